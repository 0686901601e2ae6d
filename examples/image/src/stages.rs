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
//! `failed` carries `("failed", name, stage, message)`: a per-image error goes there
//! and the run goes on; when `failed` is not connected the error fails the handler
//! call instead (counted and logged by the runtime).
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
//! and every send is a `send_or_wait` in case they fill anyway.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use bytes::Bytes;
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

/// Reports a per-image failure on `failed`, or fails the call when nothing listens.
fn failed(ctx: &mut Ctx, name: &str, stage: &str, err: ImageError) -> HandlerResult {
    if ctx.has_output("failed") {
        ctx.send_or_wait(
            "failed",
            ("failed", name, stage, err.to_string().trim_end().to_owned()),
        )?;
        Ok(())
    } else {
        Err(Box::new(err))
    }
}

/// Reads an image event; a malformed one fails the call (it names no image).
fn image_of(ev: Event) -> Result<ImageMsg, BoxError> {
    Ok(ImageMsg::from_event(ev)?)
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

/// `source` (serial): lists the regular files of a directory it receives (sorted),
/// sends their count on `total`, then their paths on `file`.
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
            match list_files(Path::new(&dir)) {
                Ok(files) => {
                    if ctx.has_output("total") {
                        ctx.send_or_wait("total", ("total", files.len()))?;
                    }
                    f.files
                        .extend(files.into_iter().map(|p| p.to_string_lossy().into_owned()));
                    f.feed(ctx)
                }
                Err(e) => {
                    failed(ctx, &dir, "source", e)?;
                    if ctx.has_output("total") {
                        ctx.send_or_wait("total", ("total", 0))?;
                    }
                    Ok(())
                }
            }
        },
    )
    .serial()
    .kind(kinds::SOURCE)
}

/// The regular files of `dir`, sorted by name.
pub fn list_files(dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ImageError::io("listing", dir, e))?;
    let mut files = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| ImageError::io("listing", dir, e))?;
        let path = entry.path();
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `decode`: reads a JPEG file and sends its pixels (attribute `max_pixels`: larger
/// images fail, see [`steps::MAX_PIXELS`]).
pub fn decode() -> Stage {
    Stage::stateful(
        "decode",
        params_of,
        |p: &mut Params, ev: Event, ctx: &mut Ctx| {
            let path = PathBuf::from(ev.get::<String>(0)?);
            let name = steps::image_name(&path);
            match steps::read_decode(&path, p.max_pixels) {
                Ok(img) => {
                    let msg = ImageMsg {
                        name,
                        variant: Variant::Full,
                        width: img.width,
                        height: img.height,
                        pixels: Bytes::from(img.pixels),
                    };
                    ctx.send_or_wait("image", msg.into_event())?;
                    Ok(())
                }
                Err(e) => failed(ctx, &name, "decode", e),
            }
        },
    )
    .bind(check_params)
    .kind(kinds::DECODE)
}

/// `denoise`: the selective median (attribute `threshold`).
pub fn denoise() -> Stage {
    Stage::stateful(
        "denoise",
        params_of,
        |p: &mut Params, ev: Event, ctx: &mut Ctx| {
            let mut msg = image_of(ev)?;
            match steps::denoised(&msg.pixels, msg.width, msg.height, p.threshold) {
                Ok(px) => {
                    msg.pixels = Bytes::from(px);
                    ctx.send_or_wait("image", msg.into_event())?;
                    Ok(())
                }
                Err(e) => failed(ctx, &msg.name, "denoise", e),
            }
        },
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
        |p: &mut Params, ev: Event, ctx: &mut Ctx| {
            let mut msg = image_of(ev)?;
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
            ctx.send_or_wait("image", msg.into_event())?;
            Ok(())
        },
    )
    .capacity(IMAGE_QUEUE)
    .bind(check_params)
    .kind(kinds::COLOR)
}

/// `scale`: forwards the image and a half-resolution copy of it.
pub fn scale() -> Stage {
    Stage::new("scale", |ev: Event, ctx: &mut Ctx| {
        let msg = image_of(ev)?;
        let (small, w, h) = filters::half(&msg.pixels, msg.width, msg.height);
        let half = ImageMsg {
            name: msg.name.clone(),
            variant: Variant::Half,
            width: w,
            height: h,
            pixels: Bytes::from(small),
        };
        ctx.send_or_wait("image", msg.into_event())?;
        ctx.send_or_wait("image", half.into_event())?;
        Ok(())
    })
    .capacity(IMAGE_QUEUE)
    .kind(kinds::SCALE)
}

/// `encode`: JPEG compression (attribute `quality`).
pub fn encode() -> Stage {
    Stage::stateful(
        "encode",
        params_of,
        |p: &mut Params, ev: Event, ctx: &mut Ctx| {
            let msg = image_of(ev)?;
            match encode_jpeg(&msg.pixels, msg.width, msg.height, p.quality) {
                Ok(jpeg) => {
                    let out = JpegMsg {
                        name: msg.name,
                        variant: msg.variant,
                        jpeg: Bytes::from(jpeg),
                    };
                    ctx.send_or_wait("jpeg", out.into_event())?;
                    Ok(())
                }
                Err(e) => failed(ctx, &msg.name, "encode", e),
            }
        },
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
        |dir: &mut PathBuf, ev: Event, ctx: &mut Ctx| {
            let msg = JpegMsg::from_event(ev)?;
            let path = steps::output_path(dir, &msg.name, msg.variant);
            let res = match path.parent() {
                Some(parent) => std::fs::create_dir_all(parent)
                    .map_err(|e| ImageError::io("creating", parent, e))
                    .and_then(|()| steps::write_file(&path, &msg.jpeg)),
                None => steps::write_file(&path, &msg.jpeg),
            };
            match res {
                Ok(()) => {
                    if ctx.has_output("written") {
                        ctx.send_or_wait(
                            "written",
                            ("written", msg.name, msg.variant.as_str(), msg.jpeg.len()),
                        )?;
                    }
                    Ok(())
                }
                Err(e) => failed(
                    ctx,
                    &msg.name,
                    &format!("write {}", msg.variant.as_str()),
                    e,
                ),
            }
        },
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
