//! Stress: a parallel stage's further instances (the split rule, waiting instances).
//! An event must never be left in a queue with no instance on its way, and a stage
//! whose instances wait must still get up to `maxpar` of them. Every run is bounded by
//! the run's own timeout, so a lost activation or a deadlock fails instead of hanging.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use leda_core::prelude::*;
use tokio::sync::{Notify, Semaphore};

/// Event kinds of the target stage.
const FAST: i64 = 0;
const WAIT: i64 = 1; // waits for the signal `id`
const SIGNAL: i64 = 2; // fires the signal `id`
const TIMER: i64 = 3; // sleeps a little
const NICE: i64 = 4; // yields (`Ctx::nice`)
const MEET: i64 = 5; // a rendezvous of `maxpar` waiters
const SPIN: i64 = 6; // busy for 100 µs

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A rendezvous of `n` arrivals: the k-th arrival belongs to generation k / n, which
/// is released once its n arrivals are in. Needs n instances waiting at once.
struct Rendezvous {
    n: u64,
    state: Mutex<(u64, u64, Vec<Waker>)>, // (arrived, generations released, wakers)
}

struct Meet {
    r: Arc<Rendezvous>,
    generation: Option<u64>,
}

impl Future for Meet {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let r = self.r.clone();
        let mut s = r.state.lock().unwrap();
        let g = match self.generation {
            Some(g) => g,
            None => {
                let g = s.0 / r.n;
                s.0 += 1;
                if s.0.is_multiple_of(r.n) {
                    s.1 = g + 1;
                    for w in s.2.drain(..) {
                        w.wake();
                    }
                }
                self.generation = Some(g);
                g
            }
        };
        if s.1 > g {
            Poll::Ready(())
        } else {
            s.2.push(cx.waker().clone());
            Poll::Pending
        }
    }
}

struct Shared {
    signals: Vec<Notify>,
    permits: Semaphore,
    waits_done: AtomicUsize,
    meets_done: AtomicUsize,
    handled: AtomicUsize,
    meet: Arc<Rendezvous>,
}

/// The stage under test: parallel (`maxpar`), async, most events fast (so the split
/// is large once calls are timed), some waiting on a signal that a later event of the
/// same stage fires, on a timer, on a yield, or on a rendezvous of `maxpar` waiters.
fn target(maxpar: usize, sh: &Arc<Shared>) -> Stage {
    let sh = sh.clone();
    Stage::asynchronous("t", move |ev: Event, ctx: Ctx| {
        let sh = sh.clone();
        async move {
            let kind: i64 = ev.get(0)?;
            let id = usize::try_from(ev.get::<i64>(1)?)?;
            match kind {
                FAST => {}
                WAIT => {
                    sh.signals[id].notified().await;
                    sh.permits.add_permits(1);
                    sh.waits_done.fetch_add(1, SeqCst);
                }
                SIGNAL => sh.signals[id].notify_one(),
                TIMER => ctx.sleep(Duration::from_micros(300)).await,
                NICE => {
                    ctx.nice().await;
                    ctx.nice().await;
                }
                MEET => {
                    Meet {
                        r: sh.meet.clone(),
                        generation: None,
                    }
                    .await;
                    sh.meets_done.fetch_add(1, SeqCst);
                }
                _ => unreachable!(),
            }
            sh.handled.fetch_add(1, SeqCst);
            Ok(())
        }
    })
    .maxpar(maxpar)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    threads: usize,
    maxpar: usize,
    producers: usize,
    rounds: usize,
    /// Per round: a WAIT/SIGNAL pair (else MEET events, `maxpar` per round).
    pairs: bool,
    seed: u64,
}

/// Producers (a parallel async stage, one activation per producer) send rounds of
/// fast events with the waiting kinds among them. At most `maxpar - 1` WAITs are
/// outstanding (a semaphore), so the SIGNAL each one needs always has an instance
/// slot: only a lost activation can stop the run.
fn graph(c: Case) -> (Graph, Arc<Shared>, usize, usize) {
    let pairs_total = if c.pairs { c.producers * c.rounds } else { 0 };
    let meets_total = if c.pairs {
        0
    } else {
        c.producers * c.rounds * c.maxpar
    };
    let sh = Arc::new(Shared {
        signals: (0..pairs_total.max(1)).map(|_| Notify::new()).collect(),
        permits: Semaphore::new(c.maxpar - 1),
        waits_done: AtomicUsize::new(0),
        meets_done: AtomicUsize::new(0),
        handled: AtomicUsize::new(0),
        meet: Arc::new(Rendezvous {
            n: c.maxpar as u64,
            state: Mutex::new((0, 0, Vec::new())),
        }),
    });
    let sh2 = sh.clone();
    let src = Stage::asynchronous("src", move |ev: Event, mut ctx: Ctx| {
        let sh = sh2.clone();
        async move {
            let p: i64 = ev.get(0)?;
            let mut rng =
                Rng((c.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((p as u64 + 1) * 77)) | 1);
            let fasts = |rng: &mut Rng, ctx: &mut Ctx| -> HandlerResult {
                for _ in 0..rng.below(60) {
                    ctx.send(1, (FAST, 0i64))?;
                }
                Ok(())
            };
            for k in 0..c.rounds {
                if c.pairs {
                    let id = (p as usize * c.rounds + k) as i64;
                    sh.permits.acquire().await.unwrap().forget();
                    let signal_first = rng.below(8) == 0;
                    if signal_first {
                        ctx.send(1, (SIGNAL, id))?;
                    }
                    fasts(&mut rng, &mut ctx)?;
                    ctx.send(1, (WAIT, id))?;
                    fasts(&mut rng, &mut ctx)?;
                    match rng.below(6) {
                        0 => ctx.send(1, (TIMER, 0i64))?,
                        1 => ctx.send(1, (NICE, 0i64))?,
                        2 => {
                            ctx.flush();
                            ctx.nice().await;
                        }
                        _ => {}
                    }
                    fasts(&mut rng, &mut ctx)?;
                    if !signal_first {
                        ctx.send(1, (SIGNAL, id))?;
                    }
                } else {
                    for _ in 0..c.maxpar {
                        fasts(&mut rng, &mut ctx)?;
                        ctx.send(1, (MEET, 0i64))?;
                        if rng.below(4) == 0 {
                            ctx.send(1, (TIMER, 0i64))?;
                        }
                    }
                }
                match rng.below(4) {
                    0 => ctx.flush(),
                    1 => ctx.nice().await,
                    2 if rng.below(8) == 0 => ctx.sleep(Duration::from_micros(200)).await,
                    _ => {}
                }
            }
            Ok(())
        }
    })
    .maxpar(c.producers);
    for p in 0..c.producers {
        src.push(p as i64);
    }
    let t = target(c.maxpar, &sh);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &t);
    (g, sh, pairs_total, meets_total)
}

fn run_case(c: Case) {
    let (g, sh, pairs, meets) = graph(c);
    let t0 = Instant::now();
    let r = g
        .run(
            Run::default()
                .threads(c.threads)
                .until_idle()
                .timeout(Duration::from_secs(15)),
        )
        .unwrap();
    let st = r.stats.stage("t").unwrap();
    assert_eq!(
        r.reason,
        EndReason::Idle,
        "{c:?}: the run did not finish after {:?} (waits {}/{pairs}, meets {}/{meets}; \
         t: queued {}, active {}, waiting {}, handled {})",
        t0.elapsed(),
        sh.waits_done.load(SeqCst),
        sh.meets_done.load(SeqCst),
        st.queue_len,
        st.active,
        st.waiting,
        sh.handled.load(SeqCst),
    );
    assert_eq!(sh.waits_done.load(SeqCst), pairs, "{c:?}");
    assert_eq!(sh.meets_done.load(SeqCst), meets, "{c:?}");
    assert_eq!(st.handled as usize, sh.handled.load(SeqCst), "{c:?}");
    assert_eq!(
        (st.active, st.waiting),
        (0, 0),
        "{c:?}: counters at the end"
    );
}

fn cases(pairs: bool, n: u64) -> impl Iterator<Item = Case> {
    (0..n).map(move |i| Case {
        threads: [1, 2, 4][(i % 3) as usize],
        maxpar: 2 + (i / 3 % 3) as usize,
        producers: 1 + (i % 4) as usize,
        rounds: 40,
        pairs,
        seed: i,
    })
}

fn iterations() -> u64 {
    std::env::var("SPLIT_STRESS_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// A WAIT's handler waits for the SIGNAL of a later event of the same stage, among
/// fast events (large split), timers and yields, from several producers.
#[test]
fn waits_on_later_events_of_the_same_stage_always_finish() {
    for c in cases(true, iterations()) {
        run_case(c);
    }
}

/// MEET handlers complete only when `maxpar` of them wait at once: the stage must get
/// all its instances although its calls are fast (large split).
#[test]
fn a_rendezvous_of_maxpar_waiting_instances_always_completes() {
    for c in cases(false, iterations()) {
        run_case(c);
    }
}

/// The same graphs under the simulator (one FIFO ready queue, every wake-up to the
/// back), where different interleavings show.
#[test]
fn the_same_under_the_simulator() {
    for pairs in [true, false] {
        for c in cases(pairs, iterations().min(40)) {
            let (g, sh, pairs_n, meets_n) = graph(c);
            let report = leda_core::sim::Simulation::new(c.seed)
                .until(Duration::from_secs(600))
                .run(&g)
                .expect("simulated run");
            assert_eq!(sh.waits_done.load(SeqCst), pairs_n, "{c:?}");
            assert_eq!(sh.meets_done.load(SeqCst), meets_n, "{c:?}");
            let _ = report;
        }
    }
}

/// Runs `src` → `t` on two threads until idle, within `limit`.
fn run_pair(src: &Stage, t: &Stage, limit: Duration) -> RunReport {
    let mut g = Graph::new("g");
    g.connect(src, 1, t);
    g.run(Run::default().threads(2).until_idle().timeout(limit))
        .unwrap()
}

/// A history of fast calls for the destination (4,000 `FAST` events in batches of
/// 200, yielding between them): its average call, and so its split, comes from these.
async fn fast_history(ctx: &mut Ctx) -> HandlerResult {
    for _ in 0..20 {
        for _ in 0..200 {
            ctx.send(1, (FAST, 0i64))?;
        }
        ctx.flush();
        ctx.nice().await;
    }
    Ok(())
}

/// A synchronous handler that blocks its thread (I/O, a lock) after a history of
/// fast calls: an event sent meanwhile, with a free thread and `maxpar` 2, should not
/// wait behind it for the whole blocking call.
#[test]
fn an_event_does_not_wait_behind_a_blocking_call_with_a_free_instance_slot() {
    let probe_latency = Arc::new(Mutex::new(None::<Duration>));
    let pl = probe_latency.clone();
    let sent_at = Arc::new(Mutex::new(None::<Instant>));
    let sa = sent_at.clone();
    let t = Stage::new("t", move |ev: Event, _ctx: &mut Ctx| {
        match ev.get::<i64>(0)? {
            0 => {}
            1 => std::thread::sleep(Duration::from_millis(1000)),
            _ => {
                let at = sa.lock().unwrap().expect("sent");
                *pl.lock().unwrap() = Some(at.elapsed());
            }
        }
        Ok(())
    })
    .maxpar(2);
    let sa2 = sent_at.clone();
    let src = Stage::asynchronous("src", move |_, mut ctx: Ctx| {
        let sa = sa2.clone();
        async move {
            fast_history(&mut ctx).await?;
            ctx.sleep(Duration::from_millis(50)).await;
            ctx.send(1, 1i64)?;
            ctx.flush();
            ctx.sleep(Duration::from_millis(50)).await;
            *sa.lock().unwrap() = Some(Instant::now());
            ctx.send(1, 2i64)?;
            Ok(())
        }
    })
    .autostart(());
    let r = run_pair(&src, &t, Duration::from_secs(20));
    assert_eq!(r.reason, EndReason::Idle);
    let lat = probe_latency.lock().unwrap().expect("probe handled");
    assert!(
        lat < Duration::from_millis(500),
        "the probe waited {lat:?} behind a blocking call"
    );
}

/// An instance that starts waiting gives its held events back: they need an instance
/// although no event is pushed after (here the other instance has handled its share
/// and released itself). The instance that waits took its share of one producer batch:
/// slow events, then a MEET, then the MEET it waits for, which it gives back.
#[test]
fn events_given_back_by_a_waiting_instance_get_an_instance() {
    for i in 0..20 {
        let met = Arc::new(AtomicUsize::new(0));
        let meet = Arc::new(Rendezvous {
            n: 2,
            state: Mutex::new((0, 0, Vec::new())),
        });
        let m2 = met.clone();
        let t = Stage::asynchronous("t", move |ev: Event, _ctx: Ctx| {
            let (met, meet) = (m2.clone(), meet.clone());
            async move {
                match ev.get::<i64>(0)? {
                    SPIN => {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(100) {
                            std::hint::spin_loop();
                        }
                    }
                    MEET => {
                        Meet {
                            r: meet,
                            generation: None,
                        }
                        .await;
                        met.fetch_add(1, SeqCst);
                    }
                    _ => {}
                }
                Ok(())
            }
        })
        .maxpar(2);
        // One batch: 45 slow events, MEET, FAST, MEET, then 52 fast ones.
        let src = Stage::new("src", |_, ctx: &mut Ctx| {
            for k in 0..100 {
                let kind = match k {
                    0..45 => SPIN,
                    45 | 47 => MEET,
                    _ => FAST,
                };
                ctx.send(1, (kind, 0i64))?;
            }
            Ok(())
        })
        .autostart(());
        let r = run_pair(&src, &t, Duration::from_secs(5));
        let st = r.stats.stage("t").unwrap();
        assert_eq!(
            r.reason,
            EndReason::Idle,
            "iteration {i}: stuck with {} queued, {} active, {} waiting, {} met",
            st.queue_len,
            st.active,
            st.waiting,
            met.load(SeqCst)
        );
        assert_eq!(met.load(SeqCst), 2);
    }
}

/// A synchronous handler that blocks its thread until a later event of the same
/// stage is handled (a rendezvous through a channel), with maxpar 2 and 2 threads,
/// after a history of fast calls. The wait is bounded (3 s) so the test cannot hang.
#[test]
fn a_blocking_handler_waiting_for_a_later_event_of_its_stage_is_not_starved() {
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    let rx = Mutex::new(rx);
    let outcome = Arc::new(Mutex::new(None::<bool>));
    let o2 = outcome.clone();
    let t = Stage::new("t", move |ev: Event, _ctx: &mut Ctx| {
        match ev.get::<i64>(0)? {
            WAIT => {
                let got = rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(3))
                    .is_ok();
                *o2.lock().unwrap() = Some(got);
            }
            SIGNAL => {
                let _ = tx.try_send(());
            }
            _ => {}
        }
        Ok(())
    })
    .maxpar(2);
    let src = Stage::asynchronous("src", move |_, mut ctx: Ctx| async move {
        fast_history(&mut ctx).await?;
        ctx.sleep(Duration::from_millis(50)).await;
        ctx.send(1, (WAIT, 0i64))?;
        ctx.flush();
        ctx.sleep(Duration::from_millis(20)).await;
        ctx.send(1, (SIGNAL, 0i64))?;
        Ok(())
    })
    .autostart(());
    let r = run_pair(&src, &t, Duration::from_secs(20));
    assert_eq!(r.reason, EndReason::Idle);
    assert_eq!(
        *outcome.lock().unwrap(),
        Some(true),
        "the signal was never handled while the waiter blocked (3 s)"
    );
}
