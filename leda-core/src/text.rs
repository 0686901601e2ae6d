//! Text from outside (events, peers' strings, error messages quoting them) made safe
//! for a log line: bounded, and with control characters escaped, so that a line of
//! hostile input can neither flood the log nor forge lines or drive a terminal; and
//! what a caught panic says, as a failure's message ([`panic_message`]).

use std::borrow::Cow;

/// `s` cut to at most `max` bytes (at a character boundary, marked when cut), with
/// every control character but the tab (which separates an event's values) escaped as
/// Rust writes it (`\n`, `\u{1b}`).
///
/// ```
/// use leda_core::text::printable;
/// assert_eq!(printable("plain", 100), "plain");
/// assert_eq!(printable("a\nfake: line\u{1b}[2J", 100), "a\\nfake: line\\u{1b}[2J");
/// assert_eq!(printable("abcdef", 3), "abc… (6 bytes in all)");
/// ```
pub fn printable(s: &str, max: usize) -> Cow<'_, str> {
    let fits = s.len() <= max;
    let escaped = |c: char| c.is_control() && c != '\t';
    if fits && !s.chars().any(escaped) {
        return Cow::Borrowed(s);
    }
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 16);
    for c in s[..end].chars() {
        if escaped(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if !fits {
        out.push_str(&format!("… ({} bytes in all)", s.len()));
    }
    Cow::Owned(out)
}

/// What a caught panic says, as a failure's message: `panic: TEXT` (with a hint where
/// the text is tokio's "no reactor running", met by a handler using tokio's timers in a
/// simulation), or `panic` when its payload is not text.
pub fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    let text = if let Some(s) = p.downcast_ref::<&str>() {
        *s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.as_str()
    } else {
        return "panic".to_owned();
    };
    if text.contains("no reactor running") {
        // tokio's timers and sockets outside the real runtime: a simulation.
        format!("panic: {text} (in a simulation, wait with `ctx.sleep`, not tokio's timers)")
    } else {
        format!("panic: {text}")
    }
}
