//! Helpers of the multi-process tests: daemons as real child processes on loopback
//! with ephemeral ports, always reaped.

#![allow(dead_code)]

pub mod pki;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A daemon child process, killed and reaped on drop.
pub struct Node {
    child: Child,
    /// Its address (`127.0.0.1:PORT`).
    pub addr: String,
    stdout: BufReader<ChildStdout>,
}

impl Node {
    /// Starts `leda-net-test-node daemon --listen 127.0.0.1:0 --once EXTRA...` (it
    /// exits after one run) and waits for its `LISTENING` line.
    pub fn spawn(extra: &[&str]) -> Node {
        let mut args = vec!["daemon", "--listen", "127.0.0.1:0", "--once"];
        args.extend_from_slice(extra);
        Node::start(&args, None)
    }

    /// Starts `leda-net-test-node daemon --listen 127.0.0.1:0 EXTRA...`, a daemon that
    /// serves deployment after deployment, under TLS with `tls` (mutual certificates).
    pub fn daemon(extra: &[&str], tls: Option<&leda_net::TlsConfig>) -> Node {
        let mut args: Vec<String> = ["daemon", "--listen", "127.0.0.1:0"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        if let Some(t) = tls {
            args.extend(pki::tls_args(t));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Node::start(&args, None)
    }

    /// Starts `leda-net-test-node ARGS...`, inside network namespace `netns` if given
    /// (`ip netns exec`), and waits for its `LISTENING` line.
    pub fn start(args: &[&str], netns: Option<&str>) -> Node {
        Node::start_env(args, netns, &[])
    }

    /// [`Node::start`] with extra environment variables.
    pub fn start_env(args: &[&str], netns: Option<&str>, env: &[(&str, &str)]) -> Node {
        let exe = env!("CARGO_BIN_EXE_leda-net-test-node");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, exe]);
                c
            }
            None => Command::new(exe),
        };
        let mut child = cmd
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the test node");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading LISTENING");
        let addr = line
            .strip_prefix("LISTENING ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim()
            .to_owned();
        Node {
            child,
            addr,
            stdout,
        }
    }

    /// Kills the process now (a crash, as far as its peers can tell).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the process to exit; returns its status and the rest of
    /// its stdout.
    pub fn finish(mut self, limit: Duration) -> (Option<ExitStatus>, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break None,
            }
        };
        let mut rest = String::new();
        if status.is_some() {
            let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        }
        (status, rest)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads its next line of output (blocking; empty at the end of its output).
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        line
    }

    /// `true` while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leda-net-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Polls `cond` until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// A small good run on `node` (10 events from `launcher:1` to a collector there):
/// proves the daemon still serves. Needs the test crate's `stages` module.
pub fn good_run(node: &Node, launcher: leda_net::Launcher) -> Result<i64, leda_net::NetError> {
    let gen_ = crate::stages::generator("gen");
    let collect = crate::stages::collect("collect").attr("expect", 10);
    let mut g = leda_core::graph::Graph::new("good");
    g.connect(&gen_, 1, &collect);
    g.part([
        leda_core::cluster::Cluster::of([&gen_]),
        leda_core::cluster::Cluster::of([&collect]),
    ])
    .unwrap()
    .map(["launcher:1", node.addr.as_str()])
    .unwrap();
    gen_.push((10, 0, false));
    let r = launcher.run(&g, leda_core::runtime::Run::default().threads(1))?;
    Ok(r.run
        .quit
        .and_then(|q| q.arg(0).and_then(leda_core::value::Value::as_int))
        .unwrap_or(-1))
}
