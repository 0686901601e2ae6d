//! Multi-resource locks (`acquire_all`) across real processes: two daemons (nodes 1 and 2)
//! and the launcher (node 0), every API client of the launcher and every worker client of the
//! daemons asking for random subsets (at least 2) of the multi locks and, holding them,
//! incrementing one counter file per instance held with that instance's fencing token. The
//! per-lock counts prove that no instance had two holders at once (no lost update), and no
//! stale fencing token was accepted.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{BIN, Proc, daemon};

/// Waits for `p` to exit, at most `limit`.
fn wait(p: &mut Proc, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = p.0.try_wait().expect("waiting for a child") {
            return s;
        }
        assert!(Instant::now() < deadline, "{what} did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the launcher with two daemons; returns its success and stdout.
fn run(args: &[&str], counter: &Path) -> (bool, String) {
    let (mut d1, a1) = daemon(&[]);
    let (mut d2, a2) = daemon(&[]);
    let mut launcher = Proc(
        Command::new(BIN)
            .args(["run", "--daemons", &format!("{a1},{a2}")])
            .arg("--counter")
            .arg(counter)
            .args(["--clients", "2", "--iters", "3", "--api-clients", "2"])
            .args(["--multi-iters", "12"])
            .args(args)
            .env_remove("LEDA_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the launcher"),
    );
    let status = wait(&mut launcher, Duration::from_secs(60), "the launcher");
    let mut out = String::new();
    if let Some(mut o) = launcher.0.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    // The daemons end with the run.
    for d in [&mut d1, &mut d2] {
        let s = wait(d, Duration::from_secs(10), "a daemon");
        assert!(s.success(), "{args:?}: daemon exited with {s}");
    }
    (status.success(), out)
}

/// The `key=value` fields of the output's `MULTI` line.
fn multi_line(out: &str) -> BTreeMap<String, String> {
    let line = out
        .lines()
        .find(|l| l.starts_with("MULTI "))
        .unwrap_or_else(|| panic!("no MULTI line in {out}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `a:3,b:4` → {a: 3, b: 4}.
fn per_lock(v: &str) -> BTreeMap<String, u64> {
    v.split(',')
        .map(|p| {
            let (name, n) = p.split_once(':').expect("name:count");
            (name.to_owned(), n.parse().expect("a count"))
        })
        .collect()
}

/// A multi lock and its number of instances.
type Lock = (&'static str, u32);

#[test]
fn acquire_all_across_processes_loses_no_update() {
    let dir = std::env::temp_dir().join(format!("lock-service-multi-mp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (algorithm, locks, instances per lock)
    let cases: [(&str, &str, &[Lock]); 3] = [
        (
            "bouabdallah-laforest",
            "a,b,c",
            &[("a", 1), ("b", 1), ("c", 1)],
        ),
        (
            "lejeune",
            "a,b,c,d",
            &[("a", 1), ("b", 1), ("c", 1), ("d", 1)],
        ),
        (
            "incremental",
            "a,b,gpu:3",
            &[("a", 1), ("b", 1), ("gpu", 3)],
        ),
    ];
    for (algorithm, locks, instances) in cases {
        let counter = dir.join(format!("{algorithm}.counter"));
        let (ok, out) = run(
            &["--multi-algorithm", algorithm, "--multi-locks", locks],
            &counter,
        );
        assert!(ok, "{algorithm}: {out}");
        // Single lock: 2 daemons × 2 clients × 3 + 2 API clients × 3.
        assert!(
            out.contains("count=18 expected=18 refused=0"),
            "{algorithm}: {out}"
        );
        let m = multi_line(&out);
        assert_eq!(m["algorithm"], algorithm);
        // (2 API clients + 2 daemons × 2 workers) × 12 rounds.
        assert_eq!(m["clients"], "6", "{out}");
        assert_eq!(m["grants"], "72", "{out}");
        assert_eq!(m["expected_grants"], "72", "{out}");
        assert_eq!(m["stale"], "0", "{out}");
        let (counts, expected) = (per_lock(&m["counts"]), per_lock(&m["expected"]));
        assert_eq!(counts, expected, "{algorithm}: {out}");
        // Every grant held at least 2 locks, every lock was used.
        assert!(expected.values().sum::<u64>() >= 2 * 72, "{out}");
        assert_eq!(expected.len(), instances.len(), "{out}");
        assert!(expected.values().all(|&n| n > 0), "{out}");
        // The counter files themselves: one per instance, `count last_fence`, the counts
        // adding up to the line's.
        for (name, k) in instances {
            let mut sum = 0;
            for i in 0..*k {
                let path = format!("{}.multi-{name}-{i}", counter.display());
                let content = std::fs::read_to_string(&path).unwrap();
                let mut it = content
                    .split_whitespace()
                    .map(|v| v.parse::<u64>().unwrap());
                let (count, fence) = (it.next().unwrap(), it.next().unwrap());
                assert!(
                    fence >= count,
                    "{path}: fences strictly increase: {content}"
                );
                sum += count;
            }
            assert_eq!(sum, counts[*name], "{algorithm} {name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_multi_options_are_refused_before_deploying() {
    let dir = std::env::temp_dir().join(format!("lock-service-multi-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let counter = dir.join("c");
    // No daemon listens there: the options must be refused before any connection.
    for (args, why) in [
        (&["--multi-locks", "a,b"][..], "needs --multi-algorithm"),
        (&["--multi-algorithm", "lejeune"], "needs --multi-locks"),
        (&["--multi-algorithm", "foo", "--multi-locks", "a,b"], "foo"),
        (
            &["--multi-algorithm", "lejeune", "--multi-locks", "a"],
            "at least 2",
        ),
        (
            &["--multi-algorithm", "lejeune", "--multi-locks", "a,gpu:2"],
            "single-instance",
        ),
        (
            &["--multi-algorithm", "incremental", "--multi-locks", "a,b:0"],
            "integer ≥ 1",
        ),
        (
            &[
                "--multi-algorithm",
                "incremental",
                "--multi-locks",
                "a,counter",
            ],
            "also the single lock",
        ),
        (
            &["--multi-algorithm", "incremental", "--multi-locks", "a,b,a"],
            "adding the multi locks",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["run", "--daemons", "127.0.0.1:9", "--counter"])
            .arg(&counter)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .output()
            .expect("running the launcher");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
