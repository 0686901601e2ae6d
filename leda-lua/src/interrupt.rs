//! Stopping handler code that runs on after its run ended.
//!
//! A handler in an endless loop holds its worker thread, and the run cannot end while a
//! worker is busy: on a daemon, whose run ends when its launcher is gone, every later
//! deployment was then refused until the daemon was restarted. So each instance shows,
//! in a [`Slot`], that it is resuming its coroutine and on which thread, and one watcher
//! thread per process looks at the slots ten times a second: once the run of a running
//! instance has been stopping for a second, it sends that thread a signal (`SIGRTMAX - 1`), whose handler
//! sets a count hook on the coroutine the thread is resuming — what Lua's own
//! interpreter does on Ctrl-C (`lua_sethook` is safe in a signal handler, not from
//! another thread while the coroutine runs). The hook raises "the run ended" at every
//! instruction, so no `pcall` can swallow it: the handler fails like any other, its
//! instance dies, and the worker is free. Nothing is set while the run goes on: a
//! handler may compute for as long as it likes.
//!
//! What this does not reach: a loop inside a C function (a pattern match that
//! backtracks, `string.rep`), a loop in a coroutine the handler made itself (hooks are
//! per coroutine in Lua 5.4), and, on LuaJIT built without `LUAJIT_ENABLE_CHECKHOOK`, a
//! loop its compiler compiled. A program embedding `leda-lua` must leave `SIGRTMAX - 1`
//! to it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock, Weak};
use std::time::{Duration, Instant};

use leda_core::prelude::Ctx;
use mlua::ffi;

/// How often the watcher looks at the running instances (and signals again a thread
/// still running a handler it wants interrupted).
const EVERY: Duration = Duration::from_millis(100);

/// How long a handler may go on after its run began to stop: one that ends by itself
/// within it ends normally.
const GRACE: Duration = Duration::from_secs(1);

/// The message of the error raised in an interrupted handler.
pub(crate) const MESSAGE: &std::ffi::CStr =
    c"the run ended while this handler was running: interrupted";

/// What one instance is running, if anything.
#[derive(Default)]
pub(crate) struct Slot {
    /// The instance's run (a context of it), known from its first event on.
    run: Mutex<Option<Ctx>>,
    /// The coroutine being resumed (null between resumes).
    state: AtomicPtr<ffi::lua_State>,
    /// The kernel id of the thread resuming it (0 between resumes).
    tid: AtomicI32,
    /// When the watcher first saw the run stopping.
    stopping_since: Mutex<Option<Instant>>,
    /// The run has been stopping for [`GRACE`]: interrupt the handler (sticky; a run
    /// never goes on again).
    wanted: AtomicBool,
    /// `run` is set (read first: no lock per handler call).
    has_run: AtomicBool,
}

thread_local! {
    /// The slot whose coroutine this thread is resuming (what the signal handler reads).
    static RESUMING: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
    /// This thread's kernel id, once asked (`gettid` is a system call: not one per
    /// handler call).
    static TID: Cell<libc::pid_t> = const { Cell::new(0) };
}

fn tid() -> libc::pid_t {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: `gettid` has no preconditions.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    })
}

/// The signal handler is in place: without it, the signal would kill the process.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// While alive, the slot shows its coroutine as running on this thread; dropped, the
/// thread shows what it showed before (an instance run inline by another's send, a
/// cohort, ends inside the other's resume).
pub(crate) struct Resuming<'a> {
    slot: &'a Slot,
    before: *const Slot,
}

impl Drop for Resuming<'_> {
    fn drop(&mut self) {
        RESUMING.with(|r| r.set(self.before));
        self.slot.tid.store(0, SeqCst);
        self.slot.state.store(std::ptr::null_mut(), SeqCst);
    }
}

impl Slot {
    /// A slot the watcher looks at for as long as it lives.
    pub(crate) fn new() -> Arc<Slot> {
        let slot = Arc::new(Slot::default());
        watched().push(Arc::downgrade(&slot));
        slot
    }

    /// Shows `thread` as being resumed on this thread for `ctx`'s run until the guard
    /// drops (an instance whose run already stopped is interrupted at once).
    pub(crate) fn resuming(&self, thread: &mlua::Thread, ctx: &Ctx) -> Resuming<'_> {
        if !self.has_run.load(SeqCst) {
            let mut run = self.run.lock().unwrap_or_else(|e| e.into_inner());
            if run.is_none() {
                *run = Some(ctx.clone());
            }
            self.has_run.store(true, SeqCst);
        }
        self.state.store(thread.state(), SeqCst);
        self.tid.store(tid(), SeqCst);
        let before = RESUMING.with(|r| r.replace(self as *const Slot));
        if self.wanted.load(SeqCst) {
            // SAFETY: this thread is about to resume the coroutine, which is alive.
            unsafe { set_hook(thread.state()) };
        }
        Resuming { slot: self, before }
    }
}

impl Slot {
    /// Whether this instance is being interrupted (its run has been stopping for
    /// [`GRACE`]).
    pub(crate) fn wanted(&self) -> bool {
        self.wanted.load(SeqCst)
    }
}

/// Whether the handler this thread runs is being interrupted (the sandbox's `xpcall`
/// then skips the handler's own message handler, which Lua runs with hooks off).
pub(crate) fn interrupting() -> bool {
    let slot = RESUMING.with(Cell::get);
    // SAFETY: set by `Slot::resuming` from a slot borrowed while the pointer is set.
    !slot.is_null() && unsafe { &*slot }.wanted.load(SeqCst)
}

fn watched() -> MutexGuard<'static, Vec<Weak<Slot>>> {
    static W: OnceLock<Mutex<Vec<Weak<Slot>>>> = OnceLock::new();
    let w = W.get_or_init(|| {
        if let Err(e) = std::thread::Builder::new()
            .name("leda-lua-interrupt".into())
            .spawn(watch)
        {
            tracing::warn!("no watcher for handlers running past their run's end: {e}");
        }
        Mutex::new(Vec::new())
    });
    w.lock().unwrap_or_else(|e| e.into_inner())
}

fn signal() -> libc::c_int {
    libc::SIGRTMAX() - 1
}

fn watch() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: installs a handler that only reads this crate's thread-local and atomics
        // and calls `lua_sethook` (async-signal-safe by Lua's design).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(signal(), &act, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, SeqCst);
            } else {
                tracing::warn!(
                    "no signal handler to interrupt handlers running past their run's end: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
    // SAFETY: `getpid` has no preconditions.
    let pid = unsafe { libc::getpid() };
    loop {
        std::thread::sleep(EVERY);
        let slots: Vec<Arc<Slot>> = {
            let mut w = watched();
            w.retain(|s| s.strong_count() > 0);
            w.iter().filter_map(Weak::upgrade).collect()
        };
        for slot in slots {
            if !slot.wanted.load(SeqCst) {
                let stopping = slot
                    .run
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .is_some_and(Ctx::is_stopping);
                if !stopping {
                    continue;
                }
                let since = *slot
                    .stopping_since
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(Instant::now);
                if since.elapsed() < GRACE {
                    continue;
                }
                slot.wanted.store(true, SeqCst);
            }
            // Every tick while it runs: a signal that found the thread in another
            // instance's handler (a cohort send) set nothing on this one.
            let tid = slot.tid.load(SeqCst);
            if tid != 0 && INSTALLED.load(SeqCst) {
                // SAFETY: `tgkill` to a thread of this process; one that has exited
                // since makes it fail (ESRCH), it is not undefined as `pthread_kill` is.
                unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal()) };
            }
        }
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    let slot = RESUMING.with(Cell::get);
    if slot.is_null() {
        return;
    }
    // SAFETY: set by `Slot::resuming` on this thread from a slot borrowed for as long as
    // the pointer is set (the guard restores the one before); a signal handler runs
    // between two instructions of this thread, so it sees either.
    let slot = unsafe { &*slot };
    let state = slot.state.load(SeqCst);
    if slot.wanted.load(SeqCst) && !state.is_null() {
        // SAFETY: the coroutine is being resumed by this thread, so it is alive.
        unsafe { set_hook(state) };
    }
}

/// # Safety
///
/// `state` must be a live `lua_State`.
unsafe fn set_hook(state: *mut ffi::lua_State) {
    // SAFETY: as the caller promises.
    unsafe { ffi::lua_sethook(state, Some(interrupt), ffi::LUA_MASKCOUNT, 1) };
}

/// Raises the error; the hook stays set (count 1), so a `pcall` that catches it returns
/// into code that raises it again.
unsafe extern "C-unwind" fn interrupt(state: *mut ffi::lua_State, _ar: *mut ffi::lua_Debug) {
    // SAFETY: `state` is the running coroutine handed to its hook; `luaL_error` unwinds
    // out of this frame, which owns nothing.
    unsafe {
        ffi::luaL_error(state, c"%s".as_ptr(), MESSAGE.as_ptr());
    }
}
