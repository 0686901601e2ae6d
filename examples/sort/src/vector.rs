//! Vectors of doubles as event payloads (the thesis' `memarray`): raw little-endian
//! `f64`s in one `Bytes` value, which a decoupled connector ships as one msgpack `bin`.

use bytes::Bytes;

use crate::error::SortError;

/// The doubles of `v` as little-endian bytes.
pub fn to_bytes(v: &[f64]) -> Bytes {
    let mut out = Vec::with_capacity(v.len() * 8);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

/// The doubles of a payload made by [`to_bytes`].
pub fn from_bytes(b: &[u8]) -> Result<Vec<f64>, SortError> {
    if !b.len().is_multiple_of(8) {
        return Err(SortError::Payload(b.len()));
    }
    Ok(b.chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            f64::from_le_bytes(a)
        })
        .collect())
}

/// The length of each of the `np` parts of a vector of `length` doubles.
pub fn part_len(length: usize, np: usize) -> Result<usize, SortError> {
    if np == 0 || length == 0 {
        return Err(SortError::Empty { np, length });
    }
    if !length.is_multiple_of(np) {
        return Err(SortError::Split { length, np });
    }
    let part = length / np;
    if i32::try_from(part).is_err() {
        return Err(SortError::TooLong(part));
    }
    Ok(part)
}

/// The input of Listing B.4: part `k` (0-based) of a vector counting down from
/// `length` to 1, so the whole vector is reverse-sorted.
pub fn input_part(length: usize, np: usize, k: usize) -> Result<Vec<f64>, SortError> {
    let part = part_len(length, np)?;
    let top = length - k * part;
    Ok((0..part).map(|i| (top - i) as f64).collect())
}

/// `true` when `v` is exactly `1.0, 2.0, …, length` (the input, sorted and complete).
pub fn is_sorted_and_complete(v: &[f64], length: usize) -> bool {
    v.len() == length && v.iter().enumerate().all(|(i, &x)| x == (i + 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bad_payloads() {
        let v = [1.5, -0.0, f64::MAX, 3.0];
        assert_eq!(from_bytes(&to_bytes(&v)).unwrap(), v);
        assert_eq!(from_bytes(&[0; 7]), Err(SortError::Payload(7)));
    }

    #[test]
    fn parts_cover_the_vector_in_reverse() {
        assert_eq!(input_part(6, 2, 0).unwrap(), [6.0, 5.0, 4.0]);
        assert_eq!(input_part(6, 2, 1).unwrap(), [3.0, 2.0, 1.0]);
        assert_eq!(part_len(7, 2), Err(SortError::Split { length: 7, np: 2 }));
        assert!(part_len(0, 2).is_err() && part_len(4, 0).is_err());
        assert!(is_sorted_and_complete(&[1.0, 2.0, 3.0], 3));
        assert!(!is_sorted_and_complete(&[1.0, 3.0, 2.0], 3));
        assert!(!is_sorted_and_complete(&[1.0, 2.0], 3));
    }
}
