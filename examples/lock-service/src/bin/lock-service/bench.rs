//! The benchmark against etcd, with like guarantees: uncontended acquire+release latency
//! (p50, p99) and the throughput of one contended lock with 8 clients doing fenced
//! read-modify-writes of a counter file, for our service (`serve` nodes, one process each on
//! loopback; clients over TCP in this process, authenticated; leases of 10 s kept alive;
//! fences from the group's majority register) with 3 and 5 nodes and each algorithm, next to
//! an etcd cluster of as many members (v3 lock API through its JSON gateway, a 10 s lease per
//! client, the lock's revision as fence). Each round runs ours then etcd; after a warm-up
//! round, the medians over the rounds are printed as `BENCH` lines.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use leda_lock_service::app::{bump_counter, read_counter};
use leda_lock_service::etcd::{EtcdClient, loopback_members, spawn_cluster};
use leda_lock_service::remote::{ConnectOptions, LockClient};
use leda_lock_service::serving::start_group;
use leda_mutex::Algorithm;

/// Benchmark options.
#[derive(Args, Debug)]
pub struct BenchArgs {
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

/// A serving group of `n` nodes (this binary's `serve`, one process each, data in `dir`),
/// killed on drop.
struct Served {
    nodes: Vec<std::process::Child>,
    clients: Vec<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn serve_group(algorithm: Algorithm, n: usize, dir: &Path) -> anyhow::Result<Served> {
    let exe = std::env::current_exe()?;
    let addrs: Vec<String> = (0..n)
        .map(|_| {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .to_string())
        })
        .collect::<anyhow::Result<_>>()?;
    let (nodes, clients) = start_group(n, Duration::from_secs(30), |i| {
        let data = dir.join(format!("lock-bench-node{i}"));
        let _ = std::fs::remove_dir_all(&data);
        std::process::Command::new(&exe)
            .args(["serve", "--id", &i.to_string(), "--clients", "127.0.0.1:0"])
            .args([
                "--nodes",
                &addrs.join(","),
                "--algorithm",
                &algorithm.to_string(),
            ])
            .args(["--locks", "u,c"])
            .arg("--data-dir")
            .arg(&data)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            // Each round ends by killing the group: its "lost a process" lines are noise.
            .stderr(std::process::Stdio::null())
            .spawn()
    })?;
    Ok(Served { nodes, clients })
}

fn opts(name: &str) -> anyhow::Result<ConnectOptions> {
    Ok(ConnectOptions::new(name)?.ttl(LEASE))
}

/// The lease both services' clients hold their locks under.
const LEASE: Duration = Duration::from_secs(10);

/// Uncontended: one client of node 0, lock "u"; returns (p50, p99) in µs.
fn ours_uncontended(g: &Served, ops: usize) -> anyhow::Result<(f64, f64)> {
    let c = LockClient::connect(&g.clients[0], opts("bench-u")?)?;
    let wait = Duration::from_secs(30);
    let mut lat = Vec::with_capacity(ops);
    for i in 0..ops + ops / 5 {
        let t = Instant::now();
        let h = c.acquire("u", wait)?;
        c.release(h)?;
        if i >= ops / 5 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

/// Contended: `clients` clients spread over the nodes, each `ops` fenced increments of one
/// counter under lock "c"; returns acquisitions per second.
fn ours_contended(g: &Served, clients: usize, ops: usize, counter: &Path) -> anyhow::Result<f64> {
    std::fs::write(counter, "")?;
    let conns = (0..clients)
        .map(|k| {
            Ok(LockClient::connect(
                &g.clients[k % g.clients.len()],
                opts("bench-c")?,
            )?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = conns
            .iter()
            .map(|c| {
                s.spawn(move || -> anyhow::Result<()> {
                    for _ in 0..ops {
                        let h = c.acquire("c", Duration::from_secs(60))?;
                        bump_counter(counter, h.fence())?;
                        c.release(h)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client panicked"))??;
        }
        Ok(())
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let (count, _) = read_counter(counter)?;
    if count != (clients * ops) as u64 {
        bail!("ours: counter {count} != {}", clients * ops);
    }
    Ok((clients * ops) as f64 / elapsed)
}

fn etcd_uncontended(addr: &str, ops: usize) -> anyhow::Result<(f64, f64)> {
    let mut c = EtcdClient::connect(addr)?;
    let lease = c.lease_grant(LEASE.as_secs())?;
    let mut lat = Vec::with_capacity(ops);
    for i in 0..ops + ops / 5 {
        let t = Instant::now();
        let key = c.lock("u", &lease)?;
        c.unlock(&key)?;
        if i >= ops / 5 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        if i % 100 == 99 {
            c.keepalive(&lease)?;
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

fn etcd_contended(
    addrs: &[String],
    clients: usize,
    ops: usize,
    counter: &Path,
) -> anyhow::Result<f64> {
    std::fs::write(counter, "")?;
    let mut conns = (0..clients)
        .map(|k| {
            let mut c = EtcdClient::connect(&addrs[k % addrs.len()])?;
            let lease = c.lease_grant(LEASE.as_secs())?;
            Ok((c, lease))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|(c, lease)| {
                s.spawn(move || -> anyhow::Result<()> {
                    for _ in 0..ops {
                        let (key, fence) = c.lock_fenced("c", lease)?;
                        bump_counter(counter, fence)?;
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
    let (count, _) = read_counter(counter)?;
    if count != (clients * ops) as u64 {
        bail!("etcd: counter {count} != {}", clients * ops);
    }
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
    let ours_counter = args.dir.join("lock-bench-ours.counter");
    let etcd_counter = args.dir.join("lock-bench-etcd.counter");
    for &n in &args.nodes {
        // etcd with as many members as our group has nodes: both replicate to a majority.
        let data = args
            .dir
            .join(format!("lock-bench-etcd-{}", std::process::id()));
        let (mut members, etcd) = spawn_cluster(&loopback_members(n)?, &data, |_| {
            std::process::Stdio::null()
        })
        .context("starting etcd (apt-get install etcd-server)")?;
        let result = (|| -> anyhow::Result<()> {
            for &algorithm in &algorithms {
                let (mut o50, mut o99, mut e50, mut e99, mut ot, mut et) =
                    (vec![], vec![], vec![], vec![], vec![], vec![]);
                for round in 0..=args.rounds {
                    let g = serve_group(algorithm, n, &args.dir)?;
                    let (a, b) = ours_uncontended(&g, args.ops)?;
                    let (c, d) = etcd_uncontended(&etcd[0], args.ops)?;
                    let t_ours =
                        ours_contended(&g, args.clients, args.contended_ops, &ours_counter)?;
                    drop(g);
                    let t_etcd =
                        etcd_contended(&etcd, args.clients, args.contended_ops, &etcd_counter)?;
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
            Ok(())
        })();
        for m in &mut members {
            let _ = m.kill();
            let _ = m.wait();
        }
        let _ = std::fs::remove_dir_all(&data);
        result?;
    }
    Ok(())
}
