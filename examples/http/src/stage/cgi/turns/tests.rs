//! The turns' unit tests, and a review's (rv22) randomized model and threaded stress tests.

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

/// The turn if `take` can have it now; otherwise waits for it with `w`'s waker.
fn poll(take: &mut Take, w: &Arc<Count>) -> Option<Turn> {
    let waker = Waker::from(w.clone());
    if let Some(turn) = take.try_now() {
        return Some(turn);
    }
    let mut ready = std::pin::pin!(take.ready());
    match ready.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(()) => take.try_now(),
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
    let s = |n| t0 + Duration::from_secs(n);
    let held = turns.try_take(t0).expect("free");
    assert!(turns.try_take(t0).is_none() && !turns.is_free());
    let mut late = turns.take(s(2));
    let mut early = turns.take(s(1));
    let mut gone = turns.take(t0);
    let mut last = turns.take(s(3));
    for f in [&mut late, &mut early, &mut gone, &mut last] {
        assert!(poll(f, &w).is_none());
    }
    drop(gone);
    drop(held);
    assert_eq!(w.0.load(Ordering::Relaxed), 1);
    assert!(poll(&mut late, &w).is_none(), "a later key went first");
    let turn = poll(&mut early, &w).expect("the earliest key's turn");
    assert!(turns.try_take(t0).is_none(), "taken while others wait");
    drop(turn);
    // Handed to `late`, which goes away without taking it: `last` has it.
    drop(late);
    let turn = poll(&mut last, &w).expect("passed on");
    drop(turn);
    assert!(turns.is_free(), "free once nobody waits");
    assert!(turns.try_take(s(9)).is_some());
}

/// A holder asking again keeps the turn when its key is the earliest (later keys
/// wait), and gives it to an earlier waiter otherwise.
#[test]
fn asking_again_keeps_or_passes_the_turn_by_key() {
    let turns = Arc::new(Turns::default());
    let w = Arc::new(Count(AtomicUsize::new(0)));
    let t0 = Instant::now();
    let s = |n| t0 + Duration::from_secs(n);
    let held = turns.try_take(t0).expect("free");
    let mut later = turns.take(s(1));
    assert!(poll(&mut later, &w).is_none());
    let mut again = held.again(t0);
    assert!(turns.try_take(s(1)).is_none(), "kept for the earliest key");
    let held = poll(&mut again, &w).expect("the earliest key keeps its turn");
    assert!(poll(&mut later, &w).is_none());
    let mut again = held.again(s(2));
    let turn = poll(&mut later, &w).expect("an earlier waiter goes first");
    assert!(poll(&mut again, &w).is_none());
    drop(turn);
    assert!(poll(&mut again, &w).is_some());
}

/// A turn handed to a waiter that has not taken it goes to an earlier key that
/// asks first; the waiter keeps its place and has the turn after it.
#[test]
fn a_turn_not_yet_taken_goes_to_an_earlier_key_asking() {
    let turns = Arc::new(Turns::default());
    let w = Arc::new(Count(AtomicUsize::new(0)));
    let t0 = Instant::now();
    let s = |n| t0 + Duration::from_secs(n);
    let held = turns.try_take(t0).expect("free");
    // Kept for itself at a late key, not polled yet (a paused page yielding).
    let mut slow = held.again(s(5));
    let cheap = turns
        .try_take(s(1))
        .expect("an earlier key takes a turn not yet taken");
    assert!(poll(&mut slow, &w).is_none(), "taken by the earlier key");
    let mut later = turns.take(s(6));
    assert!(poll(&mut later, &w).is_none());
    assert!(turns.try_take(s(7)).is_none(), "a later key does not");
    drop(cheap);
    let mut queued = turns.take(s(4));
    let turn = poll(&mut queued, &w).expect("handed to `slow`, taken by an earlier key");
    assert!(poll(&mut slow, &w).is_none());
    drop(turn);
    assert!(poll(&mut later, &w).is_none(), "`slow` keeps its place");
    let turn = poll(&mut slow, &w).expect("its turn");
    drop(turn);
    assert!(poll(&mut later, &w).is_some());
}

/// A randomized single-threaded model of the `cgi` stage's use of `Turns` (counting
/// wakers, invariants checked after every step) and a multi-threaded stress test with
/// real (thread-unparking) wakers; they caught all eight bugs a review planted in
/// `turns.rs` (the stress test six: two only change the order). Iterations scale with
/// the `TURNS_SEEDS`, `TURNS_SEEDS_MT`, `TURNS_ITERS`, `TURNS_THREADS` environment
/// variables.
mod model {
    use super::super::{Place, Take, Turn, Turns};
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
    use std::task::{Context, Wake, Waker};
    use std::time::{Duration, Instant};

    fn env(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// xorshift64*.
    struct Rng(u64);
    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, pct: u64) -> bool {
            self.below(100) < pct
        }
        /// A key: mostly a few close instants (ties, reorderings), sometimes far.
        fn key(&mut self, t0: Instant) -> Instant {
            if self.chance(80) {
                t0 + Duration::from_millis(self.below(6))
            } else {
                t0 + Duration::from_millis(self.below(2000))
            }
        }
    }

    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref()
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    /// Where a model task is in the stage loop
    /// (`loop { nice; if let Some(t) = try_now() { break t } ready().await }`).
    enum St {
        /// No page in flight.
        Idle,
        /// At the loop's top, `nice` done: `try_now` next. Runnable.
        Nice(Take),
        /// In `ready().await`, Pending; its wake count then. Runnable once woken.
        Parked(Take, usize),
        /// Has the turn (running a slice). Runnable.
        Holding(Turn),
    }

    struct Task {
        st: St,
        wakes: Arc<Wakes>,
        waker: Waker,
        /// Acquisitions (all tasks') when `ready()` last said Ready.
        ready_at: Option<u64>,
    }

    impl Task {
        fn woken_since(&self, at: usize) -> bool {
            self.wakes.0.load(SeqCst) > at
        }
    }

    #[derive(Default, Debug)]
    struct Stats {
        acquisitions: u64,
        ready_yes: u64,
        ready_then_fail: u64,
        steals: u64,
        drops_granted: u64,
        drops_waiting: u64,
        agains: u64,
    }

    fn poll_ready(take: &mut Take, waker: &Waker) -> bool {
        let mut ready = pin!(take.ready());
        ready
            .as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_ready()
    }

    fn dump(turns: &Turns, tasks: &[Task]) -> String {
        let q = turns.lock();
        let mut s = format!(
            "taken {} granted {:?} waiting {:?}\n",
            q.taken,
            q.granted.map(|g| g.1),
            q.waiting.keys().map(|p| p.1).collect::<Vec<_>>()
        );
        for (i, t) in tasks.iter().enumerate() {
            let d = match &t.st {
                St::Idle => "idle".to_string(),
                St::Nice(tk) => format!("nice place {:?}", tk.place.map(|p| p.1)),
                St::Parked(tk, at) => format!(
                    "parked place {:?} woken {}",
                    tk.place.map(|p| p.1),
                    t.woken_since(*at)
                ),
                St::Holding(_) => "holding".to_string(),
            };
            s += &format!("  task {i}: {d}\n");
        }
        s
    }

    /// The invariants, after every step of the model.
    fn check(turns: &Turns, tasks: &[Task], what: &str) {
        let fail = |m: String| panic!("{what}: {m}\n{}", dump(turns, tasks));
        let holders = tasks
            .iter()
            .filter(|t| matches!(t.st, St::Holding(_)))
            .count();
        let q = turns.lock();
        let (taken, granted) = (q.taken, q.granted);
        let waiting: BTreeMap<Place, Waker> =
            q.waiting.iter().map(|(p, w)| (*p, w.clone())).collect();
        drop(q);
        if holders > 1 {
            fail(format!("{holders} holders at once"));
        }
        if taken != (holders == 1) {
            fail(format!("taken {taken} with {holders} holders"));
        }
        let mut places = BTreeMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if let St::Nice(tk) | St::Parked(tk, _) = &t.st {
                if let Some(p) = tk.place {
                    if !waiting.contains_key(&p) {
                        fail(format!("task {i}'s place is not among the waiters"));
                    }
                    places.insert(p, i);
                } else if matches!(t.st, St::Parked(..)) {
                    fail(format!("task {i} parked without a place"));
                }
            }
        }
        if waiting.len() != places.len() {
            fail("a waiter's place outlives its Take (leak)".into());
        }
        match granted {
            Some(g) => {
                if taken {
                    fail("granted while taken".into());
                }
                let first = *waiting.keys().next().unwrap_or_else(|| {
                    fail("granted with nobody waiting".into());
                    unreachable!()
                });
                if g != first {
                    fail("granted to a waiter that is not the earliest".into());
                }
                let i = places[&g];
                if let St::Parked(_, at) = tasks[i].st
                    && !tasks[i].woken_since(at)
                {
                    fail(format!("lost wake-up: task {i} granted, parked, not woken"));
                }
            }
            None if !taken && !waiting.is_empty() => {
                fail("nobody holds or is granted the turn while some wait".into())
            }
            None => {}
        }
        for (i, t) in tasks.iter().enumerate() {
            if let St::Parked(tk, _) = &t.st
                && !waiting[&tk.place.unwrap()].will_wake(&t.waker)
            {
                fail(format!("task {i} parked with a waker not its own (noop?)"));
            }
        }
    }

    /// One step of task `i` (it must be runnable, or Idle).
    fn step(
        tasks: &mut [Task],
        i: usize,
        turns: &Arc<Turns>,
        rng: &mut Rng,
        t0: Instant,
        stats: &mut Stats,
        drain: bool,
    ) {
        let t = &mut tasks[i];
        t.st = match std::mem::replace(&mut t.st, St::Idle) {
            St::Idle if drain => St::Idle,
            St::Idle => {
                let key = rng.key(t0);
                if rng.chance(40) {
                    // The handler: the first slice at once if the state is free.
                    let before = turns.lock().granted;
                    match turns.try_take(key) {
                        Some(turn) => {
                            stats.acquisitions += 1;
                            if let Some(g) = before {
                                stats.steals += 1;
                                assert!(key < g.0, "a turn granted to {g:?} taken by a later key");
                            }
                            St::Holding(turn)
                        }
                        None => St::Nice(turns.take(key)),
                    }
                } else {
                    St::Nice(turns.take(key))
                }
            }
            St::Parked(mut take, _) => {
                // `ready().await` polled again (woken, or spuriously).
                if poll_ready(&mut take, &t.waker) {
                    stats.ready_yes += 1;
                    if rng.chance(30) {
                        // No other step between: try_now must take it.
                        let turn = take
                            .try_now()
                            .expect("try_now right after ready() said Ready");
                        stats.acquisitions += 1;
                        St::Holding(turn)
                    } else {
                        // `nice` next: other tasks may step meanwhile.
                        t.ready_at = Some(stats.acquisitions);
                        St::Nice(take)
                    }
                } else {
                    St::Parked(take, t.wakes.0.load(SeqCst))
                }
            }
            St::Nice(mut take) => {
                let before = turns.lock().granted;
                let place = take.place;
                if let Some(turn) = take.try_now() {
                    stats.acquisitions += 1;
                    if let Some(g) = before.filter(|&g| Some(g) != place) {
                        stats.steals += 1;
                        let mine = place.unwrap_or((take.key, u64::MAX));
                        assert!(mine < g, "a turn granted to {g:?} taken by a later place");
                    }
                    t.ready_at = None;
                    St::Holding(turn)
                } else {
                    if let Some(at) = t.ready_at.take() {
                        stats.ready_then_fail += 1;
                        assert!(
                            stats.acquisitions > at,
                            "ready() said Ready, nobody took the turn since, and \
                             try_now failed (a busy loop)"
                        );
                    }
                    if poll_ready(&mut take, &t.waker) {
                        // try_now just failed under the same conditions.
                        panic!("ready() Ready right after try_now failed");
                    } else {
                        St::Parked(take, t.wakes.0.load(SeqCst))
                    }
                }
            }
            St::Holding(turn) => {
                if (!drain && rng.chance(50)) || (drain && rng.chance(10)) {
                    stats.agains += 1;
                    St::Nice(turn.again(rng.key(t0)))
                } else {
                    St::Idle
                }
            }
        };
    }

    fn runnable(t: &Task) -> bool {
        match &t.st {
            St::Idle => false,
            St::Nice(_) | St::Holding(_) => true,
            St::Parked(_, at) => t.woken_since(*at),
        }
    }

    fn model(seed: u64, n: usize, steps: usize, stats: &mut Stats) {
        let mut rng = Rng::new(seed);
        let turns = Arc::new(Turns::default());
        let t0 = Instant::now();
        let mut tasks: Vec<Task> = (0..n)
            .map(|_| {
                let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
                Task {
                    st: St::Idle,
                    waker: Waker::from(wakes.clone()),
                    wakes,
                    ready_at: None,
                }
            })
            .collect();
        for s in 0..steps {
            let i = rng.below(n as u64) as usize;
            let what;
            if rng.chance(8) && matches!(tasks[i].st, St::Nice(_) | St::Parked(..)) {
                // The client leaves / the run stops: the Take (and any Ready) goes.
                let granted = turns.lock().granted;
                if let St::Nice(tk) | St::Parked(tk, _) =
                    std::mem::replace(&mut tasks[i].st, St::Idle)
                {
                    if tk.place.is_some() && tk.place == granted {
                        stats.drops_granted += 1;
                    } else {
                        stats.drops_waiting += 1;
                    }
                }
                tasks[i].ready_at = None;
                what = "drop";
            } else if runnable(&tasks[i]) || matches!(tasks[i].st, St::Idle) {
                step(&mut tasks, i, &turns, &mut rng, t0, stats, false);
                what = "step";
            } else if rng.chance(3) {
                // A spurious poll of a parked task.
                step(&mut tasks, i, &turns, &mut rng, t0, stats, false);
                what = "spurious poll";
            } else {
                continue;
            }
            check(
                &turns,
                &tasks,
                &format!("seed {seed} step {s} task {i} {what}"),
            );
        }
        // Drain: no new pages; only runnable tasks run (no spurious polls): every
        // waiter left must get the turn.
        let mut rounds = 0;
        loop {
            let run: Vec<usize> = (0..n).filter(|&i| runnable(&tasks[i])).collect();
            if run.is_empty() {
                break;
            }
            rounds += 1;
            assert!(rounds < 100_000, "seed {seed}: no end (livelock)");
            let i = run[rng.below(run.len() as u64) as usize];
            step(&mut tasks, i, &turns, &mut rng, t0, stats, true);
            check(
                &turns,
                &tasks,
                &format!("seed {seed} drain {rounds} task {i}"),
            );
        }
        let stuck: Vec<usize> = (0..n)
            .filter(|&i| !matches!(tasks[i].st, St::Idle))
            .collect();
        assert!(
            stuck.is_empty(),
            "seed {seed}: tasks {stuck:?} wait forever (lost wake-up / deadlock)\n{}",
            dump(&turns, &tasks)
        );
        assert!(turns.is_free(), "seed {seed}: not free at the end");
    }

    #[test]
    fn random_steps_keep_the_invariants() {
        let seeds = env("TURNS_SEEDS", 3000);
        let mut stats = Stats::default();
        for seed in 0..seeds {
            let n = 2 + (seed % 7) as usize;
            model(seed, n, 400, &mut stats);
        }
        eprintln!("turns model: {seeds} seeds, {stats:?}");
        assert!(stats.steals > 0 && stats.drops_granted > 0 && stats.ready_then_fail > 0);
    }

    struct Unpark {
        thread: std::thread::Thread,
        woken: AtomicBool,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref()
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.woken.store(true, SeqCst);
            self.thread.unpark();
        }
    }

    fn stress(seed: u64, threads: u64, iters: u64) {
        let turns = Arc::new(Turns::default());
        let holders = Arc::new(AtomicUsize::new(0));
        let progress = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|n| {
                let (turns, holders, progress, stop) = (
                    turns.clone(),
                    holders.clone(),
                    progress.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed * 1000 + n);
                    let me = Arc::new(Unpark {
                        thread: std::thread::current(),
                        woken: AtomicBool::new(false),
                    });
                    let waker = Waker::from(me.clone());
                    let mut cx = Context::from_waker(&waker);
                    let (mut lost, mut ready_fail, mut left) = (0u64, 0u64, 0u64);
                    let mut again: Option<Take> = None;
                    for _ in 0..iters {
                        if stop.load(SeqCst) {
                            break;
                        }
                        let key = rng.key(t0);
                        let mut take = match again.take() {
                            Some(take) => take,
                            None => {
                                if rng.chance(30)
                                    && let Some(turn) = turns.try_take(key)
                                {
                                    assert_eq!(holders.fetch_add(1, SeqCst), 0, "two holders");
                                    holders.fetch_sub(1, SeqCst);
                                    drop(turn);
                                    progress.fetch_add(1, SeqCst);
                                    continue;
                                }
                                turns.take(key)
                            }
                        };
                        // The stage loop.
                        let mut said_ready = false;
                        let turn = 'l: loop {
                            std::thread::yield_now(); // nice
                            if let Some(turn) = take.try_now() {
                                break Some(turn);
                            }
                            if std::mem::take(&mut said_ready) {
                                ready_fail += 1;
                            }
                            loop {
                                me.woken.store(false, SeqCst);
                                let ready = pin!(take.ready()).poll(&mut cx).is_ready();
                                if ready {
                                    if rng.chance(2) {
                                        // Leaves with the turn handed to it, not
                                        // taken: the drop must pass it on.
                                        left += 1;
                                        drop(take);
                                        break 'l None;
                                    }
                                    // Ready: nice, then try_now (which may fail if
                                    // someone took it meanwhile).
                                    if rng.chance(20) {
                                        std::thread::yield_now();
                                    }
                                    said_ready = true;
                                    continue 'l;
                                }
                                if rng.chance(2) {
                                    // The client leaves mid-wait.
                                    left += 1;
                                    drop(take);
                                    break 'l None;
                                }
                                let parked = Instant::now();
                                while !me.woken.load(SeqCst) && !stop.load(SeqCst) {
                                    std::thread::park_timeout(Duration::from_millis(200));
                                    if !me.woken.load(SeqCst)
                                        && parked.elapsed() > Duration::from_millis(200)
                                    {
                                        // Not woken for a while: may it go on?
                                        let r = pin!(take.ready()).poll(&mut cx).is_ready();
                                        if r && !me.woken.load(SeqCst) {
                                            lost += 1;
                                            break;
                                        }
                                    }
                                }
                                if stop.load(SeqCst) {
                                    break 'l None;
                                }
                            }
                        };
                        let Some(turn) = turn else { continue };
                        assert_eq!(holders.fetch_add(1, SeqCst), 0, "two holders");
                        for _ in 0..rng.below(200) {
                            std::hint::spin_loop();
                        }
                        if rng.chance(5) {
                            std::thread::yield_now();
                        }
                        holders.fetch_sub(1, SeqCst);
                        progress.fetch_add(1, SeqCst);
                        if rng.chance(50) {
                            let take = turn.again(rng.key(t0));
                            if rng.chance(3) {
                                // Stopped right after asking again (its place
                                // possibly handed the turn, with a noop waker).
                                drop(take);
                            } else {
                                again = Some(take);
                            }
                        }
                    }
                    drop(again);
                    (lost, ready_fail, left)
                })
            })
            .collect();
        let mut last = (0, Instant::now());
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let p = progress.load(SeqCst);
            if p != last.0 {
                last = (p, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(10) {
                stop.store(true, SeqCst);
                let q = turns.lock();
                panic!(
                    "seed {seed}: no progress for 10 s (deadlock): taken {} granted {:?} \
                     waiting {}",
                    q.taken,
                    q.granted,
                    q.waiting.len()
                );
            }
        }
        let (mut lost, mut ready_fail, mut left) = (0, 0, 0);
        for h in handles {
            let (l, r, g) = h.join().expect("a stress thread panicked");
            lost += l;
            ready_fail += r;
            left += g;
        }
        eprintln!(
            "turns stress seed {seed}: {} turns, ready-then-fail {ready_fail}, left {left}, \
             lost wake-ups {lost}",
            progress.load(SeqCst)
        );
        assert_eq!(lost, 0, "seed {seed}: lost wake-ups");
        assert!(turns.is_free(), "seed {seed}: not free at the end");
        assert!(turns.lock().waiting.is_empty(), "seed {seed}: waiters left");
    }

    /// `ready()` polled before any `try_now` on a free `Turns` (the stage never does
    /// so) took a place without the turn being handed to it, so a later key's
    /// `try_now` took the turn ahead of it; the free turn is now handed to that place.
    #[test]
    fn ready_before_try_now_keeps_key_order() {
        let turns = Arc::new(Turns::default());
        let t0 = Instant::now();
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut early = turns.take(t0);
        assert!(poll_ready(&mut early, &waker), "free: ready at once");
        {
            let q = turns.lock();
            assert!(
                q.taken || q.granted.is_some() || q.waiting.is_empty(),
                "free and ungranted with {} waiting",
                q.waiting.len()
            );
        }
        let mut late = turns.take(t0 + Duration::from_secs(5));
        assert!(
            late.try_now().is_none(),
            "a later key went ahead of a ready waiter"
        );
    }

    #[test]
    fn threads_taking_turns_lose_no_wake_up() {
        let iters = env("TURNS_ITERS", 3000);
        for seed in 0..env("TURNS_SEEDS_MT", 3) {
            stress(seed, env("TURNS_THREADS", 8), iters);
        }
    }
}
