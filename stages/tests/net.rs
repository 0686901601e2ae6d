//! `net.tcp.*` (accept/read/write on async sockets), `net.http` and `net.http.serve`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use leda_core::prelude::*;
use leda_stages::net;

/// A stage that reports the first argument of its events on a channel.
fn report(name: &str, tx: mpsc::Sender<String>) -> Stage {
    let tx = std::sync::Mutex::new(tx);
    Stage::new(name, move |ev: Event, _: &mut Ctx| {
        let _ = tx
            .lock()
            .unwrap()
            .send(ev.arg(0).map(|v| v.to_string()).unwrap_or_default());
        Ok(())
    })
}

#[test]
fn tcp_echo_with_keep_alive_loop() {
    let accept = net::accept().attr("count", 1);
    let read = net::read();
    let write = net::write();
    // Upper-cases a line and passes the connection on.
    let upper = Stage::new("upper", |mut ev: Event, ctx: &mut Ctx| {
        let conn = ev
            .take_attachment::<net::Connection>()
            .ok_or("no connection")?;
        let line: String = ev.get(0)?;
        ctx.send(
            1,
            Event::new()
                .with(format!("{}\n", line.to_uppercase()))
                .attach(conn),
        )?;
        Ok(())
    });
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx.clone());
    let closed = report("closed", tx);
    let mut g = Graph::new("echo");
    g.connect(&accept, "client", &read).local();
    g.connect(&accept, "listening", &listening);
    g.connect(&read, 1, &upper).local();
    g.connect(&upper, 1, &write).local();
    g.connect(&write, 1, &read).local();
    g.connect(&read, "closed", &closed);
    accept.push(("127.0.0.1", 0));
    let runner = std::thread::spawn(move || {
        g.run(
            Run::default()
                .threads(1)
                .until_idle()
                .timeout(Duration::from_secs(10)),
        )
    });
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("listening");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    for word in ["hello", "second line"] {
        writeln!(s, "{word}").unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{}\n", word.to_uppercase()));
    }
    drop(r);
    drop(s);
    let peer = rx.recv_timeout(Duration::from_secs(5)).expect("closed");
    assert!(peer.starts_with("127.0.0.1:"), "{peer}");
    let report = runner.join().unwrap().unwrap();
    assert_eq!(report.reason, EndReason::Idle);
}

#[test]
fn tcp_attachment_on_a_decoupled_connector_is_refused() {
    let accept = net::accept().attr("count", 1);
    let read = net::read();
    let (errs, egot) = sink("errs");
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx);
    let mut g = Graph::new("bad");
    g.connect(&accept, "client", &read); // decoupled: a socket cannot cross it
    g.connect(&accept, "listening", &listening);
    g.connect(&accept, "error", &errs);
    accept.push(0);
    let runner = std::thread::spawn(move || {
        g.run(
            Run::default()
                .threads(1)
                .until_idle()
                .timeout(Duration::from_secs(10)),
        )
    });
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("listening");
    let _c = std::net::TcpStream::connect(&addr).unwrap();
    runner.join().unwrap().unwrap();
    let e = take(&egot);
    assert_eq!(e.len(), 1);
    assert!(
        e[0][1].as_str().unwrap().contains("decoupled"),
        "{:?}",
        e[0]
    );
}

#[test]
fn tcp_stages_refuse_events_without_a_connection() {
    for st in [net::read(), net::write()] {
        let (errs, egot) = sink("errs");
        let mut g = Graph::new("x");
        g.connect(&st, "error", &errs);
        st.push("data");
        run(&g);
        let e = take(&egot);
        assert!(e[0][1].as_str().unwrap().contains("no TCP connection"));
    }
    let accept = net::accept();
    let (errs, egot) = sink("errs");
    let (c, _) = sink("c");
    let mut g = Graph::new("x");
    g.connect(&accept, "client", &c).local();
    g.connect(&accept, "error", &errs);
    accept.push(Value::Array(vec![]));
    run(&g);
    assert_eq!(take(&egot).len(), 1);
    let mut g = Graph::new("x");
    let accept = net::accept();
    g.add(&accept);
    assert!(refused(&g).contains("'client' port must be connected"));
}

#[test]
fn http_get_against_the_page_server() {
    let serve = net::serve()
        .attr("pages", Value::Array(vec![s("page-a"), s("page-b")]))
        .attr("count", 3);
    // On the server's URL, ask for it three times (with an extra argument).
    let fan = Stage::new("fan", |ev: Event, ctx: &mut Ctx| {
        let url: String = ev.get(0)?;
        for i in 0..3 {
            ctx.send(1, (url.clone(), i))?;
        }
        Ok(())
    });
    let http = net::http_stage();
    let (out, got) = sink("out");
    let mut g = Graph::new("http");
    g.connect(&serve, "listening", &fan);
    g.connect(&fan, 1, &http);
    g.connect(&http, 1, &out);
    serve.push(("127.0.0.1", 0));
    run(&g);
    let got = take(&got);
    assert_eq!(got.len(), 3);
    let mut bodies: Vec<String> = got
        .iter()
        .map(|e| e[0].as_str().unwrap().to_owned())
        .collect();
    bodies.sort();
    assert_eq!(bodies, vec!["page-a", "page-a", "page-b"]);
    let mut extras: Vec<i64> = got.iter().map(|e| e[1].as_int().unwrap()).collect();
    extras.sort();
    assert_eq!(extras, vec![0, 1, 2]);
}

#[test]
fn http_errors_go_to_http_error() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    let http = net::http_stage().attr("timeout", 2);
    let (out, got) = sink("out");
    let (he, hgot) = sink("he");
    let mut g = Graph::new("http");
    g.connect(&http, 1, &out);
    g.connect(&http, "http_error", &he);
    http.push(dead.as_str());
    http.push("https://example.org/");
    http.push("not a url");
    run(&g);
    assert!(take(&got).is_empty());
    let errs = take(&hgot);
    assert_eq!(errs.len(), 3);
    assert!(
        errs.iter()
            .any(|e| e[1].as_str().unwrap().contains("bad URL 'https://"))
    );

    // Without http_error, failures are handler errors.
    let http = net::http_stage();
    let (errs, egot) = sink("errs");
    let mut g = Graph::new("http");
    g.connect(&http, 1, &out);
    g.connect(&http, "error", &errs);
    http.push("nope");
    run(&g);
    assert_eq!(take(&egot).len(), 1);
}

#[test]
fn serve_checks_its_pages() {
    for st in [
        net::serve(),
        net::serve().attr("pages", Value::Array(vec![])),
        net::serve()
            .attr("body", "x")
            .attr("pages", Value::Array(vec![s("y")])),
    ] {
        let mut g = Graph::new("s");
        g.add(&st);
        assert!(refused(&g).contains("non-empty array"));
    }
}

#[test]
fn tcp_read_in_chunk_mode_emits_bytes() {
    let accept = net::accept().attr("count", 1);
    let read = net::read().attr("mode", "chunk").attr("size", 16);
    let (out, got) = sink("out");
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx);
    let mut g = Graph::new("chunks");
    g.connect(&accept, "client", &read).local();
    g.connect(&accept, "listening", &listening);
    g.connect(&read, 1, &out).local();
    accept.push(0);
    let runner = std::thread::spawn(move || {
        g.run(
            Run::default()
                .threads(1)
                .until_idle()
                .timeout(Duration::from_secs(10)),
        )
    });
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("listening");
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"abc").unwrap();
    drop(c);
    runner.join().unwrap().unwrap();
    let got = take(&got);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0][0].as_bytes().unwrap(), b"abc");
}

/// A review (2026-11-27): `mode` (and `size`, `max_line`, `idle_timeout`) are checked in bind, before
/// any connection (a bad mode used to fail each connection at run time; a huge chunk
/// `size` allocated that much per read).
#[test]
fn tcp_read_checks_its_attributes_in_bind() {
    for (read, needle) in [
        (net::read().attr("mode", "words"), "\"line\" or \"chunk\""),
        (
            net::read().attr("mode", "chunk").attr("size", 1e15),
            "'size' must be at most",
        ),
        (
            net::read().attr("max_line", 0),
            "'max_line' must be a positive integer",
        ),
        (
            net::read().attr("idle_timeout", -1),
            "'idle_timeout' must be a positive number",
        ),
        (
            net::read().attr("idle_timeout", 1e20),
            "'idle_timeout' must be a positive number",
        ),
    ] {
        let (out, _) = sink("out");
        let mut g = Graph::new("x");
        g.connect(&read, 1, &out).local();
        let msg = refused(&g);
        assert!(msg.contains(needle), "{msg}");
    }
}

/// Runs `g` (an `accept` pushed with port 0 whose `listening` reports on `rx`) on a
/// thread; returns the address and the run's thread.
fn start(
    g: Graph,
    rx: &mpsc::Receiver<String>,
) -> (String, std::thread::JoinHandle<Result<RunReport, RunError>>) {
    let runner = std::thread::spawn(move || {
        g.run(
            Run::default()
                .threads(1)
                .until_idle()
                .timeout(Duration::from_secs(20)),
        )
    });
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("listening");
    (addr, runner)
}

/// A review (2026-11-27): an idle connection parked a `read` instance for ever (256 of them starved
/// every later client); it is closed after `idle_timeout` and reported on `closed`.
#[test]
fn tcp_read_closes_an_idle_connection() {
    let accept = net::accept().attr("count", 1);
    let read = net::read().attr("idle_timeout", 0.2);
    let (out, got) = sink("out");
    let (closed, cgot) = sink("closed");
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx);
    let mut g = Graph::new("idle");
    g.connect(&accept, "client", &read).local();
    g.connect(&accept, "listening", &listening);
    g.connect(&read, 1, &out).local();
    g.connect(&read, "closed", &closed);
    accept.push(0);
    let (addr, runner) = start(g, &rx);
    let client = std::net::TcpStream::connect(&addr).unwrap();
    let report = runner.join().unwrap().unwrap();
    drop(client);
    assert_eq!(report.reason, EndReason::Idle);
    assert!(take(&got).is_empty());
    let c = take(&cgot);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0][1], s("idle timeout"));
}

/// A review (2026-11-27): a line was buffered whole (300 MiB of no newline: 1.2 GB); a line longer than
/// `max_line` is now an error of its connection, and one of exactly `max_line` bytes
/// (with `\r\n`) is kept.
#[test]
fn tcp_read_refuses_a_line_longer_than_max_line() {
    let accept = net::accept().attr("count", 1);
    let read = net::read().attr("max_line", 8);
    let (lines, got) = sink("lines");
    // Records the line and reads the next one on the same connection.
    let again = Stage::new("again", |mut ev: Event, ctx: &mut Ctx| {
        let conn = ev
            .take_attachment::<net::Connection>()
            .ok_or("no connection")?;
        ctx.send("line", ev.take(0))?;
        ctx.send(1, Event::new().attach(conn))?;
        Ok(())
    });
    let (errs, egot) = sink("errs");
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx);
    let mut g = Graph::new("long");
    g.connect(&accept, "client", &read).local();
    g.connect(&accept, "listening", &listening);
    g.connect(&read, 1, &again).local();
    g.connect(&again, 1, &read).local();
    g.connect(&again, "line", &lines);
    g.connect(&read, "error", &errs);
    accept.push(0);
    let (addr, runner) = start(g, &rx);
    let mut client = std::net::TcpStream::connect(&addr).unwrap();
    client.write_all(b"12345678\r\n").unwrap();
    // The server may close before it has all of it.
    let _ = client.write_all(&[b'x'; 64 * 1024]);
    let report = runner.join().unwrap().unwrap();
    drop(client);
    assert_eq!(report.reason, EndReason::Idle);
    assert_eq!(take(&got), vec![vec![s("12345678")]]);
    let e = take(&egot);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0][1]
            .as_str()
            .unwrap()
            .contains("a line longer than 8 bytes"),
        "{e:?}"
    );
}

/// A review (2026-11-27): `net.http.serve` answered one request at a time and waited for ever on a
/// client that sent nothing; it drops such a client after `request_timeout`.
#[test]
fn serve_drops_a_client_that_sends_no_request() {
    let serve = net::serve()
        .attr("body", "the page")
        .attr("count", 1)
        .attr("request_timeout", 0.2);
    let (tx, rx) = mpsc::channel();
    let listening = report("listening", tx);
    let mut g = Graph::new("serve");
    g.connect(&serve, "listening", &listening);
    serve.push(("127.0.0.1", 0));
    let (url, runner) = start(g, &rx);
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let idle = std::net::TcpStream::connect(addr).unwrap();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut c, &mut answer);
    drop(idle);
    runner.join().unwrap().unwrap();
    assert!(answer.ends_with("the page"), "{answer:?}");
    let mut g = Graph::new("s");
    let bad = net::serve().attr("body", "x").attr("request_timeout", 0);
    g.add(&bad);
    assert!(refused(&g).contains("'request_timeout'"));
}

/// A review (2026-11-27): `timeout` and `max_size` are checked in bind; a finite but huge timeout
/// (1e20 s) panicked in `Duration::from_secs_f64` at run time.
#[test]
fn http_checks_its_attributes_in_bind() {
    for (http, needle) in [
        (
            net::http_stage().attr("timeout", 1e20),
            "'timeout' must be a positive number",
        ),
        (
            net::http_stage().attr("timeout", -1),
            "'timeout' must be a positive number",
        ),
        (
            net::http_stage().attr("max_size", 0),
            "'max_size' must be a positive integer",
        ),
    ] {
        let (out, _) = sink("out");
        let mut g = Graph::new("h");
        g.connect(&http, 1, &out);
        let msg = refused(&g);
        assert!(msg.contains(needle), "{msg}");
    }
}
