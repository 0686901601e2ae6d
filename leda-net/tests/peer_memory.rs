//! Large binaries between two processes of one host travel as references read from the
//! sender's memory (`link::memory`), and arrive intact; by default only between
//! processes of one executable (this test binary and the test node are two, hence
//! `PeerMemory::AnyExecutable` here and `LEDA_PEER_MEMORY=any` for the nodes); a process
//! started with `LEDA_PEER_MEMORY=0` sends and accepts none, and the same run goes
//! through the socket.
//!
//! Each graph first sends a small event through the node's echo and starts its large
//! sends when it comes back: by then both offers were answered (frames arrive in order),
//! however long the checks took (a host with thousands of sockets makes them slow).

mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::Node;
use leda_core::prelude::*;
use leda_net::Launcher;
use leda_net::link::{PeerMemory, peer_memory_read, set_peer_memory};

const ME: &str = "launcher:1";
const EXIT: Duration = Duration::from_secs(10);
const N: i64 = 24;
const SIZE: usize = 1536 * 1024;

fn payload(i: i64) -> Bytes {
    (0..SIZE)
        .map(|k| ((k as i64 * 7 + i) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// A graph: `start` (here) sends a small event to the node's echo, which sends it back
/// to `burst` (here): `burst` runs once the links are settled. `to_node` are more
/// stages of the node's cluster, `here` more of this process's, joined by `connect`.
fn after_ping(
    node: &Node,
    burst: &Stage,
    here: &[&Stage],
    to_node: &[&Stage],
    connect: impl FnOnce(&mut Graph),
) -> Graph {
    let start = Stage::new("start", |_: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, Event::from_values([Value::Int(-1)]))?;
        Ok(())
    });
    let echo = stages::echo("ping-echo");
    let mut g = Graph::new("peer-memory");
    g.connect(&start, 1, &echo);
    g.connect(&echo, 1, burst);
    connect(&mut g);
    let mut mine = vec![&start, burst];
    mine.extend_from_slice(here);
    let mut theirs = vec![&echo];
    theirs.extend_from_slice(to_node);
    g.part([Cluster::of(mine), Cluster::of(theirs)])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    start.push(0);
    g
}

/// Runs `g` (a daemon that lives on may still be ending the previous run: retried).
fn run(g: &Graph, launcher: impl Fn() -> Launcher) -> leda_net::LaunchReport {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match launcher().run(g, Run::default().threads(2)) {
            Err(leda_net::NetError::Refused { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => return r.expect("run"),
        }
    }
}

/// Sends `N` binaries of 1.5 MiB to the daemon's echo and checks every one that comes
/// back; returns how many bytes this process read from the daemon's memory meanwhile.
fn round_trip(node: &Node) -> u64 {
    let send = Stage::new("send", |_: Event, ctx: &mut Ctx| {
        for i in 0..N {
            ctx.send_or_wait(
                1,
                Event::from_values([Value::Int(i), Value::Bytes(payload(i))]),
            )?;
        }
        Ok(())
    });
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let s2 = seen.clone();
    let record = Stage::stateful(
        "record",
        |_: &Attrs| -> Result<i64, BoxError> { Ok(0) },
        move |got: &mut i64, ev: Event, ctx: &mut Ctx| {
            let i: i64 = ev.get(0)?;
            let b = ev.args()[1].as_bytes().ok_or("no binary")?;
            assert!(b[..] == payload(i)[..], "event {i} arrived changed");
            s2.lock().unwrap().push(i);
            *got += 1;
            if *got == N {
                ctx.quit(());
            }
            Ok(())
        },
    )
    .serial();
    let echo = stages::echo("echo");
    let g = after_ping(node, &send, &[&record], &[&echo], |g| {
        g.connect(&send, 1, &echo);
        g.connect(&echo, 1, &record);
    });
    let before = peer_memory_read();
    let report = run(&g, || Launcher::new(ME));
    let read = peer_memory_read() - before;
    assert_eq!(report.transport.failed, 0);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, (0..N).collect::<Vec<_>>(), "every event back once");
    read
}

/// A node (`--once`) with `LEDA_PEER_MEMORY` set to `mode` (unset: `None`).
fn node(mode: Option<&str>) -> Node {
    let env: Vec<(&str, &str)> = mode.map(|m| ("LEDA_PEER_MEMORY", m)).into_iter().collect();
    Node::start_env(&["daemon", "--listen", "127.0.0.1:0", "--once"], None, &env)
}

/// Runs `round_trip` with a fresh node: (bytes this process read from the node's
/// memory, bytes the node read from this process's).
fn both_ways(mode: Option<&str>) -> (u64, u64) {
    let node = node(mode);
    let read = round_trip(&node);
    let (status, out) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "{out}");
    (read, node_read(&out))
}

/// What a node's `ENDED` line says it read from peers' memory.
fn node_read(out: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("peer_memory="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no peer_memory= in {out:?}"))
}

#[test]
fn large_binaries_are_read_from_the_sender_s_memory_where_allowed() {
    set_peer_memory(PeerMemory::AnyExecutable);
    let all = N as u64 * SIZE as u64;
    // Both ends allow it: every binary, both ways.
    assert_eq!(both_ways(Some("any")), (all, all));
    // By default the node reads from, and sends references to, only processes of its
    // own executable (this test binary is another).
    assert_eq!(both_ways(None), (0, 0));
    // Off at the node: everything through the socket, both ways.
    assert_eq!(both_ways(Some("0")), (0, 0));
}

/// Sends 64 binaries of 256 KiB to a slow stage of the daemon and quits at once: most
/// are still unacknowledged (discarded) at the end of the run. `kept` gets a copy of
/// each (to see when this process lets go of them).
fn quit_with_references_in_flight(node: &Node, kept: Arc<Mutex<Vec<Bytes>>>) {
    let burst = Stage::new("burst", move |_: Event, ctx: &mut Ctx| {
        for i in 0..64u8 {
            let b = Bytes::from(vec![i; 256 * 1024]);
            kept.lock().unwrap().push(b.clone());
            let _ = ctx.send(1, Event::from_values([Value::Bytes(b)]));
        }
        ctx.quit(());
        Ok(())
    });
    let slow = stages::slow("slow").attr("ms", 50).capacity(4);
    let g = after_ping(node, &burst, &[], &[&slow], |g| {
        g.connect(&burst, 1, &slow);
    });
    run(&g, || Launcher::new(ME));
}

fn held(kept: &Mutex<Vec<Bytes>>) -> usize {
    kept.lock()
        .unwrap()
        .iter()
        .filter(|b| !b.is_unique())
        .count()
}

fn wait_free(kept: &Mutex<Vec<Bytes>>) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while held(kept) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    held(kept)
}

/// Referenced binaries unacknowledged at the end of a run are kept only while the
/// peer may still read them: freed once it has exited, and once a daemon that lives on
/// has let go of the run's connection (the first version kept them until some later
/// link went down, and from a long-lived daemon for ever: a review's finding).
#[test]
fn referenced_binaries_left_at_the_end_of_a_run_are_freed_once_unreadable() {
    set_peer_memory(PeerMemory::AnyExecutable);
    let node = node(Some("any"));
    let kept: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    quit_with_references_in_flight(&node, kept.clone());
    let (status, out) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "{out}");
    assert!(node_read(&out) > 0, "no reference was read: {out}");
    assert_eq!(wait_free(&kept), 0, "kept after the peer exited");

    let node = Node::start_env(
        &["daemon", "--listen", "127.0.0.1:0"],
        None,
        &[("LEDA_PEER_MEMORY", "any")],
    );
    let kept: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    for _ in 0..3 {
        quit_with_references_in_flight(&node, kept.clone());
    }
    assert_eq!(
        wait_free(&kept),
        0,
        "kept after a long-lived daemon's runs ended"
    );
}

/// A stopped peer (SIGSTOP) whose socket is full, under a silence bound longer than the
/// end of the run waits for the link's tasks: the run ends with those tasks cancelled
/// before they account for the unacknowledged events, and their referenced binaries
/// must still be kept, since the peer, resumed, reads the frames in its socket (the
/// first version freed them: a review's finding).
#[test]
fn references_stay_readable_for_a_stopped_peer_when_the_link_is_cancelled() {
    set_peer_memory(PeerMemory::AnyExecutable);
    let mut node = node(Some("any"));
    let pid = node.pid() as i32;
    let kept: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let k2 = kept.clone();
    let burst = Stage::new("burst", move |_: Event, ctx: &mut Ctx| {
        // SAFETY: kill has no memory effects here.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        for i in 0..200u32 {
            let r = Bytes::from(vec![(i % 251) as u8; 64 * 1024]);
            // Below the reference size: through the socket, filling it.
            let inline = Value::Array(
                (0..8)
                    .map(|_| Value::Bytes(Bytes::from(vec![1u8; 32 * 1024])))
                    .collect(),
            );
            k2.lock().unwrap().push(r.clone());
            let _ = ctx.send(1, Event::from_values([Value::Bytes(r), inline]));
        }
        ctx.quit(());
        Ok(())
    });
    let slow = stages::slow("slow").attr("ms", 1).capacity(512);
    let g = after_ping(&node, &burst, &[], &[&slow], |g| {
        g.connect(&burst, 1, &slow);
    });
    let report = Launcher::new(ME)
        .liveness(leda_net::Liveness::with_silence(Duration::from_secs(30)))
        .run(&g, Run::default().threads(2))
        .expect("run");
    // Every event accounted for, though the link had to be cut at the end (before, the
    // unacknowledged ones were counted nowhere: sent 104, delivered 1, discarded 0).
    let t = report.transport;
    assert_eq!(t.sent, t.delivered + t.failed + t.discarded, "{t:?}");
    std::thread::sleep(Duration::from_millis(300));
    let n = held(&kept);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    node.kill();
    assert!(
        n > 0,
        "nothing kept although the stopped peer may still read it"
    );
    assert_eq!(wait_free(&kept), 0, "kept after the peer was killed");
}
