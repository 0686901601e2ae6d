//! The fault-tolerant quorum generators of `specs/mutex-vcube-quorum.md`: every worked example
//! of the spec (§2.1, §4.1, §4.2), the grid substitution rule (§4.3), and seeded property tests
//! that any two quorums computed from the same `correct` view intersect.

use leda_mutex::ft_quorum::grid::{self, Layout};
use leda_mutex::ft_quorum::tree::{self, tree_coterie, tree_part, tree_quorum};
use leda_mutex::ft_quorum::vcube::{
    self, cluster, dimensions, first_correct, round_tests, tests_in_cluster, vcube_quorum,
};
use leda_mutex::ft_quorum::{CorrectSet, Generator, Quorum, QuorumError};
use leda_mutex::rng::SplitMix64;

fn view(n: usize, crashed: &[usize]) -> CorrectSet {
    CorrectSet::with_crashed(n, crashed.iter().copied()).expect("crashed ids are in range")
}

fn q(ids: &[usize]) -> Quorum {
    ids.iter().copied().collect()
}

/// The quorum as a bit mask (every property test uses `n ≤ 64`).
fn mask(quorum: &Quorum) -> u64 {
    quorum.iter().fold(0, |m, &j| m | (1u64 << j))
}

/// A random view of `n` processes with between 0 and `max_failures` distinct crashes.
fn random_view(rng: &mut SplitMix64, n: usize, max_failures: usize) -> CorrectSet {
    let f = rng.range_inclusive(0, max_failures as u64) as usize;
    let mut ids: Vec<usize> = (0..n).collect();
    for k in 0..f {
        let pick = k + rng.index(n - k);
        ids.swap(k, pick);
    }
    view(n, &ids[..f])
}

/// The quorums of every correct process of `v` as masks, after checking that each contains its
/// owner and only processes of the view. `None` when the generator reports no quorum (the tree
/// only), which must then hold for every process of the view.
fn all_quorums(g: Generator, v: &CorrectSet) -> Option<Vec<u64>> {
    let view_mask = v.iter().fold(0u64, |m, j| m | (1 << j));
    let results: Vec<Result<Quorum, QuorumError>> = v.iter().map(|i| g.quorum(i, v)).collect();
    if results.iter().any(Result::is_err) {
        for r in &results {
            assert!(
                matches!(r, Err(QuorumError::NoQuorum { .. })) && g == Generator::Tree,
                "{g}: unexpected {r:?} for view {:?}",
                v.iter().collect::<Vec<_>>()
            );
        }
        return None;
    }
    let masks: Vec<u64> = results.iter().flatten().map(mask).collect();
    for (i, m) in v.iter().zip(&masks) {
        assert!(m & (1 << i) != 0, "{g}: {i} not in its own quorum");
        assert_eq!(
            m & !view_mask,
            0,
            "{g}: quorum of {i} holds a crashed process"
        );
    }
    Some(masks)
}

fn assert_pairwise_intersect(g: Generator, v: &CorrectSet, masks: &[u64]) {
    for (a, &qa) in masks.iter().enumerate() {
        for &qb in &masks[a..] {
            assert!(
                qa & qb != 0,
                "{g}: disjoint quorums {qa:#x} and {qb:#x} in view {:?}",
                v.iter().collect::<Vec<_>>()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// VCube clusters and testing rounds (spec §2)

/// The spec's recursive definition of `c(i, s)`, verbatim.
fn cluster_reference(i: usize, s: u32) -> Vec<usize> {
    let j = i ^ (1usize << (s - 1));
    let mut out = vec![j];
    for k in 1..s {
        out.extend(cluster_reference(j, k));
    }
    out
}

#[test]
fn cluster_table_for_eight_processes() {
    // Spec §2.1, the worked table: row s, column i.
    let table: [[&[usize]; 8]; 3] = [
        [&[1], &[0], &[3], &[2], &[5], &[4], &[7], &[6]],
        [
            &[2, 3],
            &[3, 2],
            &[0, 1],
            &[1, 0],
            &[6, 7],
            &[7, 6],
            &[4, 5],
            &[5, 4],
        ],
        [
            &[4, 5, 6, 7],
            &[5, 4, 7, 6],
            &[6, 7, 4, 5],
            &[7, 6, 5, 4],
            &[0, 1, 2, 3],
            &[1, 0, 3, 2],
            &[2, 3, 0, 1],
            &[3, 2, 1, 0],
        ],
    ];
    for (s, row) in (1..).zip(table) {
        for (i, expected) in row.into_iter().enumerate() {
            assert_eq!(cluster(i, s, 8).expect("valid"), expected, "c({i}, {s})");
        }
    }
}

#[test]
fn clusters_match_the_recursive_definition_and_partition_the_others() {
    for d in 0..=6u32 {
        let n = 1usize << d;
        assert_eq!(dimensions(n), Ok(d));
        for i in 0..n {
            let mut seen = vec![false; n];
            seen[i] = true;
            for s in 1..=d {
                let c = cluster(i, s, n).expect("valid");
                assert_eq!(c, cluster_reference(i, s), "c({i}, {s}), n = {n}");
                assert_eq!(c.len(), 1 << (s - 1));
                for j in c {
                    assert!(!seen[j], "{j} in two clusters of {i}");
                    seen[j] = true;
                    assert_eq!(vcube::cluster_index(i, j), Some(s));
                }
            }
            assert!(seen.iter().all(|&x| x), "clusters of {i} miss a process");
        }
    }
}

#[test]
fn fault_free_round_tests_the_first_process_of_each_cluster() {
    let v = CorrectSet::all(8);
    for i in 0..8 {
        let expected: Vec<(u32, usize)> = (1..=3)
            .map(|s| (s, cluster(i, s, 8).expect("valid")[0]))
            .collect();
        assert_eq!(round_tests(i, &v), Ok(expected), "tests of {i}");
    }
}

#[test]
fn round_tests_after_a_crash() {
    // n = 8, 1 crashed. c(0,1) = (1): 0 is first correct in c(1,1) = (0), so it still tests 1
    // (crashed processes are tested too). c(0,2) = (2,3): c(2,2) = (0,1) and c(3,2) = (1,0) both
    // have 0 as first correct process, so 0 now tests 3 as well, in place of the crashed 1.
    let v = view(8, &[1]);
    assert_eq!(tests_in_cluster(0, 1, &v), Ok(vec![1]));
    assert_eq!(tests_in_cluster(0, 2, &v), Ok(vec![2, 3]));
    assert_eq!(first_correct(3, 2, &v), Ok(Some(0)));
    // 2 is first correct in c(0,2) = (2,3), so it tests 0; the crashed 1 is tested by 0 for
    // s = 1 and by 3 for s = 2 (c(1,2) = (3,2)).
    assert_eq!(tests_in_cluster(2, 2, &v), Ok(vec![0]));
    assert_eq!(tests_in_cluster(3, 2, &v), Ok(vec![1]));
    assert_eq!(
        round_tests(1, &v),
        Ok(vec![]),
        "a crashed process tests nobody"
    );
}

#[test]
fn every_process_has_one_tester_per_cluster_in_every_view() {
    let mut rng = SplitMix64::new(0x7e57);
    for d in 1..=6u32 {
        let n = 1usize << d;
        for _ in 0..40 {
            let v = random_view(&mut rng, n, n - 1);
            // testers[j][s - 1] = who tests j for cluster s this round.
            let mut testers = vec![vec![Vec::new(); d as usize]; n];
            let mut total = 0;
            for i in 0..n {
                for (s, j) in round_tests(i, &v).expect("valid") {
                    assert!(v.contains(i));
                    testers[j][s as usize - 1].push(i);
                    total += 1;
                }
            }
            assert!(total <= n * d as usize);
            for (j, per_s) in testers.iter().enumerate() {
                for (s, who) in (1..).zip(per_s) {
                    let first = first_correct(j, s, &v).expect("valid");
                    assert_eq!(
                        who,
                        &first.into_iter().collect::<Vec<_>>(),
                        "tester of {j}, s = {s}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// VCube quorums (spec §4.1)

#[test]
fn vcube_p0_worked_example() {
    assert_eq!(
        vcube_quorum(0, &CorrectSet::all(8)),
        Ok(q(&[0, 1, 2, 4, 5]))
    );
    let v = view(8, &[2, 5]);
    assert_eq!(vcube::ff_cluster(0, 3, &v), Ok(vec![4, 6, 7]));
    assert_eq!(vcube::ff_mid(0, 3, &v), Ok(vec![4, 6]));
    assert_eq!(vcube_quorum(0, &v), Ok(q(&[0, 1, 3, 4, 6])));
}

#[test]
fn vcube_all_quorums_for_eight_processes() {
    let fault_free: [&[usize]; 8] = [
        &[0, 1, 2, 4, 5],
        &[1, 0, 3, 5, 4],
        &[2, 3, 0, 6, 7],
        &[3, 2, 1, 7, 6],
        &[4, 5, 6, 0, 1],
        &[5, 4, 7, 1, 0],
        &[6, 7, 4, 2, 3],
        &[7, 6, 5, 3, 2],
    ];
    let all = CorrectSet::all(8);
    for (i, expected) in fault_free.into_iter().enumerate() {
        assert_eq!(vcube_quorum(i, &all), Ok(q(expected)), "fault-free Q{i}");
    }
    let v = view(8, &[2, 5]);
    let after: [(usize, &[usize]); 6] = [
        (0, &[0, 1, 3, 4, 6]),
        (1, &[1, 0, 3, 4, 7]),
        (3, &[3, 1, 7, 6]),
        (4, &[4, 6, 0, 1]),
        (6, &[6, 7, 4, 3, 0]),
        (7, &[7, 6, 4, 3, 1]),
    ];
    for (i, expected) in after {
        assert_eq!(
            vcube_quorum(i, &v),
            Ok(q(expected)),
            "Q{i} after 2 and 5 crash"
        );
    }
    for crashed in [2, 5] {
        assert_eq!(
            vcube_quorum(crashed, &v),
            Err(QuorumError::NotCorrect { node: crashed })
        );
    }
}

#[test]
fn vcube_correct_process_can_leave_a_quorum_with_sixteen_processes() {
    assert_eq!(cluster(0, 4, 16), Ok((8..16).collect::<Vec<_>>()));
    let before = vcube_quorum(0, &CorrectSet::all(16)).expect("quorum");
    assert_eq!(before, q(&[0, 1, 2, 4, 5, 8, 9, 10, 11]));
    let v = view(16, &[12, 13, 14]);
    assert_eq!(vcube::ff_cluster(0, 4, &v).map(|c| c.len()), Ok(5));
    let after = vcube_quorum(0, &v).expect("quorum");
    assert_eq!(after, q(&[0, 1, 2, 4, 5, 8, 9, 10]));
    // The correct 11 left the quorum: a pending request must CANCEL there.
    let left: Vec<usize> = before
        .difference(&after)
        .filter(|&&j| v.contains(j))
        .copied()
        .collect();
    assert_eq!(left, vec![11]);
}

#[test]
fn vcube_fault_free_quorums_have_n_over_2_plus_1_members() {
    for d in 0..=9u32 {
        let n = 1usize << d;
        let v = CorrectSet::all(n);
        for i in [0, n / 3, n - 1] {
            assert_eq!(
                vcube_quorum(i, &v).map(|q| q.len()),
                Ok(n / 2 + 1),
                "n = {n}, i = {i}"
            );
        }
    }
}

#[test]
fn vcube_rejects_bad_groups() {
    assert_eq!(
        vcube_quorum(0, &CorrectSet::all(12)),
        Err(QuorumError::NotPowerOfTwo { n: 12 })
    );
    assert_eq!(
        vcube_quorum(9, &CorrectSet::all(8)),
        Err(QuorumError::UnknownNode { node: 9, n: 8 })
    );
}

#[test]
fn vcube_quorums_hold_a_strict_majority_of_the_view() {
    let mut rng = SplitMix64::new(0x5eed_0001);
    for d in 1..=6u32 {
        let n = 1usize << d;
        for _ in 0..60 {
            let v = random_view(&mut rng, n, n - 1);
            for i in v.iter() {
                let size = vcube_quorum(i, &v).expect("quorum").len();
                assert!(
                    2 * size > v.len(),
                    "n = {n}, |Q{i}| = {size}, {} correct",
                    v.len()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Agrawal–El Abbadi tree quorums (spec §4.2). Figure 3.1 labels 1..7 are heap ids 0..6.

fn labels(ids: &Quorum) -> Quorum {
    ids.iter().map(|&k| k + 1).collect()
}

fn view_by_labels(n: usize, crashed_labels: &[usize]) -> CorrectSet {
    let ids: Vec<usize> = crashed_labels.iter().map(|&l| l - 1).collect();
    view(n, &ids)
}

#[test]
fn tree_seven_nodes_fault_free() {
    let v = CorrectSet::all(7);
    let coterie: Vec<Quorum> = tree_coterie(&v, 100)
        .expect("small")
        .iter()
        .map(labels)
        .collect();
    assert_eq!(
        coterie,
        vec![q(&[1, 2, 4]), q(&[1, 2, 5]), q(&[1, 3, 6]), q(&[1, 3, 7])]
    );
    // The generator takes the first (leftmost) path, plus the process itself.
    assert_eq!(tree_part(&v).as_ref().map(labels), Ok(q(&[1, 2, 4])));
    assert_eq!(
        tree_quorum(5, &v).as_ref().map(labels),
        Ok(q(&[1, 2, 4, 6]))
    );
    assert_eq!(tree_quorum(1, &v).as_ref().map(labels), Ok(q(&[1, 2, 4])));
}

#[test]
fn tree_seven_nodes_with_2_and_3_failed_uses_both_subtrees() {
    let v = view_by_labels(7, &[2, 3]);
    let coterie: Vec<Quorum> = tree_coterie(&v, 100)
        .expect("small")
        .iter()
        .map(labels)
        .collect();
    assert_eq!(coterie, vec![q(&[1, 4, 5]), q(&[1, 6, 7])]);
    assert_eq!(tree_part(&v).as_ref().map(labels), Ok(q(&[1, 4, 5])));
    assert_eq!(
        tree_quorum(6, &v).as_ref().map(labels),
        Ok(q(&[1, 4, 5, 7]))
    );
}

#[test]
fn tree_seven_nodes_has_no_quorum_when_2_5_3_7_fail() {
    let v = view_by_labels(7, &[2, 5, 3, 7]);
    assert_eq!(tree_coterie(&v, 100), Ok(vec![]));
    assert_eq!(
        tree_part(&v),
        Err(QuorumError::NoQuorum { n: 7, correct: 3 })
    );
    for i in v.iter() {
        assert_eq!(
            tree_quorum(i, &v),
            Err(QuorumError::NoQuorum { n: 7, correct: 3 })
        );
    }
}

#[test]
fn tree_seven_nodes_tolerates_some_four_failures_and_a_failed_root() {
    // Four failures (2, 4, 5, 6) still leave the path 1-3-7.
    let v = view_by_labels(7, &[2, 4, 5, 6]);
    assert_eq!(tree_part(&v).as_ref().map(labels), Ok(q(&[1, 3, 7])));
    // A failed root is replaced by a path in each subtree.
    let v = view_by_labels(7, &[1]);
    assert_eq!(tree_part(&v).as_ref().map(labels), Ok(q(&[2, 3, 4, 6])));
    assert_eq!(tree_quorum(0, &v), Err(QuorumError::NotCorrect { node: 0 }));
}

#[test]
fn tree_quorums_from_any_views_belong_to_one_intersecting_coterie() {
    // Exhaustive over all 2^n views for small trees (full and not full): the tree part of each
    // view is in that view's coterie slice, and every two members of the union intersect.
    for n in 1..=9usize {
        let mut union: Vec<u64> = Vec::new();
        for crashed_mask in 0u32..(1 << n) {
            let crashed: Vec<usize> = (0..n).filter(|&j| crashed_mask & (1 << j) != 0).collect();
            let v = view(n, &crashed);
            let slice = tree_coterie(&v, 1 << 12).expect("small");
            match tree_part(&v) {
                Ok(part) => assert!(slice.contains(&part), "n = {n}, crashed {crashed:?}"),
                Err(e) => {
                    assert_eq!(
                        e,
                        QuorumError::NoQuorum {
                            n,
                            correct: v.len()
                        }
                    );
                    assert!(slice.is_empty());
                }
            }
            union.extend(slice.iter().map(mask));
        }
        union.sort_unstable();
        union.dedup();
        for (a, &qa) in union.iter().enumerate() {
            for &qb in &union[a..] {
                assert!(qa & qb != 0, "n = {n}: {qa:#b} and {qb:#b} are disjoint");
            }
        }
    }
}

#[test]
fn tree_quorums_from_different_random_views_intersect() {
    let mut rng = SplitMix64::new(0x7233);
    for n in [15, 31, 40, 63, 64] {
        for _ in 0..200 {
            let a = tree_part(&random_view(&mut rng, n, n / 2));
            let b = tree_part(&random_view(&mut rng, n, n / 2));
            if let (Ok(a), Ok(b)) = (a, b) {
                assert!(mask(&a) & mask(&b) != 0, "n = {n}: {a:?} and {b:?}");
            }
        }
    }
}

#[test]
fn tree_children_follow_heap_order() {
    assert_eq!(tree::children(2, 7).collect::<Vec<_>>(), vec![5, 6]);
}

// ---------------------------------------------------------------------------------------------
// Grid quorums with substitution (spec §4.3)

#[test]
fn grid_fault_free_is_row_union_column() {
    assert_eq!(
        grid::grid_quorum(4, &CorrectSet::all(9)),
        Ok(q(&[1, 3, 4, 5, 7]))
    );
    for i in 0..16 {
        assert_eq!(
            grid::grid_quorum(i, &CorrectSet::all(16)).map(|q| q.len()),
            Ok(7)
        );
    }
    // n = 8: 3×3 grid, cell (2,2) empty; its holder is the next process down column 2,
    // wrapping: 2.
    assert_eq!(
        grid::grid_quorum(6, &CorrectSet::all(8)),
        Ok(q(&[0, 2, 3, 6, 7]))
    );
}

#[test]
fn grid_substitutes_a_failed_cell_by_the_next_correct_process_down_its_column() {
    // 3×3, 1 failed: cell (0,1) is held by 4.
    let v = view(9, &[1]);
    assert_eq!(grid::holder(0, 1, &v), Ok(Some(4)));
    assert_eq!(grid::grid_quorum(0, &v), Ok(q(&[0, 2, 3, 4, 6])));
    assert_eq!(grid::grid_quorum(7, &v), Ok(q(&[4, 6, 7, 8])));
    // n = 8, 2 failed: the empty cell (2,2) wraps to row 0 (2, failed), then row 1: 5.
    let v = view(8, &[2]);
    assert_eq!(grid::holder(2, 2, &v), Ok(Some(5)));
    assert_eq!(grid::grid_quorum(6, &v), Ok(q(&[0, 3, 5, 6, 7])));
}

#[test]
fn grid_substitutes_a_dead_column_by_the_next_correct_process_in_row_major_order() {
    // 3×3 with column 1 (1, 4, 7) dead: cell (0,1) → 2, (1,1) → 5, (2,1) → 8.
    let v = view(9, &[1, 4, 7]);
    assert_eq!(grid::holder(0, 1, &v), Ok(Some(2)));
    assert_eq!(grid::holder(2, 1, &v), Ok(Some(8)));
    assert_eq!(grid::grid_quorum(0, &v), Ok(q(&[0, 2, 3, 6])));
    // n = 10 (3 rows × 4 columns, cells (2,2) and (2,3) empty), column 3 (3, 7) dead:
    // cell (2,3) is the last cell, so rule 3 wraps to cell 0; cell (2,2) is held by 2 (rule 2).
    let v = view(10, &[3, 7]);
    assert_eq!(Layout::new(10), Ok(Layout { rows: 3, cols: 4 }));
    assert_eq!(grid::holder(2, 3, &v), Ok(Some(0)));
    assert_eq!(grid::grid_quorum(9, &v), Ok(q(&[0, 1, 2, 5, 8, 9])));
}

#[test]
fn grid_quorums_never_exceed_row_plus_column() {
    let mut rng = SplitMix64::new(0x6121d);
    for n in 1..=64usize {
        let layout = Layout::new(n).expect("n >= 1");
        for _ in 0..10 {
            let v = random_view(&mut rng, n, n - 1);
            for i in v.iter() {
                let size = grid::grid_quorum(i, &v).expect("quorum").len();
                assert!(size < layout.rows + layout.cols, "n = {n}, |Q{i}| = {size}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Intersection under a common view, every generator

#[test]
fn quorums_from_the_same_view_intersect_exhaustively_for_small_groups() {
    for n in 1..=10usize {
        for crashed_mask in 0u32..(1 << n) {
            if crashed_mask.count_ones() as usize == n {
                continue; // nobody left to ask for a quorum
            }
            let crashed: Vec<usize> = (0..n).filter(|&j| crashed_mask & (1 << j) != 0).collect();
            let v = view(n, &crashed);
            for g in Generator::ALL {
                if g == Generator::VCube && !n.is_power_of_two() {
                    continue;
                }
                if let Some(masks) = all_quorums(g, &v) {
                    assert_pairwise_intersect(g, &v, &masks);
                }
            }
        }
    }
}

#[test]
fn quorums_from_the_same_view_intersect_for_random_views_up_to_64() {
    let mut rng = SplitMix64::new(0x1a7e_5ec7);
    let mut checked = [0usize; 3];
    let mut tree_without_quorum = 0;
    for n in 11..=64usize {
        for _ in 0..25 {
            for (k, g) in Generator::ALL.into_iter().enumerate() {
                if g == Generator::VCube && !n.is_power_of_two() {
                    continue;
                }
                // Grid and VCube tolerate up to n − 1 failures; the tree is run up to n / 2
                // (the spec's worst experiment) and may legitimately have no quorum.
                let max_failures = if g == Generator::Tree { n / 2 } else { n - 1 };
                let v = random_view(&mut rng, n, max_failures);
                match all_quorums(g, &v) {
                    Some(masks) => {
                        assert_pairwise_intersect(g, &v, &masks);
                        checked[k] += 1;
                    }
                    None => tree_without_quorum += 1,
                }
            }
        }
    }
    // The loops really exercised every generator.
    assert!(
        checked.iter().all(|&c| c >= 75),
        "views checked: {checked:?}"
    );
    assert!(
        tree_without_quorum < checked[1],
        "tree: {tree_without_quorum} views without quorum"
    );
}

#[test]
fn vcube_quorums_for_all_power_of_two_sizes_up_to_64() {
    let mut rng = SplitMix64::new(0xc0be);
    for d in 4..=6u32 {
        let n = 1usize << d;
        for _ in 0..150 {
            let v = random_view(&mut rng, n, n - 1);
            let masks = all_quorums(Generator::VCube, &v).expect("a correct process has a quorum");
            assert_pairwise_intersect(Generator::VCube, &v, &masks);
        }
    }
}

#[test]
fn generator_dispatch_matches_the_functions() {
    let v = view(16, &[3, 9]);
    assert_eq!(Generator::Grid.quorum(4, &v), grid::grid_quorum(4, &v));
    assert_eq!(Generator::Tree.quorum(4, &v), tree_quorum(4, &v));
    assert_eq!(Generator::VCube.quorum(4, &v), vcube_quorum(4, &v));
    for g in Generator::ALL {
        assert_eq!(
            g.quorum(3, &v),
            Err(QuorumError::NotCorrect { node: 3 }),
            "{g}"
        );
        assert_eq!(
            g.quorum(16, &v),
            Err(QuorumError::UnknownNode { node: 16, n: 16 }),
            "{g}"
        );
    }
}

/// Spec §4.1 \[D\] and §8: during detection latency two correct processes may hold different
/// views. Tree quorums stay intersecting (tested above); VCube and grid quorums need not, which
/// the protocol layer must face. Hand-made counterexamples, with `i` and `j` correct in both
/// views (the really crashed set contains both views' known crashes).
#[test]
fn vcube_and_grid_quorums_from_different_views_can_be_disjoint() {
    // VCube, n = 8: p_0 has not learned anything yet, p_7 already knows 1, 2, 4 and 5 crashed.
    let q0 = vcube_quorum(0, &CorrectSet::all(8)).expect("quorum");
    let q7 = vcube_quorum(7, &view(8, &[1, 2, 4, 5])).expect("quorum");
    assert_eq!(
        (q0.clone(), q7.clone()),
        (q(&[0, 1, 2, 4, 5]), q(&[3, 6, 7]))
    );
    assert!(q0.is_disjoint(&q7));
    // Grid, 3×3: 1 and 3 crashed; p_0 only knows about 3, p_4 only about 1.
    let q0 = grid::grid_quorum(0, &view(9, &[3])).expect("quorum");
    let q4 = grid::grid_quorum(4, &view(9, &[1])).expect("quorum");
    assert_eq!(
        (q0.clone(), q4.clone()),
        (q(&[0, 1, 2, 6]), q(&[3, 4, 5, 7]))
    );
    assert!(q0.is_disjoint(&q4));
}

/// Grid, nested views (one process knows every crash the other knows, and more): quorums still
/// intersect. Proof: let `b ⊆ a`, `i, j ∈ b`. `Q_i(a)` holds every process of `i`'s column
/// correct in `a` (each holds its own cell), and `Q_j(b)` holds the holder of cell
/// (row of `j`, column of `i`), a process of `i`'s column correct in `b` (the column walk
/// finds one: `i` itself), hence correct in `a`.
#[test]
fn grid_quorums_from_nested_views_intersect() {
    let mut rng = SplitMix64::new(0x4e57);
    for n in 2..=64usize {
        for _ in 0..8 {
            let a = random_view(&mut rng, n, n / 2);
            let mut b = a.clone();
            for _ in 0..rng.range_inclusive(1, (n / 4).max(1) as u64) {
                let victim = rng.index(n);
                if b.len() > 1 {
                    b.crash(victim).expect("in range");
                }
            }
            let in_b: Vec<usize> = b.iter().collect();
            let qa: Vec<u64> = in_b
                .iter()
                .map(|&i| mask(&grid::grid_quorum(i, &a).expect("i correct in a")))
                .collect();
            let qb: Vec<u64> = in_b
                .iter()
                .map(|&j| mask(&grid::grid_quorum(j, &b).expect("j correct in b")))
                .collect();
            for &x in &qa {
                for &y in &qb {
                    assert!(x & y != 0, "n = {n}: {x:#x} and {y:#x}");
                }
            }
        }
    }
}
