//! Links over real loopback connections: delivery, refusals, credits, order.

use super::reader::Plain;
use super::*;
use leda_core::prelude::*;
use leda_core::runtime::Running;
use std::io::{Read, Write};
use std::sync::atomic::AtomicU64;

#[path = "../../tests/common/pki.rs"]
mod pki;

fn route(from: &str, to: &str) -> RouteInfo {
    RouteInfo {
        from: from.into(),
        to: to.into(),
        window: 8,
    }
}

/// A one-thread runtime and the two ends of a loopback connection made on it.
fn runtime_and_connection() -> (tokio::runtime::Runtime, TcpStream, TcpStream) {
    runtime_and_connection_on(1)
}

/// [`runtime_and_connection`] with `threads` runtime threads.
fn runtime_and_connection_on(threads: usize) -> (tokio::runtime::Runtime, TcpStream, TcpStream) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let (client, server) = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let c = TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    });
    (rt, client, server)
}

/// A sender (`s:1`) and a receiver (`r:1`) transport for `routes`, joined by one
/// loopback connection, on a one-thread runtime.
fn linked_pair(
    routes: Vec<RouteInfo>,
) -> (tokio::runtime::Runtime, Arc<Transport>, Arc<Transport>) {
    let (rt, client, server) = runtime_and_connection();
    let sender = Transport::new("s:1", routes.clone(), rt.handle().clone());
    let receiver = Transport::new("r:1", routes, rt.handle().clone());
    sender.attach("r:1", crate::conn::Conn::plain(client));
    receiver.attach("s:1", crate::conn::Conn::plain(server));
    (rt, sender, receiver)
}

/// [`linked_pair`] with both transports' liveness settings, on a two-thread runtime
/// (a daemon's: the liveness watch runs while a reader is busy).
fn linked_pair_with(
    routes: Vec<RouteInfo>,
    liveness: Liveness,
) -> (tokio::runtime::Runtime, Arc<Transport>, Arc<Transport>) {
    let (rt, client, server) = runtime_and_connection_on(2);
    let (client, server) = (
        crate::conn::Conn::plain(client),
        crate::conn::Conn::plain(server),
    );
    link_both(rt, routes, liveness, client, server)
}

/// [`linked_pair_with`] under TLS (mutual certificates).
fn linked_tls_pair_with(
    routes: Vec<RouteInfo>,
    liveness: Liveness,
) -> (tokio::runtime::Runtime, Arc<Transport>, Arc<Transport>) {
    let (rt, server, client) = tls_connection_on(2);
    link_both(rt, routes, liveness, client, server)
}

/// A sender `s:1` over `client` and a receiver `r:1` over `server`.
fn link_both(
    rt: tokio::runtime::Runtime,
    routes: Vec<RouteInfo>,
    liveness: Liveness,
    client: crate::conn::Conn,
    server: crate::conn::Conn,
) -> (tokio::runtime::Runtime, Arc<Transport>, Arc<Transport>) {
    let build = |me: &str| {
        let h = rt.handle().clone();
        Transport::build(
            me,
            routes.clone(),
            h,
            liveness,
            OnProcessLoss::End,
            Topology::default(),
        )
    };
    let (sender, receiver) = (build("s:1"), build("r:1"));
    sender.attach("r:1", client);
    receiver.attach("s:1", server);
    (rt, sender, receiver)
}

/// Runs the receiving stage `b` behind `receiver` and a sending stage `a` behind
/// `sender`, one worker each; returns the sender's run and the receiver's.
fn start_runs(sender: &Transport, receiver: &Transport, b: &Stage) -> (Running, Running) {
    let mut rg = Graph::new("r");
    rg.add(b);
    let rrun = rg.start(Run::default().threads(1)).unwrap();
    receiver.set_handle(rrun.handle());
    let a = Stage::new("a", |_, _| Ok(()));
    let mut sg = Graph::new("s");
    sg.add(&a);
    let srun = sg.start(Run::default().threads(1)).unwrap();
    sender.set_handle(srun.handle());
    (srun, rrun)
}

/// Ends both runs and closes both transports.
fn shut_down(
    rt: &tokio::runtime::Runtime,
    sender: &Transport,
    receiver: &Transport,
    srun: Running,
    rrun: Running,
) {
    srun.handle().quit(());
    rrun.handle().quit(());
    srun.wait().unwrap();
    rrun.wait().unwrap();
    rt.block_on(async {
        sender.close(None).await;
        receiver.close(None).await;
    });
}

/// Polls `cond` until it holds or `deadline` passes (the caller asserts what it needs).
fn wait_until(deadline: std::time::Instant, mut cond: impl FnMut() -> bool) {
    while !cond() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `b` alone, on one worker, as the destination of `receiver`'s links.
fn receive_with(receiver: &Transport, b: &Stage) -> Running {
    let mut g = Graph::new("r");
    g.add(b);
    let run = g.start(Run::default().threads(1)).unwrap();
    receiver.set_handle(run.handle());
    run
}

/// Ends a [`receive_with`] run, then the raw peer's connection (if still open) and
/// the receiving transport.
fn end_receiving(
    rt: &tokio::runtime::Runtime,
    receiver: &Transport,
    run: Running,
    client: Option<std::net::TcpStream>,
) {
    run.handle().quit(());
    run.wait().unwrap();
    drop(client);
    rt.block_on(receiver.close(None));
}

/// Two transports over a loopback connection: events reach the destination stage
/// and are acknowledged; events for a stage the receiver does not run are refused
/// and reported failed to the sending stage, with the credit window enforced.
#[test]
fn delivery_refusal_and_credits_over_a_link() {
    let (rt, sender, receiver) = linked_pair(vec![route("a", "b"), route("a", "zzz")]);

    let got = Arc::new(AtomicU64::new(0));
    let seen = got.clone();
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        seen.fetch_add(ev.get::<u64>(0)?, Relaxed);
        Ok(())
    });
    let (srun, rrun) = start_runs(&sender, &receiver, &b);

    let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let to_zzz = sender.sink("a", "zzz", 1, &["r:1".into()]).unwrap();
    for i in 1..=8u64 {
        to_b.send(Event::from(i)).unwrap();
    }
    // The window (8) is used up until the receiver acknowledges.
    let r = to_b.send(Event::from(100u64));
    if let Err(r) = &r {
        assert!(
            matches!(r.error, SendError::QueueFull { .. }),
            "{}",
            r.error
        );
    }
    to_zzz.send(Event::from(5u64)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let want_b = if r.is_ok() { 136 } else { 36 };
    wait_until(deadline, || {
        got.load(Relaxed) == want_b && sender.counts().failed == 1
    });
    assert_eq!(got.load(Relaxed), want_b);
    let c = sender.counts();
    assert_eq!(c.failed, 1, "{c:?}");
    assert_eq!(c.delivered + c.failed, c.sent);
    assert_eq!(to_b.in_flight() + to_zzz.in_flight(), 0);
    let snap = srun.handle().snapshot();
    assert_eq!(
        snap.stages[0].failed_sends, 1,
        "reported to the sending stage"
    );
    assert_eq!(receiver.counts().accepted, c.delivered);

    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// Large binaries (spliced into vectored writes, not copied), strings and small
/// values cross a link intact and in order, over many batches, with credits and
/// the byte window returning as acknowledgements come back.
#[test]
fn mixed_payloads_arrive_intact_and_in_order() {
    let (rt, sender, receiver) = linked_pair(vec![RouteInfo {
        from: "a".into(),
        to: "b".into(),
        window: 64,
    }]);

    const N: u64 = 600;
    // Event i: (i, binary of a size cycling through small, spliced and large
    // ones, each byte = i mod 251, a string).
    let size = |i: u64| [0usize, 16, SPLICE_MIN, 1000, 70_000, 1024 * 1024 + 7][(i % 6) as usize];
    let bad = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let (b2, n2) = (bad.clone(), next.clone());
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let i: u64 = ev.get(0)?;
        let bin = ev.arg(1).and_then(Value::as_bytes).map(|b| b.to_vec());
        let s: String = ev.get(2)?;
        let ok = n2.fetch_add(1, Relaxed) == i
            && bin
                .is_some_and(|b| b.len() == size(i) && b.iter().all(|&x| u64::from(x) == i % 251))
            && s == format!("event {i}");
        if !ok {
            b2.fetch_add(1, Relaxed);
        }
        Ok(())
    })
    .serial();
    let (srun, rrun) = start_runs(&sender, &receiver, &b);

    let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        let bin = bytes::Bytes::from(vec![(i % 251) as u8; size(i)]);
        let mut ev = Event::from((i as i64, Value::Bytes(bin), format!("event {i}")));
        loop {
            match to_b.send(ev) {
                Ok(()) => break,
                Err(r) => {
                    assert!(
                        matches!(r.error, SendError::QueueFull { .. }),
                        "{}",
                        r.error
                    );
                    assert!(
                        std::time::Instant::now() < deadline,
                        "credits never came back"
                    );
                    ev = r.event;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }
    wait_until(deadline, || next.load(Relaxed) >= N);
    assert_eq!(next.load(Relaxed), N);
    assert_eq!(bad.load(Relaxed), 0, "every event intact and in order");
    wait_until(deadline, || to_b.in_flight() == 0);
    let c = sender.counts();
    assert_eq!((c.sent, c.delivered, c.failed), (N, N, 0));
    assert_eq!(lock(&sender.links()[0].outbox).unacked_bytes, 0);

    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// A receiving stage with less room than a frame holds: each frame is queued as
/// far as it fits (one batch), the rest waits and is retried, in order; the
/// sender's acknowledged events are released and its counters settle, and a
/// sender out of credit is woken by [`RemoteSink::room`] when credit returns.
#[test]
fn partial_batches_keep_order_and_credit_wakes_the_sender() {
    let (rt, sender, receiver) = linked_pair(vec![RouteInfo {
        from: "a".into(),
        to: "b".into(),
        window: 256,
    }]);
    const N: u64 = 5000;
    let next = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let (n2, b2) = (next.clone(), bad.clone());
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let i: u64 = ev.get(0)?;
        let bin = ev.arg(1).and_then(Value::as_bytes).map(|b| b.to_vec());
        if n2.fetch_add(1, Relaxed) != i || bin != Some(vec![(i % 251) as u8; 16]) {
            b2.fetch_add(1, Relaxed);
        }
        Ok(())
    })
    .serial()
    .capacity(10);
    let (srun, rrun) = start_runs(&sender, &receiver, &b);

    let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let mut waits = 0;
    for i in 0..N {
        let bin = bytes::Bytes::from(vec![(i % 251) as u8; 16]);
        let mut ev = Event::from((i as i64, Value::Bytes(bin)));
        loop {
            match to_b.send(ev) {
                Ok(()) => break,
                Err(r) => {
                    assert!(
                        matches!(r.error, SendError::QueueFull { .. }),
                        "{}",
                        r.error
                    );
                    ev = r.event;
                    // Completes once credit is back (no back-off here): a lost
                    // wake-up would hang, hence the generous bound.
                    let room = to_b.room().expect("leda-net signals room");
                    rt.block_on(async {
                        tokio::time::timeout(Duration::from_secs(20), room).await
                    })
                    .expect("woken when credit returned");
                    waits += 1;
                }
            }
        }
    }
    assert!(waits > 0, "the window (256) ran out at least once");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    wait_until(deadline, || {
        next.load(Relaxed) >= N && to_b.in_flight() == 0
    });
    assert_eq!(next.load(Relaxed), N);
    assert_eq!(bad.load(Relaxed), 0, "every event intact and in order");
    let c = sender.counts();
    assert_eq!((c.sent, c.delivered, c.failed), (N, N, 0));
    assert_eq!(receiver.counts().accepted, N);
    {
        let link = &sender.links()[0];
        let ob = lock(&link.outbox);
        assert_eq!(ob.unacked_bytes, 0);
        assert!(
            ob.routes[0].unacked.is_empty(),
            "acknowledged events released"
        );
        assert_eq!(ob.routes[0].credit, 256, "every credit back");
    }

    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// Sends as a running task makes them (`send_held`, then `flush`) from several
/// threads at once, retrying when the window is full: every event arrives, in order
/// per sender, and is acknowledged (the sending workers write the socket themselves,
/// racing each other, the writer task and the reader's acknowledgements).
#[test]
fn held_sends_from_several_threads_arrive_in_order() {
    const N: u64 = 20_000;
    let mut r = route("a", "b");
    r.window = 64;
    let (rt, sender, receiver) = linked_pair(vec![r]);
    let next = Arc::new(Mutex::new([0u64; 2]));
    let order = next.clone();
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let (who, i): (usize, u64) = (ev.get(0)?, ev.get(1)?);
        let mut next = order.lock().unwrap();
        if next[who] != i {
            return Err(format!("sender {who}: got {i}, expected {}", next[who]).into());
        }
        next[who] += 1;
        Ok(())
    })
    .serial();
    let (srun, rrun) = start_runs(&sender, &receiver, &b);
    let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    std::thread::scope(|s| {
        for who in 0..2usize {
            let sink = sink.clone();
            s.spawn(move || {
                for i in 0..N {
                    let mut ev = Event::from((who as i64, i as i64));
                    loop {
                        match sink.send_held(ev) {
                            Ok(()) => break,
                            Err(r) => {
                                assert!(matches!(r.error, SendError::QueueFull { .. }));
                                ev = r.event;
                                std::thread::sleep(Duration::from_micros(50));
                            }
                        }
                    }
                    if i % 16 == 15 {
                        sink.flush();
                    }
                }
                sink.flush();
            });
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    wait_until(deadline, || *next.lock().unwrap() == [N, N]);
    assert_eq!(*next.lock().unwrap(), [N, N]);
    wait_until(deadline, || sink.in_flight() == 0);
    let c = sender.counts();
    assert_eq!((c.sent, c.delivered, c.failed), (2 * N, 2 * N, 0), "{c:?}");
    assert_eq!(rrun.handle().snapshot().stages[0].errors, 0);
    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// A link asked to close while sending threads write its socket themselves still
/// closes: the writer task is not left waiting for a wake-up a direct write took
/// (found by review: 29 hangs in 150 tries before the fix).
#[test]
fn a_close_during_direct_writes_is_not_lost() {
    for _ in 0..60 {
        // A window that does not run out: the threads keep writing.
        let mut r = route("a", "b");
        r.window = 1 << 20;
        let (rt, sender, receiver) = linked_pair(vec![r]);
        let b = Stage::new("b", |_, _| Ok(()));
        let (srun, rrun) = start_runs(&sender, &receiver, &b);
        let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
        let link = sender.links().pop().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Relaxed) {
                        let _ = sink.send_held(Event::from(1i64));
                        sink.flush();
                    }
                });
            }
            std::thread::sleep(Duration::from_micros(300));
            link.close();
            std::thread::sleep(Duration::from_micros(300));
            stop.store(true, Relaxed);
        });
        // The writer wrote what was queued and closed: the link is down (within the
        // peer's close, not the 3 s silence of a lost one).
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        wait_until(deadline, || link.is_dead());
        assert!(link.is_dead(), "the writer task did not close the link");
        shut_down(&rt, &sender, &receiver, srun, rrun);
        let c = sender.counts();
        assert_eq!(c.sent, c.delivered + c.failed + c.discarded, "{c:?}");
    }
}

/// A [`Plain`] over a second descriptor of `s`, as a link's reader has.
fn plain_of(s: &TcpStream) -> Plain {
    use std::os::fd::AsFd;
    let fd = s.as_fd().try_clone_to_owned().expect("a second descriptor");
    Plain::new(Arc::new(std::net::TcpStream::from(fd)))
}

/// [`Plain::read_now`] tried again while it says `WouldBlock`, until `deadline`.
fn read_when_ready(
    plain: &Plain,
    buf: &mut bytes::BytesMut,
    deadline: std::time::Instant,
) -> std::io::Result<usize> {
    loop {
        match plain.read_now(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "nothing came");
                std::thread::yield_now();
            }
            r => return r,
        }
    }
}

/// `reader::Plain::read_now` appends what came, in order, says `WouldBlock` when
/// nothing did, and sees the end of the stream.
#[test]
fn reads_that_do_not_wait_take_what_came_and_see_the_end() {
    let (rt, client, server) = runtime_and_connection();
    let _guard = rt.enter();
    let plain = plain_of(&server);
    let mut client = client.into_std().unwrap();
    client.set_nonblocking(false).unwrap();
    let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
    let e = plain.read_now(&mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "nothing came yet");
    let sent: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    client.write_all(&sent).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while buf.len() < sent.len() {
        let n = read_when_ready(&plain, &mut buf, deadline).expect("read");
        assert!(n > 0, "the peer has not closed");
    }
    assert_eq!(&buf[..], &sent[..], "the bytes, in order, appended");
    drop(client);
    let n = read_when_ready(&plain, &mut buf, deadline).expect("read");
    assert_eq!(n, 0, "{n} bytes after the end");
    assert_eq!(buf.len(), sent.len());
    // A full buffer is grown, not read as the end of the stream.
    let (rt, c, s) = runtime_and_connection();
    let _guard = rt.enter();
    let (mut client, plain) = (c.into_std().unwrap(), plain_of(&s));
    client.set_nonblocking(false).unwrap();
    client.write_all(b"abc").unwrap();
    let mut full = bytes::BytesMut::with_capacity(8);
    full.resize(full.capacity(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let n = read_when_ready(&plain, &mut full, deadline).expect("read");
    assert!(n > 0, "a full buffer read as the end of the stream");
    assert_eq!(&full[full.len() - n..], &b"abc"[..n]);
}

/// A receiving transport linked to a raw socket (frames written by hand).
fn raw_pair(window: u32) -> (tokio::runtime::Runtime, Arc<Transport>, std::net::TcpStream) {
    raw_pair_with(window, Liveness::default())
}

/// [`raw_pair`] with the receiver's liveness settings.
fn raw_pair_with(
    window: u32,
    liveness: Liveness,
) -> (tokio::runtime::Runtime, Arc<Transport>, std::net::TcpStream) {
    let (rt, client, server) = runtime_and_connection();
    let receiver = receiving_on(&rt, window, liveness, crate::conn::Conn::plain(server));
    let client = client.into_std().unwrap();
    client.set_nonblocking(false).unwrap();
    drain_replies(&client);
    (rt, receiver, client)
}

/// A receiving transport (`r:1`, route `a` → `b` with `window`) linked to `s:1` over
/// `conn`.
fn receiving_on(
    rt: &tokio::runtime::Runtime,
    window: u32,
    liveness: Liveness,
    conn: crate::conn::Conn,
) -> Arc<Transport> {
    let routes = vec![RouteInfo {
        from: "a".into(),
        to: "b".into(),
        window,
    }];
    let receiver = Transport::build(
        "r:1",
        routes,
        rt.handle().clone(),
        liveness,
        OnProcessLoss::End,
        Topology::default(),
    );
    receiver.attach("s:1", conn);
    receiver
}

/// Reads (and drops) whatever the receiver sends to `client`, on a thread of its own,
/// until the connection ends.
fn drain_replies(client: &std::net::TcpStream) {
    let mut r = client.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut b = vec![0u8; 1 << 16];
        while matches!(r.read(&mut b), Ok(n) if n > 0) {}
    });
}

/// A one-thread runtime and the two ends (server, client) of a loopback connection
/// under TLS with mutual certificates, made on it.
fn tls_connection() -> (
    tokio::runtime::Runtime,
    crate::conn::Conn,
    crate::conn::Conn,
) {
    tls_connection_on(1)
}

/// [`tls_connection`] with `threads` runtime threads.
fn tls_connection_on(
    threads: usize,
) -> (
    tokio::runtime::Runtime,
    crate::conn::Conn,
    crate::conn::Conn,
) {
    let dir = std::env::temp_dir().join(format!(
        "leda-net-link-tls-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let tls = crate::Tls::load(&pki::pki(&dir, "link")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (rt, client, server) = runtime_and_connection_on(threads);
    let addr = format!("127.0.0.1:{}", server.local_addr().unwrap().port());
    let (server, client) = rt.block_on(async {
        tokio::try_join!(tls.accept(server, "s:1"), tls.connect(client, &addr)).unwrap()
    });
    (rt, server, client)
}

/// Under TLS, a peer gone without `close_notify` (one that dies, or drops its connection)
/// has ended the stream, as over plain TCP: a frame read after it is the end, not an
/// i/o error ("peer closed connection without sending TLS close_notify"; what a
/// launcher reported for a daemon killed before it answered ready), and for a launcher
/// waiting for its daemons' start "it closed its connection ... (it ended or died)".
#[test]
fn a_tls_peer_gone_without_close_notify_ended_the_stream() {
    use crate::frame::{read_frame, write_frame};
    for server_goes in [true, false] {
        let (rt, mut server, mut client) = tls_connection();
        let end = rt.block_on(async {
            // One exchange first (the client has read what the handshake left).
            write_frame(&mut server, &Frame::Heartbeat).await.unwrap();
            read_frame(&mut client, 1 << 20).await.unwrap();
            write_frame(&mut client, &Frame::Heartbeat).await.unwrap();
            read_frame(&mut server, 1 << 20).await.unwrap();
            if server_goes {
                drop(server);
                read_frame(&mut client, 1 << 20).await
            } else {
                drop(client);
                read_frame(&mut server, 1 << 20).await
            }
        });
        assert!(
            matches!(end, Ok(None)),
            "server gone: {server_goes}: {:?}",
            end.map(|f| f.map(|f| f.name()))
        );
    }
    let (rt, mut server, mut client) = tls_connection();
    let broken = rt.block_on(async {
        write_frame(&mut server, &Frame::Heartbeat).await.unwrap();
        read_frame(&mut client, 1 << 20).await.unwrap();
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), server.silence_broken()).await
    });
    assert!(
        matches!(broken, Ok(crate::conn::Broken::Closed)),
        "{}",
        match broken {
            Ok(crate::conn::Broken::Failed(e)) => format!("failed: {e}"),
            Ok(_) => "spoke".into(),
            Err(_) => "still silent".into(),
        }
    );
}

/// [`raw_pair`] under TLS with mutual certificates (as between processes started with
/// `--tls-*`): the peer's end is the TLS client, which writes frames by hand, and a
/// second descriptor of its socket, blocking (its replies are drained through it,
/// and it shuts or resets the connection under the TLS stream).
fn raw_tls_pair(
    window: u32,
) -> (
    tokio::runtime::Runtime,
    Arc<Transport>,
    crate::conn::Conn,
    std::net::TcpStream,
) {
    let (rt, server, client) = tls_connection();
    let receiver = receiving_on(&rt, window, Liveness::default(), server);
    let sock = {
        use std::os::fd::AsFd;
        let fd = client.tcp().as_fd().try_clone_to_owned().unwrap();
        std::net::TcpStream::from(fd)
    };
    sock.set_nonblocking(false).unwrap();
    drain_replies(&sock);
    (rt, receiver, client, sock)
}

/// A deterministic pseudo-random sequence (xorshift64) from `seed` (not zero).
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// An `events` frame of event `(i, binary of size bytes i mod 251)`.
fn frame_for(i: u64, size: usize) -> Vec<u8> {
    let bin = bytes::Bytes::from(vec![(i % 251) as u8; size]);
    let ev = Event::from((i as i64, Value::Bytes(bin)));
    frame::encode(&Frame::Events(vec![(0, vec![ev])])).unwrap()
}

/// Frames of every size around `BIG_FRAME` (large ones read into buffers of their
/// own, reused), written by a raw peer split at random points with pauses, some
/// events kept by the stage: every event intact and in order, and the kept ones still
/// intact at the end (a reused buffer never overwrites a live event). Written by a
/// review of the large-frame reader.
#[test]
fn large_frames_split_anywhere_arrive_intact() {
    let (rt, receiver, mut client) = raw_pair(100_000);
    let bad = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let kept: Arc<Mutex<Vec<Event>>> = Arc::default();
    let (b2, n2, k2) = (bad.clone(), next.clone(), kept.clone());
    let check = |ev: &Event| -> Option<u64> {
        let i: u64 = ev.get(0).ok()?;
        let b = ev.arg(1).and_then(Value::as_bytes)?;
        b.iter().all(|&x| u64::from(x) == i % 251).then_some(i)
    };
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let want = n2.fetch_add(1, Relaxed);
        match check(&ev) {
            Some(i) if i == want => {
                if i % 3 == 0 {
                    k2.lock().unwrap().push(ev);
                }
            }
            other => {
                eprintln!("bad event: want {want} got {other:?}");
                b2.fetch_add(1, Relaxed);
            }
        }
        Ok(())
    })
    .serial();
    let run = receive_with(&receiver, &b);

    // Deterministic pseudo-random sizes / split points.
    let mut rnd = xorshift(0x9e3779b97f4a7c15);
    let mut stream = Vec::new();
    const N: u64 = 60;
    for i in 0..N {
        let size = match rnd() % 5 {
            0 => 16,
            1 => 100_000,
            2 => BIG_FRAME + (rnd() % 3_000_000) as usize,
            3 => 9 * 1024 * 1024 + (rnd() % 1000) as usize,
            _ => BIG_FRAME - 100 + (rnd() % 200) as usize,
        };
        stream.extend_from_slice(&frame_for(i, size));
    }
    let mut at = 0;
    while at < stream.len() {
        let n = match rnd() % 4 {
            0 => (rnd() % 2000) as usize + 1,
            1 => (rnd() % 5_000_000) as usize + 1,
            _ => (rnd() % 20_000_000) as usize + 1,
        }
        .min(stream.len() - at);
        client.write_all(&stream[at..at + n]).unwrap();
        at += n;
        if rnd().is_multiple_of(3) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    wait_until(deadline, || next.load(Relaxed) >= N);
    assert_eq!(next.load(Relaxed), N);
    assert_eq!(bad.load(Relaxed), 0);
    for ev in kept.lock().unwrap().iter() {
        assert!(check(ev).is_some(), "a kept event was overwritten");
    }
    end_receiving(&rt, &receiver, run, Some(client));
}

/// A large frame that trickles in over a slow link, far slower than the liveness
/// watch's silence: the reader, waiting with a raised low-water mark for the rest of the
/// frame, still reads what came every `LOW_WATER_PATIENCE`, so the peer is heard and
/// not lost, and the event arrives intact; a small frame right after it is not held
/// back by the mark.
#[test]
fn a_large_frame_trickling_in_keeps_the_peer_heard() {
    let (rt, receiver, mut client) =
        raw_pair_with(100, Liveness::with_silence(Duration::from_millis(300)));
    let got: Arc<Mutex<Vec<(i64, usize)>>> = Arc::default();
    let g2 = got.clone();
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let i: i64 = ev.get(0)?;
        let bin = ev.arg(1).and_then(Value::as_bytes).ok_or("no binary")?;
        assert!(
            bin.iter().all(|&x| i64::from(x) == i % 251),
            "event {i} damaged"
        );
        g2.lock().unwrap().push((i, bin.len()));
        Ok(())
    })
    .serial();
    let run = receive_with(&receiver, &b);

    // 3 MiB in 30 KiB pieces every 10 ms: about a second, while 300 ms of silence
    // would lose the peer (and 1 MiB, the most the mark asks for, takes 350 ms).
    let big = frame_for(1, 3 * 1024 * 1024);
    for piece in big.chunks(30 * 1024) {
        client.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    client.write_all(&frame_for(2, 16)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    wait_until(deadline, || got.lock().unwrap().len() >= 2);
    assert_eq!(*got.lock().unwrap(), vec![(1, 3 * 1024 * 1024), (2, 16)]);
    let links = receiver.links();
    assert_eq!(links.len(), 1);
    assert!(!links[0].is_dead(), "the slow peer was declared lost");
    end_receiving(&rt, &receiver, run, Some(client));
}

/// Large binaries that stages keep past the next frame (a pipeline holding images): the
/// reader stops keeping their frames' buffers for reuse after two such frames, so a
/// stage then holds its binary alone and may write it in place (`try_into_mut`), and
/// what it keeps stays intact while later frames arrive.
#[test]
fn large_binaries_kept_by_a_stage_become_its_own() {
    let (rt, receiver, mut client) = raw_pair(100);
    let seen: Arc<Mutex<Vec<(i64, bool)>>> = Arc::default();
    let s2 = seen.clone();
    let b = Stage::stateful(
        "b",
        |_: &Attrs| -> Result<Option<bytes::Bytes>, BoxError> { Ok(None) },
        move |kept: &mut Option<bytes::Bytes>, mut ev: Event, _: &mut Ctx| {
            let i: i64 = ev.get(0)?;
            let Value::Bytes(bin) = ev.take(1) else {
                return Err("no binary".into());
            };
            let fill = (i % 251) as u8;
            let own = match bin.try_into_mut() {
                Ok(mut m) => {
                    m.fill(fill.wrapping_add(1)); // written in place
                    m.freeze()
                }
                Err(b) => b,
            };
            if let Some(prev) = kept.take() {
                let p = prev[0];
                assert!(prev.iter().all(|&x| x == p), "a kept binary changed");
            }
            s2.lock().unwrap().push((i, own[0] != fill));
            *kept = Some(own);
            Ok(())
        },
    )
    .serial();
    let run = receive_with(&receiver, &b);
    const N: usize = 10;
    for i in 1..=N as u64 {
        client.write_all(&frame_for(i, 2 * 1024 * 1024)).unwrap();
        // One frame at a time: the stage holds the last one when the next arrives.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        wait_until(deadline, || seen.lock().unwrap().len() >= i as usize);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), N);
    // Frames 1 and 2 were kept by the reader (shared); from the third on the
    // stage's binary is its own.
    let own: Vec<i64> = seen
        .iter()
        .filter(|(_, own)| *own)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(own, (3..=N as i64).collect::<Vec<_>>());
    end_receiving(&rt, &receiver, run, Some(client));
}

// ------------------------------------------------- large frames under the low-water mark

/// Like `a_large_frame_trickling_in_keeps_the_peer_heard`, but the destination is
/// full, so the reader has events pending (the RETRY timer re-arms the select every
/// ~1 ms, and with it the 20 ms patience timer, which then never fires).
#[test]
fn trickle_with_pending_events_keeps_the_peer_heard() {
    let (rt, receiver, mut client) =
        raw_pair_with(100, Liveness::with_silence(Duration::from_millis(300)));
    let release = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let (r2, g2) = (release.clone(), got.clone());
    let b = Stage::new("b", move |_ev: Event, _: &mut Ctx| {
        while !r2.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        g2.fetch_add(1, Relaxed);
        Ok(())
    })
    .serial()
    .capacity(1);
    let run = receive_with(&receiver, &b);
    // Several small events: the stage blocks on the first, the rest wait (pending).
    let evs: Vec<Event> = (0..5i64)
        .map(|i| Event::from((i, Value::Bytes(bytes::Bytes::from(vec![0u8; 8])))))
        .collect();
    client
        .write_all(&frame::encode(&Frame::Events(vec![(0, evs)])).unwrap())
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let big = frame_for(1, 3 * 1024 * 1024);
    for piece in big.chunks(30 * 1024) {
        if client.write_all(piece).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let dead = receiver.links()[0].is_dead();
    let why = lock(&receiver.links()[0].lost).clone();
    release.store(true, Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    if !dead {
        wait_until(deadline, || got.load(Relaxed) >= 6);
    }
    end_receiving(&rt, &receiver, run, Some(client));
    assert!(
        !dead,
        "the slow peer was declared lost while the receiver had pending events: {why:?}"
    );
}

/// Big and tiny frames alternating, written in odd-sized pieces with random pauses
/// (some longer than LOW_WATER_PATIENCE, some just around it): all events intact and
/// in order, within a deadline (a hang shows as a timeout).
fn alternate(seed: u64, n: u64, slow_stage: bool) {
    let (rt, receiver, mut client) = raw_pair(100_000);
    let bad = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let (b2, n2) = (bad.clone(), next.clone());
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let want = n2.fetch_add(1, Relaxed);
        let i: u64 = ev.get(0)?;
        let ok = ev
            .arg(1)
            .and_then(Value::as_bytes)
            .is_some_and(|b| b.iter().all(|&x| u64::from(x) == i % 251));
        if i != want || !ok {
            eprintln!("bad event: want {want} got {i} ok {ok}");
            b2.fetch_add(1, Relaxed);
        }
        if slow_stage && i.is_multiple_of(7) {
            std::thread::sleep(Duration::from_millis(30));
        }
        Ok(())
    })
    .serial()
    .capacity(if slow_stage { 2 } else { 10_000 });
    let run = receive_with(&receiver, &b);
    let mut rnd = xorshift(seed | 1);
    let writer = std::thread::spawn(move || {
        for i in 0..n {
            let size = if i % 2 == 0 || i == n - 1 {
                match rnd() % 4 {
                    0 => BIG_FRAME + 1 + (rnd() % 64) as usize,
                    1 => BIG_FRAME + (rnd() % 3_000_000) as usize,
                    2 => 2 * BIG_FRAME - 7,
                    _ => 5 * BIG_FRAME + (rnd() % 1000) as usize,
                }
            } else {
                (rnd() % 64) as usize
            };
            let f = frame_for(i, size);
            let mut at = 0;
            while at < f.len() {
                let k = match rnd() % 6 {
                    0 => 1,
                    1 => (rnd() % 7) as usize + 1,
                    2 => (rnd() % 70_000) as usize + 1,
                    3 => (rnd() % 1_500_000) as usize + 1,
                    _ => (rnd() % 300_000) as usize + 1,
                }
                .min(f.len() - at);
                client.write_all(&f[at..at + k]).unwrap();
                at += k;
                match rnd() % 10 {
                    0 => std::thread::sleep(Duration::from_millis(19 + rnd() % 4)),
                    1 => std::thread::sleep(Duration::from_millis(rnd() % 50)),
                    2 => std::thread::sleep(Duration::from_micros(rnd() % 500)),
                    _ => {}
                }
            }
        }
        client
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    wait_until(deadline, || next.load(Relaxed) >= n);
    let client = writer.join().unwrap();
    let done = next.load(Relaxed);
    let dead = receiver.links()[0].is_dead();
    end_receiving(&rt, &receiver, run, Some(client));
    assert_eq!(done, n, "seed {seed}: stuck (link dead: {dead})");
    assert_eq!(bad.load(Relaxed), 0, "seed {seed}");
    assert!(!dead);
}

#[test]
fn alternating_big_and_tiny_frames() {
    for s in 0..3u64 {
        alternate(0x9e37_79b9_7f4a_7c15 ^ (s * 0x1234_5678_9abc), 40, false);
    }
}

#[test]
fn alternating_with_a_slow_stage() {
    for s in 0..2u64 {
        alternate(0x51ed_2701_aa55_0f0f ^ (s * 0x0009_8765_4321), 30, true);
    }
}

/// A peer that dies inside a large frame (close, or reset): the link is lost within
/// moments, not at the silence bound, and the reader ends.
fn dies_mid_frame(reset: bool, cut: usize) {
    let (rt, receiver, mut client) = raw_pair(100);
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    client.write_all(&frame_for(0, 2 * BIG_FRAME)).unwrap();
    let f = frame_for(1, 4 * BIG_FRAME);
    client.write_all(&f[..cut]).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let t0 = std::time::Instant::now();
    if reset {
        // RST once the last descriptor closes (the reply drainer holds a clone: its
        // read ends on the read shutdown).
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        client.shutdown(std::net::Shutdown::Read).unwrap();
    } else {
        client.shutdown(std::net::Shutdown::Both).unwrap();
    }
    drop(client);
    let link = receiver.links()[0].clone();
    wait_until(t0 + Duration::from_secs(10), || link.is_dead());
    let took = t0.elapsed();
    end_receiving(&rt, &receiver, run, None);
    assert!(link.is_dead(), "reset {reset} cut {cut}: link not lost");
    assert!(
        took < Duration::from_millis(1000),
        "reset {reset} cut {cut}: lost after {took:?}"
    );
}

#[test]
fn peer_dies_mid_frame() {
    for cut in [5, 4096, 700_000, BIG_FRAME + 3, 4 * BIG_FRAME - 1] {
        dies_mid_frame(false, cut);
        dies_mid_frame(true, cut);
    }
}

/// Under TLS too, a stream cut inside a frame without `close_notify` (a peer that died
/// mid-write, or a close forged to truncate it) is a loss, "inside a frame": reading
/// such a close as the end of the stream (`conn::close_is_end`) ends no frame early.
#[test]
fn a_tls_stream_cut_inside_a_frame_is_a_loss() {
    for cut in [5, 4096, 700_000] {
        let (rt, receiver, mut client, sock) = raw_tls_pair(100);
        let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
        let run = receive_with(&receiver, &b);
        let f = frame_for(1, 2 * BIG_FRAME);
        rt.block_on(async {
            use tokio::io::AsyncWriteExt;
            client.write_all(&frame_for(0, 64 * 1024)).await.unwrap();
            client.write_all(&f[..cut]).await.unwrap();
            client.flush().await.unwrap();
        });
        std::thread::sleep(Duration::from_millis(30));
        sock.shutdown(std::net::Shutdown::Both).unwrap();
        let link = receiver.links()[0].clone();
        wait_until(std::time::Instant::now() + Duration::from_secs(10), || {
            link.is_dead()
        });
        let lost = receiver.lost();
        drop(client);
        end_receiving(&rt, &receiver, run, Some(sock));
        assert_eq!(lost.len(), 1, "cut {cut}: {lost:?}");
        assert!(
            lost[0]
                .reason
                .starts_with("it closed the connection inside a frame"),
            "cut {cut}: {}",
            lost[0]
        );
    }
}

/// A peer frozen inside a large frame (as under SIGSTOP: the connection stays open,
/// nothing more comes) while the reader waits with a raised low-water mark: it is
/// declared lost once the liveness watch's silence has passed, not held forever.
#[test]
fn a_peer_frozen_mid_frame_is_lost_after_the_silence() {
    let silence = Duration::from_millis(300);
    let (rt, receiver, mut client) = raw_pair_with(100, Liveness::with_silence(silence));
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    let f = frame_for(1, 4 * BIG_FRAME);
    client.write_all(&f[..BIG_FRAME + 3]).unwrap();
    let t0 = std::time::Instant::now();
    let link = receiver.links()[0].clone();
    wait_until(t0 + Duration::from_secs(10), || link.is_dead());
    let took = t0.elapsed();
    end_receiving(&rt, &receiver, run, Some(client));
    assert!(link.is_dead(), "a frozen peer was never declared lost");
    assert!(
        took >= silence / 2 && took < silence * 5,
        "lost after {took:?} (silence {silence:?})"
    );
}

/// Stage `b`, counting the calls it handled and those run on a reader rather than a pool
/// worker (the returned counters, in that order); event `-1` runs `long(on_reader)`
/// first.
fn counting_stage(
    long: impl Fn(bool) + Send + Sync + 'static,
) -> (Stage, Arc<AtomicU64>, Arc<AtomicU64>) {
    let handled = Arc::new(AtomicU64::new(0));
    let on_reader = Arc::new(AtomicU64::new(0));
    let (h2, r2) = (handled.clone(), on_reader.clone());
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let k: i64 = ev.get(0)?;
        let worker = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("leda-worker"));
        if !worker {
            r2.fetch_add(1, Relaxed);
        }
        if k == -1 {
            long(!worker);
        }
        h2.fetch_add(1, Relaxed);
        Ok(())
    });
    (b, handled, on_reader)
}

/// Computes for `d` (no blocking call: what a `nonblocking` stage may do).
fn compute_for(d: Duration) {
    let t = std::time::Instant::now();
    let mut x = 1u64;
    while t.elapsed() < d {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

/// Sends event `k` on `sink` and waits (5 s at most) until the stage has handled one
/// more event than before.
fn send_one(sink: &Arc<dyn RemoteSink>, k: i64, handled: &AtomicU64) {
    let before = handled.load(Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // (The credit of a handled event comes back in a later reply: on a loaded host,
    // after the next send; a full window then waits for it.)
    let mut ev = Event::from(k);
    while let Err(r) = sink.send(ev) {
        assert!(
            matches!(r.error, SendError::QueueFull { .. }) && std::time::Instant::now() < deadline,
            "{:?}",
            r.error
        );
        ev = r.event;
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_until(deadline, || handled.load(Relaxed) > before);
    std::thread::sleep(Duration::from_micros(300));
}

/// A `nonblocking` stage whose calls are short, then one that computes for 1.5 s
/// (no blocking call, so a legal use): the reader runs that call itself, reading
/// nothing meanwhile, and the live peer (its heartbeats wait in the socket) must not be
/// declared lost for a silence of 0.3 s; the same stage run by the pool, likewise.
fn long_call(nonblocking: bool) {
    long_call_writing(nonblocking, true)
}

/// [`long_call`], the links' workers writing the socket themselves (`direct`) or not
/// (every write by the writer task, as under TLS).
fn long_call_writing(nonblocking: bool, direct: bool) {
    let (rt, sender, receiver) = linked_pair_with(
        vec![route("a", "b")],
        Liveness::with_silence(Duration::from_millis(300)),
    );
    if !direct {
        for l in receiver.links().into_iter().chain(sender.links()) {
            lock(&l.outbox).direct = None;
        }
    }
    let (b, handled, on_reader) = counting_stage(|_| compute_for(Duration::from_millis(1500)));
    let b = if nonblocking { b.nonblocking() } else { b };
    let (srun, rrun) = start_runs(&sender, &receiver, &b);
    let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    // One at a time, until calls were timed (one in 64) and the reader runs them.
    for k in 0..300i64 {
        send_one(&sink, k, &handled);
    }
    assert_eq!(
        on_reader.load(Relaxed) > 0,
        nonblocking,
        "where the calls ran"
    );
    sink.send(Event::from(-1i64)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    wait_until(deadline, || handled.load(Relaxed) >= 301);
    assert_eq!(handled.load(Relaxed), 301);
    // Past the silence bound again after the long call: still heard.
    std::thread::sleep(Duration::from_millis(500));
    let links: Vec<_> = receiver.links().into_iter().chain(sender.links()).collect();
    let lost: Vec<_> = links.iter().map(|l| lock(&l.lost).clone()).collect();
    shut_down(&rt, &sender, &receiver, srun, rrun);
    assert_eq!(lost, vec![None, None], "a live peer was declared lost");
}

/// Starts the runs behind `sender` and `receiver` with a `nonblocking` `counting_stage`
/// whose event -1 runs `long` when the receiver's reader runs it; sends events one at a
/// time until the reader runs the calls itself, then event -1 until `long` has begun on
/// the reader (one the runtime gave to the pool instead, after a call it timed long,
/// returns at once); returns the runs, the stage's count of handled events, and the
/// events sent before -1.
fn long_call_begun(
    sender: &Transport,
    receiver: &Transport,
    long: impl Fn() + Send + Sync + 'static,
) -> (Running, Running, Arc<AtomicU64>, i64) {
    let long_started = Arc::new(AtomicBool::new(false));
    let started = long_started.clone();
    let (b, handled, on_reader) = counting_stage(move |on_reader| {
        if on_reader {
            started.store(true, SeqCst);
            long();
        }
    });
    let (srun, rrun) = start_runs(sender, receiver, &b.nonblocking());
    let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut k = 0i64;
    while on_reader.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
        send_one(&sink, k, &handled);
        k += 1;
    }
    assert!(on_reader.load(Relaxed) > 0, "the reader never ran a call");
    while !long_started.load(SeqCst) && std::time::Instant::now() < deadline {
        let _ = sink.send(Event::from(-1i64));
        wait_until(
            std::time::Instant::now() + Duration::from_millis(200),
            || long_started.load(SeqCst),
        );
    }
    assert!(
        long_started.load(SeqCst),
        "the long call did not start on the reader"
    );
    (srun, rrun, handled, k)
}

/// A link that goes down while its reader runs a handler itself (a `nonblocking` stage's
/// long call) tells the peer at once, under TLS as over plain TCP: the peer reads the
/// close ("it closed the connection"), instead of waiting out its silence bound ("nothing
/// heard from it": under TLS the reader's half kept the stream open until the call
/// ended, a review finding).
#[test]
fn a_link_lost_during_a_long_call_on_its_reader_tells_the_peer_at_once() {
    for tls in [false, true] {
        let pair = if tls {
            linked_tls_pair_with
        } else {
            linked_pair_with
        };
        let (rt, sender, receiver) = pair(
            vec![route("a", "b")],
            Liveness::with_silence(Duration::from_secs(1)),
        );
        let (srun, rrun, handled, k) =
            long_call_begun(&sender, &receiver, || compute_for(Duration::from_secs(2)));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let slink = sender.links()[0].clone();
        receiver.links()[0].lose("lost here (the test)".into());
        wait_until(deadline, || slink.is_dead());
        let why = lock(&slink.lost).clone();
        wait_until(deadline, || handled.load(Relaxed) > k as u64);
        shut_down(&rt, &sender, &receiver, srun, rrun);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.starts_with("it closed the connection")),
            "TLS: {tls}: {why:?}"
        );
    }
}

#[test]
fn a_long_call_on_the_reader_does_not_lose_a_live_peer() {
    long_call(true);
}

/// The same when the writer task writes everything (as under TLS): the replies the
/// reader queued before the long call wake the writer, which must not wait behind it.
#[test]
fn a_long_call_on_the_reader_does_not_hold_back_the_writer() {
    long_call_writing(true, false);
}

#[test]
fn a_long_call_on_the_pool_does_not_lose_a_live_peer() {
    long_call(false);
}

/// A link lost while the run is still going, whose writer has not yet recorded the
/// loss when this process begins closing (a sender saw the link down, failed its send
/// and ended the run itself: the chaos test's generator did), is still a loss: the
/// close records it, and the run reports it, instead of taking it for the orderly end.
#[test]
fn a_loss_seen_first_by_a_sender_that_ends_the_run_is_still_recorded() {
    let (rt, receiver, client) = raw_pair(100);
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    let link = receiver.links()[0].clone();
    // Hold the runtime's only worker, so that the writer cannot act on the loss
    // before the close begins.
    let (held, hold) = std::sync::mpsc::channel();
    rt.spawn(async move {
        held.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    });
    hold.recv().unwrap();
    link.lose("test: the peer went silent".into());
    assert!(link.is_dead());
    run.handle().quit(());
    run.wait().unwrap();
    rt.block_on(receiver.close(None));
    drop(client);
    let lost = receiver.lost();
    assert_eq!(lost.len(), 1, "the loss was taken for the orderly end");
    assert!(lost[0].reason.contains("went silent"), "{lost:?}");
}

/// An event that cannot be encoded for the link (nested too deeply; too large for a
/// frame likewise) fails with `Unsendable`, not `Unreachable`: the peer is fine, and a
/// sender that takes `Unreachable` for a lost process (the distributed sort did) must
/// not give up on it. The link goes on carrying the next event.
#[test]
fn an_event_that_cannot_be_encoded_is_unsendable_not_unreachable() {
    let (rt, sender, receiver) = linked_pair(vec![route("a", "b")]);
    let got = Arc::new(AtomicU64::new(0));
    let g2 = got.clone();
    let b = Stage::new("b", move |_: Event, _: &mut Ctx| {
        g2.fetch_add(1, Relaxed);
        Ok(())
    });
    let (srun, rrun) = start_runs(&sender, &receiver, &b);
    let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let mut deep = Value::Nil;
    for _ in 0..(crate::frame::MAX_DEPTH + 2) {
        deep = Value::Array(vec![deep]);
    }
    let r = sink
        .send(Event::from(vec![deep]))
        .expect_err("too deep to encode");
    assert!(
        matches!(&r.error, SendError::Unsendable { stage, .. } if stage == "b"),
        "{:?}",
        r.error
    );
    sink.send(Event::from(1i64)).unwrap();
    sink.flush();
    wait_until(std::time::Instant::now() + Duration::from_secs(10), || {
        got.load(Relaxed) == 1
    });
    assert_eq!(got.load(Relaxed), 1);
    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// Events of a megabyte or so fill a receiver by bytes long before its queue is full
/// by count: past the transport's byte bound what arrives waits unacknowledged (and
/// the sender's credit stops it), so the receiving stage holds at most the bound; all
/// arrive once it drains. Before, the queue took every event the sender's windows let
/// through (a review filled a daemon with 6 GB of 1 MiB events in 14 s).
#[test]
fn a_receiver_queues_events_within_its_byte_bound() {
    const N: usize = 200;
    const SIZE: usize = 64 * 1024;
    let mut r = route("a", "b");
    r.window = 1000;
    let (rt, sender, receiver) = linked_pair(vec![r]);
    receiver.max_queued_bytes.store(1 << 20, Relaxed);
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let (o2, g2) = (open.clone(), got.clone());
    let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
        let body: bytes::Bytes = ev.get(0)?;
        assert_eq!(body.len(), SIZE);
        while !o2.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        g2.fetch_add(1, Relaxed);
        Ok(())
    })
    .serial();
    let (srun, rrun) = start_runs(&sender, &receiver, &b);
    let sink = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
    let payload = bytes::Bytes::from(vec![5u8; SIZE]);
    let sending = {
        let (sink, payload) = (sink.clone(), payload.clone());
        std::thread::spawn(move || {
            for _ in 0..N {
                let mut ev = Event::from(payload.clone());
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while let Err(r) = sink.send(ev) {
                    assert!(
                        matches!(r.error, SendError::QueueFull { .. }),
                        "{:?}",
                        r.error
                    );
                    assert!(std::time::Instant::now() < deadline, "no room for 30 s");
                    ev = r.event;
                    std::thread::sleep(Duration::from_millis(1));
                }
                sink.flush();
            }
        })
    };
    // While the stage is held, what it queues stays within the bound (16 events of
    // 64 KiB, give or take the frame's overhead in the estimate).
    let h = rrun.handle();
    let mut most = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(10));
        most = most.max(h.queue_load(0));
    }
    assert!(
        most <= 17,
        "the receiving stage queued {most} events of 64 KiB"
    );
    open.store(true, Relaxed);
    sending.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    wait_until(deadline, || got.load(Relaxed) == N as u64);
    assert_eq!(got.load(Relaxed), N as u64, "every event arrives");
    shut_down(&rt, &sender, &receiver, srun, rrun);
}

/// A process that wakes from a stall (SIGSTOP) to find its peer gone says that it stood
/// still, also when its link goes down while the liveness watch is midway through its
/// first round after the stall (review finding: a daemon thawed after SIGSTOP said "it
/// closed the connection (last heard from 0.0 s before)": the watch had noted its round
/// but not yet the stall, and the link found neither).
#[test]
fn a_link_lost_as_the_watch_wakes_from_a_stall_says_this_process_stood_still() {
    let (rt, receiver, client) =
        raw_pair_with(100, Liveness::with_silence(Duration::from_millis(300)));
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    // The watch's round after the stall stops midway until the link is down.
    let (mid_tx, mid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    *lock(&receiver.mid_round) = Some(Box::new(move |late| {
        if late >= Duration::from_millis(200) {
            let _ = mid_tx.send(());
            let _ = lock(&go_rx).recv();
        }
    }));
    // The stall: the watch held up for 400 ms (in its look at the links).
    {
        let _links = lock(&receiver.links);
        std::thread::sleep(Duration::from_millis(400));
    }
    mid_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the watch's round after the stall");
    // The peer took this process for lost and closed.
    client.shutdown(std::net::Shutdown::Both).unwrap();
    let t0 = std::time::Instant::now();
    wait_until(t0 + Duration::from_secs(5), || !receiver.lost().is_empty());
    let lost = receiver.lost();
    go_tx.send(()).unwrap();
    end_receiving(&rt, &receiver, run, Some(client));
    assert_eq!(lost.len(), 1, "the close was not taken for a loss");
    assert!(
        lost[0]
            .reason
            .starts_with("it closed the connection, after this process stood still"),
        "{}",
        lost[0]
    );
}

/// What this process reports when its peer, before this process began closing, sent a
/// `Quit` (or not) and then closed the connection (`reset`: with a reset), all of it
/// read only after the close began (a process thawed after SIGSTOP that reads another
/// peer's `Quit` first and begins closing); over plain TCP or, with `tls`, under TLS.
fn closed_before_the_close_began(quit: bool, reset: bool, tls: bool) -> Vec<ProcessLost> {
    let (rt, receiver, mut tls_client, mut client) = if tls {
        let (rt, receiver, conn, sock) = raw_tls_pair(100);
        (rt, receiver, Some(conn), sock)
    } else {
        let (rt, receiver, client) = raw_pair(100);
        (rt, receiver, None, client)
    };
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    let link = receiver.links()[0].clone();
    // Hold the runtime's only worker until the close has begun, so that the reader
    // cannot read the peer's close before (as a process that stood still could not).
    let (held, hold) = std::sync::mpsc::channel();
    let r = receiver.clone();
    rt.spawn(async move {
        held.send(()).unwrap();
        let t0 = std::time::Instant::now();
        wait_until(t0 + Duration::from_secs(10), || r.closing.load(SeqCst));
    });
    hold.recv().unwrap();
    if quit {
        let f = frame::encode(&Frame::Quit(vec![])).unwrap();
        match &mut tls_client {
            // (Written at once: no need for the held worker's reactor.)
            Some(c) => rt.block_on(async {
                use tokio::io::AsyncWriteExt;
                c.write_all(&f).await.unwrap();
                c.flush().await.unwrap();
            }),
            None => client.write_all(&f).unwrap(),
        }
    }
    if reset {
        // (The replies' reader ends first: its descriptor would keep the socket open.)
        client.shutdown(std::net::Shutdown::Read).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(tls_client);
        drop(client);
    } else {
        // (Under TLS without `close_notify`: what a process that dies leaves.)
        client.shutdown(std::net::Shutdown::Both).unwrap();
    }
    let t0 = std::time::Instant::now();
    wait_until(t0 + Duration::from_secs(5), || link.peer_shut());
    assert!(link.peer_shut(), "the peer's close did not arrive");
    assert!(
        !link.is_dead() && !link.goodbye.load(SeqCst),
        "the reader read the peer's end before the close began"
    );
    run.handle().quit(());
    run.wait().unwrap();
    rt.block_on(receiver.close(Some(vec![])));
    receiver.lost()
}

/// A close the peer made before this process began closing, without a `Quit`, is a
/// loss, also when read only after the close began (a daemon thawed after SIGSTOP read
/// another daemon's `Quit` first, began closing, then read the close of the launcher,
/// which had taken it for lost, and reported a clean end); under TLS too (the close
/// looks at the TCP socket under the TLS stream).
#[test]
fn a_close_read_only_after_this_process_began_closing_is_still_a_loss() {
    for tls in [false, true] {
        let lost = closed_before_the_close_began(false, false, tls);
        assert_eq!(
            lost.len(),
            1,
            "the close was taken for part of the orderly end (TLS: {tls})"
        );
        assert!(
            lost[0].reason.starts_with("it closed the connection"),
            "TLS: {tls}: {}",
            lost[0]
        );
    }
}

/// After a `Quit`, the peer's close is its orderly end, read late or not, and also when
/// it reset the connection (this process' `Quit` then fails to be written: the reader
/// still reads the peer's first).
#[test]
fn a_close_after_a_quit_read_late_is_the_orderly_end() {
    for tls in [false, true] {
        assert_eq!(
            closed_before_the_close_began(true, false, tls),
            vec![],
            "after a FIN (TLS: {tls})"
        );
        assert_eq!(
            closed_before_the_close_began(true, true, tls),
            vec![],
            "after a reset (TLS: {tls})"
        );
    }
}

/// The counterpart: a peer that closes in answer to this process' `Quit` ends the link
/// in order, also when this process stood still for the silence bound just before (an
/// earlier fix took such an answer for a loss: after a whole-host pause, a launcher
/// ending its run normally would have named every daemon lost).
#[test]
fn a_close_in_answer_to_this_process_quit_is_no_loss_even_after_a_stall() {
    let (rt, receiver, client) =
        raw_pair_with(100, Liveness::with_silence(Duration::from_millis(300)));
    let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(())).serial();
    let run = receive_with(&receiver, &b);
    // The peer answers the end of the connection by closing its side.
    let mut r = client.try_clone().unwrap();
    let answer = std::thread::spawn(move || {
        let mut b = vec![0u8; 1 << 16];
        while matches!(r.read(&mut b), Ok(n) if n > 0) {}
        r.shutdown(std::net::Shutdown::Both).unwrap();
    });
    // The stall: the watch held up for 400 ms (in its look at the links).
    {
        let _links = lock(&receiver.links);
        std::thread::sleep(Duration::from_millis(400));
    }
    let t0 = std::time::Instant::now();
    wait_until(t0 + Duration::from_secs(5), || {
        lock(&receiver.stood_still).1 >= 300
    });
    assert!(lock(&receiver.stood_still).1 >= 300, "no stall seen");
    run.handle().quit(());
    run.wait().unwrap();
    rt.block_on(receiver.close(Some(vec![])));
    answer.join().unwrap();
    drop(client);
    assert_eq!(
        receiver.lost(),
        vec![],
        "the peer's answer was taken for a loss"
    );
}

/// A peer that said `Quit` and closed before this process began closing, while this
/// process' reader runs a handler past the close's grace (so it never reads to the
/// `Quit`): whether a `Quit` came first is not known, and the close is the orderly end,
/// as before `shut_before_close` (which would have counted it a loss: a normal end of
/// the run reported as a lost process).
#[test]
fn a_peer_quit_unread_behind_a_long_call_is_not_a_loss() {
    let (rt, sender, receiver) = linked_pair_with(
        vec![route("a", "b")],
        Liveness::with_silence(Duration::from_secs(60)),
    );
    let (srun, rrun, _, _) = long_call_begun(&sender, &receiver, || {
        std::thread::sleep(CLOSE_GRACE + Duration::from_secs(1))
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // The sender's run ends: its `Quit` and its close reach the receiver, whose reader
    // is busy.
    srun.handle().quit(());
    srun.wait().unwrap();
    let (s2, h) = (sender.clone(), rt.handle().clone());
    let closing = std::thread::spawn(move || h.block_on(s2.close(Some(vec![]))));
    let link = receiver.links()[0].clone();
    wait_until(deadline, || link.peer_shut());
    assert!(link.peer_shut(), "the sender's close did not arrive");
    assert!(
        !link.goodbye.load(SeqCst),
        "the reader read the peer's Quit"
    );
    rt.block_on(receiver.close(Some(vec![])));
    closing.join().unwrap();
    rrun.handle().quit(());
    rrun.wait().unwrap();
    assert_eq!(
        receiver.lost(),
        vec![],
        "the peer's orderly end was taken for a loss"
    );
}
