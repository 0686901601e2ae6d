//! # leda-lua
//!
//! Lua for Leda-RS (mlua, vendored Lua 5.4): graph scripts written with the thesis'
//! API and Lua stage handlers running one private Lua state per instance. The `leda`
//! command is the `leda-cli` crate, which also bundles the applications' stages; this
//! library depends on nothing above `leda-core`, `leda-net` and `leda-stages`.
//!
//! Module map:
//! * [`value`]: Lua values ⇄ [`leda_core::value::Value`];
//! * [`source`]: how handler and `init` functions travel to instances (source text);
//! * [`script`]: the configuring state and the `leda.*` graph API;
//! * [`instance`]: one instance: its Lua state and the handler coroutine;
//! * [`api`]: `leda.send/sleep/nice/quit/gettime/flush` inside handlers;
//! * [`capabilities`]: what handler code may do (libraries, opt-ins);
//! * [`registry`]: Rust stages reachable with `require`;
//! * [`remote`]: graphs across processes (leda-net): daemons, deployment;
//! * [`error`]: typed errors.
//!
//! # Semantics
//!
//! * One Lua state per instance, opened with the base library (with `coroutine`, as in
//!   Lua 5.1), `package` and the leda API only; `io`, `os`, `string`, `table`, `math`
//!   (and `utf8`) come with `require`. `init` runs once per instance.
//! * Transient instances are recycled, as in the original Leda: globals a handler
//!   leaves behind may be seen by a later event on the same instance (no reset per
//!   event; a reset would cost a state or an `init` per event).
//! * Events are converted to [`leda_core::value::Value`] on every connector (see
//!   [`value`]); a value that cannot be converted (function, coroutine, userdata
//!   without `__persist`, cyclic table) makes `leda.send` return `nil` and a reason
//!   naming the stage, the port and the argument.
//! * Handler and `init` code travel as source text and are compiled in text mode
//!   only ([`source`], [`remote`]).
//!
//! # Backend: Lua 5.4, LuaJIT behind the `luajit` feature
//!
//! Measured with `cargo bench -p leda-lua --bench lua` on both backends (figures in
//! the README): LuaJIT runs the CPU-bound Listing B.1 page about 4× faster, moves
//! events through a Lua pipeline at nearly the same rate (3–20 % faster: the runtime
//! and the value conversion dominate), and creates instances 1.5–2.3× slower. Lua 5.4 is the
//! default because its integer subtype keeps 64-bit integers and the integer/float
//! distinction across Rust stages and msgpack, which LuaJIT (Lua 5.1 numbers) cannot.
//! To build on LuaJIT: `cargo build -p leda-lua --no-default-features --features luajit`
//! (the crate's `lua54`/`luajit` features pick mlua's backend; a workspace-wide build is
//! Lua 5.4).
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
pub mod capabilities;
pub mod error;
pub mod instance;
mod interrupt;
pub mod library;
pub mod registry;
pub mod remote;
pub mod script;
pub mod source;
pub mod value;

pub use error::{LuaStageError, ScriptError};
/// The Lua binding this crate is built on, for crates that need a Lua state of their own.
pub use mlua;
pub use script::{Mode, Script, ScriptOptions, StageFailures};
