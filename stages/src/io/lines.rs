//! `io.lines`: Listing 4.2 in Rust.

use std::io::{BufRead, Read};

use leda_core::error::SendError;
use leda_core::prelude::*;

use crate::StageError;
use crate::args::named_or_first;

/// `io.lines` (parallel; asynchronous sends).
///
/// * **Event**: `(filename)`.
/// * **Port `line`** (or 1 when `line` is not connected): `(line)` for each line,
///   without its end-of-line (`\n` or `\r\n`); invalid UTF-8 is replaced.
/// * **Port `io_error`** (optional): `(filename, "Open error: ...")` when the file
///   cannot be opened, `(filename, "Read error: ...")` when reading fails. When it is
///   not connected, the failure is the handler's error.
/// * **Port `eof`** (optional): `()`, an event with no arguments, after the last
///   line: a *tick* that flushes a window (`window.spatial`) fed by several readers.
/// * **Attribute `bytes`** (default false): send each line as bytes (reference-counted:
///   copies of a window of such lines share them) instead of text.
/// * **Attribute `chunk`** (bytes, optional): send `(bytes)` chunks of about `chunk`
///   bytes of whole lines, each line with its end-of-line, instead of one event per
///   line (see [`read_chunk`]; a line longer than [`MAX_LINE`] is a read error).
/// * **bind**: `line` (or 1) must be connected.
///
/// A full destination queue parks the instance (no worker held) until there is room,
/// so a large file never overruns its consumer and no line is lost.
pub fn lines() -> Stage {
    crate::args::waiting("lines", |ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let filename = match ev.arg(0) {
            Some(Value::Str(s)) => s.clone(),
            other => {
                let t = other.map_or("nothing", |v| v.type_name());
                return Err(StageError::event(
                    &name,
                    format!("argument 1 (file name) must be a string, not {t}"),
                )
                .into());
            }
        };
        let file = match std::fs::File::open(&filename) {
            Ok(f) => f,
            Err(e) => return report(&mut ctx, &name, &filename, "Open error", e).await,
        };
        let port = named_or_first(&ctx, "line");
        let as_bytes = ctx
            .attrs()
            .get("bytes")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let chunk = match ctx.attrs().get("chunk") {
            None | Some(Value::Nil) => None,
            Some(Value::Int(n)) if *n > 0 => Some(*n as usize),
            Some(v) => {
                return Err(StageError::attr(
                    &name,
                    "chunk",
                    format!("must be a positive integer, not {v}"),
                )
                .into());
            }
        };
        if let Some(size) = chunk {
            let mut file = file;
            let mut carry = Vec::new();
            loop {
                match read_chunk(&mut file, &mut carry, size) {
                    Ok(Some(c)) => match ctx.send_wait(&port, Value::Bytes(c.into())).await {
                        Ok(()) => {}
                        Err(SendError::Stopped) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    },
                    Ok(None) => return eof(&mut ctx).await,
                    Err(e) => return report(&mut ctx, &name, &filename, "Read error", e).await,
                }
            }
        }
        let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
        let mut buf = Vec::with_capacity(256);
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => return eof(&mut ctx).await,
                Ok(_) => {
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                        if buf.last() == Some(&b'\r') {
                            buf.pop();
                        }
                    }
                    let line = if as_bytes {
                        Value::Bytes(bytes::Bytes::copy_from_slice(&buf))
                    } else {
                        match std::str::from_utf8(&buf) {
                            Ok(s) => Value::Str(s.to_owned()),
                            Err(_) => Value::Str(String::from_utf8_lossy(&buf).into_owned()),
                        }
                    };
                    match ctx.send_wait(&port, line).await {
                        Ok(()) => {}
                        Err(SendError::Stopped) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return report(&mut ctx, &name, &filename, "Read error", e).await,
            }
        }
    })
    .bind(|b| {
        if !b.has_output("line") && !b.has_output(1) {
            return Err(format!("lines '{}': 'line' port must be connected", b.name));
        }
        Ok(())
    })
}

/// The `eof` tick, if `eof` is connected.
async fn eof(ctx: &mut Ctx) -> HandlerResult {
    if ctx.has_output("eof") {
        match ctx.send_wait("eof", Event::new()).await {
            Ok(()) | Err(SendError::Stopped) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The longest line [`read_chunk`] accepts (bytes).
pub const MAX_LINE: usize = 1 << 20;

/// Reads the next chunk of whole lines from `reader`: about `size` bytes (more when a
/// line is longer), ending after a `\n`, or at the end of the input (where the last
/// line may have none). `carry` keeps the partial line that follows the chunk, for the
/// next call (start with it empty). `Ok(None)` at the end; a line longer than
/// [`MAX_LINE`] is an `InvalidData` error, so a file without newlines cannot take
/// unbounded memory.
pub fn read_chunk(
    reader: &mut impl Read,
    carry: &mut Vec<u8>,
    size: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut want = size.max(1);
    let mut buf = Vec::with_capacity(carry.len() + want);
    buf.append(carry);
    let mut scanned = 0;
    loop {
        // One read call per chunk when the input gives it whole (a file does).
        let mut eof = false;
        let mut len = buf.len();
        buf.resize(want.max(len), 0);
        while len < buf.len() {
            match reader.read(&mut buf[len..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(len);
        if let Some(i) = buf[scanned..].iter().rposition(|&b| b == b'\n') {
            carry.extend_from_slice(&buf[scanned + i + 1..]);
            buf.truncate(scanned + i + 1);
            return Ok(Some(buf));
        }
        if eof {
            return Ok((!buf.is_empty()).then_some(buf));
        }
        if buf.len() > MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line is longer than {MAX_LINE} bytes"),
            ));
        }
        scanned = buf.len();
        want = buf.len() * 2;
    }
}

async fn report(
    ctx: &mut Ctx,
    name: &str,
    filename: &str,
    what: &str,
    e: std::io::Error,
) -> HandlerResult {
    if ctx.has_output("io_error") {
        ctx.send_wait("io_error", (filename.to_owned(), format!("{what}: {e}")))
            .await?;
        Ok(())
    } else {
        Err(StageError::io(name, format!("{what} {filename}"), e).into())
    }
}
