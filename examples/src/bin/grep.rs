//! The thesis' grep application (Listings 4.1–4.4) with Rust handlers:
//! `lines` (reads files, one event per line) → `match` (a regex; sends the captures)
//! → `print` (serial, so output lines never interleave). Errors opening a file go to
//! the `io_error` port of `lines`, printed on stderr.
//!
//! ```text
//! cargo run --release -p leda-examples --bin grep -- PATTERN FILE...
//! ```

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Context, bail};
use leda_core::prelude::*;
use regex::Regex;

/// Listing 4.2: one event per line on port `line`; open errors on port `io_error`.
fn lines() -> Stage {
    Stage::new("lines", |ev: Event, ctx: &mut Ctx| {
        let name: String = ev.get(0)?;
        let file = match std::fs::File::open(&name) {
            Ok(f) => f,
            Err(e) => {
                ctx.send("io_error", (name, format!("Open error: {e}")))?;
                return Ok(());
            }
        };
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = match line {
                Ok(l) => l,
                Err(e) => {
                    ctx.send(
                        "io_error",
                        (name.clone(), format!("Read error at line {}: {e}", n + 1)),
                    )?;
                    break;
                }
            };
            // The waiting send: a slow consumer slows this reader instead of losing lines.
            ctx.send_or_wait("line", line)?;
        }
        Ok(())
    })
}

/// Listing 4.3: sends the captures of `pattern` (the whole match when it has none).
fn matcher() -> Stage {
    Stage::stateful(
        "match",
        |attrs: &Attrs| -> Result<Regex, BoxError> {
            let pattern: String = attrs.get_as("pattern")?;
            Ok(Regex::new(&pattern)?)
        },
        |re: &mut Regex, ev: Event, ctx: &mut Ctx| {
            let line: &str = ev.get(0)?;
            if let Some(caps) = re.captures(line) {
                let values: Vec<Value> = if caps.len() > 1 {
                    caps.iter()
                        .skip(1)
                        .map(|c| Value::from(c.map(|m| m.as_str())))
                        .collect()
                } else {
                    vec![Value::from(&caps[0])]
                };
                ctx.send_or_wait("match", Event::from_values(values))?;
            }
            Ok(())
        },
    )
    .attr("pattern", "test")
    .bind(|b| {
        match b.attrs.get_as::<Option<String>>("pattern") {
            Ok(Some(p)) => Regex::new(&p).map_err(|e| format!("bad pattern: {e}"))?,
            _ => return Err("Pattern field must be defined".into()),
        };
        if !b.has_output("match") {
            return Err("'match' port must be connected".into());
        }
        Ok(())
    })
}

/// Listing 4.1: prints its arguments, tab-separated (serial: one line at a time). When
/// nobody reads any more (`grep ... | head -1`), the run ends, as a grep's does (each
/// later line failed on its own, one log line each).
fn printer(closed: Arc<AtomicBool>) -> Stage {
    Stage::new("print", move |ev: Event, ctx: &mut Ctx| {
        match writeln!(std::io::stdout().lock(), "{ev}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                closed.store(true, Ordering::Relaxed);
                ctx.quit(());
                Ok(())
            }
            r => Ok(r?),
        }
    })
    .serial()
}

/// Prints `io_error` events on stderr and counts them.
fn error_printer(count: Arc<AtomicUsize>) -> Stage {
    Stage::new("io_errors", move |ev: Event, _: &mut Ctx| {
        count.fetch_add(1, Ordering::Relaxed);
        // (Not `eprintln!`: it panics when stderr is closed.)
        let _ = writeln!(std::io::stderr(), "grep: {ev}");
        Ok(())
    })
    .serial()
}

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit("grep", run())
}

/// The thesis' grep (Listings 4.4 and 4.5) as a Leda-RS graph in one process.
#[derive(clap::Parser)]
#[command(version, name = "grep")]
struct Args {
    /// A regular expression.
    pattern: String,
    /// Files to search.
    #[arg(required = true)]
    files: Vec<String>,
}

fn run() -> anyhow::Result<()> {
    let Args { pattern, files } = <Args as clap::Parser>::parse();
    let (pattern, files) = (&pattern, &files);
    // Listing 4.4: the graph.
    let io_errors = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let (lines, matcher, printer) = (lines(), matcher(), printer(closed.clone()));
    let errors = error_printer(io_errors.clone());
    let mut g = Graph::new("grep");
    g.connect(&lines, "line", &matcher).local();
    g.connect(&matcher, "match", &printer);
    g.connect(&lines, "io_error", &errors);
    // Listing 4.5, one process: set the pattern, push the files, run.
    matcher.set_attr("pattern", pattern.as_str());
    for f in files {
        lines.push(f.as_str());
    }
    let report = g
        .run(Run::default().until_idle())
        .context("running the grep graph")?;
    if closed.load(Ordering::Relaxed) {
        // Nobody reads on: the sends the end of the run cut short are no failure.
        return Ok(());
    }
    let failed = report.stats.stages.iter().map(|s| s.errors).sum::<u64>();
    if failed > 0 {
        bail!("{failed} handler error(s); see the log above");
    }
    if io_errors.load(Ordering::Relaxed) > 0 {
        std::process::exit(2);
    }
    Ok(())
}
