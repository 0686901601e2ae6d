//! A worker's outbox: while a task runs, the events its handler sends to stages of
//! this process (on `local` and `decoupled` connectors) are collected per destination
//! and pushed a batch at a time, one queue lock per batch instead of one per event.
//!
//! Each event is accepted against the destination's capacity when it is sent (the
//! room is read from the queue's lock-free counters, so producers racing for the last
//! slots may overshoot the capacity by up to one batch each: a soft bound, as before).
//! A send that does not fit fails at once with `QueueFull`; an accepted event is never
//! dropped. Events to one destination keep their order.
//!
//! The batches are pushed when one is full ([`OUTBOX`] events), and by the running
//! activation whenever it finished a batch of its own input, right after each handler
//! call that starts a wait and after each poll of a waiting handler, and at the end of
//! its run — always before the activation can go idle, so an accepted event is never
//! invisible to idle detection. Outside a task's run (other threads, transports
//! delivering through a handle) sends go straight to the queue.
//!
//! Events to other processes are not held here but by the transport
//! ([`RemoteSink::send_held`]): each flush also calls [`RemoteSink::flush`] on the
//! remote sinks the task sent to since the last one, and the transport writes the
//! batch on this worker then.
//!
//! # An event's path, in one direction
//!
//! `Ctx::send` ([`super::ctx`]) → [`send`] here (this module owns batching and the
//! accept-or-refuse decision; it only *asks* the stage for its room,
//! [`StageRt::room`](super::process::StageRt::room)) → [`Process::enqueue_batch`] (or
//! `Process::enqueue` outside a task) ([`super::process`]: push and claim) →
//! [`EventQueue`](super::queue::EventQueue) (under its lock) → `Executor::schedule` of
//! the claimed activation. Nothing below this module calls back into it; the task
//! ([`super::task`]) opens and closes the batching around a run ([`enter`], [`flush`]).
//!
//! This module must not touch queues or instances itself.

use std::cell::Cell;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::SendError;
use crate::event::Event;

use super::executor::RemoteSink;
use super::process::Process;

/// Most events held for one destination before they are pushed.
pub(crate) const OUTBOX: usize = 128;

/// Emptied batches kept per thread for reuse.
const SPARE: usize = 16;

struct Entry {
    dest: usize,
    events: Vec<Event>,
    /// Events the destination can still take, as last seen.
    room: usize,
}

struct Outbox {
    /// The process of the running task.
    process: *const Process,
    /// Destinations sent to since the last flush (a flush empties the list).
    entries: Vec<Entry>,
    /// Emptied batches, kept for their allocation.
    spare: Vec<Vec<Event>>,
    /// Remote sinks sent to since the last flush (each once): flushed after the
    /// local batches.
    remotes: Vec<Arc<dyn RemoteSink>>,
}

thread_local! {
    /// The outbox of the task running on this thread, or null. A plain pointer with a
    /// constant initialiser and no destructor: a send reads one thread-local word (no
    /// lazy initialisation, no borrow flag).
    ///
    /// Invariant that makes the `&mut` taken from it unique: it is dereferenced only
    /// by [`send`], [`send_remote`] and [`flush`], and nothing they call while holding
    /// it runs a handler or sends (they push to queues and schedule tasks, which never
    /// runs one inline, or hand events to a transport, which must not either).
    static CURRENT: Cell<*mut Outbox> = const { Cell::new(ptr::null_mut()) };
    /// The thread's outbox between task runs, kept for its allocations.
    static IDLE: Cell<Option<Box<Outbox>>> = const { Cell::new(None) };
}

/// The outbox of the running task of `process` on this thread, if any.
#[inline]
fn current(process: &Arc<Process>) -> *mut Outbox {
    let p = CURRENT.get();
    // SAFETY: a non-null `CURRENT` points to the live outbox installed by `enter` (it
    // is reset before the box is freed), and no `&mut` to it is held here (invariant
    // above).
    if !p.is_null() && unsafe { (*p).process } == Arc::as_ptr(process) {
        p
    } else {
        ptr::null_mut()
    }
}

/// Batching for one task run, from [`enter`] until dropped: then the batches are
/// pushed (and the outbox put away, if this run installed it).
pub(crate) struct Batching<'a> {
    process: Option<&'a Arc<Process>>,
    installed: bool,
}

/// A task of `process` starts running on this thread: its local sends are batched
/// until the returned guard is dropped. A run nested in another of the same process
/// (cohort hand-off) shares its outbox; one nested in a run of another process sends
/// straight to the queues.
pub(crate) fn enter(process: &Arc<Process>) -> Batching<'_> {
    if !CURRENT.get().is_null() {
        let same = !current(process).is_null();
        return Batching {
            process: same.then_some(process),
            installed: false,
        };
    }
    let mut o = IDLE.take().unwrap_or_else(|| {
        Box::new(Outbox {
            process: ptr::null(),
            entries: Vec::new(),
            spare: Vec::new(),
            remotes: Vec::new(),
        })
    });
    o.process = Arc::as_ptr(process);
    CURRENT.set(Box::into_raw(o));
    Batching {
        process: Some(process),
        installed: true,
    }
}

impl Drop for Batching<'_> {
    fn drop(&mut self) {
        let Some(process) = self.process.take() else {
            return;
        };
        flush(process);
        if self.installed {
            let p = CURRENT.replace(ptr::null_mut());
            // SAFETY: `enter` installed this pointer from `Box::into_raw`, and only
            // this guard takes it back.
            let mut o = unsafe { Box::from_raw(p) };
            o.process = ptr::null();
            IDLE.set(Some(o));
        }
    }
}

/// Pushes every held batch to its queue, then flushes the remote sinks sent to.
pub(crate) fn flush(process: &Arc<Process>) {
    let p = current(process);
    if p.is_null() {
        return;
    }
    // SAFETY: see `CURRENT`.
    let o = unsafe { &mut *p };
    for mut e in o.entries.drain(..) {
        if !e.events.is_empty() {
            process.enqueue_batch(e.dest, &mut e.events);
        }
        if o.spare.len() < SPARE {
            o.spare.push(e.events);
        }
    }
    if o.remotes.is_empty() {
        return;
    }
    // Taken out first: no borrow of the outbox is alive while a transport runs.
    let mut remotes = std::mem::take(&mut o.remotes);
    for r in &remotes {
        r.flush();
    }
    remotes.clear();
    let p = current(process);
    // SAFETY: see `CURRENT` (the list goes back for its allocation, unless a new one
    // was started meanwhile).
    if !p.is_null() && unsafe { (*p).remotes.is_empty() } {
        unsafe { (*p).remotes = remotes };
    }
}

/// Sends `ev` to the remote `sink`: held by the transport until the next [`flush`]
/// while a task of `process` runs here (which then flushes the sink too), else sent
/// at once.
#[inline]
pub(crate) fn send_remote(
    process: &Arc<Process>,
    sink: &Arc<dyn RemoteSink>,
    ev: Event,
) -> Result<(), Bounced> {
    let p = current(process);
    if p.is_null() {
        return sink.send(ev).map_err(|r| Box::new((r.error, r.event)));
    }
    // SAFETY: see `CURRENT`.
    let o = unsafe { &mut *p };
    if !o.remotes.iter().any(|r| Arc::ptr_eq(r, sink)) {
        o.remotes.push(sink.clone());
    }
    sink.send_held(ev).map_err(|r| Box::new((r.error, r.event)))
}

/// A send that failed, with the event handed back. Boxed: failures are rare, and a
/// one-word result keeps the hot path's return in a register.
pub(crate) type Bounced = Box<(SendError, Event)>;

/// Sends `ev` to local stage `dest`: into this thread's outbox while a task of
/// `process` runs here, else straight to the stage's queue.
#[inline(always)]
pub(crate) fn send(process: &Arc<Process>, dest: usize, ev: Event) -> Result<(), Bounced> {
    let p = current(process);
    if p.is_null() {
        return process.enqueue(dest, ev).map_err(Box::new);
    }
    // SAFETY: see `CURRENT`.
    hold(unsafe { &mut *p }, process, dest, ev)
}

/// An open batch with room, found by [`open_batch`].
pub(crate) struct OpenBatch(*mut Entry);

impl OpenBatch {
    /// Puts `ev` in the batch, as [`send`] would.
    ///
    /// # Safety
    ///
    /// Nothing may have touched this thread's outbox since [`open_batch`] returned it.
    #[inline(always)]
    pub(crate) unsafe fn accept(self, process: &Arc<Process>, ev: Event) {
        // SAFETY: the entry is still where `open_batch` found it (caller's contract).
        accept(unsafe { &mut *self.0 }, process, ev);
    }
}

/// [`send`]'s common case, inline in a handler: a task of `process` runs here and
/// its batch for `dest` is open with room as last seen. The caller then hands the
/// event straight to [`OpenBatch::accept`] (no move through a result).
#[inline(always)]
pub(crate) fn open_batch(process: &Arc<Process>, dest: usize) -> Option<OpenBatch> {
    let p = current(process);
    if p.is_null() {
        return None;
    }
    // SAFETY: see `CURRENT`.
    let o = unsafe { &mut *p };
    let e = o.entries.iter_mut().find(|e| e.dest == dest)?;
    (e.room > 0 && !e.events.is_empty() && !process.stopping.load(Relaxed)).then_some(OpenBatch(e))
}

/// Accepts `ev` for `dest` into outbox `o` of a running task of `process`.
#[inline(always)]
fn hold(o: &mut Outbox, process: &Arc<Process>, dest: usize, ev: Event) -> Result<(), Bounced> {
    // The common case: a batch for `dest` is open and has room as last seen.
    if let Some(e) = o.entries.iter_mut().find(|e| e.dest == dest)
        && e.room > 0
        && !e.events.is_empty()
        && !process.stopping.load(Relaxed)
    {
        accept(e, process, ev);
        return Ok(());
    }
    hold_slow(o, process, dest, ev)
}

/// [`hold`] when a batch opens, the room must be read again, or the run is ending.
#[cold]
#[inline(never)]
fn hold_slow(
    o: &mut Outbox,
    process: &Arc<Process>,
    dest: usize,
    ev: Event,
) -> Result<(), Bounced> {
    if process.stopping.load(Relaxed) {
        return Err(Box::new((SendError::Stopped, ev)));
    }
    let i = match o.entries.iter().position(|e| e.dest == dest) {
        Some(i) => i,
        None => {
            let events = o.spare.pop().unwrap_or_else(|| Vec::with_capacity(OUTBOX));
            o.entries.push(Entry {
                dest,
                events,
                room: 0,
            });
            o.entries.len() - 1
        }
    };
    let st = &process.stages[dest];
    let e = &mut o.entries[i];
    if e.room == 0 || e.events.is_empty() {
        e.room = st.room(e.events.len());
        if e.room == 0 && !e.events.is_empty() {
            // Full as far as this batch goes: push it, so that a full queue is
            // really full (a sender waiting for room waits on the queue itself).
            process.enqueue_batch(dest, &mut e.events);
            e.room = st.room(0);
        }
        if e.room == 0 {
            return Err(Box::new((st.refuse(), ev)));
        }
    }
    accept(e, process, ev);
    Ok(())
}

/// Puts `ev` in `e`'s batch (which has room for it), pushing the batch when full.
#[inline(always)]
fn accept(e: &mut Entry, process: &Arc<Process>, ev: Event) {
    e.room -= 1;
    e.events.push(ev);
    if e.events.len() >= OUTBOX {
        process.enqueue_batch(e.dest, &mut e.events);
    }
}
