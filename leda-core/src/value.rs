//! The dynamic value model shared by Rust stages, Lua stages and the wire.
//!
//! A [`Value`] is what one argument of an event can be: the intersection of what Lua
//! and MessagePack can both represent. Strings are UTF-8 text; arbitrary bytes are
//! [`Value::Bytes`], reference-counted so they move between stages without a copy.
//! Maps keep their insertion order and allow any value as key, like Lua tables and
//! MessagePack maps.
//!
//! Typed access goes through serde: [`Value::to`] deserializes a value into any
//! `T: Deserialize`, and [`Value::from_serde`] builds one from any `T: Serialize`.

mod de;
mod ser;

use std::fmt;

use bytes::Bytes;

pub use de::ValueError;

/// One dynamically typed value.
#[derive(Clone, Debug, Default)]
pub enum Value {
    /// Absence of a value (`nil` in Lua, `nil` in MessagePack).
    #[default]
    Nil,
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer (Lua 5.4 integer subtype).
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// UTF-8 text.
    Str(String),
    /// Raw bytes, shared without copying.
    Bytes(Bytes),
    /// An ordered sequence.
    Array(Vec<Value>),
    /// Key/value pairs in insertion order.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// `true` if dropping this value frees memory (a string, bytes, array or map).
    #[inline]
    pub(crate) fn owns_memory(&self) -> bool {
        !matches!(
            self,
            Value::Nil | Value::Bool(_) | Value::Int(_) | Value::Float(_)
        )
    }

    /// The name of this value's type, as used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::Bytes(_) => "bytes",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
        }
    }

    /// `true` for [`Value::Nil`].
    pub fn is_nil(&self) -> bool {
        matches!(self, Value::Nil)
    }

    /// The integer, if this is an [`Value::Int`] (or a float with an exact integer value).
    pub fn as_int(&self) -> Option<i64> {
        match *self {
            Value::Int(i) => Some(i),
            Value::Float(f) if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 => {
                Some(f as i64)
            }
            _ => None,
        }
    }

    /// The number as a float, for ints and floats.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            _ => None,
        }
    }

    /// The text, if this is a [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The raw bytes of a [`Value::Bytes`] or the UTF-8 bytes of a [`Value::Str`].
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Str(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The boolean, if this is a [`Value::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is a [`Value::Array`].
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The entry for `key` if this is a map holding a string key equal to `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(m) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Deserializes this value into `T` (typed access through serde).
    pub fn to<'de, T: serde::Deserialize<'de>>(&'de self) -> Result<T, ValueError> {
        T::deserialize(self)
    }

    /// Builds a value from anything serde can serialize.
    pub fn from_serde<T: serde::Serialize + ?Sized>(v: &T) -> Result<Value, ValueError> {
        v.serialize(ser::ValueSerializer)
    }
}

/// Equality follows Lua: an integer equals a float of the same numeric value, and
/// NaN is not equal to itself.
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value::*;
        match (self, other) {
            (Nil, Nil) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a == b,
            (Int(a), Float(b)) | (Float(b), Int(a)) => (*a as f64) == *b && b.fract() == 0.0,
            (Str(a), Str(b)) => a == b,
            (Bytes(a), Bytes(b)) => a == b,
            (Array(a), Array(b)) => a == b,
            (Map(a), Map(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => f.write_str(s),
            Value::Bytes(b) => write!(f, "<{} bytes>", b.len()),
            Value::Array(a) => {
                f.write_str("{")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("}")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Int(v as i64)
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32, isize);

/// `u64`/`usize` values above `i64::MAX` become floats (Lua has no unsigned integers).
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        i64::try_from(v).map_or(Value::Float(v as f64), Value::Int)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::from(v as u64)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Self {
        Value::Float(v as f64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

impl From<Bytes> for Value {
    fn from(v: Bytes) -> Self {
        Value::Bytes(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(Bytes::from(v))
    }
}

impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::Array(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Nil, Into::into)
    }
}

impl From<()> for Value {
    fn from(_: ()) -> Self {
        Value::Nil
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Order {
        id: u32,
        symbol: String,
        price: f64,
        tags: Vec<String>,
        note: Option<String>,
        side: Side,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Side {
        Buy,
        Sell { limit: i64 },
    }

    #[test]
    fn serde_round_trip_through_value() {
        let o = Order {
            id: 7,
            symbol: "PETR4".into(),
            price: 31.5,
            tags: vec!["a".into(), "b".into()],
            note: None,
            side: Side::Sell { limit: -3 },
        };
        let v = Value::from_serde(&o).unwrap();
        assert_eq!(v.get("symbol").and_then(Value::as_str), Some("PETR4"));
        let back: Order = v.to().unwrap();
        assert_eq!(back, o);
        let unit = Value::from_serde(&Side::Buy).unwrap();
        assert_eq!(unit.to::<Side>().unwrap(), Side::Buy);
    }

    #[test]
    fn msgpack_round_trip_keeps_types() {
        let v = Value::Array(vec![
            Value::Nil,
            Value::Bool(true),
            Value::Int(-5),
            Value::Int(i64::MAX),
            Value::Float(1.5),
            Value::Float(f64::NAN),
            Value::Str("héllo".into()),
            Value::Bytes(Bytes::from_static(b"\x00\xff\x10")),
            Value::Array(vec![]),
            Value::Map(vec![(Value::Int(1), Value::Str("x".into()))]),
        ]);
        let bytes = rmp_serde::to_vec(&v).unwrap();
        let back: Value = rmp_serde::from_slice(&bytes).unwrap();
        let (Value::Array(a), Value::Array(b)) = (&v, &back) else {
            panic!("not arrays")
        };
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.type_name(), y.type_name(), "{x:?} vs {y:?}");
            if let Value::Float(f) = x
                && f.is_nan()
            {
                assert!(matches!(y, Value::Float(g) if g.is_nan()));
                continue;
            }
            assert_eq!(x, y);
        }
    }

    #[test]
    fn typed_access_reports_mismatch() {
        let err = Value::Str("x".into()).to::<i32>().unwrap_err();
        assert!(err.to_string().contains("string"), "{err}");
        assert_eq!(Value::Float(3.0).to::<i32>().unwrap(), 3);
        assert!(Value::Float(3.5).to::<i32>().is_err());
        assert!(Value::Int(300).to::<u8>().is_err());
    }

    #[test]
    fn lua_equality_between_int_and_float() {
        assert_eq!(Value::Int(2), Value::Float(2.0));
        assert_ne!(Value::Int(2), Value::Float(2.5));
        assert_ne!(Value::Float(f64::NAN), Value::Float(f64::NAN));
    }
}
