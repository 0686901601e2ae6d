//! Prometheus text exposition of a snapshot. Names are stable: `leda_stage_*`,
//! `leda_connector_*`, `leda_remote_events_total`, `leda_process_*`; labels `process`,
//! `stage`, for connectors `from`, `port`, `to`, `kind`, and for remote routes `from`,
//! `to`, `outcome`. Every process of the sample (this one and the peers
//! the transport reported) contributes its samples to each family.
//!
//! Written here rather than with `prometheus-client`: that crate's metrics are values
//! the program updates as it runs, registered once; these are read from snapshots
//! (this process' counters and the peers' last reports, which come and go with the
//! run), so they would have to be copied into a fresh registry on every scrape to be
//! printed in the same text format. The output is checked by a real parser
//! (`prometheus-parse`, `tests/dashboard.rs`).

use std::fmt::Write as _;

use super::Sample;

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &str, v: f64) {
        let _ = writeln!(self.out, "{name}{{{labels}}} {v}");
    }
}

/// The sample as Prometheus text, each process' samples labelled with its address.
pub(crate) fn prometheus(sample: &Sample) -> String {
    let mut out = String::new();
    let procs: Vec<(String, &crate::stats::Snapshot)> =
        sample.processes().map(|(n, s)| (esc(n), s)).collect();
    let mut f = Family { out: &mut out };
    type StageField = fn(&crate::stats::StageSnapshot) -> f64;
    let stage_metrics: [(&str, &str, &str, StageField); 17] = [
        (
            "leda_stage_queue_length",
            "gauge",
            "Events waiting in the stage's queue.",
            |s| s.queue_len as f64,
        ),
        (
            "leda_stage_queue_capacity",
            "gauge",
            "Capacity of the stage's queue.",
            |s| s.queue_capacity as f64,
        ),
        (
            "leda_stage_instances",
            "gauge",
            "Live instances of the stage.",
            |s| s.instances as f64,
        ),
        (
            "leda_stage_active_instances",
            "gauge",
            "Instances ready, running or waiting.",
            |s| s.active as f64,
        ),
        (
            "leda_stage_idle_instances",
            "gauge",
            "Instances in the idle pool.",
            |s| s.idle as f64,
        ),
        (
            "leda_stage_waiting_instances",
            "gauge",
            "Instances waiting on an asynchronous operation.",
            |s| s.waiting as f64,
        ),
        (
            "leda_stage_maxpar",
            "gauge",
            "Instance limit of the stage.",
            |s| s.maxpar as f64,
        ),
        (
            "leda_stage_events_in_total",
            "counter",
            "Events accepted into the stage's queue.",
            |s| s.events_in as f64,
        ),
        (
            "leda_stage_events_out_total",
            "counter",
            "Events the stage sent.",
            |s| s.events_out as f64,
        ),
        (
            "leda_stage_handled_total",
            "counter",
            "Events handled (failed ones included).",
            |s| s.handled as f64,
        ),
        (
            "leda_stage_errors_total",
            "counter",
            "Handler errors and panics.",
            |s| s.errors as f64,
        ),
        (
            "leda_stage_rejected_total",
            "counter",
            "Sends refused because the queue was full.",
            |s| s.rejected as f64,
        ),
        (
            "leda_stage_failed_sends_total",
            "counter",
            "Events accepted for sending and not delivered (lost in transit, or held and refused).",
            |s| s.failed_sends as f64,
        ),
        (
            "leda_stage_discarded_total",
            "counter",
            "Events accepted and dropped unhandled because the run ended.",
            |s| s.discarded as f64,
        ),
        (
            "leda_stage_latency_mean_seconds",
            "gauge",
            "Mean handler latency (sampled).",
            |s| s.latency_mean_us / 1e6,
        ),
        (
            "leda_stage_latency_p99_seconds",
            "gauge",
            "99th-percentile handler latency (sampled).",
            |s| s.latency_p99_us / 1e6,
        ),
        (
            "leda_stage_busy_seconds_total",
            "counter",
            "Worker time spent in the stage (sampled).",
            |s| s.busy_s,
        ),
    ];
    for (name, kind, help, get) in stage_metrics {
        f.header(name, kind, help);
        for (p, snap) in &procs {
            for s in &snap.stages {
                f.sample(
                    name,
                    &format!("process=\"{p}\",stage=\"{}\"", esc(&s.name)),
                    get(s),
                );
            }
        }
    }
    type ConnectorField = fn(&crate::stats::ConnectorSnapshot) -> f64;
    let connector_metrics: [(&str, &str, &str, ConnectorField); 2] = [
        (
            "leda_connector_events_total",
            "counter",
            "Events carried by the connector.",
            |c| c.events as f64,
        ),
        (
            "leda_connector_latency_mean_seconds",
            "gauge",
            "Mean send-to-handling latency (sampled).",
            |c| c.latency_mean_us / 1e6,
        ),
    ];
    for (name, kind, help, get) in connector_metrics {
        f.header(name, kind, help);
        for (p, snap) in &procs {
            for c in &snap.connectors {
                let labels = format!(
                    "process=\"{p}\",from=\"{}\",port=\"{}\",to=\"{}\",kind=\"{}\"",
                    esc(&c.from),
                    esc(&c.port),
                    esc(&c.to),
                    esc(&c.kind)
                );
                f.sample(name, &labels, get(c));
            }
        }
    }
    let name = "leda_remote_events_total";
    f.header(
        name,
        "counter",
        "Events sent to a stage of another process, by outcome: sent = delivered + \
         failed + discarded (+ in flight).",
    );
    for (p, snap) in &procs {
        for r in &snap.remote_routes {
            for (outcome, v) in [
                ("sent", r.sent),
                ("delivered", r.delivered),
                ("failed", r.failed),
                ("discarded", r.discarded),
            ] {
                let labels = format!(
                    "process=\"{p}\",from=\"{}\",to=\"{}\",outcome=\"{outcome}\"",
                    esc(&r.from),
                    esc(&r.to)
                );
                f.sample(name, &labels, v as f64);
            }
        }
    }
    type ProcessField = fn(&crate::stats::ProcessSnapshot) -> f64;
    let process_metrics: [(&str, &str, ProcessField); 4] = [
        ("leda_process_threads", "Worker threads.", |p| {
            p.threads as f64
        }),
        (
            "leda_process_busy_threads",
            "Worker threads running an instance.",
            |p| p.busy_threads as f64,
        ),
        (
            "leda_process_ready_queue",
            "Tasks waiting for a worker.",
            |p| p.ready_queue as f64,
        ),
        (
            "leda_process_resident_memory_bytes",
            "Resident memory.",
            |p| p.rss_bytes as f64,
        ),
    ];
    for (name, help, get) in process_metrics {
        f.header(name, "gauge", help);
        for (p, snap) in &procs {
            f.sample(name, &format!("process=\"{p}\""), get(&snap.process));
        }
    }
    out
}
