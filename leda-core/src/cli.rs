//! The conventions every Leda-RS command follows (feature `cli`), in one place so that
//! they cannot drift apart:
//!
//! - **Logs** go to stderr, filtered by `RUST_LOG` (tracing's env-filter syntax, default
//!   `warn`), with colour only when stderr is a terminal ([`init_logging`]).
//! - **Errors** end the command with one line, `PROG: error: cause: cause`, each cause
//!   said once, and status 1 ([`exit`]); the backtrace only when asked for with
//!   `RUST_LIB_BACKTRACE=1` (a `RUST_BACKTRACE` set for the program's own panics does
//!   not print one for every error).
//! - **Daemons** announce readiness with one line on stdout, `LISTENING ADDR`, once
//!   bound ([`announce_listening`]); a listener bound by the standard library queues
//!   1,024 connections, not 128 ([`lengthen_accept_queue`]).
//! - **Counts** such as `--threads` are at least 1 ([`at_least_one`], a clap value
//!   parser); unset, `--threads` is one per CPU.
//! - **Long runs** show they are alive ([`Progress`]): a spinner with the elapsed time on
//!   a terminal, a line every few seconds on stderr otherwise.
//!
//! This module only formats and installs; what a command does is its own.

use std::error::Error;
use std::fmt::Display;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Installs the log subscriber: stderr, `RUST_LOG` or else `default` (e.g. `"warn"`),
/// colour only on a terminal. A second call does nothing.
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // A log line that cannot be written (stderr closed: `cmd 2>&1 | head -1`) is
    // dropped: the default reports it with `eprintln!`, which then panics, on whatever
    // thread logged (a worker reporting a failed event died, and the run never ended).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .try_init();
}

/// `err` and its causes on one line, `a: b: c`, skipping a cause whose text the line
/// already holds (an `io::Error` wrapped by an error that prints it, for instance); a
/// message of several lines is joined, up to a Lua error's `stack traceback:` (shown with
/// `RUST_LIB_BACKTRACE=1`).
///
/// ```
/// let inner = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
/// let outer = anyhow::Error::new(inner).context("reading site/index.html");
/// assert_eq!(
///     leda_core::cli::one_line(outer.as_ref()),
///     "reading site/index.html: no such file"
/// );
/// // The substance of a regex error is on its later lines (it said only
/// // "regex parse error:").
/// let e = anyhow::anyhow!("regex parse error:\n    (\n    ^\nerror: unclosed group");
/// assert_eq!(
///     leda_core::cli::one_line(e.as_ref()),
///     "regex parse error: ( ^ error: unclosed group"
/// );
/// ```
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    let first = |e: &dyn Error| {
        e.to_string()
            .lines()
            .take_while(|l| l.trim() != "stack traceback:")
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut line = first(err);
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = first(c);
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

/// Whether the user asked for error backtraces (`RUST_LIB_BACKTRACE=1` or `full`).
fn backtrace_asked() -> bool {
    std::env::var("RUST_LIB_BACKTRACE").is_ok_and(|v| v == "1" || v == "full")
}

/// The end of a command's `main`: success, or the error as one line on stderr
/// (`PROG: ...`) and status 1.
pub fn exit(prog: &str, result: anyhow::Result<()>) -> ExitCode {
    exit_code(prog, result.map(|()| ExitCode::SUCCESS))
}

/// [`exit`] for a command that chooses its status when it does not fail.
pub fn exit_code(prog: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            // (Not `eprintln!`: it panics when stderr is closed.)
            let mut err = std::io::stderr().lock();
            let _ = if backtrace_asked() {
                writeln!(err, "{prog}: {e:?}")
            } else {
                writeln!(err, "{prog}: {}", one_line(e.as_ref()))
            };
            ExitCode::FAILURE
        }
    }
}

/// Prints a daemon's readiness line, `LISTENING ADDR`, on stdout and flushes it.
pub fn announce_listening(addr: impl Display) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTENING {addr}")?;
    out.flush()
}

/// How many connections the kernel may queue for `accept` on a command's listener
/// (capped by `net.core.somaxconn`): see [`lengthen_accept_queue`].
pub const LISTEN_BACKLOG: i32 = 1024;

/// Lets `listener`, bound by the standard library (which asks for 128 queued
/// connections), queue [`LISTEN_BACKLOG`] (`listen(2)` again: Linux takes the new
/// length). With 128, 200 clients connecting at once to `leda-httpd` lost 63 SYNs, each
/// retried only a second later (`TcpExtListenOverflows`); nginx asks for 511, tokio's
/// own bind for 1,024.
pub fn lengthen_accept_queue(listener: &std::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `listener` is an open descriptor for the length of the call.
    if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A clap value parser for counts that must be at least 1 (`--threads 0` is refused
/// with a message rather than quietly run with one).
///
/// ```
/// assert_eq!(leda_core::cli::at_least_one("4"), Ok(4));
/// assert!(leda_core::cli::at_least_one("0").is_err());
/// ```
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub use crate::controller::max_threads;

/// A clap value parser for a worker thread count: `1..=`[`max_threads`].
///
/// ```
/// assert_eq!(leda_core::cli::thread_count("4"), Ok(4));
/// assert!(leda_core::cli::thread_count("0").is_err());
/// assert!(leda_core::cli::thread_count("100000").is_err());
/// ```
pub fn thread_count(s: &str) -> Result<usize, String> {
    let n = at_least_one(s)?;
    let max = max_threads();
    if n > max {
        return Err(format!(
            "at most {max} (64, or 4 per CPU): more threads only wait for each other"
        ));
    }
    Ok(n)
}

/// clap value parser of a thread range `MIN,MAX` (`--auto-threads 1,4`): `1 <= MIN <= MAX`,
/// each a [`thread_count`].
pub fn thread_range(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected MIN,MAX (e.g. 1,4)"))?;
    let (min, max) = (thread_count(a.trim())?, thread_count(b.trim())?);
    if min > max {
        return Err(format!("{s:?}: MIN is above MAX"));
    }
    Ok((min, max))
}

/// Seconds between two progress lines when stderr is not a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Shows that a long step is under way until dropped (or [`Progress::finish`]ed): on
/// a terminal an indicatif spinner, `PROG: what (12 s)`; otherwise the same text as a
/// line on stderr every 5 s (nothing for a step shorter than that).
pub struct Progress {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// Starts showing `what` (e.g. `"sorting 192000 doubles on 4 processes"`).
    pub fn start(prog: &str, what: &str) -> Progress {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new_spinner().with_message(format!("{prog}: {what}"));
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            return Progress {
                stop,
                thread: None,
                bar: Some(bar),
            };
        }
        let (s, line) = (stop.clone(), format!("{prog}: {what}"));
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let started = Instant::now();
                let (lock, cv) = &*s;
                let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    // (Dropped before this thread took the lock: do not wait a period.)
                    if *done {
                        return;
                    }
                    let (d, timeout) = cv
                        .wait_timeout(done, PROGRESS_EVERY)
                        .unwrap_or_else(|e| e.into_inner());
                    done = d;
                    if *done {
                        return;
                    }
                    if timeout.timed_out() {
                        let secs = started.elapsed().as_secs();
                        let _ = writeln!(std::io::stderr(), "{line} ({secs} s)");
                    }
                }
            })
            .ok();
        Progress {
            stop,
            thread,
            bar: None,
        }
    }

    /// Stops showing it (the spinner is cleared).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bind 127.0.0.1:80: {0}")]
    struct Bind(#[source] std::io::Error);

    #[test]
    fn a_cause_the_line_already_says_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(98);
        let shown = io.to_string();
        let e = anyhow::Error::new(Bind(io)).context("starting the daemon");
        let line = one_line(e.as_ref());
        assert_eq!(
            line,
            format!("starting the daemon: bind 127.0.0.1:80: {shown}")
        );
        assert_eq!(line.matches(&shown).count(), 1, "{line}");
    }

    /// A listener bound by the standard library queues 128 connections; lengthened, it
    /// takes a burst of 300 that nobody accepts yet, each connected at once (a SYN
    /// dropped on a full queue is retried only a second later).
    #[test]
    fn a_lengthened_accept_queue_takes_a_burst_of_connections() {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if somaxconn.is_none_or(|n| n < 300) {
            eprintln!("skipped: net.core.somaxconn is {somaxconn:?}, under 300");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        lengthen_accept_queue(&listener).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for i in 0..300 {
            let wait = std::time::Duration::from_millis(500);
            match std::net::TcpStream::connect_timeout(&addr, wait) {
                Ok(s) => held.push(s),
                Err(e) => panic!("connection {i} not queued: {e}"),
            }
        }
    }
}
