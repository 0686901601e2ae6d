//! # leda-image
//!
//! The thesis' image-processing pipeline (§14.1) on Leda-RS: `decode → denoise →
//! color → scale → encode → write`, one graph run in one, two or three processes by
//! partition and map only.
//!
//! Module map:
//!
//! * [`filters`]: the selective median, the histogram stretch and the half-size copy,
//!   plain functions over RGB8 buffers shared by the stages and the baselines;
//! * [`codec`], [`steps`]: JPEG in and out, and the per-image steps;
//! * [`message`]: the events images travel in (`bytes::Bytes`, no copy in a process);
//! * [`stages`], [`report`]: the Leda stages and the progress/summary sink;
//! * [`pipeline`]: the graph, the three layouts, daemons and the run;
//! * [`generate`]: the seeded synthetic workload;
//! * [`baseline`]: the sequential and rayon peers of the benchmark.
//!
//! The PNG chart of a run (queue length and throughput per stage over time) is
//! drawn by `leda_core::chart` from the statistics file the run writes.

pub mod baseline;
pub mod codec;
pub mod error;
pub mod filters;
pub mod generate;
pub mod message;
pub mod pipeline;
pub mod report;
pub mod stages;
pub mod steps;

pub use error::ImageError;

use leda_core::stage::Stage;

/// Builds one stage of the catalogue.
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name
/// (`require 'leda.stage.image.decode'`...). See `examples/image/pipeline.lua`.
/// Each comes with what it needs beyond computing, as `leda start --allow` names it (`io`:
/// files).
pub fn catalogue() -> Vec<(&'static str, &'static str, StageMaker)> {
    use stages::kinds;
    fn report() -> Stage {
        report::report(None)
    }
    vec![
        (kinds::SOURCE, "io", stages::source as StageMaker),
        (kinds::DECODE, "", stages::decode),
        (kinds::DENOISE, "", stages::denoise),
        (kinds::COLOR, "", stages::color),
        (kinds::SCALE, "", stages::scale),
        (kinds::ENCODE, "", stages::encode),
        (kinds::WRITE, "io", stages::write),
        (kinds::REPORT, "", report),
    ]
}
