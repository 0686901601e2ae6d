//! End to end: `leda-cep` on a small seeded log, in every configuration (scenario 1
//! and 2 across processes, one process, Lua handlers, the Rust and Lua sequential baselines). The
//! expected alarms are computed here, independently of the crate's code: filter
//! alarms from the input lines, correlate alarms from the windows `persist` wrote.
//! Windows are cut by event time, so every configuration must give the very same
//! windows and alarms (a line later than the lateness bound, a line without a time and one
//! with an unreadable address included).

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
    // Bad input, which every configuration must treat alike: a line with a time but
    // an unreadable client address (an entry: persisted, neither filtered nor
    // correlated) and a line without a time (left out, with a warning).
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
