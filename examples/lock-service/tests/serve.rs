//! The lock service as a service: `lock-service serve` nodes as real processes on loopback,
//! clients in this process (the Rust API) and in others (`lock-service lock`), leases under
//! SIGSTOP and kill -9, fences across a restart of the group, hostile clients, and the
//! `lock-check` harness under faults.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Proc};
use leda_lock_service::LockError;
use leda_lock_service::gate::EPOCH_SHIFT;
use leda_lock_service::remote::{ConnectOptions, LockClient};
use leda_lock_service::serving::start_group;
use leda_net::Secret;

/// A scratch directory with a secret file (mode 0600).
struct Scratch {
    dir: PathBuf,
    secret: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("leda-serve-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&secret)
            .unwrap();
        writeln!(f, "a test secret of enough bytes, {name}").unwrap();
        Scratch { dir, secret }
    }

    fn opts(&self, name: &str, ttl: Duration) -> ConnectOptions {
        ConnectOptions::new(name)
            .unwrap()
            .secret(Secret::from_file(&self.secret).unwrap())
            .ttl(ttl)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// Starts a group of `n` serving nodes; returns them and their client addresses.
fn group(s: &Scratch, n: usize, algorithm: &str) -> (Vec<Proc>, Vec<String>) {
    let nodes: Vec<String> = (0..n).map(|_| free_addr()).collect();
    let (children, clients) = start_group(n, Duration::from_secs(30), |i| {
        node_cmd(s, i, &nodes, algorithm)
            .stderr(Stdio::inherit())
            .spawn()
    })
    .unwrap();
    // Node 0 says SERVING once the group runs; the others open their client ports a
    // moment later (a client that comes before is turned away at once): wait for each.
    for addr in &clients {
        let t = Instant::now();
        while let Err(e) = LockClient::connect(addr, s.opts("probe", Duration::from_secs(5))) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{addr} never served: {e}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (children.into_iter().map(Proc).collect(), clients)
}

/// `lock-service serve` for node `i` of `nodes`, with the scratch's secret and a data
/// directory in it; stdout piped (its `CLIENTS ADDR` line).
fn node_cmd(s: &Scratch, i: usize, nodes: &[String], algorithm: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--id", &i.to_string(), "--clients", "127.0.0.1:0"])
        .args(["--nodes", &nodes.join(","), "--algorithm", algorithm])
        .arg("--data-dir")
        .arg(s.dir.join(format!("node{i}")))
        .env("LEDA_SECRET_FILE", &s.secret)
        .env_remove("LEDA_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    cmd
}

fn lock_cmd(s: &Scratch, addr: &str, ttl: &str, script: &str) -> Proc {
    lock_args(
        s,
        &["--connect", addr, "--ttl", ttl, "--", "sh", "-c", script],
    )
}

/// `lock-service lock lock ARGS` with the scratch's secret; stderr piped.
fn lock_args(s: &Scratch, args: &[&str]) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["lock", "lock"])
            .args(args)
            .env("LEDA_SECRET_FILE", &s.secret)
            .env_remove("LEDA_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// The exit status and stderr of wrapper `p`, which must exit within 20 s of `since`
/// while `node` is stopped (resumed either way; the panic says what it did not do,
/// `after`).
fn exit_of(
    p: &mut Proc,
    node: &Proc,
    since: Instant,
    after: &str,
) -> (std::process::ExitStatus, String) {
    let status = loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            break st;
        }
        if since.elapsed() > Duration::from_secs(20) {
            signal(node, libc::SIGCONT);
            panic!("the wrapper still runs 20 s {after}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    signal(node, libc::SIGCONT);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.0.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

fn wait_for(path: &Path) -> String {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.trim().to_owned();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} never written", path.display());
}

fn signal(p: &Proc, sig: i32) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(p.0.id() as i32, sig) };
}

#[test]
fn clients_in_other_processes_hold_leases_and_lose_them_to_sigstop_and_kill() {
    let s = Scratch::new("leases");
    let (_nodes, addrs) = group(&s, 3, "ricart-agrawala");
    let a = LockClient::connect(&addrs[0], s.opts("a", Duration::from_secs(10))).unwrap();
    let b = LockClient::connect(&addrs[1], s.opts("b", Duration::from_secs(10))).unwrap();
    let first = a.acquire("lock", Duration::from_secs(10)).unwrap();
    assert_eq!(
        first.fence() >> EPOCH_SHIFT,
        1,
        "the first group's epoch is 1"
    );
    assert!(b.try_acquire("lock").unwrap().is_none(), "held by a");
    let f1 = first.fence();
    a.release(first).unwrap();

    // A holder in another process, SIGSTOPped past its 0.5 s lease: b gets the lock with a
    // larger fence, and the holder, resumed, learns it lost the lock and stops its command.
    let held = s.dir.join("held1");
    let mut p = lock_cmd(
        &s,
        &addrs[2],
        "0.5",
        &format!("echo $LOCK_FENCE > {}; sleep 30", held.display()),
    );
    let f2: u64 = wait_for(&held).parse().unwrap();
    assert!(f2 > f1, "{f2} > {f1}");
    signal(&p, libc::SIGSTOP);
    let hold = b.acquire("lock", Duration::from_secs(10)).unwrap();
    assert!(hold.fence() > f2, "{} > {f2}", hold.fence());
    signal(&p, libc::SIGCONT);
    let status = p.0.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "the resumed holder reports the loss");
    assert!(err.contains("lost the lock"), "{err}");
    let f3 = hold.fence();
    drop(hold); // dropping a hold releases it

    // A holder killed with -9 under a 10 s lease: its connection closes, the node releases
    // at once (well before the TTL).
    let held = s.dir.join("held2");
    let p = lock_cmd(
        &s,
        &addrs[1],
        "10",
        &format!("echo $LOCK_FENCE > {}; sleep 30", held.display()),
    );
    let f4: u64 = wait_for(&held).parse().unwrap();
    assert!(f4 > f3);
    signal(&p, libc::SIGKILL);
    let t = Instant::now();
    let hold = a.acquire("lock", Duration::from_secs(8)).unwrap();
    assert!(hold.fence() > f4);
    assert!(t.elapsed() < Duration::from_secs(8));
    a.release(hold).unwrap();

    // A client without the secret is refused; a client sending garbage is cut off; the
    // service goes on.
    let wrong = ConnectOptions::new("intruder")
        .unwrap()
        .secret(Secret::new(b"not the secret, but long enough".to_vec()).unwrap());
    match LockClient::connect(&addrs[0], wrong) {
        Err(LockError::Unavailable(why)) => assert!(why.contains("auth"), "{why}"),
        other => panic!("an unauthenticated client got {other:?}"),
    }
    let mut raw = std::net::TcpStream::connect(&addrs[0]).unwrap();
    raw.write_all(&[0xff; 4096]).unwrap();
    let _ = raw.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = [0u8; 256];
    let mut total = 0;
    loop {
        match std::io::Read::read(&mut raw, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(
        total < 256,
        "a preamble at most, then the connection is closed"
    );
    let hold = b.acquire("lock", Duration::from_secs(10)).unwrap();
    b.release(hold).unwrap();
}

#[test]
fn a_restarted_group_hands_out_larger_fences_even_without_one_data_dir() {
    let s = Scratch::new("restart");
    let (nodes, addrs) = group(&s, 3, "suzuki-kasami");
    let c = LockClient::connect(&addrs[1], s.opts("c", Duration::from_secs(5))).unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let h = c.acquire("lock", Duration::from_secs(10)).unwrap();
        assert!(h.fence() > last);
        last = h.fence();
        c.release(h).unwrap();
    }
    drop(c);
    drop(nodes); // kill -9 of every node
    std::fs::remove_dir_all(s.dir.join("node2")).unwrap();
    let (_nodes, addrs) = group(&s, 3, "suzuki-kasami");
    let c = LockClient::connect(&addrs[2], s.opts("c2", Duration::from_secs(5))).unwrap();
    let h = c.acquire("lock", Duration::from_secs(10)).unwrap();
    assert!(h.fence() > last, "{} > {last}", h.fence());
    assert_eq!(h.fence() >> EPOCH_SHIFT, 2, "the second group's epoch");
    c.release(h).unwrap();
}

/// A second node started on the data directory of a live node (running, then stopped
/// with SIGSTOP) is refused, and says which process holds it; once the holder is killed
/// (kill -9), a node starts there. Before, both ran as one node, each storing the epoch
/// and answering in the majorities the fences rely on.
#[test]
fn a_second_node_on_a_held_data_dir_is_refused() {
    use std::io::{BufRead, BufReader};
    let s = Scratch::new("held-dir");
    // Node 1 of a group whose node 0 never comes: it holds its directory while it waits.
    let start = || {
        let nodes = [free_addr(), free_addr()];
        let mut p = Proc(node_cmd(&s, 1, &nodes, "centralized").spawn().unwrap());
        // Kept open: a node whose stdout is closed dies at its next line.
        let mut out = BufReader::new(p.0.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        (p, out, line)
    };
    let (first, _out, line) = start();
    assert!(line.starts_with("CLIENTS "), "{line:?}");
    for stopped in [false, true] {
        if stopped {
            signal(&first, libc::SIGSTOP);
        }
        let nodes = [free_addr(), free_addr()];
        let mut second = node_cmd(&s, 1, &nodes, "centralized")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while second.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(20) {
                let _ = second.kill();
                panic!("a second node runs on the held directory (holder stopped: {stopped})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = second.wait_with_output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("node1: the data directory is held by another lock-service node")
                && err.contains(&format!("(pid {})", first.0.id())),
            "{err}"
        );
        assert!(
            out.stdout.is_empty(),
            "it opened its client port: {:?}",
            out.stdout
        );
    }
    drop(first);
    let (_again, _out, line) = start();
    assert!(line.starts_with("CLIENTS "), "{line:?}");
}

/// Runs `lock-check` for 8 s with `extra` flags; returns its CHECK line and the history.
fn lock_check(extra: &[&str]) -> (String, Vec<leda_lock_service::check::Record>) {
    let history = std::env::temp_dir().join(format!(
        "lock-check-{}-{}.jsonl",
        std::process::id(),
        extra.len()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_lock-check"))
        // The default algorithm (quorum-grid) and group, as the README's command runs them.
        .args(["--duration", "8", "--seed", "2"])
        .args(extra)
        .arg("--history")
        .arg(&history)
        .env_remove("LEDA_SECRET")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("CHECK "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_owned();
    let text = std::fs::read_to_string(&history).unwrap();
    let _ = std::fs::remove_file(&history);
    let recs = leda_lock_service::check::parse(&text).unwrap();
    // The history is the documented JSON lines, and the checker reads it back the same.
    assert_eq!(
        leda_lock_service::check::check(&recs).holds,
        count(&line, "holds")
    );
    (line, recs)
}

fn count(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

/// Kills and pauses of clients and nodes, and (as root, with `ip`) partitions of nodes in
/// their own network namespaces: no anomaly, and locks granted throughout.
#[test]
fn lock_check_finds_no_anomaly_under_kills_pauses_and_partitions() {
    let (line, _) = lock_check(&[]);
    assert!(count(&line, "holds") >= 20, "{line}");
    assert!(count(&line, "faults") >= 5, "{line}");
    assert_eq!(
        count(&line, "overlaps") + count(&line, "fence_regressions"),
        0,
        "{line}"
    );

    // Without partitions, the group goes on after a node is lost (killed, or paused past
    // the detector's timeout; a minority, with a crash-tolerant algorithm): locks are
    // granted after the loss.
    let (line, recs) = lock_check(&["--no-partitions"]);
    use leda_lock_service::check::Record;
    let node_lost = recs.iter().find_map(|r| match r {
        Record::Fault {
            what,
            target,
            at_ns,
        } if (what == "kill" || what == "pause") && target.starts_with("node") => Some(*at_ns),
        _ => None,
    });
    let Some(at) = node_lost else {
        panic!("the schedule of seed 2 kills or pauses a node: {line}");
    };
    let after = recs
        .iter()
        .filter(
            |r| matches!(r, Record::Hold { acquired_ns, .. } if *acquired_ns > at + 1_000_000_000),
        )
        .count();
    assert!(after >= 5, "{after} holds after the node was lost: {line}");
}

/// A client stage that sends the front a node's reply (`("grant", lock, fence)`) is refused,
/// and the front's state is untouched: only the node stage's sealed events are node replies.
#[test]
fn a_client_cannot_pass_for_the_node() {
    use std::sync::{Arc, Mutex};

    use leda_core::prelude::*;
    use leda_lock_service::front::front_stage;
    use leda_mutex::Algorithm;
    use leda_mutex::stage::{NodeSpec, node_stage};

    let node = node_stage(NodeSpec {
        algorithm: Algorithm::Centralized,
        id: 0,
        n: 1,
        resources: vec!["x".into()],
        observer: None,
    })
    .unwrap();
    let front = front_stage(0, &["x".to_owned()]);
    let replies = Arc::new(Mutex::new(Vec::new()));
    let r2 = replies.clone();
    let client = Stage::new("client", move |ev: Event, ctx: &mut Ctx| {
        let tag: String = ev.get(0)?;
        match tag.as_str() {
            "go" => {
                ctx.send("front", ("grant", "x", 99))?;
                ctx.send("front", ("released", "x"))?;
                ctx.send("front", ("acquire", 1, "x", false))?;
            }
            _ => {
                let mut r = r2.lock().unwrap();
                r.push(format!("{tag} {:?}", ev.arg(3)));
                if tag == "granted" {
                    ctx.quit(());
                }
            }
        }
        Ok(())
    })
    .serial()
    .autostart("go");
    let mut g = Graph::new("forgery");
    g.connect(&front, "mutex", &node).local();
    g.connect(&node, "grant", &front).local();
    g.connect(&front, "reply", &client).local();
    g.connect(&client, "front", &front).local();
    g.run(Run::default().threads(2)).unwrap();
    let r = replies.lock().unwrap().clone();
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(
        r[0].starts_with("error") && r[1].starts_with("error"),
        "{r:?}"
    );
    assert_eq!(
        r[2], "granted Some(Int(1))",
        "the real grant, fence 1: {r:?}"
    );
}

/// The Lua side: a handler takes locks of a serving group through the catalogue's client stage
/// (`leda.stage.lock.client`), by events.
#[test]
fn lua_handlers_take_locks_of_a_serving_group() {
    leda_lua::registry::register_catalogue(leda_lock_service::catalogue());
    let s = Scratch::new("lua");
    let (_nodes, addrs) = group(&s, 3, "naimi-trehel");
    let code = format!(
        r#"
local client = require 'leda.stage.lock.client'
local c = leda.stage 'locks' (client)
c.connect = '{a0},{a1}'; c.ttl = 5; c.secret_file = '{secret}'
local user = leda.stage{{
    name = 'user', serial = true, autostart = true,
    init = function() fences = {{}} end,
    handler = function(tag, id, lock, fence)
        if tag == nil then
            leda.send('locks', 'acquire', 1, 'lock', 10)
        elseif tag == 'granted' then
            fences[#fences + 1] = fence
            leda.send('locks', 'release', id)
        elseif tag == 'released' then
            if #fences < 3 then leda.send('locks', 'acquire', id + 1, 'lock', 10)
            else leda.quit(fences[1], fences[2], fences[3]) end
        else
            error('unexpected reply ' .. tostring(tag) .. ': ' .. tostring(fence))
        end
    end,
}}
return leda.graph{{ user:connect('locks', c), c:connect('reply', user) }}:run()
"#,
        a0 = addrs[0],
        a1 = addrs[1],
        secret = s.secret.display()
    );
    let script = leda_lua::Script::new(leda_lua::ScriptOptions::default()).unwrap();
    let out = script.run_str(&code, "=locks").unwrap().into_vec();
    let fences: Vec<u64> = out
        .iter()
        .map(|v| v.as_i64().unwrap_or_else(|| panic!("{out:?}")) as u64)
        .collect();
    assert_eq!(fences.len(), 3, "{out:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(fences[0] >> EPOCH_SHIFT, 1, "{fences:?}");
}

/// The client stage's replies wait for room in a slow caller's queue, and a run that ends when
/// idle waits for them: twenty grants to a caller whose queue holds one event and that takes
/// 20 ms over each reply all arrive. Before, a reply that found the queue full was dropped (its
/// lock stayed held with nobody to release it), and `leda run` ended as soon as the acquires
/// were handed to the client stage, before any reply.
#[test]
fn the_client_stage_waits_for_room_for_its_replies() {
    leda_lua::registry::register_catalogue(leda_lock_service::catalogue());
    let s = Scratch::new("lua-slow");
    let nodes: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let locks: Vec<String> = (1..=20).map(|i| format!("lock{i}")).collect();
    let (children, addrs) = start_group(3, Duration::from_secs(30), |i| {
        node_cmd(&s, i, &nodes, "naimi-trehel")
            .args(["--locks", &locks.join(",")])
            .stderr(Stdio::inherit())
            .spawn()
    })
    .unwrap();
    let _nodes: Vec<Proc> = children.into_iter().map(Proc).collect();
    let code = format!(
        r#"
local client = require 'leda.stage.lock.client'
local c = leda.stage 'locks' (client)
c.connect = '{a0}'; c.ttl = 5; c.secret_file = '{secret}'
local user = leda.stage{{
    name = 'user', serial = true, autostart = true, capacity = 1,
    init = function() granted, released, os = 0, 0, require 'os' end,
    handler = function(tag, id)
        if tag == nil then
            for i = 1, 20 do leda.send('locks', 'acquire', i, 'lock' .. i, 10) end
        elseif tag == 'granted' then
            local t = os.clock() + 0.02
            while os.clock() < t do end
            granted = granted + 1
            assert(leda.send_wait('locks', 'release', id))
        elseif tag == 'released' then
            released = released + 1
            if released == 20 then leda.quit(granted, released) end
        else
            error('unexpected reply ' .. tostring(tag))
        end
    end,
}}
return leda.graph{{ user:connect('locks', c), c:connect('reply', user) }}:run()
"#,
        a0 = addrs[0],
        secret = s.secret.display()
    );
    // Ending when idle, as `leda run` does: the replies still to come keep the run going.
    let script = leda_lua::Script::new(leda_lua::ScriptOptions {
        until_idle: true,
        ..Default::default()
    })
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = script.run_str(&code, "=slow").map(|v| v.into_vec());
        let _ = tx.send(format!("{out:?}"));
    });
    let out = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the run did not end within 60 s: replies were lost");
    assert_eq!(out, "Ok([Integer(20), Integer(20)])");
}

/// A client speaking the wire protocol itself, to send what `LockClient` never does.
struct Raw {
    rt: tokio::runtime::Runtime,
    conn: leda_net::conn::Conn,
}

impl Raw {
    fn open(s: &Scratch, addr: &str, name: &str, ttl_ms: u64) -> Raw {
        use leda_lock_service::proto::{Request, Response};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let secret = Secret::from_file(&s.secret).unwrap();
        let conn = rt
            .block_on(leda_net::handshake::connect(
                addr,
                leda_net::frame::Role::Client,
                name,
                0,
                &secret,
                None,
                Duration::from_secs(5),
            ))
            .unwrap();
        let mut raw = Raw { rt, conn };
        raw.send(Request::Open { ttl_ms });
        let opened = raw.recv(Duration::from_secs(5));
        assert!(
            matches!(opened, Some(Response::Opened { .. })),
            "{opened:?}"
        );
        raw
    }

    fn send(&mut self, q: leda_lock_service::proto::Request) {
        let conn = &mut self.conn;
        self.rt
            .block_on(leda_lock_service::proto::write(conn, &q))
            .unwrap();
    }

    fn recv(&mut self, wait: Duration) -> Option<leda_lock_service::proto::Response> {
        let conn = &mut self.conn;
        self.rt
            .block_on(async move {
                tokio::time::timeout(wait, leda_lock_service::proto::read(conn)).await
            })
            .ok()
            .and_then(Result::ok)
            .flatten()
    }
}

/// A release of a request that still waits is refused, and the request goes on: it is
/// granted once the holder releases, and the lock is free again after its own release
/// (review finding: the refusal ended the request in the gate, its later grant found no
/// route, and the lock stayed taken for good). Then a double release: the first is
/// answered `Released`, the second refused (the first answer was lost).
#[test]
fn a_refused_release_leaves_the_request_and_the_lock_working() {
    use leda_lock_service::proto::{Request, Response};
    let s = Scratch::new("relwait");
    let (_nodes, addrs) = group(&s, 3, "ricart-agrawala");
    let a = LockClient::connect(&addrs[0], s.opts("a", Duration::from_secs(10))).unwrap();
    let held = a.acquire("lock", Duration::from_secs(10)).unwrap();
    let mut r = Raw::open(&s, &addrs[0], "raw", 10_000);
    r.send(Request::Acquire {
        req: 1,
        lock: "lock".into(),
        wait: true,
    });
    std::thread::sleep(Duration::from_millis(300));
    r.send(Request::Release { req: 1 });
    let refused = r.recv(Duration::from_secs(5));
    assert!(
        matches!(refused, Some(Response::Error { req: Some(1), .. })),
        "{refused:?}"
    );
    a.release(held).unwrap();
    let granted = r.recv(Duration::from_secs(10));
    assert!(
        matches!(granted, Some(Response::Granted { req: 1, .. })),
        "{granted:?}"
    );
    r.send(Request::Release { req: 1 });
    r.send(Request::Release { req: 1 });
    let mut answers = Vec::new();
    while let Some(a) = r.recv(Duration::from_secs(2)) {
        answers.push(a);
    }
    assert!(
        answers
            .iter()
            .any(|a| matches!(a, Response::Released { req: 1 })),
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .any(|a| matches!(a, Response::Error { req: Some(1), .. })),
        "{answers:?}"
    );
    drop(r);
    let b = LockClient::connect(&addrs[1], s.opts("b", Duration::from_secs(10))).unwrap();
    let hb = b.acquire("lock", Duration::from_secs(8));
    assert!(hb.is_ok(), "the lock stayed taken: {:?}", hb.err());
}

/// A session that sends keep-alives and never reads its answers: the node stops reading
/// it once `DIRECT_MAX` answers wait, so its memory stays bounded (review finding: +142
/// MiB for 56 MB of keep-alives), and then lets it go; the node serves others meanwhile.
#[test]
fn a_client_that_never_reads_costs_the_node_bounded_memory() {
    use leda_lock_service::proto::Request;
    use tokio::io::AsyncWriteExt;
    let rss_kib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let s = Scratch::new("noread");
    let (nodes, addrs) = group(&s, 3, "ricart-agrawala");
    let pid = nodes[1].0.id();
    let before = rss_kib(pid);
    let mut r = Raw::open(&s, &addrs[1], "hog", 3_000);
    // Holding a lock, so that each keep-alive waits for a check of the hold.
    let acquire = Request::Acquire {
        req: 1,
        lock: "held".into(),
        wait: true,
    };
    r.rt.block_on(leda_lock_service::proto::write(&mut r.conn, &acquire))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut frame = Vec::new();
    r.rt.block_on(leda_lock_service::proto::write(
        &mut frame,
        &Request::KeepAlive,
    ))
    .unwrap();
    let batch: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 100_000)
        .collect();
    let (mut sent, conn) = (0usize, &mut r.conn);
    let stalled = r.rt.block_on(async {
        while sent < 60 << 20 {
            let write = tokio::time::timeout(Duration::from_secs(2), conn.write_all(&batch));
            if write.await.is_err() {
                return true;
            }
            sent += batch.len();
        }
        false
    });
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(
        stalled,
        "the node read {sent} bytes of unanswered keep-alives"
    );
    assert!(
        grown < 64 * 1024,
        "the node grew by {grown} KiB ({sent} bytes sent)"
    );
    let c = LockClient::connect(&addrs[1], s.opts("c", Duration::from_secs(10))).unwrap();
    let h = c.acquire("lock", Duration::from_secs(10));
    assert!(h.is_ok(), "{:?}", h.err());
}

/// More connections than the node takes sessions, all silent: a client with the secret
/// still connects and locks (review finding: handshakes in progress counted against
/// the 1,024 connections, so silent ones renewed every 5 s kept every client out).
#[test]
fn silent_connections_do_not_lock_out_a_lock_client() {
    let s = Scratch::new("silent");
    let (_nodes, addrs) = group(&s, 3, "ricart-agrawala");
    let silent: Vec<std::net::TcpStream> = (0..1100)
        .map(|_| std::net::TcpStream::connect(&addrs[0]).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let c = LockClient::connect(&addrs[0], s.opts("c", Duration::from_secs(10)));
    let c = c.unwrap_or_else(|e| panic!("locked out after {:?}: {e}", t.elapsed()));
    assert!(c.acquire("lock", Duration::from_secs(10)).is_ok());
    drop(silent);
}

/// A node paused (SIGSTOP) past the failure detector's timeout while its client holds a
/// lock: the others go on without it, and a client of theirs gets the lock, but only once
/// the paused node's lease cannot be valid any more; resumed meanwhile, the paused node
/// renews nothing (the register shows the later grant) and stops (exit status 3). Review
/// finding: the second hold was granted 0.25 s after the pause while the first read valid
/// for its whole TTL.
#[test]
fn a_paused_node_s_holder_and_the_next_holder_never_overlap() {
    let s = Scratch::new("pause");
    let ttl = Duration::from_secs(2);
    let (mut nodes, addrs) = group(&s, 3, "quorum-grid");
    let a = LockClient::connect(&addrs[1], s.opts("a", ttl)).unwrap();
    let mut held = a.acquire("lock", Duration::from_secs(10)).unwrap();
    let b = LockClient::connect(&addrs[0], s.opts("b", Duration::from_secs(10))).unwrap();
    // Past the first TTL: the hold lives on renewals, which the register vouched for.
    std::thread::sleep(ttl + ttl / 4);
    assert!(held.is_valid(), "renewed while the group is whole");
    signal(&nodes[1], libc::SIGSTOP);
    let paused = Instant::now();
    let next = std::thread::spawn(move || {
        let h = b.acquire("lock", Duration::from_secs(30));
        (h, Instant::now(), b)
    });
    // Resumed while the next grant waits: its queued keep-alives must renew nothing.
    let mut resumed = false;
    let mut last_valid = None;
    while !next.is_finished() {
        if !resumed && paused.elapsed() > Duration::from_secs(1) {
            signal(&nodes[1], libc::SIGCONT);
            resumed = true;
        }
        if held.is_valid() {
            last_valid = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if !resumed {
        signal(&nodes[1], libc::SIGCONT);
    }
    let (h, granted, b) = next.join().unwrap();
    let valid_after = held.is_valid();
    let h = h.unwrap_or_else(|e| panic!("the group went on without node 1: {e}"));
    let last_valid = last_valid.expect("the first hold read valid when node 1 was paused");
    assert!(
        !valid_after && last_valid < granted,
        "two valid holds: the first read valid after the second was granted ({:?} after \
         the pause)",
        granted - paused
    );
    let t = Instant::now();
    let status = loop {
        if let Some(st) = nodes[1].0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "node 1 still serves after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert!(!held.is_valid(), "the stopped node's client still holds");
    b.release(h).unwrap();
}

/// A client whose acquire times out while its grant waits out a paused node's lease gets
/// its answer within its timeout, and the lock goes on to the next client once the wait is
/// over (review finding: the cancel was answered only after the wait, so a 1.2 s acquire
/// took 2.3 s, and up to the earlier hold's TTL, 10 minutes at most).
#[test]
fn an_acquire_timing_out_during_a_takeover_wait_returns_in_time() {
    let s = Scratch::new("rcw");
    let (nodes, addrs) = group(&s, 3, "quorum-grid");
    let a = LockClient::connect(&addrs[1], s.opts("a", Duration::from_secs(2))).unwrap();
    let _held = a.acquire("lock", Duration::from_secs(10)).unwrap();
    let b = LockClient::connect(&addrs[2], s.opts("b", Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal(&nodes[1], libc::SIGSTOP);
    let t = Instant::now();
    let timed_out = b.acquire("lock", Duration::from_millis(1200));
    let took = t.elapsed();
    assert!(
        timed_out.is_err(),
        "granted {took:?} after the pause, within the first hold's TTL"
    );
    assert!(
        took < Duration::from_millis(1700),
        "acquire with a 1.2 s timeout took {took:?}"
    );
    let c = LockClient::connect(&addrs[0], s.opts("c", Duration::from_secs(10))).unwrap();
    let next = c.acquire("lock", Duration::from_secs(10));
    signal(&nodes[1], libc::SIGCONT);
    assert!(next.is_ok(), "{:?}", next.err());
}

/// A crash-tolerant group goes on without node 0, the node that launched its run
/// (review finding: the run ended on every node with its launcher, so killing node 0, or
/// pausing it past the detector's timeout, took the whole service down).
#[test]
fn the_group_serves_on_after_node_0_is_killed() {
    let s = Scratch::new("node0");
    let (mut nodes, addrs) = group(&s, 3, "quorum-grid");
    let c = LockClient::connect(&addrs[1], s.opts("c", Duration::from_secs(2))).unwrap();
    let h = c.acquire("lock", Duration::from_secs(10)).unwrap();
    c.release(h).unwrap();
    signal(&nodes[0], libc::SIGKILL);
    let _ = nodes[0].0.wait();
    std::thread::sleep(Duration::from_secs(2));
    for (i, n) in nodes.iter_mut().enumerate().skip(1) {
        let st = n.0.try_wait().unwrap();
        assert!(st.is_none(), "node {i} ended with node 0: {st:?}");
    }
    let d = LockClient::connect(&addrs[2], s.opts("d", Duration::from_secs(2))).unwrap();
    for who in [&c, &d] {
        let h = who.acquire("lock", Duration::from_secs(10));
        let h = h.unwrap_or_else(|e| panic!("no lock without node 0: {e}"));
        who.release(h).unwrap();
    }
}

/// `lock-service lock`'s command never outlives the lease (review findings): when the
/// node it holds the lock through stops answering, the command's whole process group
/// (a child that ignores SIGTERM, and its own children) is gone before the next holder
/// gets the lock — it got SIGTERM only once the lease was over, then 5 s, and its
/// children nothing; and when the wrapper itself is killed (-9), its command dies with
/// it, where it ran on beside the next holder.
#[test]
fn a_lock_command_never_outlives_its_lease() {
    let s = Scratch::new("outlive");
    let (nodes, addrs) = group(&s, 3, "quorum-grid");
    let (pid, log) = (s.dir.join("pid"), s.dir.join("log"));
    // A command that ignores SIGTERM, and a child of its own that writes a line every
    // 20 ms while it runs.
    let script = format!(
        "trap '' TERM; echo $$ > {pid}; \
         (while :; do echo x >> {log}; sleep 0.02; done) & wait",
        pid = pid.display(),
        log = log.display()
    );
    let mut p = lock_cmd(&s, &addrs[1], "1", &script);
    wait_for(&pid);
    signal(&nodes[1], libc::SIGSTOP);
    let b = LockClient::connect(&addrs[0], s.opts("b", Duration::from_secs(10))).unwrap();
    let hold = b.acquire("lock", Duration::from_secs(30)).unwrap();
    let at_grant = std::fs::read_to_string(&log).unwrap().len();
    std::thread::sleep(Duration::from_millis(300));
    let after = std::fs::read_to_string(&log).unwrap().len();
    signal(&nodes[1], libc::SIGCONT);
    assert_eq!(
        at_grant, after,
        "the command's child wrote after the next grant"
    );
    let status = p.0.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("lost the lock") || err.contains("running out"),
        "{err}"
    );
    b.release(hold).unwrap();

    // The wrapper killed: its command goes with it.
    let _ = std::fs::remove_file(&pid);
    let p = lock_cmd(
        &s,
        &addrs[0],
        "10",
        &format!("echo $$ > {}; while :; do sleep 0.05; done", pid.display()),
    );
    let shell = wait_for(&pid);
    signal(&p, libc::SIGKILL);
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{shell}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{shell}/stat")).unwrap_or_default();
        if state
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim().starts_with('Z'))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the command ({shell}) runs on without its wrapper"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lock-service lock` exits, saying the release could not be confirmed, once the lease
/// of a node that stopped answering has run out, while the node is still stopped
/// (review finding F3b, rv13: the command was stopped in time, but the wrapper waited in
/// `release` for as long as the node stayed stopped: 11 minutes and counting).
#[test]
fn a_lock_wrapper_exits_while_its_node_stays_stopped() {
    let s = Scratch::new("stopped-release");
    let (nodes, addrs) = group(&s, 3, "quorum-grid");
    let pid = s.dir.join("pid");
    let mut p = lock_cmd(
        &s,
        &addrs[1],
        "4",
        &format!("echo $$ > {}; exec sleep 60", pid.display()),
    );
    wait_for(&pid);
    signal(&nodes[1], libc::SIGSTOP);
    let (status, err) = exit_of(
        &mut p,
        &nodes[1],
        Instant::now(),
        "after its node stopped (lease TTL 4 s)",
    );
    assert_eq!(status.code(), Some(1), "{err}");
    // The command stopped with a quarter of the lease left, then the release unconfirmed;
    // or, on a host too busy to look within that quarter, the lease over with no release.
    assert!(
        err.contains("the release was not confirmed") || err.contains("lost the lock"),
        "{err}"
    );
}

/// The wrapper's acquire that times out on a node that stopped answering exits within
/// a second of its timeout, not when the lease ends: the process ends its session, so
/// the withdrawal need not be confirmed (rv15: `--timeout 2` with `--ttl 30` took 30 s).
#[test]
fn a_lock_wrapper_gives_up_at_its_timeout_on_a_stopped_node() {
    let s = Scratch::new("stopped-timeout");
    let (nodes, addrs) = group(&s, 3, "quorum-grid");
    // The lock is held through node 0; the wrapper waits for it through node 1, which
    // then stops answering.
    let pid = s.dir.join("pid");
    let _holder = lock_cmd(
        &s,
        &addrs[0],
        "30",
        &format!("echo $$ > {}; exec sleep 60", pid.display()),
    );
    wait_for(&pid);
    let t = Instant::now();
    let mut p = lock_args(
        &s,
        &[
            "--connect",
            &addrs[1],
            "--ttl",
            "30",
            "--timeout",
            "3",
            "--",
            "true",
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    signal(&nodes[1], libc::SIGSTOP);
    let (status, err) = exit_of(
        &mut p,
        &nodes[1],
        t,
        "after its 3 s timeout (lease TTL 30 s)",
    );
    assert_ne!(status.code(), Some(0), "{err}");
}

/// An acquire that times out on a node that stopped answering returns once the lease has
/// run out: the withdrawal of the request, like a release, waits for the node only while
/// the lease is known valid (it waited for as long as the node stayed stopped; rv13 F3b).
#[test]
fn an_acquire_timing_out_on_a_stopped_node_returns() {
    let s = Scratch::new("stopped-cancel");
    let (nodes, addrs) = group(&s, 3, "quorum-grid");
    let b = LockClient::connect(&addrs[1], s.opts("b", Duration::from_secs(2))).unwrap();
    signal(&nodes[1], libc::SIGSTOP);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(b.acquire("lock", Duration::from_secs(1)));
    });
    let answer = rx.recv_timeout(Duration::from_secs(20));
    signal(&nodes[1], libc::SIGCONT);
    match answer {
        Ok(Err(LockError::Unavailable(why))) => assert!(why.contains("cancel"), "{why}"),
        Ok(other) => panic!("expected an unanswered cancel, got {other:?}"),
        Err(_) => panic!("the acquire still waits 20 s after its 1 s timeout (lease TTL 2 s)"),
    }
}

/// A node that is not serving (waiting for its group's deployment, as a node restarted
/// after a crash waits for ever) turns clients away at once, so that a client tries its
/// next node instead of waiting out its 5 s connect timeout (review finding), and says
/// why to a client with the secret: "not serving yet", not the guess at a TLS mismatch
/// that an unanswered close got (review finding). A client without the secret learns
/// no more than from a serving node.
#[test]
fn a_node_not_serving_yet_turns_clients_away_at_once() {
    use std::io::BufRead;
    let s = Scratch::new("unserved");
    let nodes = [free_addr(), free_addr()];
    let mut node = Proc(
        node_cmd(&s, 1, &nodes, "centralized")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut out = std::io::BufReader::new(node.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("CLIENTS ")
        .expect(&line)
        .to_owned();
    let t = Instant::now();
    let r = LockClient::connect(&addr, s.opts("c", Duration::from_secs(10)));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "turned away after {:?}",
        t.elapsed()
    );
    match r {
        Err(LockError::Unavailable(why)) => assert!(
            why.contains("node 1 is not serving yet") && !why.contains("tls"),
            "{why}"
        ),
        Err(e) => panic!("expected 'not serving yet', got {e}"),
        Ok(_) => panic!("a node that does not serve took a client"),
    }
    let wrong = ConnectOptions::new("w")
        .unwrap()
        .secret(Secret::new(b"another secret of enough bytes".to_vec()).unwrap());
    match LockClient::connect(&addr, wrong) {
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("wrong or missing shared secret") && !e.contains("serving"),
                "{e}"
            )
        }
        Ok(_) => panic!("a node that does not serve took a client without the secret"),
    }
}
