//! The Lua variant: `lua/cep.lua` (the same graph and rules with Lua handlers) run in
//! this process by the leda-lua script engine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use leda_lua::script::{Mode, Script, ScriptOptions};

use crate::app::{DaemonChild, Outcome, Scenario, outcome};

/// The script.
pub const SCRIPT: &str = include_str!("../lua/cep.lua");

/// Runs `lua/cep.lua` on `files` with `threads` processing workers (split equally in
/// scenario 2) and `[persist, filter, correlate]` instances, in `scenario`: the
/// daemons are this program's `lua-daemon`s (leda-lua deployment); returns the
/// outcome (with the stages whose handlers failed) and the wall time.
pub fn run(
    files: &[PathBuf],
    out: &Path,
    window: usize,
    threads: usize,
    instances: [usize; 3],
    scenario: Scenario,
) -> anyhow::Result<(Outcome, Duration)> {
    run_script(files, out, window, threads, instances, Some(scenario))
}

/// The Lua COST baseline: `lua/cep.lua` with scenario `seq` does the same work (same
/// functions, same windows) in the script's own Lua state on one thread, without a
/// graph; returns the outcome and the wall time.
pub fn sequential(
    files: &[PathBuf],
    out: &Path,
    window: usize,
) -> anyhow::Result<(Outcome, Duration)> {
    run_script(files, out, window, 1, [1, 1, 1], None)
}

/// `scenario` `None`: the sequential mode.
fn run_script(
    files: &[PathBuf],
    out: &Path,
    window: usize,
    threads: usize,
    instances: [usize; 3],
    scenario: Option<Scenario>,
) -> anyhow::Result<(Outcome, Duration)> {
    crate::app::check_window(window)?;
    crate::app::clear_outputs(out)?;
    let script_dir = std::env::temp_dir().join(format!("leda-cep-lua-{}", std::process::id()));
    std::fs::create_dir_all(&script_dir)?;
    let path = script_dir.join("cep.lua");
    std::fs::write(&path, SCRIPT)?;
    let (mine, theirs) = match scenario {
        Some(Scenario::Two) => (threads.div_ceil(2), Some((threads / 2).max(1))),
        _ => (threads, None),
    };
    // Scenarios 1 and 2 run across processes: daemons, and this process's identity.
    let remote = matches!(scenario, Some(Scenario::One | Scenario::Two));
    let mut daemons = Vec::new();
    if remote {
        for _ in files {
            daemons.push(DaemonChild::spawn("lua-daemon", 1)?);
        }
        if let Some(t) = theirs {
            daemons.push(DaemonChild::spawn("lua-daemon", t)?);
        }
    }
    // The Lua stages persist windows and alarms to files (`cep.lua`): they need `io`.
    leda_lua::capabilities::allow(leda_lua::capabilities::Capabilities {
        io: true,
        ..Default::default()
    });
    let s = Script::new(ScriptOptions {
        mode: Mode::Run,
        until_idle: true,
        threads: Some(mine),
        process: remote.then(|| "127.0.0.1:1".to_owned()),
        ..ScriptOptions::default()
    })
    .context("creating the Lua state")?;
    let mut args = vec![
        out.to_string_lossy().into_owned(),
        window.to_string(),
        instances[0].to_string(),
        instances[1].to_string(),
        instances[2].to_string(),
        match scenario {
            None => "seq",
            Some(Scenario::Local) => "local",
            Some(Scenario::One) => "1",
            Some(Scenario::Two) => "2",
        }
        .to_owned(),
        if daemons.is_empty() {
            "-".to_owned()
        } else {
            daemons
                .iter()
                .map(|d| d.addr.as_str())
                .collect::<Vec<_>>()
                .join(",")
        },
    ];
    args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
    let start = Instant::now();
    let res = s.run_file(&path, &args);
    let elapsed = start.elapsed();
    let _ = std::fs::remove_dir_all(&script_dir);
    drop(daemons);
    res.context("running lua/cep.lua")?;
    let mut o = outcome(out)?;
    o.failed = s.failures();
    Ok((o, elapsed))
}
