//! Soak test: many random seeds per algorithm through the checker.
//!
//! ```text
//! cargo run --release -p leda-mutex --bin mutex-soak -- --seeds 100000
//! cargo run --release -p leda-mutex --bin mutex-soak -- --seeds 2000 --stages   # the stage graph
//! ```
//!
//! Each seed picks a group size, a latency distribution, FIFO or not (non-FIFO wherever the
//! algorithm allows it) and a light or heavy load. The state-machine simulator runs by default;
//! `--stages` runs the algorithms' stage graphs under leda-core's simulated executor instead.
//! The first failing seed of each algorithm is printed with its verdict; the exit status is 1
//! if any seed failed. The broken naive Maekawa is expected to fail and is reported apart.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use leda_core::sim::NetModel;
use leda_mutex::{Algorithm, Channels, Latency, Schedule, SimConfig, StageSim, Verdict, Workload};

#[derive(Parser, Debug)]
#[command(
    version,
    name = "mutex-soak",
    about = "Run many seeds of every algorithm through the mutual-exclusion checker"
)]
struct Args {
    /// Seeds per algorithm.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Only these algorithms (comma-separated names); default: all.
    #[arg(long, value_delimiter = ',')]
    algorithm: Vec<String>,
    /// Largest group size.
    #[arg(long, default_value_t = 12)]
    max_nodes: usize,
    /// Run the stage graphs under leda-core's simulated executor instead of the state machines.
    #[arg(long)]
    stages: bool,
    /// Soak the crash-tolerant quorum protocol instead (grid, tree, VCube; or the generators
    /// named by --algorithm quorum-*): up to N/2 crashes per seed, simultaneous or staggered
    /// notices (see `leda_mutex::quorum_soak`).
    #[arg(long)]
    crashes: bool,
}

fn config(seed: u64, fifo: bool, max_nodes: usize) -> SimConfig {
    let n = 1 + (seed % max_nodes.max(1) as u64) as usize;
    let mut cfg = SimConfig::new(n, seed);
    cfg.channels = if fifo {
        Channels::Fifo
    } else {
        Channels::NonFifo
    };
    cfg.latency = match (seed / 7) % 3 {
        0 => Latency::Constant(3),
        1 => Latency::Uniform { min: 1, max: 20 },
        _ => Latency::Exponential { min: 1, mean: 6.0 },
    };
    let heavy = (seed / 21).is_multiple_of(2);
    cfg.workload = Workload {
        requests_per_node: 1 + (seed % 5) as usize,
        requesters: None,
        cs_duration: Latency::Uniform { min: 1, max: 8 },
        think_time: if heavy {
            Latency::Uniform { min: 0, max: 3 }
        } else {
            Latency::Exponential { min: 0, mean: 80.0 }
        },
        schedule: Schedule::Concurrent,
    };
    cfg
}

fn stage_sim(algorithm: Algorithm, cfg: &SimConfig) -> StageSim {
    let mut s = StageSim::new(algorithm, cfg.n, cfg.seed);
    s.net = NetModel {
        latency: StageSim::net_latency(&cfg.latency),
        fifo: cfg.channels == Channels::Fifo,
        spike: if cfg.seed.is_multiple_of(3) {
            (0.05, Duration::from_micros(200))
        } else {
            (0.0, Duration::ZERO)
        },
        ..NetModel::default()
    };
    s.requests = cfg.workload.requests_per_node;
    s.cs_time = cfg.workload.cs_duration.clone();
    s.think_time = cfg.workload.think_time.clone();
    s
}

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit_code("mutex-soak", run())
}

fn run() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    if args.crashes {
        return crash_soak(&args);
    }
    let algorithms: Vec<Algorithm> = if args.algorithm.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        args.algorithm
            .iter()
            .map(|a| a.parse::<Algorithm>())
            .collect::<Result<_, _>>()
            .context("--algorithm")?
    };
    let mut failed = false;
    for algorithm in algorithms {
        let started = Instant::now();
        let fifo = algorithm.requires_fifo();
        let (mut ok, mut bad, mut first_bad) = (0u64, 0u64, None);
        for seed in args.first..args.first + args.seeds {
            let cfg = config(seed, fifo, args.max_nodes);
            let verdict = if args.stages {
                stage_sim(algorithm, &cfg).run()?.verdict
            } else {
                algorithm.simulate(cfg)?.verdict
            };
            if verdict == Verdict::Ok {
                ok += 1;
            } else {
                bad += 1;
                first_bad.get_or_insert((seed, verdict));
            }
        }
        let expected_broken = algorithm == Algorithm::MaekawaNaive;
        println!(
            "{:<20} {ok:>8} ok {bad:>8} failed  {:>7.1}s{}",
            algorithm.name(),
            started.elapsed().as_secs_f64(),
            if expected_broken {
                "  (broken on purpose: failures expected)"
            } else {
                ""
            }
        );
        if let Some((seed, verdict)) = first_bad {
            println!("    first failure: seed {seed}: {verdict}");
            if !expected_broken {
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `--crashes`: the quorum protocol's crash soak, one line per generator.
fn crash_soak(args: &Args) -> anyhow::Result<ExitCode> {
    use leda_mutex::quorum_soak::soak;
    let generators: Vec<leda_mutex::ft_quorum::Generator> = if args.algorithm.is_empty() {
        leda_mutex::ft_quorum::Generator::ALL.to_vec()
    } else {
        args.algorithm
            .iter()
            .map(|a| {
                a.parse::<Algorithm>()
                    .ok()
                    .and_then(Algorithm::generator)
                    .with_context(|| format!("--crashes soaks quorum-grid|tree|vcube, not {a:?}"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let mut failed = false;
    for g in generators {
        let started = Instant::now();
        let t = soak(g, args.first, args.seeds)?;
        println!(
            "quorum-{:<7} {:>7} seeds {:>7} ok {:>5} no-quorum (tree, reported)  failures: {} mutual-exclusion, {} fence, {} liveness, {} node-error  ({} crashes, up to {} of {} in one seed; {:.1}s)",
            g.name(),
            t.runs,
            t.ok,
            t.no_quorum,
            t.safety,
            t.fence,
            t.liveness,
            t.node_errors,
            t.crashes,
            t.max_crashes.0,
            t.max_crashes.1,
            started.elapsed().as_secs_f64()
        );
        if let Some((seed, outcome)) = &t.first_failure {
            println!("    first failure: seed {seed}: {outcome}");
            failed = true;
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
