//! Lua's pattern functions (`string.find`, `match`, `gmatch`, `gsub`) for pages, with a
//! deadline.
//!
//! Lua runs a pattern match in C, where no hook reaches it: a page calling
//! `("a"):rep(30000):find(("a*"):rep(20) .. "b")` would backtrack for longer than the
//! universe is old, past any `cgi_timeout`. So pages get these four functions from
//! here: the same matcher as Lua's `lstrlib.c` (same classes, captures, `%b`, `%f`,
//! back-references, the 32-capture and 200-level limits, the same error messages),
//! written again in Rust so that it looks at the page's [`Deadline`] every few
//! thousand steps and fails with the timeout error once it has passed. Plain `find`
//! searches in linear time (`memchr::memmem`), where Lua's is quadratic at worst.
//!
//! Semantics follow the Lua the crate is built with: Lua 5.4 by default; with the
//! `luajit` feature, LuaJIT's where they differ (`find`
//! clamping its start; `gsub` and `gmatch` after an empty match; `%x` in a
//! replacement string). A differential test compares them with the C functions on
//! thousands of random patterns.
//!
//! This module owns nothing else: it is installed into the page state's `string`
//! table by [`install`] (which the string metatable's `__index` also is, so method
//! calls `s:find(p)` use it too) and armed by the `cgi` stage around each page.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use mlua::{Lua, MultiValue, Table, Value};

/// Lua's `LUA_MAXCAPTURES`.
const MAX_CAPTURES: usize = 32;
/// Lua's `MAXCCALLS`: how deep the matcher may recurse ("pattern too complex").
const MAX_DEPTH: u32 = 200;
/// The characters that make a pattern more than a plain string.
const SPECIALS: &[u8] = b"^$*+?.([%-";
/// Matcher steps between two looks at the clock (each step is a few nanoseconds).
const CHECK_EVERY: u32 = 1 << 12;
/// The error of a match stopped by the deadline (as the timeout hooks say it).
const TIMEOUT: &str = "script ran past cgi_timeout";

/// The deadline of the running page, shared by the pattern functions of one state.
#[derive(Clone, Default)]
pub(super) struct Deadline(Arc<AtomicU64>);

/// The instant deadlines are counted from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Deadline {
    /// Matches from now on fail past `at`.
    pub(super) fn arm(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos();
        self.0.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
    }

    /// No deadline until the next [`Deadline::arm`].
    pub(super) fn disarm(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    fn passed(&self) -> bool {
        let at = self.0.load(Ordering::Relaxed);
        at != 0 && epoch().elapsed().as_nanos() > u128::from(at)
    }
}

/// Why a match did not finish.
#[derive(Debug)]
enum Stop {
    /// The page's deadline passed.
    Timeout,
    /// A malformed pattern or replacement, with Lua's message.
    Bad(String),
}

impl From<Stop> for mlua::Error {
    fn from(s: Stop) -> mlua::Error {
        mlua::Error::runtime(match s {
            Stop::Timeout => TIMEOUT.to_owned(),
            Stop::Bad(m) => m,
        })
    }
}

type Step<T> = Result<T, Stop>;

fn bad<T>(msg: impl Into<String>) -> Step<T> {
    Err(Stop::Bad(msg.into()))
}

/// A capture's length, or what it is instead.
#[derive(Clone, Copy, Debug)]
enum CapLen {
    Len(usize),
    Position,
    Unfinished,
}

/// One capture's value: a slice of the subject, or a position (1-based).
#[derive(Clone, Copy, Debug)]
enum Capture {
    Slice(usize, usize),
    Position(usize),
}

/// Lua's `MatchState`: indices instead of pointers.
struct Matcher<'a> {
    src: &'a [u8],
    pat: &'a [u8],
    depth: u32,
    level: usize,
    caps: [(usize, CapLen); MAX_CAPTURES],
    steps: u32,
    deadline: &'a Deadline,
}

impl<'a> Matcher<'a> {
    fn new(src: &'a [u8], pat: &'a [u8], deadline: &'a Deadline) -> Matcher<'a> {
        Matcher {
            src,
            pat,
            depth: MAX_DEPTH,
            level: 0,
            caps: [(0, CapLen::Unfinished); MAX_CAPTURES],
            steps: 0,
            deadline,
        }
    }

    /// Lua's `reprepstate`, before each attempt at a new start.
    fn reset(&mut self) {
        self.level = 0;
        self.depth = MAX_DEPTH;
    }

    fn tick(&mut self) -> Step<()> {
        self.steps = self.steps.wrapping_add(1);
        if self.steps.is_multiple_of(CHECK_EVERY) && self.deadline.passed() {
            return Err(Stop::Timeout);
        }
        Ok(())
    }

    /// The pattern byte at `i`, `0` past its end (C reads the terminating NUL).
    fn p(&self, i: usize) -> u8 {
        self.pat.get(i).copied().unwrap_or(0)
    }

    fn class_end(&self, mut p: usize) -> Step<usize> {
        let c = self.pat[p];
        p += 1;
        match c {
            b'%' => {
                if p >= self.pat.len() {
                    return bad("malformed pattern (ends with '%')");
                }
                Ok(p + 1)
            }
            b'[' => {
                if self.p(p) == b'^' {
                    p += 1;
                }
                loop {
                    if p >= self.pat.len() {
                        return bad("malformed pattern (missing ']')");
                    }
                    let c = self.pat[p];
                    p += 1;
                    if c == b'%' && p < self.pat.len() {
                        p += 1;
                    }
                    if self.p(p) == b']' {
                        return Ok(p + 1);
                    }
                }
            }
            _ => Ok(p),
        }
    }

    /// Whether `c` is in the bracket class `[...]` from `p` (at `[`) to `ec` (at `]`).
    fn bracket(&self, c: u8, mut p: usize, ec: usize) -> bool {
        let mut sig = true;
        if self.p(p + 1) == b'^' {
            sig = false;
            p += 1;
        }
        loop {
            p += 1;
            if p >= ec {
                return !sig;
            }
            if self.pat[p] == b'%' {
                p += 1;
                if class(c, self.p(p)) {
                    return sig;
                }
            } else if self.p(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if self.pat[p - 2] <= c && c <= self.pat[p] {
                    return sig;
                }
            } else if self.pat[p] == c {
                return sig;
            }
        }
    }

    /// Whether the subject byte at `s` matches the single-character class `p..ep`.
    fn single(&self, s: usize, p: usize, ep: usize) -> bool {
        let Some(&c) = self.src.get(s) else {
            return false;
        };
        match self.pat[p] {
            b'.' => true,
            b'%' => class(c, self.p(p + 1)),
            b'[' => self.bracket(c, p, ep - 1),
            pc => pc == c,
        }
    }

    /// Lua's `match`: where a match of `pat[p..]` starting at `src[s]` ends.
    fn do_match(&mut self, s: usize, p: usize) -> Step<Option<usize>> {
        if self.depth == 0 {
            return bad("pattern too complex");
        }
        self.depth -= 1;
        let r = self.match_here(s, p);
        self.depth += 1;
        r
    }

    fn match_here(&mut self, mut s: usize, mut p: usize) -> Step<Option<usize>> {
        loop {
            self.tick()?;
            if p == self.pat.len() {
                return Ok(Some(s));
            }
            match (self.pat[p], self.p(p + 1)) {
                (b'(', b')') => return self.start_capture(s, p + 2, CapLen::Position),
                (b'(', _) => return self.start_capture(s, p + 1, CapLen::Unfinished),
                (b')', _) => return self.end_capture(s, p + 1),
                (b'$', _) if p + 1 == self.pat.len() => {
                    return Ok((s == self.src.len()).then_some(s));
                }
                (b'%', b'b') => match self.balance(s, p + 2)? {
                    Some(e) => {
                        s = e;
                        p += 4;
                        continue;
                    }
                    None => return Ok(None),
                },
                (b'%', b'f') => {
                    p += 2;
                    if self.p(p) != b'[' {
                        return bad("missing '[' after '%f' in pattern");
                    }
                    let ep = self.class_end(p)?;
                    let prev = if s == 0 { 0 } else { self.src[s - 1] };
                    let cur = self.src.get(s).copied().unwrap_or(0);
                    if !self.bracket(prev, p, ep - 1) && self.bracket(cur, p, ep - 1) {
                        p = ep;
                        continue;
                    }
                    return Ok(None);
                }
                (b'%', d) if d.is_ascii_digit() => match self.back_reference(s, d)? {
                    Some(e) => {
                        s = e;
                        p += 2;
                        continue;
                    }
                    None => return Ok(None),
                },
                _ => {}
            }
            let ep = self.class_end(p)?;
            let next = self.p(ep);
            if !self.single(s, p, ep) {
                if matches!(next, b'*' | b'?' | b'-') {
                    p = ep + 1;
                    continue;
                }
                return Ok(None);
            }
            match next {
                b'?' => {
                    if let Some(e) = self.do_match(s + 1, ep + 1)? {
                        return Ok(Some(e));
                    }
                    p = ep + 1;
                }
                b'+' => return self.max_expand(s + 1, p, ep),
                b'*' => return self.max_expand(s, p, ep),
                b'-' => return self.min_expand(s, p, ep),
                _ => {
                    s += 1;
                    p = ep;
                }
            }
        }
    }

    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> Step<Option<usize>> {
        let mut i = 0;
        while self.single(s + i, p, ep) {
            self.tick()?;
            i += 1;
        }
        loop {
            if let Some(e) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(e));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    fn min_expand(&mut self, mut s: usize, p: usize, ep: usize) -> Step<Option<usize>> {
        loop {
            if let Some(e) = self.do_match(s, ep + 1)? {
                return Ok(Some(e));
            }
            if !self.single(s, p, ep) {
                return Ok(None);
            }
            s += 1;
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, what: CapLen) -> Step<Option<usize>> {
        if self.level >= MAX_CAPTURES {
            return bad("too many captures");
        }
        self.caps[self.level] = (s, what);
        self.level += 1;
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.level -= 1;
        }
        Ok(r)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Step<Option<usize>> {
        let Some(l) = (0..self.level)
            .rev()
            .find(|&l| matches!(self.caps[l].1, CapLen::Unfinished))
        else {
            return bad("invalid pattern capture");
        };
        self.caps[l].1 = CapLen::Len(s - self.caps[l].0);
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.caps[l].1 = CapLen::Unfinished;
        }
        Ok(r)
    }

    fn balance(&mut self, s: usize, p: usize) -> Step<Option<usize>> {
        if p + 1 >= self.pat.len() {
            return bad(flavour(
                "malformed pattern (missing arguments to '%b')",
                "unbalanced pattern",
            ));
        }
        let (open, close) = (self.pat[p], self.pat[p + 1]);
        if self.src.get(s) != Some(&open) {
            return Ok(None);
        }
        let mut depth = 1;
        for i in s + 1..self.src.len() {
            self.tick()?;
            let c = self.src[i];
            if c == close {
                depth -= 1;
                if depth == 0 {
                    return Ok(Some(i + 1));
                }
            } else if c == open {
                depth += 1;
            }
        }
        Ok(None)
    }

    fn back_reference(&mut self, s: usize, d: u8) -> Step<Option<usize>> {
        let l = usize::from(d).wrapping_sub(usize::from(b'1'));
        let len = match self.caps.get(l) {
            Some(&(_, CapLen::Len(n))) if l < self.level => n,
            Some(&(_, CapLen::Position)) if l < self.level => return Ok(None),
            _ => return bad(capture_index(l.wrapping_add(1))),
        };
        let init = self.caps[l].0;
        let end = s + len;
        Ok(
            (end <= self.src.len() && self.src[init..init + len] == self.src[s..end])
                .then_some(end),
        )
    }

    /// Capture `i` of the match `s..e` (the whole match when there are no captures).
    fn capture(&self, i: usize, s: usize, e: usize) -> Step<Capture> {
        if i >= self.level {
            if i == 0 {
                return Ok(Capture::Slice(s, e));
            }
            return bad(capture_index(i + 1));
        }
        let (init, len) = self.caps[i];
        match len {
            CapLen::Unfinished => bad("unfinished capture"),
            CapLen::Position => Ok(Capture::Position(init + 1)),
            CapLen::Len(n) => Ok(Capture::Slice(init, init + n)),
        }
    }

    /// The captures of the match `s..e`; the whole match if it has none and `whole`.
    fn captures(&self, s: usize, e: usize, whole: bool) -> Step<Vec<Capture>> {
        let n = if self.level == 0 && whole {
            1
        } else {
            self.level
        };
        (0..n).map(|i| self.capture(i, s, e)).collect()
    }
}

/// The message of Lua 5.4 or of LuaJIT, for the Lua the crate is built with.
fn flavour(lua54: &'static str, luajit: &'static str) -> &'static str {
    if cfg!(feature = "luajit") {
        luajit
    } else {
        lua54
    }
}

/// The error for a capture index `%n` that does not exist.
fn capture_index(n: usize) -> String {
    if cfg!(feature = "luajit") {
        "invalid capture index".to_owned()
    } else {
        format!("invalid capture index %{n}")
    }
}

/// Lua's `match_class` in the C locale.
fn class(c: u8, cl: u8) -> bool {
    let yes = match cl.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        b's' => c == b' ' || (b'\t'..=b'\r').contains(&c),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0,
        _ => return cl == c,
    };
    if cl.is_ascii_uppercase() { !yes } else { yes }
}

/// Lua's `posrelatI`: a 1-based start, negative counting from the end.
fn start_index(pos: i64, len: usize) -> usize {
    let len = len as i64;
    let pos = if pos > 0 {
        pos
    } else if pos == 0 || pos < -len {
        1
    } else {
        len + pos + 1
    };
    usize::try_from(pos).unwrap_or(usize::MAX)
}

/// The values of `caps` in `lua`.
fn to_values(lua: &Lua, src: &[u8], caps: &[Capture]) -> mlua::Result<Vec<Value>> {
    caps.iter()
        .map(|c| match *c {
            Capture::Slice(a, b) => lua.create_string(&src[a..b]).map(Value::String),
            Capture::Position(p) => Ok(Value::Integer(p as mlua::Integer)),
        })
        .collect()
}

/// `string.find` (`find`) and `string.match`.
fn find(
    lua: &Lua,
    deadline: &Deadline,
    (s, p, init, plain): (mlua::String, mlua::String, Option<i64>, Option<Value>),
    find: bool,
) -> mlua::Result<MultiValue> {
    let (src, pat) = (s.as_bytes(), p.as_bytes());
    let mut start = start_index(init.unwrap_or(1), src.len()) - 1;
    if start > src.len() {
        if cfg!(feature = "luajit") {
            start = src.len();
        } else {
            return Ok(MultiValue::from_iter([Value::Nil]));
        }
    }
    let plain = plain.is_some_and(|v| !matches!(v, Value::Nil | Value::Boolean(false)));
    if find && (plain || !pat.iter().any(|c| SPECIALS.contains(c))) {
        return Ok(
            match memchr::memmem::find(&src[start..], &pat).map(|at| at + start) {
                Some(at) => MultiValue::from_iter([
                    Value::Integer((at + 1) as mlua::Integer),
                    Value::Integer((at + pat.len()) as mlua::Integer),
                ]),
                None => MultiValue::from_iter([Value::Nil]),
            },
        );
    }
    let anchor = pat.first() == Some(&b'^');
    let body = &pat[usize::from(anchor)..];
    let mut m = Matcher::new(&src, body, deadline);
    let mut at = start;
    loop {
        m.reset();
        if let Some(e) = m.do_match(at, 0)? {
            let mut out = Vec::new();
            if find {
                out.push(Value::Integer((at + 1) as mlua::Integer));
                out.push(Value::Integer(e as mlua::Integer));
            }
            out.extend(to_values(lua, &src, &m.captures(at, e, !find)?)?);
            return Ok(MultiValue::from_iter(out));
        }
        if anchor || at >= src.len() {
            return Ok(MultiValue::from_iter([Value::Nil]));
        }
        at += 1;
    }
}

/// `string.gmatch`: an iterator over the matches.
fn gmatch(
    lua: &Lua,
    deadline: &Deadline,
    (s, p, init): (mlua::String, mlua::String, Option<i64>),
) -> mlua::Result<mlua::Function> {
    let len = s.as_bytes().len();
    let start = if cfg!(feature = "luajit") {
        0
    } else {
        (start_index(init.unwrap_or(1), len) - 1).min(len + 1)
    };
    // (where the next search starts, where the last match ended)
    let state = Cell::new((start, None::<usize>));
    let deadline = deadline.clone();
    lua.create_function(move |lua, ()| {
        let (src, pat) = (s.as_bytes(), p.as_bytes());
        let mut m = Matcher::new(&src, &pat, &deadline);
        let (from, last) = state.get();
        for at in from..=src.len() {
            m.reset();
            let Some(e) = m.do_match(at, 0)? else {
                continue;
            };
            if cfg!(feature = "luajit") {
                state.set((if e == at { e + 1 } else { e }, None));
            } else if Some(e) == last {
                continue;
            } else {
                state.set((e, Some(e)));
            }
            return Ok(MultiValue::from_iter(to_values(
                lua,
                &src,
                &m.captures(at, e, true)?,
            )?));
        }
        state.set((src.len() + 1, last));
        Ok(MultiValue::new())
    })
}

/// What `gsub` results being built may take, shared by the calls in progress on one
/// state (a replacement function may call `gsub` again): with the state's own memory,
/// at most its limit (review finding: each nested call had the whole allowance again,
/// and one replacement string of `%0`s grew a result to 390 MB under a 32 MB limit).
struct Budget<'a> {
    memory: usize,
    building: &'a AtomicUsize,
    /// What this call has counted in `building`.
    mine: usize,
}

impl<'a> Budget<'a> {
    fn new(memory: usize, building: &'a AtomicUsize) -> Budget<'a> {
        Budget {
            memory,
            building,
            mine: 0,
        }
    }

    /// This call's result is to grow to `len` bytes: "not enough memory" if that, the
    /// other calls' results and the state's memory would pass the limit.
    fn grow(&mut self, lua: &Lua, len: usize) -> mlua::Result<()> {
        if self.memory == 0 || len <= self.mine {
            return Ok(());
        }
        let others = self
            .building
            .load(Ordering::Relaxed)
            .saturating_sub(self.mine);
        if len.saturating_add(others).saturating_add(lua.used_memory()) > self.memory {
            return Err(mlua::Error::MemoryError("not enough memory".into()));
        }
        self.building.fetch_add(len - self.mine, Ordering::Relaxed);
        self.mine = len;
        Ok(())
    }
}

impl Drop for Budget<'_> {
    fn drop(&mut self) {
        self.building.fetch_sub(self.mine, Ordering::Relaxed);
    }
}

/// `string.gsub`.
fn gsub(
    lua: &Lua,
    deadline: &Deadline,
    budget: &mut Budget,
    (s, p, repl, max): (mlua::String, mlua::String, Value, Option<i64>),
) -> mlua::Result<(mlua::String, mlua::Integer)> {
    if !matches!(
        repl,
        Value::String(_)
            | Value::Integer(_)
            | Value::Number(_)
            | Value::Table(_)
            | Value::Function(_)
    ) {
        return Err(mlua::Error::runtime(format!(
            "bad argument #3 to 'gsub' (string/function/table expected, got {})",
            repl.type_name()
        )));
    }
    let repl = match repl {
        v @ (Value::Integer(_) | Value::Number(_)) => Value::String(
            lua.coerce_string(v)?
                .ok_or_else(|| mlua::Error::runtime("gsub: replacement"))?,
        ),
        v => v,
    };
    let (src, pat) = (s.as_bytes(), p.as_bytes());
    let max = max.unwrap_or(src.len() as i64 + 1);
    let anchor = pat.first() == Some(&b'^');
    let body = &pat[usize::from(anchor)..];
    let mut m = Matcher::new(&src, body, deadline);
    let mut out = Vec::with_capacity(src.len());
    let (mut at, mut last, mut n) = (0, None, 0);
    while n < max {
        m.reset();
        let e = m.do_match(at, 0)?;
        let replaced = match e {
            Some(e) if cfg!(feature = "luajit") || Some(e) != last => {
                n += 1;
                replace(lua, &m, at, e, &repl, &mut out, budget)?;
                Some(e)
            }
            _ => None,
        };
        match replaced {
            Some(e) if !cfg!(feature = "luajit") || e > at => {
                at = e;
                last = Some(e);
            }
            _ if at < src.len() => {
                out.push(src[at]);
                at += 1;
            }
            _ => break,
        }
        if anchor {
            break;
        }
    }
    out.extend_from_slice(&src[at..]);
    Ok((lua.create_string(&out)?, n as mlua::Integer))
}

/// Appends the replacement for the match `s..e` to `out` (Lua's `add_value`).
fn replace(
    lua: &Lua,
    m: &Matcher<'_>,
    s: usize,
    e: usize,
    repl: &Value,
    out: &mut Vec<u8>,
    budget: &mut Budget,
) -> mlua::Result<()> {
    // Every piece is counted before it is added: one replacement may copy the whole
    // match thousands of times (`%0%0%0...`).
    let mut add = |out: &mut Vec<u8>, piece: &[u8]| -> mlua::Result<()> {
        budget.grow(lua, out.len() + piece.len())?;
        out.extend_from_slice(piece);
        Ok(())
    };
    let value = match repl {
        Value::String(r) => {
            let r = r.as_bytes();
            let mut i = 0;
            while i < r.len() {
                let c = r[i];
                i += 1;
                if c != b'%' {
                    add(out, &[c])?;
                    continue;
                }
                match r.get(i).copied() {
                    Some(b'%') => add(out, b"%")?,
                    Some(b'0') => add(out, &m.src[s..e])?,
                    Some(d) if d.is_ascii_digit() => {
                        match m.capture(usize::from(d - b'1'), s, e)? {
                            Capture::Slice(a, b) => add(out, &m.src[a..b])?,
                            Capture::Position(p) => add(out, p.to_string().as_bytes())?,
                        }
                    }
                    Some(other) if cfg!(feature = "luajit") => add(out, &[other])?,
                    _ => {
                        return Err(mlua::Error::runtime(
                            "invalid use of '%' in replacement string",
                        ));
                    }
                }
                i += 1;
            }
            return Ok(());
        }
        Value::Table(t) => {
            let key = to_values(lua, m.src, &[m.capture(0, s, e)?])?;
            t.get::<Value>(key.into_iter().next().unwrap_or(Value::Nil))?
        }
        Value::Function(f) => {
            let args = to_values(lua, m.src, &m.captures(s, e, true)?)?;
            f.call::<Value>(MultiValue::from_iter(args))?
        }
        _ => unreachable!("checked by gsub"),
    };
    match value {
        Value::Nil | Value::Boolean(false) => add(out, &m.src[s..e])?,
        v @ (Value::String(_) | Value::Integer(_) | Value::Number(_)) => {
            if let Some(text) = lua.coerce_string(v)? {
                add(out, &text.as_bytes())?;
            }
        }
        v => {
            return Err(mlua::Error::runtime(format!(
                "invalid replacement value (a {})",
                v.type_name()
            )));
        }
    }
    Ok(())
}

/// Replaces `find`, `match`, `gmatch` and `gsub` in `string` with the versions above,
/// stopped past `deadline`.
///
/// `memory` is the state's memory limit (0: none): `gsub` builds its result outside
/// the state, and fails as Lua would ("not enough memory") once that result could
/// not fit in what the state has left ([`Budget`]), so that a page cannot use the
/// process' memory through it (ten thousand 10 KB replacements of a 100 KB string
/// were a gigabyte).
pub(super) fn install(
    lua: &Lua,
    string: &Table,
    deadline: &Deadline,
    memory: usize,
) -> mlua::Result<()> {
    let d = deadline.clone();
    string.set(
        "find",
        lua.create_function(move |lua, args| find(lua, &d, args, true))?,
    )?;
    let d = deadline.clone();
    string.set(
        "match",
        lua.create_function(move |lua, (s, p, init)| find(lua, &d, (s, p, init, None), false))?,
    )?;
    let d = deadline.clone();
    string.set(
        "gmatch",
        lua.create_function(move |lua, args| gmatch(lua, &d, args))?,
    )?;
    let d = deadline.clone();
    let building = Arc::new(AtomicUsize::new(0));
    string.set(
        "gsub",
        lua.create_function(move |lua, args| {
            let mut budget = Budget::new(memory, &building);
            gsub(lua, &d, &mut budget, args)
        })?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
