//! The COST baseline: one thread doing the same work without the framework (read the
//! three logs, windows of `w` entries, persist each window, filter, correlate, write
//! the alarms), with the same rules and the same output files.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::app::{Outcome, outcome};
use crate::log::{Entry, ip_text, parse};
use crate::rules::{correlate, is_relevant};

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
    let mut win: Vec<String> = Vec::with_capacity(window);
    for f in files {
        for line in BufReader::with_capacity(1 << 16, File::open(f)?).lines() {
            win.push(line?);
            if win.len() == window {
                process(&win, &mut sinks)?;
                win.clear();
            }
        }
        // As the graph's sources do: end of a file flushes the partial window.
        if !win.is_empty() {
            process(&win, &mut sinks)?;
            win.clear();
        }
    }
    sinks.alarms.flush()?;
    let elapsed = start.elapsed();
    Ok((outcome(out)?, elapsed))
}
