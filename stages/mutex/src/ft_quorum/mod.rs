//! Fault-tolerant quorum generators over a `correct` view (spec `specs/mutex-vcube-quorum.md`,
//! §§2–4), the foundation of the crash-tolerant quorum mutual exclusion over VCube.
//!
//! Unlike the static coteries of [`crate::quorum`] (used by the classic Maekawa/Sanders voting),
//! every quorum here is a **pure function of `(i, n, correct_i)`**: a process recomputes its
//! quorum whenever its failure detector removes a process from its view. No I/O, no clock.
//!
//! - [`CorrectSet`]: a process's view `correct_i` of `0..n` (which processes it believes alive).
//! - [`vcube`]: the VCube virtual topology: the ordered clusters `c(i, s)`, the first fault-free
//!   process of a cluster, the testing-round structure (who tests whom), and the VCube majority
//!   quorum generator of Rodrigues et al. (spec §4.1).
//! - [`tree`]: Agrawal–El Abbadi tree quorums over a heap-ordered complete binary tree
//!   (spec §4.2), with substitution of a failed node by both of its subtrees; a typed
//!   [`QuorumError::NoQuorum`] when no quorum exists.
//! - [`grid`]: Maekawa-style grid quorums (row ∪ column) with a deterministic substitution rule
//!   for empty cells and cells of failed processes (spec §4.3).
//! - [`Generator`]: the three generators chosen by name (`grid`, `tree`, `vcube`).
//! - [`detector`]: the VCube failure detector (testing rounds, even/odd event counters, crash
//!   notices) as a pure state machine and as Leda stages feeding a node stage's `failure` input.
//! - [`protocol`]: the crash-tolerant quorum mutual-exclusion protocol (spec §5) as a
//!   [`crate::MutexNode`], parameterised by the generator.
//!
//! **Intersection.** For each generator, any two quorums computed from the **same** view
//! intersect (proved in each module's docs, checked by property tests in
//! `tests/quorum.rs`). Tree quorums intersect even across different views (they all belong
//! to the one Agrawal–El Abbadi coterie of the tree); VCube and grid quorums need not, which the
//! protocol must handle (spec §4.1, §8).
//!
//! **Common rule \[D\].** A quorum is only defined for a process that is correct in the view it is
//! computed from: asking for the quorum of a crashed process is [`QuorumError::NotCorrect`].
//! Every quorum contains only processes of the view, and contains `i` itself.

pub mod detector;
pub mod grid;
pub mod protocol;
pub mod tree;
pub mod vcube;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::node::NodeId;

/// A quorum: the set of processes a requester asks for permission, sorted, without duplicates.
pub type Quorum = BTreeSet<NodeId>;

/// Everything that can go wrong when generating a quorum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    /// The group is empty.
    #[error("a group needs at least one process")]
    EmptyGroup,
    /// VCube numbers processes by the bits of their id: it needs `n` to be a power of two.
    #[error("VCube needs a power-of-two number of processes, got {n}")]
    NotPowerOfTwo {
        /// The group size given.
        n: usize,
    },
    /// A process id outside `0..n` was named.
    #[error("process {node} is out of range for a group of {n} processes")]
    UnknownNode {
        /// The offending id.
        node: NodeId,
        /// The group size.
        n: usize,
    },
    /// A grid cell outside the grid was named.
    #[error("cell ({row}, {col}) is outside the {rows}×{cols} grid")]
    UnknownCell {
        /// The cell's row.
        row: usize,
        /// The cell's column.
        col: usize,
        /// The grid's number of rows.
        rows: usize,
        /// The grid's number of columns.
        cols: usize,
    },
    /// A VCube cluster index outside `1..=log2 n` was named.
    #[error("cluster {s} does not exist for {n} processes (clusters are 1..=log2 n)")]
    UnknownCluster {
        /// The offending cluster index.
        s: u32,
        /// The group size.
        n: usize,
    },
    /// The quorum of a process that is not correct in the view was asked for.
    #[error("process {node} is not correct in the view its quorum is computed from")]
    NotCorrect {
        /// The requesting process.
        node: NodeId,
    },
    /// Enumerating a coterie would exceed the caller's limit.
    #[error("more than {limit} quorums")]
    TooManyQuorums {
        /// The limit given.
        limit: usize,
    },
    /// The tree generator cannot form any quorum in this view: every root-to-leaf path (with
    /// failed nodes replaced by both subtrees) meets a failed leaf.
    #[error("no tree quorum exists among {correct} correct processes of {n}")]
    NoQuorum {
        /// The group size.
        n: usize,
        /// How many processes the view holds correct.
        correct: usize,
    },
}

/// A process's view `correct_i`: which of the processes `0..n` it currently believes correct.
///
/// Crash-stop model: processes only ever leave the view ([`CorrectSet::crash`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CorrectSet {
    alive: Vec<bool>,
    count: usize,
}

impl CorrectSet {
    /// The fault-free view of `n` processes.
    pub fn all(n: usize) -> Self {
        Self {
            alive: vec![true; n],
            count: n,
        }
    }

    /// The view of `n` processes where exactly the listed processes have crashed (repetitions
    /// are allowed). Fails on an id outside `0..n`.
    pub fn with_crashed(
        n: usize,
        crashed: impl IntoIterator<Item = NodeId>,
    ) -> Result<Self, QuorumError> {
        let mut view = Self::all(n);
        for j in crashed {
            view.crash(j)?;
        }
        Ok(view)
    }

    /// The group size `n`.
    pub fn n(&self) -> usize {
        self.alive.len()
    }

    /// Whether `j` is correct in this view (`false` for an id outside `0..n`).
    pub fn contains(&self, j: NodeId) -> bool {
        self.alive.get(j).copied().unwrap_or(false)
    }

    /// Removes `j` from the view; returns whether it was correct until now. Fails on an id
    /// outside `0..n`.
    pub fn crash(&mut self, j: NodeId) -> Result<bool, QuorumError> {
        let n = self.n();
        let slot = self
            .alive
            .get_mut(j)
            .ok_or(QuorumError::UnknownNode { node: j, n })?;
        let was = std::mem::replace(slot, false);
        if was {
            self.count -= 1;
        }
        Ok(was)
    }

    /// How many processes the view holds correct.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no process is correct.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The correct processes, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.alive
            .iter()
            .enumerate()
            .filter_map(|(j, &alive)| alive.then_some(j))
    }

    /// Checks that `i` names a process of this view's group and that it is correct.
    pub(crate) fn check_requester(&self, i: NodeId) -> Result<(), QuorumError> {
        let n = self.n();
        if n == 0 {
            return Err(QuorumError::EmptyGroup);
        }
        if i >= n {
            return Err(QuorumError::UnknownNode { node: i, n });
        }
        if !self.contains(i) {
            return Err(QuorumError::NotCorrect { node: i });
        }
        Ok(())
    }
}

/// The three interchangeable quorum generators of the spec (§4), chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generator {
    /// Maekawa-style grid quorums with substitution ([`grid::grid_quorum`]).
    Grid,
    /// Agrawal–El Abbadi tree quorums ([`tree::tree_quorum`]).
    Tree,
    /// VCube majority quorums ([`vcube::vcube_quorum`]).
    VCube,
}

impl Generator {
    /// Every generator, in the order the spec lists them for the experiments.
    pub const ALL: [Generator; 3] = [Generator::Grid, Generator::Tree, Generator::VCube];

    /// The name used on command lines and in CSV files.
    pub fn name(self) -> &'static str {
        match self {
            Generator::Grid => "grid",
            Generator::Tree => "tree",
            Generator::VCube => "vcube",
        }
    }

    /// The quorum of process `i` computed from its view `correct` (group size `correct.n()`).
    pub fn quorum(self, i: NodeId, correct: &CorrectSet) -> Result<Quorum, QuorumError> {
        match self {
            Generator::Grid => grid::grid_quorum(i, correct),
            Generator::Tree => tree::tree_quorum(i, correct),
            Generator::VCube => vcube::vcube_quorum(i, correct),
        }
    }
}

impl fmt::Display for Generator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown generator name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quorum generator {0:?} (expected grid, tree or vcube)")]
pub struct UnknownGenerator(pub String);

impl FromStr for Generator {
    type Err = UnknownGenerator;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Generator::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownGenerator(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correct_set_tracks_crashes() {
        let mut v = CorrectSet::all(4);
        assert_eq!(v.len(), 4);
        assert_eq!(v.crash(2), Ok(true));
        assert_eq!(v.crash(2), Ok(false));
        assert_eq!(v.len(), 3);
        assert!(!v.contains(2) && v.contains(3) && !v.contains(9));
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![0, 1, 3]);
        assert_eq!(v.crash(4), Err(QuorumError::UnknownNode { node: 4, n: 4 }));
        assert_eq!(
            CorrectSet::with_crashed(4, [0, 1, 2, 3]).map(|v| v.is_empty()),
            Ok(true)
        );
    }

    #[test]
    fn requester_checks() {
        let v = CorrectSet::with_crashed(4, [1]).expect("valid view");
        assert_eq!(v.check_requester(0), Ok(()));
        assert_eq!(
            v.check_requester(1),
            Err(QuorumError::NotCorrect { node: 1 })
        );
        assert_eq!(
            v.check_requester(7),
            Err(QuorumError::UnknownNode { node: 7, n: 4 })
        );
        assert_eq!(
            CorrectSet::all(0).check_requester(0),
            Err(QuorumError::EmptyGroup)
        );
    }

    #[test]
    fn generator_names_round_trip() {
        for g in Generator::ALL {
            assert_eq!(g.name().parse::<Generator>(), Ok(g));
            assert_eq!(g.to_string(), g.name());
        }
        assert_eq!("VCube".parse::<Generator>(), Ok(Generator::VCube));
        assert!("ring".parse::<Generator>().is_err());
    }
}
