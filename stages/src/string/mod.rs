//! `leda.stage.string.*`: Lua patterns in Rust, and the `match` stage (Listing 4.3).
//!
//! Patterns are Lua 5.4 patterns, matched by [`pattern`] (which the HTTP server's Lua
//! pages use too), a port of Lua's `lstrlib.c` matcher over byte slices (no NUL
//! terminator needed, nothing read past either end), with Lua's recursion bound: at
//! most [`pattern::MAXCCALLS`] *nested* matcher calls, so "pattern too complex" is an
//! error of that one event, as Lua's error is of that call. Two limits: position
//! captures `()` and back-references (`%1`..`%9`) are refused (captures are returned
//! as strings).
//!
//! (It replaces the `lua-patterns` crate, whose depth counter was not given back on
//! tail calls nor between start positions: ordinary text of a few hundred bytes with
//! partial matches before the real one failed with "pattern too complex", as a panic.)

mod matcher;
pub mod pattern;

use pattern::{Capture, Matcher, Scan};

pub use matcher::string_match;

/// Checks that `pattern` is a Lua pattern this library can run.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Ok(());
    }
    let b = pattern.as_bytes();
    for i in 0..b.len().saturating_sub(1) {
        let escaped = i > 0 && b[i - 1] == b'%' && !(i > 1 && b[i - 2] == b'%');
        if b[i] == b'(' && b[i + 1] == b')' && !escaped {
            return Err("position captures '()' are not supported".into());
        }
    }
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                return Err("back-references '%1'..'%9' are not supported".into());
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    pattern::check(b).map_err(|e| e.to_string())
}

/// Lua's `string.match(text, pattern)`: `None` if no match; otherwise the captures,
/// or the whole match when the pattern has no captures.
pub fn lua_match(pattern: &str, text: &str) -> Result<Option<Vec<String>>, String> {
    check_pattern(pattern)?;
    let (p, anchored) = pattern::anchor(pattern.as_bytes());
    let budget = pattern::steps(pattern::step_budget(text.len()));
    let mut m = Matcher::new(p, text.as_bytes(), budget);
    let Some(whole) = m.find(0, anchored).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let caps = m.captures(whole, true).map_err(|e| e.to_string())?;
    let text = m.text();
    Ok(Some(
        caps.into_iter()
            .map(|c| match c {
                Capture::Text(r) => String::from_utf8_lossy(&text[r]).into_owned(),
                Capture::Position(p) => (p + 1).to_string(), // as in Lua
            })
            .collect(),
    ))
}

/// Lua 5.4's `string.gsub(text, pattern, repl)` (result only): `%0`..`%9` in `repl`
/// name the whole match and the captures, `%%` is a percent sign. As in Lua 5.4, an
/// empty match right after the previous match is not a match.
pub fn gsub(pattern: &str, text: &str, repl: &str) -> Result<String, String> {
    check_pattern(pattern)?;
    let (p, anchored) = pattern::anchor(pattern.as_bytes());
    let b = text.as_bytes();
    // One budget for the whole replacement, not one per start position.
    let mut m = Matcher::new(p, b, pattern::steps(pattern::step_budget(b.len())));
    let mut scan = Scan::new(0, anchored, false);
    let (mut out, mut copied) = (Vec::with_capacity(b.len()), 0);
    while let Some(whole) = m.next_match(&mut scan).map_err(|e| e.to_string())? {
        out.extend_from_slice(&b[copied..whole.start]);
        copied = whole.end;
        add_replacement(&mut out, &m, whole, repl)?;
    }
    out.extend_from_slice(&b[copied..]);
    String::from_utf8(out).map_err(|_| "gsub produced invalid UTF-8".to_owned())
}

/// Appends `repl` for the match `whole` of `m`.
fn add_replacement<T>(
    out: &mut Vec<u8>,
    m: &Matcher<'_, T>,
    whole: std::ops::Range<usize>,
    repl: &str,
) -> Result<(), String> {
    let mut r = repl.bytes();
    while let Some(c) = r.next() {
        if c != b'%' {
            out.push(c);
            continue;
        }
        match r.next() {
            Some(b'0') => out.extend_from_slice(&m.text()[whole.clone()]),
            Some(d @ b'1'..=b'9') => {
                let i = usize::from(d - b'0');
                match m.capture(i - 1, whole.clone()) {
                    Ok(Capture::Text(r)) => out.extend_from_slice(&m.text()[r]),
                    Ok(Capture::Position(p)) => {
                        out.extend_from_slice((p + 1).to_string().as_bytes())
                    }
                    Err(_) => {
                        return Err(format!("invalid capture index %{i} in replacement string"));
                    }
                }
            }
            Some(b'%') => out.push(b'%'),
            _ => return Err("invalid use of '%' in replacement string".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matcher reads the byte after the pattern (and goes on past it when that byte
    /// is a quantifier): a pattern `x` followed in memory by `?`s failed to match `xyz`
    /// ("pattern too complex", from parsing the bytes past its end), and a heap byte after
    /// a one-byte pattern made the `match` stage's test fail now and then.
    #[test]
    fn the_bytes_after_a_pattern_are_not_read_as_part_of_it() {
        let memory = format!("x{}", "?".repeat(300));
        assert_eq!(lua_match(&memory[..1], "xyz"), Ok(Some(vec!["x".into()])));
        assert_eq!(
            check_pattern("(a)%1"),
            Err("back-references '%1'..'%9' are not supported".into())
        );
    }

    #[test]
    fn match_like_lua() {
        assert_eq!(
            lua_match("(%d+)-(%d+)", "on 10-20 x").unwrap(),
            Some(vec!["10".into(), "20".into()])
        );
        assert_eq!(lua_match("%d+", "ab 42").unwrap(), Some(vec!["42".into()]));
        assert_eq!(lua_match("^b", "ab").unwrap(), None);
        assert_eq!(lua_match("", "ab").unwrap(), Some(vec!["".into()]));
        assert!(lua_match("(%d", "1").is_err());
        assert!(lua_match("a()", "a").is_err());
        assert!(lua_match("%", "a").is_err());
    }

    /// A review (2026-11-27): the `lua-patterns` crate leaked its depth counter on tail calls and across
    /// start positions, so partial matches before the real one made ordinary text
    /// "too complex" (a panic); Lua matches these.
    #[test]
    fn partial_matches_before_the_match_are_not_too_complex() {
        let rows = "<tr><td>X</td><td>1,0</td></tr>\n".repeat(40);
        let text = format!("{rows}<td>PETR4</td>\n<td>21,39</td>");
        assert_eq!(
            lua_match("<td>PETR4</td>%s<td>(%d+,%d+)</td>", &text),
            Ok(Some(vec!["21,39".into()]))
        );
        let text = format!("{}<td>1,0</td>", "<td>X</td>".repeat(40));
        assert_eq!(
            gsub("<td>(%d+,%d+)</td>", &text, "[%1]"),
            Ok(format!("{}[1,0]", "<td>X</td>".repeat(40)))
        );
        let minus = format!("{}b", "a-".repeat(25));
        assert_eq!(
            lua_match(&minus, "second event abc"),
            Ok(Some(vec!["ab".into()]))
        );
        let optional = format!("{}b", "a?".repeat(150));
        assert_eq!(
            lua_match(&optional, "second event abc"),
            Ok(Some(vec!["ab".into()]))
        );
        // Too deep for Lua too: an error, not a panic.
        let deep = format!("{}b", "a?".repeat(250));
        assert_eq!(
            lua_match(&deep, &"a".repeat(300)),
            Err("pattern too complex".into())
        );
    }

    #[test]
    fn gsub_like_lua() {
        assert_eq!(gsub(",", "21,50", ".").unwrap(), "21.50");
        assert_eq!(gsub("(%w+)=(%w+)", "a=1 b=2", "%2=%1").unwrap(), "1=a 2=b");
        assert_eq!(gsub("x*", "abc", "-").unwrap(), "-a-b-c-");
        assert_eq!(gsub("^a", "aaa", "b").unwrap(), "baa");
        assert_eq!(gsub("%s", "a b", "%%").unwrap(), "a%b");
        assert!(gsub("a", "a", "%9").is_err());
    }
}
