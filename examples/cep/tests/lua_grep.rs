//! The Lua grep's stages (`examples/lua/grep/stage`, the thesis' Listings 4.2 and 4.3)
//! on a producer faster than its consumers: every line is searched and every match
//! delivered (a review, 2026-11-27: with the listing's `assert(leda.send(...))` the first
//! full queue failed `lines` and the rest of the file was never read). The grep's own
//! command-line tests are leda-cli's (`tests/cli.rs`); this one needs a small queue
//! and a slow consumer, which it builds around the two stage files.

use std::path::PathBuf;

use leda_lua::script::{Mode, Script, ScriptOptions};

/// `lines` and `match` as the grep has them, `match`'s queue 4 events long, and a
/// serial sink that appends each match to a file (slower than `lines` reads).
const WRAPPER: &str = r#"
require "leda"
local lines = require "stage.lines"
local matcher = require "stage.match"
local out = arg[3]
local sink = leda.stage "sink" {
  init = function()
    require 'io'
    file = assert(io.open(out, 'a'))
  end,
  handler = function(m)
    file:write(m, '\n')
    file:flush()
  end,
  serial = true,
  capacity = 4,
}
matcher.pattern = arg[1]
matcher.capacity = 4
lines:push(arg[2])
leda.graph {
  leda.connect(lines, "line", matcher, "local"),
  leda.connect(matcher, "match", sink),
}:run()
"#;

#[test]
fn the_lua_grep_loses_no_line_to_a_full_queue() {
    let dir = std::env::temp_dir().join(format!("leda-cep-lua-grep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("stage")).unwrap();
    let grep = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lua/grep/stage");
    for f in ["lines.lua", "match.lua"] {
        std::fs::copy(grep.join(f), dir.join("stage").join(f)).unwrap();
    }
    let script = dir.join("wrapper.lua");
    std::fs::write(&script, WRAPPER).unwrap();
    let input = dir.join("nums.txt");
    let n = 20_000;
    let text: String = (1..=n).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = dir.join("matches.txt");

    leda_lua::capabilities::allow(leda_lua::capabilities::Capabilities {
        io: true,
        ..Default::default()
    });
    let s = Script::new(ScriptOptions {
        mode: Mode::Run,
        until_idle: true,
        threads: Some(2),
        ..ScriptOptions::default()
    })
    .unwrap();
    let args: Vec<String> = ["(%d+)", input.to_str().unwrap(), out.to_str().unwrap()]
        .map(str::to_owned)
        .to_vec();
    s.run_file(&script, &args).unwrap();
    let failures: Vec<String> = s.failures().iter().map(ToString::to_string).collect();
    assert!(failures.is_empty(), "failed: {failures:?}");
    let got = std::fs::read_to_string(&out).unwrap();
    let mut got: Vec<u32> = got.lines().map(|l| l.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        (1..=n).collect::<Vec<u32>>(),
        "every line's match, once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
