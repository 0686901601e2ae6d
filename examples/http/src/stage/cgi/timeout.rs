//! Stopping a page that runs past `cgi_timeout`, in both Lua flavours.
//!
//! * **Lua 5.4**: a count hook (every 10,000 VM instructions) compares the clock with
//!   the armed deadline and, past it, yields the page's coroutine (no `pcall` in the
//!   page can catch a yield; where the page cannot be yielded, an error after a
//!   second deadline's worth, and from then on at every instruction of that thread, so
//!   that a `pcall` that catches it returns into code that raises it again). A page's
//!   own coroutines get the hook when created. Past its time slice the page's own
//!   thread is yielded the same way, and marked as paused ([`Ended::sliced`]): the
//!   stage lets other work on its worker go first and then resumes it. Counting alone
//!   left a page of expensive instructions (`s:upper()` of 16 MB is one) running ~30 s
//!   past a 500 ms timeout, 10,000 of them between two looks at the clock, so a timer of
//!   the worker thread's own (the `alarm` submodule) also sets the page thread's count
//!   to 1 from its signal when the slice is due, and every slice after: the hook then
//!   runs after the instruction under way.
//! * **LuaJIT**: a count hook would run only in the interpreter (JIT-compiled loops
//!   never call hooks), so no hook is set while pages run; a watchdog thread sets one
//!   (count 1, raising the error) when the deadline passes, which LuaJIT allows from
//!   another thread. Compiled loops see it only if LuaJIT was built with
//!   `LUAJIT_ENABLE_CHECKHOOK` (`CFLAGS=-DLUAJIT_ENABLE_CHECKHOOK`, what `bench.sh`
//!   and CI do): [`Timeout::install`] probes for that and, without it, turns the JIT
//!   compiler off (LuaJIT's interpreter), so that a runaway page is always stopped.

use std::ffi::CStr;
use std::time::Instant;

use mlua::Lua;

/// The error message of a page stopped by its deadline.
const MESSAGE: &CStr = c"script ran past cgi_timeout";

/// How a page's run ended, as [`Timeout::disarm`] saw it.
#[derive(Clone, Copy)]
pub(super) struct Ended {
    /// The hook yielded the page at the end of its slice (Lua 5.4).
    pub(super) sliced: bool,
    /// The armed deadline had passed.
    pub(super) expired: bool,
}

#[cfg(not(feature = "luajit"))]
pub(super) use count_hook::Timeout;
#[cfg(feature = "luajit")]
pub(super) use watchdog::Timeout;

#[cfg(not(feature = "luajit"))]
mod count_hook {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use mlua::{HookTriggers, VmState};

    use super::*;

    /// The running page's deadlines: past `at` it is stopped; past `last` it gets an
    /// error where it cannot be yielded; past `slice` its own thread (not a coroutine
    /// of the page's) is yielded so that other work on its worker goes first, and
    /// `sliced` records that.
    #[derive(Clone, Copy)]
    struct Deadlines {
        at: Instant,
        last: Instant,
        slice: Option<Instant>,
        sliced: bool,
    }

    type Shared = Arc<Mutex<Option<Deadlines>>>;

    /// The VM instructions between two calls of the hook.
    const COUNT: u32 = 10_000;

    const TRIGGERS: HookTriggers = HookTriggers::new().every_nth_instruction(COUNT);

    /// A hook (boxed: it installs itself again from within).
    type Hook = Box<dyn Fn(&Lua, &mlua::Debug) -> mlua::Result<VmState> + Send>;

    /// The hook: past the deadline, yield the page (no `pcall` in it can catch a
    /// yield); where it cannot yield (a metamethod, a callback of a C function) the
    /// yield is skipped until it can; past a second deadline's worth, an error,
    /// "file:line: message", as Lua's own, and the thread's hook then runs at every
    /// instruction: a `pcall`, `load` or `coroutine.resume` that catches the error
    /// returns into code that raises it again, so the page unwinds to its end (with
    /// the error every 10,000 instructions, a `pcall` in a loop inside a `table.sort`
    /// comparator caught each one and the page ran on for ever). On the page's own
    /// thread (`page`), past the slice, a yield too: the page is paused, not stopped.
    fn hook(d: Shared, page: bool) -> Hook {
        Box::new(move |lua, debug| {
            // Called at once by the alarm's count of 1: back to every `COUNT`.
            alarm::settle_running(lua);
            let now = Instant::now();
            let (past, late) = match d.lock().as_deref_mut() {
                Ok(Some(dl)) => {
                    let sliced = page && dl.slice.is_some_and(|s| now > s);
                    dl.sliced |= sliced;
                    (now > dl.at || sliced, now > dl.last)
                }
                _ => (false, false),
            };
            if late {
                let every = HookTriggers::new().every_nth_instruction(1);
                let _ = lua.current_thread().set_hook(every, hook(d.clone(), page));
                let file = debug.source().short_src.unwrap_or_default().into_owned();
                let line = debug.current_line().unwrap_or_default();
                return Err(mlua::Error::runtime(format!(
                    "{file}:{line}: {}",
                    MESSAGE.to_string_lossy()
                )));
            }
            Ok(if past {
                VmState::Yield
            } else {
                VmState::Continue
            })
        })
    }

    /// The deadline of the running page, checked by a count hook.
    pub(in crate::stage::cgi) struct Timeout {
        deadline: Shared,
    }

    impl Timeout {
        /// Installs the hook in `lua`.
        pub(in crate::stage::cgi) fn install(lua: &Lua) -> mlua::Result<Timeout> {
            let deadline: Shared = Arc::default();
            lua.set_hook(TRIGGERS, hook(deadline.clone(), false))?;
            Ok(Timeout { deadline })
        }

        /// Sets the hook on `th`, a page's own thread (Lua 5.4 keeps hooks per
        /// thread): the one the slice pauses.
        pub(in crate::stage::cgi) fn on_thread(&self, th: &mlua::Thread) -> mlua::Result<()> {
            th.set_hook(TRIGGERS, hook(self.deadline.clone(), true))
        }

        /// Replaces `coroutine.create` and `coroutine.wrap` in `co` by versions whose
        /// threads get the hook (mlua looks a hook up per thread: a thread the page
        /// creates would otherwise run past any deadline), and `coroutine.yield` by one
        /// that raises "a page may not yield" outside those threads: a page that yielded
        /// itself just after the hook had passed its slice where it could not yield (a
        /// `table.sort` comparator) was taken for paused and resumed (review finding).
        pub(in crate::stage::cgi) fn hook_coroutines(
            &self,
            lua: &Lua,
            co: &mlua::Table,
        ) -> mlua::Result<()> {
            let d = self.deadline.clone();
            let create = lua.create_function(move |lua, f: mlua::Function| {
                let th = lua.create_thread(f)?;
                th.set_hook(TRIGGERS, hook(d.clone(), false))?;
                Ok(th)
            })?;
            // SAFETY: `co_resume` is `coroutine.resume` (as lcorolib's), with this
            // thread's alarm aimed at the thread it resumes meanwhile.
            let resume = unsafe { lua.create_c_function(alarm::co_resume)? };
            co.set("resume", resume)?;
            lua.load(
                r#"
                local co, hooked = ...
                local resume, yield, running, error = co.resume, co.yield, co.running, error
                local own = setmetatable({}, {__mode = 'k'})
                local function create(f)
                  local th = hooked(f)
                  own[th] = true
                  return th
                end
                local function unwrap(ok, ...)
                  if not ok then error((...), 0) end
                  return ...
                end
                co.create = create
                co.wrap = function(f)
                  local th = create(f)
                  return function(...) return unwrap(resume(th, ...)) end
                end
                co.yield = function(...)
                  if not own[running()] then error('a page may not yield', 2) end
                  return yield(...)
                end
                "#,
            )
            .set_name("=leda-http sandbox")
            .call::<()>((co.clone(), create))
        }

        /// Pages run from now on are stopped past `at`, and paused past `slice`.
        pub(in crate::stage::cgi) fn arm(&self, at: Instant, slice: Option<Instant>) {
            if let Ok(mut d) = self.deadline.lock() {
                let now = Instant::now();
                *d = Some(Deadlines {
                    at,
                    last: at + at.saturating_duration_since(now),
                    slice,
                    sliced: false,
                });
            }
        }

        /// No deadline until the next [`Timeout::arm`]; how the run since it ended.
        pub(in crate::stage::cgi) fn disarm(&self) -> Ended {
            let armed = self.deadline.lock().ok().and_then(|mut d| d.take());
            Ended {
                sliced: armed.is_some_and(|dl| dl.sliced),
                expired: armed.is_some_and(|dl| Instant::now() > dl.at),
            }
        }

        /// Resumes `th`, a page's own thread ([`Timeout::on_thread`]), with `arg` (its
        /// first resume) or nothing, with this thread's alarm set to look at the
        /// deadlines after `due` (the end of the slice, or of the page's time if
        /// sooner) and every slice after, whatever instructions the page runs.
        pub(in crate::stage::cgi) fn resume(
            &self,
            lua: &Lua,
            th: &mlua::Thread,
            arg: Option<mlua::Table>,
            due: Duration,
        ) -> mlua::Result<mlua::MultiValue> {
            let _alarm = alarm::Alarm::set(th.state(), due);
            resume_raw(lua, th, arg)
        }
    }

    /// Resumes `th` with `arg` or nothing; its results, or its error. Not mlua's
    /// `Thread::resume`: after a yield it empties the thread's stack (and takes what it
    /// holds for arguments), and a thread the hook yielded is stopped inside a Lua
    /// function, whose stack above its registers holds what the next instruction may
    /// use: the results of a call with an open count (`f(g())`, `return g()`, `{g()}`).
    /// A page paused there went on with those values lost (a loop of `{g(i)}` failed
    /// in two runs of three with the count hook alone; "runtime error: 0" from the
    /// sandbox's `coroutine.wrap` once the alarm paused pages right after a resume).
    fn resume_raw(
        lua: &Lua,
        th: &mlua::Thread,
        arg: Option<mlua::Table>,
    ) -> mlua::Result<mlua::MultiValue> {
        use mlua::ffi;
        let l = th.state();
        let nargs = std::ffi::c_int::from(arg.is_some());
        // (Not the `Option` itself: `None` would push a nil.)
        let args: mlua::MultiValue = arg.into_iter().map(mlua::Value::Table).collect();
        // SAFETY: `l` is a thread of `lua`, not running (mlua's lock is held by
        // `exec_raw`); the argument `exec_raw` pushed is moved onto it, what it returns
        // or raises is moved onto `state`'s stack, and nothing with a destructor lives
        // in this frame when `lua_error` unwinds it.
        unsafe {
            lua.exec_raw::<mlua::MultiValue>(args, |state| {
                let mut n: std::ffi::c_int = 0;
                if ffi::lua_checkstack(l, nargs) == 0 {
                    ffi::luaL_error(state, c"no room for a page's argument".as_ptr());
                }
                ffi::lua_xmove(state, l, nargs);
                match ffi::lua_resume(l, state, nargs, &mut n) {
                    ffi::LUA_OK | ffi::LUA_YIELD => {
                        if ffi::lua_checkstack(state, n) == 0 {
                            ffi::luaL_error(state, c"a page returned too many values".as_ptr());
                        }
                        ffi::lua_xmove(l, state, n);
                    }
                    _ => {
                        // A table's `__tostring` would run in the message handler, on
                        // the main state, where neither the hook's slices nor the alarm
                        // reach it (review finding: 15 s past a 2 s timeout): named by
                        // its type instead, as `lua.c` names one without `__tostring`.
                        // (A page makes no userdata; other values have no metatable.)
                        if ffi::lua_type(l, -1) == ffi::LUA_TTABLE {
                            ffi::lua_pushstring(state, c"(error object is a table value)".as_ptr());
                        } else {
                            ffi::lua_xmove(l, state, 1);
                        }
                        ffi::lua_error(state);
                    }
                }
            })
        }
    }

    /// A timer per worker thread (`timer_create`, signalling that thread alone) whose
    /// signal sets a count-1 hook on the page thread running there. Lua allows
    /// `lua_sethook` in a signal handler of the thread it interrupts (its own `lua.c`
    /// stops a script on Ctrl-C so), not from another thread while that one runs (it
    /// writes the hook's fields and walks the call frames to set their `trap`). `leda-lua`'s
    /// interrupt of handlers that outlive their run works the same way, on
    /// `SIGRTMAX - 1`; this one is `SIGRTMIN + 4`, which a program embedding the server
    /// must leave to it.
    mod alarm {
        use std::cell::{Cell, RefCell};
        use std::ptr;
        use std::sync::OnceLock;

        use mlua::ffi;

        use super::*;

        /// After the first signal, the alarm rings every this long until the page's
        /// slice ends: the later deadlines (the timeout, the error past it) are seen
        /// within as much.
        const AGAIN: Duration = crate::stage::cgi::SLICE;

        thread_local! {
            /// The page thread running on this thread while its alarm is set.
            static PAGE: Cell<*mut ffi::lua_State> = const { Cell::new(ptr::null_mut()) };
            /// The innermost coroutine of the page's resumed on this thread (by
            /// [`co_resume`]), null while the page's own thread runs.
            static RUNNING: Cell<*mut ffi::lua_State> = const { Cell::new(ptr::null_mut()) };
            /// The signal set a thread's count to 1 ([`settle`] puts it back).
            static RAISED: Cell<bool> = const { Cell::new(false) };
            /// This thread's timer, made on its first page.
            static TIMER: RefCell<Option<Option<Timer>>> = const { RefCell::new(None) };
        }

        /// [`settle`] for the thread whose hook is running (called from the hook).
        pub(super) fn settle_running(lua: &Lua) {
            if RAISED.get() {
                // SAFETY: the thread is alive and on this thread, in its own hook,
                // where `lua_sethook` is ordinary API use.
                unsafe { settle(lua.current_thread().state()) };
            }
        }

        /// The signal (a real-time one no other part of the server uses), or `None`
        /// if its handler could not be installed (then only the count hook looks).
        fn signal() -> Option<libc::c_int> {
            static SIGNAL: OnceLock<Option<libc::c_int>> = OnceLock::new();
            *SIGNAL.get_or_init(|| {
                let signo = libc::SIGRTMIN() + 4;
                // SAFETY: a plain sigaction with a handler that only reads and writes
                // this thread's `Cell`s and calls Lua's hook functions.
                let ok = unsafe {
                    let mut sa: libc::sigaction = std::mem::zeroed();
                    sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                    sa.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut sa.sa_mask);
                    libc::sigaction(signo, &sa, ptr::null_mut()) == 0
                };
                if !ok {
                    tracing::warn!(
                        target: "leda_http::cgi",
                        error = %std::io::Error::last_os_error(),
                        "no alarm signal for pages: a page of long single instructions \
                         may run past its slice and cgi_timeout"
                    );
                }
                ok.then_some(signo)
            })
        }

        /// The signal handler: the running page thread's hook is called after the
        /// instruction under way.
        extern "C" fn on_signal(_: libc::c_int) {
            let mut l = PAGE.get();
            if l.is_null() {
                return;
            }
            let running = RUNNING.get();
            if !running.is_null() {
                l = running;
            }
            RAISED.set(true);
            // SAFETY: `l` is the page thread resumed on this thread (set before the
            // resume, cleared after the timer is stopped); `lua_sethook` may be called
            // from a signal handler of the thread it interrupts.
            unsafe {
                if let Some(h) = ffi::lua_gethook(l) {
                    ffi::lua_sethook(l, Some(h), ffi::lua_gethookmask(l), 1);
                }
            }
        }

        /// Puts `l`'s count back to [`COUNT`] if the signal set it to 1: from the hook
        /// that count called, or when the thread stopped running first (the hook had
        /// yielded just before the signal; review finding, that slice's successor ran
        /// the hook at every instruction).
        ///
        /// # Safety
        ///
        /// `l` is a live thread of the page's, either in its own hook on this thread or
        /// not running, and this thread's timer is stopped or `l` is not the one its
        /// signal aims at (or it is in its hook, which the signal only re-arms).
        unsafe fn settle(l: *mut ffi::lua_State) {
            if !RAISED.get() {
                return;
            }
            // SAFETY: as the caller promises.
            unsafe {
                if ffi::lua_gethookcount(l) == 1
                    && let Some(h) = ffi::lua_gethook(l)
                {
                    ffi::lua_sethook(l, Some(h), ffi::lua_gethookmask(l), COUNT as _);
                    // Only then: a signal that came meanwhile for the thread that
                    // resumed `l` is that thread's hook's to undo.
                    RAISED.set(false);
                }
            }
        }

        /// `coroutine.resume` (as lcorolib's), with [`RUNNING`] set to the resumed
        /// thread meanwhile: the alarm's signal sets the count on the thread that runs
        /// (review finding: a page that did its long instructions inside
        /// `coroutine.wrap` ran 20-33 s past a 2 s timeout).
        ///
        /// # Safety
        ///
        /// Called by Lua as a C function.
        #[allow(unsafe_op_in_unsafe_fn)]
        pub(super) unsafe extern "C-unwind" fn co_resume(l: *mut ffi::lua_State) -> libc::c_int {
            use std::sync::atomic::{Ordering, compiler_fence};
            ffi::luaL_checktype(l, 1, ffi::LUA_TTHREAD);
            let co = ffi::lua_tothread(l, 1);
            let narg = ffi::lua_gettop(l) - 1;
            if ffi::lua_checkstack(co, narg) == 0 {
                ffi::lua_pushboolean(l, 0);
                ffi::lua_pushstring(l, c"too many arguments to resume".as_ptr());
                return 2;
            }
            ffi::lua_xmove(l, co, narg);
            let prev = RUNNING.replace(co);
            compiler_fence(Ordering::SeqCst);
            let mut nres: libc::c_int = 0;
            let status = ffi::lua_resume(co, l, narg, &mut nres);
            compiler_fence(Ordering::SeqCst);
            RUNNING.set(prev);
            compiler_fence(Ordering::SeqCst);
            if co != l {
                settle(co);
            }
            if status == ffi::LUA_OK || status == ffi::LUA_YIELD {
                if ffi::lua_checkstack(l, nres + 1) == 0 {
                    ffi::lua_pop(co, nres);
                    ffi::lua_pushboolean(l, 0);
                    ffi::lua_pushstring(l, c"too many results to resume".as_ptr());
                    return 2;
                }
                ffi::lua_pushboolean(l, 1);
                ffi::lua_xmove(co, l, nres);
                nres + 1
            } else {
                ffi::lua_pushboolean(l, 0);
                ffi::lua_xmove(co, l, 1);
                2
            }
        }

        struct Timer(libc::timer_t);

        impl Timer {
            fn new(signo: libc::c_int) -> Option<Timer> {
                // SAFETY: a zeroed sigevent filled in for SIGEV_THREAD_ID (this thread).
                unsafe {
                    let mut ev: libc::sigevent = std::mem::zeroed();
                    ev.sigev_notify = libc::SIGEV_THREAD_ID;
                    ev.sigev_signo = signo;
                    ev.sigev_notify_thread_id = libc::gettid();
                    let mut id: libc::timer_t = ptr::null_mut();
                    if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) != 0 {
                        tracing::warn!(
                            target: "leda_http::cgi",
                            error = %std::io::Error::last_os_error(),
                            "no alarm timer for pages on this thread"
                        );
                        return None;
                    }
                    Some(Timer(id))
                }
            }

            /// Rings after `first`, then every `again` (zero: stopped).
            fn set(&self, first: Duration, again: Duration) {
                let ts = |d: Duration| libc::timespec {
                    tv_sec: d.as_secs() as libc::time_t,
                    tv_nsec: d.subsec_nanos().into(),
                };
                let spec = libc::itimerspec {
                    it_interval: ts(again),
                    it_value: ts(first),
                };
                // SAFETY: `self.0` is a live timer of this process.
                unsafe { libc::timer_settime(self.0, 0, &spec, ptr::null_mut()) };
            }
        }

        impl Drop for Timer {
            fn drop(&mut self) {
                // SAFETY: deleted once, here.
                unsafe { libc::timer_delete(self.0) };
            }
        }

        /// This thread's alarm, set for one slice of one page: stopped when dropped
        /// (also when the resume unwinds).
        pub(super) struct Alarm(bool);

        impl Alarm {
            pub(super) fn set(page: *mut ffi::lua_State, first: Duration) -> Alarm {
                let Some(signo) = signal() else {
                    return Alarm(false);
                };
                let set = TIMER.with_borrow_mut(|t| {
                    // Made once per thread: a thread whose timer_create failed warns once.
                    t.get_or_insert_with(|| Timer::new(signo))
                        .as_ref()
                        .map(|t| {
                            PAGE.set(page);
                            // Never zero: that would stop the timer instead.
                            t.set(first.max(Duration::from_micros(1)), AGAIN);
                        })
                });
                Alarm(set.is_some())
            }
        }

        impl Drop for Alarm {
            fn drop(&mut self) {
                if self.0 {
                    TIMER.with_borrow(|t| {
                        if let Some(Some(t)) = t {
                            t.set(Duration::ZERO, Duration::ZERO);
                        }
                    });
                    // A signal from before the timer stopped has been handled by now
                    // (delivered on the return from timer_settime).
                    let l = PAGE.get();
                    if !l.is_null() {
                        // SAFETY: `l` is the page thread, alive and not running; the
                        // timer is stopped.
                        unsafe { settle(l) };
                    }
                    PAGE.set(ptr::null_mut());
                    RAISED.set(false);
                }
            }
        }
    }
}

#[cfg(feature = "luajit")]
mod watchdog {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
    use std::thread::JoinHandle;

    use mlua::{HookTriggers, VmState, ffi};

    use super::*;

    /// A `lua_State` of the instance's Lua, anchored in its registry so that it lives as
    /// long as the Lua does. LuaJIT's hooks are global to a Lua, so any of its threads
    /// will do.
    struct RawState(*mut ffi::lua_State);

    // SAFETY: the watchdog thread uses the pointer only for `lua_sethook`, which LuaJIT
    // allows from another native thread while the Lua runs, and only while a page runs
    // (armed), that is while the `Lua` is alive.
    unsafe impl Send for RawState {}

    struct Slot {
        state: RawState,
        deadline: Option<Instant>,
        fired: bool,
        stop: bool,
    }

    struct Shared {
        slot: Mutex<Slot>,
        wake: Condvar,
    }

    impl Shared {
        fn lock(&self) -> MutexGuard<'_, Slot> {
            self.slot.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// A watchdog thread that interrupts the running page at its deadline.
    pub(in crate::stage::cgi) struct Timeout {
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
    }

    /// Raises the timeout error in the page; stays set (count 1) until disarmed, so a
    /// page's `pcall` cannot swallow it.
    unsafe extern "C-unwind" fn stop(state: *mut ffi::lua_State, _ar: *mut ffi::lua_Debug) {
        // SAFETY: `state` is the running Lua thread handed to the hook; `luaL_error`
        // unwinds out of this frame, which owns nothing.
        unsafe {
            ffi::luaL_error(state, c"%s".as_ptr(), MESSAGE.as_ptr());
        }
    }

    impl Timeout {
        /// Starts the watchdog for `lua` (and turns LuaJIT's compiler off when compiled
        /// loops cannot be interrupted in this build).
        pub(in crate::stage::cgi) fn install(lua: &Lua) -> mlua::Result<Timeout> {
            let sees_hooks = compiled_loops_see_hooks(lua)?;
            tracing::debug!(target: "leda_http::cgi", sees_hooks, "LuaJIT: compiled loops check hooks");
            if !sees_hooks {
                static WARN: Once = Once::new();
                WARN.call_once(|| {
                    tracing::warn!(
                        target: "leda_http::cgi",
                        "LuaJIT was built without LUAJIT_ENABLE_CHECKHOOK: its JIT compiler \
                         is off for pages so that cgi_timeout can stop them (build with \
                         CFLAGS=-DLUAJIT_ENABLE_CHECKHOOK for compiled pages)"
                    )
                });
                lua.load("jit.off()").exec()?;
            }
            let mut anchored: *mut ffi::lua_State = std::ptr::null_mut();
            // SAFETY: pushes a new thread and moves it into the registry (balanced stack).
            unsafe {
                lua.exec_raw::<()>((), |state| {
                    anchored = ffi::lua_newthread(state);
                    ffi::luaL_ref(state, ffi::LUA_REGISTRYINDEX);
                })?;
            }
            let shared = Arc::new(Shared {
                slot: Mutex::new(Slot {
                    state: RawState(anchored),
                    deadline: None,
                    fired: false,
                    stop: false,
                }),
                wake: Condvar::new(),
            });
            let s = shared.clone();
            static SEQ: AtomicUsize = AtomicUsize::new(0);
            let name = format!("cgi-watchdog-{}", SEQ.fetch_add(1, Ordering::Relaxed));
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || watch(&s))
                .map_err(|e| mlua::Error::runtime(format!("cgi watchdog thread: {e}")))?;
            Ok(Timeout {
                shared,
                thread: Some(thread),
            })
        }

        /// Pages run from now on are stopped past `at`. LuaJIT pages are not paused
        /// (no hook may yield there): `_slice` is not used.
        pub(in crate::stage::cgi) fn arm(&self, at: Instant, _slice: Option<Instant>) {
            let mut slot = self.shared.lock();
            slot.deadline = Some(at);
            slot.fired = false;
            drop(slot);
            self.shared.wake.notify_one();
        }

        /// Resumes `th` (LuaJIT pages are never paused, so never resumed: kept so that
        /// `Cgi::go_on` compiles in both flavours).
        pub(in crate::stage::cgi) fn resume(
            &self,
            _lua: &Lua,
            th: &mlua::Thread,
            arg: Option<mlua::Table>,
            _due: std::time::Duration,
        ) -> mlua::Result<mlua::MultiValue> {
            th.resume(arg)
        }

        /// No deadline until the next [`Timeout::arm`]; removes the hook if it was set.
        /// How the run since it ended (a LuaJIT page is never sliced).
        pub(in crate::stage::cgi) fn disarm(&self) -> Ended {
            let mut slot = self.shared.lock();
            let expired = slot.deadline.take().is_some_and(|at| Instant::now() > at);
            if slot.fired {
                // SAFETY: the Lua is alive (we are called between its pages) and the
                // watchdog cannot set the hook again while we hold the lock.
                unsafe { ffi::lua_sethook(slot.state.0, None, 0, 0) };
                slot.fired = false;
            }
            Ended {
                sliced: false,
                expired,
            }
        }
    }

    impl Drop for Timeout {
        fn drop(&mut self) {
            self.shared.lock().stop = true;
            self.shared.wake.notify_one();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn watch(shared: &Shared) {
        let mut slot = shared.lock();
        loop {
            if slot.stop {
                return;
            }
            match slot.deadline {
                Some(at) if !slot.fired => {
                    let now = Instant::now();
                    if now >= at {
                        // SAFETY: a page is running in the Lua (armed), so it is alive;
                        // LuaJIT's lua_sethook may be called from another thread.
                        unsafe {
                            ffi::lua_sethook(slot.state.0, Some(stop), ffi::LUA_MASKCOUNT, 1)
                        };
                        slot.fired = true;
                    } else {
                        slot = shared
                            .wake
                            .wait_timeout(slot, at - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                _ => slot = shared.wake.wait(slot).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Whether JIT-compiled loops exit to the interpreter when a hook is set (LuaJIT
    /// built with `LUAJIT_ENABLE_CHECKHOOK`): a loop is compiled, then run with a
    /// count hook; without the check, its iterations never reach the hook.
    pub(super) fn compiled_loops_see_hooks(lua: &Lua) -> mlua::Result<bool> {
        let spin: mlua::Function = lua
            .load(
                "local function spin(n) local s = 0 for i = 1, n do s = s + i % 7 end return s end
                 spin(1000) spin(1000)
                 return spin",
            )
            .set_name("=cgi probe")
            .eval()?;
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(100),
            move |_, _| {
                h.fetch_add(1, Ordering::Relaxed);
                Ok(VmState::Continue)
            },
        )?;
        let run = spin.call::<f64>(100_000);
        lua.remove_hook();
        run?;
        // Interpreted, the loop runs ~500,000 instructions (~5,000 hook calls);
        // compiled without the check, a handful.
        Ok(hits.load(Ordering::Relaxed) > 1_000)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn run(lua: &Lua, t: &Timeout, src: &str) -> (mlua::Result<i64>, Duration) {
        let start = Instant::now();
        t.arm(start + Duration::from_millis(200), None);
        let r = lua.load(src).set_name("@page.lua").eval::<i64>();
        t.disarm();
        (r, start.elapsed())
    }

    #[test]
    fn runaway_loops_are_stopped_and_later_pages_run() {
        let lua = Lua::new();
        let t = Timeout::install(&lua).expect("installs");
        for src in [
            "while true do end",
            "local n = 0\nwhile true do n = n + 1 % 3 end",
            "local s = 0\nfor i = 1, 1e15 do s = s + i end\nreturn s",
        ] {
            let (r, took) = run(&lua, &t, src);
            let err = r.expect_err(src).to_string();
            assert!(err.contains("cgi_timeout"), "{src}: {err}");
            assert!(err.contains("page.lua:"), "{src}: {err}");
            assert!(took < Duration::from_secs(5), "{src}: {took:?}");
            // Disarmed: the next page runs to its end.
            let (r, _) = run(
                &lua,
                &t,
                "local s = 0 for i = 1, 100000 do s = s + 1 end return s",
            );
            assert_eq!(r.expect("runs"), 100_000);
        }
    }

    /// LuaJIT's hook stays set past the deadline, so `pcall` cannot swallow it. (The
    /// Lua 5.4 count hook raises only every 10,000 instructions, which an inner
    /// `pcall` loop can catch each time: not covered there.)
    #[cfg(feature = "luajit")]
    #[test]
    fn pcall_cannot_swallow_the_timeout() {
        let lua = Lua::new();
        let t = Timeout::install(&lua).expect("installs");
        let (r, took) = run(
            &lua,
            &t,
            "while true do pcall(function() while true do end end) end",
        );
        assert!(r.expect_err("stopped").to_string().contains("cgi_timeout"));
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    /// Built with `CFLAGS=-DLUAJIT_ENABLE_CHECKHOOK` (CI, bench.sh), pages are
    /// JIT-compiled; without it, the compiler is turned off so that timeouts still work.
    #[cfg(feature = "luajit")]
    #[test]
    fn jit_stays_on_exactly_when_compiled_loops_see_hooks() {
        let lua = Lua::new();
        let sees = watchdog::compiled_loops_see_hooks(&lua).expect("probe runs");
        let _t = Timeout::install(&lua).expect("installs");
        let on: bool = lua
            .load("return (jit.status())")
            .eval()
            .expect("jit.status");
        assert_eq!(on, sees);
        if option_env!("CFLAGS").is_some_and(|f| f.contains("LUAJIT_ENABLE_CHECKHOOK")) {
            assert!(
                sees,
                "CFLAGS names LUAJIT_ENABLE_CHECKHOOK, yet compiled loops ignore hooks"
            );
        }
    }
}
