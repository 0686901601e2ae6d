//! `lock-check`: a Jepsen-style check of the lock service under faults.
//!
//! ```text
//! lock-check --duration 30 --history /tmp/h.jsonl [--target leda] [--nodes 3] [--clients 4]
//! ```
//!
//! It starts `--nodes` nodes (`lock-service serve`, one process each), a fenced register
//! (a process) and `--clients` clients (processes) that acquire a lock, read-modify-write
//! the register under it carrying the fence, and release, over and over. Meanwhile it injects
//! faults on a seeded schedule: SIGSTOP of a client past its lease (then SIGCONT), kill -9 of
//! a client (restarted under a new name), SIGSTOP of a node for 50-150 ms or, where a crashed
//! minority is tolerated, 0.4-1 s (then SIGCONT), for the crash-tolerant algorithms and etcd kill -9 of a minority of the nodes (not restarted: the
//! algorithms are crash-stop), and partitions (below). `--target etcd` drives an etcd cluster
//! the same way, `--target both` runs both and prints them side by side. At the end it
//! writes the history (JSON lines, see `leda_lock_service::check`), checks it, prints
//! `CHECK target=... <counts>` and the anomalies, and exits 1 on any.
//!
//! As root with `ip` (iproute2), every node runs in its own network namespace and a fault may
//! cut one off for 0.3-1.5 s (`netns`); elsewhere the run says partitions are skipped.

mod client;
mod netns;
mod register;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use leda_core::sim::SimRng;
use leda_lock_service::check::{Record, check};
use leda_lock_service::proto::monotonic_ns;

#[derive(Parser, Debug)]
#[command(
    version,
    name = "lock-check",
    about = "Checks the lock service under faults (Jepsen-style): overlapping holds, fence \
             regressions, lost updates, stale writes",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    /// Seconds of workload and faults.
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// Where to write the history (JSON lines).
    #[arg(long, default_value = "lock-check-history.jsonl")]
    history: PathBuf,
    /// The service under test; `both` runs ours then etcd with the same workload and fault
    /// schedule and prints them side by side (etcd's history goes to FILE.etcd).
    #[arg(long, value_enum, default_value_t = Targets::Leda)]
    target: Targets,
    /// Nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// The nodes' algorithm (quorum-grid, quorum-tree and quorum-vcube, the last with a
    /// power-of-two --nodes, survive killed nodes).
    #[arg(long, default_value = "quorum-grid")]
    algorithm: String,
    /// The locks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "x,y")]
    locks: Vec<String>,
    /// The clients' lease TTL, milliseconds.
    #[arg(long, default_value_t = 500)]
    ttl_ms: u64,
    /// Longest work under a lock, between the register's read and write, milliseconds
    /// (each hold picks up to this much at random). Past the failure detector's timeout a
    /// holder's node paused mid-hold shows whether the next grant waits for it.
    #[arg(long, default_value_t = 20)]
    work_ms: u64,
    /// Milliseconds between faults.
    #[arg(long, default_value_t = 1000)]
    fault_every_ms: u64,
    /// Inject no faults.
    #[arg(long)]
    no_faults: bool,
    /// Do not put the nodes in network namespaces (no partitions). Without root or `ip`
    /// there are none anyway, and the run says so.
    #[arg(long)]
    no_partitions: bool,
    /// Seed of the fault schedule and of the clients.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only check this history (written by an earlier run) and report.
    #[arg(long, value_name = "FILE")]
    check: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Targets {
    /// The Leda-RS lock service (`lock-service serve`).
    Leda,
    /// etcd's lock API with leases (the `etcd` binary of Debian's etcd-server, 3.4).
    Etcd,
    /// Both, one after the other.
    Both,
}

/// The service of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Leda,
    Etcd,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Leda => "leda",
            Target::Etcd => "etcd",
        }
    }
}

#[derive(Subcommand, Debug)]
enum Role {
    /// The fenced register (internal).
    #[command(hide = true)]
    Register {
        /// Address to listen on.
        #[arg(long)]
        listen: String,
        /// Its history file.
        #[arg(long)]
        history: PathBuf,
    },
    /// A checked client (internal).
    #[command(hide = true)]
    Client(client::ClientArgs),
}

fn main() -> ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit_code("lock-check", run())
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.role {
        Some(Role::Register { listen, history }) => {
            register::run(&listen, &history)?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Role::Client(args)) => {
            client::run(args)?;
            Ok(ExitCode::SUCCESS)
        }
        None => match &cli.check {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let history = leda_lock_service::check::parse(&text).map_err(anyhow::Error::msg)?;
                Ok(report(&check(&history), "file"))
            }
            None => harness(&cli),
        },
    }
}

/// Prints the report (`CHECK target=...` and the anomalies); the exit status it calls for.
fn report(report: &leda_lock_service::check::Report, target: &str) -> ExitCode {
    println!("CHECK target={target} {report}");
    for (what, list) in [
        ("overlapping holds", &report.overlaps),
        ("fence regressions", &report.regressions),
        ("lost updates", &report.lost),
        ("stale writes accepted", &report.stale),
    ] {
        for line in list.iter().take(10) {
            println!("  {what}: {line}");
        }
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A child process, killed on drop.
struct Proc {
    name: String,
    child: Child,
    stopped: bool,
    dead: bool,
}

impl Proc {
    fn signal(&mut self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads stdout lines of `child` until one starts with `prefix`; returns its rest.
fn await_line(child: &mut Child, prefix: &str, within: Duration) -> anyhow::Result<String> {
    let out = child.stdout.take().context("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = prefix.to_owned();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        let mut sent = false;
        for line in lines.by_ref().map_while(Result::ok) {
            if !sent && let Some(rest) = line.strip_prefix(&wanted) {
                let _ = tx.send(rest.trim().to_owned());
                sent = true;
            }
        }
    });
    rx.recv_timeout(within)
        .with_context(|| format!("no {prefix:?} line within {within:?}"))
}

struct Run<'a> {
    cli: &'a Cli,
    target: Target,
    history: PathBuf,
    dir: PathBuf,
    secret: PathBuf,
    /// The clients' lease TTL (etcd grants 2 s at least).
    ttl_ms: u64,
    /// The nodes' namespaces, when partitions are injected.
    net: Option<netns::Netns>,
}

impl Run<'_> {
    fn command(&self, program: &Path, log: &str) -> anyhow::Result<Command> {
        let mut c = Command::new(program);
        c.env("LEDA_SECRET_FILE", &self.secret)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.join(log))?);
        Ok(c)
    }

    /// [`Run::command`] in node `i`'s namespace, if there are namespaces.
    fn command_in(&self, i: usize, program: &Path, log: &str) -> anyhow::Result<Command> {
        let Some(net) = &self.net else {
            return self.command(program, log);
        };
        let argv = net.exec(i);
        let mut c = self.command(Path::new(&argv[0]), log)?;
        c.args(&argv[1..]).arg(program);
        Ok(c)
    }

    fn spawn_client(
        &self,
        me: &Path,
        name: &str,
        clients: &[String],
        register: &str,
        seed: u64,
    ) -> anyhow::Result<Proc> {
        let child = self
            .command(me, &format!("{name}.err"))?
            .args(["client", "--name", name, "--register", register])
            .args(["--target", self.target.name()])
            .arg("--connect")
            .arg(clients.join(","))
            .arg("--locks")
            .arg(self.cli.locks.join(","))
            .arg("--ttl-ms")
            .arg(self.ttl_ms.to_string())
            .arg("--work-ms")
            .arg(self.cli.work_ms.to_string())
            .arg("--log")
            .arg(self.dir.join(format!("{name}.log")))
            .arg("--stop")
            .arg(self.dir.join("stop"))
            .arg("--seed")
            .arg(seed.to_string())
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            stopped: false,
            dead: false,
        })
    }
}

/// The path of `program` on PATH.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(program))
            .find(|f| f.is_file())
    })
}

/// Starts the Leda-RS group: nodes 1.. first (they wait for node 0's deployment), then node
/// 0. Returns the nodes and their client addresses.
fn start_leda(run: &Run, service: &Path) -> anyhow::Result<(Vec<Option<Proc>>, Vec<String>)> {
    let (cli, dir) = (run.cli, &run.dir);
    let node_addrs: Vec<String> = match &run.net {
        Some(net) => (0..cli.nodes)
            .map(|i| format!("{}:7000", net.ip(i)))
            .collect(),
        None => (0..cli.nodes)
            .map(|_| free_addr())
            .collect::<Result<_, _>>()?,
    };
    let (children, client_addrs) =
        leda_lock_service::serving::start_group(cli.nodes, Duration::from_secs(30), |i| {
            let listen = match &run.net {
                Some(net) => format!("{}:7100", net.ip(i)),
                None => "127.0.0.1:0".into(),
            };
            let mut c = run
                .command_in(i, service, &format!("node{i}.err"))
                .map_err(std::io::Error::other)?;
            c.args(["serve", "--id", &i.to_string(), "--clients", &listen])
                .arg("--nodes")
                .arg(node_addrs.join(","))
                .arg("--data-dir")
                .arg(dir.join(format!("node{i}")))
                .arg("--audit")
                .arg(dir.join(format!("audit{i}.jsonl")))
                .args(["--algorithm", &cli.algorithm])
                .args(["--locks", &cli.locks.join(",")]);
            c.spawn()
        })
        .map_err(|e| {
            // Node 0's own error, when it exited.
            let err = std::fs::read_to_string(dir.join("node0.err")).unwrap_or_default();
            anyhow::anyhow!("{e}: {}", err.lines().last().unwrap_or("no error line"))
        })?;
    Ok((node_procs(children), client_addrs))
}

/// Starts an etcd cluster of `--nodes` members on loopback (data in /dev/shm when there is
/// one, as our nodes keep nothing but the epoch on disk). Returns them and their client
/// addresses.
fn start_etcd(run: &Run) -> anyhow::Result<(Vec<Option<Proc>>, Vec<String>)> {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm } else { &run.dir };
    let data = base.join(format!("lock-check-etcd-{}", std::process::id()));
    let members = match &run.net {
        Some(net) => (0..run.cli.nodes)
            .map(|i| leda_lock_service::etcd::Member {
                prefix: net.exec(i),
                peer: format!("{}:2380", net.ip(i)),
                client: format!("{}:2379", net.ip(i)),
            })
            .collect(),
        None => leda_lock_service::etcd::loopback_members(run.cli.nodes)?,
    };
    let (members, clients) = leda_lock_service::etcd::spawn_cluster(&members, &data, |i| {
        std::fs::File::create(run.dir.join(format!("node{i}.err")))
            .map_or(Stdio::null(), Stdio::from)
    })?;
    Ok((node_procs(members), clients))
}

/// The group's processes, named `node0`, `node1`, ... in order.
fn node_procs(children: Vec<std::process::Child>) -> Vec<Option<Proc>> {
    children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            Some(Proc {
                name: format!("node{i}"),
                child,
                stopped: false,
                dead: false,
            })
        })
        .collect()
}

/// A free loopback port (bound, then let go).
fn free_addr() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

fn harness(cli: &Cli) -> anyhow::Result<ExitCode> {
    if cli.nodes == 0 || cli.clients == 0 || cli.locks.is_empty() {
        bail!("at least one node, one client and one lock");
    }
    let runs: Vec<(Target, PathBuf)> = match cli.target {
        Targets::Leda => vec![(Target::Leda, cli.history.clone())],
        Targets::Etcd => vec![(Target::Etcd, cli.history.clone())],
        Targets::Both => {
            let mut etcd = cli.history.clone().into_os_string();
            etcd.push(".etcd");
            vec![
                (Target::Leda, cli.history.clone()),
                (Target::Etcd, etcd.into()),
            ]
        }
    };
    let mut status = ExitCode::SUCCESS;
    let mut rows = Vec::new();
    for (target, history) in runs {
        if target == Target::Etcd && which("etcd").is_none() {
            println!(
                "lock-check: etcd skipped: no etcd binary on PATH (apt-get install etcd-server)"
            );
            continue;
        }
        let (code, found) = run_one(cli, target, history)?;
        if code != ExitCode::SUCCESS {
            status = code;
        }
        rows.push((target, found));
    }
    if rows.len() > 1 {
        // One column per count, as wide as its name.
        let mut header = format!("{:<6}", "target");
        for (name, _) in rows[0].1.counts() {
            header += &format!(" {name}");
        }
        println!("{header}");
        for (t, r) in &rows {
            let mut line = format!("{:<6}", t.name());
            for (name, n) in r.counts() {
                line += &format!(" {n:>w$}", w = name.len());
            }
            println!("{line}");
        }
    }
    Ok(status)
}

/// One run against `target`: its exit status and report.
fn run_one(
    cli: &Cli,
    target: Target,
    history: PathBuf,
) -> anyhow::Result<(ExitCode, leda_lock_service::check::Report)> {
    let algorithm: leda_mutex::Algorithm = cli.algorithm.parse()?;
    let me = std::env::current_exe()?;
    let service = me.with_file_name("lock-service");
    if target == Target::Leda && !service.exists() {
        bail!(
            "{} not found (build it: cargo build -p leda-lock-service)",
            service.display()
        );
    }
    let dir = std::env::temp_dir().join(format!(
        "lock-check-{}-{}",
        std::process::id(),
        target.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let secret = dir.join("secret");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let key = leda_net::auth::nonce()?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&secret)?;
        writeln!(f, "{hex}")?;
    }
    let ttl_ms = match target {
        Target::Leda => cli.ttl_ms,
        Target::Etcd => cli.ttl_ms.max(2000),
    };
    let net = if cli.no_faults || cli.no_partitions {
        None
    } else if let Some(why) = netns::Netns::unavailable() {
        println!("lock-check: partitions skipped: {why}");
        None
    } else {
        match netns::Netns::create(cli.nodes) {
            Ok(net) => Some(net),
            Err(e) => {
                println!("lock-check: partitions skipped: cannot make namespaces: {e}");
                None
            }
        }
    };
    let run = Run {
        cli,
        target,
        history,
        dir,
        secret,
        ttl_ms,
        net,
    };
    let result = drive(&run, &me, &service, algorithm);
    let _ = std::fs::remove_dir_all(
        Path::new("/dev/shm").join(format!("lock-check-etcd-{}", std::process::id())),
    );
    if matches!(result, Ok((ExitCode::SUCCESS, _))) {
        let _ = std::fs::remove_dir_all(&run.dir);
    } else {
        eprintln!(
            "lock-check: the run's files are kept in {}",
            run.dir.display()
        );
    }
    result
}

fn drive(
    run: &Run,
    me: &Path,
    service: &Path,
    algorithm: leda_mutex::Algorithm,
) -> anyhow::Result<(ExitCode, leda_lock_service::check::Report)> {
    let cli = run.cli;
    let dir = &run.dir;
    // The register.
    let mut reg = run
        .command(me, "register.err")?
        .args(["register", "--listen", "127.0.0.1:0", "--history"])
        .arg(dir.join("register.jsonl"))
        .spawn()?;
    let register_addr = await_line(&mut reg, "LISTENING ", Duration::from_secs(10))?;
    let _register = Proc {
        name: "register".into(),
        child: reg,
        stopped: false,
        dead: false,
    };
    let (mut nodes, client_addrs) = match run.target {
        Target::Leda => start_leda(run, service)?,
        Target::Etcd => start_etcd(run)?,
    };
    let what = match run.target {
        Target::Leda => format!("leda algorithm={algorithm}"),
        Target::Etcd => "etcd".to_owned(),
    };
    println!(
        "lock-check: target={what} nodes={} clients={} locks={} ttl={} ms \
         duration={} s faults={}",
        cli.nodes,
        cli.clients,
        cli.locks.join(","),
        run.ttl_ms,
        cli.duration,
        match (cli.no_faults, run.net.is_some()) {
            (true, _) => "none",
            (false, true) => "kill,stop,partition",
            (false, false) => "kill,stop",
        }
    );
    if let Some(net) = &run.net {
        println!(
            "lock-check: nodes in network namespaces {}..{} (10.213.x.y): partitions on",
            net.name(0),
            net.name(cli.nodes - 1)
        );
    }
    // The clients: client k talks to node k mod n first.
    let rotated = |k: usize| -> Vec<String> {
        (0..cli.nodes)
            .map(|j| client_addrs[(k + j) % cli.nodes].clone())
            .collect()
    };
    let mut clients = Vec::new();
    for k in 0..cli.clients {
        clients.push(run.spawn_client(
            me,
            &format!("c{k}"),
            &rotated(k),
            &register_addr,
            cli.seed.wrapping_mul(1000) + k as u64,
        )?);
    }
    let mut faults = Vec::new();
    let mut rng = SimRng::new(cli.seed);
    let mut later: Vec<(Instant, Action)> = Vec::new();
    let start = Instant::now();
    let end = start + Duration::from_secs(cli.duration);
    let mut next_fault = start + Duration::from_millis(cli.fault_every_ms);
    let mut generation = 0;
    // etcd (Raft) survives the loss of a minority; ours with a crash-tolerant algorithm.
    let crash_tolerant = run.target == Target::Etcd || algorithm.tolerates_crashes();
    let mut killed_nodes = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = later.into_iter().partition(|(t, _)| *t <= now);
        later = rest;
        for (_, action) in due {
            match action {
                Action::ContClient(k) => {
                    clients[k].signal(libc::SIGCONT);
                    clients[k].stopped = false;
                    faults.push(fault("cont", &clients[k].name));
                }
                Action::ContNode(j) => {
                    if let Some(p) = nodes[j].as_mut() {
                        p.signal(libc::SIGCONT);
                        p.stopped = false;
                        faults.push(fault("cont", &p.name));
                    }
                }
                Action::Heal(j) => {
                    if let Some(net) = &run.net {
                        net.cut(j, false)?;
                        faults.push(fault("heal", &format!("node{j}")));
                    }
                }
                Action::RestartClient(k) => {
                    generation += 1;
                    let name = format!("c{k}.{generation}");
                    clients[k] = run.spawn_client(
                        me,
                        &name,
                        &rotated(k),
                        &register_addr,
                        cli.seed.wrapping_mul(1000) + 100 * generation + k as u64,
                    )?;
                    faults.push(fault("restart", &name));
                }
            }
        }
        if cli.no_faults || now < next_fault {
            continue;
        }
        next_fault = now + Duration::from_millis(cli.fault_every_ms);
        let ttl = Duration::from_millis(run.ttl_ms);
        let kinds = if run.net.is_some() { 5 } else { 4 };
        match rng.next_u64() % kinds {
            4 => {
                // Cut a node off from everyone (peers and clients) for 0.3-1.5 s: longer than
                // the failure detector's timeout, so the others may take it for crashed.
                let j = rng.next_u64() as usize % cli.nodes;
                let Some(net) = &run.net else { continue };
                if nodes[j].is_none()
                    || later
                        .iter()
                        .any(|(_, a)| matches!(a, Action::Heal(h) if *h == j))
                {
                    continue;
                }
                net.cut(j, true)?;
                faults.push(fault("partition", &format!("node{j}")));
                let d = Duration::from_millis(300 + rng.next_u64() % 1200);
                later.push((now + d, Action::Heal(j)));
            }
            0 => {
                let k = rng.next_u64() as usize % clients.len();
                if clients[k].stopped || clients[k].dead {
                    continue;
                }
                clients[k].signal(libc::SIGSTOP);
                clients[k].stopped = true;
                faults.push(fault("stop", &clients[k].name));
                let pause = ttl + ttl.mul_f64(rng.unit() * 2.0);
                later.push((now + pause, Action::ContClient(k)));
            }
            1 => {
                let k = rng.next_u64() as usize % clients.len();
                if clients[k].stopped || clients[k].dead {
                    continue;
                }
                clients[k].signal(libc::SIGKILL);
                clients[k].dead = true;
                faults.push(fault("kill", &clients[k].name));
                later.push((now + Duration::from_millis(300), Action::RestartClient(k)));
            }
            2 => {
                let j = rng.next_u64() as usize % cli.nodes;
                let Some(p) = nodes[j].as_mut() else { continue };
                if p.stopped {
                    continue;
                }
                p.signal(libc::SIGSTOP);
                p.stopped = true;
                // Half the time shorter than the failure detector's timeout (a slow node),
                // else, where a crashed minority is tolerated, 0.4-1 s: the others take it
                // for crashed and go on, and its clients must not hold on meanwhile (our
                // node, resumed, stops: it counts as a crash).
                let r = rng.next_u64() % 100;
                let long = crash_tolerant && (killed_nodes + 1) * 2 < cli.nodes;
                let pause = if long && r >= 50 {
                    killed_nodes += 1;
                    faults.push(fault("pause", &p.name));
                    Duration::from_millis(400 + (r - 50) * 12)
                } else {
                    faults.push(fault("stop", &p.name));
                    Duration::from_millis(50 + r)
                };
                later.push((now + pause, Action::ContNode(j)));
            }
            _ => {
                // A minority of the nodes (node 0 too: the group's run outlives it).
                if !crash_tolerant || (killed_nodes + 1) * 2 >= cli.nodes {
                    continue;
                }
                let j = rng.next_u64() as usize % cli.nodes;
                let Some(mut p) = nodes[j].take() else {
                    continue;
                };
                p.signal(libc::SIGKILL);
                killed_nodes += 1;
                faults.push(fault("kill", &p.name));
            }
        }
    }
    // The end: everyone runs again, the clients finish their holds and stop.
    for c in &mut clients {
        c.signal(libc::SIGCONT);
    }
    for p in nodes.iter_mut().flatten() {
        p.signal(libc::SIGCONT);
    }
    if let Some(net) = &run.net {
        for j in 0..cli.nodes {
            net.cut(j, false)?;
        }
    }
    std::fs::write(dir.join("stop"), "")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    for c in &mut clients {
        while Instant::now() < deadline && c.child.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    drop(clients);
    register::Register::connect(&register_addr)?.finish()?;
    drop(nodes);
    let history = merge(dir, &faults, run.target)?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&run.history)
            .with_context(|| format!("creating {}", run.history.display()))?,
    );
    for rec in &history {
        writeln!(out, "{}", serde_json::to_string(rec)?)?;
    }
    out.flush()?;
    let found = check(&history);
    let status = report(&found, run.target.name());
    println!("lock-check: history in {}", run.history.display());
    if found.holds == 0 || found.accepted == 0 {
        bail!("no hold or no accepted write: nothing was checked");
    }
    Ok((status, found))
}

enum Action {
    Heal(usize),
    ContClient(usize),
    ContNode(usize),
    RestartClient(usize),
}

fn fault(what: &str, target: &str) -> Record {
    Record::Fault {
        what: what.into(),
        target: target.into(),
        at_ns: monotonic_ns(),
    }
}

/// One history out of the clients' logs, the nodes' audit lines, the register's writes and
/// the faults.
fn merge(dir: &Path, faults: &[Record], target: Target) -> anyhow::Result<Vec<Record>> {
    // (client, lock, fence) → the service's expiry time.
    let mut expiries = std::collections::HashMap::new();
    let mut holds = Vec::new();
    let mut writes = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.starts_with("audit") {
            for line in std::fs::read_to_string(&path)?.lines() {
                let v: serde_json::Value = serde_json::from_str(line)?;
                let key = (
                    v["client"].as_str().unwrap_or_default().to_owned(),
                    v["lock"].as_str().unwrap_or_default().to_owned(),
                    v["fence"].as_u64().unwrap_or_default(),
                );
                expiries.insert(key, v["at_ns"].as_u64().unwrap_or_default());
            }
        } else if name == "register.jsonl" {
            writes = leda_lock_service::check::parse(&std::fs::read_to_string(&path)?)
                .map_err(anyhow::Error::msg)?;
        } else if let Some(client) = name.strip_suffix(".log") {
            holds.push((client.to_owned(), std::fs::read_to_string(&path)?));
        }
    }
    let mut out = Vec::new();
    for (client, text) in holds {
        let mut open: Vec<(String, u64, u64)> = Vec::new();
        let mut done = Vec::new();
        // etcd: the lease TTL and the last answered keep-alive's send time.
        let (mut ttl, mut last_k) = (0u64, 0u64);
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["L", t] => ttl = t.parse()?,
                ["K", at] => last_k = last_k.max(at.parse()?),
                ["A", lock, fence, at] => open.push(((*lock).into(), fence.parse()?, at.parse()?)),
                ["E", lock, fence, at, end] => {
                    let fence: u64 = fence.parse()?;
                    if let Some(i) = open.iter().position(|o| o.0 == *lock && o.1 == fence) {
                        let (lock, fence, acquired) = open.remove(i);
                        done.push((
                            lock,
                            fence,
                            acquired,
                            Some(at.parse()?),
                            Some(end.to_string()),
                        ));
                    }
                }
                // A line cut by kill -9.
                _ => {}
            }
        }
        // Holds the client never ended (killed): the service's expiry, if it saw one; for
        // etcd, the earliest its lease could expire.
        for (lock, fence, acquired) in open {
            let ended = match target {
                Target::Leda => expiries
                    .get(&(client.clone(), lock.clone(), fence))
                    .copied(),
                // etcd expires a lease a TTL after it last heard a keep-alive, which was
                // after we sent it: the lease lived at least until then.
                Target::Etcd => (ttl > 0).then_some(last_k + ttl),
            };
            done.push((
                lock,
                fence,
                acquired,
                ended,
                ended.map(|_| "lease_expired".into()),
            ));
        }
        for (lock, fence, acquired_ns, ended_ns, end) in done {
            // The service's own expiry may be earlier than when the client learnt of it.
            let ended_ns = match (
                ended_ns,
                expiries.get(&(client.clone(), lock.clone(), fence)),
            ) {
                (Some(e), Some(&x)) => Some(e.min(x)),
                (e, x) => e.or(x.copied()),
            };
            out.push(Record::Hold {
                lock,
                client: client.clone(),
                fence,
                acquired_ns,
                ended_ns,
                end,
            });
        }
    }
    out.extend(writes);
    out.extend(faults.iter().cloned());
    Ok(out)
}
