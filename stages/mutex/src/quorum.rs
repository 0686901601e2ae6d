//! Quorums (districts, coteries) for Maekawa-style voting (spec §12).
//!
//! The practical grid construction: nodes are laid out row-major in a grid with
//! `c = ⌈√n⌉` columns and `r = ⌈n / c⌉` rows; `S_i` is every node in the row and the column of
//! `i`'s cell. **Non-square `n` \[D\]:** the empty cells `k ≥ n` of the last row are filled by
//! wrapping around, with node `k − n` (so `k mod n`). Every cell is then occupied.
//!
//! **Intersection proof.** For any `i, j`, the cell at (row of `i`, column of `j`) exists and holds
//! some node `x`; `x` is in `i`'s row, so `x ∈ S_i`, and in `j`'s column, so `x ∈ S_j`. Also
//! `i ∈ S_i`. [`validate_quorums`] checks both properties, and the tests run it for every
//! `n ≤ 64`.

use crate::error::MutexError;
use crate::node::NodeId;

/// Grid quorums for `n` nodes (see the module docs). `result[i]` is `S_i`, sorted, without
/// duplicates; `|S_i| ≤ 2⌈√n⌉ − 1`.
pub fn grid_quorums(n: usize) -> Vec<Vec<NodeId>> {
    if n == 0 {
        return Vec::new();
    }
    let mut cols = 1;
    while cols * cols < n {
        cols += 1;
    }
    let rows = n.div_ceil(cols);
    let cell = |row: usize, col: usize| (row * cols + col) % n;
    (0..n)
        .map(|i| {
            let (row, col) = (i / cols, i % cols);
            let mut s: Vec<NodeId> = (0..cols)
                .map(|c| cell(row, c))
                .chain((0..rows).map(|r| cell(r, col)))
                .collect();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect()
}

/// Checks that `quorums` has one quorum per node, names only valid nodes, contains each node in
/// its own quorum, and that every two quorums intersect.
pub fn validate_quorums(n: usize, quorums: &[Vec<NodeId>]) -> Result<(), MutexError> {
    if quorums.len() != n {
        return Err(MutexError::Config(format!(
            "expected {n} quorums, got {}",
            quorums.len()
        )));
    }
    for (i, q) in quorums.iter().enumerate() {
        if let Some(&bad) = q.iter().find(|&&x| x >= n) {
            return Err(MutexError::UnknownNode { node: bad, n });
        }
        if !q.contains(&i) {
            return Err(MutexError::Config(format!(
                "node {i} is not in its own quorum"
            )));
        }
    }
    for i in 0..n {
        for j in i + 1..n {
            if !quorums[i].iter().any(|x| quorums[j].contains(x)) {
                return Err(MutexError::Config(format!(
                    "quorums of {i} and {j} do not intersect"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_quorums_intersect_for_every_n() {
        for n in 1..=64 {
            let q = grid_quorums(n);
            validate_quorums(n, &q).unwrap_or_else(|e| panic!("n = {n}: {e}"));
            let mut c = 1;
            while c * c < n {
                c += 1;
            }
            for s in &q {
                assert!(s.len() < 2 * c, "n = {n}: |S| = {} too large", s.len());
                assert!(s.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }

    #[test]
    fn square_grid_matches_the_slides() {
        // 3×3 grid: P_4 (id 3, middle row left) has |S| = 5: row {3,4,5} ∪ column {0,3,6}.
        let q = grid_quorums(9);
        assert_eq!(q[3], vec![0, 3, 4, 5, 6]);
        assert!(q.iter().all(|s| s.len() == 5));
    }

    #[test]
    fn validation_rejects_bad_quorums() {
        assert!(validate_quorums(2, &[vec![0], vec![1]]).is_err());
        assert!(validate_quorums(2, &[vec![0, 1], vec![0]]).is_err());
        assert!(validate_quorums(2, &[vec![0, 5], vec![0, 1]]).is_err());
        assert!(validate_quorums(2, &[vec![0, 1]]).is_err());
        assert!(validate_quorums(2, &[vec![0, 1], vec![0, 1]]).is_ok());
    }
}
