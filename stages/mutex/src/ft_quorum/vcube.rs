//! The VCube virtual topology (Duarte, Bona, Ruoso 2014; spec §2) and the VCube majority quorum
//! generator (Rodrigues et al.; spec §4.1).
//!
//! # Clusters
//!
//! With `n = 2^d` processes, process `i` has `d` clusters `s = 1..=d`; cluster `s` has
//! `m = 2^(s−1)` members given by the **ordered** list
//!
//! ```text
//! c(i, s) = ( i ⊕ 2^(s−1), c(i ⊕ 2^(s−1), 1), …, c(i ⊕ 2^(s−1), s−1) )
//! ```
//!
//! Unrolling the recursion gives the closed form used here: the `k`-th member (`k < m`) of
//! `c(i, s)` is `(i ⊕ 2^(s−1)) ⊕ k`. (By induction: `c(j, t)` lists `j ⊕ k` for
//! `k = 2^(t−1)..2^t` in order, so the concatenation lists `j ⊕ k` for `k = 0..2^(s−1)`.) The
//! tests check the closed form against the spec's recursive definition for every `n ≤ 64`.
//!
//! # Testing rounds \[T/X\]
//!
//! Process `i` tests `j ∈ c(i, s)` if and only if `i` is the **first correct process of
//! `c(j, s)`** (the full VCube rule; in the fault-free case that is exactly "i tests the first
//! process of each of its clusters", the source's wording). **Decision \[D\]:** one testing round
//! is every correct process executing its tests for every cluster `s = 1..=d` (the VCube
//! paper's test set `T_i`), so within a round each process `j` is tested at most once **per
//! cluster index `s`** (by [`first_correct`]`(j, s)`), at most `d` times in all, and a round does
//! at most `n·d` tests. The source's "every process is tested only once per round" holds per
//! cluster index, not per round, under this rule; a crashed process executes no tests.
//!
//! # VCube quorums
//!
//! `FF_cluster_i(s)` is the members of `c(i, s)` correct in `i`'s view, **in `c(i, s)` order**
//! (`m'` of them); `FF_mid_i(s)` is its first `⌈m'/2⌉` members; and
//! `Q_i = {i} ∪ ⋃_s FF_mid_i(s)`.
//!
//! **Intersection under a common view.** The clusters of `i` partition `Π ∖ {i}`, so with `f`
//! crashed processes `Σ_s m'_s = n − f − 1` and `|Q_i| ≥ 1 + (n − f − 1)/2 > (n − f)/2`: every
//! quorum holds a strict majority of the correct processes, hence any two quorums computed from
//! the same view intersect. A quorum exists whenever `i` itself is correct (up to `n − 1`
//! failures). Fault-free, `|Q_i| = n/2 + 1`.

use super::{CorrectSet, Quorum, QuorumError};
use crate::node::NodeId;

/// `d = log₂ n`, the number of clusters of every process. Fails unless `n` is a power of two
/// (`n = 1` has no clusters).
pub fn dimensions(n: usize) -> Result<u32, QuorumError> {
    if n == 0 {
        return Err(QuorumError::EmptyGroup);
    }
    if !n.is_power_of_two() {
        return Err(QuorumError::NotPowerOfTwo { n });
    }
    Ok(n.trailing_zeros())
}

/// Checks `i < n`, `n` a power of two and `1 ≤ s ≤ log₂ n`.
fn check(i: NodeId, s: u32, n: usize) -> Result<(), QuorumError> {
    let d = dimensions(n)?;
    if i >= n {
        return Err(QuorumError::UnknownNode { node: i, n });
    }
    if s == 0 || s > d {
        return Err(QuorumError::UnknownCluster { s, n });
    }
    Ok(())
}

/// The members of `c(i, s)` in cluster order, unchecked (`s ≥ 1`).
fn members(i: NodeId, s: u32) -> impl Iterator<Item = NodeId> {
    let half = 1usize << (s - 1);
    let head = i ^ half;
    (0..half).map(move |k| head ^ k)
}

/// The ordered cluster `c(i, s)` of process `i` in a group of `n` processes.
pub fn cluster(i: NodeId, s: u32, n: usize) -> Result<Vec<NodeId>, QuorumError> {
    check(i, s, n)?;
    Ok(members(i, s).collect())
}

/// The index `s` of the cluster of `i` that contains `j` (`None` when `i == j`). Both ids are
/// assumed to belong to the same power-of-two group.
pub fn cluster_index(i: NodeId, j: NodeId) -> Option<u32> {
    let x = i ^ j;
    (x != 0).then(|| usize::BITS - x.leading_zeros())
}

/// `FF_cluster_i(s)`: the members of `c(i, s)` that are correct in `correct`, in cluster order.
pub fn ff_cluster(i: NodeId, s: u32, correct: &CorrectSet) -> Result<Vec<NodeId>, QuorumError> {
    check(i, s, correct.n())?;
    Ok(members(i, s).filter(|&j| correct.contains(j)).collect())
}

/// The first process of `c(i, s)` (in cluster order) that is correct in `correct`, if any.
pub fn first_correct(
    i: NodeId,
    s: u32,
    correct: &CorrectSet,
) -> Result<Option<NodeId>, QuorumError> {
    check(i, s, correct.n())?;
    Ok(members(i, s).find(|&j| correct.contains(j)))
}

/// The processes of `c(i, s)` that `i` tests in a round: every `j ∈ c(i, s)` whose cluster
/// `c(j, s)` has `i` as its first correct process. Empty when `i` is not correct (a crashed
/// process tests nobody).
pub fn tests_in_cluster(
    i: NodeId,
    s: u32,
    correct: &CorrectSet,
) -> Result<Vec<NodeId>, QuorumError> {
    check(i, s, correct.n())?;
    if !correct.contains(i) {
        return Ok(Vec::new());
    }
    Ok(members(i, s)
        .filter(|&j| members(j, s).find(|&k| correct.contains(k)) == Some(i))
        .collect())
}

/// Everything `i` tests in one round: `(s, j)` for every cluster `s = 1..=log₂ n` and every `j`
/// of [`tests_in_cluster`]`(i, s)`, in cluster order.
pub fn round_tests(i: NodeId, correct: &CorrectSet) -> Result<Vec<(u32, NodeId)>, QuorumError> {
    let n = correct.n();
    let d = dimensions(n)?;
    if i >= n {
        return Err(QuorumError::UnknownNode { node: i, n });
    }
    let mut out = Vec::new();
    for s in 1..=d {
        out.extend(tests_in_cluster(i, s, correct)?.into_iter().map(|j| (s, j)));
    }
    Ok(out)
}

/// `FF_mid_i(s)`: the first `⌈m'/2⌉` members of [`ff_cluster`]`(i, s)` (spec §4.1: `m' = 1 → 1`,
/// `2 → 1`, `3 → 2`, `4 → 2`).
pub fn ff_mid(i: NodeId, s: u32, correct: &CorrectSet) -> Result<Vec<NodeId>, QuorumError> {
    let mut ff = ff_cluster(i, s, correct)?;
    ff.truncate(ff.len().div_ceil(2));
    Ok(ff)
}

/// The VCube majority quorum `Q_i = {i} ∪ ⋃_s FF_mid_i(s)` of process `i` in its view
/// `correct` (see the module docs). Fails when `n` is not a power of two, `i` is out of range
/// or `i` is not correct in the view.
pub fn vcube_quorum(i: NodeId, correct: &CorrectSet) -> Result<Quorum, QuorumError> {
    let d = dimensions(correct.n())?;
    correct.check_requester(i)?;
    let mut q = Quorum::new();
    q.insert(i);
    for s in 1..=d {
        q.extend(ff_mid(i, s, correct)?);
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_need_a_power_of_two() {
        assert_eq!(dimensions(8), Ok(3));
        assert_eq!(dimensions(1), Ok(0));
        assert_eq!(dimensions(12), Err(QuorumError::NotPowerOfTwo { n: 12 }));
        assert_eq!(dimensions(0), Err(QuorumError::EmptyGroup));
    }

    #[test]
    fn cluster_rejects_bad_arguments() {
        assert_eq!(
            cluster(0, 0, 8),
            Err(QuorumError::UnknownCluster { s: 0, n: 8 })
        );
        assert_eq!(
            cluster(0, 4, 8),
            Err(QuorumError::UnknownCluster { s: 4, n: 8 })
        );
        assert_eq!(
            cluster(8, 1, 8),
            Err(QuorumError::UnknownNode { node: 8, n: 8 })
        );
        assert_eq!(cluster(0, 1, 6), Err(QuorumError::NotPowerOfTwo { n: 6 }));
    }

    #[test]
    fn cluster_index_finds_the_cluster() {
        for i in 0..16 {
            assert_eq!(cluster_index(i, i), None);
            for s in 1..=4 {
                for j in members(i, s) {
                    assert_eq!(cluster_index(i, j), Some(s));
                }
            }
        }
    }

    #[test]
    fn ff_mid_takes_the_ceiling_half() {
        // c(0,3) = (4,5,6,7); crash 4 and 5, 6 and 7 one at a time: m' = 4, 3, 2, 1.
        let cases: [(&[NodeId], &[NodeId]); 4] = [
            (&[], &[4, 5]),
            (&[5], &[4, 6]),
            (&[4, 6], &[5]),
            (&[4, 5, 6], &[7]),
        ];
        for (crashed, mid) in cases {
            let v = CorrectSet::with_crashed(8, crashed.iter().copied()).expect("view");
            assert_eq!(
                ff_mid(0, 3, &v).expect("ff_mid"),
                mid,
                "crashed {crashed:?}"
            );
        }
    }

    #[test]
    fn crashed_process_has_no_quorum_and_tests_nobody() {
        let v = CorrectSet::with_crashed(8, [3]).expect("view");
        assert_eq!(
            vcube_quorum(3, &v),
            Err(QuorumError::NotCorrect { node: 3 })
        );
        assert_eq!(round_tests(3, &v), Ok(Vec::new()));
    }
}
