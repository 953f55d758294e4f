//! Tests of the OpenAPI documents: what kubectl reads from them, decoded the way it decodes
//! them, and the HTTP behaviour of the handlers.

use http::{HeaderMap, HeaderValue, header};
use http_body_util::BodyExt;
use prost::Message;
use serde_json::{Value, json};
use skerry_api::catalogue::RESOURCES;

use super::*;

/// What client-go's discovery client sends for `/openapi/v2` (`openAPIV2mimePb`).
const CLIENT_GO_V2_ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

fn docs() -> &'static Documents {
    documents().expect("the documents build")
}

fn v2_protobuf() -> pb::Document {
    pb::Document::decode(docs().v2_protobuf.bytes.clone()).expect("the v2 protobuf decodes")
}

fn v2_json() -> Value {
    serde_json::from_slice(&docs().v2_json.bytes).expect("the v2 JSON parses")
}

fn v3_json(group_version: &str) -> Value {
    let encoded = docs()
        .v3
        .get(group_version)
        .expect("group-version is served");
    serde_json::from_slice(&encoded.bytes).expect("the v3 JSON parses")
}

fn definition<'a>(doc: &'a pb::Document, name: &str) -> &'a pb::Schema {
    doc.definitions
        .as_ref()
        .expect("definitions")
        .additional_properties
        .iter()
        .find(|d| d.name == name)
        .and_then(|d| d.value.as_ref())
        .unwrap_or_else(|| panic!("{name} is defined"))
}

fn property<'a>(schema: &'a pb::Schema, name: &str) -> &'a pb::Schema {
    schema
        .properties
        .as_ref()
        .expect("properties")
        .additional_properties
        .iter()
        .find(|p| p.name == name)
        .and_then(|p| p.value.as_ref())
        .unwrap_or_else(|| panic!("property {name}"))
}

/// A vendor extension as kube-openapi reads it: `Any.yaml` through a YAML decoder.
fn extension(extensions: &[pb::NamedAny], name: &str) -> Option<serde_yaml_ng::Value> {
    extensions.iter().find(|e| e.name == name).map(|e| {
        let yaml = &e.value.as_ref().expect("extension value").yaml;
        serde_yaml_ng::from_str(yaml).expect("extension values are YAML")
    })
}

fn yaml(value: Value) -> serde_yaml_ng::Value {
    serde_yaml_ng::to_value(value).expect("JSON converts to YAML")
}

async fn body_bytes(response: Response<Body>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("bodies are infallible")
        .to_bytes()
}

#[test]
fn v2_protobuf_has_pod_with_its_group_version_kind() {
    let doc = v2_protobuf();
    assert_eq!(doc.swagger, "2.0");
    let pod = definition(&doc, "io.k8s.api.core.v1.Pod");
    assert!(
        pod.description
            .starts_with("Pod is a collection of containers"),
        "{}",
        pod.description
    );
    assert_eq!(
        extension(&pod.vendor_extension, "x-kubernetes-group-version-kind"),
        Some(yaml(json!([{"group": "", "kind": "Pod", "version": "v1"}])))
    );
    let spec = property(pod, "spec");
    assert_eq!(spec.r#ref, "#/definitions/io.k8s.api.core.v1.PodSpec");
    assert!(
        !spec.description.is_empty(),
        "a described reference keeps its description"
    );
    // kubectl's v2 parser rejects a reference with a type beside it.
    assert!(spec.r#type.is_none());
    // k8s-openapi's `metadata` is not optional in Rust, but is not required in Kubernetes.
    assert!(!pod.required.contains(&"metadata".to_string()));
}

#[test]
fn v2_protobuf_carries_strategic_merge_patch_extensions() {
    // Reference: PodSpec.containers is `patchStrategy:"merge" patchMergeKey:"name"`, and
    // Container.env the same; kubectl's client-side apply merges these lists by name.
    let doc = v2_protobuf();
    let containers = property(definition(&doc, "io.k8s.api.core.v1.PodSpec"), "containers");
    assert_eq!(
        extension(&containers.vendor_extension, "x-kubernetes-patch-strategy"),
        Some(yaml(json!("merge")))
    );
    assert_eq!(
        extension(&containers.vendor_extension, "x-kubernetes-patch-merge-key"),
        Some(yaml(json!("name")))
    );
    assert_eq!(
        extension(&containers.vendor_extension, "x-kubernetes-list-type"),
        Some(yaml(json!("map")))
    );
    assert_eq!(
        extension(&containers.vendor_extension, "x-kubernetes-list-map-keys"),
        Some(yaml(json!(["name"])))
    );
    let items = &containers
        .items
        .as_ref()
        .expect("an array has items")
        .schema;
    assert_eq!(items.len(), 1, "kubectl requires exactly one items schema");
    assert_eq!(items[0].r#ref, "#/definitions/io.k8s.api.core.v1.Container");

    let env = property(definition(&doc, "io.k8s.api.core.v1.Container"), "env");
    assert_eq!(
        extension(&env.vendor_extension, "x-kubernetes-patch-strategy"),
        Some(yaml(json!("merge")))
    );
    assert_eq!(
        extension(&env.vendor_extension, "x-kubernetes-patch-merge-key"),
        Some(yaml(json!("name")))
    );
    // Volumes retain keys as well as merging (`merge,retainKeys`).
    let volumes = property(definition(&doc, "io.k8s.api.core.v1.PodSpec"), "volumes");
    assert_eq!(
        extension(&volumes.vendor_extension, "x-kubernetes-patch-strategy"),
        Some(yaml(json!("merge,retainKeys")))
    );
}

#[test]
fn v2_protobuf_says_what_the_json_says() {
    let doc = v2_protobuf();
    let json = v2_json();
    let definitions = json["definitions"].as_object().expect("definitions");
    let decoded = &doc
        .definitions
        .as_ref()
        .expect("definitions")
        .additional_properties;
    assert_eq!(decoded.len(), definitions.len());
    for named in decoded {
        let schema = named.value.as_ref().expect("a schema");
        assert_eq!(
            gnostic::schema_to_json(schema),
            definitions[&named.name],
            "{} differs between protobuf and JSON",
            named.name
        );
    }
    let paths = doc.paths.as_ref().expect("paths");
    assert_eq!(
        paths.path.len(),
        json["paths"].as_object().expect("paths").len()
    );
}

#[test]
fn every_served_kind_is_defined_with_its_group_version_kind() {
    let json = v2_json();
    for r in RESOURCES {
        let gvk = json!({"group": r.group, "kind": r.kind, "version": r.version});
        let kinds = &json["definitions"][r.definition]["x-kubernetes-group-version-kind"];
        assert!(
            kinds.as_array().is_some_and(|k| k.contains(&gvk)),
            "{}: {kinds}",
            r.definition
        );
        if r.has_verb("list") {
            let list = &json["definitions"][format!("{}List", r.definition)];
            assert_eq!(
                list["properties"]["items"]["items"]["$ref"],
                format!("#/definitions/{}", r.definition)
            );
            let gvk = json!({"group": r.group, "kind": r.list_kind, "version": r.version});
            assert!(
                list["x-kubernetes-group-version-kind"]
                    .as_array()
                    .is_some_and(|k| k.contains(&gvk))
            );
        }
    }
    let scale = &json["definitions"]["io.k8s.api.autoscaling.v1.Scale"];
    assert_eq!(
        scale["x-kubernetes-group-version-kind"],
        json!([{"group": "autoscaling", "kind": "Scale", "version": "v1"}])
    );
}

#[test]
fn v2_paths_cover_every_resource() {
    let json = v2_json();
    let paths = json["paths"].as_object().expect("paths");
    let pods = &paths["/api/v1/namespaces/{namespace}/pods/{name}"];
    assert_eq!(pods["patch"]["operationId"], "patchCoreV1NamespacedPod");
    assert_eq!(pods["patch"]["x-kubernetes-action"], "patch");
    assert_eq!(
        pods["patch"]["x-kubernetes-group-version-kind"],
        json!({"group": "", "kind": "Pod", "version": "v1"})
    );
    assert!(paths.contains_key("/api/v1/pods"), "list across namespaces");
    assert_eq!(
        paths["/apis/rbac.authorization.k8s.io/v1/clusterroles"]["get"]["operationId"],
        "listRbacAuthorizationV1ClusterRole"
    );
    assert_eq!(
        paths["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"]["put"]["operationId"],
        "replaceAppsV1NamespacedDeploymentScale"
    );
    // The reviews: a create each, with Kubernetes' operation ids.
    for (path, id) in [
        (
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            "createAuthorizationV1SubjectAccessReview",
        ),
        (
            "/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews",
            "createAuthorizationV1NamespacedLocalSubjectAccessReview",
        ),
        (
            "/apis/authentication.k8s.io/v1/tokenreviews",
            "createAuthenticationV1TokenReview",
        ),
    ] {
        let item = paths[path].as_object().expect(path);
        for method in ["get", "put", "patch", "delete"] {
            assert!(!item.contains_key(method), "{path} {method}");
        }
        assert_eq!(item["post"]["operationId"], id);
    }
    for r in RESOURCES {
        let gvk = json!({"group": r.group, "kind": r.kind, "version": r.version});
        let has_operation = paths.values().any(|item| {
            item.as_object()
                .expect("path item")
                .values()
                .any(|op| op["x-kubernetes-group-version-kind"] == gvk)
        });
        assert!(has_operation, "{} has no operation", r.resource);
    }
}

#[test]
fn connect_subresources_are_operations_answering_a_string() {
    let v2 = v2_json();
    let paths = v2["paths"].as_object().expect("paths");
    let exec = &paths["/api/v1/namespaces/{namespace}/pods/{name}/exec"];
    assert_eq!(
        exec["get"]["operationId"],
        "connectCoreV1GetNamespacedPodExec"
    );
    assert_eq!(
        exec["post"]["operationId"],
        "connectCoreV1PostNamespacedPodExec"
    );
    assert_eq!(exec["post"]["x-kubernetes-action"], "connect");
    assert_eq!(
        exec["post"]["x-kubernetes-group-version-kind"],
        json!({"group": "", "kind": "PodExecOptions", "version": "v1"})
    );
    assert_eq!(
        exec["get"]["responses"]["200"]["schema"],
        json!({"type": "string"})
    );
    assert_eq!(exec["get"]["produces"], json!(["*/*"]));
    let names: Vec<&str> = exec["parameters"]
        .as_array()
        .expect("the path's parameters")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "command",
            "container",
            "name",
            "namespace",
            "stderr",
            "stdin",
            "stdout",
            "tty"
        ]
    );
    assert_eq!(
        exec["parameters"][2]["description"],
        "name of the PodExecOptions"
    );
    let attach = &paths["/api/v1/namespaces/{namespace}/pods/{name}/attach"];
    assert_eq!(
        attach["post"]["operationId"],
        "connectCoreV1PostNamespacedPodAttach"
    );
    let forward = &paths["/api/v1/namespaces/{namespace}/pods/{name}/portforward"];
    assert_eq!(forward["parameters"][2]["name"], "ports");
    assert_eq!(forward["parameters"][2]["type"], "integer");
    // nodes/proxy: every method, with and without a path.
    let proxy = paths["/api/v1/nodes/{name}/proxy"]
        .as_object()
        .expect("proxy");
    for (method, id) in [
        ("delete", "connectCoreV1DeleteNodeProxy"),
        ("get", "connectCoreV1GetNodeProxy"),
        ("head", "connectCoreV1HeadNodeProxy"),
        ("options", "connectCoreV1OptionsNodeProxy"),
        ("patch", "connectCoreV1PatchNodeProxy"),
        ("post", "connectCoreV1PostNodeProxy"),
        ("put", "connectCoreV1PutNodeProxy"),
    ] {
        assert_eq!(proxy[method]["operationId"], id);
    }
    let with_path = &paths["/api/v1/nodes/{name}/proxy/{path}"];
    assert_eq!(
        with_path["get"]["operationId"],
        "connectCoreV1GetNodeProxyWithPath"
    );
    let params: Vec<(&str, &str)> = with_path["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or(""),
                p["in"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        params,
        [("name", "path"), ("path", "path"), ("path", "query")]
    );
    // No schema for the options kinds, as upstream; the protobuf carries the paths' parameters.
    let defs = v2["definitions"].as_object().expect("definitions");
    assert!(!defs.contains_key("io.k8s.api.core.v1.PodExecOptions"));
    let pb = v2_protobuf();
    let item = pb
        .paths
        .as_ref()
        .expect("paths")
        .path
        .iter()
        .find(|p| p.name == "/api/v1/nodes/{name}/proxy/{path}")
        .and_then(|p| p.value.as_ref())
        .expect("the proxy path in protobuf");
    assert_eq!(item.parameters.len(), 3);
    assert!(item.head.is_some() && item.options.is_some());

    // v3: the same operations, the answer as `*/*` content.
    let v3 = v3_json("api/v1");
    let exec = &v3["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/exec"];
    assert_eq!(
        exec["get"]["responses"]["200"]["content"],
        json!({"*/*": {"schema": {"type": "string"}}})
    );
    assert_eq!(exec["parameters"][0]["schema"]["type"], "string");
    // SelfSubjectReview (`kubectl auth whoami`) is served and described.
    let authn = v3_json("apis/authentication.k8s.io/v1");
    assert_eq!(
        authn["paths"]["/apis/authentication.k8s.io/v1/selfsubjectreviews"]["post"]["operationId"],
        "createAuthenticationV1SelfSubjectReview"
    );
}

/// Every `$ref` in `value` names a schema in `schemas`, with `prefix`.
fn assert_references_resolve(
    value: &Value,
    prefix: &str,
    schemas: &serde_json::Map<String, Value>,
) {
    match value {
        Value::Object(object) => {
            if let Some(target) = object.get("$ref") {
                let target = target.as_str().expect("a $ref is a string");
                let name = target
                    .strip_prefix(prefix)
                    .unwrap_or_else(|| panic!("{target} does not start with {prefix}"));
                assert!(schemas.contains_key(name), "{target} does not resolve");
            }
            object
                .values()
                .for_each(|v| assert_references_resolve(v, prefix, schemas));
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| assert_references_resolve(v, prefix, schemas)),
        _ => {}
    }
}

#[test]
fn every_reference_resolves() {
    let v2 = v2_json();
    let definitions = v2["definitions"].as_object().expect("definitions");
    assert_references_resolve(&v2, "#/definitions/", definitions);
    for group_version in docs().v3.keys() {
        let v3 = v3_json(group_version);
        let schemas = v3["components"]["schemas"].as_object().expect("schemas");
        assert_references_resolve(&v3, "#/components/schemas/", schemas);
    }
}

#[test]
fn v3_apps_v1_describes_deployment_for_explain_and_apply() {
    let doc = v3_json("apis/apps/v1");
    assert_eq!(doc["openapi"], "3.0.0");
    let schemas = &doc["components"]["schemas"];
    let deployment = &schemas["io.k8s.api.apps.v1.Deployment"];
    assert!(
        deployment["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Deployment enables declarative updates")),
        "{deployment}"
    );
    assert_eq!(
        deployment["x-kubernetes-group-version-kind"],
        json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
    );
    // A described reference is wrapped in allOf, as Kubernetes' v3 documents have it.
    let spec = &deployment["properties"]["spec"];
    assert_eq!(
        spec["allOf"],
        json!([{"$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"}])
    );
    assert!(spec["description"].as_str().is_some_and(|d| !d.is_empty()));
    let replicas = &schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["replicas"];
    assert_eq!(replicas["type"], "integer");
    assert!(
        replicas["description"]
            .as_str()
            .is_some_and(|d| d.contains("pods"))
    );
    // The pod template's schemas come along, with their patch markers.
    let containers = &schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
    assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
    assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
    assert_eq!(
        schemas["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"],
        "int-or-string"
    );
    // kubectl apply uses the v3 document for a kind only if its PATCH accepts strategic merge.
    let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "apps", "kind": "Deployment", "version": "v1"})
    );
    assert!(
        patch["requestBody"]["content"]
            .get("application/strategic-merge-patch+json")
            .is_some()
    );
    // Only this group-version's paths.
    assert!(
        doc["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .all(|p| p.starts_with("/apis/apps/v1/"))
    );
    assert!(schemas.get("io.k8s.api.rbac.v1.Role").is_none());
}

#[test]
fn v3_index_points_at_each_document_by_hash() {
    let index: Value = serde_json::from_slice(&docs().v3_index.bytes).expect("index parses");
    let paths = index["paths"].as_object().expect("paths");
    for gv in [
        "api/v1",
        "apis/apps/v1",
        "apis/rbac.authorization.k8s.io/v1",
    ] {
        let encoded = docs().v3.get(gv).expect("served");
        assert_eq!(
            paths[gv]["serverRelativeURL"],
            format!("/openapi/v3/{gv}?hash={}", encoded.hash)
        );
    }
    assert_eq!(paths.len(), docs().v3.len());
}

#[test]
fn accept_negotiation_follows_kube_openapi() {
    let offers = [JSON, V2_PROTOBUF_REQUESTED, V2_PROTOBUF];
    assert_eq!(
        negotiate(Some(CLIENT_GO_V2_ACCEPT), &offers),
        Some(V2_PROTOBUF_REQUESTED)
    );
    assert_eq!(negotiate(Some(V2_PROTOBUF), &offers), Some(V2_PROTOBUF));
    assert_eq!(negotiate(None, &offers), Some(JSON));
    assert_eq!(negotiate(Some("*/*"), &offers), Some(JSON));
    assert_eq!(negotiate(Some("application/json"), &offers), Some(JSON));
    assert_eq!(negotiate(Some("text/html"), &offers), None);
    // Preference by q, then concrete before wildcard.
    assert_eq!(
        negotiate(
            Some(&format!("application/json;q=0.5, {CLIENT_GO_V2_ACCEPT}")),
            &offers
        ),
        Some(V2_PROTOBUF_REQUESTED)
    );
    assert_eq!(
        negotiate(Some(&format!("*/*, {V2_PROTOBUF}")), &offers),
        Some(V2_PROTOBUF)
    );
    assert_eq!(negotiate(Some("application/json;q=0"), &offers), None);
}

#[tokio::test]
async fn v2_answers_client_go_in_protobuf_with_an_etag() {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static(CLIENT_GO_V2_ACCEPT),
    );
    let response = answer_v2(&headers).expect("v2 answers");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[header::CONTENT_TYPE], V2_PROTOBUF);
    let etag = response.headers()[header::ETAG].clone();
    let body = body_bytes(response).await;
    pb::Document::decode(body).expect("the body is a gnostic document");

    headers.insert(header::IF_NONE_MATCH, etag);
    let response = answer_v2(&headers).expect("v2 answers");
    assert_eq!(response.status(), 304);
    assert!(body_bytes(response).await.is_empty());

    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    let response = answer_v2(&headers).expect("v2 answers");
    assert_eq!(response.headers()[header::CONTENT_TYPE], JSON);
    let json: Value = serde_json::from_slice(&body_bytes(response).await).expect("JSON");
    assert_eq!(json["swagger"], "2.0");

    headers.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
    assert_eq!(
        answer_v2(&headers).map(|_| ()).map_err(|e| e.code),
        Err(406)
    );
}

#[tokio::test]
async fn v3_hash_urls_are_immutable_and_stale_ones_redirect() {
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    let hash = docs().v3["apis/apps/v1"].hash.clone();

    let response = answer_v3(&headers, "apis/apps/v1", Some(&hash))
        .expect("served")
        .expect("answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()[header::CACHE_CONTROL],
        "public, immutable"
    );
    assert!(response.headers().contains_key(header::EXPIRES));
    let json: Value = serde_json::from_slice(&body_bytes(response).await).expect("JSON");
    assert!(json["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"].is_object());

    let response = answer_v3(&headers, "apis/apps/v1", Some("0123"))
        .expect("served")
        .expect("answers");
    assert_eq!(response.status(), 301);
    assert_eq!(
        response.headers()[header::LOCATION],
        format!("/openapi/v3/apis/apps/v1?hash={hash}").as_str()
    );

    let response = answer_v3(&headers, "api/v1", None)
        .expect("served")
        .expect("answers");
    assert_eq!(response.status(), 200);
    assert!(!response.headers().contains_key(header::CACHE_CONTROL));

    assert!(
        answer_v3(&headers, "apis/batch/v1", None).is_none(),
        "not served: 404"
    );
}

#[test]
fn documents_are_deterministic() {
    // Every node of the appliance must serve the same bytes under the same ETag.
    let again = Documents::build().expect("the documents build");
    assert_eq!(again.v2_protobuf.hash, docs().v2_protobuf.hash);
    assert_eq!(again.v2_json.hash, docs().v2_json.hash);
    assert_eq!(again.v3_index.hash, docs().v3_index.hash);
}
