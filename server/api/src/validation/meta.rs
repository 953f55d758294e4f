//! Object metadata checks every kind shares: name (per-kind format), generateName,
//! namespace presence, labels, annotations (256 KiB in total), owner references, finalizers;
//! and on update, the metadata that may not change.

use serde_json::{Map, Value};

use super::{
    IMMUTABLE_MESSAGE, JsonType, array_of, child, each, forbidden, index, invalid, invalid_str,
    map_of, names, non_negative, required, str_of, too_long, type_check,
};
use crate::{Cause, ResourceInfo};

/// Total bytes of annotation keys and values an object may carry (apimachinery
/// `TotalAnnotationSizeLimitB`): annotations ride along in every watch event and list.
pub const ANNOTATIONS_BYTES_MAX: usize = 256 * 1024;

/// Finalizers Kubernetes itself defines, allowed without a domain prefix
/// (`IsStandardFinalizerName`).
const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// How a kind's names are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: most kinds.
    Subdomain,
    /// RFC 1123 label: namespaces and StatefulSets (their names become host names).
    Label,
    /// RFC 1035 label: services (their names become DNS labels and env variable prefixes).
    Dns1035,
    /// Anything that fits one URL path segment: RBAC kinds (`system:controller:x`).
    PathSegment,
}

impl NameRule {
    /// The rule Kubernetes applies to names of `resource`.
    pub fn of(resource: &ResourceInfo) -> NameRule {
        match (resource.group, resource.kind) {
            ("", "Namespace") | ("apps", "StatefulSet") => NameRule::Label,
            ("", "Service") => NameRule::Dns1035,
            ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
            _ => NameRule::Subdomain,
        }
    }

    /// The messages for `name`; with `prefix`, a trailing dash is allowed (generateName).
    pub fn check(self, name: &str, prefix: bool) -> Vec<String> {
        let name = if prefix {
            names::mask_trailing_dash(name)
        } else {
            name.to_string()
        };
        match self {
            NameRule::Subdomain => names::dns1123_subdomain(&name),
            NameRule::Label => names::dns1123_label(&name),
            NameRule::Dns1035 => names::dns1035_label(&name),
            NameRule::PathSegment => names::path_segment_name(&name),
        }
    }
}

/// apimachinery `ValidateObjectMetaAccessor` plus the core group's finalizer check.
pub(super) fn validate_object_meta(resource: &ResourceInfo, obj: &Value, out: &mut Vec<Cause>) {
    let empty = Value::Object(Map::new());
    let meta = obj
        .get("metadata")
        .filter(|m| m.is_object())
        .unwrap_or(&empty);
    let rule = NameRule::of(resource);
    for field in ["name", "generateName", "namespace"] {
        type_check(meta, field, "metadata", JsonType::String, out);
    }
    for field in ["labels", "annotations"] {
        type_check(meta, field, "metadata", JsonType::Object, out);
    }
    type_check(meta, "generation", "metadata", JsonType::Integer, out);
    let generate_name = str_of(meta, "generateName");
    if !generate_name.is_empty() {
        each(
            out,
            "metadata.generateName",
            generate_name,
            rule.check(generate_name, true),
        );
    }
    let name = str_of(meta, "name");
    if name.is_empty() {
        out.push(required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        each(out, "metadata.name", name, rule.check(name, false));
    }
    let namespace = str_of(meta, "namespace");
    if resource.namespaced {
        if namespace.is_empty() {
            out.push(required("metadata.namespace", ""));
        } else {
            each(
                out,
                "metadata.namespace",
                namespace,
                names::dns1123_label(namespace),
            );
        }
    } else if !namespace.is_empty() {
        out.push(forbidden("metadata.namespace", "not allowed on this type"));
    }
    non_negative(meta, "generation", "metadata", out);
    if let Some(labels) = map_of(meta, "labels") {
        validate_labels(labels, "metadata.labels", out);
    }
    if let Some(annotations) = map_of(meta, "annotations") {
        validate_annotations(annotations, "metadata.annotations", out);
    }
    validate_owner_references(meta, out);
    validate_finalizers(array_of(meta, "finalizers"), "metadata.finalizers", out);
}

/// Label keys are qualified names, values label values; both are reported at `path`
/// itself, as Kubernetes does (not at `path[key]`).
pub(super) fn validate_labels(labels: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
    for (k, v) in labels {
        each(out, path, k, names::qualified_name(k));
        match v.as_str() {
            Some(text) => each(out, path, text, names::label_value(text)),
            None => out.push(invalid(path, v, "label values must be strings")),
        }
    }
}

/// Annotation keys are qualified names ignoring case; the total size is capped.
pub(super) fn validate_annotations(
    annotations: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Cause>,
) {
    let mut total_bytes = 0usize;
    for (k, v) in annotations {
        each(out, path, k, names::qualified_name(&k.to_lowercase()));
        total_bytes += k.len() + v.as_str().map_or(0, str::len);
    }
    if total_bytes > ANNOTATIONS_BYTES_MAX {
        out.push(too_long(path, ANNOTATIONS_BYTES_MAX));
    }
}

fn validate_owner_references(meta: &Value, out: &mut Vec<Cause>) {
    // Kubernetes reports these at `metadata.ownerReferences.<field>`, without the index.
    let path = "metadata.ownerReferences";
    let mut controller: Option<String> = None;
    for reference in array_of(meta, "ownerReferences") {
        let api_version = str_of(reference, "apiVersion");
        if api_version.rsplit('/').next().unwrap_or("").is_empty() {
            out.push(invalid_str(
                &child(path, "apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        for field in ["kind", "name", "uid"] {
            let value = str_of(reference, field);
            if value.is_empty() {
                out.push(invalid_str(&child(path, field), value, "must not be empty"));
            }
        }
        if reference.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!(
                "{}/{}",
                str_of(reference, "kind"),
                str_of(reference, "name")
            );
            match &controller {
                Some(first) => out.push(invalid(
                    path,
                    meta.get("ownerReferences").unwrap_or(super::null()),
                    &format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
}

/// Finalizers are qualified names; one without a domain must be a standard one.
pub(super) fn validate_finalizers(finalizers: &[Value], path: &str, out: &mut Vec<Cause>) {
    let mut has_orphan = false;
    let mut has_foreground = false;
    for (i, finalizer) in finalizers.iter().enumerate() {
        let name = finalizer.as_str().unwrap_or("");
        let item_path = index(path, i);
        let messages = names::qualified_name(name);
        let qualified_ok = messages.is_empty();
        each(out, &item_path, name, messages);
        if qualified_ok && !name.contains('/') && !STANDARD_FINALIZERS.contains(&name) {
            out.push(invalid_str(
                &item_path,
                name,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
        has_orphan |= name == "orphan";
        has_foreground |= name == "foregroundDeletion";
    }
    if has_orphan && has_foreground {
        out.push(invalid(
            path,
            &Value::Array(finalizers.to_vec()),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
}

/// apimachinery `ValidateObjectMetaUpdate`: identity fields are fixed at creation.
pub(super) fn validate_object_meta_update(old: &Value, new: &Value, out: &mut Vec<Cause>) {
    let old_meta = old.get("metadata").unwrap_or(super::null());
    let new_meta = new.get("metadata").unwrap_or(super::null());
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        let old_value = old_meta.get(field).filter(|v| !v.is_null());
        let new_value = new_meta.get(field).filter(|v| !v.is_null());
        // An update that omits a system field keeps the stored one (the apiserver fills it).
        if field != "name" && field != "namespace" && new_value.is_none() {
            continue;
        }
        if old_value != new_value {
            out.push(invalid(
                &format!("metadata.{field}"),
                new_value.unwrap_or(&Value::String(String::new())),
                IMMUTABLE_MESSAGE,
            ));
        }
    }
    let old_generate = str_of(old_meta, "generateName");
    let new_generate = str_of(new_meta, "generateName");
    if !new_generate.is_empty() && old_generate != new_generate {
        out.push(invalid_str(
            "metadata.generateName",
            new_generate,
            IMMUTABLE_MESSAGE,
        ));
    }
}
