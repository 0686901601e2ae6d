//! Token ring with Misra's ping-pong token-loss detection and regeneration (spec §5, \[DK\]).
//!
//! Two tokens travel the ring `i → (i+1) mod n` in the same direction: `t1` (the CS token, value
//! `> 0`) and `t2` (value `< 0`). Each node remembers `m`, the value of the last token it saw. A
//! token that arrives carrying exactly `m` has made a full round without the other token passing
//! this node, so the other token was lost on the link into this node; this node regenerates it.
//!
//! Decisions (the spec leaves these open, \[D\]/\[R\]):
//! - **Value arithmetic:** unbounded (`i64`) values, no modulus. `t1.val` only ever increases and
//!   `t2.val` only ever decreases, and they have opposite signs, so a value can never be confused
//!   with an older value of either token.
//! - **Meet:** `t1` is only ever held at a node while that node is in the CS (it is forwarded at
//!   once otherwise), and `t2` is never held. So the tokens "meet" exactly when `t2` arrives at a
//!   node that holds `t1`. Then `t1.val += 1`, `t2.val := -t1.val` and `m := t1.val`; no loss
//!   check is made (the other token is right here). This is the event where `t2` overtakes `t1`;
//!   without the value change `t2` would return to this node carrying `m` and raise a false alarm.
//! - **Regeneration of `t2`** (a `t1` arrives carrying `m`): `t1.val += 1`, a new `t2` with
//!   `-t1.val` is sent on first, then `t1` is handled as usual (`m := t1.val`). The raw
//!   "mi (t1.val)" is read as the increment, as in Misra's paper.
//! - **Regeneration of `t1`** (a `t2` arrives carrying `m` while `t1` is not here): `t2.val -= 1`,
//!   a new `t1` with `-t2.val` is created at this node. If the node waits for the CS it enters at
//!   once (and `t2` is forwarded, i.e. the tokens meet); otherwise `t1` is sent on before `t2`.
//! - **No false detection:** without a loss, every node sees `t1` and `t2` alternately, except
//!   after a meet, which changes both values; the tests run many seeds with no loss and assert
//!   that no node ever regenerates, and with one injected loss that exactly one regeneration of the
//!   right token happens.
//! - **Who detects:** a lost `t1` is always detected by the node that should have received it
//!   (`t2`, never held, passes every node in order). A lost `t2` is detected by its addressee too,
//!   unless `t2` had overtaken `t1` at some node `i` (a meet, which sets `m_i := t1.val`) since its
//!   last pass there: then `t1` finds `m_i` unchanged at `i` and `i` regenerates `t2` first. Either
//!   way exactly one regeneration happens (tested).
//! - **Fencing:** `t1` carries the fence counter as in the token ring. Because a lost `t1` takes
//!   its counter with it, every node remembers the largest fence it has seen (`fence_seen`) and
//!   `t2` carries the largest fence seen along its way. A regenerated `t1` starts from
//!   `max(fence_seen, t2.fence)`: the detecting node is the successor of the link where `t1` was
//!   lost, and the detecting `t2` passed that link's source after `t1` left it for the last time,
//!   so it carries at least the lost token's final fence. The checker verifies it.
//! - **Channels:** FIFO is required (the alternation argument relies on tokens not overtaking each
//!   other on a link). At most one token may be lost at a time (spec model).
//! - **Start:** both tokens start at the initial holder, `t1 = 1` sent ahead of `t2 = −1`, and
//!   every node starts with `m = −1`, as if the tokens had just completed a lap (so every node saw
//!   `t2` last). With this start a loss of the very first `t1` is detected by its addressee too.
//! - With `n = 1` the single node keeps `t1` for ever and no `t2` exists.

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of Misra's ring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MisraConfig {
    /// The node that holds both tokens initially (default 0).
    pub initial_holder: NodeId,
}

/// Messages of Misra's ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MisraMsg {
    /// The CS token.
    T1 {
        /// Token value (`> 0`).
        val: i64,
        /// Fence of the last grant made with this token.
        fence: Fence,
    },
    /// The detector token.
    T2 {
        /// Token value (`< 0`).
        val: i64,
        /// Largest fence seen along the way (used when `t1` must be regenerated).
        fence: Fence,
    },
}

impl Message for MisraMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::T1 { .. } => "t1",
            Self::T2 { .. } => "t2",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, Self::T1 { .. })
    }
}

/// One node of Misra's two-token ring.
#[derive(Debug, Clone)]
pub struct Misra {
    id: NodeId,
    n: usize,
    waiting: bool,
    in_cs: bool,
    /// `Some((val, fence))` while `t1` is held here.
    t1: Option<(i64, Fence)>,
    /// Value of the last token seen (`m_i`).
    m: i64,
    fence_seen: Fence,
    initial_holder: bool,
    regenerated_t1: u32,
    regenerated_t2: u32,
    meets: u64,
}

impl Misra {
    fn next(&self) -> NodeId {
        (self.id + 1) % self.n
    }

    /// How many times this node regenerated `t1`.
    pub fn regenerated_t1(&self) -> u32 {
        self.regenerated_t1
    }

    /// How many times this node regenerated `t2`.
    pub fn regenerated_t2(&self) -> u32 {
        self.regenerated_t2
    }

    /// How many times `t2` met `t1` at this node.
    pub fn meets(&self) -> u64 {
        self.meets
    }

    fn take_t1(&mut self, val: i64, fence: Fence, out: &mut Outbox<MisraMsg>) {
        self.fence_seen = self.fence_seen.max(fence);
        if self.waiting {
            self.waiting = false;
            self.in_cs = true;
            let f = fence + 1;
            self.fence_seen = f;
            self.t1 = Some((val, f));
            out.grant(f);
        } else {
            out.send(self.next(), MisraMsg::T1 { val, fence });
        }
    }

    fn on_t1(
        &mut self,
        mut val: i64,
        fence: Fence,
        out: &mut Outbox<MisraMsg>,
    ) -> Result<(), MutexError> {
        if self.t1.is_some() {
            return Err(protocol(self.id, "received t1 while holding t1"));
        }
        self.fence_seen = self.fence_seen.max(fence);
        if self.m == val {
            // t2 was lost on the link into this node: regenerate it ahead of t1.
            val += 1;
            self.regenerated_t2 += 1;
            out.send(
                self.next(),
                MisraMsg::T2 {
                    val: -val,
                    fence: self.fence_seen,
                },
            );
        }
        self.m = val;
        self.take_t1(val, fence, out);
        Ok(())
    }

    fn on_t2(&mut self, mut val: i64, fence: Fence, out: &mut Outbox<MisraMsg>) {
        self.fence_seen = self.fence_seen.max(fence);
        if let Some((v1, f1)) = self.t1 {
            // Meet: t2 overtakes the held t1.
            self.meets += 1;
            let v1 = v1 + 1;
            self.t1 = Some((v1, f1));
            self.m = v1;
            out.send(
                self.next(),
                MisraMsg::T2 {
                    val: -v1,
                    fence: self.fence_seen,
                },
            );
        } else if self.m == val {
            // t1 was lost on the link into this node: regenerate it here.
            val -= 1;
            self.regenerated_t1 += 1;
            let v1 = -val;
            let f = self.fence_seen;
            if self.waiting {
                self.m = v1;
                self.take_t1(v1, f, out);
                out.send(
                    self.next(),
                    MisraMsg::T2 {
                        val,
                        fence: self.fence_seen,
                    },
                );
            } else {
                self.m = val;
                out.send(self.next(), MisraMsg::T1 { val: v1, fence: f });
                out.send(self.next(), MisraMsg::T2 { val, fence: f });
            }
        } else {
            self.m = val;
            out.send(
                self.next(),
                MisraMsg::T2 {
                    val,
                    fence: self.fence_seen,
                },
            );
        }
    }
}

impl MutexNode for Misra {
    type Msg = MisraMsg;
    type Config = MisraConfig;
    const NAME: &'static str = "misra";
    const REQUIRES_FIFO: bool = true;
    const TOKEN_BASED: bool = true;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        check_node(config.initial_holder, n)?;
        let holder = id == config.initial_holder;
        Ok(Self {
            id,
            n,
            waiting: false,
            in_cs: false,
            t1: holder.then_some((1, 0)),
            // As if the tokens had just completed a lap, t1 ahead of t2: every node saw t2 last.
            m: -1,
            fence_seen: 0,
            initial_holder: holder,
            regenerated_t1: 0,
            regenerated_t2: 0,
            meets: 0,
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_start(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.n > 1
            && self.initial_holder
            && !self.in_cs
            && let Some((val, fence)) = self.t1.take()
        {
            // Both tokens start here; t1 leads, and t2 is the last token "seen" here.
            out.send(self.next(), MisraMsg::T1 { val, fence });
            out.send(self.next(), MisraMsg::T2 { val: -val, fence });
        }
        Ok(())
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.waiting || self.in_cs {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        match self.t1.as_mut() {
            Some((_, fence)) => {
                *fence += 1;
                self.fence_seen = *fence;
                self.in_cs = true;
                out.grant(*fence);
            }
            None => self.waiting = true,
        }
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        if self.n > 1 {
            let (val, fence) = self
                .t1
                .take()
                .ok_or_else(|| protocol(self.id, "in the CS without t1"))?;
            out.send(self.next(), MisraMsg::T1 { val, fence });
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        match msg {
            MisraMsg::T1 { val, fence } => self.on_t1(val, fence, out),
            MisraMsg::T2 { val, fence } => {
                self.on_t2(val, fence, out);
                Ok(())
            }
        }
    }

    fn holds_token(&self) -> bool {
        self.t1.is_some()
    }
}
