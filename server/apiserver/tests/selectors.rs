//! `?labelSelector=` as a 1.32 apiserver reads it: Kubernetes' `labels.Parse` (the one
//! implementation in `skerry_api::selector`), its quirks and its error messages, over LISTs
//! handed to the registry as an authenticated admin.

mod common;

use common::{Server, start};

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

async fn call(server: &Server, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let content_type = (!body.is_empty()).then_some("application/json");
    let request = common::request(method, path, None, content_type, body);
    match common::exchange(server, request).await {
        Ok((status, body)) => (
            status,
            serde_json::from_slice(&body).expect("a JSON answer"),
        ),
        Err(e) => (e.code, e.to_status()),
    }
}

async fn create(server: &Server, name: &str, labels: Value) {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "labels": labels}});
    let (status, body) = call(server, Method::POST, CMS, Some(cm)).await;
    assert_eq!(status, 201, "{body}");
}

/// The names a LIST with `selector` (already percent-encoded) returns, or its Status.
async fn names(server: &Server, selector: &str) -> Result<Vec<String>, (u16, Value)> {
    let (status, body) = call(
        server,
        Method::GET,
        &format!("{CMS}?labelSelector={selector}"),
        None,
    )
    .await;
    if status != 200 {
        return Err((status, body));
    }
    let mut names: Vec<String> = body["items"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| {
            item["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selectors_are_read_as_kubernetes_reads_them() {
    let server = start().await;
    create(&server, "empty", json!({"app": ""})).await;
    create(&server, "web", json!({"app": "web", "cores": "8"})).await;
    create(&server, "db", json!({"app": "db", "cores": "2"})).await;

    // `x in ()` is x in {""}: kube-apiserver accepts it (skerry's parser refused it).
    assert_eq!(
        names(&server, "app%20in%20()").await.expect("accepted"),
        ["empty"]
    );
    assert_eq!(
        names(&server, "app%20in%20(web,,)")
            .await
            .expect("accepted"),
        ["empty", "web"]
    );
    // `>` and `<` compare integers; a missing label satisfies neither.
    assert_eq!(
        names(&server, "cores%3E4").await.expect("accepted"),
        ["web"]
    );
    assert_eq!(names(&server, "cores%3C4").await.expect("accepted"), ["db"]);
    assert_eq!(
        names(&server, "app,!cores").await.expect("accepted"),
        ["empty"]
    );

    // Kubernetes' messages, as a 400 BadRequest Status.
    for (selector, message) in [
        (
            "app%20in%20web",
            "unable to parse requirement: found 'web' expected: '('",
        ),
        ("app=web,,db", "found ',', expected: identifier after ','"),
        (
            "cores%3Emany",
            "unable to parse requirement: values[0]: Invalid value: \"many\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
    ] {
        let (status, body) = names(&server, selector).await.expect_err(selector);
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["reason"], "BadRequest", "{body}");
        assert_eq!(body["message"], message, "{body}");
    }
}
