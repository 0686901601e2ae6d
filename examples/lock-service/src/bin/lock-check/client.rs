//! A checked client, a process of its own: acquire a lock, read-modify-write the register
//! under it with the fence, release; over and over until the stop file appears.
//!
//! Its log (one line per event, flushed at once, so a `kill -9` loses nothing written):
//! `A LOCK FENCE ACQUIRED_NS` when a grant arrives, `E LOCK FENCE ENDED_NS END` when the hold
//! ends (`released`, or `lease_expired` with the service's expiry time when it told us, else
//! the moment we learnt of the loss). Against etcd, which does not say when it expired a
//! lease, also `L TTL_NS` per lease and `K SENT_NS` per answered keep-alive: a lease cannot
//! expire before the last answered keep-alive's send time + TTL, which is the end the merge
//! gives a hold its client did not end (killed) or lost.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use leda_core::sim::SimRng;
use leda_lock_service::proto::monotonic_ns;
use leda_lock_service::remote::{ConnectOptions, Hold, LockClient};

use crate::register::Register;

/// The client role's options.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The service: `leda` (node client ports) or `etcd` (member client URLs' host:port).
    #[arg(long, default_value = "leda")]
    target: String,
    /// Node client addresses, tried from `--seed`'s position on.
    #[arg(long, value_delimiter = ',', required = true)]
    connect: Vec<String>,
    /// This client's name.
    #[arg(long)]
    name: String,
    /// The register's address.
    #[arg(long)]
    register: String,
    /// The locks, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    locks: Vec<String>,
    /// Lease TTL, milliseconds.
    #[arg(long)]
    ttl_ms: u64,
    /// Longest work under a lock, milliseconds.
    #[arg(long, default_value_t = 20)]
    work_ms: u64,
    /// This client's log.
    #[arg(long)]
    log: PathBuf,
    /// Stop when this file exists.
    #[arg(long)]
    stop: PathBuf,
    /// Seed of the lock choice and the pauses.
    #[arg(long)]
    seed: u64,
}

struct Log(std::fs::File);

impl Log {
    fn line(&mut self, s: String) -> anyhow::Result<()> {
        writeln!(self.0, "{s}")?;
        self.0.flush()?;
        Ok(())
    }
}

fn connect(args: &ClientArgs, turn: &mut usize) -> LockClient {
    loop {
        let addr = &args.connect[*turn % args.connect.len()];
        *turn += 1;
        let opts = ConnectOptions::new(args.name.clone())
            .map(|o| o.ttl(Duration::from_millis(args.ttl_ms)));
        match opts.and_then(|o| LockClient::connect(addr, o)) {
            Ok(c) => return c,
            Err(e) => {
                tracing::info!(addr, error = %e, "cannot connect; next node");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Runs the client until the stop file appears.
pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let log = Log(std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .with_context(|| format!("opening {}", args.log.display()))?);
    match args.target.as_str() {
        "leda" => run_leda(args, log),
        "etcd" => etcd::run(args, log),
        other => anyhow::bail!("--target {other}: leda or etcd"),
    }
}

fn run_leda(args: ClientArgs, mut log: Log) -> anyhow::Result<()> {
    let mut register = Register::connect(&args.register)?;
    let mut rng = SimRng::new(args.seed);
    let mut turn = args.seed as usize;
    let mut client = connect(&args, &mut turn);
    while !args.stop.exists() {
        let lock = &args.locks[rng.next_u64() as usize % args.locks.len()];
        let mut hold = match client.acquire(lock, Duration::from_secs(2)) {
            Ok(h) => h,
            Err(e) => {
                // A node cut off, or one the others took for crashed, grants nothing: after
                // a timeout or an error, try the next node.
                tracing::info!(error = %e, "acquire failed; reconnecting");
                drop(client);
                client = connect(&args, &mut turn);
                continue;
            }
        };
        let fence = hold.fence();
        log.line(format!("A {lock} {fence} {}", monotonic_ns()))?;
        if hold.is_valid() {
            // Read, work a little, write: a pause in between (SIGSTOP past the lease) makes
            // the write stale, and the register's fence check must refuse it.
            let v = register.read(lock, fence)?;
            std::thread::sleep(Duration::from_micros(
                rng.next_u64() % (args.work_ms * 1000).max(1),
            ));
            register.write(lock, &args.name, fence, v + 1)?;
        }
        finish(&client, hold, &mut log, lock)?;
        if client.as_async().ended().is_some() {
            client = connect(&args, &mut turn);
        }
        std::thread::sleep(Duration::from_micros(rng.next_u64() % 2000));
    }
    Ok(())
}

/// Ends a hold and logs its end: the end line is written before the release is sent, so a
/// kill -9 after the release cannot leave a hold that seems never to end.
fn finish(client: &LockClient, mut hold: Hold, log: &mut Log, lock: &str) -> anyhow::Result<()> {
    let fence = hold.fence();
    if let Some(at) = hold.expired_at() {
        return log.line(format!("E {lock} {fence} {at} lease_expired"));
    }
    if !hold.is_valid() {
        // Lost without the service's word (session ended, or no keep-alive answered).
        return log.line(format!("E {lock} {fence} {} lease_expired", monotonic_ns()));
    }
    log.line(format!("E {lock} {fence} {} released", monotonic_ns()))?;
    // An expiry that came first is in the node's audit (the merge takes the earlier time);
    // a session that died under the release took the lock with it.
    let _ = client.release(hold);
    Ok(())
}

/// The same client against etcd's lock API with a lease (JSON gateway).
mod etcd {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use leda_core::sim::SimRng;
    use leda_lock_service::etcd::EtcdClient;
    use leda_lock_service::proto::monotonic_ns;

    use super::{ClientArgs, Log};
    use crate::register::Register;

    /// A lease and what its keep-alive thread learnt: valid until (ns), or lost.
    struct Lease {
        id: String,
        ttl_ns: u64,
        valid_until: Mutex<u64>,
        lost: std::sync::atomic::AtomicBool,
    }

    fn connect(args: &ClientArgs, turn: &mut usize) -> EtcdClient {
        loop {
            let addr = &args.connect[*turn % args.connect.len()];
            *turn += 1;
            match EtcdClient::connect(addr) {
                Ok(c) => return c,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Grants a lease and starts its keep-alive thread (which logs each answered one).
    fn lease(
        args: &ClientArgs,
        turn: &mut usize,
        log: &Arc<Mutex<Log>>,
    ) -> anyhow::Result<Option<Arc<Lease>>> {
        let mut c = connect(args, turn);
        let ttl_s = args.ttl_ms.div_ceil(1000).max(1);
        let sent = monotonic_ns();
        let Ok(id) = c.lease_grant(ttl_s) else {
            return Ok(None);
        };
        let Ok(ttl) = c.keepalive(&id) else {
            return Ok(None);
        };
        let ttl_ns = ttl.max(1) * 1_000_000_000;
        let lease = Arc::new(Lease {
            id,
            ttl_ns,
            valid_until: Mutex::new(sent + ttl_ns),
            lost: false.into(),
        });
        log.lock().unwrap().line(format!("L {ttl_ns}"))?;
        log.lock().unwrap().line(format!("K {sent}"))?;
        let (l, log) = (lease.clone(), log.clone());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_nanos(l.ttl_ns / 3));
                if l.lost.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let sent = monotonic_ns();
                match c.keepalive(&l.id) {
                    Ok(t) if t > 0 => {
                        *l.valid_until.lock().unwrap() = sent + l.ttl_ns;
                        let _ = log.lock().unwrap().line(format!("K {sent}"));
                    }
                    _ => {
                        l.lost.store(true, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                }
            }
        });
        Ok(Some(lease))
    }

    impl Lease {
        fn valid(&self) -> bool {
            !self.lost.load(std::sync::atomic::Ordering::SeqCst)
                && monotonic_ns() < *self.valid_until.lock().unwrap()
        }
    }

    pub(super) fn run(args: ClientArgs, log: Log) -> anyhow::Result<()> {
        let log = Arc::new(Mutex::new(log));
        let mut register = Register::connect(&args.register)?;
        let mut rng = SimRng::new(args.seed);
        let mut turn = args.seed as usize;
        let mut c = connect(&args, &mut turn);
        let mut current: Option<Arc<Lease>> = None;
        while !args.stop.exists() {
            let l = match &current {
                Some(l) if l.valid() => l.clone(),
                _ => {
                    if let Some(old) = current.take() {
                        old.lost.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    match lease(&args, &mut turn, &log)? {
                        Some(l) => {
                            current = Some(l.clone());
                            l
                        }
                        None => continue,
                    }
                }
            };
            let lock = &args.locks[rng.next_u64() as usize % args.locks.len()];
            let (key, fence) = match c.lock_fenced(lock, &l.id) {
                Ok(x) => x,
                Err(_) => {
                    // The member is gone or the lease died while waiting: start over.
                    c = connect(&args, &mut turn);
                    current = None;
                    continue;
                }
            };
            log.lock()
                .unwrap()
                .line(format!("A {lock} {fence} {}", monotonic_ns()))?;
            if l.valid() {
                let v = register.read(lock, fence)?;
                std::thread::sleep(Duration::from_micros(
                    rng.next_u64() % (args.work_ms * 1000).max(1),
                ));
                register.write(lock, &args.name, fence, v + 1)?;
            }
            if l.valid() {
                log.lock()
                    .unwrap()
                    .line(format!("E {lock} {fence} {} released", monotonic_ns()))?;
                if c.unlock(&key).is_err() {
                    c = connect(&args, &mut turn);
                }
            } else {
                let until = *l.valid_until.lock().unwrap();
                log.lock()
                    .unwrap()
                    .line(format!("E {lock} {fence} {until} lease_expired"))?;
            }
            std::thread::sleep(Duration::from_micros(rng.next_u64() % 2000));
        }
        Ok(())
    }
}
