//! A Lua 5.4 pattern matcher (a port of `lstrlib.c`'s `match`) over byte slices: the
//! one behind the stage library's `string` functions and the HTTP server's Lua pages.
//!
//! Positions are indices, never pointers: the end of the pattern or of the text reads
//! as a NUL byte, as Lua's NUL-terminated strings do, without reading past either.
//! Recursion is bounded as in Lua: at most [`MAXCCALLS`] *nested* calls of the matcher
//! (tail calls loop instead of recursing, and each call gives its level back when it
//! returns), so "pattern too complex" means what it means in Lua, and a search from
//! many start positions starts each one afresh.
//!
//! Lua matches in C, where nothing stops a pattern that backtracks for ever; a
//! [`Matcher`] calls its *tick* (any `FnMut() -> Result<(), PatternError>`) every
//! [`TICK_EVERY`] steps (a step: one pattern item tried, or one byte scanned by a
//! repetition or `%b`) and stops with the tick's error: [`steps`] bounds the steps of a
//! search, a caller with a deadline looks at its clock.
//!
//! Use: [`anchor`] splits a leading `^`; [`Matcher::new`] takes the rest and the text;
//! [`Matcher::find`] is `string.find`'s and `string.match`'s search,
//! [`Matcher::next_match`] with a [`Scan`] the one of `gmatch` and `gsub`; then
//! [`Matcher::captures`] and [`Matcher::capture`] give the last match's captures.
//!
//! ```
//! use leda_stages::string::pattern::{self, Capture, Matcher};
//!
//! let (p, anchored) = pattern::anchor(b"(%d+)-(%d+)");
//! let mut m = Matcher::new(p, b"on 10-20", pattern::steps(pattern::MAX_STEPS));
//! let whole = m.find(0, anchored)?.expect("a match");
//! assert_eq!(whole, 3..8);
//! let caps = m.captures(whole, true)?;
//! assert_eq!(caps, [Capture::Text(3..5), Capture::Text(6..8)]);
//! # Ok::<(), pattern::PatternError>(())
//! ```

use std::ops::Range;

/// The deepest nesting of matcher calls (Lua's `MAXCCALLS`).
pub const MAXCCALLS: usize = 200;

/// The most steps the stage library lets one search or `gsub` take ([`steps`]): a
/// pattern that backtracks over hostile text (`a-a-a-a-b` on thousands of `a`) takes
/// time exponential in the pattern, and a handler must not spend minutes on one event.
/// About 0.2 s on this machine (release build); Lua itself has no such bound. A long
/// text gets more ([`step_budget`]).
pub const MAX_STEPS: u64 = 50_000_000;

/// The steps one search or `gsub` over `text_len` bytes may take: [`MAX_STEPS`], plus
/// 64 per byte, so that linear work over a long text (a `gsub` over megabytes: a few
/// steps per byte) is never cut off, only backtracking.
pub fn step_budget(text_len: usize) -> u64 {
    MAX_STEPS.saturating_add((text_len as u64).saturating_mul(64))
}

/// Steps between two calls of a [`Matcher`]'s tick (each step takes a few nanoseconds).
pub const TICK_EVERY: u32 = 1 << 12;

/// The most captures a pattern may have (Lua's `LUA_MAXCAPTURES`).
pub const MAXCAPTURES: usize = 32;

const L_ESC: u8 = b'%';

/// Why a pattern cannot be compiled or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// The pattern is malformed (Lua's message).
    #[error("malformed pattern ({0})")]
    Malformed(&'static str),
    /// More than [`MAXCAPTURES`] captures.
    #[error("too many captures")]
    TooManyCaptures,
    /// A `)` that closes no capture.
    #[error("invalid pattern capture")]
    InvalidCapture,
    /// A capture opened and never closed.
    #[error("unfinished capture")]
    UnfinishedCapture,
    /// `%f` not followed by `[`.
    #[error("missing '[' after '%f' in pattern")]
    MissingFrontierSet,
    /// A back-reference to a capture that is not closed.
    #[error("invalid capture index %{0}")]
    InvalidCaptureIndex(usize),
    /// More than [`MAXCCALLS`] nested matcher calls.
    #[error("pattern too complex")]
    TooComplex,
    /// More than [`MAX_STEPS`] steps in one search (backtracking): [`steps`]' error.
    #[error("pattern too complex: too many steps on this text (backtracking)")]
    TooManySteps,
    /// Stopped by a caller's tick, with its reason.
    #[error("{0}")]
    Stopped(&'static str),
}

/// Checks the whole pattern (Lua checks only what a match reaches; this refuses a
/// malformed pattern before any text is seen).
pub fn check(pattern: &[u8]) -> Result<(), PatternError> {
    let p = anchor(pattern).0;
    let ms = Matcher::new(p, b"", || Ok(()));
    let mut open: Vec<bool> = Vec::new(); // per capture: still open?
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'(' => {
                if open.len() >= MAXCAPTURES {
                    return Err(PatternError::TooManyCaptures);
                }
                if ms.pat(i + 1) == b')' {
                    open.push(false); // a position capture
                    i += 2;
                } else {
                    open.push(true);
                    i += 1;
                }
            }
            b')' => {
                let last = open
                    .iter()
                    .rposition(|&o| o)
                    .ok_or(PatternError::InvalidCapture)?;
                open[last] = false;
                i += 1;
            }
            L_ESC if ms.pat(i + 1) == b'b' => {
                if i + 3 >= p.len() {
                    return Err(PatternError::Malformed("missing arguments to '%b'"));
                }
                i += 4;
            }
            L_ESC if ms.pat(i + 1) == b'f' => {
                if ms.pat(i + 2) != b'[' {
                    return Err(PatternError::MissingFrontierSet);
                }
                i = ms.class_end(i + 2)?;
            }
            L_ESC if ms.pat(i + 1).is_ascii_digit() => {
                let l = usize::from(ms.pat(i + 1) - b'0');
                if l == 0 || l > open.len() || open[l - 1] {
                    return Err(PatternError::InvalidCaptureIndex(l));
                }
                i += 2;
            }
            _ => {
                let ep = ms.class_end(i)?;
                i = if matches!(ms.pat(ep), b'*' | b'+' | b'-' | b'?') {
                    ep + 1
                } else {
                    ep
                };
            }
        }
    }
    if open.iter().any(|&o| o) {
        return Err(PatternError::UnfinishedCapture);
    }
    Ok(())
}

/// The pattern without its leading `^`, and whether it had one (an anchored search
/// tries its first position only). `gmatch` does not call it: there `^` is a byte.
pub fn anchor(pattern: &[u8]) -> (&[u8], bool) {
    match pattern.strip_prefix(b"^") {
        Some(p) => (p, true),
        None => (pattern, false),
    }
}

/// A tick that lets a matcher take about `max` steps (to [`TICK_EVERY`]), then fails
/// with [`PatternError::TooManySteps`].
pub fn steps(max: u64) -> impl FnMut() -> Result<(), PatternError> {
    let mut ticks = max / u64::from(TICK_EVERY);
    move || {
        ticks = ticks.checked_sub(1).ok_or(PatternError::TooManySteps)?;
        Ok(())
    }
}

/// A capture of a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    /// The bytes `start..end` of the text.
    Text(Range<usize>),
    /// A position capture `()`: where it stood (0-based; Lua returns it plus one).
    Position(usize),
}

/// Where a `gmatch` or `gsub` goes on searching ([`Matcher::next_match`]).
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    at: usize,
    last: Option<usize>,
    anchor: bool,
    lua51: bool,
}

impl Scan {
    /// A scan from byte `at`; an `anchor`ed one makes a single attempt. After an empty
    /// match, Lua 5.4 goes on where it ended but refuses a match ending where the last
    /// one did; Lua 5.1 and LuaJIT (`lua51`) go on one byte later.
    pub fn new(at: usize, anchor: bool, lua51: bool) -> Scan {
        Scan {
            at,
            last: None,
            anchor,
            lua51,
        }
    }
}

/// A capture's length, or what it is instead.
#[derive(Debug, Clone, Copy)]
enum CapLen {
    Len(usize),
    Unfinished,
    Position,
}

/// Lua's `MatchState` over one pattern (without its anchor) and one text, with its
/// tick: reused for every search of one `find`, `gmatch` step or `gsub`, so that the
/// steps of all of them count.
pub struct Matcher<'a, T> {
    pat: &'a [u8],
    src: &'a [u8],
    depth: usize,
    level: usize,
    capture: [(usize, CapLen); MAXCAPTURES],
    steps: u32,
    tick: T,
}

impl<'a, T> Matcher<'a, T> {
    /// The text.
    pub fn text(&self) -> &'a [u8] {
        self.src
    }

    /// Capture `i` of the last match, `whole` (Lua's `get_onecapture`: capture 0 of a
    /// pattern without captures is the whole match).
    pub fn capture(&self, i: usize, whole: Range<usize>) -> Result<Capture, PatternError> {
        if i >= self.level {
            if i == 0 {
                return Ok(Capture::Text(whole));
            }
            return Err(PatternError::InvalidCaptureIndex(i + 1));
        }
        let (init, len) = self.capture[i];
        match len {
            CapLen::Len(l) => Ok(Capture::Text(init..init + l)),
            CapLen::Position => Ok(Capture::Position(init)),
            CapLen::Unfinished => Err(PatternError::UnfinishedCapture),
        }
    }

    /// The captures of the last match, `whole`; if the pattern has none, the whole
    /// match when `or_whole` (`match`, `gmatch`), nothing otherwise (`find`).
    pub fn captures(
        &self,
        whole: Range<usize>,
        or_whole: bool,
    ) -> Result<Vec<Capture>, PatternError> {
        let n = if self.level == 0 && or_whole {
            1
        } else {
            self.level
        };
        (0..n).map(|i| self.capture(i, whole.clone())).collect()
    }
}

impl<'a, T: FnMut() -> Result<(), PatternError>> Matcher<'a, T> {
    /// A matcher of `pattern` (its `^` is a plain byte here: see [`anchor`]) on `text`,
    /// calling `tick` every [`TICK_EVERY`] steps.
    pub fn new(pattern: &'a [u8], text: &'a [u8], tick: T) -> Self {
        Matcher {
            pat: pattern,
            src: text,
            depth: MAXCCALLS,
            level: 0,
            capture: [(0, CapLen::Len(0)); MAXCAPTURES],
            steps: TICK_EVERY,
            tick,
        }
    }

    /// Where a match starting at byte `at` ends, if there is one (a fresh attempt:
    /// Lua's `reprepstate`, then `match`).
    pub fn match_at(&mut self, at: usize) -> Result<Option<usize>, PatternError> {
        self.level = 0;
        self.depth = MAXCCALLS;
        self.do_match(at, 0)
    }

    /// Lua's `string.find` search: the first match from byte `init` on, trying every
    /// start position up to and including the end of the text (only `init` when
    /// `anchor`).
    pub fn find(
        &mut self,
        init: usize,
        anchor: bool,
    ) -> Result<Option<Range<usize>>, PatternError> {
        let mut at = init;
        while at <= self.src.len() {
            if let Some(end) = self.match_at(at)? {
                return Ok(Some(at..end));
            }
            if anchor {
                break;
            }
            at += 1;
        }
        Ok(None)
    }

    /// The next match of `gmatch` or `gsub` (Lua's loops, in the flavour of `scan`).
    pub fn next_match(&mut self, scan: &mut Scan) -> Result<Option<Range<usize>>, PatternError> {
        while scan.at <= self.src.len() {
            let at = scan.at;
            let found = self
                .match_at(at)?
                .filter(|&e| scan.lua51 || Some(e) != scan.last);
            scan.at = match found {
                Some(e) if e > at || !scan.lua51 => e,
                _ => at + 1,
            };
            if scan.anchor {
                scan.at = self.src.len() + 1;
            }
            if let Some(e) = found {
                scan.last = Some(e);
                return Ok(Some(at..e));
            }
        }
        Ok(None)
    }

    /// One step: the tick every [`TICK_EVERY`].
    #[inline(always)]
    fn step(&mut self) -> Result<(), PatternError> {
        self.steps -= 1;
        if self.steps == 0 {
            return self.tick();
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn tick(&mut self) -> Result<(), PatternError> {
        self.steps = TICK_EVERY;
        (self.tick)()
    }

    /// The pattern byte at `i`, NUL at or past its end.
    fn pat(&self, i: usize) -> u8 {
        self.pat.get(i).copied().unwrap_or(0)
    }

    /// The text byte at `i`, NUL at or past its end.
    fn src(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    fn class_end(&self, p: usize) -> Result<usize, PatternError> {
        let pe = self.pat.len();
        let mut p = p;
        let c = self.pat(p);
        p += 1;
        match c {
            L_ESC => {
                if p >= pe {
                    return Err(PatternError::Malformed("ends with '%'"));
                }
                Ok(p + 1)
            }
            b'[' => {
                if self.pat(p) == b'^' {
                    p += 1;
                }
                loop {
                    if p >= pe {
                        return Err(PatternError::Malformed("missing ']'"));
                    }
                    let c = self.pat(p);
                    p += 1;
                    if c == L_ESC && p < pe {
                        p += 1;
                    }
                    if self.pat(p) == b']' && p < pe {
                        break;
                    }
                }
                Ok(p + 1)
            }
            _ => Ok(p),
        }
    }

    /// Does the text byte `c` belong to the set `[...]` from `p` (its `[`) to `ec`
    /// (its `]`)?
    fn match_bracket_class(&self, c: u8, p: usize, ec: usize) -> bool {
        let mut p = p;
        let mut sig = true;
        if self.pat(p + 1) == b'^' {
            sig = false;
            p += 1;
        }
        loop {
            p += 1;
            if p >= ec {
                break;
            }
            if self.pat(p) == L_ESC {
                p += 1;
                if match_class(c, self.pat(p)) {
                    return sig;
                }
            } else if self.pat(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if self.pat(p - 2) <= c && c <= self.pat(p) {
                    return sig;
                }
            } else if self.pat(p) == c {
                return sig;
            }
        }
        !sig
    }

    #[inline(always)]
    fn single_match(&self, s: usize, p: usize, ep: usize) -> bool {
        if s >= self.src.len() {
            return false;
        }
        let c = self.src[s];
        match self.pat(p) {
            b'.' => true,
            L_ESC => match_class(c, self.pat(p + 1)),
            b'[' => self.match_bracket_class(c, p, ep - 1),
            pc => pc == c,
        }
    }

    fn match_balance(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        if p + 1 >= self.pat.len() {
            return Err(PatternError::Malformed("missing arguments to '%b'"));
        }
        if s >= self.src.len() || self.src[s] != self.pat[p] {
            return Ok(None);
        }
        let (b, e) = (self.pat[p], self.pat[p + 1]);
        let mut cont = 1;
        for (i, &c) in self.src.iter().enumerate().skip(s + 1) {
            self.step()?;
            if c == e {
                cont -= 1;
                if cont == 0 {
                    return Ok(Some(i + 1));
                }
            } else if c == b {
                cont += 1;
            }
        }
        Ok(None)
    }

    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> Result<Option<usize>, PatternError> {
        let mut i = 0;
        while self.single_match(s + i, p, ep) {
            self.step()?;
            i += 1;
        }
        loop {
            if let Some(res) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(res));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    fn min_expand(&mut self, s: usize, p: usize, ep: usize) -> Result<Option<usize>, PatternError> {
        let mut s = s;
        loop {
            if let Some(res) = self.do_match(s, ep + 1)? {
                return Ok(Some(res));
            }
            if self.single_match(s, p, ep) {
                s += 1;
            } else {
                return Ok(None);
            }
        }
    }

    fn start_capture(
        &mut self,
        s: usize,
        p: usize,
        what: CapLen,
    ) -> Result<Option<usize>, PatternError> {
        let level = self.level;
        if level >= MAXCAPTURES {
            return Err(PatternError::TooManyCaptures);
        }
        self.capture[level] = (s, what);
        self.level = level + 1;
        let res = self.do_match(s, p)?;
        if res.is_none() {
            self.level -= 1;
        }
        Ok(res)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        let l = (0..self.level)
            .rev()
            .find(|&l| matches!(self.capture[l].1, CapLen::Unfinished))
            .ok_or(PatternError::InvalidCapture)?;
        self.capture[l].1 = CapLen::Len(s - self.capture[l].0);
        let res = self.do_match(s, p)?;
        if res.is_none() {
            self.capture[l].1 = CapLen::Unfinished;
        }
        Ok(res)
    }

    /// A back-reference `%d` (never matching a position capture, as in Lua).
    fn match_capture(&self, s: usize, d: u8) -> Result<Option<usize>, PatternError> {
        let l = usize::from(d).wrapping_sub(usize::from(b'1'));
        let len = match self.capture.get(l) {
            Some(&(_, CapLen::Len(len))) if l < self.level => len,
            Some(&(_, CapLen::Position)) if l < self.level => return Ok(None),
            _ => return Err(PatternError::InvalidCaptureIndex(l.wrapping_add(1))),
        };
        let (init, end) = (self.capture[l].0, s + len);
        Ok(
            (end <= self.src.len() && self.src[init..init + len] == self.src[s..end])
                .then_some(end),
        )
    }

    /// Lua's `match`: where a match of the pattern from `p` on, at text position `s`,
    /// ends; `None` if there is none. One nesting level for the whole call (its tail
    /// calls loop), given back on return.
    fn do_match(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        if self.depth == 0 {
            return Err(PatternError::TooComplex);
        }
        self.depth -= 1;
        let res = self.match_body(s, p);
        self.depth += 1;
        res
    }

    fn match_body(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        let (mut s, mut p) = (s, p);
        let pe = self.pat.len();
        loop {
            self.step()?;
            if p == pe {
                return Ok(Some(s));
            }
            match self.pat[p] {
                b'(' => {
                    return if self.pat(p + 1) == b')' {
                        self.start_capture(s, p + 2, CapLen::Position)
                    } else {
                        self.start_capture(s, p + 1, CapLen::Unfinished)
                    };
                }
                b')' => return self.end_capture(s, p + 1),
                b'$' if p + 1 == pe => {
                    return Ok((s == self.src.len()).then_some(s));
                }
                L_ESC if self.pat(p + 1) == b'b' => match self.match_balance(s, p + 2)? {
                    Some(e) => {
                        s = e;
                        p += 4;
                        continue;
                    }
                    None => return Ok(None),
                },
                L_ESC if self.pat(p + 1) == b'f' => {
                    p += 2;
                    if self.pat(p) != b'[' {
                        return Err(PatternError::MissingFrontierSet);
                    }
                    let ep = self.class_end(p)?;
                    let previous = if s == 0 { 0 } else { self.src(s - 1) };
                    if !self.match_bracket_class(previous, p, ep - 1)
                        && self.match_bracket_class(self.src(s), p, ep - 1)
                    {
                        p = ep;
                        continue;
                    }
                    return Ok(None);
                }
                L_ESC if self.pat(p + 1).is_ascii_digit() => {
                    match self.match_capture(s, self.pat(p + 1))? {
                        Some(e) => {
                            s = e;
                            p += 2;
                            continue;
                        }
                        None => return Ok(None),
                    }
                }
                _ => {
                    let ep = self.class_end(p)?;
                    let suffix = self.pat(ep);
                    if !self.single_match(s, p, ep) {
                        if matches!(suffix, b'*' | b'?' | b'-') {
                            p = ep + 1;
                            continue;
                        }
                        return Ok(None);
                    }
                    match suffix {
                        b'?' => {
                            if let Some(res) = self.do_match(s + 1, ep + 1)? {
                                return Ok(Some(res));
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
        }
    }
}

/// Lua's `match_class` in the C locale.
fn match_class(c: u8, cl: u8) -> bool {
    let res = match cl.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        // C's isspace: space, \t, \n, \v, \f, \r.
        b's' => matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0, // deprecated in Lua 5.2, still there in 5.4
        _ => return cl == c,
    };
    if cl.is_ascii_uppercase() { !res } else { res }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first match of `p` in `t`: the whole match, then each capture.
    fn find(p: &[u8], t: &[u8]) -> Result<Option<Vec<Capture>>, PatternError> {
        let (p, anchored) = anchor(p);
        let mut ms = Matcher::new(p, t, steps(MAX_STEPS));
        let Some(whole) = ms.find(0, anchored)? else {
            return Ok(None);
        };
        let mut all = vec![Capture::Text(whole.clone())];
        all.extend(ms.captures(whole, false)?);
        Ok(Some(all))
    }

    fn m(p: &str, t: &str) -> Option<Vec<String>> {
        check(p.as_bytes()).unwrap();
        find(p.as_bytes(), t.as_bytes()).unwrap().map(|r| {
            r.into_iter()
                .map(|c| match c {
                    Capture::Text(r) => t[r].to_owned(),
                    Capture::Position(p) => p.to_string(),
                })
                .collect::<Vec<String>>()
        })
    }

    #[test]
    fn backtracking_is_bounded() {
        // Exponential in Lua: refused after MAX_STEPS steps, not after minutes.
        let p = "a-".repeat(12) + "b";
        let t = "a".repeat(5000);
        let e = find(p.as_bytes(), t.as_bytes()).unwrap_err();
        assert_eq!(e, PatternError::TooManySteps);
    }

    #[test]
    fn lua_semantics() {
        assert_eq!(m("a+", "baaac"), Some(vec!["aaa".into()]));
        assert_eq!(m("a-b", "aaab"), Some(vec!["aaab".into()]));
        assert_eq!(m("$", "ab"), Some(vec!["".into()]));
        assert_eq!(m("%bxy", "axxyyb"), Some(vec!["xxyy".into()]));
        assert_eq!(m("%f[%w]%w+", " hi!"), Some(vec!["hi".into()]));
        assert_eq!(m("[^%d]+", "12ab3"), Some(vec!["ab".into()]));
        assert_eq!(m("[a-c]+", "xxbcay"), Some(vec!["bca".into()]));
        assert_eq!(m("[%]]", "a]"), Some(vec!["]".into()]));
        assert_eq!(
            m("((a)(b))", "ab"),
            Some(vec!["ab".into(), "ab".into(), "a".into(), "b".into()])
        );
        assert_eq!(m("(a)%1", "xaa"), Some(vec!["aa".into(), "a".into()]));
        assert_eq!(m("^b", "ab"), None);
        assert_eq!(m("a$b", "a$b"), Some(vec!["a$b".into()]));
        assert_eq!(m("%s%S", "a \tb"), Some(vec!["\tb".into()]));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for (p, e) in [
            ("%", PatternError::Malformed("ends with '%'")),
            ("[a", PatternError::Malformed("missing ']'")),
            ("a%f", PatternError::MissingFrontierSet),
            ("(a", PatternError::UnfinishedCapture),
            ("a)", PatternError::InvalidCapture),
            ("%b(", PatternError::Malformed("missing arguments to '%b'")),
            ("(a%1)", PatternError::InvalidCaptureIndex(1)),
        ] {
            assert_eq!(check(p.as_bytes()), Err(e), "{p}");
        }
        assert_eq!(
            check("(a)".repeat(33).as_bytes()),
            Err(PatternError::TooManyCaptures)
        );
    }

    #[test]
    fn depth_is_nesting_not_total() {
        // 250 nested `?`s are too deep, as in Lua; but a long search is not.
        let deep = format!("{}b", "a?".repeat(250));
        assert_eq!(
            find(deep.as_bytes(), "a".repeat(250).as_bytes()),
            Err(PatternError::TooComplex)
        );
        let text = format!("{}<td>x</td>", "<t".repeat(10_000));
        assert_eq!(
            m("<td>(%a)</td>", &text),
            Some(vec!["<td>x</td>".into(), "x".into()])
        );
    }
}
