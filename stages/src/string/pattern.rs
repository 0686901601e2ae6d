//! A Lua 5.4 pattern matcher (a port of `lstrlib.c`'s `match`) over byte slices.
//!
//! Positions are indices, never pointers: the end of the pattern or of the text reads
//! as a NUL byte, as Lua's NUL-terminated strings do, without reading past either.
//! Recursion is bounded as in Lua: at most [`MAXCCALLS`] *nested* calls of the matcher
//! (tail calls loop instead of recursing, and each call gives its level back when it
//! returns), so "pattern too complex" means what it means in Lua, and a search from
//! many start positions starts each one afresh.

use std::ops::Range;

/// The deepest nesting of matcher calls (Lua's `MAXCCALLS`).
pub const MAXCCALLS: usize = 200;

/// The most matcher calls one search may make: a pattern that backtracks over hostile
/// text (`a-a-a-a-b` on thousands of `a`) takes time exponential in the pattern, and a
/// handler must not spend minutes on one event. About a second on this machine; Lua
/// itself has no such bound.
pub const MAX_STEPS: u64 = 50_000_000;

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
    InvalidCaptureIndex(u8),
    /// More than [`MAXCCALLS`] nested matcher calls.
    #[error("pattern too complex")]
    TooComplex,
    /// More than [`MAX_STEPS`] matcher calls in one search (backtracking).
    #[error("pattern too complex: more than {MAX_STEPS} steps on this text (backtracking)")]
    TooManySteps,
}

/// Checks the whole pattern (Lua checks only what a match reaches; this refuses a
/// malformed pattern before any text is seen).
pub fn check(pattern: &[u8]) -> Result<(), PatternError> {
    let p = pattern.strip_prefix(b"^").unwrap_or(pattern);
    let ms = MatchState::new(p, b"");
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
                let d = ms.pat(i + 1);
                let l = usize::from(d - b'0');
                if l == 0 || l > open.len() || open[l - 1] {
                    return Err(PatternError::InvalidCaptureIndex(d - b'0'));
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

/// A capture: where it starts and how long it is.
#[derive(Debug, Clone, Copy)]
enum CapLen {
    Len(usize),
    Unfinished,
    Position,
}

struct MatchState<'a> {
    pat: &'a [u8],
    src: &'a [u8],
    depth: usize,
    /// Matcher calls left to this search ([`MAX_STEPS`]).
    steps: u64,
    level: usize,
    capture: [(usize, CapLen); MAXCAPTURES],
}

impl<'a> MatchState<'a> {
    fn new(pat: &'a [u8], src: &'a [u8]) -> Self {
        MatchState {
            pat,
            src,
            depth: MAXCCALLS,
            steps: MAX_STEPS,
            level: 0,
            capture: [(0, CapLen::Len(0)); MAXCAPTURES],
        }
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

    fn match_balance(&self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        if p + 1 >= self.pat.len() {
            return Err(PatternError::Malformed("missing arguments to '%b'"));
        }
        if s >= self.src.len() || self.src[s] != self.pat[p] {
            return Ok(None);
        }
        let (b, e) = (self.pat[p], self.pat[p + 1]);
        let mut cont = 1;
        for (i, &c) in self.src.iter().enumerate().skip(s + 1) {
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

    fn match_capture(&self, s: usize, d: u8) -> Result<Option<usize>, PatternError> {
        let l = usize::from(d.wrapping_sub(b'1'));
        let len = match self.capture.get(l) {
            Some(&(_, CapLen::Len(len))) if l < self.level => len,
            _ => return Err(PatternError::InvalidCaptureIndex(d.wrapping_sub(b'0'))),
        };
        let init = self.capture[l].0;
        if self.src.len() - s >= len && self.src[init..init + len] == self.src[s..s + len] {
            Ok(Some(s + len))
        } else {
            Ok(None)
        }
    }

    /// Lua's `match`: where a match of the pattern from `p` on, at text position `s`,
    /// ends; `None` if there is none. One nesting level for the whole call (its tail
    /// calls loop), given back on return.
    fn do_match(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        if self.depth == 0 {
            return Err(PatternError::TooComplex);
        }
        if self.steps == 0 {
            return Err(PatternError::TooManySteps);
        }
        self.steps -= 1;
        self.depth -= 1;
        let res = self.match_body(s, p);
        self.depth += 1;
        res
    }

    fn match_body(&mut self, s: usize, p: usize) -> Result<Option<usize>, PatternError> {
        let (mut s, mut p) = (s, p);
        let pe = self.pat.len();
        loop {
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

    /// The whole match `start..end`, then each capture (position captures as empty
    /// ranges at their position).
    fn captures(&self, start: usize, end: usize) -> Result<Vec<Range<usize>>, PatternError> {
        let mut out = Vec::with_capacity(self.level + 1);
        out.push(start..end);
        for &(init, len) in &self.capture[..self.level] {
            match len {
                CapLen::Len(l) => out.push(init..init + l),
                CapLen::Position => out.push(init..init),
                CapLen::Unfinished => return Err(PatternError::UnfinishedCapture),
            }
        }
        Ok(out)
    }
}

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
        _ => return cl == c,
    };
    if cl.is_ascii_uppercase() { !res } else { res }
}

/// Where `pattern` matches `text` anchored at `at` (Lua's `gsub` step): the whole
/// match, then each capture; `None` if it does not match there. A leading `^` is *not*
/// interpreted here (the caller strips it). `steps` is what is left of the search's
/// [`MAX_STEPS`], shared by the calls of one `gsub`.
pub fn match_at(
    pattern: &[u8],
    text: &[u8],
    at: usize,
    steps: &mut u64,
) -> Result<Option<Vec<Range<usize>>>, PatternError> {
    let mut ms = MatchState::new(pattern, text);
    ms.steps = *steps;
    let found = ms.do_match(at, 0);
    *steps = ms.steps;
    match found? {
        Some(end) => ms.captures(at, end).map(Some),
        None => Ok(None),
    }
}

/// Lua's `string.find` search: the first match of `pattern` in `text` from byte
/// `init` on (trying every start position up to and including the end of the text,
/// only `init` when the pattern starts with `^`): the whole match, then each capture.
pub fn find(
    pattern: &[u8],
    text: &[u8],
    init: usize,
) -> Result<Option<Vec<Range<usize>>>, PatternError> {
    let (p, anchor) = match pattern.strip_prefix(b"^") {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let mut ms = MatchState::new(p, text);
    let mut s = init;
    while s <= text.len() {
        // Each start position starts afresh (depth and captures), as in Lua.
        ms.level = 0;
        ms.depth = MAXCCALLS;
        if let Some(end) = ms.do_match(s, 0)? {
            return ms.captures(s, end).map(Some);
        }
        if anchor {
            break;
        }
        s += 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> Option<Vec<String>> {
        check(p.as_bytes()).unwrap();
        find(p.as_bytes(), t.as_bytes(), 0).unwrap().map(|r| {
            r.into_iter()
                .map(|r| t[r].to_owned())
                .collect::<Vec<String>>()
        })
    }

    #[test]
    fn backtracking_is_bounded() {
        // Exponential in Lua: refused after MAX_STEPS calls, not after minutes.
        let p = "a-".repeat(12) + "b";
        let t = "a".repeat(5000);
        let e = find(p.as_bytes(), t.as_bytes(), 0).unwrap_err();
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
            find(deep.as_bytes(), "a".repeat(250).as_bytes(), 0),
            Err(PatternError::TooComplex)
        );
        let text = format!("{}<td>x</td>", "<t".repeat(10_000));
        assert_eq!(
            m("<td>(%a)</td>", &text),
            Some(vec!["<td>x</td>".into(), "x".into()])
        );
    }
}
