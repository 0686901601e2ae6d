//! A stage's event queue: a small preallocated ring for the common case, and an
//! unbounded segmented overflow for bursts (the stage's capacity is enforced by its
//! counters, not here).
//!
//! Order: a producer pushes to the ring only while the overflow is empty, and consumers
//! take from the ring before the overflow, so the events of one producer leave in the
//! order it sent them. Events of different producers have no defined order.

use crossbeam_queue::{ArrayQueue, SegQueue};

use crate::event::Event;

/// Slots of the preallocated ring (64 bytes each).
const RING: usize = 256;

pub(crate) struct EventQueue {
    ring: ArrayQueue<Event>,
    overflow: SegQueue<Event>,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        EventQueue {
            ring: ArrayQueue::new(RING),
            overflow: SegQueue::new(),
        }
    }

    #[inline]
    pub(crate) fn push(&self, ev: Event) {
        if self.overflow.is_empty() {
            match self.ring.push(ev) {
                Ok(()) => {}
                Err(ev) => self.overflow.push(ev),
            }
        } else {
            self.overflow.push(ev);
        }
    }

    #[inline]
    pub(crate) fn pop(&self) -> Option<Event> {
        self.ring.pop().or_else(|| self.overflow.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_producer_keeps_its_order_across_ring_and_overflow() {
        let q = EventQueue::new();
        let mut next = 0i64;
        let mut expect = 0i64;
        // Interleave bursts larger than the ring with partial drains.
        for burst in [10usize, 300, 5, 700, 256, 1] {
            for _ in 0..burst {
                q.push(Event::from(next));
                next += 1;
            }
            for _ in 0..burst / 2 + 1 {
                if let Some(ev) = q.pop() {
                    assert_eq!(ev.get::<i64>(0).unwrap(), expect);
                    expect += 1;
                }
            }
        }
        while let Some(ev) = q.pop() {
            assert_eq!(ev.get::<i64>(0).unwrap(), expect);
            expect += 1;
        }
        assert_eq!(expect, next);
    }
}
