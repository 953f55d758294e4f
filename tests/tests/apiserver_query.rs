//! Query parameters read as Kubernetes reads them, over real HTTP/2 + TLS to an in-process
//! apiserver: booleans through the parameter codec (`watch=True` from Python clients is a
//! watch, and so is `watch=yes`: Kubernetes refuses no boolean), `force` refused on a
//! non-apply patch whatever its value, `orphanDependents=True` orphaning, and `pretty`.

use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::Value;
use skerry_tests::apibench::fixture::Harness;
use skerry_tests::apibench::http::Client;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn cm(name: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"a":"b"}}}}"#
    ))
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// The watch events of a finished watch body (one JSON object per line).
fn events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| json(l.as_bytes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boolean_query_parameters_follow_the_kubernetes_parameter_codec() {
    let harness = Harness::start().await.expect("apiserver");
    let tls = harness.pki.admin_client_config().expect("client tls");
    let client = Client::connect(harness.addr, tls, 1)
        .await
        .expect("connect");
    for name in ["one", "two"] {
        let created = client
            .call(Method::POST, CMS, cm(name))
            .await
            .expect("create");
        assert_eq!(created.0, StatusCode::CREATED);
    }

    // Every spelling but `0` and a case-folded `false` makes a watch: the initial ADDED
    // events of both objects, then the stream ends at `timeoutSeconds`.
    for watch in ["True", "t", "yes", "", "1"] {
        let answer = client
            .call(
                Method::GET,
                &format!("{CMS}?watch={watch}&timeoutSeconds=1"),
                Bytes::new(),
            )
            .await
            .expect("watch");
        assert_eq!(answer.0, StatusCode::OK, "watch={watch}");
        let events = events(&answer.1);
        let names: Vec<&str> = events
            .iter()
            .map(|e| {
                assert_eq!(e["type"], "ADDED", "watch={watch}: {e}");
                e["object"]["metadata"]["name"].as_str().unwrap_or("")
            })
            .collect();
        assert_eq!(names, ["one", "two"], "watch={watch}");
    }
    for watch in ["False", "FALSE", "0"] {
        let answer = client
            .call(Method::GET, &format!("{CMS}?watch={watch}"), Bytes::new())
            .await
            .expect("list");
        let list = json(&answer.1);
        assert_eq!(list["kind"], "ConfigMapList", "watch={watch}: {list}");
    }
    // A named GET does not read `watch`: it answers the object.
    let named = client
        .call(Method::GET, &format!("{CMS}/one?watch=True"), Bytes::new())
        .await
        .expect("get");
    assert_eq!(json(&named.1)["kind"], "ConfigMap");

    // WatchList with Python's spellings: the initial events, then the bookmark that ends them.
    let answer = client
        .call(
            Method::GET,
            &format!(
                "{CMS}?watch=True&sendInitialEvents=True&allowWatchBookmarks=True\
                 &resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
            ),
            Bytes::new(),
        )
        .await
        .expect("watch list");
    assert_eq!(answer.0, StatusCode::OK);
    let events = events(&answer.1);
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .unwrap_or_else(|| panic!("no bookmark in {events:?}"));
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // `force` is forbidden on a non-apply patch whatever it says, `false` included.
    let patch = client
        .call_with(
            Method::PATCH,
            &format!("{CMS}/one?force=false"),
            &[(header::CONTENT_TYPE, "application/merge-patch+json")],
            Bytes::from_static(br#"{"data":{"a":"c"}}"#),
        )
        .await
        .expect("patch");
    let status = json(&patch.1);
    assert_eq!(patch.0.as_u16(), 422, "{status}");
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );

    // `orphanDependents=True` orphans: the object waits for the garbage collector (none runs
    // here) behind the `orphan` finalizer instead of going at once.
    let deleted = client
        .call(
            Method::DELETE,
            &format!("{CMS}/two?orphanDependents=True"),
            Bytes::new(),
        )
        .await
        .expect("delete");
    // 202 Accepted: the deletion waits for a finalizer.
    assert_eq!(deleted.0, StatusCode::ACCEPTED);
    let left = client
        .call(Method::GET, &format!("{CMS}/two"), Bytes::new())
        .await
        .expect("get");
    let left = json(&left.1);
    assert_eq!(
        left["metadata"]["finalizers"],
        serde_json::json!(["orphan"])
    );
    assert!(left["metadata"]["deletionTimestamp"].is_string(), "{left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretty_indents_json_when_asked_or_for_curl() {
    let harness = Harness::start().await.expect("apiserver");
    let tls = harness.pki.admin_client_config().expect("client tls");
    let client = Client::connect(harness.addr, tls, 1)
        .await
        .expect("connect");
    client
        .call(Method::POST, CMS, cm("one"))
        .await
        .expect("create");
    let get = |query: &'static str, agent: &'static str| {
        let client = &client;
        async move {
            let headers = [(header::USER_AGENT, agent)];
            let answer = client
                .call_with(
                    Method::GET,
                    &format!("{CMS}/one{query}"),
                    &headers,
                    Bytes::new(),
                )
                .await
                .expect("get");
            String::from_utf8(answer.1.to_vec()).expect("utf-8")
        }
    };
    let indented = get("?pretty=true", "kubectl/v1.32.0").await;
    assert!(
        indented.starts_with("{\n  \"apiVersion\": \"v1\",\n"),
        "{indented}"
    );
    assert_eq!(json(indented.as_bytes())["metadata"]["name"], "one");
    // Go's ParseBool: `yes` is no boolean, so not pretty (and no error).
    let compact = get("?pretty=yes", "curl/8.5.0").await;
    assert!(compact.starts_with("{\"apiVersion\":\"v1\","), "{compact}");
    // No `pretty`: curl gets it indented, kubectl does not.
    assert!(get("", "curl/8.5.0").await.starts_with("{\n  "));
    assert!(
        get("", "kubectl/v1.32.0")
            .await
            .starts_with("{\"apiVersion\"")
    );
    // Errors are JSON too.
    let missing = client
        .call(Method::GET, &format!("{CMS}/nope?pretty=1"), Bytes::new())
        .await
        .expect("get");
    let text = String::from_utf8_lossy(&missing.1);
    assert!(text.starts_with("{\n  \"apiVersion\": \"v1\",\n"), "{text}");
}
