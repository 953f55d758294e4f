//! The ServiceAccount admission plugin through the registry, as a 1.32 apiserver answers:
//!
//! - a pod in a namespace without its ServiceAccount is refused with upstream's 403 text;
//! - a pod naming none runs as `default`, gets the `kube-api-access-*` projected volume
//!   mounted in every container and its ServiceAccount's `imagePullSecrets`, and reads back so;
//! - `automountServiceAccountToken: false` on the pod or the ServiceAccount leaves it out;
//! - a ServiceAccount created just before its pod is found (the store behind the cache);
//! - mirror pods are created untouched, and refused when they name a ServiceAccount;
//! - `serviceAccountName` cannot change on update.
//!
//! Requests go straight to the registry as an authenticated admin, as `priority.rs` does.

mod common;

use common::{Server, start_with};

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

const NS: &str = "/api/v1/namespaces/default";

async fn call(server: &Server, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let content_type = body.as_ref().map(|_| "application/json");
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let request = common::request(method, path, None, content_type, body);
    match common::exchange(server, request).await {
        Ok((status, body)) => (
            status,
            serde_json::from_slice(&body).expect("a JSON answer"),
        ),
        Err(e) => (e.code, json!({"message": e.message, "reason": e.reason})),
    }
}

fn pod(name: &str, spec_extra: Value, annotations: Value) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}],
                          "initContainers": [{"name": "i", "image": "busybox"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

async fn create_pod(server: &Server, name: &str, spec_extra: Value) -> (u16, Value) {
    let body = pod(name, spec_extra, json!({}));
    call(server, Method::POST, &format!("{NS}/pods"), Some(body)).await
}

async fn create_sa(server: &Server, sa: Value) {
    let (status, body) = call(
        server,
        Method::POST,
        &format!("{NS}/serviceaccounts"),
        Some(sa),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_service_account_is_refused() {
    let server = start_with(true).await;
    let (status, body) = create_pod(&server, "early", json!({})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        "pods \"early\" is forbidden: error looking up service account default/default: serviceaccount \"default\" not found"
    );
    let (status, body) = create_pod(&server, "named", json!({"serviceAccountName": "robot"})).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["message"],
        "pods \"named\" is forbidden: error looking up service account default/robot: serviceaccount \"robot\" not found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_its_account_token_volume_and_pull_secrets() {
    let server = start_with(true).await;
    create_sa(
        &server,
        json!({"metadata": {"name": "default"}, "imagePullSecrets": [{"name": "regcred"}]}),
    )
    .await;
    let (status, created) = create_pod(&server, "web", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let (status, pod) = call(&server, Method::GET, &format!("{NS}/pods/web"), None).await;
    assert_eq!(status, 200);
    assert_eq!(pod, created, "what the create answered is what was stored");
    let spec = &pod["spec"];
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["serviceAccount"], "default");
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    let volume = &spec["volumes"][0];
    let name = volume["name"].as_str().expect("a volume name");
    assert!(
        name.starts_with("kube-api-access-") && name.len() == 21,
        "{name}"
    );
    assert_eq!(volume["projected"]["defaultMode"], 420);
    assert_eq!(
        volume["projected"]["sources"][0]["serviceAccountToken"],
        json!({"path": "token", "expirationSeconds": 3607})
    );
    assert_eq!(
        volume["projected"]["sources"][1]["configMap"]["name"],
        "kube-root-ca.crt"
    );
    let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
    assert_eq!(spec["containers"][0]["volumeMounts"], json!([mount]));
    assert_eq!(spec["initContainers"][0]["volumeMounts"], json!([mount]));

    // Opting out at the pod, then at the account (a new account, created just before its
    // pod: found through the store even when the cache has not seen it yet).
    let (status, no_token) = create_pod(
        &server,
        "quiet",
        json!({"automountServiceAccountToken": false}),
    )
    .await;
    assert_eq!(status, 201, "{no_token}");
    assert!(no_token["spec"].get("volumes").is_none(), "{no_token}");
    assert!(
        no_token["spec"]["containers"][0]
            .get("volumeMounts")
            .is_none()
    );
    create_sa(
        &server,
        json!({"metadata": {"name": "robot"}, "automountServiceAccountToken": false}),
    )
    .await;
    let (status, robot) =
        create_pod(&server, "robot", json!({"serviceAccountName": "robot"})).await;
    assert_eq!(status, 201, "{robot}");
    assert_eq!(robot["spec"]["serviceAccountName"], "robot");
    assert!(robot["spec"].get("volumes").is_none(), "{robot}");
    assert!(robot["spec"].get("imagePullSecrets").is_none(), "{robot}");

    // The account cannot change afterwards.
    let mut changed = pod.clone();
    changed["spec"]["serviceAccountName"] = json!("robot");
    changed["spec"]["serviceAccount"] = json!("robot");
    let (status, body) = call(
        &server,
        Method::PUT,
        &format!("{NS}/pods/web"),
        Some(changed),
    )
    .await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_pods_are_left_alone_or_refused() {
    let server = start_with(true).await;
    let mirror = json!({"kubernetes.io/config.mirror": "0123abcd"});
    let body = pod("static-web", json!({}), mirror.clone());
    let (status, created) = call(&server, Method::POST, &format!("{NS}/pods"), Some(body)).await;
    assert_eq!(status, 201, "no ServiceAccount needed: {created}");
    assert!(
        created["spec"].get("serviceAccountName").is_none(),
        "{created}"
    );
    assert!(created["spec"].get("volumes").is_none(), "{created}");

    for (name, extra, reason) in [
        (
            "sa",
            json!({"serviceAccountName": "default"}),
            "a mirror pod may not reference service accounts",
        ),
        (
            "secret",
            json!({"volumes": [{"name": "s", "secret": {"secretName": "s"}}]}),
            "a mirror pod may not reference secrets",
        ),
        (
            "token",
            json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
            "a mirror pod may not use ServiceAccountToken volume projections",
        ),
    ] {
        let body = pod(name, extra, mirror.clone());
        let (status, answer) = call(&server, Method::POST, &format!("{NS}/pods"), Some(body)).await;
        assert_eq!(status, 403, "{answer}");
        assert_eq!(
            answer["message"],
            format!("pods {name:?} is forbidden: {reason}")
        );
    }
}
