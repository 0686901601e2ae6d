//! Reading a listen address from an event.

use leda_core::prelude::*;

/// The address to listen on from an event: `("host", port)`, `("host:port")` or
/// `(port)` (on 127.0.0.1). `None` if the event says none of these.
pub fn listen_addr(ev: &Event) -> Option<String> {
    match (ev.arg(0), ev.arg(1)) {
        (Some(Value::Str(h)), Some(p)) if crate::args::to_i64(p).is_some() => {
            Some(format!("{h}:{}", crate::args::to_i64(p)?))
        }
        (Some(Value::Str(hp)), None) if hp.contains(':') => Some(hp.clone()),
        (Some(p), None) => crate::args::to_i64(p).map(|p| format!("127.0.0.1:{p}")),
        _ => None,
    }
}
