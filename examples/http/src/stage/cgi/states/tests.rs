//! `States`' unit tests, and a review's (rv23) randomized model and threaded stress
//! tests (with its fixes, they pass; before, four failed).

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Wake;
use std::time::{Duration, Instant};

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn states(n: usize, pages: usize) -> Arc<States> {
    let cfg = Config {
        cgi_states: n,
        cgi_pages: pages,
        ..Config::default()
    };
    Arc::new(States::new(cfg))
}

/// Polls `a` once with `w`'s waker (its count reset first).
fn poll(a: &mut Admit, w: &Arc<Count>) -> Option<OnState> {
    w.0.store(0, Ordering::Relaxed);
    let waker = Waker::from(w.clone());
    match Pin::new(a).poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(on) => Some(on),
        Poll::Pending => None,
    }
}

fn count() -> Arc<Count> {
    Arc::new(Count(AtomicUsize::new(0)))
}

fn given(a: &Admit) -> Option<usize> {
    a.ticket.as_ref().and_then(|t| t.lock().0)
}

/// A state has room for `cgi_pages` pages; the next page waits and is given the
/// first place made; a page dropped while it waits leaves its place.
#[test]
fn pages_wait_for_room_in_order() {
    let s = states(1, 2);
    let a = s.try_admit().expect("room");
    let b = s.try_admit().expect("room");
    assert!(s.try_admit().is_none());
    let (wc, wd) = (count(), count());
    let (mut c, mut d) = (s.admit(), s.admit());
    assert!(poll(&mut c, &wc).is_none() && poll(&mut d, &wd).is_none());
    drop(a);
    assert_eq!(wc.0.load(Ordering::Relaxed), 1);
    assert_eq!(wd.0.load(Ordering::Relaxed), 0);
    assert!(s.try_admit().is_none(), "a page waits: no overtaking");
    let c_on = poll(&mut c, &wc).expect("given");
    drop(d); // never given: leaves its place
    assert_eq!(s.pages_on(0), 2);
    drop((b, c_on));
    assert_eq!(s.pages_on(0), 0);
    assert!(s.room().waiting.is_empty());
}

/// A page given a state and dropped before it takes it gives the state back, and
/// the next waiter gets it.
#[test]
fn a_ticket_given_to_a_dropped_page_goes_on() {
    let s = states(1, 1);
    let a = s.try_admit().expect("room");
    let (wb, wc) = (count(), count());
    let (mut b, mut c) = (s.admit(), s.admit());
    assert!(poll(&mut b, &wb).is_none() && poll(&mut c, &wc).is_none());
    drop(a);
    assert_eq!(given(&b), Some(0));
    drop(b);
    assert_eq!(given(&c), Some(0));
    assert_eq!(wc.0.load(Ordering::Relaxed), 1);
    let on = poll(&mut c, &wc).expect("given");
    assert_eq!(s.pages_on(0), 1);
    drop(on);
    assert_eq!(s.pages_on(0), 0);
}

/// Review rv23 found: a page waiting alone at the head of the queue, dropped (its
/// client left), leaves the pages behind it waiting though a state has room for
/// them, until some page ends; new pages meanwhile also wait (`admit_now` refuses
/// while anyone waits).
#[test]
fn a_dropped_alone_waiter_lets_the_next_start() {
    let s = states(1, 2);
    let a = s.try_admit().expect("room");
    let (wl, wn) = (count(), count());
    let mut lone = s.admit_alone();
    let mut next = s.admit();
    assert!(poll(&mut lone, &wl).is_none(), "state 0 has a page");
    assert!(poll(&mut next, &wn).is_none(), "behind the alone page");
    drop(lone);
    assert_eq!(
        given(&next),
        Some(0),
        "state 0 has room (1 of 2) and nobody else waits"
    );
    assert_eq!(wn.0.load(Ordering::Relaxed), 1);
    drop((a, next));
}

/// Review rv23 found: a page admitted alone runs alone: the pages waiting behind
/// it (and pages that come later) do not join its state while it runs.
#[test]
fn an_alone_page_runs_alone() {
    let s = states(1, 4);
    let a = s.try_admit().expect("room");
    let (wl, wn) = (count(), count());
    let mut lone = s.admit_alone();
    let mut next = s.admit();
    assert!(poll(&mut lone, &wl).is_none() && poll(&mut next, &wn).is_none());
    drop(a);
    let lone_on = poll(&mut lone, &wl).expect("state 0 is empty");
    assert_eq!(given(&next), None, "joined the alone page's state");
    assert!(s.try_admit().is_none(), "joined the alone page's state");
    assert_eq!(s.pages_on(0), 1);
    drop(lone_on);
    assert_eq!(given(&next), Some(0));
    let on = poll(&mut next, &wn).expect("given");
    drop(on);
    assert_eq!(s.pages_on(0), 0);
}

/// As `cgi.rs`'s `Next::Alone` does it: the page leaves its state and waits for an
/// empty one; later pages wait behind it, so it gets one once its state's other
/// pages end.
#[test]
fn the_alone_path_gets_a_state() {
    let s = states(2, 2);
    let ons: Vec<OnState> = (0..4).map(|_| s.try_admit().expect("room")).collect();
    let mut it = ons.into_iter();
    let mine = it.next().unwrap();
    let rest: Vec<OnState> = it.collect();
    let w = count();
    let mut lone = s.admit_alone();
    drop(mine);
    assert!(poll(&mut lone, &w).is_none(), "both states hold pages");
    let wl = count();
    let mut late = s.admit();
    assert!(
        poll(&mut late, &wl).is_none(),
        "waits behind the alone page"
    );
    assert!(s.try_admit().is_none(), "try_admit waits behind it too");
    drop(rest);
    let on = poll(&mut lone, &w).expect("a state emptied");
    assert_eq!(s.pages_on(on.i), 1, "`late` joined the alone page");
    drop(on);
    let on = poll(&mut late, &wl).expect("given");
    drop(on);
    assert_eq!(s.room().pages, vec![0, 0]);
}

/// A page that goes alone keeps one state for itself (no page joins it, and it is
/// the page's once its pages end), and the other states go on taking pages.
#[test]
fn an_alone_page_keeps_one_state_and_the_others_go_on() {
    let s = states(2, 2);
    let a = s.try_admit().expect("room");
    let b = s.try_admit().expect("room");
    assert_ne!(a.i, b.i, "the least busy state first");
    let w = count();
    let mut lone = s.admit_alone();
    assert!(poll(&mut lone, &w).is_none(), "both states hold a page");
    let kept = (0..2)
        .find(|&i| s.room().kept[i].is_some())
        .expect("a state kept");
    let other = s.try_admit().expect("the other state takes pages");
    assert_ne!(other.i, kept);
    assert!(
        s.try_admit().is_none(),
        "the other is full, the kept one takes none"
    );
    let (on_kept, on_other) = if a.i == kept { (a, b) } else { (b, a) };
    drop(on_kept);
    assert_eq!(w.0.load(Ordering::Relaxed), 1);
    let on = poll(&mut lone, &w).expect("its kept state");
    assert_eq!((on.i, s.pages_on(kept)), (kept, 1));
    assert!(s.try_admit().is_none(), "nobody joins it while it runs");
    drop(on);
    assert!(s.try_admit().is_some(), "taken again once it ended");
    drop((on_other, other));
}

/// The handler's `admit_or_queue` takes a waiting page's place at once: a page that
/// comes after it, before its first poll, does not pass it.
#[test]
fn a_queued_page_keeps_its_place_before_its_first_poll() {
    let s = states(1, 1);
    let a = s.admit_or_queue().ok().expect("room");
    let Err(mut b) = s.admit_or_queue() else {
        panic!("no room: queued");
    };
    drop(a);
    assert_eq!(given(&b), Some(0), "given while not yet polled");
    assert!(s.admit_or_queue().is_err(), "a later page waits behind it");
    let on = poll(&mut b, &count()).expect("its place");
    assert_eq!(s.pages_on(on.i), 1);
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Waiter {
    admit: Admit,
    w: Arc<Count>,
    alone: bool,
    polled: bool,
}

struct Model {
    s: Arc<States>,
    waiters: Vec<Waiter>,
    /// Live places, and whether each was admitted alone.
    ons: Vec<(OnState, bool)>,
    /// Check that an alone page's state has no other page (an alone page runs alone).
    check_alone: bool,
    /// Check that no page waits while the head has room (no page waits while the head has room).
    check_head: bool,
}

impl Model {
    fn poll_at(&mut self, k: usize) {
        let wt = &mut self.waiters[k];
        wt.polled = true;
        if let Some(on) = poll(&mut wt.admit, &wt.w) {
            let wt = self.waiters.swap_remove(k);
            self.ons.push((on, wt.alone));
        }
    }

    fn check(&self, step: &str) {
        let room = self.s.room();
        let n = room.pages.len();
        let most = self.s.cfg.cgi_pages.max(1);
        let mut want = vec![0usize; n];
        for (on, _) in &self.ons {
            want[on.i] += 1;
        }
        let mut waiting = 0;
        for wt in &self.waiters {
            match &wt.admit.ticket {
                Some(t) => {
                    let g = t.lock();
                    match g.0 {
                        Some(i) => {
                            want[i] += 1;
                            assert!(
                                wt.w.0.load(Ordering::Relaxed) > 0,
                                "{step}: a ticket given without a wake-up"
                            );
                            if self.check_alone && wt.alone {
                                assert_eq!(room.pages[i], 1, "{step}: alone ticket beside pages");
                            }
                        }
                        None => {
                            let queued = room.waiting.iter().any(|x| Arc::ptr_eq(x, t));
                            let kept = room
                                .kept
                                .iter()
                                .filter(|k| k.as_ref().is_some_and(|k| Arc::ptr_eq(k, t)))
                                .count();
                            assert_eq!(
                                usize::from(queued) + kept,
                                1,
                                "{step}: a waiter neither queued nor kept a state, or both"
                            );
                            if queued {
                                waiting += 1;
                            }
                        }
                    }
                }
                None => assert!(!wt.polled, "{step}: a polled pending Admit without ticket"),
            }
        }
        assert_eq!(
            room.pages, want,
            "{step}: pages[i] != places + given tickets"
        );
        assert_eq!(
            room.waiting.len(),
            waiting,
            "{step}: stale tickets in the queue"
        );
        for &p in &room.pages {
            assert!(p <= most, "{step}: {p} pages on a state (most {most})");
        }
        for (i, k) in room.kept.iter().enumerate() {
            if k.is_some() {
                assert!(room.sole[i], "{step}: a kept state others may join");
                assert!(room.pages[i] > 0, "{step}: an empty state kept, not given");
            }
        }
        if self.check_alone {
            for (on, alone) in &self.ons {
                if *alone {
                    assert_eq!(room.pages[on.i], 1, "{step}: an alone page has company");
                }
            }
        }
        if self.check_head
            && let Some(head) = room.waiting.front()
        {
            assert!(
                self.s.with_room(&room, head.alone).is_none(),
                "{step}: the head waits though a state has room for it ({:?}, alone {})",
                room.pages,
                head.alone
            );
        }
    }

    fn step(&mut self, rng: &mut Rng) -> &'static str {
        match rng.below(12) {
            0 | 1 => {
                // A request, as the handler does it: `try_admit`, else `admit`,
                // polled later.
                if rng.below(2) == 0
                    && let Some(on) = self.s.try_admit()
                {
                    self.ons.push((on, false));
                    return "try_admit";
                }
                self.waiters.push(Waiter {
                    admit: self.s.admit(),
                    w: count(),
                    alone: false,
                    polled: false,
                });
                "admit"
            }
            2 => {
                self.waiters.push(Waiter {
                    admit: self.s.admit_alone(),
                    w: count(),
                    alone: true,
                    polled: false,
                });
                "admit_alone"
            }
            3 if !self.waiters.is_empty() => {
                let k = rng.below(self.waiters.len());
                self.poll_at(k);
                "poll one"
            }
            4 | 5 => {
                // The executor: polls the woken and the never polled.
                let mut k = 0;
                while k < self.waiters.len() {
                    let wt = &self.waiters[k];
                    if !wt.polled || wt.w.0.load(Ordering::Relaxed) > 0 {
                        let before = self.waiters.len();
                        self.poll_at(k);
                        if self.waiters.len() < before {
                            continue;
                        }
                    }
                    k += 1;
                }
                "poll woken"
            }
            6 if !self.waiters.is_empty() => {
                let k = rng.below(self.waiters.len());
                drop(self.waiters.swap_remove(k));
                "drop waiter"
            }
            7..=9 if !self.ons.is_empty() => {
                let k = rng.below(self.ons.len());
                drop(self.ons.swap_remove(k));
                "drop place"
            }
            10 if !self.ons.is_empty() => {
                // `Next::Alone`: admit_alone, drop the place, poll.
                let k = rng.below(self.ons.len());
                let admit = self.s.admit_alone();
                drop(self.ons.swap_remove(k));
                self.waiters.push(Waiter {
                    admit,
                    w: count(),
                    alone: true,
                    polled: false,
                });
                let last = self.waiters.len() - 1;
                self.poll_at(last);
                "alone path"
            }
            _ => "nothing",
        }
    }

    /// Ends every page: places end, woken waiters run, until none is left.
    fn drain(&mut self, rng: &mut Rng) {
        for round in 0.. {
            assert!(round < 100_000, "drain does not end");
            let mut progressed = false;
            let mut k = 0;
            while k < self.waiters.len() {
                let wt = &self.waiters[k];
                if !wt.polled || wt.w.0.load(Ordering::Relaxed) > 0 {
                    let before = self.waiters.len();
                    self.poll_at(k);
                    if self.waiters.len() < before {
                        progressed = true;
                        continue;
                    }
                }
                k += 1;
            }
            self.check("drain poll");
            if !progressed {
                if self.ons.is_empty() {
                    break;
                }
                let k = rng.below(self.ons.len());
                drop(self.ons.swap_remove(k));
                self.check("drain drop");
            }
        }
        assert!(
            self.waiters.is_empty(),
            "{} pages never admitted; pages {:?}, {} waiting",
            self.waiters.len(),
            self.s.room().pages,
            self.s.room().waiting.len()
        );
        assert!(self.s.room().pages.iter().all(|&p| p == 0));
        assert!(self.s.room().waiting.is_empty());
    }
}

fn model(seeds: std::ops::Range<u64>, check_head: bool, check_alone: bool) {
    let n: u64 = std::env::var("RV23_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(seeds.end);
    for seed in seeds.start..n {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let n = 1 + rng.below(3);
        let pages = rng.below(4); // 0 means 1
        let mut m = Model {
            s: states(n, pages),
            waiters: Vec::new(),
            ons: Vec::new(),
            check_alone,
            check_head,
        };
        let steps = 50 + rng.below(400);
        for _ in 0..steps {
            let what = m.step(&mut rng);
            let step = format!("seed {seed} {what}");
            m.check(&step);
        }
        m.drain(&mut rng);
    }
}

/// The model with every invariant but those two: counts, wake-ups, the
/// queue, and every waiter admitted in the end.
#[test]
fn model_counts_and_wakeups() {
    model(0..3000, false, false);
}

/// The model with those two checked too (the head has no room; alone means alone).
#[test]
fn model_strict() {
    model(0..3000, true, true);
}

/// Threads admit, hold, drop waiting futures and go alone; in the end nothing is
/// counted and nobody waits; no state holds more than `cgi_pages`, and no wait
/// lasts past a deadline (a lost wake-up).
#[test]
fn threaded_stress() {
    use std::thread;
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    /// Polls `a` until ready, or gives up (drops it) after `give_up` polls.
    fn block_on(mut a: Admit, give_up: Option<usize>) -> Option<OnState> {
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        let mut polls = 0;
        loop {
            if let Poll::Ready(on) = Pin::new(&mut a).poll(&mut cx) {
                return Some(on);
            }
            polls += 1;
            if give_up.is_some_and(|g| polls > g) {
                return None;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "a page waited 20 s: lost wake-up?"
            );
            thread::park_timeout(Duration::from_millis(1));
        }
    }
    let iters: usize = std::env::var("RV23_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    for (n, pages) in [(1, 1), (1, 3), (2, 2), (3, 1)] {
        let s = states(n, pages);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let s = s.clone();
                thread::spawn(move || {
                    let mut rng = Rng((t + 1) * 0x1234_5678_9abc_def1);
                    for _ in 0..iters {
                        let on = match rng.below(6) {
                            0 => s.try_admit(),
                            1 => block_on(s.admit_alone(), Some(rng.below(3))),
                            2 => block_on(s.admit(), Some(rng.below(3))),
                            _ => block_on(s.admit(), None),
                        };
                        let Some(on) = on else { continue };
                        assert!(s.pages_on(on.i) <= pages.max(1));
                        if rng.below(4) == 0 {
                            thread::yield_now();
                        }
                        if rng.below(8) == 0 {
                            let alone = s.admit_alone();
                            drop(on);
                            let on = block_on(alone, None).expect("no give-up");
                            assert!(s.pages_on(on.i) >= 1);
                            drop(on);
                        } else {
                            drop(on);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        let room = s.room();
        assert!(room.pages.iter().all(|&p| p == 0), "{:?}", room.pages);
        assert!(room.waiting.is_empty());
    }
}
