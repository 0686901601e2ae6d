//! The group's epoch: fences that only grow across restarts of the group.
//!
//! The algorithms count fences from 0 each time a group starts (a fresh token, a fresh
//! coordinator), so a restarted service would hand out fences below those of its previous
//! life, and a fenced resource would refuse every write of the new one. Each node therefore
//! keeps the largest epoch it has stored in `<data dir>/epoch`, and when a group starts its
//! epoch stages (`epoch<i>`, one per node, serial, fail-stop) agree on a new one:
//!
//! 1. every node reads its stored epoch and sends `("have", i, e)` to node 0;
//! 2. node 0, holding answers from a majority, picks `max + 1` and sends `("set", e)` to all;
//! 3. each node stores it (write, fsync, rename, fsync of the directory) and answers
//!    `("stored", i, e)`;
//! 4. node 0, holding a majority of `stored`, sends `("go", e)` to all, and each epoch stage
//!    tells its gate `("epoch", e)`; the gates serve clients from then on, with fences
//!    `e << 40 | fence` ([`crate::gate::EPOCH_SHIFT`]).
//!
//! Why it is monotone: an epoch is used only once a majority stored it, and the next group
//! reads a majority before choosing, so the two majorities share a node and the next epoch is
//! larger, even if a minority of the nodes lost their data directories. It assumes one group
//! starts at a time (node 0 launches it; a second launcher racing the first is not handled).
//!
//! **Fences within an epoch** come from the same stages, as a majority register per lock
//! (read a majority, write a majority, as in ABD), not from the algorithm: the crash-tolerant
//! quorum algorithms can hand a crashed holder's fence to its successor (the holder never
//! published it), and in a service the crashed node's client lives on and may still write
//! with it. When the front grants a lock to a gate's client, the gate asks its epoch stage
//! `("fence", id, lock)`; the stage reads the largest fence of `lock` from a majority
//! (`fread`/`fval`), takes the next counter, writes it to a majority (`fwrite`/`fack`), and
//! answers `("fenced", id, value)`; only then does the client learn of its grant. A grant
//! whose fence a majority stored is seen by every later read, so a successor's fence is
//! larger even if the holder's node crashed right after. Values are `counter << 8 | node`,
//! so two grants that overlap (which mutual exclusion forbids, but a false suspicion could
//! cause) still get distinct fences. Cost: two round trips to a majority per grant. The
//! values live in memory: a restarted group has a larger epoch, which orders above them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use leda_core::prelude::*;

use crate::group::GroupGraph;

/// The registry kind of epoch stages.
pub const EPOCH_KIND: &str = "lock.epoch";

/// The name of node `i`'s epoch stage.
pub fn epoch_name(i: usize) -> String {
    format!("epoch{i}")
}

/// Reads the epoch stored in `dir` (0 when there is none yet).
pub fn read_epoch(dir: &Path) -> Result<u64, BoxError> {
    let path = dir.join("epoch");
    match std::fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|e| format!("{}: not an epoch: {e}", path.display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("{}: {e}", path.display()).into()),
    }
}

/// Stores `epoch` in `dir` durably (never lowering what is there).
pub fn store_epoch(dir: &Path, epoch: u64) -> Result<u64, BoxError> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let epoch = epoch.max(read_epoch(dir)?);
    let tmp = dir.join("epoch.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    writeln!(f, "{epoch}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("epoch"))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(epoch)
}

#[derive(Debug)]
struct Epoch {
    node: usize,
    n: usize,
    dir: PathBuf,
    /// Node 0: stored epochs heard, by node.
    have: BTreeMap<usize, u64>,
    /// Node 0: the epoch chosen, and who stored it.
    chosen: Option<(u64, Vec<usize>)>,
    done: bool,
    /// The fence register: the largest value stored here, per lock.
    fences: BTreeMap<String, u64>,
    /// This node's fence operations in flight, by number.
    ops: BTreeMap<u64, FenceOp>,
    next_op: u64,
}

/// A fence operation of this node's gate: read a majority, then write a majority.
#[derive(Debug)]
struct FenceOp {
    /// The gate's request id.
    id: i64,
    lock: String,
    /// Answers so far in this phase.
    answers: usize,
    /// Read phase: the largest value read; write phase: the value written.
    value: u64,
    writing: bool,
}

/// Largest number of nodes: fence values keep the node in their low 8 bits.
pub const MAX_NODES: usize = 256;

/// The fence after `max` for node `node`: the next counter, the node in the low bits.
fn next_fence(max: u64, node: usize) -> u64 {
    (((max >> 8) + 1) << 8) | node as u64
}

impl Epoch {
    fn majority(&self) -> usize {
        self.n / 2 + 1
    }

    /// Sends `ev` to node `j`'s epoch stage, or handles it here for `j == self.node`.
    fn send_to(&mut self, j: usize, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        if j == self.node {
            return self.handle(ev, ctx);
        }
        if let Err(e) = ctx.send(format!("peer{j}").as_str(), ev) {
            // A crashed or unreachable node: the protocol waits for a majority, not for it.
            tracing::debug!(node = self.node, to = j, error = %e, "epoch: not sent");
        }
        Ok(())
    }

    fn broadcast(&mut self, ev: &Event, ctx: &mut Ctx) -> HandlerResult {
        for j in 0..self.n {
            self.send_to(j, ev.clone_args(), ctx)?;
        }
        Ok(())
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        match tag.as_str() {
            "start" => {
                let e = read_epoch(&self.dir)?;
                let me = self.node as i64;
                self.send_to(0, ("have", me, e as i64).into(), ctx)
            }
            "have" if self.node == 0 => {
                let (j, e): (usize, u64) = (ev.get(1)?, ev.get(2)?);
                self.have.insert(j, e);
                if self.chosen.is_none() && self.have.len() >= self.majority() {
                    let next = self.have.values().max().copied().unwrap_or(0) + 1;
                    self.chosen = Some((next, Vec::new()));
                    self.broadcast(&("set", next as i64).into(), ctx)?;
                }
                Ok(())
            }
            "set" => {
                let e: u64 = ev.get(1)?;
                store_epoch(&self.dir, e)?;
                let me = self.node as i64;
                self.send_to(0, ("stored", me, e as i64).into(), ctx)
            }
            "stored" if self.node == 0 => {
                let (j, e): (usize, u64) = (ev.get(1)?, ev.get(2)?);
                let majority = self.majority();
                let Some((chosen, stored)) = self.chosen.as_mut() else {
                    return Err("epoch: stored before any epoch was chosen".into());
                };
                if e != *chosen || stored.contains(&j) {
                    return Ok(());
                }
                stored.push(j);
                if stored.len() == majority {
                    let go = *chosen;
                    self.broadcast(&("go", go as i64).into(), ctx)?;
                }
                Ok(())
            }
            "fence" => {
                let (id, lock): (i64, String) = (ev.get(1)?, ev.get(2)?);
                let op = self.next_op;
                self.next_op += 1;
                self.ops.insert(
                    op,
                    FenceOp {
                        id,
                        lock: lock.clone(),
                        answers: 0,
                        value: 0,
                        writing: false,
                    },
                );
                let me = self.node as i64;
                self.broadcast(&("fread", me, op as i64, lock.as_str()).into(), ctx)
            }
            "fread" => {
                let (from, op, lock): (usize, i64, String) = (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                let v = self.fences.get(&lock).copied().unwrap_or(0);
                self.send_to(from, ("fval", op, v as i64).into(), ctx)
            }
            "fwrite" => {
                let (from, op, lock, v): (usize, i64, String, u64) =
                    (ev.get(1)?, ev.get(2)?, ev.get(3)?, ev.get(4)?);
                let stored = self.fences.entry(lock).or_default();
                *stored = (*stored).max(v);
                self.send_to(from, ("fack", op).into(), ctx)
            }
            "fval" | "fack" => {
                let op: u64 = ev.get(1)?;
                let majority = self.majority();
                let Some(o) = self.ops.get_mut(&op) else {
                    // A late answer to a finished phase.
                    return Ok(());
                };
                if (tag == "fack") != o.writing {
                    return Ok(());
                }
                if tag == "fval" {
                    o.value = o.value.max(ev.get(2)?);
                }
                o.answers += 1;
                if o.answers < majority {
                    return Ok(());
                }
                if !o.writing {
                    o.writing = true;
                    o.answers = 0;
                    o.value = next_fence(o.value, self.node);
                    let (me, v, lock) = (self.node as i64, o.value as i64, o.lock.clone());
                    return self
                        .broadcast(&("fwrite", me, op as i64, lock.as_str(), v).into(), ctx);
                }
                let o = self.ops.remove(&op).expect("the op is here");
                ctx.send("gate", ("fenced", o.id, o.value as i64))?;
                Ok(())
            }
            "go" => {
                let e: u64 = ev.get(1)?;
                if !std::mem::replace(&mut self.done, true) {
                    tracing::info!(node = self.node, epoch = e, "group epoch agreed");
                    ctx.send("gate", ("epoch", e as i64))?;
                }
                Ok(())
            }
            other => Err(format!("epoch{}: unexpected event {other:?}", self.node).into()),
        }
    }
}

/// Node `node`'s epoch stage (of `n`), storing in `dir`; ports `peer<j>` and `gate`.
/// `dir: None` builds the stand-in for a node that runs in another process (its daemon
/// rebuilds it with its own directory).
pub fn epoch_stage(node: usize, n: usize, dir: Option<PathBuf>) -> Stage {
    Stage::stateful(
        epoch_name(node),
        move |_: &Attrs| -> Result<Epoch, BoxError> {
            let dir = dir
                .clone()
                .ok_or_else(|| format!("epoch{node} runs in its own node's process"))?;
            Ok(Epoch {
                node,
                n,
                dir,
                have: BTreeMap::new(),
                chosen: None,
                done: false,
                fences: BTreeMap::new(),
                ops: BTreeMap::new(),
                next_op: 0,
            })
        },
        |e: &mut Epoch, ev: Event, ctx: &mut Ctx| e.handle(ev, ctx),
    )
    .fail_stop()
    .kind(EPOCH_KIND)
    .attr("node", node as i64)
    .attr("n", n as i64)
    .autostart("start")
}

/// Adds an epoch stage to every node of a group built with gates, `epoch<i>` ↔ `gate<i>`
/// (the gates then take their clients' fences from it), the epoch stages joined pairwise; `dirs[i]` is node `i`'s data directory where it runs
/// in this process (`None` for nodes of other processes).
pub fn attach_epochs(built: &mut GroupGraph, dirs: Vec<Option<PathBuf>>) -> Result<(), BoxError> {
    let n = built.clusters.len();
    if dirs.len() != n {
        return Err(format!("{} data directories for {n} nodes", dirs.len()).into());
    }
    if n > MAX_NODES {
        return Err(format!("{n} nodes: at most {MAX_NODES} serve clients").into());
    }
    let mut stages = Vec::new();
    for (i, dir) in dirs.into_iter().enumerate() {
        let gate = built
            .graph
            .stage(&format!("gate{i}"))
            .cloned()
            .ok_or_else(|| format!("node {i} has no gate"))?;
        gate.set_attr("epoch", true);
        let e = epoch_stage(i, n, dir);
        built.graph.connect(&e, "gate", &gate).local();
        built.graph.connect(&gate, "fence", &e).local();
        built.clusters[i].insert(&e);
        stages.push(e);
    }
    for (i, a) in stages.iter().enumerate() {
        for (j, b) in stages.iter().enumerate() {
            if i != j {
                built.graph.connect(a, format!("peer{j}").as_str(), b);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_grow_past_any_value_read_and_name_their_node() {
        assert_eq!(next_fence(0, 3), 256 + 3);
        assert_eq!(next_fence(256 + 3, 0), 512);
        assert!(next_fence(512 + 255, 1) > 512 + 255);
        // Two nodes reading the same largest value get distinct fences.
        assert_ne!(next_fence(700, 1), next_fence(700, 2));
    }

    #[test]
    fn stored_epochs_never_go_down_and_survive_a_reread() {
        let dir = std::env::temp_dir().join(format!("leda-epoch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(read_epoch(&dir).unwrap(), 0);
        assert_eq!(store_epoch(&dir, 5).unwrap(), 5);
        assert_eq!(
            store_epoch(&dir, 3).unwrap(),
            5,
            "a smaller epoch lowers nothing"
        );
        assert_eq!(read_epoch(&dir).unwrap(), 5);
        std::fs::write(dir.join("epoch"), "garbage").unwrap();
        assert!(
            read_epoch(&dir).is_err(),
            "a damaged file is an error, not epoch 0"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
