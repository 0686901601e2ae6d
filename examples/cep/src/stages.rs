//! The CEP stages (Rust handlers) and the registry daemons rebuild them from.
//!
//! `source` is the library's `io.lines` (in chunks of whole lines); `window` runs the
//! library's event-time merge ([`leda_stages::window::Merge`], as `window.merge`
//! does) over batches; `stamp`, `copy`, `persist`, `filter`, `correlate` and `alarm`
//! are this application's (the Lua variant uses the library's `window.merge` and
//! `util.broadcast` as they are).
//!
//! Each line is parsed once: `stamp` turns a chunk of lines into a [`Batch`] (the
//! chunk's text with a record of fields per line), `window` cuts windows as batches
//! too, and `persist`, `filter` and `correlate` read the records; copies of a window
//! share one buffer.
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

use leda_core::error::BadEvent;
use leda_core::prelude::*;
use leda_net::Registry;
use leda_stages::io;
use leda_stages::window::{Merge, Refused};

use crate::batch::{self, Batch, Builder, Line};
use crate::rules::{alarm, is_relevant};

/// Registered kinds.
pub mod kind {
    /// `io.lines`.
    pub const SOURCE: &str = "cep.source";
    /// Gives each line its event time.
    pub const STAMP: &str = "cep.stamp";
    /// Windows over the sources' event-time merge.
    pub const WINDOW: &str = "cep.window";
    /// Hands each window to persist, filter and correlate.
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

/// The batch an event carries as its arguments `i` (text) and `i + 1` (records), or
/// an error naming the stage.
fn batch_arg(ev: &Event, i: usize, stage: &str) -> Result<Batch, BoxError> {
    match (ev.arg(i), ev.arg(i + 1)) {
        (Some(Value::Bytes(t)), Some(Value::Bytes(r))) => {
            Ok(Batch::new(t.clone(), r.clone()).map_err(|e| format!("{stage}: {e}"))?)
        }
        _ => Err(format!("{stage}: expected a batch of log lines (text, records)").into()),
    }
}

/// Sends `b` on port 1 as `(prefix..., text, records)`.
fn send_batch(ctx: &mut Ctx, mut ev: Event, b: Batch) -> Result<(), BoxError> {
    let (text, records) = b.into_parts();
    ev.push(text);
    ev.push(records);
    Ok(ctx.send_or_wait(1, ev)?)
}

/// Bytes per chunk a source reads (whole lines): about 300 lines.
pub const CHUNK: usize = 64 * 1024;

/// Queue capacity (events) of the stages after the sources: batches and windows are
/// large (64 KiB, 200 KiB), so a few per queue keep the cores busy, and a source is
/// held back instead of reading its whole file into memory ahead of the merge.
pub const QUEUE: usize = 16;

/// `source`: reads one log file (Listing 4.2's `lines`, from the library) in chunks
/// of [`CHUNK`] bytes of whole lines.
pub fn source(name: &str) -> Stage {
    io::lines()
        .clone_as(name)
        .attr("chunk", CHUNK)
        .kind(kind::SOURCE)
}

/// How much older than its source's latest line a line may be and still go into the
/// windows (seconds): Apache writes a line when the response ends, stamped with the
/// request's start, so a source is out of order by up to its slowest response.
pub const LATENESS: i64 = 60;

/// `stamp_<i>` (serial, next to source `i`, so that its batches keep their order): a
/// chunk `(bytes)` becomes `(i, text, records)` ([`batch::stamp`]: every line parsed), the
/// source's end-of-file tick `()` becomes `(i)`. A line without a readable time is
/// left out with a warning (the sequential program does the same).
pub fn stamp(source: usize) -> Stage {
    Stage::stateful(
        format!("stamp{}", source + 1),
        |attrs: &Attrs| -> Result<u64, BoxError> { Ok(attrs.get_as("source")?) },
        |src: &mut u64, mut ev: Event, ctx: &mut Ctx| {
            if ev.is_empty() {
                return Ok(ctx.send_or_wait(1, *src)?);
            }
            let Value::Bytes(chunk) = ev.take(0) else {
                return Err("stamp: expected a chunk of log lines (bytes)".into());
            };
            let s = batch::stamp(Vec::from(chunk));
            s.warn(*src as usize);
            send_batch(ctx, Event::from(*src), s.batch)
        },
    )
    .serial()
    .capacity(QUEUE)
    .attr("source", source as u64)
    .kind(kind::STAMP)
}

/// `window` (serial): windows of `size` lines over the event-time merge of `sources`
/// sources' batches (see the module), each sent on port 1 as a batch `(text,
/// records)`. A line later than the bound goes to `late` as its alarm line
/// ([`alarm::late`]).
pub fn window(size: usize, sources: usize) -> Stage {
    Stage::stateful(
        "window",
        |attrs: &Attrs| -> Result<Merge<Line>, BoxError> {
            let size: usize = attrs.get_as("size")?;
            let sources: usize = attrs.get_as("sources")?;
            if size == 0 || sources == 0 {
                return Err("window: 'size' and 'sources' must be at least 1".into());
            }
            Ok(Merge::new(size, sources, LATENESS as f64))
        },
        |m: &mut Merge<Line>, ev: Event, ctx: &mut Ctx| {
            // A bad event (a peer's malformed batch, an unknown source) fails alone
            // (`BadEvent`): the merge keeps every line it holds (a plain error destroyed
            // it, with the lines of every source).
            let source: usize = ev.get(0).map_err(BadEvent::new)?;
            let mut out = Vec::new();
            if ev.len() == 1 {
                m.end(source, &mut out);
            } else {
                let b = batch_arg(&ev, 1, "window").map_err(BadEvent::new)?;
                // Checked whole before any line goes in: a bad batch is refused
                // whole, and no window it would complete is lost.
                b.check()
                    .map_err(|e| BadEvent::new(format!("window: {e}")))?;
                for i in 0..b.len() {
                    let line = b.take(i).map_err(|e| format!("window: {e}"))?;
                    match m.push(line.time as f64, source, line, &mut out) {
                        Ok(()) => {}
                        Err(Refused::Late(l)) => {
                            let line = alarm::late(l.time, source, &l.text);
                            ctx.send_or_wait("late", bytes::Bytes::from(line))?;
                        }
                        // (The first line: every line of a batch has its source.)
                        Err(Refused::BadSource(_)) => {
                            let why = format!("window: source {source} is unknown or has ended");
                            return Err(BadEvent::new(why).into());
                        }
                    }
                }
            }
            for w in out {
                let text = w.iter().map(|l| l.text.len() + 1).sum();
                let mut b = Builder::new(w.len(), text);
                for l in &w {
                    b.push(l).map_err(|e| format!("window: {e}"))?;
                }
                send_batch(ctx, Event::new(), b.finish())?;
            }
            Ok(())
        },
    )
    .serial()
    .capacity(QUEUE * 2)
    .attr("size", size)
    .attr("sources", sources)
    .kind(kind::WINDOW)
}

/// `copy` (parallel): each window to persist (1), filter (2) and correlate (3): the same
/// buffers in one process. `correlate` needs the text too: a client is any string
/// (IPv4, IPv6, a host name), read from its line.
pub fn copy() -> Stage {
    Stage::new("copy", |ev: Event, ctx: &mut Ctx| {
        let (text, records) = batch_arg(&ev, 0, "copy")?.into_parts();
        ctx.send_or_wait(1, (text.clone(), records.clone()))?;
        ctx.send_or_wait(2, (text.clone(), records.clone()))?;
        ctx.send_or_wait(3, (text, records))?;
        Ok(())
    })
    .capacity(QUEUE)
    .kind(kind::COPY)
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
            // The window's text is its lines, each ended by `\n`; a blank line after.
            let w = batch_arg(&ev, 0, "persist")?;
            f.write_all(w.text())?;
            f.write_all(b"\n")?;
            Ok(())
        },
    )
    .capacity(QUEUE)
    .kind(kind::PERSIST)
}

/// `filter` (parallel): sends the alarm one event per window with a relevant entry:
/// its alarm lines, `filter<TAB>line` each, as bytes.
pub fn filter() -> Stage {
    Stage::new("filter", |ev: Event, ctx: &mut Ctx| {
        let w = batch_arg(&ev, 0, "filter")?;
        let mut alarms = Vec::new();
        for i in 0..w.len() {
            if w.entry(i).is_some_and(|e| is_relevant(&e)) {
                alarm::filter(&mut alarms, w.line(i).map_err(|e| format!("filter: {e}"))?);
            }
        }
        if !alarms.is_empty() {
            ctx.send_or_wait(1, bytes::Bytes::from(alarms))?;
        }
        Ok(())
    })
    .capacity(QUEUE)
    .kind(kind::FILTER)
}

/// `correlate` (parallel): O(w²) burst detection; sends the alarm one event per window
/// with a burst: its alarm lines, `correlate<TAB>client<TAB>hot entries` for each
/// client with one, as bytes.
pub fn correlate() -> Stage {
    Stage::new("correlate", |ev: Event, ctx: &mut Ctx| {
        let w = batch_arg(&ev, 0, "correlate")?;
        let entries = w.entries().map_err(|e| format!("correlate: {e}"))?;
        let alarms = alarm::correlate(&entries);
        if !alarms.is_empty() {
            ctx.send_or_wait(1, bytes::Bytes::from(alarms))?;
        }
        Ok(())
    })
    .capacity(QUEUE)
    .kind(kind::CORRELATE)
}

/// `alarm` (serial): appends alarm lines to `<out>/alarms.log`; an event is one `bytes`
/// argument, [lines already formatted](crate::rules::alarm), as `filter`, `correlate`
/// and `window` send them.
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
            let [Value::Bytes(lines)] = ev.args() else {
                return Err("alarm: expected alarm lines (one bytes argument)".into());
            };
            f.write_all(lines)?;
            if !lines.ends_with(b"\n") {
                f.write_all(b"\n")?;
            }
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
