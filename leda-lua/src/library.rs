//! The Rust stages every [`Script`](crate::Script) can `require`: the stage library
//! (`leda-stages`). A program that bundles more (the `leda` command adds the HTTP
//! server's, the image pipeline's and the lock service's) registers them with
//! [`crate::registry::register_stage`] before running scripts: this crate depends on
//! nothing above `leda-core`, `leda-net` and `leda-stages`.

use std::sync::Once;

/// Registers the stage library's Rust stages under their `require` names (once per
/// process).
pub fn register_bundled() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        crate::registry::register_catalogue(leda_stages::catalogue());
    });
}

/// The Lua source of a bundled Lua module (e.g. `leda.stage.util.map`), if any.
pub fn lua_module(name: &str) -> Option<&'static str> {
    leda_stages::lua_modules()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| src)
}
