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
//! 3. each node stores it (write, fsync, rename, fsync of the directory, on a thread of
//!    its own: the stage goes on with other messages meanwhile) and answers
//!    `("stored", i, e)`; a node whose disk is slow may be told `go` before its own store
//!    ends, and serve with `e` (a majority stored it);
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
//! `("fence", id, lock, ttl_ms)`; the stage reads the lock's entry from a majority
//! (`fread`/`fval`), takes the next counter, writes it to a majority (`fwrite`/`fack`), and
//! answers `("fenced", id, value, wait_ms)`. A grant whose fence a majority stored is seen by
//! every later read, so a successor's fence is larger even if the holder's node crashed right
//! after. Values are `counter << 8 | node`, so two grants that overlap (which mutual
//! exclusion forbids, but a false suspicion could cause) still get distinct fences.
//!
//! **No overlap across a node's pause or crash.** An entry is the largest fence written, the
//! longest lease TTL of the fences written since the last release, and the largest fence
//! released; fences and releases only grow, so replicas merge by taking the larger. Three
//! rules use it (the gate keeps them):
//!
//! - a hold's end (release, cancel, lease expiry) is written to a majority
//!   (`("release", id, lock, fence)` → `fmark` → `("release-stored", id)`) before the front
//!   lets the lock go, so the next grant after a normal release waits for nothing;
//! - a grant whose read finds the entry open (a fence written after the last release: its
//!   node crashed, paused or cut off with the lock) is told to its client only
//!   [`takeover_wait_ms`] of the entry's TTL after its own fence was stored (`wait_ms`; the
//!   TTL written with the new fence is the larger of the two, for whoever comes next);
//! - a keep-alive of a session holding locks is answered only once a majority read
//!   (`("check", session, locks)` → `("checked", session, fences)`) shows no later grant
//!   of them: a node cut off from a majority renews nothing, a resumed one finds the later
//!   grant and ends the session.
//!
//! A write is taken only over the fence its writer read (or its own, sent again): of two
//! grants whose operations overlap (a node paused between its read and its write), the one
//! that loses on the node where their write majorities meet learns of the other (`fnack`,
//! carrying that replica's entry) and reads again from it. Grants that read the same entry
//! write fences of one counter (`fence >> 8`), and a majority stores at most one of them, so
//! "open" and "later grant" compare counters: a refused write left on a minority holds
//! nothing up and ends no session, but its TTL still counts while it is open. A write's
//! acknowledgement carries the replica's entry as it was before the write, and the grant
//! waits out what those show open too: a grant stored concurrently that its read missed is
//! on one of them (on any node of both write majorities, that grant's write came first, or
//! the node would have refused it).
//!
//! Why that suffices: a renewal's read and the next grant's write meet on one node, so every
//! renewal vouched for was sent (the client counts its lease from the keep-alive's send time)
//! before the next grant's fence was stored, and its lease ends within the wait that follows.
//! Operations whose messages were lost with a connection are sent again to the nodes that
//! have not answered on each `tick` (the gate sends one every 250 ms); answers are counted
//! once per node. Cost: two majority round trips per grant, one per release, one per
//! keep-alive of a holding session. The values live in memory: a restarted group has a
//! larger epoch, which orders above them.

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

/// A node's hold on its data directory ([`hold_data_dir`]): an exclusive `flock` on
/// `<dir>/lock`, released when this is dropped or the process ends (kill -9 included).
#[derive(Debug)]
pub struct DataDirHold {
    _file: std::fs::File,
}

/// Holds `dir` (made if missing) for this process: a second node started on the same
/// directory while this one lives (also stopped with SIGSTOP) is refused with the
/// holder's pid, instead of both storing epochs and registers there as one node. (Two
/// processes as one node would each answer for it in the majorities the epoch and the
/// fences rely on.)
pub fn hold_data_dir(dir: &Path) -> Result<DataDirHold, BoxError> {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(format!("{}: {e}", path.display()).into());
        }
        // (Empty, or a former holder's, while a holder just started has not written
        // its own yet.)
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = match pid.trim() {
            "" => String::new(),
            pid => format!(" (pid {pid})"),
        };
        return Err(format!(
            "{}: the data directory is held by another lock-service node{pid}: stop it, \
             or give this node a directory of its own",
            dir.display()
        )
        .into());
    }
    let wrote = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    wrote.map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(DataDirHold { _file: file })
}

/// Stores `epoch` in `dir` durably (never lowering what is there). Its caller holds `dir`
/// ([`hold_data_dir`], as `lock-service serve` does), so that no other process writes
/// `epoch.tmp` meanwhile.
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
    /// This node's replica of the register, per lock.
    fences: BTreeMap<String, Slot>,
    /// This node's register operations in flight, by number.
    ops: BTreeMap<u64, RegOp>,
    next_op: u64,
}

/// One lock's entry in the register: the largest fence written, the longest lease TTL of
/// the fences written since the last release (what a grant after them must wait out), and
/// the largest fence released. Fences and releases only grow, so replicas merge by taking
/// the larger.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Reg {
    fence: u64,
    ttl_ms: u64,
    released: u64,
}

/// One lock on one replica: its entry, and the entry as it was before its largest fence
/// was written.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    now: Reg,
    before: Reg,
}

impl Slot {
    /// A fence write (`fence`, `ttl_ms`, by a grant that read `read` as the largest): the
    /// entry before it, or the entry that refuses it ([`Reg::takes`]). The writer waits out
    /// what the entries before its write show open too: a grant stored concurrently, which
    /// its read missed, is there on some node of its write majority (on any node of both
    /// majorities that grant's write came first, or this one would have refused it).
    fn write(&mut self, fence: u64, ttl_ms: u64, read: u64) -> Result<Reg, Reg> {
        if self.now.fence == fence {
            // Sent again: the answer is the first one's.
            return Ok(self.before);
        }
        if !self.now.takes(fence, read) {
            return Err(self.now);
        }
        self.before = self.now;
        self.now.merge(Reg {
            fence,
            ttl_ms,
            released: 0,
        });
        Ok(self.before)
    }
}

/// A fence's counter. The grants that read the same entry write fences of one counter
/// (the node in the low bits), and a majority stores at most one of them
/// ([`Reg::takes`]): a fence of the released one's counter was that grant's or never told.
pub(crate) fn counter(fence: u64) -> u64 {
    fence >> 8
}

impl Reg {
    fn merge(&mut self, o: Reg) {
        let released = self.released.max(o.released);
        let open = |r: &Reg| counter(r.fence) > counter(released);
        // Every open fence's lease must be waited out, not only the largest's: a refused
        // write can order above the grant that refused it.
        self.ttl_ms = match (open(self), open(&o)) {
            (true, true) => self.ttl_ms.max(o.ttl_ms),
            (true, false) => self.ttl_ms,
            (false, true) => o.ttl_ms,
            (false, false) if o.fence > self.fence => o.ttl_ms,
            (false, false) => self.ttl_ms,
        };
        self.fence = self.fence.max(o.fence);
        self.released = released;
    }

    /// Whether this replica takes a write of `fence` by a grant that read `read` as the
    /// largest: only if no larger fence was stored since (its own write sent again aside),
    /// so that of two grants whose operations overlap, one learns of the other on the node
    /// where their write majorities meet.
    fn takes(&self, fence: u64, read: u64) -> bool {
        self.fence <= read || self.fence == fence
    }

    /// The entry as a message carries it.
    fn wire(self) -> [Value; 3] {
        [self.fence, self.ttl_ms, self.released].map(|v| Value::from(v as i64))
    }

    /// An entry from its message form ([`Reg::wire`]).
    fn from_wire(v: &[u64]) -> Result<Reg, BoxError> {
        match v {
            &[fence, ttl_ms, released] => Ok(Reg {
                fence,
                ttl_ms,
                released,
            }),
            _ => Err(format!("epoch: an entry of {} values", v.len()).into()),
        }
    }

    /// A grant no release has followed: its hold may still be valid.
    fn open(&self) -> bool {
        counter(self.fence) > counter(self.released)
    }
}

/// How long a grant waits after an unreleased one whose lease is `ttl_ms`: the TTL, plus
/// 2 % and 20 ms for the rates of the clocks that measure it (the client's counts from a
/// keep-alive's send, this node's from the register's answer).
pub fn takeover_wait_ms(ttl_ms: u64) -> u64 {
    ttl_ms + ttl_ms / 50 + 20
}

/// A register operation of this node's gate.
#[derive(Debug)]
struct RegOp {
    what: OpKind,
    /// This phase's message, sent again on each tick to the nodes that have not answered
    /// (a message lost with a connection must not wedge the operation).
    msg: Event,
    /// The nodes that answered this phase.
    answered: Vec<bool>,
    /// Write phase: the replicas' entries that refused it (merged), and how many did.
    refused: Option<Reg>,
    nacks: usize,
    /// The entries read from a majority (merged), one per lock.
    read: Vec<Reg>,
    writing: bool,
}

#[derive(Debug)]
enum OpKind {
    /// A grant's fence: read a majority, write the next fence to a majority.
    Fence { id: i64, lock: String, ttl_ms: u64 },
    /// A hold's end: write its fence as released to a majority.
    Release { id: i64 },
    /// A lease renewal's check: read the session's locks from a majority.
    Check { session: u64 },
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

    /// Sends `ev` to every node, this one last (its answer, handled at once, may finish
    /// the phase: the others have the message by then).
    fn broadcast(&mut self, ev: &Event, ctx: &mut Ctx) -> HandlerResult {
        let me = self.node;
        for j in (0..self.n).filter(|&j| j != me) {
            self.send_to(j, ev.clone_args(), ctx)?;
        }
        self.send_to(self.node, ev.clone_args(), ctx)
    }

    /// Starts operation `what`: reading (`fread`, from what `read` holds already) or
    /// writing first; `first` makes its first message from the operation's number and
    /// this node's.
    fn start_op(
        &mut self,
        what: OpKind,
        reading: bool,
        read: Vec<Reg>,
        first: impl FnOnce(i64, i64) -> Event,
        ctx: &mut Ctx,
    ) -> HandlerResult {
        let op = self.next_op;
        self.next_op += 1;
        let first = first(op as i64, self.node as i64);
        self.ops.insert(
            op,
            RegOp {
                what,
                msg: first.clone_args(),
                answered: vec![false; self.n],
                refused: None,
                nacks: 0,
                read,
                writing: !reading,
            },
        );
        self.broadcast(&first, ctx)
    }

    /// Runs `io` (reading or storing the epoch: a file, `fsync`s) on a thread of its
    /// own, which then sends its outcome to this stage on its `io` port (connected to
    /// itself): `(done, epoch)`, or `("epoch-io-failed", done, message)`. The stage is
    /// `nonblocking` (the register's messages from other nodes are handled by the thread
    /// that read them, without a pool worker's wake-up), so no handler waits on the disk.
    /// The epoch is stored before `stored` is sent, as before; other messages may be
    /// handled meanwhile, which the protocol allows (it counts majorities).
    fn on_io_thread(
        &self,
        ctx: &Ctx,
        done: &'static str,
        io: impl FnOnce() -> Result<u64, BoxError> + Send + 'static,
    ) -> HandlerResult {
        let mut out = ctx.clone();
        let busy = ctx.busy();
        std::thread::Builder::new()
            .name(format!("epoch{}-io", self.node))
            .spawn(move || {
                let _busy = busy;
                let ev: Event = match io() {
                    Ok(e) => (done, e as i64).into(),
                    Err(e) => ("epoch-io-failed", done, e.to_string()).into(),
                };
                // The stage's queue may be full for a moment: the outcome must not be
                // lost (nothing would send `have` or `stored` again).
                loop {
                    match out.send("io", ev.clone_args()) {
                        Err(SendError::QueueFull { .. }) => {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "epoch: the outcome of its file operation not sent");
                            break;
                        }
                        Ok(()) => break,
                    }
                }
            })?;
        Ok(())
    }

    /// Sends each operation's phase again to the nodes that have not answered it.
    fn resend(&mut self, ctx: &mut Ctx) -> HandlerResult {
        let again: Vec<(usize, Event)> = self
            .ops
            .values()
            .flat_map(|o| {
                (0..self.n)
                    .filter(|&j| !o.answered[j])
                    .map(|j| (j, o.msg.clone_args()))
            })
            .collect();
        for (j, ev) in again {
            self.send_to(j, ev, ctx)?;
        }
        Ok(())
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        match tag.as_str() {
            "start" => {
                let dir = self.dir.clone();
                self.on_io_thread(ctx, "epoch-read", move || read_epoch(&dir))
            }
            "epoch-read" => {
                let e: u64 = ev.get(1)?;
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
                let dir = self.dir.clone();
                self.on_io_thread(ctx, "epoch-stored", move || store_epoch(&dir, e).map(|_| e))
            }
            "epoch-stored" => {
                let e: u64 = ev.get(1)?;
                let me = self.node as i64;
                self.send_to(0, ("stored", me, e as i64).into(), ctx)
            }
            "epoch-io-failed" => {
                let (done, why): (String, String) = (ev.get(1)?, ev.get(2)?);
                let what = if done == "epoch-read" {
                    "reading the stored epoch"
                } else {
                    "storing the epoch"
                };
                Err(format!("epoch{}: {what}: {why}", self.node).into())
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
            // The gate's operations.
            "fence" => {
                let (id, lock, ttl_ms): (i64, String, u64) = (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                let locks = vec![Value::from(lock.as_str())];
                let first = |op, me| ("fread", op, me, locks).into();
                self.start_op(
                    OpKind::Fence { id, lock, ttl_ms },
                    true,
                    Vec::new(),
                    first,
                    ctx,
                )
            }
            "release" => {
                let (id, lock, fence): (i64, String, u64) = (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                let first = |op, me| ("fmark", op, me, lock.as_str(), fence as i64).into();
                self.start_op(OpKind::Release { id }, false, Vec::new(), first, ctx)
            }
            "check" => {
                let (session, locks): (u64, Vec<String>) = (ev.get(1)?, ev.get(2)?);
                let locks: Vec<Value> = locks.into_iter().map(Value::from).collect();
                let first = |op, me| ("fread", op, me, locks).into();
                self.start_op(OpKind::Check { session }, true, Vec::new(), first, ctx)
            }
            // A peer's operation on this replica.
            "fread" => {
                let (op, from, locks): (i64, usize, Vec<String>) =
                    (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                let mut flat = Vec::with_capacity(3 * locks.len());
                for lock in &locks {
                    flat.extend(
                        self.fences
                            .get(lock)
                            .copied()
                            .unwrap_or_default()
                            .now
                            .wire(),
                    );
                }
                let me = self.node as i64;
                self.send_to(from, ("fval", op, me, flat).into(), ctx)
            }
            "fwrite" | "fmark" => {
                let (op, from, lock): (i64, usize, String) = (ev.get(1)?, ev.get(2)?, ev.get(3)?);
                let fence: u64 = ev.get(4)?;
                let slot = self.fences.entry(lock).or_default();
                let (tag, entry) = if tag == "fwrite" {
                    match slot.write(fence, ev.get(5)?, ev.get(6)?) {
                        Ok(before) => ("fack", before),
                        Err(refusing) => ("fnack", refusing),
                    }
                } else {
                    slot.now.merge(Reg {
                        released: fence,
                        ..Reg::default()
                    });
                    ("fack", Reg::default())
                };
                let answer = (tag, op, self.node as i64, entry.wire().to_vec()).into();
                self.send_to(from, answer, ctx)
            }
            "fval" | "fack" | "fnack" => self.answer(&tag, ev, ctx),
            "tick" => self.resend(ctx),
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

    /// An answer to one of this node's operations: its next phase once a majority gave one.
    fn answer(&mut self, tag: &str, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let (op, from): (u64, usize) = (ev.get(1)?, ev.get(2)?);
        let majority = self.majority();
        let Some(o) = self.ops.get_mut(&op) else {
            // A late answer to a finished operation.
            return Ok(());
        };
        if (tag != "fval") != o.writing || o.answered.get(from) != Some(&false) {
            // Another phase's, or this node's answer again (a message sent again).
            return Ok(());
        }
        o.answered[from] = true;
        let flat: Vec<u64> = ev.get(3)?;
        if tag == "fval" {
            let theirs = flat.chunks(3).map(Reg::from_wire);
            if o.read.is_empty() {
                o.read = theirs.collect::<Result<_, _>>()?;
            } else {
                for (mine, t) in o.read.iter_mut().zip(theirs) {
                    mine.merge(t?);
                }
            }
        } else {
            let theirs = Reg::from_wire(&flat)?;
            if tag == "fnack" {
                o.refused.get_or_insert(theirs).merge(theirs);
                o.nacks += 1;
            } else if let (OpKind::Fence { .. }, [_, read]) = (&o.what, o.read.as_mut_slice()) {
                // What the replica held before this write: to be waited out as well.
                read.merge(theirs);
            }
        }
        let answers = o.answered.iter().filter(|&&a| a).count();
        if answers < majority {
            return Ok(());
        }
        if o.writing && answers - o.nacks < majority {
            // A majority answered, not all taking the write: a grant stored a larger fence
            // since this one's read. Read again, from the entries that refused it, so that
            // the next write orders above them (and waits out their leases if open).
            let o = self.ops.remove(&op).expect("the op is here");
            let (OpKind::Fence { lock, .. }, Some(refused)) = (&o.what, o.refused) else {
                return Err("epoch: a refused write that is no fence".into());
            };
            let locks = vec![Value::from(lock.as_str())];
            let first = |op, me| ("fread", op, me, locks).into();
            return self.start_op(o.what, true, vec![refused], first, ctx);
        }
        let me = self.node;
        if let (OpKind::Fence { lock, ttl_ms, .. }, false) = (&o.what, o.writing) {
            // Read: the next fence, and what a grant after it will have to wait.
            let read = o.read.first().copied().unwrap_or_default();
            let fence = next_fence(read.fence, me);
            let ttl = if read.open() {
                read.ttl_ms.max(*ttl_ms)
            } else {
                *ttl_ms
            };
            let lock = lock.clone();
            let mut first: Event = ("fwrite", op as i64, me as i64, lock.as_str()).into();
            first.push(fence as i64);
            first.push(ttl as i64);
            first.push(read.fence as i64);
            o.writing = true;
            o.answered = vec![false; self.n];
            o.msg = first.clone_args();
            // The written entry, kept to answer the gate once a majority stored it.
            o.read = vec![
                Reg {
                    fence,
                    ttl_ms: ttl,
                    released: 0,
                },
                read,
            ];
            return self.broadcast(&first, ctx);
        }
        let o = self.ops.remove(&op).expect("the op is here");
        match o.what {
            OpKind::Fence { id, .. } => {
                // A grant after an unreleased one waits out that hold's lease, counted
                // from now: a renewal the other node checked was sent before this write.
                let (written, read) = (o.read[0], o.read[1]);
                let wait = if read.open() {
                    takeover_wait_ms(read.ttl_ms)
                } else {
                    0
                };
                ctx.send_or_wait("gate", ("fenced", id, written.fence as i64, wait as i64))?;
            }
            OpKind::Release { id } => ctx.send_or_wait("gate", ("release-stored", id))?,
            OpKind::Check { session } => {
                let fences: Vec<Value> =
                    o.read.iter().map(|r| Value::from(r.fence as i64)).collect();
                ctx.send_or_wait("gate", ("checked", session as i64, fences))?;
            }
        }
        Ok(())
    }
}

/// Node `node`'s epoch stage (of `n`), storing in `dir`; ports `peer<j>`, `gate` and `io`
/// (to itself: the outcome of a file operation, see `Epoch::on_io_thread`).
/// `dir: None` builds the stand-in for a node that runs in another process (its daemon
/// rebuilds it with its own directory). Declared `nonblocking`: its handlers only
/// compute and send, and the fence register's messages from other nodes are handled by
/// the thread that read them (an uncontended acquire and release of Suzuki–Kasami on three
/// nodes took 411 µs at the median with a pool worker woken for each, 247 µs without).
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
    .nonblocking()
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
        built.graph.connect(&e, "io", &e).local();
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
    fn a_replica_merges_by_the_larger_and_refuses_a_write_over_a_later_grant() {
        let mut r = Reg::default();
        r.merge(Reg {
            fence: 512,
            ttl_ms: 2_000,
            released: 0,
        });
        assert!(r.open(), "granted, not released");
        r.merge(Reg {
            fence: 256,
            ttl_ms: 9_000,
            released: 512,
        });
        assert_eq!((r.fence, r.ttl_ms, r.released), (512, 2_000, 512));
        assert!(!r.open(), "released");
        // Two grants read 256 as the largest, and node 1's write (513) was stored here
        // first: node 0's (512) is refused, node 1's sent again is taken, and so is a
        // write that read 513.
        let stored = Reg {
            fence: next_fence(256, 1),
            ..Reg::default()
        };
        assert!(!stored.takes(next_fence(256, 0), 256));
        assert!(stored.takes(next_fence(256, 1), 256), "its own write again");
        assert!(stored.takes(next_fence(stored.fence, 0), stored.fence));
    }

    /// Second review of the register: a grant refused by a replica (its node paused between
    /// its read and its write) still stored its write on its own replica, above the grant
    /// that refused it; its read again must wait out that grant's lease, not its own.
    #[test]
    fn a_refused_grant_waits_out_the_lease_of_the_grant_that_refused_it() {
        let init = Reg {
            fence: 256,
            ttl_ms: 1_000,
            released: 256,
        };
        let mut rep = [init; 3];
        let write = |r: &mut Reg, fence, ttl_ms, read| {
            r.takes(fence, read).then(|| {
                r.merge(Reg {
                    fence,
                    ttl_ms,
                    released: 0,
                })
            })
        };
        // A (node 2, TTL 1 s) read 256 and was paused; B (node 1, TTL 10 s) is granted.
        let a_read = rep[2];
        let fa = next_fence(a_read.fence, 2);
        let fb = next_fence(rep[1].fence, 1);
        write(&mut rep[1], fb, 10_000, 256).unwrap();
        write(&mut rep[0], fb, 10_000, 256).unwrap();
        // A resumes: its own replica takes its write, node 0 refuses it.
        write(&mut rep[2], fa, 1_000, a_read.fence).unwrap();
        assert!(write(&mut rep[0], fa, 1_000, a_read.fence).is_none());
        // A reads again from the refusal and a majority ({2, 0}).
        let mut read = rep[0];
        read.merge(rep[2]);
        read.merge(rep[0]);
        assert!(read.open());
        assert!(
            takeover_wait_ms(read.ttl_ms) >= takeover_wait_ms(10_000),
            "A would be told {} ms after its fence is stored, while B's 10 s lease runs",
            takeover_wait_ms(read.ttl_ms)
        );
        // Once B releases, the refused write of B's counter holds nothing up.
        read.merge(Reg {
            released: fb,
            ..Reg::default()
        });
        assert!(!read.open(), "{read:?}");
    }

    /// Third review of the register: grant L read a refused sibling (G) and missed a grant
    /// (H) whose write was still on its way, and replicas holding H took L's write (H is
    /// below what L read). L must learn of H from the entries its write replaced, and wait
    /// out H's lease.
    #[test]
    fn a_grant_waits_out_a_concurrent_grant_its_read_missed() {
        let init = Reg {
            fence: 256,
            ttl_ms: 1_000,
            released: 256,
        };
        let mut rep = [Slot {
            now: init,
            before: init,
        }; 5];
        let read = |rep: &[Slot; 5], from: [usize; 3]| {
            let mut m = rep[from[0]].now;
            for &j in &from[1..] {
                m.merge(rep[j].now);
            }
            m
        };
        // G (node 4, TTL 1 s) reads, then pauses; H (node 0, TTL 10 s) reads and stores on
        // node 0, then node 0 pauses with its other writes queued.
        let g_read = read(&rep, [4, 3, 2]);
        let fg = next_fence(g_read.fence, 4);
        let h_read = read(&rep, [0, 1, 2]);
        let fh = next_fence(h_read.fence, 0);
        rep[0].write(fh, 10_000, h_read.fence).unwrap();
        // G resumes: stored on 4 and 3, refused by 0 (it restarts).
        rep[4].write(fg, 1_000, g_read.fence).unwrap();
        rep[3].write(fg, 1_000, g_read.fence).unwrap();
        assert!(rep[0].write(fg, 1_000, g_read.fence).is_err());
        // L (node 1, TTL 1 s) reads G, not H.
        let l_read = read(&rep, [1, 2, 3]);
        let fl = next_fence(l_read.fence, 1);
        // H's writes reach 1 and 2: a majority, told with no wait.
        rep[1].write(fh, 10_000, h_read.fence).unwrap();
        rep[2].write(fh, 10_000, h_read.fence).unwrap();
        // L's writes are taken by 1, 2 and 3; what they held before goes into L's wait.
        let mut seen = l_read;
        for j in [1, 2, 3] {
            seen.merge(rep[j].write(fl, 1_000, l_read.fence).unwrap());
        }
        assert!(seen.open());
        assert!(
            takeover_wait_ms(seen.ttl_ms) >= takeover_wait_ms(10_000),
            "L ({fl}) told {} ms after its store while H ({fh}, TTL 10 s) may hold",
            takeover_wait_ms(seen.ttl_ms)
        );
        // A write sent again gets the first answer.
        assert_eq!(rep[1].write(fl, 1_000, l_read.fence), Ok(rep[1].before));
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
