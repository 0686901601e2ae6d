//! The process runtime: the stages of this process' cluster, their event queues,
//! instance pools and routes, and the send path. Executor-agnostic.
//!
//! # Scheduling protocol
//!
//! Each stage counts its *active* instances (Ready, Running or Waiting). A send pushes
//! the event and, if fewer than `maxpar` instances are active, claims one more and
//! schedules it; an active instance takes batches of events from the queue (leaving a
//! share to another instance only for enough queued work to be worth a second worker,
//! see [`SPLIT_NS`]) and, when it finds it empty, releases itself. The push, the claim,
//! the take and the release happen under the queue's lock ([`super::queue`]), so an
//! event is never left in a queue with no instance on its way (no lost wake-up).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;
use std::time::Instant;

use super::queue::{Claim, EventQueue, Par, Parked, Taken};

use crate::connector::ConnectorKind;
use crate::error::SendError;
use crate::event::Event;
use crate::port::Port;
use crate::stage::{Attrs, BoxError, Handler, InstanceFactory};
use crate::stats::{ConnectorCounters, StageCounters};

use super::Task;
use super::executor::{Executor, RemoteSink};
use super::timing::{CallAverage, HereBackoff};

/// Where a port leads.
pub(crate) enum Target {
    /// A stage of this process, by index.
    Local(usize),
    /// A stage of another process.
    Remote(Arc<dyn RemoteSink>),
}

/// One output port of a stage, resolved.
pub(crate) struct Route {
    pub(crate) port: Port,
    pub(crate) kind: ConnectorKind,
    pub(crate) target: Target,
    /// Index into `Process::connectors`.
    pub(crate) connector: usize,
}

/// Producers waiting for room in a full queue.
#[derive(Default)]
struct SpaceWaiters {
    flag: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

/// The runtime side of one stage.
pub(crate) struct StageRt {
    pub(crate) name: Arc<str>,
    pub(crate) serial: bool,
    /// Fail-stop ([`crate::stage::Stage::fail_stop`]): the first failure stops it.
    fail_stop: bool,
    /// Why a fail-stop stage stopped: set once, by its first failure.
    stopped: OnceLock<String>,
    pub(crate) attrs: Attrs,
    factory: Arc<dyn InstanceFactory>,
    /// The event queue and the count of active instances.
    queue: EventQueue,
    pub(crate) capacity: AtomicUsize,
    pub(crate) maxpar: AtomicUsize,
    /// `maxpar` follows the thread count (not set explicitly).
    pub(crate) maxpar_auto: bool,
    pub(crate) instances: AtomicUsize,
    pub(crate) counters: StageCounters,
    /// The sampled handler calls' average, for [`StageRt::par`] and
    /// [`StageRt::short_work`].
    call_ns: CallAverage,
    /// Runs of the stage on a thread that read its events that took long keep it off
    /// such threads for a while (see [`StageRt::short_work`]).
    here: HereBackoff,
    /// [`crate::stage::Stage::nonblocking`]: may run where its events arrived.
    nonblocking: bool,
    routes: OnceLock<Box<[Route]>>,
    pub(crate) error_route: OnceLock<Option<usize>>,
    space: SpaceWaiters,
}

/// The queued work (events × the stage's average call) an instance that takes events
/// shares with another instance. Less is handled sooner by the instance that takes
/// it than by a second worker that must be woken (tens of microseconds on a loaded or
/// virtual machine) and must pull the events' cache lines over: splitting ten echo
/// events of a remote round trip between two instances cost 40 µs of its 100 µs
/// (transport bench, latency at 100,000 events/s).
pub(crate) const SPLIT_NS: u64 = 50_000;

/// Static description of a stage for building the runtime.
pub(crate) struct StageSetup {
    pub(crate) name: String,
    pub(crate) serial: bool,
    pub(crate) fail_stop: bool,
    pub(crate) nonblocking: bool,
    pub(crate) attrs: Attrs,
    pub(crate) factory: Arc<dyn InstanceFactory>,
    pub(crate) capacity: usize,
    pub(crate) maxpar: Option<usize>,
}

impl StageRt {
    pub(crate) fn new(s: StageSetup, default_maxpar: usize) -> StageRt {
        let maxpar = if s.serial {
            1
        } else {
            s.maxpar.unwrap_or(default_maxpar).max(1)
        };
        StageRt {
            name: Arc::from(s.name),
            serial: s.serial,
            fail_stop: s.fail_stop,
            stopped: OnceLock::new(),
            attrs: s.attrs,
            factory: s.factory,
            queue: EventQueue::new(),
            capacity: AtomicUsize::new(s.capacity),
            maxpar: AtomicUsize::new(maxpar),
            maxpar_auto: !s.serial && s.maxpar.is_none(),
            instances: AtomicUsize::new(0),
            counters: StageCounters::new(),
            call_ns: CallAverage::new(),
            here: HereBackoff::new(),
            nonblocking: s.nonblocking,
            routes: OnceLock::new(),
            error_route: OnceLock::new(),
            space: SpaceWaiters::default(),
        }
    }

    #[inline]
    pub(crate) fn routes(&self) -> &[Route] {
        self.routes.get().map_or(&[], |r| r)
    }

    pub(crate) fn set_routes(&self, routes: Vec<Route>) {
        let error = routes.iter().position(|r| r.port.is_error());
        let _ = self.error_route.set(error);
        let _ = self.routes.set(routes.into_boxed_slice());
    }

    #[inline]
    fn maxpar_now(&self) -> usize {
        self.maxpar.load(Relaxed)
    }

    /// `maxpar`, and how many queued events make a further instance worth it: work
    /// for [`SPLIT_NS`] at the stage's average call (every event until a call was
    /// timed).
    #[inline]
    fn par(&self) -> Par {
        let ns = self.call_ns.get();
        Par {
            max: self.maxpar_now(),
            split: SPLIT_NS.checked_div(ns).map_or(1, |k| k.max(1) as usize),
        }
    }

    /// `true` when the stage may run where its events arrived (see
    /// [`super::Claimed::run`]): it is [`crate::stage::Stage::nonblocking`], and its
    /// events (those queued, and one an activation may hold: a lone event goes with
    /// its claim, uncounted) times its average call, once a call was timed, stay under
    /// [`SPLIT_NS`] (a stage whose calls were never timed is not known to be short),
    /// and no recent run of it on such a thread took long ([`HereBackoff`]).
    pub(crate) fn short_work(&self) -> bool {
        let ns = self.call_ns.get();
        self.nonblocking
            && ns > 0
            && (self.load() as u64 + 1).saturating_mul(ns) <= SPLIT_NS
            && self.here.allowed()
    }

    /// A run of the stage on a thread that read its events took `d` (the average
    /// misses calls that are rarely slow: one call in 64 is timed).
    #[inline]
    pub(crate) fn ran_here(&self, d: std::time::Duration) {
        self.here.ran(d);
    }

    /// Folds a timed handler call (or poll) into the stage's average call.
    pub(crate) fn time_call(&self, ns: u64) {
        self.call_ns.add(ns);
    }

    /// Pushes an event if the queue has room; says whether an activation was claimed
    /// for it (the caller schedules it).
    #[inline]
    fn push(&self, ev: Event) -> Result<Claim, Event> {
        let cap = self.capacity.load(Relaxed);
        self.queue.push(ev, Some(cap), self.maxpar_now())
    }

    /// Room left for a producer that holds `held` accepted events not pushed yet, from
    /// the lock-free counters (may be slightly stale: a soft bound).
    #[inline]
    pub(crate) fn room(&self, held: usize) -> usize {
        self.capacity
            .load(Relaxed)
            .saturating_sub(self.load() + held)
    }

    /// Counts a send refused because the queue is full, and says so. Not `#[cold]`:
    /// under back-pressure (`send_wait` producers on a full queue) this is a hot path,
    /// and marking it cold cost the fan-in bench 10 % (same-run, 3 pairs).
    #[inline]
    pub(crate) fn refuse(&self) -> SendError {
        self.counters.rejected.fetch_add(1, Relaxed);
        SendError::QueueFull {
            stage: self.name.clone(),
        }
    }

    /// Events queued or held, from lock-free copies (may be slightly stale).
    #[inline]
    pub(crate) fn load(&self) -> usize {
        self.queue.load()
    }

    fn queue_push_batch(&self, evs: &mut Vec<Event>) -> Claim {
        self.queue.push_batch(evs, self.maxpar_now())
    }

    /// Pushes an initial event, ignoring the capacity.
    pub(crate) fn push_initial(&self, ev: Event) {
        self.queue.push_unbounded(ev);
        self.counters.received.fetch_add(1, Relaxed);
    }

    /// For a running instance: settles `started` held events, then takes the next
    /// batch (see [`EventQueue::take`]).
    #[inline]
    pub(crate) fn take(&self, buf: &mut VecDeque<Event>, started: usize) -> Taken {
        let t = self.queue.take(buf, started, self.par(), self.serial);
        if t.freed {
            self.room_made();
        }
        t
    }

    /// Takes the next batch for `task`, or parks it in the idle pool if the queue is
    /// empty (see [`EventQueue::take_or_park`]).
    #[inline]
    pub(crate) fn take_or_park(&self, task: Task, started: usize, stopping: &AtomicBool) -> Parked {
        let (parked, freed) =
            self.queue
                .take_or_park(task, started, self.par(), self.serial, stopping);
        if freed {
            self.room_made();
        }
        parked
    }

    /// Takes the idle instances' tasks out (they hold the process: dropped at the end
    /// of a run).
    pub(crate) fn take_idle(&self) -> Vec<Task> {
        self.queue.take_idle()
    }

    /// Settles `started` held events (their handling began).
    pub(crate) fn settle(&self, started: usize) {
        if started > 0 {
            self.queue.settle(started);
            self.room_made();
        }
    }

    /// An instance starts waiting: gives its unhandled buffered events back to the
    /// queue's front, and claims an activation for the queue's events if none runs
    /// (see [`EventQueue::start_wait`]).
    pub(crate) fn start_wait(&self, buf: &mut VecDeque<Event>, started: usize) -> Claim {
        let claim = self.queue.start_wait(buf, started, self.par());
        if started > 0 {
            self.room_made();
        }
        claim
    }

    /// A waiting instance was woken.
    pub(crate) fn end_wait(&self) {
        self.queue.end_wait();
    }

    /// Active instances waiting (a lock-free peek).
    pub(crate) fn waiting(&self) -> usize {
        self.queue.waiting()
    }

    /// Room was made: wakes the producers waiting for it once a quarter of the queue
    /// is free (at least one slot). Waking them for every slot made would have a
    /// producer faster than its consumer park and wake once per batch; with the
    /// margin it parks once per quarter queue. Every take and settle calls this, so
    /// a draining queue always reaches the mark.
    #[inline]
    fn room_made(&self) {
        if self.space.flag.load(SeqCst) {
            let cap = self.capacity.load(Relaxed);
            if self.load() + (cap / 4).max(1) <= cap {
                self.wake_producers();
            }
        }
    }

    #[cold]
    fn wake_producers(&self) {
        let wakers = {
            let mut w = self.space.wakers.lock().unwrap_or_else(|e| e.into_inner());
            self.space.flag.store(false, SeqCst);
            std::mem::take(&mut *w)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Forgets the producers waiting for room (the run ended): what they held goes
    /// with them, counted as their activations' drops count it. (A parked producer's
    /// waker holds its activation, which holds the process: kept here, they were never
    /// freed.)
    pub(crate) fn drop_waiting_producers(&self) {
        let wakers =
            std::mem::take(&mut *self.space.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        drop(wakers);
    }

    /// Registers a producer to be woken when room is made in the queue. Returns
    /// `false` (and registers nothing) if there is room already.
    pub(crate) fn wait_for_space(&self, waker: &Waker) -> bool {
        let mut w = self.space.wakers.lock().unwrap_or_else(|e| e.into_inner());
        self.space.flag.store(true, SeqCst);
        if self.has_room() {
            return false;
        }
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        true
    }

    pub(crate) fn has_room(&self) -> bool {
        self.len() < self.capacity.load(Relaxed)
    }

    /// Events queued, or taken by an instance and not started yet.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// `true` if events are waiting in the queue (a cheap, lock-free peek).
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        self.queue.has_work()
    }

    /// Events waiting in the queue (a cheap, lock-free peek).
    #[inline]
    pub(crate) fn queued(&self) -> usize {
        self.queue.queued()
    }

    pub(crate) fn active(&self) -> usize {
        self.queue.active()
    }

    /// Claims one more active instance if fewer than `maxpar` are active.
    #[inline]
    pub(crate) fn try_claim(&self) -> Claim {
        self.queue.claim(self.maxpar_now(), false)
    }

    /// Claims one more active instance if events are queued and fewer than `maxpar`
    /// instances are active.
    pub(crate) fn claim_for_work(&self) -> Claim {
        self.queue.claim(self.maxpar_now(), true)
    }

    /// A new instance built by `init` (idle ones are parked with their activations).
    pub(crate) fn instance(&self) -> Result<Box<dyn Handler>, BoxError> {
        // A panicking `init` (or factory) is an instance-creation failure like an
        // error, reported as a handler's would be; it must not unwind the worker.
        let created = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create(&self.attrs)
        }));
        let i = match created {
            Ok(r) => r?,
            Err(p) => return Err(super::task::panic_message(&p).into()),
        };
        self.instances.fetch_add(1, Relaxed);
        self.counters.created.fetch_add(1, Relaxed);
        Ok(i)
    }

    /// Instances in the idle pool.
    pub(crate) fn idle_len(&self) -> usize {
        self.queue.idle_len()
    }

    /// Notes that an instance failed with `error`: a fail-stop stage stops (the first
    /// failure is the reason it keeps).
    pub(crate) fn failed(&self, error: &str) {
        if self.fail_stop {
            let _ = self.stopped.set(error.to_owned());
        }
    }

    /// Why the stage stopped, for a fail-stop stage whose instance failed.
    pub(crate) fn stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
    }

    /// Destroys a dead instance.
    pub(crate) fn destroy(&self, instance: Box<dyn Handler>) {
        self.instances.fetch_sub(1, Relaxed);
        super::task::drop_instance(&self.name, instance);
    }

    /// Counts `n` events of this stage dropped unhandled because the run ended.
    pub(crate) fn discard(&self, n: usize) {
        if n > 0 {
            self.counters.discarded.fetch_add(n as u64, Relaxed);
        }
    }
}

/// The shared state of one process' runtime.
pub(crate) struct Process {
    pub(crate) stages: Box<[StageRt]>,
    /// Stage indices by name (the first of a name).
    by_name: std::collections::HashMap<Arc<str>, usize>,
    pub(crate) connectors: Box<[(ConnectorCounters, ConnectorInfo)]>,
    pub(crate) exec: Arc<dyn Executor>,
    activations: AtomicU64,
    pub(crate) stopping: AtomicBool,
    ending: Mutex<Option<Event>>,
    pub(crate) on_end: Box<dyn Fn() + Send + Sync>,
    pub(crate) started: Instant,
    /// The transport, for the remote routes' counts in snapshots (weak: the
    /// transport holds a handle to this process).
    pub(crate) remote: std::sync::OnceLock<std::sync::Weak<dyn super::executor::RemoteLinks>>,
    /// Live [`super::ctx::Busy`] guards: work carried on outside handler calls (last:
    /// the fields the hot path reads keep their places).
    pub(crate) busy_outside: AtomicUsize,
}

/// Names of a connector, for statistics.
pub(crate) struct ConnectorInfo {
    pub(crate) from: Arc<str>,
    pub(crate) port: Port,
    pub(crate) to: Arc<str>,
    pub(crate) kind: ConnectorKind,
}

thread_local! {
    static COHORT_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Failed sends that are logged whole, per stage ([`Process::report_failed_send`]).
const LOGGED_FAILED_SENDS: u64 = 10;

/// Deepest chain of nested cohort hand-offs on one thread.
const MAX_COHORT_DEPTH: u32 = 32;

impl Process {
    pub(crate) fn new(
        stages: Vec<StageRt>,
        connectors: Vec<ConnectorInfo>,
        exec: Arc<dyn Executor>,
        on_end: Box<dyn Fn() + Send + Sync>,
    ) -> Process {
        let mut by_name = std::collections::HashMap::with_capacity(stages.len());
        for (i, s) in stages.iter().enumerate() {
            by_name.entry(s.name.clone()).or_insert(i);
        }
        Process {
            stages: stages.into_boxed_slice(),
            by_name,
            connectors: connectors
                .into_iter()
                .map(|c| (ConnectorCounters::new(), c))
                .collect(),
            exec,
            activations: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            ending: Mutex::new(None),
            on_end,
            started: Instant::now(),
            remote: std::sync::OnceLock::new(),
            busy_outside: AtomicUsize::new(0),
        }
    }

    /// Schedules a new activation of `stage` if it has work and room for one.
    pub(crate) fn activate(self: &Arc<Self>, stage: usize) {
        let claim = self.stages[stage].claim_for_work();
        self.schedule_claimed(stage, claim);
    }

    /// Schedules the activation of `stage` that `claim` made, if it made one.
    #[inline]
    pub(crate) fn schedule_claimed(self: &Arc<Self>, stage: usize, claim: Claim) {
        if let Some(task) = self.task(stage, claim, None, false) {
            self.exec.schedule(task);
        }
    }

    /// The activation `claim` made: an idle instance's, or a new one. Its first event
    /// is the one the claim handed over, else `first` (a cohort hand-off's).
    #[inline]
    fn task(
        self: &Arc<Self>,
        stage: usize,
        claim: Claim,
        first: Option<Event>,
        cohort: bool,
    ) -> Option<Task> {
        let task = match claim {
            Claim::No => return None,
            Claim::Idle(t, direct) => t.reuse(direct.or(first), cohort),
            Claim::New(direct) => Task::new(self.clone(), stage, direct.or(first), cohort),
        };
        self.activations.fetch_add(1, SeqCst);
        Some(task)
    }

    /// Drops every stage's idle instances: called once the run has stopped (their
    /// tasks hold the process, which would otherwise never be freed).
    pub(crate) fn drop_idle(&self) {
        for st in self.stages.iter() {
            drop(st.take_idle());
        }
    }

    /// Drops the activations parked on a full local queue (the run ended).
    pub(crate) fn drop_waiting_producers(&self) {
        for st in self.stages.iter() {
            st.drop_waiting_producers();
        }
    }

    /// Reports that `event`, sent by local stage `index` and accepted, could not be
    /// delivered after all: lost in transit to another process (the peer died, the
    /// connection broke), or held by [`super::Ctx::send_or_wait`] and then refused. It
    /// is counted in the stage's `failed_sends`, logged, and delivered to the stage's
    /// `error` port when connected as `(stage, reason, args...)`: `sent = delivered +
    /// reported failed`.
    pub(crate) fn report_failed_send(
        self: &Arc<Self>,
        index: usize,
        error: &SendError,
        event: Event,
    ) {
        let Some(st) = self.stages.get(index) else {
            return;
        };
        let n = st.counters.failed_sends.fetch_add(1, Relaxed) + 1;
        // The first few of a stage are logged whole, the rest counted (in its
        // `failed_sends`, and by the link's "events lost with the connection" line): one
        // process lost mid-run logged 32,768 lines here.
        // (An event is shown cut, as a failed handler call's is: one of megabytes made
        // a line of megabytes.)
        if n <= LOGGED_FAILED_SENDS {
            let more = if n == LOGGED_FAILED_SENDS {
                " (further ones of this stage are counted, not logged)"
            } else {
                ""
            };
            let shown = event.to_string();
            tracing::warn!(stage = %st.name, event = %super::task::clip(&shown), error = %error, "event not delivered{more}");
        } else if tracing::enabled!(tracing::Level::DEBUG) {
            let shown = event.to_string();
            tracing::debug!(stage = %st.name, event = %super::task::clip(&shown), error = %error, "event not delivered");
        }
        if let Some(Some(_)) = st.error_route.get() {
            let mut report = Event::new()
                .with(st.name.to_string())
                .with(error.to_string());
            for v in event.into_args() {
                report.push(v);
            }
            let mut ctx = super::Ctx::new(self.clone(), index);
            if let Err(e) = ctx.send(crate::port::Port::error(), report) {
                tracing::error!(stage = %st.name, error = %e, "could not deliver to the error port");
            }
        }
    }

    /// Enqueues `ev` on a local stage.
    #[inline]
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        stage: usize,
        ev: Event,
    ) -> Result<(), (SendError, Event)> {
        if self.stopping.load(Relaxed) {
            return Err((SendError::Stopped, ev));
        }
        let st = &self.stages[stage];
        match st.push(ev) {
            Ok(claim) => {
                self.schedule_claimed(stage, claim);
                Ok(())
            }
            Err(ev) => Err((st.refuse(), ev)),
        }
    }

    /// Enqueues a producer's batch on a local stage (accepted against the capacity
    /// when each was sent). Fails only if the run is ending.
    pub(crate) fn enqueue_batch(self: &Arc<Self>, stage: usize, evs: &mut Vec<Event>) {
        if let Some(task) = self.enqueue_batch_claim(stage, evs) {
            self.exec.schedule(task);
        }
    }

    /// [`Process::enqueue_batch`] that hands the claimed activation, if any, to the
    /// caller instead of scheduling it.
    pub(crate) fn enqueue_batch_claim(
        self: &Arc<Self>,
        stage: usize,
        evs: &mut Vec<Event>,
    ) -> Option<Task> {
        if self.stopping.load(Relaxed) {
            self.stages[stage].discard(evs.len());
            evs.clear();
            return None;
        }
        let claim = self.stages[stage].queue_push_batch(evs);
        self.task(stage, claim, None, false)
    }

    /// Direct hand-off: runs an instance of `stage` on this thread, now.
    pub(crate) fn cohort(
        self: &Arc<Self>,
        stage: usize,
        ev: Event,
    ) -> Result<(), (SendError, Event)> {
        let st = &self.stages[stage];
        let depth = COHORT_DEPTH.get();
        if self.stopping.load(Relaxed) {
            return Err((SendError::Stopped, ev));
        }
        let claim = if depth < MAX_COHORT_DEPTH {
            st.try_claim()
        } else {
            Claim::No
        };
        if !claim.is_claimed() {
            return Err((
                SendError::CohortUnavailable {
                    stage: st.name.to_string(),
                },
                ev,
            ));
        }
        let task = self
            .task(stage, claim, Some(ev), true)
            .expect("an activation was claimed");
        COHORT_DEPTH.set(depth + 1);
        task.run();
        COHORT_DEPTH.set(depth);
        Ok(())
    }

    /// Ends the run with `quit` values (the first call wins).
    pub(crate) fn quit(&self, ev: Event) {
        {
            let mut e = self.ending.lock().unwrap_or_else(|e| e.into_inner());
            if e.is_some() {
                return;
            }
            *e = Some(ev);
        }
        self.stopping.store(true, SeqCst);
        (self.on_end)();
    }

    pub(crate) fn take_ending(&self) -> Option<Event> {
        self.ending.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// `true` when no event is queued, no instance is active, no remote send is in
    /// flight and no [`super::ctx::Busy`] guard lives. Two reads of the activation counter around the scan make it exact: any
    /// activation that the scan could have missed changes the counter.
    pub(crate) fn is_quiescent(&self) -> bool {
        // Read first: a guard dropped after its last send has made that send visible.
        if self.busy_outside.load(SeqCst) > 0 {
            return false;
        }
        let before = self.activations.load(SeqCst);
        for st in self.stages.iter() {
            if st.active() > 0 || st.len() > 0 {
                return false;
            }
            for r in st.routes() {
                if let Target::Remote(sink) = &r.target
                    && sink.in_flight() > 0
                {
                    return false;
                }
            }
        }
        // And after: a handler that took a guard and returned during the scan left its
        // stage looking idle while the guard lives (a review's stress test: an idle run
        // ended with 11–336 of 400 events handled).
        before == self.activations.load(SeqCst) && self.busy_outside.load(SeqCst) == 0
    }

    /// Index of the stage named `name`.
    pub(crate) fn stage_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}
