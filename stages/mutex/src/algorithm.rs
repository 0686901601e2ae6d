//! Algorithms chosen at run time: the [`Algorithm`] name, the analytic cost from the spec
//! (§15), and [`DynNode`], a type-erased node whose messages are dynamic [`Value`]s, so that a
//! Leda stage (or a lock service) can run any algorithm picked by configuration.
//!
//! Besides the eleven classic algorithms of [`Algorithm::ALL`], [`Algorithm::Quorum`] names the
//! crash-tolerant quorum protocol of [`crate::ft_quorum::protocol`] over one of the three quorum
//! generators (`quorum-grid`, `quorum-tree`, `quorum-vcube`; plain `quorum` means VCube). It is
//! the only algorithm whose nodes accept crash notices ([`DynNode::failure`]).

use std::fmt;
use std::str::FromStr;

use leda_core::value::Value;

use crate::algo::*;
use crate::error::MutexError;
use crate::ft_quorum::protocol::{FtQuorumConfig, FtQuorumNode};
use crate::ft_quorum::{CorrectSet, Generator};
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, Output};
use crate::quorum::grid_quorums;
use crate::sim::{Report, SimConfig, simulate};

/// The algorithms of the crate, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Centralised coordinator (node 0).
    Centralized,
    /// Token ring.
    TokenRing,
    /// Misra's two-token ring with loss detection and regeneration.
    Misra,
    /// Lamport's algorithm.
    Lamport,
    /// Ricart–Agrawala.
    RicartAgrawala,
    /// Roucairol–Carvalho.
    RoucairolCarvalho,
    /// Suzuki–Kasami broadcast token.
    SuzukiKasami,
    /// Raymond's static tree (binary heap-shaped tree rooted at node 0).
    Raymond,
    /// Naimi–Tréhel (Li–Hudak `next` form).
    NaimiTrehel,
    /// Maekawa voting with Sanders' INQUIRE/RELINQUISH over grid quorums.
    Maekawa,
    /// Naive Maekawa voting (no INQUIRE): deadlock-prone, kept to show that the checker sees it.
    MaekawaNaive,
    /// The crash-tolerant quorum protocol (REQUEST, REPLY, FAILED, INQUIRE, YIELD, RELEASE,
    /// CANCEL) over the quorums of this generator, recomputed on every crash notice
    /// ([`FtQuorumNode`]).
    Quorum(Generator),
}

impl Algorithm {
    /// Position in the canonical order: [`Algorithm::ALL`], then [`Algorithm::QUORUM`].
    fn rank(self) -> usize {
        match self {
            Algorithm::Quorum(g) => {
                Self::ALL.len() + Generator::ALL.iter().position(|x| *x == g).unwrap_or(0)
            }
            a => Self::ALL.iter().position(|x| *x == a).unwrap_or(0),
        }
    }
}

impl PartialOrd for Algorithm {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Algorithm {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

/// The kind of workload an analytic figure applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// One requester at a time (light load).
    Light,
    /// Every node always has a pending request (heavy load).
    Heavy,
}

impl Algorithm {
    /// The crash-tolerant quorum protocol over each generator (grid, tree, VCube).
    pub const QUORUM: [Algorithm; 3] = [
        Algorithm::Quorum(Generator::Grid),
        Algorithm::Quorum(Generator::Tree),
        Algorithm::Quorum(Generator::VCube),
    ];

    /// Every classic (failure-free) algorithm, the broken naive Maekawa last. The quorum
    /// variants are in [`Algorithm::QUORUM`]; [`Algorithm::every`] chains both.
    pub const ALL: [Algorithm; 11] = [
        Algorithm::Centralized,
        Algorithm::TokenRing,
        Algorithm::Misra,
        Algorithm::Lamport,
        Algorithm::RicartAgrawala,
        Algorithm::RoucairolCarvalho,
        Algorithm::SuzukiKasami,
        Algorithm::Raymond,
        Algorithm::NaimiTrehel,
        Algorithm::Maekawa,
        Algorithm::MaekawaNaive,
    ];

    /// Every algorithm: [`Algorithm::ALL`] then [`Algorithm::QUORUM`].
    pub fn every() -> impl Iterator<Item = Algorithm> {
        Self::ALL.into_iter().chain(Self::QUORUM)
    }

    /// The generator of a [`Algorithm::Quorum`] variant.
    pub fn generator(self) -> Option<Generator> {
        match self {
            Algorithm::Quorum(g) => Some(g),
            _ => None,
        }
    }

    /// Whether the algorithm tolerates crashes (accepts crash notices).
    pub fn tolerates_crashes(self) -> bool {
        matches!(self, Algorithm::Quorum(_))
    }

    /// The ten correct classic algorithms of the issue (without the broken naive Maekawa).
    pub fn correct() -> impl Iterator<Item = Algorithm> {
        Self::ALL
            .into_iter()
            .filter(|a| *a != Algorithm::MaekawaNaive)
    }

    /// The command-line name (`ricart-agrawala`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Centralized => "centralized",
            Algorithm::TokenRing => "token-ring",
            Algorithm::Misra => "misra",
            Algorithm::Lamport => "lamport",
            Algorithm::RicartAgrawala => "ricart-agrawala",
            Algorithm::RoucairolCarvalho => "roucairol-carvalho",
            Algorithm::SuzukiKasami => "suzuki-kasami",
            Algorithm::Raymond => "raymond",
            Algorithm::NaimiTrehel => "naimi-trehel",
            Algorithm::Maekawa => "maekawa",
            Algorithm::MaekawaNaive => "maekawa-naive",
            Algorithm::Quorum(Generator::Grid) => "quorum-grid",
            Algorithm::Quorum(Generator::Tree) => "quorum-tree",
            Algorithm::Quorum(Generator::VCube) => "quorum-vcube",
        }
    }

    /// Whether the algorithm needs FIFO links.
    pub fn requires_fifo(self) -> bool {
        self.dispatch(Probe::Fifo)
    }

    /// Whether the algorithm is token based.
    pub fn token_based(self) -> bool {
        self.dispatch(Probe::Token)
    }

    /// Whether the algorithm keeps a token moving even when nobody asks for the CS (so a run
    /// never becomes idle on its own).
    pub fn circulates_idly(self) -> bool {
        matches!(self, Algorithm::TokenRing | Algorithm::Misra)
    }

    /// The largest quorum (`max |S_i|`) for the Maekawa variants over `n` nodes; for the
    /// quorum protocol, the largest fault-free quorum of its generator (`None` where the
    /// generator does not apply, e.g. VCube for a group size that is not a power of two).
    pub fn quorum_size(self, n: usize) -> Option<usize> {
        match self {
            Algorithm::Maekawa | Algorithm::MaekawaNaive => {
                Some(grid_quorums(n).iter().map(Vec::len).max().unwrap_or(0))
            }
            Algorithm::Quorum(g) => fault_free_quorum_sizes(g, n)?.into_iter().max(),
            _ => None,
        }
    }

    /// The mean fault-free quorum size `mean |Q_i|` of the quorum protocol over `n` nodes.
    pub fn mean_quorum_size(self, n: usize) -> Option<f64> {
        let sizes = fault_free_quorum_sizes(self.generator()?, n)?;
        (!sizes.is_empty()).then(|| sizes.iter().sum::<usize>() as f64 / sizes.len() as f64)
    }

    /// The spec's analytic messages per CS (§15) for `n` nodes, where it gives a number.
    /// Conventions follow the implementation: the coordinator is node 0 and a CS of the
    /// coordinator itself costs no message; Maekawa counts the messages to self (`3K`, `5K`).
    /// `Light` means one request at a time from a node other than the initial holder.
    pub fn theory_msgs_per_cs(self, n: usize, load: Load) -> Option<f64> {
        let nf = n as f64;
        let k = self.quorum_size(n).unwrap_or(0) as f64;
        let log2 = nf.log2().max(1.0);
        Some(match (self, load) {
            (Algorithm::Centralized, _) => 3.0,
            (Algorithm::TokenRing, Load::Light) => nf / 2.0,
            (Algorithm::TokenRing, Load::Heavy) => 1.0,
            (Algorithm::Misra, Load::Light) => nf,
            (Algorithm::Misra, Load::Heavy) => 2.0,
            (Algorithm::Lamport, _) => 3.0 * (nf - 1.0),
            (Algorithm::RicartAgrawala, _) => 2.0 * (nf - 1.0),
            // The spec gives the range 0 … 2(N−1); the upper bound is what is plotted.
            (Algorithm::RoucairolCarvalho, _) => 2.0 * (nf - 1.0),
            (Algorithm::SuzukiKasami, _) => nf,
            (Algorithm::Raymond, Load::Light) => 2.0 * log2,
            (Algorithm::Raymond, Load::Heavy) => 4.0,
            (Algorithm::NaimiTrehel, _) => log2 + 1.0,
            (Algorithm::Maekawa | Algorithm::MaekawaNaive, Load::Light) => 3.0 * k,
            (Algorithm::Maekawa, Load::Heavy) => 5.0 * k,
            (Algorithm::MaekawaNaive, Load::Heavy) => return None,
            // Spec §6: 3|Q| without contention (self-messages counted), the requester being
            // random; FAILED/INQUIRE/YIELD under contention have no closed form.
            (Algorithm::Quorum(_), Load::Light) => 3.0 * self.mean_quorum_size(n)?,
            (Algorithm::Quorum(_), Load::Heavy) => return None,
        })
    }

    /// The spec's synchronisation delay in units of the one-hop delay T, where it is a number.
    pub fn theory_sync_delay(self, n: usize) -> Option<f64> {
        let nf = n as f64;
        match self {
            Algorithm::Centralized
            | Algorithm::Maekawa
            | Algorithm::MaekawaNaive
            | Algorithm::Quorum(_) => Some(2.0),
            Algorithm::Lamport
            | Algorithm::RicartAgrawala
            | Algorithm::RoucairolCarvalho
            | Algorithm::NaimiTrehel
            | Algorithm::SuzukiKasami => Some(1.0),
            Algorithm::Raymond => Some(nf.log2().max(1.0) / 2.0),
            Algorithm::TokenRing | Algorithm::Misra => None,
        }
    }

    /// Builds node `id` of `n` with the default configuration of the algorithm.
    pub fn node(self, id: NodeId, n: usize) -> Result<Box<dyn DynNode>, MutexError> {
        fn make<A: MutexNode + Send + 'static>(
            id: NodeId,
            n: usize,
            cfg: &A::Config,
        ) -> Result<Box<dyn DynNode>, MutexError> {
            Ok(Box::new(Erased::<A> {
                node: A::new(id, n, cfg)?,
                out: Outbox::new(),
            }))
        }
        match self {
            Algorithm::Centralized => make::<Centralized>(id, n, &Default::default()),
            Algorithm::TokenRing => make::<TokenRing>(id, n, &Default::default()),
            Algorithm::Misra => make::<Misra>(id, n, &Default::default()),
            Algorithm::Lamport => make::<Lamport>(id, n, &Default::default()),
            Algorithm::RicartAgrawala => make::<RicartAgrawala>(id, n, &Default::default()),
            Algorithm::RoucairolCarvalho => make::<RoucairolCarvalho>(id, n, &Default::default()),
            Algorithm::SuzukiKasami => make::<SuzukiKasami>(id, n, &Default::default()),
            Algorithm::Raymond => make::<Raymond>(id, n, &Default::default()),
            Algorithm::NaimiTrehel => make::<NaimiTrehel>(id, n, &Default::default()),
            Algorithm::Maekawa => make::<Maekawa>(id, n, &Default::default()),
            Algorithm::MaekawaNaive => make::<Maekawa>(
                id,
                n,
                &MaekawaConfig {
                    variant: MaekawaVariant::Naive,
                    quorums: None,
                },
            ),
            Algorithm::Quorum(g) => make::<FtQuorumNode>(id, n, &FtQuorumConfig::generator(g)),
        }
    }

    /// Runs the crate's state-machine simulator ([`crate::sim`]) with the default configuration
    /// of the algorithm.
    pub fn simulate(self, cfg: SimConfig) -> Result<Report, MutexError> {
        match self {
            Algorithm::Centralized => simulate::<Centralized>(cfg, &Default::default()),
            Algorithm::TokenRing => simulate::<TokenRing>(cfg, &Default::default()),
            Algorithm::Misra => simulate::<Misra>(cfg, &Default::default()),
            Algorithm::Lamport => simulate::<Lamport>(cfg, &Default::default()),
            Algorithm::RicartAgrawala => simulate::<RicartAgrawala>(cfg, &Default::default()),
            Algorithm::RoucairolCarvalho => simulate::<RoucairolCarvalho>(cfg, &Default::default()),
            Algorithm::SuzukiKasami => simulate::<SuzukiKasami>(cfg, &Default::default()),
            Algorithm::Raymond => simulate::<Raymond>(cfg, &Default::default()),
            Algorithm::NaimiTrehel => simulate::<NaimiTrehel>(cfg, &Default::default()),
            Algorithm::Maekawa => simulate::<Maekawa>(cfg, &Default::default()),
            Algorithm::MaekawaNaive => simulate::<Maekawa>(
                cfg,
                &MaekawaConfig {
                    variant: MaekawaVariant::Naive,
                    quorums: None,
                },
            ),
            Algorithm::Quorum(g) => simulate::<FtQuorumNode>(cfg, &FtQuorumConfig::generator(g)),
        }
    }

    fn dispatch(self, probe: Probe) -> bool {
        fn get<A: MutexNode>(p: Probe) -> bool {
            match p {
                Probe::Fifo => A::REQUIRES_FIFO,
                Probe::Token => A::TOKEN_BASED,
            }
        }
        match self {
            Algorithm::Centralized => get::<Centralized>(probe),
            Algorithm::TokenRing => get::<TokenRing>(probe),
            Algorithm::Misra => get::<Misra>(probe),
            Algorithm::Lamport => get::<Lamport>(probe),
            Algorithm::RicartAgrawala => get::<RicartAgrawala>(probe),
            Algorithm::RoucairolCarvalho => get::<RoucairolCarvalho>(probe),
            Algorithm::SuzukiKasami => get::<SuzukiKasami>(probe),
            Algorithm::Raymond => get::<Raymond>(probe),
            Algorithm::NaimiTrehel => get::<NaimiTrehel>(probe),
            Algorithm::Maekawa | Algorithm::MaekawaNaive => get::<Maekawa>(probe),
            Algorithm::Quorum(_) => get::<FtQuorumNode>(probe),
        }
    }
}

#[derive(Clone, Copy)]
enum Probe {
    Fifo,
    Token,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = MutexError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace(['_', ' '], "-");
        let alias = match norm.as_str() {
            "coordinator" | "central" => "centralized",
            "ring" => "token-ring",
            "ra" => "ricart-agrawala",
            "rc" => "roucairol-carvalho",
            "sk" => "suzuki-kasami",
            "nt" | "li-hudak" => "naimi-trehel",
            "sanders" => "maekawa",
            "naive-maekawa" => "maekawa-naive",
            "quorum" | "ft-quorum" | "quorum-vcube" | "vcube" => "quorum-vcube",
            "quorum-maekawa" | "ft-quorum-grid" => "quorum-grid",
            "quorum-agrawal" | "ft-quorum-tree" => "quorum-tree",
            other => other,
        };
        Algorithm::every()
            .find(|a| a.name() == alias)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::every().map(|a| a.name()).collect();
                MutexError::Config(format!(
                    "unknown algorithm {s:?}; known: {}",
                    names.join(", ")
                ))
            })
    }
}

/// One effect of a [`DynNode`] handler.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Send `body` (a message of kind `kind`) to node `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
        /// Whether the message carries the token.
        token: bool,
        /// The message as a dynamic value (msgpack-compatible).
        body: Value,
    },
    /// A message to self, handled inside the node (counted, never sent).
    Local {
        /// Message kind.
        kind: &'static str,
    },
    /// The local application may enter the critical section.
    Grant {
        /// The fencing token.
        fence: Fence,
    },
}

/// The fault-free quorum size of every process, or `None` if the generator does not apply.
fn fault_free_quorum_sizes(g: Generator, n: usize) -> Option<Vec<usize>> {
    let all = CorrectSet::all(n);
    (0..n)
        .map(|i| g.quorum(i, &all).ok().map(|q| q.len()))
        .collect()
}

/// A type-erased [`MutexNode`]: the same five inputs, messages as dynamic [`Value`]s.
pub trait DynNode: Send {
    /// The node's id.
    fn id(&self) -> NodeId;
    /// The START event.
    fn start(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError>;
    /// The local application asks for the CS.
    fn request(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError>;
    /// The local application leaves the CS.
    fn release(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError>;
    /// A message `body` from `from` arrived.
    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<Effect>,
    ) -> Result<(), MutexError>;
    /// A failure detector reports that `failed` crashed. Only crash-tolerant algorithms
    /// ([`Algorithm::tolerates_crashes`]) accept it; the others answer
    /// [`MutexError::FailureNotTolerated`].
    fn failure(&mut self, failed: NodeId, out: &mut Vec<Effect>) -> Result<(), MutexError>;
    /// Whether this node holds the token (token algorithms).
    fn holds_token(&self) -> bool;
    /// Whether `body` is a token message of this algorithm.
    fn is_token(&self, body: &Value) -> bool;
}

struct Erased<A: MutexNode> {
    node: A,
    out: Outbox<A::Msg>,
}

impl<A: MutexNode + Send + 'static> Erased<A> {
    fn flush(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError> {
        for o in self.out.drain() {
            out.push(match o {
                Output::Send { to, msg } => Effect::Send {
                    to,
                    kind: msg.kind(),
                    token: msg.is_token(),
                    body: Value::from_serde(&msg)
                        .map_err(|e| MutexError::Encoding(e.to_string()))?,
                },
                Output::Local { kind } => Effect::Local { kind },
                Output::Grant { fence } => Effect::Grant { fence },
            });
        }
        Ok(())
    }

    fn with(
        &mut self,
        out: &mut Vec<Effect>,
        f: impl FnOnce(&mut A, &mut Outbox<A::Msg>) -> Result<(), MutexError>,
    ) -> Result<(), MutexError> {
        self.out.clear();
        let r = f(&mut self.node, &mut self.out);
        self.flush(out)?;
        r
    }
}

impl<A: MutexNode + Send + 'static> DynNode for Erased<A> {
    fn id(&self) -> NodeId {
        self.node.id()
    }
    fn start(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_start(o))
    }
    fn request(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_request(o))
    }
    fn release(&mut self, out: &mut Vec<Effect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_release(o))
    }
    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<Effect>,
    ) -> Result<(), MutexError> {
        let msg: A::Msg = body.to().map_err(|e| MutexError::Protocol {
            node: self.node.id(),
            detail: format!("undecodable message from {from}: {e}"),
        })?;
        self.with(out, |n, o| n.on_message(from, msg, o))
    }
    fn failure(&mut self, failed: NodeId, out: &mut Vec<Effect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_failure(failed, o))
    }
    fn holds_token(&self) -> bool {
        self.node.holds_token()
    }
    fn is_token(&self, body: &Value) -> bool {
        body.to::<A::Msg>().is_ok_and(|m| m.is_token())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for a in Algorithm::every() {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        assert_eq!(
            "quorum".parse::<Algorithm>(),
            Ok(Algorithm::Quorum(Generator::VCube))
        );
        let mut sorted: Vec<Algorithm> = Algorithm::every().collect();
        sorted.sort();
        assert_eq!(sorted, Algorithm::every().collect::<Vec<_>>());
        assert_eq!("RA".parse::<Algorithm>(), Ok(Algorithm::RicartAgrawala));
        let err = "bakery".parse::<Algorithm>().unwrap_err();
        assert!(err.to_string().contains("ricart-agrawala"), "{err}");
    }

    #[test]
    fn erased_nodes_exchange_values() {
        let mut a = Algorithm::RicartAgrawala.node(0, 2).unwrap();
        let mut b = Algorithm::RicartAgrawala.node(1, 2).unwrap();
        let mut out = Vec::new();
        a.request(&mut out).unwrap();
        let Some(Effect::Send { to: 1, body, .. }) = out.pop() else {
            panic!("expected a request to node 1")
        };
        b.message(0, &body, &mut out).unwrap();
        let Some(Effect::Send { to: 0, body, .. }) = out.pop() else {
            panic!("expected a reply to node 0")
        };
        a.message(1, &body, &mut out).unwrap();
        assert!(matches!(out.pop(), Some(Effect::Grant { .. })));
        assert!(b.message(0, &Value::Int(3), &mut out).is_err());
    }
}

#[cfg(test)]
mod quorum_tests {
    use super::*;

    /// Drives erased quorum nodes by hand: delivers every send at once, FIFO per link.
    fn pump(nodes: &mut [Box<dyn DynNode>], from: NodeId, out: Vec<Effect>) -> Vec<Fence> {
        let mut grants = Vec::new();
        let mut queue: std::collections::VecDeque<(NodeId, Effect)> =
            out.into_iter().map(|e| (from, e)).collect();
        while let Some((src, e)) = queue.pop_front() {
            match e {
                Effect::Send { to, body, .. } => {
                    let mut o = Vec::new();
                    nodes[to].message(src, &body, &mut o).unwrap();
                    queue.extend(o.into_iter().map(|e| (to, e)));
                }
                Effect::Grant { fence } => grants.push(fence),
                Effect::Local { .. } => {}
            }
        }
        grants
    }

    #[test]
    fn quorum_algorithms_are_named_sized_and_run_as_dyn_nodes() {
        let a: Algorithm = "quorum-tree".parse().unwrap();
        assert_eq!(a, Algorithm::Quorum(Generator::Tree));
        assert!(a.requires_fifo() && !a.token_based() && a.tolerates_crashes());
        assert!(!Algorithm::Maekawa.tolerates_crashes());
        // VCube fault-free quorums have n/2 + 1 members; 3|Q| messages per CS at light load.
        let v = Algorithm::Quorum(Generator::VCube);
        assert_eq!(v.quorum_size(8), Some(5));
        assert_eq!(v.theory_msgs_per_cs(8, Load::Light), Some(15.0));
        assert_eq!(v.quorum_size(6), None);

        let n = 8;
        let mut nodes: Vec<Box<dyn DynNode>> = (0..n).map(|i| v.node(i, n).unwrap()).collect();
        // Node 1 crashes; everyone else is told (and FLUSHes it) before node 0 asks.
        for i in (0..n).filter(|&i| i != 1) {
            let mut o = Vec::new();
            nodes[i].failure(1, &mut o).unwrap();
            let flushes = o
                .iter()
                .filter(|e| matches!(e, Effect::Send { to, kind: "flush", .. } if *to != 1))
                .count();
            assert_eq!(flushes, n - 2, "{o:?}");
            assert!(pump(&mut nodes, i, o).is_empty());
        }
        let mut out = Vec::new();
        nodes[0].request(&mut out).unwrap();
        assert!(
            out.iter().all(|e| !matches!(e, Effect::Send { to: 1, .. })),
            "nothing goes to the crashed node: {out:?}"
        );
        assert_eq!(pump(&mut nodes, 0, out), vec![1]);
        let mut out = Vec::new();
        nodes[0].release(&mut out).unwrap();
        assert!(pump(&mut nodes, 0, out).is_empty());

        // A classic algorithm refuses crash notices with a typed error.
        let mut ra = Algorithm::RicartAgrawala.node(0, 3).unwrap();
        assert!(matches!(
            ra.failure(1, &mut Vec::new()),
            Err(MutexError::FailureNotTolerated { .. })
        ));
    }

    #[test]
    fn quorum_algorithms_simulate_cleanly() {
        for a in Algorithm::QUORUM {
            let mut cfg = SimConfig::new(8, 3);
            cfg.workload.requests_per_node = 2;
            let r = a.simulate(cfg).unwrap();
            assert!(r.verdict.is_ok(), "{a}: {:?}", r.verdict);
            assert_eq!(r.metrics.cs_entries, 16, "{a}");
        }
    }
}
