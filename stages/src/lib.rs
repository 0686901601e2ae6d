//! # leda-stages: the reusable stage library
//!
//! Stages written once and composed without change (thesis §5.3.1), usable from Rust
//! (the functions below return a fresh [`Stage`]) and from Lua
//! (`require 'leda.stage.<group>.<name>'` returns a fresh stage; set its attributes
//! like any stage's, e.g. `window.size = 5`). Every stage checks its attributes and
//! connected ports in `bind`, so a misconfigured graph is refused before it runs (what
//! needs the running process — `util.print`'s `file`, opened where the stage runs — or
//! an event — `util.timer`'s period — fails that event instead).
//!
//! Module map: [`util`], [`window`], [`string`], [`io`], [`net`]; [`args`] holds the
//! shared readers of numbers, attributes and ports; [`error`] the stages' errors.
//!
//! ## Catalogue
//!
//! | `require` name | Rust | serial | input event | output ports | attributes |
//! |---|---|---|---|---|---|
//! | `leda.stage.util.timer` | [`util::timer`] | no (async) | `(period_s, count \| -1, extra...)` | `1`: `(extra...)` every period | – |
//! | `leda.stage.util.print` | [`util::print`] | yes | any | `1` (optional): the event, forwarded | `file` (append there instead of stdout) |
//! | `leda.stage.util.map` (Lua: `map(f)` or `map('name')`), `leda.stage.util.map.rust` | [`util::map`], [`util::map_with`] | no | `(array, ...)` | `1`: `(mapped array, ...)` | `fn` (built-in name) or `pattern` + `replace` (Lua gsub) |
//! | `leda.stage.util.average` | [`util::average`] | no | `(array)` or numbers | `1`: `(mean)` | – |
//! | `leda.stage.util.broadcast` | [`util::broadcast`] | no | any (no attachment) | `1, 2, ...` and `ports`: a copy each | `ports` (extra named ports) |
//! | `leda.stage.util.roundrobin` | [`util::roundrobin`] | yes | any | `1..n` in turn | – |
//! | `leda.stage.util.switch` | [`util::switch`] | no | any | the port the key names | `key` (argument, default 1), `field`, `default` |
//! | `leda.stage.util.quit` | [`util::quit`] | yes | any | – (ends the run with the event) | `count` (default 1) |
//! | `leda.stage.window.merge` | [`window::merge`] | yes | `(time, source, element)`, or `(source)` when it ends | `1`: every `size` elements in event-time order, the same however sources interleave; `late` | `size`, `sources` (required), `lateness` |
//! | `leda.stage.window.sliding` | [`window::sliding`] | yes | one element | `1`: last `size` elements, on every event once full | `size` (required) |
//! | `leda.stage.window.spatial` | [`window::spatial`] | yes | one element, or a tick `()` to flush | `1`: every `size` elements | `size` (required) |
//! | `leda.stage.window.time` | [`window::time`] | yes | one element, or a tick `()` | `1`: the elements of each interval | `time` (seconds, required) |
//! | `leda.stage.string.match` | [`string::string_match`] | no | `(text)` | `match` or `1`: the captures | `pattern` (Lua 5.4 pattern, required) |
//! | `leda.stage.io.lines` | [`io::lines`] | no (async) | `(filename)` | `line` or `1`: `(line)`; `io_error`: `(filename, reason)`; `eof`: `()` (also after an open or read error) | `bytes` (lines as bytes), `chunk`; a line over [`io::MAX_LINE`] is skipped and reported |
//! | `leda.stage.net.tcp.accept` | [`net::accept`] | no (async) | `(host, port)` | `client` or `1`: `(peer)` + [`net::Connection`]; `listening`: `(addr)` | `count` |
//! | `leda.stage.net.tcp.read` | [`net::read`] | no (async) | `()` + connection | `1`: `(data)` + connection; `closed`: `(peer)`, or `(peer, "idle timeout")` | `mode` (`line`/`chunk`), `size`, `max_line`, `idle_timeout` |
//! | `leda.stage.net.tcp.write` | [`net::write`] | no (async) | `(data...)` + connection | `1` (optional): `()` + connection | `close` |
//! | `leda.stage.net.http` | [`net::http_stage`] | no (async) | `(url, extra...)` | `1`: `(body, extra...)`; `http_error`: `(url, reason)` | `timeout`, `max_size` |
//! | `leda.stage.net.http.serve` | [`net::serve`] | no (async) | `(host, port)` | `listening`: `("http://addr/")` | `pages` or `body`, `count`, `request_timeout` |
//!
//! "async" stages wait on the runtime's reactor (timers, sockets, room in a full
//! queue) with the instance *Waiting*: no worker thread is held while they wait.
//! Forwarding stages use the waiting send, so a full queue slows them down instead
//! of losing an event.
//!
//! ## Lua functions and `util.map`
//!
//! A Rust stage runs no Lua, so `util.map` takes its function by name (`fn`) or as a
//! Lua gsub (`pattern`, `replace`). Listing 5.1's form,
//! `require 'leda.stage.util.map'(function(v) ... end)`, is served by the Lua module
//! [`LUA_MAP`] (registered by [`lua_modules`]): called with a Lua function it builds a
//! Lua stage applying that function to each element; called with a string it
//! returns the Rust stage with `fn` set to that built-in name.
//!
//! ```
//! use leda_core::prelude::*;
//! use leda_stages::{util, window};
//!
//! let win = window::spatial().attr("size", 2);
//! let avg = util::average();
//! let quit = util::quit();
//! let mut g = Graph::new("avg");
//! g.connect(&win, 1, &avg);
//! g.connect(&avg, 1, &quit);
//! for x in [1, 2] {
//!     win.push(x);
//! }
//! let report = g.run(Run::default().threads(1)).unwrap();
//! assert_eq!(report.quit.unwrap().get::<f64>(0).unwrap(), 1.5);
//! ```

pub mod args;
pub mod error;
pub mod io;
pub mod net;
pub mod string;
pub mod util;
pub mod window;

pub use error::StageError;
use leda_core::stage::Stage;

/// Lua source of `leda.stage.util.map` as seen from Lua scripts (see the crate docs).
pub const LUA_MAP: &str = include_str!("lua/map.lua");

/// Builds a fresh stage.
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name, with
/// what each needs beyond computing, as `--allow` names it (`io`: files, `net`:
/// sockets; a daemon builds a deployed stage only when it allows that much).
pub fn catalogue() -> Vec<(&'static str, &'static str, StageMaker)> {
    vec![
        ("leda.stage.util.timer", "", util::timer),
        // Its `file` attribute appends to any file the process may write.
        ("leda.stage.util.print", "io", util::print),
        ("leda.stage.util.map.rust", "", util::map),
        ("leda.stage.util.average", "", util::average),
        ("leda.stage.util.broadcast", "", util::broadcast),
        ("leda.stage.util.roundrobin", "", util::roundrobin),
        ("leda.stage.util.switch", "", util::switch),
        ("leda.stage.util.quit", "", util::quit),
        ("leda.stage.window.merge", "", window::merge),
        ("leda.stage.window.sliding", "", window::sliding),
        ("leda.stage.window.spatial", "", window::spatial),
        ("leda.stage.window.time", "", window::time),
        ("leda.stage.string.match", "", string::string_match),
        ("leda.stage.io.lines", "io", io::lines),
        ("leda.stage.net.tcp.accept", "net", net::accept),
        ("leda.stage.net.tcp.read", "net", net::read),
        ("leda.stage.net.tcp.write", "net", net::write),
        ("leda.stage.net.http", "net", net::http_stage),
        ("leda.stage.net.http.serve", "net", net::serve),
    ]
}

/// Lua modules this crate provides, by `require` name, as `(name, source)`.
pub fn lua_modules() -> Vec<(&'static str, &'static str)> {
    vec![("leda.stage.util.map", LUA_MAP)]
}
