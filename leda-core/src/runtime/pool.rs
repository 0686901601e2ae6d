//! The real executor: one shared worker pool per process that also drives the
//! asynchronous events (a tokio reactor: timers, sockets) that wake waiting instances.
//!
//! The ready queue is a global injector plus, per worker, a LIFO deque and a FIFO
//! queue of yielded tasks, with work stealing (crossbeam-deque). A task scheduled from
//! a worker goes to that worker's deque, so a chain of hand-offs (a token around a
//! ring) stays on one warm thread; idle workers steal from the other end, so a
//! long-running producer does not keep its consumers to itself. A task that yields
//! (its batch used up, work left) goes to its worker's yielded queue: it stays where
//! its stage's queue and events are in cache, and an idle worker may take it at once
//! (a stage then settles on the worker that last stole it, instead of every yield
//! going through a shared queue to whichever worker comes first). Every
//! [`INJECTOR_EVERY`]th pick checks the injector first, and every half of that the
//! yielded queue or the niced tasks (below; each first on every other such turn), so
//! wake-ups from the reactor and yielded tasks do not wait behind a worker's stream of
//! local hand-offs. A task that yields with `Ctx::nice` (it asked to
//! go behind the other ready work: a long computation in slices) goes to a shared FIFO
//! of its own, which every worker takes from, one task at a time, after the injector;
//! its worker polls the reactor before its next pick and looks at the injector first,
//! so sockets and timers that became ready while it ran go ahead of it. In its worker's
//! yielded queue it ran again before them for up to 16 turns; in the injector an idle
//! worker's batch steal moved it into a LIFO deque, behind a stream of hand-offs that
//! no other worker steals from.
//!
//! **Hand-offs without wake-ups.** A task that ends by queueing work for another stage
//! (the output of its last batch, or the sends of a future that then waits) would wake
//! an idle worker for it, only for that worker to race this one, which is about to run
//! it anyway, and to pull the events' cache lines to the other core. During such a
//! hand-off ([`Executor::begin_handoff`]) the first task queued goes to the worker's
//! *slot*, which no other worker sees, and wakes nobody: the worker runs it next. If
//! the task goes on running after all, the slot's task moves to the deque and the
//! wake-up is made then ([`Executor::end_handoff`]).
//!
//! Idle workers spin a few microseconds (`spin_loop`, never `yield_now`: on a loaded
//! machine a yielding thread waits for other processes' time slices), then sleep until
//! a task is scheduled. A worker whose last spins all found nothing (work arrives at
//! longer intervals) spins only briefly until one finds work again. A scheduled task
//! wakes a sleeping worker unless an idle worker is already spinning (that one will
//! find it); a woken worker counts as spinning until it finds work or sleeps again, so
//! a burst of tasks wakes one worker, not all. An idle worker that finds the reactor
//! held by a worker not asleep in it looks once more, then naps briefly: a holder
//! that did not let go within a spin was preempted, and spinning on would keep it off
//! the CPU.
//!
//! Workers enter the reactor's context, so a handler may create tokio sockets and
//! timers; the workers poll the futures and the reactor only wakes them. There is no
//! reactor thread: the first idle worker to go to sleep blocks in the reactor instead
//! (the *driver*; the others sleep on a condition variable), so a socket that becomes
//! ready wakes the thread that will run its instance. Tasks woken there go to the
//! injector (served in order), without waking another worker; the driver that leaves
//! with more than one wakes a sleeper to share them (and take over the reactor). A
//! scheduled task wakes a condition-variable sleeper first, the driver only when none
//! sleeps. Busy workers poll the reactor without blocking every [`DRIVE_EVERY`] tasks
//! ([`DRIVE_GAP`] apart at least) while no worker drives it, so readiness is seen under
//! full load.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*, fence};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};

use super::Task;
use super::executor::{BoxFuture, Executor};

/// How long an idle worker keeps looking for work (spinning) before it sleeps.
const IDLE_SPIN: Duration = Duration::from_micros(20);

/// After this many consecutive idle spins that found nothing, a worker spins only
/// [`IDLE_PROBE`] until one finds work again: when work comes at intervals longer than
/// a spin (a paced stream, a request now and then) every spin is CPU taken from the
/// threads that will produce it, and on a small machine that delays them.
const IDLE_WASTED: u32 = 8;

/// The short spin of a worker whose spins have been finding nothing.
const IDLE_PROBE: Duration = Duration::from_micros(2);

/// Every this many picks, a worker takes from the injector before its own deque.
const INJECTOR_EVERY: u32 = 8;

/// How long a sleeping worker waits before it looks again on its own (a safety net:
/// wake-ups are not lost, but a busy worker's deque is stolen from only by looking).
const SLEEP_MAX: Duration = Duration::from_millis(50);

/// How long an idle worker sleeps when another worker holds the reactor without
/// sleeping in it for longer than a spin (preempted): it then looks again.
const REACTOR_NAP: Duration = Duration::from_micros(100);

/// Every this many tasks, a worker polls the reactor (without blocking) if no worker
/// drives it and it has not polled it for [`DRIVE_GAP`]. Under full load a socket's
/// readiness waits at most this many tasks: with 1.5 ms tasks (a 5 MB `writev`) 61 meant
/// 90 ms; the clock read per 8 tasks costs nothing measurable (ring, pipelines).
const DRIVE_EVERY: u32 = 8;

/// The shortest time between two polls of the reactor by one busy worker (a poll costs
/// about a microsecond: at most 1 % of its time).
const DRIVE_GAP: Duration = Duration::from_micros(100);

struct Shared {
    injector: Injector<Task>,
    /// Tasks that yielded with `Ctx::nice`, in order; taken one at a time (never moved
    /// in a batch into a worker's deque).
    niced: Injector<Task>,
    stealers: RwLock<Vec<Option<Victim>>>,
    target: AtomicUsize,
    alive: AtomicUsize,
    sleepers: AtomicUsize,
    /// Idle workers looking for work (not yet asleep): a scheduled task needs no
    /// wake-up while one is.
    spinning: AtomicUsize,
    tokens: Mutex<usize>,
    wakeup: Condvar,
    /// Workers running tasks (counted from the first task found to the first look
    /// that finds none).
    busy: AtomicUsize,
    shutdown: AtomicBool,
    io: tokio::runtime::Handle,
    /// A worker holds the reactor (polls it, or sleeps in it).
    driving: AtomicBool,
    /// The driver sleeps in the reactor (or is about to): a scheduled task may wake it
    /// through `driver_waker`.
    driver_asleep: AtomicBool,
    driver_waker: Mutex<Option<Waker>>,
}

/// What other workers see of one worker: its deque's far end, and how many tasks it
/// has started (a thief takes from a worker only while that count stands still, i.e.
/// while the worker is stuck in one long task; a worker that hops from task to task
/// keeps its hand-offs, and their caches, to itself).
struct Victim {
    stealer: Stealer<Task>,
    /// Its yielded tasks (free for the taking: they asked to run later).
    yielded: Stealer<Task>,
    started: Arc<AtomicU64>,
}

struct Local {
    pool: *const Shared,
    deque: Worker<Task>,
    /// The far end of its own deque: its oldest task, taken on the injector's turn
    /// when the injector is empty. Without it a worker whose turns go to niced tasks
    /// and whose other picks go to its slot (a stage sending to itself) never reached
    /// its deque, and no other worker steals from a worker that keeps starting tasks:
    /// stages stood at their first slice for as long as the stream ran.
    oldest: Stealer<Task>,
    /// Tasks that yielded here (first in, first out): they stay on this worker, where
    /// their stage's data is warm, unless an idle worker takes them.
    yielded: Worker<Task>,
    started: Arc<AtomicU64>,
    /// Per victim, the started-count seen at the last look.
    seen: RefCell<Vec<u64>>,
    /// This worker is inside the reactor: tasks it wakes need no other worker woken.
    driving: Cell<bool>,
    /// A hand-off is under way ([`Executor::begin_handoff`]).
    handoff: Cell<bool>,
    /// A wake-up was deferred during the hand-off: its task is in `slot`.
    owed: Cell<bool>,
    /// The task a hand-off queued: this worker runs it next (not stolen).
    slot: Cell<Option<Task>>,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
    /// On a worker: a task yielded with `Ctx::nice` in the run now ending, so the
    /// worker polls the reactor and looks at the injector before its next task.
    static NICED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is a worker with tasks of its own queued (`None`: not a
/// worker).
fn local_work() -> Option<bool> {
    LOCAL.with_borrow(|l| {
        l.as_ref()
            .map(|l| l.has_slot() || !l.deque.is_empty() || !l.yielded.is_empty())
    })
}

impl Local {
    /// The oldest task of its own deque, if any.
    fn oldest_task(&self) -> Option<Task> {
        if self.deque.is_empty() {
            return None;
        }
        self.oldest.steal().success()
    }

    /// `true` if a hand-off's task waits in the slot.
    fn has_slot(&self) -> bool {
        let t = self.slot.take();
        let some = t.is_some();
        self.slot.set(t);
        some
    }
}

/// The worker pool.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: Mutex<Threads>,
}

/// The worker threads, and the reactor's runtime they share (workers hold it weakly;
/// taken at shutdown, so that [`Io`] drops it last, closing what is parked there even
/// while a worker is left behind).
struct Threads {
    handles: Vec<JoinHandle<()>>,
    rt: Option<Arc<tokio::runtime::Runtime>>,
}

impl Pool {
    pub(crate) fn new(io: &Io) -> Pool {
        Pool {
            shared: Arc::new(Shared {
                injector: Injector::new(),
                niced: Injector::new(),
                stealers: RwLock::new(Vec::new()),
                target: AtomicUsize::new(0),
                alive: AtomicUsize::new(0),
                sleepers: AtomicUsize::new(0),
                spinning: AtomicUsize::new(0),
                tokens: Mutex::new(0),
                wakeup: Condvar::new(),
                busy: AtomicUsize::new(0),
                shutdown: AtomicBool::new(false),
                io: io.rt.handle().clone(),
                driving: AtomicBool::new(false),
                driver_asleep: AtomicBool::new(false),
                driver_waker: Mutex::new(None),
            }),
            threads: Mutex::new(Threads {
                handles: Vec::new(),
                rt: Some(io.rt.clone()),
            }),
        }
    }

    /// Stops every worker and drops the tasks still queued.
    pub(crate) fn shutdown(&self, leave_stuck_after: Option<std::time::Duration>) {
        self.shared.shutdown.store(true, SeqCst);
        self.shared.target.store(0, SeqCst);
        self.shared.wake_all();
        let handles = {
            let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            t.rt = None;
            std::mem::take(&mut t.handles)
        };
        if let Some(d) = leave_stuck_after {
            // Workers still in a handler past `d` are left behind: they hold their own
            // references to what they use (not the reactor: what other instances parked
            // there is closed with it), and leave the pool when their call returns.
            let deadline = std::time::Instant::now() + d;
            while handles.iter().any(|h| !h.is_finished()) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let stuck = handles.iter().filter(|h| !h.is_finished()).count();
            if stuck > 0 {
                tracing::error!(
                    threads = stuck,
                    "{stuck} worker thread(s) still run a handler {:.1} s after the run ended: \
                     left behind (each holds a CPU until its call returns; restart the \
                     process to reclaim them)",
                    d.as_secs_f64()
                );
            }
            for h in handles.into_iter().filter(|h| h.is_finished()) {
                let _ = h.join();
            }
        } else {
            for h in handles {
                let _ = h.join();
            }
        }
        while !self.shared.injector.steal().is_empty() {}
        while !self.shared.niced.steal().is_empty() {}
    }
}

impl Shared {
    /// Wakes a sleeping worker for a task just queued, unless an idle worker is
    /// spinning (it will find the task) or none sleeps: one on the condition variable,
    /// else the driver.
    fn notify_one(&self) {
        // Pairs with the fence of a worker going to sleep: either it sees the task in
        // its last look, or this sees it spinning or asleep.
        fence(SeqCst);
        if self.spinning.load(SeqCst) > 0 {
            return;
        }
        if self.sleepers.load(SeqCst) > 0 {
            let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            if *t < self.sleepers.load(SeqCst) {
                *t += 1;
                // Notified once the lock is free: the woken worker takes it at once,
                // and while this still held it that cost a futex wait and a wake more
                // per wake-up (the token, granted under the lock, is not lost).
                drop(t);
                self.wakeup.notify_one();
                return;
            }
        }
        self.wake_driver();
    }

    /// Wakes the driver if it sleeps in the reactor (a no-op otherwise). The driver
    /// registers its waker, then looks for work, so that either it sees a task queued
    /// before this call or this call finds its waker.
    fn wake_driver(&self) {
        if self.driver_asleep.swap(false, SeqCst) {
            let waker = self
                .driver_waker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    fn wake_all(&self) {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        *t += self.sleepers.load(SeqCst);
        drop(t);
        self.wakeup.notify_all();
        self.wake_driver();
    }

    fn find_task(&self, local: &Local, me: usize, tick: u32) -> Option<Task> {
        let niced = NICED.replace(false);
        let turn = if niced || tick.is_multiple_of(INJECTOR_EVERY) {
            self.injector
                .steal()
                .success()
                .or_else(|| local.oldest_task())
        } else {
            None
        };
        let turn = turn.or_else(|| {
            if tick.is_multiple_of(INJECTOR_EVERY) {
                local.yielded.pop().or_else(|| self.take_niced())
            } else if tick.is_multiple_of(INJECTOR_EVERY / 2) {
                // Every other turn the niced tasks go first: a worker that always has a
                // yielded task (a stage sending to itself) never reached them.
                self.take_niced().or_else(|| local.yielded.pop())
            } else {
                None
            }
        });
        if let Some(t) = turn {
            // A hand-off's task waits behind this one: where it may be stolen.
            if let Some(h) = local.slot.take() {
                local.deque.push(h);
            }
            return Some(t);
        }
        // A hand-off's task next: nobody else can run it.
        if let Some(t) = local.slot.take() {
            return Some(t);
        }
        if let Some(t) = local.deque.pop() {
            return Some(t);
        }
        if let Some(t) = local.yielded.pop() {
            return Some(t);
        }
        loop {
            match self.injector.steal_batch_and_pop(&local.deque) {
                Steal::Success(t) => return Some(t),
                Steal::Retry => continue,
                Steal::Empty => break,
            }
        }
        if let Some(t) = self.take_niced() {
            return Some(t);
        }
        let victims = self.stealers.read().unwrap_or_else(|e| e.into_inner());
        let mut seen = local.seen.borrow_mut();
        seen.resize(victims.len(), u64::MAX);
        let n = victims.len();
        for k in 1..n {
            let v = (me + k) % n;
            let Some(Some(victim)) = victims.get(v) else {
                continue;
            };
            loop {
                match victim.yielded.steal() {
                    Steal::Success(t) => return Some(t),
                    Steal::Retry => continue,
                    Steal::Empty => break,
                }
            }
            if victim.stealer.is_empty() {
                continue;
            }
            let started = victim.started.load(Relaxed);
            if std::mem::replace(&mut seen[v], started) != started {
                continue; // it moved on since the last look: let it keep its work
            }
            loop {
                match victim.stealer.steal() {
                    Steal::Success(t) => return Some(t),
                    Steal::Retry => continue,
                    Steal::Empty => break,
                }
            }
        }
        None
    }

    /// The oldest task that yielded with `Ctx::nice`, if any. (Looked at every few
    /// picks: the emptiness check is plain loads, a steal's is a fence.)
    fn take_niced(&self) -> Option<Task> {
        if self.niced.is_empty() {
            return None;
        }
        loop {
            match self.niced.steal() {
                Steal::Success(t) => return Some(t),
                Steal::Retry => continue,
                Steal::Empty => return None,
            }
        }
    }

    /// `true` if tasks wait in the shared queues (the injector, the niced tasks).
    fn shared_work(&self) -> bool {
        !self.injector.is_empty() || !self.niced.is_empty()
    }

    /// `true` if the pool has more workers than asked for (some worker should leave).
    fn should_exit_soon(&self) -> bool {
        self.alive.load(Relaxed) > self.target.load(Relaxed)
    }

    /// `true` if this worker should leave (the pool shrank); claims the exit.
    fn should_exit(&self) -> bool {
        loop {
            let alive = self.alive.load(SeqCst);
            if alive <= self.target.load(SeqCst) {
                return false;
            }
            if self
                .alive
                .compare_exchange(alive, alive - 1, SeqCst, SeqCst)
                .is_ok()
            {
                return true;
            }
        }
    }
}

fn worker(
    shared: Arc<Shared>,
    me: usize,
    deque: Worker<Task>,
    yielded: Worker<Task>,
    started: Arc<AtomicU64>,
    rt: Weak<tokio::runtime::Runtime>,
) {
    let _io = shared.io.enter();
    LOCAL.set(Some(Local {
        pool: Arc::as_ptr(&shared),
        oldest: deque.stealer(),
        deque,
        yielded,
        started,
        seen: RefCell::new(Vec::new()),
        driving: Cell::new(false),
        handoff: Cell::new(false),
        owed: Cell::new(false),
        slot: Cell::new(None),
    }));
    let mut tick = 0u32;
    // Tasks run since this worker last looked at the reactor, and when it polled it.
    let mut ran = 0u32;
    let mut polled = Instant::now();
    // Counted in `shared.busy` (running tasks, from the first found to the first look
    // that finds none: two shared writes per busy spell, not per task).
    let busy = Cell::new(false);
    let mut run = |task: Task| {
        if !busy.replace(true) {
            shared.busy.fetch_add(1, Relaxed);
        }
        run_task(task);
        ran += 1;
        if ran >= DRIVE_EVERY || NICED.get() {
            ran = 0;
            if polled.elapsed() >= DRIVE_GAP {
                polled = Instant::now();
                poll_reactor(&shared, &rt);
            }
        }
    };
    // Counted in `shared.spinning` (idle, looking for work).
    let mut spinning = false;
    // The last spin ended with another worker holding the reactor.
    let mut held = false;
    // Consecutive idle spins that found nothing (see `IDLE_WASTED`).
    let mut wasted = 0u32;
    'work: loop {
        if shared.should_exit() {
            break;
        }
        tick = tick.wrapping_add(1);
        if let Some(task) = next_task(&shared, me, tick) {
            held = false;
            stop_spinning(&shared, &mut spinning);
            run(task);
            continue;
        }
        // Idle: keep looking (stealing included) a few microseconds before sleeping: a
        // sleeping worker costs a futex wake-up per scheduled task.
        if busy.replace(false) {
            shared.busy.fetch_sub(1, Relaxed);
        }
        if !spinning {
            spinning = true;
            shared.spinning.fetch_add(1, SeqCst);
        }
        let idle_since = Instant::now();
        let spin = if wasted < IDLE_WASTED {
            IDLE_SPIN
        } else {
            IDLE_PROBE
        };
        let mut looks = 0u32;
        while !looks.is_multiple_of(8) || idle_since.elapsed() < spin {
            looks += 1;
            for _ in 0..(1u32 << (looks.min(6))) {
                std::hint::spin_loop();
            }
            tick = tick.wrapping_add(1);
            if let Some(task) = next_task(&shared, me, tick) {
                wasted = 0;
                held = false;
                stop_spinning(&shared, &mut spinning);
                run(task);
                continue 'work;
            }
            if shared.shutdown.load(Relaxed) || shared.should_exit_soon() {
                break;
            }
        }
        wasted = wasted.saturating_add(1);
        // A worker holds the reactor without sleeping in it (a busy worker's poll, or a
        // driver on its way out): it lets go within microseconds, and sleeping on the
        // condition variable now would leave the reactor undriven. Look again, once:
        // a holder that has not let go after a whole spin was preempted (on a loaded
        // machine), and spinning on would keep it from running for a time slice. Then
        // sleep, but only briefly.
        let mut nap = None;
        if shared.driving.load(SeqCst)
            && !shared.driver_asleep.load(SeqCst)
            && !shared.shutdown.load(Relaxed)
            && !shared.should_exit_soon()
        {
            if !std::mem::replace(&mut held, true) {
                continue;
            }
            nap = Some(REACTOR_NAP);
        }
        held = false;
        // Sleep, in the reactor if no worker is there. Either way, count as asleep
        // before the last look, so that a task scheduled after that look sees this
        // worker asleep and wakes it (no lost wake-up).
        spinning = false;
        if let Some(in_reactor) = InReactor::try_enter(&shared) {
            shared.driver_asleep.store(true, SeqCst);
            shared.spinning.fetch_sub(1, SeqCst);
            fence(SeqCst);
            let found = next_task(&shared, me, INJECTOR_EVERY);
            // Shutdown and shrinking are checked after the fence: `wake_all` clears
            // `driver_asleep` after setting them, so either this sees them, or the sleep
            // below sees `driver_asleep` cleared and returns at once.
            if found.is_none() && !shared.shutdown.load(SeqCst) && !shared.should_exit_soon() {
                sleep_in_reactor(&shared, &rt);
            }
            drop(in_reactor);
            // Woken tasks beyond the one this worker runs next: wake a sleeper to share
            // them (it also takes over the reactor). With one task only, none is woken
            // (a futex wake per reactor event would cost more than it saves): the
            // reactor is then undriven while that task runs, unless another worker
            // goes idle, or a busy one polls it.
            if shared.injector.len() > 1 {
                shared.notify_one();
            }
            // Looking for work again: tasks scheduled meanwhile need no other worker.
            spinning = true;
            shared.spinning.fetch_add(1, SeqCst);
            if let Some(task) = found {
                stop_spinning(&shared, &mut spinning);
                run(task);
            }
            continue;
        }
        shared.sleepers.fetch_add(1, SeqCst);
        shared.spinning.fetch_sub(1, SeqCst);
        fence(SeqCst);
        if let Some(task) = next_task(&shared, me, INJECTOR_EVERY) {
            shared.sleepers.fetch_sub(1, SeqCst);
            // A task scheduled meanwhile may have granted this (no longer) sleeper the
            // wake-up: pass it on, to a sleeper or the driver.
            if shared.shared_work() || local_work() == Some(true) {
                shared.notify_one();
            }
            run(task);
            continue;
        }
        let woken = {
            let mut t = shared.tokens.lock().unwrap_or_else(|e| e.into_inner());
            let deadline = Instant::now() + nap.unwrap_or(SLEEP_MAX);
            while *t == 0 && !shared.shutdown.load(SeqCst) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let (g, _) = shared
                    .wakeup
                    .wait_timeout(t, left)
                    .unwrap_or_else(|e| e.into_inner());
                t = g;
            }
            let woken = *t > 0;
            if woken {
                *t -= 1;
            }
            woken
        };
        if woken {
            // Woken for a task: spinning until it is found, so that tasks scheduled
            // meanwhile do not wake another worker for nothing.
            spinning = true;
            shared.spinning.fetch_add(1, SeqCst);
        }
        shared.sleepers.fetch_sub(1, SeqCst);
    }
    if spinning {
        shared.spinning.fetch_sub(1, SeqCst);
    }
    if busy.get() {
        shared.busy.fetch_sub(1, Relaxed);
    }
    // Leaving: hand the local tasks to the others.
    if let Some(l) = LOCAL.take() {
        if let Some(t) = l.slot.take() {
            shared.injector.push(t);
        }
        while let Some(t) = l.deque.pop().or_else(|| l.yielded.pop()) {
            shared.injector.push(t);
        }
    }
    shared.stealers.write().unwrap_or_else(|e| e.into_inner())[me] = None;
    shared.notify_one();
}

/// Marks the calling worker as inside the reactor (or not).
fn set_driving(on: bool) {
    LOCAL.with_borrow(|l| {
        if let Some(l) = l {
            l.driving.set(on);
        }
    });
}

/// The calling worker holds the reactor (`Shared::driving`) until dropped: then the
/// reactor is free again, also if a panic escapes `block_on` (it is never left held).
struct InReactor<'a>(&'a Shared);

impl<'a> InReactor<'a> {
    /// Takes the reactor, unless another worker holds it.
    fn try_enter(shared: &'a Shared) -> Option<InReactor<'a>> {
        if shared.driving.load(Relaxed) || shared.driving.swap(true, SeqCst) {
            return None;
        }
        set_driving(true);
        Some(InReactor(shared))
    }
}

impl Drop for InReactor<'_> {
    fn drop(&mut self) {
        set_driving(false);
        *self
            .0
            .driver_waker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.0.driver_asleep.store(false, SeqCst);
        self.0.driving.store(false, SeqCst);
    }
}

/// The driver's sleep (its caller holds the reactor, [`InReactor`]): blocks in the
/// reactor, dispatching socket and timer events, until a task is scheduled for it
/// (`driver_asleep` cleared by [`Shared::wake_driver`]) or [`SLEEP_MAX`] passes.
fn sleep_in_reactor(shared: &Shared, rt: &Weak<tokio::runtime::Runtime>) {
    let Some(rt) = reactor(shared, rt) else {
        return;
    };
    rt.block_on(async {
        let mut timeout = std::pin::pin!(tokio::time::sleep(SLEEP_MAX));
        std::future::poll_fn(|cx| {
            *shared
                .driver_waker
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            fence(SeqCst);
            if !shared.driver_asleep.load(SeqCst) || timeout.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await
    });
}

/// Polls the reactor once without blocking, unless a worker drives it (a sleeper is
/// woken for the tasks it wakes).
fn poll_reactor(shared: &Shared, rt: &Weak<tokio::runtime::Runtime>) {
    let Some(rt) = reactor(shared, rt) else {
        return;
    };
    let Some(in_reactor) = InReactor::try_enter(shared) else {
        return;
    };
    // Pending once (after waking itself): `block_on` then polls the reactor with a zero
    // timeout before it polls this again.
    let mut first = true;
    rt.block_on(std::future::poll_fn(|cx| {
        if std::mem::take(&mut first) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(())
    }));
    drop(in_reactor);
    if !shared.injector.is_empty() {
        shared.notify_one();
    }
}

/// The reactor, unless the pool is shut down. A worker holds it only while it drives
/// it, so that a worker left behind in a handler ([`Pool::shutdown`]) does not keep
/// the ended run's reactor alive, and with it every socket and future parked there;
/// nor does it drop the last reference itself (the shutdown flag is set before a
/// worker can be left behind).
fn reactor(
    shared: &Shared,
    rt: &Weak<tokio::runtime::Runtime>,
) -> Option<Arc<tokio::runtime::Runtime>> {
    if shared.shutdown.load(SeqCst) {
        return None;
    }
    rt.upgrade()
}

/// Leaves the spinning state on finding a task; the last spinner to leave wakes a
/// sleeper if more work waits in the injector (it may have skipped waking one for it).
fn stop_spinning(shared: &Shared, spinning: &mut bool) {
    if std::mem::take(spinning) && shared.spinning.fetch_sub(1, SeqCst) == 1 && shared.shared_work()
    {
        shared.notify_one();
    }
}

/// The next task for this worker (its own deque, the injector, or a stuck worker's).
fn next_task(shared: &Shared, me: usize, tick: u32) -> Option<Task> {
    LOCAL.with_borrow(|l| l.as_ref().and_then(|l| shared.find_task(l, me, tick)))
}

fn run_task(task: Task) {
    LOCAL.with_borrow(|l| {
        if let Some(l) = l {
            // Only this worker writes its count: no read-modify-write needed.
            l.started
                .store(l.started.load(Relaxed).wrapping_add(1), Relaxed);
        }
    });
    task.run();
}

impl Executor for Pool {
    #[inline]
    fn schedule(&self, task: Task) {
        let shared = &*self.shared;
        if shared.shutdown.load(Relaxed) {
            return;
        }
        let rest = LOCAL.with_borrow(|l| match l {
            Some(l) if std::ptr::eq(l.pool, shared) && !l.driving.get() => {
                // During a hand-off, the first task this worker queues is the one it runs
                // next: waking another worker for it would only bounce it (and its
                // events' cache lines) between cores.
                let rest = if l.handoff.get() && !l.owed.get() {
                    l.owed.set(true);
                    l.slot.replace(Some(task))
                } else {
                    Some(task)
                };
                match rest {
                    None => Ok(true),
                    Some(t) => {
                        l.deque.push(t);
                        Ok(false)
                    }
                }
            }
            Some(l) => Err((task, std::ptr::eq(l.pool, shared))),
            None => Err((task, false)),
        });
        match rest {
            Ok(true) => {}
            Ok(false) => shared.notify_one(),
            // Woken in the reactor by this worker: it takes the task when it leaves. The
            // injector, not its deque: a reactor poll can wake hundreds of tasks at once,
            // and they are served in order (the deque is last-in first-out).
            Err((task, true)) => {
                shared.injector.push(task);
                shared.wake_driver();
            }
            Err((task, false)) => {
                shared.injector.push(task);
                shared.notify_one();
            }
        }
    }

    fn now(&self) -> f64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    }

    fn sleep(&self, d: Duration) -> BoxFuture<()> {
        let _g = self.shared.io.enter();
        Box::pin(tokio::time::sleep(d))
    }

    /// In the pool's reactor context, as on a worker: the handler's tokio timers and
    /// sockets belong to the pool, not to the calling thread's runtime.
    fn run_here(&self, task: Task) {
        let _g = self.shared.io.enter();
        task.run();
    }

    fn threads(&self) -> usize {
        self.shared.target.load(SeqCst)
    }

    fn set_threads(&self, n: usize) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let Threads { handles, rt } = &mut *threads;
        let shared = &self.shared;
        let Some(rt) = rt.as_ref().filter(|_| !shared.shutdown.load(SeqCst)) else {
            return;
        };
        shared.target.store(n, SeqCst);
        while shared.alive.load(SeqCst) < n {
            let deque = Worker::new_lifo();
            let yielded = Worker::new_fifo();
            let started = Arc::new(AtomicU64::new(0));
            let me = {
                let mut st = shared.stealers.write().unwrap_or_else(|e| e.into_inner());
                let stealer = Some(Victim {
                    stealer: deque.stealer(),
                    yielded: yielded.stealer(),
                    started: started.clone(),
                });
                match st.iter().position(Option::is_none) {
                    Some(i) => {
                        st[i] = stealer;
                        i
                    }
                    None => {
                        st.push(stealer);
                        st.len() - 1
                    }
                }
            };
            shared.alive.fetch_add(1, SeqCst);
            let (s, rt) = (shared.clone(), Arc::downgrade(rt));
            match std::thread::Builder::new()
                .name(format!("leda-worker-{me}"))
                .spawn(move || worker(s, me, deque, yielded, started, rt))
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    shared.alive.fetch_sub(1, SeqCst);
                    shared.stealers.write().unwrap_or_else(|e| e.into_inner())[me] = None;
                    tracing::error!(error = %e, "cannot start a worker thread");
                    break;
                }
            }
        }
        shared.wake_all();
        handles.retain(|h| !h.is_finished());
    }

    fn may_spin(&self) -> bool {
        let shared = &*self.shared;
        shared.target.load(Relaxed) > 1 && !shared.shared_work() && local_work() == Some(false)
    }

    fn schedule_niced(&self, task: Task) {
        let shared = &*self.shared;
        if shared.shutdown.load(Relaxed) {
            return;
        }
        if LOCAL.with_borrow(|l| l.as_ref().is_some_and(|l| std::ptr::eq(l.pool, shared))) {
            NICED.set(true);
        }
        shared.niced.push(task);
        shared.notify_one();
    }

    fn schedule_yielded(&self, task: Task) {
        let shared = &*self.shared;
        if shared.shutdown.load(Relaxed) {
            return;
        }
        let rest = LOCAL.with_borrow(|l| match l {
            Some(l) if std::ptr::eq(l.pool, shared) => {
                l.yielded.push(task);
                None
            }
            _ => Some(task),
        });
        if let Some(task) = rest {
            shared.injector.push(task);
        }
        shared.notify_one();
    }

    fn others_ready(&self) -> bool {
        self.shared.shared_work() || local_work() == Some(true)
    }

    fn begin_handoff(&self) {
        LOCAL.with_borrow(|l| {
            if let Some(l) = l {
                l.handoff.set(true);
            }
        });
    }

    fn end_handoff(&self, continuing: bool) {
        let owed = LOCAL.with_borrow(|l| {
            l.as_ref().is_some_and(|l| {
                l.handoff.set(false);
                let owed = l.owed.replace(false);
                if owed
                    && continuing
                    && let Some(t) = l.slot.take()
                {
                    // This task goes on: its hand-off's task may be stolen after all.
                    l.deque.push(t);
                }
                owed
            })
        });
        if owed && continuing {
            self.shared.notify_one();
        }
    }

    fn busy_threads(&self) -> usize {
        self.shared.busy.load(Relaxed)
    }

    fn ready_len(&self) -> usize {
        let stealers = self
            .shared
            .stealers
            .read()
            .unwrap_or_else(|e| e.into_inner());
        self.shared.injector.len()
            + stealers
                .iter()
                .flatten()
                .map(|v| v.stealer.len() + v.yielded.len())
                .sum::<usize>()
            + self.shared.niced.len()
    }
}

/// The reactor (a current-thread tokio runtime: timers, sockets) the workers drive.
/// Dropped after the pool's shutdown, it closes what is still registered in it.
pub(crate) struct Io {
    rt: Arc<tokio::runtime::Runtime>,
}

impl Io {
    pub(crate) fn start() -> std::io::Result<Io> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Io { rt: Arc::new(rt) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::Duration;

    use crate::prelude::*;

    /// With no idle worker, nobody sleeps in the reactor: the busy worker must still
    /// poll it, so a timer fires while two stages bounce an event forever on the only
    /// worker.
    #[test]
    fn timers_fire_while_every_worker_is_busy() {
        let bounces = Arc::new(AtomicUsize::new(0));
        let b = bounces.clone();
        let ping = Stage::new("ping", move |ev, ctx: &mut Ctx| {
            b.fetch_add(1, SeqCst);
            ctx.send(1, ev)?;
            Ok(())
        })
        .autostart(());
        let pong = Stage::new("pong", |ev, ctx: &mut Ctx| {
            ctx.send(1, ev)?;
            Ok(())
        });
        let timer = Stage::asynchronous("timer", |_: Event, ctx: Ctx| async move {
            ctx.sleep(Duration::from_millis(20)).await;
            ctx.quit("rang");
            Ok(())
        })
        .autostart(());
        let mut g = Graph::new("g");
        g.connect(&ping, 1, &pong);
        g.connect(&pong, 1, &ping);
        g.add(&timer);
        let r = g
            .run(Run::default().threads(1).timeout(Duration::from_secs(20)))
            .expect("run");
        assert_eq!(r.reason, EndReason::Quit, "the timer never fired");
        assert!(
            bounces.load(SeqCst) > 100,
            "the worker was not kept busy ({} bounces)",
            bounces.load(SeqCst)
        );
    }

    /// On one worker, a stage that keeps calling `nice()` must let another ready
    /// stage run (it used to go back on top of its worker's deque and starve it).
    #[test]
    fn nice_lets_other_ready_stages_run() {
        const MAX_NICE: usize = 10_000;
        let ran = Arc::new(AtomicBool::new(false));
        let nices = Arc::new(AtomicUsize::new(0));
        let src = Stage::new("src", |_, ctx: &mut Ctx| {
            ctx.send(2, 0)?;
            ctx.send(1, 0)?;
            Ok(())
        })
        .autostart(());
        let (r2, n2) = (ran.clone(), nices.clone());
        let polite = Stage::asynchronous("polite", move |_: Event, ctx: Ctx| {
            let (ran, nices) = (r2.clone(), n2.clone());
            async move {
                while !ran.load(SeqCst) && nices.load(SeqCst) < MAX_NICE {
                    nices.fetch_add(1, SeqCst);
                    ctx.nice().await;
                }
                Ok(())
            }
        });
        let r3 = ran.clone();
        let other = Stage::new("other", move |_, _| {
            r3.store(true, SeqCst);
            Ok(())
        });
        let mut g = Graph::new("g");
        g.connect(&src, 1, &polite);
        g.connect(&src, 2, &other);
        let r = g
            .run(
                Run::default()
                    .threads(1)
                    .until_idle()
                    .timeout(Duration::from_secs(20)),
            )
            .expect("run");
        assert_eq!(r.reason, EndReason::Idle);
        assert!(ran.load(SeqCst), "the other stage never ran");
        assert!(
            nices.load(SeqCst) < MAX_NICE,
            "the other stage waited for {} nice() calls",
            nices.load(SeqCst)
        );
    }
}
