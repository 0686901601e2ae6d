//! What slow clients cost the server: the memory of files read for the cache stays
//! bounded however slowly they read (review finding rv12 F1: 2,400 slow readers of 600
//! distinct 5 MB files took 6.6 GB and 516 threads under a 64 MiB cache). One test per
//! process: it measures the process's resident memory.

mod common;

use std::time::{Duration, Instant};

const FILES: usize = 30;
const FILE_LEN: usize = 4 << 20;

fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

fn contents(i: usize) -> Vec<u8> {
    (0..FILE_LEN)
        .map(|k| (k as u32 % 251) as u8 ^ i as u8)
        .collect()
}

/// 30 clients that do not read, each asking for another 4 MiB file (all small enough
/// for the 6 MiB memory cache): before, each miss read its file into memory and held
/// it for as long as its client took (120 MiB here); now what misses read is bounded
/// (twice `cache_bytes`), the rest is sent with `sendfile`, and a client that reads is
/// still served every file whole.
#[test]
fn slow_readers_of_many_files_hold_bounded_memory() {
    let s = common::server(|c| {
        c.cache_bytes = 6 << 20;
        c.send_timeout = Duration::from_secs(60);
    });
    for i in 0..FILES {
        std::fs::write(s.root.join(format!("f{i}.bin")), contents(i)).unwrap();
    }
    let before = rss_bytes();
    let held: Vec<_> = (0..FILES)
        .map(|i| common::slow_reader(s.addr, &format!("/f{i}.bin")))
        .collect();
    // Let every miss read its file (and, before, hold it).
    let t = Instant::now();
    let mut grown = 0;
    while t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        grown = grown.max(rss_bytes().saturating_sub(before));
    }
    // A reading client is served these files whole meanwhile.
    let mut c = common::Client::connect(s.addr);
    for i in [0, FILES / 2, FILES - 1] {
        let r = c.get(&format!("/f{i}.bin"), "");
        assert_eq!(r.status, 200);
        assert!(r.body == contents(i), "f{i}.bin differs");
    }
    drop(held);
    assert!(
        grown < 40 << 20,
        "resident memory grew {} MiB with {FILES} slow readers of 4 MiB files",
        grown >> 20
    );
}
