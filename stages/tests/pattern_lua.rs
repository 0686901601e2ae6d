//! The pattern matcher against Lua 5.4's own (`lstrlib.c`, through mlua): random
//! patterns and subjects, `find`, `match`, `gmatch` and `gsub` written on
//! [`Matcher`] as Lua writes them in C, then the stage library's `lua_match` and
//! `gsub`; the same results, or the same error.

use leda_lua::mlua::{self, Lua, MultiValue, Value};
use leda_stages::string::pattern::{self, Capture, Matcher, PatternError, Scan};
use leda_stages::string::{check_pattern, gsub, lua_match};

type Outcome = Result<String, String>;

fn matcher<'a>(p: &'a [u8], s: &'a [u8]) -> Matcher<'a, impl FnMut() -> Result<(), PatternError>> {
    Matcher::new(p, s, pattern::steps(pattern::MAX_STEPS))
}

fn show(s: &[u8], caps: Vec<Capture>) -> Vec<String> {
    caps.into_iter()
        .map(|c| match c {
            Capture::Text(r) => format!("s:{:?}", String::from_utf8_lossy(&s[r])),
            Capture::Position(p) => format!("n:{}", p + 1),
        })
        .collect()
}

/// `string.find(s, p, init)` (`find`) or `string.match(s, p, init)`, `init` in
/// `1..=#s + 1`.
fn our_find(s: &[u8], p: &[u8], init: usize, find: bool) -> Outcome {
    if find && !p.iter().any(|c| b"^$*+?.([%-".contains(c)) {
        // Lua's `find` searches a pattern without specials as plain text.
        let at = match p.len() {
            0 => Some(0),
            n => s[init - 1..].windows(n).position(|w| w == p),
        };
        return Ok(at.map_or("nil".into(), |a| {
            format!("n:{},n:{}", a + init, a + init - 1 + p.len())
        }));
    }
    let (body, anchor) = pattern::anchor(p);
    let mut m = matcher(body, s);
    let Some(whole) = m.find(init - 1, anchor).map_err(|e| e.to_string())? else {
        return Ok("nil".into());
    };
    let mut out = Vec::new();
    if find {
        out.push(format!("n:{}", whole.start + 1));
        out.push(format!("n:{}", whole.end));
    }
    out.extend(show(
        s,
        m.captures(whole, !find).map_err(|e| e.to_string())?,
    ));
    Ok(out.join(","))
}

/// Every match of `string.gmatch(s, p)`: its captures, then `|`.
fn our_gmatch(s: &[u8], p: &[u8]) -> Outcome {
    let mut m = matcher(p, s);
    let mut scan = Scan::new(0, false, false);
    let mut all = Vec::new();
    while let Some(whole) = m.next_match(&mut scan).map_err(|e| e.to_string())? {
        all.extend(show(s, m.captures(whole, true).map_err(|e| e.to_string())?));
        all.push("|".to_owned());
    }
    Ok(all.join(","))
}

/// Lua's `gmatch` as [`our_gmatch`] writes it (a table: `true` for `|`).
const GMATCH: &str = "return function(s, p)
    local all, it = {}, string.gmatch(s, p)
    while true do
        local t = table.pack(it())
        if t[1] == nil then return all end
        for i = 1, t.n do all[#all + 1] = t[i] end
        all[#all + 1] = true
    end
end";

/// `string.gsub(s, p, repl)` with a replacement string (Lua 5.4's `add_s`).
fn our_gsub(s: &[u8], p: &[u8], repl: &[u8]) -> Outcome {
    let (body, anchor) = pattern::anchor(p);
    let mut m = matcher(body, s);
    let mut scan = Scan::new(0, anchor, false);
    let (mut out, mut copied, mut n) = (Vec::new(), 0, 0);
    while let Some(whole) = m.next_match(&mut scan).map_err(|e| e.to_string())? {
        n += 1;
        out.extend_from_slice(&s[copied..whole.start]);
        copied = whole.end;
        let mut i = 0;
        while i < repl.len() {
            i += 1;
            if repl[i - 1] != b'%' {
                out.push(repl[i - 1]);
                continue;
            }
            i += 1;
            match repl.get(i - 1).copied() {
                Some(b'%') => out.push(b'%'),
                Some(b'0') => out.extend_from_slice(&s[whole.clone()]),
                Some(d) if d.is_ascii_digit() => {
                    match m.capture(usize::from(d - b'1'), whole.clone()) {
                        Ok(Capture::Text(r)) => out.extend_from_slice(&s[r]),
                        Ok(Capture::Position(p)) => out.extend(format!("{}", p + 1).bytes()),
                        Err(e) => return Err(e.to_string()),
                    }
                }
                _ => return Err("invalid use of '%' in replacement string".into()),
            }
        }
    }
    out.extend_from_slice(&s[copied..]);
    Ok(format!("s:{:?},n:{n}", String::from_utf8_lossy(&out)))
}

/// Lua's values or error, written as ours are.
fn theirs(lua: &Lua, code: &str, args: MultiValue) -> Outcome {
    let f: mlua::Function = lua.load(code).eval().expect("compiles");
    match f.call::<MultiValue>(args) {
        Ok(vals) => Ok(vals
            .into_iter()
            .flat_map(|v| match v {
                Value::Table(t) => t
                    .sequence_values()
                    .collect::<mlua::Result<Vec<_>>>()
                    .expect("values"),
                v => vec![v],
            })
            .map(|v| match v {
                Value::String(s) => format!("s:{:?}", s.to_string_lossy()),
                Value::Integer(i) => format!("n:{i}"),
                Value::Nil => "nil".into(),
                Value::Boolean(true) => "|".into(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(",")),
        Err(mlua::Error::RuntimeError(m)) => {
            // The first line, without the place `GMATCH`'s errors start with.
            let m = m.lines().next().unwrap_or_default();
            let place = m
                .split_once(".rs:")
                .and_then(|(_, r)| r.splitn(3, ':').nth(2));
            Err(place.map_or(m, str::trim_start).to_owned())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A small xorshift generator: the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

const TOKENS: &[&str] = &[
    "a", "b", "c", " ", ".", "%a", "%d", "%s", "%w", "%p", "%W", "%x", "%u", "%l", "%c", "%g",
    "%z", "%A", "[ab]", "[^a]", "[a-c]", "[%d)]", "[%a_]", "[]", "[^]", "[a-]", "*", "+", "-", "?",
    "(", ")", "()", "%1", "%2", "%b()", "%bab", "%b", "%f[%w]", "%f[%W]", "%f", "^", "$", "%", "[",
    "%%", "%(", "%.", "x", "%0", "A", "_",
];
const SUBJECT: &[&str] = &[
    "a", "b", "c", "ab", " ", "(", ")", "1", "22", "x", ".", "%", "\0", "A", "_", "\t", "ff",
];

#[test]
fn the_matcher_agrees_with_lua_5_4() {
    let lua = Lua::new();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut ok, mut failed) = (0, 0);
    for case in 0..5_000 {
        let pat: String = (0..1 + rng.below(7)).map(|_| rng.pick(TOKENS)).collect();
        let src: String = (0..rng.below(14)).map(|_| rng.pick(SUBJECT)).collect();
        let init = 1 + rng.below(src.len() + 1);
        let (s, p) = (src.as_bytes(), pat.as_bytes());
        let what = format!("#{case} ({src:?}, {pat:?}, init {init})");
        let args = |more: &[Value]| {
            let mut v = vec![
                Value::String(lua.create_string(s).expect("s")),
                Value::String(lua.create_string(p).expect("p")),
            ];
            v.extend_from_slice(more);
            MultiValue::from_iter(v)
        };
        let find = theirs(&lua, "string.find", args(&[Value::Integer(init as i64)]));
        assert_eq!(our_find(s, p, init, true), find, "find {what}");
        let matched = theirs(&lua, "string.match", args(&[Value::Integer(init as i64)]));
        assert_eq!(our_find(s, p, init, false), matched, "match {what}");
        let gmatch = theirs(&lua, GMATCH, args(&[]));
        assert_eq!(our_gmatch(s, p), gmatch, "gmatch {what}");
        for repl in ["<%0>", "[%1]", "%%", "%2", "%x", "", "%1%1"] {
            let r = Value::String(lua.create_string(repl).expect("r"));
            let sub = theirs(&lua, "string.gsub", args(&[r]));
            assert_eq!(our_gsub(s, p, repl.as_bytes()), sub, "gsub {repl:?} {what}");
            // The stage library: the same, or refused before any text is seen.
            if check_pattern(&pat).is_ok() {
                let first = sub.map(|v| v.rsplit_once(",n:").expect("count").0.to_owned());
                let stage = gsub(&pat, &src, repl).map(|v| format!("s:{v:?}"));
                assert_eq!(stage.is_ok(), first.is_ok(), "stage gsub {repl:?} {what}");
                if let (Ok(o), Ok(t)) = (stage, first) {
                    assert_eq!(o, t, "stage gsub {repl:?} {what}");
                }
            }
        }
        let stage = lua_match(&pat, &src).map(|caps| match caps {
            None => "nil".to_owned(),
            Some(caps) => caps
                .iter()
                .map(|c| format!("s:{c:?}"))
                .collect::<Vec<_>>()
                .join(","),
        });
        let first = theirs(&lua, "string.match", args(&[]));
        if check_pattern(&pat).is_ok() {
            assert_eq!(stage, first, "stage match {what}");
        } else {
            assert!(stage.is_err(), "stage match {what}");
        }
        match first {
            Ok(_) => ok += 1,
            Err(_) => failed += 1,
        }
    }
    // Both kinds of case, in numbers.
    assert!(
        ok > 1_000 && failed > 1_000,
        "{ok} matched, {failed} failed"
    );
}
