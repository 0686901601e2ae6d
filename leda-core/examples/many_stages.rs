//! How the runtime's bookkeeping grows with the number of stages: a chain of N stages
//! is built, verified, started, snapshotted and ended (each step should grow about
//! linearly; the snapshot, taken every second of a run, was quadratic).
//!
//! ```text
//! cargo run --release -p leda-core --example many_stages [N...]
//! ```

use std::time::{Duration, Instant};

use leda_core::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() {
        vec![5_000, 10_000, 20_000]
    } else {
        sizes
    };
    for n in sizes {
        let t = Instant::now();
        let stages: Vec<Stage> = (0..n)
            .map(|i| {
                Stage::new(format!("s{i}"), |ev: Event, ctx: &mut Ctx| {
                    ctx.send(1, ev)?;
                    Ok(())
                })
            })
            .collect();
        let mut g = Graph::new("chain");
        for w in stages.windows(2) {
            g.connect(&w[0], 1, &w[1]);
        }
        let build = t.elapsed();
        let t = Instant::now();
        g.verify()?;
        let verify = t.elapsed();
        let t = Instant::now();
        let running = g.start(Run::default().threads(2))?;
        let start = t.elapsed();
        let h = running.handle();
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        h.snapshot();
        let snapshot = t.elapsed();
        h.quit(());
        let t = Instant::now();
        running.wait()?;
        let end = t.elapsed();
        println!(
            "stages={n} build_ms={:.1} verify_ms={:.1} start_ms={:.1} snapshot_ms={:.1} end_ms={:.1}",
            ms(build),
            ms(verify),
            ms(start),
            ms(snapshot),
            ms(end)
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
