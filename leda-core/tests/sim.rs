//! Deterministic simulation of mapped graphs: virtual time, a seeded network model,
//! crashes, and byte-identical traces for identical seeds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::error::RunError;
use leda_core::prelude::*;
use leda_core::sim::{Latency, NetModel, SimEnd, SimReport, Simulation};

/// Three processes: a source sends `n` numbered events to a relay in process 2, which
/// forwards them to a serial collector in process 3. Returns the collector's order.
fn three_process_run(seed: u64, net: NetModel, n: i64) -> (SimReport, Vec<i64>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let source = Stage::asynchronous("source", move |_, mut ctx: Ctx| async move {
        for i in 0..n {
            ctx.send_wait(1, i).await?;
            ctx.sleep(Duration::from_micros(100)).await;
        }
        Ok(())
    })
    .autostart(());
    let relay = Stage::new("relay", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev.get::<i64>(0)?)?;
        Ok(())
    })
    .serial();
    let collect = Stage::new("collect", move |ev: Event, _| {
        s2.lock().unwrap().push(ev.get::<i64>(0)?);
        Ok(())
    })
    .serial();
    let mut g = Graph::new("three");
    g.connect(&source, 1, &relay);
    g.connect(&relay, 1, &collect);
    g.part([
        Cluster::of([&source]),
        Cluster::of([&relay]),
        Cluster::of([&collect]),
    ])
    .unwrap()
    .map(["p1:1", "p2:1", "p3:1"])
    .unwrap();
    let report = Simulation::new(seed).net(net).run(&g).unwrap();
    let order = seen.lock().unwrap().clone();
    (report, order)
}

fn jittery(fifo: bool) -> NetModel {
    NetModel {
        latency: Latency::Uniform(Duration::from_micros(50), Duration::from_millis(5)),
        fifo,
        ..NetModel::default()
    }
}

#[test]
fn same_seed_same_trace_byte_for_byte() {
    let net = NetModel {
        latency: Latency::Exponential(Duration::from_millis(2)),
        fifo: false,
        loss: 0.05,
        duplicate: 0.05,
        spike: (0.05, Duration::from_millis(50)),
    };
    let (a, oa) = three_process_run(42, net.clone(), 200);
    let (b, ob) = three_process_run(42, net.clone(), 200);
    assert!(a.trace.len() > 400, "{} trace lines", a.trace.len());
    assert_eq!(a.trace, b.trace);
    assert_eq!(oa, ob);
    assert_eq!(a.time, b.time);
    let (c, _) = three_process_run(43, net, 200);
    assert_ne!(a.trace, c.trace, "another seed, another schedule");
}

#[test]
fn fifo_links_keep_order_and_non_fifo_links_can_reorder() {
    let (_, ordered) = three_process_run(1, jittery(true), 300);
    assert_eq!(ordered, (0..300).collect::<Vec<_>>());
    let reordered = (0..20).any(|seed| {
        let (_, order) = three_process_run(seed, jittery(false), 300);
        assert_eq!(order.len(), 300, "no loss configured: everything arrives");
        order.windows(2).any(|w| w[0] > w[1])
    });
    assert!(
        reordered,
        "uniform jitter without FIFO never reordered in 20 seeds"
    );
}

#[test]
fn every_send_is_delivered_or_counted_lost() {
    let net = NetModel {
        loss: 0.2,
        ..jittery(true)
    };
    let (report, order) = three_process_run(9, net, 500);
    let sends = report.trace.iter().filter(|l| l.contains(" send ")).count() as u64;
    let delivers = report
        .trace
        .iter()
        .filter(|l| l.contains(" deliver "))
        .count() as u64;
    assert!(report.lost > 0);
    assert_eq!(sends, delivers + report.lost);
    assert_eq!(
        order.len() as u64,
        report.processes[2]
            .1
            .stats
            .stage("collect")
            .unwrap()
            .handled
    );
}

#[test]
fn duplicates_are_delivered_twice() {
    let net = NetModel {
        duplicate: 1.0,
        ..NetModel::default()
    };
    let (report, order) = three_process_run(3, net, 10);
    // Each hop doubles: 10 events -> 20 at the relay -> 40 at the collector.
    assert_eq!(order.len(), 40);
    assert!(report.trace.iter().any(|l| l.contains(" duplicate ")));
}

#[test]
fn a_crashed_process_stops_and_traffic_to_it_is_lost() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let tick = Stage::asynchronous("tick", |_, mut ctx: Ctx| async move {
        for i in 0..100i64 {
            ctx.send_wait(1, i).await?;
            ctx.sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    })
    .autostart(());
    let sink = Stage::new("sink", move |ev: Event, ctx: &mut Ctx| {
        s2.lock().unwrap().push((ctx.gettime(), ev.get::<i64>(0)?));
        Ok(())
    });
    let mut g = Graph::new("crash");
    g.connect(&tick, 1, &sink);
    g.part([Cluster::of([&tick]), Cluster::of([&sink])])
        .unwrap()
        .map(["a:1", "b:1"])
        .unwrap();
    let report = Simulation::new(5)
        .latency(Latency::Constant(Duration::from_millis(1)))
        .crash("b:1", Duration::from_millis(255))
        .run(&g)
        .unwrap();
    let seen = seen.lock().unwrap();
    // Sends at 0, 10, ..., 250 ms arrive 1 ms later, before the crash at 255 ms.
    assert_eq!(seen.len(), 26);
    assert!(seen.iter().all(|(t, _)| *t < 0.255));
    assert!(report.trace.iter().any(|l| l.ends_with("crash b:1")));
    assert_eq!(report.lost, 100 - 26);
    // The last send is at 990 ms; the source's last sleep ends at 1 s.
    assert_eq!(report.time, Duration::from_secs(1));
}

/// A finished simulation frees its processes: the instances' state is dropped (no reference
/// cycle between the simulated processes and the simulator survives the run).
#[test]
fn a_finished_simulation_frees_its_processes() {
    let marker = Arc::new(());
    let m = marker.clone();
    let ticker = Stage::stateful(
        "ticker",
        move |_: &Attrs| Ok((m.clone(), 0u32)),
        |s: &mut (Arc<()>, u32), _: Event, ctx: &mut Ctx| {
            s.1 += 1;
            let mut c = ctx.clone();
            ctx.wait(async move {
                c.sleep(Duration::from_millis(1)).await;
                c.send(1, ())?;
                Ok(())
            });
            Ok(())
        },
    )
    .serial()
    .autostart(());
    let echo = Stage::new("echo", |_: Event, ctx: &mut Ctx| {
        ctx.send(1, ())?;
        Ok(())
    });
    let mut g = Graph::new("leak");
    g.connect(&ticker, 1, &echo);
    g.connect(&echo, 1, &ticker);
    g.part([Cluster::of([&ticker]), Cluster::of([&echo])])
        .unwrap()
        .map(["a:1", "b:1"])
        .unwrap();
    // Stops at the time bound with a sleep pending and events in flight.
    let report = Simulation::new(3)
        .until(Duration::from_millis(50))
        .run(&g)
        .unwrap();
    assert!(report.trace.len() > 10);
    drop(report);
    assert_eq!(
        Arc::strong_count(&marker),
        2,
        "only ours and the stage's factory remain"
    );
    drop(g);
    drop(ticker);
    assert_eq!(Arc::strong_count(&marker), 1, "instances and factory freed");
}

/// Runs `f` on a thread of its own; `None` if it has not returned within `secs` (the
/// thread is left behind, spinning, until the test process exits).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => Some(v),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the thread sent nothing and did not panic"),
        },
    }
}

/// Eight events to a parallel asynchronous stage whose calls take 10 ms of virtual time,
/// then over a 1 ms link: the end time counts the rounds of `maxpar` instances.
/// Returns the end time, the stage's `maxpar` and the trace.
fn parallel_rounds() -> (Duration, usize, Vec<String>) {
    let src = Stage::new("src", |_: Event, ctx: &mut Ctx| {
        for i in 0..8i64 {
            ctx.send(1, i)?;
        }
        Ok(())
    })
    .autostart(());
    let work = Stage::asynchronous("work", |ev: Event, mut ctx: Ctx| async move {
        let i: i64 = ev.get(0)?;
        ctx.sleep(Duration::from_millis(10)).await;
        ctx.send_wait(1, i).await?;
        Ok(())
    });
    let sink = Stage::new("sink", |_: Event, _: &mut Ctx| Ok(())).serial();
    let mut g = Graph::new("rounds");
    g.connect(&src, 1, &work).local();
    g.connect(&work, 1, &sink);
    g.part([Cluster::of([&src, &work]), Cluster::of([&sink])])
        .unwrap()
        .map(["a:1", "b:1"])
        .unwrap();
    let r = Simulation::new(1).run(&g).unwrap();
    let work = r.processes[0].1.stats.stage("work").unwrap().maxpar;
    (r.time, work, r.trace)
}

/// FNV-1a of the trace's lines (stable across Rust versions, unlike `DefaultHasher`).
fn trace_hash(trace: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in trace.iter().flat_map(|l| l.bytes().chain([b'\n'])) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Not a test of its own: run by `the_same_seed_gives_the_same_trace_on_any_host` in a
/// child process restricted to one CPU; prints what that run gave.
#[test]
fn parallel_rounds_child() {
    if std::env::var_os("LEDA_SIM_ROUNDS_CHILD").is_none() {
        return;
    }
    let (time, maxpar, trace) = parallel_rounds();
    println!(
        "ROUNDS time={} maxpar={maxpar} hash={:x}",
        time.as_nanos(),
        trace_hash(&trace)
    );
}

/// The default `maxpar` of a simulated process is a documented constant, not the host's
/// CPU count: a trace recorded on a laptop replays on a CI machine of another size.
#[test]
fn the_same_seed_gives_the_same_trace_on_any_host() {
    let (time, maxpar, trace) = parallel_rounds();
    assert_eq!(maxpar, Simulation::DEFAULT_MAXPAR);
    assert_eq!(Simulation::DEFAULT_MAXPAR, 4, "documented in semantics.md");
    // Two rounds of four: 10 + 10 ms of calls, then the 1 ms link.
    assert_eq!(time, Duration::from_millis(21));
    // The same run in a process that may use one CPU only (where `taskset` exists).
    let Some(cpu) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
            let first = line.split(':').nth(1)?.trim().split([',', '-']).next()?;
            Some(first.to_owned())
        })
    else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let Ok(out) = std::process::Command::new("taskset")
        .args(["-c", &cpu])
        .arg(exe)
        .args(["--exact", "parallel_rounds_child", "--nocapture"])
        .env("LEDA_SIM_ROUNDS_CHILD", "1")
        .output()
    else {
        eprintln!("no taskset: the one-CPU comparison is skipped");
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find("ROUNDS ").map(|i| &l[i..]))
        .unwrap_or_else(|| {
            panic!(
                "the child printed no result: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let here = format!(
        "ROUNDS time={} maxpar={maxpar} hash={:x}",
        time.as_nanos(),
        trace_hash(&trace)
    );
    assert_eq!(line, here, "one CPU (left) and this host (right)");
}

/// Two local stages that pass one event back and forth for ever.
fn zero_time_loop() -> Graph {
    let a = Stage::new("a", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev)?;
        Ok(())
    })
    .autostart(0);
    let b = Stage::new("b", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev)?;
        Ok(())
    });
    let mut g = Graph::new("loop");
    g.connect(&a, 1, &b);
    g.connect(&b, 1, &a);
    g
}

/// Work that takes no virtual time never moves the clock to `until`: the simulation
/// must still end (the default bound of steps at one instant), and say why.
#[test]
fn a_loop_in_zero_virtual_time_ends() {
    let r = within(60, || {
        Simulation::new(1)
            .until(Duration::from_secs(1))
            .run(&zero_time_loop())
            .unwrap()
    });
    let report = r.expect("until(1 s) with a zero-time loop did not return within 60 s");
    assert_eq!(
        report.end,
        SimEnd::ZeroTimeLoop {
            steps: Simulation::DEFAULT_MAX_STEPS_PER_INSTANT
        }
    );
    assert_eq!(report.time, Duration::ZERO);
    assert_eq!(report.processes[0].1.reason, EndReason::Timeout);
    let handled: u64 = report.processes[0]
        .1
        .stats
        .stages
        .iter()
        .map(|s| s.handled)
        .sum();
    assert!(handled > 100_000, "{handled} events handled");
}

/// The step bounds are exact and deterministic; the same loop across two processes with
/// zero latency (deliveries at the same instant) is bounded too.
#[test]
fn step_budgets_end_a_simulation() {
    let r = Simulation::new(1)
        .max_steps(1_000)
        .run(&zero_time_loop())
        .unwrap();
    assert_eq!(r.end, SimEnd::StepBudget { steps: 1_000 });
    let r = Simulation::new(1)
        .max_steps_per_instant(500)
        .run(&zero_time_loop())
        .unwrap();
    assert_eq!(r.end, SimEnd::ZeroTimeLoop { steps: 500 });

    let mut g = zero_time_loop();
    let (a, b) = (g.stage("a").unwrap().clone(), g.stage("b").unwrap().clone());
    g.part([Cluster::of([&a]), Cluster::of([&b])])
        .unwrap()
        .map(["a:1", "b:1"])
        .unwrap();
    let zero = Simulation::new(1)
        .latency(Latency::Constant(Duration::ZERO))
        .max_steps_per_instant(10_000)
        .run(&g)
        .unwrap();
    assert_eq!(zero.end, SimEnd::ZeroTimeLoop { steps: 10_000 });
    assert!(zero.trace.len() > 5_000, "{} trace lines", zero.trace.len());
    // With latency the clock moves and `until` ends it.
    let mut g = zero_time_loop();
    let (a, b) = (g.stage("a").unwrap().clone(), g.stage("b").unwrap().clone());
    g.part([Cluster::of([&a]), Cluster::of([&b])])
        .unwrap()
        .map(["a:1", "b:1"])
        .unwrap();
    let timed = Simulation::new(1)
        .until(Duration::from_millis(100))
        .run(&g)
        .unwrap();
    assert_eq!(timed.end, SimEnd::Until);
    assert_eq!(timed.time, Duration::from_millis(100));
    assert!(
        timed
            .processes
            .iter()
            .all(|(_, r)| r.reason == EndReason::Timeout)
    );
}

/// An instance waiting on a future that nothing in the simulation completes: the
/// simulation runs out of work, but it is stuck, not finished.
#[test]
fn a_stuck_simulation_says_so() {
    let s = Stage::asynchronous("s", |_: Event, _ctx: Ctx| async move {
        std::future::pending::<()>().await;
        Ok(())
    })
    .autostart(());
    let mut g = Graph::new("stuck");
    g.add(&s);
    let r = Simulation::new(1).run(&g).unwrap();
    assert_eq!(r.quit.map(|e| e.to_string()), None);
    assert_ne!(r.processes[0].1.reason, EndReason::Quit, "no handler quit");
    assert_eq!(r.processes[0].1.reason, EndReason::Idle);
    assert_eq!(r.end, SimEnd::Stuck { waiting: 1 });
}

/// The other ends: a quit names its process, a simulation that runs out of work is idle.
#[test]
fn a_simulation_says_how_it_ended() {
    let (r, order) = three_process_run(1, NetModel::default(), 20);
    assert_eq!(order.len(), 20);
    assert_eq!(r.end, SimEnd::Idle);
    assert!(r.processes.iter().all(|(_, p)| p.reason == EndReason::Idle));

    let ping = Stage::new("ping", |ev: Event, ctx: &mut Ctx| {
        let n: i64 = ev.get(0)?;
        if n == 3 {
            ctx.quit(n)
        } else {
            ctx.send(1, n + 1)?
        }
        Ok(())
    })
    .autostart(0);
    let pong = Stage::new("pong", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev.get::<i64>(0)?)?;
        Ok(())
    });
    let mut g = Graph::new("pingpong");
    g.connect(&ping, 1, &pong);
    g.connect(&pong, 1, &ping);
    g.part([Cluster::of([&ping]), Cluster::of([&pong])])
        .unwrap()
        .map(["p:1", "p:2"])
        .unwrap();
    let r = Simulation::new(1).run(&g).unwrap();
    assert_eq!(
        r.end,
        SimEnd::Quit {
            process: "p:1".into()
        }
    );
    assert!(r.processes.iter().all(|(_, p)| p.reason == EndReason::Quit));
}

/// A tokio timer is no simulated timer (nothing drives tokio in a simulation): the
/// handler fails like any panicking handler, counted, and the simulation does not hang.
/// Handlers wait with `ctx.sleep` (documented in sim.rs and semantics.md).
#[test]
fn a_tokio_timer_fails_the_event_in_a_simulation() {
    let r = within(60, || {
        let a = Stage::asynchronous("a", |_: Event, ctx: Ctx| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ctx.quit("done");
            Ok(())
        })
        .autostart(());
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r2 = reports.clone();
        let err = Stage::new("err", move |ev: Event, _: &mut Ctx| {
            r2.lock().unwrap().push(ev.get::<String>(1)?);
            Ok(())
        });
        let mut g = Graph::new("tokio");
        g.connect(&a, "error", &err);
        let report = Simulation::new(1).run(&g).unwrap();
        (report, reports.lock().unwrap().clone())
    })
    .expect("returned");
    let (r, reports) = r;
    assert_eq!(r.quit.map(|e| e.to_string()), None);
    assert_eq!(r.processes[0].1.stats.stage("a").unwrap().errors, 1);
    assert_eq!(r.end, SimEnd::Idle);
    assert!(
        reports.len() == 1 && reports[0].contains("wait with `ctx.sleep`"),
        "{reports:?}"
    );
}

/// A fault aimed at a process the mapping does not have is an error, not a no-op.
#[test]
fn faults_on_unknown_processes_are_refused() {
    let a = Stage::new("a", |ev: Event, ctx: &mut Ctx| {
        let n: i64 = ev.get(0)?;
        if n >= 10 {
            ctx.quit(n)
        } else {
            ctx.send(1, n + 1)?
        }
        Ok(())
    })
    .autostart(0);
    let b = Stage::new("b", |ev: Event, ctx: &mut Ctx| {
        ctx.send(1, ev.get::<i64>(0)? + 1)?;
        Ok(())
    });
    let mut g = Graph::new("faults");
    g.connect(&a, 1, &b);
    g.connect(&b, 1, &a);
    g.part([Cluster::of([&a]), Cluster::of([&b])])
        .unwrap()
        .map(["node-a:1", "node-b:1"])
        .unwrap();
    let crash = Simulation::new(1)
        .crash("node-b:2", Duration::from_millis(3))
        .run(&g);
    assert!(crash.is_err(), "crash of node-b:2 accepted");
    let lossy = NetModel {
        loss: 1.0,
        ..NetModel::default()
    };
    let link = Simulation::new(1)
        .link("node-a:1", "nodeb:1", lossy.clone())
        .run(&g);
    assert!(link.is_err(), "link to nodeb:1 accepted");
    let known = vec!["node-a:1".to_owned(), "node-b:1".to_owned()];
    match crash {
        Err(RunError::UnknownProcess {
            addr,
            fault,
            known: k,
        }) => {
            assert_eq!((addr.as_str(), fault, &k), ("node-b:2", "crash", &known));
        }
        other => panic!("{other:?}"),
    }
    let e = link.unwrap_err();
    assert_eq!(
        e.to_string(),
        "simulation: link to names process nodeb:1, which the mapping does not have \
         (its processes: node-a:1, node-b:1)"
    );
    let e = Simulation::new(1)
        .link("node-c:1", "node-b:1", lossy.clone())
        .run(&g)
        .unwrap_err();
    assert!(
        matches!(&e, RunError::UnknownProcess { addr, fault: "link from", .. } if addr == "node-c:1"),
        "{e:?}"
    );
    // Refused before anything ran: the initial event is still there for a correct run.
    let r = Simulation::new(1)
        .crash("node-b:1", Duration::from_secs(60))
        .link("node-a:1", "node-b:1", NetModel::default())
        .run(&g)
        .unwrap();
    assert_eq!(r.quit.unwrap().get::<i64>(0).unwrap(), 10);
    // An unmapped graph is one process, `sim:0`.
    let solo = Stage::new("solo", |_: Event, _: &mut Ctx| Ok(()));
    let mut g = Graph::new("solo");
    g.add(&solo);
    let e = Simulation::new(1)
        .crash("sim:1", Duration::ZERO)
        .run(&g)
        .unwrap_err();
    assert!(matches!(e, RunError::UnknownProcess { .. }), "{e:?}");
    assert!(
        Simulation::new(1)
            .crash("sim:0", Duration::ZERO)
            .run(&g)
            .is_ok()
    );
}

/// The initial events of a replicated cluster are dealt over its replicas, as a
/// launcher deals them. Before, the first replica took them all.
#[test]
fn initial_events_of_a_replicated_cluster_are_dealt_over_its_replicas() {
    let work = Stage::new("work", |_: Event, _: &mut Ctx| Ok(()));
    let a = Stage::new("a", |_: Event, _: &mut Ctx| Ok(()));
    let mut g = Graph::new("replicas");
    g.connect(&a, 1, &work);
    g.part([Cluster::of([&a]), Cluster::of([&work])])
        .unwrap()
        .map([vec!["a:1"], vec!["b:1", "b:2"]])
        .unwrap();
    for i in 0..10i64 {
        work.push(i);
    }
    let r = Simulation::new(1).run(&g).unwrap();
    let handled: Vec<u64> = r
        .processes
        .iter()
        .filter(|(addr, _)| addr.starts_with("b:"))
        .map(|(_, p)| p.stats.stage("work").unwrap().handled)
        .collect();
    assert_eq!(handled, vec![5, 5]);
}

/// A simulation's process reports add up as a real run's do: an activation waiting on
/// the virtual clock when a handler quits counts its event as discarded. Before, it
/// was dropped after the reports, in no count.
#[test]
fn a_simulation_s_counts_add_up_at_the_end() {
    let q = Stage::new("q", |_: Event, ctx: &mut Ctx| {
        let (c, sleep) = (ctx.clone(), ctx.sleep(Duration::from_millis(10)));
        ctx.wait(async move {
            sleep.await;
            c.quit(());
            Ok(())
        });
        Ok(())
    })
    .autostart(());
    let w = Stage::new("w", |_: Event, ctx: &mut Ctx| {
        let sleep = ctx.sleep(Duration::from_secs(1));
        ctx.wait(async move {
            sleep.await;
            Ok(())
        });
        Ok(())
    })
    .autostart(());
    let mut g = Graph::new("ends");
    g.add(&q);
    g.add(&w);
    let r = Simulation::new(1).run(&g).unwrap();
    for st in &r.processes[0].1.stats.stages {
        assert_eq!(
            st.events_in,
            st.handled + st.queue_len as u64 + st.discarded,
            "{st:?}"
        );
    }
    assert_eq!(r.processes[0].1.stats.stage("w").unwrap().discarded, 1);
}
