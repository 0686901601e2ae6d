//! The COST baseline: one thread doing the same work without the framework (read the
//! three logs, windows of `w` entries over their event-time merge, persist each
//! window, filter, correlate, write the alarms), with the same rules, the same windows
//! ([`leda_stages::window::Merge`], as the graph's `window`) and the same output files.
//! It reads and parses as the graph does (chunks of whole lines, [`batch::stamp`]),
//! so the two differ only in what the framework adds: stages, queues, threads.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leda_stages::io::read_chunk;
use leda_stages::window::{Merge, Refused};

use crate::app::{Outcome, outcome};
use crate::batch::{self, Line};
use crate::rules::{alarm, is_relevant};
use crate::stages::{CHUNK, LATENESS};

struct Sinks {
    persist: File,
    alarms: BufWriter<File>,
}

fn process(window: &[Line], sinks: &mut Sinks) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(window.iter().map(|l| l.text.len() + 1).sum::<usize>() + 1);
    for l in window {
        buf.extend_from_slice(&l.text);
        buf.push(b'\n');
    }
    buf.push(b'\n');
    sinks.persist.write_all(&buf)?;
    let mut entries = Vec::with_capacity(window.len());
    let mut alarms = Vec::new();
    for l in window {
        if let Some(e) = l.entry {
            if is_relevant(&e) {
                alarm::filter(&mut alarms, &l.text);
            }
            // (`stamp` read the client from this very line: always in it.)
            if let Some(client) = e.client(&l.text) {
                entries.push((client, e));
            }
        }
    }
    alarms.extend_from_slice(&alarm::correlate(&entries));
    sinks.alarms.write_all(&alarms)
}

/// Parses a chunk of source `i` and merges its lines (late ones are written as alarms).
fn stamp_and_merge(
    chunk: Vec<u8>,
    i: usize,
    merge: &mut Merge<Line>,
    windows: &mut Vec<Vec<Line>>,
    sinks: &mut Sinks,
) -> std::io::Result<()> {
    let s = batch::stamp(chunk);
    s.warn(i);
    let b = s.batch;
    for j in 0..b.len() {
        let line = b.take(j).expect("stamp's spans lie in its chunk");
        match merge.push(line.time as f64, i, line, windows) {
            Ok(()) => {}
            Err(Refused::Late(l)) => sinks.alarms.write_all(&alarm::late(l.time, i, &l.text))?,
            Err(Refused::BadSource(_)) => unreachable!("source {i} is live"),
        }
    }
    Ok(())
}

/// Runs the baseline on `files` with windows of `window` entries, writing to `out`
/// (which is cleared of earlier outputs); returns the outcome and the time taken.
pub fn sequential(
    files: &[PathBuf],
    window: usize,
    out: &Path,
) -> anyhow::Result<(Outcome, Duration)> {
    crate::app::check_window(window)?;
    crate::app::clear_outputs(out)?;
    let start = Instant::now();
    let at = |p: PathBuf| {
        move |e: std::io::Error| anyhow::Error::new(e).context(p.display().to_string())
    };
    let (persist, alarms) = (out.join("persist-seq.log"), out.join("alarms.log"));
    let mut sinks = Sinks {
        persist: OpenOptions::new()
            .create(true)
            .append(true)
            .open(&persist)
            .map_err(at(persist.clone()))?,
        alarms: BufWriter::new(File::create(&alarms).map_err(at(alarms.clone()))?),
    };
    // The files are read a chunk at a time in turn, so that the merge holds about a
    // chunk per file (they are each in time order, up to the lateness bound).
    let mut readers = Vec::with_capacity(files.len());
    for f in files {
        readers.push(Some((File::open(f).map_err(at(f.clone()))?, Vec::new())));
    }
    let mut merge: Merge<Line> = Merge::new(window, files.len(), LATENESS as f64);
    let mut windows = Vec::new();
    while !merge.finished() {
        for (i, reader) in readers.iter_mut().enumerate() {
            let Some((file, carry)) = reader else {
                continue;
            };
            match read_chunk(file, carry, CHUNK) {
                Ok(Some(chunk)) => stamp_and_merge(chunk, i, &mut merge, &mut windows, &mut sinks)
                    .map_err(at(alarms.clone()))?,
                Ok(None) => {
                    *reader = None;
                    merge.end(i, &mut windows);
                }
                // An over-long line was skipped (as `io.lines` does); reading goes on.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    tracing::warn!(file = %files[i].display(), error = %e, "line skipped");
                }
                Err(e) => return Err(at(files[i].clone())(e)),
            }
            for w in windows.drain(..) {
                process(&w, &mut sinks).map_err(at(out.to_path_buf()))?;
            }
        }
    }
    sinks.alarms.flush().map_err(at(alarms.clone()))?;
    let elapsed = start.elapsed();
    Ok((outcome(out)?, elapsed))
}
