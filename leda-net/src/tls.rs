//! TLS for links across hosts: rustls (ring), TLS 1.2/1.3, **mutual**: every process
//! holds a certificate and key signed by one CA, each side verifies the other's
//! certificate against that CA, and a client checks that the server's certificate
//! names the address it dialled (an IP address SAN for `10.0.0.2:9001`, a DNS name
//! for `host:9001`). The shared-secret handshake ([`crate::auth`]) still runs inside
//! the TLS session, so a peer needs both the secret and a certificate of the CA.
//!
//! Configured per process (`--tls-cert`, `--tls-key`, `--tls-ca`; [`TlsConfig`]): a
//! process with TLS speaks only TLS, so every process of a deployment must have it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::conn::Conn;
use crate::error::NetError;

/// Where a process' TLS material is (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// This process' certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signs every process' certificate.
    pub ca: PathBuf,
}

/// Loaded TLS contexts: accepting and connecting.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

fn tls_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> NetError {
    NetError::Tls(format!("{what}: {e}"))
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let v: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(path.display(), e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(path.display(), e))?;
    if v.is_empty() {
        return Err(tls_err(path.display(), "no certificate in the file"));
    }
    Ok(v)
}

impl Tls {
    /// Loads the certificate, key and CA of `c`.
    pub fn load(c: &TlsConfig) -> Result<Tls, NetError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&c.cert)?;
        // The key proves this process to its peers: as private as the shared secret.
        let meta = std::fs::metadata(&c.key).map_err(|e| tls_err(c.key.display(), e))?;
        crate::auth::check_private(&c.key, &meta).map_err(|e| tls_err("the TLS key", e))?;
        let key = PrivateKeyDer::from_pem_file(&c.key).map_err(|e| tls_err(c.key.display(), e))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs(&c.ca)? {
            roots.add(ca).map_err(|e| tls_err(c.ca.display(), e))?;
        }
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls_err("client verifier", e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("server config", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| tls_err(c.cert.display(), e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("client config", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_err(c.cert.display(), e))?;
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }

    /// The server side on an accepted connection.
    pub(crate) async fn accept(&self, s: TcpStream, peer: &str) -> Result<Conn, NetError> {
        let t = self.acceptor.accept(s).await.map_err(|e| NetError::Auth {
            peer: peer.into(),
            reason: format!("TLS: {e}"),
        })?;
        Ok(Conn::tls_server(t))
    }

    /// The client side towards `addr` (`host:port`: the server's certificate must
    /// name `host`).
    pub(crate) async fn connect(&self, s: TcpStream, addr: &str) -> Result<Conn, NetError> {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| tls_err(format!("server name {host}"), e))?;
        let t = self
            .connector
            .connect(name, s)
            .await
            .map_err(|e| NetError::Auth {
                peer: addr.into(),
                reason: if e.to_string().contains("InvalidContentType") {
                    // (What rustls says of a peer that answers in plain TCP.)
                    format!("TLS: {e}: the peer does not speak TLS (start it with --tls-cert/--tls-key/--tls-ca too)")
                } else {
                    format!("TLS: {e}")
                },
            })?;
        Ok(Conn::tls_client(t))
    }
}
