//! Selective median filter: a pixel channel is replaced by the median of its 3×3
//! neighbourhood only when it differs from that median by more than a threshold, so
//! impulse noise (salt and pepper) goes while edges and fine texture stay.
//!
//! The median of nine is computed as the median of three column-sorted triples: each
//! column of the window is sorted once per row (low, middle, high), then
//! `median9 = med3(max(lows), med3(middles), min(highs))`. Channels are interleaved,
//! so the horizontal neighbours of byte `i` are bytes `i - 3` and `i + 3`; the whole
//! row is one flat loop of `min`/`max` on `u8`, which the compiler vectorizes.

use super::CHANNELS;

#[inline(always)]
fn med3(a: u8, b: u8, c: u8) -> u8 {
    a.max(b).min(a.min(b).max(c))
}

/// Sorts the three rows column by column into `lo`, `mid`, `hi`.
fn sort_columns(top: &[u8], cen: &[u8], bot: &[u8], lo: &mut [u8], mid: &mut [u8], hi: &mut [u8]) {
    let n = top.len();
    let (cen, bot, lo, mid, hi) = (
        &cen[..n],
        &bot[..n],
        &mut lo[..n],
        &mut mid[..n],
        &mut hi[..n],
    );
    for i in 0..n {
        let (a, b, c) = (top[i], cen[i], bot[i]);
        let (a, b) = (a.min(b), a.max(b));
        let (b, c) = (b.min(c), b.max(c));
        let (a, b) = (a.min(b), a.max(b));
        lo[i] = a;
        mid[i] = b;
        hi[i] = c;
    }
}

/// Filters one interior row: `out[i]` for `i` in `3..len-3`.
fn filter_row(cen: &[u8], lo: &[u8], mid: &[u8], hi: &[u8], threshold: u8, out: &mut [u8]) {
    const C: usize = CHANNELS;
    let n = cen.len();
    if n <= 2 * C {
        return;
    }
    let m = n - 2 * C;
    // Equal-length windows: the bounds checks go and the loop vectorizes.
    let (l0, l1, l2) = (&lo[..m], &lo[C..C + m], &lo[2 * C..2 * C + m]);
    let (m0, m1, m2) = (&mid[..m], &mid[C..C + m], &mid[2 * C..2 * C + m]);
    let (h0, h1, h2) = (&hi[..m], &hi[C..C + m], &hi[2 * C..2 * C + m]);
    let c = &cen[C..C + m];
    let o = &mut out[C..C + m];
    for i in 0..m {
        let low = l0[i].max(l1[i]).max(l2[i]);
        let high = h0[i].min(h1[i]).min(h2[i]);
        let med = med3(low, med3(m0[i], m1[i], m2[i]), high);
        let v = c[i];
        o[i] = if v.abs_diff(med) > threshold { med } else { v };
    }
}

/// Writes into `dst` the selective 3×3 median of `src` (`width × height` RGB8):
/// each channel value that differs from its neighbourhood median by more than
/// `threshold` becomes the median. The one-pixel border is copied unchanged.
///
/// # Panics
///
/// If `src` or `dst` is not `width * height * 3` bytes long (check with
/// [`super::check_len`] first).
pub fn denoise(src: &[u8], dst: &mut [u8], width: u32, height: u32, threshold: u8) {
    let (w, h) = (width as usize, height as usize);
    let stride = w * CHANNELS;
    assert_eq!(src.len(), stride * h, "source size");
    assert_eq!(dst.len(), stride * h, "destination size");
    dst.copy_from_slice(src);
    if w < 3 || h < 3 {
        return;
    }
    // Three scratch rows for the whole image: no allocation per pixel or per row.
    let mut scratch = vec![0u8; 3 * stride];
    let (lo, rest) = scratch.split_at_mut(stride);
    let (mid, hi) = rest.split_at_mut(stride);
    for y in 1..h - 1 {
        let top = &src[(y - 1) * stride..y * stride];
        let cen = &src[y * stride..(y + 1) * stride];
        let bot = &src[(y + 1) * stride..(y + 2) * stride];
        sort_columns(top, cen, bot, lo, mid, hi);
        filter_row(
            cen,
            lo,
            mid,
            hi,
            threshold,
            &mut dst[y * stride..(y + 1) * stride],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_median(src: &[u8], w: usize, x: usize, y: usize, c: usize) -> u8 {
        let mut v = Vec::with_capacity(9);
        for dy in 0..3 {
            for dx in 0..3 {
                v.push(src[((y + dy - 1) * w + (x + dx - 1)) * 3 + c]);
            }
        }
        v.sort_unstable();
        v[4]
    }

    #[test]
    fn matches_a_naive_median_where_it_replaces() {
        let (w, h) = (17usize, 11usize);
        let mut s = 12345u32;
        let src: Vec<u8> = (0..w * h * 3)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 24) as u8
            })
            .collect();
        let mut dst = vec![0; src.len()];
        denoise(&src, &mut dst, w as u32, h as u32, 0);
        for y in 1..h - 1 {
            for x in 1..w - 1 {
                for c in 0..3 {
                    let i = (y * w + x) * 3 + c;
                    assert_eq!(dst[i], naive_median(&src, w, x, y, c), "({x},{y},{c})");
                }
            }
        }
    }

    #[test]
    fn removes_salt_and_pepper_and_keeps_edges() {
        // Left half dark (40), right half bright (200): a vertical edge at x = 8.
        let (w, h) = (16usize, 12usize);
        let mut img = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                let v = if x < 8 { 40 } else { 200 };
                img[(y * w + x) * 3..(y * w + x) * 3 + 3].fill(v);
            }
        }
        let clean = img.clone();
        // Salt and pepper on interior pixels, away from each other.
        let noisy = [
            (3, 3, 255u8),
            (5, 8, 0),
            (11, 4, 0),
            (13, 9, 255),
            (7, 6, 255),
        ];
        for &(x, y, v) in &noisy {
            img[(y * w + x) * 3..(y * w + x) * 3 + 3].fill(v);
        }
        let mut out = vec![0; img.len()];
        denoise(&img, &mut out, w as u32, h as u32, 30);
        let diff: Vec<usize> = (0..out.len())
            .filter(|&i| out[i] != clean[i])
            .map(|i| i / 3)
            .collect();
        assert!(
            diff.is_empty(),
            "pixels differ: {:?}",
            diff.iter().map(|i| (i % w, i / w)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn small_deviations_are_kept() {
        let (w, h) = (5usize, 5usize);
        let mut img = vec![100u8; w * h * 3];
        img[(2 * w + 2) * 3] = 120; // deviates by 20 < threshold
        let mut out = vec![0; img.len()];
        denoise(&img, &mut out, w as u32, h as u32, 30);
        assert_eq!(out, img);
    }

    #[test]
    fn tiny_images_are_copied() {
        let img = vec![7u8, 8, 9, 0, 255, 3];
        let mut out = vec![0; 6];
        denoise(&img, &mut out, 2, 1, 0);
        assert_eq!(out, img);
    }
}
