//! The process runtime: instances, ordering, limits, failures, waiting, backpressure.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leda_core::prelude::*;

fn run_idle(g: &Graph, threads: usize) -> RunReport {
    let r = g
        .run(
            Run::default()
                .threads(threads)
                .until_idle()
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Idle, "run did not go idle");
    r
}

#[test]
fn quit_returns_values() {
    let s = Stage::new("s", |ev: Event, ctx: &mut Ctx| {
        ctx.quit(("done", ev.get::<i64>(0)? + 1));
        Ok(())
    })
    .autostart(41);
    let mut g = Graph::new("g");
    g.add(&s);
    let r = g.run(Run::default().threads(2)).unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    let q = r.quit.unwrap();
    assert_eq!(q.get::<String>(0).unwrap(), "done");
    assert_eq!(q.get::<i64>(1).unwrap(), 42);
}

#[test]
fn serial_stage_keeps_arrival_order_and_one_instance() {
    const N: i64 = 20_000;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inits = Arc::new(AtomicUsize::new(0));
    let producer = Stage::new("producer", |_, ctx: &mut Ctx| {
        let mut ctx2 = ctx.clone();
        ctx.wait(async move {
            for i in 0..N {
                ctx2.send_wait("out", i).await?;
            }
            Ok(())
        });
        Ok(())
    })
    .autostart(());
    let (s2, i2) = (seen.clone(), inits.clone());
    let sink = Stage::stateful(
        "sink",
        move |_| {
            i2.fetch_add(1, SeqCst);
            Ok(Vec::new())
        },
        move |local: &mut Vec<i64>, ev: Event, _| {
            local.push(ev.get(0)?);
            if local.len() as i64 == N {
                *s2.lock().unwrap() = std::mem::take(local);
            }
            Ok(())
        },
    )
    .serial()
    .capacity(64);
    let mut g = Graph::new("g");
    g.connect(&producer, "out", &sink);
    let r = run_idle(&g, 4);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as i64, N, "the persistent state saw every event");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "events out of order");
    assert_eq!(
        inits.load(SeqCst),
        1,
        "a serial stage has exactly one instance"
    );
    assert_eq!(r.stats.stage("sink").unwrap().handled, N as u64);
}

#[test]
fn maxpar_bounds_concurrent_instances_and_instances_are_recycled() {
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let inits = Arc::new(AtomicUsize::new(0));
    let (r2, p2, i2) = (running.clone(), peak.clone(), inits.clone());
    let work = Stage::stateful(
        "work",
        move |_| {
            i2.fetch_add(1, SeqCst);
            Ok(())
        },
        move |_: &mut (), _, _| {
            let now = r2.fetch_add(1, SeqCst) + 1;
            p2.fetch_max(now, SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            r2.fetch_sub(1, SeqCst);
            Ok(())
        },
    )
    .maxpar(3);
    for i in 0..300 {
        work.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&work);
    let r = run_idle(&g, 6);
    assert_eq!(
        peak.load(SeqCst),
        3,
        "maxpar 3 with 6 threads and a backlog"
    );
    assert!(
        inits.load(SeqCst) <= 3,
        "instances are recycled, not rebuilt per event"
    );
    let st = r.stats.stage("work").unwrap();
    assert_eq!(st.handled, 300);
    assert_eq!(st.maxpar, 3);
    assert_eq!(st.active, 0, "an idle run has no active instance");
    assert_eq!(
        st.idle, st.instances,
        "every live instance is back in the idle pool"
    );
}

/// Counts live instance states (a drop decrements).
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

#[test]
fn idle_instances_keep_their_state_and_are_dropped_when_the_run_ends() {
    // A token goes 30 times around a ring of 5 serial stages: every stage is
    // activated 30 times, and between activations its instance is idle. Each one
    // must be the same instance (its count goes on) and none may outlive the run
    // (an idle instance's parked activation holds the process).
    const STAGES: usize = 5;
    const ROUNDS: i64 = 30;
    let live = Arc::new(AtomicUsize::new(0));
    let inits = Arc::new(AtomicUsize::new(0));
    let counts = Arc::new(Mutex::new(Vec::new()));
    let ring: Vec<Stage> = (0..STAGES)
        .map(|i| {
            let (live, inits, counts) = (live.clone(), inits.clone(), counts.clone());
            Stage::stateful(
                format!("r{i}"),
                move |_| {
                    inits.fetch_add(1, SeqCst);
                    live.fetch_add(1, SeqCst);
                    Ok((0i64, Live(live.clone())))
                },
                move |state: &mut (i64, Live), ev: Event, ctx: &mut Ctx| {
                    state.0 += 1;
                    let hop: i64 = ev.get(0)?;
                    if hop >= (ROUNDS - 1) * STAGES as i64 {
                        // The last round: each stage's last event.
                        counts.lock().unwrap().push(state.0);
                    }
                    if hop + 1 == ROUNDS * STAGES as i64 {
                        ctx.quit(());
                    } else {
                        ctx.send(1, hop + 1)?;
                    }
                    Ok(())
                },
            )
            .serial()
        })
        .collect();
    let mut g = Graph::new("ring");
    for i in 0..STAGES {
        g.connect(&ring[i], 1, &ring[(i + 1) % STAGES]);
    }
    ring[0].push(0i64);
    let r = g
        .run(Run::default().threads(2).timeout(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(inits.load(SeqCst), STAGES, "one instance per serial stage");
    assert_eq!(
        *counts.lock().unwrap(),
        vec![ROUNDS; STAGES],
        "each instance saw all its {ROUNDS} events"
    );
    assert_eq!(
        live.load(SeqCst),
        0,
        "every instance is dropped once the run has ended"
    );
}

/// A lone event pushed on an empty queue goes straight to a new activation; it must
/// stop counting against the capacity as it starts, as an event an instance takes
/// from its queue does: a capacity-1 parallel stage that passes a countdown to itself
/// must never find its own queue full.
#[test]
fn a_capacity_one_stage_can_send_to_itself() {
    let refused = Arc::new(Mutex::new(Vec::<String>::new()));
    let r2 = refused.clone();
    let s = Stage::new("loop", move |ev: Event, ctx: &mut Ctx| {
        let n: i64 = ev.get(0)?;
        if n == 0 {
            ctx.quit("done");
        } else if let Err(e) = ctx.send(1, n - 1) {
            r2.lock().unwrap().push(format!("at {n}: {e}"));
            ctx.quit("refused");
        }
        Ok(())
    })
    .capacity(1)
    .maxpar(2)
    .autostart(200i64);
    let mut g = Graph::new("g");
    g.connect(&s, 1, &s);
    let r = g
        .run(Run::default().threads(2).timeout(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(*refused.lock().unwrap(), Vec::<String>::new());
    assert_eq!(r.quit.unwrap().get::<String>(0).unwrap(), "done");
}

/// A serial stage that sends to itself forever must still let another ready stage run
/// on a one-thread pool: when its budget runs out its next event is still in its own
/// outbox, and the queue looked empty.
#[test]
fn a_stage_sending_to_itself_lets_other_stages_run() {
    let loops = Arc::new(AtomicUsize::new(0));
    let l2 = loops.clone();
    let looper = Stage::new("loop", move |ev: Event, ctx: &mut Ctx| {
        l2.fetch_add(1, SeqCst);
        ctx.send(1, ev)?;
        Ok(())
    })
    .serial()
    .autostart(0i64);
    let quitter = Stage::new("quitter", |_, ctx: &mut Ctx| {
        ctx.quit("ran");
        Ok(())
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.connect(&looper, 1, &looper);
    g.add(&quitter);
    let r = g
        .run(Run::default().threads(1).timeout(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        r.reason,
        EndReason::Quit,
        "the other stage never ran ({} loop events)",
        loops.load(SeqCst)
    );
}

#[test]
fn handler_errors_and_panics_kill_only_that_instance_and_reach_the_error_port() {
    let inits = Arc::new(AtomicUsize::new(0));
    let i2 = inits.clone();
    let fragile = Stage::stateful(
        "fragile",
        move |_| {
            i2.fetch_add(1, SeqCst);
            Ok(())
        },
        |_: &mut (), ev: Event, ctx: &mut Ctx| {
            let x: i64 = ev.get(0)?;
            if x % 10 == 3 {
                return Err(format!("bad value {x}").into());
            }
            if x % 10 == 7 {
                panic!("boom {x}");
            }
            ctx.send("ok", x)?;
            Ok(())
        },
    )
    .serial();
    let oks = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let o2 = oks.clone();
    let good = Stage::new("good", move |_, _| {
        o2.fetch_add(1, SeqCst);
        Ok(())
    });
    let e2 = errors.clone();
    let errs = Stage::new("errors", move |ev: Event, _| {
        let stage: String = ev.get(0)?;
        let msg: String = ev.get(1)?;
        let value: i64 = ev.get(2)?;
        e2.lock().unwrap().push((stage, msg, value));
        Ok(())
    });
    for i in 0..100 {
        fragile.push(i);
    }
    let mut g = Graph::new("g");
    g.connect(&fragile, "ok", &good);
    g.connect(&fragile, "error", &errs);
    let r = run_idle(&g, 2);
    assert_eq!(oks.load(SeqCst), 80);
    let mut errors = errors.lock().unwrap().clone();
    errors.sort_by_key(|e| e.2);
    assert_eq!(errors.len(), 20);
    assert_eq!(errors[0], ("fragile".into(), "bad value 3".into(), 3));
    assert_eq!(errors[1].2, 7);
    assert!(errors[1].1.contains("panic: boom 7"), "{:?}", errors[1]);
    let st = r.stats.stage("fragile").unwrap();
    assert_eq!(st.errors, 20);
    assert_eq!(st.handled, 100);
    assert_eq!(
        inits.load(SeqCst),
        21,
        "each failure destroys the instance; the next is rebuilt"
    );
}

/// A fail-stop stage is never rebuilt: after its instance's first failure, its queued
/// events and every later one fail (counted, to the `error` port, with the first
/// failure as the reason) without reaching a handler or `init`; the other stages go on.
#[test]
fn a_fail_stop_stage_stops_at_its_first_failure() {
    let inits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (i2, s2) = (inits.clone(), seen.clone());
    let node = Stage::stateful(
        "node",
        move |_| {
            i2.fetch_add(1, SeqCst);
            Ok(0i64)
        },
        move |count: &mut i64, ev: Event, _: &mut Ctx| {
            let x: i64 = ev.get(0)?;
            *count += 1;
            s2.lock().unwrap().push((x, *count));
            if x == 3 {
                return Err("lost the token".into());
            }
            Ok(())
        },
    )
    .fail_stop();
    assert!(node.is_fail_stop() && node.is_serial());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    // Serial: the reports are checked in the order they were sent.
    let errs = Stage::new("errors", move |ev: Event, _| {
        e2.lock()
            .unwrap()
            .push((ev.get::<String>(1)?, ev.get::<i64>(2)?));
        Ok(())
    })
    .serial();
    for i in 1..=6 {
        node.push(i);
    }
    let mut g = Graph::new("g");
    g.connect(&node, "error", &errs);
    let r = run_idle(&g, 2);
    assert_eq!(inits.load(SeqCst), 1, "never rebuilt");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(1, 1), (2, 2), (3, 3)],
        "no handler call after the failure (a rebuilt instance would count from 1)"
    );
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 4);
    assert_eq!(errors[0], ("lost the token".into(), 3));
    for (why, x) in &errors[1..] {
        assert!(
            why == "stage 'node' stopped after a failure: lost the token" && *x > 3,
            "{why} {x}"
        );
    }
    let st = r.stats.stage("node").unwrap();
    assert_eq!((st.errors, st.handled), (4, 6));
}

/// A panic in a stage's `init` is an instance-creation failure: each event that
/// needed the instance goes to the `error` port as a handler failure would, no worker
/// thread is lost (another stage keeps running on the one worker), and the next
/// event tries `init` again.
#[test]
fn a_panicking_init_is_reported_like_a_handler_error() {
    let inits = Arc::new(AtomicUsize::new(0));
    let i2 = inits.clone();
    let broken = Stage::stateful(
        "broken",
        move |_| -> Result<(), BoxError> {
            i2.fetch_add(1, SeqCst);
            panic!("init cannot start");
        },
        |_: &mut (), _ev: Event, _ctx: &mut Ctx| Ok(()),
    );
    let oks = Arc::new(AtomicUsize::new(0));
    let o2 = oks.clone();
    let fine = Stage::new("fine", move |_, _| {
        o2.fetch_add(1, SeqCst);
        Ok(())
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let errs = Stage::new("errors", move |ev: Event, _| {
        e2.lock().unwrap().push(ev.get::<String>(1)?);
        Ok(())
    });
    for i in 0..5 {
        broken.push(i);
        fine.push(i);
    }
    let mut g = Graph::new("g");
    g.connect(&broken, "error", &errs);
    g.add(&fine);
    let r = g
        .run(
            Run::default()
                .threads(1)
                .until_idle()
                .timeout(Duration::from_secs(20)),
        )
        .expect("run");
    assert_eq!(
        r.reason,
        EndReason::Idle,
        "ended by idleness, not the timeout"
    );
    assert_eq!(oks.load(SeqCst), 5, "the only worker survived");
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(
        errors[0].contains("init failed: panic: init cannot start"),
        "{errors:?}"
    );
    assert_eq!(inits.load(SeqCst), 5, "init is tried again for each event");
    assert_eq!(r.stats.stage("broken").unwrap().errors, 5);
}

#[test]
fn send_errors_say_why() {
    let result = Arc::new(Mutex::new(Vec::new()));
    let r2 = result.clone();
    let src = Stage::new("src", move |_, ctx: &mut Ctx| {
        let mut out = r2.lock().unwrap();
        out.push(ctx.send("nowhere", 1).unwrap_err());
        out.push(
            ctx.send(
                "dec",
                Event::new().attach(std::fs::File::open("/dev/null")?),
            )
            .unwrap_err(),
        );
        // The same attachment travels on a local connector.
        ctx.send("loc", Event::new().attach(String::from("resource")))?;
        Ok(())
    })
    .autostart(());
    let got = Arc::new(Mutex::new(None));
    let g2 = got.clone();
    let loc = Stage::new("loc", move |mut ev: Event, _| {
        *g2.lock().unwrap() = ev.take_attachment::<String>();
        Ok(())
    });
    let dec = Stage::new("dec", |_, _| Ok(()));
    let mut g = Graph::new("g");
    g.connect(&src, "dec", &dec);
    g.connect(&src, "loc", &loc).local();
    run_idle(&g, 2);
    let errs = result.lock().unwrap();
    assert_eq!(
        errs[0],
        SendError::NotConnected {
            stage: "src".into(),
            port: "nowhere".into()
        }
    );
    assert_eq!(
        errs[1],
        SendError::AttachmentOnDecoupled {
            stage: "src".into(),
            port: "dec".into()
        }
    );
    assert_eq!(got.lock().unwrap().as_deref(), Some("resource"));
}

#[test]
fn backpressure_accounting_loses_nothing() {
    const N: u64 = 50_000;
    let accepted = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let (a2, r2) = (accepted.clone(), rejected.clone());
    let src = Stage::new("src", move |_, ctx: &mut Ctx| {
        for i in 0..N {
            match ctx.send(1, i) {
                Ok(()) => a2.fetch_add(1, SeqCst),
                Err(SendError::QueueFull { stage }) => {
                    assert_eq!(&*stage, "slow");
                    r2.fetch_add(1, SeqCst)
                }
                Err(e) => return Err(e.into()),
            };
        }
        Ok(())
    })
    .autostart(());
    let received = Arc::new(AtomicUsize::new(0));
    let rc = received.clone();
    let slow = Stage::new("slow", move |_, _| {
        rc.fetch_add(1, SeqCst);
        std::hint::black_box((0..200).sum::<u64>());
        Ok(())
    })
    .capacity(100)
    .maxpar(1);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &slow);
    let r = run_idle(&g, 2);
    let (a, rj, rc) = (
        accepted.load(SeqCst),
        rejected.load(SeqCst),
        received.load(SeqCst),
    );
    assert_eq!(a + rj, N as usize, "sent = accepted + rejected");
    assert_eq!(rc, a, "every accepted event was handled");
    assert!(
        rj > 0,
        "a 100-slot queue must have refused some of {N} events"
    );
    let st = r.stats.stage("slow").unwrap();
    assert_eq!(st.rejected, rj as u64);
    assert_eq!(st.events_in, a as u64);
    assert_eq!(st.handled, a as u64);
}

#[test]
fn waiting_instances_do_not_hold_threads() {
    let done = Arc::new(AtomicUsize::new(0));
    let d2 = done.clone();
    let sleeper = Stage::asynchronous("sleeper", move |_, ctx: Ctx| {
        let d = d2.clone();
        async move {
            ctx.sleep(Duration::from_millis(100)).await;
            d.fetch_add(1, SeqCst);
            Ok(())
        }
    })
    .maxpar(100);
    for i in 0..100 {
        sleeper.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&sleeper);
    let t = Instant::now();
    let r = run_idle(&g, 1);
    let took = t.elapsed();
    assert_eq!(done.load(SeqCst), 100);
    // Serialized on one thread this would take 10 s.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let st = r.stats.stage("sleeper").unwrap();
    assert!(
        st.created > 1 && st.created <= 100,
        "created {}",
        st.created
    );
    assert_eq!(st.handled, 100);
}

#[test]
fn waiting_serial_stage_keeps_order() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let s = Stage::asynchronous("s", move |ev: Event, ctx: Ctx| {
        let seen = s2.clone();
        async move {
            let i: i64 = ev.get(0)?;
            ctx.sleep(Duration::from_millis((5 - i % 5) as u64)).await;
            ctx.nice().await;
            seen.lock().unwrap().push(i);
            Ok(())
        }
    })
    .serial();
    for i in 0..20 {
        s.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&s);
    run_idle(&g, 3);
    assert_eq!(*seen.lock().unwrap(), (0..20).collect::<Vec<i64>>());
}

#[test]
fn cohort_runs_the_receiver_on_the_sending_thread() {
    let result = Arc::new(Mutex::new(Vec::new()));
    let r2 = result.clone();
    let caller = Stage::new("caller", move |_, ctx: &mut Ctx| {
        let me = std::thread::current().id();
        let r = ctx.send("call", format!("{me:?}"));
        r2.lock().unwrap().push(format!("send={r:?}"));
        Ok(())
    })
    .autostart(());
    let r3 = result.clone();
    let callee = Stage::new("callee", move |ev: Event, _| {
        let caller_thread: String = ev.get(0)?;
        let same = caller_thread == format!("{:?}", std::thread::current().id());
        r3.lock().unwrap().push(format!("same_thread={same}"));
        Ok(())
    });
    let mut g = Graph::new("g");
    g.connect(&caller, "call", &callee).cohort();
    run_idle(&g, 2);
    // The callee ran (and finished) inside the caller's send.
    assert_eq!(
        *result.lock().unwrap(),
        vec!["same_thread=true".to_string(), "send=Ok(())".into()]
    );
}

#[test]
fn cohort_without_a_free_instance_fails_with_a_reason() {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    // The callee calls back into the caller's stage, whose only instance is busy.
    let a = Stage::new("a", move |ev: Event, ctx: &mut Ctx| {
        if ev.get::<i64>(0)? == 0 {
            ctx.send("call", 1)?;
        }
        Ok(())
    })
    .serial()
    .autostart(0);
    let b = Stage::new("b", move |ev: Event, ctx: &mut Ctx| {
        if let Err(e) = ctx.send("back", ev.get::<i64>(0)?) {
            e2.lock().unwrap().push(e);
        }
        Ok(())
    });
    let mut g = Graph::new("g");
    g.connect(&a, "call", &b).cohort();
    g.connect(&b, "back", &a).cohort();
    run_idle(&g, 1);
    assert_eq!(
        *errors.lock().unwrap(),
        vec![SendError::CohortUnavailable { stage: "a".into() }]
    );
}

#[test]
fn stats_file_has_json_lines() {
    let dir = std::env::temp_dir().join(format!("leda-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stats.jsonl");
    let s = Stage::asynchronous("tick", |_, ctx: Ctx| async move {
        ctx.sleep(Duration::from_millis(30)).await;
        Ok(())
    });
    for i in 0..10 {
        s.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&s);
    let r = g
        .run(
            Run::default()
                .threads(1)
                .maxpar(1)
                .until_idle()
                .stats_file(&path, Duration::from_millis(50)),
        )
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<leda_core::stats::Snapshot> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 3, "{} lines", lines.len());
    assert!(lines.windows(2).all(|w| w[0].time < w[1].time));
    assert_eq!(lines.last().unwrap().stage("tick").unwrap().handled, 10);
    assert_eq!(r.stats.process.threads, 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn auto_controller_grows_the_pool_for_blocking_handlers() {
    let block = Stage::new("block", |_, _| {
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    });
    for i in 0..3000 {
        block.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&block);
    let r = g
        .run(
            Run::default()
                .controller(Auto::new(1, 16))
                .until_idle()
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Idle);
    assert_eq!(r.stats.stage("block").unwrap().handled, 3000);
    assert!(
        r.stats.process.threads > 1,
        "the controller never grew the pool"
    );
}

/// A few calls that block for long are too few for the sampled worker time to see
/// (one call in 64 is timed, once it ends): the pool still grows while every worker is
/// busy, off the CPU, and events wait — with the stage's default `maxpar`, which follows
/// the pool. Before, the pool stayed at its minimum of 2 for the whole run.
#[test]
fn auto_controller_grows_the_pool_for_a_few_long_blocking_calls() {
    let block = Stage::new("block", |_, _| {
        std::thread::sleep(Duration::from_millis(400));
        Ok(())
    });
    for i in 0..24 {
        block.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&block);
    let running = g
        .start(
            Run::default()
                .controller(Auto::new(2, 16))
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    let h = running.handle();
    let mut most = 0;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        most = most.max(h.snapshot().process.threads);
    }
    h.quit(());
    running.wait().unwrap();
    assert!(
        most >= 4,
        "the pool reached {most} with every worker blocked (maxpar follows the pool; queued events start the instances it allows)"
    );
}

#[test]
fn rust_and_async_stages_mix_in_a_pipeline_with_nice() {
    let total = Arc::new(AtomicUsize::new(0));
    let t2 = total.clone();
    let gen_ = Stage::asynchronous("gen", |ev: Event, mut ctx: Ctx| async move {
        let n: usize = ev.get(0)?;
        for i in 0..n {
            ctx.send_wait("out", i).await?;
            if i % 100 == 0 {
                ctx.nice().await;
            }
        }
        Ok(())
    })
    .autostart(1000);
    let double = Stage::new("double", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev.get::<i64>(0)? * 2)?;
        Ok(())
    })
    .capacity(16);
    let sum = Stage::new("sum", move |ev: Event, _| {
        t2.fetch_add(ev.get::<usize>(0)?, SeqCst);
        Ok(())
    });
    let mut g = Graph::new("g");
    g.connect(&gen_, "out", &double);
    g.connect(&double, 1, &sum);
    let r = run_idle(&g, 2);
    assert_eq!(total.load(SeqCst), 999 * 1000);
    let c = r
        .stats
        .connectors
        .iter()
        .find(|c| c.from == "double")
        .unwrap();
    assert_eq!(c.events, 1000);
    assert_eq!(r.stats.stage("double").unwrap().events_out, 1000);
}

/// Sends switch between ports in runs of every length: each connector's count (kept
/// per route, the last port's apart) is exact once the run ends.
#[test]
fn sent_counts_are_exact_per_port_when_sends_switch_ports() {
    let n = 3000i64;
    let router = Stage::new("router", |ev: Event, ctx: &mut Ctx| {
        let i: i64 = ev.get(0)?;
        // Port a gets runs of growing length, b and c one event each in between.
        let port = match i % 7 {
            0 => "b",
            3 => "c",
            _ => "a",
        };
        ctx.send(port, i)?;
        Ok(())
    })
    .serial();
    let mut g = Graph::new("g");
    let sinks: Vec<Stage> = ["a", "b", "c"]
        .iter()
        .map(|p| Stage::new(format!("sink_{p}"), |_: Event, _: &mut Ctx| Ok(())))
        .collect();
    for (p, sink) in ["a", "b", "c"].iter().zip(&sinks) {
        g.connect(&router, *p, sink);
    }
    for i in 0..n {
        router.push(i);
    }
    let r = run_idle(&g, 2);
    let count = |p: &str| {
        let expect = (0..n)
            .filter(|i| match p {
                "b" => i % 7 == 0,
                "c" => i % 7 == 3,
                _ => i % 7 != 0 && i % 7 != 3,
            })
            .count() as u64;
        let c = r
            .stats
            .connectors
            .iter()
            .find(|c| c.to == format!("sink_{p}"))
            .unwrap();
        assert_eq!(c.events, expect, "connector to sink_{p}");
        assert_eq!(r.stats.stage(&format!("sink_{p}")).unwrap().handled, expect);
    };
    for p in ["a", "b", "c"] {
        count(p);
    }
    assert_eq!(r.stats.stage("router").unwrap().events_out, n as u64);
}

/// Random runs of sends on local, decoupled, cohort and unconnected ports, with every
/// kind of refusal, through send / try_send / send_or_wait, a clone in a wait and a
/// clone on a plain thread: each connector counts exactly the successful sends.
#[test]
fn sent_counts_exact_with_failures_clones_and_foreign_threads() {
    use std::collections::HashMap;
    let ok = Arc::new(Mutex::new(HashMap::<&'static str, u64>::new()));
    let o = ok.clone();
    let add = move |o: &Mutex<HashMap<&'static str, u64>>, p, r: Result<(), SendError>| match r {
        Ok(()) => *o.lock().unwrap().entry(p).or_default() += 1,
        Err(SendError::Stopped) => panic!("stopped"),
        Err(_) => {}
    };
    let router = Stage::new("router", move |ev: Event, ctx: &mut Ctx| {
        let mut h: u64 = ev.get::<u64>(0)?.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..1 + (h >> 58) {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            let p = ["a", "a", "a", "a", "a2", "b", "b", "c", "r", "x"][(h % 10) as usize];
            match (h >> 8) % 6 {
                0 => add(&o, p, ctx.send(p, Event::new().with(1).attach(7u8))),
                1 => add(&o, p, ctx.try_send(p, 1).map_err(|r| r.error)),
                2 if !matches!(p, "c" | "x") => add(&o, p, ctx.send_or_wait(p, 1)),
                _ => add(&o, p, ctx.send(p, 1)),
            }
        }
        if h.is_multiple_of(23) {
            let (mut c2, o2) = (ctx.clone(), o.clone());
            ctx.wait(async move {
                for j in 0..100 {
                    let p = if j % 3 == 0 { "b" } else { "a" };
                    add(&o2, p, c2.send_wait(p, j).await);
                }
                Ok(())
            });
        } else if h % 23 == 1 {
            let (mut c2, o2) = (ctx.clone(), o.clone());
            std::thread::spawn(move || {
                for j in 0..70 {
                    let p = if j % 5 == 0 { "a2" } else { "b" };
                    add(&o2, p, c2.send(p, j));
                }
            })
            .join()
            .unwrap();
        }
        Ok(())
    })
    .maxpar(3);
    let sink = |n: &str| Stage::new(n, |_: Event, _: &mut Ctx| Ok(()));
    let (a, b, c, r) = (
        sink("sa").capacity(64).maxpar(1),
        sink("sb"),
        sink("sc").serial(),
        sink("sr").capacity(8).serial(),
    );
    let mut g = Graph::new("g");
    g.connect(&router, "a", &a).local();
    g.connect(&router, "a2", &a);
    g.connect(&router, "b", &b);
    g.connect(&router, "c", &c).cohort();
    g.connect(&router, "r", &r);
    for i in 0..4000u64 {
        router.push(i);
    }
    let rep = run_idle(&g, 3);
    let ok = ok.lock().unwrap();
    let n = |p: &str| ok.get(p).copied().unwrap_or(0);
    for c in &rep.stats.connectors {
        assert_eq!(c.events, n(&c.port), "connector on port {}", c.port);
    }
    for (s, want) in [
        ("sa", n("a") + n("a2")),
        ("sb", n("b")),
        ("sc", n("c")),
        ("sr", n("r")),
    ] {
        let st = rep.stats.stage(s).unwrap();
        assert_eq!((st.events_in, st.handled), (want, want), "stage {s}");
    }
    assert_eq!(
        rep.stats.stage("router").unwrap().events_out,
        ok.values().sum::<u64>()
    );
}

#[test]
fn events_injected_through_a_process_handle_are_handled() {
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let sink = Stage::new("sink", move |ev: Event, ctx: &mut Ctx| {
        if ev.get::<i64>(0)? == -1 {
            ctx.quit("stop");
        } else {
            s2.fetch_add(1, SeqCst);
        }
        Ok(())
    })
    .serial();
    let mut g = Graph::new("g");
    g.add(&sink);
    let running = g.start(Run::default().threads(2)).unwrap();
    let h = running.handle();
    let idx = h.stage_index("sink").unwrap();
    assert_eq!(h.stage_index("nope"), None);
    for i in 0..1000 {
        h.inject(idx, Event::from(i)).unwrap();
    }
    h.inject(idx, Event::from(-1)).unwrap();
    let r = running.wait().unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(seen.load(SeqCst), 1000);
    assert_eq!(r.stats.stage("sink").unwrap().events_in, 1001);
    let err = h.inject(idx, Event::from(5)).unwrap_err();
    assert_eq!(err.error, SendError::Stopped);
}

/// Batched sends and batched takes under backpressure: a synchronous producer that
/// outruns two small serial queues loses nothing and the order holds end to end.
#[test]
fn batched_sends_keep_order_through_full_queues() {
    const N: i64 = 20_000;
    let src = Stage::new("src", |_, ctx: &mut Ctx| {
        for i in 0..N {
            ctx.send_or_wait(1, i)?;
        }
        Ok(())
    })
    .autostart(());
    let mid = Stage::new("mid", |ev: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, ev)?;
        Ok(())
    })
    .serial()
    .capacity(16);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let sink = Stage::new("sink", move |ev: Event, _| {
        s2.lock().unwrap().push(ev.get::<i64>(0)?);
        Ok(())
    })
    .serial()
    .capacity(8);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &mid);
    g.connect(&mid, 1, &sink);
    let r = run_idle(&g, 2);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as i64, N, "every event arrived");
    assert!(seen.windows(2).all(|w| w[0] + 1 == w[1]), "order kept");
    for name in ["mid", "sink"] {
        let st = r.stats.stage(name).unwrap();
        assert_eq!((st.events_in, st.handled), (N as u64, N as u64), "{name}");
        assert_eq!(st.queue_len, 0, "{name}");
    }
}

/// A chain of tiny bounded queues (capacities 1 and 2, serial and parallel stages) fed
/// by waiting senders: synchronous handlers use `send_or_wait`, async ones `send_wait`.
/// A sender parked on a full queue must be woken when the queue's consumer takes from
/// it, whichever way the room is made (the event popped by a take, held events settled
/// or given back). The sink counts the events `0..n` that reach it and sums them.
fn waiting_chain_graph(n: i64) -> (Graph, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let src = Stage::new("src", move |_, ctx: &mut Ctx| {
        for i in 0..n {
            ctx.send_or_wait(1, i)?;
        }
        Ok(())
    })
    .autostart(());
    // Parallel, capacity 1: every take pops the only queued event.
    let a = Stage::new("a", |ev: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, ev)?;
        Ok(())
    })
    .capacity(1)
    .maxpar(2);
    let b = Stage::asynchronous("b", |ev: Event, mut ctx: Ctx| async move {
        ctx.send_wait(1, ev).await?;
        Ok(())
    })
    .serial()
    .capacity(2);
    let c = Stage::new("c", |ev: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, ev)?;
        Ok(())
    })
    .serial()
    .capacity(1);
    let d = Stage::asynchronous("d", |ev: Event, mut ctx: Ctx| async move {
        ctx.send_wait(1, ev).await?;
        Ok(())
    })
    .capacity(2)
    .maxpar(2);
    let seen = Arc::new(AtomicUsize::new(0));
    let sum = Arc::new(AtomicUsize::new(0));
    let (s2, sum2) = (seen.clone(), sum.clone());
    let sink = Stage::new("sink", move |ev: Event, _| {
        s2.fetch_add(1, SeqCst);
        sum2.fetch_add(usize::try_from(ev.get::<i64>(0)?)?, SeqCst);
        std::hint::black_box((0..50).sum::<u64>());
        Ok(())
    })
    .serial()
    .capacity(1);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &a);
    g.connect(&a, 1, &b);
    g.connect(&b, 1, &c);
    g.connect(&c, 1, &d);
    g.connect(&d, 1, &sink);
    (g, seen, sum)
}

/// Runs [`waiting_chain_graph`] on `threads` workers; returns the events that reached
/// the sink.
fn waiting_chain(threads: usize, n: i64) -> i64 {
    let (g, seen, _) = waiting_chain_graph(n);
    let r = g
        .run(
            Run::default()
                .threads(threads)
                .until_idle()
                .timeout(Duration::from_secs(20)),
        )
        .unwrap();
    assert_eq!(
        r.reason,
        EndReason::Idle,
        "a parked sender was never woken ({} of {n} events arrived)",
        seen.load(SeqCst)
    );
    seen.load(SeqCst) as i64
}

/// The same chain under the simulator: one FIFO ready queue, so every woken or yielded
/// task runs only after all the tasks already ready (the worker pool runs a task woken
/// during its own poll next instead); a lost wake-up that only that order hides shows
/// up here as events that never arrive.
#[test]
fn waiting_senders_progress_when_every_wake_up_goes_to_the_back() {
    const N: usize = 2_000;
    let (g, seen, sum) = waiting_chain_graph(N as i64);
    let report = leda_core::sim::Simulation::new(1)
        .run(&g)
        .expect("simulated run");
    assert_eq!(
        seen.load(SeqCst),
        N,
        "a parked sender was never woken ({} of {N} events arrived)",
        seen.load(SeqCst)
    );
    assert_eq!(sum.load(SeqCst), N * (N - 1) / 2, "each event arrived once");
    let errors: u64 = report
        .processes
        .iter()
        .flat_map(|(_, r)| r.stats.stages.iter())
        .map(|s| s.errors)
        .sum();
    assert_eq!(errors, 0, "no handler failed");
}

/// Regression: a sender parked by `send_or_wait`/`send_wait` on a full queue stayed
/// parked forever although the queue had room (the take that popped the last event
/// woke nobody). The run is also bounded from outside, so a hang fails the test.
#[test]
fn parked_senders_are_woken_when_small_queues_drain() {
    const N: i64 = 5_000;
    for threads in [1, 2] {
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let _ = tx.send(waiting_chain(threads, N));
        });
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(got) => assert_eq!(got, N, "{threads} thread(s): every event arrived"),
            Err(_) => {
                // The worker panicked (its message is in the join error) or hung.
                if worker.is_finished() {
                    let e = worker.join().unwrap_err();
                    std::panic::resume_unwind(e);
                }
                panic!("{threads} thread(s): the run hung past its own timeout");
            }
        }
        worker.join().unwrap();
    }
}

/// A handler that runs long between sends (a source pacing itself) makes its events
/// leave with `Ctx::flush`, before it returns: the receiving stage handles the first
/// one while the sender still waits for it (without the flush it would wait for ever:
/// the event is held in the sender's batch until its call ends).
#[test]
fn flush_sends_what_a_long_handler_sent_so_far() {
    let seen = Arc::new(AtomicUsize::new(0));
    let got = seen.clone();
    let sink = Stage::new("sink", move |_: Event, _: &mut Ctx| {
        got.fetch_add(1, SeqCst);
        Ok(())
    });
    let waited = seen.clone();
    let source = Stage::new("source", move |_: Event, ctx: &mut Ctx| {
        ctx.send(1, 1)?;
        ctx.flush();
        let deadline = Instant::now() + Duration::from_secs(20);
        while waited.load(SeqCst) == 0 {
            if Instant::now() > deadline {
                return Err("the flushed event was not handled while its sender ran".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        ctx.quit("handled");
        Ok(())
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.connect(&source, 1, &sink);
    let r = g
        .run(Run::default().threads(2).timeout(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit, "{:?}", r.reason);
    assert_eq!(r.quit.unwrap().get::<String>(0).unwrap(), "handled");
}

/// Work a stage carries on outside its handler calls (a thread of its own sending through a
/// clone of its `Ctx`) keeps a run that ends when idle going while its `Busy` guard lives:
/// the late event arrives and the run ends idle after it (without the guard the run ended
/// at once, the event unsent).
#[test]
fn a_busy_guard_keeps_an_idle_run_going_until_the_work_outside_is_sent() {
    let got = Arc::new(AtomicUsize::new(0));
    let outside = Stage::new("outside", |_: Event, ctx: &mut Ctx| {
        let mut out = ctx.clone();
        let busy = ctx.busy();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            out.send("late", 7i64).unwrap();
            drop(busy);
        });
        Ok(())
    })
    .autostart(());
    let seen = got.clone();
    let sink = Stage::new("sink", move |ev: Event, _: &mut Ctx| {
        seen.fetch_add(ev.get::<i64>(0)? as usize, SeqCst);
        Ok(())
    });
    let mut g = Graph::new("g");
    g.add(&outside);
    g.add(&sink);
    g.connect(&outside, "late", &sink);
    let started = Instant::now();
    run_idle(&g, 2);
    assert_eq!(got.load(SeqCst), 7, "the late event was not handled");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// A handler that refuses an event with `BadEvent` fails that event alone (counted as the
/// stage's error): the instance keeps its state, and a fail-stop stage does not stop
/// (with a plain error it would have, and 2 and 3 would have failed too).
#[test]
fn a_bad_event_fails_alone_and_keeps_the_instance() {
    let total = Stage::stateful(
        "total",
        |_: &Attrs| Ok(0i64),
        |sum: &mut i64, ev: Event, ctx: &mut Ctx| {
            let x: i64 = ev.get(0).map_err(leda_core::error::BadEvent::new)?;
            *sum += x;
            if x == 3 {
                ctx.quit(*sum);
            }
            Ok(())
        },
    )
    .fail_stop();
    let mut g = Graph::new("g");
    g.add(&total);
    total.push(1i64);
    total.push("not a number");
    total.push(2i64);
    total.push(3i64);
    let r = g.run(Run::default().threads(2)).unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(r.quit.unwrap().get::<i64>(0).unwrap(), 6);
    let st = r.stats.stages.iter().find(|s| s.name == "total").unwrap();
    assert_eq!(st.errors, 1);
}

/// A review's stress test of the idle check: a handler takes a `Busy` guard and returns
/// while the check scans 2,000 stages on its way to it; the guard's thread sends the
/// next event 1.5 ms later. The check read the guards only before the scan and ended the
/// run with 11–336 of the 400 events handled (12 runs of 12).
#[test]
fn a_busy_guard_taken_during_the_idle_scan_is_seen() {
    const N: i64 = 400;
    let got = Arc::new(AtomicUsize::new(0));
    let mut g = Graph::new("g");
    for i in 0..2000 {
        g.add(&Stage::new(format!("f{i}"), |_: Event, _: &mut Ctx| Ok(())));
    }
    let seen = got.clone();
    let chain = Stage::new("chain", move |ev: Event, ctx: &mut Ctx| {
        let n: i64 = ev.get(0)?;
        seen.fetch_add(1, SeqCst);
        if n >= N {
            return Ok(());
        }
        let mut out = ctx.clone();
        let busy = ctx.busy();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(1500));
            out.send("next", n + 1).unwrap();
            drop(busy);
        });
        Ok(())
    })
    .autostart(1i64);
    g.connect(&chain, "next", &chain);
    run_idle(&g, 2);
    assert_eq!(
        got.load(SeqCst),
        N as usize,
        "the run went idle while a guard lived"
    );
}

/// A worker left behind by [`Run::leave_stuck_after`] holds its own handler's state,
/// not the ended run's reactor: what other instances had parked on it (a listening
/// socket here) is closed when the run returns, so a daemon's next deployment can bind
/// the same port while the stuck call still runs.
#[test]
fn a_worker_left_behind_does_not_keep_the_run_sockets() {
    let port = Arc::new(Mutex::new(None::<u16>));
    let release = Arc::new(std::sync::Barrier::new(2));
    let p = port.clone();
    let listen = Stage::new("listen", move |_, ctx: &mut Ctx| {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        *p.lock().unwrap() = Some(l.local_addr()?.port());
        l.set_nonblocking(true)?;
        let l = tokio::net::TcpListener::from_std(l)?;
        ctx.wait(async move {
            let _ = l.accept().await;
            Ok(())
        });
        Ok(())
    });
    let r = release.clone();
    let stuck = Stage::new("stuck", move |_, _ctx: &mut Ctx| {
        r.wait();
        Ok(())
    });
    let p = port.clone();
    let start = Stage::new("start", move |_, ctx: &mut Ctx| {
        ctx.send("listen", ())?;
        ctx.send("stuck", ())?;
        let (c, p) = (ctx.clone(), p.clone());
        ctx.wait(async move {
            while p.lock().unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c.quit(());
            Ok(())
        });
        Ok(())
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.connect(&start, "listen", &listen);
    g.connect(&start, "stuck", &stuck);
    let r = g
        .run(
            Run::default()
                .threads(3)
                .leave_stuck_after(Duration::from_millis(100))
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    let port = port.lock().unwrap().expect("the listener was bound");
    let rebound = std::net::TcpListener::bind(("127.0.0.1", port)).map(|_| ());
    release.wait();
    rebound.unwrap_or_else(|e| {
        panic!("port {port} is still held by the ended run while a worker is left behind: {e}")
    });
}

/// A task that yields with `Ctx::nice` goes behind the work the reactor made ready while
/// it ran (a timer here; sockets in the HTTP server), not ahead of it in its worker's own
/// queue: on one worker, a stage that computes 2 ms and then yields, for ever, lets a
/// sleeping stage go on within a round or two of its timer. Before, the sleeper waited
/// for the worker's next look at the reactor (every 8 tasks) and then for the injector's
/// turn (every 8 picks): up to 16 rounds (a static file waited 80 ms behind Lua pages
/// paused every 10 ms). Counted in rounds, not time.
#[test]
fn a_nice_task_goes_behind_what_the_reactor_woke() {
    let rounds = Arc::new(AtomicUsize::new(0));
    let (r1, r2) = (rounds.clone(), rounds.clone());
    let spinner = Stage::asynchronous("spinner", move |_, ctx: Ctx| {
        let r = r1.clone();
        async move {
            while !ctx.is_stopping() {
                spin(Duration::from_millis(2));
                r.fetch_add(1, SeqCst);
                ctx.nice().await;
            }
            Ok(())
        }
    })
    .autostart(());
    let waited = Arc::new(Mutex::new(Vec::new()));
    let w = waited.clone();
    let sleeper = Stage::asynchronous("sleeper", move |_, ctx: Ctx| {
        let (r, w) = (r2.clone(), w.clone());
        async move {
            for _ in 0..10 {
                let before = r.load(SeqCst);
                ctx.sleep(Duration::from_millis(5)).await;
                w.lock().unwrap().push(r.load(SeqCst) - before);
            }
            ctx.quit(());
            Ok(())
        }
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.add(&spinner).add(&sleeper);
    g.run(Run::default().threads(1).timeout(Duration::from_secs(60)))
        .unwrap();
    let mut w = waited.lock().unwrap().clone();
    w.sort_unstable();
    // A 5 ms sleep spans three rounds of 2 ms; one more for the round under way.
    assert!(w[w.len() / 2] <= 5, "rounds per 5 ms sleep: {w:?}");
}

/// Spins on the calling thread for `d` (a computation that does not block).
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Stages that compute in slices (`Ctx::nice` after each) all go on beside a stage that
/// sends to itself for a second, on two workers: a niced task is never moved where only
/// a worker busy with a stream of hand-offs would take it (review finding: with niced
/// tasks in the injector, an idle worker's batch steal put them in its LIFO deque, and
/// 1 to 2 of 8 stages ran one slice in the whole second).
#[test]
fn niced_stages_go_on_beside_a_stream_of_hand_offs() {
    const K: usize = 8;
    let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..K).map(|_| AtomicUsize::new(0)).collect());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut g = Graph::new("g");
    for k in 0..K {
        let (c, stop) = (counts.clone(), stop.clone());
        let s = Stage::asynchronous(format!("n{k}"), move |_, ctx: Ctx| {
            let (c, stop) = (c.clone(), stop.clone());
            async move {
                while !stop.load(SeqCst) && !ctx.is_stopping() {
                    spin(Duration::from_micros(200));
                    c[k].fetch_add(1, SeqCst);
                    ctx.nice().await;
                }
                Ok(())
            }
        })
        .autostart(());
        g.add(&s);
    }
    let stop2 = stop.clone();
    let start = Instant::now();
    let ping = Stage::new("ping", move |_, ctx: &mut Ctx| {
        if start.elapsed() < Duration::from_secs(1) {
            ctx.send("again", ())?;
        } else {
            stop2.store(true, SeqCst);
        }
        Ok(())
    })
    .autostart(());
    g.connect(&ping, "again", &ping);
    run_idle(&g, 2);
    let c: Vec<usize> = counts.iter().map(|c| c.load(SeqCst)).collect();
    // A fair share is ~300 slices each (one worker's second, 200 µs a slice, 8 stages);
    // a starved stage has 1.
    assert!(
        c.iter().all(|&n| n > 10),
        "a niced stage stood still for the whole second: {c:?}"
    );
}

/// A stage run inline by a cohort send that yields with `Ctx::nice` goes on on an idle
/// worker at once, not after the handler that called it returns (600 ms later).
#[test]
fn a_nice_inside_a_cohort_run_does_not_wait_for_the_caller() {
    let t0: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let waited = Arc::new(Mutex::new(None::<Duration>));
    let t1 = t0.clone();
    let src = Stage::new("src", move |_, ctx: &mut Ctx| {
        *t1.lock().unwrap() = Some(Instant::now());
        ctx.send("call", ())?;
        std::thread::sleep(Duration::from_millis(600));
        Ok(())
    })
    .autostart(());
    let (t2, w2) = (t0.clone(), waited.clone());
    let callee = Stage::asynchronous("callee", move |_, ctx: Ctx| {
        let (t2, w2) = (t2.clone(), w2.clone());
        async move {
            ctx.nice().await;
            *w2.lock().unwrap() = Some(t2.lock().unwrap().unwrap().elapsed());
            Ok(())
        }
    });
    let mut g = Graph::new("g");
    g.connect(&src, "call", &callee).cohort();
    run_idle(&g, 2);
    let w = waited.lock().unwrap().expect("the callee went on");
    assert!(
        w < Duration::from_millis(300),
        "the niced callee waited {w:?} for its caller to return"
    );
}

/// A stage that yields with `Ctx::nice` goes on beside a stage that sends to itself on
/// the only worker: the self-sender is back in the worker's yielded queue after each
/// batch, and the niced tasks now go first on every other turn (review finding: they
/// were taken only when that queue was empty, and 20 slices of 100 µs took the stream's
/// whole 3 s).
#[test]
fn a_niced_stage_goes_on_beside_a_yielding_stage_on_one_worker() {
    let start = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let took: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let d = done.clone();
    let ping = Stage::new("ping", move |_, ctx: &mut Ctx| {
        if !d.load(SeqCst) && start.elapsed() < Duration::from_secs(3) {
            ctx.send("again", ())?;
        }
        Ok(())
    })
    .autostart(());
    let (d, t) = (done.clone(), took.clone());
    let niced = Stage::asynchronous("niced", move |_, ctx: Ctx| {
        let (d, t) = (d.clone(), t.clone());
        async move {
            for _ in 0..20 {
                spin(Duration::from_micros(100));
                ctx.nice().await;
            }
            *t.lock().unwrap() = Some(start.elapsed());
            d.store(true, SeqCst);
            Ok(())
        }
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.connect(&ping, "again", &ping);
    g.add(&niced);
    run_idle(&g, 1);
    let t = took.lock().unwrap().expect("the niced stage ended");
    assert!(
        t < Duration::from_secs(1),
        "20 slices of 100 µs took {t:?} beside the stream"
    );
}
