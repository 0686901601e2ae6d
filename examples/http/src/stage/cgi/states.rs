//! The `cgi` stage's Lua states and which pages run on them.
//!
//! A page starts on a state with room (fewer than `cgi_pages` pages); pages that find
//! none wait, unstarted, in the order they came, and start as room is made. A page
//! that runs out of memory beside other pages of its state (they share its
//! `cgi_memory`) waits for a state of its own and runs again there
//! ([`States::admit_alone`]). With every request started at once and no second run,
//! 200 connections to a 4 MB page all failed with "not enough memory", a page holding
//! most of a state's memory made the pages beside it fail, and 2,000 connections to a
//! 0.3 s page got no response in 15 s, every page taking turns with all the others
//! (review findings, 2026-11-27).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Cgi;
use super::turns::Turns;
use crate::config::Config;

/// The stage's Lua states, shared by its instances (each has one page in flight). A
/// state is made when a page first needs it, and runs one page's slice at a time.
pub struct States {
    pub(super) cfg: Config,
    slots: Box<[Slot]>,
    room: Mutex<Room>,
}

pub(super) struct Slot {
    /// Turns on the state, one per slice.
    pub(super) turns: Arc<Turns>,
    /// The state, locked by the holder of a turn (so never contended).
    cgi: Mutex<Option<Cgi>>,
}

impl Slot {
    pub(super) fn cgi(&self) -> MutexGuard<'_, Option<Cgi>> {
        self.cgi.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Who runs where: pages started per state, and the pages waiting to start.
struct Room {
    pages: Vec<usize>,
    /// The state holds (or was given, or is kept for) a page that runs alone: no
    /// other page joins it.
    sole: Vec<bool>,
    /// The page that runs alone on the state once its pages have ended.
    kept: Vec<Option<Arc<Ticket>>>,
    waiting: VecDeque<Arc<Ticket>>,
}

/// Gives `ticket` state `i` and wakes its page.
fn give(ticket: &Ticket, i: usize) {
    let mut given = ticket.lock();
    given.0 = Some(i);
    if let Some(w) = given.1.take() {
        w.wake();
    }
}

/// A waiting page's ticket: the state it was given, and its task's waker.
#[derive(Default)]
struct Ticket {
    /// It waits for a state with no page ([`States::admit_alone`]).
    alone: bool,
    given: Mutex<(Option<usize>, Option<Waker>)>,
}

impl Ticket {
    fn lock(&self) -> MutexGuard<'_, (Option<usize>, Option<Waker>)> {
        self.given.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The states `cfg` asks for: `cgi_states`, or one per CPU when it is 0.
pub(super) fn count(cfg: &Config) -> usize {
    match cfg.cgi_states {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl States {
    /// `cfg.cgi_states` states (0: one per CPU), none made yet.
    pub fn new(cfg: Config) -> States {
        let n = count(&cfg);
        let slots = (0..n)
            .map(|_| Slot {
                turns: Arc::default(),
                cgi: Mutex::new(None),
            })
            .collect();
        States {
            cfg,
            slots,
            room: Mutex::new(Room {
                pages: vec![0; n],
                sole: vec![false; n],
                kept: vec![None; n],
                waiting: VecDeque::new(),
            }),
        }
    }

    fn room(&self) -> MutexGuard<'_, Room> {
        self.room.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state with room for one more page that runs the fewest (a free one first
    /// among those), if any; with `alone`, only a state with no page.
    fn with_room(&self, room: &Room, alone: bool) -> Option<usize> {
        let most = if alone { 1 } else { self.cfg.cgi_pages.max(1) };
        (0..self.slots.len())
            .filter(|&i| room.pages[i] < most && !room.sole[i])
            .min_by_key(|&i| (room.pages[i], !self.slots[i].turns.is_free()))
    }

    /// A place on a state for a new page now, if one has room and no page waits
    /// (the tests' first half of [`States::admit_or_queue`]).
    #[cfg(test)]
    pub(super) fn try_admit(self: &Arc<Self>) -> Option<OnState> {
        let i = self.admit_now(&mut self.room(), false)?;
        Some(OnState {
            states: self.clone(),
            i,
            alone: false,
        })
    }

    /// A place on a state for a new page now if one has room and no page waits, or
    /// else its place among the waiting pages, taken at once (queued only when first
    /// polled, a page that came later could pass it: review finding).
    pub(super) fn admit_or_queue(self: &Arc<Self>) -> Result<OnState, Admit> {
        let mut room = self.room();
        if let Some(i) = self.admit_now(&mut room, false) {
            return Ok(OnState {
                states: self.clone(),
                i,
                alone: false,
            });
        }
        let ticket = Arc::new(Ticket::default());
        room.waiting.push_back(ticket.clone());
        Err(Admit {
            states: self.clone(),
            alone: false,
            ticket: Some(ticket),
        })
    }

    fn admit_now(&self, room: &mut Room, alone: bool) -> Option<usize> {
        if !room.waiting.is_empty() {
            return None;
        }
        let i = self.with_room(room, alone)?;
        room.pages[i] += 1;
        room.sole[i] = alone;
        Some(i)
    }

    /// A place on a state for a new page, once one has room (pages that came earlier
    /// first; the tests' second half of [`States::admit_or_queue`]).
    #[cfg(test)]
    pub(super) fn admit(self: &Arc<Self>) -> Admit {
        Admit {
            states: self.clone(),
            alone: false,
            ticket: None,
        }
    }

    /// A place on a state with no other page: the least busy state that no other such
    /// page has is kept for it (no page joins it) until its pages end; when every
    /// state has one, it waits in order for a state that is empty. (Waiting at the
    /// head of the queue for any state to empty held every page back, on every state,
    /// for as long as the slowest state took: review finding.)
    pub(super) fn admit_alone(self: &Arc<Self>) -> Admit {
        Admit {
            states: self.clone(),
            alone: true,
            ticket: None,
        }
    }

    /// Starts the pages states were kept for once they are empty, then waiting pages
    /// while states have room for them.
    fn start_waiting(&self, room: &mut Room) {
        for i in 0..room.pages.len() {
            if room.pages[i] == 0
                && let Some(ticket) = room.kept[i].take()
            {
                room.pages[i] = 1;
                give(&ticket, i);
            }
        }
        while let Some(front) = room.waiting.front() {
            let Some(i) = self.with_room(room, front.alone) else {
                return;
            };
            let ticket = room.waiting.pop_front().expect("not empty");
            room.pages[i] += 1;
            room.sole[i] = ticket.alone;
            give(&ticket, i);
        }
    }

    /// Gives back state `i`'s place of a page that ended (or never started).
    fn release(&self, i: usize, alone: bool) {
        let mut room = self.room();
        room.pages[i] -= 1;
        if alone {
            room.sole[i] = false;
        }
        self.start_waiting(&mut room);
    }

    /// Pages started on state `i` and not ended.
    pub(super) fn pages_on(&self, i: usize) -> usize {
        self.room().pages[i]
    }
}

/// The future of [`States::admit`] and [`States::admit_alone`].
pub(super) struct Admit {
    states: Arc<States>,
    alone: bool,
    /// Its place among the waiting pages, once it waits.
    ticket: Option<Arc<Ticket>>,
}

impl Future for Admit {
    type Output = OnState;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<OnState> {
        let states = self.states.clone();
        let alone = self.alone;
        let on = |i| OnState {
            states: states.clone(),
            i,
            alone,
        };
        match &self.ticket {
            Some(ticket) => {
                let mut given = ticket.lock();
                if let Some(i) = given.0.take() {
                    drop(given);
                    self.ticket = None;
                    return Poll::Ready(on(i));
                }
                given.1 = Some(cx.waker().clone());
                Poll::Pending
            }
            None => {
                let mut room = states.room();
                let ticket = Arc::new(Ticket {
                    alone: self.alone,
                    ..Ticket::default()
                });
                ticket.lock().1 = Some(cx.waker().clone());
                let keep = (0..room.pages.len())
                    .filter(|&i| !room.sole[i])
                    .min_by_key(|&i| room.pages[i]);
                match keep {
                    Some(i) if self.alone => {
                        room.sole[i] = true;
                        if room.pages[i] == 0 {
                            room.pages[i] = 1;
                            return Poll::Ready(on(i));
                        }
                        room.kept[i] = Some(ticket.clone());
                    }
                    _ => {
                        if let Some(i) = states.admit_now(&mut room, self.alone) {
                            return Poll::Ready(on(i));
                        }
                        room.waiting.push_back(ticket.clone());
                    }
                }
                drop(room);
                self.ticket = Some(ticket);
                Poll::Pending
            }
        }
    }
}

impl Drop for Admit {
    /// A page that goes away while it waits leaves its place, or gives back the state
    /// it was given.
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let mut room = self.states.room();
        room.waiting.retain(|t| !Arc::ptr_eq(t, &ticket));
        for i in 0..room.kept.len() {
            if room.kept[i]
                .as_ref()
                .is_some_and(|t| Arc::ptr_eq(t, &ticket))
            {
                room.kept[i] = None;
                room.sole[i] = false;
            }
        }
        let given = ticket.lock().0.take();
        if let Some(i) = given {
            room.pages[i] -= 1;
            if self.alone {
                room.sole[i] = false;
            }
        }
        // Also when it was not given: an alone ticket at the head held back the
        // tickets behind it, and a state kept for it held back every page.
        self.states.start_waiting(&mut room);
    }
}

/// A page's place on its state, counted until the page ends or is dropped.
pub(super) struct OnState {
    pub(super) states: Arc<States>,
    pub(super) i: usize,
    /// Admitted alone: its state takes no other page until it ends.
    alone: bool,
}

impl OnState {
    pub(super) fn slot(&self) -> &Slot {
        &self.states.slots[self.i]
    }
}

impl Drop for OnState {
    fn drop(&mut self) {
        self.states.release(self.i, self.alone);
    }
}

#[cfg(test)]
mod tests;
