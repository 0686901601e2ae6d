//! Transport benchmark: leda-net between two processes on loopback against a minimal
//! hand-written tokio TCP + rmp-serde sender/receiver doing the same work.
//!
//! ```text
//! cargo bench -p leda-net --bench transport
//! LEDA_BENCH_EVENTS=1000000 LEDA_BENCH_ROUNDS=1 LEDA_BENCH_LATENCY_MS=300 cargo bench -p leda-net --bench transport
//! ```
//!
//! (`LEDA_BENCH_LATENCY_RATE=N` paces the latency runs at N events/s instead;
//! `LEDA_BENCH_SCENARIOS=16B,1KB,latency` picks scenarios; `LEDA_BENCH_ONLY=ours` or
//! `raw` runs one side alone, for profiling; `LEDA_BENCH_PERCENTILES=1` prints each
//! latency round's distribution, p50 to p99.9, on stderr. The pacing sends at least one
//! event per 100 µs tick: rates under 10,000 events/s run at 10,000.)
//!
//! Ours and the raw peer run on mimalloc (this binary and `leda-net-test-node`), the
//! allocator of the `leda` CLI's daemons.
//!
//! Scenarios (each figure the median over alternating rounds, after a warm-up, with
//! the rounds' minimum and maximum: `ours=`, `ours_min=`, `ours_max=`, the same for
//! `raw` and `ours_tls`):
//! * `remote-16B`, `remote-1KB`: events of a 16-byte / 1 KiB payload (5,000,000 /
//!   1,000,000 a round; `LEDA_BENCH_EVENTS` sets the first, the second is a fifth of it)
//!   from a stage in this process to a stage in a daemon; events/s from deployment to
//!   the end of the run. One daemon serves all of a scenario's rounds, as a `leda
//!   daemon` serves deployment after deployment (`ours_tls=`: the same over mutual TLS,
//!   with a daemon of its own; `LEDA_BENCH_TLS=0` leaves it out). The raw receiver is a
//!   fresh process per round (it has no state worth warming).
//! * `remote-latency-p50/p99`: round trips (stage → remote echo stage → stage), in
//!   microseconds, at about 10 % of our peak 16-byte rate (events paced every 100 µs);
//!   the raw peer paces the same events through its echo server.

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

/// Ours and the raw peer alike run on the `leda` CLI's allocator (so do the daemons:
/// the test node sets it too).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ME: &str = "launcher:1";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A daemon with 2 worker threads (under TLS with `tls`) that serves deployment
/// after deployment, like a user's `leda daemon`: every round of a scenario deploys
/// to the same one. (A fresh process per round made each round pay the daemon's
/// first touch of its memory: 36 MB of fresh huge pages, zeroed in the first 40 ms of
/// a 130 ms round.)
fn daemon(tls: Option<&leda_net::TlsConfig>) -> Node {
    Node::daemon(&["--threads", "2"], tls)
}

/// Our events/s, deployed to `node`; under TLS (mutual certificates) with `tls`.
fn ours_throughput(node: &Node, n: u64, size: usize, tls: Option<&leda_net::TlsConfig>) -> f64 {
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
    let mut launcher = Launcher::new(ME);
    if let Some(t) = tls {
        launcher = launcher.tls(t.clone());
    }
    let r = launcher
        .run(&g, Run::default().threads(2))
        .expect("bench run");
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(
        r.run.quit.and_then(|q| q.arg(0).and_then(Value::as_int)),
        Some(n as i64)
    );
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
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64 / 1e3;
    if std::env::var_os("LEDA_BENCH_PERCENTILES").is_some() {
        let ps = [0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999];
        let line: Vec<String> = ps
            .iter()
            .map(|&p| format!("p{}={:.0}", p * 100.0, at(p)))
            .collect();
        eprintln!("# round trips: n={} {} (us)", v.len(), line.join(" "));
    }
    (at(0.50), at(0.99))
}

/// Nanoseconds since the first call (one clock for senders and receivers of this
/// process: round trips are measured where they start).
fn now_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Pacing period: every `TICK`, `rate * TICK` events leave at once.
const TICK: Duration = Duration::from_micros(100);

/// Events per tick and the number of ticks for `rate` events/s during `secs`.
fn pacing(rate: f64, secs: f64) -> (usize, usize) {
    let per_tick = (rate * TICK.as_secs_f64()).round().max(1.0) as usize;
    let ticks = (secs / TICK.as_secs_f64()).round().max(1.0) as usize;
    (per_tick, ticks)
}

/// Round-trip latency at `rate` events/s: a pacing stage here sends `(seq, t_ns)`
/// events to an echo stage in a daemon, which sends them back to a recording stage
/// here. The first tenth of the samples is a warm-up.
fn ours_latency(node: &Node, rate: f64, secs: f64) -> (f64, f64) {
    let (per_tick, ticks) = pacing(rate, secs);
    let total = per_tick * ticks;
    let rtts = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let record = rtts.clone();
    let pace = Stage::new("pace", move |_ev: Event, ctx: &mut Ctx| {
        let start = Instant::now();
        let mut seq = 0i64;
        for t in 1..=ticks {
            for _ in 0..per_tick {
                // The clock starts before the send: time spent waiting for credit
                // (a backlog at the receiver) counts as latency.
                let mut ev = Event::from((seq, now_ns() as i64));
                loop {
                    match ctx.try_send(1, ev) {
                        Ok(()) => break,
                        Err(r) if matches!(r.error, SendError::QueueFull { .. }) => {
                            ev = r.event;
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        Err(r) => {
                            // Do not leave the run waiting for events that never come.
                            ctx.quit(());
                            return Err(r.error.into());
                        }
                    }
                }
                seq += 1;
            }
            // The tick's events leave now, not when this (long) call returns.
            ctx.flush();
            let next = start + TICK * t as u32;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
        }
        Ok(())
    });
    let recorder = Stage::stateful(
        "record",
        |_: &Attrs| -> Result<usize, BoxError> { Ok(0) },
        move |got: &mut usize, ev: Event, ctx: &mut Ctx| {
            let sent: i64 = ev.get(1)?;
            let rtt = now_ns().saturating_sub(sent as u64);
            *got += 1;
            if *got > total / 10 {
                record.lock().unwrap_or_else(|e| e.into_inner()).push(rtt);
            }
            if *got == total {
                ctx.quit(());
            }
            Ok(())
        },
    )
    .serial()
    .nonblocking();
    let echo = stages::echo("echo");
    let mut g = Graph::new("latency");
    g.connect(&pace, 1, &echo);
    g.connect(&echo, 1, &recorder);
    g.part([Cluster::of([&pace, &recorder]), Cluster::of([&echo])])
        .expect("part")
        .map([ME, node.addr.as_str()])
        .expect("map");
    pace.push(0);
    Launcher::new(ME)
        .run(&g, Run::default().threads(2))
        .expect("latency run");
    let v = std::mem::take(&mut *rtts.lock().unwrap_or_else(|e| e.into_inner()));
    percentiles(v)
}

/// The same with the hand-written peer: a pacing thread writes one frame of
/// `(seq, t_ns)` events per tick, the echo server sends each frame back, a reading
/// thread records the round trips.
fn raw_latency(rate: f64, secs: f64) -> (f64, f64) {
    use std::io::{Read, Write};
    let peer = Raw::spawn(&["raw-echo", "--listen", "127.0.0.1:0"]);
    let (per_tick, ticks) = pacing(rate, secs);
    let total = per_tick * ticks;
    let mut s = std::net::TcpStream::connect(&peer.addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let mut rd = s.try_clone().expect("clone");
    let reader = std::thread::spawn(move || {
        let mut rtts = Vec::with_capacity(total);
        let mut got = 0usize;
        let mut buf = Vec::new();
        while got < total {
            let mut len = [0u8; 4];
            rd.read_exact(&mut len).expect("read");
            buf.resize(u32::from_le_bytes(len) as usize, 0);
            rd.read_exact(&mut buf).expect("read");
            let batch: Vec<Vec<Value>> = rmp_serde::from_slice(&buf).expect("decode");
            let now = now_ns();
            for ev in batch {
                let sent = ev.get(1).and_then(Value::as_int).unwrap_or(0) as u64;
                got += 1;
                if got > total / 10 {
                    rtts.push(now.saturating_sub(sent));
                }
            }
        }
        rtts
    });
    let start = Instant::now();
    let mut seq = 0i64;
    let mut frame = Vec::new();
    for t in 1..=ticks {
        let batch: Vec<Vec<Value>> = (0..per_tick)
            .map(|_| {
                seq += 1;
                vec![Value::Int(seq), Value::Int(now_ns() as i64)]
            })
            .collect();
        frame.clear();
        frame.extend_from_slice(&[0; 4]);
        rmp_serde::encode::write(&mut frame, &batch).expect("encode");
        let len = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        s.write_all(&frame).expect("write");
        let next = start + TICK * t as u32;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
    }
    let rtts = reader.join().expect("reader");
    percentiles(rtts)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `NAME=median NAME_min=min NAME_max=max` of the rounds (nothing if none ran).
fn spread(name: &str, v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return String::new();
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let med = median(v.to_vec());
    format!(" {name}={med:.digits$} {name}_min={min:.digits$} {name}_max={max:.digits$}")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // 16-byte rounds move 5,000,000 events (about half a second each), 1 KiB rounds a
    // fifth of that: rounds of 1,000,000 16-byte events lasted 75-130 ms, and start-up
    // transients (fresh threads' heaps, page zeroing, wake-ups) made ours read 0.55x
    // raw there against 0.76x over 5,000,000 (same binaries, a minute apart).
    let n = env_or("LEDA_BENCH_EVENTS", 5_000_000);
    let rounds = env_or("LEDA_BENCH_ROUNDS", 3).max(1) as usize;
    let latency_secs = env_or("LEDA_BENCH_LATENCY_MS", 1000) as f64 / 1e3;
    let mut peak_16b = 0.0;
    // `LEDA_BENCH_ONLY=ours` runs our side alone (for profiling); `raw` the peer alone.
    let only = std::env::var("LEDA_BENCH_ONLY").unwrap_or_default();
    let (run_ours, run_raw) = (only != "raw", only != "ours");
    // `LEDA_BENCH_SCENARIOS=16B,latency` runs those scenarios alone (default: all).
    let scenarios = std::env::var("LEDA_BENCH_SCENARIOS").unwrap_or_default();
    let wanted = |s: &str| scenarios.is_empty() || scenarios.split(',').any(|x| x.trim() == s);
    // Our transport under TLS too (`ours_tls=`), unless `LEDA_BENCH_TLS=0`.
    let tls = (run_ours && env_or("LEDA_BENCH_TLS", 1) != 0)
        .then(|| common::pki::pki(&common::scratch("bench-tls"), "bench"));

    for (name, size, n) in [("remote-16B", 16usize, n), ("remote-1KB", 1024, n / 5)] {
        if !wanted(name.trim_start_matches("remote-")) {
            continue;
        }
        let node = daemon(None);
        let tls_node = tls.as_ref().map(|t| daemon(Some(t)));
        // Warm-up (page cache, binaries, sockets, the daemons' memory).
        if run_ours {
            ours_throughput(&node, n / 20 + 1, size, None);
        }
        if let (Some(t), Some(tn)) = (&tls, &tls_node) {
            ours_throughput(tn, n / 20 + 1, size, Some(t));
        }
        if run_raw {
            raw_throughput(n / 20 + 1, size);
        }
        let (mut ours, mut raw, mut ours_tls) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            if run_ours {
                ours.push(ours_throughput(&node, n, size, None));
            }
            if run_raw {
                raw.push(raw_throughput(n, size));
            }
            if let (Some(t), Some(tn)) = (&tls, &tls_node) {
                ours_tls.push(ours_throughput(tn, n, size, Some(t)));
            }
        }
        if size == 16 {
            peak_16b = median(ours.clone());
        }
        println!(
            "BENCH {name} unit=events/s better=higher{}{}{}",
            spread("ours", &ours, 0),
            spread("raw", &raw, 0),
            spread("ours_tls", &ours_tls, 0)
        );
    }

    if !wanted("latency") {
        return;
    }
    // Latency at about a tenth of our peak 16-byte rate (the same rate for both).
    let rate = match env_or("LEDA_BENCH_LATENCY_RATE", 0) {
        0 => (peak_16b / 10.0).max(1000.0),
        r => r as f64,
    };
    println!("# remote-latency: round trips at {rate:.0} events/s for {latency_secs} s");
    let node = daemon(None);
    if run_ours {
        ours_latency(&node, rate, 0.2);
    }
    if run_raw {
        raw_latency(rate, 0.2);
    }
    let (mut o50, mut o99, mut r50, mut r99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        if run_ours {
            let (a, b) = ours_latency(&node, rate, latency_secs);
            o50.push(a);
            o99.push(b);
        }
        if run_raw {
            let (a, b) = raw_latency(rate, latency_secs);
            r50.push(a);
            r99.push(b);
        }
    }
    println!(
        "BENCH remote-latency-p50 unit=us better=lower{}{}",
        spread("ours", &o50, 1),
        spread("raw", &r50, 1)
    );
    println!(
        "BENCH remote-latency-p99 unit=us better=lower{}{}",
        spread("ours", &o99, 1),
        spread("raw", &r99, 1)
    );
}
