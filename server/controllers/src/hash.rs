//! The pod-template hash (`docs/tricks.md` #28, the Deployment hash with its collision
//! counter): the name suffix and `pod-template-hash` label of every ReplicaSet a
//! Deployment owns.
//!
//! Why a hash and not a random suffix: the controller acts on a cache that lags. If it picked
//! a random name, a sync that ran before its own create came back through the watch would
//! create a *second* ReplicaSet for the same template. A name that is a pure function of the
//! template makes the create idempotent: the second attempt gets `AlreadyExists` and finds the
//! first. The price is collisions — two different templates hashing to the same 32 bits, or a
//! stranger's ReplicaSet already holding the name. Kubernetes escapes them with a counter
//! persisted in the Deployment's `status.collisionCount` and mixed into the hash, never with
//! randomness, so the name stays a function of (template, counter) and every controller
//! instance (or a new leader after failover) computes the same one.
//!
//! Kubernetes' `controller.ComputeHash` feeds FNV-32a with a `spew` deep dump of the Go
//! struct (`SortKeys: true`). skerry has no Go structs, so it feeds FNV-32a with a canonical
//! JSON serialization of the template: object keys sorted by byte order, no whitespace,
//! numbers and strings as serde_json writes them. The hashes therefore differ from the ones a
//! kube-controller-manager would compute for the same template (they must: the input bytes
//! differ), but they have the same properties: stable for equal templates, different for
//! different ones, and changed by the collision counter.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

/// The label (and ReplicaSet name suffix) carrying the hash (apps/v1
/// `DefaultDeploymentUniqueLabelKey`).
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// FNV-32a's offset basis (FNV specification; Go's `hash/fnv` `offset32`).
const FNV32_OFFSET_BASIS: u32 = 2_166_136_261;
/// FNV-32's prime (FNV specification; Go's `hash/fnv` `prime32`).
const FNV32_PRIME: u32 = 16_777_619;

/// apimachinery `rand.SafeEncodeString`'s alphabet: no vowels, so an encoded hash cannot spell
/// a word (a profanity in a pod name would be a bug report), and no `0`, `1` or `3`, which
/// read as the letters `o`, `l` and `e` and would let it spell one anyway.
const SAFE_ALPHABET: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";

/// Bytes the collision counter is written as: Kubernetes allocates an 8-byte buffer and puts
/// the counter as a little-endian `uint32` in its first 4, so 4 zero bytes follow. Matching
/// that keeps the hash's dependence on the counter exactly Kubernetes'.
const COLLISION_COUNT_BYTES: usize = 8;

/// FNV-32a over a stream of bytes.
struct Fnv32a(u32);

impl Fnv32a {
    fn new() -> Fnv32a {
        Fnv32a(FNV32_OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u32::from(*b);
            self.0 = self.0.wrapping_mul(FNV32_PRIME);
        }
    }
}

/// The pod-template hash of `template` with `collision_count` (Kubernetes'
/// `controller.ComputeHash`): FNV-32a over the canonical JSON of the template, then the
/// counter if set, then the decimal digits of the 32-bit sum safe-encoded.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let value = serde_json::to_value(template)
        .expect("a PodTemplateSpec always serializes: every map in it is keyed by String");
    let mut hasher = Fnv32a::new();
    write_canonical(&mut hasher, &value);
    if let Some(count) = collision_count {
        let mut bytes = [0u8; COLLISION_COUNT_BYTES];
        // Go's `uint32(*collisionCount)`: a negative counter wraps, as it does there.
        bytes[..4].copy_from_slice(&(count as u32).to_le_bytes());
        hasher.write(&bytes);
    }
    safe_encode(&hasher.0.to_string())
}

/// apimachinery `rand.SafeEncodeString`: each byte `b` of `s` becomes
/// `SAFE_ALPHABET[b % 27]`. (Go iterates runes; the input here is always ASCII digits.)
pub fn safe_encode(s: &str) -> String {
    s.chars()
        .map(|c| SAFE_ALPHABET[(c as usize) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// Writes `value` as canonical JSON: keys sorted, no whitespace. Sorting here (rather than
/// trusting `serde_json::Map`'s order) keeps the hash stable even if a dependency turns on
/// serde_json's `preserve_order`.
fn write_canonical(hasher: &mut Fnv32a, value: &Value) {
    match value {
        Value::Null => hasher.write(b"null"),
        Value::Bool(b) => hasher.write(if *b { b"true" } else { b"false" }),
        Value::Number(n) => hasher.write(n.to_string().as_bytes()),
        Value::String(s) => write_string(hasher, s),
        Value::Array(items) => {
            hasher.write(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.write(b",");
                }
                write_canonical(hasher, item);
            }
            hasher.write(b"]");
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.write(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    hasher.write(b",");
                }
                write_string(hasher, key);
                hasher.write(b":");
                write_canonical(hasher, &map[key]);
            }
            hasher.write(b"}");
        }
    }
}

fn write_string(hasher: &mut Fnv32a, s: &str) {
    // serde_json's escaping of a plain string cannot fail.
    let quoted = Value::String(s.to_string()).to_string();
    hasher.write(quoted.as_bytes());
}

/// Whether two pod templates are equal once the `pod-template-hash` label is removed from
/// both (Kubernetes' `deploymentutil.EqualIgnoreHash`). The hash label must be ignored
/// because a ReplicaSet's template carries it and the Deployment's does not, and because an
/// old ReplicaSet's hash may have been computed by an older hash function; this comparison,
/// not the hash, is what decides which ReplicaSet is "new" — and so what lets `kubectl
/// rollout undo` (which copies an old ReplicaSet's template back into the Deployment) find and
/// reuse the old ReplicaSet. An empty label map counts as no labels.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    fn strip(t: &PodTemplateSpec) -> PodTemplateSpec {
        let mut t = t.clone();
        if let Some(meta) = t.metadata.as_mut() {
            if let Some(labels) = meta.labels.as_mut() {
                labels.remove(POD_TEMPLATE_HASH_LABEL);
                if labels.is_empty() {
                    meta.labels = None;
                }
            }
            if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
                meta.annotations = None;
            }
        }
        t
    }
    strip(a) == strip(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn template(image: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    fn fnv(bytes: &[u8]) -> u32 {
        let mut h = Fnv32a::new();
        h.write(bytes);
        h.0
    }

    // Reference: the FNV test vectors (draft-eastlake-fnv, fnv32a of "", "a", "foobar").
    #[test]
    fn fnv32a_matches_reference_vectors() {
        assert_eq!(fnv(b""), 0x811c_9dc5);
        assert_eq!(fnv(b"a"), 0xe40c_292c);
        assert_eq!(fnv(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn safe_encode_maps_digits_as_apimachinery_does() {
        // '0' is byte 48, 48 % 27 = 21 -> '4'; '9' is 57 % 27 = 3 -> 'f'.
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }

    #[test]
    fn hash_is_stable_and_pinned() {
        let a = compute_hash(&template("nginx:1.27"), None);
        assert_eq!(a, compute_hash(&template("nginx:1.27"), None));
        // Pinned: a change here renames every ReplicaSet of every existing Deployment on
        // upgrade (they would still be found by template equality, but get new names).
        assert_eq!(a, PINNED_HASH);
    }

    /// Cross-checked outside Rust: FNV-32a of Python's `json.dumps(t, sort_keys=True,
    /// separators=(",", ":"))` of the same template, safe-encoded, is this string.
    const PINNED_HASH: &str = "6c8d7489d5";

    #[test]
    fn hash_differs_by_template() {
        assert_ne!(
            compute_hash(&template("nginx:1.27"), None),
            compute_hash(&template("nginx:1.28"), None)
        );
    }

    #[test]
    fn hash_differs_by_collision_count() {
        let t = template("nginx:1.27");
        let none = compute_hash(&t, None);
        let zero = compute_hash(&t, Some(0));
        let one = compute_hash(&t, Some(1));
        assert_ne!(none, zero, "a zero counter still writes 8 bytes");
        assert_ne!(zero, one);
        assert_ne!(none, one);
    }

    #[test]
    fn hash_uses_only_the_safe_alphabet() {
        for i in 0..200 {
            let h = compute_hash(&template(&format!("img:{i}")), Some(i));
            assert!(
                !h.is_empty() && h.len() <= 10,
                "{h}: a u32 has at most 10 digits"
            );
            assert!(h.bytes().all(|b| SAFE_ALPHABET.contains(&b)), "{h}");
            assert!(!h.bytes().any(|b| b"aeiou013".contains(&b)), "{h}");
        }
    }

    #[test]
    fn equal_ignore_hash_ignores_only_the_hash_label() {
        let d = template("nginx:1.27");
        let mut rs = d.clone();
        rs.metadata
            .as_mut()
            .and_then(|m| m.labels.as_mut())
            .unwrap()
            .insert(POD_TEMPLATE_HASH_LABEL.into(), "abc".into());
        assert!(equal_ignore_hash(&d, &rs));
        assert!(!equal_ignore_hash(&template("nginx:1.28"), &rs));
        let mut other_label = d.clone();
        other_label
            .metadata
            .as_mut()
            .and_then(|m| m.labels.as_mut())
            .unwrap()
            .insert("tier".into(), "x".into());
        assert!(!equal_ignore_hash(&other_label, &rs));
    }
}
