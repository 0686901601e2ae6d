//! The `leda` command: run, check and draw Lua graph scripts.
//!
//! * `leda run script.lua [args...]`: runs the script (`arg` as in the thesis); a
//!   graph run by it ends when idle unless `--forever` (or `until_idle=false`);
//! * `leda check script.lua [args...]`: builds the graph, checks `bind`, partition and
//!   mapping, prints a summary, runs nothing;
//! * `leda graph script.lua [args...] --dot`: prints the graph as Graphviz DOT;
//! * `leda start --listen ADDR`: a daemon (needs leda-net).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leda_core::graph::Graph;
use leda_lua::script::{Mode, Script, ScriptOptions};

#[derive(Parser)]
#[command(
    name = "leda",
    version,
    about = "Leda-RS: staged event-driven programs in Lua"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Lua script (the graph runs in this process).
    Run {
        /// Worker threads when the script names no controller.
        #[arg(long)]
        threads: Option<usize>,
        /// Keep running when the graph is idle (until leda.quit).
        #[arg(long)]
        forever: bool,
        /// The script.
        script: PathBuf,
        /// Arguments (`arg[1]`, `arg[2]`...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check a script's graph, partition and mapping without running it.
    Check {
        /// The script.
        script: PathBuf,
        /// Arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print a script's graph.
    Graph {
        /// Print Graphviz DOT (the only format).
        #[arg(long)]
        dot: bool,
        /// The script.
        script: PathBuf,
        /// Arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Start a daemon that waits for a cluster (needs leda-net).
    Start {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9999")]
        listen: String,
        /// Worker threads.
        #[arg(long)]
        threads: Option<usize>,
        /// Shared secret for non-loopback peers.
        #[arg(long)]
        secret: Option<String>,
    },
}

fn load(
    mode: Mode,
    script: &std::path::Path,
    args: &[String],
    until_idle: bool,
    threads: Option<usize>,
) -> anyhow::Result<Vec<Graph>> {
    let s = Script::new(ScriptOptions {
        mode,
        until_idle,
        threads,
    })?;
    s.run_file(script, args)?;
    Ok(s.graphs())
}

fn summary(g: &Graph) -> anyhow::Result<String> {
    g.verify()?;
    let mut out = format!(
        "graph '{}': {} stage(s), {} connector(s)\n",
        g.name(),
        g.stages().len(),
        g.connectors().len()
    );
    for c in g.connectors() {
        out += &format!(
            "  {}.{} -> {} ({})\n",
            c.from.name(),
            c.port,
            c.to.name(),
            c.kind
        );
    }
    match g.partition() {
        None => out += "  one cluster (all stages), this process\n",
        Some(parts) => {
            for (i, c) in parts.iter().enumerate() {
                let at = g
                    .mapping()
                    .and_then(|m| m.get(i))
                    .map(|p| p.0.join(", "))
                    .unwrap_or_else(|| "unmapped".into());
                out += &format!("  cluster {} {} @ {}\n", i + 1, c, at);
            }
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Run {
            threads,
            forever,
            script,
            args,
        } => load(Mode::Run, &script, &args, !forever, threads).map(|_| ()),
        Command::Check { script, args } => {
            load(Mode::Check, &script, &args, false, None).and_then(|graphs| {
                if graphs.is_empty() {
                    anyhow::bail!(
                        "{}: the script neither runs nor returns a graph",
                        script.display()
                    );
                }
                for g in &graphs {
                    print!("{}", summary(g)?);
                }
                println!("ok");
                Ok(())
            })
        }
        Command::Graph {
            dot: _,
            script,
            args,
        } => load(Mode::Check, &script, &args, false, None).and_then(|graphs| {
            if graphs.is_empty() {
                anyhow::bail!(
                    "{}: the script neither runs nor returns a graph",
                    script.display()
                );
            }
            for g in &graphs {
                print!("{}", g.to_dot());
            }
            Ok(())
        }),
        Command::Start { listen, .. } => Err(anyhow::anyhow!(
            "leda start --listen {listen}: needs leda-net (the network runtime), which this build does not include yet"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leda: {e}");
            ExitCode::FAILURE
        }
    }
}
