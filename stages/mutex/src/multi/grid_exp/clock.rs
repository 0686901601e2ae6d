//! The logical clock of the grid evaluation (spec §6; see the parent module's
//! "Logical clock"): [`LogicalClock`] wraps any [`MultiSystem`] and stamps its messages
//! ([`Stamped`]) to measure the latency-weighted causal waiting time, and \[VN\]'s literal
//! Alg. 15 beside it ([`vn_channel`]). Measurement only: it must never change what the
//! wrapped algorithm does.

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Message, NodeId};

use crate::multi::model::{MultiOutbox, MultiOutput, MultiRequest, MultiSystem};

/// A message with the logical-clock stamp of its sender: per origin process, `(origin, epoch,
/// distance)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamped<M> {
    /// The algorithm's message.
    pub msg: M,
    /// The sender's known chains.
    pub stamp: Vec<(NodeId, u32, u64)>,
    /// \[VN\]'s vector (Alg. 15), on control-token and ACK messages only.
    pub vn: Option<Vec<u64>>,
}

/// Which of \[VN\]'s two logical-clock vectors a message rides on (Alg. 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VnChannel {
    /// The control token (`control_token`, `ct`).
    ControlToken,
    /// A resource-token acknowledgement (`ack1`, `ack2`).
    Ack,
}

/// The [`VnChannel`] of a message kind, if any (names used by [`GridAware`](crate::multi::GridAware) and
/// [`BouabdallahLaforest`](crate::multi::BouabdallahLaforest)).
pub fn vn_channel(kind: &str) -> Option<VnChannel> {
    match kind {
        "control_token" | "ct" => Some(VnChannel::ControlToken),
        "ack1" | "ack2" => Some(VnChannel::Ack),
        _ => None,
    }
}

impl<M: Message> Message for Stamped<M> {
    fn kind(&self) -> &'static str {
        self.msg.kind()
    }

    fn is_token(&self) -> bool {
        self.msg.is_token()
    }
}

/// Logical waiting times of the grants seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogicalWaits {
    /// Grants measured.
    pub count: u64,
    /// Sum of the logical waiting times.
    pub sum: f64,
    /// Sum of their squares.
    pub sum_sq: f64,
}

impl LogicalWaits {
    /// Mean (0 if none).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// Population standard deviation (0 if none).
    pub fn std(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let m = self.mean();
        (self.sum_sq / self.count as f64 - m * m).max(0.0).sqrt()
    }
}

/// The latency-weighted logical clock of §6 around a [`MultiSystem`] (see the module docs).
#[derive(Debug, Clone)]
pub struct LogicalClock<S> {
    inner: S,
    cluster: Vec<usize>,
    x_local: u64,
    x_remote: u64,
    /// `clock[p][q]`: the latest request epoch of `q` known at `p` and the longest chain from it.
    clock: Vec<Vec<Option<(u32, u64)>>>,
    epoch: Vec<u32>,
    waits: LogicalWaits,
    /// \[VN\]'s vectors per process: control token, ACKs.
    vn_ct: Vec<Vec<u64>>,
    vn_ack: Vec<Vec<u64>>,
    /// \[VN\]'s accumulators per process (reset at each request).
    vn_ct_wait: Vec<u64>,
    vn_token_wait: Vec<u64>,
    vn_waits: LogicalWaits,
}

impl<S: MultiSystem> LogicalClock<S> {
    /// Wraps `inner`; `cluster[p]` is `p`'s cluster, links inside a cluster weigh `x_local`,
    /// between clusters `x_remote`.
    pub fn new(inner: S, cluster: Vec<usize>, x_local: u64, x_remote: u64) -> Self {
        let n = cluster.len();
        Self {
            inner,
            cluster,
            x_local,
            x_remote,
            clock: vec![vec![None; n]; n],
            epoch: vec![0; n],
            waits: LogicalWaits::default(),
            vn_ct: vec![vec![0; n]; n],
            vn_ack: vec![vec![0; n]; n],
            vn_ct_wait: vec![0; n],
            vn_token_wait: vec![0; n],
            vn_waits: LogicalWaits::default(),
        }
    }

    /// The wrapped system.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The logical waiting times measured so far.
    pub fn waits(&self) -> LogicalWaits {
        self.waits
    }

    /// The waiting times by \[VN\]'s literal Alg. 15 (module docs) measured so far.
    pub fn vn_waits(&self) -> LogicalWaits {
        self.vn_waits
    }

    fn weight(&self, from: NodeId, to: NodeId) -> u64 {
        if self.cluster[from] == self.cluster[to] {
            self.x_local
        } else {
            self.x_remote
        }
    }

    fn check(&self, p: NodeId) -> Result<(), MutexError> {
        if p < self.cluster.len() {
            Ok(())
        } else {
            Err(MutexError::UnknownNode {
                node: p,
                n: self.cluster.len(),
            })
        }
    }

    /// Stamps the inner outputs and measures the grants.
    fn forward(
        &mut self,
        inner_out: &mut MultiOutbox<S::Msg>,
        out: &mut MultiOutbox<Stamped<S::Msg>>,
    ) {
        for o in inner_out.drain() {
            match o {
                MultiOutput::Send { from, to, msg } => {
                    let stamp = self
                        .clock
                        .get(from)
                        .map(|row| {
                            row.iter()
                                .enumerate()
                                .filter_map(|(q, e)| e.map(|(ep, d)| (q, ep, d)))
                                .collect()
                        })
                        .unwrap_or_default();
                    // Alg. 15 R.2: every entry of the sender's vector grows by the link's weight.
                    let w = if from < self.cluster.len() && to < self.cluster.len() {
                        self.weight(from, to)
                    } else {
                        0
                    };
                    let vectors = match vn_channel(msg.kind()) {
                        Some(VnChannel::ControlToken) => self.vn_ct.get_mut(from),
                        Some(VnChannel::Ack) => self.vn_ack.get_mut(from),
                        None => None,
                    };
                    let vn = vectors.map(|v| {
                        v.iter_mut().for_each(|x| *x += w);
                        v.clone()
                    });
                    out.send(from, to, Stamped { msg, stamp, vn });
                }
                MultiOutput::Grant { node, holds } => {
                    let mine = self
                        .clock
                        .get(node)
                        .and_then(|row| row[node])
                        .filter(|&(ep, _)| Some(&ep) == self.epoch.get(node));
                    if let Some((_, d)) = mine {
                        let d = d as f64;
                        self.waits.count += 1;
                        self.waits.sum += d;
                        self.waits.sum_sq += d * d;
                    }
                    if node < self.cluster.len() {
                        let d = (self.vn_ct_wait[node] + self.vn_token_wait[node]) as f64;
                        self.vn_waits.count += 1;
                        self.vn_waits.sum += d;
                        self.vn_waits.sum_sq += d * d;
                    }
                    out.grant(node, holds);
                }
            }
        }
    }
}

impl<S: MultiSystem> MultiSystem for LogicalClock<S> {
    type Msg = Stamped<S::Msg>;
    const NAME: &'static str = S::NAME;
    const REQUIRES_FIFO: bool = S::REQUIRES_FIFO;

    fn token_instance(msg: &Self::Msg) -> Option<usize> {
        S::token_instance(&msg.msg)
    }

    fn tokens_held(&self) -> Option<Vec<usize>> {
        self.inner.tokens_held()
    }

    fn preemptions(&self) -> u64 {
        self.inner.preemptions()
    }

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        self.check(node)?;
        self.epoch[node] += 1;
        self.clock[node][node] = Some((self.epoch[node], 0));
        self.vn_ct_wait[node] = 0;
        self.vn_token_wait[node] = 0;
        let mut inner_out = MultiOutbox::new();
        self.inner.request(node, req, &mut inner_out)?;
        self.forward(&mut inner_out, out);
        Ok(())
    }

    fn release(
        &mut self,
        node: NodeId,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        let mut inner_out = MultiOutbox::new();
        self.inner.release(node, &mut inner_out)?;
        self.forward(&mut inner_out, out);
        Ok(())
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: Self::Msg,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        self.check(from)?;
        self.check(to)?;
        let w = self.weight(from, to);
        // Alg. 15 R.1.
        if let Some(v) = &msg.vn {
            let (mine, acc) = match vn_channel(msg.msg.kind()) {
                Some(VnChannel::ControlToken) => (&mut self.vn_ct[to], &mut self.vn_ct_wait[to]),
                _ => (&mut self.vn_ack[to], &mut self.vn_token_wait[to]),
            };
            let got = v.get(to).copied().unwrap_or(0);
            *acc = if vn_channel(msg.msg.kind()) == Some(VnChannel::ControlToken) {
                got
            } else {
                (*acc).max(got)
            };
            for (m, &x) in mine.iter_mut().zip(v) {
                *m = (*m).max(x);
            }
            mine[to] = 0;
        }
        let row = &mut self.clock[to];
        for &(q, ep, d) in &msg.stamp {
            let Some(e) = row.get_mut(q) else { continue };
            let cand = (ep, d + w);
            *e = match *e {
                None => Some(cand),
                Some((cur, _)) if cur < ep => Some(cand),
                Some((cur, cd)) if cur == ep => Some((cur, cd.max(d + w))),
                keep => keep,
            };
        }
        let mut inner_out = MultiOutbox::new();
        self.inner.deliver(from, to, msg.msg, &mut inner_out)?;
        self.forward(&mut inner_out, out);
        Ok(())
    }
}
