//! JSON as the matrix's results.json holds it, read the way Python reads
//! it: objects keep their keys in file order (the reports list counters in
//! the order the guests printed them; serde_json's own map sorts them) and
//! values print as Python's `str()` prints them, so the Markdown is the
//! same as the Python that wrote it before.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// A JSON value with its object keys in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null` (Python's `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A number with a fraction or exponent.
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, keys in file order.
    Object(Vec<(String, Json)>),
}

static NULL: Json = Json::Null;

impl Json {
    /// The value of `key` of an object (`None` elsewhere).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value of `key`, or null.
    pub fn at(&self, key: &str) -> &Json {
        self.get(key).unwrap_or(&NULL)
    }

    /// The string, or "" for anything else.
    pub fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => "",
        }
    }

    /// The elements of an array (none for anything else).
    pub fn items(&self) -> &[Json] {
        match self {
            Json::Array(v) => v,
            _ => &[],
        }
    }

    /// The entries of an object (none for anything else).
    pub fn entries(&self) -> &[(String, Json)] {
        match self {
            Json::Object(kv) => kv,
            _ => &[],
        }
    }

    /// Python's truth value: null, false, 0, "", [] and {} are false.
    pub fn truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Int(i) => *i != 0,
            Json::Float(f) => *f != 0.0,
            Json::Str(s) => !s.is_empty(),
            Json::Array(v) => !v.is_empty(),
            Json::Object(kv) => !kv.is_empty(),
        }
    }
}

/// Python's `repr()` of a float (which `str()` and f-strings also use):
/// the shortest digits that read back the same, `.0` on whole numbers,
/// exponent form from 1e16 up and below 1e-4.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust writes "1.5e-7"; Python "1.5e-07"
        let s = format!("{f:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{m}e{sign}{digits:0>2}");
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

impl fmt::Display for Json {
    /// Python's `str()` of the value as `json.load` gives it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("None"),
            Json::Bool(true) => f.write_str("True"),
            Json::Bool(false) => f.write_str("False"),
            Json::Int(i) => write!(f, "{i}"),
            Json::Float(x) => f.write_str(&py_float(*x)),
            Json::Str(s) => f.write_str(s),
            Json::Array(_) | Json::Object(_) => f.write_str(&self.repr()),
        }
    }
}

/// Python's `repr()` of a string: single quotes unless it holds a single
/// quote and no double one; backslash escapes for the quote, the backslash
/// and control characters.
pub fn py_repr_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

impl Json {
    /// Python's `repr()` of the value as `json.load` gives it (what `str()`
    /// of a list or dict shows for its members).
    pub fn repr(&self) -> String {
        match self {
            Json::Str(s) => py_repr_str(s),
            Json::Array(v) => format!(
                "[{}]",
                v.iter().map(Json::repr).collect::<Vec<_>>().join(", ")
            ),
            Json::Object(kv) => format!(
                "{{{}}}",
                kv.iter()
                    .map(|(k, v)| format!("{}: {}", py_repr_str(k), v.repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => other.to_string(),
        }
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
        Ok(Json::Int(i.into()))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
        Ok(Json::Int(u.into()))
    }
    fn visit_f64<E>(self, x: f64) -> Result<Json, E> {
        Ok(Json::Float(x))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.into()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element()? {
            v.push(x);
        }
        Ok(Json::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut kv: Vec<(String, Json)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            // a repeated key: the last value wins, in the first one's place,
            // as in a Python dict
            match kv.iter_mut().find(|(old, _)| *old == k) {
                Some(e) => e.1 = v,
                None => kv.push((k, v)),
            }
        }
        Ok(Json::Object(kv))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

impl Serialize for Json {
    /// Objects are written with their keys in order (what Python's
    /// `json.load` then keeps).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Int(i) => match i64::try_from(*i) {
                Ok(i) => s.serialize_i64(i),
                Err(_) => s.serialize_i128(*i),
            },
            Json::Float(x) => s.serialize_f64(*x),
            Json::Str(v) => s.serialize_str(v),
            Json::Array(v) => s.collect_seq(v),
            Json::Object(kv) => {
                let mut m = s.serialize_map(Some(kv.len()))?;
                for (k, v) in kv {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_prints_them() {
        for (f, want) in [
            (42.5, "42.5"),
            (5.0, "5.0"),
            (0.0, "0.0"),
            (-3.25, "-3.25"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
        ] {
            assert_eq!(py_float(f), want, "{f}");
        }
    }

    #[test]
    fn objects_keep_their_order_and_values_print_as_python_str() {
        let j: Json = serde_json::from_str(r#"{"z": 1, "a": [true, null], "m": 2.50, "z": 3}"#)
            .expect("json");
        let keys: Vec<_> = j.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        assert_eq!(j.at("z").to_string(), "3");
        assert_eq!(j.at("m").to_string(), "2.5");
        assert_eq!(j.at("a").items()[0].to_string(), "True");
        assert_eq!(j.at("a").items()[1].to_string(), "None");
        assert!(!j.at("missing").truthy());
        assert_eq!(j.at("a").to_string(), "[True, None]");
        let d: Json =
            serde_json::from_str(r#"{"r-x": 2, "it's": "a\"b", "l": ["q'", "\n"]}"#).expect("json");
        assert_eq!(
            d.to_string(),
            r#"{'r-x': 2, "it's": 'a"b', 'l': ["q'", '\n']}"#
        );
        assert_eq!(
            serde_json::to_string(&j).expect("json"),
            r#"{"z":3,"a":[true,null],"m":2.5}"#
        );
    }
}
