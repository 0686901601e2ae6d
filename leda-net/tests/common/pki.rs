//! Certificates for the TLS tests: a CA and a certificate for 127.0.0.1 it signed, as
//! PEM files (the key private to this user, as the daemons require). Shared by the
//! tests of `leda-net`, `leda-cli` and `leda-sort` (`#[path]`).

#![allow(dead_code)]

use std::path::Path;

/// A CA, and a certificate for 127.0.0.1 signed by it, written as PEM files in `dir`.
pub fn pki(dir: &Path, name: &str) -> leda_net::TlsConfig {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let c = leda_net::TlsConfig {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
        ca: dir.join(format!("{name}-ca.crt")),
    };
    std::fs::write(&c.cert, cert.pem()).unwrap();
    std::fs::write(&c.key, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&c.key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(&c.ca, ca.pem()).unwrap();
    c
}

/// The daemon flags for `c`.
pub fn tls_args(c: &leda_net::TlsConfig) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        c.cert.display().to_string(),
        "--tls-key".into(),
        c.key.display().to_string(),
        "--tls-ca".into(),
        c.ca.display().to_string(),
    ]
}
