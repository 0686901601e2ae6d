//! The VCube failure detector (Duarte, Bona, Ruoso 2014; spec §2.2) as a pure state machine
//! ([`Detector`]) and as Leda stages ([`detector_stage`], [`detector_timer_stage`]).
//!
//! # The state machine
//!
//! Process `i` keeps one **event counter** `ts_i[j]` per process `j` (the spec's timestamps):
//! **even means correct, odd means crashed**; every counter starts at 0. Its view `correct_i`
//! ([`Detector::correct`]) holds the processes whose counter is even.
//!
//! - **Testing rounds.** Every `period` a round starts: `i` sends ARE-YOU-ALIVE to every
//!   process of [`vcube::round_tests`]`(i, correct_i)`: the `j ∈ c(i, s)` whose cluster
//!   `c(j, s)` has `i` as its first correct process, for `s = 1..=log₂ n`. A test that is still
//!   unanswered is not sent again (one outstanding test per tested process).
//! - **Answers.** A tested process answers ALIVE with its whole counter vector. The tester
//!   takes every counter that is larger than its own (`ts_i[k] := max(ts_i[k], ts_j[k])`):
//!   this is how the crash of a process that `i` does not test reaches `i` (information about
//!   untested processes comes from tested correct ones, VCube's diagnosis).
//! - **Timeouts.** A test unanswered after `timeout` makes the tester increment the tested
//!   process' counter to odd: `i` detected the crash itself ([`Evidence::Timeout`]).
//! - **Crash notices.** The first time a counter becomes odd, by a timeout or by a larger
//!   counter learned from `j` ([`Evidence::Gossip`]), the process leaves `correct_i` and one
//!   [`DetectorOutput::Crash`] is emitted: the `on_crash(j)` upcall of the spec, delivered once.
//!
//! **Decisions \[D\]** (the source gives no period, timeout or latency; §2.2):
//!
//! 0. **Any group size.** VCube needs `n = 2^d`; a group of another size is completed to the
//!    next power of two with **absent** processes `n..2^d`, held crashed from the start (odd
//!    counters, never tested, no notice). So grid and tree quorums, which allow any `n`, can use
//!    the detector too; [`Detector::correct`] is then the view of the completed cube.
//! 1. **Crash-stop.** A process never comes back: an odd counter is never made even again,
//!    and the ALIVE of a process already held crashed is ignored (its counters too). A process
//!    already known crashed is **no longer tested** (it cannot recover, so testing it only
//!    costs messages); VCube's rule otherwise keeps testing faulty processes to see them
//!    recover.
//! 2. A process always answers ARE-YOU-ALIVE, whoever asks (so a falsely suspected but live
//!    tester does not make its testees suspect it in turn); it ignores counters about itself
//!    (a live process never believes it crashed).
//! 3. Time is an input (`now`, any monotonic origin): the machine never reads a clock. The
//!    stage wrapper feeds it `tick`s every [`DetectorConfig::tick`] (a quarter of the smaller
//!    of period and timeout), so a timeout is noticed at most one tick late.
//! 4. Accuracy needs `timeout` above the round-trip time of a test: with a longer round trip a
//!    live process is suspected and, crash-stop, is then treated as crashed for ever. In the
//!    simulation the latency is bounded and below the timeout, so the detector is perfect.
//!
//! **Latency.** The processes that test a crashed `j` (the first correct process of each
//! `c(j, s)`, `log₂ n` of them) detect it at most `period + timeout + 2·tick` after the crash;
//! the others learn it in later rounds, when they test a process that knows. The VCube paper
//! bounds the whole at `log₂² n` rounds; `tests/detector.rs` checks
//! `log₂² n · period + timeout + 2·tick` over random crash schedules.
//!
//! # The stages
//!
//! Per node `i`, in node `i`'s cluster:
//!
//! - `detector<i>` ([`detector_stage`], serial, autostarted, kind [`DETECTOR_KIND`]): inputs
//!   `("start")`, `("tick")` and `("dmsg", from, body)` from the other detectors; outputs
//!   `peer<j>` → `detector<j>` (`("dmsg", i, body)`, decoupled connectors, see
//!   [`connect_detectors`]) and `notice` → the node's mutual-exclusion stage:
//!   `("failure", j)` once per crashed `j` (see [`crate::stage`]).
//! - `dtimer<i>` ([`detector_timer_stage`], asynchronous, autostarted, kind
//!   [`DETECTOR_TIMER_KIND`]): sleeps `tick` (a runtime sleep: virtual time in simulation) and
//!   sends `("tick")` on port `tick` to the detector, for ever (until the run ends).
//!
//! [`wire_detector`] connects both to a node stage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leda_core::error::SendError;
use leda_core::port::Port;
use leda_core::prelude::*;
use serde::{Deserialize, Serialize};

use super::{CorrectSet, QuorumError, vcube};
use crate::node::NodeId;

/// The registry kind of detector stages.
pub const DETECTOR_KIND: &str = "mutex.detector";
/// The registry kind of detector timer stages.
pub const DETECTOR_TIMER_KIND: &str = "mutex.detector.timer";

/// Everything that can go wrong with a detector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectorError {
    /// The group or the process id is invalid for VCube.
    #[error(transparent)]
    Group(#[from] QuorumError),
    /// A period or timeout of zero.
    #[error("invalid detector configuration: {0}")]
    Config(String),
    /// A message from a process outside the group, or from the process itself.
    #[error("detector {node}: message from invalid sender {from}")]
    BadSender {
        /// The receiving process.
        node: NodeId,
        /// The claimed sender.
        from: NodeId,
    },
    /// An ALIVE whose counter vector does not have one entry per process of the cube.
    #[error("detector {node}: ALIVE from {from} carries {got} counters for {n} processes")]
    BadCounters {
        /// The receiving process.
        node: NodeId,
        /// The sender.
        from: NodeId,
        /// Entries received.
        got: usize,
        /// Processes of the completed cube.
        n: usize,
    },
    /// A stage event the detector does not understand.
    #[error("detector {node}: {detail}")]
    BadEvent {
        /// The process.
        node: NodeId,
        /// What was wrong.
        detail: String,
    },
}

/// The detector's timing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Time between the starts of two testing rounds.
    pub period: Duration,
    /// How long a test may stay unanswered before the tested process is held crashed.
    pub timeout: Duration,
}

impl Default for DetectorConfig {
    /// 50 ms rounds and a 200 ms timeout: loopback or LAN processes.
    fn default() -> Self {
        DetectorConfig {
            period: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
        }
    }
}

impl DetectorConfig {
    /// Checks that period and timeout are positive.
    pub fn validate(&self) -> Result<(), DetectorError> {
        if self.period.is_zero() || self.timeout.is_zero() {
            return Err(DetectorError::Config(format!(
                "period ({:?}) and timeout ({:?}) must be positive",
                self.period, self.timeout
            )));
        }
        Ok(())
    }

    /// The clock resolution the stage wrapper ticks at: a quarter of the smaller of period
    /// and timeout (at least 1 µs).
    pub fn tick(&self) -> Duration {
        (self.period.min(self.timeout) / 4).max(Duration::from_micros(1))
    }
}

/// A detector message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DetectorMsg {
    /// A test: "are you alive?", numbered by the tester.
    AreYouAlive {
        /// The tester's test number, echoed by the answer.
        seq: u64,
    },
    /// The answer to a test, with the answering process' event counters.
    Alive {
        /// The number of the test answered.
        seq: u64,
        /// The answerer's counters `ts[0..n]` (odd: crashed).
        ts: Vec<u64>,
    },
}

impl DetectorMsg {
    /// `"are-you-alive"` or `"alive"`.
    pub fn kind(&self) -> &'static str {
        match self {
            DetectorMsg::AreYouAlive { .. } => "are-you-alive",
            DetectorMsg::Alive { .. } => "alive",
        }
    }
}

/// How a process learned of a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// Its own test timed out.
    Timeout,
    /// A tested process' ALIVE carried an odd counter for it.
    Gossip {
        /// The process whose counters told.
        from: NodeId,
    },
}

/// One effect of a detector handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectorOutput {
    /// Send `msg` to process `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// The message.
        msg: DetectorMsg,
    },
    /// `node` crashed (delivered once per crashed process): it left the view.
    Crash {
        /// The crashed process.
        node: NodeId,
        /// How this process learned it.
        evidence: Evidence,
    },
    /// An answer from `by` holds this process crashed: the others took it for crashed (a
    /// pause or a partition longer than the timeout) and, crash-stop, go on without it.
    /// Delivered once. The process should stop (its own counter is otherwise ignored).
    Excluded {
        /// The process whose counters say so.
        by: NodeId,
    },
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    seq: u64,
    deadline: Duration,
}

/// One process' VCube failure detector (see the module docs).
#[derive(Debug, Clone)]
pub struct Detector {
    id: NodeId,
    n: usize,
    config: DetectorConfig,
    ts: Vec<u64>,
    correct: CorrectSet,
    probes: BTreeMap<NodeId, Probe>,
    next_round: Option<Duration>,
    rounds: u64,
    seq: u64,
    tests_sent: u64,
    excluded: bool,
}

impl Detector {
    /// The detector of process `id` in a group of `n` (completed to a power of two with
    /// absent processes, see the module docs).
    pub fn new(id: NodeId, n: usize, config: DetectorConfig) -> Result<Self, DetectorError> {
        config.validate()?;
        if n == 0 {
            return Err(QuorumError::EmptyGroup.into());
        }
        if id >= n {
            return Err(QuorumError::UnknownNode { node: id, n }.into());
        }
        let cube = n.next_power_of_two();
        vcube::dimensions(cube)?;
        let mut ts = vec![0; cube];
        let mut correct = CorrectSet::all(cube);
        ts[n..].fill(1);
        for j in n..cube {
            correct.crash(j)?;
        }
        Ok(Detector {
            id,
            n,
            config,
            ts,
            correct,
            probes: BTreeMap::new(),
            next_round: None,
            rounds: 0,
            seq: 0,
            tests_sent: 0,
            excluded: false,
        })
    }

    /// This process.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The group size.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// The view `correct_i` (of the completed cube: `2^⌈log₂ n⌉` processes).
    pub fn correct(&self) -> &CorrectSet {
        &self.correct
    }

    /// The event counters `ts_i` (odd: crashed), one per process of the completed cube.
    pub fn timestamps(&self) -> &[u64] {
        &self.ts
    }

    /// Testing rounds started so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// ARE-YOU-ALIVE messages sent so far.
    pub fn tests_sent(&self) -> u64 {
        self.tests_sent
    }

    /// The processes with a test outstanding.
    pub fn testing(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.probes.keys().copied()
    }

    /// When the machine next needs a [`Detector::on_tick`]: the next round or the earliest
    /// test deadline (`None` before [`Detector::on_start`]).
    pub fn next_wakeup(&self) -> Option<Duration> {
        let deadline = self.probes.values().map(|p| p.deadline).min();
        match (self.next_round, deadline) {
            (Some(r), Some(d)) => Some(r.min(d)),
            (r, d) => r.or(d),
        }
    }

    /// Starts the detector: the first testing round runs now.
    pub fn on_start(&mut self, now: Duration, out: &mut Vec<DetectorOutput>) {
        self.round(now, out);
    }

    /// Time passed: expired tests make their processes crashed, then a round starts if one
    /// is due. A tick before [`Detector::on_start`] starts the detector.
    pub fn on_tick(&mut self, now: Duration, out: &mut Vec<DetectorOutput>) {
        let expired: Vec<NodeId> = self
            .probes
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&j, _)| j)
            .collect();
        for j in expired {
            self.probes.remove(&j);
            self.crash(j, Evidence::Timeout, out);
        }
        if self.next_round.is_none_or(|r| r <= now) {
            self.round(now, out);
        }
    }

    /// A message from `from` arrived.
    pub fn on_message(
        &mut self,
        from: NodeId,
        msg: DetectorMsg,
        out: &mut Vec<DetectorOutput>,
    ) -> Result<(), DetectorError> {
        let n = self.n;
        let cube = self.ts.len();
        if from >= n || from == self.id {
            return Err(DetectorError::BadSender {
                node: self.id,
                from,
            });
        }
        match msg {
            DetectorMsg::AreYouAlive { seq } => {
                out.push(DetectorOutput::Send {
                    to: from,
                    msg: DetectorMsg::Alive {
                        seq,
                        ts: self.ts.clone(),
                    },
                });
            }
            DetectorMsg::Alive { seq, ts } => {
                if ts.len() != cube {
                    return Err(DetectorError::BadCounters {
                        node: self.id,
                        from,
                        got: ts.len(),
                        n: cube,
                    });
                }
                if !self.correct.contains(from) {
                    // Crash-stop: a process held crashed stays crashed; its news is ignored.
                    return Ok(());
                }
                if self.probes.get(&from).is_some_and(|p| p.seq == seq) {
                    self.probes.remove(&from);
                }
                if ts[self.id] % 2 == 1 && !std::mem::replace(&mut self.excluded, true) {
                    out.push(DetectorOutput::Excluded { by: from });
                }
                for (k, &theirs) in ts.iter().enumerate() {
                    if k == self.id || theirs <= self.ts[k] {
                        continue;
                    }
                    if self.ts[k] % 2 == 1 {
                        // Crash-stop: never back from crashed.
                        continue;
                    }
                    self.ts[k] = theirs;
                    if theirs % 2 == 1 {
                        self.probes.remove(&k);
                        self.crash(k, Evidence::Gossip { from }, out);
                    }
                }
            }
        }
        Ok(())
    }

    /// Marks `j` crashed (counter odd, out of the view) and emits the notice, once.
    fn crash(&mut self, j: NodeId, evidence: Evidence, out: &mut Vec<DetectorOutput>) {
        if self.ts[j].is_multiple_of(2) {
            self.ts[j] += 1;
        }
        if matches!(self.correct.crash(j), Ok(true)) {
            out.push(DetectorOutput::Crash { node: j, evidence });
        }
    }

    /// Starts a testing round at `now`.
    fn round(&mut self, now: Duration, out: &mut Vec<DetectorOutput>) {
        self.rounds += 1;
        // Rounds keep to their schedule (a late tick does not shift the next ones) unless the
        // detector fell a whole period behind.
        let next = self.next_round.unwrap_or(now) + self.config.period;
        self.next_round = Some(if next > now {
            next
        } else {
            now + self.config.period
        });
        // `new` checked the group, so `round_tests` cannot fail; an error would only mean an
        // empty round.
        let tests = vcube::round_tests(self.id, &self.correct).unwrap_or_default();
        for (_, j) in tests {
            if !self.correct.contains(j) || self.probes.contains_key(&j) {
                continue;
            }
            self.seq += 1;
            self.tests_sent += 1;
            self.probes.insert(
                j,
                Probe {
                    seq: self.seq,
                    deadline: now + self.config.timeout,
                },
            );
            out.push(DetectorOutput::Send {
                to: j,
                msg: DetectorMsg::AreYouAlive { seq: self.seq },
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Stages
// ---------------------------------------------------------------------------------------------

/// Sees the crash notices of detector stages (tests, the lock service's launcher).
pub trait NoticeObserver: Send + Sync + 'static {
    /// Detector `observer` held `crashed` crashed at `time` (seconds, virtual in simulation).
    fn crashed(&self, time: f64, observer: NodeId, crashed: NodeId, evidence: Evidence);

    /// `by`'s counters hold `observer` crashed ([`DetectorOutput::Excluded`]), once.
    fn excluded(&self, _time: f64, _observer: NodeId, _by: NodeId) {}
}

/// How a detector stage is built.
#[derive(Clone)]
pub struct DetectorSpec {
    /// This process.
    pub id: NodeId,
    /// Group size.
    pub n: usize,
    /// Period and timeout.
    pub config: DetectorConfig,
    /// Observer of the crash notices, if any.
    pub observer: Option<Arc<dyn NoticeObserver>>,
}

impl std::fmt::Debug for DetectorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetectorSpec")
            .field("id", &self.id)
            .field("n", &self.n)
            .field("config", &self.config)
            .finish()
    }
}

/// The name of node `i`'s detector stage.
pub fn detector_name(i: NodeId) -> String {
    format!("detector{i}")
}

/// The name of node `i`'s detector timer stage.
pub fn detector_timer_name(i: NodeId) -> String {
    format!("dtimer{i}")
}

struct DetectorState {
    machine: Detector,
    observer: Option<Arc<dyn NoticeObserver>>,
    peers: Vec<Port>,
    out: Vec<DetectorOutput>,
}

fn now_of(ctx: &Ctx) -> Duration {
    Duration::from_secs_f64(ctx.gettime().max(0.0))
}

impl DetectorState {
    fn new(spec: &DetectorSpec) -> Result<Self, DetectorError> {
        Ok(DetectorState {
            machine: Detector::new(spec.id, spec.n, spec.config)?,
            observer: spec.observer.clone(),
            peers: (0..spec.n)
                .map(|j| Port::from(crate::stage::peer_port(j)))
                .collect(),
            out: Vec::new(),
        })
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let me = self.machine.id();
        let tag: &str = ev.get(0)?;
        let now = now_of(ctx);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        match tag {
            "start" => self.machine.on_start(now, &mut out),
            "tick" => self.machine.on_tick(now, &mut out),
            "dmsg" => {
                let from: NodeId = ev.get(1)?;
                let body = ev.arg(2).ok_or_else(|| DetectorError::BadEvent {
                    node: me,
                    detail: "message without a body".into(),
                })?;
                let msg: DetectorMsg = body.to().map_err(|e| DetectorError::BadEvent {
                    node: me,
                    detail: format!("undecodable message from {from}: {e}"),
                })?;
                self.machine.on_message(from, msg, &mut out)?;
            }
            other => {
                return Err(DetectorError::BadEvent {
                    node: me,
                    detail: format!("unknown event {other:?}"),
                }
                .into());
            }
        }
        for o in out.drain(..) {
            match o {
                DetectorOutput::Send { to, msg } => {
                    let Some(port) = self.peers.get(to) else {
                        continue;
                    };
                    let body = Value::from_serde(&msg)?;
                    let ev = Event::new().with("dmsg").with(me as i64).with(body);
                    if let Err(e) = ctx.send(port, ev) {
                        // A dead peer's link refuses: its test simply goes unanswered.
                        tracing::debug!(node = me, to, error = %e, "detector message not sent");
                    }
                }
                DetectorOutput::Crash { node, evidence } => {
                    tracing::info!(node = me, crashed = node, ?evidence, "crash detected");
                    if let Some(o) = &self.observer {
                        o.crashed(ctx.gettime(), me, node, evidence);
                    }
                    match ctx.send("notice", ("failure", node as i64)) {
                        Ok(()) | Err(SendError::NotConnected { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                DetectorOutput::Excluded { by } => {
                    tracing::warn!(node = me, by, "the group holds this process crashed");
                    if let Some(o) = &self.observer {
                        o.excluded(ctx.gettime(), me, by);
                    }
                }
            }
        }
        self.out = out;
        Ok(())
    }
}

/// A detector stage (see the module docs): serial, autostarted, named `detector<id>`, of kind
/// [`DETECTOR_KIND`] with attributes `id`, `n`, `period_us` and `timeout_us`.
pub fn detector_stage(spec: DetectorSpec) -> Result<Stage, DetectorError> {
    DetectorState::new(&spec)?;
    let stage = Stage::stateful(
        detector_name(spec.id),
        {
            let spec = spec.clone();
            move |_: &Attrs| -> Result<DetectorState, BoxError> { Ok(DetectorState::new(&spec)?) }
        },
        |state: &mut DetectorState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .serial()
    .autostart("start")
    .kind(DETECTOR_KIND)
    .attr("id", spec.id as i64)
    .attr("n", spec.n as i64)
    .attr("period_us", spec.config.period.as_micros() as i64)
    .attr("timeout_us", spec.config.timeout.as_micros() as i64);
    Ok(stage)
}

fn config_from_attrs(attrs: &Attrs) -> Result<DetectorConfig, DetectorError> {
    let us = |key: &str| -> Result<Duration, DetectorError> {
        let v: u64 = attrs
            .get_as(key)
            .map_err(|e| DetectorError::Config(format!("attribute {key}: {e}")))?;
        Ok(Duration::from_micros(v))
    };
    let config = DetectorConfig {
        period: us("period_us")?,
        timeout: us("timeout_us")?,
    };
    config.validate()?;
    Ok(config)
}

/// Rebuilds a detector stage from the attributes [`detector_stage`] gives it (for a daemon's
/// registry), without its autostart event (the deployment ships the initial events).
pub fn detector_stage_from_attrs(attrs: &Attrs) -> Result<Stage, DetectorError> {
    detector_stage_observed(attrs, None)
}

/// [`detector_stage_from_attrs`] with an observer of its notices (what the process that
/// rebuilds it wants to know, e.g. to stop when a majority is held crashed).
pub fn detector_stage_observed(
    attrs: &Attrs,
    observer: Option<Arc<dyn NoticeObserver>>,
) -> Result<Stage, DetectorError> {
    let id: usize = attrs
        .get_as("id")
        .map_err(|e| DetectorError::Config(format!("attribute id: {e}")))?;
    let n: usize = attrs
        .get_as("n")
        .map_err(|e| DetectorError::Config(format!("attribute n: {e}")))?;
    let stage = detector_stage(DetectorSpec {
        id,
        n,
        config: config_from_attrs(attrs)?,
        observer,
    })?;
    stage.take_pushed();
    Ok(stage)
}

/// Node `id`'s detector timer (see the module docs): every `tick` it sends `("tick")` on port
/// `tick`, until the run stops. Kind [`DETECTOR_TIMER_KIND`], attributes `id` and `tick_us`.
pub fn detector_timer_stage(id: NodeId, tick: Duration) -> Stage {
    let tick = tick.max(Duration::from_micros(1));
    Stage::asynchronous(
        detector_timer_name(id),
        move |_ev: Event, mut ctx: Ctx| async move {
            loop {
                ctx.sleep(tick).await;
                match ctx.send_wait("tick", "tick").await {
                    Ok(()) => {}
                    Err(SendError::Stopped) => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
        },
    )
    .autostart("start")
    .kind(DETECTOR_TIMER_KIND)
    .attr("id", id as i64)
    .attr("tick_us", tick.as_micros() as i64)
}

/// Rebuilds a detector timer stage from its attributes (for a daemon's registry), without its
/// autostart event.
pub fn detector_timer_stage_from_attrs(attrs: &Attrs) -> Result<Stage, DetectorError> {
    let id: usize = attrs
        .get_as("id")
        .map_err(|e| DetectorError::Config(format!("attribute id: {e}")))?;
    let tick: u64 = attrs
        .get_as("tick_us")
        .map_err(|e| DetectorError::Config(format!("attribute tick_us: {e}")))?;
    if tick == 0 {
        return Err(DetectorError::Config("tick_us must be positive".into()));
    }
    let stage = detector_timer_stage(id, Duration::from_micros(tick));
    stage.take_pushed();
    Ok(stage)
}

/// The detector and timer stages of node `spec.id`, connected to each other (`tick`, local)
/// and to the node's mutual-exclusion stage `node` (`notice`, local). Add both to the node's
/// cluster, and join the detectors with [`connect_detectors`].
pub fn wire_detector(
    graph: &mut Graph,
    spec: DetectorSpec,
    node: &Stage,
) -> Result<(Stage, Stage), DetectorError> {
    let tick = spec.config.tick();
    let id = spec.id;
    let detector = detector_stage(spec)?;
    let timer = detector_timer_stage(id, tick);
    graph.connect(&timer, "tick", &detector).local();
    graph.connect(&detector, "notice", node).local();
    Ok((detector, timer))
}

/// Connects the detector stages pairwise (`peer<j>` of detector `i` to detector `j`),
/// decoupled.
pub fn connect_detectors(graph: &mut Graph, detectors: &[Stage]) {
    for (i, a) in detectors.iter().enumerate() {
        for (j, b) in detectors.iter().enumerate() {
            if i != j {
                graph.connect(a, crate::stage::peer_port(j), b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_validated() {
        let bad = DetectorConfig {
            period: Duration::ZERO,
            timeout: Duration::from_millis(1),
        };
        assert!(matches!(
            Detector::new(0, 8, bad),
            Err(DetectorError::Config(_))
        ));
        assert!(matches!(
            Detector::new(0, 0, DetectorConfig::default()),
            Err(DetectorError::Group(QuorumError::EmptyGroup))
        ));
        assert!(matches!(
            Detector::new(8, 8, DetectorConfig::default()),
            Err(DetectorError::Group(QuorumError::UnknownNode { .. }))
        ));
        assert_eq!(
            DetectorConfig::default().tick(),
            Duration::from_micros(12_500)
        );
    }

    #[test]
    fn other_group_sizes_are_completed_with_absent_processes() {
        // n = 6 in a cube of 8: 6 and 7 are absent (crashed from the start, never tested).
        let mut d = Detector::new(4, 6, DetectorConfig::default()).expect("detector");
        assert_eq!(d.n(), 6);
        assert_eq!(
            d.correct().iter().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4, 5]
        );
        assert_eq!(d.timestamps(), &[0, 0, 0, 0, 0, 0, 1, 1]);
        let mut out = Vec::new();
        d.on_start(Duration::ZERO, &mut out);
        // p4 tests c(4,1)[0] = 5 and c(4,3)[0] = 0; c(4,2) = (6 7) is all absent; and since
        // c(2,3) = (6 7 4 5) starts with the absent 6 and 7, p4 is its first correct process
        // and tests p2 as well.
        let to: Vec<NodeId> = out
            .iter()
            .filter_map(|o| match o {
                DetectorOutput::Send { to, .. } => Some(*to),
                _ => None,
            })
            .collect();
        assert_eq!(to, vec![5, 0, 2]);
        assert!(
            !out.iter()
                .any(|o| matches!(o, DetectorOutput::Crash { .. }))
        );
    }

    #[test]
    fn messages_from_bad_senders_are_refused() {
        let mut d = Detector::new(0, 4, DetectorConfig::default()).expect("detector");
        let mut out = Vec::new();
        assert!(matches!(
            d.on_message(0, DetectorMsg::AreYouAlive { seq: 1 }, &mut out),
            Err(DetectorError::BadSender { .. })
        ));
        assert!(matches!(
            d.on_message(9, DetectorMsg::AreYouAlive { seq: 1 }, &mut out),
            Err(DetectorError::BadSender { .. })
        ));
        assert!(matches!(
            d.on_message(
                1,
                DetectorMsg::Alive {
                    seq: 1,
                    ts: vec![0]
                },
                &mut out
            ),
            Err(DetectorError::BadCounters { got: 1, n: 4, .. })
        ));
        assert!(out.is_empty());
    }
}
