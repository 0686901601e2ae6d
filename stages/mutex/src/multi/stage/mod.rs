//! Multi-resource algorithms as Leda stages.
//!
//! A process of the group is one serial **multi node stage** (`multi<i>`) holding one
//! per-process state machine ([`MultiNode`], erased to [`DynMultiNode`] so the algorithm is
//! chosen by name, [`MultiAlgorithm`]). Resources are named: the stage is configured with a
//! list of `(name, instances)` ([`NamedSpace`]); type `r` of the algorithm's
//! [`ResourceSpace`](crate::multi::ResourceSpace) is the `r`-th name.
//!
//! | input event                    | meaning                                               |
//! |--------------------------------|-------------------------------------------------------|
//! | `("request", items)`           | the application asks for `items` (see [`NamedSpace::parse_request`]) |
//! | `("request", items, true)`     | try: granted now, or withdrawn (`multi-would-block`)  |
//! | `("release")`                  | the application leaves its CS, releasing everything   |
//! | `("cancel")`                   | withdraw the pending request (or release if granted)  |
//! | `("msg", from, body)`          | a protocol message from process `from`                |
//!
//! | output port | event                                                             |
//! |-------------|-------------------------------------------------------------------|
//! | `peer<j>`   | `("msg", me, body)` to process `j`'s stage                        |
//! | `grant`     | `("multi-grant", holds)` with `holds` an array of `[name, instance, fence]`; `("multi-released")` once a release (or a withdrawn grant) was handled; `("multi-would-block")` for a try that cannot be granted at once; `("multi-refused", why)` for a malformed request, a request while one is pending, a release without a grant |
//!
//! The tags differ from the single-resource node stage's ([`crate::stage`]) so one front stage
//! can talk to both. A withdrawn request stays in the algorithm (none of them can take a
//! request back); when its grant comes the stage releases at once and reports
//! `multi-released`. One outstanding request per process: several local clients are
//! multiplexed in front (the lock service's front stage).
//!
//! Stages are joined pairwise by decoupled connectors ([`crate::stage::connect_peers`]), so the
//! graph partitions into one cluster per process and runs under leda-core's simulated executor
//! ([`super::stage_sim`]), in one process, or over leda-net. A [`MultiObserver`] sees every
//! request, grant, release, message and token change, in (virtual) time.
//!
//! This module owns the stage (its events in and out, the per-process state, the
//! observer); `algorithm` the state machines and choosing one by name, `erased` their
//! type erasure to dynamic values, `request` resource names and request forms.

use std::fmt;
use std::sync::Arc;

use leda_core::port::Port;
use leda_core::prelude::*;

use crate::error::MutexError;
use crate::node::NodeId;
use crate::stage::peer_port;

use super::model::{Hold, MultiRequest};

/// The registry kind of multi node stages.
pub const MULTI_KIND: &str = "mutex.multi";

mod algorithm;
mod erased;
mod request;

pub use algorithm::{MultiAlgorithm, MultiNode};
pub use erased::{DynMultiNode, MultiEffect, erase};
pub use request::{MultiRequestError, NamedSpace};

/// What a multi node stage reports to its [`MultiObserver`].
#[derive(Debug, Clone, PartialEq)]
pub enum MultiNodeEvent<'a> {
    /// The application asked for `req`.
    Request(&'a MultiRequest),
    /// The CS was granted holding these instances.
    Grant(&'a [Hold]),
    /// The application left the CS (or a withdrawn grant was given back).
    Release,
    /// A message was sent to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Kind.
        kind: &'static str,
        /// The flat instance whose token it carries, if any.
        token: Option<usize>,
    },
    /// A message from `from` was delivered.
    Deliver {
        /// Sender.
        from: NodeId,
        /// The flat instance whose token it carries, if any.
        token: Option<usize>,
    },
    /// After a handler, for token algorithms: per flat instance, whether this process holds
    /// its token.
    Tokens(&'a [bool]),
    /// A handler failed (the process refuses input from now on).
    Error(&'a MutexError),
}

/// Sees what multi node stages do, from inside their handlers, in the order they run.
pub trait MultiObserver: Send + Sync + 'static {
    /// `node`'s stage did something at `time` (seconds; virtual in simulation).
    fn observe(&self, time: f64, node: NodeId, ev: MultiNodeEvent<'_>);
}

/// How a multi node stage is built.
#[derive(Clone)]
pub struct MultiNodeSpec {
    /// The algorithm.
    pub algorithm: MultiAlgorithm,
    /// This process.
    pub id: NodeId,
    /// Group size.
    pub n: usize,
    /// The resources.
    pub resources: NamedSpace,
    /// Number of clusters the group is split into evenly (`p * clusters / n`); only the
    /// grid-aware algorithm uses it. 1 unless set.
    pub clusters: usize,
    /// Observer, if any.
    pub observer: Option<Arc<dyn MultiObserver>>,
}

impl fmt::Debug for MultiNodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiNodeSpec")
            .field("algorithm", &self.algorithm)
            .field("id", &self.id)
            .field("n", &self.n)
            .field("resources", &self.resources)
            .field("clusters", &self.clusters)
            .finish()
    }
}

/// The name of process `i`'s multi node stage (`multi<i>`).
pub fn multi_node_name(i: NodeId) -> String {
    format!("multi{i}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Idle,
    /// `withdrawn`: the application gave up; the grant is released when it comes.
    Requested {
        withdrawn: bool,
    },
    Held,
}

struct MultiState {
    spec: MultiNodeSpec,
    node: Box<dyn DynMultiNode>,
    phase: Phase,
    failed: bool,
    peers: Vec<Port>,
    effects: Vec<MultiEffect>,
    tokens: Vec<bool>,
}

impl MultiState {
    fn new(spec: MultiNodeSpec) -> Result<Self, MutexError> {
        let node = spec.algorithm.node_in_clusters(
            spec.id,
            spec.n,
            spec.clusters,
            spec.resources.space(),
        )?;
        let peers = (0..spec.n).map(|j| Port::from(peer_port(j))).collect();
        let tokens = vec![false; spec.resources.space().total_instances()];
        Ok(Self {
            spec,
            node,
            phase: Phase::Idle,
            failed: false,
            peers,
            effects: Vec::new(),
            tokens,
        })
    }

    fn observe(&self, ctx: &Ctx, ev: MultiNodeEvent<'_>) {
        if let Some(o) = &self.spec.observer {
            o.observe(ctx.gettime(), self.spec.id, ev);
        }
    }

    fn refuse(ctx: &mut Ctx, why: String) -> HandlerResult {
        crate::stage::to_app(ctx, ("multi-refused", why))?;
        Ok(())
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: &str = ev.get(0)?;
        match tag {
            "request" => {
                if self.phase != Phase::Idle {
                    return Self::refuse(ctx, "a request is already pending or held".into());
                }
                let req = match ev.arg(1) {
                    None => Err(MultiRequestError::Malformed("no resources given".into())),
                    Some(v) => self.spec.resources.parse_request(v),
                };
                let req = match req {
                    Ok(r) => r,
                    Err(e) => return Self::refuse(ctx, e.to_string()),
                };
                let try_only = ev.arg(2).and_then(Value::as_bool).unwrap_or(false);
                self.phase = Phase::Requested { withdrawn: false };
                self.observe(ctx, MultiNodeEvent::Request(&req));
                self.step(ctx, |n, out| n.request(&req, out))?;
                if try_only && self.phase != Phase::Held {
                    // Not grantable without waiting for other processes: withdraw.
                    self.phase = Phase::Requested { withdrawn: true };
                    crate::stage::to_app(ctx, "multi-would-block")?;
                }
                Ok(())
            }
            "release" => {
                if self.phase != Phase::Held {
                    return Self::refuse(ctx, "release without holding".into());
                }
                self.release(ctx)
            }
            "cancel" => match self.phase {
                Phase::Requested { .. } => {
                    self.phase = Phase::Requested { withdrawn: true };
                    Ok(())
                }
                Phase::Held => self.release(ctx),
                Phase::Idle => {
                    crate::stage::to_app(ctx, "multi-released")?;
                    Ok(())
                }
            },
            "msg" => {
                let from: NodeId = ev.get(1)?;
                let body = ev
                    .arg(2)
                    .ok_or_else(|| MutexError::Encoding("message without a body".into()))?;
                if self.spec.observer.is_some() {
                    let token = self.node.token_of(body);
                    self.observe(ctx, MultiNodeEvent::Deliver { from, token });
                }
                self.step(ctx, |n, out| n.message(from, body, out))
            }
            other => Err(format!("multi node stage: unknown event {other:?}").into()),
        }
    }

    fn release(&mut self, ctx: &mut Ctx) -> HandlerResult {
        self.phase = Phase::Idle;
        self.observe(ctx, MultiNodeEvent::Release);
        self.step(ctx, |n, out| n.release(out))?;
        crate::stage::to_app(ctx, "multi-released")?;
        Ok(())
    }

    fn step(
        &mut self,
        ctx: &mut Ctx,
        f: impl FnOnce(&mut dyn DynMultiNode, &mut Vec<MultiEffect>) -> Result<(), MutexError>,
    ) -> HandlerResult {
        let me = self.spec.id;
        if self.failed {
            return Err(format!("multi node {me} stopped after an earlier error").into());
        }
        let mut effects = std::mem::take(&mut self.effects);
        effects.clear();
        let result = f(self.node.as_mut(), &mut effects);
        let mut sent = Ok(());
        let mut auto_release = false;
        for e in effects.drain(..) {
            match e {
                MultiEffect::Send {
                    to,
                    kind,
                    token,
                    body,
                } => {
                    self.observe(ctx, MultiNodeEvent::Send { to, kind, token });
                    let Some(port) = self.peers.get(to) else {
                        sent = Err(MutexError::UnknownNode {
                            node: to,
                            n: self.spec.n,
                        });
                        continue;
                    };
                    let ev = Event::new().with("msg").with(me as i64).with(body);
                    if let Err(e) = ctx.send(port, ev) {
                        // The algorithms assume reliable links: reported, never hidden.
                        tracing::warn!(node = me, to, kind, error = %e, "multi message not sent");
                    }
                }
                MultiEffect::Grant { holds } => {
                    self.observe(ctx, MultiNodeEvent::Grant(&holds));
                    let withdrawn = self.phase == Phase::Requested { withdrawn: true };
                    self.phase = Phase::Held;
                    if withdrawn {
                        auto_release = true;
                    } else {
                        let v = self.spec.resources.holds_value(&holds);
                        crate::stage::to_app(ctx, ("multi-grant", v))?;
                    }
                }
            }
        }
        self.effects = effects;
        if self.spec.observer.is_some() && self.node.token_based() {
            for (t, h) in self.tokens.iter_mut().enumerate() {
                *h = self.node.holds_token(t);
            }
            self.observe(ctx, MultiNodeEvent::Tokens(&self.tokens));
        }
        if auto_release && result.is_ok() && sent.is_ok() {
            // The application withdrew this request: give everything back at once.
            return self.release(ctx);
        }
        if let Err(e) = result.and(sent) {
            self.failed = true;
            self.observe(ctx, MultiNodeEvent::Error(&e));
            tracing::error!(node = me, error = %e, "multi node failed");
            return Err(e.into());
        }
        Ok(())
    }
}

/// A multi node stage (see the module docs): serial, named `multi<id>`, of kind
/// [`MULTI_KIND`] with attributes `algorithm`, `id`, `n`, `clusters` and `resources`
/// (`[[name, k], ...]`).
pub fn multi_node_stage(spec: MultiNodeSpec) -> Result<Stage, MutexError> {
    // Validate now, so a bad configuration fails before the graph runs.
    MultiState::new(spec.clone())?;
    let stage = Stage::stateful(
        multi_node_name(spec.id),
        {
            let spec = spec.clone();
            move |_: &Attrs| -> Result<MultiState, BoxError> { Ok(MultiState::new(spec.clone())?) }
        },
        |state: &mut MultiState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .fail_stop()
    .kind(MULTI_KIND)
    .attr("algorithm", spec.algorithm.name())
    .attr("id", spec.id as i64)
    .attr("n", spec.n as i64)
    .attr("clusters", spec.clusters as i64)
    .attr("resources", spec.resources.to_value());
    Ok(stage)
}

fn spec_from_attrs(attrs: &Attrs) -> Result<MultiNodeSpec, MutexError> {
    let bad = |what: &str, e: &dyn fmt::Display| MutexError::Config(format!("{what}: {e}"));
    let algorithm: String = attrs
        .get_as("algorithm")
        .map_err(|e| bad("attribute algorithm", &e))?;
    let id: usize = attrs.get_as("id").map_err(|e| bad("attribute id", &e))?;
    let n: usize = attrs.get_as("n").map_err(|e| bad("attribute n", &e))?;
    let clusters: usize = match attrs.get("clusters") {
        None | Some(Value::Nil) => 1,
        Some(_) => attrs
            .get_as("clusters")
            .map_err(|e| bad("attribute clusters", &e))?,
    };
    let resources = attrs
        .get("resources")
        .ok_or_else(|| MutexError::Config("attribute resources is missing".into()))?;
    Ok(MultiNodeSpec {
        algorithm: algorithm.parse()?,
        id,
        n,
        resources: NamedSpace::from_value(resources)?,
        clusters,
        observer: None,
    })
}

/// A multi node stage configured **by its attributes when it starts** (`algorithm`, `id`, `n`,
/// `resources`, optionally `clusters`), for scripts that set them after building the stage (Lua:
/// `local m = leda.stage 'multi0' (require 'leda.stage.mutex.multi'); m.id = 0 ...`).
pub fn multi_node_stage_by_attrs(name: &str) -> Stage {
    Stage::stateful(
        name,
        |attrs: &Attrs| -> Result<MultiState, BoxError> {
            Ok(MultiState::new(spec_from_attrs(attrs)?)?)
        },
        |state: &mut MultiState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .fail_stop()
}

/// Rebuilds a multi node stage from the attributes [`multi_node_stage`] gives it (for a
/// daemon's registry).
pub fn multi_node_stage_from_attrs(attrs: &Attrs) -> Result<Stage, MutexError> {
    multi_node_stage(spec_from_attrs(attrs)?)
}

/// Decodes the holds of a `("multi-grant", holds)` event into `(name, instance, fence)`
/// triples.
pub fn decode_holds(v: &Value) -> Result<Vec<(String, u32, u64)>, MutexError> {
    let bad = || MutexError::Encoding("holds must be [[name, instance, fence], ...]".into());
    let items = v.as_array().ok_or_else(bad)?;
    items
        .iter()
        .map(|h| match h.as_array() {
            Some([name, inst, fence]) => Ok((
                name.as_str().ok_or_else(bad)?.to_owned(),
                inst.as_int()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(bad)?,
                fence
                    .as_int()
                    .and_then(|f| u64::try_from(f).ok())
                    .ok_or_else(bad)?,
            )),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> NamedSpace {
        NamedSpace::new(&[("a".into(), 1), ("b".into(), 3)]).unwrap()
    }

    #[test]
    fn requests_parse_in_every_form_and_bad_ones_get_typed_errors() {
        let s = space();
        let names = Value::Array(vec!["b".into(), "a".into()]);
        assert_eq!(s.parse_request(&names).unwrap().items(), &[(0, 1), (1, 1)]);
        let pairs = Value::Array(vec![Value::Array(vec!["b".into(), Value::Int(3)])]);
        assert_eq!(s.parse_request(&pairs).unwrap().items(), &[(1, 3)]);
        let map = Value::Map(vec![
            ("b".into(), Value::Int(2)),
            ("a".into(), Value::Int(1)),
        ]);
        assert_eq!(s.parse_request(&map).unwrap().items(), &[(0, 1), (1, 2)]);
        assert_eq!(
            s.parse_request(&Value::Array(vec![])),
            Err(MultiRequestError::Empty)
        );
        assert_eq!(
            s.parse_request(&Value::Array(vec!["z".into()])),
            Err(MultiRequestError::UnknownResource("z".into()))
        );
        assert_eq!(
            s.parse_request(&Value::Array(vec!["a".into(), "a".into()])),
            Err(MultiRequestError::Duplicate("a".into()))
        );
        let four = Value::Array(vec![Value::Array(vec!["b".into(), Value::Int(4)])]);
        let err = s.parse_request(&four).unwrap_err();
        assert_eq!(
            err,
            MultiRequestError::Count {
                resource: "b".into(),
                count: 4,
                capacity: 3
            }
        );
        assert_eq!(
            MultiRequestError::from_values(&err.to_values()).unwrap(),
            err
        );
        assert!(matches!(
            s.parse_request(&Value::Int(3)),
            Err(MultiRequestError::Malformed(_))
        ));
    }

    #[test]
    fn configurations_are_validated_and_round_trip() {
        let s = space();
        assert_eq!(NamedSpace::from_value(&s.to_value()).unwrap(), s);
        assert!(NamedSpace::new(&[]).is_err());
        assert!(NamedSpace::new(&[("a".into(), 1), ("a".into(), 2)]).is_err());
        assert!(NamedSpace::new(&[("a".into(), 0)]).is_err());
        assert_eq!(
            "incremental".parse::<MultiAlgorithm>().unwrap(),
            MultiAlgorithm::Incremental
        );
        assert!("nope".parse::<MultiAlgorithm>().is_err());
        assert!(MultiAlgorithm::Incremental.node(3, 3, s.space()).is_err());
    }

    #[test]
    fn erased_nodes_exchange_values_and_grant_with_names() {
        let s = space();
        let mut a = MultiAlgorithm::Incremental.node(0, 2, s.space()).unwrap();
        let mut b = MultiAlgorithm::Incremental.node(1, 2, s.space()).unwrap();
        // Node 1 asks for `a` (instance token at node 0): it must ask node 0.
        let req = s.request(&[("a".into(), 1)]).unwrap();
        let mut out = Vec::new();
        b.request(&req, &mut out).unwrap();
        let Some(MultiEffect::Send { to: 0, body, .. }) = out.pop() else {
            panic!("a request to node 0 expected");
        };
        a.message(1, &body, &mut out).unwrap();
        let Some(MultiEffect::Send {
            to: 1,
            body,
            token: Some(0),
            ..
        }) = out.pop()
        else {
            panic!("the token of instance 0 expected");
        };
        b.message(0, &body, &mut out).unwrap();
        let Some(MultiEffect::Grant { holds }) = out.pop() else {
            panic!("a grant expected");
        };
        let decoded = decode_holds(&s.holds_value(&holds)).unwrap();
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].0, "a");
        assert!(b.holds_token(0) && !a.holds_token(0));
    }
}
