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
                  tostring(string.dump), tostring(f == nil), (tostring(why_bin):match("binary") or tostring(why_bin):match("wrong mode")) and "binary refused" or tostring(why_bin),
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
    // The loader of `os` called directly (not through `require`) left the whole library in
    // the registry's table of loaded modules, where `require` found it.
    let got = in_handler(
        "local direct = package.preload.os()
         local loaded = package.loaded.os
         local required = require 'os'
         leda.quit(tostring(direct.execute), tostring(loaded and loaded.execute), tostring(required.execute),
                   tostring(required.time ~= nil))",
    );
    assert_eq!(
        got,
        vec![st("nil"), st("nil"), st("nil"), st("true")],
        "{got:?}"
    );
    // A chunk loaded with an explicit nil environment sees no globals; `unpack` over the
    // whole integer range is refused (its length overflowed, and it pushed 2^64 nils); a
    // state past its memory limit fails the allocation, not the process (Lua 5.4: LuaJIT
    // keeps its own allocator, and has neither `math.mininteger` nor `<<`).
    #[cfg(not(feature = "luajit"))]
    let got = in_handler(
        "require 'math'; require 'string'
         local f = load('return print', 'x', 't', nil)
         local ok_env = pcall(f)
         local ok_unpack, why_unpack = pcall(unpack, {}, math.mininteger, math.maxinteger)
         local ok_mem, why_mem = pcall(string.rep, 'x', 1 << 30)
         leda.quit(tostring(ok_env), tostring(ok_unpack), tostring(why_unpack):match('too many') or why_unpack,
                   tostring(ok_mem), tostring(why_mem))",
    );
    #[cfg(not(feature = "luajit"))]
    assert_eq!(
        got,
        vec![
            st("false"),
            st("false"),
            st("too many"),
            st("false"),
            st("not enough memory")
        ],
        "{got:?}"
    );
    // Modules from files: none without `io` (the file searcher read any file named by
    // `package.path`, and ran bytecode); with it, source text only.
    let dir = common::tempdir();
    let modules = format!(
        r#"
        local dir = '{dir}'
        local f = io.open(dir .. '/textmod.lua', 'w'); f:write('return "text module"'); f:close()
        f = io.open(dir .. '/binmod.lua', 'wb')
        f:write(string.dump(function() return "bytecode module" end)); f:close()
        local s = leda.stage{{ handler = function()
            package.path = dir .. '/?.lua'
            local ok_text, text = pcall(require, 'textmod')
            local ok_bin, bin = pcall(require, 'binmod')
            leda.quit(tostring(ok_text), tostring(text), tostring(ok_bin), tostring(bin),
                      tostring(package.searchpath))
        end, autostart = true }}
        return leda.graph{{ s }}:run()
        "#,
        dir = dir.display()
    );
    let got = run(&modules).expect("run");
    assert_eq!(got[0], st("false"), "{got:?}");
    assert!(got[1].to_string().contains("may not read files"), "{got:?}");
    assert_eq!(got[2], st("false"), "{got:?}");
    assert_eq!(got[4], st("nil"), "{got:?}");

    allow(Capabilities::parse("io").unwrap());
    let got = run(&modules).expect("run");
    allow(Capabilities::default());
    assert_eq!(got[..2], [st("true"), st("text module")], "{got:?}");
    assert_eq!(got[2], st("false"), "{got:?}");
    // (Lua 5.4 says "binary", LuaJIT "wrong mode".)
    let why = got[3].to_string();
    assert!(
        why.contains("binary") || why.contains("wrong mode"),
        "{got:?}"
    );

    // The shared metatables of strings and files are not handed out (a `__close` or
    // `__gc` put there ran with hooks off, where the end of a run cannot stop it).
    let got = in_handler("require 'string'; leda.quit(tostring(getmetatable('')), ('ab'):rep(2))");
    assert_eq!(got, vec![st("false"), st("abab")], "{got:?}");

    allow(Capabilities::parse("io,os").unwrap());
    let got = in_handler(
        "require 'os'; local io = require 'io'
         leda.quit(type(io.open), type(os.execute), type(package.loadlib), type(dofile),
                   tostring(getmetatable(io.stdout)))",
    );
    allow(Capabilities::default());
    assert_eq!(
        got,
        vec![
            st("function"),
            st("function"),
            st("function"),
            st("function"),
            st("false")
        ],
        "{got:?}"
    );
}
