//! The stage library hook: Rust stages registered under a module name are reachable
//! from scripts with `require` (e.g. `require 'leda.stage.util.timer'`), and a daemon
//! builds them for a deployment when it allows what they need
//! ([`crate::capabilities`]).
//!
//! ```
//! use leda_core::prelude::*;
//! use leda_lua::capabilities::Capabilities;
//! leda_lua::registry::register_stage("leda.stage.test.nop", Capabilities::default(), || {
//!     Stage::new("nop", |_: Event, _: &mut Ctx| Ok(()))
//! });
//! assert!(leda_lua::registry::is_registered("leda.stage.test.nop"));
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use leda_core::stage::Stage;

use crate::capabilities::Capabilities;

type Maker = Arc<dyn Fn() -> Stage + Send + Sync>;

fn registry() -> &'static Mutex<HashMap<String, (Capabilities, Maker)>> {
    static R: OnceLock<Mutex<HashMap<String, (Capabilities, Maker)>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Registers a Rust stage under a `require` name. Each configuring script that
/// requires it gets a fresh stage (cached per script, like a Lua module); the stage's
/// kind is set to `module` so another process can rebuild it. `needs` is what the
/// stage does beyond computing (`io`: files, `net`: sockets): a daemon builds it for a
/// deployment only when it allows that much.
pub fn register_stage(
    module: &str,
    needs: Capabilities,
    make: impl Fn() -> Stage + Send + Sync + 'static,
) {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(module.to_owned(), (needs, Arc::new(make)));
}

/// Registers a catalogue's stages: `(module, needs, make)`, `needs` as `--allow` lists
/// it (`""`, `"io"`, `"io,net"`).
///
/// # Panics
///
/// If a `needs` list names an unknown capability (a mistake in the catalogue).
pub fn register_catalogue(
    entries: impl IntoIterator<Item = (&'static str, &'static str, fn() -> Stage)>,
) {
    for (module, needs, make) in entries {
        let needs =
            Capabilities::parse(needs).unwrap_or_else(|e| panic!("catalogue entry {module}: {e}"));
        register_stage(module, needs, make);
    }
}

/// What the stage registered as `module` needs, if it is registered.
pub fn needs(module: &str) -> Option<Capabilities> {
    registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(module)
        .map(|(n, _)| *n)
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
        .map(|(_, m)| m.clone())?;
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
