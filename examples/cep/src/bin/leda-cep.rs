//! `leda-cep`: generate logs, run the CEP graph (scenario 1, 2 or local), run the
//! sequential baseline or the Lua variant, or serve as a daemon for the launcher.
//!
//! ```text
//! leda-cep gen --out logs --lines 1000000 --seed 42
//! leda-cep run --logs logs --out out --scenario 2 --threads 4 --persist 2 --filter 2 --correlate 4
//! leda-cep seq --logs logs --out out-seq
//! leda-cep lua --logs logs --out out-lua --threads 4 --correlate 4
//! leda-cep lua-seq --logs logs --out out-lua-seq
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use leda_cep::app::{self, Scenario, Setup};
use leda_net::Daemon;

#[derive(Parser)]
#[command(
    version,
    name = "leda-cep",
    about = "Leda-RS complex event processing (thesis §5.1.2)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Directory holding access-*.log.
    #[arg(long)]
    logs: PathBuf,
    /// Output directory (persisted windows, alarms.log).
    #[arg(long)]
    out: PathBuf,
    /// Window size in lines, 1 to 1,000,000 (`app::MAX_WINDOW`).
    #[arg(long, default_value_t = 1000, value_parser = app::window_size)]
    window: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write seeded logs: access-1.log .. access-3.log.
    Gen {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Total lines over the three files.
        #[arg(long, default_value_t = 1_000_000)]
        lines: usize,
        /// Seed.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Run the graph (Rust handlers).
    Run {
        #[command(flatten)]
        common: Common,
        /// 1 (processing in one process), 2 (correlate alone) or local (one process).
        #[arg(long, default_value = "1")]
        scenario: Scenario,
        /// Processing threads in total, at least 1 (split equally in scenario 2;
        /// default: one per CPU).
        #[arg(long, default_value_t = num_cpus::get(), value_parser = leda_core::cli::thread_count)]
        threads: usize,
        /// persist instances.
        #[arg(long, default_value_t = 1)]
        persist: usize,
        /// filter instances.
        #[arg(long, default_value_t = 1)]
        filter: usize,
        /// correlate instances.
        #[arg(long, default_value_t = 2)]
        correlate: usize,
    },
    /// The single-threaded baseline.
    Seq {
        #[command(flatten)]
        common: Common,
    },
    /// The graph with Lua handlers (lua/cep.lua).
    Lua {
        #[command(flatten)]
        common: Common,
        /// 1, 2 or local, as for `run`.
        #[arg(long, default_value = "local")]
        scenario: Scenario,
        /// Worker threads, at least 1 (default: one per CPU).
        #[arg(long, default_value_t = num_cpus::get(), value_parser = leda_core::cli::thread_count)]
        threads: usize,
        /// persist instances.
        #[arg(long, default_value_t = 1)]
        persist: usize,
        /// filter instances.
        #[arg(long, default_value_t = 1)]
        filter: usize,
        /// correlate instances.
        #[arg(long, default_value_t = 2)]
        correlate: usize,
    },
    /// The Lua baseline: lua/cep.lua's work in one Lua state on one thread, no graph.
    LuaSeq {
        #[command(flatten)]
        common: Common,
    },
    /// A daemon for the Lua variant (leda-lua deployment; prints `LISTENING ADDR`).
    LuaDaemon {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Worker threads.
        #[arg(long, value_parser = leda_core::cli::thread_count)]
        threads: Option<usize>,
    },
    /// A daemon for the launcher (prints `LISTENING ADDR`).
    Daemon(leda_net::cli::DaemonArgs),
}

fn logs_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("access-") && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    anyhow::ensure!(!files.is_empty(), "no access-*.log in {}", dir.display());
    Ok(files)
}

/// Prints the summary line; a run in which events failed is an error after it.
fn report(what: &str, o: &app::Outcome, secs: f64) -> anyhow::Result<()> {
    println!(
        "{what}: {secs:.3} s, {} windows, {} entries, alarms: filter={} correlate={} late={}",
        o.windows, o.entries, o.filter_alarms, o.correlate_alarms, o.late
    );
    if o.failed.is_empty() {
        Ok(())
    } else {
        Err(app::EventsFailed(o.failed.clone()).into())
    }
}

/// The allocator of this binary, for the baselines too (they run in it): windows'
/// strings are allocated on one worker and freed on another (docs/stage-library.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit("leda-cep", run())
}

fn run() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Gen { out, lines, seed } => {
            let files = leda_cep::generate::write_logs(&out, lines, 3, seed)?;
            for f in files {
                println!("{}", f.display());
            }
        }
        Cmd::Run {
            common,
            scenario,
            threads,
            persist,
            filter,
            correlate,
        } => {
            let setup = Setup {
                files: logs_in(&common.logs)?,
                out: common.out,
                window: common.window,
                threads,
                persist,
                filter,
                correlate,
                scenario,
            };
            let progress = leda_core::cli::Progress::start("leda-cep", "correlating (Rust stages)");
            let (o, t) = app::run(&setup)?;
            progress.finish();
            report(&format!("scenario {scenario:?}"), &o, t.as_secs_f64())?;
        }
        Cmd::Seq { common } => {
            let progress = leda_core::cli::Progress::start("leda-cep", "correlating (sequential)");
            let (o, t) =
                leda_cep::seq::sequential(&logs_in(&common.logs)?, common.window, &common.out)?;
            progress.finish();
            report("sequential", &o, t.as_secs_f64())?;
        }
        Cmd::Lua {
            common,
            scenario,
            threads,
            persist,
            filter,
            correlate,
        } => {
            let progress = leda_core::cli::Progress::start("leda-cep", "correlating (Lua stages)");
            let (o, t) = leda_cep::lua::run(
                &logs_in(&common.logs)?,
                &common.out,
                common.window,
                threads,
                [persist, filter, correlate],
                scenario,
            )?;
            progress.finish();
            report("lua", &o, t.as_secs_f64())?;
        }
        Cmd::LuaSeq { common } => {
            let progress =
                leda_core::cli::Progress::start("leda-cep", "correlating (Lua, sequential)");
            let (o, t) =
                leda_cep::lua::sequential(&logs_in(&common.logs)?, &common.out, common.window)?;
            progress.finish();
            report("lua sequential", &o, t.as_secs_f64())?;
        }
        Cmd::LuaDaemon { listen, threads } => {
            // The Lua stages it runs persist windows and alarms to files: `io`.
            leda_lua::capabilities::allow(leda_lua::capabilities::Capabilities {
                io: true,
                ..Default::default()
            });
            let options = leda_lua::remote::DaemonOptions {
                listen,
                threads,
                secret: None,
                ..leda_lua::remote::DaemonOptions::default()
            };
            leda_lua::remote::serve(&options, false, |addr| {
                let _ = leda_core::cli::announce_listening(addr);
            })?;
        }
        Cmd::Daemon(args) => {
            let daemon = Daemon::bind(args.config(), leda_cep::stages::registry())?;
            leda_core::cli::announce_listening(daemon.local_addr())?;
            daemon.serve(|r| tracing::info!(reason = ?r.run.reason, "run ended"))?;
        }
    }
    Ok(())
}
