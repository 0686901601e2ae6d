//! Files above `cache_max_file` over real TCP: kept open by the cache and sent with
//! `sendfile(2)` from the shared descriptor. Exact bytes, repeated hits, HEAD, 304 and
//! keep-alive, files changed in place or replaced on disk, many connections on one
//! file, and the `max_open_files` bound (evicted descriptors stay valid for the
//! responses still sending from them).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Client, server};

/// `n` bytes of a pattern that differs with `seed`.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

/// Descriptors of this process open on files under `root` (the server runs in-process;
/// its descriptor of the root directory itself is not counted).
fn open_under(root: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(root) && target != root)
        .count()
}

/// The files under `root` this process has open (for failure messages).
fn open_list(root: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(root) && target != root)
        .collect()
}

/// Waits (up to 5 s) until `open_under(root) == n` (a response that was just read
/// may still hold its reference for a moment); returns the last count.
fn wait_open(root: &Path, n: usize) -> usize {
    let mut now = open_under(root);
    for _ in 0..250 {
        if now == n {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        now = open_under(root);
    }
    now
}

#[test]
fn descriptor_hits_exact_fresh_and_keep_alive() {
    let s = server(|c| c.cache_max_file = 64 * 1024);
    let root = std::fs::canonicalize(&s.root).unwrap();
    let expect = pattern(3_000_000, 0);
    let mut c = Client::connect(s.addr);
    // A miss (opened, sent, descriptor cached), then hits on the cached descriptor.
    for _ in 0..3 {
        let r = c.get("/big.bin", "");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some("3000000"));
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        assert!(r.body == expect, "large body differs");
    }
    assert_eq!(wait_open(&root, 1), 1, "one cached descriptor");
    // HEAD: the head alone, and the connection goes on right after it.
    c.send_raw(b"HEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    let h = c.read_response(true).unwrap();
    assert_eq!(
        (h.status, h.header("content-length")),
        (200, Some("3000000"))
    );
    assert_eq!(c.get("/style.css", "").text(), "body{}");
    // Pipelined: two large responses back to back on one connection.
    c.send_raw(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\nGET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    for _ in 0..2 {
        assert!(c.read_response(false).unwrap().body == expect);
    }
    // If-Modified-Since with the served date: 304, no body.
    let lm = c
        .get("/big.bin", "")
        .header("last-modified")
        .unwrap()
        .to_owned();
    let r = c.get("/big.bin", &format!("If-Modified-Since: {lm}\r\n"));
    assert_eq!((r.status, r.body.len()), (304, 0));

    // Changed in place (same inode, new length): the new content.
    std::thread::sleep(Duration::from_millis(20));
    let grown = pattern(3_100_000, 1);
    std::fs::write(s.root.join("big.bin"), &grown).unwrap();
    let r = c.get("/big.bin", "");
    assert_eq!(r.header("content-length"), Some("3100000"));
    assert!(r.body == grown, "in-place change not served");

    // Replaced by rename with the same length and the same mtime (as `cp -p` or
    // `rsync -t` would): only the inode differs, and it is enough.
    let old_mtime = std::fs::metadata(s.root.join("big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let replaced = pattern(3_100_000, 2);
    let tmp = s.root.join("big.bin.new");
    std::fs::write(&tmp, &replaced).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(old_mtime)
        .unwrap();
    std::fs::rename(&tmp, s.root.join("big.bin")).unwrap();
    let r = c.get("/big.bin", "");
    assert_eq!(r.header("content-length"), Some("3100000"));
    assert!(r.body == replaced, "replaced file served stale");
    // The replaced file's descriptor was dropped: one open descriptor, the new one.
    assert_eq!(wait_open(&root, 1), 1);

    // Deleted: 404, and the connection stays usable.
    std::fs::remove_file(s.root.join("big.bin")).unwrap();
    assert_eq!(c.get("/big.bin", "").status, 404);
    assert_eq!(c.get("/index.html", "").status, 200);
}

/// `conns` clients connect to `addr`, wait for each other, then each fetches
/// `/big.bin` (3,000,000 bytes of `pattern(_, 0)`) twice on its connection; every
/// response must be 200 with every byte right.
fn get_big_from_many(addr: std::net::SocketAddr, conns: usize) {
    let expect = std::sync::Arc::new(pattern(3_000_000, 0));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(conns));
    let clients: Vec<_> = (0..conns)
        .map(|_| {
            let (expect, barrier) = (expect.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                barrier.wait();
                for _ in 0..2 {
                    let r = c.get("/big.bin", "");
                    assert_eq!(r.status, 200);
                    assert!(r.body == *expect, "large body differs");
                }
            })
        })
        .collect();
    for t in clients {
        t.join().expect("client");
    }
}

#[test]
fn many_connections_share_one_descriptor() {
    const CONNS: usize = 64;
    let s = server(|c| c.cache_max_file = 64 * 1024);
    let root = std::fs::canonicalize(&s.root).unwrap();
    get_big_from_many(s.addr, CONNS);
    // Racing misses may each have opened the file; the cache keeps one descriptor.
    assert_eq!(wait_open(&root, 1), 1);
}

#[test]
fn max_open_files_bounds_descriptors_and_evicted_ones_finish() {
    let s = server(|c| {
        c.cache_max_file = 64 * 1024;
        c.max_open_files = 1;
    });
    let root = std::fs::canonicalize(&s.root).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..3u8)
        .map(|i| {
            let body = pattern(200_000 + usize::from(i) * 1000, i);
            std::fs::write(s.root.join(format!("f{i}.bin")), &body).unwrap();
            (format!("/f{i}.bin"), body)
        })
        .collect();
    // A slow reader with a small receive window asks for a 12 MB file and reads
    // nothing yet: more than the socket buffers hold, so its response is still sending
    // from the cached descriptor when that descriptor is evicted below.
    let huge = pattern(12_000_000, 9);
    std::fs::write(s.root.join("huge.bin"), &huge).unwrap();
    let mut slow = Client::connect(s.addr);
    set_rcvbuf(&slow.stream, 16 * 1024);
    slow.send_raw(b"GET /huge.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut first = [0u8; 1];
    slow.stream.peek(&mut first).unwrap(); // the response has started
    let mut c = Client::connect(s.addr);
    let name = |p: &std::path::PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
    for round in 0..3 {
        for (path, body) in &files {
            let r = c.get(path, "");
            assert!(r.body == *body, "{path} differs in round {round}");
            // At most one cached descriptor, plus the one the slow response still sends
            // from. (Which file the cache holds right after the first insert may vary:
            // the slow response's insert and this one race.)
            let n = wait_open(&root, 2);
            let open: Vec<String> = open_list(&root).iter().map(name).collect();
            assert!(n <= 2, "round {round} {path}: {open:?}");
            assert!(open.contains(&"huge.bin".to_owned()), "{open:?}");
        }
    }
    // Nine inserts later the cache holds the last file; the slow response still holds
    // the descriptor evicted from it.
    wait_open(&root, 2);
    let mut open: Vec<String> = open_list(&root).iter().map(name).collect();
    open.sort();
    assert_eq!(open, ["f2.bin", "huge.bin"]);
    // The evicted descriptor still delivers the whole slow response, then is closed.
    let r = slow.read_response(false).expect("the slow response");
    assert_eq!(r.status, 200);
    assert!(r.body == huge, "slow response differs");
    wait_open(&root, 1);
    let open: Vec<String> = open_list(&root).iter().map(name).collect();
    assert_eq!(
        open,
        ["f2.bin"],
        "the evicted descriptor is closed once its response is sent"
    );
}

/// Shrinks a socket's receive buffer (and so the window it advertises).
fn set_rcvbuf(s: &std::net::TcpStream, bytes: libc::c_int) {
    use std::os::fd::AsFd;
    leda_http::sys::set_int_option(s.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, bytes).unwrap();
}

#[test]
fn cold_misses_on_a_memory_cached_file_all_served() {
    // 3 MB is below the default cache_max_file: one miss reads it into memory, the
    // others arriving meanwhile are sent with sendfile; every byte must be right.
    const CONNS: usize = 32;
    let s = server(|_| {});
    get_big_from_many(s.addr, CONNS);
}
