//! Parsed log lines in two reference-counted buffers, their text and their records:
//! what `stamp` sends and what `window` emits, as two `bytes` arguments. Each line is
//! parsed once, next to its source; the stages after read the records, and copies of
//! a window (one per consumer, or a line quoted in an alarm) share the buffers
//! instead of copying them. Between processes each is one MessagePack `bin`.
//!
//! A record is [`RECORD`] bytes, little-endian: `time i64, micros u64, client_len u32,
//! status u16, flags u16, start u32, end u32`; its line is `text[start..end]`, without
//! its end-of-line, and its client the line's first `client_len` bytes. A line with a time whose other fields cannot be read is kept (it
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

    /// Checks every line's span (a batch from another process, before anything is
    /// taken from it).
    pub fn check(&self) -> Result<(), BadBatch> {
        (0..self.len()).try_for_each(|i| self.span(i).map(|_| ()))
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
            client_len: u32_at(r, 16),
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

    /// The fields of every line that has them, each with its client.
    pub fn entries(&self) -> Result<Vec<(&[u8], Entry)>, BadBatch> {
        let mut out = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            if let Some(e) = self.entry(i) {
                let client = e
                    .client(self.line(i)?)
                    .ok_or(BadBatch("a client lies outside its line"))?;
                out.push((client, e));
            }
        }
        Ok(out)
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

    fn record(&mut self, time: i64, entry: Option<Entry>, start: u32, end: u32) {
        let e = entry.unwrap_or(Entry {
            client_len: 0,
            time,
            status: 0,
            micros: 0,
        });
        let r = &mut self.records;
        r.extend_from_slice(&time.to_le_bytes());
        r.extend_from_slice(&e.micros.to_le_bytes());
        r.extend_from_slice(&e.client_len.to_le_bytes());
        r.extend_from_slice(&e.status.to_le_bytes());
        r.extend_from_slice(&u16::from(entry.is_some()).to_le_bytes());
        r.extend_from_slice(&start.to_le_bytes());
        r.extend_from_slice(&end.to_le_bytes());
    }

    /// Appends `line`, its text followed by `\n`. Spans are 32-bit: a batch's text
    /// cannot pass 4 GiB.
    pub fn push(&mut self, line: &Line) -> Result<(), BadBatch> {
        let start = self.text.len();
        let span = |x: usize| u32::try_from(x).map_err(|_| BadBatch("its text passes 4 GiB"));
        let (s, e) = (span(start)?, span(start + line.text.len())?);
        self.text.extend_from_slice(&line.text);
        self.record(line.time, line.entry, s, e);
        self.text.push(b'\n');
        Ok(())
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

impl Stamped {
    /// Logs the lines of `source` left out, and those kept without their fields.
    pub fn warn(&self, source: usize) {
        for line in &self.untimed {
            tracing::warn!(source, line, "no access-log time: line skipped");
        }
        if self.unparsed > 0 {
            tracing::warn!(
                source,
                lines = self.unparsed,
                "unreadable fields: kept, not filtered or correlated"
            );
        }
    }
}

/// Parses every line of `chunk` (whole lines, as `io.lines` sends them with `chunk`)
/// into a batch over the chunk's own text: nothing is copied.
pub fn stamp(chunk: Vec<u8>) -> Stamped {
    // A line that is not UTF-8 is read as `io.lines` reads it line by line: invalid
    // sequences replaced (a copy of this chunk only).
    let text = match String::from_utf8(chunk) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    assert!(
        u32::try_from(text.len()).is_ok(),
        "a chunk is at most 2 MiB"
    );
    let bytes = text.as_bytes();
    let mut b = Builder::new(text.len() / 128, 0);
    let mut untimed = Vec::new();
    let mut unparsed = 0;
    let mut start = 0;
    while start < text.len() {
        let nl = bytes[start..]
            .iter()
            .position(|&c| c == b'\n')
            .map(|i| start + i);
        let mut end = nl.unwrap_or(text.len());
        // `\r\n` ends a line as `\n` does (as in `io.lines`).
        if nl.is_some() && end > start && bytes[end - 1] == b'\r' {
            end -= 1;
        }
        // (Cut at ASCII bytes: character boundaries.)
        let line = &text[start..end];
        let (s, e) = (start as u32, end as u32);
        match parse(line) {
            Ok(entry) => b.record(entry.time, Some(entry), s, e),
            Err(_) => match time_of(line) {
                Some(t) => {
                    unparsed += 1;
                    b.record(t, None, s, e);
                }
                None => untimed.push(line.chars().take(200).collect()),
            },
        }
        start = nl.map_or(text.len(), |i| i + 1);
    }
    b.text = text.into_bytes();
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
        assert_eq!(b.entries().unwrap().len(), 2);
        assert_eq!(b.entries().unwrap()[0].0, b"203.0.113.7");
    }

    #[test]
    fn invalid_utf8_is_replaced_and_a_bare_cr_at_the_end_is_kept() {
        let mut chunk = GOOD.replace("curl/8", "curl\u{fffd}").into_bytes();
        let at = chunk.iter().position(|&c| c == 0xef).unwrap();
        chunk.splice(at..at + 3, [0xff]); // an invalid byte where U+FFFD was
        chunk.extend_from_slice(format!("\n{GOOD}\r").as_bytes());
        let s = stamp(chunk);
        assert!(s.untimed.is_empty());
        assert_eq!(
            s.unparsed, 1,
            "the bare \\r stays in the last line: its fields do not parse"
        );
        assert_eq!(s.batch.len(), 2);
        let first = String::from_utf8(s.batch.line(0).unwrap().to_vec()).unwrap();
        assert!(first.contains("curl\u{fffd}"), "{first}");
        assert_eq!(s.batch.line(1).unwrap(), format!("{GOOD}\r").as_bytes());
    }

    #[test]
    fn a_window_holds_its_lines_each_ended_by_a_newline() {
        let b = stamp(format!("{GOOD}\n{GOOD}\n").into_bytes()).batch;
        let mut w = Builder::new(2, 0);
        w.push(&b.take(1).unwrap()).unwrap();
        w.push(&b.take(0).unwrap()).unwrap();
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
        assert_eq!(b.check(), Err(BadBatch("a line lies outside the text")));
        assert_eq!(
            b.line(0).unwrap_err(),
            BadBatch("a line lies outside the text")
        );
        assert!(b.take(0).is_err());
        let good = Batch::new(text, records).unwrap();
        assert_eq!(good.check(), Ok(()));
        assert!(good.line(0).is_ok());
    }
}
