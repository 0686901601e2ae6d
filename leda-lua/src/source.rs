//! How Lua functions travel from the configuring script to instances: as **source
//! text**, never bytecode.
//!
//! A handler (or `init`) is a function value of the configuring state. Its source is
//! cut out of the script file with `debug.getinfo` (`source`, `linedefined`,
//! `lastlinedefined`) and recompiled in each instance state under the original chunk
//! name, padded so that line numbers in error messages match the script.
//!
//! Upvalues (locals of the script the function captures) travel by value:
//! * data that converts to a [`Value`] (numbers, strings, tables of data...) is copied;
//! * the `leda` module and the standard libraries are re-bound in the instance (the
//!   library is `require`d there);
//! * captured Lua functions travel the same way, recursively (a function may capture
//!   itself, as a recursive local function does);
//! * anything else (userdata, coroutines, C functions) is refused when the stage is
//!   built, naming the upvalue.
//!
//! Globals of the configuring script are **not** copied: a handler sees the globals of
//! its own instance state (set by `init`). An upvalue is copied when the stage is
//! built; later assignments in the script are not seen (set stage attributes instead).

use std::collections::HashMap;

use leda_core::value::Value;
use mlua::{ChunkMode, Function, Lua, Table};

use crate::value::{to_lua, to_value};

/// Why a function cannot travel, or cannot be rebuilt in an instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// Not a Lua function (a C function, for instance).
    #[error("{what} is not a Lua function defined in a script")]
    NotLua {
        /// What it is (`handler of stage 'x'`).
        what: String,
    },
    /// The script text is not available (a function built by `load` with `=name`).
    #[error("{what}: the source text of {source_name} is not available")]
    NoText {
        /// What function.
        what: String,
        /// Its chunk name.
        source_name: String,
    },
    /// The function text could not be located in its lines.
    #[error("{what}: cannot extract the function's text from {location}")]
    NotFound {
        /// What function.
        what: String,
        /// `file:line`.
        location: String,
    },
    /// An upvalue that cannot travel.
    #[error("{what}: upvalue '{name}' cannot travel to instances: {reason}")]
    Upvalue {
        /// What function.
        what: String,
        /// The upvalue.
        name: String,
        /// Why.
        reason: String,
    },
    /// Too many nested captured functions.
    #[error("{what}: captured functions nest too deeply")]
    TooDeep {
        /// What function.
        what: String,
    },
    /// A Lua error while compiling or running the rebuilt chunk.
    #[error("{0}")]
    Lua(String),
}

/// One captured upvalue, ready to be re-bound in an instance.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum UpValue {
    /// Plain data, copied.
    Data(Value),
    /// The `leda` module.
    Leda,
    /// A standard library (`string`, `table`...), re-required in the instance.
    Lib(String),
    /// Another Lua function, rebuilt from its source.
    Function(Box<FnSource>),
    /// The function itself (a recursive local function).
    SelfRef,
}

/// The portable form of a Lua function: a chunk that returns it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FnSource {
    /// Lua code: `local <upvalues> = ... <padding> return function ... end`.
    pub chunk: String,
    /// The original chunk name (`@path/to/script.lua`), for error messages.
    pub chunkname: String,
    /// The captured upvalues, in the order of the chunk's `local` declaration.
    pub upvalues: Vec<(String, UpValue)>,
    /// `file:line` where the function is defined.
    pub location: String,
}

/// What the configuring state knows to recognise among upvalues.
pub struct Extractor<'a> {
    /// The configuring state.
    pub lua: &'a Lua,
    /// `debug` library of the configuring state.
    pub debug: Table,
    /// The configuring `leda` table.
    pub leda: Table,
    /// Standard library tables by name.
    pub libs: Vec<(String, Table)>,
    /// Cache of script texts by chunk name.
    pub texts: HashMap<String, std::sync::Arc<str>>,
}

const MAX_NEST: usize = 16;

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Byte offsets where `word` occurs as a whole word in `s`.
fn word_positions(s: &str, word: &str) -> Vec<usize> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = s[from..].find(word) {
        let at = from + p;
        let end = at + word.len();
        let before_ok = at == 0 || !is_word(b[at - 1]);
        let after_ok = end >= b.len() || !is_word(b[end]);
        if before_ok && after_ok {
            out.push(at);
        }
        from = at + 1;
    }
    out
}

/// `function name.x:y(` → `function(` (a named declaration as an expression).
fn strip_name(text: &str) -> (String, bool) {
    let rest = &text["function".len()..];
    let trimmed = rest.trim_start();
    if trimmed.starts_with('(') {
        return (text.to_owned(), false);
    }
    let Some(paren) = trimmed.find('(') else {
        return (text.to_owned(), false);
    };
    let name = &trimmed[..paren];
    let method = name.contains(':');
    let params = &trimmed[paren + 1..];
    if method {
        let sep = if params.trim_start().starts_with(')') {
            ""
        } else {
            ", "
        };
        (format!("function(self{sep}{params}"), true)
    } else {
        (format!("function({params}"), false)
    }
}

impl Extractor<'_> {
    fn text_of(&mut self, source: &str, what: &str) -> Result<std::sync::Arc<str>, SourceError> {
        if let Some(t) = self.texts.get(source) {
            return Ok(t.clone());
        }
        let text: std::sync::Arc<str> = if let Some(path) = source.strip_prefix('@') {
            std::fs::read_to_string(path)
                .map_err(|_| SourceError::NoText {
                    what: what.to_owned(),
                    source_name: path.to_owned(),
                })?
                .into()
        } else if source.starts_with('=') {
            return Err(SourceError::NoText {
                what: what.to_owned(),
                source_name: source.to_owned(),
            });
        } else {
            source.into()
        };
        self.texts.insert(source.to_owned(), text.clone());
        Ok(text)
    }

    /// The portable form of `f`; `what` names it in errors.
    pub fn extract(&mut self, f: &Function, what: &str) -> Result<FnSource, SourceError> {
        self.extract_nested(f, what, 0)
    }

    fn extract_nested(
        &mut self,
        f: &Function,
        what: &str,
        depth: usize,
    ) -> Result<FnSource, SourceError> {
        if depth > MAX_NEST {
            return Err(SourceError::TooDeep {
                what: what.to_owned(),
            });
        }
        let info = f.info();
        let not_lua = || SourceError::NotLua {
            what: what.to_owned(),
        };
        if info.what != "Lua" {
            return Err(not_lua());
        }
        let source = info.source.clone().ok_or_else(not_lua)?;
        let first = info.line_defined.ok_or_else(not_lua)?;
        let last = info.last_line_defined.ok_or_else(not_lua)?;
        let short = info.short_src.clone().unwrap_or_else(|| source.clone());
        let location = format!("{short}:{first}");
        let text = self.text_of(&source, what)?;
        let lines: Vec<&str> = text.lines().collect();
        if first == 0 || last < first || last > lines.len() {
            return Err(SourceError::NotFound {
                what: what.to_owned(),
                location,
            });
        }
        let segment = lines[first - 1..last].join("\n");
        let first_line_len = lines[first - 1].len();
        let last_line_start = segment.len() - lines[last - 1].len();

        // Upvalues, in order; `_ENV` is the instance's own globals.
        let getupvalue: Function = self
            .debug
            .get("getupvalue")
            .map_err(|e| SourceError::Lua(e.to_string()))?;
        let mut upvalues = Vec::new();
        for i in 1..=info.num_upvalues as i64 {
            let (name, value): (Option<String>, mlua::Value) = getupvalue
                .call((f.clone(), i))
                .map_err(|e| SourceError::Lua(e.to_string()))?;
            let Some(name) = name else { continue };
            if name == "_ENV" || name.is_empty() {
                continue;
            }
            let up = self.upvalue(f, &name, &value, what, depth)?;
            upvalues.push((name, up));
        }

        // The function's own parameters, to tell apart functions on one line.
        let getinfo: Function = self
            .debug
            .get("getinfo")
            .map_err(|e| SourceError::Lua(e.to_string()))?;
        let want: Table = getinfo
            .call((f.clone(), "u"))
            .map_err(|e| SourceError::Lua(e.to_string()))?;
        let want_np: i64 = want.get("nparams").unwrap_or(-1);
        let want_va: bool = want.get("isvararg").unwrap_or(false);

        let names: Vec<&str> = upvalues.iter().map(|(n, _)| n.as_str()).collect();
        let self_name = upvalues
            .iter()
            .find(|(_, u)| matches!(u, UpValue::SelfRef))
            .map(|(n, _)| n.clone());
        let decl = if names.is_empty() {
            String::new()
        } else {
            format!("local {} = ... ", names.join(", "))
        };

        let starts: Vec<usize> = word_positions(&segment, "function")
            .into_iter()
            .filter(|&p| p < first_line_len)
            .collect();
        let ends: Vec<usize> = word_positions(&segment, "end")
            .into_iter()
            .filter(|&p| p >= last_line_start)
            .collect();
        let mut candidates: Vec<(String, Function)> = Vec::new();
        for &s in &starts {
            for &e in ends.iter().rev() {
                if e < s {
                    continue;
                }
                let raw = &segment[s..e + 3];
                let (body, _) = strip_name(raw);
                let chunk = match &self_name {
                    // `local f = ...` would shadow: declare the others, then `f` itself.
                    Some(n) => {
                        let others: Vec<&str> = names.iter().copied().filter(|x| x != n).collect();
                        let decl = if others.is_empty() {
                            String::new()
                        } else {
                            format!("local {} = select(2, ...) ", others.join(", "))
                        };
                        format!(
                            "{decl}local {n} {}{n} = {body} return {n}",
                            "\n".repeat(first - 1)
                        )
                    }
                    None => format!("{decl}{}return {body}", "\n".repeat(first - 1)),
                };
                let Ok(loader) = self.lua.load(&chunk).set_name(&source).into_function() else {
                    continue;
                };
                // Check that the candidate is the same function (arity).
                let args = vec![mlua::Value::Nil; names.len()];
                let Ok(cand) = loader.call::<Function>(mlua::MultiValue::from_vec(args)) else {
                    continue;
                };
                let Ok(got) = getinfo.call::<Table>((cand.clone(), "u")) else {
                    continue;
                };
                let np: i64 = got.get("nparams").unwrap_or(-2);
                let va: bool = got.get("isvararg").unwrap_or(false);
                if np == want_np && va == want_va {
                    candidates.push((chunk, cand));
                }
            }
        }
        let chunk = match candidates.len() {
            0 => None,
            1 => candidates.pop().map(|(c, _)| c),
            _ => self.closest(f, candidates),
        };
        match chunk {
            Some(chunk) => Ok(FnSource {
                chunk,
                chunkname: source,
                upvalues,
                location,
            }),
            None => Err(SourceError::NotFound {
                what: what.to_owned(),
                location,
            }),
        }
    }

    /// Of several functions defined on the same lines with the same parameters (`init`
    /// and `handler` on one line, say), the one whose compiled code is `f`'s: the
    /// stripped dumps hold the instructions and constants before the upvalue
    /// descriptors (which differ with the enclosing chunk), so the right candidate
    /// shares the longest prefix with `f`'s dump.
    fn closest(&self, f: &Function, candidates: Vec<(String, Function)>) -> Option<String> {
        let dump = self
            .libs
            .iter()
            .find(|(n, _)| n == "string")
            .and_then(|(_, t)| t.get::<Function>("dump").ok())?;
        let bytes = |g: &Function| -> Option<Vec<u8>> {
            dump.call::<mlua::String>((g.clone(), true))
                .ok()
                .map(|s| s.as_bytes().to_vec())
        };
        let want = bytes(f)?;
        candidates
            .into_iter()
            .filter_map(|(chunk, g)| {
                let got = bytes(&g)?;
                let common = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
                Some((common, chunk))
            })
            .max_by_key(|(common, _)| *common)
            .map(|(_, chunk)| chunk)
    }

    fn upvalue(
        &mut self,
        f: &Function,
        name: &str,
        value: &mlua::Value,
        what: &str,
        depth: usize,
    ) -> Result<UpValue, SourceError> {
        let err = |reason: String| SourceError::Upvalue {
            what: what.to_owned(),
            name: name.to_owned(),
            reason,
        };
        match value {
            mlua::Value::Table(t) => {
                if t.to_pointer() == self.leda.to_pointer() {
                    return Ok(UpValue::Leda);
                }
                if let Some((lib, _)) = self
                    .libs
                    .iter()
                    .find(|(_, l)| l.to_pointer() == t.to_pointer())
                {
                    return Ok(UpValue::Lib(lib.clone()));
                }
                to_value(value, name)
                    .map(UpValue::Data)
                    .map_err(|e| err(e.to_string()))
            }
            mlua::Value::Function(g) => {
                if g.to_pointer() == f.to_pointer() {
                    return Ok(UpValue::SelfRef);
                }
                let inner = format!("{what}, captured function '{name}'");
                self.extract_nested(g, &inner, depth + 1)
                    .map(|s| UpValue::Function(Box::new(s)))
                    .map_err(|e| err(e.to_string()))
            }
            other => to_value(other, name)
                .map(UpValue::Data)
                .map_err(|e| err(e.to_string())),
        }
    }
}

impl FnSource {
    /// Rebuilds the function in an instance state, whose `leda` table is `leda`.
    pub fn instantiate(&self, lua: &Lua, leda: &Table) -> Result<Function, SourceError> {
        let le = |e: mlua::Error| SourceError::Lua(e.to_string());
        let mut args = Vec::with_capacity(self.upvalues.len());
        let mut self_first = false;
        for (_, up) in &self.upvalues {
            let v = match up {
                UpValue::Data(v) => to_lua(lua, v).map_err(|e| SourceError::Lua(e.to_string()))?,
                UpValue::Leda => mlua::Value::Table(leda.clone()),
                UpValue::Lib(name) => {
                    let require: Function = lua.globals().get("require").map_err(le)?;
                    require.call::<mlua::Value>(name.as_str()).map_err(le)?
                }
                UpValue::Function(src) => mlua::Value::Function(src.instantiate(lua, leda)?),
                UpValue::SelfRef => {
                    self_first = true;
                    continue;
                }
            };
            args.push(v);
        }
        if self_first {
            // The chunk reads the other upvalues with `select(2, ...)`.
            args.insert(0, mlua::Value::Nil);
        }
        // Text only: a chunk that arrived from another process is never bytecode.
        let loader = lua
            .load(&self.chunk)
            .set_name(&self.chunkname)
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(le)?;
        loader
            .call::<Function>(mlua::MultiValue::from_vec(args))
            .map_err(le)
    }
}

impl FnSource {
    /// `Some(reason)` if this chunk, or that of a captured function, is precompiled
    /// bytecode rather than source text (a deployment must carry source).
    pub fn binary_chunk(&self) -> Option<String> {
        // Lua and LuaJIT bytecode start with ESC ("\x1bLua", "\x1bLJ").
        if self.chunk.trim_start().starts_with('\x1b') {
            return Some(format!("{} is bytecode, not source text", self.location));
        }
        self.upvalues.iter().find_map(|(_, u)| match u {
            UpValue::Function(f) => f.binary_chunk(),
            _ => None,
        })
    }

    /// A function from the text of a function expression (`function(x) ... end`),
    /// with no upvalues; `chunkname` names it in error messages.
    pub fn from_text(chunkname: &str, text: &str) -> FnSource {
        FnSource {
            chunk: format!("return {text}"),
            chunkname: chunkname.to_owned(),
            upvalues: Vec::new(),
            location: chunkname.trim_start_matches(['=', '@']).to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stripped_from_declarations() {
        assert_eq!(strip_name("function(x) end").0, "function(x) end");
        assert_eq!(strip_name("function do_read(a) end").0, "function(a) end");
        assert_eq!(strip_name("function m.f() end").0, "function() end");
        assert_eq!(strip_name("function o:m(a) end").0, "function(self, a) end");
        assert_eq!(strip_name("function o:m() end").0, "function(self) end");
    }

    #[test]
    fn whole_words_only() {
        assert_eq!(
            word_positions("function functions _function function", "function"),
            vec![0, 29]
        );
        assert_eq!(word_positions("x end) endless end", "end"), vec![2, 15]);
    }
}
