//! `leda.stage.net.*`: TCP (accept, read, write) and an HTTP GET client, on the
//! runtime's asynchronous sockets (a waiting instance holds no worker thread), plus a
//! tiny HTTP page server for local demos and tests.
//!
//! Sockets travel as a local attachment ([`Connection`]), so the connectors between
//! these stages must be `local` (or `cohort`): the runtime refuses to put a socket on
//! a decoupled connector.

mod addr;
mod http;
mod serve;
mod tcp;

pub use addr::listen_addr;
pub use http::{HttpError, Url, http_get, http_stage};
pub use serve::serve;
pub use tcp::{Connection, IDLE_TIMEOUT, MAX_CHUNK, accept, read, write};
