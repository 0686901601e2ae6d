//! The client of a lock-service node over the network ([`crate::proto`]): async
//! ([`AsyncLockClient`]) and blocking ([`LockClient`]).
//!
//! A client is one authenticated connection and one session with a lease; a background task
//! keeps the lease alive (a keep-alive every third of the TTL). A [`Hold`] is a lock held:
//! its fencing token, whether its lease is still known to be valid, and a way to wait for
//! its loss. Dropping a hold releases the lock (without waiting); [`Hold::release`] waits
//! until the node has let it go.
//!
//! ```no_run
//! # fn main() -> Result<(), leda_lock_service::LockError> {
//! use std::time::Duration;
//! use leda_lock_service::remote::{ConnectOptions, LockClient};
//!
//! let client = LockClient::connect("127.0.0.1:7100", ConnectOptions::new("worker-1")?)?;
//! let hold = client.acquire("orders", Duration::from_secs(5))?;
//! // ... write to the fenced resource, passing hold.fence() ...
//! client.release(hold)?;
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leda_net::Secret;
use leda_net::frame::Role;
use leda_net::handshake::{self, HANDSHAKE_TIMEOUT};
use tokio::sync::{mpsc, watch};

use crate::client::LockError;
use crate::proto::{self, Request, Response};

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The client's name (its identity in the node's logs and audit lines).
    pub name: String,
    /// The lease's time to live (the node clamps it to 100 ms ..= 10 min).
    pub ttl: Duration,
    /// The client secret the node expects.
    pub secret: Secret,
    /// Connect, handshake and open within this time.
    pub connect_timeout: Duration,
}

impl ConnectOptions {
    /// Options named `name`, a 10 s lease, the secret of the environment (`LEDA_SECRET`,
    /// `LEDA_SECRET_FILE`) or else the per-user cookie, as for every other leda-net link.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let secret = Secret::for_user().map_err(|e| LockError::Unavailable(e.to_string()))?;
        Ok(ConnectOptions {
            name: name.into(),
            ttl: Duration::from_secs(10),
            secret,
            connect_timeout: HANDSHAKE_TIMEOUT,
        })
    }

    /// With this lease TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// With this secret.
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = secret;
        self
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::UnboundedSender<Request>,
    waiters: Mutex<HashMap<u64, mpsc::UnboundedSender<Response>>>,
    next_req: AtomicU64,
    ttl: Duration,
    node: u64,
    /// Send times of the keep-alives not yet answered.
    pings: Mutex<VecDeque<Instant>>,
    /// The lease is known valid until then (a keep-alive's send time + TTL).
    valid_until: Mutex<Instant>,
    /// Why the session ended, once it has.
    ended: watch::Sender<Option<String>>,
    /// The reader task, stopped when the last handle goes: the connection then closes and
    /// the node releases at once what this client held (without waiting for the TTL).
    reader: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(r) = lock(&self.reader).take() {
            r.abort();
        }
    }
}

impl Inner {
    fn send(&self, r: Request) -> Result<(), LockError> {
        if let Some(why) = self.ended.borrow().clone() {
            return Err(LockError::Unavailable(why));
        }
        if matches!(r, Request::KeepAlive) {
            lock(&self.pings).push_back(Instant::now());
        }
        self.tx
            .send(r)
            .map_err(|_| LockError::Unavailable("connection closed".into()))
    }

    fn register(&self) -> (u64, mpsc::UnboundedReceiver<Response>) {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.waiters).insert(req, tx);
        (req, rx)
    }

    fn forget(&self, req: u64) {
        lock(&self.waiters).remove(&req);
    }

    /// The next answer on `rx` (`None` once the session ended), waiting only while the
    /// lease is known valid: a node that stopped answering (SIGSTOP) keeps the connection
    /// open, and lets the session's locks go itself when the lease expires. `what` names
    /// the request in the error.
    async fn recv_within_lease(
        &self,
        rx: &mut mpsc::UnboundedReceiver<Response>,
        what: &str,
    ) -> Result<Option<Response>, LockError> {
        loop {
            let deadline = tokio::time::Instant::from_std(*lock(&self.valid_until));
            tokio::select! {
                biased;
                r = rx.recv() => return Ok(r),
                _ = tokio::time::sleep_until(deadline) => {
                    if Instant::now() >= *lock(&self.valid_until) {
                        return Err(LockError::Unavailable(format!(
                            "the node did not answer the {what} before the lease ran out \
                             (it lets the lease's locks go when the lease expires)"
                        )));
                    }
                }
            }
        }
    }

    fn end(&self, why: String) {
        self.ended.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(why);
                true
            } else {
                false
            }
        });
        // Waiters see their channel close.
        lock(&self.waiters).clear();
    }

    fn dispatch(&self, resp: Response) {
        let req = match &resp {
            Response::Granted { req, .. }
            | Response::WouldBlock { req }
            | Response::Cancelled { req }
            | Response::Released { req }
            | Response::Expired { req, .. } => *req,
            Response::Error { req: Some(req), .. } => *req,
            Response::Alive => {
                if let Some(sent) = lock(&self.pings).pop_front() {
                    let mut v = lock(&self.valid_until);
                    *v = (*v).max(sent + self.ttl);
                }
                return;
            }
            Response::Error { req: None, message } => {
                self.end(message.clone());
                return;
            }
            Response::Opened { .. } => return,
        };
        if let Some(w) = lock(&self.waiters).get(&req) {
            let _ = w.send(resp);
        }
    }
}

/// A connection to a lock-service node, async.
#[derive(Debug, Clone)]
pub struct AsyncLockClient {
    inner: Arc<Inner>,
}

impl AsyncLockClient {
    /// Connects to the node's client address `addr`, authenticates and opens a session.
    pub async fn connect(addr: &str, opts: ConnectOptions) -> Result<Self, LockError> {
        let unavailable = |e: String| LockError::Unavailable(format!("{addr}: {e}"));
        let started = Instant::now();
        let mut conn = handshake::connect(
            addr,
            Role::Client,
            &opts.name,
            0,
            &opts.secret,
            None,
            opts.connect_timeout,
        )
        .await
        .map_err(|e| unavailable(e.to_string()))?;
        let ttl_ms = opts.ttl.as_millis().min(u64::MAX as u128) as u64;
        proto::write(&mut conn, &Request::Open { ttl_ms })
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let (ttl_ms, node) =
            match tokio::time::timeout(opts.connect_timeout, proto::read(&mut conn)).await {
                Ok(Ok(Some(Response::Opened { ttl_ms, node }))) => (ttl_ms, node),
                Ok(Ok(Some(Response::Error { message, .. }))) => return Err(unavailable(message)),
                Ok(Ok(other)) => return Err(unavailable(format!("unexpected answer {other:?}"))),
                Ok(Err(e)) => return Err(unavailable(e.to_string())),
                Err(_) => return Err(unavailable("no answer to Open".into())),
            };
        let ttl = Duration::from_millis(ttl_ms);
        let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
        let inner = Arc::new(Inner {
            tx,
            waiters: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            ttl,
            node,
            pings: Mutex::new(VecDeque::new()),
            valid_until: Mutex::new(started + ttl),
            ended: watch::channel(None).0,
            reader: Mutex::new(None),
        });
        let (mut rd, mut wr) = tokio::io::split(conn);
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                if proto::write(&mut wr, &r).await.is_err() {
                    break;
                }
            }
        });
        let reader = tokio::spawn(async move {
            let why = loop {
                match proto::read::<_, Response>(&mut rd).await {
                    Ok(Some(resp)) => match weak.upgrade() {
                        Some(inner) => inner.dispatch(resp),
                        None => return,
                    },
                    Ok(None) => break "the node closed the connection".to_owned(),
                    Err(e) => break e.to_string(),
                }
            };
            if let Some(inner) = weak.upgrade() {
                inner.end(why);
            }
        });
        *lock(&inner.reader) = Some(reader.abort_handle());
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match weak.upgrade() {
                    Some(inner) if inner.send(Request::KeepAlive).is_ok() => {}
                    _ => return,
                }
            }
        });
        Ok(AsyncLockClient { inner })
    }

    /// The node's id in its group.
    pub fn node(&self) -> u64 {
        self.inner.node
    }

    /// The lease TTL the node granted.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// `Some(why)` once the session has ended (lease expired, connection lost).
    pub fn ended(&self) -> Option<String> {
        self.inner.ended.borrow().clone()
    }

    /// Acquires `name`, waiting at most `timeout`; on timeout the request is withdrawn (the
    /// withdrawal waits for the node while the lease is known valid, see [`Hold::release`]).
    pub async fn acquire(&self, name: &str, timeout: Duration) -> Result<Hold, LockError> {
        let (req, mut rx) = self.inner.register();
        self.inner.send(Request::Acquire {
            req,
            lock: name.to_owned(),
            wait: true,
        })?;
        match tokio::time::timeout(timeout, rx.recv()).await {
            Ok(reply) => self.finish(req, name, rx, reply),
            Err(_) => {
                self.cancel(req, &mut rx).await?;
                Err(LockError::Timeout(name.to_owned()))
            }
        }
    }

    /// Acquires `name` only if it is free at once (`Ok(None)` otherwise).
    pub async fn try_acquire(&self, name: &str) -> Result<Option<Hold>, LockError> {
        let (req, mut rx) = self.inner.register();
        self.inner.send(Request::Acquire {
            req,
            lock: name.to_owned(),
            wait: false,
        })?;
        match rx.recv().await {
            Some(Response::WouldBlock { .. }) => {
                self.inner.forget(req);
                Ok(None)
            }
            reply => self.finish(req, name, rx, reply).map(Some),
        }
    }

    fn finish(
        &self,
        req: u64,
        name: &str,
        rx: mpsc::UnboundedReceiver<Response>,
        reply: Option<Response>,
    ) -> Result<Hold, LockError> {
        match reply {
            Some(Response::Granted { fence, .. }) => Ok(Hold {
                inner: self.inner.clone(),
                req,
                lock: name.to_owned(),
                fence,
                rx,
                done: false,
                lost_at: None,
            }),
            other => {
                self.inner.forget(req);
                Err(match other {
                    Some(Response::Error { message, .. }) => LockError::Refused(message),
                    Some(Response::Cancelled { .. } | Response::WouldBlock { .. }) => {
                        LockError::Cancelled(name.to_owned())
                    }
                    Some(other) => LockError::Refused(format!("unexpected reply {other:?}")),
                    None => LockError::Unavailable(
                        self.ended().unwrap_or_else(|| "connection closed".into()),
                    ),
                })
            }
        }
    }

    /// Withdraws `req`; a grant that raced the cancel is released before this returns.
    async fn cancel(
        &self,
        req: u64,
        rx: &mut mpsc::UnboundedReceiver<Response>,
    ) -> Result<(), LockError> {
        self.inner.send(Request::Cancel { req })?;
        let result = loop {
            let r = match self.inner.recv_within_lease(rx, "cancel").await {
                Ok(r) => r,
                Err(e) => break Err(e),
            };
            match r {
                Some(Response::Granted { .. }) => {}
                Some(Response::Cancelled { .. } | Response::Released { .. }) => break Ok(()),
                Some(Response::Error { message, .. }) => break Err(LockError::Refused(message)),
                Some(_) => {}
                None => break Err(LockError::Unavailable("connection closed".into())),
            }
        };
        self.inner.forget(req);
        result
    }
}

/// A lock held through a session.
#[derive(Debug)]
pub struct Hold {
    inner: Arc<Inner>,
    req: u64,
    lock: String,
    fence: u64,
    rx: mpsc::UnboundedReceiver<Response>,
    done: bool,
    lost_at: Option<u64>,
}

impl Hold {
    /// The lock's name.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The fencing token: larger than every earlier holder's.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// `true` while the lease is known valid: no expiry heard, the session alive, and a
    /// keep-alive sent less than a TTL ago answered. Check it before each use of the lock
    /// (and still fence: a pause after the check is not seen).
    pub fn is_valid(&mut self) -> bool {
        self.poll_lost();
        self.lost_at.is_none()
            && self.inner.ended.borrow().is_none()
            && Instant::now() < *lock(&self.inner.valid_until)
    }

    /// How much longer the lease is known valid: until a TTL after the last answered
    /// keep-alive was sent (zero once [`Hold::is_valid`] is `false`).
    pub fn valid_for(&mut self) -> Duration {
        if !self.is_valid() {
            return Duration::ZERO;
        }
        lock(&self.inner.valid_until).saturating_duration_since(Instant::now())
    }

    /// The node's time of the expiry (CLOCK_MONOTONIC ns), once it was reported.
    pub fn expired_at(&mut self) -> Option<u64> {
        self.poll_lost();
        self.lost_at
    }

    fn poll_lost(&mut self) {
        while let Ok(resp) = self.rx.try_recv() {
            if let Response::Expired { at_ns, .. } = resp {
                self.lost_at = Some(at_ns);
            }
        }
    }

    /// Waits until the hold is lost (lease expired, session ended); returns why.
    pub async fn lost(&mut self) -> String {
        let mut ended = self.inner.ended.subscribe();
        loop {
            let deadline = *lock(&self.inner.valid_until);
            let deadline = tokio::time::Instant::from_std(deadline);
            tokio::select! {
                r = self.rx.recv() => match r {
                    Some(Response::Expired { at_ns, .. }) => {
                        self.lost_at = Some(at_ns);
                        return "lease expired".into();
                    }
                    Some(_) => {}
                    None => return "session ended".into(),
                },
                _ = ended.wait_for(Option::is_some) => {
                    return self.inner.ended.borrow().clone().unwrap_or_default();
                }
                _ = tokio::time::sleep_until(deadline) => {
                    if Instant::now() >= *lock(&self.inner.valid_until) {
                        return "lease not renewed within its TTL".into();
                    }
                }
            }
        }
    }

    /// Releases the lock and waits until the node has let it go, or until the lease is no
    /// longer known valid ([`LockError::Unavailable`]: the node did not confirm the
    /// release, and lets the lock go when the lease expires).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.done = true;
        if let Some(at_ns) = self.expired_at() {
            self.inner.forget(self.req);
            return Err(LockError::LeaseExpired { at_ns });
        }
        self.inner.send(Request::Release { req: self.req })?;
        let result = loop {
            let r = match self.inner.recv_within_lease(&mut self.rx, "release").await {
                Ok(r) => r,
                Err(e) => break Err(e),
            };
            match r {
                Some(Response::Released { .. }) => break Ok(()),
                Some(Response::Expired { at_ns, .. }) => {
                    break Err(LockError::LeaseExpired { at_ns });
                }
                Some(Response::Error { message, .. }) => break Err(LockError::Refused(message)),
                Some(_) => {}
                None => break Err(LockError::Unavailable("connection closed".into())),
            }
        };
        self.inner.forget(self.req);
        result
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.done {
            // Fire and forget: the node releases; the answer finds no waiter.
            let _ = self.inner.send(Request::Release { req: self.req });
            self.inner.forget(self.req);
        }
    }
}

/// A connection to a lock-service node, blocking (its own small tokio runtime).
#[derive(Debug)]
pub struct LockClient {
    rt: tokio::runtime::Runtime,
    client: AsyncLockClient,
}

impl LockClient {
    /// Connects to the node's client address `addr`, authenticates and opens a session.
    pub fn connect(addr: &str, opts: ConnectOptions) -> Result<LockClient, LockError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| LockError::Unavailable(e.to_string()))?;
        let client = rt.block_on(AsyncLockClient::connect(addr, opts))?;
        Ok(LockClient { rt, client })
    }

    /// The async client this one drives.
    pub fn as_async(&self) -> &AsyncLockClient {
        &self.client
    }

    /// Acquires `name`, waiting at most `timeout`.
    pub fn acquire(&self, name: &str, timeout: Duration) -> Result<Hold, LockError> {
        self.rt.block_on(self.client.acquire(name, timeout))
    }

    /// Acquires `name` only if it is free at once.
    pub fn try_acquire(&self, name: &str) -> Result<Option<Hold>, LockError> {
        self.rt.block_on(self.client.try_acquire(name))
    }

    /// [`LockClient::acquire`] for a process that ends its session when this fails (a
    /// command): past `timeout` it waits at most a second more for the node to confirm
    /// the request's withdrawal, not for as long as the lease is valid — a grant it
    /// never heard of is let go when the session ends. (`lock-service lock --timeout 2`
    /// against a stopped node waited out a lease of 30 s; rv15.)
    pub fn acquire_or_leave(&self, name: &str, timeout: Duration) -> Result<Hold, LockError> {
        let bound = timeout.saturating_add(Duration::from_secs(1));
        self.rt.block_on(async {
            match tokio::time::timeout(bound, self.client.acquire(name, timeout)).await {
                Ok(r) => r,
                Err(_) => Err(LockError::Unavailable(format!(
                    "no answer for {name:?} within the timeout, nor to its withdrawal: the \
                     node lets the request go when this session ends"
                ))),
            }
        })
    }

    /// Releases a hold and waits until the node has let it go, or the lease runs out (see
    /// [`Hold::release`]).
    pub fn release(&self, hold: Hold) -> Result<(), LockError> {
        self.rt.block_on(hold.release())
    }

    /// Blocks until `hold` is lost; returns why.
    pub fn wait_lost(&self, hold: &mut Hold) -> String {
        self.rt.block_on(hold.lost())
    }

    /// The runtime, to drive [`Hold::lost`] alongside other work.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }
}
