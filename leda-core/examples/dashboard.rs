//! A small three-stage pipeline with the dashboard on, to look at:
//! `cargo run --release -p leda-core --example dashboard -- 127.0.0.1:8088 [seconds]`
//! then open http://127.0.0.1:8088/ (stats at /stats, Prometheus text at /metrics).

use std::time::Duration;

use leda_core::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:8088".into());
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    // 2,000 events/s into a parser, then a slow stage (1 ms each) that backs up.
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
        ctx.send_or_wait(1, format!("item-{}", ev.get::<i64>(0)?))?;
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
    g.connect(&parse, 1, &store).local();
    let running = g.start(Run::default().threads(2).dashboard(addr))?;
    if let Some(a) = running.dashboard_addr() {
        println!("dashboard: http://{a}/");
    }
    std::thread::sleep(Duration::from_secs(secs));
    running.handle().quit(());
    running.wait()?;
    Ok(())
}
