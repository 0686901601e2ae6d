use std::time::Duration;

use mlua::{Function, StdLib};

use super::*;

/// A Lua with its own C `string` functions and ours side by side.
struct Both {
    lua: Lua,
    ours: Table,
    theirs: Table,
    _deadline: Deadline,
}

fn both() -> Both {
    let lua =
        Lua::new_with(StdLib::STRING | StdLib::TABLE, mlua::LuaOptions::default()).expect("lua");
    let theirs: Table = lua.globals().get("string").expect("string");
    let ours = lua.create_table().expect("table");
    let deadline = Deadline::default();
    install(&lua, &ours, &deadline, 0).expect("install");
    Both {
        lua,
        ours,
        theirs,
        _deadline: deadline,
    }
}

/// A call's outcome as text: its values with their types, or that it failed.
fn outcome(r: mlua::Result<MultiValue>) -> Result<String, String> {
    match r {
        Ok(vals) => Ok(vals
            .iter()
            .map(|v| match v {
                Value::String(s) => format!("s:{:?}", s.to_string_lossy()),
                Value::Integer(i) => format!("n:{i}"),
                Value::Number(n) => format!("n:{n}"),
                other => format!("{}:{:?}", other.type_name(), other),
            })
            .collect::<Vec<_>>()
            .join(",")),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `name` with `args` through both; panics where they disagree.
fn same(b: &Both, name: &str, args: MultiValue, what: &str) {
    let f = |t: &Table| -> mlua::Result<MultiValue> {
        let f: Function = t.get(name)?;
        if name == "gmatch" {
            // Every match, in order (at most 64).
            let it: Function = f.call(args.clone())?;
            let mut all = Vec::new();
            for _ in 0..64 {
                let v: MultiValue = it.call(())?;
                if v.is_empty() || matches!(v.front(), Some(Value::Nil)) {
                    break;
                }
                all.push(Value::String(
                    b.lua.create_string(outcome(Ok(v)).unwrap_or_default())?,
                ));
            }
            return Ok(MultiValue::from_iter(all));
        }
        f.call(args.clone())
    };
    let (ours, theirs) = (outcome(f(&b.ours)), outcome(f(&b.theirs)));
    match (&ours, &theirs) {
        (Ok(o), Ok(t)) => assert_eq!(o, t, "{name} {what}"),
        (Err(o), Err(t)) => {
            // The same message ("malformed pattern (...)"), tracebacks aside.
            let first = |m: &str| m.lines().next().unwrap_or_default().to_owned();
            assert_eq!(first(o), first(t), "{name} {what}");
        }
        _ => panic!("{name} {what}: ours {ours:?}, Lua's {theirs:?}"),
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
    "a", "b", "c", " ", ".", "%a", "%d", "%s", "%w", "%p", "%W", "[ab]", "[^a]", "[a-c]", "[%d)]",
    "[]", "[^]", "*", "+", "-", "?", "(", ")", "()", "%1", "%2", "%b()", "%f[%w]", "%f[%W]", "^",
    "$", "%", "[", "%%", "%(", "x", "%z", "%g", "%0",
];
const SUBJECT: &[&str] = &[
    "a", "b", "c", "ab", " ", "(", ")", "1", "22", "x", ".", "%", "\0",
];

#[test]
fn agrees_with_lua_on_random_patterns() {
    let b = both();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let lua = &b.lua;
    for case in 0..6_000 {
        let pat: String = (0..1 + rng.below(6)).map(|_| rng.pick(TOKENS)).collect();
        let src: String = (0..rng.below(12)).map(|_| rng.pick(SUBJECT)).collect();
        let init = [1i64, 2, -2, 0, 20][rng.below(5)];
        let s = lua.create_string(&src).expect("s");
        let p = lua.create_string(&pat).expect("p");
        let what = format!("#{case} ({src:?}, {pat:?}, init {init})");
        let mv = |vals: Vec<Value>| MultiValue::from_iter(vals);
        let (vs, vp) = (Value::String(s.clone()), Value::String(p.clone()));
        same(&b, "find", mv(vec![vs.clone(), vp.clone()]), &what);
        same(
            &b,
            "find",
            mv(vec![vs.clone(), vp.clone(), Value::Integer(init)]),
            &what,
        );
        same(
            &b,
            "find",
            mv(vec![
                vs.clone(),
                vp.clone(),
                Value::Integer(init),
                Value::Boolean(true),
            ]),
            &what,
        );
        same(
            &b,
            "match",
            mv(vec![vs.clone(), vp.clone(), Value::Integer(init)]),
            &what,
        );
        same(&b, "gmatch", mv(vec![vs.clone(), vp.clone()]), &what);
        for repl in ["<%0>", "[%1]", "%%", "%2", "%x", ""] {
            let r = Value::String(lua.create_string(repl).expect("r"));
            same(
                &b,
                "gsub",
                mv(vec![vs.clone(), vp.clone(), r.clone()]),
                &what,
            );
            same(
                &b,
                "gsub",
                mv(vec![vs.clone(), vp.clone(), r, Value::Integer(1)]),
                &what,
            );
        }
    }
}

#[test]
fn agrees_with_lua_on_replacement_tables_and_functions() {
    let b = both();
    let cases: &[(&str, &str)] = &[
        ("hello world from Lua", "(%w+)"),
        ("hello world", "%w+"),
        ("$name is $age", "%$(%w+)"),
        ("abc", "%w*"),
        ("abc", ""),
        ("a,b,,c", "([^,]*)"),
        ("x = 1, y = 2", "(%w+) = (%w+)"),
        ("(a(b)c)", "%b()"),
        ("THE (quick) fox", "%f[%a]%a+"),
        ("aaa", "()a()"),
    ];
    let repls = b
        .lua
        .load(
            r#"return {
                {name = "Lua", age = 30, hello = false, world = "WORLD", abc = 3.5},
                function(a, b) if a == "world" then return nil end return (b or a) .. "!" end,
                function() return {} end,
                7,
            }"#,
        )
        .eval::<Vec<Value>>()
        .expect("repls");
    for (src, pat) in cases {
        for repl in &repls {
            let args = MultiValue::from_iter([
                Value::String(b.lua.create_string(src).expect("s")),
                Value::String(b.lua.create_string(pat).expect("p")),
                repl.clone(),
            ]);
            same(&b, "gsub", args, &format!("({src:?}, {pat:?}, {repl:?})"));
        }
    }
}

#[test]
fn a_match_that_would_run_for_ever_stops_at_the_deadline() {
    let b = both();
    let find: Function = b.ours.get("find").expect("find");
    let d = b._deadline.clone();
    let subject = "a".repeat(30_000);
    let pattern = format!("{}b", "a*".repeat(20));
    let start = Instant::now();
    d.arm(start + Duration::from_millis(200));
    let err = find
        .call::<MultiValue>((subject.as_str(), pattern.as_str()))
        .expect_err("stopped");
    d.disarm();
    assert!(err.to_string().contains(TIMEOUT), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // Disarmed, the same functions go on working.
    let r: Option<i64> = find.call(("xxab", "a(b)")).expect("finds");
    assert_eq!(r, Some(3));
}

#[test]
fn plain_find_is_linear() {
    let b = both();
    let find: Function = b.ours.get("find").expect("find");
    // Quadratic in Lua's lmemfind: every start position compares ~needle bytes.
    let subject = "a".repeat(4 << 20);
    let needle = format!("{}b", "a".repeat(1 << 20));
    let start = Instant::now();
    let r: Option<i64> = find
        .call((subject.as_str(), needle.as_str(), 1, true))
        .expect("runs");
    assert_eq!(r, None);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
