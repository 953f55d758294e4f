//! The typed client against a real apiserver ([`TestServer`]: TLS, HTTP/2, x509 and token
//! authentication, RBAC, the watch cache): CRUD with Kubernetes' optimistic concurrency,
//! every patch type, the status subresource, paging, watches (ordered events, bookmarks,
//! WatchList, 410 after compaction), protobuf, the metadata view, rate limiting, kubeconfigs
//! and TLS trust.

#![allow(clippy::unwrap_used, reason = "a test panics to fail")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde_json::json;
use skerry_apiserver::testing::TestServer;
use skerry_client::api::{WatchStream, http_method::Method};
use skerry_client::config::{Config, ContentType, Credentials};
use skerry_client::{
    Api, ApiResource, Client, DeleteParams, Error, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};

/// How long a test waits for one watch event before failing (the loopback delivers in
/// milliseconds; generous for a loaded two-core CI machine).
const EVENT_WAIT: Duration = Duration::from_secs(15);

/// The annotation that ends a WatchList's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

fn admin_config(server: &TestServer) -> Config {
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert {
        cert_pem: server.admin_cert_pem().to_string(),
        key_pem: server.admin_key_pem().to_string(),
    };
    // Tests are not what the limiter is for (one test measures it on its own client).
    config.qps = 0.0;
    config
}

async fn start() -> (TestServer, Client) {
    let server = TestServer::start().await.unwrap();
    let client = Client::new(admin_config(&server)).unwrap();
    (server, client)
}

fn config_map(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm.data = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
    cm
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [
            {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]},
            {"name": "sidecar", "image": "busybox:1.36"}
        ]}
    }))
    .unwrap()
}

fn rv<K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>(
    obj: &K,
) -> i64 {
    obj.metadata()
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

async fn next<K>(stream: &mut WatchStream<K>) -> WatchEvent<K> {
    tokio::time::timeout(EVENT_WAIT, stream.next())
        .await
        .expect("a watch event within the wait")
        .expect("the stream is still open")
        .expect("a well-formed event")
}

fn name_of<
    K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
>(
    obj: &K,
) -> String {
    obj.metadata().name.clone().unwrap()
}

#[tokio::test]
async fn config_map_crud_conflicts_and_patches() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let pp = PostParams::default();

    let created = api
        .create(&pp, &config_map("a", &[("app", "x")]))
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert!(created.metadata.uid.is_some());
    let again = api.create(&pp, &config_map("a", &[])).await.unwrap_err();
    assert!(again.is_already_exists(), "{again}");

    let got = api.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");

    // Optimistic concurrency: a replace from the current version wins, a second one from the
    // same (now stale) version is a 409 Conflict.
    let mut edit = got.clone();
    edit.data = Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
    let replaced = api.replace("a", &pp, &edit).await.unwrap();
    assert!(rv(&replaced) > rv(&got));
    let stale = api.replace("a", &pp, &edit).await.unwrap_err();
    assert!(stale.is_conflict(), "{stale}");
    assert!(!stale.is_already_exists());

    // Every patch type.
    let merged = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"m": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.data.as_ref().unwrap()["m"], "1");
    assert_eq!(merged.data.as_ref().unwrap()["k"], "v2");
    let strategic = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"s": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.metadata.labels.as_ref().unwrap()["s"], "1");
    assert_eq!(strategic.metadata.labels.as_ref().unwrap()["app"], "x");
    let json_patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Json(json!([{"op": "add", "path": "/data/j", "value": "2"},
                                {"op": "remove", "path": "/data/m"}])),
        )
        .await
        .unwrap();
    let data = json_patched.data.unwrap();
    assert_eq!(data["j"], "2");
    assert!(!data.contains_key("m"));
    let apply = PatchParams {
        field_manager: Some("skerry-test".to_string()),
        force: true,
        ..PatchParams::default()
    };
    let applied = api
        .patch(
            "a",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "a", "namespace": "default"},
                                 "data": {"applied": "yes"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.data.as_ref().unwrap()["applied"], "yes");
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.iter().any(|m| m == "skerry-test"), "{managers:?}");

    // Dry run changes nothing.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry, &config_map("dry", &[])).await.unwrap();
    assert!(api.get_opt("dry").await.unwrap().is_none());

    // Delete with preconditions: a wrong uid or resourceVersion is a conflict.
    let current = api.get("a").await.unwrap();
    let wrong_uid = DeleteParams {
        precondition_uid: Some("00000000-0000-0000-0000-000000000000".to_string()),
        ..DeleteParams::default()
    };
    let e = api.delete("a", &wrong_uid).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let wrong_rv = DeleteParams {
        precondition_resource_version: Some("1".to_string()),
        ..DeleteParams::default()
    };
    let e = api.delete("a", &wrong_rv).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let right = DeleteParams {
        precondition_uid: current.metadata.uid.clone(),
        precondition_resource_version: current.metadata.resource_version.clone(),
        ..DeleteParams::background()
    };
    if let Some(deleted) = api.delete("a", &right).await.unwrap() {
        assert_eq!(deleted.metadata.uid, current.metadata.uid);
    }
    let missing = api.get("a").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
    assert!(api.get_opt("a").await.unwrap().is_none());
    let e = api.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

#[tokio::test]
async fn list_pages_with_a_label_selector() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("page-{i}"), &[("page", "yes")]),
        )
        .await
        .unwrap();
    }
    api.create(
        &PostParams::default(),
        &config_map("other", &[("page", "no")]),
    )
    .await
    .unwrap();

    let mut params = ListParams {
        label_selector: Some("page=yes".to_string()),
        limit: Some(2),
        ..ListParams::default()
    };
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let page = api.list(&params).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 2, "a page of {}", page.items.len());
        assert!(page.metadata.resource_version.is_some());
        names.extend(page.items.iter().map(name_of));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["page-0", "page-1", "page-2", "page-3", "page-4"]);

    // Set-based selectors need their parentheses and commas encoded.
    let both = api
        .list(&ListParams {
            label_selector: Some("page in (yes,no)".to_string()),
            ..ListParams::default()
        })
        .await
        .unwrap();
    assert_eq!(both.items.len(), 6);
    // All namespaces: the kubernetes Service's namespace holds none of ours.
    let all: Api<ConfigMap> = client.api(None);
    let everywhere = all
        .list(&ListParams {
            label_selector: Some("page".to_string()),
            ..ListParams::default()
        })
        .await
        .unwrap();
    assert_eq!(everywhere.items.len(), 6);
}

#[tokio::test]
async fn pod_status_subresource_and_strategic_merge() {
    let (_server, client) = start().await;
    let api: Api<Pod> = client.api(Some("default"));
    let created = api
        .create(&PostParams::default(), &pod("web-1"))
        .await
        .unwrap();
    assert_eq!(created.spec.as_ref().unwrap().containers.len(), 2);

    // Strategic merge merges containers by name; the other container is untouched.
    let patched = api
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "web", "image": "nginx:1.28"}]}}),
            ),
        )
        .await
        .unwrap();
    let containers = patched.spec.unwrap().containers;
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0].image.as_deref(), Some("nginx:1.28"));
    assert_eq!(containers[0].ports.as_ref().map(Vec::len), Some(1));
    assert_eq!(containers[1].image.as_deref(), Some("busybox:1.36"));

    // The status subresource: a replace and a patch of status only.
    let mut current = api.get("web-1").await.unwrap();
    let mut status = current.status.clone().unwrap_or_default();
    status.phase = Some("Running".to_string());
    status.pod_ip = Some("10.244.0.7".to_string());
    current.status = Some(status);
    let replaced = api
        .replace_status("web-1", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(
        replaced.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    let ready = api
        .patch_status(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let conditions = ready.status.unwrap().conditions.unwrap();
    assert_eq!(conditions[0].type_, "Ready");
    // A status write through the main resource does not change status.
    let mut back = api.get("web-1").await.unwrap();
    back.status.as_mut().unwrap().phase = Some("Failed".to_string());
    let after = api
        .replace("web-1", &PostParams::default(), &back)
        .await
        .unwrap();
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Running"));

    // A subresource through the untyped call: the pod's own status path answers GET.
    let raw = api
        .subresource(Method::Get, "web-1", "status", None)
        .await
        .unwrap();
    assert_eq!(raw["status"]["phase"], "Running");

    api.delete("web-1", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("web-1").await.unwrap().is_none());
}

#[tokio::test]
async fn watch_delivers_added_modified_deleted_in_order() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let list = api.list(&ListParams::default()).await.unwrap();
    let mut stream = api
        .watch(&WatchParams {
            resource_version: list.metadata.resource_version.clone(),
            ..WatchParams::default()
        })
        .await
        .unwrap();
    let created = api
        .create(&PostParams::default(), &config_map("w", &[]))
        .await
        .unwrap();
    let mut edit = created.clone();
    edit.data = Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
    let replaced = api
        .replace("w", &PostParams::default(), &edit)
        .await
        .unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();

    let WatchEvent::Added(added) = next(&mut stream).await else {
        panic!("expected ADDED first")
    };
    assert_eq!(rv(&added), rv(&created));
    let WatchEvent::Modified(modified) = next(&mut stream).await else {
        panic!("expected MODIFIED second")
    };
    assert_eq!(rv(&modified), rv(&replaced));
    assert_eq!(modified.data.unwrap()["k"], "v2");
    let WatchEvent::Deleted(deleted) = next(&mut stream).await else {
        panic!("expected DELETED third")
    };
    assert_eq!(name_of(&deleted), "w");
    assert!(rv(&deleted) > rv(&replaced));
}

#[tokio::test]
async fn watch_sends_bookmarks_when_allowed() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let created = api
        .create(&PostParams::default(), &config_map("b", &[]))
        .await
        .unwrap();
    // A watch ending in 4 s gets its bookmark about 2 s before the end (Kubernetes sends one
    // just before the deadline so the client resumes from a recent version).
    let mut stream = api
        .watch(&WatchParams {
            resource_version: created.metadata.resource_version.clone(),
            allow_bookmarks: true,
            timeout_seconds: Some(4),
            ..WatchParams::default()
        })
        .await
        .unwrap();
    let mut bookmarks = Vec::new();
    while let Some(event) = tokio::time::timeout(EVENT_WAIT, stream.next())
        .await
        .expect("the watch ends at its timeout")
    {
        match event.unwrap() {
            WatchEvent::Bookmark {
                resource_version, ..
            } => bookmarks.push(resource_version.parse::<i64>().unwrap()),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert!(!bookmarks.is_empty(), "no bookmark before the watch ended");
    assert!(
        bookmarks.iter().all(|b| *b >= rv(&created)),
        "{bookmarks:?}"
    );
}

#[tokio::test]
async fn watch_list_ends_its_initial_events_with_a_bookmark() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let mut last = 0;
    for i in 0..3 {
        let cm = api
            .create(
                &PostParams::default(),
                &config_map(&format!("wl-{i}"), &[("wl", "1")]),
            )
            .await
            .unwrap();
        last = rv(&cm);
    }
    let mut stream = api
        .watch(&WatchParams {
            label_selector: Some("wl=1".to_string()),
            send_initial_events: Some(true),
            resource_version_match: Some("NotOlderThan".to_string()),
            allow_bookmarks: true,
            ..WatchParams::default()
        })
        .await
        .unwrap();
    let mut names = Vec::new();
    let end = loop {
        match next(&mut stream).await {
            WatchEvent::Added(cm) => names.push(name_of(&cm)),
            WatchEvent::Bookmark {
                resource_version,
                annotations,
            } => break (resource_version, annotations),
            other => panic!("unexpected event {other:?}"),
        }
    };
    names.sort();
    assert_eq!(names, ["wl-0", "wl-1", "wl-2"]);
    assert_eq!(
        end.1.get(INITIAL_EVENTS_END).map(String::as_str),
        Some("true")
    );
    assert!(end.0.parse::<i64>().unwrap() >= last);
    // And the stream goes on as a watch.
    api.create(&PostParams::default(), &config_map("wl-3", &[("wl", "1")]))
        .await
        .unwrap();
    loop {
        match next(&mut stream).await {
            WatchEvent::Added(cm) => {
                assert_eq!(name_of(&cm), "wl-3");
                break;
            }
            WatchEvent::Bookmark { .. } => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_gone() {
    let (server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let first = api
        .create(&PostParams::default(), &config_map("c0", &[]))
        .await
        .unwrap();
    for i in 1..4 {
        api.create(&PostParams::default(), &config_map(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    let store = server.store();
    store.compact(store.revision(), false).await.unwrap();
    assert!(store.compact_revision() > rv(&first));

    // A LIST at an exact version older than the watch cache's window goes to the store,
    // which has compacted it: 410. (One inside the window is served from the cache.)
    let e = api
        .list(&ListParams {
            resource_version: Some("1".to_string()),
            resource_version_match: Some("Exact".to_string()),
            ..ListParams::default()
        })
        .await
        .unwrap_err();
    assert!(e.is_gone(), "{e}");

    // A WATCH from before the watch cache's window: 410, as an error or in the stream.
    let watched = api
        .watch(&WatchParams {
            resource_version: Some("1".to_string()),
            ..WatchParams::default()
        })
        .await;
    match watched {
        Err(e) => assert!(e.is_gone(), "{e}"),
        Ok(mut stream) => match next(&mut stream).await {
            WatchEvent::Error(status) => assert_eq!(status.code, Some(410), "{status:?}"),
            other => panic!("expected a 410 ERROR event, got {other:?}"),
        },
    }
}

#[tokio::test]
async fn protobuf_create_get_list_watch() {
    let server = TestServer::start().await.unwrap();
    let mut config = admin_config(&server);
    config.content_type = ContentType::Protobuf;
    let client = Client::new(config).unwrap();
    assert_eq!(client.content_type(), ContentType::Protobuf);
    let api: Api<Pod> = client.api(Some("default"));
    let list = api.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty());
    let mut stream = api
        .watch(&WatchParams {
            resource_version: list.metadata.resource_version.clone(),
            allow_bookmarks: true,
            ..WatchParams::default()
        })
        .await
        .unwrap();

    let created = api
        .create(&PostParams::default(), &pod("pb"))
        .await
        .unwrap();
    assert_eq!(name_of(&created), "pb");
    assert_eq!(
        created.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("nginx:1.27")
    );
    let got = api.get("pb").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(got.metadata.labels.as_ref().unwrap()["app"], "web");
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.uid, created.metadata.uid);
    assert!(listed.metadata.resource_version.is_some());
    let WatchEvent::Added(added) = next(&mut stream).await else {
        panic!("expected ADDED")
    };
    assert_eq!(added.metadata.uid, created.metadata.uid);
    assert_eq!(added.spec.unwrap().containers.len(), 2);
    // Errors still decode (the server answers them in JSON).
    let e = api.get("missing").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    // Patches are JSON whatever the client speaks; the answer comes back in protobuf.
    let patched = api
        .patch(
            "pb",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"p": "1"}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["p"], "1");
    let WatchEvent::Modified(modified) = next(&mut stream).await else {
        panic!("expected MODIFIED")
    };
    assert_eq!(modified.metadata.labels.unwrap()["p"], "1");
}

#[tokio::test]
async fn metadata_api_reads_patches_and_deletes() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let created = api
        .create(&PostParams::default(), &config_map("meta", &[("m", "1")]))
        .await
        .unwrap();
    let meta = client.metadata(ApiResource::of::<ConfigMap>(), Some("default"));
    assert_eq!(meta.resource().plural, "configmaps");

    let one = meta.get("meta").await.unwrap();
    assert_eq!(one.kind, "ConfigMap");
    assert_eq!(one.api_version, "v1");
    assert_eq!(one.metadata.uid, created.metadata.uid);
    let list = meta
        .list(&ListParams {
            label_selector: Some("m=1".to_string()),
            ..ListParams::default()
        })
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].kind, "ConfigMap");
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("meta"));

    let patched = meta
        .patch(
            "meta",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"m": null, "n": "2"}}})),
        )
        .await
        .unwrap();
    let labels = patched.metadata.labels.unwrap();
    assert!(!labels.contains_key("m"));
    assert_eq!(labels["n"], "2");

    meta.delete("meta", &DeleteParams::default()).await.unwrap();
    assert!(meta.get("meta").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn metadata_watch_carries_metadata_only() {
    let (_server, client) = start().await;
    let meta = client.metadata(ApiResource::of::<ConfigMap>(), Some("default"));
    let list = meta.list(&ListParams::default()).await.unwrap();
    let mut stream = meta
        .watch(&WatchParams {
            resource_version: list.metadata.resource_version.clone(),
            ..WatchParams::default()
        })
        .await
        .unwrap();
    let api: Api<ConfigMap> = client.api(Some("default"));
    let created = api
        .create(&PostParams::default(), &config_map("mw", &[]))
        .await
        .unwrap();
    let WatchEvent::Added(added) = next(&mut stream).await else {
        panic!("expected ADDED")
    };
    assert_eq!(added.metadata.uid, created.metadata.uid);
    assert_eq!(added.kind, "ConfigMap");
}

#[tokio::test]
async fn the_rate_limiter_paces_requests() {
    let server = TestServer::start().await.unwrap();
    let mut config = admin_config(&server);
    config.qps = 20.0;
    config.burst = 1;
    let client = Client::new(config).unwrap();
    let api: Api<ConfigMap> = client.api(Some("default"));
    let started = Instant::now();
    // One token at once, then one every 50 ms: 21 requests take at least 20 × 50 ms.
    for _ in 0..21 {
        assert!(api.get_opt("none").await.unwrap().is_none());
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(950),
        "21 gets took {elapsed:?}"
    );

    // Watches wait for tokens too: with the bucket drained, opening one takes ~50 ms.
    let watch_started = Instant::now();
    let _stream = api.watch(&WatchParams::default()).await.unwrap();
    assert!(watch_started.elapsed() >= Duration::from_millis(30));
}

#[tokio::test]
async fn kubeconfig_and_token_clients() {
    let server = TestServer::start().await.unwrap();
    let config = Config::from_kubeconfig_str(&server.admin_kubeconfig(), None).unwrap();
    assert_eq!(config.server, server.url());
    let client = Client::new(config).unwrap();
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = client.api(None);
    let default = ns.get("default").await.unwrap();
    assert_eq!(name_of(&default), "default");

    // The same from a file whose CA is a separate file next to it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), server.ca_pem()).unwrap();
    let yaml = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
         clusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: ca.crt\n\
         users:\n- name: u\n  user:\n    token: {}\n\
         contexts:\n- name: t\n  context:\n    cluster: c\n    user: u\n",
        server.url(),
        server.admin_token()
    );
    std::fs::write(dir.path().join("config"), yaml).unwrap();
    let config = Config::from_kubeconfig(&dir.path().join("config")).unwrap();
    assert!(matches!(config.credentials, Credentials::Token(_)));
    let client = Client::new(config).unwrap();
    let cms: Api<ConfigMap> = client.api(Some("default"));
    cms.create(&PostParams::default(), &config_map("by-token", &[]))
        .await
        .unwrap();

    // A wrong token is a 401, a user without RBAC grants a 403.
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::Token("not-a-token".to_string());
    let e = Client::new(config)
        .unwrap()
        .api::<ConfigMap>(Some("default"))
        .get("by-token")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(401), "{e}");
    let (cert_pem, key_pem) = server.issue_client_cert("nobody", &["no-grants"]).unwrap();
    let mut config = Config::new(&server.url());
    config.ca_pem = Some(server.ca_pem().to_string());
    config.credentials = Credentials::ClientCert { cert_pem, key_pem };
    let e = Client::new(config)
        .unwrap()
        .api::<ConfigMap>(Some("default"))
        .get("by-token")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(403), "{e}");

    // A raw request returns non-2xx answers as they are.
    let (code, body) = client
        .request_raw(
            Method::Get,
            "/api/v1/namespaces/default/configmaps/nope",
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 404);
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["kind"], "Status");
}

#[tokio::test]
async fn a_server_with_an_unknown_ca_is_rejected() {
    let trusted = TestServer::start().await.unwrap();
    let other = TestServer::start().await.unwrap();
    // The other server's URL, but this server's CA: the handshake must fail.
    let mut config = admin_config(&trusted);
    config.server = other.url();
    let client = Client::new(config).unwrap();
    let e = client
        .api::<ConfigMap>(Some("default"))
        .list(&ListParams::default())
        .await
        .unwrap_err();
    match &e {
        Error::Transport(message) => {
            assert!(message.to_lowercase().contains("certificate"), "{message}")
        }
        other => panic!("expected a transport error, got {other}"),
    }
    assert!(e.is_retryable());
    // And the right CA works.
    let good = Client::new(admin_config(&other)).unwrap();
    good.api::<ConfigMap>(Some("default"))
        .list(&ListParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn many_watches_share_one_client() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = client.api(Some("default"));
    let list = api.list(&ListParams::default()).await.unwrap();
    // Over HTTP/2 these are streams of one connection; each still sees every event.
    let mut streams = Vec::new();
    for _ in 0..20 {
        streams.push(
            api.watch(&WatchParams {
                resource_version: list.metadata.resource_version.clone(),
                ..WatchParams::default()
            })
            .await
            .unwrap(),
        );
    }
    api.create(&PostParams::default(), &config_map("fan", &[]))
        .await
        .unwrap();
    for stream in &mut streams {
        let WatchEvent::Added(cm) = next(stream).await else {
            panic!("expected ADDED")
        };
        assert_eq!(name_of(&cm), "fan");
    }
}
