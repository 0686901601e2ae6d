//! The `leda` command on the thesis' grep application (Listings 4.1–4.6).

#[path = "../../leda-lua/tests/common/mod.rs"]
mod common;
#[path = "../../leda-net/tests/common/pki.rs"]
mod pki;

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
        "--allow",
        "io",
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

/// Handlers get no files unless the process allows them: the grep's `lines` stage
/// (`require 'io'`) fails, saying how to allow it; `--allow` refuses unknown names.
#[test]
fn handlers_need_allow_io_for_files() {
    let dir = common::tempdir();
    let a = dir.join("a.txt");
    std::fs::write(&a, "a test line\n").unwrap();
    let script = grep_dir().join("grep.lua");
    let out = leda(&["run", script.to_str().unwrap(), "test", a.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(text(&out.stdout), "", "nothing read: {err}");
    assert!(err.contains("start it with --allow io"), "{err}");
    let out = leda(&["run", "--allow", "io,disk", script.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown capability 'disk'"));
}

/// A missing file: the other files are still searched, the failure is logged, and the
/// run ends with status 1 and its summary (as the Rust grep exits non-zero).
#[test]
fn grep_reports_a_missing_file_goes_on_and_fails() {
    let dir = common::tempdir();
    let a = dir.join("a.txt");
    std::fs::write(&a, "one test\n").unwrap();
    let script = grep_dir().join("grep.lua");
    let out = leda(&[
        "run",
        "--allow",
        "io",
        script.to_str().unwrap(),
        "test",
        "/no/such/file",
        a.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "test\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("stage 'lines'") && err.contains("lines.lua:9"),
        "{err}"
    );
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.contains("1 event(s) failed: 1 in 'lines' (this process)")),
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

    // Listing 4.4 (app.lua) run as the program: one cluster in this process.
    let app = grep_dir().join("app.lua");
    let out = leda(&["check", app.to_str().unwrap(), "test", "x.txt"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("one cluster"));
    // Without a pattern, Listing 4.3's bind refuses, naming the file and line.
    let out = leda(&["check", app.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("Pattern field must be defined") && e.contains("match.lua:19"),
        "{e}"
    );
}

/// `leda graph --dot` renders with Graphviz (`dot`) when it is installed; the DOT is
/// checked for its clusters and edges either way.
#[test]
fn dot_output_renders() {
    let main = grep_dir().join("main.lua");
    let out = leda(&["graph", "--dot", main.to_str().unwrap(), "test"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dot = text(&out.stdout);
    assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "{dot}");
    assert!(dot.trim_end().ends_with('}'), "{dot}");
    assert!(
        dot.contains("\"lines\" -> \"match\"") && dot.contains("\"match\" -> \"print\""),
        "{dot}"
    );
    let rendered = Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = rendered else {
        eprintln!("graphviz is not installed: the DOT was checked, not rendered");
        return;
    };
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(dot.as_bytes()).expect("feed dot");
    }
    let out = child.wait_with_output().expect("dot");
    assert!(out.status.success(), "dot: {}", text(&out.stderr));
    let svg = text(&out.stdout);
    assert!(
        svg.contains("<svg") && svg.contains("cluster 2 @ 127.0.0.1:9998"),
        "{svg}"
    );
}

/// A child process that is killed and reaped however the test ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a daemon (`args` are the leda arguments) and reads the address it listens on
/// from its readiness line on standard output (`LISTENING ADDR`); the rest of its
/// standard output comes from the returned thread once it exits.
fn daemon(args: &[&str]) -> (Child, String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_leda"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the daemon"),
    );
    let out = child.0.stdout.take().expect("stdout");
    let err = child.0.stderr.take().expect("stderr");
    let mut lines = BufReader::new(out).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the daemon announces its address")
            .expect("read stdout");
        if let Some(rest) = line.strip_prefix("LISTENING ") {
            break rest.to_owned();
        }
    };
    // Keep draining both so the daemon never blocks on a full pipe.
    let rest = std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .map(|l| l + "\n")
            .collect::<String>()
    });
    std::thread::spawn(move || BufReader::new(err).lines().for_each(drop));
    (child, addr, rest)
}

/// Waits up to `secs` for the child to exit; returns its standard output.
fn finish(mut child: Child, secs: u64, rest: std::thread::JoinHandle<String>) -> (bool, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(st) = child.0.try_wait().expect("wait") {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.0.kill();
    }
    let out = rest.join().unwrap_or_default();
    (status.is_some_and(|s| s.success()), out)
}

fn grep_files() -> (PathBuf, PathBuf) {
    let dir = common::tempdir();
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    std::fs::write(&a, "a test line\nnothing here\nanother test\n").unwrap();
    std::fs::write(&b, "tests: 3\n").unwrap();
    (a, b)
}

/// Listing 4.5 over two processes: the printer in the daemon, the rest here. The
/// listing maps the printer to 127.0.0.1:9999; `--map` points that at the daemon's
/// ephemeral port, and the launcher finds its own address (9998, where nothing
/// listens) by probing.
fn grep_across(daemon_args: &[&str], launcher_args: &[&str]) {
    let (child, addr, rest) = daemon(daemon_args);
    let (a, b) = grep_files();
    let main = grep_dir().join("main.lua");
    let alias = format!("127.0.0.1:9999={addr}");
    // The lines stage (here) reads files.
    let mut args = vec!["run", "--allow", "io", "--map", &alias];
    args.extend_from_slice(launcher_args);
    args.extend([
        main.to_str().unwrap(),
        "(t%w+)",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    let out = leda(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The printer runs in the daemon: nothing is printed here.
    assert_eq!(text(&out.stdout), "");
    let (ok, printed) = finish(child, 20, rest);
    assert!(ok, "the daemon ends with the run");
    let mut lines: Vec<&str> = printed.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["test", "tests", "ther", "thing"]);
}

#[test]
fn grep_runs_over_two_processes_with_leda_start() {
    // The launcher finds its own address by probing.
    grep_across(
        &[
            "start",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--threads",
            "2",
        ],
        &[],
    );
}

#[test]
fn grep_runs_over_two_processes_with_a_leda_start_under_the_automatic_controller() {
    grep_across(
        &[
            "start",
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--auto-threads",
            "1,3",
        ],
        &[],
    );
    for bad in ["3,1", "0,2", "4"] {
        let out = leda(&["start", "--auto-threads", bad]);
        assert!(!out.status.success(), "--auto-threads {bad} accepted");
    }
}

/// Runs the grep example with its daemon started by the Lua script `script` (`leda.start`
/// on 127.0.0.1:9999, mapped to a free port); the launcher is told its own address.
fn grep_across_lua_daemon(script: &std::path::Path) {
    grep_across(
        &[
            "run",
            "--map",
            "127.0.0.1:9999=127.0.0.1:0",
            script.to_str().unwrap(),
        ],
        &["--process", "127.0.0.1:9998"],
    );
}

#[test]
fn grep_runs_over_two_processes_with_listing_4_6() {
    // daemon.lua is Listing 4.6 (leda.start{controller=..., host=..., port=9999}).
    grep_across_lua_daemon(&grep_dir().join("daemon.lua"));
}

#[test]
fn a_daemon_started_from_lua_runs_its_deployment_under_the_automatic_controller() {
    // Listing 4.6 with `leda.controller.auto` instead of a fixed pool.
    let dir = std::env::temp_dir().join(format!("leda-auto-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("daemon.lua");
    std::fs::write(
        &script,
        "require 'leda'\n\
         local c = require 'leda.controller.auto'.get(1, 4)\n\
         leda.start{controller = c, host = '127.0.0.1', port = 9999}\n",
    )
    .unwrap();
    grep_across_lua_daemon(&script);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn start_refuses_a_public_address_without_a_secret() {
    let out = Command::new(env!("CARGO_BIN_EXE_leda"))
        .args(["start", "--listen", "0.0.0.0:0"])
        .env_remove("LEDA_SECRET")
        .output()
        .expect("run leda");
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("requires a configured shared secret"), "{e}");
}

#[test]
fn run_says_which_process_it_cannot_identify() {
    // No daemon anywhere: both mapped addresses are free, so this process cannot
    // tell which one it is.
    let main = grep_dir().join("main.lua");
    let out = leda(&[
        "run",
        "--map",
        "127.0.0.1:9999=127.0.0.1:1",
        "--map",
        "127.0.0.1:9998=127.0.0.1:2",
        main.to_str().unwrap(),
        "test",
        "x.txt",
    ]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("cannot tell which mapped process is this one") && e.contains("main.lua:26"),
        "{e}"
    );
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

/// `graph:run{on_process_loss=...}` with a daemon killed (-9) in the middle of the
/// run: by default `leda run` fails naming the lost daemon; with `'continue'` the
/// stage named by `notify` is told and the script goes on (here it quits).
#[test]
fn lua_runs_end_or_go_on_when_a_daemon_is_killed() {
    let dir = common::tempdir();
    let script = dir.join("loss.lua");
    std::fs::write(
        &script,
        r#"require 'leda'
local policy = arg[1]
local src = leda.stage "src" { handler = function()
    for i = 1, 100000000 do
        if not leda.send(1, i) then leda.sleep(0.001) end
    end
end, autostart = true }
local work = leda.stage "work" { handler = function(i) leda.sleep(0.001) end }
local watch = leda.stage "watch" { handler = function(what, addr)
    print(what .. " " .. addr)
    leda.quit()
end }
local g = leda.graph{ src:connect(work), watch }
g:part(leda.cluster(src, watch), leda.cluster(work))
g:map("127.0.0.1:9998", "127.0.0.1:9999")
if policy == "continue" then
    g:run{ on_process_loss = "continue", notify = "watch", until_idle = false }
else
    g:run{ until_idle = false }
end
"#,
    )
    .unwrap();
    for policy in ["end", "continue"] {
        let (mut child, addr, _rest) = daemon(&["start", "--listen", "127.0.0.1:0"]);
        let alias = format!("127.0.0.1:9999={addr}");
        let run = Command::new(env!("CARGO_BIN_EXE_leda"))
            .args(["run", "--map", &alias, "--process", "127.0.0.1:9998"])
            .args([script.to_str().unwrap(), policy])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("leda run");
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let _ = child.0.kill();
        let _ = child.0.wait();
        let t0 = std::time::Instant::now();
        let out = run.wait_with_output().expect("leda run ends");
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(5),
            "{policy}: {took:?}"
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        if policy == "end" {
            assert!(!out.status.success(), "{policy}: {stdout} {stderr}");
            assert!(
                stderr.contains(&format!("process {addr} (cluster 1: work) was lost")),
                "{policy}: {stderr}"
            );
        } else {
            assert!(out.status.success(), "{policy}: {stderr}");
            assert!(
                stdout.contains(&format!("process_lost {addr}")),
                "{policy}: {stdout} {stderr}"
            );
        }
    }
}

/// `leda run`'s own flags after the script are refused (they would silently become the
/// script's arguments), unless passed on after `--`; `--threads 0` is refused; a
/// dashboard address that cannot be bound fails the run before anything is announced.
#[test]
fn misplaced_flags_zero_threads_and_unbindable_dashboards_are_refused() {
    let dir = common::tempdir();
    let script = dir.join("args.lua");
    std::fs::write(&script, "print(table.concat(arg, ' '))").unwrap();
    let s = script.to_str().unwrap();
    let out = leda(&["run", s, "x", "--dashboard", "127.0.0.1:0"]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("--dashboard comes after the script") && e.lines().count() == 1,
        "{e}"
    );
    let out = leda(&["run", s, "x", "--", "--dashboard", "y"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "x --dashboard y");
    let out = leda(&["run", "--threads", "0", s]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("at least 1"),
        "{}",
        text(&out.stderr)
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = leda(&["run", "--dashboard", &addr, s]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        !e.contains("dashboard on http"),
        "announced before binding: {e}"
    );
    assert!(e.contains(&format!("dashboard on {addr}")), "{e}");
    // Said once: the OS error is not repeated by its wrapper.
    assert_eq!(e.matches("in use").count(), 1, "{e}");
}

/// A run in which handlers failed exits 1 with a one-line summary naming each stage
/// and process, here and on a daemon; `--allow-failures` keeps status 0.
#[test]
fn failed_handlers_here_and_on_a_daemon_make_the_run_fail() {
    let dir = common::tempdir();
    let script = dir.join("fail.lua");
    std::fs::write(
        &script,
        r#"require 'leda'
local src = leda.stage "src" { handler = function(n)
    for i = 1, n do leda.send(1, i) end
    error("src fails once")
end }
local odd = leda.stage "odd" { handler = function(i)
    if i % 2 == 1 then error("odd " .. i) end
end }
local g = leda.graph{ src:connect(odd) }
if arg[1] then
    g:part(leda.cluster(src), leda.cluster(odd))
    g:map("127.0.0.1:9998", arg[1])
end
src:push(6)
g:run()
"#,
    )
    .unwrap();
    let s = script.to_str().unwrap();
    let out = leda(&["run", s]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    let last = e.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leda: 4 event(s) failed")
            && last.contains("1 in 'src' (this process)")
            && last.contains("3 in 'odd' (this process)"),
        "{e}"
    );
    assert!(leda(&["run", "--allow-failures", s]).status.success());
    // The failing stage on a daemon: its failures reach the launcher's summary.
    let (mut child, addr, _rest) = daemon(&["start", "--listen", "127.0.0.1:0"]);
    let out = leda(&["run", "--process", "127.0.0.1:9998", s, &addr]);
    let _ = child.0.kill();
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.lines()
            .last()
            .is_some_and(|l| l.contains(&format!("3 in 'odd' ({addr})"))),
        "{e}"
    );
}

/// With stderr closed (`leda run ... 2>&1 | head -1`), failures that are logged do not
/// take the run down: each log line that cannot be written is dropped. Before, the
/// logger's fallback `eprintln!` panicked on the worker reporting a failed event, and the
/// run hung for ever (or the final message panicked, exit 101).
#[test]
fn a_closed_stderr_neither_hangs_nor_panics_a_run() {
    let dir = std::env::temp_dir().join(format!("leda-cli-stderr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("fail.lua");
    std::fs::write(
        &script,
        "local s = leda.stage{ handler = function(i) error('failing ' .. i) end }\n\
         for i = 1, 200 do s:push(i) end\n\
         leda.graph{ s }:run()\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_leda"))
        .arg("run")
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run hung with stderr closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // 200 events failed: exit 1 (not the 101 of a panic).
    assert_eq!(status.code(), Some(1), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `leda start` and `leda run` speak mutual TLS when given the same CA: a graph mapped to
/// a TLS daemon runs; a launcher without TLS is refused by it. Before, neither command
/// had the flags, and every deployment from them crossed the network in plain TCP.
#[test]
fn leda_start_and_run_speak_tls() {
    let dir = std::env::temp_dir().join(format!("leda-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = pki::pki(&dir, "p");
    let tls_args = pki::tls_args(&c);
    let tls: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    // A key others may read is refused, as a secret file is.
    let mode =
        |m| std::fs::set_permissions(&c.key, std::os::unix::fs::PermissionsExt::from_mode(m));
    mode(0o644).unwrap();
    let out = leda(&[&["start", "--listen", "127.0.0.1:0", "--once"][..], &tls].concat());
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("readable by other users"),
        "{}",
        text(&out.stderr)
    );
    mode(0o600).unwrap();
    let script = dir.join("tls.lua");
    std::fs::write(
        &script,
        r#"
local work = leda.stage{ name = 'work', handler = function(x) leda.send(1, x * 2) end }
local back = leda.stage{ name = 'back', handler = function(y) print('BACK', y); leda.quit(y) end }
local g = leda.graph{ leda.connect(work, 1, back) }
g:part(leda.cluster(work), leda.cluster(back))
g:map('127.0.0.1:9999', '127.0.0.1:9998')
work:push(21)
g:run()
"#,
    )
    .unwrap();
    let run = |with_tls: bool, addr: &str| {
        let alias = format!("127.0.0.1:9999={addr}");
        let mut c = Command::new(env!("CARGO_BIN_EXE_leda"));
        c.args(["run", "--map", &alias, "--process", "127.0.0.1:9998"]);
        if with_tls {
            c.args(&tls);
        }
        c.arg(&script).output().expect("leda run")
    };
    let mut start = vec!["start", "--listen", "127.0.0.1:0", "--once"];
    start.extend(&tls);
    let (child, addr, rest) = daemon(&start);
    // A launcher without TLS gets no deployment through (and the daemon serves on).
    let out = run(false, &addr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--tls-cert"),
        "{}",
        text(&out.stderr)
    );
    let out = run(true, &addr);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("BACK\t42"),
        "{}",
        text(&out.stdout)
    );
    let (exited, _) = finish(child, 10, rest);
    assert!(exited);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A deployed handler stuck where nothing can interrupt it (a pattern match that
/// backtracks for ever, in C) does not keep the daemon from its next deployment: once
/// the run has ended, the daemon waits 5 s for it, leaves its thread behind and serves
/// on. Before, every later deployment was refused ("is running another deployment")
/// until the daemon was restarted.
#[test]
fn a_handler_stuck_in_c_does_not_hold_a_daemon() {
    let dir = std::env::temp_dir().join(format!("leda-cli-stuck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("stuck.lua");
    std::fs::write(
        &script,
        r#"
local mode = arg[1]
local work = leda.stage{ name = 'work', handler = function(m)
  if m == 'stuck' then
    local string = require 'string'
    string.find(string.rep('a', 60), string.rep('a-', 30) .. 'b')
  end
  leda.send(1, 'done')
end }
local back = leda.stage{ name = 'back', handler = function(x) leda.quit(x) end }
local timer = leda.stage{ name = 'stop', handler = function()
  leda.sleep(0.5); leda.quit('stopped')
end, autostart = true }
local g = leda.graph{ leda.connect(work, 1, back), timer }
g:part(leda.cluster(work), leda.cluster(back, timer))
g:map('127.0.0.1:9999', '127.0.0.1:9998')
work:push(mode)
print(g:run())
"#,
    )
    .unwrap();
    let (_child, addr, _rest) = daemon(&["start", "--listen", "127.0.0.1:0"]);
    let run = |mode: &str| {
        let alias = format!("127.0.0.1:9999={addr}");
        Command::new(env!("CARGO_BIN_EXE_leda"))
            .args(["run", "--map", &alias, "--process", "127.0.0.1:9998"])
            .arg(&script)
            .arg(mode)
            .output()
            .expect("leda run")
    };
    let out = run("stuck");
    assert!(
        text(&out.stdout).contains("stopped"),
        "{}",
        text(&out.stderr)
    );
    // The daemon serves the next deployment once it has left the stuck thread behind.
    let t0 = std::time::Instant::now();
    let out = loop {
        let out = run("quick");
        if out.status.success() || t0.elapsed() > std::time::Duration::from_secs(30) {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(text(&out.stdout).contains("done"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
