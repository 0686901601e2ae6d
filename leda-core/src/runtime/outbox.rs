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

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::SendError;
use crate::event::Event;

use super::process::Process;

/// Most events held for one destination before they are pushed.
pub(crate) const OUTBOX: usize = 32;

/// Emptied batches kept per thread for reuse.
const SPARE: usize = 16;

struct Entry {
    dest: usize,
    events: Vec<Event>,
    /// Events the destination can still take, as last seen.
    room: usize,
}

struct Outbox {
    /// Nesting of task runs on this thread (cohort hand-offs nest).
    depth: u32,
    /// The process of the running task.
    process: *const Process,
    /// Destinations sent to since the last flush (a flush empties the list).
    entries: Vec<Entry>,
    /// Emptied batches, kept for their allocation.
    spare: Vec<Vec<Event>>,
}

thread_local! {
    static OUTBOX_TLS: RefCell<Outbox> = const {
        RefCell::new(Outbox {
            depth: 0,
            process: std::ptr::null(),
            entries: Vec::new(),
            spare: Vec::new(),
        })
    };
}

/// A task of `process` starts running on this thread: batching is on until
/// [`leave`]. Returns `false` (and changes nothing) if a task of another process runs
/// here already.
pub(crate) fn enter(process: &Arc<Process>) -> bool {
    OUTBOX_TLS.with(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return false;
        };
        let ptr = Arc::as_ptr(process);
        if o.depth > 0 && o.process != ptr {
            return false;
        }
        o.depth += 1;
        o.process = ptr;
        true
    })
}

/// The task that [`enter`]ed stops running: its batches are pushed.
pub(crate) fn leave(process: &Arc<Process>) {
    flush(process);
    OUTBOX_TLS.with(|o| {
        if let Ok(mut o) = o.try_borrow_mut() {
            o.depth = o.depth.saturating_sub(1);
            if o.depth == 0 {
                o.process = std::ptr::null();
            }
        }
    });
}

/// Pushes every held batch to its queue.
pub(crate) fn flush(process: &Arc<Process>) {
    OUTBOX_TLS.with(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return; // a flush is under way further up this thread
        };
        if o.process != Arc::as_ptr(process) {
            return;
        }
        let o = &mut *o;
        for mut e in o.entries.drain(..) {
            if !e.events.is_empty() {
                process.enqueue_batch(e.dest, &mut e.events);
            }
            if o.spare.len() < SPARE {
                o.spare.push(e.events);
            }
        }
    });
}

/// A send that failed, with the event handed back. Boxed: failures are rare, and a
/// one-word result keeps the hot path's return in a register.
pub(crate) type Bounced = Box<(SendError, Event)>;

/// Sends `ev` to local stage `dest`: into this thread's outbox while a task of
/// `process` runs here, else straight to the stage's queue.
#[inline]
pub(crate) fn send(process: &Arc<Process>, dest: usize, ev: Event) -> Result<(), Bounced> {
    // The event moves into the outbox only if a task of `process` runs here.
    let mut slot = Some(ev);
    let held = OUTBOX_TLS.with(|o| {
        let mut o = o.try_borrow_mut().ok()?;
        if o.depth == 0 || o.process != Arc::as_ptr(process) {
            return None;
        }
        slot.take().map(|ev| hold(&mut o, process, dest, ev))
    });
    match (held, slot) {
        (Some(result), _) => result,
        (None, Some(ev)) => process.enqueue(dest, ev).map_err(Box::new),
        (None, None) => unreachable!("the event is taken only when it is held"),
    }
}

/// Accepts `ev` for `dest` into outbox `o` of a running task of `process`.
#[inline]
fn hold(o: &mut Outbox, process: &Arc<Process>, dest: usize, ev: Event) -> Result<(), Bounced> {
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
        let cap = st.capacity.load(Relaxed);
        e.room = cap.saturating_sub(st.load() + e.events.len());
        if e.room == 0 && !e.events.is_empty() {
            // Full as far as this batch goes: push it, so that a full queue is
            // really full (a sender waiting for room waits on the queue itself).
            process.enqueue_batch(dest, &mut e.events);
            e.room = cap.saturating_sub(st.load());
        }
        if e.room == 0 {
            st.counters.rejected.fetch_add(1, Relaxed);
            let error = SendError::QueueFull {
                stage: st.name.to_string(),
            };
            return Err(Box::new((error, ev)));
        }
    }
    e.room -= 1;
    e.events.push(ev);
    if e.events.len() >= OUTBOX {
        process.enqueue_batch(dest, &mut e.events);
    }
    Ok(())
}
