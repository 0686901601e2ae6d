//! Parsed log lines in two reference-counted buffers, their text and their records:
//! what `stamp` sends and what `window` emits, as two `bytes` arguments. Each line is
//! parsed once, next to its source; the stages after read the records, and copies of
//! a window (one per consumer, or a line quoted in an alarm) share the buffers
//! instead of copying them. Between processes each is one MessagePack `bin`.
//!
//! A record is [`RECORD`] bytes, little-endian: `time i64, micros u64, ip u32,
//! status u16, flags u16, start u32, end u32`; its line is `text[start..end]`, without
//! its end-of-line. A line with a time whose other fields cannot be read is kept (it
//! goes into a window and is persisted) with [`PARSED`] clear: `filter` and
//! `correlate` skip it, as the sequential program does. The buffers may come from
//! another process: a span outside the text is an error when the line is read.

use bytes::Bytes;

use crate::log::{Entry, parse, time_of};

/// Bytes per record.
pub const RECORD: usize = 32;
/// Record flag: the entry's fields were read.
pub const PARSED: u16 = 1;

/// Why buffers are not a batch (they may come from another process: checked, not
/// trusted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a batch of log lines: {0}")]
pub struct BadBatch(&'static str);

/// A batch (see the module).
#[derive(Clone, Debug)]
pub struct Batch {
    text: Bytes,
    records: Bytes,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Batch {
    /// The batch of `text` and `records` (whole records).
    pub fn new(text: Bytes, records: Bytes) -> Result<Batch, BadBatch> {
        if !records.len().is_multiple_of(RECORD) {
            return Err(BadBatch("the records are not whole"));
        }
        Ok(Batch { text, records })
    }

    /// The text and the records (to send on).
    pub fn into_parts(self) -> (Bytes, Bytes) {
        (self.text, self.records)
    }

    /// Lines in the batch.
    pub fn len(&self) -> usize {
        self.records.len() / RECORD
    }

    /// Whether the batch has no line.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn record(&self, i: usize) -> &[u8] {
        &self.records[i * RECORD..(i + 1) * RECORD]
    }

    fn span(&self, i: usize) -> Result<(usize, usize), BadBatch> {
        let r = self.record(i);
        let (s, e) = (u32_at(r, 24) as usize, u32_at(r, 28) as usize);
        if s > e || e > self.text.len() {
            return Err(BadBatch("a line lies outside the text"));
        }
        Ok((s, e))
    }

    /// Line `i`'s event time (seconds since the epoch).
    pub fn time(&self, i: usize) -> i64 {
        u64_at(self.record(i), 0) as i64
    }

    /// Line `i`'s fields, if they were read.
    pub fn entry(&self, i: usize) -> Option<Entry> {
        let r = self.record(i);
        let flags = u16::from_le_bytes([r[22], r[23]]);
        (flags & PARSED != 0).then(|| Entry {
            time: u64_at(r, 0) as i64,
            micros: u64_at(r, 8),
            ip: u32_at(r, 16),
            status: u16::from_le_bytes([r[20], r[21]]),
        })
    }

    /// Line `i`'s text (without its end-of-line).
    pub fn line(&self, i: usize) -> Result<&[u8], BadBatch> {
        let (s, e) = self.span(i)?;
        Ok(&self.text[s..e])
    }

    /// Line `i`'s text, sharing the buffer.
    pub fn line_shared(&self, i: usize) -> Result<Bytes, BadBatch> {
        let (s, e) = self.span(i)?;
        Ok(self.text.slice(s..e))
    }

    /// Line `i`, for the merge.
    pub fn take(&self, i: usize) -> Result<Line, BadBatch> {
        Ok(Line {
            time: self.time(i),
            entry: self.entry(i),
            text: self.line_shared(i)?,
        })
    }

    /// The whole text: for a window, its lines, each followed by `\n`.
    pub fn text(&self) -> &[u8] {
        &self.text
    }

    /// The fields of every line that has them.
    pub fn entries(&self) -> Vec<Entry> {
        (0..self.len()).filter_map(|i| self.entry(i)).collect()
    }
}

/// One line out of a batch, on its way through the merge into a window.
#[derive(Clone, Debug)]
pub struct Line {
    /// Event time.
    pub time: i64,
    /// Fields, if they were read.
    pub entry: Option<Entry>,
    /// Text (without its end-of-line), shared with the batch it came in.
    pub text: Bytes,
}

/// Builds a batch.
pub struct Builder {
    text: Vec<u8>,
    records: Vec<u8>,
}

impl Builder {
    /// An empty batch with room for `lines` lines of `text` bytes.
    pub fn new(lines: usize, text: usize) -> Builder {
        Builder {
            text: Vec::with_capacity(text),
            records: Vec::with_capacity(lines * RECORD),
        }
    }

    fn record(&mut self, time: i64, entry: Option<Entry>, start: usize, end: usize) {
        let e = entry.unwrap_or(Entry {
            ip: 0,
            time,
            status: 0,
            micros: 0,
        });
        let r = &mut self.records;
        r.extend_from_slice(&time.to_le_bytes());
        r.extend_from_slice(&e.micros.to_le_bytes());
        r.extend_from_slice(&e.ip.to_le_bytes());
        r.extend_from_slice(&e.status.to_le_bytes());
        r.extend_from_slice(&u16::from(entry.is_some()).to_le_bytes());
        r.extend_from_slice(&(start as u32).to_le_bytes());
        r.extend_from_slice(&(end as u32).to_le_bytes());
    }

    /// Appends `line`, its text followed by `\n`.
    pub fn push(&mut self, line: &Line) {
        let start = self.text.len();
        self.text.extend_from_slice(&line.text);
        self.record(line.time, line.entry, start, start + line.text.len());
        self.text.push(b'\n');
    }

    /// The batch.
    pub fn finish(self) -> Batch {
        Batch {
            text: self.text.into(),
            records: self.records.into(),
        }
    }
}

/// What [`stamp`] made of a chunk.
pub struct Stamped {
    /// The batch (the chunk's text, with a record for each line that has a time).
    pub batch: Batch,
    /// Lines without a readable access-log time, left out of the batch.
    pub untimed: Vec<String>,
    /// Lines with a time but unreadable fields (in the batch, not [`PARSED`]).
    pub unparsed: usize,
}

/// Parses every line of `chunk` (whole lines, as `io.lines` sends them with `chunk`)
/// into a batch over the chunk's own text: nothing is copied.
pub fn stamp(chunk: Vec<u8>) -> Stamped {
    let mut b = Builder::new(chunk.len() / 128, 0);
    let mut untimed = Vec::new();
    let mut unparsed = 0;
    let mut start = 0;
    while start < chunk.len() {
        let nl = chunk[start..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(chunk.len(), |i| start + i);
        let mut end = nl;
        if end > start && chunk[end - 1] == b'\r' {
            end -= 1;
        }
        let line = &chunk[start..end];
        match std::str::from_utf8(line) {
            Ok(l) => match parse(l) {
                Ok(e) => b.record(e.time, Some(e), start, end),
                Err(_) => match time_of(l) {
                    Some(t) => {
                        unparsed += 1;
                        b.record(t, None, start, end);
                    }
                    None => untimed.push(l.chars().take(200).collect()),
                },
            },
            Err(_) => untimed.push(String::from_utf8_lossy(line).chars().take(200).collect()),
        }
        start = nl + 1;
    }
    b.text = chunk;
    Stamped {
        batch: b.finish(),
        untimed,
        unparsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"203.0.113.7 - - [22/Nov/2026:10:00:01 +0000] "GET /a HTTP/1.1" 503 312 "-" "curl/8" 1234"#;

    #[test]
    fn a_chunk_becomes_a_batch_over_its_own_text() {
        let chunk = format!(
            "{GOOD}\r\nno time here\n1.2.3.4 - - [22/Nov/2026:10:00:02 +0000] broken\n{GOOD}"
        );
        let s = stamp(chunk.clone().into_bytes());
        assert_eq!(s.untimed, vec!["no time here".to_owned()]);
        assert_eq!(s.unparsed, 1);
        let b = s.batch;
        assert_eq!(b.len(), 3);
        assert_eq!(b.text(), chunk.as_bytes());
        assert_eq!(
            b.line(0).unwrap(),
            GOOD.as_bytes(),
            "the \\r is not part of the line"
        );
        assert_eq!(b.entry(0), Some(parse(GOOD).unwrap()));
        assert_eq!(b.entry(1), None);
        assert_eq!(b.time(1), b.time(0) + 1);
        assert_eq!(b.line(2).unwrap(), GOOD.as_bytes());
        assert_eq!(b.entries().len(), 2);
    }

    #[test]
    fn a_window_holds_its_lines_each_ended_by_a_newline() {
        let b = stamp(format!("{GOOD}\n{GOOD}\n").into_bytes()).batch;
        let mut w = Builder::new(2, 0);
        w.push(&b.take(1).unwrap());
        w.push(&b.take(0).unwrap());
        let w = w.finish();
        assert_eq!(w.text(), format!("{GOOD}\n{GOOD}\n").as_bytes());
        assert_eq!(w.line_shared(1).unwrap(), GOOD.as_bytes());
        assert_eq!(w.entry(1), b.entry(0));
    }

    #[test]
    fn hostile_buffers_are_refused() {
        let (text, records) = stamp(format!("{GOOD}\n").into_bytes()).batch.into_parts();
        assert_eq!(
            Batch::new(text.clone(), records.slice(1..)).unwrap_err(),
            BadBatch("the records are not whole")
        );
        let mut span = records.to_vec();
        span[28..32].copy_from_slice(&10_000u32.to_le_bytes());
        let b = Batch::new(text.clone(), Bytes::from(span)).unwrap();
        assert_eq!(
            b.line(0).unwrap_err(),
            BadBatch("a line lies outside the text")
        );
        assert!(b.take(0).is_err());
        assert!(Batch::new(text, records).unwrap().line(0).is_ok());
    }
}
