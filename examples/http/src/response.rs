//! Response heads and the small error bodies.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::error::HttpError;

/// An HTTP status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    /// 200 OK.
    pub const OK: Status = Status(200);
    /// 301 Moved Permanently (a directory named without its trailing slash).
    pub const MOVED: Status = Status(301);
    /// 304 Not Modified.
    pub const NOT_MODIFIED: Status = Status(304);
    /// 400 Bad Request.
    pub const BAD_REQUEST: Status = Status(400);
    /// 403 Forbidden.
    pub const FORBIDDEN: Status = Status(403);
    /// 404 Not Found.
    pub const NOT_FOUND: Status = Status(404);
    /// 405 Method Not Allowed.
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    /// 408 Request Timeout.
    pub const REQUEST_TIMEOUT: Status = Status(408);
    /// 413 Content Too Large.
    pub const PAYLOAD_TOO_LARGE: Status = Status(413);
    /// 414 URI Too Long.
    pub const URI_TOO_LONG: Status = Status(414);
    /// 431 Request Header Fields Too Large.
    pub const HEADERS_TOO_LARGE: Status = Status(431);
    /// 500 Internal Server Error.
    pub const INTERNAL_ERROR: Status = Status(500);
    /// 501 Not Implemented.
    pub const NOT_IMPLEMENTED: Status = Status(501);
    /// 503 Service Unavailable.
    pub const UNAVAILABLE: Status = Status(503);

    /// The reason phrase.
    pub fn reason(self) -> &'static str {
        match self.0 {
            200 => "OK",
            301 => "Moved Permanently",
            304 => "Not Modified",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            413 => "Content Too Large",
            414 => "URI Too Long",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            503 => "Service Unavailable",
            _ => "Unknown",
        }
    }
}

/// The current time in whole seconds since the epoch: what the `Date` header shows
/// (a head made in this second can be reused for the rest of it).
pub fn current_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Appends the `Date` header value, formatted once per second per thread.
fn push_http_date_now(h: &mut String) {
    thread_local! {
        static CACHE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        h.push_str(&c.1);
    })
}

/// Builds a response head.
///
/// `content_length` is always sent (also for HEAD and 304, where it describes the
/// representation), so that clients can keep the connection alive.
pub fn head(
    status: Status,
    content_type: Option<&str>,
    content_length: u64,
    last_modified: Option<SystemTime>,
    keep_alive: bool,
    extra: &[(&str, &str)],
) -> Bytes {
    let mut h = String::with_capacity(256);
    // Writing to a String cannot fail.
    let _ = write!(
        h,
        "HTTP/1.1 {} {}\r\nServer: leda-httpd\r\nDate: ",
        status.0,
        status.reason(),
    );
    push_http_date_now(&mut h);
    h.push_str("\r\n");
    if let Some(ct) = content_type {
        let _ = write!(h, "Content-Type: {ct}\r\n");
    }
    if status != Status::NOT_MODIFIED {
        let _ = write!(h, "Content-Length: {content_length}\r\n");
    }
    if let Some(lm) = last_modified {
        let _ = write!(h, "Last-Modified: {}\r\n", httpdate::HttpDate::from(lm));
    }
    for (k, v) in extra {
        let _ = write!(h, "{k}: {v}\r\n");
    }
    h.push_str(if keep_alive {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    Bytes::from(h)
}

/// A complete error response (head and a small HTML body).
pub fn error(err: &HttpError, keep_alive: bool) -> (Bytes, Bytes) {
    let status = err.status();
    let body = format!(
        "<html><head><title>{0} {1}</title></head><body><h1>{0} {1}</h1></body></html>\n",
        status.0,
        status.reason()
    );
    let extra: &[(&str, &str)] = match err {
        HttpError::MethodNotAllowed => &[("Allow", "GET, HEAD")],
        HttpError::Unavailable => &[("Retry-After", "1")],
        _ => &[],
    };
    let h = head(
        status,
        Some("text/html; charset=utf-8"),
        body.len() as u64,
        None,
        keep_alive,
        extra,
    );
    (h, Bytes::from(body))
}

/// A `301` to `location` (a directory requested without its trailing slash).
pub fn redirect(location: &str, keep_alive: bool) -> (Bytes, Bytes) {
    let body = Bytes::from_static(b"<html><body>Moved</body></html>\n");
    let h = head(
        Status::MOVED,
        Some("text/html; charset=utf-8"),
        body.len() as u64,
        None,
        keep_alive,
        &[("Location", location)],
    );
    (h, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_carry_length_and_connection() {
        let h = head(Status::OK, Some("text/plain"), 12, None, true, &[]);
        let s = std::str::from_utf8(&h).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(s.contains("Content-Length: 12\r\n"));
        assert!(s.ends_with("Connection: keep-alive\r\n\r\n"));
        let (h, body) = error(&HttpError::MethodNotAllowed, false);
        let s = std::str::from_utf8(&h).unwrap();
        assert!(s.contains("405 Method Not Allowed") && s.contains("Allow: GET, HEAD"));
        assert!(s.contains(&format!("Content-Length: {}\r\n", body.len())));
    }
}
