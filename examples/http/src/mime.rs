//! Content-Type by file extension: `mime_guess`'s table (about a thousand
//! extensions), with `charset=utf-8` on the text types a site serves, and `.md` and
//! `.lua` as plain text (shown by a browser, not downloaded).

use std::path::Path;

/// The media type served for `path`, by its extension (case-insensitive).
pub fn content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext.eq_ignore_ascii_case("md") || ext.eq_ignore_ascii_case("lua") {
        return "text/plain; charset=utf-8";
    }
    match mime_guess::from_ext(ext).first_raw() {
        Some("text/html") => "text/html; charset=utf-8",
        Some("text/css") => "text/css; charset=utf-8",
        Some("text/plain") => "text/plain; charset=utf-8",
        Some("text/javascript" | "application/javascript") => "text/javascript; charset=utf-8",
        Some(other) => other,
        None => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_extension() {
        assert_eq!(
            content_type(Path::new("/a/b.HTML")),
            "text/html; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("x.png")), "image/png");
        assert_eq!(
            content_type(Path::new("app.js")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type(Path::new("page.lua")),
            "text/plain; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("f.woff2")), "font/woff2");
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
    }
}
