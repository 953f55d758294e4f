//! The real kubectl against a running `skerry server`: every test starts the binary on a fresh
//! data dir with its Kubernetes API on a free port, points `/usr/bin/kubectl` (the dispatcher,
//! which runs its bundled 1.32 after reading `/version`) at the admin kubeconfig skerry
//! writes, and checks what kubectl prints — the client users have, unchanged.
//!
//! Each test has its own `HOME`, so kubectl's discovery and HTTP caches start empty.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::kube::*;

const APP: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
  namespace: shop
data:
  greeting: hello
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  labels:
    app: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports:
        - containerPort: 80
        env:
        - name: MODE
          value: blue
        - name: EXTRA
          value: "1"
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: 80
"#;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write file");
}

#[test]
fn namespaces_tables_and_output_formats() {
    let k = Kube::start(&[]);
    // The generator command sends a protobuf body.
    assert_eq!(
        k.ok(&["create", "namespace", "shop"]).trim(),
        "namespace/shop created"
    );
    let table = k.ok(&["get", "namespaces"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "STATUS", "AGE"]);
    for ns in [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "shop",
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(ns) && l.contains("Active")),
            "{ns} missing:\n{table}"
        );
    }
    assert_eq!(
        k.ok(&["get", "ns", "shop", "-o", "name"]).trim(),
        "namespace/shop"
    );
    assert_eq!(
        k.ok(&["get", "ns", "shop", "-o", "jsonpath={.status.phase}"]),
        "Active"
    );
    let json: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "ns", "shop", "-o", "json"])).expect("json");
    assert_eq!(json["metadata"]["name"], "shop");
    assert!(
        json["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(json["metadata"]["resourceVersion"].as_str().is_some());
    let yaml = k.ok(&["get", "ns", "shop", "-o", "yaml"]);
    assert!(yaml.contains("name: shop"), "{yaml}");
    let err = k.fails(&["create", "namespace", "shop"], None);
    assert!(
        err.contains("Error from server (AlreadyExists): namespaces \"shop\" already exists"),
        "{err}"
    );
    // A pod starts Pending with its QoS class; an unscheduled pod is deleted at once.
    k.ok(&[
        "run",
        "probe",
        "-n",
        "shop",
        "--image=busybox:1.36",
        "--restart=Never",
    ]);
    assert_eq!(
        k.ok(&[
            "get",
            "pod",
            "probe",
            "-n",
            "shop",
            "-o",
            "jsonpath={.status.phase} {.status.qosClass}"
        ]),
        "Pending BestEffort"
    );
    let pods = k.ok(&["get", "pods", "-n", "shop"]);
    assert_eq!(
        pods.lines()
            .next()
            .map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE"])
    );
    assert!(
        pods.contains("probe") && pods.contains("Pending") && pods.contains("0/1"),
        "{pods}"
    );
    assert!(
        k.ok(&["delete", "pod", "probe", "-n", "shop"])
            .contains("deleted")
    );
    // Events expire: they are stored on a lease (shared by the Events of the same minute).
    let event = "apiVersion: v1\nkind: Event\nmetadata:\n  name: e1\n  namespace: shop\ninvolvedObject:\n  kind: ConfigMap\n  name: x\n  namespace: shop\nreason: Tested\nmessage: hello\ntype: Normal\n";
    k.ok_in(&["create", "-f", "-"], Some(event));
    let out = Command::new("etcdctl")
        .args([
            "--endpoints",
            &k.etcd,
            "get",
            "/registry/events/shop/e1",
            "-w",
            "json",
        ])
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl");
    let stored: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl json");
    assert!(
        stored["kvs"][0]["lease"].as_i64().is_some_and(|l| l != 0),
        "{stored}"
    );
    let err = k.fails(&["get", "configmap", "nope", "-n", "shop"], None);
    assert!(
        err.contains("Error from server (NotFound): configmaps \"nope\" not found"),
        "{err}"
    );
}

#[test]
fn apply_get_patch_scale_label_and_delete() {
    let k = Kube::start(&[]);
    k.ok(&["create", "namespace", "shop"]);
    let app = k.path("app.yaml");
    write(&app, APP);
    let out = k.ok(&["apply", "-f", &app.display().to_string()]);
    for line in [
        "configmap/web-config created",
        "deployment.apps/web created",
        "service/web created",
    ] {
        assert!(out.contains(line), "{out}");
    }
    // Unchanged on a second apply.
    let out = k.ok(&["apply", "-f", &app.display().to_string()]);
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");
    // Change the file: client-side apply sends a strategic merge patch that removes EXTRA
    // with `$patch: delete` and keeps the container list order with `$setElementOrder`.
    write(
        &app,
        &APP.replace("        - name: EXTRA\n          value: \"1\"\n", "")
            .replace("blue", "green"),
    );
    let out = k.ok(&["apply", "-f", &app.display().to_string()]);
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let env = k.ok(&[
        "get",
        "deploy",
        "web",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env}",
    ]);
    assert!(env.contains("green") && !env.contains("EXTRA"), "{env}");
    assert_eq!(
        k.ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "2"
    );

    let wide = k.ok(&["get", "deploy", "-n", "shop", "-o", "wide"]);
    let header: Vec<&str> = wide
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    assert!(
        wide.contains("nginx:1.27") && wide.contains("app=web"),
        "{wide}"
    );
    let svc = k.ok(&["get", "svc", "web", "-n", "shop"]);
    assert!(
        svc.lines()
            .next()
            .is_some_and(|h| h.contains("CLUSTER-IP") && h.contains("PORT(S)")),
        "{svc}"
    );
    // ClusterIPs: `kubernetes` holds the first address; others are picked at random from the
    // range and claimed with their Service; an address asked for by name must be free, and
    // a deleted Service gives its address back.
    assert_eq!(
        k.ok(&[
            "get",
            "svc",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}"
        ]),
        "10.96.0.1"
    );
    let ip = k.ok(&[
        "get",
        "svc",
        "web",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert!(ip.starts_with("10.") && ip != "10.96.0.1", "{ip}");
    let taken = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: copy\n  namespace: shop\nspec:\n  clusterIP: {ip}\n  ports:\n  - port: 81\n"
    );
    let err = k.fails(&["apply", "-f", "-"], Some(&taken));
    assert!(err.contains("provided IP is already allocated"), "{err}");
    k.ok(&[
        "create",
        "service",
        "clusterip",
        "static",
        "-n",
        "shop",
        "--tcp=82:82",
        "--clusterip=10.96.0.20",
    ]);
    k.ok(&["delete", "svc", "static", "-n", "shop"]);
    k.ok(&[
        "create",
        "service",
        "clusterip",
        "static-again",
        "-n",
        "shop",
        "--tcp=82:82",
        "--clusterip=10.96.0.20",
    ]);

    // Patches of all three types.
    k.ok(&[
        "patch",
        "configmap",
        "web-config",
        "-n",
        "shop",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"extra":"x"}}"#,
    ]);
    k.ok(&[
        "patch",
        "configmap",
        "web-config",
        "-n",
        "shop",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/data/greeting","value":"hi"}]"#,
    ]);
    k.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "shop",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.28"}]}}}}"#,
    ]);
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "web-config",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.greeting} {.data.extra}"
        ]),
        "hi x"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}"
        ]),
        "nginx:1.28"
    );
    let err = k.fails(
        &[
            "patch",
            "deploy",
            "web",
            "-n",
            "shop",
            "--type",
            "json",
            "-p",
            r#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
        ],
        None,
    );
    assert!(err.contains("invalid") && err.contains("test"), "{err}");

    assert!(
        k.ok(&["scale", "deploy", "web", "-n", "shop", "--replicas", "5"])
            .contains("scaled")
    );
    assert_eq!(
        k.ok(&[
            "get",
            "deploy",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "5"
    );
    k.ok(&["label", "cm", "web-config", "-n", "shop", "tier=front"]);
    k.ok(&["annotate", "cm", "web-config", "-n", "shop", "owner=team-a"]);
    assert_eq!(
        k.ok(&["get", "cm", "-n", "shop", "-l", "tier=front", "-o", "name"])
            .trim(),
        "configmap/web-config"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "web-config",
            "-n",
            "shop",
            "-o",
            "jsonpath={.metadata.annotations.owner}"
        ]),
        "team-a"
    );

    // Server-side apply: a second manager taking a field another owns is a conflict.
    let ssa = k.path("ssa.yaml");
    write(
        &ssa,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: shop\ndata:\n  a: \"1\"\n",
    );
    assert!(
        k.ok(&["apply", "--server-side", "-f", &ssa.display().to_string()])
            .contains("serverside-applied")
    );
    write(
        &ssa,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: shop\ndata:\n  a: \"2\"\n",
    );
    let err = k.fails(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "-f",
            &ssa.display().to_string(),
        ],
        None,
    );
    assert!(err.contains("conflict"), "{err}");
    k.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        "other",
        "-f",
        &ssa.display().to_string(),
    ]);
    assert_eq!(
        k.ok(&["get", "cm", "ssa", "-n", "shop", "-o", "jsonpath={.data.a}"]),
        "2"
    );

    // Delete with cascade options.
    assert!(
        k.ok(&["delete", "cm", "web-config", "-n", "shop"])
            .contains("deleted")
    );
    // Orphaning marks the Deployment with the `orphan` finalizer for the garbage collector
    // (which runs with the control loops) to release its ReplicaSets; kubectl is told not to
    // wait for that here.
    k.ok(&["delete", "deploy", "web", "-n", "shop", "--cascade=orphan"]);
    // The garbage collector orphans the Deployment's ReplicaSet (removes its owner reference)
    // before it lets the Deployment go; the ReplicaSet and its pods stay.
    let err = k.fails(&["get", "deploy", "web", "-n", "shop"], None);
    assert!(err.contains("NotFound"), "{err}");
    let orphans = k.ok(&[
        "get",
        "rs",
        "-n",
        "shop",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.ownerReferences}{"\n"}{end}"#,
    ]);
    assert!(!orphans.trim().is_empty(), "the ReplicaSet was deleted");
    assert!(
        orphans.lines().all(|l| l.ends_with('=')),
        "owner references left: {orphans}"
    );
    assert!(
        k.ok(&[
            "delete",
            "svc",
            "web",
            "-n",
            "shop",
            "--cascade=foreground",
            "--wait=false"
        ])
        .contains("deleted")
    );
    let err = k.fails(&["get", "cm", "web-config", "-n", "shop"], None);
    assert!(err.contains("NotFound"), "{err}");
}

#[test]
fn watch_edit_chunks_discovery_and_errors() {
    let k = Kube::start(&[]);
    k.ok(&["create", "namespace", "shop"]);
    // `get -w` prints the current object, then the change another command makes.
    let mut watch = k
        .command(&["get", "cm", "-n", "shop", "-w", "--request-timeout", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    std::thread::sleep(Duration::from_secs(2));
    k.ok(&[
        "create",
        "configmap",
        "watched",
        "-n",
        "shop",
        "--from-literal=a=b",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("watched"),
        "get -w did not see the create:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `edit` with a scripted editor.
    let editor = k.path("editor.sh");
    write(&editor, "#!/bin/sh\nsed -i 's/a: b/a: edited/' \"$1\"\n");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let out = k
        .command(&["edit", "cm", "watched", "-n", "shop"])
        .env("EDITOR", &editor)
        .output()
        .expect("kubectl edit");
    assert!(
        out.status.success(),
        "edit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        k.ok(&[
            "get",
            "cm",
            "watched",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.a}"
        ]),
        "edited"
    );

    // Paged lists.
    for i in 0..7 {
        k.ok(&["create", "configmap", &format!("page-{i}"), "-n", "shop"]);
    }
    let out = k.ok(&["get", "cm", "-n", "shop", "--chunk-size=2", "-o", "name"]);
    for i in 0..7 {
        assert!(out.contains(&format!("configmap/page-{i}")), "{out}");
    }
    // kubectl asked in pages of two and followed the continue tokens.
    let out = k.kubectl_output(&["get", "cm", "-n", "shop", "--chunk-size=2", "-v=6"], None);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("limit=2") && log.contains("continue="),
        "{log}"
    );

    let resources = k.ok(&["api-resources"]);
    for line in [
        "deployments",
        "pods",
        "leases",
        "clusterroles",
        "endpointslices",
    ] {
        assert!(resources.contains(line), "{resources}");
    }
    let explain = k.ok(&["explain", "deployment.spec.replicas"]);
    assert!(explain.contains("replicas"), "{explain}");

    let err = k.fails(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata: [unclosed\n"),
    );
    assert!(err.contains("error"), "{err}");
    let err = k.fails(&["apply", "-f", "-"], Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: shop\ndataa:\n  a: b\n"));
    assert!(err.contains("unknown field \"dataa\""), "{err}");
}

#[test]
fn authorization_for_a_restricted_user() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    write(&tokens, "jane-token,jane,1001,\"developers\"\n");
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
        "jane-reads",
        "-n",
        "shop",
        "--role=pod-reader",
        "--user=jane",
    ]);
    assert_eq!(
        k.ok(&["auth", "can-i", "create", "deployments", "-n", "shop"])
            .trim(),
        "yes"
    );
    let as_jane = |args: &[&str]| {
        let mut all = vec!["--token", "jane-token", "--user", "jane-user"];
        all.extend_from_slice(args);
        k.kubectl_output(&all, None)
    };
    // kubectl needs a user entry to exist; define one with only the token.
    k.ok(&[
        "config",
        "set-credentials",
        "jane-user",
        "--token=jane-token",
    ]);
    let out = as_jane(&["get", "pods", "-n", "shop"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_jane(&["get", "secrets", "-n", "shop"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Error from server (Forbidden): secrets is forbidden: User \"jane\" cannot list resource \"secrets\" in API group \"\" in the namespace \"shop\""),
        "{err}"
    );
    let out = as_jane(&["auth", "can-i", "list", "pods", "-n", "shop"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
    let out = as_jane(&["auth", "can-i", "delete", "pods", "-n", "shop"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    // Impersonation: the admin may act as jane and gets jane's answers; jane may not
    // impersonate anyone.
    assert_eq!(
        k.ok(&["auth", "can-i", "list", "pods", "-n", "shop", "--as=jane"])
            .trim(),
        "yes"
    );
    assert_eq!(
        k.kubectl_output(
            &["auth", "can-i", "delete", "pods", "-n", "shop", "--as=jane"],
            None
        )
        .stdout,
        b"no\n"
    );
    let err = k.fails(&["get", "secrets", "-n", "shop", "--as=jane"], None);
    assert!(
        err.contains("User \"jane\" cannot list resource \"secrets\""),
        "{err}"
    );
    let out = as_jane(&["get", "pods", "-n", "shop", "--as=admin"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot impersonate resource \"users\""),
        "{err}"
    );
    // No credentials at all: 401 except the public endpoints.
    let out = k.kubectl_output(
        &["--token", "wrong", "--user", "jane-user", "get", "ns"],
        None,
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthorized"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A service account token from `kubectl create token` authenticates as the account.
    k.ok(&["create", "serviceaccount", "robot", "-n", "shop"]);
    let token = k.ok(&["create", "token", "robot", "-n", "shop"]);
    let out = k.kubectl_output(
        &[
            "--token",
            token.trim(),
            "--user",
            "jane-user",
            "get",
            "pods",
            "-n",
            "shop",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("system:serviceaccount:shop:robot"), "{err}");
}

const SAR: &str = r#"
apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: jane
  groups: ["developers"]
  resourceAttributes:
    verb: list
    resource: pods
    namespace: shop
"#;

const LSAR: &str = r#"
apiVersion: authorization.k8s.io/v1
kind: LocalSubjectAccessReview
metadata:
  namespace: shop
spec:
  user: jane
  resourceAttributes:
    verb: delete
    resource: pods
    namespace: NAMESPACE
"#;

/// SubjectAccessReview and LocalSubjectAccessReview with `kubectl create -f ... -o yaml`, as an
/// admin, as a delegate bound to `system:auth-delegator`, and refused to a user without
/// `create` on them; the reviews are listed as Kubernetes lists them.
///
/// `--validate=false`: for a kind with no PATCH operation in the OpenAPI documents (every
/// create-only kind, in Kubernetes too) kubectl's client-side validation lists
/// CustomResourceDefinitions to learn whether the kind is a custom one, and skerry serves no
/// `apiextensions.k8s.io`; the flag skips that lookup, the server's answer is the same.
#[test]
fn subject_access_reviews_with_kubectl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    write(
        &tokens,
        "jane-token,jane,1001,\"developers\"\nkubelet-token,kubelet-api,1002\n",
    );
    let k = Kube::start(&["--token-auth-file", &tokens.display().to_string()]);
    let resources = k.ok(&[
        "api-resources",
        "--api-group=authorization.k8s.io",
        "--no-headers",
    ]);
    let names: Vec<&str> = resources
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        [
            "localsubjectaccessreviews",
            "selfsubjectaccessreviews",
            "subjectaccessreviews"
        ],
        "{resources}"
    );
    let resources = k.ok(&["api-resources", "--api-group=authentication.k8s.io"]);
    // Upstream 1.32's two: `kubectl auth whoami` asks selfsubjectreviews.
    assert!(
        resources.contains(
            "selfsubjectreviews                authentication.k8s.io/v1   false        SelfSubjectReview\n\
             tokenreviews                      authentication.k8s.io/v1   false        TokenReview"
        ),
        "{resources}"
    );
    k.ok(&["create", "namespace", "shop"]);
    let sar = k.path("sar.yaml");
    write(&sar, SAR);
    let sar = sar.display().to_string();
    let create = |extra: &[&str], file: &str| {
        let mut args = vec!["create", "-f", file, "--validate=false", "-o", "yaml"];
        args.extend_from_slice(extra);
        k.kubectl_output(&args, None)
    };
    let out = k.ok(&["create", "-f", &sar, "--validate=false", "-o", "yaml"]);
    assert!(out.contains("kind: SubjectAccessReview"), "{out}");
    assert!(out.contains("status:\n  allowed: false\n"), "{out}");
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
    let out = k.ok(&["create", "-f", &sar, "--validate=false", "-o", "json"]);
    let answer: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        answer["status"],
        serde_json::json!({
            "allowed": true,
            "reason": "RBAC: allowed by RoleBinding \"developers-read/shop\" of Role \"pod-reader\" to Group \"developers\"",
        })
    );
    assert_eq!(answer["spec"]["groups"], serde_json::json!(["developers"]));

    // A LocalSubjectAccessReview: jane may not delete pods in shop; and one that names
    // another namespace than its own is refused with Kubernetes' validation error.
    let lsar = k.path("lsar.yaml");
    write(&lsar, &LSAR.replace("NAMESPACE", "shop"));
    let out = k.ok(&[
        "create",
        "-f",
        &lsar.display().to_string(),
        "--validate=false",
        "-o",
        "yaml",
    ]);
    assert!(out.contains("kind: LocalSubjectAccessReview"), "{out}");
    assert!(out.contains("  namespace: shop\n"), "{out}");
    assert!(out.contains("status:\n  allowed: false\n"), "{out}");
    let elsewhere = k.path("lsar-elsewhere.yaml");
    write(&elsewhere, &LSAR.replace("NAMESPACE", "other"));
    let err = k.fails(
        &[
            "create",
            "-f",
            &elsewhere.display().to_string(),
            "--validate=false",
        ],
        None,
    );
    assert!(
        err.contains("spec.resourceAttributes.namespace: Invalid value: \"other\": must match metadata.namespace"),
        "{err}"
    );

    // Creating a review needs `create` on it: jane has none; a delegate bound to
    // system:auth-delegator (Kubernetes' bootstrap role for this) has.
    k.ok(&[
        "config",
        "set-credentials",
        "jane-user",
        "--token=jane-token",
    ]);
    k.ok(&[
        "config",
        "set-credentials",
        "kubelet-user",
        "--token=kubelet-token",
    ]);
    let out = create(&["--user", "jane-user"], &sar);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Error from server (Forbidden): error when creating \"") && err.contains(
            "subjectaccessreviews.authorization.k8s.io is forbidden: User \"jane\" cannot create resource \"subjectaccessreviews\" in API group \"authorization.k8s.io\" at the cluster scope"
        ),
        "{err}"
    );
    assert!(!create(&["--user", "kubelet-user"], &sar).status.success());
    k.ok(&[
        "create",
        "clusterrolebinding",
        "kubelet-api-auth",
        "--clusterrole=system:auth-delegator",
        "--user=kubelet-api",
    ]);
    let out = create(&["--user", "kubelet-user"], &sar);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("allowed: true"));
}

#[test]
fn a_three_member_cluster_serves_the_api_on_every_member_and_survives_losing_one() {
    let Cluster {
        mut members,
        home,
        root: _root,
    } = Cluster::start();
    // A write through one member is read through the others.
    eventually(
        &members[0].kubeconfig,
        &home,
        &["create", "namespace", "edge"],
        &members[0].log,
    );
    for m in &members[1..] {
        let out = eventually(
            &m.kubeconfig,
            &home,
            &["get", "namespace", "edge", "-o", "name"],
            &m.log,
        );
        assert_eq!(out.trim(), "namespace/edge");
    }
    // Lose a box: the other two keep serving reads and writes.
    drop(members.remove(0));
    eventually(
        &members[0].kubeconfig,
        &home,
        &[
            "create",
            "configmap",
            "after-loss",
            "-n",
            "edge",
            "--from-literal=k=v",
        ],
        &members[0].log,
    );
    let out = eventually(
        &members[1].kubeconfig,
        &home,
        &[
            "get",
            "configmap",
            "after-loss",
            "-n",
            "edge",
            "-o",
            "jsonpath={.data.k}",
        ],
        &members[1].log,
    );
    assert_eq!(out, "v");
}
