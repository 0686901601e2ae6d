//! A Leda daemon with the test stage kinds, for the multi-process tests and the
//! transport benchmark.
//!
//! ```text
//! leda-net-test-node daemon --listen 127.0.0.1:0 [--threads N] [--secret S]
//! ```
//!
//! Prints `LISTENING <addr>` once bound, serves one deployment, prints
//! `ENDED <reason>` and exits 0 (1 on error).
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

use leda_net::{Daemon, DaemonConfig};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEDA_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let mode = args.next();
    if let Some(m @ ("raw-recv" | "raw-echo")) = mode.as_deref() {
        raw_mode(m, args.collect());
        return;
    }
    if mode.as_deref() != Some("daemon") {
        eprintln!("usage: leda-net-test-node daemon --listen HOST:PORT [--threads N] [--secret S]");
        std::process::exit(2);
    }
    let config = match DaemonConfig::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leda-net-test-node: {e}");
            std::process::exit(2);
        }
    };
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
    match daemon.serve() {
        Ok(r) => {
            println!(
                "ENDED {:?} sent={} delivered={} failed={} accepted={}",
                r.run.reason,
                r.transport.sent,
                r.transport.delivered,
                r.transport.failed,
                r.transport.accepted
            );
        }
        Err(e) => {
            eprintln!("leda-net-test-node: {e}");
            std::process::exit(1);
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
