//! The little HTTP/1.1 the dashboard needs: one request per connection, parsed with
//! httparse, answered with a complete body and `Connection: close`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Time a client has to send its whole request head (a client that drips bytes is
/// dropped), and each write of the answer.
pub(super) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// A parsed request: method, path, decoded query pairs, bearer token, and whether the
/// client prefers Graphviz DOT.
pub(super) struct Request {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: Vec<(String, String)>,
    pub(super) bearer: Option<String>,
    pub(super) wants_dot: bool,
    /// `Host`, if sent.
    pub(super) host: Option<String>,
    /// `Origin`, else `Referer`, if sent: where a browser request comes from.
    pub(super) origin: Option<String>,
}

impl Request {
    /// The value of query parameter `k`.
    pub(super) fn q(&self, k: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request head; `None` when the peer closed or sent something unparsable.
pub(super) fn read_request(stream: &mut TcpStream) -> Result<Option<Request>, std::io::Error> {
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        // The whole head within the deadline, however the bytes drip in.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let target = req.path.unwrap_or("/");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let header = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                };
                let bearer = header("authorization")
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::to_owned);
                let wants_dot = header("accept").is_some_and(|a| a.contains("text/vnd.graphviz"));
                // The values the Host and Origin checks compare: one that is not UTF-8,
                // or a header given twice, compares as what it is — not ours — instead of
                // passing for absent (a review found both checks failing open).
                let checked = |name: &str| {
                    let mut found = req
                        .headers
                        .iter()
                        .filter(|h| h.name.eq_ignore_ascii_case(name));
                    let first = found.next()?;
                    Some(match found.next() {
                        Some(_) => format!("(several {name} headers)"),
                        None => String::from_utf8_lossy(first.value).into_owned(),
                    })
                };
                return Ok(Some(Request {
                    method: req.method.unwrap_or("GET").to_owned(),
                    path: path.to_owned(),
                    query: parse_query(query),
                    bearer,
                    wants_dot,
                    host: checked("host"),
                    origin: checked("origin").or_else(|| checked("referer")),
                }));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

/// `a=1&b=x%20y` as pairs (`form_urlencoded`: `+` is a space, bad escapes kept as
/// they are).
fn parse_query(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Writes a complete response.
pub(super) fn respond(
    stream: &mut TcpStream,
    status: u16,
    ctype: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Method Not Allowed",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}

/// Writes `v` as a JSON response.
pub(super) fn json<T: serde::Serialize>(stream: &mut TcpStream, v: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    respond(stream, 200, "application/json", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_percent_decoded() {
        let q = parse_query("stage=sink%20%22q%22&n=4&flag&x=a+b&bad=%zz");
        assert_eq!(
            q,
            vec![
                ("stage".into(), "sink \"q\"".into()),
                ("n".into(), "4".into()),
                ("flag".into(), "".into()),
                ("x".into(), "a b".into()),
                ("bad".into(), "%zz".into()),
            ]
        );
    }
}
