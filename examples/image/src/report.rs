//! The `report` sink: counts what happened to every image, shows the progress bar
//! (done/total, images/s, ETA), prints one line per failed image, and ends the run
//! (`quit`, with `(done, total, failed, errors)`) once every image is accounted for.
//!
//! Input events (the first argument says which):
//!
//! * `("total", n)` from `source`, or `("total", 0, dir, why)` when it could not list
//!   the directory (an error line, no image);
//! * `("written", name, variant, bytes)` from `write`: one per output file, so an
//!   image is done when both its full-size image and its half copy are written;
//! * `("failed", name, stage, message)`: a failure labelled `source` is an input file
//!   that was not sent on (`name` is the file's name); `STAGE full` or `STAGE half`
//!   (after `scale`: `scale half`, `encode full`, `write half`...) is one of an image's
//!   two outputs lost; any other label (`decode`, `denoise`...) is the whole image lost.
//!   The stages report every failure of an image this way, whatever failed (see
//!   `stages::image_step`), so the count always completes.
//!
//! Each image sent on by `source` and accounted for sends `("next", 1)` on `credit`
//! (when connected), which lets `source` send the next path (see
//! [`crate::stages::source`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use leda_core::prelude::*;

use crate::stages::kinds;

/// What a run did, filled by the `report` stage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Input files found.
    pub total: Option<u64>,
    /// Images with both outputs written.
    pub done: u64,
    /// Inputs that failed: images with at least one failure, and files `source`
    /// refused.
    pub failed: u64,
    /// Bytes of JPEG written.
    pub bytes_written: u64,
    /// One line per failure: `name: stage: message`.
    pub errors: Vec<String>,
    /// Seconds from the first event the report saw to the last image.
    pub seconds: f64,
}

impl Summary {
    /// `true` once every input is accounted for.
    pub fn complete(&self) -> bool {
        self.total.is_some_and(|t| self.done + self.failed >= t)
    }

    /// Images per second over the run.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.done + self.failed) as f64 / self.seconds
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} image(s) processed, {} failed, {:.1} MB written, {:.2} s, {:.2} images/s",
            self.done,
            self.total
                .map_or_else(|| "?".to_string(), |t| t.to_string()),
            self.failed,
            self.bytes_written as f64 / 1e6,
            self.seconds,
            self.rate()
        )
    }
}

/// Per-image progress: outputs accounted for, and whether one failed.
#[derive(Default)]
struct Pending {
    outputs: u8,
    failed: bool,
}

struct Tally {
    summary: Summary,
    pending: HashMap<String, Pending>,
    bar: ProgressBar,
    started: Option<Instant>,
    sink: Option<Arc<Mutex<Summary>>>,
    /// Without a terminal for the bar: when the last progress line was printed.
    lines: Option<Instant>,
}

/// Seconds between two progress lines when stderr is not a terminal.
const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Tally {
    fn new(attrs: &Attrs, sink: Option<Arc<Mutex<Summary>>>) -> Result<Tally, BoxError> {
        let show = attrs.get_as::<Option<bool>>("progress")?.unwrap_or(true);
        let bar = ProgressBar::with_draw_target(
            None,
            if show {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} images  {per_sec}  ETA {eta}",
            )
            .map_err(|e| BoxError::from(e.to_string()))?,
        );
        let lines =
            (show && !std::io::IsTerminal::is_terminal(&std::io::stderr())).then(Instant::now);
        Ok(Tally {
            summary: Summary::default(),
            pending: HashMap::new(),
            bar,
            started: None,
            sink,
            lines,
        })
    }

    fn finish_image(&mut self, name: &str, failed: bool, ctx: &mut Ctx) -> HandlerResult {
        self.pending.remove(name);
        if failed {
            self.summary.failed += 1;
        } else {
            self.summary.done += 1;
        }
        self.bar.inc(1);
        if ctx.has_output("credit") {
            ctx.send_or_wait("credit", ("next", 1))?;
        }
        Ok(())
    }

    /// Prints `error: LINE` and keeps it for the summary.
    fn error_line(&mut self, line: String) {
        self.bar.suspend(|| eprintln!("error: {line}"));
        self.summary.errors.push(line);
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let started = *self.started.get_or_insert_with(Instant::now);
        let tag: String = ev.get(0)?;
        match tag.as_str() {
            "total" => {
                let n: u64 = ev.get(1)?;
                if ev.len() == 4 {
                    let (dir, why): (String, String) = (ev.get(2)?, ev.get(3)?);
                    self.error_line(format!("{dir}: source: {why}"));
                }
                self.summary.total = Some(n);
                self.bar.set_length(n);
            }
            "written" => {
                let name: String = ev.get(1)?;
                self.summary.bytes_written += ev.get::<u64>(3)?;
                let p = self.pending.entry(name.clone()).or_default();
                p.outputs += 1;
                if p.outputs >= 2 {
                    let failed = p.failed;
                    self.finish_image(&name, failed, ctx)?;
                }
            }
            "failed" => {
                let (name, stage, message): (String, String, String) =
                    (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                self.error_line(format!("{name}: {stage}: {message}"));
                if stage == "source" {
                    // A file never sent on: no credit to give back.
                    self.summary.failed += 1;
                    self.bar.inc(1);
                } else if stage.ends_with(" full") || stage.ends_with(" half") {
                    let p = self.pending.entry(name.clone()).or_default();
                    p.outputs += 1;
                    p.failed = true;
                    if p.outputs >= 2 {
                        self.finish_image(&name, true, ctx)?;
                    }
                } else {
                    self.finish_image(&name, true, ctx)?;
                }
            }
            other => return Err(format!("report: unknown event '{other}'").into()),
        }
        self.summary.seconds = started.elapsed().as_secs_f64();
        if self.lines.is_some_and(|l| l.elapsed() >= LINE_EVERY) {
            self.lines = Some(Instant::now());
            let s = &self.summary;
            eprintln!(
                "leda-image: {} of {} image(s), {:.1} images/s",
                s.done + s.failed,
                s.total.map_or("?".to_owned(), |t| t.to_string()),
                s.rate()
            );
        }
        if let Some(sink) = &self.sink {
            *sink.lock().unwrap_or_else(|e| e.into_inner()) = self.summary.clone();
        }
        if self.summary.complete() {
            self.bar.finish_and_clear();
            if self.sink.is_none() {
                println!("{}", self.summary);
            }
            // `(done, total, failed, errors)`: what a script's `graph:run` returns.
            let s = &self.summary;
            let errors = s.errors.len() as u64;
            ctx.quit((s.done, s.total.unwrap_or(0), s.failed, errors));
        }
        Ok(())
    }
}

/// The `report` stage (serial). With `sink`, the summary is kept there for the caller
/// to print; without, the stage prints it when the last image is accounted for.
/// Attribute `progress = false` hides the bar.
pub fn report(sink: Option<Arc<Mutex<Summary>>>) -> Stage {
    Stage::stateful(
        "report",
        move |a: &Attrs| Tally::new(a, sink.clone()),
        |t: &mut Tally, ev: Event, ctx: &mut Ctx| t.handle(ev, ctx),
    )
    .serial()
    .kind(kinds::REPORT)
}
