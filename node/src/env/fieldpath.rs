//! The downward API's values: a pod field named by a `fieldRef` and a container resource named
//! by a `resourceFieldRef`, as environment variables and as files (Kubernetes'
//! `pkg/fieldpath/fieldpath.go` `ExtractFieldPathAsString`, `FormatMap`,
//! `SplitMaybeSubscriptedPath`; `pkg/apis/core/pods/helpers.go`
//! `ConvertDownwardAPIFieldLabel`; `pkg/api/v1/resource/helpers.go`
//! `ExtractContainerResourceValue`, `MergeContainerResourceLimits`).
//!
//! The trick worth knowing: labels and annotations as one file are `key="value"` lines sorted
//! by key with the value quoted as Go's `strconv.Quote` does, so a value holding a newline
//! stays on one line and the file parses back unambiguously.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use skerry_api::validation::names;
use skerry_api::validation::quantity::Quantity;

/// The only API version a pod `fieldRef` may name (`ConvertDownwardAPIFieldLabel`).
const POD_API_VERSION: &str = "v1";

/// Nano-units in one unit and in one milli-unit of a [`Quantity`].
const NANO: i128 = 1_000_000_000;
const NANO_PER_MILLI: i128 = 1_000_000;

/// The resources a missing (or zero) container limit is read from the node's allocatable for
/// (`MergeContainerResourceLimits`: hugepages are left out, they are never overcommitted).
pub const DEFAULTED_LIMITS: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// `metadata.labels['k']` split into `metadata.labels` and `k`; anything else is `None`.
pub fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (head, key) = inner.split_once("['")?;
    if head.is_empty() {
        return None;
    }
    Some((head, key))
}

/// The field a `fieldRef` names, checked and translated as the apiserver's field label
/// conversion does (`spec.host` is the old name of `spec.nodeName`). `api_version` defaults
/// to `v1`, as the apiserver defaults it.
pub fn convert_field_label(api_version: Option<&str>, label: &str) -> Result<String, String> {
    let version = api_version.unwrap_or(POD_API_VERSION);
    if version != POD_API_VERSION {
        return Err(format!("unsupported pod version: {version}"));
    }
    if let Some((path, _)) = split_subscript(label) {
        return match path {
            "metadata.annotations" | "metadata.labels" => Ok(label.to_string()),
            _ => Err(format!("field label does not support subscript: {label}")),
        };
    }
    match label {
        "metadata.annotations"
        | "metadata.labels"
        | "metadata.name"
        | "metadata.namespace"
        | "metadata.uid"
        | "spec.nodeName"
        | "spec.restartPolicy"
        | "spec.serviceAccountName"
        | "spec.schedulerName"
        | "status.phase"
        | "status.hostIP"
        | "status.hostIPs"
        | "status.podIP"
        | "status.podIPs" => Ok(label.to_string()),
        "spec.host" => Ok("spec.nodeName".to_string()),
        _ => Err(format!("field label not supported: {label}")),
    }
}

/// A metadata field of the pod as a string (`ExtractFieldPathAsString`): name, namespace,
/// uid, all labels or annotations ([`format_map`]) or one of them by key. Other paths (the
/// `spec.` and `status.` ones env vars may name) are the caller's: here they are refused as
/// upstream refuses them.
pub fn extract_field_path(pod: &Pod, path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    if let Some((head, key)) = split_subscript(path) {
        return match head {
            "metadata.annotations" => {
                let errors = names::qualified_name(&key.to_lowercase());
                if !errors.is_empty() {
                    return Err(format!(
                        "invalid key subscript in {path}: {}",
                        errors.join(";")
                    ));
                }
                Ok(lookup(meta.annotations.as_ref(), key))
            }
            "metadata.labels" => {
                let errors = names::qualified_name(key);
                if !errors.is_empty() {
                    return Err(format!(
                        "invalid key subscript in {path}: {}",
                        errors.join(";")
                    ));
                }
                Ok(lookup(meta.labels.as_ref(), key))
            }
            _ => Err(format!(
                "fieldPath {} does not support subscript",
                quote(path)
            )),
        };
    }
    match path {
        "metadata.annotations" => Ok(format_map(meta.annotations.as_ref())),
        "metadata.labels" => Ok(format_map(meta.labels.as_ref())),
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(meta.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Ok(meta.uid.clone().unwrap_or_default()),
        _ => Err(format!("unsupported fieldPath: {path}")),
    }
}

fn lookup(map: Option<&BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

/// Labels or annotations as the downward API writes them: one `key="value"` per line,
/// sorted by key, values quoted as Go's `strconv.Quote`, no trailing newline.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let Some(map) = map else {
        return String::new();
    };
    let mut out = String::new();
    for (key, value) in map {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(&quote(value));
    }
    out
}

/// Go's `strconv.Quote` (one copy, in `skerry-api`).
pub use skerry_api::goquote::go_quote as quote;

/// Node allocatable resources by name, the defaults of missing limits.
pub type Allocatable = BTreeMap<String, ApiQuantity>;

/// A copy of `container` whose missing or zero CPU, memory and ephemeral-storage limits are
/// the node's allocatable (`MergeContainerResourceLimits`).
pub fn merge_limits(container: &Container, allocatable: &Allocatable) -> Container {
    let mut out = container.clone();
    let resources = out.resources.get_or_insert_with(Default::default);
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    for name in DEFAULTED_LIMITS {
        let missing = limits
            .get(name)
            .is_none_or(|q| Quantity::parse(q.0.trim()).is_none_or(|q| q.0 == 0));
        if missing && let Some(cap) = allocatable.get(name) {
            limits.insert(name.to_string(), cap.clone());
        }
    }
    out
}

/// The container named `name` among the pod's containers, then its init containers
/// (`findContainerInPod`).
pub fn find_container<'a>(pod: &'a Pod, name: &str) -> Result<&'a Container, String> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.containers.iter())
        .chain(
            spec.into_iter()
                .flat_map(|s| s.init_containers.iter().flatten()),
        )
        .find(|c| c.name == name)
        .ok_or_else(|| format!("container {name} not found"))
}

/// A container's resource as the downward API gives it (`ExtractContainerResourceValue`):
/// `limits.cpu` and `requests.cpu` in units of the divisor rounded up from milli-units,
/// memory, ephemeral storage and hugepages in units of the divisor rounded up from bytes. An
/// absent or zero divisor is 1. A resource the container does not set is 0.
pub fn container_resource_value(
    selector: &ResourceFieldSelector,
    container: &Container,
) -> Result<String, String> {
    let divisor = match selector.divisor.as_ref() {
        None => Quantity(NANO),
        Some(q) => match Quantity::parse(q.0.trim()) {
            Some(Quantity(0)) => Quantity(NANO),
            Some(q) => q,
            None => return Err(format!("invalid divisor: {}", q.0)),
        },
    };
    let resources = container.resources.as_ref();
    let value = |limits: bool, name: &str| -> Quantity {
        resources
            .and_then(|r| {
                if limits {
                    r.limits.as_ref()
                } else {
                    r.requests.as_ref()
                }
            })
            .and_then(|l| l.get(name))
            .and_then(|q| Quantity::parse(q.0.trim()))
            .unwrap_or(Quantity(0))
    };
    let (limits, name) = match selector.resource.split_once('.') {
        Some(("limits", name)) => (true, name),
        Some(("requests", name)) => (false, name),
        _ => return Err(unsupported(&selector.resource)),
    };
    match name {
        "cpu" => {
            let milli = ceil_div(value(limits, name).0, NANO_PER_MILLI);
            let divisor = ceil_div(divisor.0, NANO_PER_MILLI);
            Ok(ceil_div_checked(milli, divisor)?.to_string())
        }
        "memory" | "ephemeral-storage" => {
            let bytes = ceil_div(value(limits, name).0, NANO);
            Ok(ceil_div_checked(bytes, ceil_div(divisor.0, NANO))?.to_string())
        }
        hugepages if hugepages.starts_with("hugepages-") => {
            let bytes = ceil_div(value(limits, name).0, NANO);
            Ok(ceil_div_checked(bytes, ceil_div(divisor.0, NANO))?.to_string())
        }
        _ => Err(unsupported(&selector.resource)),
    }
}

fn unsupported(resource: &str) -> String {
    format!("unsupported container resource : {resource}")
}

/// `a / b` rounded towards positive infinity (Kubernetes' `MilliValue` and `Value` round up).
fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        q + 1
    } else {
        q
    }
}

/// [`ceil_div`] refusing a divisor that rounds to zero (a `500m` divisor of memory; the
/// apiserver's validation allows none, so this guards a corrupt object, not a user).
fn ceil_div_checked(a: i128, b: i128) -> Result<i128, String> {
    if b == 0 {
        return Err("the divisor is zero".to_string());
    }
    Ok(ceil_div(a, b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use k8s_openapi::api::core::v1::ResourceRequirements;

    use super::*;

    fn q(s: &str) -> ApiQuantity {
        ApiQuantity(s.to_string())
    }

    fn container(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
        let list = |l: &[(&str, &str)]| {
            Some(
                l.iter()
                    .map(|(k, v)| (k.to_string(), q(v)))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: list(limits),
                requests: list(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn selector(resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            resource: resource.into(),
            divisor: divisor.map(q),
            container_name: None,
        }
    }

    /// Upstream's `TestExtractResourceValue` cases, in our words.
    #[test]
    fn resources_in_units_of_the_divisor_rounded_up() {
        let c = container(
            &[("cpu", "2"), ("memory", "128Mi"), ("hugepages-2Mi", "4Mi")],
            &[
                ("cpu", "250m"),
                ("memory", "100M"),
                ("ephemeral-storage", "1Gi"),
            ],
        );
        let cases = [
            ("limits.cpu", None, "2"),
            ("limits.cpu", Some("1m"), "2000"),
            ("requests.cpu", None, "1"),
            ("requests.cpu", Some("1m"), "250"),
            ("requests.cpu", Some("0"), "1"),
            ("limits.memory", None, "134217728"),
            ("limits.memory", Some("1Mi"), "128"),
            ("limits.memory", Some("1M"), "135"),
            ("requests.memory", Some("1Mi"), "96"),
            ("requests.ephemeral-storage", Some("1Gi"), "1"),
            ("limits.ephemeral-storage", None, "0"),
            ("limits.hugepages-2Mi", Some("1Mi"), "4"),
            ("requests.hugepages-2Mi", None, "0"),
        ];
        for (resource, divisor, want) in cases {
            assert_eq!(
                container_resource_value(&selector(resource, divisor), &c).unwrap(),
                want,
                "{resource} / {divisor:?}"
            );
        }
        assert_eq!(
            container_resource_value(&selector("limits.gpu", None), &c).unwrap_err(),
            "unsupported container resource : limits.gpu"
        );
        assert_eq!(
            container_resource_value(&selector("cpu", None), &c).unwrap_err(),
            "unsupported container resource : cpu"
        );
    }

    #[test]
    fn missing_or_zero_limits_are_the_nodes_allocatable() {
        let allocatable: Allocatable = [
            ("cpu".to_string(), q("4")),
            ("memory".to_string(), q("8Gi")),
            ("ephemeral-storage".to_string(), q("100Gi")),
            ("hugepages-2Mi".to_string(), q("1Gi")),
        ]
        .into();
        let merged = merge_limits(
            &container(&[("cpu", "0"), ("memory", "1Gi")], &[]),
            &allocatable,
        );
        let limits = merged.resources.unwrap().limits.unwrap();
        assert_eq!(limits["cpu"], q("4"), "a zero limit is defaulted");
        assert_eq!(limits["memory"], q("1Gi"), "a set limit stays");
        assert_eq!(limits["ephemeral-storage"], q("100Gi"));
        assert!(
            !limits.contains_key("hugepages-2Mi"),
            "hugepages are never defaulted"
        );
    }

    #[test]
    fn labels_and_annotations_as_sorted_quoted_lines() {
        let map: BTreeMap<String, String> = [
            ("zeta", "last"),
            ("alpha", "line one\nline \"two\""),
            ("app.kubernetes.io/name", "web"),
            ("tab", "a\tb\\c"),
            ("uni", "héllo\u{7f}\u{85}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            format_map(Some(&map)),
            "alpha=\"line one\\nline \\\"two\\\"\"\n\
             app.kubernetes.io/name=\"web\"\n\
             tab=\"a\\tb\\\\c\"\n\
             uni=\"héllo\\x7f\\u0085\"\n\
             zeta=\"last\""
        );
        assert_eq!(format_map(None), "");
    }

    #[test]
    fn field_paths_and_their_errors() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web"}, "annotations": {"Note": "x"}},
        }))
        .unwrap();
        assert_eq!(extract_field_path(&pod, "metadata.name").unwrap(), "web-0");
        assert_eq!(
            extract_field_path(&pod, "metadata.namespace").unwrap(),
            "shop"
        );
        assert_eq!(extract_field_path(&pod, "metadata.uid").unwrap(), "u-1");
        assert_eq!(
            extract_field_path(&pod, "metadata.labels['app']").unwrap(),
            "web"
        );
        assert_eq!(
            extract_field_path(&pod, "metadata.labels['none']").unwrap(),
            ""
        );
        // Annotation keys are checked in lower case, looked up as written.
        assert_eq!(
            extract_field_path(&pod, "metadata.annotations['Note']").unwrap(),
            "x"
        );
        assert!(
            extract_field_path(&pod, "metadata.labels['bad key']")
                .unwrap_err()
                .starts_with("invalid key subscript in metadata.labels['bad key']: ")
        );
        assert_eq!(
            extract_field_path(&pod, "metadata.name['x']").unwrap_err(),
            "fieldPath \"metadata.name['x']\" does not support subscript"
        );
        assert_eq!(
            extract_field_path(&pod, "spec.restartPolicy").unwrap_err(),
            "unsupported fieldPath: spec.restartPolicy"
        );
        assert_eq!(
            convert_field_label(None, "spec.host").unwrap(),
            "spec.nodeName"
        );
        assert_eq!(
            convert_field_label(Some("v2"), "metadata.name").unwrap_err(),
            "unsupported pod version: v2"
        );
        assert_eq!(
            convert_field_label(None, "spec.nodeName['x']").unwrap_err(),
            "field label does not support subscript: spec.nodeName['x']"
        );
        assert_eq!(
            convert_field_label(None, "status.reason").unwrap_err(),
            "field label not supported: status.reason"
        );
    }
}
