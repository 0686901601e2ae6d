//! Tasks: one activation of a stage instance, and the instance life cycle.
//!
//! | state    | here                                                                  |
//! |----------|-----------------------------------------------------------------------|
//! | Created  | `StageRt::instance` runs the factory (`init`) in a worker             |
//! | Idle     | the instance sits in its stage's idle pool                            |
//! | Ready    | a [`Task`] holding a claim on the stage is in the executor's queue    |
//! | Running  | a worker runs the task: it drains the stage's queue                   |
//! | Waiting  | the handler handed a future to `Ctx::wait`; the task is parked in a   |
//! |          | wake cell and the worker is free; the waker re-schedules it           |
//! | Dead     | the handler failed or panicked: the instance is dropped, the failure  |
//! |          | counted, logged and sent to the `error` port; a new one is built lazily |
//! |          | — except for a fail-stop stage, which stops: its events fail from then |
//! |          | on without reaching a handler ([`crate::stage::Stage::fail_stop`])     |
//!
//! A running task takes events from its stage's queue a batch at a time (one lock per
//! batch, see [`super::queue`]) and handles up to [`BATCH`] events, then goes back to
//! the ready queue if more are waiting, so one busy stage cannot starve the others.
//! A task whose last batch was short (a producer feeds the queue as it is drained)
//! yields to other ready tasks rather than take events one at a time; with nothing
//! else to run, it spins a few microseconds for a batch to fill.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use crate::event::Event;
use crate::stage::{BoxError, Handler, HandlerResult};
use crate::stats::LATENCY_SAMPLE;

use super::ctx::Ctx;
use super::executor::BoxFuture;
use super::outbox;
use super::process::Process;
use super::queue::{Parked, Taken};

/// Handled-event counts are published to the stage's statistics at least this often
/// (and at the end of every run of a task, at most [`BATCH`] events), so a stage of
/// 1 ms handlers shows its rate every 64 ms. Each publication is an atomic add on a
/// line the stage's senders read: at every 16 events it cost a serial sink fed by
/// four producers 5 % of its throughput.
const FLUSH_EVERY: u64 = 64;

/// Events a task handles before yielding its worker to other ready tasks.
pub const BATCH: u32 = 256;

/// A unit of work for an executor: an activation of one stage.
pub struct Task(Box<Activation>);

struct Pending {
    fut: BoxFuture<HandlerResult>,
    copy: Option<Event>,
    started: Option<Instant>,
}

struct Activation {
    instance: Option<Box<dyn Handler>>,
    ctx: Ctx,
    pending: Option<Pending>,
    /// The event to handle before taking from the queue: the claim's (a lone event
    /// pushed on an empty queue), a cohort hand-off's, or one a take popped. The queue
    /// no longer counts it.
    first: Option<Event>,
    /// A cohort hand-off handles its one event and then behaves like a normal task.
    cohort: bool,
    /// Runs inside another task's handler (a cohort hand-off): that task goes on after
    /// this one, so what this one queues is not a hand-off to this worker.
    nested: bool,
    /// Events handled since the last flush to the stage's counters.
    unflushed: u64,
    /// The wake cell of the current wait, set when a poll returns `Pending`.
    cell: Option<Arc<WakeCell>>,
    /// Events taken from the stage's queue in the last batch, not handled yet.
    buf: VecDeque<Event>,
    /// Events of `buf` whose handling started since the queue last heard of it.
    started: usize,
    /// The last batch taken was short (the queue held fewer than a full batch).
    short: bool,
    /// The last poll yielded (`Ctx::nice`): the task goes behind other ready work.
    nice: bool,
}

impl Task {
    pub(crate) fn new(
        process: Arc<Process>,
        stage: usize,
        first: Option<Event>,
        cohort: bool,
    ) -> Task {
        Task(Box::new(Activation {
            instance: None,
            ctx: Ctx::for_calls(process, stage),
            pending: None,
            first,
            cohort,
            nested: cohort,
            unflushed: 0,
            cell: None,
            buf: VecDeque::new(),
            started: 0,
            short: false,
            nice: false,
        }))
    }

    /// A parked idle activation, set up for a new activation (see [`Task::new`]).
    pub(crate) fn reuse(self, first: Option<Event>, cohort: bool) -> Task {
        let mut a = self.0;
        debug_assert!(a.pending.is_none() && a.cell.is_none() && a.buf.is_empty());
        debug_assert!(a.first.is_none() && a.started == 0 && a.unflushed == 0);
        a.first = first;
        a.cohort = cohort;
        a.nested = cohort;
        a.short = false;
        a.nice = false;
        Task(a)
    }

    /// `true` if the task holds an instance (it can go to the idle pool).
    pub(crate) fn has_instance(&self) -> bool {
        self.0.instance.is_some()
    }

    /// Runs the task until its stage's queue is empty, its batch is used up, or its
    /// handler waits.
    pub fn run(self) {
        let mut a = self.0;
        let process = a.ctx.process.clone();
        if process.stopping.load(Relaxed) {
            return;
        }
        let st = &process.stages[a.ctx.stage];
        let batching = outbox::enter(&process);
        let outcome = loop {
            match a.drain(&process) {
                Outcome::Idle => {}
                other => break other,
            }
            // The queue looked empty (the hand-off begun by the last batch's output is
            // still open): publish the counts, then park, unless events came.
            a.publish_counts(&process);
            let nested = a.nested;
            let started = std::mem::take(&mut a.started);
            match st.take_or_park(Task(a), started, &process.stopping) {
                Parked::Took(t, taken) => {
                    a = t.0;
                    a.first = a.took(&process, taken);
                    a.end_handoff(&process, true);
                }
                parked => {
                    if !nested {
                        process.exec.end_handoff(false);
                    }
                    // The output was flushed before the last look: nothing is left.
                    drop(batching);
                    if let Parked::Drop(t) = parked {
                        // Not idle (no instance, or the run is ending): dropped here,
                        // outside the queue's lock.
                        drop(t);
                    }
                    return;
                }
            }
        };
        // What is left goes on as the task ends: this worker runs it next.
        a.begin_handoff(&process);
        drop(batching);
        a.end_handoff(&process, false);
        a.flush(&process);
        match outcome {
            Outcome::Idle => unreachable!("an idle task parks above"),
            Outcome::Yield => process.exec.schedule_yielded(Task(a)),
            Outcome::Wait => WakeCell::park(a),
        }
    }

    /// The process the task runs in.
    pub(crate) fn process(&self) -> &Arc<Process> {
        &self.0.ctx.process
    }

    /// The stage the task is an activation of.
    pub(crate) fn stage(&self) -> usize {
        self.0.ctx.stage
    }

    /// The task's batch buffer.
    pub(crate) fn buf(&mut self) -> &mut VecDeque<Event> {
        &mut self.0.buf
    }
}

/// What a handler call keeps of its event in case it fails.
#[derive(Clone, Copy)]
enum Keep {
    /// A copy, for the stage's `error` port.
    Whole,
    /// A copy that prints like the event, for the failure log
    /// ([`Event::clone_args_for_log`]).
    ForLog,
    /// No copy: no `error` port, no log of failed events.
    Nothing,
}

enum Outcome {
    /// The queue looked empty after the output was flushed (the hand-off is open):
    /// the task parks in the idle pool unless events came.
    Idle,
    Yield,
    Wait,
}

impl Activation {
    /// [`super::executor::Executor::begin_handoff`], unless this task is nested.
    fn begin_handoff(&self, process: &Process) {
        if !self.nested {
            process.exec.begin_handoff();
        }
    }

    /// [`super::executor::Executor::end_handoff`], unless this task is nested.
    fn end_handoff(&self, process: &Process, continuing: bool) {
        if !self.nested {
            process.exec.end_handoff(continuing);
        }
    }

    /// The handler's future waits: held events go back to the queue (the order is
    /// kept, and a parallel stage's other instances may take them meanwhile), and
    /// another instance is claimed for the queue's events if none runs.
    fn start_wait(&mut self, process: &Arc<Process>) -> Outcome {
        let st = &process.stages[self.ctx.stage];
        let claim = st.start_wait(&mut self.buf, std::mem::take(&mut self.started));
        process.schedule_claimed(self.ctx.stage, claim);
        Outcome::Wait
    }

    fn drain(&mut self, process: &Arc<Process>) -> Outcome {
        let st = &process.stages[self.ctx.stage];
        if self.pending.is_some() && self.poll_pending(process).is_pending() {
            return self.start_wait(process);
        }
        // The event is consumed by the handler: keep a copy only where a failure would
        // need it (an `error` port: whole; a log subscriber that records failed events:
        // as printed, large binaries left to the handler; turn that off with the filter
        // directive `leda::failed_event=off`: failures are then logged without their
        // event, under `leda::handler`).
        let keep_copy = if st.error_route.get().is_some_and(Option::is_some) {
            Keep::Whole
        } else if tracing::enabled!(target: "leda::failed_event", tracing::Level::WARN) {
            Keep::ForLog
        } else {
            Keep::Nothing
        };
        let mut budget = BATCH;
        // The budget ran out while no work was visible: the next events may be in this
        // task's own outbox (a stage sending to itself), so look again once it is
        // flushed.
        let mut yield_due = false;
        loop {
            // The run has ended (a quit, its timeout): no handler call starts after
            // that. The task goes (dropped by the stopping pool), its events counted as
            // discarded; before, it went on to the end of its batch (256 calls).
            if process.stopping.load(Relaxed) {
                return Outcome::Yield;
            }
            let ev = if let Some(ev) = self.first.take() {
                ev
            } else if let Some(ev) = self.buf.pop_front() {
                self.started += 1;
                ev
            } else if self.short && budget < BATCH && st.has_work() && process.exec.others_ready() {
                // A producer is feeding this queue as it is drained: rather than take
                // events one by one (one lock hand-over between cores each), let other
                // tasks run and come back to a fuller queue.
                return Outcome::Yield;
            } else {
                // This batch is done: its output goes on (one lock per destination), to
                // be run by this worker if the task ends here.
                self.begin_handoff(process);
                outbox::flush(process);
                if std::mem::take(&mut yield_due) && st.has_work() {
                    self.end_handoff(process, false);
                    return Outcome::Yield;
                }
                match self.next_batch(process) {
                    Some(ev) => {
                        self.end_handoff(process, true);
                        ev
                    }
                    None => return Outcome::Idle,
                }
            };
            self.handle(process, ev, keep_copy);
            if self.pending.is_some() && self.poll_pending(process).is_pending() {
                self.cohort = false;
                return self.start_wait(process);
            }
            budget -= 1;
            if self.cohort || budget == 0 {
                let spent = budget == 0;
                self.cohort = false;
                budget = BATCH;
                if !self.buf.is_empty() || st.has_work() {
                    return Outcome::Yield;
                }
                yield_due = spent;
            }
        }
    }

    /// Takes the next batch from the stage's queue; `None` once the queue looks empty
    /// (the activation still holds its claim: [`super::process::StageRt::take_or_park`]
    /// looks once more and gives it back).
    fn next_batch(&mut self, process: &Arc<Process>) -> Option<Event> {
        let st = &process.stages[self.ctx.stage];
        // Spin briefly for more work rather than release, when this worker has
        // nothing else to do (re-activation costs more than a short spin).
        let may_spin = process.exec.may_spin();
        if may_spin && self.short && st.queued() > 0 {
            // Nothing else to run, the last batch was short and a producer is feeding
            // the queue: give it a moment to fill a batch, instead of taking its
            // events one by one.
            fill_wait(st);
        }
        loop {
            if !may_spin && !st.has_work() {
                // Nothing to take (a lock-free peek): `take_or_park` looks under the
                // lock, and parks, in one go.
                return None;
            }
            let t = st.take(&mut self.buf, std::mem::take(&mut self.started));
            if let Some(ev) = self.took(process, t) {
                return Some(ev);
            }
            // Empty: spin for more if allowed.
            if !may_spin || !spin_for_work(st) {
                return None;
            }
        }
    }

    /// What a take gave this activation: schedules the other activation it claimed (more
    /// work than this instance, up to maxpar) and returns the next event to handle.
    fn took(&mut self, process: &Arc<Process>, t: Taken) -> Option<Event> {
        process.schedule_claimed(self.ctx.stage, t.another);
        let ev = t.event?;
        self.short = self.buf.len() + 1 < super::queue::TAKE;
        Some(ev)
    }

    fn handle(&mut self, process: &Arc<Process>, mut ev: Event, keep_copy: Keep) {
        let st = &process.stages[self.ctx.stage];
        if let Some(stamp) = ev.take_stamp() {
            process.connectors[stamp.connector]
                .0
                .latency
                .record(stamp.at.elapsed());
        }
        if let Some(why) = st.stopped() {
            // A fail-stop stage after its failure: no handler, no new instance.
            let why = format!("stage '{}' stopped after a failure: {why}", st.name);
            self.report_failure(process, ev, &why);
            return;
        }
        let copy = match keep_copy {
            Keep::Whole => Some(ev.clone_args()),
            Keep::ForLog => Some(ev.clone_args_for_log()),
            Keep::Nothing => None,
        };
        let instance = match &mut self.instance {
            Some(i) => i,
            empty => match st.instance() {
                Ok(i) => empty.insert(i),
                Err(e) => {
                    let copy = copy.unwrap_or_else(|| ev.clone_args());
                    self.fail(process, copy, &format!("init failed: {e}"));
                    return;
                }
            },
        };
        // One call in LATENCY_SAMPLE is timed: its duration counts (scaled) as worker
        // time, and, once the event is done, its latency goes to the histogram.
        let started = sample_tick(LATENCY_SAMPLE).then(Instant::now);
        let ctx = &mut self.ctx;
        let result = catch_unwind(AssertUnwindSafe(|| instance.handle(ev, ctx)));
        // One clock read serves both the worker time and, for a call that finished,
        // the latency.
        let took = started.map(|t| t.elapsed());
        if let Some(d) = took {
            add_busy(st, d);
        }
        let error: BoxError = match result {
            Ok(Ok(())) => {
                if let Some(fut) = self.ctx.take_wait() {
                    self.pending = Some(Pending { fut, copy, started });
                } else {
                    self.done(process, took);
                }
                return;
            }
            Ok(Err(e)) => e,
            Err(panic) => panic_message(&panic).into(),
        };
        if let Some(held) = self.ctx.take_held() {
            // Sends the call held (`send_or_wait`) were accepted: they are delivered,
            // as `send`'s are (those that cannot be are reported, each), and then the
            // call's own failure is handled.
            let fut: BoxFuture<HandlerResult> = Box::pin(async move {
                let _reported = held.await;
                Err(error)
            });
            self.pending = Some(Pending { fut, copy, started });
            return;
        }
        self.failed_call(process, error, copy);
    }

    /// A handler call (or the wait it asked for) failed with `error`: a cancellation
    /// ends the instance quietly, a refused event ([`crate::error::BadEvent`]) fails
    /// alone and the instance stays, anything else kills the instance and fails the
    /// event.
    fn failed_call(&mut self, process: &Arc<Process>, error: BoxError, copy: Option<Event>) {
        let st = &process.stages[self.ctx.stage];
        if error.is::<crate::error::BadEvent>() {
            self.refused(process, copy.unwrap_or_default(), &error.to_string());
            return;
        }
        if let Some(i) = self.instance.take() {
            st.destroy(i);
        }
        if error.is::<crate::error::Cancelled>() {
            self.cancelled(process, &error.to_string());
        } else {
            self.fail(process, copy.unwrap_or_default(), &error.to_string());
        }
    }

    fn poll_pending(&mut self, process: &Arc<Process>) -> Poll<()> {
        let Some(p) = self.pending.as_mut() else {
            return Poll::Ready(());
        };
        let cell = Arc::new(WakeCell {
            state: Mutex::new(CellState::Polling { woken: false }),
        });
        let waker = Waker::from(cell.clone());
        let mut cx = Context::from_waker(&waker);
        let timed = sample_tick(LATENCY_SAMPLE).then(Instant::now);
        NICE.set(false);
        let result = catch_unwind(AssertUnwindSafe(|| p.fut.as_mut().poll(&mut cx)));
        self.nice = NICE.take();
        // What the future sent goes on now (it may wait a long time before more); if it
        // waits, this worker runs that next.
        self.begin_handoff(process);
        outbox::flush(process);
        self.end_handoff(process, !matches!(result, Ok(Poll::Pending)));
        let st = &process.stages[self.ctx.stage];
        if let Some(t) = timed {
            add_busy(st, t.elapsed());
        }
        match result {
            Ok(Poll::Pending) => {
                self.cell = Some(cell);
                Poll::Pending
            }
            Ok(Poll::Ready(r)) => {
                let p = self.pending.take().expect("pending checked above");
                match r {
                    Ok(()) => self.done(process, p.started.map(|t| t.elapsed())),
                    Err(e) => self.failed_call(process, e, p.copy),
                }
                Poll::Ready(())
            }
            Err(panic) => {
                let p = self.pending.take().expect("pending checked above");
                self.failed_call(process, panic_message(&panic).into(), p.copy);
                Poll::Ready(())
            }
        }
    }

    fn done(&mut self, process: &Process, latency: Option<std::time::Duration>) {
        self.unflushed += 1;
        if self.unflushed >= FLUSH_EVERY {
            process.stages[self.ctx.stage]
                .counters
                .handled
                .fetch_add(self.unflushed, Relaxed);
            self.unflushed = 0;
        }
        if let Some(d) = latency {
            process.stages[self.ctx.stage].counters.latency.record(d);
        }
    }

    /// The instance died (or its fail-stop stage had stopped): count, log, and report
    /// the event to the `error` port.
    fn fail(&mut self, process: &Arc<Process>, event: Event, error: &str) {
        let st = &process.stages[self.ctx.stage];
        st.failed(error);
        let what = if st.stopped().is_some() {
            "handler failed; fail-stop stage stopped"
        } else {
            "handler failed; instance destroyed"
        };
        self.log_and_report(process, event, error, what);
    }

    /// Logs a failed event (`what` happened to the instance), counts it and reports it
    /// to the `error` port. A log line stays readable whatever the event holds (a
    /// megabyte line, an image, terminal escapes): the event and the error are cut at
    /// `LOG_MAX` bytes and their control characters escaped in the log (the `error` port
    /// gets them whole).
    fn log_and_report(&mut self, process: &Arc<Process>, event: Event, error: &str, what: &str) {
        let st = &process.stages[self.ctx.stage];
        let error_text = clip(error);
        if tracing::enabled!(target: "leda::failed_event", tracing::Level::WARN) {
            let event_text = event.to_string();
            tracing::warn!(target: "leda::failed_event", stage = %st.name, event = %clip(&event_text), error = %error_text, "{what}");
        } else {
            // The event was not kept (`leda::failed_event=off`): the failure is still logged.
            tracing::warn!(target: "leda::handler", stage = %st.name, error = %error_text, "{what}");
        }
        self.report_failure(process, event, error);
    }

    /// The handler was stopped because its run had ended ([`crate::error::Cancelled`]):
    /// the instance is gone; logged, not counted as a failure.
    fn cancelled(&mut self, process: &Arc<Process>, why: &str) {
        let st = &process.stages[self.ctx.stage];
        self.unflushed += 1;
        tracing::warn!(target: "leda::handler", stage = %st.name, "{}", clip(why));
    }

    /// The handler refused the event ([`crate::error::BadEvent`]): it fails (counted,
    /// logged, to the `error` port) and the instance, which the refusal left as it was,
    /// stays; a fail-stop stage does not stop.
    fn refused(&mut self, process: &Arc<Process>, event: Event, error: &str) {
        let what = "handler refused the event; instance kept";
        self.log_and_report(process, event, error, what);
    }

    /// Counts a failed event and reports it to the `error` port (not logged: a stopped
    /// stage's later events are logged once, by the failure that stopped it).
    fn report_failure(&mut self, process: &Arc<Process>, event: Event, error: &str) {
        let st = &process.stages[self.ctx.stage];
        self.unflushed += 1;
        st.counters.errors.fetch_add(1, Relaxed);
        if let Some(Some(_)) = st.error_route.get() {
            let mut report = Event::new().with(st.name.to_string()).with(error);
            for v in event.into_args() {
                report.push(v);
            }
            if let Err(e) = self.ctx.send(crate::port::Port::error(), report) {
                tracing::error!(stage = %st.name, error = %e, "could not deliver to the error port");
            }
        }
    }

    fn flush(&mut self, process: &Process) {
        process.stages[self.ctx.stage].settle(std::mem::take(&mut self.started));
        self.publish_counts(process);
    }

    /// Publishes the counts of events sent and handled.
    fn publish_counts(&mut self, process: &Process) {
        self.ctx.flush_counts();
        if self.unflushed > 0 {
            process.stages[self.ctx.stage]
                .counters
                .handled
                .fetch_add(self.unflushed, Relaxed);
            self.unflushed = 0;
        }
    }
}

/// Spins a few microseconds for an event to arrive; `true` if one did.
fn spin_for_work(st: &super::process::StageRt) -> bool {
    for i in 0..SPIN_ROUNDS {
        if st.has_work() {
            return true;
        }
        for _ in 0..(1 << i.min(4)) {
            std::hint::spin_loop();
        }
    }
    st.has_work()
}

/// Pauses (a few microseconds in all) while the stage's queue holds less than a
/// full batch.
fn fill_wait(st: &super::process::StageRt) {
    for _ in 0..FILL_ROUNDS {
        if st.queued() >= super::queue::TAKE {
            return;
        }
        for _ in 0..16 {
            std::hint::spin_loop();
        }
    }
}

/// Rounds of [`fill_wait`].
const FILL_ROUNDS: u32 = 8;

/// Rounds of [`spin_for_work`]: about 200 pause instructions, a few microseconds.
const SPIN_ROUNDS: u32 = 16;

/// Adds a sampled handler call (or poll) to the stage's worker time, scaled by the
/// sampling rate (an unbiased estimate the controller divides by events handled).
fn add_busy(st: &super::process::StageRt, took: std::time::Duration) {
    let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    st.time_call(ns);
    st.counters
        .busy_ns
        .fetch_add(ns.saturating_mul(LATENCY_SAMPLE), Relaxed);
}

/// Marks the future being polled on this thread as yielding (`Ctx::nice`): once
/// it returns `Pending`, its task is re-queued behind the other ready tasks.
pub(crate) fn mark_nice() {
    NICE.set(true);
}

thread_local! {
    /// Set by [`mark_nice`] during a poll.
    static NICE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static TICK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `true` once every `every` calls on this thread (sampling without shared state).
#[inline]
fn sample_tick(every: u64) -> bool {
    let t = TICK.get().wrapping_add(1);
    TICK.set(t);
    t.is_multiple_of(every)
}

/// Drops a handler's state. A destructor that panics is logged and goes no further: it
/// would kill the worker thread (and with it the event's report and the stage's later
/// events) or, at the end of a run, unwind out of `Graph::run`.
pub(crate) fn drop_instance(stage: &str, instance: Box<dyn Handler>) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(instance))) {
        tracing::error!(
            target: "leda::handler",
            stage,
            "an instance's destructor panicked: {}",
            clip(&panic_message(&p))
        );
    }
}

impl Drop for Activation {
    /// An activation dropped with events it did not handle (the run ended: the pool
    /// stopped, or the reactor it waited on closed) counts them as discarded; its
    /// instance, if any, is dropped as [`drop_instance`] does.
    fn drop(&mut self) {
        let st = &self.ctx.process.stages[self.ctx.stage];
        // The events of the batch it took are the queue's (held) until settled: they
        // leave its length as they become discarded.
        st.settle(self.started + self.buf.len());
        st.discard(
            self.buf.len()
                + usize::from(self.first.is_some())
                + usize::from(self.pending.is_some()),
        );
        if let Some(p) = self.pending.take()
            && let Err(e) = catch_unwind(AssertUnwindSafe(move || drop(p)))
        {
            tracing::error!(target: "leda::handler", stage = %st.name, "a waiting call's state panicked when dropped: {}", clip(&panic_message(&e)));
        }
        if let Some(i) = self.instance.take() {
            drop_instance(&st.name, i);
        }
    }
}

pub(crate) use crate::text::panic_message;

/// What a parked task's waker points to.
pub(crate) struct WakeCell {
    state: Mutex<CellState>,
}

enum CellState {
    /// The future is being polled (or the task is queued); `woken` records a wake-up
    /// that arrived meanwhile.
    Polling { woken: bool },
    /// Parked: the wake-up schedules it.
    Parked(Box<Activation>),
}

impl WakeCell {
    fn park(mut a: Box<Activation>) {
        let Some(cell) = a.cell.take() else {
            unreachable!("a task waits only after a poll returned Pending");
        };
        let mut s = cell.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *s {
            CellState::Polling { woken: true } => {
                drop(s);
                let process = a.ctx.process.clone();
                process.stages[a.ctx.stage].end_wait();
                if std::mem::take(&mut a.nice) {
                    // `Ctx::nice`: behind the tasks already ready, not ahead of them.
                    process.exec.schedule_niced(Task(a));
                } else {
                    process.exec.schedule(Task(a));
                }
            }
            _ => *s = CellState::Parked(a),
        }
    }
}

impl Wake for WakeCell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *s, CellState::Polling { woken: true }) {
            CellState::Parked(a) => {
                *s = CellState::Polling { woken: false };
                drop(s);
                let process = a.ctx.process.clone();
                process.stages[a.ctx.stage].end_wait();
                process.exec.schedule(Task(a));
            }
            CellState::Polling { .. } => {}
        }
    }
}

/// The most of an event or error a failure's log line shows (bytes).
const LOG_MAX: usize = 2048;

/// `s`, cut to [`LOG_MAX`] bytes at a character boundary (marked when cut), control
/// characters escaped.
pub(crate) fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    crate::text::printable(s, LOG_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_log_shows_at_most_log_max_bytes_of_an_event() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(LOG_MAX); // two bytes each: a cut could split one
        let c = clip(&long);
        assert!(c.len() < LOG_MAX + 40, "{}", c.len());
        assert!(c.ends_with(&format!("… ({} bytes in all)", 2 * LOG_MAX)));
        assert!(c.starts_with(&"é".repeat(LOG_MAX / 2)));
        // A hostile event cannot forge a line or drive a terminal.
        assert_eq!(
            clip("evil\u{1b}]0;PWNED\u{7}\rfake"),
            "evil\\u{1b}]0;PWNED\\u{7}\\rfake"
        );
    }
}
