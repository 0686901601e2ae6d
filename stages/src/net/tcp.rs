//! `net.tcp.accept`, `net.tcp.read`, `net.tcp.write`.

use leda_core::error::SendError;
use leda_core::prelude::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::listen_addr;
use crate::StageError;
use crate::args::{named_or_first, positive_attr, seconds_attr};
use crate::io::MAX_LINE;

/// An accepted (or connected) TCP socket with its read buffer: the local attachment
/// that `accept` emits and `read`/`write` take.
#[derive(Debug)]
pub struct Connection {
    stream: BufReader<TcpStream>,
    peer: String,
}

impl Connection {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Connection {
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        Connection {
            stream: BufReader::new(stream),
            peer,
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Reads one line (without its end-of-line) of at most [`MAX_LINE`] bytes (1 MiB, as
    /// `io.lines`); `None`
    /// at end of stream. See [`Connection::read_line_max`].
    pub async fn read_line(&mut self) -> std::io::Result<Option<String>> {
        self.read_line_max(MAX_LINE).await
    }

    /// Reads one line (without its end-of-line, `\n` or `\r\n`; the last line before
    /// the end of stream may have none); `None` at end of stream. A line longer than
    /// `max` bytes (end-of-line not counted) is an `InvalidData` error, read no further
    /// than `max` + 2 bytes: the connection is not usable after it.
    pub async fn read_line_max(&mut self, max: usize) -> std::io::Result<Option<String>> {
        let mut buf = Vec::new();
        loop {
            let avail = self.stream.fill_buf().await?;
            if avail.is_empty() {
                if buf.is_empty() {
                    return Ok(None);
                }
                break;
            }
            let nl = avail.iter().position(|&b| b == b'\n');
            let used = nl.map_or(avail.len(), |i| i + 1);
            if buf.len() + used > max.saturating_add(2) {
                return Err(line_too_long(max));
            }
            buf.extend_from_slice(&avail[..used]);
            self.stream.consume(used);
            if nl.is_some() {
                buf.pop();
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                break;
            }
        }
        if buf.len() > max {
            return Err(line_too_long(max));
        }
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }

    /// Reads what is available, at most `max` bytes (and at most [`MAX_CHUNK`]);
    /// `None` at end of stream.
    pub async fn read_some(&mut self, max: usize) -> std::io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0; max.clamp(1, MAX_CHUNK)];
        let n = self.stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// Writes all of `data` and flushes.
    pub async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        let s = self.stream.get_mut();
        s.write_all(data).await?;
        s.flush().await
    }
}

/// The largest `size` of `net.tcp.read` in chunk mode (bytes): 1 MiB.
pub const MAX_CHUNK: usize = 1 << 20;

/// How long `net.tcp.read` waits for data by default (seconds) before it closes an
/// idle connection.
pub const IDLE_TIMEOUT: f64 = 60.0;

fn line_too_long(max: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("a line longer than {max} bytes (end-of-line not counted)"),
    )
}

/// `net.tcp.accept` (parallel; asynchronous).
///
/// * **Event**: `(host, port)`, `("host:port")` or `(port)`; port 0 picks a free one.
/// * **Attribute `count`** (optional): stop after this many connections (otherwise
///   accept for ever).
/// * **Port `client`** (or 1): `(peer address)` with the [`Connection`] attached;
///   must be a local connector.
/// * **Port `listening`** (optional): `(bound address)` once listening.
/// * **bind**: `client` (or 1) must be connected.
pub fn accept() -> Stage {
    crate::args::waiting("accept", |ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let addr = listen_addr(&ev).ok_or_else(|| {
            StageError::event(&name, "expected (host, port), (\"host:port\") or (port)")
        })?;
        let limit = positive_attr(&name, ctx.attrs(), "count")?;
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|e| StageError::io(&name, format!("listen on {addr}"), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| StageError::io(&name, "local address", e))?;
        tracing::info!(stage = %name, %bound, "listening");
        if ctx.has_output("listening") {
            ctx.send_wait("listening", bound.to_string()).await?;
        }
        let port = named_or_first(&ctx, "client");
        let mut accepted = 0usize;
        while limit.is_none_or(|n| accepted < n) {
            let (stream, peer) = listener
                .accept()
                .await
                .map_err(|e| StageError::io(&name, "accept", e))?;
            accepted += 1;
            let _ = stream.set_nodelay(true);
            let ev = Event::new()
                .with(peer.to_string())
                .attach(Connection::new(stream));
            match ctx.send_wait(&port, ev).await {
                Ok(()) => {}
                Err(SendError::Stopped) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    })
    .bind(|b| {
        if !b.has_output("client") && !b.has_output(1) {
            return Err(format!(
                "accept '{}': 'client' port must be connected",
                b.name
            ));
        }
        Ok(())
    })
}

fn take_conn(name: &str, ev: &mut Event) -> Result<Connection, StageError> {
    ev.take_attachment::<Connection>().ok_or_else(|| {
        StageError::event(
            name,
            "the event carries no TCP connection (use a local connector from net.tcp.accept)",
        )
    })
}

/// How `net.tcp.read` reads, from its attributes.
struct ReadAttrs {
    /// Chunk mode (`Some(size)`) or line mode (`None`).
    chunk: Option<usize>,
    max_line: usize,
    idle: std::time::Duration,
}

fn read_attrs(stage: &str, attrs: &Attrs) -> Result<ReadAttrs, StageError> {
    let chunk = match attrs.get("mode") {
        None | Some(Value::Nil) => false,
        Some(Value::Str(m)) if m == "line" => false,
        Some(Value::Str(m)) if m == "chunk" => true,
        Some(v) => {
            return Err(StageError::attr(
                stage,
                "mode",
                format!("must be \"line\" or \"chunk\", not {v}"),
            ));
        }
    };
    let size = positive_attr(stage, attrs, "size")?.unwrap_or(64 * 1024);
    if size > MAX_CHUNK {
        return Err(StageError::attr(
            stage,
            "size",
            format!("must be at most {MAX_CHUNK} bytes, not {size}"),
        ));
    }
    let max_line = positive_attr(stage, attrs, "max_line")?.unwrap_or(MAX_LINE);
    let idle = seconds_attr(stage, attrs, "idle_timeout")?.unwrap_or(IDLE_TIMEOUT);
    let idle = std::time::Duration::try_from_secs_f64(idle)
        .map_err(|e| StageError::attr(stage, "idle_timeout", e.to_string()))?;
    Ok(ReadAttrs {
        chunk: chunk.then_some(size),
        max_line,
        idle,
    })
}

/// `net.tcp.read` (parallel; asynchronous).
///
/// * **Event**: anything, with a [`Connection`] attached.
/// * **Attribute `mode`**: `"line"` (default: one line, without end-of-line) or
///   `"chunk"` (what is available, up to attribute `size` bytes, default 64 KiB, at
///   most [`MAX_CHUNK`], as bytes).
/// * **Attribute `max_line`** (bytes, default [`MAX_LINE`], 1 MiB, as `io.lines`): in line mode, a
///   longer line (end-of-line not counted) is an error of that connection: the
///   handler's error (to the `error` port when connected), and the socket is closed.
///   Memory per connection stays bounded by it.
/// * **Attribute `idle_timeout`** (seconds, default [`IDLE_TIMEOUT`], 60): a
///   connection that sends nothing for that long is closed, as if the peer had
///   closed it (`closed` gets `(peer, "idle timeout")`). Each waiting read holds one
///   of the stage's instances (256 at most), so without it idle clients would starve
///   the others.
/// * **Port 1**: `(data)` with the connection attached.
/// * **Port `closed`** (optional): `(peer)` when the peer closed the connection, or
///   `(peer, "idle timeout")` when it was idle too long; the socket is then dropped.
/// * **bind**: `mode`, `size`, `max_line` and `idle_timeout`, when set, must be valid.
pub fn read() -> Stage {
    crate::args::waiting("read", |mut ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let mut conn = take_conn(&name, &mut ev)?;
        let how = read_attrs(&name, ctx.attrs())?;
        let read = async {
            Ok::<_, std::io::Error>(match how.chunk {
                Some(size) => conn.read_some(size).await?.map(|b| Value::Bytes(b.into())),
                None => conn.read_line_max(how.max_line).await?.map(Value::Str),
            })
        };
        let data = match tokio::time::timeout(how.idle, read).await {
            Ok(r) => {
                r.map_err(|e| StageError::io(&name, format!("read from {}", conn.peer()), e))?
            }
            Err(_) => {
                tracing::debug!(stage = %name, peer = %conn.peer(), "idle connection closed");
                if ctx.has_output("closed") {
                    ctx.send_wait("closed", (conn.peer().to_owned(), "idle timeout"))
                        .await?;
                }
                return Ok(());
            }
        };
        match data {
            Some(d) => ctx.send_wait(1, Event::new().with(d).attach(conn)).await?,
            None if ctx.has_output("closed") => {
                ctx.send_wait("closed", conn.peer().to_owned()).await?
            }
            None => {}
        }
        Ok(())
    })
    .bind(|b| {
        read_attrs(b.name, b.attrs).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// `net.tcp.write` (parallel; asynchronous).
///
/// * **Event**: `(data...)` with a [`Connection`] attached; each string or bytes
///   argument is written in order (numbers as text).
/// * **Attribute `close`** (default false): close the connection after writing.
/// * **Port 1** (optional): `()` with the connection attached, to read the next
///   request (keep-alive); if not connected (or `close`), the socket is closed.
pub fn write() -> Stage {
    crate::args::waiting("write", |mut ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let mut conn = take_conn(&name, &mut ev)?;
        for v in ev.args() {
            let bytes: Vec<u8> = match v {
                Value::Str(s) => s.clone().into_bytes(),
                Value::Bytes(b) => b.to_vec(),
                Value::Int(_) | Value::Float(_) => v.to_string().into_bytes(),
                other => {
                    return Err(StageError::event(
                        &name,
                        format!("cannot write a {}", other.type_name()),
                    )
                    .into());
                }
            };
            conn.write_all(&bytes)
                .await
                .map_err(|e| StageError::io(&name, format!("write to {}", conn.peer()), e))?;
        }
        let close = ctx
            .attrs()
            .get("close")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if !close && ctx.has_output(1) {
            ctx.send_wait(1, Event::new().attach(conn)).await?;
        }
        Ok(())
    })
}
