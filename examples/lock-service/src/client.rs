//! The lock API for Rust code running in a node's process: `acquire(resource, timeout)` →
//! [`Grant`] with its fencing token, [`LockClient::try_acquire`], [`LockClient::release`], and
//! cancellation of a queued request ([`Pending::cancel`]).
//!
//! A [`LockClient`] injects requests into the node's front stage and gets the replies through
//! the [`api_stage`], which routes each reply to the waiting caller by request id. Blocking
//! calls wait on a channel, never inside a stage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::runtime::ProcessHandle;

/// How long [`LockClient::release`] waits for the node to confirm.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// What went wrong with a lock call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The lock was not granted within the timeout; the request was withdrawn.
    #[error("timed out waiting for {0:?}")]
    Timeout(String),
    /// The request was cancelled.
    #[error("request for {0:?} cancelled")]
    Cancelled(String),
    /// The service refused the call (unknown resource, release without holding...).
    #[error("lock service refused: {0}")]
    Refused(String),
    /// The node's process does not take events any more (stopped, queue full).
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
}

/// A held lock.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    /// The resource.
    pub resource: String,
    /// The fencing token: strictly increasing across the grants of one resource. Storage
    /// guarded by the lock should refuse writes carrying a token older than one it has seen.
    pub fencing_token: u64,
    id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Granted(u64),
    WouldBlock,
    Cancelled,
    Released,
    Error(String),
}

#[derive(Default)]
struct Waiters {
    map: Mutex<HashMap<i64, Sender<Reply>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Sender<Reply>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shared part of a client: request ids and the waiters' channels.
#[derive(Clone, Default)]
pub struct ApiShared {
    next: Arc<AtomicI64>,
    waiters: Arc<Waiters>,
}

impl std::fmt::Debug for ApiShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiShared")
            .field("pending", &self.waiters.lock().len())
            .finish()
    }
}

impl ApiShared {
    /// A fresh id space and waiter table.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The stage (`api<node>`, serial) that receives the front's replies and wakes the callers.
/// A grant for a caller that gave up is released at once (port `front`).
pub fn api_stage(node: usize, shared: ApiShared) -> Stage {
    Stage::new(format!("api{node}"), move |ev: Event, ctx: &mut Ctx| {
        let tag: String = ev.get(0)?;
        let id: i64 = ev.get(1)?;
        let resource: String = ev.get(2)?;
        let reply = match tag.as_str() {
            "granted" => Reply::Granted(ev.get::<i64>(3)? as u64),
            "would-block" => Reply::WouldBlock,
            "cancelled" => Reply::Cancelled,
            "released" => Reply::Released,
            "error" => Reply::Error(ev.get(3)?),
            other => return Err(format!("api: unknown reply {other:?}").into()),
        };
        let waiter = shared.waiters.lock().get(&id).cloned();
        let delivered = waiter.is_some_and(|w| w.send(reply.clone()).is_ok());
        if !delivered && matches!(reply, Reply::Granted(_)) {
            // The caller is gone (timed out and cancelled after the grant): give it back.
            ctx.send("front", ("release", id, resource))?;
        }
        Ok(())
    })
    .serial()
}

/// A pending acquisition: wait for it, or cancel it.
#[derive(Debug)]
pub struct Pending<'a> {
    client: &'a LockClient,
    id: i64,
    resource: String,
    rx: Receiver<Reply>,
}

impl Pending<'_> {
    /// Waits up to `timeout`; on timeout the request is withdrawn and [`LockError::Timeout`]
    /// returned.
    pub fn wait(self, timeout: Duration) -> Result<Grant, LockError> {
        match self.rx.recv_timeout(timeout) {
            Ok(reply) => self.finish(reply),
            Err(RecvTimeoutError::Timeout) => {
                let resource = self.resource.clone();
                self.cancel()?;
                Err(LockError::Timeout(resource))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(LockError::Unavailable("reply channel closed".into()))
            }
        }
    }

    /// Withdraws the request. If it was granted before the withdrawal reached the service,
    /// the grant is released; either way the caller holds nothing when this returns `Ok`.
    pub fn cancel(self) -> Result<(), LockError> {
        self.client
            .inject(("cancel", self.id, self.resource.as_str()).into())?;
        loop {
            match self.rx.recv_timeout(RELEASE_WAIT) {
                // Granted before the cancel: the front turns the cancel into a release; wait
                // for it so the lock is free when we return.
                Ok(Reply::Granted(_)) => {}
                Ok(Reply::Cancelled | Reply::Released) => {
                    self.client.forget(self.id);
                    return Ok(());
                }
                Ok(Reply::WouldBlock) => {}
                Ok(Reply::Error(e)) => {
                    self.client.forget(self.id);
                    return Err(LockError::Refused(e));
                }
                Err(_) => {
                    self.client.forget(self.id);
                    return Err(LockError::Unavailable("no answer to a cancel".into()));
                }
            }
        }
    }

    fn finish(self, reply: Reply) -> Result<Grant, LockError> {
        match reply {
            Reply::Granted(fence) => Ok(Grant {
                resource: self.resource,
                fencing_token: fence,
                id: self.id,
            }),
            other => {
                self.client.forget(self.id);
                Err(match other {
                    Reply::WouldBlock | Reply::Cancelled => LockError::Cancelled(self.resource),
                    Reply::Error(e) => LockError::Refused(e),
                    _ => LockError::Refused(format!("unexpected reply {other:?}")),
                })
            }
        }
    }
}

/// A client of one node's lock service.
#[derive(Clone)]
pub struct LockClient {
    handle: ProcessHandle,
    front: usize,
    shared: ApiShared,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("front", &self.front)
            .finish()
    }
}

impl LockClient {
    /// A client of the front stage named `front` in the process of `handle`, whose replies
    /// reach the [`api_stage`] built with `shared`.
    pub fn new(handle: ProcessHandle, front: &str, shared: ApiShared) -> Result<Self, LockError> {
        let front = handle
            .stage_index(front)
            .ok_or_else(|| LockError::Unavailable(format!("no stage {front:?} here")))?;
        Ok(LockClient {
            handle,
            front,
            shared,
        })
    }

    fn inject(&self, ev: Event) -> Result<(), LockError> {
        self.handle
            .inject(self.front, ev)
            .map_err(|r| LockError::Unavailable(r.error.to_string()))
    }

    fn register(&self) -> (i64, Receiver<Reply>) {
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.shared.waiters.lock().insert(id, tx);
        (id, rx)
    }

    fn forget(&self, id: i64) {
        self.shared.waiters.lock().remove(&id);
    }

    /// Starts an acquisition; wait for it or cancel it with the returned [`Pending`].
    pub fn begin(&self, resource: &str) -> Result<Pending<'_>, LockError> {
        let (id, rx) = self.register();
        if let Err(e) = self.inject(("acquire", id, resource, false).into()) {
            self.forget(id);
            return Err(e);
        }
        Ok(Pending {
            client: self,
            id,
            resource: resource.to_owned(),
            rx,
        })
    }

    /// Acquires `resource`, waiting at most `timeout`.
    pub fn acquire(&self, resource: &str, timeout: Duration) -> Result<Grant, LockError> {
        self.begin(resource)?.wait(timeout)
    }

    /// Acquires `resource` only if that needs no waiting: nobody waits locally and the
    /// algorithm can grant at once (e.g. this node holds the token). `Ok(None)` otherwise.
    pub fn try_acquire(&self, resource: &str) -> Result<Option<Grant>, LockError> {
        let (id, rx) = self.register();
        if let Err(e) = self.inject(("acquire", id, resource, true).into()) {
            self.forget(id);
            return Err(e);
        }
        let pending = Pending {
            client: self,
            id,
            resource: resource.to_owned(),
            rx,
        };
        match pending.rx.recv_timeout(RELEASE_WAIT) {
            Ok(Reply::WouldBlock) => {
                self.forget(id);
                Ok(None)
            }
            Ok(reply) => pending.finish(reply).map(Some),
            Err(_) => {
                self.forget(id);
                Err(LockError::Unavailable("no answer to a try".into()))
            }
        }
    }

    /// Releases a held lock and waits until the node has let it go.
    pub fn release(&self, grant: Grant) -> Result<(), LockError> {
        let rx = {
            let (tx, rx) = mpsc::channel();
            self.shared.waiters.lock().insert(grant.id, tx);
            rx
        };
        let result = self
            .inject(("release", grant.id, grant.resource.as_str()).into())
            .and_then(|()| match rx.recv_timeout(RELEASE_WAIT) {
                Ok(Reply::Released) => Ok(()),
                Ok(Reply::Error(e)) => Err(LockError::Refused(e)),
                Ok(other) => Err(LockError::Refused(format!("unexpected reply {other:?}"))),
                Err(_) => Err(LockError::Unavailable("no answer to a release".into())),
            });
        self.forget(grant.id);
        result
    }
}
