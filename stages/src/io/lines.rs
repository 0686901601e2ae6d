//! `io.lines`: Listing 4.2 in Rust.

use std::io::BufRead;

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
        let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
        let mut buf = Vec::with_capacity(256);
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => {
                    if ctx.has_output("eof") {
                        match ctx.send_wait("eof", Event::new()).await {
                            Ok(()) | Err(SendError::Stopped) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    return Ok(());
                }
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
