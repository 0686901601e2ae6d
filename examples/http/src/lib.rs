//! # leda-http: the staged HTTP server (thesis §5.2.1, Fig. 5.6)
//!
//! A web server as a Leda stage graph: `accept` → `handle_request` → static files
//! through a serial LRU `cache` (small files in memory; larger ones kept open and sent
//! zero-copy with `sendfile(2)` by `send_file`, which also serves misses) or dynamic
//! `.lua` pages through `cgi` → `send_buffer` → back to `handle_request` (keep-alive)
//! or `close`. Client sockets travel between stages as local attachments on local
//! connectors, so the whole server is one cluster.
//!
//! Module map:
//! * [`config`]: limits, timeouts and sizes (stage attributes);
//! * [`request`], [`response`], [`mime`], [`path`]: HTTP itself (parsing under limits,
//!   heads and error bodies, content types, safe path resolution);
//! * [`conn`]: the connection attachment and its timed I/O;
//! * [`cache`]: the LRU file cache (small files in memory, larger ones as open
//!   descriptors); [`sys`]: the `sendfile(2)` and `MSG_MORE` calls, safely wrapped;
//! * [`stage`]: the seven stages; [`graph`]: wiring them and starting the server;
//! * [`site`]: the embedded default site; [`error`]: typed errors.

pub mod cache;
pub mod config;
pub mod conn;
pub mod error;
pub mod graph;
pub mod mime;
pub mod path;
pub mod request;
pub mod response;
pub mod site;
pub mod stage;
pub mod sys;

use leda_core::stage::Stage;

pub use config::Config;
pub use error::{HttpError, ServerError};
pub use graph::{Server, Serving, build, start};

/// Builds a fresh stage (what the `leda` command's registry stores).
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name
/// (`require 'leda.stage.http.accept'` ...). `examples/http/server.lua` wires them.
/// Each with what it needs beyond computing, as `leda start --allow` names it (`io`:
/// files, `net`: sockets).
pub fn catalogue() -> Vec<(&'static str, &'static str, StageMaker)> {
    vec![
        ("leda.stage.http.accept", "net", stage::accept::stage),
        ("leda.stage.http.handle_request", "", stage::handle::stage),
        ("leda.stage.http.cache", "io", stage::cache::stage),
        ("leda.stage.http.send_file", "io", stage::send_file::stage),
        ("leda.stage.http.cgi", "io", stage::cgi::stage),
        ("leda.stage.http.send_buffer", "", stage::send_buffer::stage),
        ("leda.stage.http.close", "", stage::close::stage),
    ]
}
