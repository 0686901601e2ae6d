//! The `leda` command: run, check and draw Lua graph scripts, and serve deployments.
//! It bundles, beside the stage library, the Rust stages of the HTTP server, the image
//! pipeline and the lock service, so that scripts can `require` them (the library
//! crate `leda-lua` depends on none of them).
//!
//! * `leda run script.lua [args...]`: runs the script (`arg` as in the thesis); a
//!   graph run by it ends when idle unless `--forever` (or `until_idle=false`);
//! * `leda check script.lua [args...]`: builds the graph, checks `bind`, partition and
//!   mapping, prints a summary, runs nothing;
//! * `leda graph script.lua [args...] --dot`: prints the graph as Graphviz DOT;
//! * `leda run --process ADDR --map FROM=TO`: a graph mapped to several processes is
//!   deployed to the daemons of the other clusters (leda-net);
//! * `leda start --listen ADDR [--threads N] [--secret-file PATH] [--once]`: a daemon
//!   that runs the clusters deployed to it (by default every peer is authenticated
//!   with the per-user cookie file; see `leda_net::auth`);
//! * `run` and `start` take `--dashboard ADDR [--dashboard-token T]`: the live
//!   dashboard (page, `/stats`, `/metrics`, `/graph`, controls; see
//!   `leda_core::dashboard`);
//! * `leda plot stats.jsonl -o out.png`: queue length and throughput per stage over
//!   time, from a statistics file.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use clap::{Parser, Subcommand};
use leda_core::graph::Graph;
use leda_lua::remote::DaemonOptions;
use leda_lua::script::{Mode, Script, ScriptOptions};
use leda_net::Secret;

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
        #[arg(long, value_parser = leda_core::cli::thread_count)]
        threads: Option<usize>,
        /// Keep running when the graph is idle (until leda.quit).
        #[arg(long)]
        forever: bool,
        /// Exit 0 even when handlers failed (a service that must go on); by default a
        /// run in which any event failed ends with a summary and status 1.
        #[arg(long)]
        allow_failures: bool,
        /// This process's address in the graph's mapping (default: graph:run{host=,
        /// port=}, else the one mapped address where no daemon answers).
        #[arg(long, value_name = "HOST:PORT")]
        process: Option<String>,
        /// Rewrite a mapped address (repeatable), e.g. `--map host1:port1=127.0.0.1:9001`.
        #[arg(long = "map", value_name = "FROM=TO", value_parser = parse_alias)]
        aliases: Vec<(String, String)>,
        /// File holding the shared secret of the daemons (mode 0600; default:
        /// LEDA_SECRET, LEDA_SECRET_FILE, else the per-user cookie file).
        #[arg(long = "secret-file", value_name = "PATH", value_parser = secret_file)]
        secret: Option<Secret>,
        /// Let handlers of this process use more than the default libraries: `io`
        /// (files), `os` (the whole os library, C modules), comma-separated.
        #[arg(long, value_name = "io,os", value_parser = leda_lua::capabilities::Capabilities::parse)]
        allow: Option<leda_lua::capabilities::Capabilities>,
        #[command(flatten)]
        dashboard: DashboardArgs,
        /// Mutual TLS to the daemons of a mapped graph (they must speak it too).
        #[command(flatten)]
        tls: leda_net::cli::TlsArgs,
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
    /// Start a daemon that runs the clusters deployed to it (Listing 4.6).
    Start {
        /// Address to listen on (a non-loopback address needs a secret; port 0 picks one).
        #[arg(long, default_value = "127.0.0.1:9999")]
        listen: String,
        /// Worker threads (default: one per CPU).
        #[arg(long, value_parser = leda_core::cli::thread_count)]
        threads: Option<usize>,
        /// Run each deployment under the automatic controller, between MIN and MAX
        /// threads, instead of a fixed pool.
        #[arg(long, value_name = "MIN,MAX", value_parser = leda_core::cli::thread_range,
              conflicts_with = "threads")]
        auto_threads: Option<(usize, usize)>,
        /// File holding the shared secret (mode 0600; default: LEDA_SECRET,
        /// LEDA_SECRET_FILE, else the per-user cookie file); off loopback one must be
        /// configured (not the cookie).
        #[arg(long = "secret-file", value_name = "PATH", value_parser = secret_file)]
        secret: Option<Secret>,
        /// Serve one deployment, then exit (a refused or failed one does not count;
        /// default: wait for the next one).
        #[arg(long)]
        once: bool,
        /// Let deployments use more than the default: `io` (files, in handlers and
        /// library stages), `os` (the whole os library, C modules), `net` (library
        /// stages that listen or connect), comma-separated.
        #[arg(long, value_name = "io,os,net", value_parser = leda_lua::capabilities::Capabilities::parse)]
        allow: Option<leda_lua::capabilities::Capabilities>,
        #[command(flatten)]
        dashboard: DashboardArgs,
        /// Mutual TLS on every link (the launchers must speak it too).
        #[command(flatten)]
        tls: leda_net::cli::TlsArgs,
    },
    /// Chart queue length and throughput per stage over time from a statistics
    /// JSON-lines file (PNG).
    Plot {
        /// The statistics file (one snapshot per line).
        stats: PathBuf,
        /// The PNG to write.
        #[arg(short, long, default_value = "stats.png")]
        output: PathBuf,
    },
}

/// The flags `leda run` itself takes: after the script, they would silently become
/// the script's arguments.
const RUN_FLAGS: &[&str] = &[
    "--threads",
    "--forever",
    "--allow-failures",
    "--process",
    "--map",
    "--secret-file",
    "--allow",
    "--dashboard",
    "--dashboard-token",
    "--tls-cert",
    "--tls-key",
    "--tls-ca",
];

/// The script's arguments: one of `leda run`'s own flags among them is refused (the
/// user meant it for `leda`), unless it comes after a `--`, which is dropped.
fn script_args(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(flag) = args[..end].iter().find(|a| {
        let name = a.split('=').next().unwrap_or(a);
        RUN_FLAGS.contains(&name)
    }) {
        anyhow::bail!(
            "{flag} comes after the script, so it would be the script's argument: put \
             leda's options before the script (or pass it on after `--`)"
        );
    }
    let mut args = args;
    if end < args.len() {
        args.remove(end);
    }
    Ok(args)
}

/// The live dashboard's options (`run` and `start`).
#[derive(clap::Args)]
struct DashboardArgs {
    /// Serve the live dashboard on this address (e.g. 127.0.0.1:8088; port 0 picks
    /// one); any address other than loopback needs --dashboard-token.
    #[arg(long, value_name = "HOST:PORT")]
    dashboard: Option<String>,
    /// Token every dashboard request must carry (`Authorization: Bearer T` or `?token=T`).
    #[arg(long, value_name = "TOKEN", requires = "dashboard")]
    dashboard_token: Option<String>,
}

impl DashboardArgs {
    /// The dashboard to serve, announced on stderr once its address could be bound
    /// (port 0 is resolved here, so that the announced address is the real one; the
    /// run binds it again when it starts).
    fn config(self) -> anyhow::Result<Option<leda_core::dashboard::DashboardConfig>> {
        let Some(asked) = self.dashboard else {
            return Ok(None);
        };
        let addr = std::net::TcpListener::bind(&asked)
            .and_then(|l| l.local_addr())
            .with_context(|| format!("dashboard on {asked}"))?
            .to_string();
        let token = if self.dashboard_token.is_some() {
            "?token=..."
        } else {
            ""
        };
        eprintln!("leda: dashboard on http://{addr}/{token}");
        Ok(Some(leda_core::dashboard::DashboardConfig {
            addr,
            token: self.dashboard_token,
        }))
    }
}

fn parse_alias(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() => Ok((from.into(), to.into())),
        _ => Err(format!("'{s}' is not FROM=TO")),
    }
}

fn load(
    script: &std::path::Path,
    args: &[String],
    options: ScriptOptions,
) -> anyhow::Result<Vec<Graph>> {
    let s = Script::new(options)?;
    s.run_file(script, args)?;
    Ok(s.graphs())
}

fn check_options() -> ScriptOptions {
    ScriptOptions {
        mode: Mode::Check,
        ..ScriptOptions::default()
    }
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

/// `--secret-file PATH`: the secret in that file (refused if short, or readable by
/// other users).
fn secret_file(path: &str) -> Result<Secret, String> {
    Secret::from_file(path).map_err(|e| e.to_string())
}

/// Makes the bundled applications' Rust stages reachable with `require` (in scripts
/// run here and in clusters deployed to this process as a daemon).
fn register_applications() {
    let groups = [
        leda_http::catalogue(),
        leda_image::catalogue(),
        leda_lock_service::catalogue(),
    ];
    leda_lua::registry::register_catalogue(groups.into_iter().flatten());
}

/// Events built on one worker are often freed on another: mimalloc takes such frees
/// without the arena locking glibc's malloc does (`leda run examples/cep/lua/cep.lua`:
/// 12.0–12.2 s → 10.6–10.7 s, docs/lua.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    leda_core::cli::init_logging("warn");
    register_applications();
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Run {
            threads,
            forever,
            allow_failures,
            process,
            aliases,
            secret,
            allow,
            dashboard,
            tls,
            script,
            args,
        } => (|| {
            let args = script_args(args)?;
            leda_lua::capabilities::allow(allow.unwrap_or_default());
            let options = ScriptOptions {
                mode: Mode::Run,
                until_idle: !forever,
                threads,
                process,
                aliases,
                secret,
                dashboard: dashboard.config()?,
                tls: tls.config(),
            };
            let s = Script::new(options)?;
            s.run_file(&script, &args)?;
            let failed = s.failures();
            if !failed.is_empty() && !allow_failures {
                let total: u64 = failed.iter().map(|f| f.count).sum();
                let each: Vec<String> = failed.iter().map(ToString::to_string).collect();
                anyhow::bail!(
                    "{total} event(s) failed: {} (each logged above; --allow-failures exits 0)",
                    each.join(", ")
                );
            }
            Ok(())
        })(),
        Command::Check { script, args } => {
            load(&script, &args, check_options()).and_then(|graphs| {
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
        } => load(&script, &args, check_options()).and_then(|graphs| {
            if graphs.is_empty() {
                anyhow::bail!(
                    "{}: the script neither runs nor returns a graph",
                    script.display()
                );
            }
            for g in &graphs {
                let dot = g.to_dot();
                if dot.ends_with('\n') {
                    print!("{dot}");
                } else {
                    println!("{dot}");
                }
            }
            Ok(())
        }),
        Command::Start {
            listen,
            threads,
            auto_threads,
            secret,
            once,
            allow,
            dashboard,
            tls,
        } => (|| {
            leda_lua::capabilities::allow(allow.unwrap_or_default());
            let options = DaemonOptions {
                listen,
                threads,
                secret,
                dashboard: dashboard.config()?,
                maxpar: None,
                auto_threads,
                tls: tls.config(),
            };
            leda_lua::remote::serve(&options, !once, |addr| {
                if let Err(e) = leda_core::cli::announce_listening(addr) {
                    tracing::warn!("stdout: {e}");
                }
            })?;
            Ok(())
        })(),
        Command::Plot { stats, output } => leda_core::chart::plot_jsonl(&stats, &output)
            .map(|()| eprintln!("leda: wrote {}", output.display()))
            .map_err(anyhow::Error::from),
    };
    leda_core::cli::exit("leda", result)
}
