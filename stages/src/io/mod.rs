//! `leda.stage.io.*`: file input.

mod lines;

pub use lines::lines;
