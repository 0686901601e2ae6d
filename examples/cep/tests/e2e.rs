//! End to end: `leda-cep` on a small seeded log, in every configuration (scenario 1
//! and 2 across processes, one process, Lua handlers, the Rust and Lua sequential baselines). The
//! expected alarms are computed here, independently of the crate's code: filter
//! alarms from the input lines, correlate alarms from the windows `persist` wrote.
//! Windows are cut by event time, so every configuration must give the very same
//! windows and alarms (a line later than the lateness bound, a line without a time and one
//! whose client is no IP address included).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leda-cep");

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leda-cep-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cep(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run leda-cep");
    assert!(
        out.status.success(),
        "leda-cep {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (client, seconds within the month, status, micros), parsed without the crate.
fn fields(line: &str) -> (String, i64, u32, u64) {
    let client = line.split(' ').next().unwrap().to_owned();
    let t = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    // dd/Mon/yyyy:hh:mm:ss +0000 — the test logs span minutes of one day.
    let day: i64 = t[0..2].parse().unwrap();
    let hms: Vec<i64> = t[12..20].split(':').map(|x| x.parse().unwrap()).collect();
    let secs = day * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    let after_request = line.split('"').nth(2).unwrap();
    let status: u32 = after_request
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let micros: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    (client, secs, status, micros)
}

fn relevant(line: &str) -> bool {
    let (_, _, status, micros) = fields(line);
    status >= 500 || micros >= 2_000_000
}

/// Clients with a burst in `window`: sort each client's erroneous entries by time and
/// count neighbours within 30 s with a sliding range (not a pairwise scan).
fn bursts(window: &[String]) -> usize {
    let mut by_client: HashMap<String, Vec<i64>> = HashMap::new();
    for l in window {
        let (c, t, status, _) = fields(l);
        if status >= 400 {
            by_client.entry(c).or_default().push(t);
        }
    }
    let mut alarms = 0;
    for times in by_client.values_mut() {
        times.sort_unstable();
        let hot = (0..times.len()).any(|i| {
            let lo = times.partition_point(|&x| x < times[i] - 30);
            let hi = times.partition_point(|&x| x <= times[i] + 30);
            hi - lo > 3 // itself plus at least three peers
        });
        alarms += usize::from(hot);
    }
    alarms
}

fn persisted(out: &Path) -> Vec<Vec<String>> {
    let mut windows = Vec::new();
    for f in std::fs::read_dir(out).unwrap() {
        let p = f.unwrap().path();
        if !p
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("persist-")
        {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for w in text.split("\n\n").filter(|w| !w.trim().is_empty()) {
            windows.push(w.lines().map(str::to_owned).collect());
        }
    }
    windows
}

fn check(out: &Path, input: &[String], window: usize, what: &str) {
    let windows = persisted(out);
    // Every entry persisted exactly once, windows never larger than the size.
    let mut got: Vec<&String> = windows.iter().flatten().collect();
    let mut want: Vec<&String> = input.iter().collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{what}: persisted entries differ from the input");
    assert!(
        windows.iter().all(|w| !w.is_empty() && w.len() <= window),
        "{what}"
    );
    // Windows over the merged stream: only the last one is partial.
    assert!(
        windows.iter().filter(|w| w.len() < window).count() <= 1,
        "{what}"
    );
    // ... and each is in event-time order.
    for w in &windows {
        assert!(
            w.windows(2).all(|p| fields(&p[0]).1 <= fields(&p[1]).1),
            "{what}"
        );
    }

    let alarms = std::fs::read_to_string(out.join("alarms.log")).unwrap_or_default();
    let mut filter: Vec<&str> = alarms
        .lines()
        .filter_map(|l| l.strip_prefix("filter\t"))
        .collect();
    let mut want_filter: Vec<&str> = input
        .iter()
        .filter(|l| relevant(l))
        .map(String::as_str)
        .collect();
    filter.sort();
    want_filter.sort();
    assert!(!want_filter.is_empty());
    assert_eq!(filter, want_filter, "{what}: filter alarms");
    let correlate = alarms
        .lines()
        .filter(|l| l.starts_with("correlate\t"))
        .count();
    let want_correlate: usize = windows.iter().map(|w| bursts(w)).sum();
    assert!(want_correlate > 0, "{what}: the seeded log has bursts");
    assert_eq!(correlate, want_correlate, "{what}: correlate alarms");
}

#[test]
fn every_configuration_raises_the_same_expected_alarms() {
    let logs = tmp("logs");
    let files = cep(&[
        "gen",
        "--out",
        logs.to_str().unwrap(),
        "--lines",
        "12000",
        "--seed",
        "7",
    ]);
    assert_eq!(files.lines().count(), 3);
    let mut input = Vec::new();
    for f in files.lines() {
        input.extend(
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_owned),
        );
    }
    assert_eq!(input.len(), 12000);
    // Out of order within source 2: a line 30 s older than the one before it (within
    // the lateness bound of 60 s: merged in its place) and one 2 minutes older (late:
    // an alarm line, in no window).
    let f2 = files.lines().nth(1).unwrap();
    let last = input[input.len() / 2].clone();
    let shifted = |secs: i64| {
        let t = fields(&last).1 - secs; // may cross into the day before
        let open = last.find('[').unwrap();
        let (day, rest) = (t.div_euclid(86_400), t.rem_euclid(86_400));
        format!(
            "{}[{:02}/{}:{:02}:{:02}:{:02} +0000]{}",
            &last[..open],
            day,
            &last[open + 4..open + 12],
            rest / 3600,
            rest / 60 % 60,
            rest % 60,
            &last[last.find(']').unwrap() + 1..]
        )
    };
    let (near, late) = (shifted(30), shifted(120));
    // Bad input, which every configuration must treat alike: a line whose client is
    // no address (an entry all the same: a client is any string without spaces; not
    // an error, so neither filtered nor correlated) and a line without a time (left
    // out, with a warning).
    let stamp = &near[near.find('[').unwrap()..=near.find(']').unwrap()];
    let bad_ip = format!(r#"999.1.1.1 - - {stamp} "GET /bad HTTP/1.1" 200 5 "-" "-" 100"#);
    let mut text = std::fs::read_to_string(f2).unwrap();
    text.push_str(&format!("{near}\n{late}\n{bad_ip}\nno time on this line\n"));
    std::fs::write(f2, text).unwrap();
    input.push(near);
    input.push(bad_ip);
    let logs = logs.to_str().unwrap();
    let window = "250";
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("seq", vec!["seq"]),
        (
            "local",
            vec![
                "run",
                "--scenario",
                "local",
                "--threads",
                "2",
                "--correlate",
                "3",
            ],
        ),
        (
            "scenario1",
            vec!["run", "--scenario", "1", "--threads", "2", "--persist", "2"],
        ),
        (
            "scenario2",
            vec!["run", "--scenario", "2", "--threads", "2", "--filter", "2"],
        ),
        ("lua-seq", vec!["lua-seq"]),
        ("lua", vec!["lua", "--threads", "2", "--correlate", "2"]),
        ("lua1", vec!["lua", "--scenario", "1", "--threads", "2"]),
        (
            "lua2",
            vec!["lua", "--scenario", "2", "--threads", "2", "--persist", "2"],
        ),
    ];
    let mut reference: Option<(Vec<Vec<String>>, Vec<String>)> = None;
    for (name, args) in runs {
        let out = tmp(name);
        let mut a = args.clone();
        a.extend([
            "--logs",
            logs,
            "--out",
            out.to_str().unwrap(),
            "--window",
            window,
        ]);
        let summary = cep(&a);
        assert!(summary.contains("12002 entries"), "{name}: {summary}");
        assert!(summary.trim_end().ends_with(" late=1"), "{name}: {summary}");
        check(&out, &input, 250, name);
        // The very same windows and alarms as the first configuration (the
        // sequential program): results are defined by event time.
        let mut windows = persisted(&out);
        windows.sort();
        let alarms_text = std::fs::read_to_string(out.join("alarms.log")).unwrap();
        let mut alarms: Vec<String> = alarms_text.lines().map(str::to_owned).collect();
        alarms.sort();
        assert_eq!(
            alarms.iter().filter(|l| l.starts_with("late\t")).count(),
            1,
            "{name}: the late line"
        );
        assert!(
            alarms.iter().any(|l| l.ends_with(&late)),
            "{name}: {alarms:?}"
        );
        match &reference {
            None => reference = Some((windows, alarms)),
            Some((w, a)) => {
                assert!(
                    w == &windows,
                    "{name}: windows differ from the sequential program's"
                );
                assert_eq!(
                    a, &alarms,
                    "{name}: alarms differ from the sequential program's"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    let _ = std::fs::remove_dir_all(logs);
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let out = Command::new(BIN)
        .args(["run", "--logs", "/nonexistent/leda", "--out", "/tmp/x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/leda"));
    let out = Command::new(BIN)
        .args(["run", "--scenario", "3", "--logs", "a", "--out", "b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected 1, 2 or local"));
}

/// Lines at the edge of the grammar (docs/stage-library.md § CEP): every
/// configuration must agree on which are entries, which only have a time and which
/// have none (a review, 2026-11-27: the Rust and Lua parsers disagreed).
#[test]
fn hostile_lines_are_read_alike_by_every_configuration() {
    let logs = tmp("hostile-logs");
    let files = cep(&[
        "gen",
        "--out",
        logs.to_str().unwrap(),
        "--lines",
        "3000",
        "--seed",
        "1",
    ]);
    let f1 = files.lines().next().unwrap();
    let text = std::fs::read_to_string(f1).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let at = lines.len() / 2;
    let t = {
        let l = &lines[at];
        l[l.find('[').unwrap() + 1..l.find(']').unwrap()].to_owned()
    };
    let with_time = |time: &str| {
        let l = &lines[at];
        format!(
            "{}[{time}]{}",
            &l[..l.find('[').unwrap()],
            &l[l.find(']').unwrap() + 1..]
        )
    };
    let req = r#""GET /x HTTP/1.1""#;
    // Entries: any client without spaces (IPv6, a host name), Apache's escapes.
    let entries = [
        format!(r#"2001:db8::1 - - [{t}] {req} 503 12 "-" "curl" 5000"#),
        format!(r#"host.example - - [{t}] {req} 503 12 "-" "curl" 5000"#),
        format!(r#"010.009.009.009 - - [{t}] {req} 503 12 "-" "curl" 5000"#),
        format!(r#"10.9.9.3 - - [{t}] {req} 503 12 "-" "cu\"rl" 5000"#),
        format!(r#"10.9.9.8 - - [{t}] {req} 503 - "-" "curl" 5000"#),
    ];
    // A burst of an IPv6 client: a correlate alarm.
    let burst: Vec<String> = (0..4)
        .map(|_| format!(r#"2001:db8::2 - - [{t}] {req} 404 12 "-" "curl" 100"#))
        .collect();
    // A time, but not an entry: persisted, never an alarm.
    let timed = [
        format!(r#"10.9.9.9 - - [{t}] {req} 503 12 5000"#),
        format!(r#"10.9.9.7 - - [{t}] {req} 99999 12 "-" "curl" 5000"#),
        format!(r#"10.9.9.6 - - [{t}] {req} 200 12 "-" "curl" 99999999999999999999"#),
        format!(r#"10.9.9.5 - - [{t}] {req} 200 12 "-" "curl" -5"#),
        format!(r#"10.9.9.4 - - [{t}]  {req} 503 12 "-" "curl" 5000"#),
        format!(r#"10.9.9.2 - - [{t}] {req} +503 12 "-" "curl" 5000"#),
        format!(r#"10.9.9.1 - - [{t}] {req} 503 12 "-" "curl" +5000"#),
        format!(r#"10.9.9.0 - - [{t}] {req} 503 12 "-" "curl" 5000 "#),
        // A valid but absurd time, in the middle of its source: alone, it does not
        // make the 1,500 lines after it late (`late=0` below).
        format!(r#"10.9.9.10 - - [01/Jan/9999:00:00:00 +0000] {req} 503 12 5000"#),
    ];
    // No valid time: left out (not late, not in a window), and the rest of the
    // source is not made late by an absurd future.
    let untimed: Vec<String> = [
        "22/Nov/99999999999999:00:00:00 +0000",
        "22/Nov/99999999999999999999:00:00:00 +0000",
        "22/Nov/2026:9999999999999999:00:00 +0000",
        "22/Nov/2026:00:00:00 +99999999999",
        "22/Nov/-5:00:00:00 +0000",
        "0/Nov/2026:00:00:00 +0000",
        "99/Feb/2026:00:00:00 +0000",
        "22/Nov/2026:-1:-1:-1 +0000",
        "22/Nov/+2026:+0:+0:+0 +0000",
        "22/Nov/285000000000:00:00:00 +0000",
        "22/Nov/9007199254:00:00:00 +0000",
        "22/Nov/2026:00:00:00 +1399",
        "22/Nov/0000000002026:00:00:00 +0000",
    ]
    .iter()
    .map(|time| with_time(time))
    .collect();
    let added: Vec<String> = entries
        .iter()
        .chain(&burst)
        .chain(&timed)
        .chain(&untimed)
        .cloned()
        .collect();
    lines.splice(at..at, added);
    std::fs::write(f1, lines.join("\n") + "\n").unwrap();
    let persisted_lines = 3000 + entries.len() + burst.len() + timed.len();
    let logs = logs.to_str().unwrap();
    let mut reference: Option<(String, Vec<String>, Vec<String>)> = None;
    for (name, args) in [
        ("seq", vec!["seq"]),
        ("lua-seq", vec!["lua-seq"]),
        (
            "local",
            vec!["run", "--scenario", "local", "--threads", "2"],
        ),
        ("lua", vec!["lua", "--threads", "2"]),
    ] {
        let out = tmp(&format!("hostile-{name}"));
        let mut a = args;
        a.extend(["--logs", logs, "--out", out.to_str().unwrap()]);
        a.extend(["--window", "5000"]);
        let summary = cep(&a);
        let counts = summary[summary.find(" s, ").unwrap() + 4..]
            .trim()
            .to_owned();
        assert!(
            counts.starts_with(&format!("1 windows, {persisted_lines} entries")),
            "{name}: {summary}"
        );
        assert!(counts.ends_with("late=0"), "{name}: {summary}");
        let alarms_text = std::fs::read_to_string(out.join("alarms.log")).unwrap();
        let mut alarms: Vec<String> = alarms_text.lines().map(str::to_owned).collect();
        alarms.sort();
        for e in &entries {
            assert!(
                alarms.contains(&format!("filter\t{e}")),
                "{name}: no filter alarm for {e}"
            );
        }
        assert!(
            alarms.contains(&"correlate\t2001:db8::2\t4".to_owned()),
            "{name}: {alarms:?}"
        );
        for l in &timed {
            assert!(
                !alarms.iter().any(|a| a.ends_with(l.as_str())),
                "{name}: {l}"
            );
        }
        let mut windows: Vec<String> = persisted(&out).concat();
        windows.sort();
        for l in entries.iter().chain(&timed) {
            assert!(
                windows.binary_search(l).is_ok(),
                "{name}: {l} not persisted"
            );
        }
        for l in &untimed {
            assert!(windows.binary_search(l).is_err(), "{name}: {l} persisted");
        }
        match &reference {
            None => reference = Some((counts, alarms, windows)),
            Some((c, a, w)) => {
                assert_eq!(c, &counts, "{name}: summary differs from seq's");
                assert_eq!(a, &alarms, "{name}: alarms differ from seq's");
                assert!(w == &windows, "{name}: persisted lines differ from seq's");
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    let _ = std::fs::remove_dir_all(logs);
}

fn cep_fails(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run leda-cep");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const MODES: [&[&str]; 4] = [
    &["seq"],
    &["lua-seq"],
    &["run", "--scenario", "local", "--threads", "2"],
    &["lua", "--threads", "2"],
];

/// `--window` out of 1..=1,000,000 is refused the same way by every mode, before
/// anything runs (a review, 2026-11-27: 0 gave "0 windows" and status 0 in one mode, an abort or a
/// panic in others).
#[test]
fn every_mode_refuses_a_window_out_of_range() {
    let logs = tmp("window-logs");
    cep(&["gen", "--out", logs.to_str().unwrap(), "--lines", "30"]);
    for mode in MODES {
        for size in ["0", "1000001", "99999999999999999999", "-1"] {
            let out = tmp("window-out");
            let mut a = mode.to_vec();
            let (logs, out_dir) = (logs.to_str().unwrap(), out.to_str().unwrap());
            let window = format!("--window={size}");
            a.extend(["--logs", logs, "--out", out_dir, &window]);
            let (code, stdout, stderr) = cep_fails(&a);
            assert_eq!(code, Some(2), "{a:?}: {stderr}");
            assert!(stdout.is_empty(), "{a:?}: {stdout}");
            assert!(
                stderr.contains("expected 1 to 1000000 lines")
                    || stderr.contains("expected a number of lines"),
                "{a:?}: {stderr}"
            );
            assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "{a:?}");
        }
    }
    let _ = std::fs::remove_dir_all(logs);
}

/// An unreadable log: the baselines stop with an error naming the file; the graphs
/// process what they can, print their summary, and exit non-zero because events
/// failed (a review, 2026-11-27: they exited 0).
#[test]
fn an_unreadable_log_fails_every_mode_naming_it() {
    let logs = tmp("unreadable-logs");
    let files = cep(&["gen", "--out", logs.to_str().unwrap(), "--lines", "300"]);
    let first = PathBuf::from(files.lines().next().unwrap());
    for (make, reason) in [
        (
            &(|p: &Path| std::os::unix::fs::symlink("/nonexistent/leda-cep", p))
                as &dyn Fn(&Path) -> std::io::Result<()>,
            "No such file or directory",
        ),
        (&|p: &Path| std::fs::create_dir(p), "Is a directory"),
    ] {
        let _ = std::fs::remove_file(&first);
        let _ = std::fs::remove_dir(&first);
        make(&first).unwrap();
        for mode in MODES {
            let out = tmp("unreadable-out");
            let mut a = mode.to_vec();
            a.extend([
                "--logs",
                logs.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ]);
            let (code, stdout, stderr) = cep_fails(&a);
            assert_eq!(code, Some(1), "{a:?}: {stderr}");
            let last = stderr.lines().last().unwrap_or_default();
            if mode[0].ends_with("seq") {
                let named = format!("{}: {reason}", first.display());
                assert!(last.contains(&named), "{a:?}: {last}");
            } else {
                assert!(stdout.contains(" late=0"), "{a:?}: the summary: {stdout}");
                assert!(
                    last.contains("1 event(s) failed: 1 in 'source1'"),
                    "{a:?}: {last}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(logs);
}

/// `seq` counts only its own run in an `--out` that another run used (a review, 2026-11-27: it
/// counted `run`'s persisted windows too).
#[test]
fn a_reused_out_directory_holds_only_the_last_run() {
    let logs = tmp("reused-logs");
    cep(&["gen", "--out", logs.to_str().unwrap(), "--lines", "600"]);
    let out = tmp("reused-out");
    let (logs, out) = (logs.to_str().unwrap(), out.to_str().unwrap());
    let mut summaries = Vec::new();
    for mode in [MODES[2], MODES[0], MODES[3], MODES[0], MODES[1], MODES[0]] {
        let mut a = mode.to_vec();
        a.extend(["--logs", logs, "--out", out]);
        let summary = cep(&a);
        summaries.push(summary[summary.find(" s, ").unwrap() + 4..].to_owned());
    }
    assert!(
        summaries[0].starts_with("1 windows, 600 entries"),
        "{summaries:?}"
    );
    assert!(
        summaries.iter().all(|s| s == &summaries[0]),
        "{summaries:?}"
    );
    let _ = std::fs::remove_dir_all(logs);
    let _ = std::fs::remove_dir_all(out);
}

/// The children of process `pid` (every thread's).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// `true` while process `pid` runs (neither gone nor a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()))
        .is_some_and(|state| state != 'Z')
}

/// A launcher killed (-9) once it has started a daemon, before it deploys: the daemon
/// ends with it, in the Rust and Lua variants (a review, 2026-11-27: such daemons,
/// which wait for a deployment that never comes, outlived their launcher for good).
#[test]
fn daemons_end_with_a_launcher_killed_before_deploying() {
    let logs = tmp("orphan-logs");
    cep(&["gen", "--out", logs.to_str().unwrap(), "--lines", "300"]);
    for mode in ["run", "lua"] {
        let out = tmp("orphan-out");
        let mut launcher = Command::new(BIN)
            .args([mode, "--scenario", "2", "--logs"])
            .arg(&logs)
            .arg("--out")
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run leda-cep");
        let daemon = loop {
            if let Some(&d) = children(launcher.id()).first() {
                break d;
            }
            assert!(
                launcher.try_wait().unwrap().is_none(),
                "{mode}: the launcher ended before starting a daemon"
            );
            std::thread::yield_now();
        };
        launcher.kill().unwrap();
        launcher.wait().unwrap();
        // (Not a bound on how soon it ends: only a guard against waiting for ever.)
        let guard = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while alive(daemon) {
            if std::time::Instant::now() > guard {
                let _ = Command::new("kill")
                    .args(["-9", &daemon.to_string()])
                    .status();
                panic!("{mode}: daemon {daemon} outlived its launcher (killed it now)");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(logs);
}
