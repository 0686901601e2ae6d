//! Micro-benchmarks of the per-request work outside the network: the thesis' Listing
//! B.1 page through the CGI stage's Lua state, and request-head parsing (the fuzz
//! target's body). Run: `cargo bench -p leda-http --bench page`.

use std::time::{Duration, Instant};

use leda_http::Config;
use leda_http::request::{self, Parsed};
use leda_http::stage::cgi::{Cgi, PageRequest};

fn per_op(mut f: impl FnMut(), min: Duration) -> (f64, u64) {
    f();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < min {
        f();
        n += 1;
    }
    (start.elapsed().as_secs_f64() * 1e6 / n as f64, n)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("leda-http-bench-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let page = dir.join("loop.lua");
    std::fs::write(&page, include_str!("../site/loop.lua")).expect("write page");
    let cfg = Config {
        root: dir.clone(),
        ..Config::default()
    };
    let page = std::fs::canonicalize(&page).expect("canonical page");
    let mut cgi = Cgi::new(cfg.clone()).expect("Lua state");
    let req = PageRequest::default();
    let mut len = 0;
    let (us, n) = per_op(
        || len = cgi.run(&page, &req).expect("page runs").body.len(),
        Duration::from_secs(3),
    );
    println!("B.1 page (Lua 5.4, {len} bytes): {us:.1} us/page over {n} runs");
    // The same chunk in a plain Lua state (no sandbox, hook or memory limit).
    let lua = mlua::Lua::new();
    let f = lua
        .load(include_str!("../site/loop.lua"))
        .into_function()
        .expect("compiles");
    let (us, n) = per_op(
        || {
            let _: mlua::String = f.call(()).expect("runs");
        },
        Duration::from_secs(3),
    );
    println!("B.1 page, plain Lua state: {us:.1} us/page over {n} runs");
    let head = b"GET /static/300k.bin?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
    let (us, n) = per_op(
        || {
            assert!(matches!(
                request::parse(head, &cfg),
                Ok(Parsed::Complete(_))
            ))
        },
        Duration::from_secs(1),
    );
    println!(
        "request head parse: {:.0} ns/request over {n} runs",
        us * 1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
