//! Conversion between Lua values and [`leda_core::value::Value`].
//!
//! Every event crossing a connector is converted to [`Value`]s in the sending Lua
//! state and back in the receiving one (instances never share a Lua state), so the
//! rules below hold for every connector type:
//!
//! | Lua | `Value` |
//! |---|---|
//! | `nil`, booleans | `Nil`, `Bool` |
//! | integers / floats | `Int` / `Float` (the Lua 5.4 subtype is kept; NaN stays NaN) |
//! | strings | `Str` when valid UTF-8, otherwise `Bytes` (both come back as Lua strings) |
//! | table with keys exactly `1..n` | `Array` |
//! | empty table | `Array([])` |
//! | any other table (sparse arrays included) | `Map` |
//! | userdata with a `__persist` metamethod | what `__persist(u)` returns |
//! | functions, threads, other userdata, cyclic tables | error ([`ConvertError`]) |
//!
//! Shared (acyclic) sub-tables are copied once per reference. A converted value holds
//! at most [`MAX_VALUES`] values and [`MAX_BYTES`] bytes of strings, so a table that
//! references one sub-table twice at each of 30 levels (2^30 copies) is refused, not
//! built.

use std::collections::HashSet;
use std::fmt;

use bytes::Bytes;
use leda_core::value::Value;
use mlua::{Lua, Table};

/// Maximum nesting depth of a converted table.
pub const MAX_DEPTH: usize = 200;

/// Most values one conversion produces (every nil, number, string and table counts
/// one; a shared sub-table counts once per reference).
pub const MAX_VALUES: usize = 1 << 22;

/// Most bytes of strings one conversion copies (a shared string counts once per
/// reference).
pub const MAX_BYTES: usize = 1 << 28;

/// Why a Lua value cannot become a [`Value`] (or the reverse).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A type that cannot leave its Lua state (function, thread, userdata...).
    #[error("{what} is a {type_name}, which cannot cross a connector")]
    Unsupported {
        /// Where the value was (`argument 2`, `argument 1.key`...).
        what: String,
        /// The Lua type name.
        type_name: &'static str,
    },
    /// A table that contains itself.
    #[error("{what} is a cyclic table, which cannot cross a connector")]
    Cycle {
        /// Where the table was.
        what: String,
    },
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("{what} is nested deeper than {MAX_DEPTH} levels")]
    TooDeep {
        /// Where the table was.
        what: String,
    },
    /// More than [`MAX_VALUES`] values or [`MAX_BYTES`] bytes of strings in all.
    #[error(
        "{what} makes the value larger than {MAX_VALUES} values or {MAX_BYTES} bytes of strings \
         (a table shared by several references is copied once per reference)"
    )]
    TooLarge {
        /// Where the limit was reached.
        what: String,
    },
    /// A map key that Lua cannot use (nil or NaN).
    #[error("a map key {key} cannot be a Lua table key")]
    BadKey {
        /// The key, printed.
        key: String,
    },
    /// A Lua error while reading a table or calling `__persist`.
    #[error("{what}: {message}")]
    Lua {
        /// Where.
        what: String,
        /// The Lua error.
        message: String,
    },
}

/// Where a value sits in the one being converted, printed only for an error
/// (`argument 1.key[2]`): built on the stack as the conversion descends.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Index(&'a Path<'a>, usize),
    Key(&'a Path<'a>, &'a Value),
    AKey(&'a Path<'a>),
    Persisted(&'a Path<'a>),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root(what) => f.write_str(what),
            Path::Index(up, i) => write!(f, "{up}[{i}]"),
            Path::Key(up, key) => {
                // A key is printed whole only when short: a path of long keys, many
                // levels deep, would be as large as the value.
                let key = key.to_string();
                match key.char_indices().nth(40) {
                    Some((cut, _)) => write!(f, "{up}.{}…", &key[..cut]),
                    None => write!(f, "{up}.{key}"),
                }
            }
            Path::AKey(up) => write!(f, "{up} (a key)"),
            Path::Persisted(up) => write!(f, "{up} (__persist result)"),
        }
    }
}

/// What one conversion may still produce.
struct Budget {
    values: usize,
    bytes: usize,
}

impl Budget {
    fn take(&mut self, bytes: usize, path: &Path) -> Result<(), ConvertError> {
        if self.values == 0 || bytes > self.bytes {
            return Err(ConvertError::TooLarge {
                what: path.to_string(),
            });
        }
        self.values -= 1;
        self.bytes -= bytes;
        Ok(())
    }
}

/// Converts one Lua value; `what` names it in errors (e.g. `"argument 1"`).
pub fn to_value(v: &mlua::Value, what: &str) -> Result<Value, ConvertError> {
    let mut seen = HashSet::new();
    let mut budget = Budget {
        values: MAX_VALUES,
        bytes: MAX_BYTES,
    };
    convert(v, &Path::Root(what), &mut seen, &mut budget, 0)
}

fn lua_err(what: &Path, e: mlua::Error) -> ConvertError {
    ConvertError::Lua {
        what: what.to_string(),
        message: e.to_string(),
    }
}

fn convert(
    v: &mlua::Value,
    what: &Path,
    seen: &mut HashSet<usize>,
    budget: &mut Budget,
    depth: usize,
) -> Result<Value, ConvertError> {
    let bytes = match v {
        mlua::Value::String(s) => s.as_bytes().len(),
        _ => 0,
    };
    budget.take(bytes, what)?;
    Ok(match v {
        mlua::Value::Nil => Value::Nil,
        mlua::Value::Boolean(b) => Value::Bool(*b),
        mlua::Value::Integer(i) => Value::Int(*i),
        mlua::Value::Number(n) => Value::Float(*n),
        mlua::Value::String(s) => {
            let b = s.as_bytes();
            match std::str::from_utf8(&b) {
                Ok(text) => Value::Str(text.to_owned()),
                Err(_) => Value::Bytes(Bytes::copy_from_slice(&b)),
            }
        }
        mlua::Value::Table(t) => {
            if depth >= MAX_DEPTH {
                return Err(ConvertError::TooDeep {
                    what: what.to_string(),
                });
            }
            let id = t.to_pointer() as usize;
            if !seen.insert(id) {
                return Err(ConvertError::Cycle {
                    what: what.to_string(),
                });
            }
            let out = table(t, what, seen, budget, depth)?;
            seen.remove(&id);
            out
        }
        mlua::Value::UserData(ud) => {
            let persist = ud
                .metatable()
                .ok()
                .and_then(|mt| mt.get::<mlua::Function>("__persist").ok());
            match persist {
                Some(f) => {
                    let r: mlua::Value = f.call(ud.clone()).map_err(|e| lua_err(what, e))?;
                    if matches!(r, mlua::Value::UserData(_)) {
                        return Err(ConvertError::Unsupported {
                            what: Path::Persisted(what).to_string(),
                            type_name: "userdata",
                        });
                    }
                    convert(&r, what, seen, budget, depth + 1)?
                }
                None => {
                    return Err(ConvertError::Unsupported {
                        what: what.to_string(),
                        type_name: "userdata without a __persist hook",
                    });
                }
            }
        }
        other => {
            return Err(ConvertError::Unsupported {
                what: what.to_string(),
                type_name: other.type_name(),
            });
        }
    })
}

fn table(
    t: &Table,
    what: &Path,
    seen: &mut HashSet<usize>,
    budget: &mut Budget,
    depth: usize,
) -> Result<Value, ConvertError> {
    // First the keys alone, holding nothing (a table of millions of entries collected as
    // pairs held a reference each and ran mlua out of stack space): a sequence has
    // exactly the integer keys 1..n.
    let (mut n, mut top, mut is_array) = (0usize, 0i64, true);
    for kv in t.pairs::<mlua::Value, mlua::Value>() {
        let (k, _) = kv.map_err(|e| lua_err(what, e))?;
        n += 1;
        if n > budget.values {
            return Err(ConvertError::TooLarge {
                what: what.to_string(),
            });
        }
        match k {
            mlua::Value::Integer(k) if k >= 1 => top = top.max(k),
            _ => is_array = false,
        }
    }
    if is_array && top as u64 == n as u64 {
        let mut out = Vec::with_capacity(n);
        for i in 1..=n {
            let v: mlua::Value = t.raw_get(i as i64).map_err(|e| lua_err(what, e))?;
            let sub = Path::Index(what, i);
            out.push(convert(&v, &sub, seen, budget, depth + 1)?);
        }
        return Ok(Value::Array(out));
    }
    let mut out = Vec::with_capacity(n);
    for kv in t.pairs::<mlua::Value, mlua::Value>() {
        let (k, v) = kv.map_err(|e| lua_err(what, e))?;
        let key = convert(&k, &Path::AKey(what), seen, budget, depth + 1)?;
        let value = convert(&v, &Path::Key(what, &key), seen, budget, depth + 1)?;
        out.push((key, value));
    }
    Ok(Value::Map(out))
}

/// Converts a [`Value`] into a Lua value of `lua`.
pub fn to_lua(lua: &Lua, v: &Value) -> Result<mlua::Value, ConvertError> {
    let err = |e| lua_err(&Path::Root("value"), e);
    Ok(match v {
        Value::Nil => mlua::Value::Nil,
        Value::Bool(b) => mlua::Value::Boolean(*b),
        Value::Int(i) => mlua::Value::Integer(*i),
        Value::Float(f) => mlua::Value::Number(*f),
        Value::Str(s) => mlua::Value::String(lua.create_string(s).map_err(err)?),
        Value::Bytes(b) => mlua::Value::String(lua.create_string(b.as_ref()).map_err(err)?),
        Value::Array(a) => {
            let t = lua.create_table_with_capacity(a.len(), 0).map_err(err)?;
            for (i, x) in a.iter().enumerate() {
                t.raw_set(i as i64 + 1, to_lua(lua, x)?).map_err(err)?;
            }
            mlua::Value::Table(t)
        }
        Value::Map(m) => {
            let t = lua.create_table_with_capacity(0, m.len()).map_err(err)?;
            for (k, x) in m {
                let key = to_lua(lua, k)?;
                let bad = match &key {
                    mlua::Value::Nil => true,
                    mlua::Value::Number(n) => n.is_nan(),
                    _ => false,
                };
                if bad {
                    return Err(ConvertError::BadKey { key: k.to_string() });
                }
                t.raw_set(key, to_lua(lua, x)?).map_err(err)?;
            }
            mlua::Value::Table(t)
        }
    })
}

/// Converts Lua arguments (`...`) into event values; `what` prefixes error locations.
pub fn args_to_values(args: &[mlua::Value], what: &str) -> Result<Vec<Value>, ConvertError> {
    args.iter()
        .enumerate()
        .map(|(i, v)| to_value(v, &format!("{what}argument {}", i + 1)))
        .collect()
}
