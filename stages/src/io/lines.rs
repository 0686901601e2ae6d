//! `io.lines`: Listing 4.2 in Rust.

use std::io::{BufRead, Read};

use leda_core::error::SendError;
use leda_core::prelude::*;

use crate::StageError;
use crate::args::{named_or_first, to_f64};

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
///   A file that cannot be opened, or not read to its end, gets its `eof` too (before
///   the error is reported), so a stage waiting for every source's end still ends.
/// * **Attribute `bytes`** (default false): send each line as bytes (reference-counted:
///   copies of a window of such lines share them) instead of text.
/// * **Attribute `chunk`** (bytes, 1..=[`MAX_LINE`], optional): send `(bytes)` chunks
///   of about `chunk` bytes of whole lines, each line with its end-of-line, instead of
///   one event per line (`bytes` does not apply); see [`read_chunk`].
///
/// In both modes a line longer than [`MAX_LINE`] bytes (its end-of-line not counted)
/// is skipped and reported (on `io_error` as a `Read error`, or as a warning), and
/// reading goes on: both modes give the same lines, in bounded memory.
///
/// A read error that ends the file (either way) sends `eof` first, then is reported:
/// what was read is all there is.
/// * **bind**: `line` (or 1) must be connected; `chunk`, when set, must be valid.
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
        let size = chunk_attr(&name, ctx.attrs())?;
        let file = match std::fs::File::open(&filename) {
            Ok(f) => f,
            Err(e) => {
                // No line will come: the end tick says so, as for a read error.
                eof(&mut ctx).await?;
                return report(&mut ctx, &name, &filename, "Open error", e).await;
            }
        };
        let port = named_or_first(&ctx, "line");
        let as_bytes = ctx
            .attrs()
            .get("bytes")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut reader = match size {
            None => Reader::Lines {
                reader: std::io::BufReader::with_capacity(64 * 1024, file),
                buf: Vec::with_capacity(256),
                as_bytes,
            },
            Some(size) => Reader::Chunks {
                file,
                carry: Vec::new(),
                size,
            },
        };
        loop {
            match reader.next() {
                Ok(Some(v)) => match ctx.send_wait(&port, v).await {
                    Ok(()) => {}
                    Err(SendError::Stopped) => return Ok(()),
                    Err(e) => return Err(e.into()),
                },
                Ok(None) => return eof(&mut ctx).await,
                // An over-long line was skipped: reported (on `io_error`, or as a
                // warning), and reading goes on.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    if ctx.has_output("io_error") {
                        report(&mut ctx, &name, &filename, "Read error", e).await?;
                    } else {
                        tracing::warn!(stage = %name, file = %filename, error = %e, "line skipped");
                    }
                }
                // The file cannot be read further: what was read is all there is (the
                // end tick says so), and the error is reported.
                Err(e) => {
                    eof(&mut ctx).await?;
                    return report(&mut ctx, &name, &filename, "Read error", e).await;
                }
            }
        }
    })
    .bind(|b| {
        if !b.has_output("line") && !b.has_output(1) {
            return Err(format!("lines '{}': 'line' port must be connected", b.name));
        }
        chunk_attr(b.name, b.attrs).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// The `chunk` attribute: `None` when absent (one event per line).
fn chunk_attr(stage: &str, attrs: &Attrs) -> Result<Option<usize>, StageError> {
    match attrs.get("chunk") {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => match to_f64(v) {
            Some(n) if n >= 1.0 && n <= MAX_LINE as f64 && n.fract() == 0.0 => Ok(Some(n as usize)),
            _ => Err(StageError::attr(
                stage,
                "chunk",
                format!("must be a whole number of bytes in 1..={MAX_LINE}, not {v}"),
            )),
        },
    }
}

/// What `io.lines` reads a file with: a line at a time, or chunks of whole lines.
enum Reader {
    Lines {
        reader: std::io::BufReader<std::fs::File>,
        buf: Vec<u8>,
        as_bytes: bool,
    },
    Chunks {
        file: std::fs::File,
        carry: Vec<u8>,
        size: usize,
    },
}

impl Reader {
    /// The next event's value; `None` at the end.
    fn next(&mut self) -> std::io::Result<Option<Value>> {
        match self {
            Reader::Chunks { file, carry, size } => {
                Ok(read_chunk(file, carry, *size)?.map(|c| Value::Bytes(c.into())))
            }
            Reader::Lines {
                reader,
                buf,
                as_bytes,
            } => {
                if !read_line(reader, buf)? {
                    return Ok(None);
                }
                Ok(Some(if *as_bytes {
                    Value::Bytes(bytes::Bytes::copy_from_slice(buf))
                } else {
                    Value::Str(String::from_utf8_lossy(buf).into_owned())
                }))
            }
        }
    }
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

/// The longest line `io.lines` and [`read_chunk`] accept: bytes of the line, its
/// end-of-line (`\n` or `\r\n`) not counted.
pub const MAX_LINE: usize = 1 << 20;

fn too_long() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("a line longer than {MAX_LINE} bytes (end-of-line not counted) was skipped"),
    )
}

/// The length of a line ending with the `\n` at `nl` and starting at 0, without its
/// end-of-line.
fn line_len(buf: &[u8], nl: usize) -> usize {
    if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    }
}

/// Reads the next line into `buf`, without its end-of-line (`\n` or `\r\n`; the
/// last line may have none); `false` at the end. A line longer than [`MAX_LINE`] is
/// skipped up to its `\n` and reported as an `InvalidData` error (the next call goes
/// on after it), holding at most [`MAX_LINE`] bytes and a buffer's worth meanwhile:
/// the same lines as [`read_chunk`] gives.
fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    buf.clear();
    let (mut any, mut skipping) = (false, false);
    loop {
        let avail = match reader.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            // The end: a last line without end-of-line, if any.
            if skipping || buf.len() > MAX_LINE {
                buf.clear();
                return Err(too_long());
            }
            return Ok(any);
        }
        any = true;
        let nl = avail.iter().position(|&b| b == b'\n');
        let used = nl.map_or(avail.len(), |i| i + 1);
        if !skipping {
            buf.extend_from_slice(&avail[..used]);
            // Longer than a line of MAX_LINE bytes with `\r\n`: too long whatever follows.
            if buf.len() > MAX_LINE + 2 {
                skipping = true;
                buf.clear();
            }
        }
        reader.consume(used);
        if nl.is_some() {
            if skipping {
                return Err(too_long());
            }
            let len = line_len(buf, buf.len() - 1);
            buf.truncate(len);
            if len > MAX_LINE {
                buf.clear();
                return Err(too_long());
            }
            return Ok(true);
        }
    }
}

/// Reads into `buf` from its length up to `want` bytes (fewer at the end of the
/// input); returns whether the end was reached. One read call when the input gives
/// the bytes at once (a file does).
fn fill(reader: &mut impl Read, buf: &mut Vec<u8>, want: usize) -> std::io::Result<bool> {
    let mut len = buf.len();
    buf.resize(want.max(len), 0);
    let mut eof = false;
    while len < buf.len() {
        match reader.read(&mut buf[len..]) {
            Ok(0) => {
                eof = true;
                break;
            }
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                buf.truncate(len);
                return Err(e);
            }
        }
    }
    buf.truncate(len);
    Ok(eof)
}

/// Reads the next chunk of whole lines from `reader`: about `size` bytes (at most
/// [`MAX_LINE`]; more when a line is longer), ending after a `\n`, or at the end of the
/// input (where the last line may have none). `carry` keeps the partial line that
/// follows the chunk, for the next call (start with it empty). `Ok(None)` at the end.
///
/// A line longer than [`MAX_LINE`] bytes (its end-of-line not counted) is skipped, up
/// to its `\n`, and reported as an `InvalidData` error: the next call goes on after
/// it, so a file without newlines takes bounded memory and one bad line does not end
/// the file. Other errors are the reader's.
pub fn read_chunk(
    reader: &mut impl Read,
    carry: &mut Vec<u8>,
    size: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    // With chunks no larger than a line may be, only the first line of `buf` can be
    // too long.
    let size = size.clamp(1, MAX_LINE);
    let mut buf = Vec::with_capacity(carry.len() + size);
    buf.append(carry);
    // `buf` grows (doubling) only while it holds no `\n`.
    let mut scanned = 0;
    loop {
        let eof = fill(reader, &mut buf, size.max(scanned * 2))?;
        let first = buf[scanned..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| scanned + i);
        let too_long = match first {
            Some(f) => line_len(&buf, f) > MAX_LINE,
            // No `\n` yet: more than a line of MAX_LINE bytes and `\r` already, or
            // the last line, without end-of-line, is longer than MAX_LINE.
            None => buf.len() > MAX_LINE + 1 || (eof && buf.len() > MAX_LINE),
        };
        if too_long {
            return Err(skip_long(reader, carry, buf, first));
        }
        if first.is_some() {
            let last = buf
                .iter()
                .rposition(|&b| b == b'\n')
                .expect("a newline was found");
            carry.extend_from_slice(&buf[last + 1..]);
            buf.truncate(last + 1);
            return Ok(Some(buf));
        }
        if eof {
            return Ok((!buf.is_empty()).then_some(buf));
        }
        scanned = buf.len();
    }
}

/// Drops the long first line of `buf` (ending at `end`, or further in `reader`) and
/// keeps what follows it in `carry`.
fn skip_long(
    reader: &mut impl Read,
    carry: &mut Vec<u8>,
    mut buf: Vec<u8>,
    end: Option<usize>,
) -> std::io::Error {
    if let Some(f) = end {
        carry.extend_from_slice(&buf[f + 1..]);
        return too_long();
    }
    loop {
        buf.clear();
        let eof = match fill(reader, &mut buf, 64 * 1024) {
            Ok(eof) => eof,
            Err(e) => return e,
        };
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            carry.extend_from_slice(&buf[i + 1..]);
            return too_long();
        }
        if eof {
            return too_long();
        }
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
