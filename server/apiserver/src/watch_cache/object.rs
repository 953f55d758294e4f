//! `CachedObject`: one object as the watch cache holds it, serialized at most once per
//! encoding and shared by every reader.
//!
//! This carries the seed's "Serialize Once, Deliver to a Thousand Watchers: the
//! cachingObject": an event's object is encoded lazily, the first time any watcher needs it,
//! and the bytes (and the whole watch frame around them) are memoized, so a hundred watchers
//! of one event cost one serialization and a hundred reference-count bumps. The deep copy is
//! lazy too: readers share one `Arc`, and [`CachedObject::make_mut`] copies only when the
//! object is shared, as `Arc::make_mut` does.
//!
//! Invariants: the memoized bytes are always the encoding of the current value (a mutation
//! through [`CachedObject::make_mut`] drops them); `metadata.resourceVersion` is already set
//! (objects are built from the store only through [`crate::storage::decode`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::Value;

/// A wire encoding of objects. Only JSON is served today; protobuf adds a variant here, a
/// branch in [`CachedObject::encode`] and a frame layout in [`CachedObject::frame`], and
/// every memo grows with [`Encoding::COUNT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Json,
}

impl Encoding {
    /// How many encodings a memo holds.
    pub const COUNT: usize = 1;

    fn index(self) -> usize {
        match self {
            Encoding::Json => 0,
        }
    }
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
    /// The object alone, per encoding. `OnceLock`: many watcher streams may ask at once and
    /// exactly one of them encodes; the others wait for and share its bytes.
    encoded: [OnceLock<Bytes>; Encoding::COUNT],
    /// Whole watch frames (`{"type":...,"object":...}\n`) per encoding and event type.
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

    /// The object in `encoding`, produced once and shared afterwards.
    pub fn encode(&self, encoding: Encoding) -> Bytes {
        self.inner.encoded[encoding.index()]
            .get_or_init(|| {
                if let Some(counter) = &self.inner.serializations {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                match encoding {
                    Encoding::Json => Bytes::from(
                        serde_json::to_vec(&self.inner.value)
                            .expect("a serde_json::Value always serializes"),
                    ),
                }
            })
            .clone()
    }

    /// The object as JSON.
    pub fn json(&self) -> Bytes {
        self.encode(Encoding::Json)
    }

    /// The watch frame carrying this object as an event of `event_type`, built once per
    /// encoding and type: `{"type":"ADDED","object":{...}}\n` for JSON.
    pub fn frame(&self, event_type: EventType, encoding: Encoding) -> Bytes {
        self.inner.frames[encoding.index()][event_type.index()]
            .get_or_init(|| match encoding {
                Encoding::Json => json_frame(event_type.as_str(), &self.encode(encoding)),
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
}
