//! Mutual-exclusion experiments: CSV rows, and a sweep with PNG charts.
//!
//! ```text
//! cargo run --release -p leda-mutex --bin mutex-exp -- --algorithm ricart-agrawala --nodes 16 \
//!     --requesters all --cs 20 --seed 1 [--latency exp:10] [--cs-time 5] [--think-time 0] [--by-type]
//! cargo run --release -p leda-mutex --bin mutex-exp -- --sweep --out mutex-sweep
//! cargo run --release -p leda-mutex --bin mutex-exp -- --sweep-grid --out docs
//! cargo run --release -p leda-mutex --bin mutex-exp -- --sweep-lejeune --out docs
//! cargo run --release -p leda-mutex --bin mutex-exp -- --algorithm quorum --quorum vcube \
//!     --nodes 64 --requesters all --failures half --seed 1 [--notice uniform:0:80]
//! cargo run --release -p leda-mutex --bin mutex-exp -- --sweep-quorum --seeds 2 --out quorum-sweep
//! ```
//!
//! Durations are in ticks (the one-hop latency is the unit of the theory's T when constant):
//! `N`, `const:N`, `uniform:MIN:MAX`, `exp:MEAN`, `exp:MIN:MEAN`. `--algorithm all` runs every
//! algorithm. `--drop KIND:NTH` loses the NTH message of KIND (repeatable; e.g. `t1:5` for
//! Misra). `--engine stages` runs the stage graph under leda-core's simulated executor instead
//! of the bare state machines (`--requesters all` only).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use leda_mutex::algorithm::Algorithm;
use leda_mutex::chart;
use leda_mutex::experiment::{
    CSV_HEADER, Engine, Experiment, Requesters, Row, parse_latency, sweep,
};
use leda_mutex::sim::DropRule;

#[derive(Parser, Debug)]
#[command(
    version,
    name = "mutex-exp",
    about = "Measure the mutual-exclusion algorithms in deterministic simulation"
)]
struct Args {
    /// Algorithm name, or `all`.
    #[arg(long, default_value = "all")]
    algorithm: String,
    /// Group size.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// `one` (one outstanding request at a time) or `all` (every node, concurrently).
    #[arg(long, default_value = "all")]
    requesters: String,
    /// Critical sections per node.
    #[arg(long, default_value_t = 10)]
    cs: usize,
    /// Seed (the first one with --seeds).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seeds per configuration.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// One-hop latency distribution.
    #[arg(long, default_value = "const:10")]
    latency: String,
    /// Time in the critical section.
    #[arg(long, default_value = "const:5")]
    cs_time: String,
    /// Think time before each request.
    #[arg(long, default_value = "const:0")]
    think_time: String,
    /// Per-message-type messages per CS in the `by_type` column.
    #[arg(long)]
    by_type: bool,
    /// Lose the NTH message of KIND (KIND:NTH; repeatable).
    #[arg(long)]
    drop: Vec<String>,
    /// `state-machines` or `stages`.
    #[arg(long, default_value = "state-machines")]
    engine: String,
    /// Run N ∈ {4..128} × {one, all} × every algorithm; write CSV and PNG charts to --out.
    #[arg(long)]
    sweep: bool,
    /// Output directory of --sweep.
    #[arg(long, default_value = "mutex-sweep")]
    out: PathBuf,
    /// Quorum-protocol options (`--algorithm quorum`, `--sweep-quorum`).
    #[command(flatten)]
    quorum: leda_mutex::quorum_exp::QuorumArgs,
    /// Grid sweep options (`--sweep-grid`).
    #[command(flatten)]
    grid: leda_mutex::multi::grid_exp::GridArgs,
    /// Lejeune et al. sweep options (`--sweep-lejeune`).
    #[command(flatten)]
    lejeune: leda_mutex::multi::lejeune_exp::LejeuneArgs,
}

fn drops(specs: &[String]) -> anyhow::Result<Vec<DropRule>> {
    specs
        .iter()
        .map(|s| {
            let (kind, nth) = s
                .split_once(':')
                .with_context(|| format!("--drop {s:?}: expected KIND:NTH"))?;
            let nth: u64 = nth
                .parse()
                .with_context(|| format!("--drop {s:?}: NTH is not a number"))?;
            // Message kinds are static names; find the one the user means.
            let kind: &'static str = Box::leak(kind.to_owned().into_boxed_str());
            Ok(DropRule { kind, nth })
        })
        .collect()
}

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit("mutex-exp", run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.lejeune.sweep_lejeune {
        let started = Instant::now();
        let rows = leda_mutex::multi::lejeune_exp::run_lejeune_sweep(
            &args.out,
            args.seed,
            &args.lejeune,
            |r| eprintln!("{}", r.csv()),
        )?;
        eprintln!(
            "lejeune sweep: {} runs in {:.1}s; wrote multi-lejeune*.csv and 6 charts to {}",
            rows.len(),
            started.elapsed().as_secs_f64(),
            args.out.display()
        );
        return Ok(());
    }
    if args.grid.sweep_grid {
        leda_mutex::multi::grid_exp::run_grid_sweep(&args.out, args.seed, &args.grid)?;
        return Ok(());
    }
    let requesters: Requesters = args.requesters.parse()?;
    if args.quorum.wanted(&args.algorithm) {
        return quorum_main(&args, requesters);
    }
    let engine = match args.engine.as_str() {
        "state-machines" | "sm" => Engine::StateMachines,
        "stages" => Engine::Stages,
        other => bail!("--engine must be state-machines or stages, not {other:?}"),
    };
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let algorithms: Vec<Algorithm> = if args.algorithm == "all" {
        Algorithm::correct().collect()
    } else {
        vec![args.algorithm.parse()?]
    };
    let mut base = Experiment::new(algorithms[0], args.nodes, requesters);
    base.cs = args.cs;
    base.seed = args.seed;
    base.latency = parse_latency(&args.latency)?;
    base.cs_time = parse_latency(&args.cs_time)?;
    base.think_time = parse_latency(&args.think_time)?;
    base.drops = drops(&args.drop)?;
    base.engine = engine;

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.sweep {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        let started = Instant::now();
        let csv_path = args.out.join("sweep.csv");
        let mut csv = std::fs::File::create(&csv_path)
            .with_context(|| format!("creating {}", csv_path.display()))?;
        writeln!(csv, "{CSV_HEADER}")?;
        writeln!(out, "{CSV_HEADER}")?;
        let mut io_err = None;
        let rows = sweep(&base, args.seeds, |row: &Row| {
            let line = row.csv(args.by_type);
            if let Err(e) = writeln!(csv, "{line}").and_then(|_| writeln!(out, "{line}")) {
                io_err.get_or_insert(e);
            }
        })?;
        if let Some(e) = io_err {
            return Err(e).context("writing the sweep CSV");
        }
        for r in [Requesters::One, Requesters::All] {
            let msgs = args.out.join(format!("msgs_per_cs_{}.png", r.name()));
            let wait = args.out.join(format!("wait_{}.png", r.name()));
            chart::msgs_per_cs_chart(&rows, r, &msgs)?;
            chart::wait_chart(&rows, r, &wait)?;
        }
        eprintln!(
            "sweep: {} runs in {:.1}s; wrote {} and 4 charts to {}",
            rows.len(),
            started.elapsed().as_secs_f64(),
            csv_path.display(),
            args.out.display()
        );
        return Ok(());
    }
    writeln!(out, "{CSV_HEADER}")?;
    let mut failed = false;
    for algorithm in algorithms {
        for s in 0..args.seeds {
            let mut e = base.clone();
            e.algorithm = algorithm;
            e.seed = args.seed + s;
            let row = e.run()?;
            failed |= !row.verdict.is_ok() && e.drops.is_empty();
            writeln!(out, "{}", row.csv(args.by_type))?;
            if !row.verdict.is_ok() {
                eprintln!("{algorithm} seed {}: {}", e.seed, row.verdict);
            }
        }
    }
    if failed {
        bail!("some runs failed the checker");
    }
    Ok(())
}

/// `--algorithm quorum[-grid|-tree|-vcube] [--quorum G] [--failures F]` and `--sweep-quorum`
/// (see `leda_mutex::quorum_exp`).
fn quorum_main(args: &Args, requesters: Requesters) -> anyhow::Result<()> {
    use leda_mutex::quorum_exp::{QuorumExperiment, csv_header, sweep, write_sweep};
    let q = &args.quorum;
    if !args.drop.is_empty() || args.engine != "state-machines" {
        bail!("--drop and --engine do not apply to the quorum protocol (crashes: --failures)");
    }
    let mut base = QuorumExperiment::new(q.generator(&args.algorithm)?, args.nodes, requesters);
    base.cs = Some(args.cs);
    base.seed = args.seed;
    base.latency = parse_latency(&args.latency)?;
    base.cs_time = parse_latency(&args.cs_time)?;
    base.think_time = parse_latency(&args.think_time)?;
    base.failures = q.failures()?;
    base.notice = parse_latency(&q.notice)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if q.sweep_quorum {
        base.cs = None;
        let started = Instant::now();
        let nodes = q.sweep_nodes();
        let total = nodes.len() * 3 * 2 * 4 * args.seeds as usize;
        let mut done = 0;
        let rows = sweep(&base, &nodes, args.seeds, q.threads(), |r| {
            done += 1;
            eprintln!(
                "[{done}/{total}] {} n={} {} failures={} seed={}: {} msgs/CS, {} crashes{}, {:.1}s",
                r.row.exp.algorithm,
                r.row.exp.nodes,
                r.row.exp.requesters.name(),
                r.failures,
                r.row.exp.seed,
                r.row
                    .msgs_per_cs()
                    .map_or("-".into(), |m| format!("{m:.1}")),
                r.crashes,
                if r.no_quorum { ", NO QUORUM" } else { "" },
                started.elapsed().as_secs_f64()
            );
        })?;
        let (cells, files) = write_sweep(&args.out, &rows, true)?;
        writeln!(out, "{}", leda_mutex::quorum_exp::summary_markdown(&cells))?;
        let no_quorum = rows.iter().filter(|r| r.no_quorum).count();
        let failed: Vec<String> = rows
            .iter()
            .filter(|r| r.failed())
            .map(|r| {
                format!(
                    "{} n={} seed={}: {}",
                    r.row.exp.algorithm,
                    r.row.exp.nodes,
                    r.row.exp.seed,
                    r.verdict()
                )
            })
            .collect();
        eprintln!(
            "quorum sweep: {} runs in {:.1}s; {no_quorum} runs without a quorum (tree); {} failed the checker; wrote {}",
            rows.len(),
            started.elapsed().as_secs_f64(),
            failed.len(),
            files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !failed.is_empty() {
            bail!("some runs failed the checker:\n{}", failed.join("\n"));
        }
        return Ok(());
    }
    writeln!(out, "{}", csv_header())?;
    let mut failed = false;
    for s in 0..args.seeds {
        let mut e = base.clone();
        e.seed = args.seed + s;
        let row = e.run()?;
        writeln!(out, "{}", row.csv(args.by_type))?;
        if row.no_quorum {
            eprintln!(
                "{} seed {}: no quorum could be formed ({})",
                row.row.exp.algorithm,
                e.seed,
                row.verdict()
            );
        } else if !row.verdict().is_ok() {
            eprintln!(
                "{} seed {}: {}",
                row.row.exp.algorithm,
                e.seed,
                row.verdict()
            );
        }
        failed |= row.failed();
    }
    if failed {
        bail!("some runs failed the checker");
    }
    Ok(())
}
