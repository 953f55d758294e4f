//! Strict decoding of request bodies (`docs/tricks.md` #19, strict JSON decoding).
//!
//! serde, like Go's `encoding/json`, silently drops fields it does not know and keeps the last
//! of two duplicate keys, so `spec.contianers` or a doubled `replicas` would be accepted and
//! lost. kubectl sends `fieldValidation=Strict` and validates nothing itself, so the server
//! alone must notice. Kubernetes forked its JSON decoder for this; here it is two passes over
//! the body:
//!
//! 1. a scan of the raw JSON that reports every duplicate key with its path, and
//! 2. a typed decode (into the k8s-openapi type) through `serde_ignored`, which reports every
//!    field the type does not have, with its path.
//!
//! Field matching is case-sensitive (`Metadata` is unknown, not `metadata`), integers never
//! pass through floats (`1.0` is not an `int32`), and errors are accumulated, not stopped at
//! the first, capped at [`STRICT_ERRORS_MAX`]. A type error (a string where a number belongs)
//! is fatal whatever the validation level, as in Kubernetes.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::status::ApiError;

/// Unknown and duplicate field errors kept per request. Kubernetes caps accumulated
/// decoding errors at 100 so that a hostile body cannot make the error as large as itself.
pub const STRICT_ERRORS_MAX: usize = 100;

/// Nesting depth past which a body is refused before any decoding. serde_json's own
/// recursion limit is 128; objects Kubernetes serves nest about 15 deep, so 64 leaves room
/// for CRD-like free-form fields while keeping the scan's recursion bounded.
pub const NESTING_DEPTH_MAX: usize = 64;

/// What `fieldValidation` asks for (Kubernetes' default for a client that says nothing is
/// `Warn`; kubectl sends `Strict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Decode as usual, say nothing.
    Ignore,
    /// Decode, and answer each problem as a `Warning` header.
    Warn,
    /// Refuse the request with 400 BadRequest listing the problems.
    Strict,
}

impl FieldValidation {
    /// Parses the `fieldValidation` query parameter (empty = `Warn`).
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Warn" => Ok(Self::Warn),
            "Ignore" => Ok(Self::Ignore),
            "Strict" => Ok(Self::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of \"Ignore\", \"Warn\" or \"Strict\", got {other:?}"
            ))),
        }
    }
}

/// A decoded body: the object as JSON, normalised by its type, and the strict-decoding
/// problems to answer as warnings.
#[derive(Debug)]
pub struct Decoded {
    pub object: Value,
    pub warnings: Vec<String>,
}

/// Decodes `body` as JSON into `T` under `validation`, returning the object re-encoded from
/// `T` (so every field it holds is one the type knows, with the type's shape).
///
/// `defaults` fills `apiVersion` and `kind` when the body leaves them out (the URL names the
/// resource); a body that names another kind is refused by the typed decode.
pub fn decode<T>(
    body: &[u8],
    validation: FieldValidation,
    defaults: (&str, &str),
) -> Result<Decoded, ApiError>
where
    T: DeserializeOwned + serde::Serialize,
{
    let mut problems = Vec::new();
    if validation != FieldValidation::Ignore {
        scan_duplicates(body, &mut problems)?;
    }
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}")))?;
    let Some(map) = value.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    if !map.contains_key("apiVersion") {
        map.insert("apiVersion".into(), Value::String(defaults.0.into()));
    }
    if !map.contains_key("kind") {
        map.insert("kind".into(), Value::String(defaults.1.into()));
    }
    let object = decode_value::<T>(value, validation, &mut problems)?;
    finish(object, validation, problems)
}

/// The typed pass over an already parsed value (a patched object, a protobuf body turned
/// into JSON): unknown fields are reported, duplicates cannot exist any more.
pub fn decode_parsed<T>(value: Value, validation: FieldValidation) -> Result<Decoded, ApiError>
where
    T: DeserializeOwned + serde::Serialize,
{
    let mut problems = Vec::new();
    let object = decode_value::<T>(value, validation, &mut problems)?;
    finish(object, validation, problems)
}

fn decode_value<T>(
    value: Value,
    validation: FieldValidation,
    problems: &mut Vec<String>,
) -> Result<Value, ApiError>
where
    T: DeserializeOwned + serde::Serialize,
{
    let mut track = serde_path_to_error::Track::new();
    let typed: Result<T, _> = serde_ignored::deserialize(
        serde_path_to_error::Deserializer::new(value, &mut track),
        |path| {
            if validation != FieldValidation::Ignore && problems.len() < STRICT_ERRORS_MAX {
                problems.push(format!("unknown field \"{}\"", KubePath(&path)));
            }
        },
    );
    let typed = typed.map_err(|e| {
        let path = track.path().to_string();
        ApiError::bad_request(format!(
            "error decoding request body: {}: {e}",
            if path.is_empty() || path == "." {
                "(root)".to_string()
            } else {
                path
            }
        ))
    })?;
    serde_json::to_value(&typed)
        .map_err(|e| ApiError::internal(format!("re-encoding a decoded object: {e}")))
}

fn finish(
    object: Value,
    validation: FieldValidation,
    mut problems: Vec<String>,
) -> Result<Decoded, ApiError> {
    problems.truncate(STRICT_ERRORS_MAX);
    match validation {
        FieldValidation::Strict if !problems.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            problems.join(", ")
        ))),
        FieldValidation::Ignore => Ok(Decoded {
            object,
            warnings: Vec::new(),
        }),
        _ => Ok(Decoded {
            object,
            warnings: problems,
        }),
    }
}

/// serde_ignored's path printed as Kubernetes prints field paths: `spec.containers[0].foo`.
struct KubePath<'a, 'b>(&'a serde_ignored::Path<'b>);

impl fmt::Display for KubePath<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use serde_ignored::Path;
        fn write(path: &Path<'_>, f: &mut fmt::Formatter<'_>) -> Result<bool, fmt::Error> {
            // Returns whether anything was written, so the next segment knows to add a dot.
            match path {
                Path::Root => Ok(false),
                Path::Seq { parent, index } => {
                    write(parent, f)?;
                    write!(f, "[{index}]")?;
                    Ok(true)
                }
                Path::Map { parent, key } => {
                    if write(parent, f)? {
                        f.write_str(".")?;
                    }
                    f.write_str(key)?;
                    Ok(true)
                }
                Path::Some { parent }
                | Path::NewtypeStruct { parent }
                | Path::NewtypeVariant { parent } => write(parent, f),
            }
        }
        write(self.0, f).map(|_| ())
    }
}

/// Reports every duplicate key in `body`, with its path, into `problems`.
fn scan_duplicates(body: &[u8], problems: &mut Vec<String>) -> Result<(), ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let scan = Scan {
        path: String::new(),
        depth: 0,
        problems,
    };
    scan.deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}")))
}

struct Scan<'a> {
    path: String,
    depth: usize,
    problems: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Scan<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= NESTING_DEPTH_MAX {
            return Err(de::Error::custom(format!(
                "nesting deeper than {NESTING_DEPTH_MAX} levels"
            )));
        }
        let mut index = 0usize;
        loop {
            let child = Scan {
                path: format!("{}[{index}]", self.path),
                depth: self.depth + 1,
                problems: &mut *self.problems,
            };
            if seq.next_element_seed(child)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.depth >= NESTING_DEPTH_MAX {
            return Err(de::Error::custom(format!(
                "nesting deeper than {NESTING_DEPTH_MAX} levels"
            )));
        }
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key) && self.problems.len() < STRICT_ERRORS_MAX {
                self.problems.push(format!("duplicate field \"{path}\""));
            }
            map.next_value_seed(Scan {
                path,
                depth: self.depth + 1,
                problems: &mut *self.problems,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},
        "spec":{"containers":[{"name":"c","image":"nginx","ports":[{"containerPort":80}]}]}}"#;

    #[test]
    fn a_valid_body_decodes_without_warnings() {
        let d =
            decode::<Pod>(POD.as_bytes(), FieldValidation::Strict, ("v1", "Pod")).expect("valid");
        assert!(d.warnings.is_empty());
        assert_eq!(
            d.object["spec"]["containers"][0]["ports"][0]["containerPort"],
            80
        );
    }

    #[test]
    fn unknown_fields_are_reported_with_kubernetes_paths() {
        let body = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","colour":"red"},
            "spec":{"containers":[{"name":"c","image":"x","imagee":"y"}]}}"#;
        let d = decode::<Pod>(body.as_bytes(), FieldValidation::Warn, ("v1", "Pod")).expect("warn");
        assert_eq!(
            d.warnings,
            vec![
                "unknown field \"metadata.colour\"".to_string(),
                "unknown field \"spec.containers[0].imagee\"".to_string()
            ]
        );
        assert!(d.object["metadata"].get("colour").is_none());
        let e = decode::<Pod>(body.as_bytes(), FieldValidation::Strict, ("v1", "Pod"))
            .expect_err("strict refuses");
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "strict decoding error: unknown field \"metadata.colour\", unknown field \"spec.containers[0].imagee\""
        );
        let d =
            decode::<Pod>(body.as_bytes(), FieldValidation::Ignore, ("v1", "Pod")).expect("ignore");
        assert!(d.warnings.is_empty());
    }

    #[test]
    fn field_names_are_case_sensitive() {
        let body = r#"{"apiVersion":"v1","kind":"Pod","Metadata":{"name":"p"}}"#;
        let d = decode::<Pod>(body.as_bytes(), FieldValidation::Warn, ("v1", "Pod")).expect("warn");
        assert_eq!(d.warnings, vec!["unknown field \"Metadata\"".to_string()]);
    }

    #[test]
    fn duplicate_fields_are_reported() {
        let body = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a","name":"b"},
            "spec":{"replicas":1,"replicas":2,"selector":{},"template":{}}}"#;
        let e = decode::<Deployment>(
            body.as_bytes(),
            FieldValidation::Strict,
            ("apps/v1", "Deployment"),
        )
        .expect_err("duplicates refused");
        assert_eq!(
            e.message,
            "strict decoding error: duplicate field \"metadata.name\", duplicate field \"spec.replicas\""
        );
    }

    #[test]
    fn integers_never_pass_through_floats() {
        let body = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a"},
            "spec":{"replicas":1.5,"selector":{},"template":{}}}"#;
        let e = decode::<Deployment>(
            body.as_bytes(),
            FieldValidation::Ignore,
            ("apps/v1", "Deployment"),
        )
        .expect_err("a float is not an int32");
        assert_eq!(e.code, 400);
        assert!(e.message.contains("spec.replicas"), "{}", e.message);
        let body = body.replace("1.5", "1.0");
        decode::<Deployment>(
            body.as_bytes(),
            FieldValidation::Ignore,
            ("apps/v1", "Deployment"),
        )
        .expect_err("1.0 is not an int32 either");
    }

    #[test]
    fn errors_are_capped() {
        let fields: Vec<String> = (0..300).map(|i| format!("\"f{i}\":1")).collect();
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p",{}}}}}"#,
            fields.join(",")
        );
        let d = decode::<Pod>(body.as_bytes(), FieldValidation::Warn, ("v1", "Pod")).expect("warn");
        assert_eq!(d.warnings.len(), STRICT_ERRORS_MAX);
    }

    #[test]
    fn missing_type_meta_comes_from_the_url_and_a_wrong_kind_is_refused() {
        let d = decode::<Pod>(
            br#"{"metadata":{"name":"p"}}"#,
            FieldValidation::Strict,
            ("v1", "Pod"),
        )
        .expect("type meta defaulted");
        assert_eq!(d.object["kind"], "Pod");
        decode::<Pod>(
            br#"{"apiVersion":"v1","kind":"Service"}"#,
            FieldValidation::Strict,
            ("v1", "Pod"),
        )
        .expect_err("a Service is not a Pod");
    }

    #[test]
    fn deep_nesting_and_garbage_are_bad_requests() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let e = decode::<Pod>(deep.as_bytes(), FieldValidation::Strict, ("v1", "Pod"))
            .expect_err("deep");
        assert_eq!(e.code, 400);
        let e = decode::<Pod>(b"{not json", FieldValidation::Strict, ("v1", "Pod"))
            .expect_err("garbage");
        assert_eq!(e.code, 400);
        let e = decode::<Pod>(b"[]", FieldValidation::Ignore, ("v1", "Pod"))
            .expect_err("not an object");
        assert_eq!(e.code, 400);
    }
}
