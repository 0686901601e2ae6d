//! The Rust stages the `leda` command and every [`Script`](crate::Script) can
//! `require`: the stage library, the bundled applications' stages and the lock
//! service's node and front stages.

use std::sync::Once;

/// Registers every bundled Rust stage under its `require` name (once per process).
pub fn register_bundled() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let groups = [
            leda_stages::catalogue(),
            leda_http::catalogue(),
            leda_image::catalogue(),
            leda_lock_service::catalogue(),
        ];
        for (module, make) in groups.into_iter().flatten() {
            crate::registry::register_stage(module, make);
        }
    });
}

/// The Lua source of a bundled Lua module (e.g. `leda.stage.util.map`), if any.
pub fn lua_module(name: &str) -> Option<&'static str> {
    leda_stages::lua_modules()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| src)
}
