//! `lock-service serve`: one node of a long-lived group, with a client port; and
//! `lock-service lock`: run a command while holding a lock (as `etcdctl lock`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use leda_core::prelude::*;
use leda_lock_service::epoch::{attach_epochs, hold_data_dir};
use leda_lock_service::gate::GateLocal;
use leda_lock_service::group::{Detection, ServiceConfig, Side, build_group_with, serve_registry};
use leda_lock_service::proto::{self, Request, Response};
use leda_lock_service::remote::{ConnectOptions, LockClient};
use leda_net::conn::Conn;
use leda_net::handshake::{self, HANDSHAKE_TIMEOUT};
use leda_net::{Daemon, DaemonConfig, Launcher, Secret};
use tokio::io::AsyncWriteExt;

/// `lock-service serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// This node's id: its index in `--nodes`.
    #[arg(long)]
    id: usize,
    /// Every node's address for node-to-node links, in id order, comma-separated (the same
    /// list on every node). Node 0 starts the group: it deploys to the others, which wait.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<String>,
    /// Address of this node's client port.
    #[arg(long, default_value = "127.0.0.1:0")]
    clients: String,
    /// Directory of this node's stable state (the group epoch).
    #[arg(long)]
    data_dir: PathBuf,
    /// Algorithm (node 0 chooses for the group): ricart-agrawala, suzuki-kasami,
    /// naimi-trehel, centralized, ..., quorum-grid, quorum-tree, quorum-vcube (these three
    /// go on when a minority of nodes crash).
    #[arg(long, default_value = "ricart-agrawala")]
    algorithm: String,
    /// The locks the group serves (node 0 chooses), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "lock")]
    locks: Vec<String>,
    /// Append one JSON line per lease that ended with its lock held (client, lock, fence,
    /// CLOCK_MONOTONIC time).
    #[arg(long, value_name = "PATH")]
    audit: Option<PathBuf>,
    /// Secret clients must prove (mode 0600; default: the nodes' secret).
    #[arg(long, value_name = "PATH", value_parser = leda_net::cli::secret_file)]
    client_secret_file: Option<Secret>,
    /// Node 0: seconds to wait for the other nodes to be up.
    #[arg(long, default_value_t = 30)]
    wait_s: u64,
    #[command(flatten)]
    secret: leda_net::cli::SecretArgs,
}

/// Runs one node until the group ends; status 1 if it ended by a lost process.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let n = args.nodes.len();
    if args.id >= n {
        bail!("--id {} but --nodes lists {n} nodes", args.id);
    }
    let _held = hold_data_dir(&args.data_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let secret = match args.secret.secret {
        Some(s) => s,
        None => Secret::for_user()?,
    };
    let client_secret = args.client_secret_file.unwrap_or_else(|| secret.clone());
    let listener = std::net::TcpListener::bind(&args.clients)
        .with_context(|| format!("binding the client port {}", args.clients))?;
    // (Clients that start together connect together.)
    if let Err(e) = leda_core::cli::lengthen_accept_queue(&listener) {
        tracing::warn!(error = %e, "cannot lengthen the client port's accept queue");
    }
    let clients = listener.local_addr()?;
    let local = Arc::new(GateLocal {
        listener: Mutex::new(Some(listener)),
        secret: client_secret,
        audit: args.audit,
    });
    println!("CLIENTS {clients}");
    if args.id > 0 {
        refuse_clients_until_served(&local, args.id)?;
        let config = DaemonConfig {
            listen: args.nodes[args.id].clone(),
            secret: Some(secret),
            once: true,
            threads: Some(2),
            ..DaemonConfig::default()
        };
        let mut daemon = Daemon::bind(config, serve_registry(local, args.data_dir))?;
        leda_core::cli::announce_listening(daemon.local_addr())?;
        let report = daemon.serve_one()?;
        if !report.lost.is_empty() {
            eprintln!("lock-service: the group lost {}", report.lost[0]);
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let algorithm: leda_mutex::Algorithm = args.algorithm.parse()?;
    let cfg = ServiceConfig {
        algorithm,
        nodes: n,
        resources: args.locks.clone(),
    };
    let mut sides = vec![Side::Gate(Some(local))];
    sides.extend((1..n).map(|_| Side::Gate(None)));
    let mut detection = Detection::for_algorithm(algorithm);
    if detection.config.is_some() {
        detection.observer = Some(Arc::new(leda_lock_service::guard::MajorityGuard::new(n)));
    }
    let mut built = build_group_with(&cfg, &sides, None, &detection)?;
    let mut dirs = vec![Some(args.data_dir)];
    dirs.extend((1..n).map(|_| None));
    attach_epochs(&mut built, dirs).map_err(|e| anyhow::anyhow!("{e}"))?;
    let addrs: Vec<&str> = args.nodes.iter().map(String::as_str).collect();
    built.graph.part(built.clusters.clone())?.map(addrs)?;
    let run = || {
        let run = Run::default().threads(2);
        if detection.config.is_some() {
            // A crashed minority is tolerated, node 0 (this launcher) included.
            run.on_process_loss(OnProcessLoss::Continue { notify: None })
                .outlive_launcher()
        } else {
            run
        }
    };
    let launcher = Launcher::new(args.nodes[0].clone()).secret(secret);
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    let launched = loop {
        match launcher.start(&built.graph, run()) {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "the group is not up yet; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e).context("starting the group"),
        }
    };
    println!(
        "SERVING nodes={n} algorithm={algorithm} locks={}",
        args.locks.join(",")
    );
    let report = launched.wait().context("running the group")?;
    eprintln!("lock-service: the group ended: {:?}", report.run.reason);
    Ok(ExitCode::FAILURE)
}

/// `lock-service lock` options.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock.
    name: String,
    /// Client addresses of the nodes to try, in order, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    connect: Vec<String>,
    /// Lease TTL, seconds: the lock is lost this long after the service last heard from us.
    #[arg(long, default_value_t = 10.0)]
    ttl: f64,
    /// Seconds to wait for the lock.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// This client's name (default: `lock-PID`).
    #[arg(long)]
    client_name: Option<String>,
    /// Secret the nodes expect from clients (mode 0600; default: $LEDA_SECRET,
    /// $LEDA_SECRET_FILE, else ~/.leda.cookie).
    #[arg(long, value_name = "PATH", value_parser = leda_net::cli::secret_file)]
    client_secret_file: Option<Secret>,
    /// The command, run with LOCK_NAME and LOCK_FENCE set while the lock is held.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn secs(s: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("--{what} {s}: not a duration"))
}

/// Until its gate takes the client listener (the group deployed here), a node turns
/// each client away at once, so that a client tries its next node instead of waiting
/// out its connect timeout: a node restarted after a crash binds its port but is never
/// deployed to again while the group runs (crash-stop), and held every client that
/// tried it first for 5 s (review finding). A client is told why only once it proved
/// the secret: after the handshake, it reads `node N is not serving yet` in answer to
/// its `Open`, as the gate answers a refused session (the connection used to be closed
/// unanswered, and the client guessed at a TLS mismatch). One without the secret gets
/// the handshake's refusal, as from a serving node: no more than that. The refusals
/// are bounded as the gate's handshakes are (`handshake::Slots`, timeouts). A client
/// that connects in the very instant the gate starts may be turned away too; it tries
/// its next node.
fn refuse_clients_until_served(local: &Arc<GateLocal>, node: usize) -> anyhow::Result<()> {
    let listener = match &*local.listener.lock().unwrap_or_else(|e| e.into_inner()) {
        Some(l) => l.try_clone()?,
        None => return Ok(()),
    };
    // (The gate sets it non-blocking too, for tokio.)
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = local.clone();
    // (The gate took the listener: it serves now.)
    let serving = move |local: &GateLocal| {
        local
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    };
    std::thread::Builder::new()
        .name("refuse-clients".into())
        .spawn(move || {
            rt.block_on(async move {
                let slots = handshake::Slots::new(MAX_REFUSING);
                while !serving(&local) {
                    match listener.accept() {
                        Ok((tcp, peer)) => {
                            let secret = local.secret.clone();
                            slots.spawn(peer, move |slot| async move {
                                let _slot = slot;
                                match refuse(tcp, &peer.to_string(), &secret, node).await {
                                    Ok(()) => tracing::info!(
                                        %peer,
                                        "a client before this node serves: turned away"
                                    ),
                                    Err(e) => tracing::info!(
                                        %peer,
                                        error = %e,
                                        "a client before this node serves: closed"
                                    ),
                                }
                            });
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                // The refusals under way end within their timeouts.
                tokio::time::sleep(2 * HANDSHAKE_TIMEOUT).await;
            })
        })?;
    Ok(())
}

/// Refusals in progress on a node that does not serve yet, at most.
const MAX_REFUSING: usize = 16;

/// Runs the handshake with a client of a node that does not serve yet and, once the
/// client proved the secret, answers its `Open` with `node N is not serving yet`.
async fn refuse(
    tcp: std::net::TcpStream,
    peer: &str,
    secret: &Secret,
    node: usize,
) -> anyhow::Result<()> {
    tcp.set_nonblocking(true)?;
    let mut conn = Conn::plain(tokio::net::TcpStream::from_std(tcp)?);
    handshake::server(&mut conn, peer, secret, HANDSHAKE_TIMEOUT).await?;
    // The Open is read first: closed with it unread, the connection would be reset,
    // and the client would read the reset rather than the answer.
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, proto::read::<_, Request>(&mut conn)).await {
        Ok(Ok(Some(_))) => {}
        _ => bail!("no Open within the handshake timeout"),
    }
    let message = format!(
        "node {node} is not serving yet (its group has not started it: it is starting \
         up, or restarted while its group runs on without it)"
    );
    proto::write(&mut conn, &Response::Error { req: None, message }).await?;
    conn.shutdown().await?;
    Ok(())
}

/// Acquires the lock, runs the command while holding it, releases; the command's status.
///
/// The command must not outlive the lease (review findings, 2026-11-27: it got SIGTERM
/// only once the lease was over, then 5 s before SIGKILL, alongside the next holder; its
/// own children were never signalled; and a wrapper killed with -9 left it running). So
/// it runs in a process group of its own (unless this process reads a terminal: the
/// command must stay in its foreground group, and only the command itself is signalled
/// then) and ends with this process (`PR_SET_PDEATHSIG`); when the lease has less than
/// a quarter of the granted TTL left (two keep-alives unanswered) the group gets
/// SIGTERM, and SIGKILL when it runs out; then the status is 1. The release after the
/// command waits for the node only while the lease is known valid (review finding F3b,
/// rv13: with the node stopped, the wrapper waited in it for as long as the node stayed
/// stopped); an unconfirmed release is an error (status 1). Nothing can stop it
/// while this process is itself stopped (SIGSTOP), and processes the command leaves
/// behind when it exits are not waited for: fences are what protect a resource then.
pub fn lock(args: LockArgs) -> anyhow::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let name = args
        .client_name
        .unwrap_or_else(|| format!("lock-{}", std::process::id()));
    let mut opts = ConnectOptions::new(name)?.ttl(secs(args.ttl, "ttl")?);
    if let Some(s) = args.client_secret_file {
        opts = opts.secret(s);
    }
    let mut failures = Vec::new();
    let client = args
        .connect
        .iter()
        .find_map(|addr| match LockClient::connect(addr, opts.clone()) {
            Ok(c) => Some(c),
            Err(e) => {
                failures.push(e.to_string());
                None
            }
        })
        .with_context(|| format!("no node answered: {}", failures.join("; ")))?;
    // What the node granted (it clamps what was asked).
    let ttl = client.as_async().ttl();
    // (This process ends its session if it fails: the withdrawal of a timed-out request
    // is not waited for beyond a second.)
    let mut hold = client.acquire_or_leave(&args.name, secs(args.timeout, "timeout")?)?;
    let mut cmd = std::process::Command::new(&args.command[0]);
    leda_net::daemon::end_with_parent(&mut cmd)
        .args(&args.command[1..])
        .env("LOCK_NAME", &args.name)
        .env("LOCK_FENCE", hold.fence().to_string());
    // SAFETY: isatty(3) on a descriptor number.
    let own_group = unsafe { libc::isatty(0) } == 0;
    if own_group {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", args.command[0]))?;
    // Whom to signal: the process group the command leads, or the command alone.
    let target = if own_group {
        -(child.id() as libc::pid_t)
    } else {
        child.id() as libc::pid_t
    };
    let mut termed = false;
    loop {
        if let Some(status) = child.try_wait()? {
            let fence = hold.fence();
            if termed {
                let released = match client.release(hold) {
                    Ok(()) => "released".to_owned(),
                    Err(e) => format!("the release was not confirmed: {e}"),
                };
                bail!(
                    "the lease on {:?} (fence {fence}) was running out without a renewal: \
                     the command was stopped ({status}); {released}",
                    args.name
                );
            }
            client.release(hold).with_context(|| {
                format!(
                    "releasing {:?} (fence {fence}) after the command ended ({status})",
                    args.name
                )
            })?;
            return Ok(ExitCode::from(
                status.code().unwrap_or(1).clamp(0, 255) as u8
            ));
        }
        let left = hold.valid_for();
        if left.is_zero() {
            // The lock may be someone else's already: the command stops now.
            // SAFETY: kill(2) of our child, or of the process group it leads (not
            // reused while the child is unreaped).
            unsafe { libc::kill(target, libc::SIGKILL) };
            let _ = child.wait();
            bail!(
                "lost the lock {:?} (fence {}) while the command ran: {}",
                args.name,
                hold.fence(),
                client
                    .as_async()
                    .ended()
                    .unwrap_or_else(|| "lease expired".into())
            );
        }
        if !termed && left < ttl / 4 {
            tracing::warn!(
                lock = %args.name,
                left_ms = left.as_millis() as u64,
                "the lease is running out without a renewal: stopping the command"
            );
            // SAFETY: as above.
            unsafe { libc::kill(target, libc::SIGTERM) };
            termed = true;
        }
        std::thread::sleep(Duration::from_millis(10).min(left / 4));
    }
}
