//! The process runtime: runs the clusters mapped to this process on one shared worker
//! pool steered by a controller.
//!
//! * `process`: stages, queues, instance pools, routes and the send path;
//! * `queue`: a stage's event queue (batches taken under one short lock) and its
//!   count of active instances;
//! * `outbox`: a worker's per-destination batches of sent events;
//! * `task`: one activation of an instance and the instance life cycle;
//! * `ctx`: the instance API handlers use;
//! * [`executor`]: the seam between the runtime and what runs its tasks;
//! * `pool`: the real executor (worker threads, which also drive the reactor).

mod ctx;
pub mod executor;
mod outbox;
mod pool;
pub(crate) mod process;
mod queue;
mod task;
mod timing;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

pub use ctx::{Busy, Ctx, PortKey, SendWait};
pub use task::{BATCH, Task};

use crate::controller::{Controller, Fixed, Knobs};
use crate::dashboard::{ClusterInfo, DashboardConfig, GraphInfo, StageInfo};
use crate::error::RunError;
use crate::event::Event;
use crate::graph::Graph;
use crate::stage::DEFAULT_CAPACITY;
use crate::stats::{ConnectorSnapshot, ProcessSnapshot, Snapshot, StageSnapshot};

use executor::{Executor, RemoteLinks};
use process::{ConnectorInfo, Process, Route, StageRt, StageSetup, Target};

/// Options of a run (`graph:run{...}`).
pub struct Run {
    threads: Option<usize>,
    maxpar: Option<usize>,
    until_idle: bool,
    timeout: Option<Duration>,
    controller: Option<Box<dyn Controller>>,
    stats_file: Option<PathBuf>,
    stats_interval: Duration,
    process: Option<String>,
    remote: Option<Arc<dyn RemoteLinks>>,
    executor: Option<Arc<dyn Executor>>,
    dashboard: Option<DashboardConfig>,
    on_process_loss: OnProcessLoss,
    outlive_launcher: bool,
    leave_stuck_after: Option<Duration>,
}

/// What the processes of a run do when one of them is lost (killed, frozen, cut off by
/// the network): see [`Run::on_process_loss`]. Acted on by the transport (leda-net).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OnProcessLoss {
    /// End the run everywhere; the launcher's run fails with an error that names the
    /// lost process (the default).
    #[default]
    End,
    /// Go on without it: sends to the lost process fail with
    /// [`SendError::Unreachable`](crate::error::SendError::Unreachable) (to the sender's
    /// `error` port, like any failed send), and, if `notify` names a stage of the
    /// process that noticed, that stage receives the event
    /// `("process_lost", address, cluster_index, reason)`.
    Continue {
        /// The stage told of each loss, if any.
        notify: Option<String>,
    },
}

impl Default for Run {
    fn default() -> Self {
        Run {
            threads: None,
            maxpar: None,
            until_idle: false,
            timeout: None,
            controller: None,
            stats_file: None,
            stats_interval: Duration::from_secs(1),
            process: None,
            remote: None,
            executor: None,
            dashboard: None,
            on_process_loss: OnProcessLoss::End,
            outlive_launcher: false,
            leave_stuck_after: None,
        }
    }
}

impl Run {
    /// A fixed pool of `n` worker threads (default: one per CPU).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n.max(1));
        self
    }

    /// The default instance limit of parallel stages (default: the thread count, and it
    /// follows the pool when a controller resizes it).
    pub fn maxpar(mut self, n: usize) -> Self {
        self.maxpar = Some(n.max(1));
        self
    }

    /// Also end the run once every queue is empty and no instance is active.
    pub fn until_idle(mut self) -> Self {
        self.until_idle = true;
        self
    }

    /// `true` if [`Run::until_idle`] was asked (a launcher turns it into global idle
    /// detection: one process being idle says nothing about the others).
    pub fn is_until_idle(&self) -> bool {
        self.until_idle
    }

    /// Sets or clears [`Run::until_idle`].
    pub fn set_until_idle(mut self, on: bool) -> Self {
        self.until_idle = on;
        self
    }

    /// Once the run has ended, wait at most `d` for the handlers still running, then
    /// leave their threads behind (an error is logged) and return: for a daemon, whose
    /// next deployment would otherwise wait for ever on a handler in an endless loop
    /// that nothing can interrupt (a loop in C, a finalizer). By default the end of a run
    /// waits for every handler. A call left behind belongs to an ended run: its sends
    /// fail with `Stopped`, and a wait it asks for on the run's timers or sockets
    /// (closed with the run) fails its call when it returns.
    pub fn leave_stuck_after(mut self, d: Duration) -> Self {
        self.leave_stuck_after = Some(d);
        self
    }

    /// End the run after `d`: the workers stop, and the run returns once the handler
    /// calls still running then have returned (a handler blocked in a
    /// call holds the end: see [`Run::leave_stuck_after`]).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// The controller that sizes the pool (overrides `threads`).
    pub fn controller(mut self, c: impl Controller + 'static) -> Self {
        self.controller = Some(Box::new(c));
        self
    }

    /// Append a JSON-lines statistics snapshot to `path` every `interval`.
    pub fn stats_file(mut self, path: impl Into<PathBuf>, interval: Duration) -> Self {
        self.stats_file = Some(path.into());
        self.stats_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The `host:port` of this process in the graph's mapping (default: the first
    /// cluster's first process).
    pub fn process(mut self, addr: impl Into<String>) -> Self {
        self.process = Some(addr.into());
        self
    }

    /// Serves the dashboard (statistics, metrics, graph, controls; see
    /// [`crate::dashboard`]) on `addr` (`127.0.0.1:PORT`; port 0 picks one, see
    /// [`Running::dashboard_addr`]).
    pub fn dashboard(mut self, addr: impl Into<String>) -> Self {
        let token = self.dashboard.take().and_then(|d| d.token);
        self.dashboard = Some(DashboardConfig {
            addr: addr.into(),
            token,
        });
        self
    }

    /// The token the dashboard requires on every request (required off loopback).
    pub fn dashboard_token(mut self, token: impl Into<String>) -> Self {
        let addr = self
            .dashboard
            .take()
            .map_or_else(|| "127.0.0.1:0".to_owned(), |d| d.addr);
        self.dashboard = Some(DashboardConfig {
            addr,
            token: Some(token.into()),
        });
        self
    }

    /// Runs the tasks on `executor` instead of a worker pool (a deterministic simulator,
    /// say): it gets every ready task through [`Executor::schedule`] and provides time.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// The transport to stages mapped to other processes (leda-net, or a simulator).
    pub fn remote(mut self, links: Arc<dyn RemoteLinks>) -> Self {
        self.remote = Some(links);
        self
    }

    /// What every process of the run does when another one is lost (default:
    /// [`OnProcessLoss::End`]).
    pub fn on_process_loss(mut self, policy: OnProcessLoss) -> Self {
        self.on_process_loss = policy;
        self
    }

    /// The policy set by [`Run::on_process_loss`].
    pub fn process_loss(&self) -> &OnProcessLoss {
        &self.on_process_loss
    }

    /// Under [`OnProcessLoss::Continue`], the other processes go on when the launcher's
    /// process is lost too (a long-lived service whose launcher is one of its nodes). By
    /// default a launcher's loss ends the run everywhere: a run does not outlive it.
    pub fn outlive_launcher(mut self) -> Self {
        self.outlive_launcher = true;
        self
    }

    /// Whether [`Run::outlive_launcher`] was asked.
    pub fn outlives_launcher(&self) -> bool {
        self.outlive_launcher
    }
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// A handler called `quit`.
    Quit,
    /// `until_idle` and nothing was left to do.
    Idle,
    /// The timeout passed.
    Timeout,
}

/// What a run returns.
#[derive(Debug)]
pub struct RunReport {
    /// Why the run ended.
    pub reason: EndReason,
    /// The values passed to `quit`, if it was called.
    pub quit: Option<Event>,
    /// Statistics at the end of the run.
    pub stats: Snapshot,
}

impl Graph {
    /// Validates the graph and runs the clusters mapped to this process until `quit`
    /// (or, if asked, until idle or a timeout).
    pub fn run(&self, opts: Run) -> Result<RunReport, RunError> {
        self.start(opts)?.wait()
    }

    /// Validates the graph and starts the clusters mapped to this process; the returned
    /// [`Running`] gives a [`ProcessHandle`] and waits for the end.
    pub fn start(&self, opts: Run) -> Result<Running, RunError> {
        start(self, opts)
    }
}

fn start(graph: &Graph, mut opts: Run) -> Result<Running, RunError> {
    let plan = graph.verify()?;
    let local_cluster = match (&plan.processes, &opts.process) {
        (None, _) => None,
        (Some(procs), Some(me)) => Some(
            procs
                .iter()
                .position(|p| p.0.iter().any(|a| a == me))
                .ok_or_else(|| RunError::NotMapped { addr: me.clone() })?,
        ),
        (Some(_), None) => Some(0),
    };
    let is_local = |s: &crate::stage::Stage| match local_cluster {
        None => true,
        Some(c) => plan.cluster_of(s) == Some(c),
    };

    let mut controller: Box<dyn Controller> = opts
        .controller
        .take()
        .unwrap_or_else(|| Box::new(Fixed::new(opts.threads.unwrap_or_else(num_cpus::get))));
    let initial_threads = controller.initial_threads();
    let default_maxpar = opts.maxpar.unwrap_or(initial_threads);

    // Stages of this process, in graph order.
    let local: Vec<&crate::stage::Stage> = graph.stages().iter().filter(|s| is_local(s)).collect();
    let index: HashMap<_, _> = local.iter().enumerate().map(|(i, s)| (s.id(), i)).collect();
    let stages: Vec<StageRt> = local
        .iter()
        .map(|s| {
            let spec = s.spec();
            StageRt::new(
                StageSetup {
                    name: s.name().to_owned(),
                    serial: spec.serial,
                    fail_stop: spec.fail_stop,
                    nonblocking: spec.nonblocking,
                    attrs: spec.attrs.clone(),
                    factory: spec.factory.clone(),
                    capacity: spec.capacity.unwrap_or(DEFAULT_CAPACITY),
                    maxpar: spec.maxpar,
                },
                default_maxpar,
            )
        })
        .collect();

    // Routes of each local stage.
    let mut routes: Vec<Vec<Route>> = (0..stages.len()).map(|_| Vec::new()).collect();
    let mut connectors = Vec::new();
    for c in graph.connectors().iter().filter(|c| is_local(&c.from)) {
        let target = match index.get(&c.to.id()) {
            Some(&i) => Target::Local(i),
            None => {
                let cluster = plan.cluster_of(&c.to).unwrap_or(0);
                let procs = plan
                    .processes
                    .as_ref()
                    .map(|p| p[cluster].0.clone())
                    .unwrap_or_default();
                let links = opts.remote.as_ref().ok_or_else(|| RunError::NoTransport {
                    cluster: cluster + 1,
                    addr: procs.first().cloned().unwrap_or_default(),
                })?;
                let sink = links
                    .sink(c.from.name(), c.to.name(), cluster, &procs)
                    .map_err(|reason| RunError::Remote {
                        stage: c.to.name().to_owned(),
                        reason,
                    })?;
                Target::Remote(sink)
            }
        };
        routes[index[&c.from.id()]].push(Route {
            port: c.port.clone(),
            kind: c.kind,
            target,
            connector: connectors.len(),
        });
        connectors.push(ConnectorInfo {
            from: Arc::from(c.from.name()),
            port: c.port.clone(),
            to: Arc::from(c.to.name()),
            kind: c.kind,
        });
    }

    // The real executor (worker pool + reactor), unless one was supplied.
    let (exec, real): (Arc<dyn Executor>, Option<RealExecutor>) = match opts.executor.take() {
        Some(e) => (e, None),
        None => {
            let io = pool::Io::start().map_err(|source| RunError::Io {
                context: "starting the reactor".into(),
                source,
            })?;
            let pool = Arc::new(pool::Pool::new(&io));
            (pool.clone(), Some((pool, io)))
        }
    };
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let process = Arc::new(Process::new(
        stages,
        connectors,
        exec.clone(),
        Box::new(move || {
            let _ = done_tx.try_send(());
        }),
    ));
    for (st, r) in process.stages.iter().zip(routes) {
        st.set_routes(r);
    }
    if let Some(links) = &opts.remote {
        let _ = process.remote.set(Arc::downgrade(links));
    }
    let stats_out = match &opts.stats_file {
        Some(path) => Some(BufWriter::new(File::create(path).map_err(|source| {
            RunError::Io {
                context: format!("creating stats file {}", path.display()),
                source,
            }
        })?)),
        None => None,
    };

    let handle = ProcessHandle {
        process: process.clone(),
        run_maxpar: opts.maxpar.is_some(),
    };
    let dashboard = match &opts.dashboard {
        Some(cfg) => {
            let info = graph_info(graph, &plan, local_cluster, opts.process.clone());
            Some(crate::dashboard::serve(
                cfg,
                handle.clone(),
                info,
                graph.to_dot(),
                opts.remote.clone(),
            )?)
        }
        None => None,
    };

    // The initial events are taken only now that nothing can fail (but the supervisor
    // thread's spawn, below): a start that fails leaves them to the next.
    for (st, s) in process.stages.iter().zip(&local) {
        for ev in std::mem::take(&mut s.spec().pushed) {
            st.push_initial(ev);
        }
    }
    exec.set_threads(initial_threads);
    apply_auto_maxpar(&process, initial_threads, opts.maxpar.is_some());
    controller.start(&mut Knobs::new(&process, opts.maxpar.is_some()));
    for (i, st) in process.stages.iter().enumerate() {
        if st.len() > 0 {
            process.activate(i);
        }
    }

    let supervisor = Supervisor {
        process,
        real,
        controller,
        opts,
        done_rx,
        stats_out,
    };
    let thread = std::thread::Builder::new()
        .name("leda-supervisor".into())
        .spawn(move || supervisor.run())
        .map_err(|source| RunError::Io {
            context: "starting the supervisor thread".into(),
            source,
        })?;
    Ok(Running {
        handle,
        thread,
        dashboard,
    })
}

/// The graph as the dashboard shows it.
fn graph_info(
    graph: &Graph,
    plan: &crate::graph::Plan,
    local_cluster: Option<usize>,
    process: Option<String>,
) -> GraphInfo {
    let process = process.or_else(|| {
        let procs = plan.processes.as_ref()?;
        procs.get(local_cluster?)?.0.first().cloned()
    });
    GraphInfo {
        name: graph.name().to_owned(),
        process,
        stages: graph
            .stages()
            .iter()
            .map(|s| {
                let cluster = plan.cluster_of(s).unwrap_or(0);
                StageInfo {
                    name: s.name().to_owned(),
                    serial: s.is_serial(),
                    cluster,
                    local: local_cluster.is_none_or(|c| c == cluster),
                    ports: Vec::new(), // filled by the dashboard
                }
            })
            .collect(),
        connectors: graph
            .connectors()
            .iter()
            .map(|c| crate::dashboard::ConnectorInfo {
                from: c.from.name().to_owned(),
                port: c.port.to_string(),
                to: c.to.name().to_owned(),
                kind: c.kind.to_string(),
            })
            .collect(),
        clusters: plan
            .clusters
            .iter()
            .enumerate()
            .map(|(i, c)| ClusterInfo {
                stages: c.stages().map(|s| s.name().to_owned()).collect(),
                processes: plan
                    .processes
                    .as_ref()
                    .map(|p| p[i].0.clone())
                    .unwrap_or_default(),
            })
            .collect(),
        processes: Vec::new(), // filled by the dashboard
    }
}

/// A started run: a handle into the process, and the supervisor thread that ends it.
pub struct Running {
    handle: ProcessHandle,
    thread: std::thread::JoinHandle<Result<RunReport, RunError>>,
    dashboard: Option<crate::dashboard::Dashboard>,
}

impl Running {
    /// A handle to inject events, take snapshots or quit.
    pub fn handle(&self) -> ProcessHandle {
        self.handle.clone()
    }

    /// The address the dashboard listens on, if one was asked for.
    pub fn dashboard_addr(&self) -> Option<std::net::SocketAddr> {
        self.dashboard.as_ref().map(|d| d.addr)
    }

    /// Waits for the run to end.
    pub fn wait(self) -> Result<RunReport, RunError> {
        let report = match self.thread.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        };
        drop(self.dashboard);
        report
    }
}

/// A handle into a running process: used by transports to deliver events that arrive
/// from other processes, and by tools to observe and stop the run.
#[derive(Clone)]
pub struct ProcessHandle {
    process: Arc<Process>,
    run_maxpar: bool,
}

/// An activation of a local stage claimed by [`ProcessHandle::inject_batch_here`], not
/// yet running. Dropped without [`Claimed::run`], it goes to the pool like any other.
#[must_use = "an activation left unrun is scheduled when dropped"]
pub struct Claimed(Option<Task>);

impl Claimed {
    /// Runs the activation on this thread when its stage is declared
    /// [`Stage::nonblocking`](crate::stage::Stage::nonblocking) and its queued work is
    /// short (the events queued times the stage's average call, once one was timed,
    /// under 50 µs): events that arrived from another process are then handled by the
    /// thread that read them, without waking a pool worker (on a busy two-core host
    /// the wake-up cost a round trip more than the handling). Otherwise it goes to the
    /// pool, and so do the activations of a stage whose run here took over a
    /// millisecond, for a tenth of a second after the first such run and twice as long
    /// after each further one (up to ten seconds), and at least a hundred times the
    /// run's length. The calling thread must not be a pool worker in a task's run.
    pub fn run(mut self) {
        let Some(task) = self.0.take() else { return };
        let process = task.process().clone();
        let st = &process.stages[task.stage()];
        if st.short_work() {
            let t = Instant::now();
            process.exec.run_here(task);
            st.ran_here(t.elapsed());
        } else {
            process.exec.schedule(task);
        }
    }

    /// Hands the activation to the pool (what dropping it does).
    pub fn schedule(self) {
        drop(self);
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.process().clone().exec.schedule(task);
        }
    }
}

impl ProcessHandle {
    /// The controls a controller has (threads, `maxpar`, capacities).
    pub fn knobs(&self) -> Knobs<'_> {
        Knobs::new(&self.process, self.run_maxpar)
    }

    /// The index of the local stage named `name`, for [`ProcessHandle::inject`].
    pub fn stage_index(&self, name: &str) -> Option<usize> {
        self.process.stage_index(name)
    }

    /// The names of the stages of this process, by index.
    pub fn stage_names(&self) -> Vec<String> {
        self.process
            .stages
            .iter()
            .map(|s| s.name.to_string())
            .collect()
    }

    /// Puts `event` on the queue of local stage `index` (an arrival from another
    /// process). Fails, handing the event back, if the queue is full or the run ended.
    pub fn inject(&self, index: usize, event: Event) -> Result<(), crate::error::Rejected> {
        let Some(st) = self.process.stages.get(index) else {
            return Err(crate::error::Rejected {
                error: crate::error::SendError::Unreachable {
                    stage: format!("#{index}"),
                    reason: "no such stage in this process".into(),
                },
                event,
            });
        };
        self.process
            .enqueue(index, event)
            .map(|()| {
                st.counters.received.fetch_add(1, Relaxed);
            })
            .map_err(|(error, event)| crate::error::Rejected { error, event })
    }

    /// Puts the events of `events`, in order, on the queue of local stage `index`, as
    /// many as it has room for, under one queue lock and with at most one wake-up (a
    /// batch of arrivals from another process). The room is read from the queue's
    /// lock-free counters, so concurrent producers may overshoot the capacity by up to
    /// one batch each (the soft bound of local batched sends). Returns how many were
    /// queued, from the front; the rest stay in `events`, in order. Fails, queueing
    /// nothing, if the stage does not exist or the run ended.
    pub fn inject_batch(
        &self,
        index: usize,
        events: &mut Vec<Event>,
    ) -> Result<usize, crate::error::SendError> {
        self.inject_batch_here(index, events, &mut Vec::new())
    }

    /// [`ProcessHandle::inject_batch`], but when the activation it claims for the
    /// stage has short work (see [`Claimed::run`]) it is added to `claimed` instead of
    /// waking a worker: the caller runs it once it is done with what it was doing (a
    /// transport's reader, once the frames at hand are delivered and acknowledged).
    pub fn inject_batch_here(
        &self,
        index: usize,
        events: &mut Vec<Event>,
        claimed: &mut Vec<Claimed>,
    ) -> Result<usize, crate::error::SendError> {
        let Some(st) = self.process.stages.get(index) else {
            return Err(crate::error::SendError::Unreachable {
                stage: format!("#{index}"),
                reason: "no such stage in this process".into(),
            });
        };
        if self.process.stopping.load(Relaxed) {
            return Err(crate::error::SendError::Stopped);
        }
        let room = st.capacity.load(Relaxed).saturating_sub(st.load());
        let n = room.min(events.len());
        if n < events.len() {
            st.counters
                .rejected
                .fetch_add((events.len() - n) as u64, Relaxed);
        }
        if n == 0 {
            return Ok(0);
        }
        // (If the run ends meanwhile, the push drops the batch, as an ending run drops
        // what is queued.)
        let rest = (n < events.len()).then(|| events.split_off(n));
        let task = self.process.enqueue_batch_claim(index, events);
        if let Some(rest) = rest {
            *events = rest;
        }
        if let Some(task) = task {
            // Long work goes to the pool at once (its worker starts on it while the
            // caller goes on reading); short work waits for the caller.
            if st.short_work() {
                claimed.push(Claimed(Some(task)));
            } else {
                self.process.exec.schedule(task);
            }
        }
        st.counters.received.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    /// Reports that `event`, sent by local stage `index` to another process, was lost
    /// in transit (the peer died, the connection broke): it is counted in the stage's
    /// `failed_sends`, logged, and delivered to the stage's `error` port when connected
    /// as `(stage, reason, args...)`. This keeps `sent = delivered + reported failed`.
    pub fn report_failed(&self, index: usize, error: &crate::error::SendError, event: Event) {
        self.process.report_failed_send(index, error, event);
    }

    /// Events queued at local stage `index` (or taken by an instance and not started).
    pub fn queue_load(&self, index: usize) -> usize {
        self.process.stages.get(index).map_or(0, |s| s.load())
    }

    /// `true` if local stage `index` has room for one more event.
    pub fn has_room(&self, index: usize) -> bool {
        self.process.stages.get(index).is_some_and(|s| s.has_room())
    }

    /// Ends the run as `quit` would.
    pub fn quit(&self, values: impl Into<Event>) {
        self.process.quit(values.into());
    }

    /// `true` once the run is ending (`quit` was called, here or through a handle).
    pub fn is_stopping(&self) -> bool {
        self.process
            .stopping
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `true` when nothing is queued, running, waiting or in flight in this process.
    pub fn is_quiescent(&self) -> bool {
        self.process.is_quiescent()
    }

    /// A statistics snapshot now.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.process)
    }
}

/// The worker pool and the reactor it drives.
type RealExecutor = (Arc<pool::Pool>, pool::Io);

struct Supervisor {
    process: Arc<Process>,
    /// The worker pool and reactor, when this run owns them.
    real: Option<RealExecutor>,
    controller: Box<dyn Controller>,
    opts: Run,
    done_rx: crossbeam_channel::Receiver<()>,
    stats_out: Option<BufWriter<File>>,
}

impl Supervisor {
    /// Ticks the controller and the stats file until the run ends, then stops the pool.
    fn run(self) -> Result<RunReport, RunError> {
        let Supervisor {
            process,
            real,
            mut controller,
            opts,
            done_rx,
            mut stats_out,
        } = self;
        let started = Instant::now();
        // At least a millisecond: a zero interval would make this loop spin.
        let ctrl_every = controller.interval().max(Duration::from_millis(1));
        let mut next_ctrl = started + ctrl_every;
        let mut next_stats = started + opts.stats_interval;
        let mut prev_snapshot = snapshot(&process);
        let mut prev_ctrl_snapshot = prev_snapshot.clone();
        let reason = loop {
            let now = Instant::now();
            let mut wake = next_ctrl.min(next_stats);
            if opts.until_idle {
                wake = wake.min(now + Duration::from_millis(2));
            }
            if let Some(t) = opts.timeout {
                wake = wake.min(started + t);
            }
            if done_rx
                .recv_timeout(wake.saturating_duration_since(now))
                .is_ok()
            {
                break Ok(EndReason::Quit);
            }
            let now = Instant::now();
            if opts.until_idle && process.is_quiescent() {
                break Ok(EndReason::Idle);
            }
            if opts.timeout.is_some_and(|t| now >= started + t) {
                break Ok(EndReason::Timeout);
            }
            if now >= next_ctrl {
                next_ctrl = now + ctrl_every;
                let mut snap = snapshot(&process);
                snap.rates_from(&prev_ctrl_snapshot);
                controller.tick(&snap, &mut Knobs::new(&process, opts.maxpar.is_some()));
                prev_ctrl_snapshot = snap;
            }
            if now >= next_stats {
                next_stats = now + opts.stats_interval;
                let mut snap = snapshot(&process);
                snap.rates_from(&prev_snapshot);
                if let Some(out) = stats_out.as_mut()
                    && let Err(e) = write_line(out, &snap)
                {
                    // The run ends with the error, but only after the pool is stopped.
                    break Err(e);
                }
                prev_snapshot = snap;
            }
        };

        process
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let threads = process.exec.threads();
        if let Some((pool, _)) = &real {
            pool.shutdown(opts.leave_stuck_after);
        }
        let mut stats = snapshot(&process);
        // Idle instances go now (their handlers' destructors run), not with the last
        // handle to the process: their parked tasks hold it. The reactor goes too, and
        // with it the activations waiting there, whose events the last snapshot counts
        // as discarded (no longer queued: the queue's length is read again).
        process.drop_idle();
        process.drop_waiting_producers();
        drop(real);
        // What those drops counted: sends published, held ones failed, events discarded.
        let after = snapshot(&process);
        for (s, a) in stats.stages.iter_mut().zip(after.stages) {
            s.queue_len = a.queue_len;
            s.discarded = a.discarded;
            s.failed_sends = a.failed_sends;
            s.events_out = a.events_out;
        }
        stats.connectors = after.connectors;
        let reason = reason?;
        stats.process.threads = threads;
        stats.rates_from(&prev_snapshot);
        if let Some(out) = stats_out.as_mut() {
            write_line(out, &stats)?;
        }
        let quit = process.take_ending();
        Ok(RunReport {
            reason,
            quit,
            stats,
        })
    }
}

fn write_line(out: &mut BufWriter<File>, snap: &Snapshot) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        context: "writing the stats file".into(),
        source,
    };
    serde_json::to_writer(&mut *out, snap).map_err(|e| io(std::io::Error::other(e)))?;
    out.write_all(b"\n").map_err(io)?;
    out.flush().map_err(io)
}

/// Stages whose `maxpar` was not set follow the thread count.
pub(crate) fn apply_auto_maxpar(process: &Process, threads: usize, run_maxpar_set: bool) {
    if run_maxpar_set {
        return;
    }
    for st in process.stages.iter().filter(|s| s.maxpar_auto) {
        st.maxpar.store(threads.max(1), Relaxed);
    }
}

/// A statistics snapshot of `process` (rates are filled in against a previous one).
pub(crate) fn snapshot(process: &Process) -> Snapshot {
    let time = process.started.elapsed().as_secs_f64();
    let mut stages: Vec<StageSnapshot> = process
        .stages
        .iter()
        .map(|st| {
            let c = &st.counters;
            let (n, sum, p99) = c.latency.summary();
            StageSnapshot {
                name: st.name.to_string(),
                queue_len: st.len(),
                queue_capacity: st.capacity.load(Relaxed),
                instances: st.instances.load(Relaxed),
                active: st.active(),
                idle: st.idle_len(),
                waiting: st.waiting(),
                maxpar: st.maxpar.load(Relaxed),
                created: c.created.load(Relaxed),
                events_in: c.received.load(Relaxed),
                events_out: 0,
                handled: c.handled.load(Relaxed),
                errors: c.errors.load(Relaxed),
                rejected: c.rejected.load(Relaxed),
                failed_sends: c.failed_sends.load(Relaxed),
                discarded: c.discarded.load(Relaxed),
                latency_mean_us: if n == 0 {
                    0.0
                } else {
                    sum as f64 / n as f64 / 1e3
                },
                latency_p99_us: p99 as f64 / 1e3,
                throughput: 0.0,
                busy_s: c.busy_ns.load(Relaxed) as f64 / 1e9,
            }
        })
        .collect();
    let connectors = process
        .connectors
        .iter()
        .map(|(c, info)| {
            let (n, sum, _) = c.latency.summary();
            let events = c.events.load(Relaxed);
            if let Some(i) = process.stage_index(&info.from) {
                stages[i].events_out += events;
            }
            ConnectorSnapshot {
                from: info.from.to_string(),
                port: info.port.to_string(),
                to: info.to.to_string(),
                kind: info.kind.to_string(),
                events,
                latency_mean_us: if n == 0 {
                    0.0
                } else {
                    sum as f64 / n as f64 / 1e3
                },
                throughput: 0.0,
            }
        })
        .collect();
    Snapshot {
        time,
        process: ProcessSnapshot {
            threads: process.exec.threads(),
            busy_threads: process.exec.busy_threads(),
            ready_queue: process.exec.ready_len(),
            rss_bytes: crate::stats::resident_memory(),
            cpu_s: crate::stats::cpu_time(),
        },
        stages,
        connectors,
        remote_routes: process
            .remote
            .get()
            .and_then(std::sync::Weak::upgrade)
            .map(|l| l.route_counts())
            .unwrap_or_default(),
    }
}
