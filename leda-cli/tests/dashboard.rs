//! `leda run --dashboard ADDR` serves the live dashboard of the script's run, and
//! `leda plot` charts a statistics file.

#[path = "../../leda-lua/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leda_core::stats::{Snapshot, StageSnapshot};

/// Kills and reaps the child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    Some((status, out.split_once("\r\n\r\n")?.1.to_owned()))
}

#[test]
fn run_serves_the_dashboard_of_the_script() {
    let dir = common::tempdir();
    let script = dir.join("tick.lua");
    std::fs::write(
        &script,
        r#"require 'leda'
        local tick = leda.stage "tick" { handler = function() leda.sleep(2); leda.quit() end }
        local g = leda.graph{ tick }
        tick:push()
        g:run()
        "#,
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_leda"))
        .args(["run", "--dashboard", "127.0.0.1:0"])
        .arg(&script)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run leda");
    let mut child = Reaped(child);
    // leda announces the port it picked.
    let mut stderr = BufReader::new(child.0.stderr.take().expect("piped stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("the announcement");
    let addr = line
        .trim()
        .strip_prefix("leda: dashboard on http://")
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(!addr.ends_with(":0"), "{addr}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        if let Some((200, body)) = get(&addr, "/stats") {
            break body;
        }
        assert!(Instant::now() < deadline, "no dashboard on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let snap: Snapshot = serde_json::from_str(&stats).unwrap();
    assert!(snap.stage("tick").is_some(), "{stats}");
    let (code, metrics) = get(&addr, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains(r#"leda_stage_events_in_total{process="local",stage="tick"} 1"#),
        "{metrics}"
    );
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    let status = child.0.wait().expect("leda exits");
    assert!(status.success(), "{err}");
}

#[test]
fn plot_writes_a_png_and_refuses_bad_input() {
    let dir = common::tempdir();
    let stats = dir.join("stats.jsonl");
    let lines: Vec<String> = (0..5)
        .map(|i| {
            serde_json::to_string(&Snapshot {
                time: f64::from(i),
                stages: vec![StageSnapshot {
                    name: "s".into(),
                    queue_len: i as usize * 2,
                    throughput: 10.0 * f64::from(i),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .unwrap()
        })
        .collect();
    std::fs::write(&stats, lines.join("\n")).unwrap();
    let png = dir.join("out.png");
    let out = Command::new(env!("CARGO_BIN_EXE_leda"))
        .arg("plot")
        .arg(&stats)
        .arg("-o")
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&png)
            .unwrap()
            .starts_with(b"\x89PNG\r\n\x1a\n")
    );

    std::fs::write(&stats, "{not json\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_leda"))
        .arg("plot")
        .arg(&stats)
        .arg("-o")
        .arg(dir.join("bad.png"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stats.jsonl:1: not a statistics snapshot"),
        "{err}"
    );
    assert!(!dir.join("bad.png").exists());
}
