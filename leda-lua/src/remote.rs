//! Graphs across processes, over leda-net.
//!
//! * **Daemons** (`leda start --listen ADDR`, Listing 4.6's `leda.start{...}`): a
//!   [`leda_net::Daemon`] whose [`registry`] rebuilds the stages of a deployed cluster:
//!   Lua stages from their **source text** (the [`StageCode`] travels in the stage's
//!   [`CODE_ATTR`] attribute, and is compiled in text mode only, so bytecode is
//!   refused), Rust stages by the name they are registered under in
//!   [`crate::registry`] (`leda.stage.util.timer`...).
//! * **Launching** (`graph:run()` of a graph mapped to several processes): the
//!   configuring process finds which mapped address is its own ([`this_process`]),
//!   attaches every Lua stage's code ([`attach_code`]) and deploys the other clusters
//!   to their daemons with a [`leda_net::Launcher`], then runs its own cluster.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::graph::Graph;
use leda_core::runtime::Run;
use leda_core::stage::{Attrs, BoxError, Stage};
use leda_core::value::Value;
use leda_net::frame::Role;
use leda_net::{Daemon, DaemonConfig, Launcher, NetError, Registry, Secret};

use crate::instance::{StageCode, code_of, stage_from_code};

/// The attribute that carries a Lua stage's code to the process that runs it
/// (msgpack of [`StageCode`]: source text and copied upvalues). Instances never see
/// it in `self`.
pub const CODE_ATTR: &str = "leda.lua.code";

/// The registered kind of every Lua stage.
pub const LUA_KIND: &str = "lua";

/// Why a graph could not be deployed or served.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A deployed Lua stage carries no usable code.
    #[error("stage '{stage}': {reason}")]
    BadCode {
        /// The stage.
        stage: String,
        /// What is wrong.
        reason: String,
    },
    /// A deployed Lua stage's code record is missing or malformed.
    #[error("{0}")]
    NoCode(String),
    /// The configuring process cannot tell which mapped address is its own.
    #[error(
        "cannot tell which mapped process is this one: {found}; name it with graph:run{{host=..., port=...}} or `leda run --process HOST:PORT`"
    )]
    WhoAmI {
        /// What probing found.
        found: String,
    },
    /// The address named as this process is not in the mapping.
    #[error("this process ({me}) is not one of the mapped processes ({mapped})")]
    NotMapped {
        /// This process.
        me: String,
        /// The mapping.
        mapped: String,
    },
    /// The network layer failed.
    #[error(transparent)]
    Net(#[from] NetError),
}

/// The stages a daemon of the `leda` command can run: Lua stages (kind [`LUA_KIND`])
/// and every Rust stage registered for `require` whose needs this process allows
/// ([`crate::capabilities`]; checked when the deployment is built).
pub fn registry() -> Registry {
    crate::library::register_bundled();
    let mut r = Registry::new();
    r.register(LUA_KIND, |attrs: &Attrs| {
        stage_from_attrs(attrs).map_err(|e| Box::new(e) as BoxError)
    });
    for module in crate::registry::registered() {
        let name = module.clone();
        r.register(module, move |_: &Attrs| {
            let needs = crate::registry::needs(&name)
                .ok_or_else(|| format!("stage '{name}' is no longer registered"))?;
            let allowed = crate::capabilities::allowed();
            if !allowed.covers(needs) {
                let lack = allowed.missing(needs);
                return Err(format!(
                    "stage '{name}' needs {lack}, which this daemon does not allow \
                     (start it with --allow {lack})"
                )
                .into());
            }
            crate::registry::make_stage(&name)
                .ok_or_else(|| format!("stage '{name}' is no longer registered").into())
        });
    }
    r
}

/// The code of a Lua stage, as the [`CODE_ATTR`] value.
pub fn encode_code(code: &StageCode) -> Result<Value, RemoteError> {
    rmp_serde::to_vec(code)
        .map(|b| Value::Bytes(Bytes::from(b)))
        .map_err(|e| RemoteError::BadCode {
            stage: code.name.clone(),
            reason: format!("cannot encode its code: {e}"),
        })
}

/// Sets [`CODE_ATTR`] on every Lua stage of `graph`, so that a deployment carries the
/// stages' source to the daemons that run them.
pub fn attach_code(graph: &Graph) -> Result<(), RemoteError> {
    for s in graph.stages() {
        if let Some(code) = code_of(s) {
            s.set_attr(CODE_ATTR, encode_code(&code)?);
        }
    }
    Ok(())
}

/// Rebuilds a Lua stage from its deployed attributes.
pub fn stage_from_attrs(attrs: &Attrs) -> Result<Stage, RemoteError> {
    let bad = RemoteError::NoCode;
    let bytes = match attrs.get(CODE_ATTR) {
        Some(Value::Bytes(b)) => b.clone(),
        Some(other) => {
            return Err(bad(format!(
                "attribute '{CODE_ATTR}' is not a code record ({})",
                other.type_name()
            )));
        }
        None => return Err(bad(format!("no '{CODE_ATTR}' attribute: no Lua source"))),
    };
    let code: StageCode =
        rmp_serde::from_slice(&bytes).map_err(|e| bad(format!("malformed code record: {e}")))?;
    if let Some(reason) = code.binary_chunk() {
        return Err(RemoteError::BadCode {
            stage: code.name.clone(),
            reason,
        });
    }
    Ok(stage_from_code(code.name.clone(), Arc::new(code)))
}

fn net_runtime() -> Result<tokio::runtime::Runtime, RemoteError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            RemoteError::Net(NetError::Io {
                context: "starting a probe runtime".into(),
                source: e,
            })
        })
}

/// Which address of `mapped` is this process: the only one where no Leda daemon
/// answers (each is probed with a handshake in the `Probe` role, so daemons log
/// nothing; over TLS when `tls` is given, as the daemons then expect).
pub fn this_process(
    mapped: &[String],
    secret: Option<&Secret>,
    tls: Option<&leda_net::TlsConfig>,
) -> Result<String, RemoteError> {
    let rt = net_runtime()?;
    let key = match secret {
        Some(s) => s.clone(),
        None => Secret::for_user().map_err(NetError::from)?,
    };
    let tls = tls.map(leda_net::Tls::load).transpose()?;
    let mut free = Vec::new();
    let mut busy = Vec::new();
    for addr in mapped {
        let r = rt.block_on(leda_net::handshake::connect(
            addr,
            Role::Probe,
            "probe",
            0,
            &key,
            tls.as_ref(),
            Duration::from_millis(1500),
        ));
        match r {
            Ok(_) => busy.push(addr.clone()),
            Err(NetError::Io { source, .. }) => free.push((addr.clone(), source.to_string())),
            // Something answers there (a daemon that wants a secret, say).
            Err(e) => {
                tracing::debug!(addr, error = %e, "probe");
                busy.push(addr.clone());
            }
        }
    }
    free.dedup_by(|a, b| a.0 == b.0);
    match free.as_slice() {
        [(me, _)] => Ok(me.clone()),
        [] => Err(RemoteError::WhoAmI {
            found: format!("a daemon answers at every address ({})", busy.join(", ")),
        }),
        many => Err(RemoteError::WhoAmI {
            found: format!(
                "no daemon answers at {} (is one not started? `leda start --listen ADDR` on each)",
                many.iter()
                    .map(|(a, why)| format!("{a} ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// How the configuring process launches a mapped graph.
#[derive(Debug, Clone, Default)]
pub struct LaunchOptions {
    /// This process's address in the mapping.
    pub me: String,
    /// The shared secret (default: `LEDA_SECRET`).
    pub secret: Option<Secret>,
    /// End the run when every process is idle.
    pub until_idle: bool,
    /// Mutual TLS to every daemon (they must speak it too).
    pub tls: Option<leda_net::TlsConfig>,
}

/// Deploys `graph` to its daemons and runs this process's cluster; returns the
/// launch's report (the local run's, with the `quit` values of whichever process quit,
/// and the other processes' final statistics).
pub fn launch(
    graph: &Graph,
    run: Run,
    opts: &LaunchOptions,
) -> Result<leda_net::LaunchReport, RemoteError> {
    let mapped: Vec<String> = graph
        .mapping()
        .map(|m| m.iter().flat_map(|p| p.0.iter().cloned()).collect())
        .unwrap_or_default();
    if !mapped.contains(&opts.me) {
        return Err(RemoteError::NotMapped {
            me: opts.me.clone(),
            mapped: mapped.join(", "),
        });
    }
    attach_code(graph)?;
    let mut launcher = Launcher::new(opts.me.clone());
    if let Some(s) = &opts.secret {
        launcher = launcher.secret(s.clone());
    }
    if opts.until_idle {
        launcher = launcher.until_idle();
    }
    if let Some(t) = &opts.tls {
        launcher = launcher.tls(t.clone());
    }
    tracing::info!(graph = graph.name(), me = %opts.me, "deploying");
    let report = launcher.run(graph, run)?;
    tracing::info!(
        sent = report.transport.sent,
        failed = report.transport.failed,
        "run ended"
    );
    Ok(report)
}

/// How a daemon listens and runs (`leda start`, `leda.start{...}`).
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// `host:port` to listen on (port 0 picks one).
    pub listen: String,
    /// Worker threads (default: what the deployment asks, else one per CPU).
    pub threads: Option<usize>,
    /// The automatic controller between these thread counts, instead of a fixed pool.
    pub auto_threads: Option<(usize, usize)>,
    /// Shared secret (default: `LEDA_SECRET`); required off loopback.
    pub secret: Option<Secret>,
    /// Serve the dashboard of each deployed run (`leda start --dashboard ADDR`).
    pub dashboard: Option<leda_core::dashboard::DashboardConfig>,
    /// Default instance limit of parallel stages (default: the thread count).
    pub maxpar: Option<usize>,
    /// Mutual TLS on every link (`leda start --tls-cert ... --tls-key ... --tls-ca ...`).
    pub tls: Option<leda_net::TlsConfig>,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            listen: format!("127.0.0.1:{}", leda_net::daemon::DEFAULT_PORT),
            threads: None,
            auto_threads: None,
            secret: None,
            dashboard: None,
            maxpar: None,
            tls: None,
        }
    }
}

impl DaemonOptions {
    fn config(&self, listen: String) -> DaemonConfig {
        let mut c = DaemonConfig {
            listen,
            threads: self.threads,
            auto_threads: self.auto_threads,
            dashboard: self.dashboard.clone(),
            maxpar: self.maxpar,
            ..DaemonConfig::default()
        };
        if self.secret.is_some() {
            c.secret = self.secret.clone();
        }
        c.tls = self.tls.clone();
        c
    }
}

/// Serves deployments: binds, calls `on_bound` with the bound address, then runs the
/// clusters deployed to it one after another (or only the first one unless
/// `forever`), and returns the last run's `quit` values.
pub fn serve(
    opts: &DaemonOptions,
    forever: bool,
    mut on_bound: impl FnMut(SocketAddr),
) -> Result<Option<Event>, RemoteError> {
    let mut config = opts.config(opts.listen.clone());
    config.once = !forever;
    let daemon = Daemon::bind(config, registry())?;
    on_bound(daemon.local_addr());
    let mut quit = None;
    daemon.serve(|report| {
        tracing::info!(reason = ?report.run.reason, "deployment ended");
        quit = report
            .run
            .quit
            .as_ref()
            .map(|e| Event::from_values(e.args().to_vec()));
    })?;
    Ok(quit)
}
