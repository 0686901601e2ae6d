//! The grep example end to end: a real process, real files.

use std::process::Command;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("leda-grep-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn prints_captures_of_matching_lines_from_every_file() {
    let d = temp_dir("ok");
    std::fs::write(
        d.join("a.txt"),
        "order 17 shipped\nnothing here\norder 4 lost\n",
    )
    .unwrap();
    std::fs::write(d.join("b.txt"), "no orders\norder 99 shipped\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_grep"))
        .args([
            r"order (\d+) (\w+)",
            d.join("a.txt").to_str().unwrap(),
            d.join("b.txt").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, vec!["17\tshipped", "4\tlost", "99\tshipped"]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn missing_file_goes_to_io_error_and_exit_code_2_while_others_are_searched() {
    let d = temp_dir("missing");
    std::fs::write(d.join("a.txt"), "needle\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_grep"))
        .args([
            "needle",
            "/nonexistent/file",
            d.join("a.txt").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "needle\n");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent/file\tOpen error"), "{err}");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn bad_pattern_is_refused_by_bind_before_running() {
    let out = Command::new(env!("CARGO_BIN_EXE_grep"))
        .args(["(", "/dev/null"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("bind of stage 'match' refused the graph: bad pattern"),
        "{err}"
    );
}

/// Nobody reading its output any more (`grep ... | head -1`): the run ends, with no log
/// line per remaining match (there was one WARN per line, 200,000 of them, and exit 1).
#[test]
fn a_closed_stdout_ends_the_run() {
    let d = temp_dir("pipe");
    let text: String = (0..200_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(d.join("n.txt"), text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grep"))
        .args([r"line (\d+)", d.join("n.txt").to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines().count() < 10,
        "{} lines on stderr",
        err.lines().count()
    );
}
