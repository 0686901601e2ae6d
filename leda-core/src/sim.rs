//! Deterministic simulation: every cluster of a mapped graph runs as a simulated
//! process inside this OS process, on one thread, in virtual time, over a modelled
//! network (latency, FIFO or not, loss, duplication, delay spikes, crashes). The same
//! seed gives the same trace, byte for byte.
//!
//! The simulator plugs into the two seams of the runtime: each simulated process gets
//! an [`Executor`] that queues its tasks on the simulation's single ready queue and
//! gives virtual time, and [`RemoteLinks`] whose sinks turn a remote send into a
//! delivery scheduled on the virtual clock. Handlers, stages and graphs are unchanged,
//! with one exception: a handler waits for time with [`Ctx::sleep`](crate::runtime::Ctx::sleep)
//! (or a future built on it), never with a tokio timer (`tokio::time::sleep`,
//! `tokio::time::timeout`, ...) nor any other future that only a real reactor completes.
//! Nothing drives tokio in a simulation: a tokio timer panics there ("there is no reactor
//! running"), which fails that event like any handler panic (counted, logged, sent to the
//! `error` port), and a future waiting on a real socket or thread never completes (the
//! simulation ends [`SimEnd::Stuck`]).
//!
//! A simulation does not depend on the host: a simulated process runs on one (virtual)
//! thread and the default `maxpar` of its parallel stages is
//! [`Simulation::DEFAULT_MAXPAR`], not the host's CPU count as in a real run. It ends
//! when a handler quits, when nothing is left to do, at [`Simulation::until`], or when a
//! step budget is spent ([`Simulation::max_steps`],
//! [`Simulation::max_steps_per_instant`]: work that takes no virtual time, a loop between
//! two local stages say, never reaches `until`); [`SimReport::end`] says which.
//!
//! ```
//! use std::time::Duration;
//! use leda_core::prelude::*;
//! use leda_core::sim::{Latency, SimEnd, Simulation};
//!
//! let ping = Stage::new("ping", |ev: Event, ctx: &mut Ctx| {
//!     let n: i64 = ev.get(0)?;
//!     if n == 3 { ctx.quit(n) } else { ctx.send(1, n + 1)? }
//!     Ok(())
//! }).autostart(0);
//! let pong = Stage::new("pong", |ev: Event, ctx: &mut Ctx| {
//!     ctx.send(1, ev.get::<i64>(0)?)?;
//!     Ok(())
//! });
//! let mut g = Graph::new("pingpong");
//! g.connect(&ping, 1, &pong);
//! g.connect(&pong, 1, &ping);
//! g.part([Cluster::of([&ping]), Cluster::of([&pong])]).unwrap().map(["sim:1", "sim:2"]).unwrap();
//! let report = Simulation::new(7).latency(Latency::Constant(Duration::from_millis(5))).run(&g).unwrap();
//! assert_eq!(report.quit.unwrap().get::<i64>(0).unwrap(), 3);
//! assert_eq!(report.end, SimEnd::Quit { process: "sim:1".into() });
//! assert_eq!(report.time, Duration::from_millis(30)); // 6 one-way trips of 5 ms
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::error::{Rejected, RunError, SendError};
use crate::event::Event;
use crate::graph::Graph;
use crate::runtime::executor::{BoxFuture, Executor, RemoteLinks, RemoteSink};
use crate::runtime::{EndReason, ProcessHandle, Run, RunReport, Running, Task};

/// A seeded pseudo-random generator (SplitMix64): small, fast, reproducible everywhere.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SimRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One-way latency of a link.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    /// Always this long.
    Constant(Duration),
    /// Uniform between the two bounds.
    Uniform(Duration, Duration),
    /// Exponential with this mean.
    Exponential(Duration),
}

impl Latency {
    fn sample(&self, rng: &mut SimRng) -> Duration {
        match *self {
            Latency::Constant(d) => d,
            Latency::Uniform(a, b) => {
                let (lo, hi) = (a.min(b).as_nanos() as f64, a.max(b).as_nanos() as f64);
                Duration::from_nanos((lo + (hi - lo) * rng.unit()) as u64)
            }
            Latency::Exponential(mean) => {
                let u = 1.0 - rng.unit(); // (0, 1]
                Duration::from_nanos((-u.ln() * mean.as_nanos() as f64) as u64)
            }
        }
    }
}

/// The network model between simulated processes.
#[derive(Clone, Debug)]
pub struct NetModel {
    /// One-way latency.
    pub latency: Latency,
    /// Deliver in send order on each link (sender process → receiver process).
    pub fifo: bool,
    /// Probability that an event is lost.
    pub loss: f64,
    /// Probability that an event is delivered twice.
    pub duplicate: f64,
    /// Probability of a delay spike, and its extra delay.
    pub spike: (f64, Duration),
}

impl Default for NetModel {
    fn default() -> Self {
        NetModel {
            latency: Latency::Constant(Duration::from_millis(1)),
            fifo: true,
            loss: 0.0,
            duplicate: 0.0,
            spike: (0.0, Duration::ZERO),
        }
    }
}

/// A configured simulation.
pub struct Simulation {
    seed: u64,
    net: NetModel,
    overrides: HashMap<(String, String), NetModel>,
    crashes: Vec<(String, Duration)>,
    until: Option<Duration>,
    maxpar: Option<usize>,
    max_steps: u64,
    max_steps_per_instant: u64,
}

/// Why a simulation ended ([`SimReport::end`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimEnd {
    /// A handler called `quit` in the live process with this address.
    Quit {
        /// The process' address (`sim:0` for an unmapped graph).
        process: String,
    },
    /// Nothing was left to do: no task ready, nothing due on the virtual clock, and in
    /// every live process nothing queued, running or waiting.
    Idle,
    /// Nothing the simulation can run or deliver was left, but live processes still had
    /// work pending: `waiting` instances (over all live processes) wait on a future that
    /// no simulated event completes (a tokio timer, a real socket, a channel nothing sends
    /// on), or a `Ctx::busy` guard is held outside the simulation (`waiting` may then be
    /// 0). The simulation is stuck, not finished.
    Stuck {
        /// Instances parked on something outside the simulation.
        waiting: usize,
    },
    /// The virtual clock reached [`Simulation::until`] with work still due later.
    Until,
    /// [`Simulation::max_steps`] steps were taken.
    StepBudget {
        /// The steps taken.
        steps: u64,
    },
    /// [`Simulation::max_steps_per_instant`] steps were taken without the virtual clock
    /// moving: work that takes no virtual time loops (two stages passing an event back
    /// and forth, a handler that re-sends to itself), which no `until` bounds.
    ZeroTimeLoop {
        /// The steps taken at the last instant.
        steps: u64,
    },
}

/// What a simulation returns.
#[derive(Debug)]
pub struct SimReport {
    /// Why the simulation ended.
    pub end: SimEnd,
    /// Virtual time when the simulation ended.
    pub time: Duration,
    /// The values passed to `quit`, if a handler called it.
    pub quit: Option<Event>,
    /// One line per network event (send, deliver, lose, duplicate, crash), in order.
    pub trace: Vec<String>,
    /// Each simulated process' own report, by address. The simulator ends every process
    /// itself, so each report's `reason` is the simulation's end as a run's
    /// [`EndReason`]: `Quit` after [`SimEnd::Quit`] (in every process, as a quit ends a
    /// distributed run everywhere), `Idle` after [`SimEnd::Idle`] and [`SimEnd::Stuck`],
    /// `Timeout` after the bounds ([`SimEnd::Until`], [`SimEnd::StepBudget`],
    /// [`SimEnd::ZeroTimeLoop`]). A crashed process' report says the same; the trace has
    /// its `crash` line.
    pub processes: Vec<(String, RunReport)>,
    /// Events that did not reach their stage: lost by the network model, sent to a
    /// crashed process or to a stage it does not run, or refused by a full queue on
    /// arrival. Each has its trace line; the refused ones were also reported to their
    /// sender (its `failed_sends` and `error` port), as a transport reports them.
    pub lost: u64,
}

impl Simulation {
    /// The default `maxpar` of parallel stages in a simulated process (see
    /// [`Simulation::maxpar`]). A real run's default is its thread count, one per CPU of
    /// the host; a simulation uses this constant instead, so that the same seed gives the
    /// same trace on every machine.
    pub const DEFAULT_MAXPAR: usize = 4;

    /// The default of [`Simulation::max_steps_per_instant`]: a million steps at one
    /// virtual instant, about a second of real time in a debug build. The simulations of
    /// this workspace's tests take 8,000 at most.
    pub const DEFAULT_MAX_STEPS_PER_INSTANT: u64 = 1_000_000;

    /// A simulation with this seed and the default network (1 ms constant latency, FIFO,
    /// no loss).
    pub fn new(seed: u64) -> Self {
        Simulation {
            seed,
            net: NetModel::default(),
            overrides: HashMap::new(),
            crashes: Vec::new(),
            until: None,
            maxpar: None,
            max_steps: u64::MAX,
            max_steps_per_instant: Self::DEFAULT_MAX_STEPS_PER_INSTANT,
        }
    }

    /// The network model of every link.
    pub fn net(mut self, net: NetModel) -> Self {
        self.net = net;
        self
    }

    /// The latency of every link.
    pub fn latency(mut self, latency: Latency) -> Self {
        self.net.latency = latency;
        self
    }

    /// A different model for the link from process `from` to process `to`. Both must be
    /// processes of the mapping, or [`Simulation::run`] fails with
    /// [`RunError::UnknownProcess`].
    pub fn link(mut self, from: &str, to: &str, net: NetModel) -> Self {
        self.overrides.insert((from.to_owned(), to.to_owned()), net);
        self
    }

    /// Process `addr` crashes (stops, crash-stop) at virtual time `at`. It must be a
    /// process of the mapping (`sim:0` for an unmapped graph), or [`Simulation::run`]
    /// fails with [`RunError::UnknownProcess`].
    pub fn crash(mut self, addr: &str, at: Duration) -> Self {
        self.crashes.push((addr.to_owned(), at));
        self
    }

    /// Stop at this virtual time at the latest ([`SimEnd::Until`]). Work that takes no
    /// virtual time never reaches it: [`Simulation::max_steps_per_instant`] bounds that.
    pub fn until(mut self, t: Duration) -> Self {
        self.until = Some(t);
        self
    }

    /// The default `maxpar` of parallel stages in every simulated process (default:
    /// [`Simulation::DEFAULT_MAXPAR`], whatever the host).
    pub fn maxpar(mut self, n: usize) -> Self {
        self.maxpar = Some(n);
        self
    }

    /// Stop after `n` steps in all ([`SimEnd::StepBudget`]); a step is one task run (an
    /// activation of a stage, a woken instance) or one action on the virtual clock (a
    /// delivery, a timer, a crash). Default: no bound; the simulation is deterministic,
    /// so the same seed stops at the same step.
    pub fn max_steps(mut self, n: u64) -> Self {
        self.max_steps = n;
        self
    }

    /// Stop after `n` steps (see [`Simulation::max_steps`]) taken without the virtual
    /// clock moving ([`SimEnd::ZeroTimeLoop`]): a loop of work that takes no virtual time
    /// would otherwise run for ever, `until` or not. Default:
    /// [`Simulation::DEFAULT_MAX_STEPS_PER_INSTANT`]; raise it for a simulation that
    /// legitimately does that much at one instant (an unmapped graph without sleeps does
    /// all its work at time zero).
    pub fn max_steps_per_instant(mut self, n: u64) -> Self {
        self.max_steps_per_instant = n;
        self
    }

    /// Runs `graph` (partitioned and mapped; an unmapped graph is one process, `sim:0`)
    /// until a handler quits, nothing is left to do, the `until` time or a step budget;
    /// [`SimReport::end`] says which. Fails before anything runs if the graph is invalid
    /// or a fault names a process that the mapping does not have.
    pub fn run(self, graph: &Graph) -> Result<SimReport, RunError> {
        let plan = graph.verify()?;
        let addrs: Vec<String> = match &plan.processes {
            Some(procs) => procs.iter().flat_map(|p| p.0.iter().cloned()).collect(),
            None => vec!["sim:0".to_owned()],
        };
        let known = |addr: &str, fault: &'static str| {
            if addrs.iter().any(|a| a == addr) {
                Ok(())
            } else {
                Err(RunError::UnknownProcess {
                    addr: addr.to_owned(),
                    fault,
                    known: addrs.clone(),
                })
            }
        };
        for (addr, _) in &self.crashes {
            known(addr, "crash")?;
        }
        // In a fixed order: which error a run reports must not depend on a hash map's.
        let mut links: Vec<&(String, String)> = self.overrides.keys().collect();
        links.sort();
        for (from, to) in links {
            known(from, "link from")?;
            known(to, "link to")?;
        }
        let core = Arc::new(Core {
            state: Mutex::new(State {
                now: Duration::ZERO,
                seq: 0,
                ready: VecDeque::new(),
                timers: BinaryHeap::new(),
                actions: HashMap::new(),
                rng: SimRng::new(self.seed),
                trace: Vec::new(),
                dead: vec![false; addrs.len()],
                last_delivery: HashMap::new(),
                handles: Vec::new(),
                lost: 0,
                quitter: None,
            }),
            addrs: addrs.clone(),
            net: self.net.clone(),
            overrides: self.overrides.clone(),
        });
        // The simulated processes and the core refer to each other (executor, links, handles,
        // queued tasks and wakers); break the cycle however the run ends, or every run leaks.
        let _teardown = Teardown(core.clone());
        let mapped = plan.processes.is_some();
        // The initial events of a replicated cluster are dealt over its replicas, as a
        // launcher deals them (before, its first replica took them all): each
        // process' share is pushed back just before it starts.
        let mut initial: Vec<(usize, Vec<(String, Event)>)> = Vec::new();
        if let Some(procs) = &plan.processes {
            for (si, s) in graph.stages().iter().enumerate() {
                let Some(c) = plan.cluster_of(s) else {
                    continue;
                };
                let replicas = &procs[c].0;
                if replicas.len() > 1 {
                    let evs = s.take_pushed().into_iter().enumerate();
                    let dealt = evs.map(|(k, e)| (replicas[k % replicas.len()].clone(), e));
                    initial.push((si, dealt.collect()));
                }
            }
        }
        let mut running: Vec<(String, Running)> = Vec::new();
        for (pid, addr) in addrs.iter().enumerate() {
            for (si, evs) in &mut initial {
                for (to, e) in std::mem::take(evs) {
                    if to == *addr {
                        graph.stages()[*si].push(e);
                    } else {
                        evs.push((to, e));
                    }
                }
            }
            let exec = Arc::new(SimExec {
                core: core.clone(),
                pid,
            });
            // One virtual thread, and a maxpar that does not follow the host's CPUs.
            let mut opts = Run::default()
                .executor(exec)
                .threads(1)
                .maxpar(self.maxpar.unwrap_or(Self::DEFAULT_MAXPAR));
            if mapped {
                opts = opts.process(addr.clone()).remote(Arc::new(SimLinks {
                    core: core.clone(),
                    pid,
                }));
            }
            let r = match graph.start(opts) {
                Ok(r) => r,
                Err(e) => {
                    // The shares not dealt yet go back to their stages, for a later run.
                    for (si, evs) in initial {
                        for (_, ev) in evs {
                            graph.stages()[si].push(ev);
                        }
                    }
                    return Err(e);
                }
            };
            core.lock().handles.push(r.handle());
            running.push((addr.clone(), r));
        }
        for (addr, at) in &self.crashes {
            if let Some(pid) = addrs.iter().position(|a| a == addr) {
                core.lock().at(*at, Action::Crash(pid));
            }
        }
        let stop = core.drive(&Bounds {
            until: self.until,
            max_steps: self.max_steps,
            max_steps_per_instant: self.max_steps_per_instant,
        });
        let end = match stop {
            Stop::Quit(pid) => SimEnd::Quit {
                process: addrs[pid].clone(),
            },
            Stop::OutOfWork => core.idle_or_stuck(),
            Stop::Until => SimEnd::Until,
            Stop::StepBudget(steps) => SimEnd::StepBudget { steps },
            Stop::ZeroTimeLoop(steps) => SimEnd::ZeroTimeLoop { steps },
        };
        let reason = match end {
            SimEnd::Quit { .. } => EndReason::Quit,
            SimEnd::Idle | SimEnd::Stuck { .. } => EndReason::Idle,
            SimEnd::Until | SimEnd::StepBudget { .. } | SimEnd::ZeroTimeLoop { .. } => {
                EndReason::Timeout
            }
        };
        let (time, quitter) = {
            let s = core.lock();
            (s.now, s.quitter)
        };
        // What was left to run or deliver goes before the processes' last snapshots, so
        // that the events of activations still ready or waiting on the virtual clock
        // count as discarded there.
        drop(core.take_left());
        let handles: Vec<ProcessHandle> = running.iter().map(|(_, r)| r.handle()).collect();
        for h in &handles {
            h.quit(Event::new());
        }
        let mut processes = Vec::new();
        let mut quit = None;
        for (pid, (addr, r)) in running.into_iter().enumerate() {
            let mut report = r.wait()?;
            if Some(pid) == quitter {
                quit = report.quit.take();
            }
            report.reason = reason;
            processes.push((addr, report));
        }
        let mut s = core.lock();
        Ok(SimReport {
            end,
            time,
            quit,
            trace: std::mem::take(&mut s.trace),
            processes,
            lost: s.lost,
        })
    }
}

/// Drops what the core holds of the simulated processes (see [`Simulation::run`]).
struct Teardown(Arc<Core>);

impl Drop for Teardown {
    fn drop(&mut self) {
        let handles = std::mem::take(&mut self.0.lock().handles);
        // Dropped outside the lock: a task or waker may lock the core as it goes.
        drop((handles, self.0.take_left()));
    }
}

/// What bounds [`Core::drive`].
struct Bounds {
    until: Option<Duration>,
    max_steps: u64,
    max_steps_per_instant: u64,
}

/// Why [`Core::drive`] returned.
enum Stop {
    /// The live process with this index quit.
    Quit(usize),
    /// No task ready, no timed action left.
    OutOfWork,
    Until,
    StepBudget(u64),
    ZeroTimeLoop(u64),
}

/// The next step of [`Core::drive`]: a ready task, or the timed action due first.
enum Step {
    Task((usize, Task)),
    Timer(Duration, u64),
}

enum Action {
    Wake(Waker),
    Deliver {
        to: usize,
        stage: String,
        event: Event,
        from: usize,
        from_stage: String,
    },
    Crash(usize),
}

struct State {
    now: Duration,
    seq: u64,
    ready: VecDeque<(usize, Task)>,
    timers: BinaryHeap<Reverse<(Duration, u64)>>,
    actions: HashMap<u64, Action>,
    rng: SimRng,
    trace: Vec<String>,
    dead: Vec<bool>,
    last_delivery: HashMap<(usize, usize), Duration>,
    handles: Vec<ProcessHandle>,
    lost: u64,
    /// The live process whose handler ended the run.
    quitter: Option<usize>,
}

impl State {
    fn at(&mut self, t: Duration, action: Action) -> u64 {
        self.seq += 1;
        self.timers.push(Reverse((t, self.seq)));
        self.actions.insert(self.seq, action);
        self.seq
    }

    fn log(&mut self, line: std::fmt::Arguments<'_>) {
        let mut s = String::new();
        let _ = write!(s, "{:>12.6} ", self.now.as_secs_f64());
        let _ = s.write_fmt(line);
        self.trace.push(s);
    }
}

struct Core {
    state: Mutex<State>,
    addrs: Vec<String>,
    net: NetModel,
    overrides: HashMap<(String, String), NetModel>,
}

impl Core {
    /// Takes what is left to run or deliver (ready tasks, actions on the virtual clock),
    /// for the caller to drop outside the lock: a task or waker may lock the core as it
    /// goes.
    fn take_left(&self) -> (VecDeque<(usize, Task)>, HashMap<u64, Action>) {
        let mut s = self.lock();
        s.timers.clear();
        (std::mem::take(&mut s.ready), std::mem::take(&mut s.actions))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs ready tasks; when none is left, moves the clock to the next timed action.
    /// Each task run and each timed action is a step, counted against the bounds.
    fn drive(&self, bounds: &Bounds) -> Stop {
        let (mut steps, mut still) = (0u64, 0u64);
        loop {
            let mut s = self.lock();
            let step = match s.ready.pop_front() {
                Some(task) => Step::Task(task),
                None => {
                    let Some(&Reverse((t, id))) = s.timers.peek() else {
                        return Stop::OutOfWork;
                    };
                    if let Some(u) = bounds.until
                        && t > u
                    {
                        s.now = u;
                        return Stop::Until;
                    }
                    if t > s.now {
                        still = 0; // the clock moves
                    }
                    Step::Timer(t, id)
                }
            };
            if steps >= bounds.max_steps || still >= bounds.max_steps_per_instant {
                if let Step::Task(task) = step {
                    s.ready.push_front(task);
                }
                return if steps >= bounds.max_steps {
                    Stop::StepBudget(steps)
                } else {
                    Stop::ZeroTimeLoop(still)
                };
            }
            steps += 1;
            still += 1;
            let action = match step {
                Step::Task((pid, task)) => {
                    let dead = s.dead[pid];
                    drop(s);
                    if !dead {
                        task.run();
                    }
                    if let Some(pid) = self.check_quit() {
                        return Stop::Quit(pid);
                    }
                    continue;
                }
                Step::Timer(t, id) => {
                    s.timers.pop();
                    s.now = s.now.max(t);
                    let action = s.actions.remove(&id);
                    // Acted on outside the lock: a wake-up schedules a task, which locks.
                    drop(s);
                    action
                }
            };
            match action {
                Some(Action::Wake(w)) => w.wake(),
                Some(Action::Deliver {
                    to,
                    stage,
                    event,
                    from,
                    from_stage,
                }) => self.deliver(to, &stage, event, from, &from_stage),
                Some(Action::Crash(pid)) => {
                    let mut s = self.lock();
                    s.dead[pid] = true;
                    let addr = self.addrs[pid].clone();
                    s.log(format_args!("crash {addr}"));
                    let h = s.handles[pid].clone();
                    drop(s);
                    h.quit(Event::new());
                }
                None => {}
            }
        }
    }

    /// The live process whose handler called `quit`, once one did (recorded as the
    /// quitter).
    fn check_quit(&self) -> Option<usize> {
        let mut s = self.lock();
        if s.quitter.is_none() {
            s.quitter = (0..s.handles.len()).find(|&p| !s.dead[p] && s.handles[p].is_stopping());
        }
        s.quitter
    }

    /// Once nothing is left to run or deliver: [`SimEnd::Idle`] if every live process is
    /// quiescent, else [`SimEnd::Stuck`] with the instances still waiting.
    fn idle_or_stuck(&self) -> SimEnd {
        let live: Vec<ProcessHandle> = {
            let s = self.lock();
            (0..s.handles.len())
                .filter(|&p| !s.dead[p])
                .map(|p| s.handles[p].clone())
                .collect()
        };
        if live.iter().all(ProcessHandle::is_quiescent) {
            return SimEnd::Idle;
        }
        let waiting = live
            .iter()
            .flat_map(|h| h.snapshot().stages)
            .map(|st| st.waiting)
            .sum();
        SimEnd::Stuck { waiting }
    }

    fn deliver(&self, to: usize, stage: &str, event: Event, from: usize, from_stage: &str) {
        let mut s = self.lock();
        let (to_addr, from_addr) = (self.addrs[to].clone(), self.addrs[from].clone());
        if s.dead[to] {
            s.lost += 1;
            s.log(format_args!(
                "drop {from_addr}/{from_stage} -> {to_addr}/{stage} (crashed) {event}"
            ));
            return;
        }
        let h = s.handles[to].clone();
        let Some(idx) = h.stage_index(stage) else {
            s.lost += 1;
            s.log(format_args!(
                "drop {from_addr}/{from_stage} -> {to_addr}/{stage} (no such stage)"
            ));
            return;
        };
        s.log(format_args!(
            "deliver {from_addr}/{from_stage} -> {to_addr}/{stage} {event}"
        ));
        drop(s);
        if let Err(r) = h.inject(idx, event) {
            // The receiver's queue is full: report to the sender, as a transport would.
            let mut s = self.lock();
            s.lost += 1;
            s.log(format_args!("refused {to_addr}/{stage}: {}", r.error));
            let sender = s.handles[from].clone();
            drop(s);
            if let Some(i) = sender.stage_index(from_stage) {
                sender.report_failed(i, &r.error, r.event);
            }
        }
    }
}

struct SimExec {
    core: Arc<Core>,
    pid: usize,
}

impl Executor for SimExec {
    fn schedule(&self, task: Task) {
        self.core.lock().ready.push_back((self.pid, task));
    }
    fn now(&self) -> f64 {
        self.core.lock().now.as_secs_f64()
    }
    fn sleep(&self, d: Duration) -> BoxFuture<()> {
        let deadline = self.core.lock().now + d;
        Box::pin(SimSleep {
            core: self.core.clone(),
            deadline,
            timer: None,
        })
    }
    fn threads(&self) -> usize {
        1
    }
    fn set_threads(&self, _: usize) {}
    fn busy_threads(&self) -> usize {
        0
    }
    fn ready_len(&self) -> usize {
        self.core
            .lock()
            .ready
            .iter()
            .filter(|(p, _)| *p == self.pid)
            .count()
    }
}

struct SimSleep {
    core: Arc<Core>,
    deadline: Duration,
    timer: Option<u64>,
}

impl Future for SimSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let core = self.core.clone();
        let mut s = core.lock();
        if s.now >= self.deadline {
            return Poll::Ready(());
        }
        if let Some(id) = self.timer {
            s.actions.insert(id, Action::Wake(cx.waker().clone()));
        } else {
            let id = s.at(self.deadline, Action::Wake(cx.waker().clone()));
            self.timer = Some(id);
        }
        Poll::Pending
    }
}

struct SimLinks {
    core: Arc<Core>,
    pid: usize,
}

impl RemoteLinks for SimLinks {
    fn sink(
        &self,
        from: &str,
        to: &str,
        _cluster: usize,
        processes: &[String],
    ) -> Result<Arc<dyn RemoteSink>, String> {
        let targets: Vec<usize> = processes
            .iter()
            .map(|a| {
                self.core
                    .addrs
                    .iter()
                    .position(|x| x == a)
                    .ok_or_else(|| format!("unknown process {a}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Arc::new(SimSink {
            core: self.core.clone(),
            from: self.pid,
            from_stage: from.to_owned(),
            to: to.to_owned(),
            targets,
            next: Mutex::new(0),
        }))
    }
}

struct SimSink {
    core: Arc<Core>,
    from: usize,
    from_stage: String,
    to: String,
    targets: Vec<usize>,
    next: Mutex<usize>,
}

impl RemoteSink for SimSink {
    fn send(&self, event: Event) -> Result<(), Rejected> {
        let target = {
            let mut n = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let t = self.targets[*n % self.targets.len()];
            *n += 1;
            t
        };
        let core = &self.core;
        let mut s = core.lock();
        if s.dead[self.from] {
            return Err(Rejected {
                error: SendError::Stopped,
                event,
            });
        }
        let (from_addr, to_addr) = (&core.addrs[self.from], &core.addrs[target]);
        let net = core
            .overrides
            .get(&(from_addr.clone(), to_addr.clone()))
            .unwrap_or(&core.net);
        s.log(format_args!(
            "send {from_addr}/{} -> {to_addr}/{} {event}",
            self.from_stage, self.to
        ));
        if s.rng.unit() < net.loss {
            s.lost += 1;
            s.log(format_args!(
                "lose {from_addr}/{} -> {to_addr}/{}",
                self.from_stage, self.to
            ));
            return Ok(());
        }
        let copies = if s.rng.unit() < net.duplicate { 2 } else { 1 };
        let mut event = Some(event);
        for copy in 0..copies {
            let mut delay = net.latency.sample(&mut s.rng);
            if s.rng.unit() < net.spike.0 {
                delay += net.spike.1;
            }
            let mut at = s.now + delay;
            if net.fifo {
                let last = s
                    .last_delivery
                    .entry((self.from, target))
                    .or_insert(Duration::ZERO);
                at = at.max(*last);
                *last = at;
            }
            if copy == 1 {
                s.log(format_args!(
                    "duplicate {from_addr}/{} -> {to_addr}/{}",
                    self.from_stage, self.to
                ));
            }
            let Some(original) = event.take() else { break };
            let ev = if copy + 1 < copies {
                let dup = original.clone_args();
                event = Some(original);
                dup
            } else {
                original
            };
            s.at(
                at,
                Action::Deliver {
                    to: target,
                    stage: self.to.clone(),
                    event: ev,
                    from: self.from,
                    from_stage: self.from_stage.clone(),
                },
            );
        }
        Ok(())
    }
}
