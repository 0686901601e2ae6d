//! `window.*` stages: sliding, spatial, time.

mod common;

use std::time::Duration;

use common::*;
use leda_core::prelude::*;
use leda_stages::{util, window};

fn feed(w: &Stage, events: Vec<Event>) -> Vec<Vec<Value>> {
    let (out, got) = sink("out");
    let mut g = Graph::new("w");
    g.connect(w, 1, &out);
    for e in events {
        w.push(e);
    }
    run(&g);
    take(&got)
}

fn nums(xs: &[i64]) -> Vec<Event> {
    xs.iter().map(|&x| Event::from(x)).collect()
}

#[test]
fn sliding_emits_the_last_n_after_each_event_once_full() {
    let w = window::sliding().attr("size", 3);
    assert!(w.is_serial());
    let got = feed(&w, nums(&[1, 2, 3, 4, 5]));
    assert_eq!(
        got,
        vec![
            vec![ints(&[1, 2, 3])],
            vec![ints(&[2, 3, 4])],
            vec![ints(&[3, 4, 5])]
        ]
    );
    // Fewer events than the size: nothing; ticks are ignored.
    let w = window::sliding().attr("size", 3);
    let mut evs = nums(&[1, 2]);
    evs.push(Event::new());
    assert!(feed(&w, evs).is_empty());
    // Size 1, multi-argument elements.
    let w = window::sliding().attr("size", 1);
    assert_eq!(
        feed(&w, vec![Event::from(("a", 1))]),
        vec![vec![Value::Array(vec![Value::Array(vec![
            s("a"),
            Value::Int(1)
        ])])]]
    );
}

#[test]
fn spatial_emits_disjoint_windows_and_flushes_on_a_tick() {
    let w = window::spatial().attr("size", 2);
    assert!(w.is_serial());
    let mut evs = nums(&[1, 2, 3, 4, 5]);
    evs.push(Event::new());
    evs.push(Event::new()); // an empty window is never emitted
    let got = feed(&w, evs);
    assert_eq!(
        got,
        vec![vec![ints(&[1, 2])], vec![ints(&[3, 4])], vec![ints(&[5])]]
    );
    let w = window::spatial().attr("size", 4);
    assert!(feed(&w, vec![Event::new()]).is_empty());
}

#[test]
fn time_window_closes_after_its_interval_and_on_ticks() {
    // Elements 1, 2 in the first 100 ms window; 3 arrives later and closes it; a
    // tick flushes 3.
    let w = window::time().attr("time", 0.1);
    let (out, got) = sink("out");
    let delay = Stage::asynchronous("delay", |ev: Event, mut ctx: Ctx| async move {
        let ms: u64 = ev.get(0)?;
        ctx.sleep(Duration::from_millis(ms)).await;
        let v = ev.arg(1).cloned().unwrap_or(Value::Nil);
        if v.is_nil() {
            ctx.send_wait(1, Event::new()).await?;
        } else {
            ctx.send_wait(1, v).await?;
        }
        Ok(())
    })
    .maxpar(8);
    let mut g = Graph::new("w");
    g.connect(&delay, 1, &w);
    g.connect(&w, 1, &out);
    delay.push((0, 1));
    delay.push((30, 2));
    delay.push((250, 3));
    delay.push((400, Value::Nil));
    run(&g);
    assert_eq!(take(&got), vec![vec![ints(&[1, 2])], vec![ints(&[3])]]);
}

#[test]
fn timer_ticks_drive_a_time_window() {
    let t = util::timer();
    let w = window::time().attr("time", 10.0);
    let (out, got) = sink("out");
    let mut g = Graph::new("w");
    g.connect(&t, 1, &w);
    g.connect(&w, 1, &out);
    for x in 1..=3 {
        w.push(x);
    }
    t.push((0.05, 1)); // one tick, no extra args
    run(&g);
    assert_eq!(take(&got), vec![vec![ints(&[1, 2, 3])]]);
}

#[test]
fn windows_check_their_attributes_and_port() {
    let (out, _) = sink("out");
    for (w, needle) in [
        (window::sliding(), "must be set"),
        (window::sliding().attr("size", 0), "positive integer"),
        (window::spatial().attr("size", "big"), "positive integer"),
        (window::spatial(), "must be set"),
        (window::time(), "must be set"),
        (window::time().attr("time", -1), "positive number"),
    ] {
        let mut g = Graph::new("w");
        g.connect(&w, 1, &out);
        let msg = refused(&g);
        assert!(msg.contains(needle), "{msg}");
    }
    let w = window::spatial().attr("size", 3);
    let mut g = Graph::new("w");
    g.add(&w);
    assert!(refused(&g).contains("port 1 must be connected"));
}

/// A review (2026-11-27): a huge `size` (1e15, i64::MAX) is a window that never fills, not an
/// allocation of `size` elements up front (which aborted the process, or panicked with
/// "capacity overflow" in `init`).
#[test]
fn a_huge_size_allocates_nothing_up_front() {
    for size in [Value::Float(1e15), Value::Int(i64::MAX)] {
        let w = window::spatial().attr("size", size.clone());
        let mut evs = nums(&[1, 2, 3]);
        evs.push(Event::new());
        assert_eq!(
            feed(&w, evs),
            vec![vec![ints(&[1, 2, 3])]],
            "spatial {size}"
        );

        let w = window::sliding().attr("size", size.clone());
        let (out, got) = sink("out");
        let mut g = Graph::new("w");
        g.connect(&w, 1, &out);
        for e in nums(&[1, 2, 3]) {
            w.push(e);
        }
        let report = run(&g);
        assert!(take(&got).is_empty());
        let stage = report.stats.stage("sliding").expect("sliding stats");
        assert_eq!((stage.handled, stage.errors), (3, 0), "sliding {size}");

        let m = window::merge()
            .attr("size", size.clone())
            .attr("sources", 1);
        let (out, got) = sink("out");
        let mut g = Graph::new("w");
        g.connect(&m, 1, &out);
        m.push((1.0, 0, "a"));
        m.push((2.0, 0, "b"));
        m.push(0);
        run(&g);
        assert_eq!(
            take(&got),
            vec![vec![Value::Array(vec![s("a"), s("b")])]],
            "merge {size}"
        );
    }
}

/// A review (2026-11-27): a `time` no `Duration` holds (1e20 s) is refused in bind, naming it.
#[test]
fn time_window_refuses_a_huge_time_in_bind() {
    let (out, _) = sink("out");
    let w = window::time().attr("time", 1e20);
    let mut g = Graph::new("w");
    g.connect(&w, 1, &out);
    let msg = refused(&g);
    assert!(
        msg.contains("'time' must be a positive number of seconds"),
        "{msg}"
    );
}
