//! The one serde path of a port's settings: a `--port` flag's `key=value`
//! list and a TOML `[[port]]` table both become a list of [`Raw`] entries,
//! which the port model then deserializes from.

use super::ConfigError;
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;

/// A value as a flag or the file gave it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Raw {
    /// Text from the command line: a number, a boolean (`on`/`off`,
    /// `true`/`false`, `1`/`0`) or a string, as the field asks; a
    /// sequence of one where a list is asked for.
    Text(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Seq(Vec<Raw>),
    Map(Vec<(String, Raw)>),
}

impl fmt::Display for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Raw::Text(s) | Raw::Str(s) => f.write_str(s),
            Raw::Int(n) => write!(f, "{n}"),
            Raw::Float(n) => write!(f, "{n}"),
            Raw::Bool(b) => write!(f, "{b}"),
            Raw::Seq(v) => {
                f.write_str("[")?;
                for (i, r) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{r}")?;
                }
                f.write_str("]")
            }
            Raw::Map(_) => f.write_str("{...}"),
        }
    }
}

impl Raw {
    /// The text of a string value.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Raw::Text(s) | Raw::Str(s) => Some(s),
            _ => None,
        }
    }

    fn is_scalar(&self) -> bool {
        !matches!(self, Raw::Seq(_) | Raw::Map(_))
    }

    fn unexpected(&self) -> de::Unexpected<'_> {
        match self {
            Raw::Text(s) | Raw::Str(s) => de::Unexpected::Str(s),
            Raw::Int(n) => de::Unexpected::Signed(*n),
            Raw::Float(n) => de::Unexpected::Float(*n),
            Raw::Bool(b) => de::Unexpected::Bool(*b),
            Raw::Seq(_) => de::Unexpected::Seq,
            Raw::Map(_) => de::Unexpected::Map,
        }
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Raw;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number, boolean, array or table")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
                Ok(Raw::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
                Ok(Raw::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
                i64::try_from(v)
                    .map(Raw::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
                Ok(Raw::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
                Ok(Raw::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Raw, E> {
                Ok(Raw::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
                let mut v = Vec::new();
                while let Some(r) = a.next_element()? {
                    v.push(r);
                }
                Ok(Raw::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
                let mut v = Vec::new();
                while let Some((k, r)) = a.next_entry::<String, Raw>()? {
                    v.push((k, r));
                }
                Ok(Raw::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> IntoDeserializer<'de, ConfigError> for Raw {
    type Deserializer = Raw;
    fn into_deserializer(self) -> Raw {
        self
    }
}

/// The entries of a table, each value's errors prefixed with `key=value`.
pub(crate) struct RawMap {
    iter: std::vec::IntoIter<(String, Raw)>,
    value: Option<(String, Raw)>,
}

impl RawMap {
    pub(crate) fn new(entries: Vec<(String, Raw)>) -> Self {
        RawMap {
            iter: entries.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for RawMap {
    type Error = ConfigError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ConfigError> {
        let Some((k, v)) = self.iter.next() else {
            return Ok(None);
        };
        let key = seed.deserialize(Raw::Str(k.clone()))?;
        self.value = Some((k, v));
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, ConfigError> {
        let (k, v) = self
            .value
            .take()
            .ok_or_else(|| ConfigError::Serde("value without a key".into()))?;
        if v.is_scalar() {
            let shown = v.to_string();
            seed.deserialize(v)
                .map_err(|e| ConfigError::value(&k, shown, e))
        } else {
            seed.deserialize(v).map_err(|e| match e {
                e @ ConfigError::Value { .. } => e,
                e => ConfigError::Value {
                    key: k,
                    value: "...".into(),
                    err: Box::new(e),
                },
            })
        }
    }
}

/// Parses a command-line number.
fn number<T: std::str::FromStr>(s: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    s.parse::<T>()
        .map_err(|e| ConfigError::Invalid(e.to_string()))
}

macro_rules! text_number {
    ($($method:ident $visit:ident $ty:ty;)*) => {$(
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
            match self {
                Raw::Text(s) => v.$visit(number::<$ty>(&s)?),
                other => other.deserialize_any(v),
            }
        }
    )*};
}

impl<'de> Deserializer<'de> for Raw {
    type Error = ConfigError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        match self {
            Raw::Text(s) | Raw::Str(s) => v.visit_string(s),
            Raw::Int(n) => v.visit_i64(n),
            Raw::Float(n) => v.visit_f64(n),
            Raw::Bool(b) => v.visit_bool(b),
            Raw::Seq(items) => {
                let mut seq = de::value::SeqDeserializer::new(items.into_iter());
                let value = v.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Raw::Map(entries) => v.visit_map(RawMap::new(entries)),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        match self {
            Raw::Text(s) => match s.as_str() {
                "on" | "true" | "1" => v.visit_bool(true),
                "off" | "false" | "0" => v.visit_bool(false),
                _ => Err(ConfigError::Invalid("on or off".into())),
            },
            other => other.deserialize_any(v),
        }
    }

    text_number! {
        deserialize_i8 visit_i8 i8;
        deserialize_i16 visit_i16 i16;
        deserialize_i32 visit_i32 i32;
        deserialize_i64 visit_i64 i64;
        deserialize_u8 visit_u8 u8;
        deserialize_u16 visit_u16 u16;
        deserialize_u32 visit_u32 u32;
        deserialize_u64 visit_u64 u64;
        deserialize_f32 visit_f32 f32;
        deserialize_f64 visit_f64 f64;
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        v.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        match self {
            // `remote=A` once on the command line: a list of one.
            t @ Raw::Text(_) => Raw::Seq(vec![t]).deserialize_any(v),
            other => other.deserialize_any(v),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, ConfigError> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ConfigError> {
        match self {
            Raw::Text(s) | Raw::Str(s) => v.visit_enum(s.into_deserializer()),
            other => Err(de::Error::invalid_type(other.unexpected(), &"a string")),
        }
    }

    serde::forward_to_deserialize_any! {
        char str string bytes byte_buf unit unit_struct tuple tuple_struct map
        struct identifier ignored_any i128 u128
    }
}

/// The field names of a serde-derived struct `T`, as it spells them.
pub(crate) fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = ConfigError;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ConfigError> {
            Err(ConfigError::Serde("not a struct".into()))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, ConfigError> {
            *self.0 = fields;
            Err(ConfigError::Serde("probed".into()))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}
