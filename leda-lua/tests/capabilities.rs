//! What handler code may do (`leda_lua::capabilities`): by default no files, a safe
//! part of `os`, no C modules, no bytecode in or out; `allow` grants `io` and `os`.
//! One test: the grant is process-wide.

mod common;

use common::{run, st};
use leda_lua::capabilities::{Capabilities, allow};

/// Runs `body` as a handler and returns what it quits with.
fn in_handler(body: &str) -> Vec<leda_core::value::Value> {
    run(&format!(
        "local s = leda.stage{{ handler = function() {body} end, autostart = true }}
         return leda.graph{{ s }}:run()"
    ))
    .expect("run")
}

#[test]
fn handlers_get_the_default_set_unless_allowed() {
    let probe = r#"
        require 'string'; require 'os'
        local ok_io, why_io = pcall(require, 'io')
        local bin = "\27Lua" .. string.rep("x", 32)
        local f, why_bin = load(bin)
        leda.quit(tostring(ok_io), tostring(why_io):match("allow io") and "says how" or tostring(why_io),
                  tostring(string.dump), tostring(f == nil), tostring(why_bin):match("binary") and "binary refused" or tostring(why_bin),
                  tostring(os.execute), type(os.time()), tostring(package.loadlib), tostring(dofile),
                  load("return 40 + 2")())
    "#;
    let got = in_handler(probe);
    assert_eq!(
        got,
        vec![
            st("false"),
            st("says how"),
            st("nil"),
            st("true"),
            st("binary refused"),
            st("nil"),
            st("number"),
            st("nil"),
            st("nil"),
            leda_core::value::Value::Int(42),
        ],
        "{got:?}"
    );
    allow(Capabilities::parse("io,os").unwrap());
    let got = in_handler(
        "require 'os'; local io = require 'io'
         leda.quit(type(io.open), type(os.execute), type(package.loadlib), type(dofile))",
    );
    allow(Capabilities::default());
    assert_eq!(
        got,
        vec![
            st("function"),
            st("function"),
            st("function"),
            st("function")
        ],
        "{got:?}"
    );
}
