//! The copy of an event the runtime keeps while its handler runs, for the failure log
//! (a log subscriber that records failed events is installed, as in the applications):
//! it prints like the event, and holds no reference to a large binary, which the
//! handler may therefore take over. Its own test binary: the subscriber is global
//! (handlers run on the pool's threads).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use leda_core::prelude::*;

mod log;
use log::Log;

#[test]
fn handlers_take_over_large_binaries_and_failures_still_print_them() {
    let log = Log::install("warn");
    assert!(tracing::enabled!(
        target: "leda::failed_event",
        tracing::Level::WARN
    ));
    // The source sends binaries of three sizes to `take`, which records whether it held
    // each one alone, and one more to `fails`, whose handler fails on it.
    let sizes = [1 << 20, 4096, 100];
    let source = Stage::new("source", move |_, ctx: &mut Ctx| {
        for n in sizes {
            ctx.send("take", Event::from(Bytes::from(vec![7u8; n])).with("x"))?;
        }
        ctx.send(
            "fail",
            Event::from("big").with(Bytes::from(vec![1u8; 70_000])),
        )?;
        Ok(())
    })
    .autostart(());
    let alone = Arc::new(Mutex::new(Vec::new()));
    let a2 = alone.clone();
    let take = Stage::new("take", move |mut ev: Event, _: &mut Ctx| {
        let Value::Bytes(b) = ev.take(0) else {
            return Err("expected bytes".into());
        };
        let n = b.len();
        a2.lock().unwrap().push((n, b.try_into_mut().is_ok()));
        Ok(())
    });
    let fails = Stage::new("fails", |_: Event, _: &mut Ctx| Err("no, thanks".into()));
    let mut g = Graph::new("g");
    g.connect(&source, "take", &take).local();
    g.connect(&source, "fail", &fails).local();
    let r = g
        .run(
            Run::default()
                .threads(2)
                .until_idle()
                .timeout(Duration::from_secs(60)),
        )
        .unwrap();
    assert_eq!(r.reason, EndReason::Idle);
    let mut alone = alone.lock().unwrap().clone();
    alone.sort();
    // 4096 bytes and more: the handler holds the only reference. Shorter binaries are
    // shared with the copy (one count; a handler taking over those copies them).
    assert_eq!(alone, vec![(100, false), (4096, true), (1 << 20, true)]);
    let text = log.text();
    let line = text
        .lines()
        .find(|l| l.contains("leda::failed_event"))
        .unwrap_or_else(|| panic!("no failed-event line in:\n{text}"));
    assert!(line.contains("big\t<70000 bytes>"), "{line}");
    assert!(
        line.contains("no, thanks") && line.contains("fails"),
        "{line}"
    );
}
