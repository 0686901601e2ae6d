//! Micro-benchmarks of the per-request work outside the network: the thesis' Listing
//! B.1 page through the CGI stage's Lua state, the same chunk in a plain Lua state
//! (with Lua's default collector pause and with the stage's), and request-head parsing
//! (the fuzz target's body).
//!
//! Run: `cargo bench -p leda-http --bench page` (Lua 5.4), and for LuaJIT
//! `CFLAGS=-DLUAJIT_ENABLE_CHECKHOOK cargo bench -p leda-http --no-default-features
//! --features luajit --bench page`. Times are CPU time of the benchmark thread per
//! operation (steadier than wall time on a shared machine), median of 5 rounds.

use std::time::{Duration, Instant};

use leda_http::Config;
use leda_http::request::{self, Parsed};
use leda_http::stage::cgi::{Cgi, PageRequest};

const FLAVOUR: &str = if cfg!(feature = "luajit") {
    "LuaJIT"
} else {
    "Lua 5.4"
};

fn thread_cpu_us() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
}

/// Median over 5 rounds of `round` each of the CPU microseconds per call of `f`.
fn per_op(mut f: impl FnMut(), round: Duration) -> (f64, u64) {
    f();
    let mut rounds = Vec::new();
    let mut total = 0;
    for _ in 0..5 {
        let (start, cpu) = (Instant::now(), thread_cpu_us());
        let mut n = 0u64;
        while start.elapsed() < round {
            f();
            n += 1;
        }
        rounds.push((thread_cpu_us() - cpu) / n as f64);
        total += n;
    }
    rounds.sort_by(f64::total_cmp);
    (rounds[2], total)
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
        Duration::from_secs(1),
    );
    println!("B.1 page, CGI state ({FLAVOUR}, {len} bytes): {us:.0} us/page over {n} runs");
    // The same chunk in a plain Lua state (no sandbox, timeout or memory limit).
    for pause in [200, 400] {
        let lua = mlua::Lua::new();
        lua.gc_set_pause(pause);
        let f = lua
            .load(include_str!("../site/loop.lua"))
            .into_function()
            .expect("compiles");
        let (us, n) = per_op(
            || {
                let _: mlua::String = f.call(()).expect("runs");
            },
            Duration::from_secs(1),
        );
        println!(
            "B.1 page, plain {FLAVOUR} state, GC pause {pause}: {us:.0} us/page over {n} runs"
        );
    }
    let head = b"GET /static/300k.bin?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
    let (us, n) = per_op(
        || {
            assert!(matches!(
                request::parse(head, &cfg),
                Ok(Parsed::Complete(_))
            ))
        },
        Duration::from_millis(200),
    );
    println!(
        "request head parse: {:.0} ns/request over {n} runs",
        us * 1000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
