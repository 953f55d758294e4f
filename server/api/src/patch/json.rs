//! `application/json-patch+json`: RFC 6902 operations applied in order, all or nothing.
//!
//! The operations are the `json-patch` crate's; this module adds Kubernetes' limits and
//! turns the crate's errors into messages that name the operation and the path, answered
//! with Kubernetes' codes: an undecodable body is 400, too many operations 413, an operation
//! that cannot apply (a failed `test`, a missing path) 422.

use serde_json::Value;

use super::{PatchError, parse_body};

/// Operations accepted in one JSON patch. Each costs a walk of the object, so this bounds
/// the work of one request. The number is Kubernetes' (`maxJSONPatchOperations` in the
/// apiserver's patch handler).
pub const OPERATIONS_MAX: usize = 10_000;

/// Applies an RFC 6902 patch to `current`.
pub fn apply(current: &Value, patch: &[u8]) -> Result<Value, PatchError> {
    let body = parse_body(patch)?;
    let Value::Array(operations) = &body else {
        return Err(PatchError::Decode(
            "a JSON patch must be a list of operations".to_string(),
        ));
    };
    if operations.len() > OPERATIONS_MAX {
        return Err(PatchError::TooManyOperations {
            count: operations.len(),
            max: OPERATIONS_MAX,
        });
    }
    let parsed: json_patch::Patch =
        serde_json::from_value(body).map_err(|e| PatchError::Decode(e.to_string()))?;
    // Work on a copy: the all-or-nothing guarantee is that `current` is never touched.
    let mut document = current.clone();
    json_patch::patch_unsafe(&mut document, &parsed).map_err(|e| describe(&parsed, &e))?;
    Ok(document)
}

/// `the "remove" operation (#2) at /spec/replicas failed: path is invalid`.
fn describe(patch: &json_patch::Patch, error: &json_patch::PatchError) -> PatchError {
    let op = patch
        .0
        .get(error.operation)
        .map(operation_name)
        .unwrap_or("unknown");
    let detail = match &error.kind {
        json_patch::PatchErrorKind::TestFailed => "test failed: the value does not match",
        json_patch::PatchErrorKind::InvalidFromPointer => {
            "\"from\" does not name an existing value"
        }
        json_patch::PatchErrorKind::InvalidPointer => {
            "the path does not name an existing value or its parent"
        }
        json_patch::PatchErrorKind::CannotMoveInsideItself => {
            "a value cannot be moved inside itself"
        }
        _ => "the operation cannot be applied",
    };
    PatchError::Invalid(format!(
        "the {op:?} operation (#{}) at {:?} failed: {detail}",
        error.operation + 1,
        error.path.as_str()
    ))
}

fn operation_name(operation: &json_patch::PatchOperation) -> &'static str {
    match operation {
        json_patch::PatchOperation::Add(_) => "add",
        json_patch::PatchOperation::Remove(_) => "remove",
        json_patch::PatchOperation::Replace(_) => "replace",
        json_patch::PatchOperation::Move(_) => "move",
        json_patch::PatchOperation::Copy(_) => "copy",
        json_patch::PatchOperation::Test(_) => "test",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(current: Value, patch: Value) -> Result<Value, PatchError> {
        apply(&current, patch.to_string().as_bytes())
    }

    // Reference: RFC 6902 §4 (the six operations) and Appendix A examples.
    #[test]
    fn operations_apply_in_order() {
        let pod =
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c"}]}});
        let out = run(
            pod,
            json!([
                {"op": "test", "path": "/metadata/labels/a", "value": "1"},
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a"},
                {"op": "add", "path": "/spec/containers/-", "value": {"name": "d"}},
                {"op": "replace", "path": "/spec/containers/0/name", "value": "c0"},
                {"op": "copy", "from": "/metadata/labels/b", "path": "/metadata/labels/c"},
                {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/m~1n"},
            ]),
        )
        .expect("patch applies");
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"c": "2", "m/n": "2"}},
                   "spec": {"containers": [{"name": "c0"}, {"name": "d"}]}})
        );
    }

    #[test]
    fn failed_test_is_invalid_and_leaves_nothing_applied() {
        let current = json!({"spec": {"replicas": 1}});
        let err = run(
            current.clone(),
            json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "test", "path": "/spec/replicas", "value": 1},
            ]),
        )
        .expect_err("test fails after the replace");
        assert_eq!(
            err,
            PatchError::Invalid(
                "the \"test\" operation (#2) at \"/spec/replicas\" failed: test failed: the value does not match"
                    .to_string()
            )
        );
    }

    #[test]
    fn missing_path_is_invalid() {
        let err = run(
            json!({}),
            json!([{"op": "remove", "path": "/spec/replicas"}]),
        )
        .expect_err("nothing to remove");
        assert!(
            matches!(err, PatchError::Invalid(ref m) if m.contains("\"remove\" operation (#1)"))
        );
    }

    #[test]
    fn malformed_bodies_are_decode_errors() {
        assert!(matches!(
            apply(&json!({}), b"{\"op\":\"add\"}"),
            Err(PatchError::Decode(_))
        ));
        assert!(matches!(
            apply(&json!({}), b"[{\"op\":\"frob\",\"path\":\"/a\"}]"),
            Err(PatchError::Decode(_))
        ));
        assert!(matches!(
            apply(&json!({}), b"not json"),
            Err(PatchError::Decode(_))
        ));
    }

    #[test]
    fn operation_count_is_bounded() {
        let ops: Vec<Value> = (0..=OPERATIONS_MAX)
            .map(|_| json!({"op": "test", "path": "", "value": {}}))
            .collect();
        let err = run(json!({}), Value::Array(ops)).expect_err("one too many");
        assert_eq!(
            err,
            PatchError::TooManyOperations {
                count: OPERATIONS_MAX + 1,
                max: OPERATIONS_MAX
            }
        );
    }
}
