//! Output port names. A port is a key, a string or a number, as in `leda.send(port, ...)`;
//! the default port is `1`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The name of an output port: a string or a positive number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Port {
    /// A numbered port (`leda.send(1, ...)`).
    Index(i64),
    /// A named port (`leda.send("line", ...)`).
    Name(Arc<str>),
}

impl Port {
    /// The default port, `1`.
    pub const DEFAULT: Port = Port::Index(1);

    /// The port a stage's handler errors go to when connected.
    pub fn error() -> Port {
        Port::Name(Arc::from("error"))
    }

    /// `true` for the `error` port.
    pub fn is_error(&self) -> bool {
        matches!(self, Port::Name(n) if &**n == "error")
    }
}

impl Default for Port {
    fn default() -> Self {
        Port::DEFAULT
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Index(i) => write!(f, "{i}"),
            // A name that reads as a number is another port than that number: quoted.
            Port::Name(n) if n.parse::<i64>().is_ok() => write!(f, "\"{n}\""),
            Port::Name(n) => f.write_str(n),
        }
    }
}

impl From<&str> for Port {
    fn from(s: &str) -> Self {
        Port::Name(Arc::from(s))
    }
}

impl From<String> for Port {
    fn from(s: String) -> Self {
        Port::Name(Arc::from(s))
    }
}

impl From<&Port> for Port {
    fn from(p: &Port) -> Self {
        p.clone()
    }
}

macro_rules! port_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Port {
            fn from(i: $t) -> Self {
                Port::Index(i as i64)
            }
        }
    )*};
}
port_from_int!(i32, i64, u32, usize);

impl PartialEq<&str> for Port {
    fn eq(&self, other: &&str) -> bool {
        matches!(self, Port::Name(n) if &**n == *other)
    }
}

#[cfg(test)]
mod tests {
    use super::Port;

    /// `"1"` and `1` are two ports: an error naming one must not read as the other.
    #[test]
    fn a_name_that_reads_as_a_number_is_shown_quoted() {
        assert_eq!(Port::from(1).to_string(), "1");
        assert_eq!(Port::from("1").to_string(), "\"1\"");
        assert_eq!(Port::from("-7").to_string(), "\"-7\"");
        assert_eq!(Port::from("out").to_string(), "out");
    }
}
