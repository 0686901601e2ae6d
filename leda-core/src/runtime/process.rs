//! The process runtime: the stages of this process' cluster, their event queues,
//! instance pools and routes, and the send path. Executor-agnostic.
//!
//! # Scheduling protocol
//!
//! Each stage counts its *active* instances (Ready, Running or Waiting). A send pushes
//! the event, then, if fewer than `maxpar` instances are active, claims one more and
//! schedules it; an active instance drains the queue and, when it finds it empty,
//! releases itself and re-checks the queue. Both sides use sequentially consistent
//! operations on the queue length and the active count, so an event is never left in
//! a queue with no instance on its way (no lost wake-up) and no lock is taken.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;
use std::time::Instant;

use crossbeam_queue::SegQueue;

use super::queue::EventQueue;
use crossbeam_utils::CachePadded;

use crate::connector::ConnectorKind;
use crate::error::SendError;
use crate::event::Event;
use crate::port::Port;
use crate::stage::{Attrs, BoxError, Handler, InstanceFactory};
use crate::stats::{ConnectorCounters, StageCounters};

use super::Task;
use super::executor::{Executor, RemoteSink};

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

/// The producers' side of a stage queue's counters.
#[derive(Default)]
struct ProducerSide {
    pushed: AtomicU64,
    popped_seen: AtomicU64,
}

/// The runtime side of one stage.
pub(crate) struct StageRt {
    pub(crate) name: Arc<str>,
    pub(crate) serial: bool,
    pub(crate) attrs: Attrs,
    factory: Arc<dyn InstanceFactory>,
    queue: EventQueue,
    /// Written by producers only: events pushed, and their cached view of `popped`.
    producers: CachePadded<ProducerSide>,
    /// Written by consumers only: events popped.
    popped: CachePadded<AtomicU64>,
    active: CachePadded<AtomicUsize>,
    pub(crate) capacity: AtomicUsize,
    pub(crate) maxpar: AtomicUsize,
    /// `maxpar` follows the thread count (not set explicitly).
    pub(crate) maxpar_auto: bool,
    idle: SegQueue<Box<dyn Handler>>,
    pub(crate) instances: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    pub(crate) counters: StageCounters,
    routes: OnceLock<Box<[Route]>>,
    pub(crate) error_route: OnceLock<Option<usize>>,
    space: SpaceWaiters,
}

/// Static description of a stage for building the runtime.
pub(crate) struct StageSetup {
    pub(crate) name: String,
    pub(crate) serial: bool,
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
            attrs: s.attrs,
            factory: s.factory,
            queue: EventQueue::new(),
            producers: CachePadded::new(ProducerSide::default()),
            popped: CachePadded::new(AtomicU64::new(0)),
            active: CachePadded::new(AtomicUsize::new(0)),
            capacity: AtomicUsize::new(s.capacity),
            maxpar: AtomicUsize::new(maxpar),
            maxpar_auto: !s.serial && s.maxpar.is_none(),
            idle: SegQueue::new(),
            instances: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            counters: StageCounters::new(),
            routes: OnceLock::new(),
            error_route: OnceLock::new(),
            space: SpaceWaiters::default(),
        }
    }

    pub(crate) fn routes(&self) -> &[Route] {
        self.routes.get().map_or(&[], |r| r)
    }

    pub(crate) fn set_routes(&self, routes: Vec<Route>) {
        let error = routes.iter().position(|r| r.port.is_error());
        let _ = self.error_route.set(error);
        let _ = self.routes.set(routes.into_boxed_slice());
    }

    /// Pushes an event if the queue has room. The capacity is a soft bound: producers
    /// racing for the last slot may overshoot it by one event each.
    fn push(&self, ev: Event) -> Result<(), Event> {
        let cap = self.capacity.load(Relaxed) as u64;
        let p = &self.producers;
        let pushed = p.pushed.load(Relaxed);
        // Producers check against a cached count of popped events and read the
        // consumers' counter only when that looks full: no shared write per event.
        if pushed.saturating_sub(p.popped_seen.load(Relaxed)) >= cap {
            let popped = self.popped.load(SeqCst);
            p.popped_seen.store(popped, Relaxed);
            if pushed.saturating_sub(popped) >= cap {
                self.counters.rejected.fetch_add(1, Relaxed);
                return Err(ev);
            }
        }
        self.queue.push(ev);
        p.pushed.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Pushes an initial event, ignoring the capacity.
    pub(crate) fn push_initial(&self, ev: Event) {
        self.queue.push(ev);
        self.producers.pushed.fetch_add(1, SeqCst);
        self.counters.received.fetch_add(1, Relaxed);
    }

    #[inline]
    pub(crate) fn pop(&self) -> Option<Event> {
        let ev = self.queue.pop()?;
        if self.serial {
            // One consumer: a plain store, no locked instruction.
            self.popped.store(self.popped.load(Relaxed) + 1, Release);
        } else {
            self.popped.fetch_add(1, Release);
        }
        if self.space.flag.load(SeqCst) {
            self.wake_producers();
        }
        Some(ev)
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

    /// Registers a producer to be woken when an event leaves the queue. Returns `false`
    /// (and registers nothing) if there is room already.
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

    /// Events queued (pushed and not yet popped).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        let popped = self.popped.load(SeqCst);
        let pushed = self.producers.pushed.load(SeqCst);
        pushed.saturating_sub(popped) as usize
    }

    pub(crate) fn active(&self) -> usize {
        self.active.load(SeqCst)
    }

    /// Claims one more active instance if fewer than `maxpar` are active.
    #[inline]
    pub(crate) fn try_claim(&self) -> bool {
        let max = self.maxpar.load(Relaxed);
        let mut cur = self.active.load(SeqCst);
        while cur < max {
            match self
                .active
                .compare_exchange_weak(cur, cur + 1, SeqCst, SeqCst)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// Gives back an active claim (the instance, if any, goes back to the idle pool).
    /// Returns `true` if the caller must keep going because work arrived meanwhile and
    /// it re-claimed.
    pub(crate) fn release(&self, instance: Option<Box<dyn Handler>>) -> bool {
        if let Some(i) = instance {
            self.idle.push(i);
        }
        self.active.fetch_sub(1, SeqCst);
        self.len() > 0 && self.try_claim()
    }

    /// An idle instance, or a new one built by `init`.
    pub(crate) fn instance(&self) -> Result<Box<dyn Handler>, BoxError> {
        if let Some(i) = self.idle.pop() {
            return Ok(i);
        }
        let i = self.factory.create(&self.attrs)?;
        self.instances.fetch_add(1, Relaxed);
        self.counters.created.fetch_add(1, Relaxed);
        Ok(i)
    }

    /// Instances in the idle pool.
    pub(crate) fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Destroys a dead instance.
    pub(crate) fn destroy(&self, instance: Box<dyn Handler>) {
        self.instances.fetch_sub(1, Relaxed);
        drop(instance);
    }
}

/// The shared state of one process' runtime.
pub(crate) struct Process {
    pub(crate) stages: Box<[StageRt]>,
    pub(crate) connectors: Box<[(ConnectorCounters, ConnectorInfo)]>,
    pub(crate) exec: Arc<dyn Executor>,
    activations: AtomicU64,
    pub(crate) stopping: AtomicBool,
    ending: Mutex<Option<Event>>,
    pub(crate) on_end: Box<dyn Fn() + Send + Sync>,
    pub(crate) started: Instant,
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

/// Deepest chain of nested cohort hand-offs on one thread.
const MAX_COHORT_DEPTH: u32 = 32;

impl Process {
    pub(crate) fn new(
        stages: Vec<StageRt>,
        connectors: Vec<ConnectorInfo>,
        exec: Arc<dyn Executor>,
        on_end: Box<dyn Fn() + Send + Sync>,
    ) -> Process {
        Process {
            stages: stages.into_boxed_slice(),
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
        }
    }

    /// Schedules a new activation of `stage` if it has work and room for one.
    #[inline]
    pub(crate) fn activate(self: &Arc<Self>, stage: usize) {
        let st = &self.stages[stage];
        if st.active() < st.maxpar.load(Relaxed) && st.try_claim() {
            self.activations.fetch_add(1, SeqCst);
            self.exec
                .schedule(Task::new(self.clone(), stage, None, false));
        }
    }

    /// Records that a released instance re-claimed its stage.
    pub(crate) fn reactivated(&self) {
        self.activations.fetch_add(1, SeqCst);
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
            Ok(()) => {
                self.activate(stage);
                Ok(())
            }
            Err(ev) => Err((
                SendError::QueueFull {
                    stage: st.name.to_string(),
                },
                ev,
            )),
        }
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
        if depth >= MAX_COHORT_DEPTH || !st.try_claim() {
            return Err((
                SendError::CohortUnavailable {
                    stage: st.name.to_string(),
                },
                ev,
            ));
        }
        self.activations.fetch_add(1, SeqCst);
        COHORT_DEPTH.set(depth + 1);
        Task::new(self.clone(), stage, Some(ev), true).run();
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

    /// `true` when no event is queued, no instance is active and no remote send is in
    /// flight. Two reads of the activation counter around the scan make it exact: any
    /// activation that the scan could have missed changes the counter.
    pub(crate) fn is_quiescent(&self) -> bool {
        let before = self.activations.load(SeqCst);
        for st in self.stages.iter() {
            if st.len() > 0 || st.active() > 0 {
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
        before == self.activations.load(SeqCst)
    }

    /// Index of the stage named `name`.
    pub(crate) fn stage_index(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| &*s.name == name)
    }
}
