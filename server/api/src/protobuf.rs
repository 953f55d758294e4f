//! Kubernetes' protobuf wire format (`application/vnd.kubernetes.protobuf`), transcoded to and
//! from the JSON objects skerry handles.
//!
//! A body is the 4-byte magic `k8s\0` followed by a `runtime.Unknown` message:
//! `typeMeta` (1: {apiVersion = 1, kind = 2}), `raw` (2: the object's own message),
//! `contentEncoding` (3) and `contentType` (4). Field tags and kinds come from the table in
//! [`crate::schema`]. Kubernetes' special messages have their own JSON forms: `Time`
//! (Timestamp{seconds} ⇄ `2024-01-02T03:04:05Z`), `MicroTime` (⇄ `...05.123456Z`),
//! `Duration` (nanoseconds ⇄ `1h2m3s`), `Quantity` ({string} ⇄ string), `IntOrString`
//! ({type, intVal, strVal} ⇄ number or string), `RawExtension` and `FieldsV1` (raw bytes ⇄
//! the JSON they hold), `+protobuf.nullable` list wrappers (⇄ arrays); bytes fields are
//! base64 strings and int64s are JSON numbers.
//!
//! # One allocation per object, marshalled backwards
//!
//! (`docs/tricks.md` #9, the reverse protobuf marshal inside runtime.Unknown.) A length
//! prefix precedes its message, so a forward writer must either know
//! every nested size in advance or copy each finished message behind its prefix. [`encode`]
//! runs the same traversal twice over a [`Sink`]: first a [`Counter`] that only adds up
//! lengths (computing every message's size once, bottom-up), then a [`BackWriter`] over ONE
//! zero-filled buffer of exactly the final size — magic, `Unknown` header and object — that
//! it fills from the end towards the start. Fields are emitted in reverse, each value before
//! its key, so a nested message's length is simply how far the writer moved while writing
//! it: prefixes are written after their contents, and the object is never copied into the
//! envelope. The returned `Vec`'s capacity equals its length, and the writer asserts it
//! finished exactly at offset 0 without ever growing the buffer.
//!
//! # Decoding
//!
//! Invariants: every length prefix is checked against the bytes that remain (a message is
//! never longer than its body), nesting is capped at [`NESTING_DEPTH_MAX`], varints at 10
//! bytes, and a field number the table does not know is an error naming its path — a
//! request is never silently truncated. Hostile input yields an error, never a panic.
//!
//! # Zero values: Go's JSON, not the wire's
//!
//! The wire does not say which fields were pointers, and Go's gogo-protobuf writes every
//! non-pointer field even when it is zero (kubectl sends `hostIPC: false`, `paused: false`,
//! `generation: 0`). The decoder prints what Kubernetes' own encoding/json would print for
//! the Go struct that gogo's Unmarshal fills, using each field's Go facts from
//! [`schema::GoField`] (`schema/go_json.json`, the table of the Go struct tags):
//!
//! - a non-pointer `omitempty` scalar at its zero (false, 0, "", empty bytes) is dropped;
//! - a pointer is printed whenever it arrived, zero included (`replicas: 0` survives), and an
//!   absent one is dropped under `omitempty` or printed as `null` without it;
//! - a non-pointer field without `omitempty` is always printed: an absent scalar as its zero
//!   (`containerPort: 0`), an absent slice or map as `null` (`rules: null`);
//! - a struct is never omitted, `omitempty` or not (Go 1.23's encoding/json): an absent
//!   non-pointer struct prints its zero value, built by the same rules (`resources: {}`,
//!   `status: {}`), and the special types print their own zero form: `Time` and `MicroTime`
//!   `null` (hence Kubernetes 1.32's `creationTimestamp: null` in pod templates),
//!   `Quantity` `"0"`, `IntOrString` `0`, `Duration` `"0s"`, `RawExtension` `null`.
//!
//! Fields the table lacks (see `schema/go_json.md`) keep the conservative rule: zero numbers
//! and `false` kept, `null` and empty optional strings dropped. The rules run once per decoded
//! message ([`apply_go_json`]); inline members are Go's embedded structs, whose fields sit in
//! the parent's JSON.

use std::fmt;
use std::io::Write as _;

use serde_json::{Map, Number, Value};
use thiserror::Error;

use crate::schema::{self, FieldSchema, Kind, Special, TypeSchema};

/// The 4 bytes that open every Kubernetes protobuf body (`k8s.io/apimachinery` serializer).
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// The media type of the format.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The deepest message nesting accepted, in either direction. Kubernetes objects nest about
/// 12 deep (Deployment > spec > template > spec > containers > env > valueFrom > ...); each
/// level costs a stack frame, so this bounds stack use against hostile bodies. Borrowed from
/// prost's `RECURSION_LIMIT` (100).
pub const NESTING_DEPTH_MAX: usize = 100;

/// The longest protobuf varint (a 64-bit value in 7-bit groups).
const VARINT_BYTES_MAX: usize = 10;

/// Protobuf wire types (protobuf encoding guide, "Message Structure").
const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;

/// The largest protobuf field number (2^29 - 1).
const FIELD_NUMBER_MAX: u64 = (1 << 29) - 1;

/// `runtime.Unknown` and `runtime.TypeMeta` field numbers (k8s.io/apimachinery/pkg/runtime).
const UNKNOWN_TYPE_META: u32 = 1;
const UNKNOWN_RAW: u32 = 2;
const UNKNOWN_CONTENT_ENCODING: u32 = 3;
const UNKNOWN_CONTENT_TYPE: u32 = 4;
const TYPE_META_API_VERSION: u32 = 1;
const TYPE_META_KIND: u32 = 2;

/// Seconds from 0001-01-01T00:00:00Z to the Unix epoch, and from the epoch to the end of
/// 9999: the range of Kubernetes' Timestamp (its proto comment).
const TIMESTAMP_SECONDS_MIN: i64 = -62_135_596_800;
const TIMESTAMP_SECONDS_MAX: i64 = 253_402_300_799;
const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// The object's type, from the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TypeMeta {
    /// `v1`, `apps/v1`, ...
    pub api_version: String,
    /// `Pod`, `DeploymentList`, ...
    pub kind: String,
}

/// Why a body could not be decoded or an object encoded. Decoding errors are the client's
/// (400 Bad Request); encoding errors mean a stored object does not fit its schema (500).
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtobufError {
    /// The body is not Kubernetes protobuf at all.
    #[error("body does not start with the Kubernetes protobuf magic k8s\\0")]
    MissingMagic,
    /// Truncated or ill-formed wire data: a bad varint, a length past the end, a wire type
    /// that does not fit the field.
    #[error("malformed protobuf at {path}: {reason}")]
    Malformed { path: String, reason: &'static str },
    /// A field number the schema does not have; Kubernetes would drop it, skerry refuses
    /// rather than silently lose what the client sent.
    #[error("unknown protobuf field {tag} in {path}")]
    UnknownField { path: String, tag: u32 },
    /// A JSON field the schema does not have (encoding).
    #[error("unknown field {path}")]
    UnknownJsonField { path: String },
    /// The envelope (or the caller) names a kind with no protobuf schema.
    #[error("no protobuf schema for kind {kind} in {api_version}")]
    UnknownKind { api_version: String, kind: String },
    /// `runtime.Unknown.contentEncoding` is set; Kubernetes defines none.
    #[error("unsupported content encoding {0:?}")]
    UnsupportedEncoding(String),
    /// Messages nested deeper than [`NESTING_DEPTH_MAX`].
    #[error("nesting deeper than {NESTING_DEPTH_MAX} at {path}")]
    TooDeep { path: String },
    /// A JSON value of the wrong type for its field (encoding).
    #[error("{path}: expected {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
    },
    /// A value of the right type that does not parse: a time, a duration, base64, embedded
    /// JSON, a timestamp outside years 1 to 9999.
    #[error("{path}: {reason}")]
    InvalidValue { path: String, reason: String },
}

// ---------------------------------------------------------------- paths

/// A JSON path built on the stack while walking; rendered only for an error.
#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Field(&'a str),
    Index(usize),
    Key(&'a str),
}

#[derive(Clone, Copy)]
struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

impl<'a> Path<'a> {
    const ROOT: Path<'static> = Path {
        parent: None,
        segment: Segment::Root,
    };

    fn child(&'a self, segment: Segment<'a>) -> Path<'a> {
        Path {
            parent: Some(self),
            segment,
        }
    }

    fn render(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match self.segment {
            Segment::Root => write!(f, "<object>"),
            Segment::Field(name) => write!(f, ".{name}"),
            Segment::Index(i) => write!(f, "[{i}]"),
            Segment::Key(key) => write!(f, "[{key:?}]"),
        }
    }
}

fn malformed(path: &Path, reason: &'static str) -> ProtobufError {
    ProtobufError::Malformed {
        path: path.render(),
        reason,
    }
}

fn wrong_type(path: &Path, expected: &'static str) -> ProtobufError {
    ProtobufError::WrongType {
        path: path.render(),
        expected,
    }
}

fn invalid(path: &Path, reason: impl Into<String>) -> ProtobufError {
    ProtobufError::InvalidValue {
        path: path.render(),
        reason: reason.into(),
    }
}

fn check_depth(depth: usize, path: &Path) -> Result<(), ProtobufError> {
    if depth > NESTING_DEPTH_MAX {
        return Err(ProtobufError::TooDeep {
            path: path.render(),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------- decoding

/// Reads protobuf primitives from a slice; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, offset: 0 }
    }

    fn done(&self) -> bool {
        self.offset >= self.bytes.len()
    }

    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut value = 0u64;
        for i in 0..VARINT_BYTES_MAX {
            let byte = *self.bytes.get(self.offset).ok_or("truncated varint")?;
            self.offset += 1;
            if i == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err("varint longer than 64 bits");
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes")
    }

    fn fixed64(&mut self) -> Result<u64, &'static str> {
        let end = self.offset.checked_add(8).ok_or("truncated fixed64")?;
        let bytes = self
            .bytes
            .get(self.offset..end)
            .ok_or("truncated fixed64")?;
        self.offset = end;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(array))
    }

    /// A length-delimited field's contents; the length is checked against what remains.
    fn delimited(&mut self) -> Result<&'a [u8], &'static str> {
        let len = self.varint()?;
        let remaining = self.bytes.len() - self.offset;
        if len > remaining as u64 {
            return Err("length prefix runs past the end of its message");
        }
        let start = self.offset;
        self.offset += len as usize;
        Ok(&self.bytes[start..self.offset])
    }

    /// A field key: (field number, wire type).
    fn key(&mut self) -> Result<(u32, u8), &'static str> {
        let key = self.varint()?;
        let tag = key >> 3;
        if tag == 0 || tag > FIELD_NUMBER_MAX {
            return Err("invalid field number");
        }
        Ok((tag as u32, (key & 7) as u8))
    }
}

/// Decodes a protobuf body into its type and its JSON object, shaped as the JSON API shows
/// it (`apiVersion` and `kind` included for kinds).
pub fn decode(body: &[u8]) -> Result<(TypeMeta, Value), ProtobufError> {
    decode_envelope(body, 0)
}

fn decode_envelope(body: &[u8], depth: usize) -> Result<(TypeMeta, Value), ProtobufError> {
    let root = Path::ROOT;
    let rest = body
        .strip_prefix(&MAGIC)
        .ok_or(ProtobufError::MissingMagic)?;
    let mut type_meta = TypeMeta::default();
    let mut raw: &[u8] = &[];
    let mut reader = Reader::new(rest);
    while !reader.done() {
        let (tag, wire) = reader.key().map_err(|r| malformed(&root, r))?;
        if wire != WIRE_LEN {
            return Err(malformed(&root, "envelope field is not length-delimited"));
        }
        let bytes = reader.delimited().map_err(|r| malformed(&root, r))?;
        match tag {
            UNKNOWN_TYPE_META => type_meta = decode_type_meta(bytes)?,
            UNKNOWN_RAW => raw = bytes,
            UNKNOWN_CONTENT_ENCODING => {
                if !bytes.is_empty() {
                    let encoding = String::from_utf8_lossy(bytes).into_owned();
                    return Err(ProtobufError::UnsupportedEncoding(encoding));
                }
            }
            // The content type of `raw`; Kubernetes' decoder reads `raw` as protobuf
            // whatever it says, and kubectl sends it empty.
            UNKNOWN_CONTENT_TYPE => {}
            tag => {
                return Err(ProtobufError::UnknownField {
                    path: "runtime.Unknown".to_string(),
                    tag,
                });
            }
        }
    }
    let unknown_kind = || ProtobufError::UnknownKind {
        api_version: type_meta.api_version.clone(),
        kind: type_meta.kind.clone(),
    };
    let definition = schema::definition_for_kind(&type_meta.api_version, &type_meta.kind)
        .ok_or_else(unknown_kind)?;
    let ty = schema::lookup(definition).ok_or_else(unknown_kind)?;
    let mut object = Map::new();
    if ty.type_meta {
        object.insert(
            "apiVersion".into(),
            Value::String(type_meta.api_version.clone()),
        );
        object.insert("kind".into(), Value::String(type_meta.kind.clone()));
    }
    decode_fields(ty, raw, &mut object, &root, depth + 1)?;
    apply_go_json(ty, &mut object, &root, depth + 1)?;
    Ok((type_meta, Value::Object(object)))
}

fn decode_type_meta(bytes: &[u8]) -> Result<TypeMeta, ProtobufError> {
    let path = Path::ROOT;
    let path = path.child(Segment::Field("typeMeta"));
    let mut type_meta = TypeMeta::default();
    let mut reader = Reader::new(bytes);
    while !reader.done() {
        let (tag, wire) = reader.key().map_err(|r| malformed(&path, r))?;
        if wire != WIRE_LEN {
            return Err(malformed(&path, "typeMeta field is not length-delimited"));
        }
        let value = reader.delimited().map_err(|r| malformed(&path, r))?;
        let value = String::from_utf8_lossy(value).into_owned();
        match tag {
            TYPE_META_API_VERSION => type_meta.api_version = value,
            TYPE_META_KIND => type_meta.kind = value,
            tag => {
                return Err(ProtobufError::UnknownField {
                    path: "runtime.TypeMeta".to_string(),
                    tag,
                });
            }
        }
    }
    Ok(type_meta)
}

/// Decodes one message's fields into `object` (an inline member decodes into its parent's).
fn decode_fields(
    ty: &'static TypeSchema,
    bytes: &[u8],
    object: &mut Map<String, Value>,
    path: &Path,
    depth: usize,
) -> Result<(), ProtobufError> {
    check_depth(depth, path)?;
    let mut reader = Reader::new(bytes);
    while !reader.done() {
        let (tag, wire) = reader.key().map_err(|r| malformed(path, r))?;
        let field = ty
            .field_by_tag(tag)
            .ok_or_else(|| ProtobufError::UnknownField {
                path: path.render(),
                tag,
            })?;
        let field_path = path.child(Segment::Field(&field.json));
        match field.kind {
            Kind::Map => {
                expect_wire(wire, WIRE_LEN, &field_path)?;
                let entry = reader.delimited().map_err(|r| malformed(&field_path, r))?;
                let (key, value) = decode_map_entry(field, entry, &field_path, depth)?;
                let map = object
                    .entry(field.json.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(map) = map {
                    map.insert(key, value);
                }
            }
            Kind::Message => {
                expect_wire(wire, WIRE_LEN, &field_path)?;
                let bytes = reader.delimited().map_err(|r| malformed(&field_path, r))?;
                let element = element_type(field, &field_path)?;
                if field.inline {
                    decode_fields(element, bytes, object, path, depth + 1)?;
                } else if !field.repeated
                    && element.special.is_none()
                    && let Some(Value::Object(existing)) = object.get_mut(&field.json)
                {
                    // A message field seen twice merges (protobuf encoding guide, "Last
                    // One Wins" for scalars, merge for messages).
                    decode_fields(element, bytes, existing, &field_path, depth + 1)?;
                    apply_go_json(element, existing, &field_path, depth + 1)?;
                } else {
                    let value = decode_message(element, bytes, &field_path, depth + 1)?;
                    put(object, field, value);
                }
            }
            kind => {
                if wire == WIRE_LEN && field.repeated && kind != Kind::String && kind != Kind::Bytes
                {
                    // A packed repeated scalar (proto2 Kubernetes writes them unpacked, but
                    // a decoder must accept both).
                    let packed = reader.delimited().map_err(|r| malformed(&field_path, r))?;
                    let mut inner = Reader::new(packed);
                    let element_wire = if kind == Kind::Double {
                        WIRE_FIXED64
                    } else {
                        WIRE_VARINT
                    };
                    while !inner.done() {
                        let value = decode_scalar(kind, element_wire, &mut inner, &field_path)?;
                        put(object, field, value);
                    }
                } else {
                    let value = decode_scalar(kind, wire, &mut reader, &field_path)?;
                    put(object, field, value);
                }
            }
        }
    }
    Ok(())
}

/// Sets a singular field (last one wins) or appends to a repeated one; omission is
/// [`apply_go_json`]'s, once the message is complete.
fn put(object: &mut Map<String, Value>, field: &FieldSchema, value: Value) {
    if field.repeated {
        let list = object
            .entry(field.json.clone())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = list {
            list.push(value);
        }
        return;
    }
    object.insert(field.json.clone(), value);
}

/// Rewrites a decoded message's fields into what Go's encoding/json prints for the struct
/// gogo's Unmarshal fills (the module doc's zero-value rules): drops zero `omitempty`
/// scalars, prints absent non-`omitempty` fields as their zero or `null`, and builds the
/// zero value of absent non-pointer structs. Inline members' fields live in `object` too.
fn apply_go_json(
    ty: &'static TypeSchema,
    object: &mut Map<String, Value>,
    path: &Path,
    depth: usize,
) -> Result<(), ProtobufError> {
    check_depth(depth, path)?;
    for field in ty.fields() {
        if field.inline {
            // An embedded non-pointer struct (the generator checks none is a pointer).
            apply_go_json(element_type(field, path)?, object, path, depth + 1)?;
            continue;
        }
        let Some(go) = field.go() else {
            // No Go declaration: the conservative rule.
            let drop = match object.get(&field.json) {
                Some(Value::Null) => true,
                Some(Value::String(s)) => {
                    s.is_empty() && field.kind == Kind::String && !field.required && !field.repeated
                }
                _ => false,
            };
            if drop {
                object.remove(&field.json);
            }
            continue;
        };
        match object.get(&field.json) {
            Some(value) => {
                if go.omitempty && !go.pointer && is_go_empty(field, value) {
                    object.remove(&field.json);
                }
            }
            None => {
                let field_path = path.child(Segment::Field(&field.json));
                if let Some(zero) = go_zero(field, go, &field_path, depth + 1)? {
                    object.insert(field.json.clone(), zero);
                }
            }
        }
    }
    Ok(())
}

/// Whether Go's `omitempty` drops this decoded value of a non-pointer field: a zero
/// scalar or empty bytes. Structs are never empty to encoding/json; a slice or map that
/// arrived has at least one element.
fn is_go_empty(field: &FieldSchema, value: &Value) -> bool {
    if field.repeated || matches!(field.kind, Kind::Message | Kind::Map) {
        return false;
    }
    match value {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// What Go prints for a field that did not arrive (its zero value), or `None` when Go
/// omits it.
fn go_zero(
    field: &FieldSchema,
    go: schema::GoField,
    path: &Path,
    depth: usize,
) -> Result<Option<Value>, ProtobufError> {
    // nil pointers, slices, maps and []byte: omitted under omitempty, else `null`.
    let nil = go.pointer || field.repeated || matches!(field.kind, Kind::Map | Kind::Bytes);
    if nil {
        return Ok((!go.omitempty).then_some(Value::Null));
    }
    let zero = match field.kind {
        Kind::Message => {
            let element = element_type(field, path)?;
            if element.special == Some(Special::ListWrapper) {
                // A named slice type (`ExtraValue`): nil.
                return Ok((!go.omitempty).then_some(Value::Null));
            }
            // A struct is never omitted; its zero value is the empty message's JSON.
            decode_message(element, &[], path, depth)?
        }
        _ if go.omitempty => return Ok(None),
        Kind::Bool => Value::Bool(false),
        Kind::Int32 | Kind::Int64 => Value::from(0),
        Kind::Double => Value::from(0.0),
        Kind::String => Value::String(String::new()),
        Kind::Bytes | Kind::Map => unreachable!("handled as nil above"),
    };
    Ok(Some(zero))
}

fn expect_wire(wire: u8, expected: u8, path: &Path) -> Result<(), ProtobufError> {
    if wire != expected {
        return Err(malformed(path, "wire type does not match the field's kind"));
    }
    Ok(())
}

fn element_type(field: &FieldSchema, path: &Path) -> Result<&'static TypeSchema, ProtobufError> {
    // The table's loader checks every named type exists; a miss is a table bug, reported
    // rather than panicking on a request.
    field.element_type().ok_or_else(|| {
        invalid(
            path,
            "field's message type is missing from the schema table",
        )
    })
}

fn decode_scalar(
    kind: Kind,
    wire: u8,
    reader: &mut Reader,
    path: &Path,
) -> Result<Value, ProtobufError> {
    let value = match kind {
        Kind::String => {
            expect_wire(wire, WIRE_LEN, path)?;
            let bytes = reader.delimited().map_err(|r| malformed(path, r))?;
            // Go's JSON encoder replaces invalid UTF-8 with U+FFFD; so do we.
            Value::String(String::from_utf8_lossy(bytes).into_owned())
        }
        Kind::Bytes => {
            expect_wire(wire, WIRE_LEN, path)?;
            let bytes = reader.delimited().map_err(|r| malformed(path, r))?;
            Value::String(base64_encode(bytes))
        }
        Kind::Bool => {
            expect_wire(wire, WIRE_VARINT, path)?;
            Value::Bool(reader.varint().map_err(|r| malformed(path, r))? != 0)
        }
        Kind::Int32 => {
            expect_wire(wire, WIRE_VARINT, path)?;
            // int32 is the low 32 bits of the varint (negatives are sign-extended to 64).
            Value::from(reader.varint().map_err(|r| malformed(path, r))? as i32)
        }
        Kind::Int64 => {
            expect_wire(wire, WIRE_VARINT, path)?;
            Value::from(reader.varint().map_err(|r| malformed(path, r))? as i64)
        }
        Kind::Double => {
            expect_wire(wire, WIRE_FIXED64, path)?;
            let bits = reader.fixed64().map_err(|r| malformed(path, r))?;
            let number = Number::from_f64(f64::from_bits(bits))
                .ok_or_else(|| invalid(path, "NaN or infinity has no JSON form"))?;
            Value::Number(number)
        }
        Kind::Message | Kind::Map => unreachable!("decode_scalar is only called for scalar kinds"),
    };
    Ok(value)
}

fn decode_map_entry(
    field: &FieldSchema,
    entry: &[u8],
    path: &Path,
    depth: usize,
) -> Result<(String, Value), ProtobufError> {
    let value_kind = field.value.unwrap_or(Kind::String);
    let mut key = String::new();
    let mut value = None;
    let mut reader = Reader::new(entry);
    while !reader.done() {
        let (tag, wire) = reader.key().map_err(|r| malformed(path, r))?;
        match tag {
            1 => {
                expect_wire(wire, WIRE_LEN, path)?;
                let bytes = reader.delimited().map_err(|r| malformed(path, r))?;
                key = String::from_utf8_lossy(bytes).into_owned();
            }
            2 if value_kind == Kind::Message => {
                expect_wire(wire, WIRE_LEN, path)?;
                let bytes = reader.delimited().map_err(|r| malformed(path, r))?;
                let element = element_type(field, path)?;
                let entry_path = path.child(Segment::Key(&key));
                value = Some(decode_message(element, bytes, &entry_path, depth + 1)?);
            }
            2 => value = Some(decode_scalar(value_kind, wire, &mut reader, path)?),
            tag => {
                return Err(ProtobufError::UnknownField {
                    path: path.render(),
                    tag,
                });
            }
        }
    }
    // An entry without a value holds the value kind's zero.
    let value = match value {
        Some(value) => value,
        None if value_kind == Kind::Message => {
            decode_message(element_type(field, path)?, &[], path, depth + 1)?
        }
        None => Value::String(String::new()),
    };
    Ok((key, value))
}

/// Decodes one message into its JSON value (special types into their own JSON forms).
fn decode_message(
    ty: &'static TypeSchema,
    bytes: &[u8],
    path: &Path,
    depth: usize,
) -> Result<Value, ProtobufError> {
    check_depth(depth, path)?;
    let Some(special) = ty.special else {
        let mut object = Map::new();
        decode_fields(ty, bytes, &mut object, path, depth)?;
        apply_go_json(ty, &mut object, path, depth)?;
        return Ok(Value::Object(object));
    };
    let fields = SpecialFields::read(ty, special, bytes, path)?;
    match special {
        // Go: an empty Time is the zero time, JSON null; nanoseconds are not read back
        // (metav1.Time.Unmarshal keeps seconds only).
        Special::Time if bytes.is_empty() => Ok(Value::Null),
        Special::Time => Ok(Value::String(format_rfc3339(fields.int(1), 0, 0, path)?)),
        Special::MicroTime if bytes.is_empty() => Ok(Value::Null),
        Special::MicroTime => {
            let nanos = fields.int(2);
            if !(0..NANOS_PER_SECOND).contains(&nanos) {
                return Err(invalid(path, "nanos out of range"));
            }
            Ok(Value::String(format_rfc3339(
                fields.int(1),
                nanos,
                6,
                path,
            )?))
        }
        Special::Duration => Ok(Value::String(format_go_duration(fields.int(1)))),
        Special::Quantity => {
            let text = fields.text(1);
            // The zero Quantity marshals to JSON as "0".
            Ok(Value::String(if text.is_empty() {
                "0".into()
            } else {
                text.into_owned()
            }))
        }
        Special::IntOrString => match fields.int(1) {
            0 => Ok(Value::from(fields.int(2) as i32)),
            1 => Ok(Value::String(fields.text(3).into_owned())),
            _ => Err(invalid(
                path,
                "IntOrString type is neither 0 (int) nor 1 (string)",
            )),
        },
        Special::RawExtension | Special::FieldsV1 => {
            let raw = fields.bytes(1);
            if raw.is_empty() {
                Ok(Value::Null)
            } else if raw.starts_with(&MAGIC) {
                // An embedded object in protobuf form (watch events over protobuf).
                Ok(decode_envelope(raw, depth + 1)?.1)
            } else {
                serde_json::from_slice(raw)
                    .map_err(|e| invalid(path, format!("embedded JSON is invalid: {e}")))
            }
        }
        Special::ListWrapper => Ok(Value::Array(fields.strings)),
    }
}

/// The fields of a special message, read by tag (each is a scalar; see `Special`).
#[derive(Default)]
struct SpecialFields<'a> {
    ints: [i64; 4],
    texts: [&'a [u8]; 4],
    strings: Vec<Value>,
}

impl<'a> SpecialFields<'a> {
    fn read(
        ty: &'static TypeSchema,
        special: Special,
        bytes: &'a [u8],
        path: &Path,
    ) -> Result<Self, ProtobufError> {
        let mut fields = SpecialFields::default();
        let mut reader = Reader::new(bytes);
        while !reader.done() {
            let (tag, wire) = reader.key().map_err(|r| malformed(path, r))?;
            let field = ty
                .field_by_tag(tag)
                .ok_or_else(|| ProtobufError::UnknownField {
                    path: path.render(),
                    tag,
                })?;
            let slot = tag as usize;
            if slot >= fields.ints.len() {
                return Err(malformed(path, "special message field out of range"));
            }
            match field.kind {
                Kind::String | Kind::Bytes => {
                    expect_wire(wire, WIRE_LEN, path)?;
                    let value = reader.delimited().map_err(|r| malformed(path, r))?;
                    if special == Special::ListWrapper {
                        fields
                            .strings
                            .push(Value::String(String::from_utf8_lossy(value).into_owned()));
                    } else {
                        fields.texts[slot] = value;
                    }
                }
                Kind::Int32 | Kind::Int64 => {
                    expect_wire(wire, WIRE_VARINT, path)?;
                    let value = reader.varint().map_err(|r| malformed(path, r))? as i64;
                    fields.ints[slot] = if field.kind == Kind::Int32 {
                        i64::from(value as i32)
                    } else {
                        value
                    };
                }
                _ => {
                    return Err(malformed(
                        path,
                        "unexpected field kind in a special message",
                    ));
                }
            }
        }
        Ok(fields)
    }

    fn int(&self, tag: usize) -> i64 {
        self.ints[tag]
    }

    fn text(&self, tag: usize) -> std::borrow::Cow<'a, str> {
        String::from_utf8_lossy(self.texts[tag])
    }

    fn bytes(&self, tag: usize) -> &'a [u8] {
        self.texts[tag]
    }
}

// ---------------------------------------------------------------- encoding

/// Where the marshal traversal puts bytes. Bytes are *prepended*: the traversal emits fields
/// in reverse and each value before its key. `written` is how many bytes have been put so
/// far, so a nested message's length is the difference across writing it.
trait Sink {
    fn written(&self) -> usize;
    fn put(&mut self, bytes: &[u8]);
    /// Prepends `len` bytes produced by `fill` (which gets exactly `len` bytes).
    fn put_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
    ) -> Result<(), String>;
    /// The first pass checks the JSON (unknown fields); the second need not repeat it.
    fn validating(&self) -> bool;

    fn put_varint(&mut self, mut value: u64) {
        let mut buffer = [0u8; VARINT_BYTES_MAX];
        let mut len = 0;
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                buffer[len] = byte;
                len += 1;
                break;
            }
            buffer[len] = byte | 0x80;
            len += 1;
        }
        self.put(&buffer[..len]);
    }

    fn put_key(&mut self, tag: u32, wire: u8) {
        self.put_varint((u64::from(tag) << 3) | u64::from(wire));
    }

    fn put_len_field(&mut self, tag: u32, bytes: &[u8]) {
        self.put(bytes);
        self.put_varint(bytes.len() as u64);
        self.put_key(tag, WIRE_LEN);
    }
}

/// The sizing pass: counts bytes without writing any.
struct Counter {
    len: usize,
}

impl Sink for Counter {
    fn written(&self) -> usize {
        self.len
    }

    fn put(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
    }

    fn put_with(
        &mut self,
        len: usize,
        _fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        self.len += len;
        Ok(())
    }

    fn validating(&self) -> bool {
        true
    }
}

/// The writing pass: fills one pre-sized buffer from its end towards offset 0.
struct BackWriter {
    buffer: Vec<u8>,
    /// The first byte written so far; everything from here to the end is final.
    start: usize,
}

impl BackWriter {
    fn new(len: usize) -> Self {
        Self {
            buffer: vec![0; len],
            start: len,
        }
    }

    /// # Panics
    /// If the sizing pass and the writing pass disagreed (a bug in this module).
    fn finish(self, capacity: usize) -> Vec<u8> {
        assert_eq!(
            self.start, 0,
            "the sizing pass over-counted by {} bytes",
            self.start
        );
        assert_eq!(
            self.buffer.capacity(),
            capacity,
            "the buffer was reallocated"
        );
        self.buffer
    }

    fn reserve(&mut self, len: usize) -> &mut [u8] {
        assert!(
            len <= self.start,
            "the sizing pass under-counted: {len} bytes to put, {} left",
            self.start
        );
        self.start -= len;
        &mut self.buffer[self.start..self.start + len]
    }
}

impl Sink for BackWriter {
    fn written(&self) -> usize {
        self.buffer.len() - self.start
    }

    fn put(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len()).copy_from_slice(bytes);
    }

    fn put_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        fill(self.reserve(len))
    }

    fn validating(&self) -> bool {
        false
    }
}

/// Encodes `object` (a JSON object of kind `kind` in `api_version`) as a Kubernetes protobuf
/// body: magic, `runtime.Unknown` envelope and the object's message, in one allocation.
pub fn encode(api_version: &str, kind: &str, object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let unknown_kind = || ProtobufError::UnknownKind {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
    };
    let definition = schema::definition_for_kind(api_version, kind).ok_or_else(unknown_kind)?;
    let ty = schema::lookup(definition).ok_or_else(unknown_kind)?;
    let root = Path::ROOT;

    let mut counter = Counter { len: 0 };
    marshal_envelope(&mut counter, ty, api_version, kind, object, &root)?;
    let total_len = counter.len;

    let mut writer = BackWriter::new(total_len);
    let capacity = writer.buffer.capacity();
    marshal_envelope(&mut writer, ty, api_version, kind, object, &root)?;
    Ok(writer.finish(capacity))
}

/// Magic + `runtime.Unknown{typeMeta, raw, contentEncoding, contentType}`, last field first.
fn marshal_envelope<S: Sink>(
    sink: &mut S,
    ty: &'static TypeSchema,
    api_version: &str,
    kind: &str,
    object: &Value,
    root: &Path,
) -> Result<(), ProtobufError> {
    // Go writes the two strings even when empty; so do we, byte for byte.
    sink.put_len_field(UNKNOWN_CONTENT_TYPE, b"");
    sink.put_len_field(UNKNOWN_CONTENT_ENCODING, b"");
    nested(sink, UNKNOWN_RAW, |sink| {
        marshal_value(sink, ty, object, root, 1)
    })?;
    nested(sink, UNKNOWN_TYPE_META, |sink| {
        sink.put_len_field(TYPE_META_KIND, kind.as_bytes());
        sink.put_len_field(TYPE_META_API_VERSION, api_version.as_bytes());
        Ok(())
    })?;
    sink.put(&MAGIC);
    Ok(())
}

/// Writes a length-delimited field whose contents `body` writes: contents, then their
/// length (known by now), then the key.
fn nested<S: Sink>(
    sink: &mut S,
    tag: u32,
    body: impl FnOnce(&mut S) -> Result<(), ProtobufError>,
) -> Result<(), ProtobufError> {
    let before = sink.written();
    body(sink)?;
    let len = sink.written() - before;
    sink.put_varint(len as u64);
    sink.put_key(tag, WIRE_LEN);
    Ok(())
}

/// The contents of one message for a JSON value of type `ty`.
fn marshal_value<S: Sink>(
    sink: &mut S,
    ty: &'static TypeSchema,
    value: &Value,
    path: &Path,
    depth: usize,
) -> Result<(), ProtobufError> {
    check_depth(depth, path)?;
    let Some(special) = ty.special else {
        return match value {
            Value::Object(object) => marshal_object(sink, ty, object, path, depth, true),
            Value::Null => Ok(()),
            _ => Err(wrong_type(path, "an object")),
        };
    };
    match special {
        Special::Time | Special::MicroTime => {
            let text = value
                .as_str()
                .ok_or_else(|| wrong_type(path, "an RFC 3339 time"))?;
            let (seconds, nanos) = parse_rfc3339(text).map_err(|r| invalid(path, r))?;
            // metav1.Time keeps seconds only on the wire (Time.ProtoTime); MicroTime keeps
            // nanoseconds. Both write Timestamp's two fields, as gogo does.
            let nanos = if special == Special::Time { 0 } else { nanos };
            put_varint_field(sink, 2, nanos as u64);
            put_varint_field(sink, 1, seconds as u64);
        }
        Special::Duration => {
            let text = value
                .as_str()
                .ok_or_else(|| wrong_type(path, "a duration string"))?;
            let nanos = parse_go_duration(text).map_err(|r| invalid(path, r))?;
            put_varint_field(sink, 1, nanos as u64);
        }
        Special::Quantity => {
            // Quantity's JSON decoder accepts a bare number too (`cpu: 1`).
            let number_text;
            let text = match value {
                Value::String(s) => s.as_str(),
                Value::Number(n) => {
                    number_text = n.to_string();
                    number_text.as_str()
                }
                _ => return Err(wrong_type(path, "a quantity string")),
            };
            sink.put_len_field(1, text.as_bytes());
        }
        Special::IntOrString => match value {
            // Go writes all three fields: type, intVal, strVal.
            Value::Number(n) => {
                let int = n
                    .as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| wrong_type(path, "a 32-bit integer or a string"))?;
                sink.put_len_field(3, b"");
                put_varint_field(sink, 2, int as i64 as u64);
                put_varint_field(sink, 1, 0);
            }
            Value::String(s) => {
                sink.put_len_field(3, s.as_bytes());
                put_varint_field(sink, 2, 0);
                put_varint_field(sink, 1, 1);
            }
            _ => return Err(wrong_type(path, "an integer or a string")),
        },
        Special::RawExtension | Special::FieldsV1 => {
            let len = json_len(value);
            sink.put_with(len, |out| {
                let mut out = out;
                serde_json::to_writer(&mut out, value).map_err(|e| e.to_string())
            })
            .map_err(|r| invalid(path, r))?;
            sink.put_varint(len as u64);
            sink.put_key(1, WIRE_LEN);
        }
        Special::ListWrapper => {
            let items = value.as_array().ok_or_else(|| wrong_type(path, "a list"))?;
            let tag = ty.fields().first().map_or(1, |f| f.tag);
            for (i, item) in items.iter().enumerate().rev() {
                let item_path = path.child(Segment::Index(i));
                let text = match item {
                    Value::String(s) => s.as_str(),
                    Value::Null => "",
                    _ => return Err(wrong_type(&item_path, "a string")),
                };
                sink.put_len_field(tag, text.as_bytes());
            }
        }
    }
    Ok(())
}

fn put_varint_field<S: Sink>(sink: &mut S, tag: u32, value: u64) {
    sink.put_varint(value);
    sink.put_key(tag, WIRE_VARINT);
}

/// The length of `value` serialized as compact JSON, counted without allocating.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).expect("serializing a serde_json::Value cannot fail");
    count.flush().expect("counting cannot fail");
    count.0
}

fn marshal_object<S: Sink>(
    sink: &mut S,
    ty: &'static TypeSchema,
    object: &Map<String, Value>,
    path: &Path,
    depth: usize,
    owner: bool,
) -> Result<(), ProtobufError> {
    if owner && sink.validating() {
        for key in object.keys() {
            let type_meta = ty.type_meta && (key == "apiVersion" || key == "kind");
            if !type_meta && ty.field(key).is_none() {
                return Err(ProtobufError::UnknownJsonField {
                    path: path.child(Segment::Field(key)).render(),
                });
            }
        }
    }
    for field in ty.fields().iter().rev() {
        if field.inline {
            let member = element_type(field, path)?;
            if inline_present(member, object) {
                nested(sink, field.tag, |sink| {
                    marshal_object(sink, member, object, path, depth + 1, false)
                })?;
            }
            continue;
        }
        let Some(value) = object.get(&field.json) else {
            continue;
        };
        if value.is_null() {
            continue;
        }
        let field_path = path.child(Segment::Field(&field.json));
        marshal_field(sink, field, value, &field_path, depth)?;
    }
    Ok(())
}

/// Whether any field of an inline member (or of its own inline members) is set in `object`.
fn inline_present(member: &TypeSchema, object: &Map<String, Value>) -> bool {
    member.fields().iter().any(|f| {
        if f.inline {
            f.element_type().is_some_and(|t| inline_present(t, object))
        } else {
            object.get(&f.json).is_some_and(|v| !v.is_null())
        }
    })
}

fn marshal_field<S: Sink>(
    sink: &mut S,
    field: &FieldSchema,
    value: &Value,
    path: &Path,
    depth: usize,
) -> Result<(), ProtobufError> {
    if field.kind == Kind::Map {
        let map = value
            .as_object()
            .ok_or_else(|| wrong_type(path, "an object (map)"))?;
        let value_kind = field.value.unwrap_or(Kind::String);
        for (key, entry_value) in map.iter().rev() {
            let entry_path = path.child(Segment::Key(key));
            nested(sink, field.tag, |sink| {
                // Go writes a map entry's key and value even when empty.
                if value_kind == Kind::Message {
                    let element = element_type(field, &entry_path)?;
                    nested(sink, 2, |sink| {
                        marshal_value(sink, element, entry_value, &entry_path, depth + 1)
                    })?;
                } else {
                    marshal_scalar(sink, value_kind, 2, entry_value, &entry_path)?;
                }
                sink.put_len_field(1, key.as_bytes());
                Ok(())
            })?;
        }
        return Ok(());
    }
    if field.repeated {
        let items = value.as_array().ok_or_else(|| wrong_type(path, "a list"))?;
        for (i, item) in items.iter().enumerate().rev() {
            let item_path = path.child(Segment::Index(i));
            marshal_single(sink, field, item, &item_path, depth)?;
        }
        return Ok(());
    }
    marshal_single(sink, field, value, path, depth)
}

fn marshal_single<S: Sink>(
    sink: &mut S,
    field: &FieldSchema,
    value: &Value,
    path: &Path,
    depth: usize,
) -> Result<(), ProtobufError> {
    if field.kind == Kind::Message {
        let element = element_type(field, path)?;
        return nested(sink, field.tag, |sink| {
            marshal_value(sink, element, value, path, depth + 1)
        });
    }
    marshal_scalar(sink, field.kind, field.tag, value, path)
}

/// One scalar field; JSON `null` stands for the kind's zero, as Go's decoder reads it.
fn marshal_scalar<S: Sink>(
    sink: &mut S,
    kind: Kind,
    tag: u32,
    value: &Value,
    path: &Path,
) -> Result<(), ProtobufError> {
    match kind {
        Kind::String => {
            let text = match value {
                Value::String(s) => s.as_str(),
                Value::Null => "",
                _ => return Err(wrong_type(path, "a string")),
            };
            sink.put_len_field(tag, text.as_bytes());
        }
        Kind::Bytes => {
            let text = match value {
                Value::String(s) => s.as_str(),
                Value::Null => "",
                _ => return Err(wrong_type(path, "a base64 string")),
            };
            let len = base64_decode(text.as_bytes(), None).map_err(|r| invalid(path, r))?;
            sink.put_with(len, |out| {
                base64_decode(text.as_bytes(), Some(out))
                    .map(|_| ())
                    .map_err(String::from)
            })
            .map_err(|r| invalid(path, r))?;
            sink.put_varint(len as u64);
            sink.put_key(tag, WIRE_LEN);
        }
        Kind::Bool => {
            let flag = match value {
                Value::Bool(b) => *b,
                Value::Null => false,
                _ => return Err(wrong_type(path, "a boolean")),
            };
            put_varint_field(sink, tag, u64::from(flag));
        }
        Kind::Int32 => {
            let int = match value {
                Value::Null => 0,
                _ => value
                    .as_i64()
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| wrong_type(path, "a 32-bit integer"))?,
            };
            // Negative int32s are sign-extended to 64 bits on the wire.
            put_varint_field(sink, tag, i64::from(int) as u64);
        }
        Kind::Int64 => {
            let int = match value {
                Value::Null => 0,
                _ => value
                    .as_i64()
                    .ok_or_else(|| wrong_type(path, "a 64-bit integer"))?,
            };
            put_varint_field(sink, tag, int as u64);
        }
        Kind::Double => {
            let float = match value {
                Value::Null => 0.0,
                _ => value.as_f64().ok_or_else(|| wrong_type(path, "a number"))?,
            };
            sink.put(&float.to_bits().to_le_bytes());
            sink.put_key(tag, WIRE_FIXED64);
        }
        Kind::Message | Kind::Map => {
            return Err(invalid(path, "a message where a scalar was expected"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- base64

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as Go's `encoding/json` writes `[]byte`.
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64_ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_value(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes standard padded base64 (Go's `base64.StdEncoding`, which skips `\r` and `\n`)
/// into `out` when given, returning the decoded length; `None` only measures.
fn base64_decode(text: &[u8], mut out: Option<&mut [u8]>) -> Result<usize, &'static str> {
    let mut quad = [0u32; 4];
    let mut filled = 0;
    let mut len = 0;
    let mut finished = false;
    for &c in text {
        if c == b'\r' || c == b'\n' {
            continue;
        }
        if finished {
            return Err("base64 data after padding");
        }
        quad[filled] = if c == b'=' {
            64
        } else {
            base64_value(c).ok_or("invalid base64 character")?
        };
        filled += 1;
        if filled < 4 {
            continue;
        }
        filled = 0;
        let produced = match (quad[2] == 64, quad[3] == 64) {
            (false, false) => 3,
            (false, true) => 2,
            (true, true) => 1,
            (true, false) => return Err("misplaced base64 padding"),
        };
        if quad[0] == 64 || quad[1] == 64 {
            return Err("misplaced base64 padding");
        }
        finished = produced < 3;
        let n = (quad[0] << 18) | (quad[1] << 12) | ((quad[2] & 63) << 6) | (quad[3] & 63);
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        if let Some(out) = out.as_deref_mut() {
            out.get_mut(len..len + produced)
                .ok_or("base64 output longer than measured")?
                .copy_from_slice(&bytes[..produced]);
        }
        len += produced;
    }
    if filled != 0 {
        return Err("base64 length is not a multiple of 4");
    }
    Ok(len)
}

// ---------------------------------------------------------------- time

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day count since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Seconds (and nanoseconds) since the epoch as RFC 3339 in UTC with `digits` fractional
/// digits (0 for Time, 6 for MicroTime; truncated, as Go's formatter does).
fn format_rfc3339(
    seconds: i64,
    nanos: i64,
    digits: u32,
    path: &Path,
) -> Result<String, ProtobufError> {
    if !(TIMESTAMP_SECONDS_MIN..=TIMESTAMP_SECONDS_MAX).contains(&seconds) {
        return Err(invalid(path, "timestamp outside years 1 to 9999"));
    }
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let second_of_day = seconds.rem_euclid(86_400);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
    if digits > 0 {
        let fraction = nanos / 10i64.pow(9 - digits);
        text.push_str(&format!(".{fraction:0width$}", width = digits as usize));
    }
    text.push('Z');
    Ok(text)
}

/// Parses RFC 3339 (`2024-01-02T03:04:05Z`, `...05.123456Z`, `...05+01:00`) into seconds
/// since the epoch and nanoseconds, as Go's `time.Parse(time.RFC3339, ...)` accepts it.
fn parse_rfc3339(text: &str) -> Result<(i64, i64), &'static str> {
    const MALFORMED: &str = "not an RFC 3339 time (2006-01-02T15:04:05Z)";
    let b = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Result<i64, &'static str> {
        let digits = b.get(range).ok_or(MALFORMED)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(MALFORMED);
        }
        Ok(digits
            .iter()
            .fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(i, c)| b.get(i) != Some(&c)) {
        return Err(MALFORMED);
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => return Err("month out of range"),
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 59 {
        return Err("date or time field out of range");
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while b.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start || end - start > 9 {
            return Err("fractional seconds must have 1 to 9 digits");
        }
        let fraction = number(start..end)?;
        nanos = fraction * 10i64.pow(9 - (end - start) as u32);
        i = end;
    }
    let offset_seconds = match b.get(i) {
        Some(b'Z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (number(i + 1..i + 3)?, number(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return Err("time zone offset out of range");
            }
            let offset = h * 3600 + m * 60;
            if sign == b'+' { offset } else { -offset }
        }
        _ => return Err(MALFORMED),
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset_seconds;
    Ok((seconds, nanos))
}

// ---------------------------------------------------------------- Go durations

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1.5ms`, `0s`.
fn format_go_duration(nanos: i64) -> String {
    let mut magnitude = nanos.unsigned_abs();
    let sign = if nanos < 0 { "-" } else { "" };
    if magnitude == 0 {
        return "0s".into();
    }
    let fraction = |value: u64, digits: u32| -> (String, u64) {
        let scale = 10u64.pow(digits);
        let mut frac = format!("{:0width$}", value % scale, width = digits as usize);
        while frac.ends_with('0') {
            frac.pop();
        }
        let frac = if frac.is_empty() {
            String::new()
        } else {
            format!(".{frac}")
        };
        (frac, value / scale)
    };
    if magnitude < 1_000_000_000 {
        let (digits, unit) = match magnitude {
            0..1_000 => (0, "ns"),
            1_000..1_000_000 => (3, "µs"),
            _ => (6, "ms"),
        };
        let (frac, whole) = fraction(magnitude, digits);
        return format!("{sign}{whole}{frac}{unit}");
    }
    let (frac, seconds_total) = fraction(magnitude, 9);
    magnitude = seconds_total;
    let mut text = format!("{}{frac}s", magnitude % 60);
    magnitude /= 60;
    if magnitude > 0 {
        text = format!("{}m{text}", magnitude % 60);
        magnitude /= 60;
        if magnitude > 0 {
            text = format!("{magnitude}h{text}");
        }
    }
    format!("{sign}{text}")
}

/// Go's `time.ParseDuration`: a signed sequence of decimal numbers with units
/// (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), or `0`.
fn parse_go_duration(text: &str) -> Result<i64, &'static str> {
    const MALFORMED: &str = "not a Go duration (1h2m3s)";
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(MALFORMED);
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let whole: u64 = if digits == 0 {
            0
        } else {
            rest[..digits].parse().map_err(|_| MALFORMED)?
        };
        rest = &rest[digits..];
        let (mut frac, mut frac_scale) = (0u64, 1u64);
        let mut frac_digits = 0;
        if let Some(after) = rest.strip_prefix('.') {
            frac_digits = after.bytes().take_while(u8::is_ascii_digit).count();
            for d in after[..frac_digits].bytes() {
                // Digits past nanosecond precision of the largest unit cannot matter.
                if frac_scale < 10u64.pow(18) {
                    frac = frac * 10 + u64::from(d - b'0');
                    frac_scale *= 10;
                }
            }
            rest = &after[frac_digits..];
        }
        if digits == 0 && frac_digits == 0 {
            return Err(MALFORMED);
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit: u64 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err("missing or unknown duration unit"),
        };
        rest = &rest[unit_len..];
        let part = whole
            .checked_mul(unit)
            .and_then(|n| n.checked_add((frac as u128 * unit as u128 / frac_scale as u128) as u64))
            .ok_or("duration overflows int64 nanoseconds")?;
        total = total
            .checked_add(part)
            .ok_or("duration overflows int64 nanoseconds")?;
    }
    if negative {
        if total > i64::MAX as u64 + 1 {
            return Err("duration overflows int64 nanoseconds");
        }
        Ok((total as i64).wrapping_neg())
    } else {
        i64::try_from(total).map_err(|_| "duration overflows int64 nanoseconds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Encodes, checks the one-buffer property, decodes, and checks nothing changed; the
    /// decoded JSON must also deserialize into k8s-openapi's type for the kind.
    fn round_trip(object: Value) -> Vec<u8> {
        let api_version = object["apiVersion"]
            .as_str()
            .expect("apiVersion")
            .to_string();
        let kind = object["kind"].as_str().expect("kind").to_string();
        let body = encode(&api_version, &kind, &object).expect("encode");
        assert_eq!(
            body.capacity(),
            body.len(),
            "one buffer of exactly the final size"
        );
        assert!(body.starts_with(&MAGIC));
        let (type_meta, decoded) = decode(&body).expect("decode");
        assert_eq!(type_meta, TypeMeta { api_version, kind });
        assert_eq!(decoded, object);
        body
    }

    fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> T {
        serde_json::from_value(value.clone()).expect("k8s-openapi accepts the decoded JSON")
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
    }

    #[test]
    fn pod_round_trips() {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "namespace": "default",
                "uid": "9b2a4f3e-0000-4000-8000-000000000001",
                "resourceVersion": "42",
                "generation": 1,
                "creationTimestamp": "2024-01-02T03:04:05Z",
                "labels": {"app": "web", "tier": ""},
                "annotations": {"note": "hello"},
                "finalizers": ["example.com/keep"],
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc",
                    "uid": "9b2a4f3e-0000-4000-8000-000000000002", "controller": true,
                    "blockOwnerDeletion": true
                }],
                "managedFields": [{
                    "manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                    "time": "2024-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}
                }]
            },
            "spec": {
                "containers": [{
                    "name": "nginx",
                    "image": "nginx:1.27",
                    "command": ["nginx", "-g", "daemon off;"],
                    "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"},
                              {"containerPort": 53, "protocol": "UDP"}],
                    "resources": {
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                        "requests": {"cpu": "250m", "memory": "64Mi"}
                    },
                    "env": [
                        {"name": "MODE", "value": "prod"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "initialDelaySeconds": 3, "periodSeconds": 10
                    },
                    "readinessProbe": {"tcpSocket": {"port": 80}},
                    "securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": false},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/nginx"}]
                }],
                "volumes": [
                    {"name": "config", "configMap": {"name": "nginx", "defaultMode": 420}},
                    {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}
                ],
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                     "effect": "NoExecute", "tolerationSeconds": 300}
                ],
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "automountServiceAccountToken": false,
                "hostNetwork": true
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "podIPs": [{"ip": "10.0.0.7"}],
                "startTime": "2024-01-02T03:04:06Z",
                "conditions": [{"type": "Ready", "status": "True",
                                // A non-pointer metav1.Time: never omitted, the zero prints null.
                                "lastProbeTime": null,
                                "lastTransitionTime": "2024-01-02T03:04:07Z"}]
            }
        });
        round_trip(pod.clone());
        let typed: k8s_openapi::api::core::v1::Pod = typed(&pod);
        assert_eq!(
            typed.spec.expect("spec").containers[0]
                .ports
                .as_ref()
                .map(Vec::len),
            Some(2)
        );
    }

    #[test]
    fn deployment_round_trips_with_zero_replicas_and_int_or_string() {
        let deployment = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            // Go prints the zero metav1.Time as null (Kubernetes 1.32, Go 1.23).
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                         "creationTimestamp": null},
            "spec": {
                // A pointer field set to zero must survive (the module doc's zero rule).
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"},
                             "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "revisionHistoryLimit": 10,
                "template": {
                    "metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                    // Container.resources is a struct value: never omitted.
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27",
                                             "resources": {}}]}
                }
            },
            "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2,
                       "conditions": [{"type": "Available", "status": "True",
                                       "lastUpdateTime": "2024-01-02T03:04:05Z",
                                       "lastTransitionTime": null,
                                       "reason": "MinimumReplicasAvailable"}]}
        });
        round_trip(deployment.clone());
        let _: k8s_openapi::api::apps::v1::Deployment = typed(&deployment);
    }

    #[test]
    fn secret_bytes_are_base64_in_json() {
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s1", "namespace": "default", "creationTimestamp": null},
            "type": "Opaque",
            // "b", "", binary bytes 00 ff fe, and a 5-byte value (one padding character).
            "data": {"a": "Yg==", "empty": "", "binary": "AP/+", "five": "aGVsbG8="},
            "immutable": true
        });
        let body = round_trip(secret);
        // The bytes travel raw: 00 ff fe appears in the body.
        assert!(body.windows(3).any(|w| w == [0x00, 0xff, 0xfe]));
    }

    #[test]
    fn invalid_base64_is_an_error_with_its_path() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": "s"}, "data": {"a": "not base64!"}});
        let error = encode("v1", "Secret", &secret).expect_err("invalid base64");
        assert!(
            matches!(&error, ProtobufError::InvalidValue { path, .. } if path == "<object>.data[\"a\"]"),
            "{error}"
        );
    }

    #[test]
    fn config_map_namespace_and_service_round_trip() {
        round_trip(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c1", "namespace": "default", "creationTimestamp": null},
            "data": {"k": "v", "multi": "line1\nline2"},
            "binaryData": {"bin": "AQID"}
        }));
        round_trip(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "x", "deletionTimestamp": "2030-12-31T23:59:59Z",
                         "creationTimestamp": null},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Terminating"}
        }));
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "web"},
                "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10"],
                "ports": [
                    {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP", "nodePort": 30080},
                    {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"}
                ],
                "sessionAffinity": "None"
            },
            "status": {"loadBalancer": {}}
        });
        round_trip(service.clone());
        let typed: k8s_openapi::api::core::v1::Service = typed(&service);
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let ports = typed.spec.expect("spec").ports.expect("ports");
        assert_eq!(
            ports[0].target_port,
            Some(IntOrString::String("http".into()))
        );
        assert_eq!(ports[1].target_port, Some(IntOrString::Int(9090)));
    }

    #[test]
    fn lease_round_trips_with_micro_time() {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "skerry-leader", "namespace": "kube-system",
                         "creationTimestamp": null},
            "spec": {
                "holderIdentity": "node-1",
                "leaseDurationSeconds": 15,
                "acquireTime": "2024-01-02T03:04:05.123456Z",
                "renewTime": "2024-01-02T03:04:20.000001Z",
                "leaseTransitions": 2
            }
        });
        let body = round_trip(lease.clone());
        let _: k8s_openapi::api::coordination::v1::Lease = typed(&lease);
        // MicroTime carries nanoseconds on the wire: tag 2, varint 123456000.
        let mut nanos = vec![0x10];
        push_varint(&mut nanos, 123_456_000);
        assert!(body.windows(nanos.len()).any(|w| w == nanos.as_slice()));
    }

    #[test]
    fn time_keeps_seconds_only_and_zero_time_is_null() {
        let with_fraction = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "x", "creationTimestamp": "2024-01-02T04:04:05.999+01:00"}});
        let body = encode("v1", "Namespace", &with_fraction).expect("encode");
        let (_, decoded) = decode(&body).expect("decode");
        // Go's metav1.Time is second precision and always written in UTC.
        assert_eq!(
            decoded["metadata"]["creationTimestamp"],
            "2024-01-02T03:04:05Z"
        );
        let with_null = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "x", "creationTimestamp": null}});
        let (_, decoded) =
            decode(&encode("v1", "Namespace", &with_null).expect("encode")).expect("decode");
        // ObjectMeta.creationTimestamp is a metav1.Time value: Go prints its zero as null
        // (the `omitzero` that drops it arrived after Kubernetes 1.32).
        assert_eq!(
            decoded["metadata"],
            json!({"name": "x", "creationTimestamp": null})
        );
    }

    #[test]
    fn status_and_watch_event_round_trip() {
        round_trip(json!({
            "apiVersion": "v1", "kind": "Status",
            "metadata": {"resourceVersion": "7"},
            "status": "Failure", "message": "pods \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "kind": "pods",
                        "causes": [{"reason": "FieldValueInvalid", "message": "bad", "field": "spec"}]},
            "code": 404
        }));
        // WatchEvent is not a kind with TypeMeta in its JSON; its object is embedded JSON.
        let event = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "ConfigMap",
                                                     "metadata": {"name": "c"}, "data": {"k": "v"}}});
        let body = encode("meta.k8s.io/v1", "WatchEvent", &event).expect("encode");
        let (_, decoded) = decode(&body).expect("decode");
        assert_eq!(decoded, event);
    }

    #[test]
    fn list_round_trips_and_items_carry_no_type_meta() {
        round_trip(json!({
            "apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "12", "continue": "abc", "remainingItemCount": 3},
            "items": [{"metadata": {"name": "a", "creationTimestamp": null}, "data": {"k": "v"}},
                      {"metadata": {"name": "b", "creationTimestamp": null}}]
        }));
        // Stored objects carry apiVersion/kind; inside a list they are accepted and dropped.
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {},
            "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]});
        let (_, decoded) =
            decode(&encode("v1", "ConfigMapList", &list).expect("encode")).expect("decode");
        assert_eq!(
            decoded["items"],
            json!([{"metadata": {"name": "a", "creationTimestamp": null}}])
        );
    }

    /// The envelope byte for byte as kubectl 1.32 writes it (see the captured fixture): the
    /// two empty strings after `raw` included.
    #[test]
    fn envelope_matches_kubernetes_bytes() {
        let body = encode("v1", "Namespace", &json!({"metadata": {"name": "x"}})).expect("encode");
        let mut expected = b"k8s\0".to_vec();
        expected.extend_from_slice(&[0x0a, 0x0f, 0x0a, 0x02]);
        expected.extend_from_slice(b"v1");
        expected.extend_from_slice(&[0x12, 0x09]);
        expected.extend_from_slice(b"Namespace");
        // raw: Namespace{metadata(1): ObjectMeta{name(1): "x"}}
        expected.extend_from_slice(&[0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'x']);
        expected.extend_from_slice(&[0x1a, 0x00, 0x22, 0x00]);
        assert_eq!(body, expected);
        assert_eq!(body.capacity(), body.len());
    }

    /// Captured from the real kubectl 1.32 (`kubectl --server http://127.0.0.1:PORT create
    /// namespace x` against gen/capture_kubectl.py).
    #[test]
    fn decodes_kubectl_create_namespace() {
        let body = fixture("kubectl-create-namespace.pb");
        let (type_meta, object) = decode(&body).expect("kubectl's body decodes");
        assert_eq!(
            type_meta,
            TypeMeta {
                api_version: "v1".into(),
                kind: "Namespace".into()
            }
        );
        // Expected JSON reasoned from the Go tags (k8s.io/api core/v1 and apimachinery
        // meta/v1 types.go): kubectl (gogo) writes every non-pointer field. `generateName`,
        // `namespace`, ... are `string ,omitempty`: dropped when "". `generation` is
        // `int64 ,omitempty`: dropped at 0. `creationTimestamp` is a metav1.Time value:
        // a struct, never omitted, its zero prints null. `spec` and `status` are struct
        // values: printed, empty. This is json.Marshal of the decoded v1.Namespace.
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "x", "creationTimestamp": null},
                   "spec": {}, "status": {}})
        );
        let _: k8s_openapi::api::core::v1::Namespace = typed(&object);
    }

    /// `kubectl create deployment web --image=nginx:1.27 --replicas=0 --port=80`, decoded to
    /// exactly json.Marshal of the apps/v1 Deployment gogo fills. Expected JSON reasoned
    /// from the Go tags (k8s.io/api apps/v1 and core/v1 types.go), field by field:
    /// `replicas` is `*int32`: kept at 0. `paused`, `minReadySeconds` are `omitempty`
    /// values: dropped at zero. `strategy` and `status` are struct values: `{}`.
    /// `template.metadata.creationTimestamp` (metav1.Time value): null. PodSpec's bools,
    /// strings and the `hostIPC`-style flags are `omitempty`: dropped. `resources` is a
    /// ResourceRequirements value: `{}`. `containerPort` has no `omitempty`: kept;
    /// `hostPort` (0) and `protocol` ("") are `omitempty`: dropped. `containers` arrived;
    /// no absent non-`omitempty` slice remains.
    #[test]
    fn decodes_kubectl_create_deployment_exactly() {
        let (type_meta, deployment) =
            decode(&fixture("kubectl-create-deployment.pb")).expect("decode");
        assert_eq!(type_meta.kind, "Deployment");
        assert_eq!(
            deployment,
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": "web",
                    "namespace": "default",
                    "labels": {"app": "web"},
                    "creationTimestamp": null
                },
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                        "spec": {"containers": [{
                            "name": "nginx",
                            "image": "nginx:1.27",
                            "ports": [{"containerPort": 80}],
                            "resources": {}
                        }]}
                    },
                    "strategy": {}
                },
                "status": {}
            })
        );
        let _: k8s_openapi::api::apps::v1::Deployment = typed(&deployment);
    }

    /// `kubectl create secret generic s1 --from-literal=a=b`: `data` is
    /// `map[string][]byte` (base64 in JSON), `type` a `string ,omitempty` ("" from kubectl:
    /// dropped), `immutable` a `*bool` (nil: absent). Expected JSON reasoned from the Go
    /// tags as above.
    #[test]
    fn decodes_kubectl_create_secret_exactly() {
        let (_, secret) = decode(&fixture("kubectl-create-secret.pb")).expect("decode");
        assert_eq!(
            secret,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s1", "namespace": "default", "creationTimestamp": null},
                "data": {"a": "Yg=="}
            })
        );
        let _: k8s_openapi::api::core::v1::Secret = typed(&secret);
    }

    /// Go's rules on fields the wire did not carry (another encoder than gogo, or skerry's
    /// own): a non-`omitempty` scalar prints its zero, a non-`omitempty` slice `null`, an
    /// absent struct value its zero value with the specials' own zero forms.
    #[test]
    fn absent_fields_print_as_go_prints_their_zero() {
        // Role.rules is `[]PolicyRule json:"rules"` (no omitempty): nil prints null.
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                          "metadata": {"name": "r"}});
        let (_, decoded) =
            decode(&encode("rbac.authorization.k8s.io/v1", "Role", &role).expect("encode"))
                .expect("decode");
        assert_eq!(decoded["rules"], Value::Null);
        assert!(decoded.as_object().expect("object").contains_key("rules"));
        // ServicePort: `port` int32 without omitempty prints 0; `targetPort` is an
        // IntOrString value (a struct): its zero prints 0; `nodePort` (omitempty) is absent.
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                             "spec": {"ports": [{"name": "p"}]}});
        let (_, decoded) =
            decode(&encode("v1", "Service", &service).expect("encode")).expect("decode");
        assert_eq!(
            decoded["spec"]["ports"][0],
            json!({"name": "p", "port": 0, "targetPort": 0})
        );
        assert_eq!(decoded["status"], json!({"loadBalancer": {}}));
        // ResourceFieldSelector.divisor is a Quantity value: its zero prints "0".
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "env": [{"name": "E", "valueFrom":
                {"resourceFieldRef": {"resource": "limits.cpu"}}}]}]}});
        let (_, decoded) = decode(&encode("v1", "Pod", &pod).expect("encode")).expect("decode");
        assert_eq!(
            decoded["spec"]["containers"][0]["env"][0]["valueFrom"]["resourceFieldRef"],
            json!({"resource": "limits.cpu", "divisor": "0"})
        );
        // Pointers keep their zero; omitempty values drop theirs.
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "stdin": false, "tty": true,
                                     "securityContext": {"privileged": false}}],
                     "hostIPC": false, "automountServiceAccountToken": false}});
        let (_, decoded) = decode(&encode("v1", "Pod", &pod).expect("encode")).expect("decode");
        let spec = &decoded["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert!(spec.get("hostIPC").is_none());
        let container = &spec["containers"][0];
        assert!(container.get("stdin").is_none());
        assert_eq!(container["tty"], true);
        assert_eq!(container["securityContext"], json!({"privileged": false}));
        assert_eq!(decoded["status"], json!({}));
    }

    #[test]
    fn unknown_proto_field_is_an_error_with_its_path() {
        // Namespace{metadata: ObjectMeta{name: "x", field 99: varint 1}}
        let mut body = b"k8s\0".to_vec();
        body.extend_from_slice(&[0x0a, 0x0f, 0x0a, 0x02]);
        body.extend_from_slice(b"v1");
        body.extend_from_slice(&[0x12, 0x09]);
        body.extend_from_slice(b"Namespace");
        body.extend_from_slice(&[0x12, 0x08, 0x0a, 0x06, 0x0a, 0x01, b'x', 0x98, 0x06, 0x01]);
        assert_eq!(
            decode(&body),
            Err(ProtobufError::UnknownField {
                path: "<object>.metadata".into(),
                tag: 99
            })
        );
    }

    #[test]
    fn unknown_json_field_and_wrong_types_are_errors_with_paths() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "imagePullPolice": "Always"}]}});
        assert_eq!(
            encode("v1", "Pod", &pod),
            Err(ProtobufError::UnknownJsonField {
                path: "<object>.spec.containers[0].imagePullPolice".into()
            })
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": "80"}]}]}});
        assert_eq!(
            encode("v1", "Pod", &pod),
            Err(ProtobufError::WrongType {
                path: "<object>.spec.containers[0].ports[0].containerPort".into(),
                expected: "a 32-bit integer"
            })
        );
        assert!(matches!(
            encode("v1", "Gadget", &json!({})),
            Err(ProtobufError::UnknownKind { .. })
        ));
    }

    #[test]
    fn malformed_bodies_are_errors() {
        assert_eq!(decode(b"{}"), Err(ProtobufError::MissingMagic));
        // A length prefix that runs past the end of the body.
        let truncated = [b'k', b'8', b's', 0, 0x0a, 0x7f, 0x0a];
        assert!(matches!(
            decode(&truncated),
            Err(ProtobufError::Malformed { .. })
        ));
        // An unsupported content encoding.
        let mut gzip = b"k8s\0".to_vec();
        gzip.extend_from_slice(&[0x1a, 0x04]);
        gzip.extend_from_slice(b"gzip");
        assert_eq!(
            decode(&gzip),
            Err(ProtobufError::UnsupportedEncoding("gzip".into()))
        );
    }

    /// An envelope whose WatchEvent object is another envelope, `levels` deep.
    fn nested_watch_events(levels: usize) -> Vec<u8> {
        let mut body =
            encode("v1", "Namespace", &json!({"metadata": {"name": "x"}})).expect("encode");
        for _ in 0..levels {
            let mut raw_extension = vec![0x0a];
            push_len(&mut raw_extension, &body);
            let mut event = vec![0x0a, 0x05];
            event.extend_from_slice(b"ADDED");
            event.push(0x12);
            push_len(&mut event, &raw_extension);
            let mut type_meta = vec![0x0a, 0x0e];
            type_meta.extend_from_slice(b"meta.k8s.io/v1");
            type_meta.extend_from_slice(&[0x12, 0x0a]);
            type_meta.extend_from_slice(b"WatchEvent");
            let mut unknown = b"k8s\0".to_vec();
            unknown.push(0x0a);
            push_len(&mut unknown, &type_meta);
            unknown.push(0x12);
            push_len(&mut unknown, &event);
            body = unknown;
        }
        body
    }

    fn push_varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    fn push_len(out: &mut Vec<u8>, bytes: &[u8]) {
        push_varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }

    #[test]
    fn embedded_protobuf_objects_decode_and_nesting_is_bounded() {
        let (_, event) = decode(&nested_watch_events(1)).expect("one level decodes");
        assert_eq!(
            event,
            json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": "x", "creationTimestamp": null},
                                               "spec": {}, "status": {}}})
        );
        assert!(matches!(
            decode(&nested_watch_events(NESTING_DEPTH_MAX)),
            Err(ProtobufError::TooDeep { .. })
        ));
    }

    #[test]
    fn rfc3339_and_go_durations() {
        let root = Path::ROOT;
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok((0, 0)));
        assert_eq!(
            parse_rfc3339("2024-02-29T23:59:59.5Z"),
            Ok((1_709_251_199, 500_000_000))
        );
        assert_eq!(
            parse_rfc3339("0001-01-01T00:00:00Z"),
            Ok((TIMESTAMP_SECONDS_MIN, 0))
        );
        assert_eq!(
            parse_rfc3339("9999-12-31T23:59:59Z"),
            Ok((TIMESTAMP_SECONDS_MAX, 0))
        );
        assert!(parse_rfc3339("2023-02-29T00:00:00Z").is_err());
        assert!(parse_rfc3339("2024-01-02 03:04:05Z").is_err());
        assert!(parse_rfc3339("2024-01-02T03:04:05").is_err());
        assert_eq!(
            format_rfc3339(1_709_251_199, 0, 0, &root).as_deref(),
            Ok("2024-02-29T23:59:59Z")
        );
        assert_eq!(
            format_rfc3339(-1, 999_999_999, 6, &root).as_deref(),
            Ok("1969-12-31T23:59:59.999999Z")
        );
        // Go's time.Duration.String() and time.ParseDuration.
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (300_000_000, "300ms"),
            (1_500_000_000, "1.5s"),
            (3_723_000_000_000, "1h2m3s"),
            (3_600_000_000_000, "1h0m0s"),
            (-5_400_000_000_000, "-1h30m0s"),
        ] {
            assert_eq!(format_go_duration(nanos), text);
            assert_eq!(parse_go_duration(text), Ok(nanos), "{text}");
        }
        assert_eq!(parse_go_duration("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse_go_duration("10us"), Ok(10_000));
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("3000000h").is_err());
        assert_eq!(format_go_duration(i64::MIN), "-2562047h47m16.854775808s");
    }

    #[test]
    fn base64_matches_go_std_encoding() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
        ] {
            assert_eq!(base64_encode(bytes), text);
            let mut out = vec![0; bytes.len()];
            assert_eq!(
                base64_decode(text.as_bytes(), Some(&mut out)),
                Ok(bytes.len())
            );
            assert_eq!(out, bytes);
        }
        assert_eq!(base64_decode(b"Zm9v\r\nYg==", None), Ok(4));
        assert!(base64_decode(b"Zg", None).is_err());
        assert!(base64_decode(b"Zg==Zg==", None).is_err());
        assert!(base64_decode(b"Z===", None).is_err());
    }

    proptest! {
        /// Hostile input never panics, with or without the magic.
        #[test]
        fn random_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = decode(&with_magic);
        }

        /// Corrupting one byte of a real body never panics.
        #[test]
        fn mutated_kubectl_bodies_never_panic(index in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut body = fixture("kubectl-create-deployment.pb");
            let i = index.index(body.len());
            body[i] = byte;
            let _ = decode(&body);
        }

        /// Arbitrary labels and data survive a round trip. (An empty map has no wire form:
        /// it decodes as absent, as Go's `omitempty` shows it; so does a zero `generation`,
        /// an `int64` with `omitempty`.)
        #[test]
        fn config_maps_round_trip(
            labels in proptest::collection::btree_map("[a-z./-]{1,20}", "[ -~]{0,20}", 1..5),
            data in proptest::collection::btree_map("[a-zA-Z0-9._-]{1,20}", any::<String>(), 1..5),
            generation in any::<i64>(),
        ) {
            let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "labels": labels, "generation": generation,
                             "creationTimestamp": null},
                "data": data});
            let body = encode("v1", "ConfigMap", &object).expect("encode");
            prop_assert_eq!(body.capacity(), body.len());
            let (_, decoded) = decode(&body).expect("decode");
            if generation == 0 {
                object["metadata"].as_object_mut().expect("metadata").remove("generation");
            }
            prop_assert_eq!(decoded, object);
        }

        /// Decoding is idempotent under Go's rules: an object decoded from protobuf, encoded
        /// again and decoded again is unchanged (zeros dropped once stay dropped, zero values
        /// built once are encoded and come back the same).
        #[test]
        fn go_json_is_a_fixed_point(replicas in 0i32..3, paused in any::<bool>(), port in 0i32..3) {
            let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {"replicas": replicas, "paused": paused, "selector": {},
                         "template": {"spec": {"containers": [
                             {"name": "c", "ports": [{"containerPort": port}]}]}}}});
            let once = decode(&encode("apps/v1", "Deployment", &deployment).expect("encode"))
                .expect("decode").1;
            let twice = decode(&encode("apps/v1", "Deployment", &once).expect("encode"))
                .expect("decode").1;
            prop_assert_eq!(&once["spec"]["replicas"], &json!(replicas));
            prop_assert_eq!(once["spec"].get("paused").is_some(), paused);
            prop_assert_eq!(&once["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"], &json!(port));
            prop_assert_eq!(twice, once);
        }
    }
}
