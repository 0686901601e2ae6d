//! Shared-secret authentication: where the secret comes from, and the HMAC-SHA256
//! challenge–response over the whole handshake.
//!
//! # The secret
//!
//! Every connection is authenticated, on loopback too: a deployment ships code. In
//! order of precedence a process takes its secret from
//!
//! 1. the program's configuration (a daemon's `--secret-file PATH`, an API call),
//! 2. `LEDA_SECRET` (the secret itself) or `LEDA_SECRET_FILE` (a file holding it),
//! 3. the per-user **cookie file** (as Erlang's `~/.erlang.cookie`): `LEDA_COOKIE`, or
//!    `~/.leda.cookie`, created on first use with 32 random bytes (hex) and mode 0600.
//!
//! A secret shorter than [`MIN_SECRET_LEN`] bytes is refused, and so is a secret or
//! cookie file that another user could read (any group or other permission bit) or
//! that this user does not own. So another local user, who cannot read the cookie,
//! cannot deploy to a daemon, and two processes of the same user need no flag.
//!
//! # The proofs
//!
//! Each side sends a fresh random nonce in its preamble. Both hash the *transcript*:
//! the server's preamble, the client's preamble and the client's `Hello` (role,
//! address, deployment, nonce) as encoded without its MAC. The client proves it knows
//! the secret with `HMAC(secret, client-label || transcript)`; the server answers
//! with `HMAC(secret, server-label || transcript || client proof)`. A changed byte
//! anywhere in the handshake (a role or an address rewritten on the way) fails the
//! check, labels differ per direction (no reflection), and the secret never travels.

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Length of a nonce in bytes.
pub const NONCE_LEN: usize = 32;

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// Environment variable holding the shared secret itself.
pub const SECRET_ENV: &str = "LEDA_SECRET";

/// Environment variable naming a file that holds the shared secret.
pub const SECRET_FILE_ENV: &str = "LEDA_SECRET_FILE";

/// Environment variable naming the cookie file (default `~/.leda.cookie`).
pub const COOKIE_ENV: &str = "LEDA_COOKIE";

const CLIENT_LABEL: &[u8] = b"leda-net/2 client";
const SERVER_LABEL: &[u8] = b"leda-net/2 server";
const SESSION_LABEL: &[u8] = b"leda-net/3 session";

/// Why no usable secret could be had.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Empty, or shorter than [`MIN_SECRET_LEN`].
    #[error("the shared secret{from} is {len} byte(s); at least {MIN_SECRET_LEN} are required")]
    TooShort {
        /// Its length.
        len: usize,
        /// Where it came from (` in FILE`, ` in LEDA_SECRET`), or empty.
        from: String,
    },
    /// A secret or cookie file that others may read.
    #[error(
        "{path} is readable by other users (mode {mode:o}): it must be a file that only you \
         can read (`chmod 600 FILE`), as it holds the secret that lets a peer run code here"
    )]
    Exposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// A secret or cookie file of another user.
    #[error("{path} belongs to another user (uid {owner})")]
    NotOwned {
        /// The file.
        path: String,
        /// Its owner.
        owner: u32,
    },
    /// No home directory for the cookie, and no `LEDA_COOKIE`.
    #[error("no cookie file: neither {COOKIE_ENV} nor HOME is set")]
    NoHome,
    /// Reading or creating a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A shared secret (never printed).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from bytes (a passphrase works); refused if shorter than
    /// [`MIN_SECRET_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret, SecretError> {
        Secret::checked(bytes.into(), String::new())
    }

    fn checked(bytes: Vec<u8>, from: String) -> Result<Secret, SecretError> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort {
                len: bytes.len(),
                from,
            });
        }
        Ok(Secret(bytes))
    }

    /// The secret held in `path` (surrounding whitespace removed); the file must be
    /// this user's and readable by no one else.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Secret, SecretError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let io = |source| SecretError::Io {
            path: shown.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        check_private(path, &meta)?;
        let raw = std::fs::read(path).map_err(io)?;
        let text = raw.trim_ascii().to_vec();
        Secret::checked(text, format!(" in {shown}"))
    }

    /// The secret of the environment: `LEDA_SECRET` (surrounding whitespace removed, as
    /// from a file), else the file named by `LEDA_SECRET_FILE`; `None` if neither is set.
    pub fn from_env() -> Result<Option<Secret>, SecretError> {
        if let Some(v) = std::env::var_os(SECRET_ENV) {
            let from = format!(" in {SECRET_ENV}");
            let v = v.into_encoded_bytes();
            return Secret::checked(v.trim_ascii().to_vec(), from).map(Some);
        }
        match std::env::var_os(SECRET_FILE_ENV) {
            Some(p) => Secret::from_file(PathBuf::from(p)).map(Some),
            None => Ok(None),
        }
    }

    /// The per-user cookie (`LEDA_COOKIE`, else `~/.leda.cookie`), created with 32
    /// random bytes and mode 0600 if it does not exist.
    pub fn cookie() -> Result<Secret, SecretError> {
        let path = match std::env::var_os(COOKIE_ENV) {
            Some(p) => PathBuf::from(p),
            None => {
                let home = std::env::var_os("HOME").ok_or(SecretError::NoHome)?;
                PathBuf::from(home).join(".leda.cookie")
            }
        };
        if !path.exists() {
            create_cookie(&path)?;
        }
        Secret::from_file(&path)
    }

    /// The secret a process uses when none is configured: the environment's, else
    /// the cookie.
    pub fn for_user() -> Result<Secret, SecretError> {
        match Secret::from_env()? {
            Some(s) => Ok(s),
            None => Secret::cookie(),
        }
    }

    fn mac(&self, label: &[u8], transcript: &[u8; 32], extra: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(label);
        m.update(transcript);
        m.update(extra);
        m
    }

    /// The key both ends of a connection derive once its handshake has succeeded: over
    /// the transcript and the client's proof, known to no one without the secret.
    pub(crate) fn session_key(&self, transcript: &[u8; 32], client_proof: &[u8]) -> [u8; 32] {
        self.mac(SESSION_LABEL, transcript, client_proof)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The client's proof over the handshake's transcript.
    pub fn client_proof(&self, transcript: &[u8; 32]) -> Vec<u8> {
        self.mac(CLIENT_LABEL, transcript, &[])
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// The server's proof over the transcript and the client's proof.
    pub fn server_proof(&self, transcript: &[u8; 32], client_proof: &[u8]) -> Vec<u8> {
        self.mac(SERVER_LABEL, transcript, client_proof)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    /// Checks a client's proof in constant time.
    pub fn verify_client(&self, transcript: &[u8; 32], proof: &[u8]) -> bool {
        self.mac(CLIENT_LABEL, transcript, &[])
            .verify_slice(proof)
            .is_ok()
    }

    /// Checks a server's proof in constant time.
    pub fn verify_server(&self, transcript: &[u8; 32], client_proof: &[u8], proof: &[u8]) -> bool {
        self.mac(SERVER_LABEL, transcript, client_proof)
            .verify_slice(proof)
            .is_ok()
    }
}

/// The hash of a handshake: both preambles and the client's hello without its MAC.
pub fn transcript(server_preamble: &[u8], client_preamble: &[u8], hello: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [server_preamble, client_preamble, hello] {
        h.update((part.len() as u32).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// Refuses a file others may read or another user owns.
pub(crate) fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), SecretError> {
    let shown = path.display().to_string();
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::Exposed { path: shown, mode });
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(SecretError::NotOwned {
            path: shown,
            owner: meta.uid(),
        });
    }
    Ok(())
}

/// Writes a new cookie to `path`: a private temporary file, then a hard link to the
/// final name, so that two processes starting at once both read a whole cookie (the
/// second one's link fails and it reads the first one's).
fn create_cookie(path: &Path) -> Result<(), SecretError> {
    let io = |source| SecretError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    let written = f.write_all(hex.as_bytes()).and_then(|()| f.sync_all());
    drop(f);
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "created the cookie file");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(e)),
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
    fn proofs_check_secret_transcript_and_direction() {
        let s = Secret::new("open sesame, please").unwrap();
        let t = transcript(b"server", b"client", b"hello");
        let p = s.client_proof(&t);
        assert!(s.verify_client(&t, &p));
        assert!(
            !Secret::new("wrong secret, sorry")
                .unwrap()
                .verify_client(&t, &p)
        );
        let other = transcript(b"server", b"client", b"hellO");
        assert!(!s.verify_client(&other, &p), "any changed byte fails");
        let sp = s.server_proof(&t, &p);
        assert!(s.verify_server(&t, &p, &sp));
        assert!(
            !s.verify_server(&t, &p, &p),
            "a client proof is no server proof"
        );
        assert!(!s.verify_client(&t, &p[..31]));
    }

    #[test]
    fn short_secrets_and_exposed_files_are_refused() {
        assert!(matches!(
            Secret::new(""),
            Err(SecretError::TooShort { len: 0, .. })
        ));
        assert!(matches!(
            Secret::new("s3cret"),
            Err(SecretError::TooShort { len: 6, .. })
        ));
        let dir = std::env::temp_dir().join(format!("leda-auth-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("secret");
        std::fs::write(&f, "a secret of enough length\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::from_file(&f).unwrap_err();
        assert!(matches!(e, SecretError::Exposed { mode: 0o644, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Secret::from_file(&f).unwrap();
        assert_eq!(s.0, b"a secret of enough length");
        // A cookie is created private, once, and read back the same.
        let c = dir.join("cookie");
        create_cookie(&c).unwrap();
        let mode = std::fs::metadata(&c).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = Secret::from_file(&c).unwrap().0;
        assert_eq!(first.len(), 64);
        create_cookie(&c).unwrap();
        assert_eq!(
            Secret::from_file(&c).unwrap().0,
            first,
            "an existing cookie stays"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
