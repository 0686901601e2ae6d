//! The benchmark against etcd: uncontended acquire+release latency (p50, p99) and the
//! throughput of one contended lock with 8 clients, for our service with 3 and 5 nodes
//! (one process per node on loopback) and each algorithm, next to a local etcd's v3 lock API.
//! Each round runs ours then etcd; after a warm-up round, the medians over the rounds are
//! printed as `BENCH` lines.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use leda_lock_service::app::{bump_counter, read_counter};
use leda_lock_service::etcd::EtcdClient;
use leda_lock_service::group::{ServiceConfig, Side};
use leda_mutex::Algorithm;

use crate::launch::{DaemonProc, Group};

/// Benchmark options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// etcd client address (host:port).
    #[arg(long, default_value = "127.0.0.1:2379")]
    etcd: String,
    /// Measured rounds (after one warm-up round).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Acquire+release pairs per uncontended measurement.
    #[arg(long, default_value_t = 300)]
    ops: usize,
    /// Acquisitions per client in the contended measurement.
    #[arg(long, default_value_t = 60)]
    contended_ops: usize,
    /// Contending clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Group sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    nodes: Vec<usize>,
    /// Algorithms.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ricart-agrawala,suzuki-kasami,naimi-trehel"
    )]
    algorithms: Vec<String>,
    /// Directory for the counter files.
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

fn spawn_daemons(n: usize) -> anyhow::Result<Vec<DaemonProc>> {
    (0..n).map(|_| DaemonProc::spawn()).collect()
}

/// Uncontended: one API client at node 0, lock "u"; returns (p50, p99) in µs.
fn ours_uncontended(algorithm: Algorithm, nodes: usize, ops: usize) -> anyhow::Result<(f64, f64)> {
    let daemons = spawn_daemons(nodes - 1)?;
    let addrs: Vec<String> = daemons.iter().map(|d| d.addr.clone()).collect();
    let cfg = ServiceConfig {
        algorithm,
        nodes,
        resources: vec!["u".into()],
    };
    let idle = (1..nodes)
        .map(|_| Side::Worker {
            clients: 0,
            iters: 0,
            resource: "u".into(),
            counter: String::new(),
        })
        .collect();
    let group = Group::start(&cfg, idle, nodes, &addrs)?;
    let c = group.client.clone();
    let wait = Duration::from_secs(30);
    let mut lat = Vec::with_capacity(ops);
    for i in 0..ops + ops / 5 {
        let t = Instant::now();
        let g = c.acquire("u", wait)?;
        c.release(g)?;
        if i >= ops / 5 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    group
        .handle()
        .inject(group.done, ("done", 0i64, 0i64, 0i64).into())
        .map_err(|r| anyhow::anyhow!("reporting: {}", r.error))?;
    group.wait()?;
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

/// Contended: `clients` worker clients spread over nodes 1.., each `ops` guarded increments of
/// one counter; returns acquisitions per second.
fn ours_contended(
    algorithm: Algorithm,
    nodes: usize,
    clients: usize,
    ops: usize,
    counter: &Path,
) -> anyhow::Result<f64> {
    std::fs::write(counter, "")?;
    let daemons = spawn_daemons(nodes - 1)?;
    let addrs: Vec<String> = daemons.iter().map(|d| d.addr.clone()).collect();
    let cfg = ServiceConfig {
        algorithm,
        nodes,
        resources: vec!["c".into()],
    };
    let per = |i: usize| clients / (nodes - 1) + usize::from(i < clients % (nodes - 1));
    let sides = (0..nodes - 1)
        .map(|i| Side::Worker {
            clients: per(i),
            iters: ops,
            resource: "c".into(),
            counter: counter.to_string_lossy().into_owned(),
        })
        .collect();
    // Deployment is not timed; the workers start as soon as it completes, so the first few
    // acquisitions may precede the timer (a small overestimate, amortised by `ops`).
    let group = Group::start(&cfg, sides, nodes - 1, &addrs)?;
    let started = Instant::now();
    group.wait()?;
    let elapsed = started.elapsed().as_secs_f64();
    let (count, _) = read_counter(counter)?;
    if count != (clients * ops) as u64 {
        bail!("{algorithm}: counter {count} != {}", clients * ops);
    }
    Ok((clients * ops) as f64 / elapsed)
}

fn etcd_uncontended(addr: &str, ops: usize) -> anyhow::Result<(f64, f64)> {
    let mut c = EtcdClient::connect(addr)?;
    let lease = c.lease_grant(60)?;
    let mut lat = Vec::with_capacity(ops);
    for i in 0..ops + ops / 5 {
        let t = Instant::now();
        let key = c.lock("u", &lease)?;
        c.unlock(&key)?;
        if i >= ops / 5 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

fn etcd_contended(addr: &str, clients: usize, ops: usize, counter: &Path) -> anyhow::Result<f64> {
    std::fs::write(counter, "")?;
    let mut conns = (0..clients)
        .map(|_| {
            let mut c = EtcdClient::connect(addr)?;
            let lease = c.lease_grant(60)?;
            Ok((c, lease))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let fence = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|(c, lease)| {
                let fence = &fence;
                s.spawn(move || -> anyhow::Result<()> {
                    for _ in 0..ops {
                        let key = c.lock("c", lease)?;
                        // etcd's lock has no fencing token of its own here: count grants.
                        let f = fence.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        bump_counter(counter, f)?;
                        c.unlock(&key)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("an etcd client panicked"))??;
        }
        Ok(())
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok((clients * ops) as f64 / elapsed)
}

/// Runs the benchmark and prints `BENCH` lines.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let algorithms: Vec<Algorithm> = args
        .algorithms
        .iter()
        .map(|a| a.parse::<Algorithm>())
        .collect::<Result<_, _>>()?;
    if args.nodes.iter().any(|&n| n < 2) {
        bail!("--nodes: at least 2 nodes per group");
    }
    EtcdClient::connect(&args.etcd)
        .with_context(|| format!("connecting to etcd at {}", args.etcd))?;
    let ours_counter = args.dir.join("lock-bench-ours.counter");
    let etcd_counter = args.dir.join("lock-bench-etcd.counter");
    for &n in &args.nodes {
        for &algorithm in &algorithms {
            let (mut o50, mut o99, mut e50, mut e99, mut ot, mut et) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            for round in 0..=args.rounds {
                let (a, b) = ours_uncontended(algorithm, n, args.ops)?;
                let (c, d) = etcd_uncontended(&args.etcd, args.ops)?;
                let t_ours = ours_contended(
                    algorithm,
                    n,
                    args.clients,
                    args.contended_ops,
                    &ours_counter,
                )?;
                let t_etcd =
                    etcd_contended(&args.etcd, args.clients, args.contended_ops, &etcd_counter)?;
                eprintln!(
                    "round {round} n={n} {algorithm}: ours p50 {a:.0}us p99 {b:.0}us {t_ours:.0}/s; etcd p50 {c:.0}us p99 {d:.0}us {t_etcd:.0}/s{}",
                    if round == 0 { " (warm-up)" } else { "" }
                );
                if round > 0 {
                    o50.push(a);
                    o99.push(b);
                    e50.push(c);
                    e99.push(d);
                    ot.push(t_ours);
                    et.push(t_etcd);
                }
            }
            let case = format!("n{n}-{algorithm}");
            println!(
                "BENCH lock-uncontended-p50-{case} unit=us better=lower ours={:.1} etcd={:.1}",
                median(o50),
                median(e50)
            );
            println!(
                "BENCH lock-uncontended-p99-{case} unit=us better=lower ours={:.1} etcd={:.1}",
                median(o99),
                median(e99)
            );
            println!(
                "BENCH lock-contended-{}clients-{case} unit=acquisitions/s better=higher ours={:.0} etcd={:.0}",
                args.clients,
                median(ot),
                median(et)
            );
        }
    }
    Ok(())
}
