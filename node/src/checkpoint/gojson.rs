//! Reading a checkpoint's JSON as Go's `encoding/json` does for upstream's structs: a field
//! matches its name exactly or, failing that, case-insensitively (upstream's own fixtures
//! write `defaultCPUSet` for the tag `defaultCpuSet`); unknown fields are ignored; `null`
//! leaves the zero value (a nil map or slice, which the dump tells apart from an empty
//! slice); a wrong JSON type is Go's `cannot unmarshal ... into Go struct field ...` error.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::CheckpointError;

/// Parses `blob` as a JSON object, with Go's message for a truncated file.
pub fn parse_object(blob: &[u8], go_type: &str) -> Result<Map<String, Value>, CheckpointError> {
    let v: Value = serde_json::from_slice(blob).map_err(|e| {
        CheckpointError::Json(if e.is_eof() {
            "unexpected end of JSON input".to_string()
        } else {
            format!("json: {e}")
        })
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(mismatch(&other, go_type, "")),
    }
}

/// The member of `obj` for the field tagged `name` (exact match first, then ASCII
/// case-insensitive, as `encoding/json`).
pub fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's `UnmarshalTypeError` text for `v` at `path` (`Struct.field`) of `go_type`.
pub fn mismatch(v: &Value, go_type: &str, path: &str) -> CheckpointError {
    if path.is_empty() {
        return CheckpointError::Json(format!(
            "json: cannot unmarshal {} into Go value of type {go_type}",
            kind(v)
        ));
    }
    CheckpointError::Json(format!(
        "json: cannot unmarshal {} into Go struct field {path} of type {go_type}",
        kind(v)
    ))
}

/// A string field (`null` or absent: "").
pub fn string(v: Option<&Value>, path: &str) -> Result<String, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(mismatch(other, "string", path)),
    }
}

/// An unsigned integer field (`uint64`, `checksum.Checksum`).
pub fn uint(v: Option<&Value>, go_type: &str, path: &str) -> Result<u64, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| mismatch(&Value::Number(n.clone()), go_type, path)),
        Some(other) => Err(mismatch(other, go_type, path)),
    }
}

/// A signed integer field (`int`, `int64`).
pub fn int(v: Option<&Value>, go_type: &str, path: &str) -> Result<i64, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| mismatch(&Value::Number(n.clone()), go_type, path)),
        Some(other) => Err(mismatch(other, go_type, path)),
    }
}

/// A map with string keys (`null` or absent: empty, which dumps as a nil map does).
pub fn string_map<T>(
    v: Option<&Value>,
    go_type: &str,
    path: &str,
    mut item: impl FnMut(&Value) -> Result<T, CheckpointError>,
) -> Result<BTreeMap<String, T>, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m.iter().map(|(k, v)| Ok((k.clone(), item(v)?))).collect(),
        Some(other) => Err(mismatch(other, go_type, path)),
    }
}

/// A map with integer keys (JSON object keys are decimal strings, as Go writes them).
pub fn int_map<T>(
    v: Option<&Value>,
    go_type: &str,
    path: &str,
    mut item: impl FnMut(&Value) -> Result<T, CheckpointError>,
) -> Result<BTreeMap<i64, T>, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let key = k.parse::<i64>().map_err(|_| {
                    CheckpointError::Json(format!(
                        "json: cannot unmarshal number {k} into Go value of type int"
                    ))
                })?;
                Ok((key, item(v)?))
            })
            .collect(),
        Some(other) => Err(mismatch(other, go_type, path)),
    }
}

/// A slice (`null` or absent: `None`, Go's nil slice).
pub fn slice<T>(
    v: Option<&Value>,
    go_type: &str,
    path: &str,
    mut item: impl FnMut(&Value) -> Result<T, CheckpointError>,
) -> Result<Option<Vec<T>>, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a.iter().map(&mut item).collect::<Result<_, _>>().map(Some),
        Some(other) => Err(mismatch(other, go_type, path)),
    }
}

/// A JSON value as a map's string value.
pub fn str_value(v: &Value, path: &str) -> Result<String, CheckpointError> {
    string(Some(v), path)
}
