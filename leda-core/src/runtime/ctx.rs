//! `Ctx`: the instance API a handler sees (`leda.send`, `sleep`, `nice`, `quit`,
//! `gettime`, and `wait` to park the instance on a future).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::connector::ConnectorKind;
use crate::error::{Rejected, SendError};
use crate::event::Event;
use crate::port::Port;
use crate::stage::{Attrs, HandlerResult};
use crate::stats::{STAMP_SAMPLE, Stamp};

use super::executor::BoxFuture;
use super::process::{Process, Target};

/// Something that names an output port without allocating: `&str`, integers, `&Port`.
pub trait PortKey {
    /// `true` if this key names `port`.
    fn matches(&self, port: &Port) -> bool;
    /// The port, for error messages.
    fn to_port(&self) -> Port;
}

impl PortKey for &str {
    fn matches(&self, port: &Port) -> bool {
        matches!(port, Port::Name(n) if &**n == *self)
    }
    fn to_port(&self) -> Port {
        Port::from(*self)
    }
}

impl<P: PortKey> PortKey for &P {
    fn matches(&self, port: &Port) -> bool {
        (**self).matches(port)
    }
    fn to_port(&self) -> Port {
        (**self).to_port()
    }
}

impl PortKey for Port {
    fn matches(&self, port: &Port) -> bool {
        self == port
    }
    fn to_port(&self) -> Port {
        self.clone()
    }
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl PortKey for $t {
            fn matches(&self, port: &Port) -> bool {
                matches!(port, Port::Index(i) if *i == *self as i64)
            }
            fn to_port(&self) -> Port {
                Port::Index(*self as i64)
            }
        }
    )*};
}
int_key!(i32, i64, u32, usize);

/// The instance API, handed to every handler call.
///
/// Cheap to clone: an async handler keeps an owned `Ctx` across awaits.
pub struct Ctx {
    pub(crate) process: Arc<Process>,
    pub(crate) stage: usize,
    pub(crate) wait: Option<BoxFuture<HandlerResult>>,
    /// Events sent and not yet published, per route, but for `route_hint`'s.
    sent: SmallVec<[u64; 4]>,
    /// The route of the last successful send (tried first by the next one).
    route_hint: usize,
    /// Events sent on `route_hint` and not yet published.
    hint_sent: u64,
    stamp_tick: u32,
    /// Sends of this handler call held behind a full queue (see [`Ctx::send_or_wait`]):
    /// the backlog later ones join, if any (a `wait` starts a new one after it).
    backlog: Option<Backlog>,
    /// Every backlog of this call, in order: delivered if the call fails.
    held: Vec<Backlog>,
    /// The `Ctx` of an activation, which parks on what its calls hold; not a clone.
    in_call: bool,
}

/// Sends held by [`Ctx::send_or_wait`], delivered in order by one future.
type Backlog = Arc<Mutex<Held>>;

/// The sends a stage's handler call held, not yet delivered. Those still here when
/// nothing can deliver them any more (the run ended while they waited) are counted in
/// the stage's `failed_sends`: accepted, and never sent.
struct Held {
    sends: VecDeque<(Port, Event)>,
    process: Arc<Process>,
    stage: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.sends.is_empty() {
            return;
        }
        let st = &self.process.stages[self.stage];
        let n = self.sends.len();
        st.counters.failed_sends.fetch_add(n as u64, Relaxed);
        tracing::debug!(stage = %st.name, events = n, "held sends not delivered (the run ended)");
    }
}

fn lock_backlog(b: &Backlog) -> std::sync::MutexGuard<'_, Held> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

impl Clone for Ctx {
    fn clone(&self) -> Self {
        Ctx::new(self.process.clone(), self.stage)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // Borrowed, not cloned: a clone and a drop of the process's `Arc` are two atomic
        // writes to a count every worker shares, on every activation's end.
        self.flush_counts();
    }
}

impl Ctx {
    pub(crate) fn new(process: Arc<Process>, stage: usize) -> Ctx {
        Ctx {
            process,
            stage,
            wait: None,
            sent: SmallVec::new(),
            route_hint: 0,
            hint_sent: 0,
            stamp_tick: 0,
            backlog: None,
            held: Vec::new(),
            in_call: false,
        }
    }

    /// The `Ctx` an activation hands its handler calls.
    pub(crate) fn for_calls(process: Arc<Process>, stage: usize) -> Ctx {
        let mut ctx = Ctx::new(process, stage);
        ctx.in_call = true;
        ctx
    }

    /// The name of the stage this instance belongs to.
    pub fn stage_name(&self) -> &str {
        &self.process.stages[self.stage].name
    }

    /// The stage's attributes (`self.<field>` in Lua).
    pub fn attrs(&self) -> &Attrs {
        &self.process.stages[self.stage].attrs
    }

    /// `true` if `port` is connected.
    pub fn has_output(&self, port: impl PortKey) -> bool {
        self.process.stages[self.stage]
            .routes()
            .iter()
            .any(|r| port.matches(&r.port))
    }

    /// Sends `event` on `port` (`leda.send`). The event goes to the connected stage's
    /// queue, or, on a cohort connector, is handled at once by a free instance.
    /// Never blocks; on failure the event is not delivered and the error says why.
    #[inline]
    pub fn send(&mut self, port: impl PortKey, event: impl Into<Event>) -> Result<(), SendError> {
        self.send_fast(&port, event.into()).map_err(|r| r.error)
    }

    /// Like [`Ctx::send`], but a failed send hands the event back for a retry.
    #[inline]
    pub fn try_send(
        &mut self,
        port: impl PortKey,
        event: impl Into<Event>,
    ) -> Result<(), Rejected> {
        self.send_fast(&port, event.into()).map_err(|r| *r)
    }

    /// Every send: the common case inline (see [`Ctx::open_batch`]), the rest out of
    /// line.
    #[inline(always)]
    fn send_fast(&mut self, port: &impl PortKey, event: Event) -> Result<(), Box<Rejected>> {
        let tick = self.stamp_tick.wrapping_add(1);
        match self.open_batch(port, &event, tick) {
            Some(batch) => {
                // SAFETY: nothing touched this thread's outbox since `open_batch`.
                unsafe { batch.accept(&self.process, event) };
                self.stamp_tick = tick;
                self.count_sent(self.route_hint);
                Ok(())
            }
            None => self.send_boxed(port, event),
        }
    }

    /// The common send's batch: on the port sent on last, to a local (not cohort)
    /// stage whose batch in this thread's outbox is open with room, and not due for a
    /// latency stamp. The event then goes straight into the batch from the handler
    /// (one copy); anything else is decided whole by [`Ctx::send_boxed`].
    #[inline(always)]
    fn open_batch(
        &self,
        port: &impl PortKey,
        event: &Event,
        tick: u32,
    ) -> Option<super::outbox::OpenBatch> {
        let route = self.process.stages[self.stage]
            .routes()
            .get(self.route_hint)?;
        let Target::Local(dest) = route.target else {
            return None;
        };
        if !port.matches(&route.port)
            || route.kind == ConnectorKind::Cohort
            || (route.kind == ConnectorKind::Decoupled && event.has_attachment())
            || tick.is_multiple_of(STAMP_SAMPLE)
        {
            return None;
        }
        super::outbox::open_batch(&self.process, dest)
    }

    /// Counts a send on route `ri` (published every [`SEND_FLUSH_EVERY`]).
    #[inline(always)]
    fn count_sent(&mut self, ri: usize) {
        if ri != self.route_hint {
            self.switch_hint(ri);
        }
        self.hint_sent += 1;
        if self.hint_sent >= SEND_FLUSH_EVERY {
            let n = std::mem::take(&mut self.hint_sent);
            publish_sent(&self.process, self.stage, ri, n);
        }
    }

    /// `ri` becomes the hinted route: the old one's count is kept with the others'.
    #[inline(never)]
    fn switch_hint(&mut self, ri: usize) {
        let old = self.route_hint;
        let len = self.sent.len().max(old.max(ri) + 1);
        self.sent.resize(len, 0);
        self.sent[old] += std::mem::take(&mut self.hint_sent);
        self.hint_sent = std::mem::take(&mut self.sent[ri]);
        self.route_hint = ri;
    }

    /// The route `port` takes `event` on (its index), or why none can: the port is not
    /// connected, or the event has an attachment for a decoupled connector.
    #[inline]
    fn route_of(&self, port: &impl PortKey, event: &Event) -> Result<usize, SendError> {
        let st = &self.process.stages[self.stage];
        let routes = st.routes();
        // Most handlers send on one port again and again: try the last one first.
        let ri = match routes.get(self.route_hint) {
            Some(r) if port.matches(&r.port) => Some(self.route_hint),
            _ => routes.iter().position(|r| port.matches(&r.port)),
        };
        let Some(ri) = ri else {
            return Err(SendError::NotConnected {
                stage: st.name.to_string(),
                port: port.to_port().to_string(),
            });
        };
        let route = &routes[ri];
        if route.kind == ConnectorKind::Decoupled && event.has_attachment() {
            return Err(SendError::AttachmentOnDecoupled {
                stage: st.name.to_string(),
                port: route.port.to_string(),
            });
        }
        Ok(ri)
    }

    /// Every send the fast path did not take: out of line, and its result one word (a
    /// failure is rare). A result returned through memory was read back right after
    /// the call with wide loads that could not be forwarded from the callee's narrower
    /// stores: a stall that cost a quarter of a one-thread pipeline's time.
    #[inline(never)]
    fn send_boxed(&mut self, port: &impl PortKey, mut event: Event) -> Result<(), Box<Rejected>> {
        let ri = match self.route_of(port, &event) {
            Ok(ri) => ri,
            Err(error) => return Err(Box::new(Rejected { error, event })),
        };
        let process = &self.process;
        let route = &process.stages[self.stage].routes()[ri];
        let result = match &route.target {
            Target::Local(dest) => {
                // A sample of local sends is stamped: the connector's latency. (A
                // stamp names a connector of this process: it never leaves it.)
                self.stamp_tick = self.stamp_tick.wrapping_add(1);
                if self.stamp_tick.is_multiple_of(STAMP_SAMPLE) {
                    event.set_stamp(Stamp {
                        connector: route.connector,
                        at: Instant::now(),
                    });
                }
                match route.kind {
                    ConnectorKind::Cohort => process.cohort(*dest, event).map_err(Box::new),
                    _ => super::outbox::send(process, *dest, event),
                }
            }
            Target::Remote(sink) => {
                if process.stopping.load(Relaxed) {
                    Err(Box::new((SendError::Stopped, event)))
                } else {
                    super::outbox::send_remote(process, sink, event)
                }
            }
        };
        match result {
            Ok(()) => {
                self.count_sent(ri);
                Ok(())
            }
            Err(bounced) => {
                let (error, mut event) = *bounced;
                event.take_stamp();
                Err(Box::new(Rejected { error, event }))
            }
        }
    }

    /// Sends `event` on `port`, waiting (without holding a worker thread) while the
    /// destination queue is full. Other failures are returned at once.
    ///
    /// The first attempt is made at once, when this is called; the returned future
    /// only waits if that attempt found the queue full.
    #[inline(always)]
    pub fn send_wait<K: PortKey>(&mut self, port: K, event: impl Into<Event>) -> SendWait<'_, K> {
        let slow = match self.send_fast(&port, event.into()) {
            Ok(()) => None,
            Err(r) => Some(Box::new(Slow::after(*r))),
        };
        SendWait {
            ctx: self,
            port,
            slow,
        }
    }

    /// The waiting send for synchronous handlers: like [`Ctx::send`], but when the
    /// destination queue is full the event is held and this instance parks once the
    /// handler returns (Waiting, no thread held) until it is delivered. Later sends of
    /// the same call queue behind it, so order is kept. Failures other than a full
    /// queue are returned at once (behind held events too: an unconnected port, an
    /// attachment for a decoupled connector). A held event that cannot be delivered
    /// after all (its process lost, a cohort with no free instance) is reported as a
    /// failed send — counted in the stage's `failed_sends` and sent to its `error` port
    /// as `(stage, reason, args...)` — the other held events still go, and the handler
    /// call fails with that error; those still held when the run ends are counted in
    /// `failed_sends`. Events held by a call that then
    /// fails are still delivered (as [`Ctx::send`]'s are), before its failure is
    /// reported.
    ///
    /// Only the `Ctx` a handler call is given parks; on a clone (kept by an async
    /// handler or another thread) nothing would wait for what it held, so there a full
    /// queue is an error, as with [`Ctx::send`]: use [`Ctx::send_wait`] instead.
    #[inline]
    pub fn send_or_wait(
        &mut self,
        port: impl PortKey,
        event: impl Into<Event>,
    ) -> Result<(), SendError> {
        if !self.in_call {
            return self.send(port, event);
        }
        if self.backlog.is_none() && self.wait.is_none() {
            return match self.send_fast(&port, event.into()) {
                Ok(()) => Ok(()),
                Err(r) => match *r {
                    Rejected {
                        error: SendError::QueueFull { .. },
                        event,
                    } => self.hold_back(port.to_port(), event),
                    r => Err(r.error),
                },
            };
        }
        self.hold_back(port.to_port(), event.into())
    }

    /// [`Ctx::send_or_wait`] when the event must wait: behind a backlog of held events,
    /// after the call's wait, or for room.
    #[cold]
    #[inline(never)]
    fn hold_back(&mut self, port: Port, event: Event) -> Result<(), SendError> {
        // What can be known now is said now, not after the call.
        self.route_of(&port, &event)?;
        if let Some(backlog) = &self.backlog {
            // Behind events already held: queue after them (one future drains all).
            lock_backlog(backlog).sends.push_back((port, event));
            return Ok(());
        }
        let backlog = Arc::new(Mutex::new(Held {
            sends: VecDeque::from([(port, event)]),
            process: self.process.clone(),
            stage: self.stage,
        }));
        self.backlog = Some(backlog.clone());
        self.held.push(backlog.clone());
        let before = self.wait.take();
        let deliver = self.deliver(backlog);
        self.wait = Some(Box::pin(async move {
            // Accepted, so delivered even if the wait before them fails (whose failure
            // is then the call's).
            let waited = match before {
                Some(before) => before.await,
                None => Ok(()),
            };
            let delivered = deliver.await;
            waited?;
            Ok(delivered?)
        }));
        Ok(())
    }

    /// Delivers the held sends of `backlog` in order, each waiting for room. One that
    /// cannot be delivered after all (its process lost, a cohort with no free instance)
    /// is reported as a failed send ([`super::process::Process::report_failed_send`]:
    /// counted, and sent to the stage's `error` port), and the others go on; the first
    /// failure is the result. Once the run has ended, what is left is only counted.
    fn deliver(&self, backlog: Backlog) -> impl Future<Output = Result<(), SendError>> + use<> {
        let mut ctx = self.clone();
        async move {
            let mut first = None;
            loop {
                let next = lock_backlog(&backlog).sends.pop_front();
                let Some((port, event)) = next else {
                    return first.map_or(Ok(()), Err);
                };
                match ctx.send_fast(&port, event) {
                    Ok(()) => {}
                    Err(r) if matches!(r.error, SendError::QueueFull { .. }) => {
                        // (Back in the backlog while it waits: counted if the run ends.)
                        let room = ctx.room(&port);
                        lock_backlog(&backlog).sends.push_front((port, r.event));
                        room.await;
                    }
                    Err(r) if matches!(r.error, SendError::Stopped) => {
                        // The run ended: the rest are counted as they go (`Held`), no
                        // report can reach an `error` port any more.
                        lock_backlog(&backlog).sends.push_front((port, r.event));
                        return Err(r.error);
                    }
                    Err(r) => {
                        ctx.process.report_failed_send(ctx.stage, &r.error, r.event);
                        first.get_or_insert(r.error);
                    }
                }
            }
        }
    }

    /// After a handler call that failed: drops the wait it asked for, and returns its
    /// held sends ([`Ctx::send_or_wait`]: accepted, so they are delivered as `send`'s
    /// are) as a future that delivers them; `None` if it held none.
    pub(crate) fn take_held(&mut self) -> Option<BoxFuture<Result<(), SendError>>> {
        self.wait = None;
        self.backlog = None;
        if self.held.is_empty() {
            return None;
        }
        let held = std::mem::take(&mut self.held);
        let delivers: Vec<_> = held.into_iter().map(|b| self.deliver(b)).collect();
        Some(Box::pin(async move {
            let mut first = Ok(());
            for d in delivers {
                let r = d.await;
                if first.is_ok() {
                    first = r;
                }
            }
            first
        }))
    }

    /// Takes the future the handler call asked to wait on (and ends the call's
    /// backlog of held sends: the future owns it now).
    #[inline]
    pub(crate) fn take_wait(&mut self) -> Option<BoxFuture<HandlerResult>> {
        // A backlog exists only with a wait (`send_or_wait` sets both).
        let wait = self.wait.take()?;
        self.backlog = None;
        self.held.clear();
        Some(wait)
    }

    /// Completes when the destination of `port` has room (or after a short back-off for
    /// remote destinations).
    fn room(&self, port: &impl PortKey) -> BoxFuture<()> {
        let routes = self.process.stages[self.stage].routes();
        match routes
            .iter()
            .find(|r| port.matches(&r.port))
            .map(|r| &r.target)
        {
            Some(Target::Local(dest)) => Box::pin(Room {
                process: self.process.clone(),
                stage: *dest,
            }),
            Some(Target::Remote(sink)) => {
                let backoff = self.process.exec.sleep(Duration::from_millis(1));
                let Some(signal) = sink.room() else {
                    return backoff;
                };
                /// The first of the transport's signal and the back-off.
                struct First(BoxFuture<()>, BoxFuture<()>);
                impl Future for First {
                    type Output = ();
                    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                        if self.0.as_mut().poll(cx).is_ready()
                            || self.1.as_mut().poll(cx).is_ready()
                        {
                            Poll::Ready(())
                        } else {
                            Poll::Pending
                        }
                    }
                }
                Box::pin(First(signal, backoff))
            }
            None => self.process.exec.sleep(Duration::from_millis(1)),
        }
    }

    /// A future that completes after `d`; the instance waits without holding a thread
    /// (`leda.sleep`). Use it from an async handler, or hand it to [`Ctx::wait`].
    pub fn sleep(&self, d: Duration) -> BoxFuture<()> {
        self.process.exec.sleep(d)
    }

    /// Yields the worker and re-queues the instance (`leda.nice`).
    pub fn nice(&self) -> impl Future<Output = ()> + Send + 'static {
        Yield(false)
    }

    /// Sends now what this call has sent so far: events to stages of this process
    /// are otherwise held in batches until the instance's batch of events ends (or
    /// the handler waits), and events to other processes are written by this worker
    /// then. A handler that runs long between sends (a source pacing itself) calls
    /// this after each burst so its events do not wait for it to return.
    pub fn flush(&self) {
        super::outbox::flush(&self.process);
    }

    /// Marks work this stage carries on outside its handler calls — on a thread or
    /// runtime of its own, sending through a clone of this `Ctx` — that will still send
    /// events. While the guard lives the process is not idle, so a run that ends when
    /// idle ([`super::Run::until_idle`], `leda run`) waits for that work instead of ending
    /// before its events are sent. Drop the guard after the last send.
    pub fn busy(&self) -> Busy {
        self.process.busy_outside.fetch_add(1, SeqCst);
        Busy(self.process.clone())
    }

    /// `true` once the run is ending (a quit, a timeout, the loss of the process that
    /// launched it): what a handler still sends may not be handled, and a long
    /// computation may as well stop.
    pub fn is_stopping(&self) -> bool {
        self.process.stopping.load(Relaxed)
    }

    /// Ends the run; `run` returns `values` (`leda.quit`).
    pub fn quit(&self, values: impl Into<Event>) {
        self.process.quit(values.into());
    }

    /// Seconds since the Unix epoch, microsecond resolution (`leda.gettime`); virtual in
    /// simulation.
    pub fn gettime(&self) -> f64 {
        self.process.exec.now()
    }

    /// Parks this instance on `fut` once the handler returns: the instance is Waiting
    /// and the worker thread is free until `fut` completes; its result counts as the
    /// handler's. The next event is handled only after that (serial order holds).
    /// Waits asked for earlier in the same call (or sends held by
    /// [`Ctx::send_or_wait`]) complete first.
    ///
    /// Only the `Ctx` a handler call is given parks: on a clone (an async handler's, or
    /// one kept by another thread) nothing would ever poll `fut`, so it is dropped with
    /// an error in the log (`leda::handler`); await it there instead.
    pub fn wait(&mut self, fut: impl Future<Output = HandlerResult> + Send + 'static) {
        if !self.in_call {
            tracing::error!(
                target: "leda::handler",
                stage = self.stage_name(),
                "Ctx::wait on a clone of a handler's Ctx: nothing waits there, the future \
                 is dropped (await it instead)"
            );
            return;
        }
        self.backlog = None;
        // Sends held by `send_or_wait` earlier in this call go first.
        self.wait = Some(match self.wait.take() {
            None => Box::pin(fut),
            Some(before) => Box::pin(async move {
                before.await?;
                fut.await
            }),
        });
    }

    /// Publishes the sent-event counts not yet published.
    pub(crate) fn flush_counts(&mut self) {
        if self.hint_sent > 0 {
            let n = std::mem::take(&mut self.hint_sent);
            publish_sent(&self.process, self.stage, self.route_hint, n);
        }
        publish_all_sent(&mut self.sent, &self.process, self.stage);
    }
}

/// Publishes and clears the sent-event counts of `stage` (one per route).
fn publish_all_sent(sent: &mut [u64], process: &Process, stage: usize) {
    if sent.iter().all(|&c| c == 0) {
        return;
    }
    for (ri, c) in sent.iter_mut().enumerate() {
        if *c > 0 {
            publish_sent(process, stage, ri, *c);
            *c = 0;
        }
    }
}

/// Sent-event counts are published to the statistics at least this often (and when
/// the handler call or task ends), so long-running senders show steady rates.
const SEND_FLUSH_EVERY: u64 = 64;

/// Adds `count` events sent on route `ri` of `stage` to the connector and destination
/// statistics.
fn publish_sent(process: &Process, stage: usize, ri: usize, count: u64) {
    let route = &process.stages[stage].routes()[ri];
    process.connectors[route.connector]
        .0
        .events
        .fetch_add(count, Relaxed);
    if let Target::Local(dest) = route.target {
        process.stages[dest]
            .counters
            .received
            .fetch_add(count, Relaxed);
    }
}

/// The future of [`Ctx::send_wait`]: completes once the event is sent, or with the
/// error that stopped it.
#[must_use = "the event may still be waiting for room: await the future"]
pub struct SendWait<'a, K> {
    ctx: &'a mut Ctx,
    port: K,
    /// `None` once the event is sent (the common case: sent when the future was made).
    slow: Option<Box<Slow>>,
}

/// A [`SendWait`] that could not send at once (boxed: rare, and it keeps the future
/// of a successful send two words and a key).
enum Slow {
    Failed(Option<SendError>),
    /// The queue was full: wait for room, then try again.
    Full(Option<Event>),
    Waiting(Option<Event>, BoxFuture<()>),
}

impl Slow {
    fn after(r: Rejected) -> Slow {
        match r {
            Rejected {
                error: SendError::QueueFull { .. },
                event,
            } => Slow::Full(Some(event)),
            Rejected { error, .. } => Slow::Failed(Some(error)),
        }
    }
}

// No field is ever pinned (the room future is boxed; the key is only read).
impl<K> Unpin for SendWait<'_, K> {}

impl<K: PortKey> Future for SendWait<'_, K> {
    type Output = Result<(), SendError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.slow.is_none() {
            return Poll::Ready(Ok(()));
        }
        this.poll_slow(cx)
    }
}

impl<K: PortKey> SendWait<'_, K> {
    #[cold]
    fn poll_slow(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        let this = self;
        loop {
            let Some(slow) = this.slow.as_deref_mut() else {
                return Poll::Ready(Ok(()));
            };
            match slow {
                Slow::Failed(e) => {
                    let e = e.take().expect("SendWait polled after it completed");
                    return Poll::Ready(Err(e));
                }
                Slow::Full(event) => {
                    let event = event.take().expect("a full send holds its event");
                    *slow = Slow::Waiting(Some(event), this.ctx.room(&this.port));
                }
                Slow::Waiting(event, room) => {
                    if room.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let event = event.take().expect("a waiting send holds its event");
                    match this.ctx.try_send(&this.port, event) {
                        Ok(()) => this.slow = None,
                        Err(r) => *slow = Slow::after(r),
                    }
                }
            }
        }
    }
}

/// Work outside handler calls that keeps the process from being idle: see [`Ctx::busy`].
#[must_use = "the process counts as busy only while the guard lives"]
pub struct Busy(Arc<Process>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy_outside.fetch_sub(1, SeqCst);
    }
}

/// Completes when a stage's queue has room.
struct Room {
    process: Arc<Process>,
    stage: usize,
}

impl Future for Room {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let st = &self.process.stages[self.stage];
        if st.has_room() || self.process.stopping.load(Relaxed) || !st.wait_for_space(cx.waker()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Returns `Pending` once, after asking to be woken: the task goes back to the ready queue.
struct Yield(bool);

impl Future for Yield {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        super::task::mark_nice();
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
