//! `util.*` stages: timer, print, map, average, broadcast, roundrobin, switch, quit.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leda_core::prelude::*;
use leda_stages::util;

#[test]
fn timer_forwards_extra_args_count_times_then_ends() {
    let t = util::timer();
    let (out, got) = sink("out");
    let mut g = Graph::new("t");
    g.connect(&t, 1, &out);
    t.push((0.02, 3, "url", 7));
    let start = Instant::now();
    run(&g);
    let got = take(&got);
    assert_eq!(got, vec![vec![s("url"), Value::Int(7)]; 3]);
    assert!(start.elapsed() >= Duration::from_millis(60));
}

#[test]
fn timers_wait_without_holding_the_only_worker() {
    // Ten timers of 100 ms on ONE worker thread: if a waiting timer held the thread
    // they would take a second; asynchronous waits overlap.
    let t = util::timer();
    let (out, got) = sink("out");
    let mut g = Graph::new("t");
    g.connect(&t, 1, &out);
    for i in 0..10 {
        t.push((0.1, 1, i));
    }
    let start = Instant::now();
    g.run(
        Run::default()
            .threads(1)
            .until_idle()
            .timeout(Duration::from_secs(10)),
    )
    .unwrap();
    assert_eq!(take(&got).len(), 10);
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn forever_timer_runs_until_quit() {
    let t = util::timer();
    let q = util::quit().attr("count", 4);
    let mut g = Graph::new("t");
    g.connect(&t, 1, &q);
    t.push((0.01, -1, "tick"));
    let r = g
        .run(Run::default().threads(1).timeout(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(r.quit.unwrap().get::<String>(0).unwrap(), "tick");
}

#[test]
fn timer_rejects_bad_arguments() {
    let t = util::timer();
    let (errs, got) = sink("errs");
    let mut g = Graph::new("t");
    g.connect(&t, "error", &errs);
    t.push(("soon", 1));
    t.push((0, -1));
    t.push((-1.0, 1));
    t.push((0.01, "x"));
    run(&g);
    let got = take(&got);
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|e| e[0] == s("timer")));
}

#[test]
fn print_formats_like_lua_and_appends_to_a_file() {
    let ev = Event::new()
        .with("a")
        .with(1)
        .with(2.5)
        .with(Value::Nil)
        .with(ints(&[1, 2]));
    assert_eq!(util::format_event(&ev), "a\t1\t2.5\tnil\t{1, 2}");
    let dir = std::env::temp_dir().join(format!("leda-stages-print-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let p = util::print().attr("file", dir.to_string_lossy().into_owned());
    let (out, got) = sink("out");
    let mut g = Graph::new("p");
    g.connect(&p, 1, &out);
    assert!(p.is_serial());
    p.push(("x", 1));
    p.push(("y", 2));
    run(&g);
    let text = std::fs::read_to_string(&dir).unwrap();
    let _ = std::fs::remove_file(&dir);
    assert_eq!(text, "x\t1\ny\t2\n");
    assert_eq!(take(&got).len(), 2, "forwarded on port 1");
}

#[test]
fn map_applies_builtins_gsub_and_rust_functions() {
    let cases: Vec<(Stage, Value, Value)> = vec![
        (
            util::map().attr("fn", "decimal_point"),
            Value::Array(vec![s("1,5"), s("2")]),
            Value::Array(vec![s("1.5"), s("2")]),
        ),
        (
            util::map().attr("fn", "tonumber"),
            Value::Array(vec![s("1"), s("2.5"), s("x")]),
            Value::Array(vec![Value::Int(1), Value::Float(2.5), Value::Nil]),
        ),
        (util::map().attr("fn", "upper"), s("ab"), s("AB")),
        (
            util::map().attr("pattern", "(%d+)").attr("replace", "<%1>"),
            Value::Array(vec![s("a1b22")]),
            Value::Array(vec![s("a<1>b<22>")]),
        ),
        (
            util::map_with("double", |v| {
                Ok(Value::Int(v.as_int().ok_or("not an int")? * 2))
            }),
            ints(&[1, 2, 3]),
            ints(&[2, 4, 6]),
        ),
        (
            util::map().attr("fn", "trim"),
            Value::Array(vec![]),
            Value::Array(vec![]),
        ),
    ];
    for (m, input, want) in cases {
        let (out, got) = sink("out");
        let mut g = Graph::new("m");
        g.connect(&m, 1, &out);
        m.push(input);
        run(&g);
        assert_eq!(take(&got), vec![vec![want]]);
    }
}

#[test]
fn map_bind_and_element_errors() {
    let (out, _) = sink("out");
    for (m, needle) in [
        (util::map(), "must be set"),
        (util::map().attr("fn", "nope"), "not a built-in"),
        (
            util::map().attr("fn", "upper").attr("pattern", "x"),
            "conflicts",
        ),
        (
            util::map().attr("pattern", "(").attr("replace", ""),
            "bad Lua pattern",
        ),
    ] {
        let mut g = Graph::new("m");
        g.connect(&m, 1, &out);
        let msg = refused(&g);
        assert!(msg.contains(needle), "{msg}");
    }
    let m = util::map().attr("fn", "upper");
    let mut g = Graph::new("m");
    g.add(&m);
    assert!(refused(&g).contains("port 1 must be connected"));

    let m = util::map_with("strict", |v| {
        v.as_int()
            .map(Value::Int)
            .ok_or_else(|| "not an int".to_owned())
    });
    let (out, got) = sink("out");
    let (errs, egot) = sink("errs");
    let mut g = Graph::new("m");
    g.connect(&m, 1, &out);
    g.connect(&m, "error", &errs);
    m.push(Value::Array(vec![Value::Int(1), s("x")]));
    m.push(Event::new());
    run(&g);
    assert!(take(&got).is_empty());
    let e = take(&egot);
    assert_eq!(e.len(), 2);
    assert!(
        e.iter()
            .any(|x| x[1].as_str().unwrap().contains("element 2: not an int"))
    );
}

#[test]
fn average_of_arrays_args_and_strings() {
    assert_eq!(
        util::mean(&[Value::Int(1), Value::Float(2.0), s(" 3 ")]).unwrap(),
        2.0
    );
    assert!(util::mean(&[]).unwrap_err().contains("empty"));
    assert!(util::mean(&[s("x")]).unwrap_err().contains("element 1"));
    let a = util::average();
    let (out, got) = sink("out");
    let (errs, egot) = sink("errs");
    let mut g = Graph::new("a");
    g.connect(&a, 1, &out);
    g.connect(&a, "error", &errs);
    a.push(ints(&[1, 2, 3, 4]));
    a.push((10, 20));
    a.push(Value::Array(vec![]));
    run(&g);
    let mut got: Vec<f64> = take(&got)
        .iter()
        .map(|e| e[0].as_float().unwrap())
        .collect();
    got.sort_by(f64::total_cmp);
    assert_eq!(got, vec![2.5, 15.0]);
    assert_eq!(take(&egot).len(), 1, "empty vector is an error");
}

#[test]
fn broadcast_copies_to_every_port() {
    let b = util::broadcast().attr("ports", Value::Array(vec![s("audit")]));
    let (o1, g1) = sink("o1");
    let (o2, g2) = sink("o2");
    let (o3, g3) = sink("o3");
    let mut g = Graph::new("b");
    g.connect(&b, 1, &o1);
    g.connect(&b, 2, &o2);
    g.connect(&b, "audit", &o3);
    b.push(("x", 1));
    run(&g);
    for got in [g1, g2, g3] {
        assert_eq!(take(&got), vec![vec![s("x"), Value::Int(1)]]);
    }
    let b = util::broadcast();
    let mut g = Graph::new("b");
    g.connect(&b, "other", &o1);
    assert!(refused(&g).contains("port 1 must be connected"));
    let b = util::broadcast().attr("ports", Value::Array(vec![s("nope")]));
    let mut g = Graph::new("b");
    g.connect(&b, 1, &o1);
    assert!(refused(&g).contains("'nope' is listed but not connected"));
}

#[test]
fn roundrobin_deals_in_turn() {
    let r = util::roundrobin();
    assert!(r.is_serial());
    let (o1, g1) = sink("o1");
    let (o2, g2) = sink("o2");
    let (o3, g3) = sink("o3");
    let mut g = Graph::new("r");
    g.connect(&r, 1, &o1);
    g.connect(&r, 2, &o2);
    g.connect(&r, 3, &o3);
    for i in 0..7 {
        r.push(i);
    }
    run(&g);
    let ids = |got| {
        take(&got)
            .iter()
            .map(|e| e[0].as_int().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(g1), vec![0, 3, 6]);
    assert_eq!(ids(g2), vec![1, 4]);
    assert_eq!(ids(g3), vec![2, 5]);
    let r = util::roundrobin();
    let mut g = Graph::new("r");
    g.connect(&r, 2, &o2);
    assert!(refused(&g).contains("port 1 must be connected"));
}

#[test]
fn switch_routes_by_key_field_and_default() {
    let sw = util::switch().attr("key", 2).attr("default", "other");
    let (a, ga) = sink("a");
    let (b, gb) = sink("b");
    let (o, go) = sink("o");
    let mut g = Graph::new("s");
    g.connect(&sw, "GET", &a);
    g.connect(&sw, 3, &b);
    g.connect(&sw, "other", &o);
    sw.push(("x", "GET"));
    sw.push(("y", 3));
    sw.push(("z", "PUT"));
    run(&g);
    assert_eq!(take(&ga), vec![vec![s("x"), s("GET")]]);
    assert_eq!(take(&gb), vec![vec![s("y"), Value::Int(3)]]);
    assert_eq!(take(&go), vec![vec![s("z"), s("PUT")]]);

    let sw = util::switch().attr("field", "kind");
    let (e, ge) = sink("e");
    let mut g = Graph::new("s");
    g.connect(&sw, "alarm", &a);
    g.connect(&sw, "error", &e);
    sw.push(Value::Map(vec![(s("kind"), s("alarm"))]));
    sw.push(Value::Map(vec![(s("kind"), s("unknown"))]));
    sw.push(Event::new());
    run(&g);
    assert_eq!(take(&ga).len(), 1);
    assert_eq!(take(&ge).len(), 2, "unknown key and missing key are errors");

    let sw = util::switch().attr("default", "nowhere");
    let mut g = Graph::new("s");
    g.connect(&sw, 1, &a);
    assert!(refused(&g).contains("default port 'nowhere' is not connected"));
    let sw = util::switch().attr("key", 0);
    let mut g = Graph::new("s");
    g.connect(&sw, 1, &a);
    assert!(refused(&g).contains("positive integer"));
}

#[test]
fn quit_ends_with_the_nth_event() {
    let q = util::quit().attr("count", 2);
    q.push("first");
    q.push("second");
    q.push("third");
    let mut g = Graph::new("q");
    g.add(&q);
    let r = g
        .run(Run::default().threads(1).timeout(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(r.reason, EndReason::Quit);
    assert_eq!(r.quit.unwrap().get::<String>(0).unwrap(), "second");
}

/// A review (2026-11-27): `file` of print and `count` of quit were checked only when an event came.
#[test]
fn print_and_quit_check_their_attributes_in_bind() {
    for (st, needle) in [
        (util::print().attr("file", 5), "'file' must be a path"),
        (util::print().attr("file", ""), "'file' must be a path"),
        (
            util::quit().attr("count", 0),
            "'count' must be a positive integer",
        ),
        (
            util::quit().attr("count", -5),
            "'count' must be a positive integer",
        ),
    ] {
        let mut g = Graph::new("p");
        g.add(&st);
        let msg = refused(&g);
        assert!(msg.contains(needle), "{msg}");
    }
}

#[test]
fn print_to_a_file_it_cannot_open_fails_its_events() {
    // The file is opened where the stage runs, for its first event: not in bind.
    let p = util::print().attr("file", "/nonexistent/leda/dir/out.txt");
    let (errs, got) = sink("errs");
    let mut g = Graph::new("p");
    g.connect(&p, "error", &errs);
    p.push("x");
    run(&g);
    let e = take(&got);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0][1]
            .as_str()
            .unwrap()
            .contains("open /nonexistent/leda/dir/out.txt"),
        "{:?}",
        e[0]
    );
}

/// A review (2026-11-27): a finite but huge period (1e20 s) panicked in `Duration::from_secs_f64`; it
/// is an error of that event, with a message.
#[test]
fn timer_refuses_a_period_no_duration_holds() {
    let t = util::timer();
    let (errs, got) = sink("errs");
    let mut g = Graph::new("t");
    g.connect(&t, "error", &errs);
    t.push((1e20, 1));
    run(&g);
    let got = take(&got);
    assert_eq!(got.len(), 1, "{got:?}");
    let msg = got[0][1].as_str().unwrap();
    assert!(msg.contains("argument 1 (period)"), "{msg}");
    assert!(!msg.contains("panic"), "{msg}");
}

#[test]
fn map_forwards_extra_arguments() {
    let m = util::map().attr("fn", "decimal_point");
    let (out, got) = sink("out");
    let mut g = Graph::new("m");
    g.connect(&m, 1, &out);
    m.push((Value::Array(vec![s("1,5")]), "PETR4", 3));
    run(&g);
    assert_eq!(
        take(&got),
        vec![vec![
            Value::Array(vec![s("1.5")]),
            s("PETR4"),
            Value::Int(3)
        ]]
    );
}
