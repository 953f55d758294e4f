//! `CachedObject`: one object as the watch cache holds it, serialized at most once per
//! encoding and shared by every reader.
//!
//! This carries `docs/tricks.md` #5, serialize once per watch event (Kubernetes'
//! cachingObject): an event's object is encoded lazily, the first time any watcher needs it
//! in a given [`Encoding`], and the bytes (and the whole watch frame around them) are
//! memoized per encoding, so a hundred JSON watchers and a hundred protobuf watchers of one
//! event cost two serializations and two hundred reference-count bumps. The deep copy is
//! lazy too: readers share one `Arc`, and [`CachedObject::make_mut`] copies only when the
//! object is shared, as `Arc::make_mut` does.
//!
//! Watch frames, in Kubernetes' two streaming layouts:
//! - JSON: `{"type":"ADDED","object":{...}}\n`, one event per line;
//! - protobuf (`application/vnd.kubernetes.protobuf;stream=watch`): a 4-byte big-endian
//!   length, then a `metav1.WatchEvent` written by the *raw* protobuf serializer (no
//!   `k8s\0` magic, no `runtime.Unknown`): field 1 `type` (string), field 2 `object` (a
//!   `RawExtension`, whose field 1 `raw` holds the object as the normal protobuf serializer
//!   writes it, magic and envelope included). This is apimachinery's
//!   `LengthDelimitedFramer` around `streaming.Encoder`, which client-go's watch decoder
//!   reads back.
//!
//! Invariants: the memoized bytes are always the encoding of the current value (a mutation
//! through [`CachedObject::make_mut`] drops them); `metadata.resourceVersion` is already set
//! (objects are built from the store only through [`crate::storage::decode`]); a frame is
//! always a whole frame of its encoding (an object that cannot be encoded yields an ERROR
//! frame carrying a 500 Status, never a truncated or foreign frame).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use skerry_api::protobuf::{self, ProtobufError};

/// A wire encoding of objects and watch frames. Each memo holds [`Encoding::COUNT`] slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// `application/json`: newline-delimited JSON events.
    #[default]
    Json,
    /// `application/vnd.kubernetes.protobuf`: length-prefixed `WatchEvent` messages.
    Protobuf,
}

impl Encoding {
    /// How many encodings a memo holds.
    pub const COUNT: usize = 2;

    /// This encoding's slot in a memo.
    pub(crate) fn index(self) -> usize {
        match self {
            Encoding::Json => 0,
            Encoding::Protobuf => 1,
        }
    }

    /// The `Content-Type` of a watch response in this encoding (Kubernetes' stream
    /// serializer media types).
    pub fn watch_content_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Protobuf => PROTOBUF_WATCH_CONTENT_TYPE,
        }
    }
}

/// The media type of a protobuf watch stream, as kube-apiserver labels it.
pub const PROTOBUF_WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Why an object could not be encoded. Cloneable, since the outcome is memoized and shared by
/// every watcher of the object.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Protobuf needs the object's `apiVersion` and `kind` for its envelope and schema.
    #[error("object has no apiVersion and kind to encode it as protobuf")]
    MissingTypeMeta,
    /// The object does not fit its protobuf schema (or its kind has none).
    #[error("encoding protobuf")]
    Protobuf(#[source] Arc<ProtobufError>),
}

/// Encodes a whole object (one carrying `apiVersion` and `kind`) in `encoding`.
pub fn encode_value(encoding: Encoding, value: &Value) -> Result<Bytes, EncodeError> {
    match encoding {
        Encoding::Json => Ok(Bytes::from(
            serde_json::to_vec(value).expect("a serde_json::Value always serializes"),
        )),
        Encoding::Protobuf => {
            let (Some(api_version), Some(kind)) =
                (value["apiVersion"].as_str(), value["kind"].as_str())
            else {
                return Err(EncodeError::MissingTypeMeta);
            };
            protobuf::encode(api_version, kind, value)
                .map(Bytes::from)
                .map_err(|e| EncodeError::Protobuf(Arc::new(e)))
        }
    }
}

/// A watch frame of `encoding` around already-encoded object bytes.
pub fn watch_frame(encoding: Encoding, event_type: &str, object: &[u8]) -> Bytes {
    match encoding {
        Encoding::Json => json_frame(event_type, object),
        Encoding::Protobuf => protobuf_frame(event_type, object),
    }
}

/// An ERROR frame of `encoding` carrying `status` (a `Status` object). Should the Status
/// itself not encode, a bare 500 Status saying why is sent instead.
pub fn error_frame(encoding: Encoding, status: &Value) -> Bytes {
    let bytes = encode_value(encoding, status).unwrap_or_else(|e| {
        let fallback = internal_status(&format!("encoding a Status: {e}"));
        encode_value(encoding, &fallback).expect("a bare Status always encodes")
    });
    watch_frame(encoding, "ERROR", &bytes)
}

/// A 500 `Status` with `message`, in the shape `ApiError::to_status` gives.
fn internal_status(message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": "InternalError", "code": 500})
}

/// The type of a watch event, as Kubernetes spells it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// How many event types a frame memo holds.
    const COUNT: usize = 3;

    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    fn index(self) -> usize {
        match self {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
        }
    }
}

/// One object, shared and memoized. Cloning is a reference-count bump.
#[derive(Clone)]
pub struct CachedObject {
    inner: Arc<Inner>,
}

struct Inner {
    value: Value,
    /// The object alone, per encoding (or why it does not encode). `OnceLock`: many watcher
    /// streams may ask at once and exactly one of them encodes; the others wait for and
    /// share its outcome.
    encoded: [OnceLock<Result<Bytes, EncodeError>>; Encoding::COUNT],
    /// Whole watch frames per encoding and event type (see the module doc for layouts).
    frames: [[OnceLock<Bytes>; EventType::COUNT]; Encoding::COUNT],
    /// Counts encodings for the cache's metrics; `None` for objects outside a cache.
    serializations: Option<Arc<AtomicU64>>,
}

impl Clone for Inner {
    /// A copy for mutation: the value is deep-copied and the memos start empty, since they
    /// would describe the value before the mutation.
    fn clone(&self) -> Self {
        Inner::new(self.value.clone(), self.serializations.clone())
    }
}

impl Inner {
    fn new(value: Value, serializations: Option<Arc<AtomicU64>>) -> Self {
        Self {
            value,
            encoded: Default::default(),
            frames: Default::default(),
            serializations,
        }
    }
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

/// Equal when the objects are equal, shared or not.
impl PartialEq for CachedObject {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.value() == other.value()
    }
}

impl CachedObject {
    /// Wraps a decoded object. `serializations` is bumped once per encoding produced.
    pub fn new(value: Value, serializations: Option<Arc<AtomicU64>>) -> Self {
        Self {
            inner: Arc::new(Inner::new(value, serializations)),
        }
    }

    /// The object.
    pub fn value(&self) -> &Value {
        &self.inner.value
    }

    /// The object for mutation: deep-copied first if anyone else holds it, and its memoized
    /// encodings dropped. Readers that never mutate never pay for a copy.
    pub fn make_mut(&mut self) -> &mut Value {
        let inner = Arc::make_mut(&mut self.inner);
        inner.encoded = Default::default();
        inner.frames = Default::default();
        &mut inner.value
    }

    /// The object as an owned value: moved out if this is the last reference, else copied.
    pub fn into_value(self) -> Value {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner.value,
            Err(shared) => shared.value.clone(),
        }
    }

    /// Whether two handles share one object (and so one set of encodings).
    pub fn ptr_eq(&self, other: &CachedObject) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The object in `encoding`, produced once and shared afterwards (a failure too is
    /// produced once). JSON never fails; protobuf fails for objects outside its schema.
    pub fn encode(&self, encoding: Encoding) -> Result<Bytes, EncodeError> {
        self.inner.encoded[encoding.index()]
            .get_or_init(|| {
                if let Some(counter) = &self.inner.serializations {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                encode_value(encoding, &self.inner.value)
            })
            .clone()
    }

    /// The object as JSON.
    pub fn json(&self) -> Bytes {
        self.encode(Encoding::Json)
            .expect("a serde_json::Value always serializes")
    }

    /// The watch frame carrying this object as an event of `event_type`, built once per
    /// encoding and type: `{"type":"ADDED","object":{...}}\n` for JSON, a length-prefixed
    /// `WatchEvent` for protobuf. An object that does not encode yields an ERROR frame with
    /// a 500 Status instead, so the client hears why rather than miss the event silently.
    pub fn frame(&self, event_type: EventType, encoding: Encoding) -> Bytes {
        self.inner.frames[encoding.index()][event_type.index()]
            .get_or_init(|| match self.encode(encoding) {
                Ok(bytes) => watch_frame(encoding, event_type.as_str(), &bytes),
                Err(e) => error_frame(
                    encoding,
                    &internal_status(&format!(
                        "{} {:?}: {e}: {}",
                        event_type.as_str(),
                        self.name(),
                        std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
                    )),
                ),
            })
            .clone()
    }

    /// `metadata.namespace`; `None` for cluster-scoped objects.
    pub fn namespace(&self) -> Option<&str> {
        self.inner.value["metadata"]["namespace"].as_str()
    }

    /// `metadata.name`; empty if the object has none.
    pub fn name(&self) -> &str {
        self.inner.value["metadata"]["name"].as_str().unwrap_or("")
    }

    /// `metadata.resourceVersion` as a number; 0 if absent or malformed.
    pub fn resource_version(&self) -> i64 {
        self.inner.value["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The labels, in key order. Values that are not strings are skipped.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.inner.value["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flat_map(|labels| labels.iter())
            .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.inner.value["metadata"]["labels"][key].as_str()
    }

    /// A copy whose `metadata.resourceVersion` is `resource_version` (a deleted object's last
    /// state carries the delete's revision, as Kubernetes sends it).
    pub fn with_resource_version(&self, resource_version: i64) -> CachedObject {
        let mut copy = CachedObject {
            inner: Arc::new(Inner::new(
                self.inner.value.clone(),
                self.inner.serializations.clone(),
            )),
        };
        set_resource_version(copy.make_mut(), resource_version);
        copy
    }
}

/// Sets `metadata.resourceVersion`, creating `metadata` if needed.
pub(crate) fn set_resource_version(value: &mut Value, resource_version: i64) {
    if let Value::Object(map) = value {
        let metadata = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if !metadata.is_object() {
            *metadata = Value::Object(Default::default());
        }
        if let Value::Object(metadata) = metadata {
            metadata.insert(
                "resourceVersion".into(),
                Value::String(resource_version.to_string()),
            );
        }
    }
}

/// One JSON watch frame around already-encoded object bytes.
pub(crate) fn json_frame(event_type: &str, object: &[u8]) -> Bytes {
    const HEAD: &[u8] = b"{\"type\":\"";
    const MIDDLE: &[u8] = b"\",\"object\":";
    const TAIL: &[u8] = b"}\n";
    let mut frame = BytesMut::with_capacity(
        HEAD.len() + event_type.len() + MIDDLE.len() + object.len() + TAIL.len(),
    );
    frame.put_slice(HEAD);
    frame.put_slice(event_type.as_bytes());
    frame.put_slice(MIDDLE);
    frame.put_slice(object);
    frame.put_slice(TAIL);
    frame.freeze()
}

/// One protobuf watch frame around an object already encoded by [`protobuf::encode`]:
/// `u32` big-endian length, then `WatchEvent{type = 1, object = 2: RawExtension{raw = 1}}`.
///
/// # Panics
/// If the frame would exceed 4 GiB, which the store's request size limit rules out.
pub(crate) fn protobuf_frame(event_type: &str, raw: &[u8]) -> Bytes {
    /// Field 1 (`type`, `raw`) and field 2 (`object`), wire type 2 (length-delimited).
    const FIELD_1_BYTES: u8 = 1 << 3 | 2;
    const FIELD_2_BYTES: u8 = 2 << 3 | 2;
    let raw_extension_len = 1 + varint_len(raw.len()) + raw.len();
    let event_len = 1
        + varint_len(event_type.len())
        + event_type.len()
        + 1
        + varint_len(raw_extension_len)
        + raw_extension_len;
    let prefix = u32::try_from(event_len).expect("a watch event is smaller than 4 GiB");
    let mut frame = BytesMut::with_capacity(4 + event_len);
    frame.put_u32(prefix);
    frame.put_u8(FIELD_1_BYTES);
    put_varint(&mut frame, event_type.len());
    frame.put_slice(event_type.as_bytes());
    frame.put_u8(FIELD_2_BYTES);
    put_varint(&mut frame, raw_extension_len);
    frame.put_u8(FIELD_1_BYTES);
    put_varint(&mut frame, raw.len());
    frame.put_slice(raw);
    assert_eq!(frame.len(), 4 + event_len, "protobuf frame length mismatch");
    frame.freeze()
}

/// Bytes of `value` as a protobuf varint.
fn varint_len(mut value: usize) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn put_varint(out: &mut BytesMut, mut value: usize) {
    while value >= 0x80 {
        // Truncation intended: the low seven bits, with the continuation bit set.
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// A decoded protobuf watch frame: the event type and the `raw` object bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtobufEvent {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    pub event_type: String,
    /// The object, as [`protobuf::encode`] wrote it (magic and envelope included).
    pub raw: Bytes,
}

/// Why bytes are not a protobuf watch frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf watch frame: {0}")]
pub struct FrameError(pub &'static str);

/// Splits one frame off the front of `buffer`: `Ok(None)` when it does not yet hold a whole
/// frame (read more), else the event and the bytes it used. The inverse of the protobuf
/// branch of [`watch_frame`], for clients and tests; fields it does not know are skipped,
/// as gogo-protobuf does.
pub fn decode_protobuf_frame(buffer: &[u8]) -> Result<Option<(ProtobufEvent, usize)>, FrameError> {
    let Some((prefix, rest)) = buffer.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    let Some(mut message) = rest.get(..len) else {
        return Ok(None);
    };
    let mut event_type = None;
    let mut raw = Bytes::new();
    while !message.is_empty() {
        let (field, rest) = read_field(message)?;
        message = rest;
        match (field.number, field.bytes) {
            (1, Some(value)) => {
                let text =
                    std::str::from_utf8(value).map_err(|_| FrameError("type is not UTF-8"))?;
                event_type = Some(text.to_string());
            }
            (2, Some(mut extension)) => {
                while !extension.is_empty() {
                    let (field, rest) = read_field(extension)?;
                    extension = rest;
                    if let (1, Some(value)) = (field.number, field.bytes) {
                        raw = Bytes::copy_from_slice(value);
                    }
                }
            }
            _ => {}
        }
    }
    let event_type = event_type.ok_or(FrameError("no type"))?;
    Ok(Some((ProtobufEvent { event_type, raw }, 4 + len)))
}

/// One field of a message.
struct Field<'a> {
    number: u64,
    /// The value of a length-delimited field; `None` for a skipped varint or fixed field.
    bytes: Option<&'a [u8]>,
}

/// The first field of `input`, and what follows it.
fn read_field(input: &[u8]) -> Result<(Field<'_>, &[u8]), FrameError> {
    let (key, rest) = read_varint(input)?;
    let number = key >> 3;
    let skipped = |rest| {
        (
            Field {
                number,
                bytes: None,
            },
            rest,
        )
    };
    match key & 7 {
        0 => read_varint(rest).map(|(_, rest)| skipped(rest)),
        1 => rest
            .get(8..)
            .map(skipped)
            .ok_or(FrameError("truncated fixed64")),
        2 => {
            let (len, rest) = read_varint(rest)?;
            let len = usize::try_from(len).map_err(|_| FrameError("length overflows"))?;
            if len > rest.len() {
                return Err(FrameError("length past the end"));
            }
            let (value, rest) = rest.split_at(len);
            Ok((
                Field {
                    number,
                    bytes: Some(value),
                },
                rest,
            ))
        }
        5 => rest
            .get(4..)
            .map(skipped)
            .ok_or(FrameError("truncated fixed32")),
        _ => Err(FrameError("unsupported wire type")),
    }
}

/// A varint of at most 10 bytes.
fn read_varint(input: &[u8]) -> Result<(u64, &[u8]), FrameError> {
    /// The longest varint: 64 bits at 7 per byte.
    const VARINT_BYTES_MAX: usize = 10;
    let mut value = 0u64;
    for (i, byte) in input.iter().take(VARINT_BYTES_MAX).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, &input[i + 1..]));
        }
    }
    Err(FrameError("bad varint"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(rv: i64) -> Value {
        json!({"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": "web", "namespace": "default",
                            "resourceVersion": rv.to_string(), "labels": {"app": "web"}}})
    }

    #[test]
    fn encodes_once_and_shares_the_bytes() {
        let counter = Arc::new(AtomicU64::new(0));
        let object = CachedObject::new(pod(5), Some(counter.clone()));
        let readers: Vec<CachedObject> = (0..50).map(|_| object.clone()).collect();
        let first = readers[0].json();
        for r in &readers {
            let again = r.frame(EventType::Modified, Encoding::Json);
            assert!(again.ends_with(b"}\n"));
            assert_eq!(
                r.json().as_ptr(),
                first.as_ptr(),
                "the same buffer, not a copy"
            );
        }
        assert_eq!(counter.load(Ordering::Relaxed), 1);
        let frame: Value = serde_json::from_slice(&object.frame(EventType::Added, Encoding::Json))
            .expect("frame is JSON");
        assert_eq!(frame["type"], "ADDED");
        assert_eq!(frame["object"], pod(5));
    }

    #[test]
    fn copies_only_when_mutated_and_shared() {
        let counter = Arc::new(AtomicU64::new(0));
        let shared = CachedObject::new(pod(5), Some(counter.clone()));
        let _ = shared.json();
        let mut mine = shared.clone();
        assert!(mine.ptr_eq(&shared));
        mine.make_mut()["metadata"]["labels"]["app"] = json!("db");
        assert!(
            !mine.ptr_eq(&shared),
            "a shared object is copied before mutation"
        );
        assert_eq!(
            shared.label("app"),
            Some("web"),
            "other readers see no change"
        );
        assert_eq!(mine.label("app"), Some("db"));
        let encoded: Value = serde_json::from_slice(&mine.json()).expect("json");
        assert_eq!(
            encoded["metadata"]["labels"]["app"], "db",
            "stale bytes were dropped"
        );
        assert_eq!(counter.load(Ordering::Relaxed), 2);

        let mut alone = CachedObject::new(pod(6), None);
        let before = Arc::as_ptr(&alone.inner);
        alone.make_mut()["spec"] = json!({});
        assert_eq!(
            Arc::as_ptr(&alone.inner),
            before,
            "a sole owner mutates in place"
        );
    }

    #[test]
    fn accessors_read_metadata() {
        let o = CachedObject::new(pod(7), None);
        assert_eq!(o.namespace(), Some("default"));
        assert_eq!(o.name(), "web");
        assert_eq!(o.resource_version(), 7);
        assert_eq!(o.labels().collect::<Vec<_>>(), vec![("app", "web")]);
        assert_eq!(o.with_resource_version(9).resource_version(), 9);
        assert_eq!(o.resource_version(), 7);
    }

    /// Reference: apimachinery's `LengthDelimitedFramer` (4-byte big-endian length) around
    /// a raw `metav1.WatchEvent` {1: type, 2: RawExtension {1: raw}}.
    #[test]
    fn protobuf_frame_layout_is_kubernetes_watch_event() {
        let frame = watch_frame(Encoding::Protobuf, "ADDED", b"xyz");
        let mut expected = vec![0, 0, 0, 14, 0x0a, 5];
        expected.extend_from_slice(b"ADDED");
        expected.extend_from_slice(&[0x12, 5, 0x0a, 3]);
        expected.extend_from_slice(b"xyz");
        assert_eq!(&frame[..], &expected[..]);
        // Lengths past 127 take multi-byte varints.
        let raw = vec![7u8; 300];
        let frame = watch_frame(Encoding::Protobuf, "MODIFIED", &raw);
        let (event, used) = decode_protobuf_frame(&frame)
            .expect("well-formed")
            .expect("whole");
        assert_eq!(used, frame.len());
        assert_eq!(event.event_type, "MODIFIED");
        assert_eq!(&event.raw[..], &raw[..]);
    }

    #[test]
    fn protobuf_frames_are_memoized_and_decode() {
        let counter = Arc::new(AtomicU64::new(0));
        let object = CachedObject::new(pod(5), Some(counter.clone()));
        let first = object.frame(EventType::Added, Encoding::Protobuf);
        let again = object.clone().frame(EventType::Added, Encoding::Protobuf);
        assert_eq!(first.as_ptr(), again.as_ptr(), "the same buffer");
        let _ = object.frame(EventType::Deleted, Encoding::Protobuf);
        assert_eq!(counter.load(Ordering::Relaxed), 1, "one protobuf encoding");
        let _ = object.json();
        assert_eq!(counter.load(Ordering::Relaxed), 2, "and one JSON encoding");
        let (event, _) = decode_protobuf_frame(&first).expect("ok").expect("whole");
        let (type_meta, value) = protobuf::decode(&event.raw).expect("decodes");
        assert_eq!(type_meta.kind, "Pod");
        assert_eq!(value["metadata"]["name"], "web");
        assert_eq!(value["metadata"]["resourceVersion"], "5");
    }

    /// A kind with no protobuf schema cannot be framed; its watchers hear a 500 ERROR
    /// instead of a frame they cannot read, and the failure too is computed once.
    #[test]
    fn an_object_outside_the_schema_becomes_an_error_frame() {
        let counter = Arc::new(AtomicU64::new(0));
        let widget = json!({"kind": "Widget", "apiVersion": "example.com/v1",
                            "metadata": {"name": "w", "resourceVersion": "3"}});
        let object = CachedObject::new(widget, Some(counter.clone()));
        assert!(matches!(
            object.encode(Encoding::Protobuf),
            Err(EncodeError::Protobuf(_))
        ));
        let frame = object.frame(EventType::Added, Encoding::Protobuf);
        assert_eq!(counter.load(Ordering::Relaxed), 1);
        let (event, _) = decode_protobuf_frame(&frame).expect("ok").expect("whole");
        assert_eq!(event.event_type, "ERROR");
        let (_, status) = protobuf::decode(&event.raw).expect("a Status decodes");
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 500);
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("Widget")),
            "{status}"
        );
        let bare = CachedObject::new(json!({"metadata": {"name": "x"}}), None);
        assert!(matches!(
            bare.encode(Encoding::Protobuf),
            Err(EncodeError::MissingTypeMeta)
        ));
    }
}
