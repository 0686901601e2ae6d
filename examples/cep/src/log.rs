//! Parsing one access-log line into the fields the rules use.
//!
//! The grammar (docs/stage-library.md § CEP; `lua/cep.lua`'s `parse` implements the
//! very same one): Apache's combined format followed by `%D`,
//!
//! ```text
//! line    = client SP ident SP user SP "[" time "]" SP quoted SP status SP size SP quoted SP quoted SP micros
//! client, ident, user = 1*NONSPACE         ; any bytes but space, \t, \n, \v, \f, \r
//! quoted  = DQUOTE *(any byte but DQUOTE and "\" / "\" any byte) DQUOTE   ; Apache's escapes
//! status  = 3DIGIT                         ; 100..=599
//! size    = "-" / 1*DIGIT
//! micros  = 1*18DIGIT                      ; %D: no overflow in i64 (nor in Lua's integers)
//! time    = 2DIGIT "/" MONTH "/" 4DIGIT ":" 2DIGIT ":" 2DIGIT ":" 2DIGIT SP ("+" / "-") 4DIGIT
//! ```
//!
//! with single spaces, DIGIT the ASCII digits only (no sign), and the time's fields in
//! range: year 1970..=9999, a day that exists in its month, hour ≤ 23, minute and
//! second ≤ 59, zone hours ≤ 23 and minutes ≤ 59. The year range refuses what Apache
//! cannot write (no log predates the Unix epoch; `%Y` of a 4-digit grammar ends at
//! 9999) and keeps every time in i64 seconds far from overflow. The time of a line
//! that is not an entry is the text between its first `[` and the first `]` after it
//! ([`time_of`]), with the same time grammar.

use std::collections::HashMap;

/// The fields of a log entry the CEP rules read. The client (`%h`: an IPv4 or IPv6
/// address or a host name) is the line's first `client_len` bytes
/// ([`Entry::client`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Length in bytes of the client, the line's first field.
    pub client_len: u32,
    /// Request time, seconds since the epoch.
    pub time: i64,
    /// HTTP status.
    pub status: u16,
    /// Response time in microseconds (`%D`).
    pub micros: u64,
}

impl Entry {
    /// The client of this entry's `line`, or `None` if `line` is too short to be it.
    pub fn client<'a>(&self, line: &'a [u8]) -> Option<&'a [u8]> {
        line.get(..self.client_len as usize)
    }
}

/// Why a line is not an access-log entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an access-log line ({0}): {1}")]
pub struct ParseError(pub &'static str, pub String);

/// The first year a time may have.
pub const MIN_YEAR: i64 = 1970;
/// The last year a time may have.
pub const MAX_YEAR: i64 = 9999;
/// The most digits `%D` may have (10^18 - 1 fits i64 and Lua's integers).
pub const MAX_MICROS_DIGITS: usize = 18;

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn month(m: &[u8]) -> Option<u32> {
    const M: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    M.iter().position(|x| *x == m).map(|i| i as u32 + 1)
}

/// The value of `s` if it is 1 to 18 ASCII digits (no sign, no space).
fn digits(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > MAX_MICROS_DIGITS || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, &c| n * 10 + i64::from(c - b'0')))
}

/// `s` as exactly `n` digits, if in `range`.
fn field(s: &[u8], n: usize, range: std::ops::RangeInclusive<i64>) -> Option<i64> {
    let v = digits(s).filter(|_| s.len() == n)?;
    range.contains(&v).then_some(v)
}

/// Parses Apache's `%t` (`22/Nov/2026:10:00:01 +0000`) to seconds since the epoch:
/// the grammar's `time` (see the module), fields in range, or `None`.
pub fn parse_time(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    // dd/Mon/yyyy:hh:mm:ss +zzzz: 26 bytes, separators at fixed places.
    if b.len() != 26 || [b[2], b[6], b[11], b[14], b[17], b[20]] != *b"//::: " {
        return None;
    }
    let year = field(&b[7..11], 4, MIN_YEAR..=MAX_YEAR)?;
    let mon = month(&b[3..6])?;
    let day = field(&b[0..2], 2, 1..=i64::from(days_in_month(year, mon)))?;
    let h = field(&b[12..14], 2, 0..=23)?;
    let mi = field(&b[15..17], 2, 0..=59)?;
    let s = field(&b[18..20], 2, 0..=59)?;
    let sign = match b[21] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let zh = field(&b[22..24], 2, 0..=23)?;
    let zm = field(&b[24..26], 2, 0..=59)?;
    let offset = sign * (zh * 3600 + zm * 60);
    Some(days_from_civil(year, mon, day as u32) * 86_400 + h * 3600 + mi * 60 + s - offset)
}

/// The event time of a line that is not an entry: the text between its first `[` and
/// the first `]` after it, as [`parse_time`] reads it.
pub fn time_of(line: &str) -> Option<i64> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    parse_time(&line[open + 1..close])
}

/// Whitespace as Lua's `%s` (C's `isspace` in the C locale) knows it.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A position in a line being parsed.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    /// `1*NONSPACE`.
    fn token(&mut self) -> Option<&'a [u8]> {
        let s = self.i;
        while self.i < self.b.len() && !is_space(self.b[self.i]) {
            self.i += 1;
        }
        (self.i > s).then(|| &self.b[s..self.i])
    }

    fn byte(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// The bytes up to the next `c`, which is consumed.
    fn until(&mut self, c: u8) -> Option<&'a [u8]> {
        let s = self.i;
        let n = self.b[s..].iter().position(|&x| x == c)?;
        self.i = s + n + 1;
        Some(&self.b[s..s + n])
    }

    /// `quoted`: a `"`-delimited string in which `\` escapes the byte after it.
    fn quoted(&mut self) -> Option<()> {
        self.byte(b'"')?;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    self.b.get(self.i + 1)?;
                    self.i += 2;
                }
                _ => self.i += 1,
            }
        }
    }
}

/// Parses a line of the grammar (see the module): Apache's combined format ending
/// with `%D`.
pub fn parse(line: &str) -> Result<Entry, ParseError> {
    let bad = |what| ParseError(what, line.chars().take(80).collect());
    let mut c = Cursor {
        b: line.as_bytes(),
        i: 0,
    };
    let client = c.token().ok_or_else(|| bad("client"))?;
    let client_len = u32::try_from(client.len()).map_err(|_| bad("client"))?;
    (|| {
        c.byte(b' ')?;
        c.token()?;
        c.byte(b' ')?;
        c.token()?;
        c.byte(b' ')
    })()
    .ok_or_else(|| bad("identity"))?;
    let time = (|| {
        c.byte(b'[')?;
        let t = std::str::from_utf8(c.until(b']')?).ok()?;
        parse_time(t)
    })()
    .ok_or_else(|| bad("time"))?;
    (|| {
        c.byte(b' ')?;
        c.quoted()
    })()
    .ok_or_else(|| bad("request"))?;
    let status = (|| {
        c.byte(b' ')?;
        field(c.token()?, 3, 100..=599)
    })()
    .ok_or_else(|| bad("status"))?;
    (|| {
        c.byte(b' ')?;
        let size = c.token()?;
        (size == b"-" || size.iter().all(u8::is_ascii_digit)).then_some(())?;
        c.byte(b' ')?;
        c.quoted()?;
        c.byte(b' ')?;
        c.quoted()
    })()
    .ok_or_else(|| bad("referer or user agent"))?;
    let micros = (|| {
        c.byte(b' ')?;
        let d = c.token()?;
        (c.i == c.b.len()).then_some(())?;
        digits(d)
    })()
    .ok_or_else(|| bad("response time"))?;
    Ok(Entry {
        client_len,
        time,
        status: status as u16,
        micros: micros as u64,
    })
}

/// Numbers each distinct client of `clients` from 0, in order of first appearance
/// (so that the rules compare numbers, not strings).
pub fn client_ids<'a>(clients: impl IntoIterator<Item = &'a [u8]>) -> (Vec<u32>, Vec<&'a [u8]>) {
    let mut ids = HashMap::new();
    let mut names = Vec::new();
    let numbered = clients
        .into_iter()
        .map(|c| {
            *ids.entry(c).or_insert_with(|| {
                names.push(c);
                names.len() as u32 - 1
            })
        })
        .collect();
    (numbered, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "22/Nov/2026:10:00:01 +0000";

    fn line(client: &str, rest: &str) -> String {
        format!("{client} - - [{T}] {rest}")
    }

    #[test]
    fn parses_generated_lines() {
        let l = r#"203.0.113.7 - - [22/Nov/2026:10:00:01 +0000] "GET /a b HTTP/1.1" 404 312 "-" "curl/8.11.0" 1234"#;
        let e = parse(l).unwrap();
        assert_eq!(e.client(l.as_bytes()), Some(&b"203.0.113.7"[..]));
        assert_eq!(e.time, crate::generate::START + 10 * 3600 + 1);
        assert_eq!((e.status, e.micros), (404, 1234));
        assert!(parse("garbage").is_err());
        assert!(parse(r#"1.2.3.4 - - [bad] "GET /" 200 1 "-" "-" 5"#).is_err());
        assert_eq!(
            parse_time("22/Nov/2026:01:00:00 +0100"),
            Some(crate::generate::START)
        );
    }

    #[test]
    fn any_client_without_spaces_and_apache_escapes_are_entries() {
        let rest = r#""GET /x HTTP/1.1" 503 12 "-" "curl" 5000"#;
        for client in [
            "2001:db8::1",
            "host.example",
            "010.009.009.009",
            "999.1.1.1",
        ] {
            let l = line(client, rest);
            let e = parse(&l).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(e.client(l.as_bytes()), Some(client.as_bytes()));
            assert_eq!((e.status, e.micros), (503, 5000));
        }
        let escaped = line("a", r#""GET /\"x\\ HTTP/1.1" 503 - "-" "cu\"rl" 5000"#);
        assert_eq!(parse(&escaped).map(|e| e.status), Ok(503));
        let big = line("a", r#""G" 200 1 "-" "-" 999999999999999999"#);
        assert_eq!(parse(&big).map(|e| e.micros), Ok(999_999_999_999_999_999));
    }

    #[test]
    fn lines_outside_the_grammar_are_not_entries() {
        let refused = [
            // Common Log Format (no referer, no user agent), with %D.
            line("a", r#""GET /x HTTP/1.1" 503 12 5000"#),
            line("a", r#""GET /x HTTP/1.1" +503 12 "-" "curl" 5000"#),
            line("a", r#""GET /x HTTP/1.1" 503 12 "-" "curl" +5000"#),
            line("a", r#""GET /x HTTP/1.1" 503 12 "-" "curl" -5"#),
            line("a", r#""GET /x HTTP/1.1" 99999 12 "-" "curl" 5000"#),
            line("a", r#""GET /x HTTP/1.1" 099 12 "-" "curl" 5000"#),
            line("a", r#""GET /x HTTP/1.1" 600 12 "-" "curl" 5000"#),
            line(
                "a",
                r#""GET /x HTTP/1.1" 200 12 "-" "curl" 9999999999999999999"#,
            ),
            line("a", r#""GET /x HTTP/1.1" 503 12 "-" "curl" 5000 "#),
            line("a", r#""GET /x HTTP/1.1" 503 1x "-" "curl" 5000"#),
            line("a", r#""GET /x HTTP/1.1" 503 12 "-" "cu\"rl 5000"#),
            line("a", r#""GET /x HTTP/1.1\" 503 12 "-" "curl" 5000"#),
            format!(r#"a - - [{T}]  "GET /x HTTP/1.1" 503 12 "-" "curl" 5000"#),
            format!(r#"a  - - [{T}] "GET /x HTTP/1.1" 503 12 "-" "curl" 5000"#),
            format!("a\t- - [{T}] \"GET /x HTTP/1.1\" 503 12 \"-\" \"curl\" 5000"),
        ];
        for l in &refused {
            assert!(parse(l).is_err(), "{l}");
            assert_eq!(time_of(l), parse_time(T), "{l}: a time all the same");
        }
    }

    #[test]
    fn times_out_of_the_grammar_or_range_are_refused() {
        for t in [
            "22/Nov/+2026:+0:+0:+0 +0000",
            "22/Nov/-5:00:00:00 +0000",
            "22/Nov/2026:-1:-1:-1 +0000",
            "22/Nov/2026:00:00:00 +99999999999",
            "22/Nov/99999999999999999999:00:00:00 +0000",
            "22/Nov/99999999999999:00:00:00 +0000",
            "22/Nov/2026:9999999999999999:00:00 +0000",
            "00/Nov/2026:00:00:00 +0000",
            "0/Nov/2026:00:00:00 +0000",
            "31/Nov/2026:00:00:00 +0000",
            "29/Feb/2026:00:00:00 +0000",
            "22/nov/2026:00:00:00 +0000",
            "22/Nov/2026:24:00:00 +0000",
            "22/Nov/2026:00:60:00 +0000",
            "22/Nov/2026:00:00:60 +0000",
            "22/Nov/2026:00:00:00 +1399",
            "22/Nov/2026:00:00:00 +2400",
            "22/Nov/2026:00:00:00 +00x0",
            "22/Nov/2026:00:00:00",
            "22/Nov/2026:00:00:00 +0000 extra",
            "22/Nov/2026:00:00:00.5 +0000",
            "22/Nov/1969:23:59:59 +0000",
            "22/Nov/0000000002026:00:00:00 +0000",
            "22/Nov/2026:00:00:00  +000",
        ] {
            assert_eq!(parse_time(t), None, "{t}");
        }
        assert_eq!(
            parse_time("29/Feb/2028:00:00:00 +0000"),
            Some(1_835_395_200)
        );
        assert_eq!(parse_time("01/Jan/1970:00:00:00 +0000"), Some(0));
        assert_eq!(parse_time("01/Jan/1970:00:00:00 +0100"), Some(-3600));
        assert_eq!(
            parse_time("31/Dec/9999:23:59:59 -2359"),
            Some(253_402_300_799 + 86_340)
        );
    }
}
