//! `leda.stage.io.*`: file input.

mod lines;

pub use lines::{MAX_LINE, lines, read_chunk};
