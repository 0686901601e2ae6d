//! Local daemon processes for one-command runs (the `--spawn` mode and the tests):
//! children of the same binary listening on 127.0.0.1 with ephemeral ports, killed
//! and reaped on drop.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The line a daemon prints once bound: `LISTENING <addr>`.
pub const LISTENING: &str = "LISTENING ";

/// One daemon child.
#[derive(Debug)]
pub struct DaemonChild {
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// Its listening address.
    pub addr: String,
}

impl DaemonChild {
    /// Starts `exe daemon --listen 127.0.0.1:0 --once EXTRA...` (it exits after one
    /// run) and waits for its address.
    pub fn spawn(exe: &Path, extra: &[&str]) -> std::io::Result<DaemonChild> {
        let mut child = leda_net::daemon::end_with_parent(&mut Command::new(exe))
            .args(["daemon", "--listen", "127.0.0.1:0", "--once"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("daemon stdout not captured"));
        };
        let mut stdout = BufReader::new(out);
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        match line.strip_prefix(LISTENING) {
            Some(addr) if read.is_ok() => {
                let addr = addr.trim().to_owned();
                Ok(DaemonChild {
                    child,
                    stdout,
                    addr,
                })
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(std::io::Error::other(format!(
                    "daemon did not report its address (got {line:?})"
                )))
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `limit` for the daemon to exit on its own; returns `true` if it
    /// exited successfully, and its remaining output.
    pub fn finish(mut self, limit: Duration) -> (bool, String) {
        let deadline = Instant::now() + limit;
        let ok = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                _ => break false,
            }
        };
        let mut rest = String::new();
        if ok {
            let _ = self.stdout.read_to_string(&mut rest);
        }
        (ok, rest)
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Starts `n` daemons of `exe`.
pub fn spawn_many(exe: &Path, n: usize, extra: &[&str]) -> std::io::Result<Vec<DaemonChild>> {
    (0..n).map(|_| DaemonChild::spawn(exe, extra)).collect()
}
