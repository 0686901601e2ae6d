//! The stage library hook: Rust stages registered under a module name are reachable
//! from scripts with `require` (e.g. `require 'leda.stage.util.timer'`).
//!
//! ```
//! use leda_core::prelude::*;
//! leda_lua::registry::register_stage("leda.stage.test.nop", || {
//!     Stage::new("nop", |_: Event, _: &mut Ctx| Ok(()))
//! });
//! assert!(leda_lua::registry::is_registered("leda.stage.test.nop"));
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use leda_core::stage::Stage;

type Maker = Arc<dyn Fn() -> Stage + Send + Sync>;

fn registry() -> &'static Mutex<HashMap<String, Maker>> {
    static R: OnceLock<Mutex<HashMap<String, Maker>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Registers a Rust stage under a `require` name. Each configuring script that
/// requires it gets a fresh stage (cached per script, like a Lua module); the stage's
/// kind is set to `module` so another process can rebuild it.
pub fn register_stage(module: &str, make: impl Fn() -> Stage + Send + Sync + 'static) {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(module.to_owned(), Arc::new(make));
}

/// `true` if `module` names a registered stage.
pub fn is_registered(module: &str) -> bool {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(module)
}

/// A fresh stage for `module`, if registered.
pub fn make_stage(module: &str) -> Option<Stage> {
    let maker = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(module)
        .cloned()?;
    Some(maker().kind(module))
}

/// The registered module names, sorted.
pub fn registered() -> Vec<String> {
    let mut v: Vec<String> = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    v.sort();
    v
}
