//! The three image filters, as plain functions over packed RGB8 buffers (3 bytes per
//! pixel, rows without padding). They are shared by the Leda stages and by the
//! sequential and rayon baselines, so the benchmark compares schedulers, not filters.
//!
//! Every filter works row by row over byte slices of equal length, with no allocation
//! per pixel, so the inner loops auto-vectorize.

pub mod color;
pub mod denoise;
pub mod scale;

pub use color::{StretchLevels, stretch, stretch_levels};
pub use denoise::denoise;
pub use scale::{half, half_size};

/// Bytes per pixel of every buffer the filters take (RGB8).
pub const CHANNELS: usize = 3;

/// Checks that `data` holds `width × height` RGB8 pixels.
pub fn check_len(data: &[u8], width: u32, height: u32) -> Result<(), crate::ImageError> {
    let want = width as usize * height as usize * CHANNELS;
    if data.len() == want && width > 0 && height > 0 {
        Ok(())
    } else {
        Err(crate::ImageError::BadBuffer {
            width,
            height,
            len: data.len(),
        })
    }
}
