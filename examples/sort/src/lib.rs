//! Leda-RS distributed vector sort: the thesis' overhead benchmark against MPI
//! (§5, Fig. 5.13, Listing B.4).
//!
//! A **scatter** stage splits a vector of *n* doubles into *p* contiguous parts and
//! sends part *k* on output port *k*; each port leads to a clone of the **sort** stage
//! (`sort1` … `sortp`), every clone alone in a cluster mapped to its own process, which
//! runs the selection sort of Listing B.2; the sorted parts go to a serial **reducer**
//! that finishes once all *p* have arrived. Scatter and reducer share the launcher's
//! cluster. Every connector is decoupled: the parts travel serialized, as raw
//! little-endian doubles (the thesis' `memarray`).
//!
//! The same binary (`leda-sort`) is launcher and daemon: remote stages are rebuilt by
//! their registered kind ([`stages::registry`]).
//!
//! Module map: [`kernel`] (Listing B.2, in C and in Rust), [`vector`] (doubles as
//! bytes, the scatter's input), [`stages`] (the stage kinds), [`graph`] (the two
//! graphs: the sort and the communication-only test), [`daemons`] (local daemon
//! processes for one-command runs), [`error`].
//!
//! # Timing window (spec §14.4, decision)
//!
//! The clock starts in the scatter handler *after* the input vector has been built
//! and stops in the reducer when the last sorted part has arrived (before the result
//! is checked). It therefore includes serializing, sending, sorting and returning
//! every part, and excludes process start, deployment and vector initialisation, as
//! the thesis' text says. The MPI peer (`mpi/sort_mpi.c`) uses the same window: after
//! filling the vector, before `MPI_Scatter`, until the last `MPI_Recv`.

pub mod daemons;
pub mod error;
pub mod graph;
pub mod kernel;
pub mod stages;
pub mod vector;

pub use error::SortError;
pub use kernel::Kernel;

use leda_core::stage::Stage;

/// Builds a stage of the catalogue.
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name
/// (`require 'leda.stage.sort.sort'`); their attributes are those of [`stages`].
pub fn catalogue() -> Vec<(&'static str, StageMaker)> {
    vec![
        ("leda.stage.sort.scatter", stages::scatter as StageMaker),
        ("leda.stage.sort.sort", stages::sorter),
        ("leda.stage.sort.reducer", stages::reducer),
    ]
}
