//! Validation against the messages a 1.32 apiserver answers for the same bodies.

use serde_json::{Value, json};

use super::{validate_create, validate_update};
use crate::catalogue::lookup;
use crate::defaults::apply_defaults;
use crate::{ApiError, Cause};

fn info(group: &str, resource: &str) -> &'static crate::ResourceInfo {
    lookup(group, "v1", resource).expect("resource is served")
}

/// Defaults then validates, as the apiserver does on create.
fn create(group: &str, resource: &str, mut obj: Value) -> Vec<Cause> {
    apply_defaults(info(group, resource), &mut obj);
    validate_create(info(group, resource), &obj)
}

fn update(group: &str, resource: &str, mut old: Value, mut new: Value) -> Vec<Cause> {
    apply_defaults(info(group, resource), &mut old);
    apply_defaults(info(group, resource), &mut new);
    validate_update(info(group, resource), &old, &new)
}

fn fields(causes: &[Cause]) -> Vec<String> {
    causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

fn pod(name: &str, containers: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"containers": containers}})
}

#[test]
fn valid_objects_pass() {
    assert_eq!(
        create(
            "",
            "pods",
            pod("web", json!([{"name": "web", "image": "nginx"}]))
        ),
        vec![]
    );
    let deployment = json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "n", "image": "nginx"}]}}
        }
    });
    assert_eq!(create("apps", "deployments", deployment), vec![]);
    let service = json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}});
    assert_eq!(create("", "services", service), vec![]);
    assert_eq!(
        create("", "namespaces", json!({"metadata": {"name": "team-a"}})),
        vec![]
    );
}

// Reference: `kubectl run Web --image=nginx` against a 1.32 cluster.
#[test]
fn bad_pod_name_reads_like_kubernetes() {
    let causes = create(
        "",
        "pods",
        pod("Web", json!([{"name": "web", "image": "nginx"}])),
    );
    assert_eq!(
        fields(&causes),
        vec![
            "metadata.name: Invalid value: \"Web\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        ]
    );
    assert_eq!(causes[0].reason, "FieldValueInvalid");
    let error = ApiError::invalid("", "Pod", "Web", causes);
    assert!(error.message.starts_with(
        "Pod \"Web\" is invalid: metadata.name: Invalid value: \"Web\": a lowercase RFC 1123"
    ));
}

#[test]
fn names_follow_the_kind() {
    let causes = create(
        "",
        "services",
        json!({"metadata": {"name": "1web", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}}),
    );
    assert!(
        fields(&causes)[0]
            .starts_with("metadata.name: Invalid value: \"1web\": a DNS-1035 label must consist"),
        "{causes:?}"
    );
    let causes = create("", "namespaces", json!({"metadata": {"name": "a.b"}}));
    assert_eq!(
        fields(&causes),
        vec!["metadata.name: Invalid value: \"a.b\": must not contain dots"]
    );
    let causes = create(
        "",
        "configmaps",
        json!({"metadata": {"generateName": "cfg-", "namespace": "default"}}),
    );
    assert_eq!(
        fields(&causes),
        vec!["metadata.name: Required value: name or generateName is required"],
        "generateName is checked as a prefix; the apiserver names the object"
    );
    let causes = create("", "configmaps", json!({"metadata": {"name": "c"}}));
    assert_eq!(fields(&causes), vec!["metadata.namespace: Required value"]);
    let causes = create(
        "",
        "nodes",
        json!({"metadata": {"name": "n1", "namespace": "default"}}),
    );
    assert_eq!(
        fields(&causes),
        vec!["metadata.namespace: Forbidden: not allowed on this type"]
    );
    let causes = create(
        "rbac.authorization.k8s.io",
        "clusterroles",
        json!({"metadata": {"name": "system:controller:x"}}),
    );
    assert_eq!(causes, vec![], "RBAC names only need to be path segments");
}

#[test]
fn bad_labels_and_annotations() {
    let mut p = pod("web", json!([{"name": "web", "image": "nginx"}]));
    p["metadata"]["labels"] = json!({"app": "-bad", "a/b/c": "x"});
    p["metadata"]["annotations"] = json!({"big": "x".repeat(256 * 1024)});
    let causes = fields(&create("", "pods", p));
    assert_eq!(causes.len(), 3, "{causes:#?}");
    assert!(causes.contains(&"metadata.labels: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string()));
    assert!(causes.contains(&"metadata.labels: Invalid value: \"-bad\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string()));
    assert!(causes.contains(
        &"metadata.annotations: Too long: may not be more than 262144 bytes".to_string()
    ));
}

#[test]
fn containers_required_unique_and_with_images() {
    let causes = fields(&create("", "pods", pod("p", json!([]))));
    assert_eq!(causes, vec!["spec.containers: Required value"]);
    let causes = create(
        "",
        "pods",
        pod(
            "p",
            json!([
                {"name": "app", "image": "nginx"},
                {"name": "app", "image": ""},
                {"name": "Bad_Name", "image": "busybox"}
            ]),
        ),
    );
    assert_eq!(
        fields(&causes),
        vec![
            "spec.containers[1].name: Duplicate value: \"app\"",
            "spec.containers[1].image: Required value",
            "spec.containers[2].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ]
    );
    assert_eq!(causes[0].reason, "FieldValueDuplicate");
    assert_eq!(causes[1].reason, "FieldValueRequired");
}

#[test]
fn bad_ports_protocols_and_policies() {
    let mut p = pod(
        "p",
        json!([{
            "name": "c", "image": "nginx",
            "ports": [{"containerPort": 70000}, {"containerPort": 80, "protocol": "ICMP", "name": "http"}, {"containerPort": 81, "name": "http"}]
        }]),
    );
    p["spec"]["restartPolicy"] = json!("Sometimes");
    let causes = fields(&create("", "pods", p));
    assert_eq!(
        causes,
        vec![
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "spec.containers[0].ports[1].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "spec.containers[0].ports[2].name: Duplicate value: \"http\"",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
        ]
    );
}

#[test]
fn resources_and_mounts() {
    let p = pod(
        "p",
        json!([{
            "name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "2", "memory": "lots"}, "limits": {"cpu": "1", "gpu": "1"}},
            "volumeMounts": [{"name": "missing", "mountPath": "/data"}]
        }]),
    );
    let causes = fields(&create("", "pods", p));
    assert_eq!(
        causes,
        vec![
            "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
            "spec.containers[0].resources.limits[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
            // The request was defaulted from the limit, so it is reported too, as in Kubernetes.
            "spec.containers[0].resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
            "spec.containers[0].resources.requests[memory]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
        ]
    );
}

#[test]
fn deployment_selector_and_replicas() {
    let deployment = json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": -1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "other"}}, "spec": {"containers": [{"name": "n", "image": "nginx"}]}}
        }
    });
    assert_eq!(
        fields(&create("apps", "deployments", deployment)),
        vec![
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
            "spec.template.metadata.labels: Invalid value: {\"app\":\"other\"}: `selector` does not match template `labels`",
        ]
    );
    let no_selector = json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "n", "image": "nginx"}]}}}
    });
    assert_eq!(
        fields(&create("apps", "deployments", no_selector)),
        vec!["spec.selector: Required value"]
    );
}

#[test]
fn service_ports() {
    let svc = json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {
        "type": "Magic",
        "ports": [{"port": 80, "name": "http", "targetPort": 0}, {"port": 80, "name": "http"}, {"port": 0}]
    }});
    let causes = fields(&create("", "services", svc));
    assert_eq!(
        causes,
        vec![
            "spec.type: Unsupported value: \"Magic\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
            "spec.ports[1].name: Duplicate value: \"http\"",
            "spec.ports[1]: Duplicate value: {\"AppProtocol\":null,\"Name\":\"\",\"NodePort\":0,\"Port\":80,\"Protocol\":\"TCP\",\"TargetPort\":0}",
            "spec.ports[2].name: Required value",
            "spec.ports[2].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.ports[2].targetPort: Invalid value: 0: must be between 1 and 65535, inclusive",
        ]
    );
}

#[test]
fn config_map_and_secret_keys_and_sizes() {
    let cm = json!({"metadata": {"name": "c", "namespace": "default"}, "data": {"bad/key": "v", "big": "x".repeat(1024 * 1024 + 1)}});
    assert_eq!(
        fields(&create("", "configmaps", cm)),
        vec![
            "data[bad/key]: Invalid value: \"bad/key\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
            ": Too long: may not be more than 1048576 bytes",
        ]
    );
    let tls = json!({"metadata": {"name": "s", "namespace": "default"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "YQ=="}});
    assert_eq!(
        fields(&create("", "secrets", tls)),
        vec!["data[tls.key]: Required value"]
    );
}

#[test]
fn rbac_rules_and_bindings() {
    let role = json!({"metadata": {"name": "r", "namespace": "default"}, "rules": [{"apiGroups": [""], "resources": ["pods"]}]});
    assert_eq!(
        fields(&create("rbac.authorization.k8s.io", "roles", role)),
        vec!["rules[0].verbs: Required value: verbs must contain at least one value"]
    );
    let binding = json!({"metadata": {"name": "b"}, "roleRef": {"kind": "Role", "name": "r"}, "subjects": [{"kind": "Robot", "name": "x"}, {"kind": "ServiceAccount", "name": "sa"}]});
    assert_eq!(
        fields(&create(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            binding
        )),
        vec![
            "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
            "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            "subjects[1].namespace: Required value",
        ]
    );
}

#[test]
fn lease_and_endpoint_slice() {
    let lease = json!({"metadata": {"name": "l", "namespace": "kube-system"}, "spec": {"leaseDurationSeconds": 0}});
    assert_eq!(
        fields(&create("coordination.k8s.io", "leases", lease)),
        vec!["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]
    );
    let slice = json!({"metadata": {"name": "s", "namespace": "default"}, "addressType": "IPv5", "endpoints": [{"addresses": []}]});
    assert_eq!(
        fields(&create("discovery.k8s.io", "endpointslices", slice)),
        vec![
            "addressType: Unsupported value: \"IPv5\": supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
            "endpoints[0].addresses: Required value: must contain at least 1 address",
        ]
    );
}

#[test]
fn updates_keep_immutable_fields() {
    let old = pod("p", json!([{"name": "c", "image": "nginx:1"}]));
    let image_change = pod("p", json!([{"name": "c", "image": "nginx:2"}]));
    assert_eq!(update("", "pods", old.clone(), image_change), vec![]);
    let mut port_change = pod(
        "p",
        json!([{"name": "c", "image": "nginx:1", "ports": [{"containerPort": 80}]}]),
    );
    port_change["metadata"]["labels"] = json!({"labels": "may-change"});
    let causes = update("", "pods", old, port_change);
    assert_eq!(causes.len(), 1);
    assert!(causes[0].message.starts_with(
        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
    ));

    let deployment = |app: &str| {
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "n", "image": "nginx"}]}}
            }
        })
    };
    assert_eq!(
        fields(&update(
            "apps",
            "deployments",
            deployment("a"),
            deployment("b")
        )),
        vec!["spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"b\"}}: field is immutable",]
    );

    let svc = |ip: &str| json!({"metadata": {"name": "s", "namespace": "default"}, "spec": {"clusterIP": ip, "ports": [{"port": 80}]}});
    assert_eq!(
        fields(&update(
            "",
            "services",
            svc("10.96.0.10"),
            svc("10.96.0.11")
        )),
        vec![
            "spec.clusterIPs[0]: Invalid value: [\"10.96.0.11\"]: may not change once set",
            "spec.clusterIP: Invalid value: \"10.96.0.11\": field is immutable",
        ]
    );

    let frozen = |v: &str| json!({"metadata": {"name": "c", "namespace": "default"}, "immutable": true, "data": {"k": v}});
    assert_eq!(
        fields(&update("", "configmaps", frozen("1"), frozen("2"))),
        vec!["data: Forbidden: field is immutable when `immutable` is set",]
    );
    let renamed = json!({"metadata": {"name": "d", "namespace": "default"}});
    assert_eq!(
        fields(&update(
            "",
            "configmaps",
            json!({"metadata": {"name": "c", "namespace": "default"}}),
            renamed
        )),
        vec!["metadata.name: Invalid value: \"d\": field is immutable",]
    );
}

#[test]
fn wrong_json_types_are_reported_not_panicked_on() {
    let causes = create(
        "",
        "pods",
        json!({"metadata": {"name": 5, "namespace": "default"}, "spec": {"containers": "nope"}}),
    );
    assert!(
        causes
            .iter()
            .any(|c| c.reason == "FieldValueTypeInvalid" && c.field == "metadata.name"),
        "{causes:?}"
    );
    assert!(
        causes.iter().any(|c| c.field == "spec.containers"),
        "{causes:?}"
    );
    assert!(!validate_create(info("", "pods"), &json!([1, 2])).is_empty());
}

// Reference: pkg/apis/scheduling/validation of 1.32 (ValidatePriorityClass and its update).
#[test]
fn priority_classes() {
    let class = |name: &str, value: i64| json!({"metadata": {"name": name}, "value": value});
    let group = "scheduling.k8s.io";
    assert_eq!(
        create(group, "priorityclasses", class("high", 1_000_000_000)),
        vec![]
    );
    assert_eq!(
        fields(&create(
            group,
            "priorityclasses",
            class("higher", 1_000_000_001)
        )),
        vec!["value: Forbidden: maximum allowed value of a user defined priority is 1000000000"]
    );
    assert_eq!(
        fields(&create(group, "priorityclasses", class("system-mine", 5))),
        vec![
            "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority class"
        ]
    );
    assert_eq!(
        create(
            group,
            "priorityclasses",
            class("system-cluster-critical", 2_000_000_000)
        ),
        vec![]
    );
    // Value and preemptionPolicy are fixed; the description may change.
    let old = class("high", 1000);
    let mut new = class("high", 2000);
    new["preemptionPolicy"] = json!("Never");
    new["description"] = json!("now documented");
    assert_eq!(
        fields(&update(group, "priorityclasses", old.clone(), new)),
        vec![
            "value: Forbidden: may not be changed in an update.",
            "preemptionPolicy: Invalid value: \"Never\": field is immutable"
        ]
    );
    let mut described = old.clone();
    described["description"] = json!("now documented");
    assert_eq!(update(group, "priorityclasses", old, described), vec![]);
}

// Reference: pkg/apis/policy/validation of 1.32 (ValidatePodDisruptionBudgetSpec).
#[test]
fn pod_disruption_budgets() {
    let pdb =
        |spec: Value| json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec});
    assert_eq!(
        create(
            "policy",
            "poddisruptionbudgets",
            pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}))
        ),
        vec![]
    );
    let causes = create(
        "policy",
        "poddisruptionbudgets",
        pdb(
            json!({"minAvailable": 1, "maxUnavailable": "10%", "selector": {"matchLabels": {"app": "web/x"}}}),
        ),
    );
    let fields = fields(&causes);
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert!(fields[0].starts_with("spec: Invalid value: "), "{fields:?}");
    assert!(
        fields[0].ends_with(": minAvailable and maxUnavailable cannot be both set"),
        "{fields:?}"
    );
    assert!(
        fields[1].starts_with("spec.selector.matchLabels: Invalid value: \"web/x\""),
        "{fields:?}"
    );
}

#[test]
fn the_mirror_annotation_is_neither_added_changed_nor_removed() {
    let plain = pod("p", json!([{"name": "c", "image": "nginx:1"}]));
    let mut mirror = plain.clone();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    let mut other_hash = plain.clone();
    other_hash["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "def"});
    let path = "metadata.annotations[kubernetes.io/config.mirror]";
    assert_eq!(
        fields(&update("", "pods", plain.clone(), mirror.clone())),
        vec![format!("{path}: Forbidden: field is forbidden")]
    );
    assert_eq!(
        fields(&update("", "pods", mirror.clone(), plain)),
        vec![format!("{path}: Forbidden: field is immutable")]
    );
    assert_eq!(
        fields(&update("", "pods", mirror.clone(), other_hash)),
        vec![format!("{path}: Forbidden: field is immutable")]
    );
    let mut relabelled = mirror.clone();
    relabelled["metadata"]["labels"] = json!({"a": "b"});
    assert_eq!(update("", "pods", mirror, relabelled), vec![]);
}
