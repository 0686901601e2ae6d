//! Value round-trips Lua -> Rust -> msgpack -> Rust -> Lua, and refused values.

use bytes::Bytes;
use leda_core::value::Value;
use leda_lua::value::{ConvertError, to_lua, to_value};
use mlua::{Lua, UserData};

/// Lua -> Value -> msgpack -> Value -> Lua, then compared in Lua with `same`.
fn round_trip(lua: &Lua, expr: &str) -> Value {
    let v: mlua::Value = lua.load(format!("return {expr}")).eval().unwrap();
    let value = to_value(&v, "x").unwrap();
    let bytes = rmp_serde::to_vec(&value).unwrap();
    let back: Value = rmp_serde::from_slice(&bytes).unwrap();
    // Debug text, so that NaN compares equal to itself.
    assert_eq!(
        format!("{back:?}"),
        format!("{value:?}"),
        "msgpack round trip of {expr}"
    );
    let again = to_lua(lua, &back).unwrap();
    let same: mlua::Function = lua.globals().get("same").unwrap();
    let ok: bool = same.call((v, again)).unwrap();
    assert!(ok, "Lua round trip of {expr}");
    value
}

fn lua() -> Lua {
    let lua = Lua::new();
    lua.load(
        r#"
        function same(a, b)
          if type(a) ~= type(b) then return false end
          if type(a) == "number" then
            if a ~= a then return b ~= b end
            return math.type(a) == math.type(b) and a == b
          end
          if type(a) ~= "table" then return a == b end
          for k, v in pairs(a) do if not same(v, b[k]) then return false end end
          for k in pairs(b) do if a[k] == nil then return false end end
          return true
        end"#,
    )
    .exec()
    .unwrap();
    lua
}

#[test]
fn scalars_keep_their_types() {
    let lua = lua();
    assert_eq!(round_trip(&lua, "nil"), Value::Nil);
    assert_eq!(round_trip(&lua, "true"), Value::Bool(true));
    assert_eq!(round_trip(&lua, "42"), Value::Int(42));
    assert_eq!(round_trip(&lua, "-7"), Value::Int(-7));
    assert_eq!(round_trip(&lua, "math.maxinteger"), Value::Int(i64::MAX));
    assert!(matches!(round_trip(&lua, "42.0"), Value::Float(f) if f == 42.0));
    assert!(matches!(round_trip(&lua, "0/0"), Value::Float(f) if f.is_nan()));
    assert!(matches!(round_trip(&lua, "1/0"), Value::Float(f) if f.is_infinite()));
    assert_eq!(round_trip(&lua, "'héllo'"), Value::Str("héllo".into()));
    assert_eq!(round_trip(&lua, "''"), Value::Str(String::new()));
}

#[test]
fn binary_strings_become_bytes() {
    let lua = lua();
    assert_eq!(
        round_trip(&lua, "'\\0\\255\\254abc'"),
        Value::Bytes(Bytes::from_static(b"\0\xff\xfeabc"))
    );
}

#[test]
fn tables_arrays_maps_and_nesting() {
    let lua = lua();
    assert_eq!(round_trip(&lua, "{}"), Value::Array(vec![]));
    assert_eq!(
        round_trip(&lua, "{1, 2.5, 'x'}"),
        Value::Array(vec![
            Value::Int(1),
            Value::Float(2.5),
            Value::Str("x".into())
        ])
    );
    // Sparse arrays are maps, so the holes survive.
    match round_trip(&lua, "{[1] = 'a', [3] = 'c'}") {
        Value::Map(m) => assert_eq!(m.len(), 2),
        other => panic!("sparse array became {other:?}"),
    }
    match round_trip(&lua, "{a = 1, [2] = {b = {c = {1, 2, {}}}}, [1.5] = true}") {
        Value::Map(m) => assert_eq!(m.len(), 3),
        other => panic!("map became {other:?}"),
    }
    // Shared (acyclic) sub-tables are copied.
    round_trip(&lua, "(function() local t = {1} return {t, t} end)()");
}

#[test]
fn refused_values_say_what_and_where() {
    let lua = lua();
    let f: mlua::Value = lua.load("return {k = {print}}").eval().unwrap();
    let e = to_value(&f, "argument 2").unwrap_err();
    assert!(
        matches!(
            &e,
            ConvertError::Unsupported {
                type_name: "function",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("argument 2.k[1]"), "{e}");

    let cyc: mlua::Value = lua.load("local t = {} t.self = t return t").eval().unwrap();
    assert!(matches!(
        to_value(&cyc, "x"),
        Err(ConvertError::Cycle { .. })
    ));

    let co: mlua::Value = lua.load("return coroutine.create(print)").eval().unwrap();
    assert!(to_value(&co, "x").is_err());

    let deep: mlua::Value = lua
        .load("local t = {} for i = 1, 300 do t = {t} end return t")
        .eval()
        .unwrap();
    assert!(matches!(
        to_value(&deep, "x"),
        Err(ConvertError::TooDeep { .. })
    ));

    // A table that references one sub-table twice at each of 30 levels is 2^30 values
    // once copied: refused, not built (it took minutes and all memory); a path of long
    // keys is printed cut (it was built whole for every level, quadratic in depth).
    let dag: mlua::Value = lua
        .load("local t = {} for i = 1, 30 do t = {t, t} end return t")
        .eval()
        .unwrap();
    let e = to_value(&dag, "x").unwrap_err();
    assert!(matches!(e, ConvertError::TooLarge { .. }), "{e}");
    let keys: mlua::Value = lua
        .load("local k = string.rep('k', 1 << 20) local t = print for i = 1, 150 do t = {[k] = t} end return t")
        .eval()
        .unwrap();
    let e = to_value(&keys, "x").unwrap_err().to_string();
    assert!(
        e.contains("function") && e.len() < 150 * 50,
        "{}",
        &e[..200]
    );

    // A table of more than a million entries converts (collected as pairs first, each
    // held a reference, and mlua ran out of stack space: a panic).
    let big: mlua::Value = lua
        .load("local m = {} for i = 1, 1100000 do m[i] = 's' .. i end return m")
        .eval()
        .unwrap();
    match to_value(&big, "x").unwrap() {
        Value::Array(a) => assert_eq!(a.len(), 1_100_000),
        other => panic!("{}", other.type_name()),
    }

    // Map keys Lua cannot hold.
    let bad = Value::Map(vec![(Value::Nil, Value::Int(1))]);
    assert!(matches!(
        to_lua(&lua, &bad),
        Err(ConvertError::BadKey { .. })
    ));
}

struct Opaque;
impl UserData for Opaque {}

struct Point(i64, i64);
impl UserData for Point {
    fn add_methods<M: mlua::UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method("__persist", |_, p, ()| Ok(vec![p.0, p.1]));
    }
}

#[test]
fn userdata_needs_a_persist_hook() {
    let lua = lua();
    let u = mlua::Value::UserData(lua.create_userdata(Opaque).unwrap());
    let e = to_value(&u, "argument 1").unwrap_err().to_string();
    assert!(e.contains("__persist"), "{e}");
    let p = mlua::Value::UserData(lua.create_userdata(Point(3, 4)).unwrap());
    assert_eq!(
        to_value(&p, "argument 1").unwrap(),
        Value::Array(vec![Value::Int(3), Value::Int(4)])
    );
}
