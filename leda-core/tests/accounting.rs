//! Every event a stage accepted is handled, reported, or counted: sends held by a call
//! that then fails, `send_or_wait` on a clone, a start that fails, destructors that
//! panic, and what the end of a run leaves (a review, 2026-11-27, found each lost or
//! hanging).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;

fn counter() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let c = Arc::new(AtomicUsize::new(0));
    (c.clone(), c)
}

/// Runs `g` on two threads until it is idle (bounded).
fn run_idle(g: &Graph) -> RunReport {
    let r = g
        .run(
            Run::default()
                .threads(2)
                .until_idle()
                .timeout(Duration::from_secs(30)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Idle, "the run did not go idle");
    r
}

/// A slow serial sink of capacity 2, counting what it handles.
fn slow_sink(name: &str, got: Arc<AtomicUsize>) -> Stage {
    Stage::new(name, move |_: Event, _: &mut Ctx| {
        std::thread::sleep(Duration::from_millis(2));
        got.fetch_add(1, SeqCst);
        Ok(())
    })
    .serial()
    .capacity(2)
}

/// Runs `handler` as the serial, autostarted stage `src`, its port 1 connected to a
/// [`slow_sink`], until idle; returns how many events the sink handled and the report.
fn into_slow_sink(
    handler: impl Fn(Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static,
) -> (usize, RunReport) {
    let (got, g2) = counter();
    let src = Stage::new("src", handler).serial().autostart(());
    let dst = slow_sink("dst", g2);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &dst);
    let r = run_idle(&g);
    (got.load(SeqCst), r)
}

/// Ten `send_or_wait`s accepted (eight held behind the full queue), then the call
/// fails — by an error or a panic: the ten are delivered and the failure reported
/// once. Before, the eight held were dropped with the call's wait.
#[test]
fn sends_held_by_a_call_that_fails_are_delivered() {
    for panics in [false, true] {
        let (got, g2) = counter();
        let (reports, r2) = counter();
        let src = Stage::new("src", move |_: Event, ctx: &mut Ctx| {
            for i in 0..10i64 {
                ctx.send_or_wait(1, i)?;
            }
            if panics {
                panic!("the call panics after its sends were accepted");
            }
            Err("the call fails after its sends were accepted".into())
        })
        .serial()
        .autostart(());
        let dst = slow_sink("dst", g2);
        let err = Stage::new("err", move |_: Event, _: &mut Ctx| {
            r2.fetch_add(1, SeqCst);
            Ok(())
        });
        let mut g = Graph::new("g");
        g.connect(&src, 1, &dst);
        g.connect(&src, "error", &err);
        let r = run_idle(&g);
        assert_eq!(got.load(SeqCst), 10, "panics={panics}: held sends lost");
        assert_eq!(reports.load(SeqCst), 1, "panics={panics}");
        assert_eq!(r.stats.stages[0].errors, 1, "panics={panics}");
    }
}

/// `send_or_wait` on a clone of the `Ctx` (another thread's) cannot park anything: a
/// full queue is an error there, as with `send`, and every send it accepted arrives.
/// Before, it returned `Ok` for all 100 and 95 vanished.
#[test]
fn send_or_wait_on_a_clone_reports_a_full_queue() {
    let (accepted, a2) = counter();
    let (refused, f2) = counter();
    let (got, g2) = counter();
    let a = Stage::new("a", move |_: Event, ctx: &mut Ctx| {
        let mut c = ctx.clone();
        let busy = ctx.busy();
        let (a3, f3) = (a2.clone(), f2.clone());
        std::thread::spawn(move || {
            let _busy = busy;
            for i in 0..100i64 {
                match c.send_or_wait(1, i) {
                    Ok(()) => a3.fetch_add(1, SeqCst),
                    Err(SendError::QueueFull { .. }) => f3.fetch_add(1, SeqCst),
                    Err(e) => panic!("{e}"),
                };
            }
        });
        Ok(())
    })
    .autostart(());
    let b = slow_sink("b", g2);
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    run_idle(&g);
    assert_eq!(accepted.load(SeqCst) + refused.load(SeqCst), 100);
    assert!(refused.load(SeqCst) > 0, "a capacity of 2 must refuse some");
    assert_eq!(got.load(SeqCst), accepted.load(SeqCst));
}

/// A start that fails (here: the stats file cannot be created) leaves the initial
/// events for the next run. Before, it took them with it.
#[test]
fn a_start_that_fails_leaves_the_initial_events() {
    let (got, g2) = counter();
    let s = Stage::new("s", move |_: Event, _: &mut Ctx| {
        g2.fetch_add(1, SeqCst);
        Ok(())
    })
    .autostart(1);
    s.push(2);
    let mut g = Graph::new("g");
    g.add(&s);
    let e = g
        .run(
            Run::default()
                .until_idle()
                .stats_file("/nonexistent-dir/x.jsonl", Duration::from_secs(1)),
        )
        .unwrap_err();
    assert!(e.to_string().contains("stats file"), "{e}");
    run_idle(&g);
    assert_eq!(got.load(SeqCst), 2);
}

struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a destructor panics");
        }
    }
}

/// A handler state whose destructor panics; event 0 fails its call, 2 quits.
struct Bomb(#[allow(dead_code)] PanicsOnDrop);

impl Handler for Bomb {
    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        match ev.get::<i64>(0)? {
            0 => Err("fail".into()),
            2 => {
                ctx.quit(());
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// A destructor that panics when a failed instance is destroyed, on the only worker:
/// the failure is counted and the stage goes on. Before, the worker died with it and
/// the run hung (ended only by its timeout, the failure not counted).
#[test]
fn a_destructor_that_panics_does_not_kill_the_worker() {
    let s = Stage::from_handler("bomb", |_| Ok(Bomb(PanicsOnDrop))).serial();
    for i in 0..3i64 {
        s.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&s);
    let r = g
        .run(Run::default().threads(1).timeout(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(r.stats.stages[0].errors, 1);
}

/// The same destructor on an idle instance dropped at the end of the run: the run
/// returns its report. Before, the panic unwound out of `Graph::run`.
#[test]
fn a_destructor_that_panics_at_the_end_does_not_unwind_out_of_run() {
    let s = Stage::from_handler("bomb", |_| Ok(Bomb(PanicsOnDrop))).serial();
    s.push(1);
    let mut g = Graph::new("g");
    g.add(&s);
    run_idle(&g);
}

/// A quit while a producer floods a serial stage: what the run ends with adds up,
/// `events_in` = `handled` + `queue_len` + `discarded`, and every send that returned
/// `Ok` is in `events_in`. Before, a producer's batch cleared at the end (6–128
/// events) was in no count.
#[test]
fn the_counts_add_up_when_a_run_ends_under_load() {
    for _ in 0..3 {
        let (accepted, a2) = counter();
        let quit_at = Arc::new(Mutex::new(0usize));
        let q2 = quit_at.clone();
        let src = Stage::new("src", move |_: Event, ctx: &mut Ctx| {
            for i in 0..200_000i64 {
                if ctx.send(1, i).is_ok() {
                    a2.fetch_add(1, SeqCst);
                }
            }
            Ok(())
        })
        .autostart(());
        let dst = Stage::new("dst", move |_: Event, ctx: &mut Ctx| {
            let mut n = q2.lock().unwrap();
            *n += 1;
            if *n == 1000 {
                ctx.quit(());
            }
            Ok(())
        })
        .serial()
        .capacity(1_000_000);
        let mut g = Graph::new("g");
        g.connect(&src, 1, &dst);
        let r = g
            .run(Run::default().threads(2).timeout(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(r.reason, EndReason::Quit);
        let d = r.stats.stages.iter().find(|s| s.name == "dst").unwrap();
        assert_eq!(
            d.events_in,
            d.handled + d.queue_len as u64 + d.discarded,
            "{d:?}"
        );
        assert_eq!(accepted.load(SeqCst) as u64, d.events_in, "{d:?}");
    }
}

/// A run's timeout stops the handler calls: a serial stage with a backlog of 20 ms
/// calls makes the few that fit, not the rest of its batch of 256 (which took 5 s
/// after a timeout of 100 ms), and its backlog counts as queued or discarded.
#[test]
fn no_handler_call_starts_after_the_run_ended() {
    let (calls, c2) = counter();
    let s = Stage::new("s", move |_: Event, _: &mut Ctx| {
        c2.fetch_add(1, SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    })
    .serial();
    for i in 0..1000i64 {
        s.push(i);
    }
    let mut g = Graph::new("g");
    g.add(&s);
    let r = g
        .run(
            Run::default()
                .threads(2)
                .timeout(Duration::from_millis(100)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Timeout);
    let made = calls.load(SeqCst);
    assert!(made < 100, "{made} calls for a run of 100 ms");
    let st = &r.stats.stages[0];
    assert_eq!(st.handled, made as u64);
    assert_eq!(
        st.events_in,
        st.handled + st.queue_len as u64 + st.discarded,
        "{st:?}"
    );
}

/// Events that arrive in batches (as a transport delivers them) and are taken by an
/// instance when the run ends are counted once: discarded, no longer queued. Before,
/// the rest of the batch an instance held was in both (+744 of 1,000).
#[test]
fn a_batch_taken_when_the_run_ends_is_counted_once() {
    for _ in 0..3 {
        let s = Stage::new("s", |_: Event, _: &mut Ctx| {
            std::thread::sleep(Duration::from_micros(500));
            Ok(())
        })
        .serial()
        .capacity(100_000);
        let q = Stage::new("q", |_: Event, ctx: &mut Ctx| {
            let c = ctx.clone();
            ctx.wait(async move {
                c.sleep(Duration::from_millis(40)).await;
                c.quit(());
                Ok(())
            });
            Ok(())
        })
        .autostart(());
        let mut g = Graph::new("g");
        g.add(&s);
        g.add(&q);
        let running = g
            .start(Run::default().threads(2).timeout(Duration::from_secs(60)))
            .unwrap();
        let h = running.handle();
        let i = h.stage_index("s").unwrap();
        let mut sent = 0u64;
        for _ in 0..5 {
            let mut batch: Vec<Event> = (0..1000i64).map(Event::from).collect();
            sent += h.inject_batch(i, &mut batch).unwrap_or(0) as u64;
        }
        let r = running.wait().unwrap();
        let st = r.stats.stage("s").unwrap();
        assert_eq!(st.events_in, sent, "{st:?}");
        assert_eq!(
            st.events_in,
            st.handled + st.queue_len as u64 + st.discarded,
            "{st:?}"
        );
    }
}

/// A `send_or_wait` that can be refused at once (an unconnected port) is refused at
/// once behind held events too, and the held ones around it arrive. Before, it
/// returned `Ok`, then failed the call once the events before it went, and the two
/// after it vanished.
#[test]
fn an_unconnected_port_behind_held_sends_is_refused_at_once() {
    let seen = Arc::new(Mutex::new(None));
    let s2 = seen.clone();
    let (got, r) = into_slow_sink(move |_: Event, ctx: &mut Ctx| {
        for i in 0..5i64 {
            ctx.send_or_wait(1, i)?;
        }
        *s2.lock().unwrap() = Some(ctx.send_or_wait("nowhere", 5));
        for i in 6..8i64 {
            ctx.send_or_wait(1, i)?;
        }
        Ok(())
    });
    assert!(
        matches!(
            *seen.lock().unwrap(),
            Some(Err(SendError::NotConnected { .. }))
        ),
        "{:?}",
        seen.lock().unwrap()
    );
    assert_eq!(got, 7);
    assert_eq!(r.stats.stages[0].errors, 0);
}

/// A held event refused when its turn comes (a cohort hand-off to a stage whose only
/// instance is busy: here the sender's own, parked on its held sends) is reported —
/// counted in `failed_sends`, and on the `error` port with its arguments — and the
/// held events after it still arrive; the call fails with that refusal. Before, the
/// refused event and the two after it vanished, only the call's failure reported.
#[test]
fn a_held_event_refused_in_its_turn_is_reported_and_the_rest_arrive() {
    let (got, g2) = counter();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let r2 = reports.clone();
    let src = Stage::new("src", move |ev: Event, ctx: &mut Ctx| {
        if ev.get::<Option<i64>>(0)?.is_some() {
            return Ok(()); // (never reached: the hand-off is refused)
        }
        for i in 0..5i64 {
            ctx.send_or_wait(1, i)?;
        }
        ctx.send_or_wait("again", 5)?;
        for i in 6..8i64 {
            ctx.send_or_wait(1, i)?;
        }
        Ok(())
    })
    .serial()
    .autostart(());
    let dst = slow_sink("dst", g2);
    let err = Stage::new("err", move |ev: Event, _: &mut Ctx| {
        let report = (ev.get::<String>(0)?, ev.get::<String>(1)?);
        r2.lock().unwrap().push((report, ev.get::<Option<i64>>(2)?));
        Ok(())
    });
    let mut g = Graph::new("g");
    g.connect(&src, 1, &dst);
    g.connect(&src, "again", &src).cohort();
    g.connect(&src, "error", &err);
    let r = run_idle(&g);
    assert_eq!(
        got.load(SeqCst),
        7,
        "held events after the refused one lost"
    );
    let src_stats = &r.stats.stages[0];
    assert_eq!(src_stats.failed_sends, 1, "{src_stats:?}");
    assert_eq!(src_stats.errors, 1, "the call fails with the refusal");
    let reports = reports.lock().unwrap();
    // The refused event's report, with its argument; and the call's failure.
    assert_eq!(reports.len(), 2, "{reports:?}");
    let refused = reports.iter().find(|(_, arg)| *arg == Some(5));
    assert!(
        refused
            .is_some_and(|((stage, why), _)| stage == "src"
                && why.contains("parallel instance of stage 'src'")),
        "{reports:?}"
    );
}

/// Sends a call held behind a full queue when the run ends are counted: every event
/// `send_or_wait` accepted was sent (`events_out`) or is in `failed_sends`. Before,
/// the 990-odd still held when the run timed out were in no count, and the process
/// of the run was never freed (the parked producer held it).
#[test]
fn sends_still_held_when_the_run_ends_are_counted() {
    let (got, g2) = counter();
    let (accepted, a2) = counter();
    let token = Arc::new(());
    let t2 = token.clone();
    let src = Stage::new("src", move |_: Event, ctx: &mut Ctx| {
        let _kept = &t2;
        for i in 0..1000i64 {
            ctx.send_or_wait(1, i)?;
            a2.fetch_add(1, SeqCst);
        }
        Ok(())
    })
    .serial()
    .autostart(());
    let dst = slow_sink("dst", g2);
    let mut g = Graph::new("g");
    g.connect(&src, 1, &dst);
    let r = g
        .run(Run::default().threads(2).timeout(Duration::from_millis(50)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Timeout);
    let s = &r.stats.stages[0];
    assert_eq!(accepted.load(SeqCst), 1000);
    assert!(
        got.load(SeqCst) < 1000,
        "the run ended before all were delivered"
    );
    assert_eq!(s.events_out + s.failed_sends, 1000, "{s:?}");
    assert!(s.failed_sends > 0, "{s:?}");
    drop((g, src, dst));
    assert_eq!(
        Arc::strong_count(&token),
        1,
        "the ended run's handler was kept"
    );
}

/// Sends held behind a wait the call asked for (`ctx.wait`) are delivered even when
/// that wait fails, as those of a call that fails are; the failure is then the call's.
/// Before, the five were dropped with the failed wait.
#[test]
fn sends_held_behind_a_failed_wait_are_delivered() {
    let (got, r) = into_slow_sink(|_: Event, ctx: &mut Ctx| {
        ctx.wait(async { Err("the wait fails".into()) });
        for i in 0..5i64 {
            ctx.send_or_wait(1, i)?;
        }
        Ok(())
    });
    assert_eq!(got, 5, "held sends dropped with the failed wait");
    assert_eq!(r.stats.stages[0].errors, 1);
    assert_eq!(r.stats.stages[0].failed_sends, 0);
}

/// Sends held before a wait the call then asked for (`ctx.wait`) are delivered when
/// the call fails, as its other held sends are. Before, the wait's future took them
/// and was dropped with the failed call.
#[test]
fn sends_held_before_a_wait_of_a_failed_call_are_delivered() {
    let (got, r) = into_slow_sink(|_: Event, ctx: &mut Ctx| {
        for i in 0..5i64 {
            ctx.send_or_wait(1, i)?;
        }
        ctx.wait(async { Ok(()) });
        for i in 5..8i64 {
            ctx.send_or_wait(1, i)?;
        }
        Err("the call fails after its sends were accepted".into())
    });
    assert_eq!(got, 8, "held sends dropped with the failed call");
    assert_eq!(r.stats.stages[0].errors, 1);
    assert_eq!(r.stats.stages[0].failed_sends, 0);
}
