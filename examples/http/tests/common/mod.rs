//! Test support: a server on an ephemeral port over a temporary root, and a small
//! blocking HTTP/1.1 client over a real TCP socket.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use leda_core::runtime::Running;
use leda_http::Config;

/// A running server; quits and joins when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub root: PathBuf,
    _dir: tempfile::TempDir,
    /// The server's graceful stop.
    pub drain: std::sync::Arc<leda_http::conn::Drain>,
    running: Option<Running>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.handle().quit(());
            let _ = r.wait();
        }
    }
}

/// Lifts the soft open-files limit (1,000 connections need 2,000+ descriptors here).
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Writes the standard test site under a fresh temporary directory.
pub fn site(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("index.html"), "<h1>home</h1>").unwrap();
    std::fs::write(root.join("docs/index.html"), "<p>docs</p>").unwrap();
    std::fs::write(root.join("style.css"), "body{}").unwrap();
    std::fs::write(root.join("data.json"), "{}").unwrap();
    std::fs::write(root.join("a b.txt"), "spaced").unwrap();
    std::fs::write(root.join("sub/file.txt"), "in sub").unwrap();
    std::fs::write(dir.join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(dir, root.join("up")).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("big.bin"), big).unwrap();
    std::fs::write(root.join("loop.lua"), include_str!("../../site/loop.lua")).unwrap();
    std::fs::write(root.join("hello.lua"), include_str!("../../site/hello.lua")).unwrap();
    std::fs::write(
        root.join("echo.lua"),
        "return request.method .. ' ' .. request.path .. '?' .. request.query, 'text/plain'\n",
    )
    .unwrap();
    std::fs::write(
        root.join("bad.lua"),
        "local x = 1\nlocal y = nil + x\nreturn 'never'\n",
    )
    .unwrap();
    std::fs::write(root.join("forever.lua"), "while true do end\n").unwrap();
    root
}

/// Starts a server over a fresh test site; `tune` adjusts the settings.
pub fn server(tune: impl FnOnce(&mut Config)) -> TestServer {
    raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let mut cfg = Config {
        root: root.clone(),
        ..Config::default()
    };
    tune(&mut cfg);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = leda_http::start(&cfg, listener, 2).unwrap();
    TestServer {
        addr,
        root,
        _dir: dir,
        drain: serving.drain,
        running: Some(serving.running),
    }
}

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// `GET path` over HTTP/1.1 with `Host`, plus extra header lines.
    pub fn get(&mut self, path: &str, extra: &str) -> Response {
        self.send_raw(format!("GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n").as_bytes());
        self.read_response(false).expect("a response")
    }

    /// Reads one response; `None` if the server closed first. `head` responses have no body.
    pub fn read_response(&mut self, head: bool) -> Option<Response> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill() {
                return None;
            }
        };
        let text = String::from_utf8(self.buf[..end].to_vec()).unwrap();
        self.buf.drain(..end);
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap();
        let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap();
                (k.trim().to_owned(), v.trim().to_owned())
            })
            .collect();
        let mut r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        let len: usize = r.header("content-length").map_or(0, |v| v.parse().unwrap());
        if !head && status != 304 {
            while self.buf.len() < len {
                assert!(self.fill(), "connection closed inside a body");
            }
            r.body = self.buf.drain(..len).collect();
        }
        Some(r)
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// `true` if the server closed the connection (EOF or reset) within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }
}

/// A connection with a 4 KiB receive buffer (set before connecting, so that the
/// window stays small) that has asked for `path` and reads nothing.
pub fn slow_reader(addr: SocketAddr, path: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(addr).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    (&stream)
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .unwrap();
    stream
}

/// One request on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    Client::connect(addr).get(path, "Connection: close\r\n")
}
