//! A small pipeline with the dashboard on, to look at:
//! `cargo run --release -p leda-core --example dashboard -- 127.0.0.1:8088 [seconds] [stats.jsonl]`
//! then open http://127.0.0.1:8088/ (stats at /stats, Prometheus text at /metrics,
//! the graph at /graph and /graph.dot). With a third argument, the run also writes its
//! statistics there once a second (chart them with `leda plot stats.jsonl -o out.png`).
//!
//! A source sends bursts of about 2,000 events/s to `parse`, `validate` rejects one
//! event in 50 (the errors chart), and `store` (1 ms per event, one instance) falls
//! behind: its queue grows and its box turns red. Add threads or raise `store`'s
//! maxpar from the page and watch the backlog drain.

use std::time::Duration;

use leda_core::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:8088".into());
    let secs: u64 = match args.get(1) {
        Some(s) => s
            .parse()
            .map_err(|_| format!("seconds: '{s}' is not a number"))?,
        None => 60,
    };
    let source = Stage::asynchronous("source", |_, mut ctx: Ctx| async move {
        for i in 0i64.. {
            ctx.send_wait("out", i).await?;
            if i % 20 == 0 {
                ctx.sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    })
    .autostart(());
    let parse = Stage::new("parse", |ev: Event, ctx: &mut Ctx| {
        let i = ev.get::<i64>(0)?;
        ctx.send_or_wait("item", (i, format!("item-{i}")))?;
        Ok(())
    });
    let validate = Stage::new("validate", |ev: Event, ctx: &mut Ctx| {
        let i = ev.get::<i64>(0)?;
        if i % 50 == 49 {
            return Err(format!("item {i} is invalid").into());
        }
        ctx.send_or_wait("valid", ev)?;
        Ok(())
    });
    let store = Stage::new("store", |_, _| {
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    })
    .maxpar(1)
    .capacity(5000);
    let mut g = Graph::new("demo");
    g.connect(&source, "out", &parse);
    g.connect(&parse, "item", &validate).local();
    g.connect(&validate, "valid", &store);
    let mut run = Run::default().threads(2).dashboard(addr);
    if let Some(path) = args.get(2) {
        run = run.stats_file(path, Duration::from_secs(1));
    }
    let running = g.start(run)?;
    if let Some(a) = running.dashboard_addr() {
        println!("dashboard: http://{a}/");
    }
    std::thread::sleep(Duration::from_secs(secs));
    running.handle().quit(());
    running.wait()?;
    Ok(())
}
