//! What the multi-process tests share: the `lock-service` binary, children reaped on drop,
//! and daemons started on an ephemeral loopback port.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The `lock-service` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_lock-service");

/// A child process, killed (SIGKILL) and reaped on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `lock-service daemon --listen 127.0.0.1:0` with `envs` set (and no
/// `LEDA_SECRET`), and returns it with the address it printed (`LISTENING ADDR`).
#[allow(dead_code)] // not every test file starts bare daemons
pub fn daemon(envs: &[(&str, &str)]) -> (Proc, String) {
    let mut child = Proc(
        Command::new(BIN)
            .args(["daemon", "--listen", "127.0.0.1:0", "--once"])
            .env_remove("LEDA_SECRET")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning a daemon"),
    );
    let mut out = BufReader::new(child.0.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("reading LISTENING");
    let addr = line
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim()
        .to_owned();
    (child, addr)
}
