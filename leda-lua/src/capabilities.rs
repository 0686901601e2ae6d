//! What Lua handler code may do: the library set of every instance state, and the
//! opt-ins a process grants (`leda start --allow io,os`, `leda run --allow io`).
//!
//! A deployment ships Lua code to a daemon, so a handler state gets, by default:
//!
//! | library | by default | with the opt-in |
//! |---|---|---|
//! | base | all but `dofile`, `loadfile`; `load`/`loadstring` compile **text only** | `io`: `dofile`, `loadfile` |
//! | `coroutine`, `string` (no `string.dump`), `table`, `math`, `utf8` | yes (with `require`) | |
//! | `os` | `os.time`, `os.clock`, `os.date`, `os.difftime` | `os`: the whole library |
//! | `io` | no: `require 'io'` fails and says how to allow it | `io` |
//! | `package` | Lua modules by `require`; no C modules (`package.loadlib` and `package.cpath` are removed) | `os`: C modules too |
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
}

const IO: u8 = 1;
const OS: u8 = 2;

static ALLOWED: AtomicU8 = AtomicU8::new(0);

impl Capabilities {
    /// Parses a comma-separated list: `io`, `os` (`""` allows nothing).
    pub fn parse(list: &str) -> Result<Capabilities, String> {
        let mut c = Capabilities::default();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "io" => c.io = true,
                "os" => c.os = true,
                other => {
                    return Err(format!(
                        "--allow: unknown capability '{other}' (known: io, os)"
                    ));
                }
            }
        }
        Ok(c)
    }

    fn bits(self) -> u8 {
        (u8::from(self.io) * IO) | (u8::from(self.os) * OS)
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
    }
}

/// Lua run in every new handler state after its libraries are registered: text-only
/// chunks, no `string.dump`, and what the capabilities do not allow removed.
/// (`string.dump` is also removed when `string` is `require`d: see
/// [`crate::instance`].)
pub(crate) fn sandbox_chunk(c: Capabilities) -> String {
    let mut s = String::from(
        r#"
local load = load
_G.load = function(chunk, name, _, env)
  if env == nil then return load(chunk, name, "t") end
  return load(chunk, name, "t", env)
end
if loadstring then
  _G.loadstring = function(s, name) return load(s, name, "t") end
end
"#,
    );
    if !c.io {
        s.push_str("dofile = nil\nloadfile = nil\n");
    }
    if !c.os {
        s.push_str("package.loadlib = nil\npackage.cpath = ''\n");
    }
    s
}
