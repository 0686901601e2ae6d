//! # leda-lua
//!
//! Lua for Leda-RS (mlua, Lua 5.4, vendored): graph scripts written with the thesis'
//! API, Lua stage handlers running one private Lua state per instance, and the
//! `leda` command.
//!
//! Module map:
//! * [`value`]: Lua values ⇄ [`leda_core::value::Value`];
//! * [`source`]: how handler and `init` functions travel to instances (source text);
//! * [`script`]: the configuring state and the `leda.*` graph API;
//! * [`instance`]: one instance: its Lua state and the handler coroutine;
//! * [`api`]: `leda.send/sleep/nice/quit/gettime` inside handlers;
//! * [`registry`]: Rust stages reachable with `require`;
//! * [`error`]: typed errors.
//!
//! ```
//! use leda_lua::script::{Script, ScriptOptions};
//!
//! let script = Script::new(ScriptOptions::default()).unwrap();
//! let out = script
//!     .run_str(
//!         "local double = leda.stage{ handler = function(x) leda.send(1, 2 * x) end }
//!          local sum = leda.stage{ handler = function(x) leda.quit(x) end, serial = true }
//!          double:push(21)
//!          return leda.graph{ double:connect(sum) }:run()",
//!         "=doc",
//!     )
//!     .unwrap();
//! assert_eq!(out.into_vec()[0].as_i64(), Some(42));
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod error;
pub mod instance;
pub mod library;
pub mod registry;
pub mod script;
pub mod source;
pub mod value;

pub use error::{LuaStageError, ScriptError};
/// The Lua binding this crate is built on, for crates that need a Lua state of their own.
pub use mlua;
pub use script::{Mode, Script, ScriptOptions};
