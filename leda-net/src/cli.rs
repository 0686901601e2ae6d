//! The command-line options every daemon and launcher of Leda-RS takes, as clap
//! argument groups, so that `leda start`, `leda-sort daemon`, `leda-image daemon`,
//! `leda-cep daemon` and `lock-service daemon` take the same flags with the same
//! meaning. Parsing only: what a daemon does is [`crate::daemon`]'s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::Secret;
use crate::daemon::{DEFAULT_PORT, DaemonConfig};
use crate::tls::TlsConfig;

/// clap value parser of `--secret-file PATH`: reads the secret (mode 0600, at least 16
/// bytes: [`Secret::from_file`]).
pub fn secret_file(path: &str) -> Result<Secret, String> {
    Secret::from_file(path).map_err(|e| e.to_string())
}

/// `--secret-file PATH`, for launchers and daemons.
#[derive(Debug, Clone, Default, Args)]
pub struct SecretArgs {
    /// File holding the shared secret that authenticates every process (mode 0600;
    /// default: $LEDA_SECRET, $LEDA_SECRET_FILE, else the per-user cookie file
    /// ~/.leda.cookie).
    #[arg(long = "secret-file", value_name = "PATH", value_parser = secret_file)]
    pub secret: Option<Secret>,
}

/// `--tls-cert`, `--tls-key`, `--tls-ca`: mutual TLS on every link, for daemons and
/// launchers alike (each process presents a certificate signed by the CA).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// This process' certificate (PEM): with --tls-key and --tls-ca, every link speaks
    /// mutual TLS.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// This process' private key (PEM).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The CA that signs every process' certificate (PEM).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS configuration, if the three files were given.
    pub fn config(&self) -> Option<TlsConfig> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsConfig {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            _ => None,
        }
    }
}

/// The options of a daemon command.
#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// Address to listen on (port 0 picks a free one); off loopback a configured
    /// secret is required.
    #[arg(long, default_value_t = format!("127.0.0.1:{DEFAULT_PORT}"))]
    pub listen: String,
    /// Worker threads, at least 1 (default: one per CPU).
    #[arg(long, value_parser = leda_core::cli::thread_count)]
    pub threads: Option<usize>,
    /// Run each deployment under the automatic controller, between MIN and MAX threads,
    /// instead of a fixed pool.
    #[arg(long, value_name = "MIN,MAX", value_parser = leda_core::cli::thread_range,
          conflicts_with = "threads")]
    pub auto_threads: Option<(usize, usize)>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub secret: SecretArgs,
    /// Serve one deployment, then exit (a refused or failed one does not count;
    /// default: one after another).
    #[arg(long)]
    pub once: bool,
    /// Serve each run's dashboard on this address.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<String>,
    /// Token the dashboard requires (mandatory off loopback).
    #[arg(long, value_name = "TOKEN", requires = "dashboard")]
    pub dashboard_token: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub tls: TlsArgs,
    /// Milliseconds a connecting peer has for the handshake (tests).
    #[arg(long, value_name = "MS", hide = true)]
    pub handshake_timeout_ms: Option<u64>,
}

impl DaemonArgs {
    /// The daemon configuration these options give.
    pub fn config(self) -> DaemonConfig {
        let mut c = DaemonConfig {
            listen: self.listen,
            threads: self.threads,
            auto_threads: self.auto_threads,
            secret: self.secret.secret,
            once: self.once,
            ..DaemonConfig::default()
        };
        if let Some(addr) = self.dashboard {
            c.dashboard = Some(leda_core::dashboard::DashboardConfig {
                addr,
                token: self.dashboard_token,
            });
        }
        c.tls = self.tls.config();
        if let Some(ms) = self.handshake_timeout_ms {
            c.handshake_timeout = Duration::from_millis(ms);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        daemon: DaemonArgs,
    }

    fn parse(args: &[&str]) -> Result<DaemonConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("d").chain(args.iter().copied()))
            .map(|c| c.daemon.config())
    }

    #[test]
    fn flags_map_to_the_config_and_bad_ones_are_refused() {
        let c = parse(&["--listen", "127.0.0.1:0", "--threads", "3", "--once"]).unwrap();
        assert_eq!(
            (c.listen.as_str(), c.threads, c.once),
            ("127.0.0.1:0", Some(3), true)
        );
        assert_eq!(
            parse(&[]).unwrap().listen,
            format!("127.0.0.1:{DEFAULT_PORT}")
        );
        assert_eq!(
            parse(&["--auto-threads", "1,4"]).unwrap().auto_threads,
            Some((1, 4))
        );
        for bad in [
            &["--threads", "0"][..],
            &["--auto-threads", "4,1"],
            &["--auto-threads", "2"],
            &["--auto-threads", "1,4", "--threads", "2"],
            &["--secret", "xxxxxxxxxxxxxxxxxxxxxxxx"],
            &["--tls-cert", "a.pem"],
            &["--dashboard-token", "t"],
            &["--nope"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
