//! The access reviews of `authorization.k8s.io/v1` (SubjectAccessReview,
//! LocalSubjectAccessReview, SelfSubjectAccessReview), as Kubernetes'
//! `pkg/apis/authorization/validation` checks them: exactly one of resourceAttributes and
//! nonResourceAttributes; a subject for the non-self kinds; metadata empty (but for a
//! LocalSubjectAccessReview's namespace, which its resourceAttributes must repeat); selector
//! attributes with either a raw selector or requirements, never both.
//!
//! Bad values render as `field.Error.ErrorBody` renders them: a nil pointer as the string
//! `"null"`, strings quoted, and `NonResourceAttributes` in Go's `%#v` syntax. The one value
//! rendered differently is an ObjectMeta that should have been empty: Go prints the whole Go
//! struct (`v1.ObjectMeta{Name:"x", GenerateName:"", ...}`); here it is its JSON, as the rest
//! of the validation renders objects.

use serde_json::Value;

use super::{array_of, child, each, forbidden, index, invalid, names, null, required, str_of};
use crate::Cause;

/// What kind of access review is validated: the fields each may and must carry differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Review {
    /// SubjectAccessReview: any user, cluster-scoped.
    Subject,
    /// LocalSubjectAccessReview: any user, in the namespace of the path.
    Local,
    /// SelfSubjectAccessReview: the requesting user.
    SelfSubject,
}

/// Kubernetes' `ValidateSubjectAccessReview`, `ValidateLocalSubjectAccessReview` and
/// `ValidateSelfSubjectAccessReview`.
pub(super) fn validate_access_review(obj: &Value, review: Review, out: &mut Vec<Cause>) {
    let spec = obj.get("spec").unwrap_or(null());
    let resource_attributes = present(spec, "resourceAttributes");
    let non_resource_attributes = present(spec, "nonResourceAttributes");
    match (resource_attributes, non_resource_attributes) {
        (Some(_), Some(non_resource)) => out.push(invalid_rendered(
            "spec.nonResourceAttributes",
            &non_resource_attributes_go(non_resource),
            "cannot be specified in combination with resourceAttributes",
        )),
        (None, None) => out.push(invalid_rendered(
            "spec.resourceAttributes",
            NIL,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    if review != Review::SelfSubject
        && str_of(spec, "user").is_empty()
        && array_of(spec, "groups").is_empty()
    {
        out.push(invalid(
            "spec.user",
            spec.get("user").unwrap_or(&Value::String(String::new())),
            "at least one of user or group must be specified",
        ));
    }
    if let Some(attributes) = resource_attributes {
        validate_selector_attributes(attributes, "spec.resourceAttributes", out);
    }

    let metadata = obj.get("metadata").unwrap_or(null());
    let namespace = str_of(metadata, "namespace");
    let ignored: &[&str] = match review {
        Review::Local => &["managedFields", "namespace"],
        _ => &["managedFields"],
    };
    if !meta_is_empty(metadata, ignored) {
        let detail = match review {
            Review::Local => "must be empty except for namespace",
            _ => "must be empty",
        };
        out.push(invalid("metadata", metadata, detail));
    }
    if review == Review::Local {
        if let Some(attributes) = resource_attributes {
            let spec_namespace = str_of(attributes, "namespace");
            if spec_namespace != namespace {
                out.push(invalid(
                    "spec.resourceAttributes.namespace",
                    &Value::String(spec_namespace.to_string()),
                    "must match metadata.namespace",
                ));
            }
        }
        if let Some(non_resource) = non_resource_attributes {
            out.push(invalid_rendered(
                "spec.nonResourceAttributes",
                &non_resource_attributes_go(non_resource),
                "disallowed on this kind of request",
            ));
        }
    }
}

/// How `field.Error` renders a nil pointer: the string `null`, quoted.
const NIL: &str = "\"null\"";

/// A pointer field that is set (`null` is Go's nil).
fn present<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    obj.get(field).filter(|v| !v.is_null())
}

/// An Invalid cause whose value is already rendered.
fn invalid_rendered(path: &str, rendered: &str, detail: &str) -> Cause {
    Cause::new(
        "FieldValueInvalid",
        path,
        format!("Invalid value: {rendered}: {detail}"),
    )
}

/// `%#v` of Kubernetes' internal `authorization.NonResourceAttributes`, as `field.Invalid`
/// prints it (the internal type has no `String` method).
fn non_resource_attributes_go(attributes: &Value) -> String {
    let quoted = |field: &str| Value::String(str_of(attributes, field).to_string()).to_string();
    format!(
        "authorization.NonResourceAttributes{{Path:{}, Verb:{}}}",
        quoted("path"),
        quoted("verb")
    )
}

/// Whether metadata is `metav1.ObjectMeta{}` under `apiequality.Semantic.DeepEqual` once the
/// `ignored` fields are cleared: every other field absent or zero (empty and nil maps and
/// slices are equal there).
fn meta_is_empty(metadata: &Value, ignored: &[&str]) -> bool {
    let Some(fields) = metadata.as_object() else {
        return metadata.is_null();
    };
    fields
        .iter()
        .filter(|(k, _)| !ignored.contains(&k.as_str()))
        .all(|(_, v)| is_zero(v))
}

fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Kubernetes' `validateResourceAttributes`: the field and label selector attributes.
fn validate_selector_attributes(attributes: &Value, path: &str, out: &mut Vec<Cause>) {
    for (field, labels) in [("fieldSelector", false), ("labelSelector", true)] {
        let Some(selector) = present(attributes, field) else {
            continue;
        };
        let selector_path = child(path, field);
        let raw = str_of(selector, "rawSelector");
        let requirements = array_of(selector, "requirements");
        if !raw.is_empty() && !requirements.is_empty() {
            out.push(invalid(
                &child(&selector_path, "rawSelector"),
                &Value::String(raw.to_string()),
                "may not specified at the same time as requirements",
            ));
        }
        if raw.is_empty() && requirements.is_empty() {
            out.push(required(
                &child(&selector_path, "requirements"),
                &format!(
                    "when {selector_path} is specified, requirements or rawSelector is required"
                ),
            ));
        }
        for (i, requirement) in requirements.iter().enumerate() {
            let requirement_path = index(&child(&selector_path, "requirements"), i);
            validate_requirement(requirement, labels, &requirement_path, out);
        }
    }
}

/// apimachinery's `ValidateLabelSelectorRequirement` and `ValidateFieldSelectorRequirement`
/// with `AllowUnknownOperatorInRequirement` (a newer client's operator must not make a review
/// invalid): a label key must be a qualified name and its values label values; a field key
/// only has to be there.
fn validate_requirement(requirement: &Value, labels: bool, path: &str, out: &mut Vec<Cause>) {
    let key = str_of(requirement, "key");
    if !labels && key.is_empty() {
        out.push(required(&child(path, "key"), "must be specified"));
    }
    let values = array_of(requirement, "values");
    match str_of(requirement, "operator") {
        "In" | "NotIn" if values.is_empty() => out.push(required(
            &child(path, "values"),
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => out.push(forbidden(
            &child(path, "values"),
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        _ => {}
    }
    if labels {
        each(out, &child(path, "key"), key, names::qualified_name(key));
        for (j, value) in values.iter().enumerate() {
            let text = value.as_str().unwrap_or("");
            each(
                out,
                &index(&child(path, "values"), j),
                text,
                names::label_value(text),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::catalogue::lookup;
    use crate::validation::validate_create;

    /// `field: message` of every cause, as `ApiError::invalid` joins them.
    fn check(resource: &str, obj: Value) -> Vec<String> {
        let info = lookup("authorization.k8s.io", "v1", resource).expect("served");
        validate_create(info, &obj)
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    const PODS: &str = r#"{"verb": "get", "resource": "pods", "namespace": "a"}"#;

    fn attributes() -> Value {
        serde_json::from_str(PODS).expect("json")
    }

    #[test]
    fn valid_reviews_pass() {
        let sar =
            json!({"metadata": {}, "spec": {"resourceAttributes": attributes(), "user": "jane"}});
        assert_eq!(check("subjectaccessreviews", sar), Vec::<String>::new());
        let by_group = json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}, "groups": ["ops"]}});
        assert_eq!(
            check("subjectaccessreviews", by_group),
            Vec::<String>::new()
        );
        let local = json!({"metadata": {"namespace": "a"}, "spec": {"resourceAttributes": attributes(), "user": "jane"}});
        assert_eq!(
            check("localsubjectaccessreviews", local),
            Vec::<String>::new()
        );
        // Managed fields are the one metadata a review may carry (the create handler adds them).
        let managed = json!({"metadata": {"managedFields": [{"manager": "kubectl"}], "labels": {}}, "spec": {"resourceAttributes": attributes()}});
        assert_eq!(
            check("selfsubjectaccessreviews", managed),
            Vec::<String>::new()
        );
    }

    #[test]
    fn attributes_exactly_one_and_a_subject() {
        assert_eq!(
            check("subjectaccessreviews", json!({"spec": {}})),
            [
                "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
                "spec.user: Invalid value: \"\": at least one of user or group must be specified",
            ]
        );
        let both = json!({"spec": {
            "resourceAttributes": attributes(),
            "nonResourceAttributes": {"path": "/healthz", "verb": "get"},
        }});
        assert_eq!(
            check("selfsubjectaccessreviews", both),
            [
                "spec.nonResourceAttributes: Invalid value: authorization.NonResourceAttributes{Path:\"/healthz\", Verb:\"get\"}: cannot be specified in combination with resourceAttributes"
            ]
        );
    }

    #[test]
    fn metadata_must_be_empty() {
        let named = json!({"metadata": {"name": "x"}, "spec": {"resourceAttributes": attributes(), "user": "jane"}});
        assert_eq!(
            check("subjectaccessreviews", named),
            ["metadata: Invalid value: {\"name\":\"x\"}: must be empty"]
        );
        let named = json!({"metadata": {"name": "x", "namespace": "a"}, "spec": {"resourceAttributes": attributes(), "user": "jane"}});
        assert_eq!(
            check("localsubjectaccessreviews", named),
            [
                "metadata: Invalid value: {\"name\":\"x\",\"namespace\":\"a\"}: must be empty except for namespace"
            ]
        );
    }

    #[test]
    fn a_local_review_stays_in_its_namespace_and_on_resources() {
        let elsewhere = json!({"metadata": {"namespace": "b"}, "spec": {"resourceAttributes": attributes(), "user": "jane"}});
        assert_eq!(
            check("localsubjectaccessreviews", elsewhere),
            [
                "spec.resourceAttributes.namespace: Invalid value: \"a\": must match metadata.namespace"
            ]
        );
        let non_resource = json!({"metadata": {"namespace": "b"}, "spec": {"nonResourceAttributes": {"path": "/x", "verb": "get"}, "user": "jane"}});
        assert_eq!(
            check("localsubjectaccessreviews", non_resource),
            [
                "spec.nonResourceAttributes: Invalid value: authorization.NonResourceAttributes{Path:\"/x\", Verb:\"get\"}: disallowed on this kind of request"
            ]
        );
    }

    #[test]
    fn selector_attributes_have_a_raw_selector_or_requirements() {
        let with = |selectors: Value| {
            let mut attributes = attributes();
            for (k, v) in selectors.as_object().expect("object") {
                attributes[k] = v.clone();
            }
            json!({"spec": {"resourceAttributes": attributes, "user": "me"}})
        };
        assert_eq!(
            check(
                "subjectaccessreviews",
                with(
                    json!({"fieldSelector": {"rawSelector": "foo", "requirements": [{"key": "k", "operator": "Exists"}]}})
                )
            ),
            [
                "spec.resourceAttributes.fieldSelector.rawSelector: Invalid value: \"foo\": may not specified at the same time as requirements"
            ]
        );
        assert_eq!(
            check("subjectaccessreviews", with(json!({"fieldSelector": {}}))),
            [
                "spec.resourceAttributes.fieldSelector.requirements: Required value: when spec.resourceAttributes.fieldSelector is specified, requirements or rawSelector is required"
            ]
        );
        assert_eq!(
            check(
                "subjectaccessreviews",
                with(json!({"fieldSelector": {"requirements": [{"key": "", "operator": "In"}]}}))
            ),
            [
                "spec.resourceAttributes.fieldSelector.requirements[0].key: Required value: must be specified",
                "spec.resourceAttributes.fieldSelector.requirements[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
            ]
        );
        // An operator this server does not know passes (a newer client may send one).
        assert_eq!(
            check(
                "subjectaccessreviews",
                with(
                    json!({"labelSelector": {"requirements": [{"key": "app", "operator": "Gt", "values": ["1"]}]}})
                )
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            check(
                "subjectaccessreviews",
                with(
                    json!({"labelSelector": {"requirements": [{"key": "a b", "operator": "Exists", "values": ["x"]}]}})
                )
            ),
            [
                "spec.resourceAttributes.labelSelector.requirements[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.resourceAttributes.labelSelector.requirements[0].key: Invalid value: \"a b\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ]
        );
    }
}
