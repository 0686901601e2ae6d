//! From a request target to a file under the root: percent-decoding, refusal of `..`,
//! and a canonical-path check that catches symlinks leading out of the root.
//!
//! The decoder is this module's, not `percent-encoding`'s: that crate passes a
//! malformed escape (`%zz`, a trailing `%`) through as literal text, where a server
//! must refuse it (400): two components that read the same path differently are how
//! path-confusion attacks start. NUL bytes are refused too.

use std::borrow::Cow;
use std::ffi::{CStr, OsStr, OsString};
use std::fs::Metadata;
use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::error::HttpError;
use crate::sys;

/// Decodes `%XX` escapes. Malformed escapes and NUL bytes are refused. A path without
/// escapes is returned as it is (no copy).
pub fn percent_decode(s: &[u8]) -> Result<Cow<'_, [u8]>, HttpError> {
    if !s.contains(&b'%') {
        if s.contains(&0) {
            return Err(HttpError::BadRequest("NUL in path"));
        }
        return Ok(Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                let hex = |b: u8| match b {
                    b'0'..=b'9' => Some(b - b'0'),
                    b'a'..=b'f' => Some(b - b'a' + 10),
                    b'A'..=b'F' => Some(b - b'A' + 10),
                    _ => None,
                };
                let (Some(h), Some(l)) = (
                    s.get(i + 1).copied().and_then(hex),
                    s.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(HttpError::BadRequest("malformed percent-escape"));
                };
                out.push(h << 4 | l);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    if out.contains(&0) {
        return Err(HttpError::BadRequest("NUL in path"));
    }
    Ok(Cow::Owned(out))
}

/// What a request path resolved to.
#[derive(Debug)]
pub enum Resolved {
    /// A regular file under the root.
    File {
        /// Its canonical path.
        path: PathBuf,
        /// Its metadata.
        meta: Metadata,
    },
    /// A directory named without its trailing slash: redirect to `location`.
    Redirect {
        /// The path with a trailing slash.
        location: String,
    },
}

/// The document root: its canonical path, and a descriptor of it for the fast path of
/// [`Root::resolve`].
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    dir: Option<OwnedFd>,
}

impl Root {
    /// The root at `path`, which must be canonical. Without a descriptor of it (it
    /// cannot be opened), every request takes the slow path.
    pub fn new(path: PathBuf) -> Root {
        let dir = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(&path)
            .ok()
            .map(OwnedFd::from);
        Root { path, dir }
    }

    /// The root at `path` (canonical), shared: every instance of every stage serving
    /// the same root uses one descriptor of it (an async stage has one instance per
    /// connection it is waiting on).
    pub fn shared(path: PathBuf) -> Arc<Root> {
        static ROOTS: Mutex<Vec<Weak<Root>>> = Mutex::new(Vec::new());
        let mut roots = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
        roots.retain(|w| w.strong_count() > 0);
        if let Some(r) = roots
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.path == path)
        {
            return r;
        }
        let r = Arc::new(Root::new(path));
        roots.push(Arc::downgrade(&r));
        r
    }

    /// The shared [`Root`] of the configured document root `dir` (canonicalized first:
    /// a stage's setting may name it through a symlink or relatively).
    pub fn of(dir: &Path) -> Result<Arc<Root>, String> {
        std::fs::canonicalize(dir)
            .map(Root::shared)
            .map_err(|e| format!("document root {}: {e}", dir.display()))
    }

    /// Its canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What [`resolve`] answers, found faster in the common case, a regular file
    /// reached through no symlink: one `openat2(2)` walk from the root's descriptor,
    /// which the kernel keeps beneath the root and fails on any symlink (see
    /// [`sys::open_beneath`]), then an `fstat` (three system calls, where `resolve`
    /// makes one `readlink` per path component and a `stat`, each walking from `/`).
    /// Without symlinks and `..` the joined path is canonical, so it is the same answer.
    /// Anything else (a symlink, a directory, an error, an old kernel) goes through
    /// [`resolve`], unchanged.
    pub fn resolve(&self, decoded: &[u8]) -> Result<Resolved, HttpError> {
        if let Some(dir) = &self.dir
            && let Some(found) = self.plain_file(dir.as_fd(), decoded)
        {
            return Ok(found);
        }
        resolve(&self.path, decoded)
    }

    /// Opens for reading the file at `canonical`, a path [`Root::resolve`] answered,
    /// as it is now: the open itself stays beneath the root and follows no symlink (a
    /// canonical path has none), so a directory swapped for a symlink since the
    /// resolution is refused (`ELOOP`), never followed out of the root. Where the
    /// kernel lacks `openat2` (or a seccomp filter refuses it), the file is opened by path
    /// (`O_NOFOLLOW`) and refused unless `/proc/self/fd` shows the descriptor at
    /// `canonical`.
    pub fn open(&self, canonical: &Path) -> std::io::Result<std::fs::File> {
        let outside = || std::io::Error::new(ErrorKind::PermissionDenied, "not under the root");
        let rel = canonical.strip_prefix(&self.path).map_err(|_| outside())?;
        if let Some(dir) = &self.dir {
            let rel = std::ffi::CString::new(rel.as_os_str().as_bytes())?;
            match sys::open_beneath(dir.as_fd(), &rel, libc::O_RDONLY) {
                // No `openat2` (old kernel), or one a seccomp filter refuses.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {}
                opened => return opened.map(std::fs::File::from),
            }
        }
        let file = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(canonical)?;
        let at = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
        if at != canonical {
            return Err(outside());
        }
        Ok(file)
    }

    fn plain_file(&self, dir: BorrowedFd<'_>, decoded: &[u8]) -> Option<Resolved> {
        if decoded.first() != Some(&b'/') {
            return None;
        }
        // One buffer: the root, '/', the relative path and a NUL. The kernel gets the
        // relative part (NUL-terminated), the answer is the rest (no copy).
        let root = self.path.as_os_str().as_bytes();
        let mut full = Vec::with_capacity(root.len() + decoded.len() + 2);
        full.extend_from_slice(root);
        full.push(b'/');
        let start = full.len();
        for seg in decoded.split(|&b| b == b'/') {
            match seg {
                b"" | b"." => {}
                b".." => return None,
                // Dotfiles (`.git`, `.env`, ...): left to `resolve`, which refuses them.
                s if hidden(s) => return None,
                s => {
                    if full.len() > start {
                        full.push(b'/');
                    }
                    full.extend_from_slice(s);
                }
            }
        }
        if full.len() == start {
            return None;
        }
        full.push(0);
        let rel = CStr::from_bytes_with_nul(&full[start..]).ok()?;
        let fd = sys::open_beneath(dir, rel, libc::O_PATH).ok()?;
        let meta = std::fs::File::from(fd).metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        full.pop();
        // The root "/" gives "//rel": drop the doubled slash.
        if root == b"/" {
            full.remove(0);
        }
        let path = PathBuf::from(OsString::from_vec(full));
        Some(Resolved::File { path, meta })
    }
}

/// Resolves the decoded path `decoded` (it must start with `/`) under `root` (which
/// must be canonical). Directories are served through their `index.html`; there is no
/// directory listing.
pub fn resolve(root: &Path, decoded: &[u8]) -> Result<Resolved, HttpError> {
    if decoded.first() != Some(&b'/') {
        return Err(HttpError::BadRequest("path must start with '/'"));
    }
    let mut full = root.to_path_buf();
    // The path as a clean absolute one (`//a/./b` is `/a/b`): what a redirect names,
    // never `//a/`, which a browser reads as the host `a`.
    let mut clean = String::new();
    for seg in decoded.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => return Err(HttpError::Forbidden),
            // Dotfiles and dot-directories are not served: 404, as if absent.
            s if hidden(s) => return Err(HttpError::NotFound),
            s => {
                full.push(OsStr::from_bytes(s));
                clean.push('/');
                clean.push_str(&String::from_utf8_lossy(s));
            }
        }
    }
    let (path, meta) = canonical_under(root, &full)?;
    if meta.is_dir() {
        if !decoded.ends_with(b"/") {
            clean.push('/');
            return Ok(Resolved::Redirect {
                location: encode_location(&clean),
            });
        }
        let (path, meta) = match canonical_under(root, &path.join("index.html")) {
            Err(HttpError::NotFound) => return Err(HttpError::Forbidden),
            other => other?,
        };
        if !meta.is_file() {
            return Err(HttpError::Forbidden);
        }
        return Ok(Resolved::File { path, meta });
    }
    if !meta.is_file() {
        return Err(HttpError::Forbidden);
    }
    Ok(Resolved::File { path, meta })
}

/// Whether a path segment names a dotfile or dot-directory, which are never served
/// (`.git`, `.env`, `.htpasswd`...), except `.well-known` (RFC 8615: there for the
/// public, as ACME challenges and `security.txt`).
fn hidden(segment: &[u8]) -> bool {
    segment.starts_with(b".") && segment != b".well-known"
}

/// Canonicalizes `p` (following every symlink) and checks that it stays under `root`.
fn canonical_under(root: &Path, p: &Path) -> Result<(PathBuf, Metadata), HttpError> {
    let real = std::fs::canonicalize(p).map_err(|e| match e.kind() {
        ErrorKind::PermissionDenied => HttpError::Forbidden,
        _ => HttpError::NotFound,
    })?;
    if !real.starts_with(root) {
        return Err(HttpError::Forbidden);
    }
    // A symlink into a dotfile or dot-directory under the root is refused too.
    let hidden = real
        .strip_prefix(root)
        .is_ok_and(|rel| rel.components().any(|c| hidden(c.as_os_str().as_bytes())));
    if hidden {
        return Err(HttpError::NotFound);
    }
    let meta = std::fs::metadata(&real).map_err(|e| match e.kind() {
        ErrorKind::PermissionDenied => HttpError::Forbidden,
        _ => HttpError::NotFound,
    })?;
    Ok((real, meta))
}

/// Escapes what may not appear raw in a `Location` header.
fn encode_location(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding() {
        assert_eq!(&*percent_decode(b"/a%20b").unwrap(), b"/a b");
        assert_eq!(&*percent_decode(b"/%2e%2E/").unwrap(), b"/../");
        assert!(percent_decode(b"/%zz").is_err());
        assert!(percent_decode(b"/%2").is_err());
        assert!(percent_decode(b"/a%00").is_err());
        // Without escapes: the same bytes, not copied; NUL still refused.
        assert!(matches!(
            percent_decode(b"/a/b.txt"),
            Ok(Cow::Borrowed(b"/a/b.txt"))
        ));
        assert!(percent_decode(b"/a\0").is_err());
    }

    #[test]
    fn traversal_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("out")).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("in")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let fast = Root::shared(root.clone());
        assert!(fast.dir.is_some());
        assert!(Arc::ptr_eq(&fast, &Root::shared(root.clone())));
        // The fast path answers exactly as the slow one, for every kind of path.
        for p in [
            &b"/a.txt"[..],
            b"//a.txt",
            b"/./a.txt",
            b"/a.txt/",
            b"/in",
            b"/out",
            b"/../secret",
            b"/sub/../a.txt",
            b"/sub/",
            b"/sub",
            b"/nope",
            b"/sub/nope",
            b"/",
            b"a.txt",
        ] {
            let show = |r: Result<Resolved, HttpError>| match r {
                Ok(Resolved::File { path, meta }) => format!("file {path:?} {}", meta.len()),
                Ok(Resolved::Redirect { location }) => format!("redirect {location}"),
                Err(e) => format!("error {e}"),
            };
            let p_text = String::from_utf8_lossy(p);
            assert_eq!(show(fast.resolve(p)), show(resolve(&root, p)), "{p_text}");
        }
        assert!(matches!(
            fast.resolve(b"/in"),
            Ok(Resolved::File { path, .. }) if path == root.join("a.txt")
        ));
        assert!(matches!(
            resolve(&root, b"/a.txt"),
            Ok(Resolved::File { .. })
        ));
        assert_eq!(
            resolve(&root, b"/../secret").unwrap_err(),
            HttpError::Forbidden
        );
        assert_eq!(resolve(&root, b"/out").unwrap_err(), HttpError::Forbidden);
        assert_eq!(resolve(&root, b"/sub/").unwrap_err(), HttpError::Forbidden);
        assert_eq!(resolve(&root, b"/nope").unwrap_err(), HttpError::NotFound);
        assert!(matches!(
            resolve(&root, b"/sub"),
            Ok(Resolved::Redirect { .. })
        ));
        assert!(resolve(&root, b"a.txt").is_err());
    }

    /// Dotfiles and dot-directories are not served, directly or through a symlink,
    /// and a directory's redirect is a clean path (`//sub` must not become
    /// `Location: //sub/`, which a browser reads as the host `sub`).
    #[test]
    fn dotfiles_and_protocol_relative_redirects() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(root.join(".well-known/.private")).unwrap();
        std::fs::write(root.join(".well-known/security.txt"), "Contact: x").unwrap();
        std::fs::write(root.join(".well-known/.private/key"), "x").unwrap();
        std::fs::write(root.join(".env"), "SECRET=1").unwrap();
        std::fs::write(root.join(".git/config"), "x").unwrap();
        std::os::unix::fs::symlink(".env", root.join("env")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let fast = Root::shared(root.clone());
        for p in [
            &b"/.env"[..],
            b"/.git/config",
            b"/sub/../.env",
            b"/./.env",
            b"/env",
            b"/.well-known/.private/key",
        ] {
            let p_text = String::from_utf8_lossy(p);
            for r in [fast.resolve(p), resolve(&root, p)] {
                assert!(
                    matches!(r, Err(HttpError::NotFound) | Err(HttpError::Forbidden)),
                    "{p_text}"
                );
            }
        }
        // `.well-known` is the one dot-directory served.
        for r in [
            fast.resolve(b"/.well-known/security.txt"),
            resolve(&root, b"/.well-known/security.txt"),
        ] {
            assert!(matches!(r, Ok(Resolved::File { .. })), "{:?}", r.is_ok());
        }
        for (p, want) in [
            (&b"//sub"[..], "/sub/"),
            (b"///sub", "/sub/"),
            (b"/./sub", "/sub/"),
            (b"/sub", "/sub/"),
        ] {
            match fast.resolve(p) {
                Ok(Resolved::Redirect { location }) => assert_eq!(location, want),
                other => panic!("{}: {:?}", String::from_utf8_lossy(p), other.is_ok()),
            }
        }
    }
}
