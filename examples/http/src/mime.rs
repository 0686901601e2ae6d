//! Content-Type by file extension.

use std::path::Path;

/// The media type served for `path`, by its extension (case-insensitive).
pub fn content_type(path: &Path) -> &'static str {
    // Lowercased on the stack: no extension served here is longer than 5 bytes.
    let mut buf = [0u8; 8];
    let ext = path.extension().and_then(|e| {
        let e = e.as_encoded_bytes();
        let lower = buf.get_mut(..e.len())?;
        for (l, b) in lower.iter_mut().zip(e) {
            *l = b.to_ascii_lowercase();
        }
        std::str::from_utf8(lower).ok()
    });
    match ext {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("txt" | "md" | "lua") => "text/plain; charset=utf-8",
        Some("xml") => "application/xml",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("ico") => "image/x-icon",
        Some("wasm") => "application/wasm",
        Some("pdf") => "application/pdf",
        Some("zip") => "application/zip",
        Some("gz") => "application/gzip",
        Some("woff") => "font/woff",
        Some("woff2") => "font/woff2",
        Some("mp4") => "video/mp4",
        Some("mp3") => "audio/mpeg",
        _ => "application/octet-stream",
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
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
    }
}
