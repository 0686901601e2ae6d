//! Shared-secret authentication: HMAC-SHA256 challenge–response in both directions.
//!
//! Each side sends a fresh random nonce; each proves knowledge of the secret by
//! returning `HMAC(secret, label || their_nonce || own_nonce)`. Labels differ per
//! direction, so a proof cannot be reflected back. The secret itself never travels.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Length of a nonce in bytes.
pub const NONCE_LEN: usize = 32;

/// Environment variable read for the shared secret when none is given explicitly.
pub const SECRET_ENV: &str = "LEDA_SECRET";

const CLIENT_LABEL: &[u8] = b"leda-net/1 client";
const SERVER_LABEL: &[u8] = b"leda-net/1 server";

/// A shared secret (never printed).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from bytes (a passphrase works).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// The secret in [`SECRET_ENV`], if set and non-empty.
    pub fn from_env() -> Option<Secret> {
        std::env::var_os(SECRET_ENV)
            .filter(|v| !v.is_empty())
            .map(|v| Secret(v.into_encoded_bytes()))
    }

    fn mac(&self, label: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(label);
        m.update(&(a.len() as u32).to_le_bytes());
        m.update(a);
        m.update(b);
        m
    }

    /// The client's proof: over the server's nonce, then its own.
    pub fn client_proof(&self, server_nonce: &[u8], client_nonce: &[u8]) -> Vec<u8> {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// The server's proof: over the client's nonce, then its own.
    pub fn server_proof(&self, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
        self.mac(SERVER_LABEL, client_nonce, server_nonce)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// Checks a client's proof in constant time.
    pub fn verify_client(&self, server_nonce: &[u8], client_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce)
            .verify_slice(proof)
            .is_ok()
    }

    /// Checks a server's proof in constant time.
    pub fn verify_server(&self, client_nonce: &[u8], server_nonce: &[u8], proof: &[u8]) -> bool {
        self.mac(SERVER_LABEL, client_nonce, server_nonce)
            .verify_slice(proof)
            .is_ok()
    }
}

/// A fresh random nonce.
pub fn nonce() -> Result<[u8; NONCE_LEN], std::io::Error> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_secret_and_direction() {
        let s = Secret::new("open sesame");
        let (cn, sn) = (nonce().unwrap(), nonce().unwrap());
        let p = s.client_proof(&sn, &cn);
        assert!(s.verify_client(&sn, &cn, &p));
        assert!(!Secret::new("wrong").verify_client(&sn, &cn, &p));
        assert!(
            !s.verify_server(&cn, &sn, &p),
            "a client proof is not a server proof"
        );
        assert!(!s.verify_client(&sn, &cn, &p[..31]));
        assert_ne!(cn, sn);
    }
}
