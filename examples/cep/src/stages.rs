//! The CEP stages (Rust handlers) and the registry daemons rebuild them from.
//!
//! `source` is the library's `io.lines`, `window` its `window.merge`, `copy` its
//! `util.broadcast` (reused unchanged); `stamp`, `persist`, `filter`, `correlate` and
//! `alarm` are this application's.
//!
//! Results are defined by event time: each source's `stamp` gives every line its log
//! time, and `window` cuts windows of `size` lines over the merge of the sources in
//! time order (ties by source, then line order) with a lateness bound of
//! [`LATENESS`] seconds per source, so the windows, and so the alarms, are the same in
//! every configuration and on every run. A line more than [`LATENESS`] seconds older
//! than one its source sent before is *late*: it is recorded as a `late` alarm line
//! instead of going into a window.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use leda_core::prelude::*;
use leda_net::Registry;
use leda_stages::{io, util, window};

use crate::log::{Entry, ip_text, parse, time_of};
use crate::rules::{correlate as correlated, is_relevant};

/// Registered kinds.
pub mod kind {
    /// `io.lines`.
    pub const SOURCE: &str = "cep.source";
    /// Gives each line its event time.
    pub const STAMP: &str = "cep.stamp";
    /// `window.merge`.
    pub const WINDOW: &str = "cep.window";
    /// `util.broadcast`.
    pub const COPY: &str = "cep.copy";
    /// Appends windows to files.
    pub const PERSIST: &str = "cep.persist";
    /// Keeps relevant entries.
    pub const FILTER: &str = "cep.filter";
    /// Pairwise burst detection.
    pub const CORRELATE: &str = "cep.correlate";
    /// Records alarms.
    pub const ALARM: &str = "cep.alarm";
}

fn out_dir(attrs: &Attrs, stage: &str) -> Result<PathBuf, BoxError> {
    match attrs.get("out") {
        Some(Value::Str(d)) => Ok(PathBuf::from(d)),
        _ => Err(format!("{stage}: attribute 'out' (output directory) must be set").into()),
    }
}

/// The lines of a window event, or an error naming the stage.
fn window_lines<'a>(ev: &'a Event, stage: &str) -> Result<&'a [Value], BoxError> {
    match ev.arg(0) {
        Some(Value::Array(a)) => Ok(a),
        _ => Err(format!("{stage}: expected a window (an array of log lines)").into()),
    }
}

/// The text of a log line sent as text or as bytes.
fn line_text(v: &Value) -> Option<&str> {
    match v {
        Value::Str(s) => Some(s),
        Value::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// Parses the lines of a window; malformed lines are logged and skipped.
fn entries(lines: &[Value], stage: &str) -> Vec<(Entry, usize)> {
    let mut out = Vec::with_capacity(lines.len());
    for (i, v) in lines.iter().enumerate() {
        match line_text(v).map(parse) {
            Some(Ok(e)) => out.push((e, i)),
            Some(Err(e)) => tracing::warn!(stage, error = %e, "malformed log line skipped"),
            None => tracing::warn!(stage, "non-text log entry skipped"),
        }
    }
    out
}

/// `source`: reads one log file (Listing 4.2's `lines`, from the library), each line
/// as reference-counted bytes so that `copy` shares them instead of copying.
pub fn source(name: &str) -> Stage {
    io::lines()
        .clone_as(name)
        .attr("bytes", true)
        .kind(kind::SOURCE)
}

/// How much older than its source's latest line a line may be and still go into the
/// windows (seconds): Apache writes a line when the response ends, stamped with the
/// request's start, so a source is out of order by up to its slowest response.
pub const LATENESS: i64 = 60;

/// `stamp_<i>` (serial, next to source `i`, so that its lines keep their order):
/// `(line)` becomes `(time, i, line)`, the source's end-of-file tick `()` becomes
/// `(i)`. A line without a readable time is the handler's error (logged, counted).
pub fn stamp(source: usize) -> Stage {
    Stage::stateful(
        format!("stamp{}", source + 1),
        |attrs: &Attrs| -> Result<u64, BoxError> { Ok(attrs.get_as("source")?) },
        |src: &mut u64, mut ev: Event, ctx: &mut Ctx| {
            if ev.is_empty() {
                return Ok(ctx.send_or_wait(1, *src)?);
            }
            let line = ev.take(0);
            let time = line_text(&line)
                .and_then(time_of)
                .ok_or_else(|| format!("stamp: no access-log time in {line}"))?;
            ctx.send_or_wait(1, (time, *src, line))?;
            Ok(())
        },
    )
    .serial()
    .attr("source", source as u64)
    .kind(kind::STAMP)
}

/// `window`: windows of `size` entries over the event-time merge of `sources`
/// sources (see the module).
pub fn window(size: usize, sources: usize) -> Stage {
    window::merge()
        .clone_as("window")
        .attr("size", size)
        .attr("sources", sources)
        .attr("lateness", LATENESS)
        .kind(kind::WINDOW)
}

/// `copy`: one copy of each window to persist (1), filter (2) and correlate (3).
pub fn copy() -> Stage {
    util::broadcast().clone_as("copy").kind(kind::COPY)
}

static PERSIST_FILES: AtomicUsize = AtomicUsize::new(0);

/// `persist` (parallel): appends each window to this instance's file
/// `<out>/persist-<pid>-<n>.log`, one line per entry, a blank line after each window
/// (one write per window).
pub fn persist() -> Stage {
    Stage::stateful(
        "persist",
        |attrs: &Attrs| -> Result<File, BoxError> {
            let dir = out_dir(attrs, "persist")?;
            let n = PERSIST_FILES.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("persist-{}-{n}.log", std::process::id()));
            Ok(OpenOptions::new().create(true).append(true).open(&path)?)
        },
        |f: &mut File, ev: Event, _: &mut Ctx| {
            let lines = window_lines(&ev, "persist")?;
            let mut buf = Vec::with_capacity(lines.len() * 200);
            for l in lines {
                match l {
                    Value::Str(t) => buf.extend_from_slice(t.as_bytes()),
                    Value::Bytes(b) => buf.extend_from_slice(b),
                    other => return Err(format!("persist: a log line is a {}", other.type_name()).into()),
                }
                buf.push(b'\n');
            }
            buf.push(b'\n');
            f.write_all(&buf)?;
            Ok(())
        },
    )
    .kind(kind::PERSIST)
}

/// `filter` (parallel): sends `("filter", line)` to the alarm for each relevant entry.
pub fn filter() -> Stage {
    Stage::new("filter", |ev: Event, ctx: &mut Ctx| {
        let lines = window_lines(&ev, "filter")?;
        for (e, i) in entries(lines, "filter") {
            if is_relevant(&e) {
                let text = line_text(&lines[i]).unwrap_or_default().to_owned();
                ctx.send_or_wait(1, ("filter", text))?;
            }
        }
        Ok(())
    })
    .kind(kind::FILTER)
}

/// `correlate` (parallel): O(w²) burst detection; sends `("correlate", client, hot
/// entries)` to the alarm for each client with a burst in the window.
pub fn correlate() -> Stage {
    Stage::new("correlate", |ev: Event, ctx: &mut Ctx| {
        let lines = window_lines(&ev, "correlate")?;
        let es: Vec<Entry> = entries(lines, "correlate")
            .into_iter()
            .map(|(e, _)| e)
            .collect();
        for (ip, n) in correlated(&es) {
            ctx.send_or_wait(1, ("correlate", ip_text(ip), n))?;
        }
        Ok(())
    })
    .kind(kind::CORRELATE)
}

/// `alarm` (serial): appends each alarm as a tab-separated line to `<out>/alarms.log`.
pub fn alarm() -> Stage {
    Stage::stateful(
        "alarm",
        |attrs: &Attrs| -> Result<File, BoxError> {
            let dir = out_dir(attrs, "alarm")?;
            Ok(OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("alarms.log"))?)
        },
        |f: &mut File, ev: Event, _: &mut Ctx| {
            // Tab-separated; a log line sent as bytes is written as its text.
            let mut line = Vec::with_capacity(256);
            for (i, v) in ev.args().iter().enumerate() {
                if i > 0 {
                    line.push(b'\t');
                }
                match v {
                    Value::Bytes(b) => line.extend_from_slice(b),
                    other => line.extend_from_slice(other.to_string().as_bytes()),
                }
            }
            line.push(b'\n');
            f.write_all(&line)?;
            Ok(())
        },
    )
    .serial()
    .kind(kind::ALARM)
}

/// The kinds a CEP daemon can build.
pub fn registry() -> Registry {
    Registry::new()
        .with(kind::SOURCE, |_| Ok(source("source")))
        .with(kind::STAMP, |_| Ok(stamp(0)))
        .with(kind::WINDOW, |_| Ok(window(1000, 1)))
        .with(kind::COPY, |_| Ok(copy()))
        .with(kind::PERSIST, |_| Ok(persist()))
        .with(kind::FILTER, |_| Ok(filter()))
        .with(kind::CORRELATE, |_| Ok(correlate()))
        .with(kind::ALARM, |_| Ok(alarm()))
}
