//! The embedded default site: what `leda-httpd` serves without `--root`.

use std::path::{Path, PathBuf};

use crate::error::ServerError;

/// The site's files: name and contents.
pub const FILES: &[(&str, &str)] = &[
    ("index.html", include_str!("../site/index.html")),
    ("style.css", include_str!("../site/style.css")),
    ("hello.lua", include_str!("../site/hello.lua")),
    ("loop.lua", include_str!("../site/loop.lua")),
];

/// Writes the site into `dir` (created if needed) and returns it.
pub fn write_to(dir: &Path) -> Result<PathBuf, ServerError> {
    std::fs::create_dir_all(dir).map_err(ServerError::Site)?;
    for (name, text) in FILES {
        let p = dir.join(name);
        // Rewrite only what differs, so that a running server's cache stays valid.
        if std::fs::read_to_string(&p).ok().as_deref() != Some(*text) {
            std::fs::write(&p, text).map_err(ServerError::Site)?;
        }
    }
    Ok(dir.to_path_buf())
}

/// The default place for the embedded site: a per-user directory under the system's
/// temporary directory.
pub fn default_dir() -> PathBuf {
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    std::env::temp_dir().join(format!(
        "leda-httpd-site-{user}-{}",
        env!("CARGO_PKG_VERSION")
    ))
}
