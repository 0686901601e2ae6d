//! A seeded generator of realistic Apache access logs (combined format plus the
//! response time `%D`, in microseconds), split over several files.
//!
//! Traffic: a few thousand clients browsing pages and assets (mostly 200/304, some
//! 404, rare 5xx, a heavy tail of slow responses), and a few dozen scanners that fire
//! bursts of requests for missing or forbidden paths within seconds: the pattern the
//! `correlate` stage looks for.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use leda_core::sim::SimRng;

/// leda-core's SplitMix64 ([`SimRng`]) with the draws the generator uses; seeds are
/// mixed first (`seed ^ 0x9E37_79B9_7F4A_7C15`), so the logs of a seed never change.
#[derive(Clone, Debug)]
pub struct Rng(SimRng);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(SimRng::new(seed ^ 0x9E37_79B9_7F4A_7C15))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.unit()
    }
}

const PAGES: &[&str] = &[
    "/",
    "/index.html",
    "/products",
    "/products/42",
    "/products/7",
    "/cart",
    "/checkout",
    "/login",
    "/search?q=shoes",
    "/search?q=lamp",
    "/blog/2026/11/leda",
    "/about",
    "/contact",
    "/api/v1/items",
    "/api/v1/items/981",
    "/api/v1/cart",
    "/static/app.js",
    "/static/app.css",
    "/static/logo.png",
    "/favicon.ico",
];
const PROBES: &[&str] = &[
    "/wp-login.php",
    "/.env",
    "/admin",
    "/phpmyadmin/",
    "/.git/config",
    "/cgi-bin/test.cgi",
    "/backup.zip",
    "/config.php",
    "/server-status",
    "/xmlrpc.php",
];
const AGENTS: &[&str] = &[
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "curl/8.11.0",
    "Googlebot/2.1 (+http://www.google.com/bot.html)",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Seconds since the Unix epoch of the first log line (2026-11-22 00:00:00 UTC).
pub const START: i64 = 1_795_305_600;

/// Days since 1970-01-01 to (year, month 1-12, day 1-31) (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Apache's `%t` for `secs` since the epoch, in UTC.
pub fn apache_time(secs: i64) -> String {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{d:02}/{}/{y}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn client_ip(rng: &mut Rng) -> String {
    // 4,000 clients in 198.51.100.0/22-like space.
    let n = rng.below(4000);
    format!("10.{}.{}.{}", 1 + n / 2000, (n / 250) % 8, n % 250 + 1)
}

fn scanner_ip(rng: &mut Rng) -> String {
    format!("203.0.113.{}", 1 + rng.below(40))
}

/// One server's log: `lines` lines starting at [`START`].
pub fn server_log(rng: &mut Rng, lines: usize, out: &mut impl Write) -> std::io::Result<()> {
    let mut t = START as f64;
    let mut burst: Option<(String, u32)> = None;
    for _ in 0..lines {
        t += rng.unit() * 0.004; // ~500 requests/s per server
        let (ip, path, status, agent) = match burst.take() {
            Some((ip, left)) => {
                if left > 1 {
                    burst = Some((ip.clone(), left - 1));
                }
                let path = PROBES[rng.below(PROBES.len() as u64) as usize];
                let status = if rng.below(4) == 0 { 403 } else { 404 };
                (ip, path, status, AGENTS[3])
            }
            None if rng.below(400) == 0 => {
                let ip = scanner_ip(rng);
                burst = Some((ip.clone(), 4 + rng.below(12) as u32));
                (
                    ip,
                    PROBES[rng.below(PROBES.len() as u64) as usize],
                    404,
                    AGENTS[3],
                )
            }
            None => {
                let path = PAGES[rng.below(PAGES.len() as u64) as usize];
                let r = rng.below(1000);
                let status = match r {
                    0..=849 => 200,
                    850..=909 => 304,
                    910..=939 => 302,
                    940..=984 => 404,
                    985..=989 => 403,
                    990..=996 => 500,
                    _ => 503,
                };
                let agent = AGENTS[rng.below(AGENTS.len() as u64) as usize];
                (client_ip(rng), path, status, agent)
            }
        };
        let bytes = match status {
            304 => 0,
            200 => 200 + rng.below(40_000),
            _ => 150 + rng.below(400),
        };
        // Response time: mostly 1-60 ms, a tail up to seconds.
        let u = rng.unit();
        let micros = if u < 0.995 {
            1_000 + rng.below(59_000)
        } else {
            500_000 + rng.below(4_000_000)
        };
        let referer = if rng.below(3) == 0 {
            "https://www.example.com/"
        } else {
            "-"
        };
        writeln!(
            out,
            "{ip} - - [{}] \"GET {path} HTTP/1.1\" {status} {bytes} \"{referer}\" \"{agent}\" {micros}",
            apache_time(t as i64)
        )?;
    }
    Ok(())
}

/// Writes `total` lines split over `files` logs `access-<i>.log` in `dir` (the first
/// files get the remainder). Same seed, same files.
pub fn write_logs(
    dir: &Path,
    total: usize,
    files: usize,
    seed: u64,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let files = files.max(1);
    let mut paths = Vec::new();
    for i in 0..files {
        let n = total / files + usize::from(i < total % files);
        let path = dir.join(format!("access-{}.log", i + 1));
        let mut rng = Rng::new(seed.wrapping_add(i as u64 * 0x1000_0001));
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
        server_log(&mut rng, n, &mut w)?;
        w.flush()?;
        paths.push(path);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(apache_time(0), "01/Jan/1970:00:00:00 +0000");
        assert_eq!(apache_time(START), "22/Nov/2026:00:00:00 +0000");
        assert_eq!(apache_time(951_782_400), "29/Feb/2000:00:00:00 +0000");
    }

    #[test]
    fn seeded() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        server_log(&mut Rng::new(7), 200, &mut a).unwrap();
        server_log(&mut Rng::new(7), 200, &mut b).unwrap();
        assert_eq!(a, b);
        let mut c = Vec::new();
        server_log(&mut Rng::new(8), 200, &mut c).unwrap();
        assert_ne!(a, c);
        assert_eq!(String::from_utf8(a).unwrap().lines().count(), 200);
    }
}
