//! The apiserver's answers to bad requests, over real HTTP/2 + TLS to an in-process
//! apiserver: each is a `Status` with Kubernetes' code and reason, and nothing is written.
//! (The real kubectl's view of the same errors is in `appliance/tests/kubectl.rs`.)

use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::Value;
use skerry_tests::apibench::fixture::Harness;
use skerry_tests::apibench::http::Client;

fn status(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not a Status ({e}): {}", String::from_utf8_lossy(body)))
}

fn assert_status(answer: &(StatusCode, Bytes), code: u16, reason: &str) -> Value {
    let s = status(&answer.1);
    assert_eq!(answer.0.as_u16(), code, "{s}");
    assert_eq!(s["kind"], "Status", "{s}");
    assert_eq!(s["code"], code, "{s}");
    assert_eq!(s["reason"], reason, "{s}");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_kubernetes_statuses_and_change_nothing() {
    let harness = Harness::start().await.expect("apiserver");
    let tls = harness.pki.admin_client_config().expect("client tls");
    let client = Client::connect(harness.addr, tls, 1)
        .await
        .expect("connect");
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = |name: &str| {
        Bytes::from(format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"a":"b"}}}}"#
        ))
    };

    // 201, then 409 AlreadyExists.
    let created = client
        .call(Method::POST, cms, cm("one"))
        .await
        .expect("create");
    assert_eq!(created.0, StatusCode::CREATED);
    let again = client
        .call(Method::POST, cms, cm("one"))
        .await
        .expect("create again");
    assert_status(&again, 409, "AlreadyExists");

    // 409 Conflict on a stale resourceVersion.
    let mut stale: Value = serde_json::from_slice(&created.1).expect("json");
    client
        .call(
            Method::PUT,
            &format!("{cms}/one"),
            Bytes::from(stale.to_string()),
        )
        .await
        .expect("update");
    stale["data"]["a"] = "c".into();
    let conflict = client
        .call(
            Method::PUT,
            &format!("{cms}/one"),
            Bytes::from(stale.to_string()),
        )
        .await
        .expect("stale update");
    let s = assert_status(&conflict, 409, "Conflict");
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("the object has been modified")),
        "{s}"
    );

    // 400: not JSON, unknown fields under Strict, a wrong type.
    let garbage = client
        .call(Method::POST, cms, Bytes::from_static(b"{nope"))
        .await
        .expect("post");
    assert_status(&garbage, 400, "BadRequest");
    let unknown = client
        .call(
            Method::POST,
            &format!("{cms}?fieldValidation=Strict"),
            Bytes::from_static(
                br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"dataa":{}}"#,
            ),
        )
        .await
        .expect("post");
    let s = assert_status(&unknown, 400, "BadRequest");
    assert!(
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"unknown field "dataa""#)),
        "{s}"
    );

    // 422 Invalid with a field cause.
    let invalid = client
        .call(Method::POST, cms, cm("Not_A_Name"))
        .await
        .expect("post");
    let s = assert_status(&invalid, 422, "Invalid");
    assert_eq!(s["details"]["causes"][0]["field"], "metadata.name", "{s}");

    // 413 for a body over 3 MiB.
    let huge = vec![b' '; 3 * 1024 * 1024 + 1];
    let too_large = client
        .call(Method::POST, cms, Bytes::from(huge))
        .await
        .expect("post");
    assert_status(&too_large, 413, "RequestEntityTooLarge");

    // 415 for a body type the server does not read.
    let text = client
        .call_with(
            Method::POST,
            cms,
            &[(header::CONTENT_TYPE, "text/plain")],
            cm("t"),
        )
        .await
        .expect("post");
    assert_status(&text, 415, "UnsupportedMediaType");
    let patch = client
        .call_with(
            Method::PATCH,
            &format!("{cms}/one"),
            &[(header::CONTENT_TYPE, "application/json")],
            Bytes::from_static(b"{}"),
        )
        .await
        .expect("patch");
    assert_status(&patch, 415, "UnsupportedMediaType");

    // 406 for an Accept the server cannot produce.
    let html = client
        .call_with(
            Method::GET,
            cms,
            &[(header::ACCEPT, "text/html")],
            Bytes::new(),
        )
        .await
        .expect("get");
    assert_status(&html, 406, "NotAcceptable");

    // 404 for an unknown object, an unknown resource and an unknown path.
    assert_status(
        &client
            .call(Method::GET, &format!("{cms}/nope"), Bytes::new())
            .await
            .expect("get"),
        404,
        "NotFound",
    );
    assert_status(
        &client
            .call(
                Method::GET,
                "/api/v1/namespaces/default/widgets",
                Bytes::new(),
            )
            .await
            .expect("get"),
        404,
        "NotFound",
    );
    assert_status(
        &client
            .call(Method::GET, "/no/such/path", Bytes::new())
            .await
            .expect("get"),
        404,
        "NotFound",
    );

    // 405 for a verb the resource does not have.
    let review = client
        .call(
            Method::GET,
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            Bytes::new(),
        )
        .await
        .expect("get");
    assert_status(&review, 405, "MethodNotAllowed");

    // 410 Expired for a continue token whose revision was compacted.
    for i in 0..4 {
        client
            .call(Method::POST, cms, cm(&format!("page-{i}")))
            .await
            .expect("create");
    }
    let page = client
        .call(Method::GET, &format!("{cms}?limit=2"), Bytes::new())
        .await
        .expect("list");
    let token = status(&page.1)["metadata"]["continue"]
        .as_str()
        .expect("a continue token")
        .to_string();
    client
        .call(Method::POST, cms, cm("later"))
        .await
        .expect("create");
    harness
        .store
        .compact(harness.store.revision(), true)
        .await
        .expect("compact");
    let expired = client
        .call(
            Method::GET,
            &format!("{cms}?limit=2&continue={token}"),
            Bytes::new(),
        )
        .await
        .expect("list");
    assert_status(&expired, 410, "Expired");

    // A watch from a compacted revision: an in-stream ERROR with 410.
    let watch = client
        .call(
            Method::GET,
            &format!("{cms}?watch=true&resourceVersion=2&timeoutSeconds=1"),
            Bytes::new(),
        )
        .await
        .expect("watch");
    let line = String::from_utf8_lossy(&watch.1)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let event: Value = serde_json::from_str(&line).expect("an event");
    assert_eq!(event["type"], "ERROR", "{event}");
    assert_eq!(event["object"]["code"], 410, "{event}");

    // Nothing bad was stored: the ConfigMaps are the good ones.
    let list = client
        .call(Method::GET, cms, Bytes::new())
        .await
        .expect("list");
    let names: Vec<String> = status(&list.1)["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        names,
        ["later", "one", "page-0", "page-1", "page-2", "page-3"]
    );
}
