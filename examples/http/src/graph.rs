//! The server's stage graph (thesis Fig. 5.6), built in Rust; `server.lua` builds the
//! same graph from Lua.
//!
//! ```text
//! accept ─client→ handle_request ─static→ cache ─hit→ send_buffer ─next→ handle_request
//!    │                 │  │  │              ├file→ send_file ─insert→ cache
//!    │                 │  │  │              └miss→ send_file ├next→ handle_request
//!    └reject→ send_buffer  │  └dynamic→ cgi ─reply→ send_buffer  └close→ close
//!                          └reply→ send_buffer
//! ```
//! `hit`: a file in memory; `file`: an open descriptor, sent with `sendfile`; `miss`:
//! opened (and inserted) by `send_file`.
//! Every connector is local: client sockets travel on the events.

use std::net::TcpListener;
use std::sync::Arc;

use leda_core::prelude::*;
use leda_core::runtime::Running;

use crate::config::Config;
use crate::conn::Drain;
use crate::error::ServerError;
use crate::stage;

/// The server's graph and its entry stage.
pub struct Server {
    /// The stage graph.
    pub graph: Graph,
    /// The accept stage (push a start event, optionally with a listener, to run it).
    pub accept: Stage,
    /// The server's graceful stop (keep it: the stages find it only while it lives).
    pub drain: Arc<Drain>,
}

/// A started server.
pub struct Serving {
    /// Its run: [`Running::wait`] returns when it ends.
    pub running: Running,
    /// Its graceful stop ([`Drain::stop`]).
    pub drain: Arc<Drain>,
}

/// Builds the graph with `cfg` set as attributes on every stage.
pub fn build(cfg: &Config) -> Server {
    let accept = stage::accept::stage();
    let handle = stage::handle::stage();
    let cache = stage::cache::stage();
    let send_file = stage::send_file::stage();
    let cgi = stage::cgi::stage();
    let send_buffer = stage::send_buffer::stage();
    let close = stage::close::stage();
    let drain = Arc::new(Drain::default());
    accept.set_attr(stage::DRAIN_ATTR, Drain::register(&drain) as i64);
    let maxpar = cfg.max_connections.saturating_add(64);
    for s in [
        &accept,
        &handle,
        &cache,
        &send_file,
        &cgi,
        &send_buffer,
        &close,
    ] {
        for (k, v) in cfg.to_attrs() {
            s.set_attr(k, v);
        }
    }
    let cgi = cgi.maxpar(stage::cgi::instances(cfg));
    let (handle, send_file, send_buffer, close) = (
        handle.maxpar(maxpar),
        send_file.maxpar(maxpar),
        send_buffer.maxpar(maxpar),
        close.maxpar(maxpar),
    );
    let mut g = Graph::new("leda-httpd");
    g.connect(&accept, "client", &handle).local();
    g.connect(&accept, "reject", &send_buffer).local();
    g.connect(&handle, "static", &cache).local();
    g.connect(&handle, "dynamic", &cgi).local();
    g.connect(&handle, "reply", &send_buffer).local();
    g.connect(&handle, "close", &close).local();
    g.connect(&cache, "hit", &send_buffer).local();
    g.connect(&cache, "file", &send_file).local();
    g.connect(&cache, "miss", &send_file).local();
    g.connect(&send_file, "insert", &cache).local();
    g.connect(&send_file, "next", &handle).local();
    g.connect(&send_file, "close", &close).local();
    g.connect(&cgi, "reply", &send_buffer).local();
    g.connect(&send_buffer, "next", &handle).local();
    g.connect(&send_buffer, "close", &close).local();
    Server {
        graph: g,
        accept,
        drain,
    }
}

/// Checks the root, builds the graph and starts it on `listener` with `threads`
/// workers. Stop it with `running.handle().quit(())`, after [`Drain::stop`] for a
/// graceful stop.
pub fn start(cfg: &Config, listener: TcpListener, threads: usize) -> Result<Serving, ServerError> {
    let root = std::fs::canonicalize(&cfg.root).map_err(|source| ServerError::Root {
        path: cfg.root.display().to_string(),
        source,
    })?;
    if !root.is_dir() {
        return Err(ServerError::Root {
            path: cfg.root.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    let cfg = Config {
        root,
        cgi_states: if cfg.cgi_states == 0 {
            threads.max(1)
        } else {
            cfg.cgi_states
        },
        ..cfg.clone()
    };
    let server = build(&cfg);
    server.accept.push(Event::new().attach(listener));
    Ok(Serving {
        running: server.graph.start(Run::default().threads(threads))?,
        drain: server.drain,
    })
}
