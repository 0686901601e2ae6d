//! Algorithms chosen at run time: the [`Algorithm`] name, the analytic cost from the spec
//! (§15), and [`DynNode`], a type-erased node whose messages are dynamic [`Value`]s, so that a
//! Leda stage (or a lock service) can run any algorithm picked by configuration.

use std::fmt;
use std::str::FromStr;

use leda_core::value::Value;

use crate::algo::*;
use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, Output};
use crate::quorum::grid_quorums;
use crate::sim::{Report, SimConfig, simulate};

/// The algorithms of the crate, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// Every algorithm, the broken naive Maekawa last.
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

    /// The ten correct algorithms of the issue (without the broken naive Maekawa).
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

    /// The largest quorum (`max |S_i|`) for the Maekawa variants over `n` nodes.
    pub fn quorum_size(self, n: usize) -> Option<usize> {
        matches!(self, Algorithm::Maekawa | Algorithm::MaekawaNaive)
            .then(|| grid_quorums(n).iter().map(Vec::len).max().unwrap_or(0))
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
        })
    }

    /// The spec's synchronisation delay in units of the one-hop delay T, where it is a number.
    pub fn theory_sync_delay(self, n: usize) -> Option<f64> {
        let nf = n as f64;
        match self {
            Algorithm::Centralized | Algorithm::Maekawa | Algorithm::MaekawaNaive => Some(2.0),
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
            other => other,
        };
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == alias)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
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
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
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
