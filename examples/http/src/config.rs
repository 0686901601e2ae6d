//! Server settings: limits, timeouts and sizes, read from stage attributes so that the
//! same stages work from the Rust graph and from `server.lua`.

use std::path::PathBuf;
use std::time::Duration;

use leda_core::stage::{Attrs, BoxError};

/// Everything a stage of the server may need to know. Every field has a default; a
/// stage attribute of the same name overrides it (sizes in bytes, times in seconds).
#[derive(Clone, Debug)]
pub struct Config {
    /// The document root (canonicalized by the stages that serve files).
    pub root: PathBuf,
    /// Longest request line (method, target, version) before `414`.
    pub max_request_line: usize,
    /// Largest request head (request line and headers) before `431`.
    pub max_header_bytes: usize,
    /// Most header fields before `431`.
    pub max_headers: usize,
    /// Largest request body a GET or HEAD may carry (read and discarded) before `413`.
    pub max_body: usize,
    /// How long a kept-alive connection may stay silent before it is closed.
    pub idle_timeout: Duration,
    /// How long a client has to send a whole request head once it started (slowloris).
    pub header_timeout: Duration,
    /// How long a write to the client may make no progress (slow readers).
    pub send_timeout: Duration,
    /// While a response from memory larger than one write turn
    /// ([`crate::conn::FAIR_CHUNK`]) is written, the most of it that its socket holds not
    /// yet sent before the server writes more (`TCP_NOTSENT_LOWAT`; 0 leaves the
    /// kernel's, which is no bound). Bytes in flight are not counted, so it does not slow
    /// a connection on a long path; it keeps a client that reads a socket until it is
    /// empty (as wrk does) from being fed megabytes ahead while its other connections
    /// wait. Default 4 KiB; measured on 2 CPUs (docs/http-server.md § The 5 MB tail on
    /// the AMD host): 5 MB files on loopback at 200 connections, p99 0.51–0.96 s, below
    /// nginx's in each of 8 rounds (16 KiB: above it in 3; 128 KiB: 0.89–2.29 s),
    /// requests/s not lower; over a link limited to 1 Gbit/s, the same throughput for
    /// about 1.9× the server's CPU of no bound (woken more often to write). Set on every
    /// connection instead, 300 KB responses at 50 connections lost 9–12 %.
    pub notsent_lowat: usize,
    /// Most connections open at once; more are answered `503` and closed.
    pub max_connections: usize,
    /// Most requests served on one connection before it is closed.
    pub max_requests_per_connection: u64,
    /// Total bytes of file data the cache may hold. What cache misses read and is still
    /// alive (cached, or held by responses being sent) is at most twice this; past it a
    /// miss is sent with `sendfile`.
    pub cache_bytes: usize,
    /// Largest file the cache keeps in memory (sent with one `writev` of head and body);
    /// larger files are kept open instead and sent with `sendfile(2)`, zero-copy.
    ///
    /// The default, 8 MiB, is measured (`examples/http/bench.sh`, Linux 6.18, loopback):
    /// for 300 KB and 5 MB files, `writev` from memory costs less CPU in all than
    /// `sendfile` from a cached descriptor (the server's `sendfile` of 300 KB costs more
    /// than its copy, and a client receiving 5 MB sendfile responses spends about twice
    /// the CPU per byte).
    pub cache_max_file: usize,
    /// Most file descriptors the cache keeps open for files above `cache_max_file`
    /// (least recently used closed first); 0 opens such files per request.
    pub max_open_files: usize,
    /// Longest a CGI script may run before it is stopped with `500`.
    pub cgi_timeout: Duration,
    /// Most memory one CGI Lua state may use (the pages it runs at once together).
    pub cgi_memory: usize,
    /// Lua states that run `.lua` pages (0: one per worker thread with
    /// [`crate::start`], one per CPU otherwise). Each holds up to `cgi_memory`.
    pub cgi_states: usize,
    /// Most pages one Lua state runs at once (taking turns, one time slice at a time);
    /// pages that find no state below it wait, unstarted, in the order they came.
    pub cgi_pages: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: PathBuf::from("."),
            max_request_line: 8 * 1024,
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            max_body: 64 * 1024,
            idle_timeout: Duration::from_secs(15),
            header_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
            notsent_lowat: 4 * 1024,
            max_connections: 10_000,
            max_requests_per_connection: 100_000,
            cache_bytes: 64 * 1024 * 1024,
            cache_max_file: 8 * 1024 * 1024,
            max_open_files: 1000,
            cgi_timeout: Duration::from_secs(10),
            cgi_memory: 256 * 1024 * 1024,
            cgi_states: 0,
            cgi_pages: 8,
        }
    }
}

impl Config {
    /// Reads the settings from stage attributes; missing ones keep their defaults.
    pub fn from_attrs(attrs: &Attrs) -> Result<Config, BoxError> {
        let mut c = Config::default();
        if let Some(root) = attrs.get_as::<Option<String>>("root")? {
            c.root = PathBuf::from(root);
        }
        let size = |key: &str, v: &mut usize| -> Result<(), BoxError> {
            if let Some(n) = attrs.get_as::<Option<u64>>(key)? {
                *v = usize::try_from(n).map_err(|_| format!("attribute '{key}' too large"))?;
            }
            Ok(())
        };
        size("max_request_line", &mut c.max_request_line)?;
        size("max_header_bytes", &mut c.max_header_bytes)?;
        size("max_headers", &mut c.max_headers)?;
        size("max_body", &mut c.max_body)?;
        size("max_connections", &mut c.max_connections)?;
        size("notsent_lowat", &mut c.notsent_lowat)?;
        size("cache_bytes", &mut c.cache_bytes)?;
        size("cache_max_file", &mut c.cache_max_file)?;
        size("max_open_files", &mut c.max_open_files)?;
        size("cgi_memory", &mut c.cgi_memory)?;
        size("cgi_states", &mut c.cgi_states)?;
        size("cgi_pages", &mut c.cgi_pages)?;
        if let Some(n) = attrs.get_as::<Option<u64>>("max_requests_per_connection")? {
            c.max_requests_per_connection = n;
        }
        let secs = |key: &str, v: &mut Duration| -> Result<(), BoxError> {
            if let Some(s) = attrs.get_as::<Option<f64>>(key)? {
                if !(s.is_finite() && s > 0.0) {
                    return Err(
                        format!("attribute '{key}' must be a positive number of seconds").into(),
                    );
                }
                *v = Duration::from_secs_f64(s);
            }
            Ok(())
        };
        secs("idle_timeout", &mut c.idle_timeout)?;
        secs("header_timeout", &mut c.header_timeout)?;
        secs("send_timeout", &mut c.send_timeout)?;
        secs("cgi_timeout", &mut c.cgi_timeout)?;
        Ok(c)
    }

    /// The file cache's limits.
    pub fn cache_limits(&self) -> crate::cache::Limits {
        crate::cache::Limits {
            memory_bytes: self.cache_bytes,
            memory_max_file: self.cache_max_file,
            max_open: self.max_open_files,
        }
    }

    /// Writes the settings as attributes (the inverse of [`Config::from_attrs`]).
    pub fn to_attrs(&self) -> Vec<(&'static str, leda_core::value::Value)> {
        vec![
            ("root", self.root.to_string_lossy().into_owned().into()),
            ("max_request_line", self.max_request_line.into()),
            ("max_header_bytes", self.max_header_bytes.into()),
            ("max_headers", self.max_headers.into()),
            ("max_body", self.max_body.into()),
            ("max_connections", self.max_connections.into()),
            ("notsent_lowat", self.notsent_lowat.into()),
            (
                "max_requests_per_connection",
                self.max_requests_per_connection.into(),
            ),
            ("cache_bytes", self.cache_bytes.into()),
            ("cache_max_file", self.cache_max_file.into()),
            ("max_open_files", self.max_open_files.into()),
            ("cgi_memory", self.cgi_memory.into()),
            ("cgi_states", self.cgi_states.into()),
            ("cgi_pages", self.cgi_pages.into()),
            ("idle_timeout", self.idle_timeout.as_secs_f64().into()),
            ("header_timeout", self.header_timeout.as_secs_f64().into()),
            ("send_timeout", self.send_timeout.as_secs_f64().into()),
            ("cgi_timeout", self.cgi_timeout.as_secs_f64().into()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_and_validate() {
        let c = Config {
            cache_bytes: 1234,
            max_open_files: 7,
            idle_timeout: Duration::from_millis(500),
            notsent_lowat: 0,
            ..Config::default()
        };
        let mut attrs = Attrs::default();
        for (k, v) in c.to_attrs() {
            attrs.set(k, v);
        }
        let back = Config::from_attrs(&attrs).unwrap();
        assert_eq!((back.cache_bytes, back.max_open_files), (1234, 7));
        assert_eq!(back.notsent_lowat, 0);
        assert_eq!(back.idle_timeout, Duration::from_millis(500));
        attrs.set("idle_timeout", -1.0);
        assert!(Config::from_attrs(&attrs).is_err());
    }
}
