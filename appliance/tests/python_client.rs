//! The real Python `kubernetes` client (Debian's python3-kubernetes, run with
//! `/usr/bin/python3`) against a running `skerry server`: each test starts the binary on a
//! fresh data dir, writes a short script that loads the admin kubeconfig skerry writes with
//! `kubernetes.config.load_kube_config`, runs it, and checks the JSON it prints.

mod common;

use std::process::Command;

use common::kube::*;
use serde_json::Value;

/// The interpreter whose `kubernetes` package is Debian's python3-kubernetes.
const PYTHON: &str = "/usr/bin/python3";

/// Runs `script` with the admin kubeconfig as its first argument (and `args` after it); it
/// must succeed and print one JSON document.
fn python(k: &Kube, script: &str, args: &[&str]) -> Value {
    let path = k.path("script.py");
    std::fs::write(&path, script).expect("write the script");
    let out = Command::new(PYTHON)
        .arg(&path)
        .arg(&k.kubeconfig)
        .args(args)
        .env("HOME", &k.home)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed:\nstdout: {stdout}\nstderr: {}\nserver log tail:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&k.log())
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Watches ConfigMaps with `watch.Watch().stream(...)` (which sends `watch=True`) and, from
/// inside the loop, creates, patches and deletes one: each change must come back as an event
/// of the watch that is already open. Prints `[[type, name, data.k], ...]`.
const WATCH_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
ns = "default"
v1.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="seed")))
seen = []
w = watch.Watch()
for ev in w.stream(v1.list_namespaced_config_map, ns, timeout_seconds=60):
    name = ev["object"].metadata.name
    if name == "kube-root-ca.crt":
        continue  # the root CA publisher's, in every namespace as on Kubernetes
    seen.append([ev["type"], name, (ev["object"].data or {}).get("k")])
    if ev["type"] == "ADDED" and name == "seed":
        v1.create_namespaced_config_map(
            ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm1"), data={"k": "1"}))
    elif ev["type"] == "ADDED" and name == "cm1":
        v1.patch_namespaced_config_map("cm1", ns, {"data": {"k": "2"}})
    elif ev["type"] == "MODIFIED" and name == "cm1":
        v1.delete_namespaced_config_map("cm1", ns)
    elif ev["type"] == "DELETED" and name == "cm1":
        w.stop()
print(json.dumps(seen))
"#;

#[test]
fn python_watch_receives_added_modified_and_deleted() {
    let k = Kube::start(&[]);
    let seen = python(&k, WATCH_SCRIPT, &[]);
    assert_eq!(
        seen,
        serde_json::json!([
            ["ADDED", "seed", null],
            ["ADDED", "cm1", "1"],
            ["MODIFIED", "cm1", "2"],
            ["DELETED", "cm1", "2"],
        ])
    );
}

/// SubjectAccessReview, LocalSubjectAccessReview and TokenReview through the client's typed
/// APIs; the service-account tokens come as arguments 2 (for the API server) and 3 (for the
/// audience `vault`). Prints each review's `status` as the client decoded it.
const REVIEWS_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
authz = client.AuthorizationV1Api()
authn = client.AuthenticationV1Api()
out = {}
def pods(verb):
    return client.V1ResourceAttributes(verb=verb, resource="pods", namespace="shop")
sar = authz.create_subject_access_review(client.V1SubjectAccessReview(
    spec=client.V1SubjectAccessReviewSpec(user="jane", groups=["developers"], resource_attributes=pods("list"))))
out["sar"] = sar.status.to_dict()
out["sar_nobody"] = authz.create_subject_access_review(client.V1SubjectAccessReview(
    spec=client.V1SubjectAccessReviewSpec(user="nobody", resource_attributes=pods("list")))).status.to_dict()
out["sar_path"] = authz.create_subject_access_review(client.V1SubjectAccessReview(
    spec=client.V1SubjectAccessReviewSpec(user="jane", groups=["system:authenticated"],
        non_resource_attributes=client.V1NonResourceAttributes(path="/api", verb="get")))).status.to_dict()
lsar = authz.create_namespaced_local_subject_access_review("shop", client.V1LocalSubjectAccessReview(
    metadata=client.V1ObjectMeta(namespace="shop"),
    spec=client.V1SubjectAccessReviewSpec(user="jane", groups=["developers"], resource_attributes=pods("delete"))))
out["lsar"] = lsar.status.to_dict()
out["lsar_namespace"] = lsar.metadata.namespace
def review(token, audiences=None):
    r = authn.create_token_review(client.V1TokenReview(
        spec=client.V1TokenReviewSpec(token=token, audiences=audiences)))
    return r.status.to_dict()
out["static"] = review("jane-token")
out["static_for_vault"] = review("jane-token", ["vault"])
out["sa"] = review(sys.argv[2])
out["sa_for_vault"] = review(sys.argv[2], ["vault"])
out["vault_sa"] = review(sys.argv[3])
out["vault_sa_for_vault"] = review(sys.argv[3], ["vault", "other"])
out["bad"] = review("not-a-token")
print(json.dumps(out))
"#;

#[test]
fn python_reviews_answer_as_kubernetes_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "jane-token,jane,1001,\"developers\"\n").expect("token file");
    let k = Kube::start(&["--token-auth-file", &tokens.display().to_string()]);
    k.ok(&["create", "namespace", "shop"]);
    k.ok(&[
        "create",
        "role",
        "pod-reader",
        "-n",
        "shop",
        "--verb=get,list,watch",
        "--resource=pods",
    ]);
    k.ok(&[
        "create",
        "rolebinding",
        "developers-read",
        "-n",
        "shop",
        "--role=pod-reader",
        "--group=developers",
    ]);
    k.ok(&["create", "serviceaccount", "robot", "-n", "shop"]);
    let uid = k.ok(&[
        "get",
        "sa",
        "robot",
        "-n",
        "shop",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let for_api = k.ok(&["create", "token", "robot", "-n", "shop"]);
    let for_vault = k.ok(&[
        "create",
        "token",
        "robot",
        "-n",
        "shop",
        "--audience",
        "vault",
    ]);
    let out = python(&k, REVIEWS_SCRIPT, &[for_api.trim(), for_vault.trim()]);

    // Access reviews: RBAC's answer and reason; nobody is allowed nothing, and a non-resource
    // path through the bootstrap `system:discovery` binding to system:authenticated.
    assert_eq!(out["sar"]["allowed"], true, "{out}");
    assert_eq!(
        out["sar"]["reason"],
        "RBAC: allowed by RoleBinding \"developers-read/shop\" of Role \"pod-reader\" to Group \"developers\""
    );
    assert_eq!(out["sar_nobody"]["allowed"], false, "{out}");
    assert_eq!(out["sar_nobody"]["reason"], Value::Null);
    assert_eq!(out["sar_path"]["allowed"], true, "{out}");
    assert_eq!(
        out["sar_path"]["reason"],
        "RBAC: allowed by ClusterRoleBinding \"system:discovery\" of ClusterRole \"system:discovery\" to Group \"system:authenticated\""
    );
    assert_eq!(out["lsar"]["allowed"], false, "{out}");
    assert_eq!(out["lsar_namespace"], "shop");

    // TokenReviews. A static token: this server's audience, and not for another.
    let api = "https://kubernetes.default.svc.cluster.local";
    assert_eq!(out["static"]["authenticated"], true, "{out}");
    assert_eq!(
        out["static"]["user"],
        serde_json::json!({"username": "jane", "uid": "1001", "groups": ["developers", "system:authenticated"], "extra": null})
    );
    assert_eq!(out["static"]["audiences"], serde_json::json!([api]));
    assert_eq!(out["static_for_vault"]["authenticated"], Value::Null);
    assert_eq!(out["static_for_vault"]["error"], "invalid bearer token");

    // A service-account token for the API server, with its uid and token id.
    let sa = &out["sa"];
    assert_eq!(sa["authenticated"], true, "{out}");
    assert_eq!(sa["user"]["username"], "system:serviceaccount:shop:robot");
    assert_eq!(sa["user"]["uid"], uid.trim());
    assert_eq!(
        sa["user"]["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:shop",
            "system:authenticated"
        ])
    );
    let credential = &sa["user"]["extra"]["authentication.kubernetes.io/credential-id"][0];
    assert!(
        credential.as_str().is_some_and(|c| c.starts_with("JTI=")),
        "{sa}"
    );
    assert_eq!(sa["audiences"], serde_json::json!([api]));
    // ... is not one for `vault`, and the one for `vault` only for `vault`: audiences
    // intersect as Kubernetes' JWT authenticator intersects them.
    assert_eq!(out["sa_for_vault"]["authenticated"], Value::Null);
    assert_eq!(
        out["sa_for_vault"]["error"],
        format!(
            "[invalid bearer token, token audiences [\"{api}\"] is invalid for the target audiences [\"vault\"]]"
        )
    );
    assert_eq!(out["vault_sa"]["authenticated"], Value::Null);
    assert_eq!(
        out["vault_sa"]["error"],
        format!(
            "[invalid bearer token, token audiences [\"vault\"] is invalid for the target audiences [\"{api}\"]]"
        )
    );
    assert_eq!(out["vault_sa_for_vault"]["authenticated"], true, "{out}");
    assert_eq!(
        out["vault_sa_for_vault"]["audiences"],
        serde_json::json!(["vault"])
    );

    // A token nobody knows: not authenticated, Kubernetes' error, no HTTP error.
    assert_eq!(
        out["bad"],
        serde_json::json!({
            "authenticated": null,
            "audiences": null,
            "error": "invalid bearer token",
            "user": {"username": null, "uid": null, "groups": null, "extra": null},
        })
    );
}
