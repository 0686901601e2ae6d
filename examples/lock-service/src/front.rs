//! The front stage of a lock-service node: it multiplexes the node's local clients onto the
//! node stage, which allows one outstanding request per resource.
//!
//! Client → front (`("acquire", id, resource, try)`, `("release", id, resource)`,
//! `("cancel", id, resource)`), front → node stage (port `mutex`), node stage → front
//! (`grant`, `released`, `would-block`, `refused`), front → clients (port `reply`):
//!
//! | reply                                | meaning                                      |
//! |--------------------------------------|----------------------------------------------|
//! | `("granted", id, resource, fence)`   | `id` holds the lock, with this fencing token |
//! | `("would-block", id, resource)`      | a try could not be granted at once           |
//! | `("cancelled", id, resource)`        | the request was withdrawn                    |
//! | `("released", id, resource)`         | the release (or a cancel after the grant) is done |
//! | `("error", id, resource, why)`       | bad input (unknown resource): the request ends |
//! | `("not-held", id, resource, why)`    | a release of a request that holds nothing (still waiting, or releasing already): refused, and the request goes on |
//!
//! The node stage's events carry its seal ([`leda_mutex::stage::from_node`]); an event with a
//! node reply's tag but no seal (a client stage imitating the node) is answered with
//! `("error", -1, tag, why)` and changes nothing. Node and front share a process.
//!
//! Local requests are served in arrival order. A try succeeds only when nothing waits locally
//! and the algorithm grants without waiting for another node (e.g. the token is here).
//!
//! **Multi-resource locks** (issue #10): a front configured with multi-resource locks
//! (attribute `multi`, `[[name, instances], ...]`, disjoint from `resources`) also talks to the
//! node's multi node stage ([`leda_mutex::multi::stage`], port `multi`, replies on the same
//! input) and takes:
//!
//! | client → front                    | meaning                                      |
//! |-----------------------------------|----------------------------------------------|
//! | `("acquire_all", id, items)`      | all of `items` at once: an array of names (one instance each) or of `[name, count]` pairs, or a map `name → count` |
//! | `("acquire_all", id, items, true)`| try: granted at once or `would-block-all` |
//! | `("release_all", id)`             | release everything `id` holds                |
//! | `("cancel_all", id)`              | withdraw `id`'s request (release if granted) |
//!
//! | reply                                   | meaning                                  |
//! |-----------------------------------------|------------------------------------------|
//! | `("granted-all", id, holds)`            | `id` holds every instance of `holds`, an array of `[name, instance, fence]` (one fencing token per instance) |
//! | `("released-all", id)`                  | the release (or a cancel after the grant) is done |
//! | `("cancelled-all", id)`                 | the request was withdrawn                |
//! | `("would-block-all", id)`               | a try could not be granted at once       |
//! | `("invalid", id, kind, resource, count, capacity, message)` | bad input, nothing was queued: `kind` is `empty`, `unknown`, `duplicate`, `count` or `malformed` ([`MultiRequestError`]) |
//! | `("error-all", id, why)`                | release without holding                  |
//!
//! Multi-resource requests are served in arrival order, one at a time at the node stage (the
//! algorithms allow one outstanding request per process). A single-resource `acquire` of a
//! multi-resource lock's name is refused with an error naming `acquire_all`.

use std::collections::{BTreeMap, VecDeque};

use leda_core::prelude::*;
use leda_mutex::multi::{MultiRequest, MultiRequestError, NamedSpace};

/// The registry kind of front stages.
pub const FRONT_KIND: &str = "lock.front";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Idle,
    Requested {
        id: i64,
        try_only: bool,
    },
    Held {
        id: i64,
    },
    /// The node was told to withdraw; it reports `released` when the algorithm is done.
    Withdrawn,
    Releasing {
        id: i64,
    },
}

#[derive(Debug)]
struct Resource {
    st: St,
    queue: Waiting<bool>,
}

/// Requests waiting for a lock, in arrival order, by request id (unique), with what
/// each asks. Withdrawing one takes constant time: a review found a client that queued
/// ~700,000 requests behind a holder and closed its sessions froze the node for 28 s,
/// each cancel scanning the queue. A withdrawn entry is only forgotten; it is skipped
/// when it comes up, and the queue is compacted once most of it is such entries.
#[derive(Debug)]
struct Waiting<T> {
    /// Id, the entry's number (a withdrawn id used again is a new entry), what it asks.
    queue: VecDeque<(i64, u64, T)>,
    /// Waiting ids and the number of their live entry.
    live: std::collections::HashMap<i64, u64>,
    next: u64,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            queue: VecDeque::new(),
            live: Default::default(),
            next: 0,
        }
    }
}

impl<T> Waiting<T> {
    fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Queues request `id`; `false` (nothing queued) if one with that id waits already.
    fn push_back(&mut self, id: i64, what: T) -> bool {
        if self.live.contains_key(&id) {
            return false;
        }
        self.next += 1;
        self.live.insert(id, self.next);
        self.queue.push_back((id, self.next, what));
        true
    }

    fn pop_front(&mut self) -> Option<(i64, T)> {
        while let Some((id, n, what)) = self.queue.pop_front() {
            if self.live.get(&id) == Some(&n) {
                self.live.remove(&id);
                return Some((id, what));
            }
        }
        None
    }

    /// Withdraws request `id`; `false` if it was not waiting.
    fn remove(&mut self, id: i64) -> bool {
        if self.live.remove(&id).is_none() {
            return false;
        }
        if self.queue.len() > 64 && self.queue.len() > 2 * self.live.len() {
            let live = &self.live;
            self.queue.retain(|(q, n, _)| live.get(q) == Some(n));
        }
        true
    }
}

/// Where the node's one multi-resource request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MultiSt {
    Idle,
    Requested {
        id: i64,
        try_only: bool,
    },
    Held {
        id: i64,
    },
    /// Withdrawn at the node stage; it reports `multi-released` when the algorithm is done.
    Withdrawn,
    Releasing {
        id: i64,
    },
}

#[derive(Debug)]
struct MultiLocks {
    space: NamedSpace,
    st: MultiSt,
    queue: Waiting<(MultiRequest, bool)>,
}

/// The front's state: one entry per configured resource, and the multi-resource locks.
#[derive(Debug)]
pub struct Front {
    resources: BTreeMap<String, Resource>,
    multi: Option<MultiLocks>,
}

impl Front {
    /// A front for these resources.
    pub fn new(resources: &[String]) -> Front {
        Front {
            resources: resources
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        Resource {
                            st: St::Idle,
                            queue: Waiting::default(),
                        },
                    )
                })
                .collect(),
            multi: None,
        }
    }

    /// A front for `resources` and the multi-resource locks `multi`; fails if a name is in
    /// both.
    pub fn with_multi(resources: &[String], multi: Option<NamedSpace>) -> Result<Front, BoxError> {
        if let Some(m) = &multi
            && let Some(both) = resources.iter().find(|r| m.contains(r))
        {
            return Err(format!(
                "resource {both:?} is configured both as a lock and as a multi-resource lock"
            )
            .into());
        }
        let mut front = Front::new(resources);
        front.multi = multi.map(|space| MultiLocks {
            space,
            st: MultiSt::Idle,
            queue: Waiting::default(),
        });
        Ok(front)
    }

    fn reply(ctx: &mut Ctx, ev: Event) -> HandlerResult {
        ctx.send("reply", ev)?;
        Ok(())
    }

    fn issue(res: &mut Resource, name: &str, ctx: &mut Ctx) -> HandlerResult {
        if res.st != St::Idle {
            return Ok(());
        }
        if let Some((id, try_only)) = res.queue.pop_front() {
            res.st = St::Requested { id, try_only };
            ctx.send("mutex", ("request", name, try_only))?;
        }
        Ok(())
    }

    /// Handles one event (see the module docs).
    pub fn handle(&mut self, mut ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        let client_tag = matches!(
            tag.as_str(),
            "acquire" | "release" | "cancel" | "acquire_all" | "release_all" | "cancel_all"
        );
        if !client_tag && !leda_mutex::stage::from_node(&mut ev) {
            // Only the node stage's sealed events are node replies: whatever else sends one
            // (a client stage) is refused, and the front's state is untouched.
            tracing::warn!(
                tag,
                "front: a node reply that does not come from the node stage"
            );
            return Self::reply(
                ctx,
                ("error", -1, tag.as_str(), "not a client request: refused").into(),
            );
        }
        if matches!(
            tag.as_str(),
            "acquire_all"
                | "release_all"
                | "cancel_all"
                | "multi-grant"
                | "multi-released"
                | "multi-would-block"
                | "multi-refused"
        ) {
            return self.handle_multi(&tag, &ev, ctx);
        }
        let from_client = matches!(tag.as_str(), "acquire" | "release" | "cancel");
        let (id, name): (i64, String) = if from_client {
            (ev.get(1)?, ev.get(2)?)
        } else {
            (-1, ev.get(1)?)
        };
        let Some(res) = self.resources.get_mut(&name) else {
            if from_client && self.multi.as_ref().is_some_and(|m| m.space.contains(&name)) {
                return Self::reply(
                    ctx,
                    (
                        "error",
                        id,
                        name.as_str(),
                        "a multi-resource lock: use acquire_all",
                    )
                        .into(),
                );
            }
            if from_client {
                return Self::reply(ctx, ("error", id, name.as_str(), "unknown resource").into());
            }
            return Err(format!("front: event {tag:?} for unknown resource {name:?}").into());
        };
        match tag.as_str() {
            "acquire" => {
                let try_only = ev.arg(3).and_then(Value::as_bool).unwrap_or(false);
                if try_only && (res.st != St::Idle || !res.queue.is_empty()) {
                    return Self::reply(ctx, ("would-block", id, name.as_str()).into());
                }
                if !res.queue.push_back(id, try_only) {
                    let why = "a request with this id is already waiting";
                    return Self::reply(ctx, ("error", id, name.as_str(), why).into());
                }
                Self::issue(res, &name, ctx)
            }
            "release" => match res.st {
                St::Held { id: holder } if holder == id => {
                    res.st = St::Releasing { id };
                    ctx.send("mutex", ("release", name.as_str()))?;
                    Ok(())
                }
                _ => Self::reply(
                    ctx,
                    ("not-held", id, name.as_str(), "release without holding").into(),
                ),
            },
            "cancel" => {
                if res.queue.remove(id) {
                    return Self::reply(ctx, ("cancelled", id, name.as_str()).into());
                }
                match res.st {
                    St::Requested { id: r, .. } if r == id => {
                        res.st = St::Withdrawn;
                        ctx.send("mutex", ("cancel", name.as_str()))?;
                        Self::reply(ctx, ("cancelled", id, name.as_str()).into())
                    }
                    // Granted before the cancel arrived: the cancel releases.
                    St::Held { id: h } if h == id => {
                        res.st = St::Releasing { id };
                        ctx.send("mutex", ("release", name.as_str()))?;
                        Ok(())
                    }
                    _ => Self::reply(ctx, ("cancelled", id, name.as_str()).into()),
                }
            }
            "grant" => {
                let fence: i64 = ev.get(2)?;
                match res.st {
                    St::Requested { id, .. } => {
                        res.st = St::Held { id };
                        Self::reply(ctx, ("granted", id, name.as_str(), fence).into())
                    }
                    // The node releases a withdrawn grant itself.
                    St::Withdrawn => Ok(()),
                    other => Err(format!("front: grant for {name:?} in state {other:?}").into()),
                }
            }
            "would-block" => match res.st {
                St::Requested { id, try_only: true } => {
                    res.st = St::Withdrawn;
                    Self::reply(ctx, ("would-block", id, name.as_str()).into())
                }
                other => Err(format!("front: would-block for {name:?} in state {other:?}").into()),
            },
            "released" => {
                let prev = std::mem::replace(&mut res.st, St::Idle);
                if let St::Releasing { id } = prev {
                    Self::reply(ctx, ("released", id, name.as_str()).into())?;
                }
                Self::issue(res, &name, ctx)
            }
            "refused" => {
                let why: String = ev.get(2).unwrap_or_default();
                tracing::error!(resource = name, why, "node stage refused a request");
                Err(format!("node stage refused: {why}").into())
            }
            other => Err(format!("front: unknown event {other:?}").into()),
        }
    }

    fn issue_multi(m: &mut MultiLocks, ctx: &mut Ctx) -> HandlerResult {
        if m.st != MultiSt::Idle {
            return Ok(());
        }
        if let Some((id, (req, try_only))) = m.queue.pop_front() {
            m.st = MultiSt::Requested { id, try_only };
            ctx.send(
                "multi",
                Event::new()
                    .with("request")
                    .with(m.space.request_value(&req))
                    .with(try_only),
            )?;
        }
        Ok(())
    }

    fn invalid(ctx: &mut Ctx, id: i64, err: &MultiRequestError) -> HandlerResult {
        let mut ev = Event::new().with("invalid").with(id);
        for v in err.to_values() {
            ev.push(v);
        }
        Self::reply(ctx, ev)
    }

    /// The multi-resource part of the protocol (see the module docs).
    fn handle_multi(&mut self, tag: &str, ev: &Event, ctx: &mut Ctx) -> HandlerResult {
        let from_client = matches!(tag, "acquire_all" | "release_all" | "cancel_all");
        let id: i64 = if from_client { ev.get(1)? } else { -1 };
        let Some(m) = self.multi.as_mut() else {
            if tag == "acquire_all" {
                // No multi-resource lock here: every name is unknown.
                let err = match NamedSpace::parse_items(ev.arg(2).unwrap_or(&Value::Nil)) {
                    Ok(items) => match items.first() {
                        None => MultiRequestError::Empty,
                        Some((name, _)) => MultiRequestError::UnknownResource(name.clone()),
                    },
                    Err(e) => e,
                };
                return Self::invalid(ctx, id, &err);
            }
            if from_client {
                return Self::reply(ctx, ("error-all", id, "no multi-resource lock here").into());
            }
            return Err(format!("front: {tag:?} without multi-resource locks").into());
        };
        match tag {
            "acquire_all" => {
                let req = match ev.arg(2) {
                    None => Err(MultiRequestError::Empty),
                    Some(v) => m.space.parse_request(v),
                };
                let try_only = ev.arg(3).and_then(Value::as_bool).unwrap_or(false);
                match req {
                    Ok(_) if try_only && (m.st != MultiSt::Idle || !m.queue.is_empty()) => {
                        Self::reply(ctx, ("would-block-all", id).into())
                    }
                    Ok(req) => {
                        if !m.queue.push_back(id, (req, try_only)) {
                            let why = "a request with this id is already waiting";
                            return Self::reply(ctx, ("error-all", id, why).into());
                        }
                        Self::issue_multi(m, ctx)
                    }
                    Err(e) => Self::invalid(ctx, id, &e),
                }
            }
            "release_all" => match m.st {
                MultiSt::Held { id: holder } if holder == id => {
                    m.st = MultiSt::Releasing { id };
                    ctx.send("multi", "release")?;
                    Ok(())
                }
                _ => Self::reply(ctx, ("error-all", id, "release without holding").into()),
            },
            "cancel_all" => {
                if m.queue.remove(id) {
                    return Self::reply(ctx, ("cancelled-all", id).into());
                }
                match m.st {
                    MultiSt::Requested { id: r, .. } if r == id => {
                        m.st = MultiSt::Withdrawn;
                        ctx.send("multi", "cancel")?;
                        Self::reply(ctx, ("cancelled-all", id).into())
                    }
                    // Granted before the cancel arrived: the cancel releases.
                    MultiSt::Held { id: h } if h == id => {
                        m.st = MultiSt::Releasing { id };
                        ctx.send("multi", "release")?;
                        Ok(())
                    }
                    _ => Self::reply(ctx, ("cancelled-all", id).into()),
                }
            }
            "multi-grant" => {
                let holds = ev
                    .arg(1)
                    .cloned()
                    .ok_or("front: multi-grant without holds")?;
                match m.st {
                    MultiSt::Requested { id, .. } => {
                        m.st = MultiSt::Held { id };
                        Self::reply(ctx, Event::new().with("granted-all").with(id).with(holds))
                    }
                    // The node releases a withdrawn grant itself.
                    MultiSt::Withdrawn => Ok(()),
                    other => Err(format!("front: multi-grant in state {other:?}").into()),
                }
            }
            "multi-released" => {
                let prev = std::mem::replace(&mut m.st, MultiSt::Idle);
                if let MultiSt::Releasing { id } = prev {
                    Self::reply(ctx, ("released-all", id).into())?;
                }
                Self::issue_multi(m, ctx)
            }
            "multi-would-block" => match m.st {
                MultiSt::Requested { id, try_only: true } => {
                    m.st = MultiSt::Withdrawn;
                    Self::reply(ctx, ("would-block-all", id).into())
                }
                other => Err(format!("front: multi-would-block in state {other:?}").into()),
            },
            "multi-refused" => {
                let why: String = ev.get(1).unwrap_or_default();
                tracing::error!(why, "multi node stage refused a request");
                if let MultiSt::Requested { id, .. } = m.st {
                    // The front validated the request, so front and node disagree on the
                    // configuration: tell the caller and go on with the next request.
                    m.st = MultiSt::Idle;
                    Self::reply(ctx, ("error-all", id, why.as_str()).into())?;
                    return Self::issue_multi(m, ctx);
                }
                Err(format!("multi node stage refused: {why}").into())
            }
            other => Err(format!("front: unknown event {other:?}").into()),
        }
    }
}

/// The multi-resource locks named by a front's `multi` attribute, if it has one.
fn multi_attr(a: &Attrs) -> Result<Option<NamedSpace>, BoxError> {
    match a.get("multi") {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => Ok(Some(NamedSpace::from_value(v)?)),
    }
}

/// The front's single-resource locks: attribute `resources`, which a front with
/// multi-resource locks only may leave out.
fn resources_attr(a: &Attrs) -> Result<Vec<String>, BoxError> {
    match a.get("resources") {
        None | Some(Value::Nil) if a.get("multi").is_some() => Ok(Vec::new()),
        _ => Ok(a.get_as("resources")?),
    }
}

/// A front stage named `front<node>` for `resources` (kind [`FRONT_KIND`], attributes `node`
/// and `resources`). Setting its `multi` attribute before the graph starts
/// (`[[name, instances], ...]`, see [`crate::multi::attach_multi`]) adds multi-resource locks.
pub fn front_stage(node: usize, resources: &[String]) -> Stage {
    let list: Vec<Value> = resources.iter().map(|r| Value::Str(r.clone())).collect();
    let owned = resources.to_vec();
    Stage::stateful(
        format!("front{node}"),
        move |a: &Attrs| -> Result<Front, BoxError> { Front::with_multi(&owned, multi_attr(a)?) },
        |f: &mut Front, ev: Event, ctx: &mut Ctx| f.handle(ev, ctx),
    )
    .serial()
    .kind(FRONT_KIND)
    .attr("node", node as i64)
    .attr("resources", Value::Array(list))
}

/// Rebuilds a front stage from its attributes (for a daemon's registry).
pub fn front_stage_from_attrs(attrs: &Attrs) -> Result<Stage, BoxError> {
    let node: usize = attrs.get_as("node")?;
    let resources: Vec<String> = attrs.get_as("resources")?;
    let stage = front_stage(node, &resources);
    if let Some(multi) = attrs.get("multi") {
        stage.set_attr("multi", multi.clone());
    }
    Ok(stage)
}

/// A front stage configured by its attributes when it starts (for scripts that set them after
/// building the stage, e.g. Lua): `resources` (a list of lock names) and/or `multi`
/// (multi-resource locks, `{{name, instances}, ...}`).
pub fn front_stage_by_attrs(name: &str) -> Stage {
    Stage::stateful(
        name,
        |a: &Attrs| -> Result<Front, BoxError> {
            Front::with_multi(&resources_attr(a)?, multi_attr(a)?)
        },
        |f: &mut Front, ev: Event, ctx: &mut Ctx| f.handle(ev, ctx),
    )
    .serial()
}

#[cfg(test)]
mod waiting_tests {
    use super::Waiting;

    /// Order kept, withdrawn requests skipped, a duplicate id refused, and a queue of
    /// mostly withdrawn entries compacted; withdrawing 100,000 of 200,000 waiting
    /// requests one by one takes linear time (it was quadratic: a node froze for 28 s).
    #[test]
    fn withdrawing_is_constant_time_and_keeps_the_order() {
        let mut w = Waiting::default();
        for id in 0..200_000 {
            assert!(w.push_back(id, id * 10));
        }
        assert!(!w.push_back(5, 0), "a duplicate id");
        let t = std::time::Instant::now();
        for id in (0..200_000).filter(|i| i % 2 == 1) {
            assert!(w.remove(id));
        }
        assert!(!w.remove(1), "already withdrawn");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(w.pop_front(), Some((0, 0)));
        assert_eq!(w.pop_front(), Some((2, 20)));
        for id in (4..200_000).step_by(2) {
            assert!(w.remove(id));
        }
        assert!(w.is_empty());
        assert!(w.queue.len() <= 64, "compacted: {}", w.queue.len());
        assert_eq!(w.pop_front(), None);
        // An id withdrawn and used again: the new request, in its new place.
        let mut w = Waiting::default();
        assert!(w.push_back(1, "old"));
        assert!(w.push_back(2, "two"));
        assert!(w.remove(1));
        assert!(w.push_back(1, "new"));
        assert_eq!(w.pop_front(), Some((2, "two")));
        assert_eq!(w.pop_front(), Some((1, "new")));
        assert_eq!(w.pop_front(), None);
    }
}
