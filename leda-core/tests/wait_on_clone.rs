//! `Ctx::wait` on a clone of a handler's `Ctx` (an async handler's) parks nothing: the
//! future is never polled. It used to vanish silently; it is dropped with an error in
//! the log. Its own test binary: the log subscriber is global.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leda_core::prelude::*;

mod log;
use log::Log;

#[test]
fn a_wait_on_a_clone_of_the_ctx_is_reported_not_lost_silently() {
    let log = Log::install("error");
    let polled = Arc::new(AtomicBool::new(false));
    let p2 = polled.clone();
    let stage = Stage::asynchronous("async", move |_: Event, mut ctx: Ctx| {
        let p3 = p2.clone();
        async move {
            ctx.wait(async move {
                p3.store(true, Ordering::SeqCst);
                Ok(())
            });
            Ok(())
        }
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.add(&stage);
    g.run(
        Run::default()
            .threads(2)
            .until_idle()
            .timeout(Duration::from_secs(30)),
    )
    .unwrap();
    assert!(
        !polled.load(Ordering::SeqCst),
        "nothing polls a clone's wait"
    );
    let text = log.text();
    assert!(
        text.contains("Ctx::wait on a clone") && text.contains("async"),
        "{text}"
    );
}
