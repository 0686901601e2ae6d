//! The graph, its three layouts (thesis Fig. 5.1) and how a run is started.
//!
//! ```text
//! source ─file→ decode ─image→ denoise ─image→ color ─image→ scale ─image→ encode ─jpeg→ write
//!  │  ↑                                                                                    │
//!  │  └─credit── report ←──────────────────────────────written─────────────────────────────┘
//!  └──total──────→┘           (and every stage's `failed` → report)
//! ```
//!
//! The layouts differ only by partition and map:
//!
//! | layout | processes | clusters |
//! |---|---|---|
//! | 1 | this one | everything |
//! | 2 | this + 1 daemon | {source, decode, denoise, report} · {color, scale, encode, write} |
//! | 3 | this + 2 daemons | {source, decode, denoise, report} · {color, scale} · {encode, write} |
//!
//! The heavy filters are separated as the spec suggests; `report` stays with the
//! launcher so that the progress bar and the error lines appear where the user is.
//! Daemons are the same executable started with `daemon --listen 127.0.0.1:0`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leda_core::prelude::*;
use leda_core::runtime::ProcessHandle;
use leda_net::{Launcher, NetError};

use crate::error::ImageError;
use crate::report::{Summary, report};
use crate::stages;
use crate::steps::Params;

/// The launcher's identity in the mapping (it dials the daemons and listens nowhere).
pub const LAUNCHER: &str = "launcher:1";

/// How the graph is spread over processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// (a) one process.
    One,
    /// (b) two processes.
    Two,
    /// (c) three processes.
    Three,
}

impl Layout {
    /// The layout numbered `n` (1, 2 or 3).
    pub fn from_number(n: u8) -> Result<Layout, ImageError> {
        match n {
            1 => Ok(Layout::One),
            2 => Ok(Layout::Two),
            3 => Ok(Layout::Three),
            _ => Err(ImageError::Setting(format!(
                "layout {n}: expected 1, 2 or 3"
            ))),
        }
    }

    /// Number of OS processes.
    pub fn processes(self) -> usize {
        match self {
            Layout::One => 1,
            Layout::Two => 2,
            Layout::Three => 3,
        }
    }

    /// The default number of images in flight with `threads` workers per process.
    ///
    /// In one process an image is in one stage at a time, so one image per worker
    /// thread keeps every thread busy, as rayon's `par_iter` does. More would only
    /// raise the number of multi-megabyte buffers alive at once: at 8 Mpx a window of
    /// 6 made glibc hand heaps back and fault them in again (about 4× the page faults
    /// of rayon, twice its system time). Across processes the hops over loopback add
    /// latency, so those layouts keep one image per thread of every process, plus two
    /// (the former two per thread, plus two, was 4–8 % slower at 8 Mpx there too).
    pub fn default_window(self, threads: usize) -> usize {
        let threads = threads.max(1);
        match self {
            Layout::One => threads,
            Layout::Two | Layout::Three => threads * self.processes() + 2,
        }
    }
}

/// Why a pipeline run failed as a whole (per-image failures are in the [`Summary`]).
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The input or output directory is unusable.
    #[error(transparent)]
    Setup(#[from] ImageError),
    /// The graph was refused or the run failed.
    #[error("run failed: {0}")]
    Run(#[from] RunError),
    /// Deployment to the daemons or the transport failed.
    #[error("multi-process run failed: {0}")]
    Net(#[from] NetError),
    /// A daemon process could not be started.
    #[error("starting daemon {exe}: {reason}")]
    Daemon {
        /// The executable.
        exe: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// The stages of one pipeline graph.
#[derive(Clone, Debug)]
pub struct Stages {
    /// Lists the input directory.
    pub source: Stage,
    /// JPEG decoding.
    pub decode: Stage,
    /// Selective median.
    pub denoise: Stage,
    /// Histogram stretch.
    pub color: Stage,
    /// Half-resolution copy.
    pub scale: Stage,
    /// JPEG encoding.
    pub encode: Stage,
    /// File writing.
    pub write: Stage,
    /// Progress, error lines, end of run.
    pub report: Stage,
}

/// Builds the graph writing into `output` with the given settings, at most `window`
/// images in flight; `sink` receives the summary as it grows.
pub fn build(
    output: &Path,
    params: &Params,
    window: usize,
    sink: Option<Arc<Mutex<Summary>>>,
    progress: bool,
) -> (Graph, Stages) {
    let s = Stages {
        source: stages::source().attr("window", window),
        decode: stages::decode().attr("max_pixels", params.max_pixels),
        denoise: stages::denoise().attr("threshold", params.threshold),
        color: stages::color().attr("clip", params.clip),
        scale: stages::scale(),
        encode: stages::encode().attr("quality", params.quality),
        write: stages::write().attr("output", output.to_string_lossy().into_owned()),
        report: report(sink).attr("progress", progress),
    };
    let mut g = Graph::new("image");
    g.connect(&s.source, "file", &s.decode);
    g.connect(&s.source, "total", &s.report);
    g.connect(&s.decode, "image", &s.denoise);
    g.connect(&s.denoise, "image", &s.color);
    g.connect(&s.color, "image", &s.scale);
    g.connect(&s.scale, "image", &s.encode);
    g.connect(&s.encode, "jpeg", &s.write);
    g.connect(&s.write, "written", &s.report);
    g.connect(&s.report, "credit", &s.source);
    for st in [
        &s.source, &s.decode, &s.denoise, &s.color, &s.scale, &s.encode, &s.write,
    ] {
        g.connect(st, "failed", &s.report);
    }
    (g, s)
}

/// The clusters of `layout` (none for one process).
pub fn clusters(layout: Layout, s: &Stages) -> Vec<Cluster> {
    let front = Cluster::of([&s.source, &s.decode, &s.denoise, &s.report]);
    match layout {
        Layout::One => Vec::new(),
        Layout::Two => vec![
            front,
            Cluster::of([&s.color, &s.scale, &s.encode, &s.write]),
        ],
        Layout::Three => vec![
            front,
            Cluster::of([&s.color, &s.scale]),
            Cluster::of([&s.encode, &s.write]),
        ],
    }
}

/// A daemon child process; killed (if still running) and reaped on drop.
#[derive(Debug)]
pub struct DaemonChild {
    child: Child,
    /// Its listening address.
    pub addr: String,
    stdout: BufReader<ChildStdout>,
}

impl DaemonChild {
    /// Starts `exe daemon --listen 127.0.0.1:0 --threads N` and waits for its
    /// `LISTENING ADDR` line.
    pub fn spawn(exe: &Path, threads: usize) -> Result<DaemonChild, PipelineError> {
        let err = |reason: String| PipelineError::Daemon {
            exe: exe.to_owned(),
            reason,
        };
        let mut child = leda_net::daemon::end_with_parent(&mut Command::new(exe))
            .args(["daemon", "--once", "--listen", "127.0.0.1:0", "--threads"])
            .arg(threads.to_string())
            // The daemons' "lost the launcher" warning at the end of every run is
            // noise (the launcher closes its links once the run is over).
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,leda_net::link=error".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| err(e.to_string()))?;
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("no stdout".into()));
        };
        let mut d = DaemonChild {
            child,
            addr: String::new(),
            stdout: BufReader::new(out),
        };
        let mut line = String::new();
        match d.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => {}
            Ok(_) => return Err(err("exited before listening".into())),
            Err(e) => return Err(err(e.to_string())),
        }
        match line.trim().strip_prefix("LISTENING ") {
            Some(a) => d.addr = a.to_owned(),
            None => return Err(err(format!("unexpected first line {line:?}"))),
        }
        Ok(d)
    }

    /// Waits up to `limit` for the daemon to exit after its run, then kills it. (It
    /// exits within milliseconds of the run's end: looked at every millisecond, not
    /// every ten, which made every multi-process run end up to 10 ms late.)
    pub fn finish(mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                _ => return false, // killed and reaped by drop
            }
        }
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

/// Watches the daemons while the run goes: one that exits before the end stops the
/// run (otherwise its images would never be accounted for and the run would hang).
struct Watch {
    /// 0 while the run goes; then how long each daemon may take to exit, milliseconds.
    stop: Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<Option<PipelineError>>,
}

/// How long a daemon may take to exit after a run that ended well, and after one that
/// failed (a daemon stopped, or still in a long handler call, is then killed sooner:
/// with ten seconds, the error came 10 s after the loss was known, a review found).
const GRACE: Duration = Duration::from_secs(10);
const GRACE_FAILED: Duration = Duration::from_secs(1);

fn watch_daemons(mut daemons: Vec<DaemonChild>, handle: ProcessHandle) -> Watch {
    use std::sync::atomic::{AtomicU64, Ordering};
    let stop = Arc::new(AtomicU64::new(0));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut failure = None;
        while flag.load(Ordering::SeqCst) == 0 && failure.is_none() {
            for d in &mut daemons {
                if let Ok(Some(status)) = d.child.try_wait()
                    && !handle.is_stopping()
                {
                    failure = Some(PipelineError::Daemon {
                        exe: PathBuf::from(&d.addr),
                        reason: format!("exited during the run ({status})"),
                    });
                    handle.quit(Event::new());
                    break;
                }
            }
            // Woken early by `Watch::finish` (a sleep here made every run end up to
            // 50 ms late).
            std::thread::park_timeout(Duration::from_millis(50));
        }
        let grace = if failure.is_some() {
            GRACE_FAILED
        } else {
            Duration::from_millis(flag.load(Ordering::SeqCst))
        };
        for d in daemons {
            if !d.finish(grace) {
                tracing::warn!("a daemon did not exit cleanly");
            }
        }
        failure
    });
    Watch { stop, thread }
}

impl Watch {
    /// Stops watching, reaps the daemons (each given [`GRACE`], or [`GRACE_FAILED`]
    /// after a run that failed), and returns a daemon failure if one ended the run.
    fn finish(self, failed: bool) -> Option<PipelineError> {
        let grace = if failed { GRACE_FAILED } else { GRACE };
        self.stop.store(
            grace.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
        self.thread.thread().unpark();
        self.thread.join().unwrap_or_else(|_| {
            Some(PipelineError::Daemon {
                exe: PathBuf::from("watcher"),
                reason: "the watcher thread panicked".into(),
            })
        })
    }
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Directory of input JPEGs.
    pub input: PathBuf,
    /// Output directory (created; `half/` inside for the reduced copies).
    pub output: PathBuf,
    /// Process layout.
    pub layout: Layout,
    /// Worker threads of each process.
    pub threads: usize,
    /// Filter and encoder settings.
    pub params: Params,
    /// Images in flight at most (default: [`Layout::default_window`]; 0: no bound,
    /// which the command line refuses).
    pub window: Option<usize>,
    /// Show the progress bar.
    pub progress: bool,
    /// JSON-lines statistics of the launching process, and their period.
    pub stats: Option<(PathBuf, Duration)>,
    /// The executable to start as daemon (layouts 2 and 3): this program.
    pub daemon_exe: PathBuf,
}

/// What a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// Per-image counts and error lines.
    pub summary: Summary,
    /// Wall-clock time of the run, deployment included.
    pub elapsed: Duration,
    /// Events sent to other processes (0 in one process).
    pub remote_events: u64,
}

/// Checks the directories, builds the graph for `opts.layout`, starts the daemons it
/// needs, runs, and reaps them.
pub fn run(opts: &RunOptions) -> Result<Outcome, PipelineError> {
    if !opts.input.is_dir() {
        return Err(ImageError::io(
            "opening input directory",
            &opts.input,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        )
        .into());
    }
    crate::steps::prepare_output(&opts.output)?;
    let sink = Arc::new(Mutex::new(Summary::default()));
    let threads = opts.threads.max(1);
    // Enough images in flight to keep every thread of every process busy.
    let window = opts
        .window
        .unwrap_or_else(|| opts.layout.default_window(threads));
    let (mut g, s) = build(
        &opts.output,
        &opts.params,
        window,
        Some(sink.clone()),
        opts.progress,
    );
    s.source.push(opts.input.to_string_lossy().into_owned());
    let mut run = Run::default().threads(threads);
    if let Some((path, every)) = &opts.stats {
        run = run.stats_file(path, *every);
    }
    let start = Instant::now();
    let remote_events = match opts.layout {
        Layout::One => {
            // `report` quits when every image is accounted for; idleness is the
            // safety net should an image go missing.
            g.run(run.until_idle())?;
            0
        }
        layout => {
            let daemons = (1..layout.processes())
                .map(|_| DaemonChild::spawn(&opts.daemon_exe, threads))
                .collect::<Result<Vec<_>, _>>()?;
            let mut addrs = vec![LAUNCHER.to_owned()];
            addrs.extend(daemons.iter().map(|d| d.addr.clone()));
            g.part(clusters(layout, &s))
                .map_err(RunError::from)?
                .map(addrs)
                .map_err(RunError::from)?;
            // The run ends when `report` has seen every image (it quits, which ends
            // every process): every stage reports each image's failure to it, a
            // failed send included (`stages::image_step`). Global idle detection is
            // not used here: it can end a run while events are still in flight
            // between processes.
            let launched = Launcher::new(LAUNCHER)
                .daemon_threads(threads)
                .start(&g, run)?;
            let watch = watch_daemons(daemons, launched.handle());
            let report = launched.wait();
            let clean = watch.finish(report.is_err());
            let report = report?;
            if let Some(e) = clean {
                return Err(e);
            }
            report.transport.sent
        }
    };
    let summary = sink.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Outcome {
        summary,
        elapsed: start.elapsed(),
        remote_events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_window_is_one_image_per_thread_in_one_process() {
        assert_eq!(Layout::One.default_window(2), 2);
        assert_eq!(Layout::One.default_window(0), 1, "never an empty window");
        assert_eq!(Layout::Two.default_window(2), 6);
        assert_eq!(Layout::Three.default_window(2), 8);
    }
}
