//! The crash-tolerant quorum algorithm over real processes on loopback, with a node killed
//! mid-run: three daemons (nodes 1–3) and the launcher (node 0) run `quorum` over each
//! generator (grid, tree, VCube) with the VCube failure detector's stages beside every node.
//! Node 3 is a requester like the others (`--doomed-nodes 3`: its two clients contend for the
//! same lock for ever, counting in their own file so that whatever it did before dying is not
//! part of the check) and an arbiter in the others' quorums. Once both counters show the lock
//! at work, its daemon gets SIGKILL, possibly inside the critical section. The survivors must
//! keep acquiring the lock: the final count equals every increment the survivors made (no lost
//! update, so no overlap) with no stale fencing token accepted, most of them after the kill,
//! and node 0's detector must report node 3's crash.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{BIN, Proc, daemon};

/// The counter file's count, if it can be read now (it is rewritten under the lock).
fn count(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let mut it = s.split_whitespace();
    let c = it.next()?.parse().ok()?;
    it.next()?.parse::<u64>().ok()?;
    Some(c)
}

/// One field `key=value` of a `RESULT` line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn run(generator: &str, dir: &Path) {
    let counter = dir.join(format!("{generator}.counter"));
    let _ = std::fs::remove_file(&counter);
    let daemons: Vec<(Proc, String)> = (0..3).map(|_| daemon(&[("RUST_LOG", "error")])).collect();
    let addrs: Vec<&str> = daemons.iter().map(|d| d.1.as_str()).collect();
    let mut launcher = Proc(
        Command::new(BIN)
            .args(["run", "--algorithm", "quorum", "--quorum", generator])
            .args(["--daemons", &addrs.join(",")])
            .arg("--counter")
            .arg(&counter)
            .args(["--clients", "2", "--iters", "20", "--api-clients", "2"])
            .args(["--doomed-nodes", "3"])
            .args(["--detector-period-ms", "20", "--detector-timeout-ms", "400"])
            .args(["--acquire-timeout", "20"])
            .env_remove("LEDA_SECRET")
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the launcher"),
    );
    let stdout = launcher.0.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let mut daemons = daemons;
    let (victim, _) = daemons.pop().expect("three daemons");

    // Wait until the lock is at work: some increments are in both files.
    let doomed = dir.join(format!("{generator}.counter.node3"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        if let Some(c) = count(&counter).filter(|&c| c >= 10)
            && count(&doomed).is_some_and(|d| d >= 3)
        {
            break c;
        }
        assert!(
            launcher
                .0
                .try_wait()
                .expect("polling the launcher")
                .is_none(),
            "{generator}: the launcher ended before the kill"
        );
        assert!(
            Instant::now() < deadline,
            "{generator}: no progress before the kill"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let killed_at = Instant::now();
    drop(victim); // SIGKILL node 3's daemon, and reap it

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = launcher.0.try_wait().expect("waiting for the launcher") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{generator}: the run did not end after the kill"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let after_kill = killed_at.elapsed();
    let _ = reader.join();
    let timed: Vec<(Instant, String)> = rx.try_iter().collect();
    let notice_after = timed
        .iter()
        .find(|(_, l)| l.starts_with("NOTICE observer=0 crashed=3 "))
        .map(|(t, _)| t.saturating_duration_since(killed_at));
    let lines: Vec<String> = timed.into_iter().map(|(_, l)| l).collect();
    let out = lines.join("\n");
    assert!(status.success(), "{generator}: launcher failed: {out}");

    let result = lines
        .iter()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("{generator}: no RESULT line in {out}"));
    // 2 active daemons × 2 clients × 20 + 2 API clients × 20: every increment landed, so no
    // two clients were ever in the critical section together, and no stale fence was accepted.
    assert_eq!(field(result, "count"), Some("120"), "{generator}: {result}");
    assert_eq!(
        field(result, "expected"),
        Some("120"),
        "{generator}: {result}"
    );
    assert_eq!(field(result, "refused"), Some("0"), "{generator}: {result}");
    assert!(
        before < 120,
        "{generator}: the kill came after the last increment"
    );
    let final_count = count(&counter).expect("final counter");
    assert_eq!(final_count, 120, "{generator}");
    // The killed node was detected by node 0 (only node 3 crashed). Node 3's testers are
    // nodes 2 and 1 (the first processes of c(3,1) = (2) and c(3,2) = (1 0)): node 0 learns it
    // from an odd counter in one of their ALIVE answers, across processes.
    let notice = lines
        .iter()
        .find(|l| l.starts_with("NOTICE observer=0 crashed=3 "))
        .unwrap_or_else(|| panic!("{generator}: no crash notice for node 3 in {out}"));
    assert!(notice.contains("evidence=Gossip"), "{generator}: {notice}");
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("NOTICE") && !l.contains("crashed=3 ")),
        "{generator}: false suspicion in {out}"
    );
    let victim_count = count(&doomed).unwrap_or(0);
    println!(
        "{generator}: killed node 3 at count {before} (it had made {victim_count} increments of \
         its own); {} increments after; node 0 told after {notice_after:?}; run ended \
         {after_kill:?} after the kill",
        120 - before,
    );

    // The surviving daemons end with the run.
    for (mut d, addr) in daemons {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = d.0.try_wait().expect("waiting for a daemon") {
                assert!(s.success(), "{generator}: daemon {addr} exited with {s}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{generator}: daemon {addr} did not end"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn survivors_keep_the_lock_after_a_node_is_killed() {
    let dir = std::env::temp_dir().join(format!("lock-service-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for generator in ["vcube", "grid", "tree"] {
        run(generator, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
