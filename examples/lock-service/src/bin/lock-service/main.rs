//! The lock service, one process per node on loopback.
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
//! `LockClient::acquire`) increments the counter file under the lock, refusing stale fencing
//! tokens. The run prints `RESULT count=C expected=E refused=R` and fails unless `C == E` and
//! `R == 0`: no update was lost.
//!
//! `lock-service bench --etcd 127.0.0.1:2379` compares the service (its own daemons, spawned
//! as child processes) with etcd's lock API; see `examples/lock-service/bench.sh`.

mod bench;
mod launch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use leda_core::prelude::*;
use leda_lock_service::app::{bump_counter, read_counter};
use leda_lock_service::client::LockClient;
use leda_lock_service::group::{ServiceConfig, Side, registry};
use leda_mutex::Algorithm;
use leda_net::{Daemon, DaemonConfig};

#[derive(Parser, Debug)]
#[command(about = "Leda-RS distributed lock service (one process per node)")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a daemon that hosts one node (prints `LISTENING ADDR` first).
    Daemon {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Worker threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
    /// Benchmark against etcd (BENCH lines on stdout).
    Bench(bench::BenchArgs),
    /// Deploy nodes 1.. to the daemons, run node 0 here, hammer the counter, check it.
    Run {
        /// Algorithm (ricart-agrawala, suzuki-kasami, naimi-trehel, ...).
        #[arg(long, default_value = "ricart-agrawala")]
        algorithm: String,
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
        /// API clients (threads using LockClient) in this process.
        #[arg(long, default_value_t = 2)]
        api_clients: usize,
        /// Per-acquire timeout of the API clients, seconds.
        #[arg(long, default_value_t = 30)]
        acquire_timeout: u64,
    },
}

fn api_client(
    client: &LockClient,
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

fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEDA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse().cmd {
        Cmd::Bench(args) => {
            bench::run(&args)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Daemon { listen, threads } => {
            let config = DaemonConfig::from_args([
                "--listen".to_owned(),
                listen,
                "--threads".to_owned(),
                threads.to_string(),
            ])
            .map_err(anyhow::Error::msg)?;
            let daemon = Daemon::bind(config, registry())?;
            use std::io::Write;
            let mut out = std::io::stdout();
            writeln!(out, "LISTENING {}", daemon.local_addr())?;
            out.flush()?;
            let report = daemon.serve()?;
            // Whoever started us may have stopped reading: a closed stdout is not an error.
            let _ = writeln!(out, "ENDED {:?}", report.run.reason);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            algorithm,
            daemons,
            counter,
            resource,
            clients,
            iters,
            api_clients,
            acquire_timeout,
        } => {
            let algorithm: Algorithm = algorithm.parse()?;
            let nodes = daemons.len() + 1;
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
            let mut sides = vec![];
            sides.extend((1..nodes).map(|_| Side::Worker {
                clients,
                iters,
                resource: resource.clone(),
                counter: counter_str.clone(),
            }));
            let reports = (nodes - 1) + api_clients;
            if reports == 0 {
                bail!("nothing to do: no daemon and no API client");
            }
            let group = launch::Group::start(&cfg, sides, reports, &daemons)?;
            let (handle, client, done) = (group.handle(), group.client.clone(), group.done);
            let timeout = Duration::from_secs(acquire_timeout);
            let mut failures = Vec::new();
            std::thread::scope(|s| {
                let workers: Vec<_> = (0..api_clients)
                    .map(|_| {
                        let client = client.clone();
                        let (resource, counter) = (&resource, &counter);
                        s.spawn(move || api_client(&client, resource, counter, iters, timeout))
                    })
                    .collect();
                for w in workers {
                    let (written, refused) = match w.join() {
                        Ok(Ok(r)) => r,
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
            let (count, _) = read_counter(&counter)?;
            let expected = ((nodes - 1) * clients * iters + api_clients * iters) as u64;
            println!(
                "RESULT algorithm={algorithm} nodes={nodes} count={count} expected={expected} refused={refused}"
            );
            for f in &failures {
                eprintln!("client failure: {f}");
            }
            if count != expected || refused != 0 || !failures.is_empty() {
                eprintln!("LOST UPDATES or stale fences: the lock failed");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
