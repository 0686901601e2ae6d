//! What Lua handler code may do: the library set of every instance state, what library
//! stages a daemon builds, and the opt-ins a process grants (`leda start --allow
//! io,os,net`, `leda run --allow io`).
//!
//! A deployment ships Lua code to a daemon, so a handler state gets, by default:
//!
//! | library | by default | with the opt-in |
//! |---|---|---|
//! | base | all but `dofile`, `loadfile`; `load`/`loadstring` compile **text only** | `io`: `dofile`, `loadfile` (text only) |
//! | `coroutine`, `string` (no `string.dump`), `table`, `math`, `utf8` | yes (with `require`) | |
//! | `os` | `os.time`, `os.clock`, `os.date`, `os.difftime` | `os`: the whole library |
//! | `io` | no: `require 'io'` fails and says how to allow it | `io` |
//! | `package` | modules from `package.preload` (the standard libraries, the stage library); no files, no C modules (`loadlib`, `searchpath` removed, `cpath` empty) | `io`: Lua modules from files on `package.path` (text only); `os`: C modules too |
//!
//! A daemon builds the Rust stages a deployment names (the stage library's, the bundled
//! applications') only when they need nothing beyond what it allows
//! ([`crate::registry::register_stage`] records what each needs): files (`io`: reading
//! lines, printing to a file, serving or writing files) or sockets (`net`). A script's
//! own process builds every stage it names.
//!
//! The opt-ins are process-wide ([`allow`]) and apply to handler states created
//! afterwards; a script's own configuring state (the program the user runs) keeps
//! every library. This module only decides; [`crate::instance`] opens the libraries.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Opt-ins beyond the default library set of handler states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `io`, `dofile`, `loadfile`: files.
    pub io: bool,
    /// The whole `os` library (`os.execute`, `os.remove`, `os.exit`, `os.getenv`,
    /// ...) and C modules (`package.loadlib`, `package.cpath`).
    pub os: bool,
    /// Sockets: library stages that listen or connect (`leda.stage.net.*`, the HTTP
    /// server's `accept`, the lock service's client). Lua code has no sockets of its own.
    pub net: bool,
}

const IO: u8 = 1;
const OS: u8 = 2;
const NET: u8 = 4;

static ALLOWED: AtomicU8 = AtomicU8::new(0);

impl Capabilities {
    /// Parses a comma-separated list: `io`, `os`, `net` (`""` allows nothing).
    pub fn parse(list: &str) -> Result<Capabilities, String> {
        let mut c = Capabilities::default();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "io" => c.io = true,
                "os" => c.os = true,
                "net" => c.net = true,
                other => {
                    return Err(format!(
                        "--allow: unknown capability '{other}' (known: io, os, net)"
                    ));
                }
            }
        }
        Ok(c)
    }

    pub(crate) fn bits(self) -> u8 {
        (u8::from(self.io) * IO) | (u8::from(self.os) * OS) | (u8::from(self.net) * NET)
    }

    /// `true` if every capability of `needed` is in `self`.
    pub fn covers(self, needed: Capabilities) -> bool {
        needed.bits() & !self.bits() == 0
    }

    /// The capabilities of `needed` that `self` lacks, as `--allow` would name them.
    pub fn missing(self, needed: Capabilities) -> String {
        let lack = needed.bits() & !self.bits();
        [(IO, "io"), (OS, "os"), (NET, "net")]
            .iter()
            .filter(|(b, _)| lack & b != 0)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Grants `c` to the handler states this process creates from now on.
pub fn allow(c: Capabilities) {
    ALLOWED.store(c.bits(), Relaxed);
}

/// What handler states of this process may do.
pub fn allowed() -> Capabilities {
    let b = ALLOWED.load(Relaxed);
    Capabilities {
        io: b & IO != 0,
        os: b & OS != 0,
        net: b & NET != 0,
    }
}

/// Lua run in every new handler state after its libraries are registered: text-only
/// chunks, no `string.dump`, and what the capabilities do not allow removed.
/// (`string.dump` is also removed when `string` is `require`d: see
/// [`crate::instance`].)
pub(crate) fn sandbox_chunk(c: Capabilities) -> String {
    // `select('#', ...)` tells an absent environment from an explicit `nil` (a chunk
    // loaded with `nil` sees no globals).
    let mut s = String::from(
        r#"
local load, select, error = load, select, error
_G.load = function(chunk, name, _, ...)
  if select('#', ...) == 0 then return load(chunk, name, "t") end
  return load(chunk, name, "t", (...))
end
if loadstring then
  _G.loadstring = function(s, name) return load(s, name, "t") end
end
local searchers = package.searchers or package.loaders
"#,
    );
    if c.io {
        // Files, but source text only: `loadfile`, `dofile` and the module searcher.
        s.push_str(
            r#"
local loadfile, searchpath = loadfile, package.searchpath
_G.loadfile = function(file, _, ...)
  if select('#', ...) == 0 then return loadfile(file, "t") end
  return loadfile(file, "t", (...))
end
_G.dofile = function(file)
  local f, why = loadfile(file, "t")
  if not f then error(why, 2) end
  return f()
end
searchers[2] = function(name)
  local path, why = searchpath(name, package.path)
  if not path then return why end
  local f, e = loadfile(path, "t")
  if not f then
    error("error loading module '" .. name .. "' from file '" .. path .. "':\n\t" .. e, 2)
  end
  return f, path
end
"#,
        );
    } else {
        // No files: not as chunks, nor as modules (the file searcher read any path named
        // by `package.path`, and took bytecode).
        s.push_str(
            r#"
dofile = nil
loadfile = nil
package.searchpath = nil
searchers[2] = function()
  return "\n\tno file searched: handlers of this process may not read files (start it with --allow io)"
end
"#,
        );
    }
    if !c.os {
        s.push_str(
            "package.loadlib = nil
package.cpath = ''
",
        );
    }
    s
}
