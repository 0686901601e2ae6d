//! Maekawa-style grid quorums adapted to failures by substitution (spec §4.3).
//!
//! **Grid \[D\].** `C = ⌈√n⌉` columns and `R = ⌈n / C⌉` rows, filled row-major with the processes
//! `0..n`: cell `(r, c)` holds process `r·C + c` if that is `< n`, and is **empty** otherwise
//! (only cells of the last row can be empty). `Q_i` is the [`holder`] of every cell of `i`'s row
//! and of every cell of `i`'s column; with no empty cell and no failure, `|Q_i| = R + C − 1`.
//!
//! **Substitution rule \[D\]** (the source's figure is lost; this is the spec's suggested rule).
//! The holder of a cell in a view `correct` is:
//! 1. the cell's own process, if the cell is not empty and that process is correct;
//! 2. otherwise the process of the **next cell down the same column**, wrapping from the last
//!    row to row 0, whose process is correct (the source: "the same process may appear more
//!    than once in the same column");
//! 3. otherwise (no correct process in the whole column) the **next correct process in
//!    row-major order** after the cell: the first correct process among the cells
//!    `k + 1, k + 2, …` (mod `R·C`, skipping empty cells) where `k = r·C + c` is the cell's
//!    row-major index.
//!
//! The holder only depends on the cell and the view, so every process with the same view
//! computes the same grid of holders. Duplicates collapse, so a quorum may shrink below
//! `R + C − 1`; it never grows beyond it.
//!
//! **Intersection under a common view.** For any `i, j`, the cell at (row of `i`, column of `j`)
//! lies in `i`'s row and in `j`'s column, so its holder is in both `Q_i` and `Q_j`. A holder
//! exists whenever the view is non-empty, so a quorum exists for every correct `i` (any number of
//! failures up to `n − 1`), and `i ∈ Q_i` because `i`'s own cell is held by `i`. Quorums
//! computed from **different** views need not intersect.

use super::{CorrectSet, Quorum, QuorumError};
use crate::node::NodeId;

/// The grid's shape for `n` processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of rows, `R = ⌈n / C⌉`.
    pub rows: usize,
    /// Number of columns, `C = ⌈√n⌉`.
    pub cols: usize,
}

impl Layout {
    /// The layout for `n ≥ 1` processes.
    pub fn new(n: usize) -> Result<Self, QuorumError> {
        if n == 0 {
            return Err(QuorumError::EmptyGroup);
        }
        let mut cols = 1;
        while cols * cols < n {
            cols += 1;
        }
        Ok(Self {
            rows: n.div_ceil(cols),
            cols,
        })
    }

    /// The `(row, column)` cell of process `i` (row-major placement).
    pub fn cell_of(self, i: NodeId) -> (usize, usize) {
        (i / self.cols, i % self.cols)
    }
}

/// The process that stands for cell `(row, col)` in the view `correct`, after substitution
/// (see the module docs). `None` only when the view is empty. Fails on a cell outside the grid.
pub fn holder(row: usize, col: usize, correct: &CorrectSet) -> Result<Option<NodeId>, QuorumError> {
    let n = correct.n();
    let layout = Layout::new(n)?;
    if row >= layout.rows || col >= layout.cols {
        return Err(QuorumError::UnknownCell {
            row,
            col,
            rows: layout.rows,
            cols: layout.cols,
        });
    }
    Ok(holder_unchecked(layout, row, col, correct))
}

fn holder_unchecked(
    layout: Layout,
    row: usize,
    col: usize,
    correct: &CorrectSet,
) -> Option<NodeId> {
    let n = correct.n();
    let at = |r: usize| {
        let p = r * layout.cols + col;
        (p < n && correct.contains(p)).then_some(p)
    };
    // Rules 1 and 2: this cell, then down the column, wrapping.
    if let Some(p) = (0..layout.rows).find_map(|t| at((row + t) % layout.rows)) {
        return Some(p);
    }
    // Rule 3: next correct process in row-major order after the cell, wrapping over the cells
    // (empty cells hold nobody).
    let cells = layout.rows * layout.cols;
    let k = row * layout.cols + col;
    (1..=cells)
        .map(|t| (k + t) % cells)
        .find(|&p| p < n && correct.contains(p))
}

/// The grid quorum of process `i` in its view `correct`: the holders of every cell of `i`'s row
/// and column. Fails when `i` is out of range or not correct in the view.
pub fn grid_quorum(i: NodeId, correct: &CorrectSet) -> Result<Quorum, QuorumError> {
    correct.check_requester(i)?;
    let layout = Layout::new(correct.n())?;
    let (row, col) = layout.cell_of(i);
    let row_cells = (0..layout.cols).map(|c| (row, c));
    let col_cells = (0..layout.rows).map(|r| (r, col));
    // The view holds `i`, so every cell has a holder.
    Ok(row_cells
        .chain(col_cells)
        .filter_map(|(r, c)| holder_unchecked(layout, r, c, correct))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_shapes() {
        assert_eq!(Layout::new(9), Ok(Layout { rows: 3, cols: 3 }));
        assert_eq!(Layout::new(8), Ok(Layout { rows: 3, cols: 3 }));
        assert_eq!(Layout::new(10), Ok(Layout { rows: 3, cols: 4 }));
        assert_eq!(Layout::new(1), Ok(Layout { rows: 1, cols: 1 }));
        assert_eq!(Layout::new(0), Err(QuorumError::EmptyGroup));
        assert_eq!(Layout::new(10).map(|l| l.cell_of(7)), Ok((1, 3)));
    }

    #[test]
    fn holder_rejects_cells_outside_the_grid() {
        let v = CorrectSet::all(8);
        assert!(holder(3, 0, &v).is_err());
        assert!(holder(0, 3, &v).is_err());
        assert_eq!(
            holder(2, 2, &v),
            Ok(Some(2)),
            "empty cell takes its column's next process"
        );
        assert_eq!(
            holder(0, 0, &CorrectSet::with_crashed(1, [0]).expect("view")),
            Ok(None)
        );
    }
}
