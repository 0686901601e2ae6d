//! The synthetic workload: seeded, photo-like JPEGs (smooth colour gradients, filled
//! shapes, a fine texture, and salt-and-pepper impulse noise for the denoiser) at the
//! thesis' three resolutions.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::codec::encode_jpeg;
use crate::error::ImageError;

/// The thesis' image sizes (§14.1): about 260 kilopixels, 1 and 8 megapixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// 624×416 = 259,584 pixels.
    Low,
    /// 1152×864 = 995,328 pixels.
    Medium,
    /// 3456×2304 = 7,962,624 pixels.
    High,
    /// Any size (tests).
    Custom(u32, u32),
}

impl Resolution {
    /// Width and height in pixels.
    pub fn size(self) -> (u32, u32) {
        match self {
            Resolution::Low => (624, 416),
            Resolution::Medium => (1152, 864),
            Resolution::High => (3456, 2304),
            Resolution::Custom(w, h) => (w, h),
        }
    }
}

impl std::str::FromStr for Resolution {
    type Err = ImageError;
    /// `260k`, `1m`, `8m`, or `WIDTHxHEIGHT`.
    fn from_str(s: &str) -> Result<Self, ImageError> {
        match s.to_ascii_lowercase().as_str() {
            "260k" | "low" => Ok(Resolution::Low),
            "1m" | "medium" => Ok(Resolution::Medium),
            "8m" | "high" => Ok(Resolution::High),
            other => {
                let bad = || {
                    ImageError::Setting(format!(
                        "resolution '{s}': expected 260k, 1m, 8m or WIDTHxHEIGHT"
                    ))
                };
                let (w, h) = other.split_once('x').ok_or_else(bad)?;
                let (w, h): (u32, u32) =
                    (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
                if w == 0 || h == 0 || u64::from(w) * u64::from(h) > 100_000_000 {
                    return Err(bad());
                }
                Ok(Resolution::Custom(w, h))
            }
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Number of images (default 500, the thesis' count).
    pub count: usize,
    /// Image size.
    pub resolution: Resolution,
    /// Seed: the same seed gives the same files.
    pub seed: u64,
    /// Fraction of pixels hit by salt-and-pepper noise.
    pub noise: f64,
    /// JPEG quality of the generated files.
    pub quality: u8,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            count: 500,
            resolution: Resolution::Medium,
            seed: 1,
            noise: 0.01,
            quality: 90,
        }
    }
}

/// SplitMix64: small, seedable, good enough for test images.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn colour(&mut self) -> [i32; 3] {
        let v = self.next();
        [
            (v & 255) as i32,
            ((v >> 8) & 255) as i32,
            ((v >> 16) & 255) as i32,
        ]
    }
}

/// The pixels (RGB8) of synthetic image number `index` under `seed`.
pub fn synth(width: u32, height: u32, seed: u64, index: u64, noise: f64) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut rng = Rng(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407));
    let mut px = vec![0u8; w * h * 3];
    // Background: a bilinear gradient between four corner colours, with a texture
    // of two crossed waves (tables per row and column, no trigonometry per pixel).
    let corners = [rng.colour(), rng.colour(), rng.colour(), rng.colour()];
    let (fx, fy) = (2 + rng.below(30) as usize, 2 + rng.below(30) as usize);
    let wave = |n: usize, period: usize| -> Vec<i32> {
        (0..n)
            .map(|i| {
                (12.0 * (i as f64 * std::f64::consts::TAU / (period as f64 * 4.0)).sin()) as i32
            })
            .collect()
    };
    let (wx, wy) = (wave(w, fx), wave(h, fy));
    let wd = (w.max(2) - 1) as i32;
    let hd = (h.max(2) - 1) as i32;
    let mut grain = rng.next() | 1;
    for y in 0..h {
        let ty = y as i32;
        let left: [i32; 3] =
            std::array::from_fn(|c| corners[0][c] + (corners[2][c] - corners[0][c]) * ty / hd);
        let right: [i32; 3] =
            std::array::from_fn(|c| corners[1][c] + (corners[3][c] - corners[1][c]) * ty / hd);
        let row = &mut px[y * w * 3..(y + 1) * w * 3];
        for (x, p) in row.chunks_exact_mut(3).enumerate() {
            grain ^= grain << 13;
            grain ^= grain >> 7;
            grain ^= grain << 17;
            let t = wx[x] + wy[y] + ((grain & 15) as i32 - 8);
            for c in 0..3 {
                let base = left[c] + (right[c] - left[c]) * x as i32 / wd;
                p[c] = (base + t).clamp(0, 255) as u8;
            }
        }
    }
    // Shapes: filled rectangles and discs in solid colours.
    let shapes = 4 + rng.below(8);
    for _ in 0..shapes {
        let col = rng.colour();
        let col = [col[0] as u8, col[1] as u8, col[2] as u8];
        let (cx, cy) = (rng.below(w as u64) as i64, rng.below(h as u64) as i64);
        let r = (1 + rng.below((w.min(h) / 4).max(1) as u64)) as i64;
        let disc = rng.next() & 1 == 0;
        let (y0, y1) = ((cy - r).max(0), (cy + r).min(h as i64 - 1));
        for y in y0..=y1 {
            let half = if disc {
                let dy = y - cy;
                ((r * r - dy * dy) as f64).sqrt() as i64
            } else {
                r * 3 / 2
            };
            let (x0, x1) = ((cx - half).max(0), (cx + half).min(w as i64 - 1));
            if x0 > x1 {
                continue;
            }
            let row =
                &mut px[(y as usize * w + x0 as usize) * 3..(y as usize * w + x1 as usize + 1) * 3];
            for p in row.chunks_exact_mut(3) {
                p.copy_from_slice(&col);
            }
        }
    }
    // Salt and pepper.
    let hits = ((w * h) as f64 * noise.clamp(0.0, 1.0)) as usize;
    for _ in 0..hits {
        let i = rng.below((w * h) as u64) as usize;
        let v = if rng.next() & 1 == 0 { 0 } else { 255 };
        px[i * 3..i * 3 + 3].fill(v);
    }
    px
}

/// The file name of image `i` (1-based).
pub fn file_name(i: usize) -> String {
    format!("img_{i:05}.jpg")
}

/// Writes `opts.count` synthetic JPEGs into `dir` (created if missing), in parallel,
/// and returns their paths in order.
pub fn generate(dir: &Path, opts: &GenOptions) -> Result<Vec<PathBuf>, ImageError> {
    std::fs::create_dir_all(dir).map_err(|e| ImageError::io("creating", dir, e))?;
    let (w, h) = opts.resolution.size();
    (1..=opts.count)
        .into_par_iter()
        .map(|i| {
            let px = synth(w, h, opts.seed, i as u64, opts.noise);
            let jpeg = encode_jpeg(&px, w, h, opts.quality)?;
            let path = dir.join(file_name(i));
            std::fs::write(&path, jpeg).map_err(|e| ImageError::io("writing", &path, e))?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_image_other_seed_other_image() {
        let a = synth(64, 48, 7, 1, 0.01);
        assert_eq!(a, synth(64, 48, 7, 1, 0.01));
        assert_ne!(a, synth(64, 48, 8, 1, 0.01));
        assert_ne!(a, synth(64, 48, 7, 2, 0.01));
    }

    #[test]
    fn noise_adds_impulses() {
        let px = synth(100, 100, 3, 1, 0.05);
        let impulses = px
            .chunks_exact(3)
            .filter(|p| p == &[0, 0, 0] || p == &[255, 255, 255])
            .count();
        assert!(impulses >= 300, "{impulses} impulse pixels");
    }

    #[test]
    fn resolutions_parse() {
        assert_eq!("1m".parse::<Resolution>().unwrap().size(), (1152, 864));
        assert_eq!("260K".parse::<Resolution>().unwrap(), Resolution::Low);
        assert_eq!(
            "30x20".parse::<Resolution>().unwrap(),
            Resolution::Custom(30, 20)
        );
        assert!("0x20".parse::<Resolution>().is_err());
        assert!("big".parse::<Resolution>().is_err());
        let mp = |r: Resolution| r.size().0 as f64 * r.size().1 as f64 / 1e6;
        assert!((mp(Resolution::Low) - 0.26).abs() < 0.01);
        assert!((mp(Resolution::Medium) - 1.0).abs() < 0.01);
        assert!((mp(Resolution::High) - 8.0).abs() < 0.1);
    }
}
