//! The reviews over real HTTP/2 + TLS to an in-process apiserver: SubjectAccessReview,
//! LocalSubjectAccessReview and TokenReview in JSON and in protobuf, their refusals with
//! Kubernetes' codes and messages, and nothing ever stored. (The real kubectl and
//! python3-kubernetes against the real binary are in `appliance/tests/`.)

use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};
use skerry_tests::apibench::fixture::Harness;
use skerry_tests::apibench::http::Client;

const SARS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

fn lsars(namespace: &str) -> String {
    format!("/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews")
}

fn json_of(answer: &(StatusCode, Bytes)) -> Value {
    serde_json::from_slice(&answer.1)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&answer.1)))
}

async fn post(client: &Client, path: &str, body: Value) -> (StatusCode, Value) {
    let answer = client
        .call(Method::POST, path, Bytes::from(body.to_string()))
        .await
        .expect("post");
    (answer.0, json_of(&answer))
}

/// A review of the bootstrap policy: `system:kube-scheduler` may bind pods, not read secrets.
fn sar(verb: &str, resource: &str, subresource: &str) -> Value {
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:kube-scheduler",
            "groups": ["system:authenticated"],
            "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource, "namespace": "default"},
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_answer_from_rbac_and_the_authenticators_and_store_nothing() {
    let harness = Harness::start().await.expect("apiserver");
    let tls = harness.pki.admin_client_config().expect("client tls");
    let client = Client::connect(harness.addr, tls, 1)
        .await
        .expect("connect");
    let revision = harness.store.revision();

    // Allowed, with the binding that allows it as the reason; the spec comes back as sent.
    let (code, allowed) = post(&client, SARS, sar("create", "pods", "binding")).await;
    assert_eq!(code, StatusCode::CREATED, "{allowed}");
    assert_eq!(allowed["status"]["allowed"], true, "{allowed}");
    assert_eq!(
        allowed["status"]["reason"],
        "RBAC: allowed by ClusterRoleBinding \"system:kube-scheduler\" of ClusterRole \"system:kube-scheduler\" to User \"system:kube-scheduler\""
    );
    assert_eq!(allowed["spec"]["user"], "system:kube-scheduler");
    assert_eq!(allowed["metadata"]["creationTimestamp"], Value::Null);
    // Denied: `allowed: false`, no reason, no `denied` (RBAC has no opinion, never a denial).
    let (_, denied) = post(&client, SARS, sar("get", "secrets", "")).await;
    assert_eq!(denied["status"], json!({"allowed": false}));

    // A LocalSubjectAccessReview takes its namespace from the path.
    let mut local = sar("get", "secrets", "");
    local["kind"] = json!("LocalSubjectAccessReview");
    let (code, answer) = post(&client, &lsars("default"), local.clone()).await;
    assert_eq!(code, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["metadata"]["namespace"], "default");
    // ... whose resourceAttributes must repeat it,
    let (code, status) = post(&client, &lsars("kube-system"), local.clone()).await;
    assert_eq!(code.as_u16(), 422, "{status}");
    assert_eq!(
        status["message"],
        ".authorization.k8s.io \"\" is invalid: spec.resourceAttributes.namespace: Invalid value: \"default\": must match metadata.namespace"
    );
    // ... and whose own namespace may not contradict it.
    local["metadata"] = json!({"namespace": "kube-system"});
    let (code, status) = post(&client, &lsars("default"), local).await;
    assert_eq!(code.as_u16(), 400, "{status}");
    assert_eq!(
        status["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );

    // Invalid reviews: every cause, in Kubernetes' words.
    let (code, status) = post(
        &client,
        SARS,
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {"name": "x"}, "spec": {}}),
    )
    .await;
    assert_eq!(code.as_u16(), 422, "{status}");
    // The metadata shown is the whole of it, the managedFields the create recorded included
    // (Kubernetes prints the same ObjectMeta, in Go syntax).
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(
            ".authorization.k8s.io \"\" is invalid: [spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: \"\": at least one of user or group must be specified, metadata: Invalid value: {"
        ) && message.contains("\"name\":\"x\"")
            && message.ends_with("}: must be empty]"),
        "{message}"
    );
    let fields: Vec<&str> = status["details"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert_eq!(fields, ["spec.resourceAttributes", "spec.user", "metadata"]);

    // A TokenReview: this server has no token authenticators, so no token authenticates,
    // and that is an answer, not an error.
    let (code, review) = post(
        &client,
        TOKEN_REVIEWS,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "nobody-knows"}}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{review}");
    assert_eq!(
        review["status"],
        json!({"user": {}, "error": "invalid bearer token"})
    );
    let (code, status) = post(
        &client,
        TOKEN_REVIEWS,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}}),
    )
    .await;
    assert_eq!(code.as_u16(), 400, "{status}");
    assert_eq!(
        status["message"],
        "token is required for TokenReview in authentication"
    );

    // Create-only: no GET, no namespaced TokenReview.
    let get = client
        .call(Method::GET, SARS, Bytes::new())
        .await
        .expect("get");
    assert_eq!(get.0.as_u16(), 405);
    let namespaced = client
        .call(
            Method::POST,
            "/apis/authentication.k8s.io/v1/namespaces/default/tokenreviews",
            Bytes::from_static(b"{}"),
        )
        .await
        .expect("post");
    assert_eq!(namespaced.0.as_u16(), 404);

    // Protobuf in and out, as client-go's typed clients send and ask.
    let body = skerry_api::protobuf::encode(
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        &sar("create", "pods", "binding"),
    )
    .expect("encode");
    let answer = client
        .call_with(
            Method::POST,
            SARS,
            &[(header::CONTENT_TYPE, PROTOBUF), (header::ACCEPT, PROTOBUF)],
            Bytes::from(body),
        )
        .await
        .expect("post protobuf");
    assert_eq!(answer.0, StatusCode::CREATED);
    let (type_meta, object) = skerry_api::protobuf::decode(&answer.1).expect("a protobuf body");
    assert_eq!(type_meta.kind, "SubjectAccessReview");
    assert_eq!(object["status"]["allowed"], true, "{object}");
    assert_eq!(
        object["spec"]["resourceAttributes"]["subresource"],
        "binding"
    );
    let body = skerry_api::protobuf::encode(
        "authentication.k8s.io/v1",
        "TokenReview",
        &json!({"spec": {"token": "nobody-knows", "audiences": ["vault"]}}),
    )
    .expect("encode");
    let answer = client
        .call_with(
            Method::POST,
            TOKEN_REVIEWS,
            &[(header::CONTENT_TYPE, PROTOBUF), (header::ACCEPT, PROTOBUF)],
            Bytes::from(body),
        )
        .await
        .expect("post protobuf");
    assert_eq!(answer.0, StatusCode::CREATED);
    let (_, object) = skerry_api::protobuf::decode(&answer.1).expect("a protobuf body");
    assert_eq!(
        object["status"]["error"], "invalid bearer token",
        "{object}"
    );
    assert_eq!(object["spec"]["audiences"], json!(["vault"]));

    // Nothing was written.
    assert_eq!(harness.store.revision(), revision);
}
