//! The two graphs: the distributed sort (Listing B.4) and the communication-only test.

use leda_core::graph::Processes;
use leda_core::prelude::*;

use crate::error::SortError;
use crate::kernel::Kernel;
use crate::stages;
use crate::vector;

fn graph_err(e: impl std::fmt::Display) -> SortError {
    SortError::Graph(e.to_string())
}

/// Listing B.4: scatter and reducer in `me`'s cluster, `sort1` … `sortp` each alone
/// in a cluster mapped to `procs[k]`; all connectors decoupled. The scatter has its
/// start event pushed.
pub fn sort_graph(
    np: usize,
    length: usize,
    kernel: Kernel,
    me: &str,
    procs: &[String],
) -> Result<Graph, SortError> {
    vector::part_len(length, np)?;
    if procs.len() != np {
        return Err(SortError::Processes {
            np,
            given: procs.len(),
        });
    }
    let scatter = stages::scatter()
        .attr("np", np as u64)
        .attr("length", length as u64);
    let reducer = stages::reducer()
        .attr("np", np as u64)
        .attr("length", length as u64);
    let op = stages::sorter().attr("kernel", kernel.as_str());
    let mut g = Graph::new("sort");
    let mut clusters = vec![Cluster::of([&scatter, &reducer])];
    for k in 1..=np {
        let opk = op.clone_as(format!("sort{k}"));
        g.connect(&scatter, k, &opk);
        g.connect(&opk, 1, &reducer);
        clusters.push(Cluster::of([&opk]));
    }
    let mut mapping = vec![Processes::from(me)];
    mapping.extend(procs.iter().map(|p| Processes::from(p.as_str())));
    g.part(clusters)
        .map_err(graph_err)?
        .map(mapping)
        .map_err(graph_err)?;
    scatter.push("start");
    Ok(g)
}

/// The communication test: a sender in `me` and a sink in `remote`, joined both ways
/// by decoupled connectors; the sender has its start event pushed.
pub fn send_graph(
    bytes: usize,
    rounds: usize,
    warmup: usize,
    me: &str,
    remote: &str,
) -> Result<Graph, SortError> {
    let sender = stages::sender()
        .attr("bytes", bytes as u64)
        .attr("rounds", rounds as u64)
        .attr("warmup", warmup as u64);
    let sink = stages::sink();
    let mut g = Graph::new("send");
    g.connect(&sender, 1, &sink);
    g.connect(&sink, 1, &sender);
    g.part([Cluster::of([&sender]), Cluster::of([&sink])])
        .map_err(graph_err)?
        .map([me, remote])
        .map_err(graph_err)?;
    sender.push("start");
    Ok(g)
}
