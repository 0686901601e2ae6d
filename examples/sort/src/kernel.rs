//! Listing B.2, the selection sort both versions run.
//!
//! [`Kernel::C`] calls `csrc/selection_sort.c`, compiled by `build.rs` at -O2: the very
//! source and flags the MPI peer is built with, so the comparison measures the
//! runtimes and not two compilers. [`Kernel::Rust`] is the same algorithm in Rust
//! (LLVM turns the minimum search into a predictable branch where GCC emits a `cmov`
//! chain, so it runs several times faster; it is not what the benchmark compares).

use std::str::FromStr;

use crate::error::SortError;

unsafe extern "C" {
    /// Listing B.2 (`csrc/selection_sort.c`).
    fn selection_sort(v: *mut f64, n: std::os::raw::c_int);
}

/// Which implementation of Listing B.2 sorts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The C function, compiled like the MPI peer's.
    #[default]
    C,
    /// The same algorithm in Rust.
    Rust,
}

impl Kernel {
    /// The name used in attributes and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kernel::C => "c",
            Kernel::Rust => "rust",
        }
    }

    /// Sorts `v` ascending, in place.
    pub fn sort(self, v: &mut [f64]) -> Result<(), SortError> {
        match self {
            Kernel::C => {
                let n = std::os::raw::c_int::try_from(v.len())
                    .map_err(|_| SortError::TooLong(v.len()))?;
                // SAFETY: `v` is a valid, exclusively borrowed buffer of `n` doubles;
                // the function reads and writes only `v[0..n)`.
                unsafe { selection_sort(v.as_mut_ptr(), n) };
            }
            Kernel::Rust => selection_sort_rust(v),
        }
        Ok(())
    }
}

impl FromStr for Kernel {
    type Err = SortError;
    fn from_str(s: &str) -> Result<Kernel, SortError> {
        match s {
            "c" | "C" => Ok(Kernel::C),
            "rust" => Ok(Kernel::Rust),
            other => Err(SortError::Kernel(other.into())),
        }
    }
}

/// Listing B.2 in Rust: for each position, find the minimum of the rest and swap.
pub fn selection_sort_rust(v: &mut [f64]) {
    let n = v.len();
    for j in 0..n.saturating_sub(1) {
        let mut i_min = j;
        for i in j + 1..n {
            if v[i] < v[i_min] {
                i_min = i;
            }
        }
        if i_min != j {
            v.swap(j, i_min);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kernels_sort() {
        for k in [Kernel::C, Kernel::Rust] {
            let mut v = vec![3.0, -1.5, 2.0, 2.0, 10.0, 0.0];
            k.sort(&mut v).unwrap();
            assert_eq!(v, [-1.5, 0.0, 2.0, 2.0, 3.0, 10.0], "{k:?}");
            let mut e: Vec<f64> = Vec::new();
            k.sort(&mut e).unwrap();
            let mut one = vec![1.0];
            k.sort(&mut one).unwrap();
            assert_eq!(one, [1.0]);
        }
        assert_eq!("rust".parse::<Kernel>(), Ok(Kernel::Rust));
        assert!("quick".parse::<Kernel>().is_err());
    }
}
