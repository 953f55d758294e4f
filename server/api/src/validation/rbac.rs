//! The RBAC kinds (Role, ClusterRole, RoleBinding, ClusterRoleBinding): rules need verbs, bindings need a valid role reference and
//! subjects of a known kind; a binding's role reference never changes.

use serde_json::Value;

use super::{array_of, child, each, index, invalid, names, not_supported, null, required, str_of};
use crate::Cause;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

pub(super) fn validate_role(obj: &Value, namespaced: bool, out: &mut Vec<Cause>) {
    for (i, rule) in array_of(obj, "rules").iter().enumerate() {
        validate_policy_rule(rule, namespaced, &index("rules", i), out);
    }
}

/// rbac validation `ValidatePolicyRule`.
fn validate_policy_rule(rule: &Value, namespaced: bool, path: &str, out: &mut Vec<Cause>) {
    if array_of(rule, "verbs").is_empty() {
        out.push(required(
            &child(path, "verbs"),
            "verbs must contain at least one value",
        ));
    }
    let urls = array_of(rule, "nonResourceURLs");
    if !urls.is_empty() {
        let urls_value = Value::Array(urls.to_vec());
        if namespaced {
            out.push(invalid(
                &child(path, "nonResourceURLs"),
                &urls_value,
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        let has_resources = ["apiGroups", "resources", "resourceNames"]
            .iter()
            .any(|f| !array_of(rule, f).is_empty());
        if has_resources {
            out.push(invalid(
                &child(path, "nonResourceURLs"),
                &urls_value,
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if array_of(rule, "apiGroups").is_empty() {
        out.push(required(
            &child(path, "apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if array_of(rule, "resources").is_empty() {
        out.push(required(
            &child(path, "resources"),
            "resource rules must supply at least one resource",
        ));
    }
}

pub(super) fn validate_binding(
    obj: &Value,
    old: Option<&Value>,
    namespaced: bool,
    out: &mut Vec<Cause>,
) {
    let role_ref = obj.get("roleRef").unwrap_or(null());
    let api_group = str_of(role_ref, "apiGroup");
    if api_group != RBAC_GROUP {
        out.push(not_supported(
            "roleRef.apiGroup",
            &Value::from(api_group),
            &[RBAC_GROUP],
        ));
    }
    let kind = str_of(role_ref, "kind");
    let allowed: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !allowed.contains(&kind) {
        out.push(not_supported("roleRef.kind", &Value::from(kind), allowed));
    }
    let name = str_of(role_ref, "name");
    if name.is_empty() {
        out.push(required("roleRef.name", ""));
    } else {
        each(out, "roleRef.name", name, names::path_segment_name(name));
    }
    for (i, subject) in array_of(obj, "subjects").iter().enumerate() {
        validate_subject(subject, namespaced, &index("subjects", i), out);
    }
    if let Some(old) = old {
        let old_ref = old.get("roleRef").unwrap_or(null());
        if old_ref != role_ref {
            out.push(invalid("roleRef", role_ref, "cannot change roleRef"));
        }
    }
}

/// rbac validation `ValidateRoleBindingSubject`.
fn validate_subject(subject: &Value, namespaced: bool, path: &str, out: &mut Vec<Cause>) {
    let name = str_of(subject, "name");
    if name.is_empty() {
        out.push(required(&child(path, "name"), ""));
    }
    let api_group = str_of(subject, "apiGroup");
    match str_of(subject, "kind") {
        "ServiceAccount" => {
            if !name.is_empty() {
                each(
                    out,
                    &child(path, "name"),
                    name,
                    names::dns1123_subdomain(name),
                );
            }
            if !api_group.is_empty() {
                out.push(not_supported(
                    &child(path, "apiGroup"),
                    &Value::from(api_group),
                    &[""],
                ));
            }
            if !namespaced && str_of(subject, "namespace").is_empty() {
                out.push(required(&child(path, "namespace"), ""));
            }
        }
        "User" | "Group" => {
            if api_group != RBAC_GROUP {
                out.push(not_supported(
                    &child(path, "apiGroup"),
                    &Value::from(api_group),
                    &[RBAC_GROUP],
                ));
            }
        }
        other => out.push(not_supported(
            &child(path, "kind"),
            &Value::from(other),
            &["ServiceAccount", "User", "Group"],
        )),
    }
}
