//! `leda-image`: the image pipeline in one, two or three processes.
//!
//! ```text
//! leda-image generate --output samples --count 50 --resolution 1m
//! leda-image --input samples --output out --layout 1 --threads 2
//! leda-image baseline seq|rayon --input samples --output out-seq
//! leda-image daemon --listen 127.0.0.1:0        (started by layouts 2 and 3)
//! leda-image chart --stats out/stats.jsonl --output out/pipeline.png
//! ```
//!
//! Exit status: 0 when every image was processed, 2 when some failed (each has an
//! error line and the run went on), 1 when the run could not be done at all.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use leda_image::baseline::{self, Baseline};
use leda_image::generate::{GenOptions, Resolution, generate};
use leda_image::pipeline::{self, Layout, RunOptions};
use leda_image::report::Summary;
use leda_image::steps::Params;

#[derive(Parser)]
#[command(
    name = "leda-image",
    version,
    about = "Leda-RS image pipeline: decode, denoise, colour, scale, encode, write",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct FilterArgs {
    /// Denoise threshold: a channel value farther than this from its 3x3 median is replaced.
    #[arg(long, default_value_t = Params::default().threshold)]
    threshold: u8,
    /// Colour: fraction clipped at each end of each channel's histogram.
    #[arg(long, default_value_t = Params::default().clip)]
    clip: f64,
    /// JPEG quality of the outputs (1-100).
    #[arg(long, default_value_t = Params::default().quality, value_parser = clap::value_parser!(u8).range(1..=100))]
    quality: u8,
    /// Inputs with more pixels than this fail (decompression bombs; memory per image
    /// in flight is about 7 bytes per pixel).
    #[arg(long, default_value_t = Params::default().max_pixels, value_parser = clap::value_parser!(u64).range(1..))]
    max_pixels: u64,
}

impl FilterArgs {
    fn params(&self) -> anyhow::Result<Params> {
        anyhow::ensure!(
            (0.0..=0.49).contains(&self.clip),
            "--clip {} is outside [0, 0.49]",
            self.clip
        );
        Ok(Params {
            threshold: self.threshold,
            clip: self.clip,
            quality: self.quality,
            max_pixels: self.max_pixels,
        })
    }
}

#[derive(Args)]
struct RunArgs {
    /// Directory of input JPEGs: its regular files, in name order. Outputs are named
    /// after the stem: a file whose stem an earlier one has fails (as do a name that
    /// is not UTF-8 and a link to no file).
    #[arg(long)]
    input: Option<PathBuf>,
    /// Output directory (OUTPUT/STEM.jpg; half-size copies go to OUTPUT/half).
    #[arg(long)]
    output: Option<PathBuf>,
    /// 1: one process; 2: two processes; 3: three processes (daemons on 127.0.0.1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    layout: u8,
    /// Worker threads per process (default: one per CPU).
    #[arg(long, value_parser = leda_core::cli::thread_count)]
    threads: Option<usize>,
    /// Images in flight at most, 1 or more (default: threads in layout 1, else
    /// threads x processes + 2).
    #[arg(long, value_parser = window)]
    window: Option<usize>,
    /// Hide the progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Statistics file, JSON lines (default OUTPUT/stats.jsonl).
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Statistics period in milliseconds.
    #[arg(long, default_value_t = 100)]
    stats_ms: u64,
    /// PNG chart of queue lengths and throughput (default OUTPUT/pipeline.png).
    #[arg(long)]
    chart: Option<PathBuf>,
    #[command(flatten)]
    filters: FilterArgs,
}

/// `--window`: 1 or more.
fn window(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 would put every image in flight at once: give 1 or more".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum BaselineKind {
    /// Single-threaded loop.
    Seq,
    /// rayon par_iter over images.
    Rayon,
}

#[derive(Subcommand)]
enum Command {
    /// Write seeded synthetic photo-like JPEGs.
    Generate {
        /// Directory to write into.
        #[arg(long)]
        output: PathBuf,
        /// Number of images.
        #[arg(long, default_value_t = 500)]
        count: usize,
        /// 260k, 1m, 8m or WIDTHxHEIGHT.
        #[arg(long, default_value = "1m")]
        resolution: String,
        /// Seed (same seed, same files).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Fraction of pixels hit by salt-and-pepper noise.
        #[arg(long, default_value_t = 0.01)]
        noise: f64,
    },
    /// Run a benchmark peer with the same filter code.
    Baseline {
        /// seq or rayon.
        kind: BaselineKind,
        /// Directory of input JPEGs.
        #[arg(long)]
        input: PathBuf,
        /// Output directory.
        #[arg(long)]
        output: PathBuf,
        /// rayon threads (default: one per CPU).
        #[arg(long, value_parser = leda_core::cli::thread_count)]
        threads: Option<usize>,
        #[command(flatten)]
        filters: FilterArgs,
    },
    /// Serve as a daemon for layouts 2 and 3 (prints `LISTENING ADDR`).
    Daemon(leda_net::cli::DaemonArgs),
    /// Draw the chart of a statistics file.
    Chart {
        /// JSON-lines statistics.
        #[arg(long)]
        stats: PathBuf,
        /// PNG to write.
        #[arg(long)]
        output: PathBuf,
    },
}

/// Prints a line on stdout, ignoring a closed pipe (`leda-image ... | head -1`).
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

fn print_summary(s: &Summary, what: &str) {
    out!("{what}: {s}");
}

fn status(s: &Summary) -> ExitCode {
    if s.failed > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_pipeline(a: RunArgs) -> anyhow::Result<ExitCode> {
    let input = a.input.context("--input DIR is required")?;
    let output = a.output.context("--output DIR is required")?;
    let layout = Layout::from_number(a.layout)?;
    let threads = a.threads.unwrap_or_else(num_cpus::get).max(1);
    let stats = a.stats.unwrap_or_else(|| output.join("stats.jsonl"));
    let chart = a.chart.unwrap_or_else(|| output.join("pipeline.png"));
    let opts = RunOptions {
        input: input.clone(),
        output: output.clone(),
        layout,
        threads,
        params: a.filters.params()?,
        window: a.window,
        progress: !a.no_progress,
        stats: Some((stats.clone(), Duration::from_millis(a.stats_ms.max(10)))),
        daemon_exe: std::env::current_exe().context("locating this executable")?,
    };
    let out = pipeline::run(&opts)
        .with_context(|| format!("processing {} into {}", input.display(), output.display()))?;
    let mut s = out.summary;
    s.seconds = out.elapsed.as_secs_f64();
    print_summary(
        &s,
        &format!(
            "layout {} ({} process(es), {threads} thread(s) each)",
            a.layout,
            layout.processes()
        ),
    );
    if out.remote_events > 0 {
        out!("events sent to other processes: {}", out.remote_events);
    }
    match leda_core::chart::plot_jsonl(&stats, &chart) {
        Ok(()) => out!("chart: {}", chart.display()),
        Err(e) => eprintln!("leda-image: no chart: {e}"),
    }
    Ok(status(&s))
}

fn daemon(args: leda_net::cli::DaemonArgs) -> anyhow::Result<ExitCode> {
    let d = leda_net::Daemon::bind(args.config(), leda_image::stages::registry())?;
    leda_core::cli::announce_listening(d.local_addr())?;
    d.serve(|report| {
        // The launcher may have closed our stdout already: ignore a failed write.
        let _ = writeln!(std::io::stdout(), "ENDED {:?}", report.run.reason);
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Keeps freed image buffers in the heap: with glibc's defaults every multi-megabyte
/// buffer is a fresh `mmap` (or a trimmed heap top), so each image pays its page
/// faults again. Applies to every mode of this binary (pipeline and baselines alike).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn main() -> ExitCode {
    tune_allocator();
    leda_core::cli::init_logging("warn");
    let cli = Cli::parse();
    let result = match cli.command {
        None => run_pipeline(cli.run),
        Some(Command::Generate {
            output,
            count,
            resolution,
            seed,
            noise,
        }) => (|| {
            let resolution: Resolution = resolution.parse()?;
            let opts = GenOptions {
                count,
                resolution,
                seed,
                noise,
                ..GenOptions::default()
            };
            let t = std::time::Instant::now();
            let files = generate(&output, &opts)?;
            let (w, h) = resolution.size();
            out!(
                "generated {} image(s) of {w}x{h} in {} ({:.1} s)",
                files.len(),
                output.display(),
                t.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        })(),
        Some(Command::Baseline {
            kind,
            input,
            output,
            threads,
            filters,
        }) => (|| {
            let how = match kind {
                BaselineKind::Seq => Baseline::Seq,
                BaselineKind::Rayon => Baseline::Rayon(threads.unwrap_or_else(num_cpus::get)),
            };
            let s = baseline::run(&input, &output, &filters.params()?, how)?;
            for e in &s.errors {
                eprintln!("error: {e}");
            }
            print_summary(
                &s,
                match kind {
                    BaselineKind::Seq => "seq",
                    BaselineKind::Rayon => "rayon",
                },
            );
            Ok(status(&s))
        })(),
        Some(Command::Daemon(args)) => daemon(args),
        Some(Command::Chart { stats, output }) => leda_core::chart::plot_jsonl(&stats, &output)
            .map(|()| {
                out!("chart: {}", output.display());
                ExitCode::SUCCESS
            })
            .map_err(Into::into),
    };
    leda_core::cli::exit_code("leda-image", result)
}
