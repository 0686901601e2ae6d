//! Transport benchmark: leda-net between two processes on loopback against a minimal
//! hand-written tokio TCP + rmp-serde sender/receiver doing the same work.
//!
//! ```text
//! cargo bench -p leda-net --bench transport
//! LEDA_BENCH_EVENTS=200000 LEDA_BENCH_ROUNDS=1 cargo bench -p leda-net --bench transport
//! ```
//!
//! Scenarios (medians over alternating rounds, after a warm-up):
//! * `remote-16B`, `remote-1KB`: events of a 16-byte / 1 KiB payload from a stage in
//!   this process to a stage in a daemon; events/s from deployment to the end of the run.
//! * `remote-latency-p50/p99`: round trips of one event (stage → remote echo stage →
//!   stage), in microseconds.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Node;
use leda_core::prelude::*;
use leda_net::Launcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ME: &str = "launcher:1";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ours_throughput(n: u64, size: usize) -> f64 {
    let node = Node::spawn(&["--threads", "2"]);
    let gen_ = stages::generator("gen");
    let drain = stages::drain("drain").attr("expect", n as i64);
    let mut g = Graph::new("bench");
    g.connect(&gen_, 1, &drain);
    g.part([Cluster::of([&gen_]), Cluster::of([&drain])])
        .expect("part")
        .map([ME, node.addr.as_str()])
        .expect("map");
    gen_.push((n as i64, size as i64, false));
    let t0 = Instant::now();
    let r = Launcher::new(ME)
        .run(&g, Run::default().threads(2))
        .expect("bench run");
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(
        r.run.quit.and_then(|q| q.arg(0).and_then(Value::as_int)),
        Some(n as i64)
    );
    let _ = node.finish(Duration::from_secs(10));
    n as f64 / secs
}

struct Raw {
    child: std::process::Child,
    addr: String,
}

impl Raw {
    fn spawn(args: &[&str]) -> Raw {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leda-net-test-node"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn raw peer");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("LISTENING");
        let addr = line.trim().trim_start_matches("LISTENING ").to_owned();
        Raw { child, addr }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn raw_throughput(n: u64, size: usize) -> f64 {
    let count = n.to_string();
    let peer = Raw::spawn(&["raw-recv", "--listen", "127.0.0.1:0", "--count", &count]);
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let t0 = Instant::now();
    rt().block_on(async {
        let mut s = tokio::net::TcpStream::connect(&peer.addr)
            .await
            .expect("connect");
        s.set_nodelay(true).expect("nodelay");
        let mut sent = 0u64;
        let mut frame = Vec::new();
        while sent < n {
            let k = (n - sent).min(1024);
            let batch: Vec<Vec<Value>> = (0..k)
                .map(|i| {
                    vec![if size == 0 {
                        Value::Int(i as i64)
                    } else {
                        Value::Bytes(payload.clone())
                    }]
                })
                .collect();
            frame.clear();
            frame.extend_from_slice(&[0; 4]);
            rmp_serde::encode::write(&mut frame, &batch).expect("encode");
            let len = (frame.len() - 4) as u32;
            frame[..4].copy_from_slice(&len.to_le_bytes());
            s.write_all(&frame).await.expect("write");
            sent += k;
        }
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).await.expect("ack");
    });
    n as f64 / t0.elapsed().as_secs_f64()
}

fn percentiles(mut v: Vec<u64>) -> (f64, f64) {
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64 / 1e3;
    (at(0.50), at(0.99))
}

fn ours_latency(samples: usize, warmup: usize) -> (f64, f64) {
    let node = Node::spawn(&["--threads", "2"]);
    let rtts = Arc::new(Mutex::new(Vec::with_capacity(samples)));
    let total = samples + warmup;
    let record = rtts.clone();
    let pinger = Stage::stateful(
        "ping",
        |_: &Attrs| -> Result<(Instant, usize), BoxError> { Ok((Instant::now(), 0)) },
        move |st: &mut (Instant, usize), _ev: Event, ctx: &mut Ctx| {
            if st.1 > warmup {
                let ns = st.0.elapsed().as_nanos() as u64;
                record.lock().unwrap_or_else(|e| e.into_inner()).push(ns);
            }
            st.1 += 1;
            if st.1 > total {
                ctx.quit(());
                return Ok(());
            }
            st.0 = Instant::now();
            ctx.send(1, st.1 as i64)?;
            Ok(())
        },
    )
    .serial();
    let echo = stages::echo("echo");
    let mut g = Graph::new("latency");
    g.connect(&pinger, 1, &echo);
    g.connect(&echo, 1, &pinger);
    g.part([Cluster::of([&pinger]), Cluster::of([&echo])])
        .expect("part")
        .map([ME, node.addr.as_str()])
        .expect("map");
    pinger.push(0);
    Launcher::new(ME)
        .run(&g, Run::default().threads(2))
        .expect("latency run");
    let _ = node.finish(Duration::from_secs(10));
    let v = std::mem::take(&mut *rtts.lock().unwrap_or_else(|e| e.into_inner()));
    percentiles(v)
}

fn raw_latency(samples: usize, warmup: usize) -> (f64, f64) {
    let peer = Raw::spawn(&["raw-echo", "--listen", "127.0.0.1:0"]);
    let mut rtts = Vec::with_capacity(samples);
    rt().block_on(async {
        let mut s = tokio::net::TcpStream::connect(&peer.addr)
            .await
            .expect("connect");
        s.set_nodelay(true).expect("nodelay");
        let mut buf = Vec::new();
        for i in 0..(samples + warmup) {
            let t0 = Instant::now();
            let batch = vec![vec![Value::Int(i as i64)]];
            let body = rmp_serde::to_vec(&batch).expect("encode");
            let mut frame = (body.len() as u32).to_le_bytes().to_vec();
            frame.extend_from_slice(&body);
            s.write_all(&frame).await.expect("write");
            let len = s.read_u32_le().await.expect("read") as usize;
            buf.resize(len, 0);
            s.read_exact(&mut buf).await.expect("read");
            let back: Vec<Vec<Value>> = rmp_serde::from_slice(&buf).expect("decode");
            assert_eq!(back.len(), 1);
            if i >= warmup {
                rtts.push(t0.elapsed().as_nanos() as u64);
            }
        }
    });
    percentiles(rtts)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_or("LEDA_BENCH_EVENTS", 1_000_000);
    let rounds = env_or("LEDA_BENCH_ROUNDS", 3).max(1) as usize;
    let samples = env_or("LEDA_BENCH_SAMPLES", 10_000) as usize;

    for (name, size) in [("remote-16B", 16usize), ("remote-1KB", 1024)] {
        // Warm-up (page cache, binaries, sockets).
        ours_throughput(n / 20 + 1, size);
        raw_throughput(n / 20 + 1, size);
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours.push(ours_throughput(n, size));
            raw.push(raw_throughput(n, size));
        }
        println!(
            "BENCH {name} unit=events/s better=higher ours={:.0} raw={:.0}",
            median(ours),
            median(raw)
        );
    }

    ours_latency(samples / 10 + 1, 100);
    raw_latency(samples / 10 + 1, 100);
    let (mut o50, mut o99, mut r50, mut r99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (a, b) = ours_latency(samples, 1000);
        o50.push(a);
        o99.push(b);
        let (a, b) = raw_latency(samples, 1000);
        r50.push(a);
        r99.push(b);
    }
    println!(
        "BENCH remote-latency-p50 unit=us better=lower ours={:.1} raw={:.1}",
        median(o50),
        median(r50)
    );
    println!(
        "BENCH remote-latency-p99 unit=us better=lower ours={:.1} raw={:.1}",
        median(o99),
        median(r99)
    );
}
