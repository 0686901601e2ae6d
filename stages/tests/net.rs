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

#[test]
fn tcp_read_rejects_an_unknown_mode() {
    let read = net::read().attr("mode", "words");
    let (errs, egot) = sink("errs");
    let mut g = Graph::new("x");
    g.connect(&read, "error", &errs);
    // The mode is checked after the connection: attach a real one.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let _client = std::net::TcpStream::connect(addr).unwrap();
    let (server, _) = l.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(async { net::Connection::new(tokio::net::TcpStream::from_std(server).unwrap()) });
    read.push(Event::new().attach(conn));
    run(&g);
    let e = take(&egot);
    assert_eq!(e.len(), 1);
    assert!(
        e[0][1].as_str().unwrap().contains("\"line\" or \"chunk\""),
        "{:?}",
        e[0]
    );
}
