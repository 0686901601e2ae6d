//! Stage kinds of the multi-process tests and benchmarks. Shared by the test node
//! binary (its registry) and by the tests (the launcher side builds the same stages).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};

use leda_core::prelude::*;
use leda_net::Registry;

/// Reads the file named by the event, one event per line on port `line`.
pub fn lines() -> Stage {
    Stage::new("lines", |ev: Event, ctx: &mut Ctx| {
        let name: String = ev.get(0)?;
        let file = std::fs::File::open(&name)?;
        for line in BufReader::new(file).lines() {
            ctx.send_or_wait("line", line?)?;
        }
        Ok(())
    })
    .kind("test.lines")
}

/// Sends lines containing the `pattern` attribute on port `match`.
pub fn matcher() -> Stage {
    Stage::stateful(
        "match",
        |attrs: &Attrs| -> Result<String, BoxError> { Ok(attrs.get_as("pattern")?) },
        |pattern: &mut String, ev: Event, ctx: &mut Ctx| {
            let line: &str = ev.get(0)?;
            if line.contains(pattern.as_str()) {
                ctx.send_or_wait("match", line)?;
            }
            Ok(())
        },
    )
    .kind("test.match")
    .bind(|b| {
        if b.attrs.get("pattern").is_none() {
            return Err("Pattern field must be defined".into());
        }
        Ok(())
    })
}

/// Appends each event's arguments, tab-separated, to the file named by attribute `out`.
pub fn printer() -> Stage {
    Stage::stateful(
        "print",
        |attrs: &Attrs| -> Result<std::fs::File, BoxError> {
            let path: String = attrs.get_as("out")?;
            Ok(std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?)
        },
        |f: &mut std::fs::File, ev: Event, _: &mut Ctx| {
            writeln!(f, "{ev}")?;
            Ok(())
        },
    )
    .serial()
    .kind("test.print")
}

/// Adds attribute `add` (default 1) to an integer and sends it on port 1.
pub fn inc(name: &str) -> Stage {
    Stage::stateful(
        name.to_owned(),
        |attrs: &Attrs| -> Result<i64, BoxError> {
            Ok(attrs.get_as::<Option<i64>>("add")?.unwrap_or(1))
        },
        |add: &mut i64, ev: Event, ctx: &mut Ctx| {
            let x: i64 = ev.get(0)?;
            ctx.send_or_wait(1, x + *add)?;
            Ok(())
        },
    )
    .kind("test.inc")
}

/// Sends `(x, pid)`: which process handled `x`.
pub fn tag(name: &str) -> Stage {
    Stage::new(name.to_owned(), |ev: Event, ctx: &mut Ctx| {
        let x: i64 = ev.get(0)?;
        ctx.send_or_wait(1, (x, i64::from(std::process::id())))?;
        Ok(())
    })
    .kind("test.tag")
}

/// Counts events and sums their first argument; quits with `(count, sum)` once the
/// count reaches attribute `expect`. With `pids = true`, the quit values also list how
/// many events came from each distinct second argument.
pub fn collect(name: &str) -> Stage {
    struct State {
        expect: u64,
        count: u64,
        sum: i64,
        by: Vec<(i64, i64)>,
    }
    Stage::stateful(
        name.to_owned(),
        |attrs: &Attrs| -> Result<State, BoxError> {
            Ok(State {
                expect: attrs.get_as("expect")?,
                count: 0,
                sum: 0,
                by: Vec::new(),
            })
        },
        |st: &mut State, ev: Event, ctx: &mut Ctx| {
            st.count += 1;
            st.sum += ev.get::<i64>(0)?;
            if let Some(k) = ev.get::<Option<i64>>(1)? {
                match st.by.iter_mut().find(|(p, _)| *p == k) {
                    Some(e) => e.1 += 1,
                    None => st.by.push((k, 1)),
                }
            }
            if st.count == st.expect {
                let by: Vec<Value> = st.by.iter().map(|(_, n)| Value::Int(*n)).collect();
                ctx.quit((st.count as i64, st.sum, Value::Array(by)));
            }
            Ok(())
        },
    )
    .serial()
    .kind("test.collect")
}

/// Counts events and sleeps `ms` milliseconds on each (a slow receiver).
pub fn slow(name: &str) -> Stage {
    Stage::stateful(
        name.to_owned(),
        |attrs: &Attrs| -> Result<u64, BoxError> {
            Ok(attrs.get_as::<Option<u64>>("ms")?.unwrap_or(1))
        },
        |ms: &mut u64, _ev: Event, _: &mut Ctx| {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            Ok(())
        },
    )
    .serial()
    .kind("test.slow")
}

/// On `(n, size, quit)`: sends `n` events of `size` payload bytes (an integer when
/// `size` is 0) on port 1, waiting when the destination is full; then, unless `quit`
/// is false, quits with the number of events it could send. A send failure other than
/// a full queue stops it.
pub fn generator(name: &str) -> Stage {
    Stage::asynchronous(name.to_owned(), |ev: Event, mut ctx: Ctx| async move {
        let n: i64 = ev.get(0)?;
        let size: usize = ev.get::<Option<usize>>(1)?.unwrap_or(0);
        let payload = bytes::Bytes::from(vec![7u8; size]);
        let mut ok = 0i64;
        for i in 0..n {
            let e = if size == 0 {
                Event::from(i)
            } else {
                Event::from(payload.clone())
            };
            if ctx.send_wait(1, e).await.is_err() {
                break;
            }
            ok += 1;
        }
        if ev.get::<Option<bool>>(2)?.unwrap_or(true) {
            ctx.quit(ok);
        }
        Ok(())
    })
    .kind("test.gen")
}

/// Counts what arrives on its queue (error-port reports of a sender).
pub fn counter(name: &str, count: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Stage {
    Stage::new(name.to_owned(), move |_ev: Event, _: &mut Ctx| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })
}

/// Discards its events; quits with the count once it reaches attribute `expect`.
pub fn drain(name: &str) -> Stage {
    Stage::stateful(
        name.to_owned(),
        |attrs: &Attrs| -> Result<(u64, u64), BoxError> { Ok((attrs.get_as("expect")?, 0)) },
        |st: &mut (u64, u64), _ev: Event, ctx: &mut Ctx| {
            st.1 += 1;
            if st.1 == st.0 {
                ctx.quit(st.1 as i64);
            }
            Ok(())
        },
    )
    .serial()
    .kind("test.drain")
}

/// Sends every event back unchanged on port 1.
pub fn echo(name: &str) -> Stage {
    Stage::new(name.to_owned(), |ev: Event, ctx: &mut Ctx| {
        ctx.send_or_wait(1, ev)?;
        Ok(())
    })
    .kind("test.echo")
    // It never blocks its thread: events from another process may be handled by the
    // thread that read them.
    .nonblocking()
}

/// Sleeps attribute `ms` milliseconds (default 0) on each event, then sends it back
/// unchanged on port 1 (a busy worker between two stages of another process).
pub fn slow_echo(name: &str) -> Stage {
    Stage::stateful(
        name.to_owned(),
        |attrs: &Attrs| -> Result<u64, BoxError> {
            Ok(attrs.get_as::<Option<u64>>("ms")?.unwrap_or(0))
        },
        |ms: &mut u64, ev: Event, ctx: &mut Ctx| {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            ctx.send_or_wait(1, ev)?;
            Ok(())
        },
    )
    .kind("test.slow_echo")
}

/// The registry of every kind above.
pub fn registry() -> Registry {
    Registry::new()
        .with("test.lines", |_| Ok(lines()))
        .with("test.match", |_| Ok(matcher()))
        .with("test.print", |_| Ok(printer()))
        .with("test.inc", |_| Ok(inc("inc")))
        .with("test.tag", |_| Ok(tag("tag")))
        .with("test.collect", |_| Ok(collect("collect")))
        .with("test.slow", |_| Ok(slow("slow")))
        .with("test.gen", |_| Ok(generator("gen")))
        .with("test.echo", |_| Ok(echo("echo")))
        .with("test.drain", |_| Ok(drain("drain")))
        .with("test.slow_echo", |_| Ok(slow_echo("slow_echo")))
}
