//! The bundled applications' Lua graphs (`examples/http/server.lua`,
//! `examples/image/pipeline.lua`) run by the real `leda` binary.

#[path = "../../leda-lua/tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// A child killed and reaped however the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("ephemeral port")
        .port()
}

/// One `GET` with `Connection: close`; the status code and the body.
fn get(addr: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((code, raw[head_end + 4..].to_vec()))
}

#[test]
fn http_server_lua_serves_static_and_dynamic_pages_inside_its_root() {
    let root = repo();
    let addr = format!("127.0.0.1:{}", free_port());
    let _server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_leda"))
            .current_dir(&root)
            .args([
                "run",
                "examples/http/server.lua",
                "examples/http/site",
                &addr,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("leda run server.lua"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let (code, body) = loop {
        match get(&addr, "/") {
            Ok(r) => break r,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("server.lua never answered on {addr}: {e}"),
        }
    };
    assert_eq!(code, 200);
    let index = std::fs::read(root.join("examples/http/site/index.html")).expect("index.html");
    assert_eq!(body, index, "the static page is served as it is on disk");

    let (code, body) = get(&addr, "/hello.lua?x=1").expect("dynamic page");
    assert_eq!(code, 200);
    let page = String::from_utf8_lossy(&body);
    assert!(
        page.contains("<h1>Hello from Lua</h1>") && page.contains("GET /hello.lua"),
        "the page's output is served, not its source: {page}"
    );

    let (code, _) = get(&addr, "/../../Cargo.toml").expect("traversal");
    assert!(
        code == 400 || code == 403 || code == 404,
        "traversal refused, got {code}"
    );
    let (code, _) = get(&addr, "/no-such-page.html").expect("missing page");
    assert_eq!(code, 404);
}

#[test]
fn image_pipeline_lua_processes_every_image_in_one_process() {
    let dir = common::tempdir();
    let (input, output) = (dir.join("in"), dir.join("out"));
    let made = leda_image::generate::generate(
        &input,
        &leda_image::generate::GenOptions {
            count: 4,
            resolution: leda_image::generate::Resolution::Custom(96, 64),
            ..Default::default()
        },
    )
    .expect("generate images");
    assert_eq!(made.len(), 4);
    std::fs::write(input.join("broken.jpg"), b"not a jpeg").expect("write broken file");

    let out = Command::new(env!("CARGO_BIN_EXE_leda"))
        .current_dir(repo())
        .args(["run", "examples/image/pipeline.lua"])
        .arg(&input)
        .arg(&output)
        .arg("1")
        .output()
        .expect("leda run pipeline.lua");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for path in &made {
        let name = path.file_name().expect("file name");
        let full = output.join(name);
        let half = output.join("half").join(name);
        let (w, h) = image_size(&full);
        assert_eq!((w, h), (96, 64), "{} keeps its size", full.display());
        assert_eq!(
            image_size(&half),
            (48, 32),
            "{} is half size",
            half.display()
        );
    }
    assert!(
        stderr.contains("error: broken: decode:"),
        "the broken file is reported, stderr: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Width and height of a JPEG (SOF0/SOF2 marker), read without an image library.
fn image_size(path: &Path) -> (u16, u16) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut i = 2;
    while i + 9 < b.len() {
        assert_eq!(b[i], 0xFF, "{}: marker expected at {i}", path.display());
        let marker = b[i + 1];
        let len = usize::from(u16::from_be_bytes([b[i + 2], b[i + 3]]));
        if matches!(marker, 0xC0..=0xC2) {
            let h = u16::from_be_bytes([b[i + 5], b[i + 6]]);
            let w = u16::from_be_bytes([b[i + 7], b[i + 8]]);
            return (w, h);
        }
        i += 2 + len;
    }
    panic!("{}: no frame header", path.display());
}
