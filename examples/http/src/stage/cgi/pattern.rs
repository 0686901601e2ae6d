//! Lua's pattern functions (`string.find`, `match`, `gmatch`, `gsub`) for pages, with a
//! deadline.
//!
//! Lua runs a pattern match in C, where no hook reaches it: a page calling
//! `("a"):rep(30000):find(("a*"):rep(20) .. "b")` would backtrack for longer than the
//! universe is old, past any `cgi_timeout`. So pages get these four functions from
//! here, on the stage library's port of Lua's `lstrlib.c` matcher
//! ([`leda_stages::string::pattern`]: same classes, captures, `%b`, `%f`,
//! back-references, the 32-capture and 200-level limits, the same error messages),
//! whose tick looks at the page's [`Deadline`] every few thousand steps and fails with
//! the timeout error once it has passed. Plain `find` searches in linear time
//! (`memchr::memmem`), where Lua's is quadratic at worst.
//!
//! Semantics follow the Lua the crate is built with: Lua 5.4 by default; with the
//! `luajit` feature, LuaJIT's where they differ (`find`
//! clamping its start; `gsub` and `gmatch` after an empty match; `%x` in a
//! replacement string; two error messages). A differential test compares them with
//! the C functions on thousands of random patterns.
//!
//! This module owns nothing else: it is installed into the page state's `string`
//! table by [`install`] (which the string metatable's `__index` also is, so method
//! calls `s:find(p)` use it too) and armed by the `cgi` stage around each page.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use leda_stages::string::pattern::{self, Capture, Matcher, PatternError, Scan};
use mlua::{Lua, MultiValue, Table, Value};

/// The characters that make a pattern more than a plain string.
const SPECIALS: &[u8] = b"^$*+?.([%-";
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

    /// A matcher's tick: the timeout error once the deadline has passed.
    fn tick(&self) -> impl FnMut() -> Result<(), PatternError> + '_ {
        || {
            if self.passed() {
                return Err(PatternError::Stopped(TIMEOUT));
            }
            Ok(())
        }
    }
}

/// A matcher's error as the Lua the crate is built with words it.
fn lua_error(e: PatternError) -> mlua::Error {
    mlua::Error::runtime(match e {
        PatternError::Malformed(m) if cfg!(feature = "luajit") && m.contains("'%b'") => {
            "unbalanced pattern".to_owned()
        }
        PatternError::InvalidCaptureIndex(_) if cfg!(feature = "luajit") => {
            "invalid capture index".to_owned()
        }
        e => e.to_string(),
    })
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
        .map(|c| match c {
            Capture::Text(r) => lua.create_string(&src[r.clone()]).map(Value::String),
            Capture::Position(p) => Ok(Value::Integer(*p as mlua::Integer + 1)),
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
    let (body, anchor) = pattern::anchor(&pat);
    let mut m = Matcher::new(body, &src, deadline.tick());
    let Some(whole) = m.find(start, anchor).map_err(lua_error)? else {
        return Ok(MultiValue::from_iter([Value::Nil]));
    };
    let mut out = Vec::new();
    if find {
        out.push(Value::Integer((whole.start + 1) as mlua::Integer));
        out.push(Value::Integer(whole.end as mlua::Integer));
    }
    let caps = m.captures(whole, !find).map_err(lua_error)?;
    out.extend(to_values(lua, &src, &caps)?);
    Ok(MultiValue::from_iter(out))
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
    let state = Cell::new(Scan::new(start, false, cfg!(feature = "luajit")));
    let deadline = deadline.clone();
    lua.create_function(move |lua, ()| {
        let (src, pat) = (s.as_bytes(), p.as_bytes());
        let mut m = Matcher::new(&pat, &src, deadline.tick());
        let mut scan = state.get();
        let found = m.next_match(&mut scan).map_err(lua_error)?;
        state.set(scan);
        let Some(whole) = found else {
            return Ok(MultiValue::new());
        };
        let caps = m.captures(whole, true).map_err(lua_error)?;
        Ok(MultiValue::from_iter(to_values(lua, &src, &caps)?))
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
    let (body, anchor) = pattern::anchor(&pat);
    let mut m = Matcher::new(body, &src, deadline.tick());
    let mut scan = Scan::new(0, anchor, cfg!(feature = "luajit"));
    let (mut out, mut copied, mut n) = (Vec::with_capacity(src.len()), 0, 0);
    while n < max {
        let Some(whole) = m.next_match(&mut scan).map_err(lua_error)? else {
            break;
        };
        n += 1;
        out.extend_from_slice(&src[copied..whole.start]);
        copied = whole.end;
        replace(lua, &m, whole, &repl, &mut out, budget)?;
    }
    out.extend_from_slice(&src[copied..]);
    Ok((lua.create_string(&out)?, n as mlua::Integer))
}

/// Appends the replacement for the match `whole` to `out` (Lua's `add_value`).
fn replace<T>(
    lua: &Lua,
    m: &Matcher<'_, T>,
    whole: Range<usize>,
    repl: &Value,
    out: &mut Vec<u8>,
    budget: &mut Budget,
) -> mlua::Result<()> {
    let src = m.text();
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
                    Some(b'0') => add(out, &src[whole.clone()])?,
                    Some(d) if d.is_ascii_digit() => {
                        let i = usize::from(d - b'1');
                        match m.capture(i, whole.clone()).map_err(lua_error)? {
                            Capture::Text(r) => add(out, &src[r])?,
                            Capture::Position(p) => add(out, (p + 1).to_string().as_bytes())?,
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
            let key = m.capture(0, whole.clone()).map_err(lua_error)?;
            let key = to_values(lua, src, &[key])?;
            t.get::<Value>(key.into_iter().next().unwrap_or(Value::Nil))?
        }
        Value::Function(f) => {
            let caps = m.captures(whole.clone(), true).map_err(lua_error)?;
            f.call::<Value>(MultiValue::from_iter(to_values(lua, src, &caps)?))?
        }
        _ => unreachable!("checked by gsub"),
    };
    match value {
        Value::Nil | Value::Boolean(false) => add(out, &src[whole])?,
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
