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
//! | `("error", id, resource, why)`       | bad input (unknown resource, release without holding) |
//!
//! Local requests are served in arrival order. A try succeeds only when nothing waits locally
//! and the algorithm grants without waiting for another node (e.g. the token is here).

use std::collections::{BTreeMap, VecDeque};

use leda_core::prelude::*;

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
    queue: VecDeque<(i64, bool)>,
}

/// The front's state: one entry per configured resource.
#[derive(Debug)]
pub struct Front {
    resources: BTreeMap<String, Resource>,
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
                            queue: VecDeque::new(),
                        },
                    )
                })
                .collect(),
        }
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
    pub fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        let from_client = matches!(tag.as_str(), "acquire" | "release" | "cancel");
        let (id, name): (i64, String) = if from_client {
            (ev.get(1)?, ev.get(2)?)
        } else {
            (-1, ev.get(1)?)
        };
        let Some(res) = self.resources.get_mut(&name) else {
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
                res.queue.push_back((id, try_only));
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
                    ("error", id, name.as_str(), "release without holding").into(),
                ),
            },
            "cancel" => {
                if let Some(pos) = res.queue.iter().position(|&(q, _)| q == id) {
                    res.queue.remove(pos);
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
}

/// A front stage named `front<node>` for `resources` (kind [`FRONT_KIND`], attribute
/// `resources`).
pub fn front_stage(node: usize, resources: &[String]) -> Stage {
    let list: Vec<Value> = resources.iter().map(|r| Value::Str(r.clone())).collect();
    let owned = resources.to_vec();
    Stage::stateful(
        format!("front{node}"),
        move |_: &Attrs| -> Result<Front, BoxError> { Ok(Front::new(&owned)) },
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
    Ok(front_stage(node, &resources))
}

/// A front stage configured by its `resources` attribute when it starts (for scripts that set
/// it after building the stage, e.g. Lua).
pub fn front_stage_by_attrs(name: &str) -> Stage {
    Stage::stateful(
        name,
        |a: &Attrs| -> Result<Front, BoxError> {
            let resources: Vec<String> = a.get_as("resources")?;
            Ok(Front::new(&resources))
        },
        |f: &mut Front, ev: Event, ctx: &mut Ctx| f.handle(ev, ctx),
    )
    .serial()
}
