//! The pipeline's Leda stages: `source → decode → denoise → color → scale → encode →
//! write`, plus the `report` sink that counts outcomes (see [`crate::report`]).
//!
//! Ports:
//!
//! | stage | input | outputs |
//! |---|---|---|
//! | `source` | `(dir)`, `("next", k)` | `file (path)`, `total ("total", n)`, `failed` |
//! | `decode` | `(path)` | `image (name, "full", w, h, pixels)`, `failed` |
//! | `denoise`, `color` | image | `image`, `failed` |
//! | `scale` | image | `image`: the full image, then the half copy (`"half"`), `failed` |
//! | `encode` | image | `jpeg (name, variant, jpeg)`, `failed` |
//! | `write` | jpeg | `written ("written", name, variant, bytes)`, `failed` |
//!
//! `failed` carries `("failed", name, stage, message)`: every failure of an image goes
//! there — an error, a panic, a send that fails (its process lost, an image too large
//! to cross to another process) — and the run goes on; `stage` names the output lost
//! after `scale` (`encode half`, `write full`...); `source` reports there, by file
//! name, the files it refuses (see [`list_inputs`]). When `failed` is not connected
//! the error fails the handler call instead (counted and logged by the runtime).
//!
//! | `report` | total, written, failed | `credit ("next", 1)` per image accounted for |
//!
//! Attributes: `source.window` (images in flight, 0 = unbounded, default 0),
//! `denoise.threshold` (0–255, default 40), `color.clip` (fraction, default
//! 0.005), `encode.quality` (1–100, default 85), `write.output` (directory, required).
//!
//! Memory is bounded by a window: `source` keeps at most `window` images in flight
//! and sends the next path when `report` hands back a credit (`report.credit →
//! source`), so a fast decoder cannot pile up gigabytes of pixels in front of a
//! slower filter. The stages' queues ([`IMAGE_QUEUE`]) are larger than the window,
//! and every send waits for room in case they fill anyway.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use leda_core::error::Rejected;
use leda_core::prelude::*;
use leda_core::stage::BindCtx;

use crate::codec::encode_jpeg;
use crate::error::ImageError;
use crate::filters;
use crate::message::{ImageMsg, JpegMsg, Variant};
use crate::steps::{self, Params};

/// `require` / registry names of the stage kinds.
pub mod kinds {
    /// Lists an input directory.
    pub const SOURCE: &str = "leda.stage.image.source";
    /// Reads and decodes a JPEG.
    pub const DECODE: &str = "leda.stage.image.decode";
    /// Selective median.
    pub const DENOISE: &str = "leda.stage.image.denoise";
    /// Histogram stretch.
    pub const COLOR: &str = "leda.stage.image.color";
    /// Half-resolution copy.
    pub const SCALE: &str = "leda.stage.image.scale";
    /// JPEG compression.
    pub const ENCODE: &str = "leda.stage.image.encode";
    /// Writes the files.
    pub const WRITE: &str = "leda.stage.image.write";
    /// Counts outcomes, shows progress, ends the run.
    pub const REPORT: &str = "leda.stage.image.report";
}

/// Queue capacity of the stages that receive decoded images.
pub const IMAGE_QUEUE: usize = 64;

/// Reports a per-image failure on `failed` as `("failed", name, label, why)`, or fails
/// the call when nothing listens.
fn failed(ctx: &mut Ctx, name: &str, label: &str, why: impl std::fmt::Display) -> HandlerResult {
    let why = why.to_string();
    if ctx.has_output("failed") {
        ctx.send_or_wait("failed", ("failed", name, label, why.trim_end()))?;
        Ok(())
    } else {
        Err(why.into())
    }
}

/// The image an event belongs to, and how a failure with it is labelled in `report`:
/// `denoise` for the whole image, `encode half` for one of its two outputs.
struct Owner {
    name: String,
    /// The output, once `scale` has made two of the image.
    output: Option<String>,
}

impl Owner {
    /// The image of an image or JPEG event (`(name, variant, ...)`), whole or one
    /// output of it (`per_output`).
    fn of_event(ev: &Event, per_output: bool) -> Option<Owner> {
        let name = ev.arg(0).and_then(Value::as_str)?.to_owned();
        let output = match per_output {
            true => Some(ev.arg(1).and_then(Value::as_str)?.to_owned()),
            false => None,
        };
        Some(Owner { name, output })
    }

    fn label(&self, stage: &str) -> String {
        match &self.output {
            Some(v) => format!("{stage} {v}"),
            None => stage.to_owned(),
        }
    }
}

/// What a step of one image makes of its event: the events to send on, in order.
type StepResult = Result<Vec<Event>, ImageError>;

/// The handler of one image step of stage `stage`: `step` makes what goes on `port`
/// from the event (`splits`: the two outputs of a whole image, as `scale` does), and
/// every failure of it — an error, a panic, a send that fails (a process lost, an
/// image too large to cross to another process) — becomes the image's `failed`
/// report instead of a failed call that `report` would never hear of (the
/// multi-process layouts end only when `report` has heard of every image). An event
/// that names no image (see [`Owner`]) fails the call.
fn image_step<S>(
    stage: &'static str,
    port: &'static str,
    owner: fn(&Event) -> Option<Owner>,
    splits: bool,
    step: impl Fn(&mut S, Event, &Ctx) -> StepResult + Send + Sync + 'static,
) -> impl Fn(&mut S, Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static {
    move |s: &mut S, ev: Event, ctx: &mut Ctx| {
        let Some(owner) = owner(&ev) else {
            return Err(Box::new(ImageError::BadEvent(format!(
                "{stage}: the event names no image: {ev}"
            ))));
        };
        let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(s, ev, ctx)))
        {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return failed(ctx, &owner.name, &owner.label(stage), e),
            Err(panic) => {
                let why = leda_core::text::panic_message(&panic);
                return failed(ctx, &owner.name, &owner.label(stage), why);
            }
        };
        // A send that fails loses what the event carries: the image, or one output.
        let out = out.into_iter().map(|ev| {
            let label = match (&owner.output, splits) {
                (None, true) => {
                    Owner::of_event(&ev, true).map_or(stage.to_owned(), |o| o.label(stage))
                }
                _ => owner.label(stage),
            };
            (label, ev)
        });
        let name = owner.name.clone();
        forward(ctx, port, name, out)
    }
}

/// Sends `events` on `port` in order, each waiting for room (without holding a thread);
/// one that cannot be sent is reported as a failure of image `name` under its label,
/// and the others still go.
fn forward(
    ctx: &mut Ctx,
    port: &'static str,
    name: String,
    events: impl Iterator<Item = (String, Event)>,
) -> HandlerResult {
    let mut events = events;
    while let Some((label, ev)) = events.next() {
        match ctx.try_send(port, ev) {
            Ok(()) => {}
            Err(Rejected {
                error: SendError::QueueFull { .. },
                event,
            }) => {
                // Full: the rest waits for room, after this call.
                let rest: Vec<_> = std::iter::once((label, event)).chain(events).collect();
                let mut c = ctx.clone();
                ctx.wait(async move {
                    for (label, ev) in rest {
                        match c.send_wait(port, ev).await {
                            Ok(()) => {}
                            Err(e @ SendError::Stopped) => return Err(e.into()),
                            Err(e) if c.has_output("failed") => {
                                let why = e.to_string();
                                c.send_wait("failed", ("failed", name.as_str(), label, why))
                                    .await?;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(())
                });
                return Ok(());
            }
            Err(Rejected {
                error: e @ SendError::Stopped,
                ..
            }) => return Err(e.into()),
            Err(r) => failed(ctx, &name, &label, r.error)?,
        }
    }
    Ok(())
}

/// The image of a path sent to `decode`: its file stem.
fn owner_of_path(ev: &Event) -> Option<Owner> {
    let path = ev.arg(0).and_then(Value::as_str)?;
    Some(Owner {
        name: steps::image_name(Path::new(path)),
        output: None,
    })
}

/// The image of an image event before `scale` (the whole image).
fn owner_of_image(ev: &Event) -> Option<Owner> {
    Owner::of_event(ev, false)
}

/// The image and output of an event after `scale`.
fn owner_of_output(ev: &Event) -> Option<Owner> {
    Owner::of_event(ev, true)
}

fn number_attr(a: &Attrs, key: &str, default: f64, lo: f64, hi: f64) -> Result<f64, BoxError> {
    let v = match a.get(key) {
        None | Some(Value::Nil) => return Ok(default),
        Some(v) => v.as_float().ok_or_else(|| {
            ImageError::Setting(format!("attribute '{key}' must be a number, got {v}"))
        })?,
    };
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(Box::new(ImageError::Setting(format!(
            "attribute '{key}' = {v} is outside [{lo}, {hi}]"
        ))))
    }
}

/// The filter settings from a stage's attributes (defaults from [`Params`]).
pub fn params_of(a: &Attrs) -> Result<Params, BoxError> {
    let d = Params::default();
    Ok(Params {
        threshold: number_attr(a, "threshold", f64::from(d.threshold), 0.0, 255.0)? as u8,
        clip: number_attr(a, "clip", d.clip, 0.0, 0.49)?,
        quality: number_attr(a, "quality", f64::from(d.quality), 1.0, 100.0)? as u8,
        max_pixels: number_attr(a, "max_pixels", d.max_pixels as f64, 1.0, 1e15)? as u64,
    })
}

/// Refuses a run whose stage attributes are out of range.
fn check_params(b: &BindCtx<'_>) -> Result<(), String> {
    params_of(b.attrs).map(|_| ()).map_err(|e| e.to_string())
}

/// The state of `source`: files not yet sent, and images in flight.
struct Feeder {
    files: VecDeque<String>,
    window: usize,
    in_flight: usize,
}

impl Feeder {
    /// Sends files while the window allows (all of them without a window).
    fn feed(&mut self, ctx: &mut Ctx) -> HandlerResult {
        while self.window == 0 || self.in_flight < self.window {
            let Some(f) = self.files.pop_front() else {
                break;
            };
            self.in_flight += 1;
            ctx.send_or_wait("file", f)?;
        }
        Ok(())
    }
}

/// `source` (serial): lists the input files of a directory it receives (sorted, see
/// [`list_inputs`]), sends their count on `total`, reports those it refuses on `failed`
/// (stage `source`), then sends the others' paths on `file`. A directory it cannot
/// list is reported on `total` as `("total", 0, dir, why)`.
///
/// With attribute `window = N` (N > 0) at most N images are in flight: a path is sent
/// for each `("next", k)` credit event received (which `report` sends on its
/// `credit` port as images finish). This bounds the memory a fast decoder can fill
/// with decoded images, in every layout, without relying on full queues.
pub fn source() -> Stage {
    Stage::stateful(
        "source",
        |a: &Attrs| -> Result<Feeder, BoxError> {
            let window = number_attr(a, "window", 0.0, 0.0, 1e9)? as usize;
            Ok(Feeder {
                files: VecDeque::new(),
                window,
                in_flight: 0,
            })
        },
        |f: &mut Feeder, ev: Event, ctx: &mut Ctx| {
            if ev.len() == 2 && ev.arg(0).and_then(Value::as_str) == Some("next") {
                let k: u64 = ev.get(1)?;
                f.in_flight = f.in_flight.saturating_sub(k as usize);
                return f.feed(ctx);
            }
            let dir: String = ev.get(0)?;
            let inputs = match list_inputs(Path::new(&dir)) {
                Ok(inputs) => inputs,
                Err(e) if ctx.has_output("total") => {
                    let why = e.to_string();
                    ctx.send_or_wait("total", ("total", 0, dir, why))?;
                    return Ok(());
                }
                Err(e) => return Err(Box::new(e)),
            };
            if ctx.has_output("total") {
                ctx.send_or_wait("total", ("total", inputs.len()))?;
            }
            for input in inputs {
                match input {
                    // (UTF-8: `list_inputs` refuses other names.)
                    Ok(path) => f.files.push_back(path.to_string_lossy().into_owned()),
                    Err(r) if ctx.has_output("failed") => failed(ctx, &r.file, "source", &r.why)?,
                    // (Failing the call would lose the files after it.)
                    Err(r) => tracing::warn!("{}: not processed: {}", r.file, r.why),
                }
            }
            f.feed(ctx)
        },
    )
    .serial()
    .kind(kinds::SOURCE)
}

/// An input file that is not processed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Its file name (one that is not UTF-8 with replacement characters).
    pub file: String,
    /// Why it is not processed.
    pub why: String,
}

/// The inputs of `dir`, sorted by name: its regular files (other entries, such as
/// subdirectories, are not inputs), each to be processed or refused: a name that is
/// not UTF-8, a stem that an earlier file already has (both would write the same
/// `NAME.jpg`: the first keeps it), a symbolic link that leads to no file.
pub fn list_inputs(dir: &Path) -> Result<Vec<Result<PathBuf, Refused>>, ImageError> {
    use std::collections::hash_map::{Entry, HashMap};
    let rd = std::fs::read_dir(dir).map_err(|e| ImageError::io("listing", dir, e))?;
    let mut paths = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| ImageError::io("listing", dir, e))?;
        paths.push(entry.path());
    }
    paths.sort();
    let mut names = HashMap::new();
    let mut inputs = Vec::new();
    for path in paths {
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let refuse = |why: String| {
            Err(Refused {
                file: file.clone(),
                why,
            })
        };
        let input = match std::fs::metadata(&path) {
            Ok(m) if !m.is_file() => continue,
            Err(e) if path.is_symlink() => {
                refuse(format!("a symbolic link that leads to no file ({e})"))
            }
            Err(e) => refuse(ImageError::io("reading", &path, e).to_string()),
            Ok(_) if path.to_str().is_none() => {
                refuse("the file name is not valid UTF-8: rename the file".into())
            }
            Ok(_) => match names.entry(steps::image_name(&path)) {
                Entry::Occupied(first) => refuse(format!(
                    "its output name '{}' is already that of {}: rename one of them",
                    first.key(),
                    first.get()
                )),
                Entry::Vacant(v) => {
                    v.insert(file.clone());
                    Ok(path)
                }
            },
        };
        inputs.push(input);
    }
    Ok(inputs)
}

/// `decode`: reads a JPEG file and sends its pixels (attribute `max_pixels`: larger
/// images fail, see [`steps::MAX_PIXELS`]).
pub fn decode() -> Stage {
    Stage::stateful(
        "decode",
        params_of,
        image_step(
            "decode",
            "image",
            owner_of_path,
            false,
            |p: &mut Params, ev, _| {
                let path = PathBuf::from(
                    ev.get::<String>(0)
                        .map_err(|e| ImageError::BadEvent(e.to_string()))?,
                );
                let img = steps::read_decode(&path, p.max_pixels)?;
                let msg = ImageMsg {
                    name: steps::image_name(&path),
                    variant: Variant::Full,
                    width: img.width,
                    height: img.height,
                    pixels: Bytes::from(img.pixels),
                };
                Ok(vec![msg.into_event()])
            },
        ),
    )
    .bind(check_params)
    .kind(kinds::DECODE)
}

/// `denoise`: the selective median (attribute `threshold`).
pub fn denoise() -> Stage {
    Stage::stateful(
        "denoise",
        params_of,
        image_step(
            "denoise",
            "image",
            owner_of_image,
            false,
            |p: &mut Params, ev, _| {
                let mut msg = ImageMsg::from_event(ev)?;
                msg.pixels = Bytes::from(steps::denoised(
                    &msg.pixels,
                    msg.width,
                    msg.height,
                    p.threshold,
                )?);
                Ok(vec![msg.into_event()])
            },
        ),
    )
    .capacity(IMAGE_QUEUE)
    .bind(check_params)
    .kind(kinds::DENOISE)
}

/// `color`: per-channel histogram stretch (attribute `clip`), in place when this
/// stage holds the only reference to the pixels.
pub fn color() -> Stage {
    Stage::stateful(
        "color",
        params_of,
        image_step(
            "color",
            "image",
            owner_of_image,
            false,
            |p: &mut Params, ev, _| {
                let mut msg = ImageMsg::from_event(ev)?;
                // In place when this stage holds the only reference: in one process the
                // decoder's buffer, across processes the received frame's (its pixels are
                // a slice of it); a copy otherwise.
                msg.pixels = match std::mem::take(&mut msg.pixels).try_into_mut() {
                    Ok(mut px) => {
                        filters::stretch(&mut px, p.clip);
                        px.freeze()
                    }
                    Err(shared) => {
                        let mut px = shared.to_vec();
                        filters::stretch(&mut px, p.clip);
                        Bytes::from(px)
                    }
                };
                Ok(vec![msg.into_event()])
            },
        ),
    )
    .capacity(IMAGE_QUEUE)
    .bind(check_params)
    .kind(kinds::COLOR)
}

/// `scale`: forwards the image and a half-resolution copy of it.
pub fn scale() -> Stage {
    Stage::stateful(
        "scale",
        |_: &Attrs| Ok(()),
        image_step(
            "scale",
            "image",
            owner_of_image,
            true,
            |_: &mut (), ev, _| {
                let msg = ImageMsg::from_event(ev)?;
                let (small, w, h) = filters::half(&msg.pixels, msg.width, msg.height);
                let half = ImageMsg {
                    name: msg.name.clone(),
                    variant: Variant::Half,
                    width: w,
                    height: h,
                    pixels: Bytes::from(small),
                };
                Ok(vec![msg.into_event(), half.into_event()])
            },
        ),
    )
    .capacity(IMAGE_QUEUE)
    .kind(kinds::SCALE)
}

/// `encode`: JPEG compression (attribute `quality`).
pub fn encode() -> Stage {
    Stage::stateful(
        "encode",
        params_of,
        image_step(
            "encode",
            "jpeg",
            owner_of_output,
            true,
            |p: &mut Params, ev, _| {
                let msg = ImageMsg::from_event(ev)?;
                let jpeg = encode_jpeg(&msg.pixels, msg.width, msg.height, p.quality)?;
                let out = JpegMsg {
                    name: msg.name,
                    variant: msg.variant,
                    jpeg: Bytes::from(jpeg),
                };
                Ok(vec![out.into_event()])
            },
        ),
    )
    .capacity(IMAGE_QUEUE)
    .bind(check_params)
    .kind(kinds::ENCODE)
}

/// `write`: writes `OUTPUT/NAME.jpg` and `OUTPUT/half/NAME.jpg` (attribute `output`).
pub fn write() -> Stage {
    Stage::stateful(
        "write",
        |a: &Attrs| -> Result<PathBuf, BoxError> {
            let dir: String = a.get_as("output")?;
            Ok(PathBuf::from(dir))
        },
        image_step(
            "write",
            "written",
            owner_of_output,
            true,
            |dir: &mut PathBuf, ev, ctx| {
                let msg = JpegMsg::from_event(ev)?;
                let path = steps::output_path(dir, &msg.name, msg.variant);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| ImageError::io("creating", parent, e))?;
                }
                steps::write_file(&path, &msg.jpeg)?;
                let written = ("written", msg.name, msg.variant.as_str(), msg.jpeg.len());
                Ok(match ctx.has_output("written") {
                    true => vec![Event::from(written)],
                    false => Vec::new(),
                })
            },
        ),
    )
    .capacity(IMAGE_QUEUE * 2)
    .bind(|b| match b.attrs.get("output") {
        Some(Value::Str(_)) => Ok(()),
        _ => Err("stage 'write' needs the 'output' attribute (a directory)".into()),
    })
    .kind(kinds::WRITE)
}

/// The stage kinds a daemon of this pipeline must be able to build.
pub fn registry() -> leda_net::Registry {
    leda_net::Registry::new()
        .with(kinds::SOURCE, |_| Ok(source()))
        .with(kinds::DECODE, |_| Ok(decode()))
        .with(kinds::DENOISE, |_| Ok(denoise()))
        .with(kinds::COLOR, |_| Ok(color()))
        .with(kinds::SCALE, |_| Ok(scale()))
        .with(kinds::ENCODE, |_| Ok(encode()))
        .with(kinds::WRITE, |_| Ok(write()))
        .with(kinds::REPORT, |_| Ok(crate::report::report(None)))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::generate::{GenOptions, Resolution, generate};
    use crate::report::{Summary, report};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("leda-image-st-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A send that fails in a middle stage (here: its port is not connected) is that
    /// image's failure, reported to `report`, not a failed call it never hears of (a
    /// review, 2026-11-27: an image too large to cross to another process failed
    /// `denoise`'s call, and the multi-process layouts waited for it for ever).
    #[test]
    fn a_failed_send_is_reported_as_the_images_failure() {
        let dir = scratch("send");
        let opts = GenOptions {
            count: 3,
            resolution: Resolution::Custom(8, 8),
            ..GenOptions::default()
        };
        generate(&dir, &opts).unwrap();
        let sink = Arc::new(Mutex::new(Summary::default()));
        let (source, decode, denoise) = (source(), decode(), denoise());
        let report = report(Some(sink.clone())).attr("progress", false);
        let mut g = Graph::new("send");
        g.connect(&source, "file", &decode);
        g.connect(&source, "total", &report);
        g.connect(&decode, "image", &denoise);
        for st in [&source, &decode, &denoise] {
            g.connect(st, "failed", &report);
        }
        source.push(dir.to_string_lossy().into_owned());
        g.run(Run::default().threads(2).until_idle()).unwrap();
        let s = sink.lock().unwrap().clone();
        assert_eq!((s.total, s.done, s.failed), (Some(3), 0, 3), "{s:?}");
        for (k, e) in s.errors.iter().enumerate() {
            let why = ": denoise: port 'image' of stage 'denoise' is not connected";
            assert!(e.starts_with("img_0000") && e.ends_with(why), "{k}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a `failed` connection, a refused input is logged and the files after it
    /// are still sent (failing the call lost them).
    #[test]
    fn a_refused_input_loses_no_other_file_without_failed() {
        let dir = scratch("nofailed");
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["a.jpg", "dup.jpeg", "dup.jpg", "z.jpg"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        let sink = Stage::new("sink", move |ev: Event, _: &mut Ctx| {
            seen.lock().unwrap().push(ev.get::<String>(0)?);
            Ok(())
        });
        let source = source();
        let mut g = Graph::new("nofailed");
        g.connect(&source, "file", &sink);
        source.push(dir.to_string_lossy().into_owned());
        g.run(Run::default().threads(1).until_idle()).unwrap();
        let mut got: Vec<_> = got
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.rsplit('/').next().unwrap().to_owned())
            .collect();
        got.sort();
        assert_eq!(got, ["a.jpg", "dup.jpeg", "z.jpg"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Inputs that would write the same outputs, or cannot be read as named, are refused
    /// by name, with the reason; the others are listed in order.
    #[test]
    fn inputs_that_cannot_be_processed_are_refused_with_the_reason() {
        use std::os::unix::ffi::OsStrExt;
        let dir = scratch("list");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in ["a.jpg", "dup.jpeg", "dup.jpg", "dup"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        std::fs::write(dir.join(std::ffi::OsStr::from_bytes(b"caf\xe9.jpg")), b"x").unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere.jpg"), dir.join("dangling.jpg")).unwrap();
        let got: Vec<_> = list_inputs(&dir)
            .unwrap()
            .into_iter()
            .map(|i| match i {
                Ok(p) => p.file_name().unwrap().to_string_lossy().into_owned(),
                Err(r) => format!("{}: {}", r.file, r.why),
            })
            .collect();
        assert_eq!(got.len(), 6, "{got:?}");
        assert_eq!(got[0], "a.jpg");
        assert!(
            got[1].starts_with("caf\u{fffd}.jpg: the file name is not valid UTF-8"),
            "{got:?}"
        );
        assert!(
            got[2].starts_with("dangling.jpg: a symbolic link that leads to no file"),
            "{got:?}"
        );
        assert_eq!(got[3], "dup");
        assert_eq!(
            got[4],
            "dup.jpeg: its output name 'dup' is already that of dup: rename one of them"
        );
        assert_eq!(
            got[5],
            "dup.jpg: its output name 'dup' is already that of dup: rename one of them"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
