//! A Leda daemon with the test stage kinds, for the multi-process tests and the
//! transport benchmark.
//!
//! ```text
//! leda-net-test-node daemon --listen 127.0.0.1:0 [--threads N] [--secret-file PATH] [--once]
//! leda-net-test-node launch --me ADDR --daemon ADDR [--events N] [--ms MS] [--silence-ms MS]
//! ```
//!
//! A daemon prints `LISTENING <addr>` once bound, then for each deployment it serves
//! `ENDED <reason> ... peer_memory=<bytes read from peers' memory so far>` and one `ROUTE from to sent delivered failed discarded` line
//! per route it sent on, and `LOST <process>` per lost process; with `--once` it
//! exits 0 after the first (1 on error).
//!
//! `launch` runs the generator here and a slow consumer (`--ms` per event) on the
//! daemon, a run that lasts; it prints `STARTED`, then `DONE` or `FAILED <error>`
//! (exit 3): the launcher of the chaos tests that kill a launcher.
//!
//! The benchmark's hand-written peer runs from the same binary:
//!
//! ```text
//! leda-net-test-node raw-recv --listen 127.0.0.1:0 --count N
//! leda-net-test-node raw-echo --listen 127.0.0.1:0
//! ```

mod raw;
mod stages;

use std::io::Write;

use leda_net::Daemon;

/// The allocator of the `leda` CLI, whose daemons this node stands for (and of the
/// raw peer it also runs: the transport bench compares both on it).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let mode = args.next();
    if let Some(m @ ("raw-recv" | "raw-echo")) = mode.as_deref() {
        raw_mode(m, args.collect());
        return;
    }
    if mode.as_deref() == Some("launch") {
        launch(args.collect());
        return;
    }
    if mode.as_deref() != Some("daemon") {
        eprintln!(
            "usage: leda-net-test-node daemon --listen HOST:PORT [--threads N] [--secret-file PATH]"
        );
        std::process::exit(2);
    }
    #[derive(clap::Parser)]
    #[command(name = "leda-net-test-node daemon")]
    struct DaemonCli {
        #[command(flatten)]
        daemon: leda_net::cli::DaemonArgs,
    }
    let config =
        <DaemonCli as clap::Parser>::parse_from(std::iter::once("daemon".to_owned()).chain(args))
            .daemon
            .config();
    let daemon = match Daemon::bind(config, stages::registry()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("leda-net-test-node: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "LISTENING {}", daemon.local_addr());
    let _ = out.flush();
    drop(out);
    let served = daemon.serve(|r| {
        let mut out = std::io::stdout().lock();
        let t = &r.transport;
        let _ = writeln!(
            out,
            "ENDED {:?} sent={} delivered={} failed={} discarded={} accepted={} routes={} lost={} \
             peer_memory={}",
            r.run.reason,
            t.sent,
            t.delivered,
            t.failed,
            t.discarded,
            t.accepted,
            r.routes.len(),
            r.lost.len(),
            leda_net::link::peer_memory_read()
        );
        for c in &r.routes {
            let _ = writeln!(
                out,
                "ROUTE {} {} {} {} {} {}",
                c.from, c.to, c.sent, c.delivered, c.failed, c.discarded
            );
        }
        for l in &r.lost {
            let _ = writeln!(out, "LOST {} {l}", l.process);
        }
        let _ = out.flush();
    });
    if let Err(e) = served {
        eprintln!("leda-net-test-node: {e}");
        std::process::exit(1);
    }
}

/// `launch`: see the crate docs.
fn launch(args: Vec<String>) {
    use leda_core::prelude::*;
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let me = flag("--me").unwrap_or_else(|| "launcher:1".into());
    let Some(daemon) = flag("--daemon") else {
        eprintln!("launch needs --daemon ADDR");
        std::process::exit(2);
    };
    let n: i64 = flag("--events")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let ms: i64 = flag("--ms").and_then(|v| v.parse().ok()).unwrap_or(1);
    let gen_ = stages::generator("gen");
    let slow = stages::slow("slow").attr("ms", ms).capacity(64);
    let mut g = Graph::new("chaos-launch");
    g.connect(&gen_, 1, &slow);
    let parted = g
        .part([Cluster::of([&gen_]), Cluster::of([&slow])])
        .and_then(|g| g.map([me.as_str(), daemon.as_str()]));
    if let Err(e) = parted {
        eprintln!("launch: {e}");
        std::process::exit(2);
    }
    gen_.push((n, 0, true));
    let mut launcher = leda_net::Launcher::new(me);
    if let Some(ms) = flag("--silence-ms").and_then(|v| v.parse().ok()) {
        launcher = launcher.liveness(leda_net::Liveness::with_silence(
            std::time::Duration::from_millis(ms),
        ));
    }
    let launched = match launcher.start(&g, Run::default().threads(1)) {
        Ok(l) => l,
        Err(e) => {
            println!("FAILED {e}");
            std::process::exit(3);
        }
    };
    println!("STARTED");
    let _ = std::io::stdout().flush();
    match launched.wait() {
        Ok(_) => println!("DONE"),
        Err(e) => {
            println!("FAILED {e}");
            std::process::exit(3);
        }
    }
}

fn raw_mode(mode: &str, args: Vec<String>) {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let listen = flag("--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let count: u64 = flag("--count").and_then(|c| c.parse().ok()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("LISTENING {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        if mode == "raw-recv" {
            raw::recv(listener, count).await
        } else {
            raw::echo(listener).await
        }
    });
    if let Err(e) = result {
        eprintln!("leda-net-test-node {mode}: {e}");
        std::process::exit(1);
    }
}
