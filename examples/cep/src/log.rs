//! Parsing one access-log line into the fields the rules use.

use crate::generate::civil_from_days;

/// The fields of a log entry the CEP rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Client IPv4 address.
    pub ip: u32,
    /// Request time, seconds since the epoch.
    pub time: i64,
    /// HTTP status.
    pub status: u16,
    /// Response time in microseconds (`%D`).
    pub micros: u64,
}

/// Why a line is not an access-log entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an access-log line ({0}): {1}")]
pub struct ParseError(pub &'static str, pub String);

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn month(m: &str) -> Option<u32> {
    const M: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    M.iter().position(|x| *x == m).map(|i| i as u32 + 1)
}

/// Parses Apache's `%t` (`22/Nov/2026:10:00:01 +0000`) to seconds since the epoch.
pub fn parse_time(t: &str) -> Option<i64> {
    let (date, zone) = t.split_once(' ')?;
    let mut it = date.splitn(4, [':', '/']);
    let day: u32 = it.next()?.parse().ok()?;
    let mon = month(it.next()?)?;
    let year: i64 = it.next()?.parse().ok()?;
    let mut hms = it.next()?.split(':');
    let h: i64 = hms.next()?.parse().ok()?;
    let mi: i64 = hms.next()?.parse().ok()?;
    let s: i64 = hms.next()?.parse().ok()?;
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let z: i64 = zone.get(1..)?.parse().ok()?;
    let offset = sign * ((z / 100) * 3600 + (z % 100) * 60);
    debug_assert!(civil_from_days(days_from_civil(year, mon, day)) == (year, mon, day));
    Some(days_from_civil(year, mon, day) * 86_400 + h * 3600 + mi * 60 + s - offset)
}

fn parse_ip(s: &str) -> Option<u32> {
    s.parse::<std::net::Ipv4Addr>().ok().map(u32::from)
}

/// The event time of a log line (its `%t`), without parsing the rest.
pub fn time_of(line: &str) -> Option<i64> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    parse_time(&line[open + 1..close])
}

/// Parses a combined-format line ending with `%D`.
pub fn parse(line: &str) -> Result<Entry, ParseError> {
    let bad = |what| ParseError(what, line.chars().take(80).collect());
    let (ip, rest) = line.split_once(' ').ok_or_else(|| bad("no fields"))?;
    let ip = parse_ip(ip).ok_or_else(|| bad("client address"))?;
    let open = rest.find('[').ok_or_else(|| bad("time"))?;
    let close = rest[open..].find(']').ok_or_else(|| bad("time"))? + open;
    let time = parse_time(&rest[open + 1..close]).ok_or_else(|| bad("time"))?;
    let rest = &rest[close + 1..];
    // The request line is quoted; status and size follow it.
    let q1 = rest.find('"').ok_or_else(|| bad("request"))?;
    let q2 = rest[q1 + 1..].find('"').ok_or_else(|| bad("request"))? + q1 + 1;
    let mut after = rest[q2 + 1..].split_ascii_whitespace();
    let status: u16 = after
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("status"))?;
    let micros: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("response time"))?;
    Ok(Entry {
        ip,
        time,
        status,
        micros,
    })
}

/// Dotted form of an address.
pub fn ip_text(ip: u32) -> String {
    std::net::Ipv4Addr::from(ip).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_generated_lines() {
        let l = r#"203.0.113.7 - - [22/Nov/2026:10:00:01 +0000] "GET /a b HTTP/1.1" 404 312 "-" "curl/8.11.0" 1234"#;
        let e = parse(l).unwrap();
        assert_eq!(e.ip, u32::from(std::net::Ipv4Addr::new(203, 0, 113, 7)));
        assert_eq!(e.time, crate::generate::START + 10 * 3600 + 1);
        assert_eq!((e.status, e.micros), (404, 1234));
        assert!(parse("garbage").is_err());
        assert!(parse(r#"1.2.3.4 - - [bad] "GET /" 200 1 "-" "-" 5"#).is_err());
        assert_eq!(
            parse_time("22/Nov/2026:01:00:00 +0100"),
            Some(crate::generate::START)
        );
    }
}
