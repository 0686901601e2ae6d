//! Stages: the handler, how its instances are built, and its attributes.
//!
//! A [`Stage`] is a cheap, cloneable handle (like a Lua stage object): building a graph
//! connects handles, and `push` on a handle queues initial events for the next run.
//!
//! # Instance semantics
//!
//! * **Serial** (`serial()`): exactly one persistent instance; its state is kept between
//!   events and events are handled one at a time in arrival order.
//! * **Parallel** (the default): up to `maxpar` instances run at once. Instances are
//!   created lazily by `init` and *recycled without reset* (the original Leda's
//!   semantics, option (b) of the model): a transient handler must not rely on state
//!   left by an earlier event, nor on its absence. Building a fresh state per event
//!   would cost an `init` per event.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::event::Event;
use crate::port::Port;
use crate::runtime::Ctx;
use crate::value::{Value, ValueError};

/// Any error a handler, `init` or `bind` may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler returns: `Ok(())`, or an error that kills the instance.
pub type HandlerResult = Result<(), BoxError>;

/// An event handler with its private instance state.
///
/// Implement this for a struct when an instance needs state; closures work through
/// [`Stage::new`] and [`Stage::stateful`].
pub trait Handler: Send + 'static {
    /// Handles one event. Returning an error (or panicking) kills this instance only.
    fn handle(&mut self, event: Event, ctx: &mut Ctx) -> HandlerResult;
}

/// A stage's named attributes (`pattern` of the thesis' match stage, `size` of a
/// window...). Instances receive a snapshot taken when the run starts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(BTreeMap<String, Value>);

impl Attrs {
    /// The attribute named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// Typed access to an attribute; a missing attribute reads as nil.
    pub fn get_as<'a, T: serde::Deserialize<'a>>(&'a self, key: &str) -> Result<T, ValueError> {
        const NIL: Value = Value::Nil;
        self.0
            .get(key)
            .unwrap_or(&NIL)
            .to()
            .map_err(|e| ValueError(format!("attribute '{key}': {e}")))
    }

    /// Sets an attribute.
    pub fn set(&mut self, key: impl Into<String>, v: impl Into<Value>) {
        self.0.insert(key.into(), v.into());
    }

    /// Iterates over the attributes in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// Builds the state of new instances.
pub trait InstanceFactory: Send + Sync + 'static {
    /// Creates one instance (runs the stage's `init`).
    fn create(&self, attrs: &Attrs) -> Result<Box<dyn Handler>, BoxError>;
}

impl<F> InstanceFactory for F
where
    F: Fn(&Attrs) -> Result<Box<dyn Handler>, BoxError> + Send + Sync + 'static,
{
    fn create(&self, attrs: &Attrs) -> Result<Box<dyn Handler>, BoxError> {
        self(attrs)
    }
}

/// What `bind` sees: the stage's attributes and which output ports the graph connects.
#[derive(Debug)]
pub struct BindCtx<'a> {
    /// The stage's name.
    pub name: &'a str,
    /// The stage's attributes as they stand when the run starts.
    pub attrs: &'a Attrs,
    /// The connected output ports.
    pub outputs: &'a [Port],
}

impl BindCtx<'_> {
    /// `true` if `port` is connected.
    pub fn has_output(&self, port: impl Into<Port>) -> bool {
        let p = port.into();
        self.outputs.contains(&p)
    }
}

type BindFn = dyn Fn(&BindCtx<'_>) -> Result<(), String> + Send + Sync;

/// A stage's definition, shared by every handle to it.
pub(crate) struct StageSpec {
    pub(crate) factory: Arc<dyn InstanceFactory>,
    pub(crate) serial: bool,
    pub(crate) fail_stop: bool,
    pub(crate) nonblocking: bool,
    pub(crate) maxpar: Option<usize>,
    pub(crate) capacity: Option<usize>,
    pub(crate) attrs: Attrs,
    pub(crate) bind: Option<Arc<BindFn>>,
    pub(crate) pushed: Vec<Event>,
    pub(crate) kind: Option<String>,
}

/// A unique stage identity (names may repeat across graphs; ids never do).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageId(u64);

struct StageInner {
    id: StageId,
    name: String,
    spec: Mutex<StageSpec>,
}

/// A handle to a stage: handler, instance policy, attributes and initial events.
#[derive(Clone)]
pub struct Stage(Arc<StageInner>);

static NEXT_STAGE_ID: AtomicU64 = AtomicU64::new(1);

/// Default event-queue capacity of a stage.
pub const DEFAULT_CAPACITY: usize = 64 * 1024;

impl Stage {
    /// A stage from an instance factory (the general constructor).
    pub fn from_factory(name: impl Into<String>, factory: impl InstanceFactory) -> Stage {
        Stage(Arc::new(StageInner {
            id: StageId(NEXT_STAGE_ID.fetch_add(1, Ordering::Relaxed)),
            name: name.into(),
            spec: Mutex::new(StageSpec {
                factory: Arc::new(factory),
                serial: false,
                fail_stop: false,
                nonblocking: false,
                maxpar: None,
                capacity: None,
                attrs: Attrs::default(),
                bind: None,
                pushed: Vec::new(),
                kind: None,
            }),
        }))
    }

    /// A stage whose instances have no state of their own: `handler(event, ctx)`.
    pub fn new<F>(name: impl Into<String>, handler: F) -> Stage
    where
        F: Fn(Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static,
    {
        let f = Arc::new(handler);
        Stage::from_factory(
            name,
            move |_: &Attrs| -> Result<Box<dyn Handler>, BoxError> {
                Ok(Box::new(FnHandler(f.clone())))
            },
        )
    }

    /// A stage whose instances carry state `S` built by `init` from the attributes.
    pub fn stateful<S, I, F>(name: impl Into<String>, init: I, handler: F) -> Stage
    where
        S: Send + 'static,
        I: Fn(&Attrs) -> Result<S, BoxError> + Send + Sync + 'static,
        F: Fn(&mut S, Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static,
    {
        let f = Arc::new(handler);
        Stage::from_factory(
            name,
            move |attrs: &Attrs| -> Result<Box<dyn Handler>, BoxError> {
                Ok(Box::new(StateHandler {
                    state: init(attrs)?,
                    f: f.clone(),
                }))
            },
        )
    }

    /// A stage whose instances are `H`s built by `init` (a [`Handler`] implementation).
    pub fn from_handler<H, I>(name: impl Into<String>, init: I) -> Stage
    where
        H: Handler,
        I: Fn(&Attrs) -> Result<H, BoxError> + Send + Sync + 'static,
    {
        Stage::from_factory(
            name,
            move |attrs: &Attrs| -> Result<Box<dyn Handler>, BoxError> {
                Ok(Box::new(init(attrs)?))
            },
        )
    }

    /// A stage with an asynchronous handler. While its future is pending (a sleep, a
    /// socket, a full destination queue), the instance is *Waiting* and its worker
    /// thread is free to run other instances.
    pub fn asynchronous<F, Fut>(name: impl Into<String>, handler: F) -> Stage
    where
        F: Fn(Event, Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        Stage::new(name, move |ev, ctx| {
            let fut = handler(ev, ctx.clone());
            ctx.wait(fut);
            Ok(())
        })
    }

    /// The stage's unique id.
    pub fn id(&self) -> StageId {
        self.0.id
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub(crate) fn spec(&self) -> MutexGuard<'_, StageSpec> {
        // A panic while holding this lock cannot leave the spec half-written: every
        // critical section is a single field assignment.
        self.0.spec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One persistent instance; events handled in arrival order.
    pub fn serial(self) -> Self {
        self.spec().serial = true;
        self
    }

    /// Serial, and **fail-stop**: when its instance fails (its handler or `init` returns
    /// an error or panics), the stage stops for the rest of the run instead of building
    /// a fresh instance, whose state would not be the dead one's (a mutual-exclusion
    /// node that forgot it holds the token, a coordinator that counts fences from 0
    /// again). Its queued events, and every event sent to it later, fail without
    /// reaching a handler: each is counted as the stage's error, logged, and sent to its
    /// `error` port like any failed event, with the reason `stage 'NAME' stopped after
    /// a failure: FIRST ERROR`. This is the crash of the fail-stop model that
    /// crash-tolerant algorithms assume.
    pub fn fail_stop(self) -> Self {
        {
            let mut spec = self.spec();
            spec.serial = true;
            spec.fail_stop = true;
        }
        self
    }

    /// Declares that the stage's handlers never block their thread: no sleeping, no
    /// blocking I/O, no `block_on` of a runtime, no waiting for a send's room other
    /// than with `send_or_wait`, `send_wait` or `ctx.wait`. Events that come from
    /// another process may then be handled on the thread that read them, when the
    /// stage's queued work is short, instead of waking a pool worker: a round trip
    /// through such a stage costs its process one thread wake-up instead of two (see
    /// `Claimed::run` in [`crate::runtime`]). A handler that blocks anyway holds up
    /// that connection meanwhile, or panics in `block_on` (the reading thread belongs
    /// to the transport's tokio runtime). A call that computes long is allowed: the
    /// peer's silence is not counted while its reader runs it, and after a run there
    /// that took over a millisecond the stage goes to the pool for a while (a tenth of
    /// a second, doubling with each further such run up to ten seconds, and at least a
    /// hundred times the run's length); but while calls hold
    /// every thread of that runtime for longer than the silence bound, this process
    /// sends no heartbeats and its peers take it for lost.
    pub fn nonblocking(self) -> Self {
        self.spec().nonblocking = true;
        self
    }

    /// At most `n` instances at once (ignored for serial stages).
    pub fn maxpar(self, n: usize) -> Self {
        self.spec().maxpar = Some(n.max(1));
        self
    }

    /// The event-queue capacity (default [`DEFAULT_CAPACITY`]).
    pub fn capacity(self, n: usize) -> Self {
        self.spec().capacity = Some(n.max(1));
        self
    }

    /// Sets an attribute (builder form).
    pub fn attr(self, key: impl Into<String>, v: impl Into<Value>) -> Self {
        self.set_attr(key, v);
        self
    }

    /// Sets an attribute on an existing handle (the attributes are read at run time).
    pub fn set_attr(&self, key: impl Into<String>, v: impl Into<Value>) {
        self.spec().attrs.set(key, v);
    }

    /// The current attributes.
    pub fn attrs(&self) -> Attrs {
        self.spec().attrs.clone()
    }

    /// A check run once before the graph starts; `Err(message)` refuses the run.
    pub fn bind<F>(self, f: F) -> Self
    where
        F: Fn(&BindCtx<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        self.spec().bind = Some(Arc::new(f));
        self
    }

    /// Queues `event` for the next run (`autostart`), as [`Stage::push`] does: the run
    /// that starts takes it, so a graph run a second time (a simulation replayed with
    /// the same seed) gets it again only if pushed again. `Event::new()` is the thesis'
    /// `autostart = true`.
    pub fn autostart(self, event: impl Into<Event>) -> Self {
        self.push(event);
        self
    }

    /// Queues an initial event for the next run (`stage:push(...)`): the next run that
    /// starts takes it (a start that fails leaves it queued). Initial events are
    /// queued whatever the stage's capacity.
    pub fn push(&self, event: impl Into<Event>) {
        self.spec().pushed.push(event.into());
    }

    /// Names the registered kind of this stage, so that a remote process can rebuild
    /// it from its own registry (used by leda-net deployment).
    pub fn kind(self, kind: impl Into<String>) -> Self {
        self.spec().kind = Some(kind.into());
        self
    }

    /// The registered kind, if any.
    pub fn kind_name(&self) -> Option<String> {
        self.spec().kind.clone()
    }

    /// `true` for fail-stop stages ([`Stage::fail_stop`]).
    pub fn is_fail_stop(&self) -> bool {
        self.spec().fail_stop
    }

    /// `true` for a serial stage.
    pub fn is_serial(&self) -> bool {
        self.spec().serial
    }

    /// `true` for a stage declared [`Stage::nonblocking`].
    pub fn is_nonblocking(&self) -> bool {
        self.spec().nonblocking
    }

    /// The instance limit set with [`Stage::maxpar`], if any.
    pub fn maxpar_setting(&self) -> Option<usize> {
        self.spec().maxpar
    }

    /// The queue capacity set with [`Stage::capacity`], if any.
    pub fn capacity_setting(&self) -> Option<usize> {
        self.spec().capacity
    }

    /// Takes the initial events queued with [`Stage::push`] (a launcher ships those of
    /// remote stages to the process that runs them).
    pub fn take_pushed(&self) -> Vec<Event> {
        std::mem::take(&mut self.spec().pushed)
    }

    /// A new stage with the same handler, policy and attributes under another name
    /// (`leda.stage "name" (existing)`); initial events are not copied.
    pub fn clone_as(&self, name: impl Into<String>) -> Stage {
        let spec = self.spec();
        let s = Stage::from_factory(name, NoFactory);
        {
            let mut new = s.spec();
            new.factory = spec.factory.clone();
            new.serial = spec.serial;
            new.fail_stop = spec.fail_stop;
            new.nonblocking = spec.nonblocking;
            new.maxpar = spec.maxpar;
            new.capacity = spec.capacity;
            new.attrs = spec.attrs.clone();
            new.bind = spec.bind.clone();
            new.kind = spec.kind.clone();
        }
        s
    }
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stage({})", self.name())
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for Stage {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}
impl Eq for Stage {}

struct NoFactory;
impl InstanceFactory for NoFactory {
    fn create(&self, _: &Attrs) -> Result<Box<dyn Handler>, BoxError> {
        Err("stage has no handler".into())
    }
}

struct FnHandler<F>(Arc<F>);

impl<F> Handler for FnHandler<F>
where
    F: Fn(Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static,
{
    #[inline]
    fn handle(&mut self, event: Event, ctx: &mut Ctx) -> HandlerResult {
        (self.0)(event, ctx)
    }
}

struct StateHandler<S, F> {
    state: S,
    f: Arc<F>,
}

impl<S, F> Handler for StateHandler<S, F>
where
    S: Send + 'static,
    F: Fn(&mut S, Event, &mut Ctx) -> HandlerResult + Send + Sync + 'static,
{
    #[inline]
    fn handle(&mut self, event: Event, ctx: &mut Ctx) -> HandlerResult {
        (self.f)(&mut self.state, event, ctx)
    }
}
