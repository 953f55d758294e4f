//! `application/merge-patch+json`: RFC 7386 JSON merge patch, and the diff that makes one.
//!
//! Objects merge key by key, `null` deletes a key, and anything else (lists included)
//! replaces the value whole. Kubernetes serves custom resources and `kubectl scale`
//! with it.
//!
//! Invariant: for documents whose objects hold no `null` members (which merge patch
//! cannot express), `apply(a, diff(a, b)) == b`; the proptest below checks it.

use serde_json::{Map, Value};

use super::{PatchError, parse_body};

/// Applies an RFC 7386 merge patch to `current`.
///
/// The patch must be an object: RFC 7386 lets any other value replace the target, but an
/// API object replaced by a list or a string is never what a client meant, and
/// Kubernetes refuses such patches too (400).
pub fn apply(current: &Value, patch: &[u8]) -> Result<Value, PatchError> {
    let patch = parse_body(patch)?;
    if !patch.is_object() {
        return Err(PatchError::Decode(
            "a merge patch must be a JSON object".to_string(),
        ));
    }
    Ok(merge(current, &patch))
}

/// RFC 7386 §2 `MergePatch(Target, Patch)` on values.
pub fn merge(target: &Value, patch: &Value) -> Value {
    let Value::Object(patch_members) = patch else {
        return patch.clone();
    };
    let mut result = match target {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    for (key, value) in patch_members {
        if value.is_null() {
            result.remove(key);
        } else {
            let merged = merge(result.get(key).unwrap_or(&Value::Null), value);
            result.insert(key.clone(), merged);
        }
    }
    Value::Object(result)
}

/// The merge patch that turns `source` into `target` (what a client sends after editing).
/// Unchanged members are left out; members removed from `target` are `null`.
pub fn diff(source: &Value, target: &Value) -> Value {
    match (source, target) {
        (Value::Object(s), Value::Object(t)) => {
            let mut patch = Map::new();
            for key in s.keys() {
                if !t.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            for (key, t_value) in t {
                match s.get(key) {
                    Some(s_value) if s_value == t_value => {}
                    Some(s_value @ Value::Object(_)) if t_value.is_object() => {
                        patch.insert(key.clone(), diff(s_value, t_value));
                    }
                    _ => {
                        patch.insert(key.clone(), t_value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => target.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    // Reference: RFC 7386 Appendix A, the test cases that apply to objects.
    #[test]
    fn rfc_7386_appendix_a() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            let out = apply(&target, patch.to_string().as_bytes()).expect("object patch");
            assert_eq!(out, expected, "target {target} patch {patch}");
        }
    }

    #[test]
    fn non_object_patches_are_refused() {
        for body in ["[1]", "\"x\"", "null", "{"] {
            assert!(
                matches!(
                    apply(&json!({}), body.as_bytes()),
                    Err(PatchError::Decode(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn scale_patch_as_kubectl_sends_it() {
        let deployment = json!({"spec": {"replicas": 1, "template": {"spec": {}}}});
        let out = apply(&deployment, br#"{"spec":{"replicas":3}}"#).expect("applies");
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3, "template": {"spec": {}}}})
        );
    }

    /// JSON documents with no `null` object members (merge patch cannot express those).
    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "[a-c]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn merge_of_diff_gives_target(
            a in prop::collection::btree_map("[a-d]", document(), 0..4),
            b in prop::collection::btree_map("[a-d]", document(), 0..4),
        ) {
            let a = Value::Object(a.into_iter().collect());
            let b = Value::Object(b.into_iter().collect());
            let patch = diff(&a, &b);
            prop_assert_eq!(merge(&a, &patch), b.clone());
            // And through the wire form.
            let out = apply(&a, patch.to_string().as_bytes()).expect("diff is an object");
            prop_assert_eq!(out, b);
        }

        #[test]
        fn diff_of_equal_documents_is_empty(a in document()) {
            let a = json!({"x": a});
            prop_assert_eq!(diff(&a, &a), json!({}));
        }
    }
}
