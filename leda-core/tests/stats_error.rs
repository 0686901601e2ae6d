//! A statistics file that cannot be written ends the run with an error, after the
//! worker pool is stopped (it used to return early and leave the workers running).
//! Alone in its test binary: it counts this process's worker threads.

use std::time::Duration;

use leda_core::prelude::*;

/// Threads of this process named like the pool's workers.
fn workers_alive() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with("leda-worker"))
        })
        .count()
}

#[test]
fn unwritable_stats_file_ends_the_run_and_stops_the_pool() {
    let busy = Stage::asynchronous("busy", |_: Event, ctx: Ctx| async move {
        loop {
            ctx.sleep(Duration::from_millis(5)).await;
        }
    })
    .autostart(());
    let mut g = Graph::new("g");
    g.add(&busy);
    let r = g.run(
        Run::default()
            .threads(2)
            .stats_file("/dev/full", Duration::from_millis(10))
            .timeout(Duration::from_secs(20)),
    );
    let err = r.expect_err("writing to /dev/full must fail the run");
    assert!(
        err.to_string().contains("stats file"),
        "unexpected error: {err}"
    );
    assert_eq!(workers_alive(), 0, "the run returned with workers running");
}
