//! A Lua stage's code is source text plus copied upvalues: it serializes (msgpack),
//! and a stage rebuilt from it elsewhere runs the same handler.

mod common;

use std::sync::Arc;

use leda_core::prelude::*;
use leda_lua::instance::{StageCode, code_of, stage_from_code};
use leda_lua::script::LuaStage;

#[test]
fn code_travels_as_source_through_msgpack() {
    let s = common::script();
    let out = common::run_in(
        &s,
        r#"
        local offset = 40
        local function add(x) return x + offset end
        return leda.stage "adder" {
          init = function() require 'string' end,
          handler = function(x) leda.send(1, string.format("%d", add(x))) end }
    "#,
    )
    .unwrap();
    let stage = match &out.into_vec()[0] {
        mlua::Value::UserData(ud) => ud.borrow::<LuaStage>().unwrap().0.clone(),
        other => panic!("not a stage: {other:?}"),
    };
    let code = code_of(&stage).expect("a Lua stage has code");
    assert!(code.handler.chunk.contains("string.format"));
    let wire = rmp_serde::to_vec(&*code).unwrap();
    // Never bytecode: Lua bytecode starts with ESC "Lua".
    assert!(!wire.windows(4).any(|w| w == b"\x1bLua"));
    let back: StageCode = rmp_serde::from_slice(&wire).unwrap();

    let remote = stage_from_code("adder-remote", Arc::new(back));
    let sink = Stage::new("sink", |ev: Event, ctx: &mut Ctx| {
        ctx.quit(ev);
        Ok(())
    });
    remote.push(2);
    let mut g = Graph::new("travel");
    g.connect(&remote, 1, &sink);
    let report = g.run(Run::default().threads(2)).unwrap();
    assert_eq!(report.quit.unwrap().get::<String>(0).unwrap(), "42");
}
