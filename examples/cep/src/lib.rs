//! # leda-cep: complex event processing (thesis §5.1.2)
//!
//! Three sources read Apache access logs; each line gets its log time (`stamp`) and a
//! window cuts every 1,000 entries of the sources' event-time merge (so results do not
//! depend on how the sources interleave: [`stages`]); a copy stage hands each window to `persist` (appends it to a file), `filter` (keeps
//! server errors and slow responses) and `correlate` (pairwise, O(w²), detects bursts
//! of errors from one client); both raise alarms. The graph is run in the thesis' two
//! partitions, sources in processes of their own (leda-net), with instance counts and
//! threads as parameters; [`seq`] is the single-threaded baseline, and `lua/cep.lua`
//! the same graph with Lua handlers.
//!
//! Module map: [`generate`] writes seeded logs; [`log`] parses a line; [`rules`] says what
//! is relevant and what correlates; [`stages`] holds the stages and the daemon
//! registry; [`app`] builds, partitions and runs the graph; [`seq`] is the baseline.

pub mod app;
pub mod batch;
pub mod generate;
pub mod log;
pub mod lua;
pub mod rules;
pub mod seq;
pub mod stages;
