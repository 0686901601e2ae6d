//! Colour correction by histogram stretch on each channel separately: the levels
//! below the `clip` quantile map to 0, those above the `1 - clip` quantile to 255,
//! and the levels in between spread linearly over the full range.

use super::CHANNELS;

/// The clipped black and white level of each channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StretchLevels {
    /// Per channel: the highest level mapped to 0.
    pub low: [u8; CHANNELS],
    /// Per channel: the lowest level mapped to 255.
    pub high: [u8; CHANNELS],
}

/// Per-channel histograms of an RGB8 buffer. Four partial tables per channel break the
/// store-to-load dependency when neighbouring pixels share a level.
fn histograms(data: &[u8]) -> [[u32; 256]; CHANNELS] {
    let mut part = [[[0u32; 256]; CHANNELS]; 4];
    let mut quads = data.chunks_exact(4 * CHANNELS);
    for q in &mut quads {
        for (k, px) in q.chunks_exact(CHANNELS).enumerate() {
            for c in 0..CHANNELS {
                part[k][c][px[c] as usize] += 1;
            }
        }
    }
    for px in quads.remainder().chunks_exact(CHANNELS) {
        for c in 0..CHANNELS {
            part[0][c][px[c] as usize] += 1;
        }
    }
    let mut h = [[0u32; 256]; CHANNELS];
    for p in &part {
        for (hc, pc) in h.iter_mut().zip(p) {
            for (a, b) in hc.iter_mut().zip(pc) {
                *a += *b;
            }
        }
    }
    h
}

/// The clipped levels of `data` (RGB8): per channel, `low` is the first level where
/// more than `clip` of the pixels lie at or below it, `high` the last level where
/// more than `clip` lie at or above it. `clip` is a fraction (0.005 clips 0.5% at
/// each end) and is limited to `[0, 0.49]`.
pub fn stretch_levels(data: &[u8], clip: f64) -> StretchLevels {
    let hist = histograms(data);
    let pixels = (data.len() / CHANNELS) as f64;
    let clip_count = (pixels * clip.clamp(0.0, 0.49)).floor() as u64;
    let mut low = [0u8; CHANNELS];
    let mut high = [255u8; CHANNELS];
    // The first level (from the bottom, then from the top) past the clipped count.
    fn past<'a>(levels: impl Iterator<Item = (usize, &'a u32)>, clip_count: u64) -> Option<u8> {
        let mut seen = 0u64;
        let mut levels = levels;
        levels
            .find(|(_, n)| {
                seen += u64::from(**n);
                seen > clip_count
            })
            .map(|(v, _)| v as u8)
    }
    for (c, h) in hist.iter().enumerate() {
        if let Some(v) = past(h.iter().enumerate(), clip_count) {
            low[c] = v;
        }
        if let Some(v) = past(h.iter().enumerate().rev(), clip_count) {
            high[c] = v;
        }
    }
    StretchLevels { low, high }
}

/// The lookup table mapping `low` to 0 and `high` to 255 (identity if `high <= low`).
fn lut(low: u8, high: u8) -> [u8; 256] {
    let mut t = [0u8; 256];
    if high <= low {
        for (v, e) in t.iter_mut().enumerate() {
            *e = v as u8;
        }
        return t;
    }
    let (lo, span) = (u32::from(low), u32::from(high - low));
    for (v, e) in t.iter_mut().enumerate() {
        let v = v as u32;
        *e = if v <= lo {
            0
        } else if v >= lo + span {
            255
        } else {
            (((v - lo) * 255 + span / 2) / span) as u8
        };
    }
    t
}

/// Stretches each channel of `data` (RGB8) in place and returns the levels used.
pub fn stretch(data: &mut [u8], clip: f64) -> StretchLevels {
    let levels = stretch_levels(data, clip);
    let tables: [[u8; 256]; CHANNELS] = std::array::from_fn(|c| lut(levels.low[c], levels.high[c]));
    for px in data.chunks_exact_mut(CHANNELS) {
        px[0] = tables[0][px[0] as usize];
        px[1] = tables[1][px[1] as usize];
        px[2] = tables[2][px[2] as usize];
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_min_and_max_map_to_0_and_255() {
        // 1000 pixels: red spans 50..=150 with one outlier at each end; the outliers
        // fall in the 0.5% clip, so 50 -> 0 and 150 -> 255.
        let mut data = Vec::new();
        for i in 0..1000u32 {
            let r = match i {
                0 => 0,
                1 => 255,
                _ => 50 + (i % 101) as u8,
            };
            data.extend_from_slice(&[r, 100, (i % 256) as u8]);
        }
        let levels = stretch(&mut data, 0.005);
        assert_eq!(levels.low[0], 50);
        assert_eq!(levels.high[0], 150);
        let reds: Vec<u8> = data.chunks_exact(3).map(|p| p[0]).collect();
        assert_eq!(reds[0], 0, "clipped low outlier");
        assert_eq!(reds[1], 255, "clipped high outlier");
        for (i, &r) in reds.iter().enumerate().skip(2) {
            let src = 50 + (i as u32 % 101);
            if src == 50 {
                assert_eq!(r, 0);
            }
            if src == 150 {
                assert_eq!(r, 255);
            }
        }
        // A flat channel is left alone.
        assert!(data.chunks_exact(3).all(|p| p[1] == 100));
    }

    #[test]
    fn stretch_is_monotonic() {
        let t = lut(30, 200);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!((t[30], t[200], t[115]), (0, 255, 128));
    }

    #[test]
    fn zero_clip_uses_true_extremes() {
        let mut data = vec![10, 20, 30, 110, 120, 130];
        let l = stretch(&mut data, 0.0);
        assert_eq!(l.low, [10, 20, 30]);
        assert_eq!(l.high, [110, 120, 130]);
        assert_eq!(data, vec![0, 0, 0, 255, 255, 255]);
    }
}
