//! The crash soak of the quorum protocol (issue #9 item 4): many seeds per generator through
//! the [`crate::Checker`], each with up to N/2 crashes at random times and simultaneous or
//! staggered (transiently inconsistent) crash notices. Driven by `mutex-soak --crashes` and by
//! the tests.
//!
//! Seed `s` fixes everything: the group size (from the generator's list of sizes), the number of
//! crashes (1..=N/2), victims and times (uniform over the first part of the run, so they land
//! while requests are being served), the notice latency (three regimes: simultaneous, staggered
//! over 0..80 ticks, widely staggered over 0..400), the link latency and the workload
//! (concurrent requests, 2–4 CS per node, short think times).

use std::fmt;

use crate::checker::{Verdict, Violation};
use crate::ft_quorum::Generator;
use crate::ft_quorum::protocol::{FtQuorumConfig, FtQuorumNode};
use crate::rng::SplitMix64;
use crate::sim::{Channels, Crash, Latency, Schedule, SimConfig, Simulation, Workload};

/// How crash notices reach the live processes in a soak seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Notices {
    /// Every observer after the same constant delay.
    Simultaneous,
    /// Per observer, uniform over 0..80 ticks.
    Staggered,
    /// Per observer, uniform over 0..400 ticks (views disagree for several CS).
    WidelyStaggered,
}

impl Notices {
    /// The three regimes, cycled by seed.
    pub const ALL: [Notices; 3] = [
        Notices::Simultaneous,
        Notices::Staggered,
        Notices::WidelyStaggered,
    ];

    /// The detection latency of the regime.
    pub fn latency(self) -> Latency {
        match self {
            Notices::Simultaneous => Latency::Constant(5),
            Notices::Staggered => Latency::Uniform { min: 0, max: 80 },
            Notices::WidelyStaggered => Latency::Uniform { min: 0, max: 400 },
        }
    }
}

/// The group sizes a generator is soaked with (VCube needs powers of two).
pub fn soak_sizes(g: Generator) -> &'static [usize] {
    match g {
        Generator::VCube => &[4, 8, 16, 32],
        Generator::Tree => &[3, 7, 8, 15, 20, 31],
        Generator::Grid => &[4, 5, 9, 12, 16, 25, 30],
    }
}

/// The simulation of soak seed `seed` for generator `g` (see the module docs).
pub fn soak_config(g: Generator, seed: u64) -> SimConfig {
    let sizes = soak_sizes(g);
    let mut rng = SplitMix64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x50A4);
    let n = sizes[rng.index(sizes.len())];
    let notices = Notices::ALL[(seed % 3) as usize];
    let mut cfg = SimConfig::new(n, seed);
    cfg.channels = Channels::Fifo;
    cfg.latency = Latency::Uniform { min: 1, max: 10 };
    let cs = 2 + rng.index(3);
    cfg.workload = Workload {
        requests_per_node: cs,
        requesters: None,
        cs_duration: Latency::Uniform { min: 1, max: 20 },
        think_time: Latency::Uniform { min: 0, max: 30 },
        schedule: Schedule::Concurrent,
    };
    // A CS takes about 2 hops + its duration at heavy load: crash in the first 60 % of that.
    let horizon = (n * cs) as u64 * 21 * 6 / 10;
    let k = 1 + rng.index(n / 2);
    cfg.crashes = Crash::random(&mut rng, n, k, horizon, &notices.latency());
    cfg.max_time = 10_000_000;
    cfg.max_events = 20_000_000;
    cfg
}

/// What one soak seed gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SoakOutcome {
    /// Every request of a live process was served; no violation.
    Ok,
    /// A live process's generator found no quorum (tree); its requests stay unserved, as
    /// specified. Safety was still checked until the run stopped.
    NoQuorum,
    /// Two processes in the CS at once (or another safety violation, fences aside).
    Safety(Violation),
    /// Fences did not increase.
    Fence(Violation),
    /// A live process with a quorum was never served.
    Liveness(Verdict),
    /// A handler refused an input.
    NodeError(Verdict),
}

impl fmt::Display for SoakOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SoakOutcome::Ok => write!(f, "ok"),
            SoakOutcome::NoQuorum => write!(f, "no quorum"),
            SoakOutcome::Safety(v) | SoakOutcome::Fence(v) => write!(f, "{v}"),
            SoakOutcome::Liveness(v) | SoakOutcome::NodeError(v) => write!(f, "{v}"),
        }
    }
}

/// Runs soak seed `seed` for generator `g`: its outcome, and how many of its scheduled crashes
/// happened before the run ended.
pub fn soak_run(g: Generator, seed: u64) -> Result<(SoakOutcome, usize), crate::MutexError> {
    let cfg = soak_config(g, seed);
    let crashes = cfg.crashes.clone();
    let mut sim = Simulation::<FtQuorumNode>::new(cfg, &FtQuorumConfig::generator(g))?;
    let report = sim.run();
    let (happened, no_quorum) =
        crate::quorum_exp::crash_tally(&sim, &crashes, report.metrics.end_time);
    let outcome = match report.verdict {
        Verdict::Ok => SoakOutcome::Ok,
        Verdict::Violation(v @ Violation::FenceNotIncreasing { .. }) => SoakOutcome::Fence(v),
        Verdict::Violation(v) => SoakOutcome::Safety(v),
        v @ (Verdict::Deadlock { .. } | Verdict::Stall { .. }) => {
            if no_quorum {
                SoakOutcome::NoQuorum
            } else {
                SoakOutcome::Liveness(v)
            }
        }
        v @ Verdict::NodeError { .. } => SoakOutcome::NodeError(v),
    };
    Ok((outcome, happened))
}

/// The tally of a soak over many seeds for one generator.
#[derive(Debug, Clone, Default)]
pub struct SoakTally {
    /// Seeds run.
    pub runs: u64,
    /// Seeds that passed.
    pub ok: u64,
    /// Seeds without a quorum (tree), not failures.
    pub no_quorum: u64,
    /// Mutual-exclusion (or other non-fence safety) violations.
    pub safety: u64,
    /// Fence-order violations.
    pub fence: u64,
    /// Live processes with a quorum left unserved.
    pub liveness: u64,
    /// Handler errors.
    pub node_errors: u64,
    /// Crashes injected (that happened before their run ended), over all seeds.
    pub crashes: u64,
    /// The largest number of crashes that happened in one seed, and that seed's group size.
    pub max_crashes: (usize, usize),
    /// The first failing seed and its outcome.
    pub first_failure: Option<(u64, SoakOutcome)>,
}

impl SoakTally {
    /// Records one seed.
    pub fn add(&mut self, seed: u64, n: usize, crashes: usize, outcome: SoakOutcome) {
        self.runs += 1;
        self.crashes += crashes as u64;
        if crashes > self.max_crashes.0 {
            self.max_crashes = (crashes, n);
        }
        let failure = match &outcome {
            SoakOutcome::Ok => {
                self.ok += 1;
                false
            }
            SoakOutcome::NoQuorum => {
                self.no_quorum += 1;
                false
            }
            SoakOutcome::Safety(_) => {
                self.safety += 1;
                true
            }
            SoakOutcome::Fence(_) => {
                self.fence += 1;
                true
            }
            SoakOutcome::Liveness(_) => {
                self.liveness += 1;
                true
            }
            SoakOutcome::NodeError(_) => {
                self.node_errors += 1;
                true
            }
        };
        if failure && self.first_failure.is_none() {
            self.first_failure = Some((seed, outcome));
        }
    }

    /// Seeds that failed the checker.
    pub fn failures(&self) -> u64 {
        self.safety + self.fence + self.liveness + self.node_errors
    }
}

/// Soaks generator `g` over seeds `first..first + seeds`.
pub fn soak(g: Generator, first: u64, seeds: u64) -> Result<SoakTally, crate::MutexError> {
    let mut tally = SoakTally::default();
    for seed in first..first + seeds {
        let n = soak_config(g, seed).n;
        let (outcome, crashes) = soak_run(g, seed)?;
        tally.add(seed, n, crashes, outcome);
    }
    Ok(tally)
}
