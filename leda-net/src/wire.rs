//! The hand-written decoder of `events` frame bodies: msgpack straight into events,
//! with no intermediate serde layer.
//!
//! `events` frames carry nearly all the traffic, so their decoding is specialised:
//! values are read in one pass over the frame, declared lengths only reserve what the
//! remaining bytes can hold, nesting is bounded by [`MAX_DEPTH`], and binaries of
//! [`ZERO_COPY_MIN`] bytes or more are slices of the received frame (no copy) when the
//! frame is given as [`Bytes`]. Smaller binaries are copied, so that a small value
//! kept by a stage does not pin a whole frame buffer.
//!
//! It decodes exactly what the serde path would for the same bytes
//! (`Vec<(u32, Vec<Vec<Value>>)>` through `rmp_serde`), except msgpack extension
//! types, which Leda values never use and which are refused here; a test checks the
//! two against each other.

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;

use crate::frame::MAX_DEPTH;

/// Binaries at least this long are decoded as slices of the frame buffer.
pub const ZERO_COPY_MIN: usize = 4096;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    owner: Option<&'a Bytes>,
}

type R<T> = Result<T, String>;

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

    fn len8(&mut self) -> R<usize> {
        Ok(self.byte()?.into())
    }
    fn len16(&mut self) -> R<usize> {
        Ok(u16::from_be_bytes(self.be()?).into())
    }
    fn len32(&mut self) -> R<usize> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|e| e.to_string())
    }

    /// A capacity for `n` declared items of at least one byte each.
    fn room(&self, n: usize) -> usize {
        n.min(self.buf.len() - self.pos)
    }

    /// An array header; its length.
    fn array(&mut self) -> R<usize> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok((m & 0x0f).into()),
            0xdc => self.len16(),
            0xdd => self.len32(),
            m => Err(format!("expected an array, found marker 0x{m:02x}")),
        }
    }

    /// A non-negative integer that fits in `u32`.
    fn u32(&mut self) -> R<u32> {
        let v = match self.value(MAX_DEPTH)? {
            Value::Int(i) => u32::try_from(i).ok(),
            _ => None,
        };
        v.ok_or_else(|| "expected a route number".to_owned())
    }

    fn bin(&mut self, n: usize) -> R<Value> {
        let r = self.take(n)?;
        Ok(Value::Bytes(match self.owner {
            Some(owner) if n >= ZERO_COPY_MIN => owner.slice(r),
            _ => Bytes::copy_from_slice(&self.buf[r]),
        }))
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
        let mut v = Vec::with_capacity(self.room(n));
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(v))
    }

    fn map(&mut self, n: usize, depth: usize) -> R<Value> {
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
            return Err(format!("nesting deeper than {MAX_DEPTH}"));
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
            0xc1 => return Err("reserved marker 0xc1".into()),
            _ => return Err(format!("extension type (marker 0x{m:02x}) in an event")),
        })
    }
}

/// Decodes an `events` body: `[[route, [[arg, ...], ...]], ...]`. With `owner` (the
/// frame buffer `body` lies in), large binaries are slices of it.
pub(crate) fn decode_events(body: &[u8], owner: Option<&Bytes>) -> R<Vec<(u32, Vec<Event>)>> {
    let mut r = Reader {
        buf: body,
        pos: 0,
        owner,
    };
    let groups = r.array()?;
    let mut out = Vec::with_capacity(r.room(groups));
    for _ in 0..groups {
        if r.array()? != 2 {
            return Err("a route group is not a [route, events] pair".into());
        }
        let route = r.u32()?;
        let n = r.array()?;
        let mut events = Vec::with_capacity(r.room(n));
        for _ in 0..n {
            let args = r.array()?;
            let mut ev = Event::new();
            for _ in 0..args {
                // groups, group, events, event: four levels above each argument.
                ev.push(r.value(5)?);
            }
            events.push(ev);
        }
        out.push((route, events));
    }
    if r.pos != body.len() {
        return Err(format!("{} trailing byte(s)", body.len() - r.pos));
    }
    Ok(out)
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
