//! A stage's event queue and activation state: a deque of *batches* behind one short
//! lock.
//!
//! Events arrive one at a time (appended to the last batch) or as a producer's whole
//! batch (its outbox, see [`super::outbox`]), which is queued as it is: the buffer
//! changes hands, the events are not moved. A running instance takes a whole batch
//! per lock the same way (a parallel stage's instance only its share, once enough is
//! queued to share: [`Par`]), so a pipeline moves each event once, into the
//! producer's batch, and consumers pay one synchronisation per batch instead of one
//! per event. Emptied buffers go back and forth through a small spare list, so the
//! steady state allocates nothing.
//!
//! The lock also guards the count of active instances, so the decisions "this push
//! needs a new activation" and "the queue is empty, this instance may go idle" are
//! made under one lock: an event is never left in a queue with no instance on its way.
//!
//! Idle instances are parked here too, each with its activation (a [`Task`]), under
//! the same lock: the claim that needs an instance pops one in the same critical
//! section, and an instance that finds the queue empty parks itself in the one that
//! ends its activation ([`EventQueue::take_or_park`]). A token passed around a ring
//! of stages thus costs each stage two locks, and no allocation.
//!
//! Events taken by an instance but whose handling has not started yet are *held*: they
//! still count against the stage's capacity. An instance that starts waiting gives its
//! held events back to the front of the queue, so order is kept and other instances
//! of a parallel stage can take them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use crossbeam_utils::CachePadded;

use super::Task;
use crate::event::Event;

/// Most events in a batch built from single pushes, and the most a parallel stage's
/// instance takes at once. (32 cost pipeline-10 a sixth of its rate: twice the locks,
/// and twice the batches crossing cores, for the same events.)
pub(crate) const TAKE: usize = 64;

/// Emptied batch buffers a queue keeps for reuse.
const SPARE: usize = 4;

/// Largest buffer (in events) kept for reuse.
const SPARE_MAX_SLOTS: usize = 4 * TAKE;

/// Largest buffer (in events) kept as a *big* spare: the buffer of a large batch
/// pushed whole (a remote frame's events, see leda-net), returned to the next producer
/// of such a batch. Without them each frame's buffer was freed by the worker that
/// emptied it and the reader allocated a fresh one, on fresh pages (remote 16-byte
/// events: a tenth of all the samples went to the reader zeroing pages).
const BIG_SPARE_MAX_SLOTS: usize = 8192;

/// Big spares a queue keeps: a batch being handled, one queued behind it and one
/// being filled by the producer circulate.
const BIG_SPARES: usize = 2;

/// Above this many batch slots, an emptied queue gives its memory back.
const SHRINK_ABOVE: usize = 1 << 10;

/// A batch of events, in order.
pub(crate) type Batch = VecDeque<Event>;

/// How many instances of a stage may be active, and when an instance that takes
/// events should leave some to another one.
///
/// A push claims an instance whenever fewer than `max` are active (the one that runs
/// may be inside a long call). An instance that takes events takes the whole next
/// batch, and claims no other instance for what is left, while fewer than `split` are
/// queued:
/// for less, waking a second worker and moving the events' cache lines to it costs
/// more than handling them takes. (Splitting ten echo events of a remote round trip
/// between two instances cost 40 µs of its 100 µs.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Par {
    /// At most this many instances are active (`maxpar`).
    pub(crate) max: usize,
    /// Queued events worth sharing with another instance (`1`: any).
    pub(crate) split: usize,
}

impl Par {
    /// Up to `max` instances, a further one whenever events are queued.
    #[cfg(test)]
    pub(crate) fn eager(max: usize) -> Par {
        Par { max, split: 1 }
    }

    /// `true` if an instance should be claimed beside `active` ones, `running` of
    /// which are not waiting, for `queued` events (an instance that waits may not be
    /// back for a long time: the events get one of their own).
    #[inline]
    fn wants(self, active: usize, running: usize, queued: usize) -> bool {
        active < self.max && (running == 0 || queued >= self.split)
    }
}

pub(crate) struct State {
    batches: VecDeque<Batch>,
    /// Events in `batches`.
    len: usize,
    /// Emptied buffers, kept for their allocation.
    spare: Vec<Batch>,
    /// Emptied buffers of large batches ([`BIG_SPARE_MAX_SLOTS`], [`BIG_SPARES`]).
    big: Vec<Batch>,
    /// Events taken by instances whose handling has not started.
    held: usize,
    /// Active instances (Ready, Running or Waiting).
    active: usize,
    /// Idle instances, parked with their activations.
    idle: Vec<Task>,
}

impl State {
    fn buffer(&mut self) -> Batch {
        self.spare
            .pop()
            .unwrap_or_else(|| Batch::with_capacity(TAKE))
    }

    fn recycle(&mut self, b: Batch) {
        let cap = b.capacity();
        if cap > SPARE_MAX_SLOTS {
            if cap <= BIG_SPARE_MAX_SLOTS && self.big.len() < BIG_SPARES {
                self.big.push(b);
            }
        } else if cap > 0 && self.spare.len() < SPARE {
            self.spare.push(b);
        }
    }

    /// Appends one event to the last batch, or to a new one if that is full.
    fn push_one(&mut self, ev: Event) {
        match self.batches.back_mut() {
            Some(b) if b.len() < TAKE => b.push_back(ev),
            _ => {
                let mut b = self.buffer();
                b.push_back(ev);
                self.batches.push_back(b);
            }
        }
        self.len += 1;
    }
}

pub(crate) struct EventQueue {
    state: CachePadded<Mutex<State>>,
    /// Copies of the queued count and `active`, written under the lock, for lock-free
    /// peeks (statistics, "is more work coming" checks).
    queued: CachePadded<AtomicUsize>,
    /// Copy of `held` (written under the lock).
    held: AtomicUsize,
    active: AtomicUsize,
    /// Active instances waiting (for a future their handler returned): counted up
    /// under the lock, when the instance gives its held events back, so that a push
    /// after it sees that no instance is on its way; counted down when woken.
    waiting: AtomicUsize,
}

/// What a running instance got from [`EventQueue::take`].
pub(crate) struct Taken {
    /// The next event to handle (more may have gone to the instance's buffer).
    pub(crate) event: Option<Event>,
    /// Work remains and another activation was claimed: schedule it.
    pub(crate) another: Claim,
    /// Room was made in the queue (wake producers waiting for space): held events
    /// were settled, or an event left the queue (the one returned; the rest of the
    /// batch stays held and still counts).
    pub(crate) freed: bool,
}

/// The outcome of a claim on an activation.
///
/// A single event pushed on an empty queue whose push claimed an activation is handed
/// to that activation directly (`Some`): it skips the queue's batches and the
/// activation's first take. Like an event a take pops for its instance, the queue no
/// longer counts it (counted until its handler returned, it made a capacity-1 stage
/// that sends to itself refuse its own send).
#[must_use = "a claimed activation must be scheduled"]
pub(crate) enum Claim {
    /// `maxpar` instances are active already (or no work was queued).
    No,
    /// Claimed, with an idle instance's parked activation to reuse.
    Idle(Task, Option<Event>),
    /// Claimed; no instance is idle: a new activation builds one.
    New(Option<Event>),
}

impl Claim {
    /// `true` unless nothing was claimed.
    pub(crate) fn is_claimed(&self) -> bool {
        !matches!(self, Claim::No)
    }
}

/// What [`EventQueue::take_or_park`] did with the task.
pub(crate) enum Parked {
    /// The queue was empty: the task went to the idle pool, its claim given back.
    Idle,
    /// The queue was empty: the claim was given back, and the task (no instance, or
    /// the run is ending) is to be dropped, outside the lock.
    Drop(Task),
    /// Events had arrived: the task keeps its claim and goes on with them.
    Took(Task, Taken),
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        EventQueue {
            state: CachePadded::new(Mutex::new(State {
                batches: VecDeque::new(),
                len: 0,
                spare: Vec::new(),
                big: Vec::new(),
                held: 0,
                active: 0,
                idle: Vec::new(),
            })),
            queued: CachePadded::new(AtomicUsize::new(0)),
            held: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler never runs under this lock, so it is never poisoned by one; recover
        // anyway rather than spread a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    fn claim_locked(&self, s: &mut State, maxpar: usize) -> Claim {
        if s.active < maxpar {
            s.active += 1;
            self.active.store(s.active, Release);
            match s.idle.pop() {
                Some(t) => Claim::Idle(t, None),
                None => Claim::New(None),
            }
        } else {
            Claim::No
        }
    }

    /// Pushes `ev` unless the queue holds `cap` events already (`None`: no bound).
    /// On success, says whether an activation was claimed for it (fewer than
    /// `maxpar` were active): the caller schedules it.
    #[inline]
    pub(crate) fn push(
        &self,
        ev: Event,
        cap: Option<usize>,
        maxpar: usize,
    ) -> Result<Claim, Event> {
        let mut s = self.lock();
        if let Some(cap) = cap
            && s.len + s.held >= cap
        {
            return Err(ev);
        }
        if s.len == 0 && s.active < maxpar {
            return Ok(self.claim_direct(&mut s, maxpar, ev));
        }
        s.push_one(ev);
        self.queued.store(s.len, Release);
        Ok(self.claim_locked(&mut s, maxpar))
    }

    /// Active instances not waiting (under the lock).
    #[inline]
    fn running(&self, s: &State) -> usize {
        s.active - self.waiting.load(Acquire).min(s.active)
    }

    /// Claims an activation if `par` wants one more for the queued events.
    #[inline]
    fn claim_wanted(&self, s: &mut State, par: Par) -> Claim {
        if par.wants(s.active, self.running(s), s.len) {
            self.claim_locked(s, par.max)
        } else {
            Claim::No
        }
    }

    /// Claims an activation for `ev`, which goes to it directly (the queue is empty
    /// and fewer than `maxpar` instances are active).
    #[inline]
    fn claim_direct(&self, s: &mut State, maxpar: usize, ev: Event) -> Claim {
        match self.claim_locked(s, maxpar) {
            Claim::Idle(t, None) => Claim::Idle(t, Some(ev)),
            Claim::New(None) => Claim::New(Some(ev)),
            _ => unreachable!("fewer than maxpar are active: the claim is made"),
        }
    }

    /// Claims an activation if fewer than `maxpar` are active (and, if `need_work`,
    /// only when events are queued).
    pub(crate) fn claim(&self, maxpar: usize, need_work: bool) -> Claim {
        let mut s = self.lock();
        if need_work && s.len == 0 {
            return Claim::No;
        }
        self.claim_locked(&mut s, maxpar)
    }

    /// For a running instance: first marks `started` held events as no longer held,
    /// then takes the next batch into `buf` (a parallel stage's instance takes only
    /// its share, leaving the rest to the other instances) and returns the first event
    /// of `buf`. (`buf` is normally empty: its buffer and the batch's then trade
    /// places.) An empty queue leaves the instance's claim in place.
    pub(crate) fn take(&self, buf: &mut Batch, started: usize, par: Par, serial: bool) -> Taken {
        let mut s = self.lock();
        let settled = self.settle_locked(&mut s, started);
        self.take_locked(&mut s, buf, settled, par, serial)
    }

    /// [`EventQueue::take`] for `task`'s instance, which parks if the queue is empty:
    /// its claim is given back and the task goes to the idle pool (unless it has no
    /// instance or `stopping` is set: it is handed back, to be dropped). One lock for
    /// the last look and the release, so the next activation finds the instance.
    /// Also says whether held events were settled (room was made).
    pub(crate) fn take_or_park(
        &self,
        mut task: Task,
        started: usize,
        par: Par,
        serial: bool,
        stopping: &AtomicBool,
    ) -> (Parked, bool) {
        let mut s = self.lock();
        let settled = self.settle_locked(&mut s, started);
        if s.len > 0 {
            let t = self.take_locked(&mut s, task.buf(), settled, par, serial);
            let freed = t.freed;
            return (Parked::Took(task, t), freed);
        }
        s.active -= 1;
        self.active.store(s.active, Release);
        if s.batches.capacity() > SHRINK_ABOVE {
            s.batches.shrink_to(TAKE);
        }
        // `stopping` is read under the lock: `take_idle` takes it after `stopping` is
        // set, so a task parked here is either taken by it or sees `stopping`.
        let parked = if task.has_instance() && !stopping.load(SeqCst) {
            // The idle instance keeps no buffer: this queue's spare list does.
            let buf = std::mem::take(task.buf());
            s.recycle(buf);
            s.idle.push(task);
            Parked::Idle
        } else {
            Parked::Drop(task)
        };
        (parked, settled)
    }

    /// Settles `started` held events; `true` if any were.
    #[inline]
    fn settle_locked(&self, s: &mut State, started: usize) -> bool {
        s.held -= started.min(s.held);
        self.held.store(s.held, Release);
        started > 0
    }

    /// The rest of [`EventQueue::take`], under the lock (`settled`: held events were
    /// settled, room was made).
    #[inline]
    fn take_locked(
        &self,
        s: &mut State,
        buf: &mut Batch,
        settled: bool,
        par: Par,
        serial: bool,
    ) -> Taken {
        if s.len == 0 {
            return Taken {
                event: None,
                another: Claim::No,
                freed: settled,
            };
        }
        // A serial stage takes the next batch; so does a parallel one with too few
        // events queued to share them, else it leaves a share for the other instances.
        let share = if serial || s.len < par.split {
            usize::MAX
        } else {
            (s.len / par.max.max(1)).clamp(1, TAKE)
        };
        let front = s.batches.front_mut().expect("len > 0: a batch is queued");
        let before = buf.len();
        if front.len() <= share {
            let mut b = s.batches.pop_front().expect("a batch is queued");
            if buf.is_empty() {
                std::mem::swap(buf, &mut b);
            } else {
                buf.append(&mut b);
            }
            s.recycle(b);
        } else {
            buf.extend(front.drain(..share));
        }
        let n = buf.len() - before;
        let event = buf.pop_front();
        s.len -= n;
        s.held += n - 1;
        self.held.store(s.held, Release);
        self.queued.store(s.len, Release);
        let another = if s.len > 0 {
            self.claim_wanted(s, par)
        } else {
            Claim::No
        };
        Taken {
            // The popped event no longer counts against the capacity: a slot was
            // made even if nothing held was settled.
            freed: settled || event.is_some(),
            event,
            another,
        }
    }

    /// Marks `started` held events as no longer held.
    pub(crate) fn settle(&self, started: usize) {
        if started > 0 {
            let mut s = self.lock();
            s.held -= started.min(s.held);
            self.held.store(s.held, Release);
        }
    }

    /// An instance starts waiting: gives the events of `buf` back to the front of the
    /// queue (order kept), after marking `started` held events as no longer held, and
    /// claims an activation for the queued events if no other instance is running
    /// (see [`Par`]; handling them may be what this one waits for).
    pub(crate) fn start_wait(&self, buf: &mut Batch, started: usize, par: Par) -> Claim {
        let mut s = self.lock();
        s.held -= (started + buf.len()).min(s.held);
        self.held.store(s.held, Release);
        if !buf.is_empty() {
            s.len += buf.len();
            let empty = s.buffer();
            let b = std::mem::replace(buf, empty);
            s.batches.push_front(b);
        }
        self.queued.store(s.len, Release);
        self.waiting.fetch_add(1, Release);
        if s.len > 0 {
            self.claim_wanted(&mut s, par)
        } else {
            Claim::No
        }
    }

    /// A waiting instance was woken (it runs again).
    pub(crate) fn end_wait(&self) {
        self.waiting.fetch_sub(1, Release);
    }

    /// Active instances waiting (a lock-free peek).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Acquire)
    }

    /// Queues all of `evs` (a producer's batch; the producer checked the capacity
    /// when it accepted them), leaving `evs` empty. Says whether an activation was
    /// claimed.
    pub(crate) fn push_batch(&self, evs: &mut Vec<Event>, maxpar: usize) -> Claim {
        let mut s = self.lock();
        let n = evs.len();
        if n == 1
            && s.len == 0
            && s.active < maxpar
            && let Some(ev) = evs.pop()
        {
            return self.claim_direct(&mut s, maxpar, ev);
        }
        match s.batches.back_mut() {
            // A few events are copied: into the last batch if it has room, else into
            // one of this queue's own buffers (it stays warm here, and the producer
            // keeps its own).
            _ if n == 0 => {}
            Some(b) if n < TAKE / 4 && b.len() + n <= TAKE => b.extend(evs.drain(..)),
            _ if n < TAKE / 4 => {
                let mut b = s.buffer();
                b.extend(evs.drain(..));
                s.batches.push_back(b);
            }
            _ => {
                // The buffer changes hands (a vector becomes a deque in place, and an
                // emptied deque a vector): no event moves. A producer of large batches
                // gets a big spare, the buffer of an earlier one.
                let spare = match s.big.pop() {
                    Some(b) if n > SPARE_MAX_SLOTS => b,
                    big => {
                        s.big.extend(big);
                        s.buffer()
                    }
                };
                let empty = Vec::from(spare);
                s.batches
                    .push_back(Batch::from(std::mem::replace(evs, empty)));
            }
        }
        s.len += n;
        self.queued.store(s.len, Release);
        self.claim_locked(&mut s, maxpar)
    }

    /// Events queued or held, from the lock-free copies (may be slightly stale).
    #[inline]
    pub(crate) fn load(&self) -> usize {
        self.queued.load(Acquire) + self.held.load(Acquire)
    }

    /// Pushes an event ignoring the capacity and claiming nothing.
    pub(crate) fn push_unbounded(&self, ev: Event) {
        let mut s = self.lock();
        s.push_one(ev);
        self.queued.store(s.len, Release);
    }

    /// Idle instances.
    pub(crate) fn idle_len(&self) -> usize {
        self.lock().idle.len()
    }

    /// Takes the idle instances' tasks out (to drop them once the run has stopped).
    pub(crate) fn take_idle(&self) -> Vec<Task> {
        std::mem::take(&mut self.lock().idle)
    }

    /// Events queued or held (what counts against the capacity).
    pub(crate) fn len(&self) -> usize {
        let s = self.lock();
        s.len + s.held
    }

    /// `true` if events are queued (a lock-free peek).
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        self.queued.load(Acquire) > 0
    }

    /// Events in the queue (a lock-free peek).
    #[inline]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Acquire)
    }

    /// Active instances (a lock-free peek).
    #[inline]
    pub(crate) fn active(&self) -> usize {
        self.active.load(Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Producers push batches of all sizes (small, medium, big) from
    /// several threads while one consumer takes; every event arrives once, in order per
    /// producer, and the big spares stay bounded.
    #[test]
    fn concurrent_batches_of_all_sizes_keep_order() {
        use std::sync::Arc;
        const P: i64 = 4;
        const PER: i64 = 300_000;
        let q = Arc::new(EventQueue::new());
        let mut hs = Vec::new();
        for p in 0..P {
            let q = q.clone();
            hs.push(std::thread::spawn(move || {
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (p as u64 + 1);
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut seq = 0i64;
                let mut evs: Vec<Event> = Vec::new();
                while seq < PER {
                    let n = match rnd() % 4 {
                        0 => 2 + rnd() % 14,
                        1 => 16 + rnd() % 240,
                        2 => 257 + rnd() % 3000,
                        _ => 5000 + rnd() % 4000,
                    } as i64;
                    let n = n.min(PER - seq).max(1);
                    if n == 1 {
                        break;
                    }
                    assert!(evs.is_empty(), "the buffer handed back held events");
                    evs.extend((seq..seq + n).map(|i| Event::from((p, i))));
                    seq += n;
                    let _ = q.push_batch(&mut evs, usize::MAX);
                    {
                        let s = q.lock();
                        assert!(s.big.len() <= BIG_SPARES);
                        assert!(s.big.iter().all(|b| b.is_empty()));
                    }
                    if rnd() % 8 == 0 {
                        std::thread::yield_now();
                    }
                }
                seq
            }));
        }
        let mut next = vec![0i64; P as usize];
        let mut buf = VecDeque::new();
        let mut started = 0;
        let mut total = 0i64;
        let mut sent: Option<i64> = None;
        let seen = |ev: Event, next: &mut Vec<i64>| {
            let p: i64 = ev.get(0).unwrap();
            let i: i64 = ev.get(1).unwrap();
            assert_eq!(
                i, next[p as usize],
                "producer {p}: out of order / lost / duplicated"
            );
            next[p as usize] += 1;
        };
        loop {
            let t = q.take(&mut buf, started, Par::eager(usize::MAX), true);
            started = 0;
            match t.event {
                Some(ev) => {
                    seen(ev, &mut next);
                    total += 1;
                    while let Some(ev) = buf.pop_front() {
                        seen(ev, &mut next);
                        total += 1;
                        started += 1;
                    }
                }
                None => {
                    if hs.iter().all(|h| h.is_finished()) {
                        if sent.is_none() {
                            sent = Some(0);
                            continue; // one more look after all finished
                        }
                        break;
                    }
                    std::thread::yield_now();
                }
            }
        }
        let want: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, want);
    }

    fn take_all(q: &EventQueue, out: &mut Vec<i64>, maxpar: usize, serial: bool) {
        let mut buf = VecDeque::new();
        let mut started = 0;
        loop {
            let t = q.take(&mut buf, started, Par::eager(maxpar), serial);
            let Some(ev) = t.event else { break };
            out.push(ev.get::<i64>(0).unwrap());
            started = 0;
            while let Some(ev) = buf.pop_front() {
                out.push(ev.get::<i64>(0).unwrap());
                started += 1;
            }
        }
    }

    #[test]
    fn batches_keep_order_and_capacity_counts_held_events() {
        let q = EventQueue::new();
        // An instance is active: pushes go to the queue.
        assert!(q.claim(1, false).is_claimed());
        for i in 0..100i64 {
            assert!(q.push(Event::from(i), Some(100), 1).is_ok());
        }
        let full = q.push(Event::from(100i64), Some(100), 1);
        assert!(full.is_err(), "the 101st event must be refused");

        // Take one batch: its events are held and still count.
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert_eq!(t.event.unwrap().get::<i64>(0).unwrap(), 0);
        assert_eq!(buf.len(), TAKE - 1);
        assert_eq!(q.len(), 99, "held events count against the capacity");
        assert!(q.push(Event::from(100i64), Some(100), 1).is_ok());
        assert!(q.push(Event::from(101i64), Some(100), 1).is_err());

        // Handle two, give the rest back: they return to the front, in order.
        buf.pop_front();
        buf.pop_front();
        assert!(
            !q.start_wait(&mut buf, 2, Par::eager(1)).is_claimed(),
            "maxpar 1"
        );
        assert_eq!(q.len(), 100 - 3 + 1);
        let mut out = vec![0, 1, 2];
        take_all(&q, &mut out, 1, true);
        assert_eq!(out, (0..=100).collect::<Vec<_>>());
        assert_eq!(q.len(), 0);
    }

    /// Pushes claim instances up to maxpar (the one that runs may be in a long call);
    /// a take below the split takes everything and claims nothing more; an instance
    /// that starts waiting claims one for the queued events unless another runs.
    #[test]
    fn takes_share_only_above_the_split_and_a_waiting_instance_claims_another() {
        let par = Par { max: 2, split: 100 };
        // Pushes: the first gets the event with its claim, the second claims the
        // second instance, the rest queue.
        let q = EventQueue::new();
        assert!(matches!(
            q.push(Event::from(0i64), None, par.max),
            Ok(Claim::New(Some(_)))
        ));
        assert!(
            q.push(Event::from(1i64), None, par.max)
                .unwrap()
                .is_claimed()
        );
        assert!(
            !q.push(Event::from(2i64), None, par.max)
                .unwrap()
                .is_claimed()
        );
        assert_eq!(q.active(), 2);
        // Below the split, a parallel instance takes the whole batch and claims no
        // other; above it, it leaves a share and claims one.
        let q = EventQueue::new();
        assert!(q.claim(2, false).is_claimed());
        let mut evs: Vec<Event> = (0..10i64).map(Event::from).collect();
        assert!(
            q.push_batch(&mut evs, par.max).is_claimed(),
            "the second instance"
        );
        let q = EventQueue::new();
        assert!(q.claim(1, false).is_claimed());
        let mut evs: Vec<Event> = (0..10i64).map(Event::from).collect();
        assert!(!q.push_batch(&mut evs, 1).is_claimed());
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, par, false);
        assert!(!t.another.is_claimed());
        assert_eq!(buf.len(), 9, "all ten taken (one returned)");
        // The instance waits: its held events go back, and one is claimed for them.
        assert!(q.start_wait(&mut buf, 0, par).is_claimed());
        assert_eq!((q.active(), q.waiting()), (2, 1));
        let q = EventQueue::new();
        assert!(q.claim(1, false).is_claimed());
        let mut evs: Vec<Event> = (0..200i64).map(Event::from).collect();
        assert!(!q.push_batch(&mut evs, 1).is_claimed());
        let t = q.take(&mut VecDeque::new(), 0, par, false);
        assert!(t.another.is_claimed(), "200 queued: shared");
        // With nothing queued, a wait claims nothing; once woken, the instance runs.
        let q = EventQueue::new();
        assert!(q.claim(2, false).is_claimed());
        assert!(!q.start_wait(&mut VecDeque::new(), 0, par).is_claimed());
        assert_eq!(q.waiting(), 1);
        q.end_wait();
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_large_batch_s_buffer_returns_to_the_next_producer_of_one() {
        let q = EventQueue::new();
        assert!(q.claim(1, false).is_claimed());
        let batch = |from: i64| (from..from + 2000).map(Event::from).collect::<Vec<_>>();
        let mut evs = batch(0);
        let first = evs.as_ptr();
        assert!(!q.push_batch(&mut evs, 1).is_claimed());
        assert!(
            evs.is_empty() && evs.capacity() < 2000,
            "the buffer changed hands"
        );
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert!(t.event.is_some() && buf.len() == 1999);
        buf.clear();
        // The next batch's take swaps it in, and the emptied first buffer is kept...
        let mut evs = batch(2000);
        assert!(!q.push_batch(&mut evs, 1).is_claimed());
        let t = q.take(&mut buf, 1999, Par::eager(1), true);
        assert!(t.event.is_some() && buf.len() == 1999);
        // ... for the next producer of a large batch: no allocation, the same memory.
        let mut evs = batch(4000);
        assert!(!q.push_batch(&mut evs, 1).is_claimed());
        assert!(evs.is_empty() && evs.capacity() >= 2000);
        assert_eq!(evs.as_ptr(), first);
        // A small batch's producer does not take it.
        buf.clear();
        let t = q.take(&mut buf, 1999, Par::eager(1), true);
        assert!(t.event.is_some());
        let mut small = batch(6000);
        small.truncate(100);
        assert!(!q.push_batch(&mut small, 1).is_claimed());
        assert!(small.capacity() <= SPARE_MAX_SLOTS);
    }

    #[test]
    fn a_take_that_pops_an_event_reports_room_made() {
        // Capacity 1, full: the take pops the only event with nothing to settle, and
        // must still report the freed slot (producers parked on the full queue wait
        // for exactly that).
        let q = EventQueue::new();
        for _ in 0..2 {
            assert!(q.claim(2, false).is_claimed());
        }
        assert!(q.push(Event::from(1i64), Some(1), 2).is_ok());
        assert!(q.push(Event::from(2i64), Some(1), 2).is_err());
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(2), false);
        assert!(t.event.is_some() && buf.is_empty());
        assert!(t.freed, "popping the only event made room");
        assert_eq!(q.len(), 0);
        // A batch: the popped event frees a slot, the rest stay held until settled.
        for i in 0..4i64 {
            assert!(q.push(Event::from(i), Some(4), 1).is_ok());
        }
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert!(t.freed && buf.len() == 3 && q.len() == 3);
        buf.clear();
        let t = q.take(&mut buf, 3, Par::eager(1), true);
        assert!(
            t.event.is_none() && t.freed,
            "settling held events made room"
        );
        // Nothing popped, nothing settled: no room was made.
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert!(t.event.is_none() && !t.freed);
    }

    #[test]
    fn batches_change_hands_whole_and_singles_fill_the_last_batch() {
        let q = EventQueue::new();
        // A producer's batch larger than TAKE is queued as it is; singles after it
        // start a new batch; a small batch joins the last one.
        let mut big: Vec<Event> = (0..100i64).map(Event::from).collect();
        assert!(
            q.push_batch(&mut big, 1).is_claimed(),
            "the first push claims an activation"
        );
        assert!(big.is_empty());
        for i in 100..105i64 {
            assert!(!q.push(Event::from(i), None, 1).unwrap().is_claimed());
        }
        let mut small: Vec<Event> = (105..108i64).map(Event::from).collect();
        assert!(!q.push_batch(&mut small, 1).is_claimed());
        assert_eq!(q.len(), 108);
        // A serial instance takes the whole producer batch at once (held: 99).
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert_eq!(t.event.unwrap().get::<i64>(0).unwrap(), 0);
        assert_eq!(buf.len(), 99);
        assert_eq!(q.len(), 107, "held events still count");
        // Giving back part of it puts it at the front, in order.
        let handled: Vec<i64> = (0..9)
            .map(|_| buf.pop_front().unwrap().get::<i64>(0).unwrap())
            .collect();
        assert_eq!(handled, (1..10).collect::<Vec<_>>());
        assert!(
            !q.start_wait(&mut buf, 9, Par::eager(1)).is_claimed(),
            "maxpar 1"
        );
        assert!(buf.is_empty());
        assert_eq!(q.len(), 98);
        let mut out = Vec::new();
        take_all(&q, &mut out, 1, true);
        assert_eq!(out, (10..108).collect::<Vec<_>>());
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn parallel_takes_leave_a_share_and_claims_respect_maxpar() {
        let q = EventQueue::new();
        let mut direct = Vec::new();
        for i in 0..40i64 {
            match q.push(Event::from(i), None, 4).unwrap() {
                Claim::New(Some(ev)) => direct.push(ev.get::<i64>(0).unwrap()),
                Claim::No => {}
                _ => panic!("an empty queue with no idle instance: a new one, with the event"),
            }
        }
        // Each of the first four claimed an instance and went to it directly.
        assert_eq!(direct, [0, 1, 2, 3]);
        assert_eq!(q.active(), 4);
        assert_eq!((q.queued(), q.len()), (36, 36));
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(4), false);
        assert_eq!(t.event.unwrap().get::<i64>(0).unwrap(), 4);
        assert_eq!(
            buf.len() + 1,
            9,
            "a quarter of the queue for one of 4 instances"
        );
        assert_eq!(q.len(), 36 - 1, "one popped, the rest of the share held");
        assert!(!t.another.is_claimed(), "maxpar reached: no further claim");
        // Drained: an empty take keeps the claim (only `take_or_park` gives it back).
        buf.clear();
        let mut out = Vec::new();
        take_all(&q, &mut out, 4, false);
        let t = q.take(&mut buf, 0, Par::eager(4), false);
        assert!(t.event.is_none() && !t.another.is_claimed());
        assert_eq!(q.active(), 4);
    }

    #[test]
    fn a_lone_event_goes_to_its_activation_and_later_ones_queue_behind_it() {
        let q = EventQueue::new();
        let Ok(Claim::New(Some(ev))) = q.push(Event::from(7i64), Some(1), 1) else {
            panic!("an empty queue, no active instance: the event goes with the claim");
        };
        assert_eq!(ev.get::<i64>(0).unwrap(), 7);
        // Like an event a take pops, it no longer counts: the queue has room for one.
        assert_eq!((q.queued(), q.len()), (0, 0));
        // Behind the active instance, events queue (order is kept) up to the capacity.
        assert!(matches!(
            q.push(Event::from(8i64), Some(2), 1),
            Ok(Claim::No)
        ));
        let mut batch = vec![Event::from(9i64)];
        assert!(matches!(q.push_batch(&mut batch, 1), Claim::No));
        assert_eq!(q.queued(), 2);
        assert!(q.push(Event::from(10i64), Some(2), 1).is_err(), "full");
        let mut buf = VecDeque::new();
        let t = q.take(&mut buf, 0, Par::eager(1), true);
        assert_eq!(t.event.unwrap().get::<i64>(0).unwrap(), 8);
    }
}
