//! The `leda-httpd` binary: with no `--root` it serves the embedded site and prints the
//! URL to open.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fetch(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Starts `leda-httpd` on a free port with two threads and `args`; the child, and the
/// address from the URL it prints first.
fn spawn(args: &[&std::ffi::OsStr], stderr: Stdio) -> (Reap, String) {
    let mut child = Reap(
        Command::new(env!("CARGO_BIN_EXE_leda-httpd"))
            .args(["--listen", "127.0.0.1:0", "--threads", "2"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"));
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    (child, addr.to_owned())
}

#[test]
fn serves_the_embedded_site_and_prints_the_url() {
    let (_child, addr) = spawn(&[], Stdio::null());
    let addr = addr.as_str();
    let page = fetch(addr, "/");
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.contains("leda-httpd is running"));
    let dynamic = fetch(addr, "/hello.lua?x=1");
    assert!(dynamic.starts_with("HTTP/1.1 200 OK\r\n"), "{dynamic}");
    assert!(dynamic.contains("Hello from Lua") && dynamic.contains("with query"));
}

#[test]
fn bad_root_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_leda-httpd"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--root",
            "/nonexistent/leda-root",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/leda-root"), "{err}");
}

/// SIGTERM drains: the request under way gets its whole response, then the server
/// exits with status 0; a second signal is not needed.
#[test]
fn sigterm_ends_the_responses_under_way_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("slow.lua"),
        "local t = os.clock() while os.clock() - t < 0.6 do end return 'done'",
    )
    .unwrap();
    let (mut child, addr) = spawn(&["--root".as_ref(), dir.path().as_os_str()], Stdio::piped());
    let a = addr.clone();
    let page = std::thread::spawn(move || fetch(&a, "/slow.lua"));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) }, 0);
    let page = page.join().unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
    assert!(page.ends_with("done"), "{page}");
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("SIGTERM: draining"), "{err}");
    assert!(TcpStream::connect(&addr).is_err(), "still listening");
}

/// A page whose client left is dropped at its next pause (Lua 5.4), as nginx drops a
/// request whose client closed, and the log says so (review finding: four clients that
/// left after 0.3 s cost 6.8 s of CPU). The page would compute for 20 s.
#[cfg(not(feature = "luajit"))]
#[test]
fn a_page_whose_client_left_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("slow.lua"),
        "local t0 = os.time() while os.time() - t0 < 20 do end return 'slow'",
    )
    .unwrap();
    let (mut child, addr) = spawn(
        &[
            "--root".as_ref(),
            dir.path().as_os_str(),
            "--cgi-timeout".as_ref(),
            "60".as_ref(),
        ],
        Stdio::piped(),
    );
    let lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET /slow.lua HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("slow.lua: the client left; the page is dropped") => return,
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    panic!("no drop logged within 10 s; the log: {seen:#?}");
}
