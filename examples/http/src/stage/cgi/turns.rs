//! Turns on a Lua state: an async lock whose waiters go in the order of a key each
//! brings (earliest first), not in the order they came. The `cgi` stage keys a page's
//! turn by its start while the page is young, so pages of about the same cost end in
//! the order they came (first come, first served, as before pages shared states), and
//! by the time it asks once it has run long, so long pages take turns behind the
//! pages that were already waiting (see `States`).

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
    /// A turn is held (or granted to a waiter that has not taken it yet).
    held: bool,
    waiting: BTreeMap<Place, Waiter>,
    seq: u64,
}

struct Waiter {
    waker: Waker,
    /// The turn was handed to this waiter: its next poll takes it.
    granted: bool,
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
    /// future is then ready as soon as it is polled). Asked for after the turn was
    /// given up, a holder whose key is the earliest would be passed by pages that
    /// came later and found the resource free meanwhile.
    pub(super) fn again(mut self, key: Instant) -> Take {
        let turns = self.0.take().expect("a turn is held until dropped");
        let mut q = turns.lock();
        q.seq += 1;
        let place = (key, q.seq);
        q.waiting.insert(
            place,
            Waiter {
                waker: Waker::noop().clone(),
                granted: false,
            },
        );
        q.pass();
        drop(q);
        Take {
            turns,
            key,
            place: Some(place),
        }
    }
}

impl Queue {
    /// Hands the turn to the first waiter, or frees it.
    fn pass(&mut self) {
        match self.waiting.values_mut().next() {
            Some(w) => {
                w.granted = true;
                w.waker.wake_by_ref();
            }
            None => self.held = false,
        }
    }
}

impl Turns {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The turn, if it is free (then nobody waits for it).
    pub(super) fn try_take(self: &Arc<Self>) -> Option<Turn> {
        let mut q = self.lock();
        if q.held {
            return None;
        }
        q.held = true;
        Some(Turn(Some(self.clone())))
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

/// The future of [`Turns::take`] and [`Turn::again`].
pub(super) struct Take {
    turns: Arc<Turns>,
    key: Instant,
    /// Where it waits, once it does.
    place: Option<Place>,
}

impl Future for Take {
    type Output = Turn;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Turn> {
        let turns = self.turns.clone();
        let mut q = turns.lock();
        match self.place {
            None if !q.held => {
                q.held = true;
                return Poll::Ready(Turn(Some(turns.clone())));
            }
            None => {
                q.seq += 1;
                let place = (self.key, q.seq);
                q.waiting.insert(
                    place,
                    Waiter {
                        waker: cx.waker().clone(),
                        granted: false,
                    },
                );
                self.place = Some(place);
            }
            Some(place) => {
                let w = q
                    .waiting
                    .get_mut(&place)
                    .expect("a waiting turn stays queued until it is taken or dropped");
                if w.granted {
                    q.waiting.remove(&place);
                    // Taken: its drop has nothing to give back.
                    self.place = None;
                    return Poll::Ready(Turn(Some(turns.clone())));
                }
                w.waker.clone_from(cx.waker());
            }
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
            if q.waiting.remove(&place).is_some_and(|w| w.granted) {
                q.pass();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn poll(f: &mut Pin<Box<Take>>, w: &Arc<Count>) -> Option<Turn> {
        let waker = Waker::from(w.clone());
        match f.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(t) => Some(t),
            Poll::Pending => None,
        }
    }

    /// Waiters get the turn by key, not by arrival; a waiter dropped after it was
    /// handed the turn passes it on; a dropped waiter leaves its place.
    #[test]
    fn turns_go_by_key_and_are_passed_on() {
        let turns = Arc::new(Turns::default());
        let w = Arc::new(Count(AtomicUsize::new(0)));
        let t0 = Instant::now();
        let held = turns.try_take().expect("free");
        assert!(turns.try_take().is_none());
        let mut late = Box::pin(turns.take(t0 + Duration::from_secs(2)));
        let mut early = Box::pin(turns.take(t0 + Duration::from_secs(1)));
        let mut gone = Box::pin(turns.take(t0));
        let mut last = Box::pin(turns.take(t0 + Duration::from_secs(3)));
        for f in [&mut late, &mut early, &mut gone, &mut last] {
            assert!(poll(f, &w).is_none());
        }
        drop(gone);
        drop(held);
        assert_eq!(w.0.load(Ordering::Relaxed), 1);
        assert!(poll(&mut late, &w).is_none(), "a later key went first");
        let turn = poll(&mut early, &w).expect("the earliest key's turn");
        assert!(turns.try_take().is_none(), "taken while others wait");
        drop(turn);
        // Handed to `late`, which goes away without taking it: `last` has it.
        drop(late);
        let turn = poll(&mut last, &w).expect("passed on");
        drop(turn);
        assert!(turns.try_take().is_some(), "free once nobody waits");
    }

    /// A holder asking again keeps the turn when its key is the earliest (pages that
    /// come meanwhile wait), and gives it to an earlier waiter otherwise.
    #[test]
    fn asking_again_keeps_or_passes_the_turn_by_key() {
        let turns = Arc::new(Turns::default());
        let w = Arc::new(Count(AtomicUsize::new(0)));
        let t0 = Instant::now();
        let held = turns.try_take().expect("free");
        let mut later = Box::pin(turns.take(t0 + Duration::from_secs(1)));
        assert!(poll(&mut later, &w).is_none());
        let mut again = Box::pin(held.again(t0));
        assert!(turns.try_take().is_none(), "kept for the one asking again");
        let held = poll(&mut again, &w).expect("the earliest key keeps its turn");
        assert!(poll(&mut later, &w).is_none());
        let mut again = Box::pin(held.again(t0 + Duration::from_secs(2)));
        let turn = poll(&mut later, &w).expect("an earlier waiter goes first");
        assert!(poll(&mut again, &w).is_none());
        drop(turn);
        assert!(poll(&mut again, &w).is_some());
    }
}
