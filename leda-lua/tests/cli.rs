//! The `leda` command on the thesis' grep application (Listings 4.1–4.6).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn leda(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leda"))
        .args(args)
        .output()
        .expect("run leda")
}

fn grep_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lua/grep")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn grep_runs_in_one_process() {
    let dir = common::tempdir();
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    std::fs::write(&a, "a test line\nnothing here\nanother test\n").unwrap();
    std::fs::write(&b, "tests: 3\n").unwrap();
    let script = grep_dir().join("grep.lua");
    let out = leda(&[
        "run",
        script.to_str().unwrap(),
        "(t%w+)",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    assert_eq!(lines, vec!["test", "tests", "ther", "thing"]);
}

#[test]
fn grep_reports_a_missing_file_and_goes_on() {
    let dir = common::tempdir();
    let a = dir.join("a.txt");
    std::fs::write(&a, "one test\n").unwrap();
    let script = grep_dir().join("grep.lua");
    let out = leda(&[
        "run",
        script.to_str().unwrap(),
        "test",
        "/no/such/file",
        a.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "test\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("stage 'lines'") && err.contains("lines.lua:9"),
        "{err}"
    );
}

#[test]
fn check_and_dot_show_partition_and_mapping() {
    let main = grep_dir().join("main.lua");
    let out = leda(&["check", main.to_str().unwrap(), "test", "x.txt"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("lines.line -> match (local)"), "{s}");
    assert!(s.contains("match.match -> print (decoupled)"), "{s}");
    assert!(s.contains("cluster 1 {print} @ 127.0.0.1:9999"), "{s}");
    assert!(
        s.contains("cluster 2 {lines, match} @ 127.0.0.1:9998"),
        "{s}"
    );
    assert!(s.ends_with("ok\n"), "{s}");

    let out = leda(&["graph", "--dot", main.to_str().unwrap(), "test"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("digraph"), "{s}");
    assert!(
        s.contains("subgraph cluster_0") && s.contains("label=\"line (local)\""),
        "{s}"
    );

    // Listing 4.4 alone returns its graph: check it too.
    let app = grep_dir().join("app.lua");
    let out = leda(&["check", app.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("one cluster"));
}

#[test]
fn multi_process_run_and_start_need_leda_net() {
    let main = grep_dir().join("main.lua");
    let out = leda(&["run", main.to_str().unwrap(), "test", "x.txt"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("main.lua:26") && e.contains("needs leda-net"),
        "{e}"
    );
    let daemon = grep_dir().join("daemon.lua");
    let out = leda(&["run", daemon.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("needs leda-net"));
    let out = leda(&["start", "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("needs leda-net"));
}

#[test]
fn bad_script_and_bind_failure_exit_nonzero() {
    let dir = common::tempdir();
    let bad = dir.join("bad.lua");
    std::fs::write(
        &bad,
        "require 'leda'\nlocal s = leda.stage{ handler = function() end\n",
    )
    .unwrap();
    let out = leda(&["check", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("bad.lua:"),
        "{}",
        text(&out.stderr)
    );

    // Listing 4.3's bind refuses a graph where 'match' is not connected.
    let script = dir.join("unbound.lua");
    std::fs::write(
        &script,
        format!(
            "package.path = '{}/?.lua;' .. package.path\nlocal m = require 'stage.match'\nreturn leda.graph{{ m }}:run()\n",
            grep_dir().display()
        ),
    )
    .unwrap();
    let out = leda(&["check", script.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("'match' port must be connected"), "{e}");
}
