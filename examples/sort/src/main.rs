//! `leda-sort`: the thesis' distributed sort, one binary for launcher and daemons.
//!
//! ```text
//! # every remote process: a daemon of this same binary
//! leda-sort daemon --listen 127.0.0.1:9001
//! # the launcher: scatter and reducer here, sort1..sortP on the daemons
//! leda-sort run --np 2 --length 48000 --daemons 127.0.0.1:9001,127.0.0.1:9002
//! # or let the launcher start P local daemons itself
//! leda-sort run --np 4 --length 192000 --spawn
//! # communication only: one vector to one remote process
//! leda-sort send --bytes 1536000 --spawn
//! ```
//!
//! `run` prints the thesis' line `leda LENGTH NP PART SECONDS` and exits with 1 if the
//! result is not the whole input, sorted. `send` prints `send BYTES SECONDS` (the
//! median round, vector there and a small acknowledgement back).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use leda_core::prelude::*;
use leda_net::{Daemon, DaemonConfig, Launcher, Secret};
use leda_sort::daemons::{self, DaemonChild};
use leda_sort::{Kernel, graph, stages, vector};

#[derive(Parser)]
#[command(
    version,
    name = "leda-sort",
    about = "Leda-RS distributed vector sort (launcher and daemon)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve deployments as a daemon; prints `LISTENING <addr>` once bound.
    Daemon {
        #[command(flatten)]
        daemon: leda_net::cli::DaemonArgs,
    },
    /// Run the distributed sort.
    Run {
        /// Number of sort processes (p).
        #[arg(long)]
        np: usize,
        /// Vector length (doubles); a multiple of p.
        #[arg(long, default_value_t = 192_000)]
        length: usize,
        /// Selection sort implementation: `c` (Listing B.2, as the MPI peer) or `rust`.
        #[arg(long, default_value = "c")]
        kernel: Kernel,
        /// Output file for the sorted vector (one number per line).
        #[arg(long)]
        out: Option<PathBuf>,
        /// When a sort process is lost: `end` the run with an error naming it, or
        /// `continue`: its part is sorted again by a surviving process.
        #[arg(long, value_enum, default_value = "end")]
        on_loss: OnLoss,
        #[command(flatten)]
        procs: Procs,
    },
    /// Time sending one vector to one remote process.
    Send {
        /// Vector size in bytes.
        #[arg(long)]
        bytes: usize,
        /// Measured rounds (the median is printed).
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Rounds before measuring.
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[command(flatten)]
        procs: Procs,
    },
}

/// `run --on-loss`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OnLoss {
    /// End the run with an error naming the lost process.
    End,
    /// Sort the lost process' part again on a surviving one.
    Continue,
}

#[derive(Args)]
struct SecretArg {
    /// File holding the shared secret that authenticates the processes (mode 0600;
    /// default: $LEDA_SECRET, $LEDA_SECRET_FILE, else the per-user cookie file).
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
}

impl SecretArg {
    fn get(&self) -> anyhow::Result<Option<Secret>> {
        Ok(match &self.secret_file {
            Some(p) => Some(Secret::from_file(p)?),
            None => None,
        })
    }
}

#[derive(Args)]
struct Procs {
    /// Daemon addresses, comma-separated (one per sort stage; one for `send`); the
    /// same flag as `lock-service run --daemons` (`--procs` is an alias).
    #[arg(
        long = "daemons",
        alias = "procs",
        value_name = "ADDRS",
        value_delimiter = ',',
        conflicts_with = "spawn"
    )]
    procs: Vec<String>,
    /// Start the daemons here, as children on 127.0.0.1 (ephemeral ports).
    #[arg(long)]
    spawn: bool,
    /// This process' name in the mapping.
    #[arg(long, default_value = "launcher:0")]
    me: String,
    /// Worker threads here (default: one per CPU).
    #[arg(long, value_parser = leda_core::cli::thread_count)]
    threads: Option<usize>,
    #[command(flatten)]
    secret: SecretArg,
    /// Mutual TLS to the daemons (they must speak it too; with --spawn they get the
    /// same files).
    #[command(flatten)]
    tls: leda_net::cli::TlsArgs,
}

impl Procs {
    /// The daemon addresses, starting `n` local daemons with `--spawn`.
    fn resolve(&self, n: usize) -> anyhow::Result<(Vec<String>, Vec<DaemonChild>)> {
        if self.spawn {
            let exe = std::env::current_exe().context("locating this binary")?;
            // The daemons prove the launcher's secret: the same file (they took the
            // cookie, and every run failed "authentication failed").
            let file = self
                .secret
                .secret_file
                .as_ref()
                .map(|p| p.display().to_string());
            let mut extra: Vec<&str> = match &file {
                Some(f) => vec!["--secret-file", f],
                None => Vec::new(),
            };
            let tls: Vec<String> = match self.tls.config() {
                Some(t) => [
                    ("--tls-cert", t.cert),
                    ("--tls-key", t.key),
                    ("--tls-ca", t.ca),
                ]
                .into_iter()
                .flat_map(|(flag, p)| [flag.to_owned(), p.display().to_string()])
                .collect(),
                None => Vec::new(),
            };
            extra.extend(tls.iter().map(String::as_str));
            let children = daemons::spawn_many(&exe, n, &extra).context("starting daemons")?;
            Ok((children.iter().map(|c| c.addr.clone()).collect(), children))
        } else if self.procs.is_empty() {
            bail!("give the daemons with --daemons ADDR,... or start them here with --spawn")
        } else {
            Ok((self.procs.clone(), Vec::new()))
        }
    }

    fn launcher(&self) -> anyhow::Result<Launcher> {
        let mut l = Launcher::new(self.me.clone());
        if let Some(s) = self.secret.get()? {
            l = l.secret(s);
        }
        if let Some(t) = self.tls.config() {
            l = l.tls(t);
        }
        Ok(l)
    }

    fn run_opts(&self) -> Run {
        match self.threads {
            Some(n) => Run::default().threads(n),
            None => Run::default(),
        }
    }
}

/// Errors end the program with one line (the cause chain) and status 1.
fn main() -> std::process::ExitCode {
    leda_core::cli::exit("leda-sort", run_cli())
}

fn run_cli() -> anyhow::Result<()> {
    leda_core::cli::init_logging("warn");
    match Cli::parse().cmd {
        Cmd::Daemon { daemon: args } => daemon(args.config()),
        Cmd::Run {
            np,
            length,
            kernel,
            out,
            on_loss,
            procs,
        } => run(np, length, kernel, out, on_loss, &procs),
        Cmd::Send {
            bytes,
            rounds,
            warmup,
            procs,
        } => send(bytes, rounds, warmup, &procs),
    }
}

fn daemon(config: DaemonConfig) -> anyhow::Result<()> {
    let daemon = Daemon::bind(config, stages::registry())?;
    leda_core::cli::announce_listening(daemon.local_addr())?;
    daemon.serve(|report| {
        // Not `println!`: its panic on a closed stdout (the launcher that started this
        // daemon, killed) ended a daemon that could have served on (review finding).
        let _ = writeln!(
            std::io::stdout(),
            "ENDED {:?} received={} sent={} failed={} discarded={}",
            report.run.reason,
            report.transport.accepted,
            report.transport.sent,
            report.transport.failed,
            report.transport.discarded
        );
        for l in &report.lost {
            eprintln!("leda-sort daemon: {l}");
        }
        let _ = std::io::stdout().flush();
    })?;
    Ok(())
}

fn run(
    np: usize,
    length: usize,
    kernel: Kernel,
    out: Option<PathBuf>,
    on_loss: OnLoss,
    procs: &Procs,
) -> anyhow::Result<()> {
    let part = vector::part_len(length, np)?;
    let (addrs, children) = procs.resolve(np)?;
    let g = graph::sort_graph(np, length, kernel, &procs.me, &addrs)?;
    let mut opts = procs.run_opts();
    if on_loss == OnLoss::Continue {
        // The scatter is told of each loss and sends the lost part again.
        opts = opts.on_process_loss(OnProcessLoss::Continue {
            notify: Some(stages::SCATTER.into()),
        });
    }
    let progress = leda_core::cli::Progress::start(
        "leda-sort",
        &format!("sorting {length} doubles on {np} process(es)"),
    );
    let report = procs
        .launcher()?
        .run(&g, opts)
        .context("running the distributed sort")?;
    progress.finish();
    let lost: String = report.lost.iter().map(|l| format!("; {l}")).collect();
    let Some(quit) = report.run.quit.filter(|q| !q.is_empty()) else {
        bail!("the run ended without the reducer's result{lost}");
    };
    if quit.get::<&str>(0).ok() == Some(stages::FAILED) {
        bail!("the sort cannot finish: {}{lost}", quit.get::<&str>(1)?);
    }
    let secs: f64 = quit.get(0)?;
    let ok: bool = quit.get(1)?;
    println!("leda {length} {np} {part} {secs:.6}");
    if let Some(path) = out {
        let sorted = vector::from_bytes(quit.arg(2).and_then(Value::as_bytes).unwrap_or(&[]))?;
        let mut w = std::io::BufWriter::new(
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        );
        for x in sorted {
            writeln!(w, "{x}")?;
        }
        w.flush()?;
    }
    reap(children);
    if !ok {
        bail!("the result is not the whole input in order");
    }
    Ok(())
}

fn send(bytes: usize, rounds: usize, warmup: usize, procs: &Procs) -> anyhow::Result<()> {
    let (addrs, children) = procs.resolve(1)?;
    let [remote] = addrs.as_slice() else {
        bail!("send needs exactly one daemon, {} given", addrs.len());
    };
    let g = graph::send_graph(bytes, rounds, warmup, &procs.me, remote)?;
    let report = procs
        .launcher()?
        .run(&g, procs.run_opts())
        .context("running the communication test")?;
    let quit = report
        .run
        .quit
        .context("the run ended without the sender's result")?;
    let mut times: Vec<f64> = quit
        .arg(0)
        .and_then(Value::as_array)
        .unwrap_or(&[])
        .iter()
        .filter_map(Value::as_float)
        .collect();
    if times.is_empty() {
        bail!("no round was measured");
    }
    times.sort_by(f64::total_cmp);
    println!("send {bytes} {:.6}", times[times.len() / 2]);
    reap(children);
    Ok(())
}

/// Lets spawned daemons exit on their own (they end with the run), then reaps them.
fn reap(children: Vec<DaemonChild>) {
    for c in children {
        let (ok, _) = c.finish(Duration::from_secs(10));
        if !ok {
            tracing::warn!("a daemon did not end cleanly");
        }
    }
}
