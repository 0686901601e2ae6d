//! The lock service, one process per node.
//!
//! A long-lived group that clients in other processes use (see `docs/mutex.md`):
//!
//! ```text
//! lock-service serve --id 1 --nodes A0,A1,A2 --clients 127.0.0.1:7411 --data-dir D1   # and 2
//! lock-service serve --id 0 --nodes A0,A1,A2 --clients 127.0.0.1:7410 --data-dir D0 \
//!     --algorithm quorum-grid --locks deploy
//! lock-service lock deploy --connect 127.0.0.1:7410 -- COMMAND   # LOCK_FENCE set
//! ```
//!
//! Test workloads deployed for one run:
//!
//! ```text
//! # one daemon per node except node 0 (each prints `LISTENING 127.0.0.1:PORT`)
//! lock-service daemon --listen 127.0.0.1:0
//! # node 0: deploys nodes 1.. to the daemons, runs API clients itself, checks the counter
//! lock-service run --algorithm ricart-agrawala --daemons ADDR1,ADDR2 --counter /tmp/counter \
//!     --clients 2 --iters 50 --api-clients 2
//! ```
//!
//! Every worker client (on the daemons) and API client (in the launcher, through
//! `LocalClient::acquire`) increments the counter file under the lock, refusing stale fencing
//! tokens. The run prints `RESULT count=C expected=E refused=R` and fails unless `C == E` and
//! `R == 0`: no update was lost.
//!
//! The crash-tolerant quorum algorithm survives killed nodes:
//!
//! ```text
//! lock-service run --algorithm quorum --quorum vcube --daemons A1,A2,A3 --counter /tmp/c \
//!     --doomed-nodes 3 --detector-period-ms 20 --detector-timeout-ms 400
//! ```
//!
//! runs the VCube failure detector's stages beside every node. Nodes that may be killed
//! mid-run must not hold increments the final count expects:
//!
//! - `--passive-nodes` run no clients (arbiters only);
//! - `--doomed-nodes` run workers that contend for the same lock for ever but count in their
//!   own file `<counter>.node<J>`; the run does not wait for them (it ends when the others are
//!   done), so killing one, even inside the critical section, loses nothing the check counts.
//!
//! Multi-resource locks (`acquire_all`) across the same processes:
//!
//! ```text
//! lock-service run --daemons A1,A2 --counter /tmp/c --multi-algorithm bouabdallah-laforest \
//!     --multi-locks a,b,c --multi-iters 20
//! ```
//!
//! adds a multi node stage (`multi<i>`) to every node; each API client and each worker client
//! of the active daemon nodes (neither passive nor doomed), after its single-lock increments,
//! `acquire_all`s a random subset (at least 2) of the multi locks `--multi-iters` times (a
//! lock `NAME:K` has `K` instances; a client asks for 1..=K of them) and, holding them,
//! increments one counter file per instance held (`<counter>.multi-<NAME>-<I>`), refusing a
//! fencing token not newer than the file's last one. The run prints `MULTI algorithm=...
//! clients=C grants=G expected_grants=E counts=a:Ca,... expected=a:Ea,... stale=S` and fails
//! unless `G == E`, every count equals its expected count and `S == 0`.
//!
//! The launcher prints `STARTED nodes=N` once the group is deployed, and `NOTICE observer=0
//! crashed=J evidence=...` when node 0's detector learns that node `J` crashed.
//!
//! `lock-service bench --etcd 127.0.0.1:2379` compares the service (its own daemons, spawned
//! as child processes) with etcd's lock API; see `examples/lock-service/bench.sh`.

mod bench;
mod launch;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use launch::MultiWork;
use leda_core::prelude::*;
use leda_lock_service::app::{
    MultiTally, bump_counter, decode_multi_report, multi_client, multi_counter_path,
    parse_multi_lock, read_counter,
};
use leda_lock_service::client::LocalClient;
use leda_lock_service::group::{Detection, ServiceConfig, Side, registry};
use leda_lock_service::multi::MultiServiceConfig;
use leda_mutex::Algorithm;
use leda_mutex::ft_quorum::Generator;
use leda_mutex::ft_quorum::detector::{DetectorConfig, Evidence, NoticeObserver};
use leda_mutex::multi::MultiAlgorithm;
use leda_net::Daemon;

#[derive(Parser, Debug)]
#[command(
    version,
    name = "lock-service",
    about = "Leda-RS distributed lock service (one process per node)"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a daemon that hosts one node (prints `LISTENING ADDR` first).
    Daemon(leda_net::cli::DaemonArgs),
    /// Run one node of a long-lived group with a client port (prints `CLIENTS ADDR`; node 0
    /// then `SERVING ...` once the group is up).
    Serve(serve::ServeArgs),
    /// Run a command while holding a lock of a serving group (`LOCK_FENCE` in its
    /// environment); the command is terminated if the lock is lost.
    Lock(serve::LockArgs),
    /// Benchmark against etcd (BENCH lines on stdout).
    Bench(bench::BenchArgs),
    /// Deploy nodes 1.. to the daemons, run node 0 here, hammer the counter, check it.
    Run {
        /// Algorithm (ricart-agrawala, suzuki-kasami, naimi-trehel, ..., quorum-grid,
        /// quorum-tree, quorum-vcube; `quorum` with `--quorum`).
        #[arg(long, default_value = "ricart-agrawala")]
        algorithm: String,
        /// The quorum generator of the crash-tolerant quorum algorithm: grid, tree or vcube
        /// (needs `--algorithm quorum`).
        #[arg(long)]
        quorum: Option<String>,
        /// Failure detector: time between testing rounds, milliseconds (quorum algorithms).
        #[arg(long, default_value_t = 50)]
        detector_period_ms: u64,
        /// Failure detector: how long a test may go unanswered, milliseconds.
        #[arg(long, default_value_t = 200)]
        detector_timeout_ms: u64,
        /// Daemon nodes (1..) that run no worker clients: arbiters only, which a test may kill.
        #[arg(long, value_delimiter = ',')]
        passive_nodes: Vec<usize>,
        /// Daemon nodes (1..) whose workers request the lock for ever and count in their own
        /// file `<counter>.node<J>`; the run does not wait for them (a test kills them).
        #[arg(long, value_delimiter = ',')]
        doomed_nodes: Vec<usize>,
        /// Daemon addresses, comma-separated (one node each).
        #[arg(long, value_delimiter = ',', required = true)]
        daemons: Vec<String>,
        /// The shared counter file.
        #[arg(long)]
        counter: PathBuf,
        /// The lock's name.
        #[arg(long, default_value = "counter")]
        resource: String,
        /// Worker clients per daemon node.
        #[arg(long, default_value_t = 2)]
        clients: usize,
        /// Increments per client.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// API clients (threads using LocalClient) in this process.
        #[arg(long, default_value_t = 2)]
        api_clients: usize,
        /// Per-acquire timeout of the API clients, seconds.
        #[arg(long, default_value_t = 30)]
        acquire_timeout: u64,
        /// Multi-resource algorithm for `--multi-locks`: incremental, bouabdallah-laforest,
        /// lejeune, lejeune-loan or grid-aware.
        #[arg(long)]
        multi_algorithm: Option<String>,
        /// Multi-resource locks `NAME[:K]` (K instances, default 1), comma-separated, at least
        /// 2; the API clients and the active daemon nodes' workers `acquire_all` random
        /// subsets of them.
        #[arg(long, value_delimiter = ',')]
        multi_locks: Vec<String>,
        /// `acquire_all` rounds per client (with `--multi-locks`).
        #[arg(long, default_value_t = 20)]
        multi_iters: usize,
        /// Seed of the clients' random subsets (API client `c` uses `seed + c`; the workers of
        /// node `j` mix `j` in).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// An API client: `iters` guarded increments under the single lock, then (with `multi`) its
/// `acquire_all` rounds; returns (written, refused) of the single lock and the multi tally.
fn api_client(
    client: &LocalClient,
    resource: &str,
    counter: &std::path::Path,
    iters: usize,
    timeout: Duration,
    multi: Option<(&MultiWork, u64)>,
) -> anyhow::Result<(i64, i64, MultiTally)> {
    let (written, refused) = single_client(client, resource, counter, iters, timeout)?;
    let tally = match multi {
        Some((work, c)) => multi_client(
            client,
            &work.cfg.resources,
            counter,
            work.rounds,
            work.seed.wrapping_add(c),
            timeout,
        )?,
        None => MultiTally::default(),
    };
    Ok((written, refused, tally))
}

fn single_client(
    client: &LocalClient,
    resource: &str,
    counter: &std::path::Path,
    iters: usize,
    timeout: Duration,
) -> anyhow::Result<(i64, i64)> {
    let (mut written, mut refused) = (0, 0);
    for _ in 0..iters {
        let grant = client
            .acquire(resource, timeout)
            .with_context(|| format!("acquiring {resource}"))?;
        if bump_counter(counter, grant.fencing_token)? {
            written += 1;
        } else {
            refused += 1;
        }
        client.release(grant).context("releasing")?;
    }
    Ok((written, refused))
}

/// Increments per client of a doomed node: more than any run makes (it is killed, or the run
/// ends without waiting for it).
const DOOMED_ITERS: usize = 1_000_000_000;

/// Prints node 0's crash notices as they come (`NOTICE observer=0 crashed=J evidence=...`).
#[derive(Debug, Default)]
struct NoticePrinter {
    seen: std::sync::atomic::AtomicUsize,
}

impl NoticeObserver for NoticePrinter {
    fn crashed(&self, _time: f64, observer: usize, crashed: usize, evidence: Evidence) {
        self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // A closed stdout must not fail the detector.
        let _ = writeln!(
            out,
            "NOTICE observer={observer} crashed={crashed} evidence={evidence:?}"
        );
        let _ = out.flush();
    }
}

/// The multi-resource work from `--multi-algorithm`, `--multi-locks`, `--multi-iters`, `--seed`.
fn pick_multi(
    algorithm: Option<&str>,
    locks: &[String],
    rounds: usize,
    seed: u64,
    single: &str,
) -> anyhow::Result<Option<MultiWork>> {
    let algorithm: MultiAlgorithm = match (algorithm, locks.is_empty()) {
        (None, true) => return Ok(None),
        (None, false) => bail!("--multi-locks needs --multi-algorithm"),
        (Some(a), true) => bail!("--multi-algorithm {a} needs --multi-locks"),
        (Some(a), false) => a.parse()?,
    };
    let resources = locks
        .iter()
        .map(|l| parse_multi_lock(l))
        .collect::<Result<Vec<_>, _>>()?;
    if resources.len() < 2 {
        bail!("--multi-locks: at least 2 locks (the clients ask for subsets of 2 or more)");
    }
    if !algorithm.multi_instance()
        && let Some((name, k)) = resources.iter().find(|(_, k)| *k > 1)
    {
        bail!("--multi-locks {name}:{k}: {algorithm} allocates single-instance locks only");
    }
    if let Some((name, _)) = resources.iter().find(|(name, _)| name == single) {
        bail!("--multi-locks {name}: also the single lock (--resource)");
    }
    Ok(Some(MultiWork {
        cfg: MultiServiceConfig {
            algorithm,
            resources,
        },
        workers: vec![],
        rounds,
        seed,
    }))
}

/// Formats `name:count,...` over the multi locks (0 for a lock never counted).
fn per_lock(locks: &[(String, u32)], counts: &std::collections::BTreeMap<String, u64>) -> String {
    locks
        .iter()
        .map(|(name, _)| format!("{name}:{}", counts.get(name).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The algorithm from `--algorithm` and `--quorum`.
fn pick_algorithm(algorithm: &str, quorum: Option<&str>) -> anyhow::Result<Algorithm> {
    let algorithm: Algorithm = algorithm.parse()?;
    match quorum {
        None => Ok(algorithm),
        Some(q) => {
            let g: Generator = q.parse()?;
            if algorithm.generator().is_none() {
                bail!("--quorum {q} needs --algorithm quorum (got {algorithm})");
            }
            Ok(Algorithm::Quorum(g))
        }
    }
}

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit_code("lock-service", run())
}

fn run() -> anyhow::Result<ExitCode> {
    match Args::parse().cmd {
        Cmd::Serve(args) => serve::serve(args),
        Cmd::Lock(args) => serve::lock(args),
        Cmd::Bench(args) => {
            bench::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Daemon(args) => {
            let daemon = Daemon::bind(args.config(), registry())?;
            leda_core::cli::announce_listening(daemon.local_addr())?;
            use std::io::Write;
            let mut out = std::io::stdout();
            daemon.serve(|report| {
                // Whoever started us may have stopped reading: a closed stdout is not an
                // error.
                let _ = writeln!(out, "ENDED {:?}", report.run.reason);
                let _ = out.flush();
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            algorithm,
            quorum,
            detector_period_ms,
            detector_timeout_ms,
            passive_nodes,
            doomed_nodes,
            daemons,
            counter,
            resource,
            clients,
            iters,
            api_clients,
            acquire_timeout,
            multi_algorithm,
            multi_locks,
            multi_iters,
            seed,
        } => {
            let algorithm = pick_algorithm(&algorithm, quorum.as_deref())?;
            let mut multi = pick_multi(
                multi_algorithm.as_deref(),
                &multi_locks,
                multi_iters,
                seed,
                &resource,
            )?;
            let nodes = daemons.len() + 1;
            let (mut passive_nodes, mut doomed_nodes) = (passive_nodes, doomed_nodes);
            for list in [&mut passive_nodes, &mut doomed_nodes] {
                list.sort_unstable();
                list.dedup();
            }
            for (flag, list) in [("passive", &passive_nodes), ("doomed", &doomed_nodes)] {
                if let Some(bad) = list.iter().find(|&&p| p == 0 || p >= nodes) {
                    bail!("--{flag}-nodes: {bad} is not a daemon node (1..{nodes})");
                }
            }
            if let Some(both) = passive_nodes.iter().find(|p| doomed_nodes.contains(p)) {
                bail!("node {both} cannot be both passive and doomed");
            }
            let notices = Arc::new(NoticePrinter::default());
            let detection = if algorithm.tolerates_crashes() {
                let config = DetectorConfig {
                    period: Duration::from_millis(detector_period_ms),
                    timeout: Duration::from_millis(detector_timeout_ms),
                };
                config.validate()?;
                Detection {
                    config: Some(config),
                    observer: Some(notices.clone()),
                }
            } else {
                Detection::default()
            };
            std::fs::write(&counter, "")
                .with_context(|| format!("resetting {}", counter.display()))?;
            let counter_str = counter
                .to_str()
                .context("the counter path must be UTF-8")?
                .to_owned();
            let cfg = ServiceConfig {
                algorithm,
                nodes,
                resources: vec![resource.clone()],
            };
            if let Some(work) = &multi {
                for (name, k) in &work.cfg.resources {
                    for i in 0..*k {
                        let path = multi_counter_path(&counter, name, i);
                        std::fs::write(&path, "")
                            .with_context(|| format!("resetting {}", path.display()))?;
                    }
                }
            }
            let mut sides = vec![];
            for &i in &doomed_nodes {
                let own = format!("{counter_str}.node{i}");
                std::fs::write(&own, "").with_context(|| format!("resetting {own}"))?;
            }
            sides.extend((1..nodes).map(|i| {
                if passive_nodes.contains(&i) {
                    Side::Worker {
                        clients: 0,
                        iters: 0,
                        resource: resource.clone(),
                        counter: counter_str.clone(),
                    }
                } else if doomed_nodes.contains(&i) {
                    Side::Worker {
                        clients,
                        iters: DOOMED_ITERS,
                        resource: resource.clone(),
                        counter: format!("{counter_str}.node{i}"),
                    }
                } else {
                    Side::Worker {
                        clients,
                        iters,
                        resource: resource.clone(),
                        counter: counter_str.clone(),
                    }
                }
            }));
            let active_nodes: Vec<usize> = (1..nodes)
                .filter(|i| !passive_nodes.contains(i) && !doomed_nodes.contains(i))
                .collect();
            let active = active_nodes.len();
            if let Some(work) = &mut multi {
                if clients > 0 {
                    work.workers = active_nodes;
                }
                if api_clients == 0 && work.workers.is_empty() {
                    bail!("--multi-locks: no API client and no active worker to use them");
                }
            }
            // Doomed workers never report.
            let reports = (nodes - 1 - doomed_nodes.len()) + api_clients;
            if reports == 0 {
                bail!("nothing to do: no daemon and no API client");
            }
            let group = launch::Group::start_with(
                &cfg,
                sides,
                reports,
                &daemons,
                &detection,
                multi.as_ref(),
            )?;
            {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                writeln!(out, "STARTED nodes={nodes} algorithm={algorithm}")?;
                out.flush()?;
            }
            let (handle, client, done) = (group.handle(), group.client.clone(), group.done);
            let timeout = Duration::from_secs(acquire_timeout);
            let mut failures = Vec::new();
            let mut tally = MultiTally::default();
            std::thread::scope(|s| {
                let workers: Vec<_> = (0..api_clients)
                    .map(|c| {
                        let client = client.clone();
                        let (resource, counter) = (&resource, &counter);
                        let multi = multi.as_ref().map(|w| (w, c as u64));
                        s.spawn(move || {
                            api_client(&client, resource, counter, iters, timeout, multi)
                        })
                    })
                    .collect();
                for w in workers {
                    let (written, refused) = match w.join() {
                        Ok(Ok((written, refused, t))) => {
                            tally.merge(&t);
                            (written, refused)
                        }
                        Ok(Err(e)) => {
                            failures.push(format!("{e:#}"));
                            (0, 0)
                        }
                        Err(_) => {
                            failures.push("an API client panicked".to_owned());
                            (0, 0)
                        }
                    };
                    if let Err(r) = handle.inject(done, ("done", 0i64, written, refused).into()) {
                        failures.push(format!("reporting to done: {}", r.error));
                    }
                }
            });
            let report = group.wait()?;
            let quit: Vec<Value> = report
                .run
                .quit
                .map(|e| e.args().to_vec())
                .unwrap_or_default();
            let refused = quit.get(2).and_then(Value::as_int).unwrap_or(-1);
            // The daemons' workers' multi rounds, summed by the collector.
            tally.merge(
                &decode_multi_report(quit.get(3..).unwrap_or_default())
                    .map_err(|e| anyhow::anyhow!("the collector's multi report: {e}"))?,
            );
            let (count, _) = read_counter(&counter)?;
            let expected = (active * clients * iters + api_clients * iters) as u64;
            let seen = notices.seen.load(std::sync::atomic::Ordering::SeqCst);
            println!(
                "RESULT algorithm={algorithm} nodes={nodes} count={count} expected={expected} refused={refused} notices={seen}"
            );
            let mut multi_ok = true;
            if let Some(work) = &multi {
                let locks = &work.cfg.resources;
                let mut counts = std::collections::BTreeMap::new();
                for (name, k) in locks {
                    let mut sum = 0;
                    for i in 0..*k {
                        sum += read_counter(&multi_counter_path(&counter, name, i))?.0;
                    }
                    counts.insert(name.clone(), sum);
                }
                let multi_clients = api_clients + work.workers.len() * clients;
                let want_grants = (multi_clients * work.rounds) as u64;
                println!(
                    "MULTI algorithm={} nodes={nodes} clients={multi_clients} grants={} expected_grants={want_grants} counts={} expected={} stale={}",
                    work.cfg.algorithm,
                    tally.grants,
                    per_lock(locks, &counts),
                    per_lock(locks, &tally.expected),
                    tally.stale
                );
                let of = |m: &std::collections::BTreeMap<String, u64>, n: &str| {
                    m.get(n).copied().unwrap_or(0)
                };
                multi_ok = tally.stale == 0
                    && tally.grants == want_grants
                    && locks
                        .iter()
                        .all(|(n, _)| of(&counts, n) == of(&tally.expected, n));
            }
            for f in &failures {
                eprintln!("client failure: {f}");
            }
            if count != expected || refused != 0 || !failures.is_empty() || !multi_ok {
                eprintln!("LOST UPDATES or stale fences: the lock failed");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
