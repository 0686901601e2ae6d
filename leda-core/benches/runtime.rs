//! `cargo bench -p leda-core --bench runtime`: the runtime against raw crossbeam
//! channels and tokio, in the same run, alternating, after a warm-up. Prints one
//! `BENCH` line per comparison (medians of the rounds, with each contender's minimum
//! and maximum: `ours=`, `ours_min=`, `ours_max=`, ...) and a `detail` line per round.
//!
//! Environment: `LEDA_BENCH_EVENTS` (default 5,000,000), `LEDA_BENCH_ROUNDS` (default
//! 3), `LEDA_BENCH_THREADS` (default: one per CPU; every contender gets the same),
//! `LEDA_BENCH_MAXPAR` (our runs' `Run::maxpar`; default: the stages' own, i.e. the
//! thread count).

/// Every contender runs on mimalloc, the allocator the `leda` binary ships with (on
/// glibc's malloc our pipeline-10 is about 30 % slower, and crossbeam's pipeline-2
/// slower too: docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leda_core::prelude::*;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Queue/channel capacity for every contender.
const CAP: usize = 4096;

/// The median, or NaN for a contender that did not run.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs each contender `rounds` times, alternating, and returns each one's figures.
///
/// `LEDA_BENCH_OURS_ONLY=1` runs only our side (the first contender; for profiling),
/// `LEDA_BENCH_PEERS_ONLY=1` only the peers (to check their figures alone); the
/// others report NaN.
fn compare(rounds: usize, contenders: &mut [(&str, &mut dyn FnMut() -> f64)]) -> Vec<Vec<f64>> {
    let ours_only = std::env::var("LEDA_BENCH_OURS_ONLY").is_ok();
    let peers_only = std::env::var("LEDA_BENCH_PEERS_ONLY").is_ok();
    let runs = |i: usize| !(ours_only && i > 0 || peers_only && i == 0);
    for (i, (_, f)) in contenders.iter_mut().enumerate() {
        if runs(i) {
            f(); // warm-up
        }
    }
    let mut results = vec![Vec::new(); contenders.len()];
    for _ in 0..rounds {
        for (i, (name, f)) in contenders.iter_mut().enumerate() {
            if runs(i) {
                let v = f();
                eprintln!("detail {name} {v:.4}");
                results[i].push(v);
            }
        }
    }
    results
}

/// One `BENCH` line: per contender the median of its rounds (`name=`) and their
/// spread (`name_min=`, `name_max=`); a contender that did not run shows NaN.
fn bench_line(scenario: &str, unit: &str, better: &str, names: &[&str], rounds: &[Vec<f64>]) {
    let fields: Vec<String> = names
        .iter()
        .zip(rounds)
        .map(|(n, v)| {
            let min = v.iter().copied().fold(f64::NAN, f64::min);
            let max = v.iter().copied().fold(f64::NAN, f64::max);
            format!(
                "{n}={:.3} {n}_min={min:.3} {n}_max={max:.3}",
                median(v.clone())
            )
        })
        .collect();
    println!(
        "BENCH {scenario} unit={unit} better={better} {}",
        fields.join(" ")
    );
}

// ---------------------------------------------------------------- pipelines (ours)

/// A source stage emitting `n` integers on port 1 with the waiting send.
fn source(n: usize) -> Stage {
    Stage::asynchronous("source", move |_, mut ctx: Ctx| async move {
        for i in 0..n as i64 {
            ctx.send_wait(1, i).await?;
        }
        Ok(())
    })
    .autostart(())
}

fn forwarder(name: String) -> Stage {
    Stage::new(name, |ev: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, ev)?;
        Ok(())
    })
    .capacity(CAP)
}

/// A serial sink that quits after `expect` events (like a consumer thread's loop).
fn counter(name: &str, expect: usize) -> Stage {
    Stage::stateful(
        name,
        |_| Ok(0usize),
        move |seen: &mut usize, _, ctx: &mut Ctx| {
            *seen += 1;
            if *seen == expect {
                ctx.quit(());
            }
            Ok(())
        },
    )
    .serial()
    .capacity(CAP)
}

/// A parallel sink that quits after `expect` events.
fn parallel_counter(name: &str, expect: usize) -> Stage {
    let seen = Arc::new(AtomicUsize::new(0));
    Stage::new(name, move |_, ctx: &mut Ctx| {
        if seen.fetch_add(1, SeqCst) + 1 == expect {
            ctx.quit(());
        }
        Ok(())
    })
    .capacity(CAP)
}

fn run_timed(g: &Graph, threads: usize) -> f64 {
    let t = Instant::now();
    let r = g
        .run({
            let r = Run::default()
                .threads(threads)
                .timeout(Duration::from_secs(300));
            match std::env::var("LEDA_BENCH_MAXPAR") {
                Ok(m) => r.maxpar(m.parse().expect("LEDA_BENCH_MAXPAR")),
                Err(_) => r,
            }
        })
        .expect("run");
    assert_eq!(
        r.reason,
        EndReason::Quit,
        "benchmark run did not finish: {:?}",
        r.stats
    );
    t.elapsed().as_secs_f64()
}

/// Mevents/s through `stages` stages (a source and stages-1 handlers).
fn ours_pipeline(stages: usize, n: usize, threads: usize) -> f64 {
    let mut g = Graph::new("pipeline");
    let mut prev = source(n);
    for i in 1..stages - 1 {
        let next = forwarder(format!("s{i}"));
        g.connect(&prev, 1, &next);
        prev = next;
    }
    g.connect(&prev, 1, &counter("sink", n));
    n as f64 / run_timed(&g, threads) / 1e6
}

fn ours_fan_in(producers: usize, n: usize, threads: usize) -> f64 {
    let mut g = Graph::new("fan-in");
    let sink = counter("sink", n);
    for p in 0..producers {
        let per = n / producers;
        let src = Stage::asynchronous(format!("p{p}"), move |_, mut ctx: Ctx| async move {
            for i in 0..per as i64 {
                ctx.send_wait(1, i).await?;
            }
            Ok(())
        })
        .autostart(());
        g.connect(&src, 1, &sink);
    }
    n as f64 / run_timed(&g, threads) / 1e6
}

// ------------------------------------------------------------- pipelines (peers)

fn crossbeam_pipeline(stages: usize, n: usize) -> f64 {
    let t = Instant::now();
    let (tx0, mut rx) = crossbeam_channel::bounded::<u64>(CAP);
    let mut handles = vec![std::thread::spawn(move || {
        for i in 0..n as u64 {
            tx0.send(i).expect("send");
        }
    })];
    for _ in 1..stages - 1 {
        let (tx, next_rx) = crossbeam_channel::bounded::<u64>(CAP);
        let input = std::mem::replace(&mut rx, next_rx);
        handles.push(std::thread::spawn(move || {
            for v in input {
                tx.send(v).expect("send");
            }
        }));
    }
    let sink = std::thread::spawn(move || rx.iter().count());
    for h in handles {
        h.join().expect("join");
    }
    assert_eq!(sink.join().expect("join"), n);
    n as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn crossbeam_fan_in(producers: usize, n: usize) -> f64 {
    let t = Instant::now();
    let (tx, rx) = crossbeam_channel::bounded::<u64>(CAP);
    let handles: Vec<_> = (0..producers)
        .map(|_| {
            let tx = tx.clone();
            let per = n / producers;
            std::thread::spawn(move || {
                for i in 0..per as u64 {
                    tx.send(i).expect("send");
                }
            })
        })
        .collect();
    drop(tx);
    let count = rx.iter().count();
    for h in handles {
        h.join().expect("join");
    }
    assert_eq!(count, n / producers * producers);
    n as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn tokio_rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .build()
        .expect("tokio")
}

fn tokio_timed<F: Future<Output = ()>>(threads: usize, f: F) -> f64 {
    let rt = tokio_rt(threads);
    let t = Instant::now();
    rt.block_on(f);
    t.elapsed().as_secs_f64()
}

fn tokio_pipeline(stages: usize, n: usize, threads: usize) -> f64 {
    let secs = tokio_timed(threads, async move {
        let (tx0, mut rx) = tokio::sync::mpsc::channel::<u64>(CAP);
        let mut tasks = vec![tokio::spawn(async move {
            for i in 0..n as u64 {
                tx0.send(i).await.expect("send");
            }
        })];
        for _ in 1..stages - 1 {
            let (tx, next_rx) = tokio::sync::mpsc::channel::<u64>(CAP);
            let mut input = std::mem::replace(&mut rx, next_rx);
            tasks.push(tokio::spawn(async move {
                while let Some(v) = input.recv().await {
                    tx.send(v).await.expect("send");
                }
            }));
        }
        let sink = tokio::spawn(async move {
            let mut c = 0;
            while rx.recv().await.is_some() {
                c += 1;
            }
            c
        });
        for t in tasks {
            t.await.expect("join");
        }
        assert_eq!(sink.await.expect("join"), n);
    });
    n as f64 / secs / 1e6
}

fn tokio_fan_in(producers: usize, n: usize, threads: usize) -> f64 {
    let secs = tokio_timed(threads, async move {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(CAP);
        for _ in 0..producers {
            let tx = tx.clone();
            let per = n / producers;
            tokio::spawn(async move {
                for i in 0..per as u64 {
                    tx.send(i).await.expect("send");
                }
            });
        }
        drop(tx);
        let mut c = 0;
        while rx.recv().await.is_some() {
            c += 1;
        }
        assert_eq!(c, n / producers * producers);
    });
    n as f64 / secs / 1e6
}

// ------------------------------------------------------------------------- others

/// ns per event through one parallel stage with maxpar 100.
fn ours_instances(n: usize, threads: usize) -> f64 {
    let mut g = Graph::new("instances");
    let work = parallel_counter("work", n).maxpar(100);
    g.connect(&source(n), 1, &work);
    run_timed(&g, threads) * 1e9 / n as f64
}

/// Mevents/s: one token around a ring of `stages` serial stages, `rounds` times.
fn ours_ring(stages: usize, rounds: usize, threads: usize) -> f64 {
    let hops = stages * rounds;
    let mut g = Graph::new("ring");
    let ring: Vec<Stage> = (0..stages)
        .map(|i| {
            Stage::new(format!("r{i}"), move |ev: Event, ctx: &mut Ctx| {
                let hop: usize = ev.get(0)?;
                if hop + 1 == hops {
                    ctx.quit(());
                } else {
                    ctx.send(1, hop + 1)?;
                }
                Ok(())
            })
            .serial()
        })
        .collect();
    for i in 0..stages {
        g.connect(&ring[i], 1, &ring[(i + 1) % stages]);
    }
    ring[0].push(0usize);
    hops as f64 / run_timed(&g, threads) / 1e6
}

fn tokio_ring(stages: usize, rounds: usize, threads: usize) -> f64 {
    let hops = stages * rounds;
    let secs = tokio_timed(threads, async move {
        let chans: Vec<_> = (0..stages)
            .map(|_| tokio::sync::mpsc::channel::<usize>(CAP))
            .collect();
        let senders: Vec<_> = chans.iter().map(|(tx, _)| tx.clone()).collect();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let done = Arc::new(Mutex::new(Some(done_tx)));
        for (i, (_, mut rx)) in chans.into_iter().enumerate() {
            let next = senders[(i + 1) % stages].clone();
            let done = done.clone();
            tokio::spawn(async move {
                while let Some(hop) = rx.recv().await {
                    if hop + 1 == hops {
                        if let Some(d) = done.lock().expect("lock").take() {
                            let _ = d.send(());
                        }
                    } else if next.send(hop + 1).await.is_err() {
                        return;
                    }
                }
            });
        }
        senders[0].send(0).await.expect("send");
        done_rx.await.expect("done");
    });
    hops as f64 / secs / 1e6
}

/// µs to create, initialise and start one instance: `n` events to a stage whose
/// instances all wait until every one has started, so each event needs a new instance.
fn ours_spawn(n: usize, threads: usize) -> f64 {
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Notify::new());
    let s = Stage::stateful(
        "spawn",
        |_| Ok(vec![0u8; 64]),
        move |_state: &mut Vec<u8>, _, ctx: &mut Ctx| {
            let (started, gate) = (started.clone(), gate.clone());
            let last = started.fetch_add(1, SeqCst) + 1 == n;
            let c2 = ctx.clone();
            ctx.wait(async move {
                if last {
                    gate.notify_waiters();
                    c2.quit(());
                } else {
                    gate.notified().await;
                }
                Ok(())
            });
            Ok(())
        },
    )
    .maxpar(n);
    for i in 0..n {
        s.push(i);
    }
    let mut g = Graph::new("spawn");
    g.add(&s);
    run_timed(&g, threads) * 1e6 / n as f64
}

fn tokio_spawn(n: usize, threads: usize) -> f64 {
    let secs = tokio_timed(threads, async move {
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let done = Arc::new(Mutex::new(Some(done_tx)));
        for _ in 0..n {
            let (started, gate, done) = (started.clone(), gate.clone(), done.clone());
            tokio::spawn(async move {
                let state = vec![0u8; 64];
                std::hint::black_box(&state);
                if started.fetch_add(1, SeqCst) + 1 == n {
                    gate.notify_waiters();
                    if let Some(d) = done.lock().expect("lock").take() {
                        let _ = d.send(());
                    }
                } else {
                    gate.notified().await;
                }
            });
        }
        done_rx.await.expect("done");
    });
    secs * 1e6 / n as f64
}

/// The controller under a step: a stage whose handler blocks for 1 ms gets 500
/// events/s for 2 s, then 5,000 events/s (10×) for 4 s. Returns (seconds after the step
/// until a 200 ms window reaches 90% of the step rate, min and max threads over the
/// last 2 s).
fn controller_step(controller: impl Controller + 'static) -> (f64, usize, usize) {
    const BASE: f64 = 500.0;
    const STEP_AT: f64 = 2.0;
    const END: f64 = 6.0;
    let block = Stage::new("block", |_, _| {
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    })
    .capacity(1 << 20);
    let source = Stage::asynchronous("load", |_, mut ctx: Ctx| async move {
        let t0 = Instant::now();
        let mut sent = 0.0f64;
        loop {
            let t = t0.elapsed().as_secs_f64();
            if t >= END {
                return Ok(());
            }
            let due = if t < STEP_AT {
                BASE * t
            } else {
                BASE * STEP_AT + 10.0 * BASE * (t - STEP_AT)
            };
            while sent < due {
                ctx.send(1, sent as i64)?;
                sent += 1.0;
            }
            ctx.sleep(Duration::from_millis(1)).await;
        }
    })
    .autostart(());
    let mut g = Graph::new("step");
    g.connect(&source, 1, &block);
    let running = g
        .start(Run::default().controller(controller).maxpar(256))
        .expect("start");
    let h = running.handle();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    while t0.elapsed().as_secs_f64() < END {
        std::thread::sleep(Duration::from_millis(100));
        let s = h.snapshot();
        samples.push((
            t0.elapsed().as_secs_f64(),
            s.stage("block").map_or(0, |b| b.handled),
            s.process.threads,
        ));
    }
    h.quit(());
    running.wait().expect("run");
    if std::env::var("LEDA_BENCH_TRACE").is_ok() {
        for w in samples.windows(2) {
            let rate = (w[1].1 - w[0].1) as f64 / (w[1].0 - w[0].0);
            eprintln!("trace t={:.1} rate={rate:.0} threads={}", w[1].0, w[1].2);
        }
    }
    let mut reached = f64::NAN;
    for w in samples.windows(3) {
        let (t_a, n_a, _) = w[0];
        let (t_b, n_b, _) = w[2];
        if t_a >= STEP_AT && (n_b - n_a) as f64 / (t_b - t_a) >= 0.9 * 10.0 * BASE {
            reached = t_b - STEP_AT;
            break;
        }
    }
    let tail: Vec<usize> = samples
        .iter()
        .filter(|s| s.0 >= END - 2.0)
        .map(|s| s.2)
        .collect();
    (
        reached,
        tail.iter().copied().min().unwrap_or(0),
        tail.iter().copied().max().unwrap_or(0),
    )
}

fn main() {
    let n = env("LEDA_BENCH_EVENTS", 5_000_000);
    let rounds = env("LEDA_BENCH_ROUNDS", 3).max(1);
    let threads = env("LEDA_BENCH_THREADS", num_cpus::get()).max(1);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_owned())
        })
        .unwrap_or_default();
    println!(
        "# machine: nproc={} {cpu}; threads={threads} events={n} rounds={rounds}",
        num_cpus::get()
    );

    let only = std::env::var("LEDA_BENCH_ONLY").unwrap_or_default();
    let want = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);

    for stages in [2, 10] {
        if !want(&format!("pipeline-{stages}")) {
            continue;
        }
        let v = compare(
            rounds,
            &mut [
                ("ours", &mut || ours_pipeline(stages, n, threads)),
                ("crossbeam", &mut || crossbeam_pipeline(stages, n)),
                ("tokio", &mut || tokio_pipeline(stages, n, threads)),
            ],
        );
        bench_line(
            &format!("pipeline-{stages}"),
            "Mevents/s",
            "higher",
            &["ours", "crossbeam", "tokio"],
            &v,
        );
    }
    if want("fan-in") {
        let v = compare(
            rounds,
            &mut [
                ("ours", &mut || ours_fan_in(4, n, threads)),
                ("crossbeam", &mut || crossbeam_fan_in(4, n)),
                ("tokio", &mut || tokio_fan_in(4, n, threads)),
            ],
        );
        bench_line(
            "fan-in",
            "Mevents/s",
            "higher",
            &["ours", "crossbeam", "tokio"],
            &v,
        );
    }

    if want("instances-100") {
        let m = (n / 5).max(1);
        let v = compare(rounds, &mut [("ours", &mut || ours_instances(m, threads))]);
        bench_line("instances-100", "ns/event", "lower", &["ours"], &v);
    }

    if want("ring") {
        let ring_n = env("LEDA_BENCH_RING", 1000);
        let v = compare(
            rounds,
            &mut [
                ("ours", &mut || {
                    ours_ring(ring_n, 1_000_000 / ring_n, threads)
                }),
                ("tokio", &mut || {
                    tokio_ring(ring_n, 1_000_000 / ring_n, threads)
                }),
            ],
        );
        bench_line("ring", "Mevents/s", "higher", &["ours", "tokio"], &v);
    }

    if want("controller-step") {
        let (ours, lo, hi) = controller_step(Auto::new(num_cpus::get(), 64));
        println!("# controller-step: auto controller held {lo}..={hi} threads over the last 2 s");
        let (fixed, _, _) = controller_step(Fixed::new(8));
        bench_line(
            "controller-step",
            "s",
            "lower",
            &["ours", "fixed8"],
            &[vec![ours], vec![fixed]],
        );
    }

    if want("spawn") {
        let k = 20_000;
        let v = compare(
            rounds,
            &mut [
                ("ours", &mut || ours_spawn(k, threads)),
                ("tokio", &mut || tokio_spawn(k, threads)),
            ],
        );
        bench_line("spawn", "us/instance", "lower", &["ours", "tokio"], &v);
    }
}
