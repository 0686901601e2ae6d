//! Starting a group: node 0 (API side and the `done` collector) in this process, nodes 1..
//! on daemons.

use anyhow::{Context, bail};
use leda_core::prelude::*;
use leda_core::runtime::ProcessHandle;
use leda_lock_service::app::set_multi_work;
use leda_lock_service::client::{ApiShared, LocalClient};
use leda_lock_service::group::{Detection, ServiceConfig, Side, build_group_with};
use leda_lock_service::multi::{MultiServiceConfig, attach_multi};
use leda_net::{LaunchReport, Launched, Launcher};

/// Multi-resource locks for a run: the group's configuration, and who uses them.
#[derive(Debug, Clone)]
pub struct MultiWork {
    /// The algorithm and the locks.
    pub cfg: MultiServiceConfig,
    /// Daemon nodes whose worker clients also do `acquire_all` rounds (after their
    /// single-lock increments).
    pub workers: Vec<usize>,
    /// `acquire_all` rounds per client.
    pub rounds: usize,
    /// Seed of the random subsets.
    pub seed: u64,
}

/// The launcher's identity in the mapping.
const ME: &str = "launcher:1";

/// A running group seen from node 0.
pub struct Group {
    launched: Launched,
    /// A client of node 0.
    pub client: LocalClient,
    /// The `done` stage's index in this process.
    pub done: usize,
}

impl Group {
    /// Deploys `daemon_sides[i]` as node `i + 1` on `daemons[i]`, node 0 here (the run ends
    /// after `reports` reports to `done`), with this failure-detection setting, and multi-resource locks
    /// (a `multi<i>` stage beside every node, see [`attach_multi`], and multi rounds for the
    /// workers of `multi.workers`) when `multi` is given.
    pub fn start_with(
        cfg: &ServiceConfig,
        daemon_sides: Vec<Side>,
        reports: usize,
        daemons: &[String],
        detection: &Detection,
        multi: Option<&MultiWork>,
    ) -> anyhow::Result<Group> {
        if daemons.len() + 1 != cfg.nodes || daemon_sides.len() != daemons.len() {
            bail!("{} daemons for {} nodes", daemons.len(), cfg.nodes);
        }
        let shared = ApiShared::new();
        let mut sides = vec![Side::Api(shared.clone())];
        sides.extend(daemon_sides);
        let mut built = build_group_with(cfg, &sides, Some(reports), detection)?;
        if let Some(multi) = multi {
            attach_multi(&mut built, &cfg.resources, &multi.cfg)
                .context("adding the multi locks")?;
            for &i in &multi.workers {
                let app = built
                    .graph
                    .stage(&format!("app{i}"))
                    .with_context(|| format!("node {i} has no worker stage"))?;
                set_multi_work(app, &multi.cfg.resources, multi.rounds, multi.seed);
            }
        }
        let mut addrs: Vec<&str> = vec![ME];
        addrs.extend(daemons.iter().map(String::as_str));
        built.graph.part(built.clusters.clone())?.map(addrs)?;
        // With a failure detector (the crash-tolerant quorums), the group goes on
        // when a node's process is lost: that is the algorithm's job. Otherwise the
        // loss of any node ends the run (the default).
        let mut run = Run::default().threads(2);
        if detection.config.is_some() {
            run = run.on_process_loss(OnProcessLoss::Continue { notify: None });
        }
        let launched = Launcher::new(ME)
            .start(&built.graph, run)
            .context("deploying the group")?;
        let handle = launched.handle();
        let client = LocalClient::new(handle.clone(), "front0", shared)?;
        let done = handle
            .stage_index("done")
            .context("no done stage in the launcher")?;
        Ok(Group {
            launched,
            client,
            done,
        })
    }

    /// A handle into node 0's process.
    pub fn handle(&self) -> ProcessHandle {
        self.launched.handle()
    }

    /// Waits for the end of the run.
    pub fn wait(self) -> anyhow::Result<LaunchReport> {
        self.launched.wait().context("running the group")
    }
}
