//! `net.http`: an HTTP/1.1 GET client on asynchronous sockets.

use std::time::Duration;

use leda_core::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::args::{positive_attr, seconds_attr};

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not `http://host[:port][/path]`.
    #[error("bad URL '{0}': expected http://host[:port][/path]")]
    BadUrl(String),
    /// The URL holds a space or a control character (CR and LF would end the request
    /// line and inject headers or a second request): they must be percent-encoded.
    #[error("bad URL {0:?}: spaces and control characters must be percent-encoded")]
    UnsafeUrl(String),
    /// Connecting, writing or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No complete answer within the time limit.
    #[error("timed out after {0} s")]
    Timeout(f64),
    /// The answer is not HTTP, or is cut short.
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The body exceeds the size limit.
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    /// A status other than 2xx.
    #[error("HTTP {0} {1}")]
    Status(u16, String),
}

/// A parsed `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// Host name or address.
    pub host: String,
    /// Port (80 by default).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses `http://host[:port][/path]` (no TLS, no user info). A URL with a space
    /// or a control character (CR, LF...) is refused ([`HttpError::UnsafeUrl`]): the
    /// path goes verbatim into the request line.
    pub fn parse(url: &str) -> Result<Url, HttpError> {
        if url.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(HttpError::UnsafeUrl(url.to_owned()));
        }
        let bad = || HttpError::BadUrl(url.to_owned());
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| bad())?)
            }
            _ => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Url {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            path,
        })
    }
}

fn decode_chunked(mut b: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    loop {
        let line_end = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| HttpError::Malformed("chunk size line cut short".into()))?;
        let size_text = std::str::from_utf8(&b[..line_end])
            .map_err(|_| HttpError::Malformed("chunk size is not text".into()))?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| HttpError::Malformed(format!("bad chunk size '{size_text}'")))?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let end = size
            .checked_add(2)
            .filter(|&end| end <= b.len())
            .ok_or_else(|| HttpError::Malformed("chunk cut short".into()))?;
        out.extend_from_slice(&b[..size]);
        b = &b[end..];
    }
}

/// GETs `url` and returns the body of a 2xx answer. `limit` bounds the whole answer.
pub async fn http_get(url: &str, timeout: Duration, limit: usize) -> Result<Vec<u8>, HttpError> {
    let u = Url::parse(url)?;
    let work = async {
        let mut s = TcpStream::connect((u.host.as_str(), u.port)).await?;
        let host = if u.port == 80 {
            u.host.clone()
        } else {
            format!("{}:{}", u.host, u.port)
        };
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: leda-rs\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            u.path
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::with_capacity(8 * 1024);
        let mut tmp = [0u8; 16 * 1024];
        loop {
            let n = s.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            if buf.len() + n > limit {
                return Err(HttpError::TooLarge(limit));
            }
            buf.extend_from_slice(&tmp[..n]);
            // Stop early once a Content-Length body is complete (servers that keep
            // the connection open despite `Connection: close`).
            if let Some(done) = complete_len(&buf)
                && buf.len() >= done
            {
                break;
            }
        }
        parse_response(&buf)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout(timeout.as_secs_f64())),
    }
}

/// Total length of the answer if its head is complete and gives a Content-Length.
fn complete_len(buf: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    match r.parse(buf) {
        Ok(httparse::Status::Complete(head)) => r
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| {
                std::str::from_utf8(h.value)
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .map(|n| head + n),
        _ => None,
    }
}

fn parse_response(buf: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(HttpError::Malformed("response head cut short".into()));
        }
        Err(e) => return Err(HttpError::Malformed(e.to_string())),
    };
    let code = r.code.unwrap_or(0);
    let body = &buf[head..];
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        decode_chunked(body)?
    } else if let Some(len) = header("content-length") {
        let n: usize = len
            .parse()
            .map_err(|_| HttpError::Malformed(format!("bad Content-Length '{len}'")))?;
        if body.len() < n {
            return Err(HttpError::Malformed(format!(
                "body cut short: {} of {n} bytes",
                body.len()
            )));
        }
        body[..n].to_vec()
    } else {
        body.to_vec()
    };
    if !(200..300).contains(&code) {
        return Err(HttpError::Status(code, r.reason.unwrap_or("").to_owned()));
    }
    Ok(body)
}

/// `net.http` (parallel; asynchronous): fetches the URL it receives.
///
/// * **Event**: `(url, extra...)`, an `http://` URL (no TLS).
/// * **Attributes**: `timeout` (seconds, default 10), `max_size` (bytes, default 16 MiB).
/// * **URL**: a space or control character in it (CR, LF...) is refused, so an URL
///   built from event data cannot add headers or a second request.
/// * **bind**: `timeout` and `max_size`, when set, must be valid.
/// * **Port 1**: `(body, extra...)`, the body as a string (bytes if not UTF-8), for
///   a 2xx answer.
/// * **Port `http_error`** (optional): `(url, reason)` on failure (bad URL, refused
///   connection, timeout, non-2xx status...). Not connected: the failure is the
///   handler's error.
pub fn http_stage() -> Stage {
    crate::args::waiting("http", |mut ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let (timeout, limit) = http_attrs(&name, ctx.attrs())?;
        let url = match ev.take(0) {
            Value::Str(s) => s,
            other => format!("{other}"),
        };
        match http_get(&url, timeout, limit).await {
            Ok(body) => {
                let body = match String::from_utf8(body) {
                    Ok(s) => Value::Str(s),
                    Err(e) => Value::Bytes(e.into_bytes().into()),
                };
                let out = Event::from_values(
                    std::iter::once(body).chain(ev.args().iter().skip(1).cloned()),
                );
                ctx.send_wait(1, out).await?;
                Ok(())
            }
            Err(e) if ctx.has_output("http_error") => {
                ctx.send_wait("http_error", (url, e.to_string())).await?;
                Ok(())
            }
            Err(e) => Err(crate::StageError::protocol(&name, format!("GET {url:?}: {e}")).into()),
        }
    })
    .bind(|b| {
        http_attrs(b.name, b.attrs).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// `timeout` (default 10 s) and `max_size` (default 16 MiB) of `net.http`.
fn http_attrs(stage: &str, attrs: &Attrs) -> Result<(Duration, usize), crate::StageError> {
    let timeout = match seconds_attr(stage, attrs, "timeout")? {
        // `seconds_attr` admits only what a `Duration` holds.
        Some(s) => Duration::try_from_secs_f64(s)
            .map_err(|e| crate::StageError::attr(stage, "timeout", e.to_string()))?,
        None => Duration::from_secs(10),
    };
    let limit = positive_attr(stage, attrs, "max_size")?.unwrap_or(16 << 20);
    Ok((timeout, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:8080/q?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 8080, "/q?x=1")
        );
        let u = Url::parse("http://example.org").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        let u = Url::parse("http://h?x").unwrap();
        assert_eq!(u.path, "/?x");
        for bad in [
            "https://x/",
            "http://",
            "http://h:99999/",
            "ftp://x",
            "http://u@h/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    /// A review (2026-11-27): the path went verbatim into the request line, so CR/LF in a URL injected
    /// headers and a second request.
    #[test]
    fn urls_with_spaces_or_control_characters_are_refused() {
        for bad in [
            "http://127.0.0.1:1/a HTTP/1.1\r\nX-Injected: yes\r\n\r\nGET /smuggled",
            "http://h/a\nb",
            "http://h/a b",
            "http://h\r\n/",
            "http://h/\x7f",
            "http://h/\0",
        ] {
            assert!(
                matches!(Url::parse(bad), Err(HttpError::UnsafeUrl(_))),
                "{bad:?}"
            );
        }
        assert!(Url::parse("http://h/a%20b%0D%0A").is_ok());
    }

    /// A review (2026-11-27): a chunk size of 2^64 - 1 overflowed `size + 2` (a panic).
    #[test]
    fn a_huge_chunk_size_is_malformed_not_a_panic() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc\r\n0\r\n\r\n",
        );
        assert!(matches!(r, Err(HttpError::Malformed(_))), "{r:?}");
    }

    #[test]
    fn responses() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA";
        assert_eq!(parse_response(ok).unwrap(), b"hello");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), b"hello world");
        let close = b"HTTP/1.0 200 OK\r\n\r\nuntil close";
        assert_eq!(parse_response(close).unwrap(), b"until close");
        assert!(matches!(
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\n"),
            Err(HttpError::Status(404, _))
        ));
        assert!(matches!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab"),
            Err(HttpError::Malformed(_))
        ));
        assert!(matches!(
            parse_response(b"garbage\r\n\r\n"),
            Err(HttpError::Malformed(_))
        ));
        assert!(matches!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            Err(HttpError::Malformed(_))
        ));
    }
}
