//! `leda-httpd`: the staged HTTP server.
//!
//! Without `--root` it serves a small embedded site and prints the URL to open.
//! SIGTERM or SIGINT stops it gracefully (`--drain-timeout`); a second one at once.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use leda_http::Config;

/// The staged HTTP server of Leda-RS (thesis Fig. 5.6).
#[derive(Parser, Debug)]
#[command(name = "leda-httpd", version)]
struct Args {
    /// Document root; without it, an embedded demo site is served.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Worker threads, at least 1 (default: one per CPU).
    #[arg(long, value_parser = leda_core::cli::thread_count)]
    threads: Option<usize>,
    /// Total bytes of file data the cache may hold (file data read for it and still
    /// being sent: at most twice this).
    #[arg(long, default_value_t = Config::default().cache_bytes)]
    cache_bytes: usize,
    /// Largest file the cache keeps in memory; larger files are kept open and sent
    /// with sendfile(2).
    #[arg(long, default_value_t = Config::default().cache_max_file)]
    cache_max_file: usize,
    /// Most files the cache keeps open (for files above --cache-max-file); 0 opens
    /// them per request.
    #[arg(long, default_value_t = Config::default().max_open_files)]
    max_open_files: usize,
    /// Most connections open at once; more get 503.
    #[arg(long, default_value_t = Config::default().max_connections)]
    max_connections: usize,
    /// Seconds a kept-alive connection may stay idle.
    #[arg(long, default_value_t = Config::default().idle_timeout.as_secs_f64())]
    idle_timeout: f64,
    /// Seconds a client has to send a whole request head.
    #[arg(long, default_value_t = Config::default().header_timeout.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a `.lua` page may run (its time slices together on Lua 5.4) before it is
    /// stopped with 500.
    #[arg(long, default_value_t = Config::default().cgi_timeout.as_secs_f64())]
    cgi_timeout: f64,
    /// Most memory one Lua state of `.lua` pages may use, in bytes (the pages it runs at
    /// once together); a page past it gives 500 (0: no bound).
    #[arg(long, default_value_t = Config::default().cgi_memory)]
    cgi_memory: usize,
    /// Lua states that run `.lua` pages (default: one per worker thread).
    #[arg(long)]
    cgi_states: Option<usize>,
    /// Most pages one Lua state runs at once, taking turns 10 ms at a time (more wait
    /// to start).
    #[arg(long, default_value_t = Config::default().cgi_pages)]
    cgi_pages: usize,
    /// While a response from memory larger than 512 KiB is written, the bytes its
    /// socket may hold unsent before more is written into it (TCP_NOTSENT_LOWAT; 0: the
    /// kernel's, no bound).
    #[arg(long, default_value_t = Config::default().notsent_lowat)]
    notsent_lowat: usize,
    /// Seconds a SIGTERM or SIGINT waits for open connections to end their response
    /// (no new ones are accepted meanwhile) before the server stops; a second signal
    /// stops it at once.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout: f64,
}

fn secs(name: &str, s: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0,
        "--{name} must be a positive number of seconds"
    );
    Duration::try_from_secs_f64(s).with_context(|| format!("--{name} {s}"))
}

/// Logging when `RUST_LOG` is not set. A failed stage is logged without the request's
/// event: keeping a copy of every event in case its handler fails costs ~10 % of the
/// server's user-space CPU (`RUST_LOG=warn,leda::failed_event=warn` brings it back).
const LOG_DEFAULT: &str = "warn,leda::failed_event=off,leda_http::cgi=info";

/// Pages' Lua environments, strings and responses are freed on whichever worker runs
/// next: mimalloc takes such frees without glibc's arena locks (the Lua page +10–15 %,
/// static files unchanged: docs/http-server.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Blocked first, before any thread starts, so that every thread inherits the mask
    // and only the `signals` thread (`serve`) takes them.
    let signals = Signals::block();
    leda_core::cli::init_logging(LOG_DEFAULT);
    let args = Args::parse();
    leda_core::cli::exit("leda-httpd", serve(args, signals))
}

fn serve(args: Args, signals: std::io::Result<Signals>) -> anyhow::Result<()> {
    let signals = signals.context("blocking SIGTERM and SIGINT")?;
    raise_fd_limit();
    let (root, embedded) = match &args.root {
        Some(r) => (r.clone(), false),
        None => (
            leda_http::site::write_to(&leda_http::site::default_dir())?,
            true,
        ),
    };
    let cfg = Config {
        root,
        cache_bytes: args.cache_bytes,
        cache_max_file: args.cache_max_file,
        max_open_files: args.max_open_files,
        max_connections: args.max_connections,
        idle_timeout: secs("idle-timeout", args.idle_timeout)?,
        header_timeout: secs("header-timeout", args.header_timeout)?,
        cgi_timeout: secs("cgi-timeout", args.cgi_timeout)?,
        cgi_memory: args.cgi_memory,
        cgi_states: args.cgi_states.unwrap_or(0),
        cgi_pages: args.cgi_pages,
        notsent_lowat: args.notsent_lowat,
        ..Config::default()
    };
    let listener =
        TcpListener::bind(&args.listen).with_context(|| format!("listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let threads = args.threads.unwrap_or_else(num_threads);
    let grace = secs("drain-timeout", args.drain_timeout)?;
    let serving = leda_http::start(&cfg, listener, threads)?;
    if embedded {
        println!(
            "leda-httpd: serving the embedded demo site on http://{addr}/ ({threads} threads)"
        );
        println!("leda-httpd: open http://{addr}/ (static) and http://{addr}/hello.lua (dynamic)");
    } else {
        println!(
            "leda-httpd: serving {} on http://{addr}/ ({threads} threads)",
            cfg.root.display()
        );
    }
    let leda_http::Serving { running, drain } = serving;
    let handle = running.handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = signals.next();
            eprintln!(
                "leda-httpd: {}: draining ({} connection(s) open, up to {:.1} s; again to stop now)",
                signal_name(sig),
                drain.open(),
                grace.as_secs_f64()
            );
            let left = drain.stop(grace, |d| {
                let again = signals.wait(d);
                if let Some(sig) = again {
                    eprintln!("leda-httpd: {}: stopping now", signal_name(sig));
                }
                again.is_some()
            });
            if left > 0 {
                eprintln!("leda-httpd: stopping with {left} connection(s) open");
            }
            handle.quit(());
        })?;
    running.wait()?;
    Ok(())
}

/// SIGTERM and SIGINT, blocked for the whole process and taken by `sigtimedwait`.
struct Signals(libc::sigset_t);

impl Signals {
    /// Blocks the signals in the calling thread (and the threads it starts later).
    fn block() -> std::io::Result<Signals> {
        // SAFETY: a sigset_t filled by sigemptyset/sigaddset, then installed as this
        // thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(Signals(set))
        }
    }

    /// The next signal.
    fn next(&self) -> libc::c_int {
        loop {
            if let Some(sig) = self.wait(Duration::from_secs(3600)) {
                return sig;
            }
        }
    }

    /// The next signal within `limit`, if one comes.
    fn wait(&self, limit: Duration) -> Option<libc::c_int> {
        let ts = libc::timespec {
            tv_sec: limit.as_secs() as libc::time_t,
            tv_nsec: limit.subsec_nanos().into(),
        };
        // SAFETY: the set lives in `self`; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "signal",
    }
}

fn num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Lifts the soft open-files limit to the hard one: each connection is a descriptor.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
