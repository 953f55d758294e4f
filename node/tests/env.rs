//! A container's environment built from objects in a real in-process apiserver (through
//! [`ApiLookup`]): every source, `envFrom` with prefixes and skipped keys, optional and
//! missing references with upstream's errors, the downward API's fields and resources,
//! service links, and `$(VAR)` expansion in values, command and args.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::config::{Config, Credentials};
use skerry_client::{Api, Client, PostParams};
use skerry_node::env::{
    ApiLookup, EnvInput, Environment, REASON_CREATE_CONTAINER_CONFIG_ERROR,
    expand_command_and_args, make_environment,
};

fn client(server: &TestServer) -> Client {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    config.qps = 0.0;
    Client::new(config).unwrap()
}

async fn create<K>(client: &Client, namespace: Option<&str>, object: serde_json::Value) -> K
where
    K: skerry_client::object::Object
        + k8s_openapi::Resource
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Clone,
{
    let api: Api<K> = client.api(namespace);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap()
}

/// The objects every test reads: namespace `shop`, a ConfigMap, a Secret and two Services.
async fn fixture() -> (TestServer, Client) {
    let server = TestServer::start().await.unwrap();
    let client = client(&server);
    create::<Namespace>(&client, None, json!({"metadata": {"name": "shop"}})).await;
    create::<ConfigMap>(
        &client,
        Some("shop"),
        json!({"metadata": {"name": "settings"},
               "data": {"LOG_LEVEL": "debug", "mode": "fast", "1BAD": "x", "2ALSO": "y"}}),
    )
    .await;
    create::<Secret>(
        &client,
        Some("shop"),
        // "aHVudGVyMg==" is base64 of "hunter2": the environment gets the decoded bytes.
        json!({"metadata": {"name": "creds"}, "data": {"PASSWORD": "aHVudGVyMg=="},
               "stringData": {"USER": "admin"}}),
    )
    .await;
    create::<Service>(
        &client,
        Some("shop"),
        json!({"metadata": {"name": "my-db"},
               "spec": {"ports": [{"name": "pg", "port": 5432}, {"name": "metrics", "port": 9187}]}}),
    )
    .await;
    create::<Service>(
        &client,
        Some("shop"),
        json!({"metadata": {"name": "headless"},
               "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
    )
    .await;
    (server, client)
}

fn pod(containers: serde_json::Value, enable_service_links: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "shop", "uid": "uid-123",
                     "labels": {"app": "web", "tier": "front"},
                     "annotations": {"team": "payments"}},
        "spec": {"nodeName": "node-a", "serviceAccountName": "robot",
                 "enableServiceLinks": enable_service_links,
                 "containers": containers},
    }))
    .unwrap()
}

async fn environment(
    client: &Client,
    pod: &Pod,
) -> Result<Environment, skerry_node::env::EnvError> {
    let allocatable: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("8Gi".into())),
        ("ephemeral-storage".to_string(), Quantity("50Gi".into())),
    ]
    .into();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let pod_ips = ["10.244.0.7".to_string(), "fd00::7".to_string()];
    let host_ips = ["192.168.1.10".to_string(), "fd00::10".to_string()];
    make_environment(
        EnvInput {
            pod,
            container,
            pod_ips: &pod_ips,
            host_ips: &host_ips,
            node_allocatable: &allocatable,
        },
        &ApiLookup::new(client.clone()),
    )
    .await
}

fn map(env: &Environment) -> BTreeMap<String, String> {
    env.to_map()
}

#[tokio::test]
async fn every_source_resolves() {
    let (_server, client) = fixture().await;
    let p = pod(
        json!([{
            "name": "app", "image": "busybox",
            "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "250m"}},
            "env": [
                {"name": "PLAIN", "value": "hello"},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LOG_LEVEL"}}},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "PASSWORD"}}},
                {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "USER"}}},
                {"name": "MAYBE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope", "optional": true}}},
                {"name": "NOCM", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                {"name": "NOSECRET", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NS", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
                {"name": "LABELS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "OLD_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.host"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "HOST_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIPs"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
                {"name": "MEM_LIMIT_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_REQ_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "EPH_GI", "valueFrom": {"resourceFieldRef": {"containerName": "app", "resource": "limits.ephemeral-storage", "divisor": "1Gi"}}},
            ],
        }]),
        true,
    );
    let env = environment(&client, &p).await.unwrap();
    let vars = map(&env);
    let want = [
        ("PLAIN", "hello"),
        ("LEVEL", "debug"),
        ("PASS", "hunter2"),
        ("USER", "admin"),
        ("POD_NAME", "web-0"),
        ("POD_NS", "shop"),
        ("POD_UID", "uid-123"),
        ("APP", "web"),
        ("TEAM", "payments"),
        ("LABELS", "app=\"web\"\ntier=\"front\""),
        ("NODE", "node-a"),
        ("OLD_NODE", "node-a"),
        ("SA", "robot"),
        ("HOST_IP", "192.168.1.10"),
        ("HOST_IPS", "192.168.1.10,fd00::10"),
        ("POD_IP", "10.244.0.7"),
        ("POD_IPS", "10.244.0.7,fd00::7"),
        ("MEM_LIMIT_MI", "256"),
        // No CPU limit: the node's allocatable.
        ("CPU_LIMIT", "4"),
        ("CPU_REQ_M", "250"),
        ("EPH_GI", "50"),
    ];
    for (name, value) in want {
        assert_eq!(vars.get(name).map(String::as_str), Some(value), "{name}");
    }
    for skipped in ["MAYBE", "NOCM", "NOSECRET"] {
        assert!(
            !vars.contains_key(skipped),
            "an optional miss sets nothing: {skipped}"
        );
    }
    assert!(env.events.is_empty());
}

#[tokio::test]
async fn env_from_with_prefix_skips_invalid_names_with_an_event() {
    let (_server, client) = fixture().await;
    let p = pod(
        json!([{
            "name": "app", "image": "busybox",
            "envFrom": [
                {"configMapRef": {"name": "settings"}},
                {"prefix": "S_", "secretRef": {"name": "creds"}},
                {"configMapRef": {"name": "absent", "optional": true}},
            ],
            // env overrides envFrom.
            "env": [{"name": "mode", "value": "slow"}],
        }]),
        true,
    );
    let env = environment(&client, &p).await.unwrap();
    let vars = map(&env);
    assert_eq!(vars["LOG_LEVEL"], "debug");
    assert_eq!(vars["mode"], "slow");
    assert_eq!(vars["S_PASSWORD"], "hunter2");
    assert_eq!(vars["S_USER"], "admin");
    assert!(!vars.contains_key("1BAD") && !vars.contains_key("2ALSO"));
    assert_eq!(env.events.len(), 1);
    let event = &env.events[0];
    assert_eq!(
        (event.type_, event.reason),
        ("Warning", "InvalidEnvironmentVariableNames")
    );
    assert_eq!(
        event.message,
        "Keys [1BAD, 2ALSO] from the EnvFrom configMap shop/settings were skipped since they are considered invalid environment variable names."
    );
}

#[tokio::test]
async fn missing_references_fail_as_upstream_words_them() {
    let (_server, client) = fixture().await;
    let cases = [
        (
            json!({"configMapKeyRef": {"name": "settings", "key": "nope"}}),
            "couldn't find key nope in ConfigMap shop/settings",
        ),
        (
            json!({"secretKeyRef": {"name": "creds", "key": "nope"}}),
            "couldn't find key nope in Secret shop/creds",
        ),
        (
            json!({"configMapKeyRef": {"name": "absent", "key": "k"}}),
            "configmap \"absent\" not found",
        ),
        (
            json!({"secretKeyRef": {"name": "absent", "key": "k"}}),
            "secret \"absent\" not found",
        ),
        (
            json!({"fieldRef": {"fieldPath": "status.phase"}}),
            "unsupported fieldPath: status.phase",
        ),
        (
            json!({"resourceFieldRef": {"resource": "limits.gpu"}}),
            "unsupported container resource : limits.gpu",
        ),
        (
            json!({"resourceFieldRef": {"containerName": "ghost", "resource": "limits.cpu"}}),
            "container ghost not found",
        ),
    ];
    for (value_from, want) in cases {
        let p = pod(
            json!([{"name": "app", "image": "busybox",
                    "env": [{"name": "X", "valueFrom": value_from}]}]),
            true,
        );
        let err = environment(&client, &p).await.unwrap_err();
        assert_eq!(err.message, want);
        assert_eq!(err.reason(), REASON_CREATE_CONTAINER_CONFIG_ERROR);
        assert_eq!(err.event().reason, "Failed");
        assert_eq!(err.event().message, format!("Error: {want}"));
    }
    let p = pod(
        json!([{"name": "app", "image": "busybox", "envFrom": [{"secretRef": {"name": "absent"}}]}]),
        true,
    );
    assert_eq!(
        environment(&client, &p).await.unwrap_err().message,
        "secret \"absent\" not found"
    );
}

#[tokio::test]
async fn service_links_and_the_master_service() {
    let (_server, client) = fixture().await;
    let services: Api<Service> = client.api(Some("shop"));
    let db_ip = services
        .get("my-db")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let master: Api<Service> = client.api(Some("default"));
    let master_ip = master
        .get("kubernetes")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let container = json!([{"name": "app", "image": "busybox"}]);

    let vars = map(&environment(&client, &pod(container.clone(), true))
        .await
        .unwrap());
    assert_eq!(vars["MY_DB_SERVICE_HOST"], db_ip);
    assert_eq!(vars["MY_DB_SERVICE_PORT"], "5432");
    assert_eq!(vars["MY_DB_SERVICE_PORT_METRICS"], "9187");
    assert_eq!(vars["MY_DB_SERVICE_PORT_PG"], "5432");
    assert_eq!(vars["MY_DB_PORT"], format!("tcp://{db_ip}:5432"));
    assert_eq!(vars["MY_DB_PORT_9187_TCP_ADDR"], db_ip);
    assert_eq!(vars["KUBERNETES_SERVICE_HOST"], master_ip);
    assert_eq!(vars["KUBERNETES_SERVICE_PORT"], "443");
    assert_eq!(vars["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
    assert_eq!(
        vars["KUBERNETES_PORT_443_TCP"],
        format!("tcp://{master_ip}:443")
    );
    assert!(
        !vars.keys().any(|k| k.starts_with("HEADLESS")),
        "no variables for a headless service"
    );

    // Links off: only the master service.
    let vars = map(&environment(&client, &pod(container, false)).await.unwrap());
    assert!(!vars.keys().any(|k| k.starts_with("MY_DB")));
    assert_eq!(vars["KUBERNETES_SERVICE_HOST"], master_ip);

    // The container's own variable wins over a service variable.
    let own = json!([{"name": "app", "image": "busybox",
                      "env": [{"name": "MY_DB_SERVICE_HOST", "value": "mine"}]}]);
    let env = environment(&client, &pod(own, true)).await.unwrap();
    let hosts: Vec<_> = env
        .vars
        .iter()
        .filter(|(k, _)| k == "MY_DB_SERVICE_HOST")
        .collect();
    assert_eq!(
        hosts,
        [&("MY_DB_SERVICE_HOST".to_string(), "mine".to_string())],
        "once, the container's"
    );
}

#[tokio::test]
async fn expansion_sees_earlier_variables_and_services_only() {
    let (_server, client) = fixture().await;
    let p = pod(
        json!([{
            "name": "app", "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "settings"}}],
            "command": ["/bin/$(SHELL_NAME)", "-c"],
            "args": ["echo $(GREETING) $(UNDEFINED) $$(GREETING) $(LOG_LEVEL)"],
            "env": [
                {"name": "FIRST", "value": "one"},
                {"name": "SECOND", "value": "$(FIRST)-two"},
                {"name": "FORWARD", "value": "$(LATER)"},
                {"name": "LATER", "value": "late"},
                {"name": "FROM_CM", "value": "level=$(LOG_LEVEL)"},
                {"name": "DB", "value": "$(MY_DB_SERVICE_HOST):$(MY_DB_SERVICE_PORT)"},
                {"name": "ESCAPED", "value": "$$(FIRST)"},
                {"name": "SHELL_NAME", "value": "sh"},
                {"name": "GREETING", "value": "hi"},
            ],
        }]),
        true,
    );
    let env = environment(&client, &p).await.unwrap();
    let vars = map(&env);
    assert_eq!(vars["SECOND"], "one-two");
    assert_eq!(vars["FORWARD"], "$(LATER)", "a later variable is not seen");
    assert_eq!(vars["FROM_CM"], "level=debug");
    assert!(
        vars["DB"].ends_with(":5432") && !vars["DB"].contains('$'),
        "{}",
        vars["DB"]
    );
    assert_eq!(vars["ESCAPED"], "$(FIRST)");
    let container = &p.spec.as_ref().unwrap().containers[0];
    let (command, args) = expand_command_and_args(container, &vars);
    assert_eq!(command, ["/bin/sh", "-c"]);
    assert_eq!(args, ["echo hi $(UNDEFINED) $(GREETING) debug"]);
}

#[tokio::test]
async fn a_pod_without_enable_service_links_is_refused() {
    let (_server, client) = fixture().await;
    let mut p = pod(json!([{"name": "app", "image": "busybox"}]), true);
    p.spec.as_mut().unwrap().enable_service_links = None;
    assert_eq!(
        environment(&client, &p).await.unwrap_err().message,
        "nil pod.spec.enableServiceLinks encountered, cannot construct envvars"
    );
}
