//! The hand-written codec of `events` frames: msgpack straight from and into events,
//! with no intermediate serde layer.
//!
//! # Encoding
//!
//! `EventsFrame` appends events one at a time to an open frame in an `Outgoing`
//! buffer (the link's outbox), grouping consecutive events of one route; the frame's
//! length, its group count and the open group's event count are fixed-width (`u32` LE
//! prefix, msgpack `array 32` headers) and patched when the frame is closed. Values are
//! written as rmp-serde writes them (smallest integer and length markers). Binaries of
//! at least the buffer's splice size are not copied: the buffer keeps a reference to
//! them and the writer sends them from the event's own memory (vectored writes).
//! Nesting deeper than the decoder accepts is refused at the sender, as an error for
//! that event only.
//!
//! # Decoding
//!
//! `events` frames carry nearly all the traffic, so their decoding is specialised:
//! values are read in one pass over the frame, declared lengths reserve at most a
//! few hundred items (vectors grow as items actually arrive, so memory follows what
//! was decoded, not what was declared), a frame carries at most [`MAX_FRAME_EVENTS`]
//! events, nesting is bounded by [`MAX_DEPTH`], and binaries of
//! [`ZERO_COPY_MIN`] bytes or more are slices of the received frame (no copy) when the
//! frame is given as [`Bytes`]. Smaller binaries are copied, so that a small value
//! kept by a stage does not pin a whole frame buffer: into shared, recycled chunks
//! (`Arena`: one allocation for many binaries instead of one each), of
//! [`ARENA_CHUNK`] bytes for those under [`ARENA_MAX`] bytes and [`MEDIUM_CHUNK`]
//! bytes for the others, so that a kept value pins at most one chunk.
//!
//! It decodes exactly what the serde path would for the same bytes
//! (`Vec<(u32, Vec<Vec<Value>>)>` through `rmp_serde`), except msgpack extension
//! types, which Leda values never use and which are refused here, but for one: a
//! reference to a binary in the sender's memory (`link::memory`), read only on a link
//! whose peer's memory this process reads, within the frame's byte limit; a test checks
//! the two decoders against each other.

use bytes::{Bytes, BytesMut};
use leda_core::event::Event;
use leda_core::value::Value;

use crate::frame::{MAX_DEPTH, MAX_FRAME, kind};
use crate::link::memory::{Peer, REF_EXT, REF_MIN};

/// Binaries at least this long are decoded as slices of the frame buffer.
pub const ZERO_COPY_MIN: usize = 4096;

/// Most items reserved ahead for one declared array, map or list of groups or events.
const PREALLOC: usize = 256;

/// Most events one `events` frame may carry (senders close a frame at 8192): an empty
/// event takes one byte on the wire and 64 in memory, so a frame of empty events is
/// bounded by this, not by its size.
pub const MAX_FRAME_EVENTS: usize = 1 << 16;

/// Most values one frame may hold, all events and nesting levels together: a value
/// takes about 40 bytes decoded, a one-byte integer or nil one on the wire, so without
/// this a 64 MiB frame of nils decoded into some 2.5 GiB. Senders refuse an event that
/// would exceed it alone (error to its stage) and start a new frame before the open one
/// would.
pub const MAX_FRAME_VALUES: usize = 1 << 22;

/// Binaries shorter than this are decoded into shared chunks of [`ARENA_CHUNK`] bytes.
pub const ARENA_MAX: usize = 256;

/// Size of the shared chunks tiny binaries are copied into.
pub const ARENA_CHUNK: usize = 16 * 1024;

/// Binaries from [`ARENA_MAX`] up to [`ZERO_COPY_MIN`] bytes are decoded into shared
/// chunks of this size.
pub const MEDIUM_CHUNK: usize = 64 * 1024;

/// Used chunks kept, per size class, for reuse once every binary in them is dropped.
const ARENA_SPENT: usize = 64;

/// Chunks of one size that binaries are copied into: the open one, and used ones that
/// are reused (no allocation, no fresh pages) once the stages have dropped every
/// binary cut from them.
#[derive(Debug)]
struct Chunks {
    size: usize,
    open: BytesMut,
    spent: std::collections::VecDeque<BytesMut>,
}

impl Chunks {
    fn new(size: usize) -> Chunks {
        Chunks {
            size,
            open: BytesMut::with_capacity(size),
            spent: std::collections::VecDeque::new(),
        }
    }

    /// `data` as a binary cut from a shared chunk (`data` is smaller than a chunk).
    fn copy(&mut self, data: &[u8]) -> Bytes {
        let n = data.len();
        if self.open.capacity() - self.open.len() < n {
            let spent = std::mem::take(&mut self.open);
            self.spent.push_back(spent);
            // The oldest used chunk is free again when its binaries are all dropped.
            let size = self.size;
            let free = (self.spent.front_mut()).is_some_and(|old| old.try_reclaim(size));
            self.open = match free {
                true => self.spent.pop_front().unwrap_or_default(),
                false => {
                    if self.spent.len() > ARENA_SPENT {
                        self.spent.pop_front();
                    }
                    BytesMut::with_capacity(size)
                }
            };
        }
        self.open.extend_from_slice(data);
        self.open.split_to(n).freeze()
    }
}

/// Where small binaries are decoded (kept from frame to frame): instead of one
/// allocation each (freed on another thread, which costs more still), they are cut
/// from shared chunks, by size class so that a binary kept by a stage pins at most
/// [`ARENA_CHUNK`] bytes when it is tiny, [`MEDIUM_CHUNK`] bytes otherwise (at most
/// 256 times its size).
#[derive(Debug)]
pub(crate) struct Arena {
    tiny: Chunks,
    medium: Chunks,
}

impl Default for Arena {
    fn default() -> Self {
        Arena {
            tiny: Chunks::new(ARENA_CHUNK),
            medium: Chunks::new(MEDIUM_CHUNK),
        }
    }
}

impl Arena {
    /// `data` (shorter than [`ZERO_COPY_MIN`]) as a binary cut from a shared chunk.
    fn copy(&mut self, data: &[u8]) -> Bytes {
        if data.len() < ARENA_MAX {
            self.tiny.copy(data)
        } else {
            self.medium.copy(data)
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    owner: Option<&'a Bytes>,
    /// The chunks small binaries are copied into.
    arena: &'a mut Arena,
    /// The sender, if this process reads referenced binaries from its memory
    /// (`link::memory`); references are refused otherwise.
    peer: Option<&'a Peer>,
    /// Referenced bytes this frame may still bring (a frame's references and its own
    /// bytes together are bounded like an inline frame).
    ref_budget: usize,
    /// Values this frame may still hold ([`MAX_FRAME_VALUES`]).
    values_left: usize,
}

/// The decoders' results: errors boxed, so that a result carrying a length or a count
/// is two words, returned in registers (see [`EncodeError`]).
type R<T> = Result<T, Box<String>>;

impl<'a> Reader<'a> {
    fn byte(&mut self) -> R<u8> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| format!("unexpected end of data at byte {}", self.pos))?;
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes, as a range of the buffer.
    fn take(&mut self, n: usize) -> R<std::ops::Range<usize>> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "{n} byte(s) announced at byte {}, {} left",
                    self.pos,
                    self.buf.len() - self.pos
                )
            })?;
        let r = self.pos..end;
        self.pos = end;
        Ok(r)
    }

    fn be<const N: usize>(&mut self) -> R<[u8; N]> {
        let r = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[r]);
        Ok(a)
    }

    /// The integer after marker `m` (0xcc–0xce, 0xd0–0xd3: every integer marker but
    /// 0xcf, whose `u64` may not fit).
    #[inline(always)]
    fn int(&mut self, m: u8) -> R<i64> {
        Ok(match m {
            0xcc => self.byte()?.into(),
            0xcd => u16::from_be_bytes(self.be()?).into(),
            0xce => u32::from_be_bytes(self.be()?).into(),
            0xd0 => i8::from_be_bytes(self.be()?).into(),
            0xd1 => i16::from_be_bytes(self.be()?).into(),
            0xd2 => i32::from_be_bytes(self.be()?).into(),
            _ => i64::from_be_bytes(self.be()?),
        })
    }

    fn len8(&mut self) -> R<usize> {
        Ok(self.byte()?.into())
    }
    fn len16(&mut self) -> R<usize> {
        Ok(u16::from_be_bytes(self.be()?).into())
    }
    fn len32(&mut self) -> R<usize> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|e| Box::new(e.to_string()))
    }

    /// A capacity to reserve for `n` declared items of at least one byte each: no
    /// more than the remaining bytes could hold, and no more than [`PREALLOC`] (the
    /// vector grows as items actually arrive: a declared length alone, or nested
    /// declared lengths, cost little).
    fn room(&self, n: usize) -> usize {
        n.min(self.buf.len() - self.pos).min(PREALLOC)
    }

    /// An array header; its length.
    fn array(&mut self) -> R<usize> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok((m & 0x0f).into()),
            0xdc => self.len16(),
            0xdd => self.len32(),
            m => Err(Box::new(format!(
                "expected an array, found marker 0x{m:02x}"
            ))),
        }
    }

    /// A non-negative integer that fits in `u32`.
    fn u32(&mut self) -> R<u32> {
        let v = match self.value(MAX_DEPTH)? {
            Value::Int(i) => u32::try_from(i).ok(),
            _ => None,
        };
        v.ok_or_else(|| Box::new("expected a route number".to_owned()))
    }

    #[inline(always)]
    fn bin(&mut self, n: usize) -> R<Value> {
        let r = self.take(n)?;
        Ok(Value::Bytes(match self.owner {
            Some(owner) if n >= ZERO_COPY_MIN => owner.slice(r),
            _ if n > 0 && n < ZERO_COPY_MIN => self.arena.copy(&self.buf[r]),
            _ => Bytes::copy_from_slice(&self.buf[r]),
        }))
    }

    /// Counts `n` more values in the frame (declared ones: a declaration the frame cannot
    /// hold is refused before anything is allocated for it).
    #[inline(always)]
    fn charge(&mut self, n: usize) -> R<()> {
        self.values_left = self
            .values_left
            .checked_sub(n)
            .ok_or_else(|| Box::new(format!("more than {MAX_FRAME_VALUES} values in one frame")))?;
        Ok(())
    }

    /// A reference to a binary in the sender's memory (after its `fixext 16` marker).
    fn reference(&mut self) -> R<Value> {
        let ty = self.byte()? as i8;
        let addr = u64::from_be_bytes(self.be()?);
        let len = u64::from_be_bytes(self.be()?);
        if ty != REF_EXT {
            return Err(Box::new(format!(
                "extension type {ty} (marker 0xd8) in an event"
            )));
        }
        let Some(peer) = self.peer else {
            return Err(Box::new(
                "a reference to the sender's memory, which this link does not read".into(),
            ));
        };
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| (REF_MIN..=self.ref_budget).contains(&n))
            .ok_or_else(|| {
                format!(
                    "a referenced binary of {len} bytes (at least {REF_MIN}, and the frame \
                     has {} left)",
                    self.ref_budget
                )
            })?;
        self.ref_budget -= len;
        let v = peer.read(addr, len).map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                format!("{SENDER_GONE} (reading {len} bytes of its memory: {e})")
            } else {
                format!("reading {len} bytes of the sender's memory: {e}")
            }
        })?;
        Ok(Value::Bytes(Bytes::from(v)))
    }

    fn str(&mut self, n: usize) -> R<Value> {
        let r = self.take(n)?;
        // As rmp-serde does: a string that is not UTF-8 arrives as bytes.
        Ok(match std::str::from_utf8(&self.buf[r.clone()]) {
            Ok(s) => Value::Str(s.to_owned()),
            Err(_) => Value::Bytes(Bytes::copy_from_slice(&self.buf[r])),
        })
    }

    fn seq(&mut self, n: usize, depth: usize) -> R<Value> {
        self.charge(n)?;
        let mut v = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(v))
    }

    fn map(&mut self, n: usize, depth: usize) -> R<Value> {
        self.charge(n.saturating_mul(2))?;
        let mut v = Vec::with_capacity(self.room(n) / 2);
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            v.push((k, self.value(depth + 1)?));
        }
        Ok(Value::Map(v))
    }

    /// One value at nesting `depth`.
    fn value(&mut self, depth: usize) -> R<Value> {
        if depth > MAX_DEPTH {
            return Err(Box::new(format!("nesting deeper than {MAX_DEPTH}")));
        }
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => Value::Int(m.into()),
            0xe0..=0xff => Value::Int((m as i8).into()),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xcc => Value::Int(self.byte()?.into()),
            0xcd => Value::Int(u16::from_be_bytes(self.be()?).into()),
            0xce => Value::Int(u32::from_be_bytes(self.be()?).into()),
            0xcf => Value::from(u64::from_be_bytes(self.be()?)),
            0xd0 => Value::Int(i8::from_be_bytes(self.be()?).into()),
            0xd1 => Value::Int(i16::from_be_bytes(self.be()?).into()),
            0xd2 => Value::Int(i32::from_be_bytes(self.be()?).into()),
            0xd3 => Value::Int(i64::from_be_bytes(self.be()?)),
            0xca => Value::Float(f32::from_be_bytes(self.be()?).into()),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xa0..=0xbf => self.str((m & 0x1f).into())?,
            0xd9 => {
                let n = self.len8()?;
                self.str(n)?
            }
            0xda => {
                let n = self.len16()?;
                self.str(n)?
            }
            0xdb => {
                let n = self.len32()?;
                self.str(n)?
            }
            0xc4 => {
                let n = self.len8()?;
                self.bin(n)?
            }
            0xc5 => {
                let n = self.len16()?;
                self.bin(n)?
            }
            0xc6 => {
                let n = self.len32()?;
                self.bin(n)?
            }
            0x90..=0x9f => self.seq((m & 0x0f).into(), depth)?,
            0xdc => {
                let n = self.len16()?;
                self.seq(n, depth)?
            }
            0xdd => {
                let n = self.len32()?;
                self.seq(n, depth)?
            }
            0x80..=0x8f => self.map((m & 0x0f).into(), depth)?,
            0xde => {
                let n = self.len16()?;
                self.map(n, depth)?
            }
            0xdf => {
                let n = self.len32()?;
                self.map(n, depth)?
            }
            0xd8 => self.reference()?,
            0xc1 => return Err(Box::new("reserved marker 0xc1".into())),
            _ => {
                return Err(Box::new(format!(
                    "extension type (marker 0x{m:02x}) in an event"
                )));
            }
        })
    }
}

/// Nesting level of an event's arguments in an `events` body (groups, group, events,
/// event: four levels above each argument).
const ARG_DEPTH: usize = 5;

/// How a frame's decoding fails when the sender died after sending it: its memory,
/// which the frame's large binaries are read from on one host, is gone. Not a bad
/// frame: the reader reports the sender lost, as for a closed connection.
pub(crate) const SENDER_GONE: &str = "the sending process is gone";

/// Bytes to write: a byte buffer, and binaries to send from their own memory at given
/// offsets of it (spliced in, in order).
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    /// Encoded bytes, without the spliced binaries.
    pub(crate) bytes: Vec<u8>,
    /// `(offset in bytes, binary)`: the binary goes before `bytes[offset..]`.
    pub(crate) splices: Vec<(usize, Bytes)>,
    /// Total length of the spliced binaries.
    spliced: usize,
    /// Binaries at least this long are spliced rather than copied.
    splice_min: usize,
    /// Binaries at least this long are sent as references to this process's memory
    /// (`link::memory`; `None`: never). Only for events that stay alive until
    /// acknowledged.
    pub(crate) refs_from: Option<usize>,
    /// Total length of the referenced binaries.
    refs: usize,
    /// Values encoded (see [`MAX_FRAME_VALUES`]).
    values: usize,
}

/// A position in an [`Outgoing`] buffer, to truncate back to.
#[derive(Clone, Copy, Debug)]
struct Mark {
    bytes: usize,
    splices: usize,
    spliced: usize,
    refs: usize,
    values: usize,
}

impl Outgoing {
    /// An empty buffer that splices binaries of at least `splice_min` bytes.
    pub(crate) fn new(splice_min: usize, capacity: usize) -> Outgoing {
        Outgoing {
            bytes: Vec::with_capacity(capacity),
            splices: Vec::new(),
            spliced: 0,
            splice_min,
            refs_from: None,
            refs: 0,
            values: 0,
        }
    }

    /// Length of the byte stream, spliced binaries included.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + self.spliced
    }

    /// What the buffer costs the receiver: the stream's length and the referenced
    /// binaries'.
    pub(crate) fn weight(&self) -> usize {
        self.len() + self.refs
    }

    /// `true` if there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.splices.is_empty()
    }

    /// Empties the buffer (keeping its capacity).
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.splices.clear();
        self.spliced = 0;
        self.refs = 0;
        self.values = 0;
    }

    fn mark(&self) -> Mark {
        Mark {
            bytes: self.bytes.len(),
            splices: self.splices.len(),
            spliced: self.spliced,
            refs: self.refs,
            values: self.values,
        }
    }

    fn truncate(&mut self, m: Mark) {
        self.bytes.truncate(m.bytes);
        self.splices.truncate(m.splices);
        self.spliced = m.spliced;
        self.refs = m.refs;
        self.values = m.values;
    }

    /// The byte stream as one buffer (spliced binaries copied in).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        let mut at = 0;
        for (off, b) in &self.splices {
            v.extend_from_slice(&self.bytes[at..*off]);
            v.extend_from_slice(b);
            at = *off;
        }
        v.extend_from_slice(&self.bytes[at..]);
        v
    }

    /// The stream as slices in order, for a vectored write.
    pub(crate) fn segments(&self) -> Vec<&[u8]> {
        let mut v = Vec::with_capacity(2 * self.splices.len() + 1);
        let mut at = 0;
        for (off, b) in &self.splices {
            if *off > at {
                v.push(&self.bytes[at..*off]);
            }
            if !b.is_empty() {
                v.push(&b[..]);
            }
            at = *off;
        }
        if self.bytes.len() > at {
            v.push(&self.bytes[at..]);
        }
        v
    }
}

fn put_u8(buf: &mut Vec<u8>, m: u8, v: u8) {
    buf.extend_from_slice(&[m, v]);
}

/// An integer, in its smallest msgpack form (as `rmp::encode::write_sint`).
fn put_int(buf: &mut Vec<u8>, v: i64) {
    match v {
        0..=127 => buf.push(v as u8),
        -32..=-1 => buf.push(v as i8 as u8),
        128..=255 => put_u8(buf, 0xcc, v as u8),
        256..=65_535 => {
            buf.push(0xcd);
            buf.extend_from_slice(&(v as u16).to_be_bytes());
        }
        65_536..=0xffff_ffff => {
            buf.push(0xce);
            buf.extend_from_slice(&(v as u32).to_be_bytes());
        }
        0x1_0000_0000.. => {
            buf.push(0xcf);
            buf.extend_from_slice(&(v as u64).to_be_bytes());
        }
        -128..=-33 => put_u8(buf, 0xd0, v as i8 as u8),
        -32_768..=-129 => {
            buf.push(0xd1);
            buf.extend_from_slice(&(v as i16).to_be_bytes());
        }
        -2_147_483_648..=-32_769 => {
            buf.push(0xd2);
            buf.extend_from_slice(&(v as i32).to_be_bytes());
        }
        _ => {
            buf.push(0xd3);
            buf.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Why an event cannot be encoded. Boxed, so that the encoders' results are one word,
/// returned in a register: a three-word `Result<(), String>` went back through memory,
/// and the caller's wide load of it stalled on the callee's narrower stores (82 % of
/// the outbox's per-event time at 16-byte events).
pub(crate) type EncodeError = Box<String>;

/// A length with the fix/8/16/32 markers of one family (`fix` is `None` for binaries,
/// `m8` is `None` for arrays and maps). Errs above `u32::MAX`.
fn put_len(
    buf: &mut Vec<u8>,
    n: usize,
    fix: Option<(u8, usize)>,
    m8: Option<u8>,
    m16: u8,
    m32: u8,
) -> Result<(), EncodeError> {
    match (fix, m8) {
        (Some((base, max)), _) if n <= max => buf.push(base | n as u8),
        (_, Some(m)) if n <= 0xff => put_u8(buf, m, n as u8),
        _ if n <= 0xffff => {
            buf.push(m16);
            buf.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            let n = u32::try_from(n)
                .map_err(|_| Box::new(format!("a length of {n} exceeds msgpack's")))?;
            buf.push(m32);
            buf.extend_from_slice(&n.to_be_bytes());
        }
    }
    Ok(())
}

fn put_array_len(buf: &mut Vec<u8>, n: usize) -> Result<(), EncodeError> {
    put_len(buf, n, Some((0x90, 15)), None, 0xdc, 0xdd)
}

/// Appends `v` at nesting `depth` (refused beyond [`MAX_DEPTH`], as the decoder would).
fn put_value(out: &mut Outgoing, v: &Value, depth: usize) -> Result<(), EncodeError> {
    let buf = &mut out.bytes;
    if depth > MAX_DEPTH {
        return Err(Box::new(format!(
            "a value nested deeper than {} levels cannot be sent",
            MAX_DEPTH - ARG_DEPTH
        )));
    }
    match v {
        Value::Nil => buf.push(0xc0),
        Value::Bool(b) => buf.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Int(i) => put_int(buf, *i),
        Value::Float(f) => {
            buf.push(0xcb);
            buf.extend_from_slice(&f.to_be_bytes());
        }
        Value::Str(s) => {
            put_len(buf, s.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb)?;
            buf.extend_from_slice(s.as_bytes());
        }
        Value::Bytes(b) if out.refs_from.is_some_and(|min| b.len() >= min) => {
            buf.extend_from_slice(&[0xd8, REF_EXT as u8]);
            buf.extend_from_slice(&(b.as_ptr() as u64).to_be_bytes());
            buf.extend_from_slice(&(b.len() as u64).to_be_bytes());
            out.refs += b.len();
        }
        Value::Bytes(b) => {
            put_len(buf, b.len(), None, Some(0xc4), 0xc5, 0xc6)?;
            if b.len() >= out.splice_min {
                out.splices.push((buf.len(), b.clone()));
                out.spliced += b.len();
            } else {
                buf.extend_from_slice(b);
            }
        }
        Value::Array(a) => {
            put_array_len(buf, a.len())?;
            out.values += a.len();
            for x in a {
                put_value(out, x, depth + 1)?;
            }
        }
        Value::Map(m) => {
            put_len(buf, m.len(), Some((0x80, 15)), None, 0xde, 0xdf)?;
            out.values += 2 * m.len();
            for (k, x) in m {
                put_value(out, k, depth + 1)?;
                put_value(out, x, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// An `events` frame open at the end of an [`Outgoing`] buffer: events are appended
/// one at a time, grouped by route in order; [`EventsFrame::close`] patches the lengths.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventsFrame {
    /// Offset of the frame's length prefix in the buffer's bytes.
    start: usize,
    /// Stream length (spliced binaries included) where the frame starts.
    stream_start: usize,
    /// The buffer's referenced bytes where the frame starts.
    refs_start: usize,
    /// The buffer's value count where the frame starts.
    values_start: usize,
    groups: u32,
    /// Offset of the open group's event count.
    count_at: usize,
    route: u32,
    count: u32,
    /// Events in the frame, all groups.
    events: u32,
}

impl EventsFrame {
    /// Opens a frame at the end of `out`.
    pub(crate) fn open(out: &mut Outgoing) -> EventsFrame {
        let start = out.bytes.len();
        let stream_start = out.len();
        let refs_start = out.refs;
        let values_start = out.values;
        out.bytes
            .extend_from_slice(&[0, 0, 0, 0, kind::EVENTS, 0xdd, 0, 0, 0, 0]);
        EventsFrame {
            start,
            stream_start,
            refs_start,
            values_start,
            groups: 0,
            count_at: 0,
            route: 0,
            count: 0,
            events: 0,
        }
    }

    /// Offset of the frame in its buffer's bytes.
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// Bytes of the frame so far, length prefix and spliced binaries included.
    pub(crate) fn size(&self, out: &Outgoing) -> usize {
        out.len() - self.stream_start
    }

    /// What the frame costs its receiver: [`EventsFrame::size`] and the referenced
    /// binaries' length.
    pub(crate) fn weight(&self, out: &Outgoing) -> usize {
        self.size(out) + out.refs - self.refs_start
    }

    /// `true` if the frame holds no event yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups == 0
    }

    /// Events in the frame so far.
    pub(crate) fn events(&self) -> u32 {
        self.events
    }

    /// Appends one event of `route`. On error (a value nested too deeply, or the frame
    /// would exceed [`MAX_FRAME`]) nothing is appended.
    pub(crate) fn push(
        &mut self,
        out: &mut Outgoing,
        route: u32,
        ev: &Event,
    ) -> Result<(), EncodeError> {
        let before = out.mark();
        let r = self.push_inner(out, route, ev);
        if r.is_err() {
            out.truncate(before);
        }
        r
    }

    /// [`EventsFrame::push`], changing `self` only once the event is in (a copy of
    /// the whole frame state for the rollback cost the sending worker a stalled load
    /// per event: 5 % of its time at 16-byte events).
    fn push_inner(
        &mut self,
        out: &mut Outgoing,
        route: u32,
        ev: &Event,
    ) -> Result<(), EncodeError> {
        let (mut groups, mut count_at, mut count) = (self.groups, self.count_at, self.count);
        if groups == 0 || self.route != route || count == u32::MAX {
            if groups > 0 {
                // (Harmless if this event fails: the open group's count so far.)
                self.patch_count(&mut out.bytes);
            }
            groups = groups
                .checked_add(1)
                .ok_or_else(|| Box::new("too many route groups in one frame".to_owned()))?;
            let buf = &mut out.bytes;
            buf.push(0x92);
            put_int(buf, route.into());
            buf.push(0xdd);
            count_at = buf.len();
            buf.extend_from_slice(&[0, 0, 0, 0]);
            count = 0;
        }
        let args = ev.args();
        put_array_len(&mut out.bytes, args.len())?;
        out.values += args.len();
        for v in args {
            put_value(out, v, ARG_DEPTH)?;
        }
        let len = self.weight(out) - 4;
        if len > MAX_FRAME as usize {
            return Err(Box::new(format!(
                "{len} bytes exceed the {MAX_FRAME}-byte frame limit"
            )));
        }
        if out.values - self.values_start > MAX_FRAME_VALUES {
            return Err(Box::new(format!(
                "more than {MAX_FRAME_VALUES} values in one frame"
            )));
        }
        self.groups = groups;
        self.count_at = count_at;
        self.route = route;
        self.count = count + 1;
        self.events = self.events.saturating_add(1);
        Ok(())
    }

    fn patch_count(&self, buf: &mut [u8]) {
        buf[self.count_at..self.count_at + 4].copy_from_slice(&self.count.to_be_bytes());
    }

    /// Closes the frame: patches its length, group count and last event count.
    pub(crate) fn close(self, out: &mut Outgoing) {
        if self.groups > 0 {
            self.patch_count(&mut out.bytes);
        }
        let len = (self.size(out) - 4) as u32;
        let buf = &mut out.bytes;
        buf[self.start..self.start + 4].copy_from_slice(&len.to_le_bytes());
        buf[self.start + 6..self.start + 10].copy_from_slice(&self.groups.to_be_bytes());
    }
}

/// Decodes an `events` body: `[[route, [[arg, ...], ...]], ...]`. With `owner` (the
/// frame buffer `body` lies in), large binaries are slices of it.
pub(crate) fn decode_events(body: &[u8], owner: Option<&Bytes>) -> R<Vec<(u32, Vec<Event>)>> {
    let (mut groups, mut events) = (Vec::new(), Vec::new());
    decode_events_into(
        body,
        owner,
        None,
        &mut Arena::default(),
        &mut groups,
        &mut events,
    )?;
    let mut events = events.into_iter();
    Ok(groups
        .into_iter()
        .map(|(route, n)| (route, events.by_ref().take(n).collect()))
        .collect())
}

/// Like [`decode_events`], into reusable buffers (kept warm from frame to frame): the
/// events of every group in order into `events`, and `(route, count)` per group into
/// `groups`. Both are cleared first; after an error their contents are unspecified.
/// Small binaries are copied into `arena` (kept from frame to frame). With `peer`, the
/// sender, references to binaries in its memory are read (see `link::memory`). Returns
/// how many bytes were so read.
pub(crate) fn decode_events_into(
    body: &[u8],
    owner: Option<&Bytes>,
    peer: Option<&Peer>,
    arena: &mut Arena,
    groups: &mut Vec<(u32, usize)>,
    events: &mut Vec<Event>,
) -> R<usize> {
    groups.clear();
    events.clear();
    let mut r = Reader {
        buf: body,
        pos: 0,
        owner,
        arena,
        peer,
        ref_budget: (MAX_FRAME as usize).saturating_sub(body.len()),
        values_left: MAX_FRAME_VALUES,
    };
    let n_groups = r.array()?;
    groups.reserve(r.room(n_groups));
    for _ in 0..n_groups {
        if r.array()? != 2 {
            return Err(Box::new(
                "a route group is not a [route, events] pair".into(),
            ));
        }
        let route = r.u32()?;
        let n = r.array()?;
        if n > MAX_FRAME_EVENTS - events.len() {
            return Err(Box::new(format!(
                "more than {MAX_FRAME_EVENTS} events in one frame (senders close a frame \
                 at 8192)"
            )));
        }
        events.reserve(r.room(n));
        for _ in 0..n {
            let args = r.array()?;
            r.charge(args)?;
            // Built in place in `events`, each argument written straight into it:
            // a value or an event assembled on the stack and then copied was read
            // back with loads wider than the stores that wrote it (a stall each).
            events.push(Event::new());
            let ev = events.last_mut().expect("just pushed");
            for _ in 0..args {
                // The common small values without the general decoder's call.
                match r.buf.get(r.pos) {
                    Some(&m @ 0x00..=0x7f) => {
                        r.pos += 1;
                        ev.push(Value::Int(m.into()));
                    }
                    Some(&m @ (0xcc..=0xce | 0xd0..=0xd3)) => {
                        r.pos += 1;
                        let i = r.int(m)?;
                        ev.push(Value::Int(i));
                    }
                    Some(0xcb) => {
                        r.pos += 1;
                        let f = f64::from_be_bytes(r.be()?);
                        ev.push(Value::Float(f));
                    }
                    Some(0xc4) => {
                        r.pos += 1;
                        let n = r.len8()?;
                        let b = r.bin(n)?;
                        ev.push(b);
                    }
                    // groups, group, events, event: four levels above each argument.
                    _ => {
                        let v = r.value(ARG_DEPTH)?;
                        ev.push(v);
                    }
                }
            }
        }
        groups.push((route, n));
    }
    if r.pos != body.len() {
        return Err(Box::new(format!("{} trailing byte(s)", body.len() - r.pos)));
    }
    Ok((MAX_FRAME as usize).saturating_sub(body.len()) - r.ref_budget)
}

/// Decodes an `events` body as a live link does: with the body as a shared buffer
/// (large binaries are slices of it), into event and group buffers and a small-binary
/// arena kept from call to call (per thread). Returns the number of events. The
/// fuzz target's entry to the link's own path.
#[doc(hidden)]
pub fn decode_events_live(body: &[u8]) -> Result<usize, String> {
    type State = (Arena, Vec<(u32, usize)>, Vec<Event>);
    thread_local! {
        static STATE: std::cell::RefCell<State> = std::cell::RefCell::default();
    }
    let owner = Bytes::copy_from_slice(body);
    STATE.with(|s| {
        let (arena, groups, events) = &mut *s.borrow_mut();
        let r = decode_events_into(&owner, Some(&owner), None, arena, groups, events);
        let n = events.len();
        events.clear();
        r.map(|_| n).map_err(|e| *e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serde decoding of the same body, for comparison.
    fn serde_decode(body: &[u8]) -> Option<Vec<(u32, Vec<Vec<Value>>)>> {
        let mut d = rmp_serde::Deserializer::new(std::io::Cursor::new(body));
        d.set_max_depth(MAX_DEPTH);
        let v = serde::Deserialize::deserialize(&mut d).ok()?;
        (d.position() == body.len() as u64).then_some(v)
    }

    fn plain(groups: &[(u32, Vec<Event>)]) -> Vec<(u32, Vec<Vec<Value>>)> {
        groups
            .iter()
            .map(|(r, evs)| (*r, evs.iter().map(|e| e.args().to_vec()).collect()))
            .collect()
    }

    fn sample_values() -> Vec<Value> {
        let mut v = vec![
            Value::Nil,
            Value::Bool(true),
            Value::Bool(false),
            Value::Float(1.5),
            Value::Str(String::new()),
            Value::Str("é".repeat(40)),
            Value::Bytes(Bytes::new()),
            Value::Bytes(Bytes::from(vec![3u8; 16])),
            Value::Bytes(Bytes::from(vec![4u8; 255])),
            Value::Bytes(Bytes::from(vec![1u8; 300])),
            Value::Bytes(Bytes::from(vec![2u8; 70_000])),
            Value::Array(vec![Value::Int(1), Value::Array(vec![])]),
            Value::Map(vec![(Value::from("k"), Value::Int(-3))]),
        ];
        for i in [
            0i64,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            -1,
            -32,
            -33,
            -129,
            -40_000,
            i64::from(u32::MAX),
            i64::MAX,
            i64::MIN,
        ] {
            v.push(Value::Int(i));
        }
        v
    }

    #[test]
    fn agrees_with_serde_on_every_value_kind() {
        let vals = sample_values();
        let groups = vec![
            (
                0u32,
                vals.iter()
                    .cloned()
                    .map(|v| Event::from_values([v]))
                    .collect(),
            ),
            (
                70_000u32,
                vec![Event::from_values(vals.clone()), Event::new()],
            ),
        ];
        let mut buf = Vec::new();
        crate::frame::encode_events(&mut buf, &groups).unwrap();
        let body = &buf[5..];
        let ours = decode_events(body, None).unwrap();
        assert_eq!(plain(&ours), serde_decode(body).unwrap());
        assert_eq!(plain(&ours), plain(&groups));
        // u64 above i64::MAX and f32, which our encoder never writes.
        let odd = [
            0x91, 0x92, 0x01, 0x91, 0x92, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xca, 0x3f, 0xc0, 0, 0,
        ];
        assert_eq!(
            plain(&decode_events(&odd, None).unwrap()),
            serde_decode(&odd).unwrap()
        );
    }

    #[test]
    fn values_are_written_as_rmp_serde_writes_them() {
        let mut vals = sample_values();
        vals.push(Value::Str("x".repeat(300)));
        vals.push(Value::Str("y".repeat(70_000)));
        vals.push(Value::Array((0..20).map(Value::Int).collect()));
        vals.push(Value::Array((0..70_000).map(Value::Int).collect()));
        vals.push(Value::Map(
            (0..20).map(|i| (Value::Int(i), Value::Nil)).collect(),
        ));
        for v in vals {
            let mut ours = Outgoing::new(usize::MAX, 0);
            put_value(&mut ours, &v, ARG_DEPTH).unwrap();
            assert_eq!(ours.bytes, rmp_serde::to_vec(&v).unwrap(), "{v:?}");
            // The same with every binary spliced.
            let mut spliced = Outgoing::new(0, 0);
            put_value(&mut spliced, &v, ARG_DEPTH).unwrap();
            assert_eq!(spliced.to_vec(), ours.bytes, "{v:?}");
            assert_eq!(spliced.segments().concat(), ours.bytes, "{v:?}");
        }
    }

    #[test]
    fn too_deep_values_are_refused_at_the_sender_and_nothing_is_appended() {
        let mut deep = Value::Int(1);
        for _ in 0..MAX_DEPTH {
            deep = Value::Array(vec![deep]);
        }
        let mut out = Outgoing::new(2, 0);
        out.bytes.push(42);
        let mut f = EventsFrame::open(&mut out);
        f.push(&mut out, 3, &Event::from(1i64)).unwrap();
        let size = out.len();
        let big = Value::Bytes(Bytes::from(vec![5u8; 10]));
        let deep = Event::from_values([big.clone(), deep]);
        assert!(f.push(&mut out, 4, &deep).is_err());
        assert_eq!((out.len(), out.splices.len()), (size, 0));
        f.push(
            &mut out,
            3,
            &Event::from_values([Value::Int(2), big.clone()]),
        )
        .unwrap();
        f.close(&mut out);
        let buf = out.to_vec();
        let len = u32::from_le_bytes(buf[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, buf.len() - 5);
        let got = decode_events(&buf[1 + 5..], None).unwrap();
        assert_eq!(
            plain(&got),
            vec![(3, vec![vec![Value::Int(1)], vec![Value::Int(2), big]])]
        );
    }

    #[test]
    fn large_binaries_are_slices_of_the_frame() {
        let big = Bytes::from(vec![9u8; ZERO_COPY_MIN]);
        let small = Bytes::from(vec![8u8; 10]);
        let mut buf = Vec::new();
        crate::frame::encode_events(&mut buf, &[(1, vec![Event::from((big, small))])]).unwrap();
        let frame = Bytes::from(buf).slice(5..);
        let got = decode_events(&frame, Some(&frame)).unwrap();
        let args = got[0].1[0].args();
        let b = args[0].as_bytes().unwrap();
        let range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
        assert!(range.contains(&(b.as_ptr() as usize)), "zero copy");
        let s = args[1].as_bytes().unwrap();
        assert!(!range.contains(&(s.as_ptr() as usize)), "small ones copied");
        assert_eq!(b.len(), ZERO_COPY_MIN);
        assert_eq!(s, &[8u8; 10]);
    }

    /// Small binaries share chunks (no allocation each), across chunk boundaries and
    /// frames, and arrive intact; tiny and medium ones in chunks of their own class.
    #[test]
    fn small_binaries_share_chunks_and_arrive_intact() {
        let make = || -> Vec<Event> {
            (0..3000usize)
                .map(|i| {
                    let tiny = Bytes::from(vec![(i % 251) as u8; 1 + i % 40]);
                    Event::from_values([Value::Bytes(tiny), Value::Bytes(Bytes::new())])
                })
                .collect()
        };
        let evs = make();
        let mut buf = Vec::new();
        crate::frame::encode_events(&mut buf, &[(2, make())]).unwrap();
        let body = Bytes::from(buf).slice(5..);
        let mut arena = Arena::default();
        let (mut groups, mut got) = (Vec::new(), Vec::new());
        let mut chunks = std::collections::HashSet::new();
        for _ in 0..2 {
            decode_events_into(&body, Some(&body), None, &mut arena, &mut groups, &mut got)
                .unwrap();
            assert_eq!(groups, vec![(2, evs.len())]);
            for (a, b) in got.iter().zip(&evs) {
                assert_eq!(a.args(), b.args());
                let p = a.args()[0].as_bytes().unwrap().as_ptr() as usize;
                chunks.insert(p / ARENA_CHUNK);
            }
        }
        // ~60 KB of tiny binaries per frame, in 16 KiB chunks: a handful, not 6000.
        assert!(chunks.len() < 20, "{} chunks", chunks.len());
        // Medium binaries (1 KiB here), 64 to a 64 KiB chunk.
        let medium = |i: usize| Bytes::from(vec![(i % 251) as u8; ARENA_MAX + i % 1000]);
        let evs: Vec<Event> = (0..200).map(|i| Event::from(medium(i))).collect();
        let mut buf = Vec::new();
        crate::frame::encode_events(&mut buf, &[(0, evs)]).unwrap();
        decode_events_into(&buf[5..], None, None, &mut arena, &mut groups, &mut got).unwrap();
        let mut chunks = std::collections::HashSet::new();
        for (i, ev) in got.iter().enumerate() {
            let b = ev.args()[0].as_bytes().unwrap();
            assert_eq!(b, &medium(i)[..]);
            chunks.insert(b.as_ptr() as usize / MEDIUM_CHUNK);
        }
        assert!(chunks.len() < 20, "{} chunks", chunks.len());
    }

    /// With references on, a large binary goes as its address and length (not its
    /// bytes), counts in the frame's weight, and a link that reads the sender's memory
    /// (here this very process) decodes it into a buffer of its own; a link that does
    /// not, or a reference past the frame's byte budget or to no memory, is an error.
    #[test]
    fn large_binaries_go_as_references_read_from_the_sender() {
        use crate::link::memory::REF_MIN;
        let big = Bytes::from((0..REF_MIN + 5).map(|i| i as u8).collect::<Vec<u8>>());
        let small = Bytes::from(vec![9u8; 100]);
        let ev = Event::from_values([
            Value::Bytes(big.clone()),
            Value::Array(vec![Value::Bytes(small.clone()), Value::Bytes(big.clone())]),
        ]);
        let mut out = Outgoing::new(512, 0);
        out.refs_from = Some(REF_MIN);
        let mut f = EventsFrame::open(&mut out);
        f.push(&mut out, 3, &ev).unwrap();
        assert!(out.len() < 200, "{} bytes on the stream", out.len());
        assert_eq!(f.weight(&out), f.size(&out) + 2 * big.len());
        f.close(&mut out);
        let body = out.to_vec()[5..].to_vec();
        let me = crate::link::memory::Peer::itself();
        let me = Some(&*me);
        let (mut groups, mut got) = (Vec::new(), Vec::new());
        let mut arena = Arena::default();
        let read = decode_events_into(&body, None, me, &mut arena, &mut groups, &mut got).unwrap();
        assert_eq!(read, 2 * big.len());
        assert_eq!(groups, vec![(3, 1)]);
        assert_eq!(got[0].args(), ev.args());
        let b = got[0].args()[0].as_bytes().unwrap();
        assert_ne!(b.as_ptr(), big.as_ptr(), "a copy of its own");
        // A link that does not read the sender's memory refuses references.
        let e = decode_events_into(&body, None, None, &mut arena, &mut groups, &mut got);
        assert!(e.unwrap_err().contains("does not read"));
        // A reference to more than a frame may carry, or to unmapped memory.
        let forge = |addr: u64, len: u64| {
            let mut b = vec![0x91, 0x92, 0x00, 0x91, 0x91, 0xd8, REF_EXT as u8];
            b.extend_from_slice(&addr.to_be_bytes());
            b.extend_from_slice(&len.to_be_bytes());
            b
        };
        let too_big = forge(big.as_ptr() as u64, MAX_FRAME as u64);
        let e = decode_events_into(&too_big, None, me, &mut arena, &mut groups, &mut got);
        assert!(e.unwrap_err().contains("left"));
        // (A reference shorter than REF_MIN would cost a system call per 18 bytes.)
        let tiny = forge(big.as_ptr() as u64, 16);
        let e = decode_events_into(&tiny, None, me, &mut arena, &mut groups, &mut got);
        assert!(e.unwrap_err().contains("at least"));
        let nowhere = forge(16, REF_MIN as u64);
        let e = decode_events_into(&nowhere, None, me, &mut arena, &mut groups, &mut got);
        assert!(e.unwrap_err().contains("sender's memory"));
        // An event whose references exceed the frame limit is refused at the sender.
        let huge = Bytes::from(vec![0u8; MAX_FRAME as usize / 2 + 1]);
        let ev = Event::from_values([Value::Bytes(huge.clone()), Value::Bytes(huge)]);
        let mut f = EventsFrame::open(&mut out);
        assert!(f.push(&mut out, 0, &ev).is_err());
    }

    /// A frame holds at most MAX_FRAME_VALUES values: the decoder refuses more (a
    /// declared array at once, many small events as they come), and the encoder refuses
    /// an event that exceeds it alone and one that would make the open frame exceed it
    /// (the outbox then starts a new frame). Before, a 64 MiB frame of nils decoded into
    /// some 2.5 GiB.
    #[test]
    fn a_frame_holds_a_bounded_number_of_values() {
        let (mut groups, mut got, mut arena) = (Vec::new(), Vec::new(), Arena::default());
        let mut decode = |body: &[u8]| {
            decode_events_into(body, None, None, &mut arena, &mut groups, &mut got)
                .map(|_| got.len())
        };
        // One event, one argument: an array declaring more values than a frame holds.
        let mut b = vec![0x91, 0x92, 0x00, 0x91, 0x91, 0xdd];
        b.extend_from_slice(&(MAX_FRAME_VALUES as u32).to_be_bytes());
        assert!(decode(&b).unwrap_err().contains("values in one frame"));
        // Events of 128 nils each, more than a frame holds in all.
        let n = MAX_FRAME_VALUES / 128 + 1;
        let mut b = vec![0x91, 0x92, 0x00, 0xdd];
        b.extend_from_slice(&(n as u32).to_be_bytes());
        for _ in 0..n {
            b.extend_from_slice(&[0xdc, 0, 128]);
            b.extend(std::iter::repeat_n(0xc0, 128));
        }
        assert!(decode(&b).unwrap_err().contains("values in one frame"));
        // As many as a frame holds: decoded.
        let mut b = vec![0x91, 0x92, 0x00, 0xdd];
        b.extend_from_slice(&((n - 1) as u32).to_be_bytes());
        for _ in 0..n - 1 {
            b.extend_from_slice(&[0xdc, 0, 128]);
            b.extend(std::iter::repeat_n(0xc0, 128));
        }
        assert_eq!(decode(&b).unwrap(), n - 1);

        // The sender: an event alone over the bound is refused, nothing appended.
        let big = Event::from_values([Value::Array(vec![Value::Nil; MAX_FRAME_VALUES])]);
        let mut out = Outgoing::new(512, 0);
        let mut f = EventsFrame::open(&mut out);
        let before = out.len();
        assert!(f.push(&mut out, 0, &big).is_err());
        assert_eq!(out.len(), before);
        // Two events of 60 % each: the second does not fit with the first.
        let half = Event::from_values([Value::Array(vec![Value::Nil; MAX_FRAME_VALUES * 3 / 5])]);
        f.push(&mut out, 0, &half).unwrap();
        assert!(f.push(&mut out, 0, &half).is_err());
        f.close(&mut out);
        let mut g = EventsFrame::open(&mut out);
        g.push(&mut out, 0, &half).unwrap();
    }

    #[test]
    fn hostile_bodies_are_errors() {
        let cases: [&[u8]; 8] = [
            b"",
            &[0x91],
            &[0x91, 0x93],
            &[0x91, 0x92, 0xff],
            &[0x91, 0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0x91, 0x92, 0x01, 0x91, 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff],
            &[0x91, 0x92, 0x01, 0x91, 0x91, 0xd4, 0x01, 0x02],
            &[0x90, 0x00],
        ];
        for c in cases {
            assert!(decode_events(c, None).is_err(), "{c:?}");
        }
        let mut deep = vec![0x91, 0x92, 0x01, 0x91, 0x91];
        deep.extend(std::iter::repeat_n(0x91u8, 100_000));
        assert!(decode_events(&deep, None).is_err());
    }
}
