//! The COST baseline: one thread doing the same work without the framework (read the
//! three logs, windows of `w` entries over their event-time merge, persist each
//! window, filter, correlate, write the alarms), with the same rules, the same windows
//! ([`leda_stages::window::Merge`], as the graph's `window`) and the same output files.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::app::{Outcome, outcome};
use leda_stages::window::{Merge, Refused};

use crate::log::{Entry, ip_text, parse, time_of};
use crate::rules::{correlate, is_relevant};
use crate::stages::LATENESS;

struct Sinks {
    persist: File,
    alarms: BufWriter<File>,
}

fn process(window: &[String], sinks: &mut Sinks) -> std::io::Result<()> {
    let mut buf = String::with_capacity(window.len() * 200);
    for l in window {
        buf.push_str(l);
        buf.push('\n');
    }
    buf.push('\n');
    sinks.persist.write_all(buf.as_bytes())?;
    let mut entries: Vec<Entry> = Vec::with_capacity(window.len());
    for l in window {
        match parse(l) {
            Ok(e) => {
                if is_relevant(&e) {
                    writeln!(sinks.alarms, "filter\t{l}")?;
                }
                entries.push(e);
            }
            Err(e) => tracing::warn!(error = %e, "malformed log line skipped"),
        }
    }
    for (ip, n) in correlate(&entries) {
        writeln!(sinks.alarms, "correlate\t{}\t{n}", ip_text(ip))?;
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
    std::fs::create_dir_all(out)?;
    for name in ["alarms.log", "persist-seq.log"] {
        let _ = std::fs::remove_file(out.join(name));
    }
    let start = Instant::now();
    let mut sinks = Sinks {
        persist: OpenOptions::new()
            .create(true)
            .append(true)
            .open(out.join("persist-seq.log"))?,
        alarms: BufWriter::new(File::create(out.join("alarms.log"))?),
    };
    // The files are read a chunk at a time in turn, so that the merge holds about a
    // chunk per file (they are each in time order, up to the lateness bound).
    const CHUNK: usize = 1024;
    let mut readers = Vec::with_capacity(files.len());
    for f in files {
        readers.push(Some(
            BufReader::with_capacity(1 << 16, File::open(f)?).lines(),
        ));
    }
    let mut merge: Merge<String> = Merge::new(window, files.len(), LATENESS as f64);
    let mut windows = Vec::new();
    while !merge.finished() {
        for (i, reader) in readers.iter_mut().enumerate() {
            let Some(lines) = reader else { continue };
            for _ in 0..CHUNK {
                let Some(line) = lines.next() else {
                    *reader = None;
                    merge.end(i, &mut windows);
                    break;
                };
                let line = line?;
                let Some(time) = time_of(&line) else {
                    tracing::warn!(line, "no access-log time: line skipped");
                    continue;
                };
                match merge.push(time as f64, i, line, &mut windows) {
                    Ok(()) => {}
                    Err(Refused::Late(line)) => {
                        writeln!(sinks.alarms, "late\t{time}\t{i}\t{line}")?;
                    }
                    Err(Refused::BadSource(_)) => unreachable!("source {i} is live"),
                }
            }
            for w in windows.drain(..) {
                process(&w, &mut sinks)?;
            }
        }
    }
    sinks.alarms.flush()?;
    let elapsed = start.elapsed();
    Ok((outcome(out)?, elapsed))
}
