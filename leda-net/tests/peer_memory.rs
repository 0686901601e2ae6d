//! Large binaries between two processes of one host travel as references read from the
//! sender's memory (`link::memory`), and arrive intact; a process started with
//! `LEDA_PEER_MEMORY=0` sends and accepts none, and the same run goes through the socket.

mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Node;
use leda_core::prelude::*;
use leda_net::Launcher;
use leda_net::link::peer_memory_read;

const ME: &str = "launcher:1";
const EXIT: Duration = Duration::from_secs(10);
const N: i64 = 24;
const SIZE: usize = 1536 * 1024;

fn payload(i: i64) -> bytes::Bytes {
    (0..SIZE)
        .map(|k| ((k as i64 * 7 + i) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
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
    let mut g = Graph::new("peer-memory");
    g.connect(&send, 1, &echo);
    g.connect(&echo, 1, &record);
    g.part([Cluster::of([&send, &record]), Cluster::of([&echo])])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    send.push(0);
    let before = peer_memory_read();
    let report = Launcher::new(ME)
        .run(&g, Run::default().threads(2))
        .expect("run");
    let read = peer_memory_read() - before;
    assert_eq!(report.transport.failed, 0);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, (0..N).collect::<Vec<_>>(), "every event back once");
    read
}

#[test]
fn large_binaries_are_read_from_the_sender_s_memory_unless_turned_off() {
    let node = Node::spawn(&[]);
    let read = round_trip(&node);
    assert_eq!(
        read,
        N as u64 * SIZE as u64,
        "every echo read from the daemon's memory"
    );
    let (status, out) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "{out}");

    let node = Node::start_env(
        &["daemon", "--listen", "127.0.0.1:0", "--once"],
        None,
        &[("LEDA_PEER_MEMORY", "0")],
    );
    let read = round_trip(&node);
    assert_eq!(read, 0, "the daemon offered its memory though turned off");
    let (status, out) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "{out}");
}
