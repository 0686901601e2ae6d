//! The per-image steps, shared by the Leda stages and by the sequential and rayon
//! baselines: read and decode, denoise, colour-correct, scale, encode, write.

use std::path::{Path, PathBuf};

use crate::codec::{Rgb, decode_jpeg, encode_jpeg};
use crate::error::ImageError;
use crate::filters;
use crate::message::Variant;

/// Filter and encoder settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Denoise: replace a channel value by the 3×3 median when it deviates by more.
    pub threshold: u8,
    /// Colour: fraction of pixels clipped at each end of each channel's histogram.
    pub clip: f64,
    /// JPEG quality of the outputs.
    pub quality: u8,
    /// Decode: the most pixels an input may have (see [`MAX_PIXELS`]).
    pub max_pixels: u64,
}

/// The default of [`Params::max_pixels`]: about 90 million (Pillow's threshold for a
/// decompression bomb, ~9,500 × 9,500). An image in flight takes about 7 bytes per
/// pixel at its peak (decoded, denoised, half-size copy), so the memory of a run is
/// bounded by its window (images in flight) times 7 × this, ~630 MB per image.
pub const MAX_PIXELS: u64 = 90_000_000;

impl Default for Params {
    fn default() -> Self {
        Params {
            threshold: 40,
            clip: 0.005,
            quality: 85,
            max_pixels: MAX_PIXELS,
        }
    }
}

/// The image name of an input path: its file stem.
pub fn image_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Where an output goes: `DIR/NAME.jpg` for the full-size image, `DIR/half/NAME.jpg`
/// for the half-resolution copy.
pub fn output_path(dir: &Path, name: &str, variant: Variant) -> PathBuf {
    match variant {
        Variant::Full => dir.join(format!("{name}.jpg")),
        Variant::Half => dir.join("half").join(format!("{name}.jpg")),
    }
}

/// Creates the output directory and its `half/` subdirectory, failing clearly when
/// the location is not writable.
pub fn prepare_output(dir: &Path) -> Result<(), ImageError> {
    let half = dir.join("half");
    std::fs::create_dir_all(&half).map_err(|e| ImageError::io("creating", &half, e))?;
    let probe = dir.join(".leda-image-write-test");
    std::fs::write(&probe, b"").map_err(|e| ImageError::io("writing into", dir, e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Reads and decodes one JPEG file of at most `max_pixels` pixels.
pub fn read_decode(path: &Path, max_pixels: u64) -> Result<Rgb, ImageError> {
    let bytes = std::fs::read(path).map_err(|e| ImageError::io("reading", path, e))?;
    decode_jpeg(&bytes, max_pixels)
}

/// The selective median of `src` into a new buffer.
pub fn denoised(src: &[u8], width: u32, height: u32, threshold: u8) -> Result<Vec<u8>, ImageError> {
    filters::check_len(src, width, height)?;
    let mut dst = vec![0u8; src.len()];
    filters::denoise(src, &mut dst, width, height, threshold);
    Ok(dst)
}

/// Writes `data` to `path`.
pub fn write_file(path: &Path, data: &[u8]) -> Result<(), ImageError> {
    std::fs::write(path, data).map_err(|e| ImageError::io("writing", path, e))
}

/// The whole pipeline on one file, in the calling thread (the baselines' unit of
/// work): returns the bytes written.
pub fn process_file(path: &Path, out: &Path, p: &Params) -> Result<u64, ImageError> {
    let name = image_name(path);
    let Rgb {
        width,
        height,
        pixels,
    } = read_decode(path, p.max_pixels)?;
    let mut px = denoised(&pixels, width, height, p.threshold)?;
    drop(pixels);
    filters::stretch(&mut px, p.clip);
    let (small, sw, sh) = filters::half(&px, width, height);
    let full_jpeg = encode_jpeg(&px, width, height, p.quality)?;
    let half_jpeg = encode_jpeg(&small, sw, sh, p.quality)?;
    write_file(&output_path(out, &name, Variant::Full), &full_jpeg)?;
    write_file(&output_path(out, &name, Variant::Half), &half_jpeg)?;
    Ok((full_jpeg.len() + half_jpeg.len()) as u64)
}
