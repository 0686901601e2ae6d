//! The lock API for Rust code running in a node's process: `acquire(resource, timeout)` →
//! [`Grant`] with its fencing token, [`LocalClient::try_acquire`], [`LocalClient::release`], and
//! cancellation of a queued request ([`Pending::cancel`]).
//!
//! Multi-resource locks (a group started with [`crate::multi::MultiServiceConfig`]):
//! [`LocalClient::acquire_all`] takes a set of locks at once, [`LocalClient::acquire_counts`] a
//! number of instances of several lock types; both return a [`MultiGrant`] with one fencing
//! token per instance held, released together by [`LocalClient::release_all`]. Timeouts,
//! cancellation ([`PendingAll::cancel`]) and tries ([`LocalClient::try_acquire_all`]) work as
//! for single locks; bad input (empty set,
//! unknown lock, a lock named twice, a count of 0 or above the number of instances) is a
//! [`LockError::Invalid`] with a typed [`MultiRequestError`], and nothing is queued.
//!
//! A [`LocalClient`] injects requests into the node's front stage and gets the replies through
//! the [`api_stage`], which routes each reply to the waiting caller by request id. Blocking
//! calls wait on a channel, never inside a stage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leda_core::prelude::*;
use leda_core::runtime::ProcessHandle;
use leda_mutex::multi::MultiRequestError;
use leda_mutex::multi::stage::decode_holds;

/// How long [`LocalClient::release`] waits for the node to confirm.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How often a blocked call looks whether the run has ended.
const END_POLL: Duration = Duration::from_millis(50);

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
    /// The node's process does not take events any more (stopped, queue full), or its run
    /// ended while the call waited.
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
    /// The lease ran out before the release: the service released the lock at `at_ns`
    /// (CLOCK_MONOTONIC nanoseconds of the node's host).
    #[error("the lease had expired (the service released the lock at {at_ns} ns)")]
    LeaseExpired {
        /// When the service released the lock.
        at_ns: u64,
    },
    /// A multi-resource request the service cannot take (nothing was queued).
    #[error("invalid multi-resource request: {0}")]
    Invalid(MultiRequestError),
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

/// One resource instance held by a [`MultiGrant`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceGrant {
    /// The lock (resource type).
    pub resource: String,
    /// Which of its instances (`0..k`; always 0 for a single-instance lock).
    pub instance: u32,
    /// The fencing token of this instance: strictly increasing across the grants of this
    /// instance.
    pub fencing_token: u64,
}

/// Several locks held together (from [`LocalClient::acquire_all`] or
/// [`LocalClient::acquire_counts`]).
#[derive(Debug, PartialEq, Eq)]
pub struct MultiGrant {
    /// Every instance held, with its own fencing token, sorted by lock then instance.
    pub holds: Vec<InstanceGrant>,
    id: i64,
}

impl MultiGrant {
    /// The fencing token of instance `instance` of `resource`, if this grant holds it.
    pub fn fencing_token(&self, resource: &str, instance: u32) -> Option<u64> {
        self.holds
            .iter()
            .find(|h| h.resource == resource && h.instance == instance)
            .map(|h| h.fencing_token)
    }

    /// The instances held of `resource`.
    pub fn instances(&self, resource: &str) -> Vec<u32> {
        self.holds
            .iter()
            .filter(|h| h.resource == resource)
            .map(|h| h.instance)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Granted(u64),
    GrantedAll(Vec<InstanceGrant>),
    WouldBlock,
    Cancelled,
    Released,
    Error(String),
    Invalid(MultiRequestError),
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
        let resource = || ev.get::<String>(2);
        let reply = match tag.as_str() {
            "granted" => Reply::Granted(ev.get::<i64>(3)? as u64),
            "would-block" | "would-block-all" => Reply::WouldBlock,
            "cancelled" | "cancelled-all" => Reply::Cancelled,
            "released" | "released-all" => Reply::Released,
            "error" | "not-held" => Reply::Error(ev.get(3)?),
            "error-all" => Reply::Error(ev.get(2)?),
            "granted-all" => {
                let holds = ev.arg(2).ok_or("api: granted-all without holds")?;
                let mut holds: Vec<InstanceGrant> = decode_holds(holds)?
                    .into_iter()
                    .map(|(resource, instance, fencing_token)| InstanceGrant {
                        resource,
                        instance,
                        fencing_token,
                    })
                    .collect();
                holds.sort();
                Reply::GrantedAll(holds)
            }
            "invalid" => Reply::Invalid(MultiRequestError::from_values(
                ev.args().get(2..).unwrap_or_default(),
            )?),
            other => return Err(format!("api: unknown reply {other:?}").into()),
        };
        let waiter = shared.waiters.lock().get(&id).cloned();
        let delivered = waiter.is_some_and(|w| w.send(reply.clone()).is_ok());
        if !delivered {
            // The caller is gone (timed out and cancelled after the grant): give it back.
            match reply {
                Reply::Granted(_) => ctx.send("front", ("release", id, resource()?))?,
                Reply::GrantedAll(_) => ctx.send("front", ("release_all", id))?,
                _ => {}
            }
        }
        Ok(())
    })
    .serial()
}

/// A pending acquisition: wait for it, or cancel it.
#[derive(Debug)]
pub struct Pending<'a> {
    client: &'a LocalClient,
    id: i64,
    /// The lock, or for a multi-resource request a description of the set.
    resource: String,
    rx: Receiver<Reply>,
    /// A multi-resource request (cancelled with `cancel_all`).
    all: bool,
}

impl Pending<'_> {
    /// Waits up to `timeout`; on timeout the request is withdrawn and [`LockError::Timeout`]
    /// returned.
    pub fn wait(self, timeout: Duration) -> Result<Grant, LockError> {
        match self.client.recv(&self.rx, timeout) {
            Ok(Some(reply)) => self.finish(reply),
            Ok(None) => {
                let resource = self.resource.clone();
                self.cancel()?;
                Err(LockError::Timeout(resource))
            }
            Err(e) => {
                self.client.forget(self.id);
                Err(e)
            }
        }
    }

    /// Withdraws the request. If it was granted before the withdrawal reached the service,
    /// the grant is released; either way the caller holds nothing when this returns `Ok`.
    pub fn cancel(self) -> Result<(), LockError> {
        let ev = if self.all {
            ("cancel_all", self.id).into()
        } else {
            ("cancel", self.id, self.resource.as_str()).into()
        };
        self.client.inject(ev)?;
        loop {
            match self.client.recv(&self.rx, RELEASE_WAIT) {
                // Granted before the cancel: the front turns the cancel into a release; wait
                // for it so the lock is free when we return.
                Ok(Some(Reply::Granted(_) | Reply::GrantedAll(_) | Reply::WouldBlock)) => {}
                Ok(Some(Reply::Cancelled | Reply::Released)) => {
                    self.client.forget(self.id);
                    return Ok(());
                }
                Ok(Some(Reply::Error(e))) => {
                    self.client.forget(self.id);
                    return Err(LockError::Refused(e));
                }
                Ok(Some(Reply::Invalid(e))) => {
                    self.client.forget(self.id);
                    return Err(LockError::Invalid(e));
                }
                Ok(None) => {
                    self.client.forget(self.id);
                    return Err(LockError::Unavailable("no answer to a cancel".into()));
                }
                Err(e) => {
                    self.client.forget(self.id);
                    return Err(e);
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
            other => Err(self.failed(other)),
        }
    }

    /// The error for a reply that is not a grant (the waiter is forgotten).
    fn failed(self, reply: Reply) -> LockError {
        self.client.forget(self.id);
        match reply {
            Reply::WouldBlock | Reply::Cancelled => LockError::Cancelled(self.resource),
            Reply::Error(e) => LockError::Refused(e),
            Reply::Invalid(e) => LockError::Invalid(e),
            other => LockError::Refused(format!("unexpected reply {other:?}")),
        }
    }
}

/// A pending multi-resource acquisition: wait for it, or cancel it.
#[derive(Debug)]
pub struct PendingAll<'a>(Pending<'a>);

impl PendingAll<'_> {
    /// Waits up to `timeout` for every lock of the request; on timeout the request is
    /// withdrawn (nothing is held) and [`LockError::Timeout`] returned.
    pub fn wait(self, timeout: Duration) -> Result<MultiGrant, LockError> {
        let p = self.0;
        match p.client.recv(&p.rx, timeout) {
            Ok(Some(Reply::GrantedAll(holds))) => Ok(MultiGrant { holds, id: p.id }),
            Ok(Some(other)) => Err(p.failed(other)),
            Ok(None) => {
                let what = p.resource.clone();
                p.cancel()?;
                Err(LockError::Timeout(what))
            }
            Err(e) => {
                p.client.forget(p.id);
                Err(e)
            }
        }
    }

    /// Withdraws the request. If it was granted before the withdrawal reached the service,
    /// everything is released; either way the caller holds nothing when this returns `Ok`.
    pub fn cancel(self) -> Result<(), LockError> {
        self.0.cancel()
    }
}

/// A client of one node's lock service.
#[derive(Clone)]
pub struct LocalClient {
    handle: ProcessHandle,
    front: usize,
    shared: ApiShared,
}

impl std::fmt::Debug for LocalClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClient")
            .field("front", &self.front)
            .finish()
    }
}

impl LocalClient {
    /// A client of the front stage named `front` in the process of `handle`, whose replies
    /// reach the [`api_stage`] built with `shared`.
    pub fn new(handle: ProcessHandle, front: &str, shared: ApiShared) -> Result<Self, LockError> {
        let front = handle
            .stage_index(front)
            .ok_or_else(|| LockError::Unavailable(format!("no stage {front:?} here")))?;
        Ok(LocalClient {
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

    /// The reply on `rx`, or `None` after `timeout`; an error as soon as the run ends
    /// (nothing answers then: a caller must not wait out its timeout).
    fn recv(&self, rx: &Receiver<Reply>, timeout: Duration) -> Result<Option<Reply>, LockError> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if self.handle.is_stopping() {
                return Err(LockError::Unavailable(
                    "the run ended before the node answered".into(),
                ));
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match rx.recv_timeout(left.min(END_POLL)) {
                Ok(reply) => return Ok(Some(reply)),
                Err(RecvTimeoutError::Timeout) if left <= END_POLL => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(LockError::Unavailable("reply channel closed".into()));
                }
            }
        }
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
            all: false,
        })
    }

    fn begin_items(
        &self,
        items: Vec<(String, i64)>,
        try_only: bool,
    ) -> Result<PendingAll<'_>, LockError> {
        let what = items
            .iter()
            .map(|(r, c)| {
                if *c == 1 {
                    r.clone()
                } else {
                    format!("{c}x{r}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let list = Value::Array(
            items
                .into_iter()
                .map(|(r, c)| Value::Array(vec![Value::Str(r), Value::Int(c)]))
                .collect(),
        );
        let (id, rx) = self.register();
        let ev = Event::new()
            .with("acquire_all")
            .with(id)
            .with(list)
            .with(try_only);
        if let Err(e) = self.inject(ev) {
            self.forget(id);
            return Err(e);
        }
        Ok(PendingAll(Pending {
            client: self,
            id,
            resource: format!("[{what}]"),
            rx,
            all: true,
        }))
    }

    /// Starts acquiring every lock of `resources` at once (one instance of each); wait for it
    /// or cancel it with the returned [`PendingAll`].
    pub fn begin_all<S: AsRef<str>>(&self, resources: &[S]) -> Result<PendingAll<'_>, LockError> {
        self.begin_items(
            resources
                .iter()
                .map(|r| (r.as_ref().to_owned(), 1))
                .collect(),
            false,
        )
    }

    /// Starts acquiring `count` instances of each lock type of `counts` at once.
    pub fn begin_counts<S: AsRef<str>>(
        &self,
        counts: &[(S, u32)],
    ) -> Result<PendingAll<'_>, LockError> {
        self.begin_items(
            counts
                .iter()
                .map(|(r, c)| (r.as_ref().to_owned(), i64::from(*c)))
                .collect(),
            false,
        )
    }

    /// Acquires every lock of `resources` only if that needs no waiting: nothing waits locally
    /// and the algorithm grants at once (e.g. every token is here). `Ok(None)` otherwise.
    pub fn try_acquire_all<S: AsRef<str>>(
        &self,
        resources: &[S],
    ) -> Result<Option<MultiGrant>, LockError> {
        let items = resources
            .iter()
            .map(|r| (r.as_ref().to_owned(), 1))
            .collect();
        let p = self.begin_items(items, true)?.0;
        match self.recv(&p.rx, RELEASE_WAIT) {
            Ok(Some(Reply::GrantedAll(holds))) => Ok(Some(MultiGrant { holds, id: p.id })),
            Ok(Some(Reply::WouldBlock)) => {
                self.forget(p.id);
                Ok(None)
            }
            Ok(Some(other)) => Err(p.failed(other)),
            Ok(None) => {
                self.forget(p.id);
                Err(LockError::Unavailable("no answer to a try".into()))
            }
            Err(e) => {
                self.forget(p.id);
                Err(e)
            }
        }
    }

    /// Acquires every lock of `resources` together (deadlock-free, whatever other clients
    /// ask for), waiting at most `timeout`: one fencing token per lock.
    pub fn acquire_all<S: AsRef<str>>(
        &self,
        resources: &[S],
        timeout: Duration,
    ) -> Result<MultiGrant, LockError> {
        self.begin_all(resources)?.wait(timeout)
    }

    /// Acquires `count` instances of each lock type of `counts` together, waiting at most
    /// `timeout`: one fencing token per instance.
    pub fn acquire_counts<S: AsRef<str>>(
        &self,
        counts: &[(S, u32)],
        timeout: Duration,
    ) -> Result<MultiGrant, LockError> {
        self.begin_counts(counts)?.wait(timeout)
    }

    /// Releases every instance of a [`MultiGrant`] and waits until the node has let them go.
    pub fn release_all(&self, grant: MultiGrant) -> Result<(), LockError> {
        let rx = {
            let (tx, rx) = mpsc::channel();
            self.shared.waiters.lock().insert(grant.id, tx);
            rx
        };
        let result = self
            .inject(("release_all", grant.id).into())
            .and_then(|()| match self.recv(&rx, RELEASE_WAIT)? {
                Some(Reply::Released) => Ok(()),
                Some(Reply::Error(e)) => Err(LockError::Refused(e)),
                Some(other) => Err(LockError::Refused(format!("unexpected reply {other:?}"))),
                None => Err(LockError::Unavailable("no answer to a release".into())),
            });
        self.forget(grant.id);
        result
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
            all: false,
        };
        match self.recv(&pending.rx, RELEASE_WAIT) {
            Ok(Some(Reply::WouldBlock)) => {
                self.forget(id);
                Ok(None)
            }
            Ok(Some(reply)) => pending.finish(reply).map(Some),
            Ok(None) => {
                self.forget(id);
                Err(LockError::Unavailable("no answer to a try".into()))
            }
            Err(e) => {
                self.forget(id);
                Err(e)
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
            .and_then(|()| match self.recv(&rx, RELEASE_WAIT)? {
                Some(Reply::Released) => Ok(()),
                Some(Reply::Error(e)) => Err(LockError::Refused(e)),
                Some(other) => Err(LockError::Refused(format!("unexpected reply {other:?}"))),
                None => Err(LockError::Unavailable("no answer to a release".into())),
            });
        self.forget(grant.id);
        result
    }
}
