//! A minimal client of etcd's v3 lock API through its gRPC gateway (JSON over HTTP/1.1, one
//! keep-alive connection), for the benchmark and `lock-check` against etcd. Only what they
//! need: lease grant and keep-alive, lock (with its revision as the fence), unlock.
//!
//! Not the `etcd-client` crate: it speaks gRPC (tonic, prost and a protobuf toolchain at
//! build time) to do these three calls, for a peer the benchmark alone uses and CI never
//! runs; the gateway's JSON is what etcd documents for clients without gRPC. One
//! keep-alive connection per benchmark thread, as a gRPC channel would be.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The connection failed.
    #[error("etcd connection: {0}")]
    Io(#[from] std::io::Error),
    /// The response could not be understood.
    #[error("etcd response: {0}")]
    Protocol(String),
    /// etcd answered with an error status.
    #[error("etcd returned HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
}

/// One keep-alive HTTP connection to an etcd member.
#[derive(Debug)]
pub struct EtcdClient {
    host: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// Standard base64 (etcd's JSON gateway carries keys and names as base64).
pub fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

impl EtcdClient {
    /// Connects to `addr` (`host:port` of the client URL).
    pub fn connect(addr: &str) -> Result<Self, EtcdError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(EtcdClient {
            host: addr.to_owned(),
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// POSTs `body` (JSON) to `path` and returns the JSON response.
    pub fn post(&mut self, path: &str, body: &str) -> Result<serde_json::Value, EtcdError> {
        write!(
            self.writer,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        )?;
        self.writer.flush()?;
        let (status, body) = self.read_response()?;
        if status != 200 {
            return Err(EtcdError::Status {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        serde_json::from_slice(&body).map_err(|e| EtcdError::Protocol(e.to_string()))
    }

    fn read_response(&mut self) -> Result<(u16, Vec<u8>), EtcdError> {
        let mut head = Vec::new();
        loop {
            let n = self.reader.read_until(b'\n', &mut head)?;
            if n == 0 {
                return Err(EtcdError::Protocol("connection closed".into()));
            }
            if head.ends_with(b"\r\n\r\n") {
                break;
            }
            if head.len() > 64 * 1024 {
                return Err(EtcdError::Protocol("response head too large".into()));
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        resp.parse(&head)
            .map_err(|e| EtcdError::Protocol(e.to_string()))?;
        let status = resp.code.unwrap_or(0);
        let header = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
        };
        let body = if let Some(len) = header("content-length") {
            let len: usize = len
                .parse()
                .map_err(|_| EtcdError::Protocol(format!("bad content-length {len:?}")))?;
            let mut body = vec![0; len];
            self.reader.read_exact(&mut body)?;
            body
        } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let mut line = String::new();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| EtcdError::Protocol(format!("bad chunk size {line:?}")))?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
            body
        } else {
            return Err(EtcdError::Protocol("response without a length".into()));
        };
        Ok((status, body))
    }

    /// Grants a lease of `ttl` seconds and returns its id.
    pub fn lease_grant(&mut self, ttl: u64) -> Result<String, EtcdError> {
        let v = self.post("/v3/lease/grant", &format!(r#"{{"TTL":{ttl}}}"#))?;
        v.get("ID")
            .and_then(|id| {
                id.as_str()
                    .map(str::to_owned)
                    .or_else(|| id.as_i64().map(|i| i.to_string()))
            })
            .ok_or_else(|| EtcdError::Protocol(format!("lease grant without an ID: {v}")))
    }

    /// Acquires lock `name` under `lease`; returns the lock's key (base64) for unlock.
    pub fn lock(&mut self, name: &str, lease: &str) -> Result<String, EtcdError> {
        self.lock_fenced(name, lease).map(|(key, _)| key)
    }

    /// Acquires lock `name` under `lease`; returns the lock's key and the store's revision
    /// when the lock was granted, which serves as the fence: a later holder's grant comes
    /// after this holder's key was deleted (unlock or lease expiry), a write that raises the
    /// revision.
    pub fn lock_fenced(&mut self, name: &str, lease: &str) -> Result<(String, u64), EtcdError> {
        let body = format!(
            r#"{{"name":"{}","lease":"{lease}"}}"#,
            base64(name.as_bytes())
        );
        let v = self.post("/v3/lock/lock", &body)?;
        let key = v
            .get("key")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| EtcdError::Protocol(format!("lock without a key: {v}")))?;
        let revision = v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| EtcdError::Protocol(format!("lock without a revision: {v}")))?;
        Ok((key, revision))
    }

    /// Renews `lease`; returns its remaining TTL in seconds (0: it had expired).
    pub fn keepalive(&mut self, lease: &str) -> Result<u64, EtcdError> {
        let v = self.post("/v3/lease/keepalive", &format!(r#"{{"ID":"{lease}"}}"#))?;
        Ok(v["result"]["TTL"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0))
    }

    /// Releases the lock whose key `lock` returned.
    pub fn unlock(&mut self, key: &str) -> Result<(), EtcdError> {
        self.post("/v3/lock/unlock", &format!(r#"{{"key":"{key}"}}"#))?;
        Ok(())
    }
}

/// A free loopback address (bound, then let go).
fn free_addr() -> Result<String, EtcdError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

/// Where an etcd member runs: an argv prefix (e.g. `ip netns exec NS`), its peer and client
/// addresses.
#[derive(Debug, Clone)]
pub struct Member {
    /// Prepended to the `etcd` command line.
    pub prefix: Vec<String>,
    /// Its peer address (host:port).
    pub peer: String,
    /// Its client address (host:port).
    pub client: String,
}

/// `n` members on loopback, on free ports.
pub fn loopback_members(n: usize) -> Result<Vec<Member>, EtcdError> {
    (0..n)
        .map(|_| {
            Ok(Member {
                prefix: Vec::new(),
                peer: free_addr()?,
                client: free_addr()?,
            })
        })
        .collect()
}

/// Starts an etcd cluster of `members` (the `etcd` binary on PATH), their data under `data`,
/// member `i`'s stderr to `stderr(i)`, and waits until every member grants a lease (at most
/// 30 s). Returns the member processes and their client addresses.
pub fn spawn_cluster(
    members: &[Member],
    data: &std::path::Path,
    stderr: impl Fn(usize) -> std::process::Stdio,
) -> Result<(Vec<std::process::Child>, Vec<String>), EtcdError> {
    let n = members.len();
    let peers: Vec<&str> = members.iter().map(|m| m.peer.as_str()).collect();
    let clients: Vec<String> = members.iter().map(|m| m.client.clone()).collect();
    let cluster: Vec<String> = (0..n)
        .map(|i| format!("m{i}=http://{}", peers[i]))
        .collect();
    let mut procs = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let (program, pre) = match m.prefix.split_first() {
            Some((p, rest)) => (p.as_str(), rest),
            None => ("etcd", &[][..]),
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(pre);
        if !m.prefix.is_empty() {
            cmd.arg("etcd");
        }
        let child = cmd
            .arg("--name")
            .arg(format!("m{i}"))
            .arg("--data-dir")
            .arg(data.join(format!("m{i}")))
            .arg("--listen-client-urls")
            .arg(format!("http://{}", clients[i]))
            .arg("--advertise-client-urls")
            .arg(format!("http://{}", clients[i]))
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", peers[i]))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{}", peers[i]))
            .arg("--initial-cluster")
            .arg(cluster.join(","))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr(i))
            .spawn()?;
        procs.push(child);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for addr in &clients {
        while EtcdClient::connect(addr)
            .and_then(|mut c| c.lease_grant(5))
            .is_err()
        {
            if std::time::Instant::now() > deadline {
                for p in &mut procs {
                    let _ = p.kill();
                    let _ = p.wait();
                }
                return Err(EtcdError::Protocol(format!(
                    "etcd member at {addr} not up within 30 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok((procs, clients))
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
