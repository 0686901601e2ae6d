#![allow(dead_code)]
//! Helpers shared by the integration tests.

use leda_core::value::Value;
use leda_lua::script::{Mode, Script, ScriptOptions};
use mlua::MultiValue;

/// A configuring state whose runs use 2 threads and end when idle.
pub fn script() -> Script {
    Script::new(ScriptOptions {
        mode: Mode::Run,
        until_idle: true,
        threads: Some(2),
        ..ScriptOptions::default()
    })
    .expect("configuring state")
}

/// Writes `code` to a temporary script file and runs it; returns what the script
/// returns, as values (the configuring state ends with the call).
pub fn run(code: &str) -> Result<Vec<Value>, leda_lua::ScriptError> {
    let s = script();
    let out = run_in(&s, code)?;
    Ok(out
        .iter()
        .enumerate()
        .map(|(i, v)| leda_lua::value::to_value(v, &format!("result {i}")).expect("plain result"))
        .collect())
}

/// A string value.
pub fn st(s: &str) -> Value {
    Value::Str(s.to_owned())
}

/// Runs `code` as a file in `s`.
pub fn run_in(s: &Script, code: &str) -> Result<MultiValue, leda_lua::ScriptError> {
    let dir = tempdir();
    let path = dir.join("script.lua");
    std::fs::write(&path, code).expect("write script");
    s.run_file(&path, &[])
}

/// A fresh temporary directory.
pub fn tempdir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "leda-lua-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}
