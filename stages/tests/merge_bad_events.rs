//! `window.merge` and bad events: each fails alone, and the merge keeps what it held.

mod common;

use common::*;
use leda_core::prelude::*;
use leda_stages::window;

/// A late element (port `late` not connected), an element of a source that does not
/// exist and one whose time is not a number, between good ones: each fails (to the
/// `error` port), and the windows hold every good element. Before, the failure destroyed
/// the merge's instance: `{a, b, c}, {d}` came out as `{c, d}`.
#[test]
fn a_bad_event_fails_alone_and_the_merge_keeps_its_elements() {
    let m = window::merge().attr("size", 3).attr("sources", 1);
    let (out, got) = sink("out");
    let (errors, failed) = sink("errors");
    let mut g = Graph::new("merge");
    g.connect(&m, 1, &out);
    g.connect(&m, "error", &errors);
    m.push((1.0, 0, "a"));
    m.push((2.0, 0, "b"));
    m.push((0.5, 0, "late"));
    m.push((3.0, 7, "no such source"));
    m.push(("three", 0, "no time"));
    m.push((3.0, 0, "c"));
    m.push((4.0, 0, "d"));
    m.push(0);
    run(&g);
    assert_eq!(
        take(&got),
        vec![
            vec![Value::Array(vec![s("a"), s("b"), s("c")])],
            vec![Value::Array(vec![s("d")])],
        ]
    );
    assert_eq!(take(&failed).len(), 3);
}

/// A number of sources that cannot be allocated is refused before the run (it aborted
/// the process: one queue per source, allocated when the merge starts).
#[test]
fn absurd_sources_are_refused_in_bind() {
    let m = window::merge()
        .attr("size", 3)
        .attr("sources", 1_000_000_000_000_000i64);
    let (out, _) = sink("out");
    let mut g = Graph::new("merge");
    g.connect(&m, 1, &out);
    let e = refused(&g);
    assert!(e.contains("sources") && e.contains("at most"), "{e}");
}
