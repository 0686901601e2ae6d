//! The benchmark's peers, with the same filter code as the stages: a single-threaded
//! loop over the images, and rayon's `par_iter` over the images.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::ImageError;
use crate::report::Summary;
use crate::steps::{self, Params};

/// Which baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// One thread, one image after the other.
    Seq,
    /// `par_iter` over the images on a pool of the given size.
    Rayon(usize),
}

fn tally(summary: &mut Summary, path: &Path, r: Result<u64, ImageError>) {
    match r {
        Ok(bytes) => {
            summary.done += 1;
            summary.bytes_written += bytes;
        }
        Err(e) => {
            summary.failed += 1;
            summary
                .errors
                .push(format!("{}: {e}", steps::image_name(path)));
        }
    }
}

/// Processes every file of `input` into `output` and returns the summary.
pub fn run(
    input: &Path,
    output: &Path,
    params: &Params,
    how: Baseline,
) -> Result<Summary, ImageError> {
    let inputs = crate::stages::list_inputs(input)?;
    steps::prepare_output(output)?;
    let start = std::time::Instant::now();
    let mut summary = Summary {
        total: Some(inputs.len() as u64),
        ..Summary::default()
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for input in inputs {
        match input {
            Ok(f) => files.push(f),
            Err(r) => {
                summary.failed += 1;
                summary
                    .errors
                    .push(format!("{}: source: {}", r.file, r.why));
            }
        }
    }
    match how {
        Baseline::Seq => {
            for f in &files {
                tally(&mut summary, f, steps::process_file(f, output, params));
            }
        }
        Baseline::Rayon(threads) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads.max(1))
                .build()
                .map_err(|e| ImageError::Setting(format!("rayon pool: {e}")))?;
            let results: Vec<Result<u64, ImageError>> = pool.install(|| {
                files
                    .par_iter()
                    .map(|f| steps::process_file(f, output, params))
                    .collect()
            });
            for (f, r) in files.iter().zip(results) {
                tally(&mut summary, f, r);
            }
        }
    }
    summary.seconds = start.elapsed().as_secs_f64();
    Ok(summary)
}
