//! Turns on a Lua state: an async lock whose waiters go in the order of a key each
//! brings (earliest first), not in the order they came. The `cgi` stage keys a young
//! page's turns by when its request came, so pages of about the same cost end in the
//! order they came, and a long page's by a time ahead, so cheap pages go first (see
//! `FRESH`).
//!
//! A turn handed to a waiter is only its own once that waiter runs and takes it: a
//! waiter that has not been polled yet (a paused page waiting behind the sockets for
//! its worker) would hold the state idle meanwhile, so a page with an earlier key that
//! asks first takes the turn instead, and the other keeps its place.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// A waiter's place: its key, and a sequence number that tells equal keys apart.
type Place = (Instant, u64);

/// The turns on one resource.
#[derive(Default)]
pub(super) struct Turns {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// A holder has the turn.
    taken: bool,
    /// The waiter the turn was handed to, which has not taken it yet.
    granted: Option<Place>,
    waiting: BTreeMap<Place, Waker>,
    seq: u64,
}

impl Queue {
    fn place(&mut self, key: Instant) -> Place {
        self.seq += 1;
        (key, self.seq)
    }

    /// Takes the turn for `place` if it is free, or handed to a waiter with a later
    /// place that has not taken it (that one keeps its place among the waiters).
    fn claim(&mut self, place: Place) -> bool {
        if self.taken || self.granted.is_some_and(|g| g <= place) {
            return false;
        }
        self.granted = None;
        self.taken = true;
        true
    }

    /// Gives the turn up: it goes to the first waiter, or is free.
    fn pass(&mut self) {
        self.taken = false;
        self.granted = self.waiting.first_key_value().map(|(&place, waker)| {
            waker.wake_by_ref();
            place
        });
    }
}

/// A turn: the resource is this holder's until it is dropped (or given up for a
/// place among the waiters, [`Turn::again`]).
pub(super) struct Turn(Option<Arc<Turns>>);

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(turns) = self.0.take() {
            turns.lock().pass();
        }
    }
}

impl Turn {
    /// Asks for another turn at `key` and gives this one up, in one step: this one
    /// goes to the waiter with the earliest key, which may be the one asking (its
    /// future then takes it when polled, unless an earlier key asked meanwhile).
    /// Asked for after the turn was given up, a holder whose key is the earliest would
    /// be passed by every page that found the resource free in between.
    pub(super) fn again(mut self, key: Instant) -> Take {
        let turns = self.0.take().expect("a turn is held until dropped");
        let mut q = turns.lock();
        let place = q.place(key);
        q.waiting.insert(place, Waker::noop().clone());
        q.pass();
        drop(q);
        Take {
            turns,
            key,
            place: Some(place),
        }
    }
}

impl Turns {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nobody has the turn, nor was handed it.
    pub(super) fn is_free(&self) -> bool {
        let q = self.lock();
        !q.taken && q.granted.is_none()
    }

    /// The turn now, for `key`, if it is free or only handed to a later key.
    pub(super) fn try_take(self: &Arc<Self>, key: Instant) -> Option<Turn> {
        let mut q = self.lock();
        let place = q.place(key);
        q.claim(place).then(|| Turn(Some(self.clone())))
    }

    /// The turn, once every waiter with an earlier `key` (or the same key, come
    /// earlier) has had its own.
    pub(super) fn take(self: &Arc<Self>, key: Instant) -> Take {
        Take {
            turns: self.clone(),
            key,
            place: None,
        }
    }
}

/// A place among the waiters for a turn ([`Turns::take`], [`Turn::again`]): the turn
/// is taken with [`Take::try_now`], and [`Take::ready`] waits until it can be.
pub(super) struct Take {
    turns: Arc<Turns>,
    key: Instant,
    /// Where it waits, once it does.
    place: Option<Place>,
}

impl Take {
    /// The turn, if it is this waiter's now: handed to it, free, or handed to a
    /// later key that has not taken it; otherwise it takes (or keeps) its place.
    pub(super) fn try_now(&mut self) -> Option<Turn> {
        let turns = self.turns.clone();
        let mut q = turns.lock();
        let place = match self.place {
            Some(place) => place,
            None => {
                let place = q.place(self.key);
                if q.claim(place) {
                    return Some(Turn(Some(turns.clone())));
                }
                q.waiting.insert(place, Waker::noop().clone());
                self.place = Some(place);
                return None;
            }
        };
        if q.granted == Some(place) || q.claim(place) {
            q.waiting.remove(&place);
            q.granted = None;
            q.taken = true;
            // Taken: its drop has nothing to give back.
            self.place = None;
            return Some(Turn(Some(turns.clone())));
        }
        None
    }

    /// Completes once [`Take::try_now`] would take the turn (which may by then have
    /// gone to an earlier key that asked first). Not taken here: a waiter woken by
    /// the turn's handing over runs ahead of the sockets (its worker's own queue),
    /// so the stage yields its worker (`nice`) after this and takes the turn then.
    pub(super) fn ready(&mut self) -> Ready<'_> {
        Ready(self)
    }
}

/// The future of [`Take::ready`].
pub(super) struct Ready<'a>(&'a mut Take);

impl Future for Ready<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let take = &mut *self.get_mut().0;
        let mut q = take.turns.lock();
        let place = match take.place {
            Some(place) => place,
            None => {
                // (The stage asks `try_now` first; asked here first, a free turn is
                // handed to this place, so that no later key takes it meanwhile.)
                let place = q.place(take.key);
                q.waiting.insert(place, Waker::noop().clone());
                if !q.taken && q.granted.is_none() {
                    q.granted = Some(place);
                }
                take.place = Some(place);
                place
            }
        };
        let free = !q.taken && q.granted.is_none_or(|g| g > place);
        if q.granted == Some(place) || free {
            return Poll::Ready(());
        }
        if let Some(w) = q.waiting.get_mut(&place) {
            w.clone_from(cx.waker());
        }
        Poll::Pending
    }
}

impl Drop for Take {
    /// A waiter that goes away leaves its place; one that was handed the turn and
    /// did not take it passes it on.
    fn drop(&mut self) {
        if let Some(place) = self.place {
            let mut q = self.turns.lock();
            q.waiting.remove(&place);
            if q.granted == Some(place) {
                q.pass();
            }
        }
    }
}

#[cfg(test)]
mod tests;
