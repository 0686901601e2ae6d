//! Serialization: `Value` into any serde format, and any `Serialize` type into a `Value`.

use bytes::Bytes;
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

use super::{Value, ValueError};

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Nil => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::Bytes(b) => s.serialize_bytes(b),
            Value::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Map(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Serializes any `T: Serialize` into a [`Value`]: structs become string-keyed maps,
/// unit enum variants strings, other variants single-entry maps `{variant = body}`.
pub(super) struct ValueSerializer;

type R = Result<Value, ValueError>;

impl Serializer for ValueSerializer {
    type Ok = Value;
    type Error = ValueError;
    type SerializeSeq = SeqBuilder;
    type SerializeTuple = SeqBuilder;
    type SerializeTupleStruct = SeqBuilder;
    type SerializeTupleVariant = SeqBuilder;
    type SerializeMap = MapBuilder;
    type SerializeStruct = MapBuilder;
    type SerializeStructVariant = MapBuilder;

    fn serialize_bool(self, v: bool) -> R {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i16(self, v: i16) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i32(self, v: i32) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_i64(self, v: i64) -> R {
        Ok(Value::Int(v))
    }
    fn serialize_u8(self, v: u8) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u16(self, v: u16) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u32(self, v: u32) -> R {
        Ok(Value::Int(v.into()))
    }
    fn serialize_u64(self, v: u64) -> R {
        i64::try_from(v)
            .map(Value::Int)
            .map_err(|_| ValueError(format!("{v} does not fit in a signed 64-bit integer")))
    }
    fn serialize_f32(self, v: f32) -> R {
        Ok(Value::Float(v.into()))
    }
    fn serialize_f64(self, v: f64) -> R {
        Ok(Value::Float(v))
    }
    fn serialize_char(self, v: char) -> R {
        Ok(Value::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> R {
        Ok(Value::Str(v.to_owned()))
    }
    fn serialize_bytes(self, v: &[u8]) -> R {
        Ok(Value::Bytes(Bytes::copy_from_slice(v)))
    }
    fn serialize_none(self) -> R {
        Ok(Value::Nil)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> R {
        v.serialize(self)
    }
    fn serialize_unit(self) -> R {
        Ok(Value::Nil)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R {
        Ok(Value::Nil)
    }
    fn serialize_unit_variant(self, _n: &'static str, _i: u32, variant: &'static str) -> R {
        Ok(Value::Str(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _n: &'static str, v: &T) -> R {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        v: &T,
    ) -> R {
        Ok(Value::Map(vec![(
            Value::Str(variant.to_owned()),
            v.serialize(self)?,
        )]))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqBuilder, ValueError> {
        Ok(SeqBuilder {
            items: Vec::with_capacity(len.unwrap_or(0)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqBuilder, ValueError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _n: &'static str,
        len: usize,
    ) -> Result<SeqBuilder, ValueError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<SeqBuilder, ValueError> {
        Ok(SeqBuilder {
            items: Vec::with_capacity(len),
            variant: Some(variant),
        })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapBuilder, ValueError> {
        Ok(MapBuilder {
            entries: Vec::with_capacity(len.unwrap_or(0)),
            key: None,
            variant: None,
        })
    }
    fn serialize_struct(self, _n: &'static str, len: usize) -> Result<MapBuilder, ValueError> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _n: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<MapBuilder, ValueError> {
        Ok(MapBuilder {
            entries: Vec::with_capacity(len),
            key: None,
            variant: Some(variant),
        })
    }
}

fn wrap_variant(variant: Option<&'static str>, body: Value) -> Value {
    match variant {
        Some(name) => Value::Map(vec![(Value::Str(name.to_owned()), body)]),
        None => body,
    }
}

/// Builds arrays (and tuple variants).
pub(super) struct SeqBuilder {
    items: Vec<Value>,
    variant: Option<&'static str>,
}

impl SerializeSeq for SeqBuilder {
    type Ok = Value;
    type Error = ValueError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ValueError> {
        self.items.push(v.serialize(ValueSerializer)?);
        Ok(())
    }
    fn end(self) -> R {
        Ok(wrap_variant(self.variant, Value::Array(self.items)))
    }
}

/// Tuples, tuple structs and tuple variants build arrays like sequences do.
macro_rules! seq_like {
    ($($tr:ident :: $method:ident),*) => {$(
        impl ser::$tr for SeqBuilder {
            type Ok = Value;
            type Error = ValueError;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ValueError> {
                SerializeSeq::serialize_element(self, v)
            }
            fn end(self) -> R {
                SerializeSeq::end(self)
            }
        }
    )*};
}
seq_like!(
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// Builds maps, structs and struct variants.
pub(super) struct MapBuilder {
    entries: Vec<(Value, Value)>,
    key: Option<Value>,
    variant: Option<&'static str>,
}

impl SerializeMap for MapBuilder {
    type Ok = Value;
    type Error = ValueError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), ValueError> {
        self.key = Some(k.serialize(ValueSerializer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ValueError> {
        let k = self
            .key
            .take()
            .ok_or_else(|| ValueError("map value without key".into()))?;
        self.entries.push((k, v.serialize(ValueSerializer)?));
        Ok(())
    }
    fn end(self) -> R {
        Ok(wrap_variant(self.variant, Value::Map(self.entries)))
    }
}

impl ser::SerializeStruct for MapBuilder {
    type Ok = Value;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), ValueError> {
        self.entries
            .push((Value::Str(key.to_owned()), v.serialize(ValueSerializer)?));
        Ok(())
    }
    fn end(self) -> R {
        SerializeMap::end(self)
    }
}

impl ser::SerializeStructVariant for MapBuilder {
    type Ok = Value;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), ValueError> {
        ser::SerializeStruct::serialize_field(self, key, v)
    }
    fn end(self) -> R {
        SerializeMap::end(self)
    }
}
