//! API discovery: the legacy documents (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`) and the
//! aggregated one kubectl 1.32 asks for first (`apidiscovery.k8s.io/v2`), both built from the
//! catalogue, and `/version`.
//!
//! kubectl recognises the aggregated form only by its exact content type
//! ([`AGGREGATED_CONTENT_TYPE`]); any other answer makes it fall back to the legacy documents,
//! which other clients use too, so both are served.

use serde_json::{Value, json};
use skerry_api::catalogue::{RESOURCES, ResourceInfo, groups};

/// The content type that marks an aggregated discovery answer; kubectl matches it exactly.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The Kubernetes minor version skerry implements: the API level of the k8s-openapi types
/// it serves (feature `v1_32`). The kubectl dispatcher on the machine runs its bundled
/// kubectl of the same minor.
pub const KUBERNETES_MINOR: &str = "32";

/// `GET /version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("v1.{KUBERNETES_MINOR}.0-skerry.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// Go's names for the architecture (`amd64`, `arm64`), which clients print.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `GET /api`: the core group's versions.
pub fn legacy_api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `GET /apis`: every named group.
pub fn legacy_api_groups() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .filter(|g| !g.is_empty())
        .map(|g| {
            let versions = versions_of(g);
            json!({
                "name": g,
                "versions": versions.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect::<Vec<_>>(),
                "preferredVersion": {"groupVersion": format!("{g}/{}", versions[0]), "version": versions[0]},
            })
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`: one group, or `None` if it is not served.
pub fn legacy_api_group(group: &str) -> Option<Value> {
    let versions = versions_of(group);
    if group.is_empty() || versions.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect::<Vec<_>>(),
        "preferredVersion": {"groupVersion": format!("{group}/{}", versions[0]), "version": versions[0]},
    }))
}

fn versions_of(group: &str) -> Vec<&'static str> {
    let mut versions = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    versions
}

/// `GET /api/v1`, `GET /apis/<group>/<version>`: the resources of one group-version, with a
/// separate entry per subresource as Kubernetes lists them.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let resources: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in &resources {
        let mut entry = json!({
            "name": r.resource,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        for s in r.subresources {
            let mut sub = json!({
                "name": format!("{}/{}", r.resource, s.name),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": s.kind,
                "verbs": s.verbs,
            });
            if let Some((g, v)) = s.group_version {
                sub["group"] = json!(g);
                sub["version"] = json!(v);
            }
            list.push(sub);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    }))
}

/// The aggregated discovery document: for `/api` the core group only, for `/apis` every
/// named group.
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = groups()
        .into_iter()
        .filter(|g| g.is_empty() == core)
        .map(|g| {
            let versions: Vec<Value> = versions_of(g)
                .into_iter()
                .map(|v| {
                    let resources: Vec<Value> = RESOURCES
                        .iter()
                        .filter(|r| r.group == g && r.version == v)
                        .map(aggregated_resource)
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

fn aggregated_resource(r: &ResourceInfo) -> Value {
    let mut entry = json!({
        "resource": r.resource,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": r.verbs,
    });
    if !r.short_names.is_empty() {
        entry["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        entry["categories"] = json!(r.categories);
    }
    if !r.subresources.is_empty() {
        entry["subresources"] = r
            .subresources
            .iter()
            .map(|s| {
                let (g, v) = s.group_version.unwrap_or((r.group, r.version));
                json!({"subresource": s.name, "responseKind": {"group": g, "version": v, "kind": s.kind}, "verbs": s.verbs})
            })
            .collect();
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_documents_cover_the_catalogue() {
        let core = resource_list("", "v1").expect("core group");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            names.contains(&"pods")
                && names.contains(&"pods/status")
                && names.contains(&"namespaces")
        );
        assert!(resource_list("apps", "v1").is_some());
        assert!(resource_list("apps", "v2").is_none());
        let groups = legacy_api_groups();
        assert!(
            groups["groups"]
                .as_array()
                .expect("groups")
                .iter()
                .any(|g| g["name"] == "apps")
        );
        assert!(legacy_api_group("").is_none());
    }

    #[test]
    fn aggregated_splits_core_from_named_groups() {
        let core = aggregated(true);
        assert_eq!(core["items"].as_array().expect("items").len(), 1);
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        let named = aggregated(false);
        let items = named["items"].as_array().expect("items");
        assert!(items.iter().all(|i| i["metadata"]["name"] != ""));
        let apps = items
            .iter()
            .find(|i| i["metadata"]["name"] == "apps")
            .expect("apps");
        let deploy = apps["versions"][0]["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["resource"] == "deployments")
            .expect("deployments");
        assert_eq!(deploy["subresources"][1]["responseKind"]["kind"], "Scale");
        assert_eq!(
            deploy["subresources"][1]["responseKind"]["group"],
            "autoscaling"
        );
    }

    #[test]
    fn connect_subresources_are_listed_with_their_options_kinds() {
        let core = resource_list("", "v1").expect("core group");
        let find = |name: &str| {
            core["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .find(|r| r["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} is listed"))
        };
        for (name, kind, verbs) in [
            ("pods/attach", "PodAttachOptions", json!(["create", "get"])),
            ("pods/exec", "PodExecOptions", json!(["create", "get"])),
            (
                "pods/portforward",
                "PodPortForwardOptions",
                json!(["create", "get"]),
            ),
            (
                "nodes/proxy",
                "NodeProxyOptions",
                json!(["create", "delete", "get", "patch", "update"]),
            ),
        ] {
            let entry = find(name);
            assert_eq!(entry["kind"], kind, "{name}");
            assert_eq!(entry["verbs"], verbs, "{name}");
            assert!(entry.get("group").is_none(), "{name}");
        }
        let agg = aggregated(true);
        let nodes = agg["items"][0]["versions"][0]["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["resource"] == "nodes")
            .cloned()
            .expect("nodes");
        assert_eq!(nodes["subresources"][0]["subresource"], "proxy");
        assert_eq!(
            nodes["subresources"][0]["responseKind"]["kind"],
            "NodeProxyOptions"
        );
    }

    #[test]
    fn version_reports_the_implemented_minor() {
        assert_eq!(version()["minor"], KUBERNETES_MINOR);
    }
}
