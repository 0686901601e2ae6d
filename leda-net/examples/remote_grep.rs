//! The thesis' grep (Listings 4.4–4.6) across two processes: the printer runs in a
//! daemon, lines and match in the launching process.
//!
//! ```text
//! # terminal 1: a daemon (the same binary, so it knows the stage kinds)
//! cargo run -p leda-net --example remote_grep -- daemon --listen 127.0.0.1:9001
//! # terminal 2: deploy and run; matches are printed by terminal 1
//! cargo run -p leda-net --example remote_grep -- run 127.0.0.1:9001 PATTERN FILE...
//! ```

use std::io::{BufRead, BufReader, Write};

use anyhow::{Context, bail};
use leda_core::prelude::*;
use leda_net::{Daemon, Launcher, Registry};

/// Listing 4.2: one event per line.
fn lines() -> Stage {
    Stage::new("lines", |ev: Event, ctx: &mut Ctx| {
        let name: String = ev.get(0)?;
        for line in BufReader::new(std::fs::File::open(&name)?).lines() {
            ctx.send_or_wait("line", line?)?;
        }
        Ok(())
    })
    .kind("grep.lines")
}

/// Listing 4.3 (substring instead of a Lua pattern).
fn matcher() -> Stage {
    Stage::stateful(
        "match",
        |a: &Attrs| -> Result<String, BoxError> { Ok(a.get_as("pattern")?) },
        |p: &mut String, ev: Event, ctx: &mut Ctx| {
            let line: &str = ev.get(0)?;
            if line.contains(p.as_str()) {
                ctx.send_or_wait("match", line)?;
            }
            Ok(())
        },
    )
    .kind("grep.match")
}

/// Listing 4.1: prints, one line at a time.
fn printer() -> Stage {
    Stage::new("print", |ev: Event, _: &mut Ctx| {
        writeln!(std::io::stdout().lock(), "{ev}")?;
        Ok(())
    })
    .serial()
    .kind("grep.print")
}

fn registry() -> Registry {
    Registry::new()
        .with("grep.lines", |_| Ok(lines()))
        .with("grep.match", |_| Ok(matcher()))
        .with("grep.print", |_| Ok(printer()))
}

/// Errors end the command with one line and status 1 (`leda_core::cli`).
fn main() -> std::process::ExitCode {
    leda_core::cli::init_logging("warn");
    leda_core::cli::exit("remote_grep", run())
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("daemon") => {
            // Listing 4.6: leda.start{...}
            #[derive(clap::Parser)]
            struct DaemonCli {
                #[command(flatten)]
                daemon: leda_net::cli::DaemonArgs,
            }
            let cli = <DaemonCli as clap::Parser>::parse_from(&args);
            let daemon = Daemon::bind(cli.daemon.config(), registry())?;
            leda_core::cli::announce_listening(daemon.local_addr())?;
            daemon.serve(|report| eprintln!("run ended: {:?}", report.run.reason))?;
            Ok(())
        }
        Some("run") if args.len() >= 4 => {
            let (daemon, pattern, files) = (&args[1], &args[2], &args[3..]);
            // Listing 4.4: the graph.
            let (lines, matcher, printer) = (lines(), matcher(), printer());
            let mut g = Graph::new("grep");
            g.connect(&lines, "line", &matcher).local();
            g.connect(&matcher, "match", &printer);
            // Listing 4.5: the printer alone in cluster 1, the rest in cluster 2.
            let cluster1 = Cluster::of([&printer]);
            let cluster2 = g.all() - &cluster1;
            let me = "127.0.0.1:9002";
            g.part([cluster1, cluster2])?.map([daemon.as_str(), me])?;
            matcher.set_attr("pattern", pattern.as_str());
            for f in files {
                lines.push(f.as_str());
            }
            let report = Launcher::new(me)
                .until_idle()
                .run(&g, Run::default())
                .context("running grep across two processes")?;
            eprintln!(
                "done: {} line(s) sent to the printer, {} failed",
                report.transport.sent, report.transport.failed
            );
            Ok(())
        }
        _ => bail!(
            "usage: remote_grep daemon --listen HOST:PORT [--threads N] [--secret S]\n       remote_grep run DAEMON_ADDR PATTERN FILE..."
        ),
    }
}
