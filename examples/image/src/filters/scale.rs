//! Half-resolution copy by 2×2 box averaging.

use super::CHANNELS;

/// The size of the half-resolution copy of a `width × height` image: each side halved
/// (rounding down), at least one pixel.
pub fn half_size(width: u32, height: u32) -> (u32, u32) {
    ((width / 2).max(1), (height / 2).max(1))
}

/// A half-resolution copy of `src` (`width × height` RGB8): each output pixel is the
/// rounded mean of a 2×2 block (an odd last row or column is dropped; a side of one
/// pixel is kept). Returns the pixels and their size.
///
/// # Panics
///
/// If `src` is not `width * height * 3` bytes long.
pub fn half(src: &[u8], width: u32, height: u32) -> (Vec<u8>, u32, u32) {
    let (w, h) = (width as usize, height as usize);
    assert_eq!(src.len(), w * h * CHANNELS, "source size");
    let (ow, oh) = half_size(width, height);
    let (ow, oh) = (ow as usize, oh as usize);
    let stride = w * CHANNELS;
    let mut out = vec![0u8; ow * oh * CHANNELS];
    for (y, orow) in out.chunks_exact_mut(ow * CHANNELS).enumerate() {
        let r0 = &src[(2 * y).min(h - 1) * stride..][..stride];
        let r1 = &src[(2 * y + 1).min(h - 1) * stride..][..stride];
        for (x, opx) in orow.chunks_exact_mut(CHANNELS).enumerate() {
            let a = 2 * x * CHANNELS;
            let b = (2 * x + 1).min(w - 1) * CHANNELS;
            for c in 0..CHANNELS {
                let s = u16::from(r0[a + c])
                    + u16::from(r0[b + c])
                    + u16::from(r1[a + c])
                    + u16::from(r1[b + c]);
                opx[c] = ((s + 2) / 4) as u8;
            }
        }
    }
    (out, ow as u32, oh as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions() {
        assert_eq!(half_size(1000, 600), (500, 300));
        assert_eq!(half_size(1001, 601), (500, 300));
        assert_eq!(half_size(1, 1), (1, 1));
        let (px, w, h) = half(&[0u8; 7 * 5 * 3], 7, 5);
        assert_eq!((w, h, px.len()), (3, 2, 3 * 2 * 3));
        let (px, w, h) = half(&[1, 2, 3], 1, 1);
        assert_eq!((w, h, px), (1, 1, vec![1, 2, 3]));
    }

    #[test]
    fn averages_blocks() {
        // 2x2 image -> one pixel, the rounded mean of the four.
        let src = [0, 10, 255, 10, 20, 255, 20, 30, 0, 30, 41, 0];
        let (px, w, h) = half(&src, 2, 2);
        assert_eq!((w, h), (1, 1));
        assert_eq!(px, vec![15, 25, 128]);
    }
}
