//! Request parsing with `httparse`, under the server's limits.
//!
//! [`parse`] looks at the bytes received so far and answers: a complete request head,
//! "need more", or the error to answer with. [`fuzz_parse`] is the body of the cargo-fuzz
//! target (`fuzz/`), also exercised by the unit tests.

use std::mem::MaybeUninit;
use std::time::SystemTime;

use bytes::Bytes;

use crate::config::Config;
use crate::error::HttpError;

/// The request methods the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// HEAD: like GET, without the body.
    Head,
}

/// A parsed request head.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// GET or HEAD.
    pub method: Method,
    /// The path part of the target, still percent-encoded.
    pub path: String,
    /// The query string (after `?`), if any.
    pub query: Option<String>,
    /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Whether the client wants the connection kept open.
    pub keep_alive: bool,
    /// The `If-Modified-Since` date, if present and valid.
    pub if_modified_since: Option<SystemTime>,
    /// The declared body length (read and discarded).
    pub content_length: usize,
    /// The number of header fields.
    pub header_count: usize,
    /// The request head's bytes, when the connection kept them (see
    /// [`Request::headers`]); empty from [`parse`] alone.
    pub raw: Bytes,
    /// Bytes the head took in the buffer.
    pub head_len: usize,
}

impl Request {
    /// All header fields (names as sent, values trimmed), for CGI scripts: parsed
    /// again from [`raw`](Self::raw) on demand, so that static requests never copy them.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut slots = vec![httparse::EMPTY_HEADER; self.header_count];
        let mut req = httparse::Request::new(&mut slots);
        if !matches!(req.parse(&self.raw), Ok(httparse::Status::Complete(_))) {
            return Vec::new();
        }
        req.headers
            .iter()
            .map(|h| {
                let value = String::from_utf8_lossy(h.value);
                (h.name.to_owned(), value.trim().to_owned())
            })
            .collect()
    }
}

/// Header slots on the stack: enough for the default `max_headers`.
const STACK_HEADERS: usize = 64;

/// The outcome of looking at a buffer.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// A whole request head.
    Complete(Request),
    /// Not enough bytes yet.
    Partial,
}

/// Finds where a request head ends in a buffer that grows as bytes arrive, looking
/// at each byte about once: a client that drips its request a byte at a time costs
/// linear work, not a full parse per read. The head is parsed ([`parse`]) once, when
/// it is whole.
#[derive(Debug, Default)]
pub struct HeadScan {
    /// Bytes already searched (the next search starts a little before, so that a
    /// terminator split across reads is found).
    scanned: usize,
    /// Where the first line ends, once seen.
    first_line: Option<usize>,
    /// Bytes looked at so far (what the linearity test counts).
    pub examined: usize,
}

impl HeadScan {
    /// Forgets the previous head (the buffer now starts with the next request).
    pub fn reset(&mut self) {
        self.scanned = 0;
        self.first_line = None;
    }

    /// `Ok(true)` when `buf` holds a whole head (through its empty line), `Ok(false)`
    /// when more is needed; the limits of `cfg` on the request line (414) and on the
    /// head (431) are checked as the bytes arrive.
    pub fn complete(&mut self, buf: &[u8], cfg: &Config) -> Result<bool, HttpError> {
        let from = self.scanned.saturating_sub(2);
        let mut found = false;
        for (i, &b) in buf.iter().enumerate().skip(from) {
            self.examined += 1;
            if b != b'\n' {
                continue;
            }
            self.first_line.get_or_insert(i);
            // An empty line: `\n\n` or `\n\r\n`.
            if buf.get(i + 1) == Some(&b'\n')
                || (buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n'))
            {
                found = true;
                break;
            }
        }
        self.scanned = buf.len();
        match self.first_line {
            Some(n) if n > cfg.max_request_line + 1 => return Err(HttpError::UriTooLong),
            None if buf.len() > cfg.max_request_line + 1 => return Err(HttpError::UriTooLong),
            _ => {}
        }
        if !found && buf.len() > cfg.max_header_bytes {
            return Err(HttpError::HeadersTooLarge);
        }
        Ok(found)
    }
}

/// Parses the request head at the start of `buf`, enforcing the limits of `cfg`.
pub fn parse(buf: &[u8], cfg: &Config) -> Result<Parsed, HttpError> {
    // The request line first: its own limit gives 414, not 431.
    let line_end = buf
        .iter()
        .take(cfg.max_request_line + 2)
        .position(|&b| b == b'\n');
    match line_end {
        None if buf.len() > cfg.max_request_line + 1 => return Err(HttpError::UriTooLong),
        Some(n) if n > cfg.max_request_line + 1 => return Err(HttpError::UriTooLong),
        _ => {}
    }
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots = if cfg.max_headers <= STACK_HEADERS {
        &mut stack[..cfg.max_headers]
    } else {
        heap.resize_with(cfg.max_headers, MaybeUninit::uninit);
        &mut heap[..]
    };
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(buf, slots) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadersTooLarge),
        Err(httparse::Error::Version) => return Err(HttpError::BadRequest("bad version")),
        Err(_) => return Err(HttpError::BadRequest("malformed request")),
    };
    let head_len = match status {
        httparse::Status::Partial => {
            if buf.len() > cfg.max_header_bytes {
                return Err(HttpError::HeadersTooLarge);
            }
            return Ok(Parsed::Partial);
        }
        httparse::Status::Complete(n) => n,
    };
    if head_len > cfg.max_header_bytes {
        return Err(HttpError::HeadersTooLarge);
    }
    let minor_version = req.version.unwrap_or(1);
    let target = req.path.unwrap_or("");
    let mut keep_alive = minor_version >= 1;
    let mut host = false;
    let mut content_length: Option<usize> = None;
    let mut if_modified_since = None;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| HttpError::BadRequest("non-UTF-8 header value"))?
            .trim();
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            if host {
                return Err(HttpError::BadRequest("more than one Host"));
            }
            host = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && minor_version == 0 {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            // Digits only (RFC 9110 §8.6): `parse` would also take a leading `+`, which
            // a proxy in front may read differently (request smuggling).
            let n: usize = Some(value)
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
                .ok_or(HttpError::BadRequest("bad Content-Length"))?;
            if content_length.is_some_and(|m| m != n) {
                return Err(HttpError::BadRequest("conflicting Content-Length"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::NotImplemented("request transfer codings"));
        } else if name.eq_ignore_ascii_case("if-modified-since") {
            if_modified_since = httpdate::parse_http_date(value).ok();
        }
    }
    if minor_version == 1 && !host {
        return Err(HttpError::BadRequest("HTTP/1.1 request without Host"));
    }
    let method = match req.method {
        Some("GET") => Method::Get,
        Some("HEAD") => Method::Head,
        _ => return Err(HttpError::MethodNotAllowed),
    };
    let content_length = content_length.unwrap_or(0);
    if content_length > cfg.max_body {
        return Err(HttpError::PayloadTooLarge);
    }
    let (path, query) = split_target(target)?;
    Ok(Parsed::Complete(Request {
        method,
        path: path.to_owned(),
        query: query.map(str::to_owned),
        minor_version,
        keep_alive,
        if_modified_since,
        content_length,
        header_count: req.headers.len(),
        raw: Bytes::new(),
        head_len,
    }))
}

/// Splits an origin-form (`/p?q`) or absolute-form (`http://host/p?q`) target into
/// path and query.
fn split_target(target: &str) -> Result<(&str, Option<&str>), HttpError> {
    let target = target.split('#').next().unwrap_or("");
    let rest = if target.starts_with('/') {
        target
    } else if let Some(after) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        match after.find('/') {
            Some(i) => &after[i..],
            None => "/",
        }
    } else {
        return Err(HttpError::BadRequest("request target must be a path"));
    };
    Ok(match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    })
}

/// The body of the fuzz target: any bytes must parse, ask for more, or be refused
/// with an error status, never panic; a parsed request's path goes through decoding.
pub fn fuzz_parse(data: &[u8]) {
    let cfg = Config::default();
    if let Ok(Parsed::Complete(req)) = parse(data, &cfg) {
        assert!(req.head_len <= data.len());
        assert!(req.head_len <= cfg.max_header_bytes);
        if let Ok(decoded) = crate::path::percent_decode(req.path.as_bytes()) {
            assert!(!decoded.contains(&0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Parsed, HttpError> {
        parse(s.as_bytes(), &Config::default())
    }

    fn complete(s: &str) -> Request {
        match p(s) {
            Ok(Parsed::Complete(r)) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn versions_and_keep_alive() {
        let r = complete("GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!((r.path.as_str(), r.query.as_deref()), ("/a", Some("b=1")));
        assert!(r.keep_alive);
        assert!(!complete("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(!complete("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(complete("HEAD / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert_eq!(
            complete("GET http://h/x HTTP/1.1\r\nHost: h\r\n\r\n").path,
            "/x"
        );
    }

    #[test]
    fn header_fields_from_the_kept_head() {
        let text = "GET /p.lua HTTP/1.1\r\nHost: x\r\nX-A:  one \r\nAccept: */*\r\n\r\n";
        let mut r = complete(text);
        assert_eq!(r.header_count, 3);
        // Not kept (parse alone): none.
        assert!(r.headers().is_empty());
        r.raw = Bytes::copy_from_slice(&text.as_bytes()[..r.head_len]);
        let fields: Vec<(String, String)> = [("Host", "x"), ("X-A", "one"), ("Accept", "*/*")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(r.headers(), fields);
    }

    #[test]
    fn partial_and_errors() {
        assert_eq!(p("GET / HTTP/1.1\r\nHost:"), Ok(Parsed::Partial));
        assert_eq!(
            p("GET / HTTP/1.1\r\n\r\n"),
            Err(HttpError::BadRequest("HTTP/1.1 request without Host"))
        );
        assert_eq!(
            p("POST / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Err(HttpError::MethodNotAllowed)
        );
        assert_eq!(
            p("GET * HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap_err()
                .status()
                .0,
            400
        );
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(9000));
        assert_eq!(p(&long), Err(HttpError::UriTooLong));
        assert_eq!(p(&"a".repeat(9000)), Err(HttpError::UriTooLong));
        let many: String = (0..70).map(|i| format!("X-{i}: v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n");
        assert_eq!(p(&many), Err(HttpError::HeadersTooLarge));
        // A limit above the slots kept on the stack: allowed that many.
        let cfg = Config {
            max_headers: 100,
            ..Config::default()
        };
        match parse(many.as_bytes(), &cfg) {
            Ok(Parsed::Complete(r)) => assert_eq!(r.header_count, 71),
            other => panic!("{other:?}"),
        }
        let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n", "v".repeat(17000));
        assert_eq!(p(&big), Err(HttpError::HeadersTooLarge));
        assert_eq!(
            p("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"),
            Err(HttpError::PayloadTooLarge)
        );
        assert_eq!(
            p("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap_err()
                .status()
                .0,
            501
        );
    }

    /// A deterministic mutation loop over valid requests: the fuzz target's body on
    /// stable, in every test run.
    /// A head dripped in one byte at a time is searched about once per byte (the
    /// whole-buffer parse on every read it replaces was quadratic: ~n²/2 bytes), is
    /// found whole exactly when its empty line arrives, and parses.
    #[test]
    fn a_dripped_head_costs_linear_work() {
        let cfg = Config::default();
        let mut head = String::from("GET /index.html HTTP/1.1\r\nHost: x\r\n");
        for i in 0..16 {
            head.push_str(&format!("X-Filler-{i}: {}\r\n", "abcdefghij".repeat(24)));
        }
        head.push_str("\r\n");
        let bytes = head.as_bytes();
        let mut scan = HeadScan::default();
        for n in 1..=bytes.len() {
            let whole = scan.complete(&bytes[..n], &cfg).expect("within the limits");
            assert_eq!(whole, n == bytes.len(), "at {n} of {}", bytes.len());
        }
        assert!(
            scan.examined <= 3 * bytes.len(),
            "{} bytes examined for a {}-byte head",
            scan.examined,
            bytes.len()
        );
        assert!(matches!(parse(bytes, &cfg), Ok(Parsed::Complete(_))));
        // The limits hold before the head is whole: an endless request line, and an
        // endless head.
        let mut scan = HeadScan::default();
        let long = format!("GET /{} HTTP/1.1", "a".repeat(cfg.max_request_line + 8));
        assert_eq!(
            scan.complete(long.as_bytes(), &cfg).unwrap_err(),
            HttpError::UriTooLong
        );
        let mut scan = HeadScan::default();
        let mut endless = String::from("GET / HTTP/1.1\r\n");
        while endless.len() <= cfg.max_header_bytes {
            endless.push_str("X-A: b\r\n");
        }
        assert_eq!(
            scan.complete(endless.as_bytes(), &cfg).unwrap_err(),
            HttpError::HeadersTooLarge
        );
    }

    #[test]
    fn fuzz_body_survives_mutations() {
        let seeds: [&[u8]; 3] = [
            b"GET /index.html?x=%41 HTTP/1.1\r\nHost: a\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
            b"HEAD /%2e%2e/%00 HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc",
            b"GET http://h/a/../b HTTP/1.1\r\nHost: h\r\nConnection: close, te\r\n\r\n",
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let mut data = seeds[i % seeds.len()].to_vec();
            for _ in 0..(next() % 8) {
                let pos = (next() as usize) % (data.len() + 1);
                match next() % 3 {
                    0 if pos < data.len() => data[pos] = next() as u8,
                    1 => data.insert(pos, next() as u8),
                    _ => data.truncate(pos),
                }
            }
            fuzz_parse(&data);
        }
    }
}
