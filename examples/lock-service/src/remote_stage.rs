//! The network client as a stage (`leda.stage.lock.client` from Lua): a graph's handlers take
//! locks of a serving group ([`crate::remote`]) by sending events, and learn of grants, releases
//! and lost leases as events.
//!
//! Attributes: `connect` (a node's client address, or a list tried in order), `ttl` (lease,
//! seconds, default 10), `name` (the client's name, default `lock.client-<pid>`), `secret_file`
//! (default: `LEDA_SECRET`, `LEDA_SECRET_FILE`, else the per-user cookie).
//!
//! | in                                | out (port `reply`)                              |
//! |-----------------------------------|-------------------------------------------------|
//! | `("acquire", id, lock[, timeout_s])` | `("granted", id, lock, fence)`, or `("failed", id, lock, why)` (timeout, refusal, no node) |
//! | `("release", id)`                 | `("released", id)`, or `("failed", id, nil, why)` |
//! | (the lease is lost while held)    | `("lost", id, lock, why)`                       |
//!
//! Requests run concurrently (a waiting acquire holds no worker, and a release is never queued
//! behind it); ids are the caller's, one hold each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::runtime::Busy;
use leda_net::Secret;
use tokio::sync::oneshot;

use crate::remote::{AsyncLockClient, ConnectOptions};

struct Client {
    /// Taken on drop (a runtime must not be dropped inside another one's context).
    rt: Option<tokio::runtime::Runtime>,
    opts: ConnectOptions,
    addrs: Vec<String>,
    conn: Arc<tokio::sync::Mutex<Option<AsyncLockClient>>>,
    /// Holds by id: the signal that releases one (it carries the guard that keeps the
    /// run from ending before the release's reply is sent).
    held: Arc<Mutex<HashMap<i64, oneshot::Sender<Busy>>>>,
}

fn addrs_attr(a: &Attrs) -> Result<Vec<String>, BoxError> {
    match a.get("connect") {
        Some(Value::Str(s)) => Ok(s.split(',').map(str::to_owned).collect()),
        Some(Value::Array(_)) => Ok(a.get_as("connect")?),
        _ => Err("lock client: attribute `connect` (an address or a list) is required".into()),
    }
}

impl Client {
    fn new(name: &str, a: &Attrs) -> Result<Client, BoxError> {
        let addrs = addrs_attr(a)?;
        let ttl: f64 = a.get_as::<Option<f64>>("ttl")?.unwrap_or(10.0);
        let ttl = Duration::try_from_secs_f64(ttl).map_err(|e| format!("ttl {ttl}: {e}"))?;
        let client = a
            .get_as::<Option<String>>("name")?
            .unwrap_or_else(|| format!("{name}-{}", std::process::id()));
        let mut opts = ConnectOptions::new(client)?.ttl(ttl);
        if let Some(path) = a.get_as::<Option<String>>("secret_file")? {
            opts = opts.secret(Secret::from_file(&path)?);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        Ok(Client {
            rt: Some(rt),
            opts,
            addrs,
            conn: Arc::default(),
            held: Arc::default(),
        })
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        let id: i64 = ev.get(1)?;
        match tag.as_str() {
            "acquire" => {
                let lock: String = ev.get(2)?;
                let timeout = ev.get::<Option<f64>>(3)?.unwrap_or(60.0);
                let timeout = Duration::try_from_secs_f64(timeout)
                    .map_err(|e| format!("timeout {timeout}: {e}"))?;
                let (conn, held, addrs, opts) = (
                    self.conn.clone(),
                    self.held.clone(),
                    self.addrs.clone(),
                    self.opts.clone(),
                );
                let mut out = ctx.clone();
                // Until the acquire's reply is sent, the run is not idle.
                let busy = ctx.busy();
                let rt = self.rt.as_ref().ok_or("lock client: stopped")?;
                rt.spawn(async move {
                    let client = {
                        let mut c = conn.lock().await;
                        if c.as_ref().is_none_or(|c| c.ended().is_some()) {
                            *c = None;
                            for addr in &addrs {
                                if let Ok(x) = AsyncLockClient::connect(addr, opts.clone()).await {
                                    *c = Some(x);
                                    break;
                                }
                            }
                        }
                        c.clone()
                    };
                    // Every reply waits for room in the caller's queue; one that cannot be
                    // delivered at all (the process stops) is logged.
                    let Some(client) = client else {
                        let why = "no node answered";
                        reply(&mut out, id, ("failed", id, lock.as_str(), why)).await;
                        return;
                    };
                    let mut hold = match client.acquire(&lock, timeout).await {
                        Ok(h) => h,
                        Err(e) => {
                            let why = e.to_string();
                            reply(&mut out, id, ("failed", id, lock.as_str(), why)).await;
                            return;
                        }
                    };
                    let (tx, rx) = oneshot::channel();
                    held.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, tx);
                    let fence = hold.fence() as i64;
                    if !reply(&mut out, id, ("granted", id, lock.as_str(), fence)).await {
                        // Nobody will learn of the grant: give the lock back.
                        held.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        let _ = hold.release().await;
                        return;
                    }
                    // Held, the lock is no work of the run's: a run that ends when idle
                    // ends, and the lease with it.
                    drop(busy);
                    tokio::select! {
                        why = hold.lost() => {
                            held.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                            reply(&mut out, id, ("lost", id, lock.as_str(), why)).await;
                        }
                        signal = rx => {
                            let _busy = signal.ok();
                            let ev: Event = match hold.release().await {
                                Ok(()) => ("released", id).into(),
                                Err(e) => Event::new()
                                    .with("failed")
                                    .with(id)
                                    .with(Value::Nil)
                                    .with(e.to_string()),
                            };
                            reply(&mut out, id, ev).await;
                        }
                    }
                });
                Ok(())
            }
            "release" => {
                let signal = self
                    .held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                match signal {
                    Some(tx) => {
                        let _ = tx.send(ctx.busy());
                    }
                    None => {
                        let why = format!("no lock held under id {id}");
                        ctx.send(
                            "reply",
                            Event::new()
                                .with("failed")
                                .with(id)
                                .with(Value::Nil)
                                .with(why),
                        )?;
                    }
                }
                Ok(())
            }
            other => Err(format!("lock client: unknown request {other:?}").into()),
        }
    }
}

/// Sends `ev` on `reply`, waiting while the caller's queue is full; `false` (and a log line)
/// when it cannot be delivered (the port is not connected, the process stops).
async fn reply(out: &mut Ctx, id: i64, ev: impl Into<Event>) -> bool {
    match out.send_wait("reply", ev).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(target: "leda::lock", "lock client: the reply to request {id} was not delivered: {e}");
            false
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A client stage configured by its attributes when it starts (see the module docs).
pub fn client_stage_by_attrs(name: &str) -> Stage {
    let stage_name = name.to_owned();
    Stage::stateful(
        name,
        move |a: &Attrs| Client::new(&stage_name, a),
        |c: &mut Client, ev: Event, ctx: &mut Ctx| c.handle(ev, ctx),
    )
    .serial()
}
