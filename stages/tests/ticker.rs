//! The stock ticker (Listing 5.1, `examples/lua/ticker`) end to end: the real `leda`
//! binary runs `quotes.lua` (the local page server) and `ticker.lua` (the listing,
//! seven quotes 50 ms apart); the printed averages are checked against the page's
//! quotes computed here independently.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills and reaps a child process when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `leda` binary of this workspace (built by `cargo test --workspace`, as
/// leda-lua's own tests need it; built here, from leda-cli, if missing).
fn leda() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("leda");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", "leda-cli", "--bin", "leda"])
            .status()
            .expect("cargo build leda");
        assert!(st.success(), "building leda failed");
    }
    bin
}

/// The quotes `quotes.lua` serves, request after request (its formula, in Rust).
fn quotes(n: usize) -> Vec<f64> {
    let mut price = 21.40f64;
    (1..=n as i64)
        .map(|i| {
            price += ((i * 37) % 11 - 5) as f64 / 100.0;
            format!("{price:.2}").parse().unwrap()
        })
        .collect()
}

#[test]
fn ticker_prints_the_mean_of_the_last_five_quotes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/lua/ticker");
    let leda = leda();
    let mut server = Reap(
        Command::new(&leda)
            .arg("run")
            .arg(dir.join("quotes.lua"))
            .arg("0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start quotes.lua"),
    );
    let mut url = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let mut ticker = Reap(
        Command::new(&leda)
            .arg("run")
            .arg(dir.join("ticker.lua"))
            .args([url.as_str(), "7", "0.05"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ticker.lua"),
    );
    // Seven quotes make three windows of five; the run ends when idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = ticker.0.try_wait().unwrap() {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "ticker did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(ticker.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(ticker.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "ticker failed: {err}");

    let printed: Vec<f64> = out.lines().map(|l| l.trim().parse().expect(l)).collect();
    let q = quotes(7);
    let want: Vec<f64> = (0..3)
        .map(|i| q[i..i + 5].iter().sum::<f64>() / 5.0)
        .collect();
    assert_eq!(printed.len(), 3, "{out}");
    for (p, w) in printed.iter().zip(&want) {
        assert!(
            (p - w).abs() < 1e-9,
            "printed {printed:?}, expected {want:?}"
        );
    }
}
