//! The Node authorizer and NodeRestriction with the real binary and the real kubectl.
//!
//! One `skerry server` runs its node agent as node `authz-a`, with no RBAC binding of its
//! own: its pod reaches Running only if the kubelet may read the pod's secret and configmap
//! and create its service-account token, which the Node authorizer grants through its graph.
//! The test then speaks as two nodes with client certificates issued from the cluster CA
//! (as `appliance/src/node.rs` issues the kubelet's): `authz-a`, and `authz-b`, which does
//! not run. Each refusal is the 403 kube-apiserver gives, with upstream's words.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::kube::{kubectl_as, tail};
use common::node::{IMAGE, Node, missing_prerequisite, running};

const NODE_A: &str = "authz-a";
const NODE_B: &str = "authz-b";

/// A kubeconfig for node `name` (`system:node:<name>` in `system:nodes`): the admin's, with a
/// client certificate issued by the cluster CA in place of the admin's.
fn node_kubeconfig(node: &Node, name: &str) -> PathBuf {
    let pki = node.data().join("pki");
    let ca = skerry_tls::pki::Ca::load(&pki.join("ca.crt"), &pki.join("ca.key")).expect("the CA");
    let cert = ca
        .client_cert_for(
            &format!("system:node:{name}"),
            &["system:nodes"],
            Duration::from_secs(3600),
        )
        .expect("a node certificate");
    let admin = std::fs::read_to_string(&node.kube.kubeconfig).expect("admin kubeconfig");
    let replaced: Vec<String> = admin
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            match line.trim_start().split_once(':') {
                Some(("client-certificate-data", _)) => format!(
                    "{indent}client-certificate-data: {}",
                    STANDARD.encode(&cert.cert_pem)
                ),
                Some(("client-key-data", _)) => format!(
                    "{indent}client-key-data: {}",
                    STANDARD.encode(&cert.key_pem)
                ),
                _ => line.to_string(),
            }
        })
        .collect();
    let path = node.kube.dir.path().join(format!("{name}.kubeconfig"));
    std::fs::write(&path, replaced.join("\n") + "\n").expect("write kubeconfig");
    path
}

struct As<'a> {
    kubeconfig: PathBuf,
    home: &'a Path,
}

impl As<'_> {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        match stdin {
            None => kubectl_as(&self.kubeconfig, self.home, args),
            Some(text) => {
                use std::io::Write;
                let mut child = std::process::Command::new(common::kube::KUBECTL)
                    .args(args)
                    .env("KUBECONFIG", &self.kubeconfig)
                    .env("HOME", self.home)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("kubectl");
                child
                    .stdin
                    .take()
                    .expect("stdin")
                    .write_all(text.as_bytes())
                    .expect("write stdin");
                child.wait_with_output().expect("kubectl output")
            }
        }
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `args`, which must fail with a 403 saying `message`; returns stderr.
    fn forbidden(&self, args: &[&str], stdin: Option<&str>, message: &str) -> String {
        let out = self.run(args, stdin);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "kubectl {args:?} succeeded");
        assert!(
            // kubectl prints a 403 as `Error from server (Forbidden)`, except where it wraps
            // the Status's message (`create token`).
            (stderr.contains("Error from server (Forbidden)") || stderr.contains("is forbidden: "))
                && stderr.contains(message),
            "kubectl {args:?}: wanted a 403 with {message:?}, got {stderr}"
        );
        stderr
    }
}

const SECRET_POD: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: db, namespace: default}
stringData: {password: hunter2}
---
apiVersion: v1
kind: Secret
metadata: {name: unrelated, namespace: default}
stringData: {password: nope}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: conf, namespace: default}
data: {MODE: test}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  serviceAccountName: default
  containers:
  - name: c
    image: IMAGE
    command: ["sleep", "3600"]
    env: [{name: PASSWORD, valueFrom: {secretKeyRef: {name: db, key: password}}}]
    envFrom: [{configMapRef: {name: conf}}]
    volumeMounts: [{name: token, mountPath: /var/run/secrets/tok}]
  volumes:
  - name: token
    projected: {sources: [{serviceAccountToken: {path: token}}]}
"#;

#[test]
fn nodes_reach_only_their_own_pods_objects_and_write_only_their_own() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE_A);
    node.import_busybox();
    // The service account the pod names, made by the controllers.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !node
        .kube
        .kubectl_output(&["get", "serviceaccount", "default"], None)
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no default service account"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    node.kube.ok_in(
        &["apply", "-f", "-"],
        Some(&SECRET_POD.replace("IMAGE", IMAGE)),
    );
    // The kubelet, with no binding, read the secret and configmap and made the token.
    node.wait_pod("web", "running", running);
    assert!(
        node.kube
            .ok(&["get", "clusterrolebindings", "-o", "name"])
            .lines()
            .all(|b| !b.contains("skerry:node:")),
        "no per-node binding is made"
    );

    let home = node.kube.home.as_path();
    let a = As {
        kubeconfig: node_kubeconfig(&node, NODE_A),
        home,
    };
    let b = As {
        kubeconfig: node_kubeconfig(&node, NODE_B),
        home,
    };

    // Secrets: through the graph only.
    let secret = a.ok(
        &["get", "secret", "db", "-o", "jsonpath={.data.password}"],
        None,
    );
    assert_eq!(STANDARD.decode(secret.trim()).expect("base64"), b"hunter2");
    a.ok(&["get", "configmap", "conf"], None);
    a.forbidden(
        &["get", "secret", "unrelated"],
        None,
        "secrets \"unrelated\" is forbidden: User \"system:node:authz-a\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'authz-a' and this object",
    );
    b.forbidden(
        &["get", "secret", "db"],
        None,
        "secrets \"db\" is forbidden: User \"system:node:authz-b\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'authz-b' and this object",
    );
    a.forbidden(&["get", "secrets"], None, "No Object name found");
    b.forbidden(
        &["create", "token", "default"],
        None,
        "serviceaccounts \"default\" is forbidden: User \"system:node:authz-b\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"default\": no relationship found between node 'authz-b' and this object",
    );
    // The access reviews ask the same chain.
    let can = |who: &str, what: &str| {
        node.kube
            .kubectl_output(
                &[
                    "auth",
                    "can-i",
                    "get",
                    what,
                    "--as",
                    &format!("system:node:{who}"),
                    "--as-group",
                    "system:nodes",
                ],
                None,
            )
            .status
            .success()
    };
    assert!(can(NODE_A, "secret/db"));
    assert!(!can(NODE_B, "secret/db"));

    // AuthorizeNodeWithSelectors: a node reads its own Node only, pods bound to it only, and
    // lists or watches pods only by its spec.nodeName.
    a.ok(&["get", "node", NODE_A], None);
    a.ok(
        &[
            "get",
            "nodes",
            "--field-selector",
            &format!("metadata.name={NODE_A}"),
        ],
        None,
    );
    a.forbidden(
        &["get", "nodes"],
        None,
        "nodes is forbidden: User \"system:node:authz-a\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: node 'authz-a' cannot read all nodes, only its own Node object",
    );
    // B may not read A's Node, so a `kubectl label`'s first GET is refused.
    b.forbidden(
        &["label", "node", NODE_A, "x=y"],
        None,
        "nodes \"authz-a\" is forbidden: User \"system:node:authz-b\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node 'authz-b' cannot read 'authz-a', only its own Node object",
    );
    a.ok(&["get", "pod", "web"], None);
    b.forbidden(
        &["get", "pod", "web"],
        None,
        "pods \"web\" is forbidden: User \"system:node:authz-b\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\": no relationship found between node 'authz-b' and this object",
    );
    let listed = a.ok(
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={NODE_A}"),
            "-o",
            "name",
        ],
        None,
    );
    assert!(listed.contains("pod/web"), "{listed}");
    a.forbidden(
        &["get", "pods", "-A"],
        None,
        "pods is forbidden: User \"system:node:authz-a\" cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector",
    );
    b.forbidden(
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={NODE_A}"),
        ],
        None,
        "can only list/watch pods with spec.nodeName field selector",
    );
    // B may not write A's Node (a raw PUT: kubectl's label and patch GET it first), Lease or
    // pod status.
    let mut node_a: serde_json::Value =
        serde_json::from_str(&node.kube.ok(&["get", "node", NODE_A, "-o", "json"]))
            .expect("node json");
    node_a["metadata"]["labels"]["x"] = "y".into();
    b.forbidden(
        &[
            "replace",
            "--raw",
            &format!("/api/v1/nodes/{NODE_A}"),
            "-f",
            "-",
        ],
        Some(&node_a.to_string()),
        "nodes \"authz-a\" is forbidden: node \"authz-b\" is not allowed to modify node \"authz-a\"",
    );
    b.forbidden(
        &[
            "-n",
            "kube-node-lease",
            "patch",
            "lease",
            NODE_A,
            "--type=merge",
            "-p",
            r#"{"spec":{"holderIdentity":"b"}}"#,
        ],
        None,
        "can only access node lease with the same name as the requesting node",
    );
    // A status write (a PUT: kubectl's patch of a subresource first GETs it, which the node
    // rules do not grant, upstream either).
    let status_of = |message: &str| {
        let mut pod = node.pod("web");
        pod["status"]["message"] = message.into();
        pod.to_string()
    };
    b.forbidden(
        &["replace", "--subresource=status", "-f", "-"],
        Some(&status_of("b")),
        "pods \"web\" is forbidden: node \"authz-b\" can only update pod status for pods with spec.nodeName set to itself",
    );
    b.forbidden(
        &["delete", "pod", "web", "--wait=false"],
        None,
        "pods \"web\" is forbidden: node \"authz-b\" can only delete pods with spec.nodeName set to itself",
    );
    // A may: its own pod's status, its own Node's labels (the kubelet's namespaces).
    a.ok(
        &["replace", "--subresource=status", "-f", "-"],
        Some(&status_of("a")),
    );
    a.ok(
        &["label", "node", NODE_A, "kubelet.kubernetes.io/tier=a"],
        None,
    );
    a.forbidden(
        &[
            "label",
            "node",
            NODE_A,
            "node-restriction.kubernetes.io/tier=gold",
        ],
        None,
        "is not allowed to modify labels: node-restriction.kubernetes.io/tier",
    );

    // A node creates no pod but a mirror pod of its own.
    let plain = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"sneaky","namespace":"default"}},
            "spec":{{"nodeName":"{NODE_A}","containers":[{{"name":"c","image":"{IMAGE}"}}]}}}}"#
    );
    a.forbidden(
        &["create", "-f", "-"],
        Some(&plain),
        "pods \"sneaky\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"authz-a\" can only create mirror pods",
    );
    let uid = node
        .kube
        .ok(&["get", "node", NODE_A, "-o", "jsonpath={.metadata.uid}"]);
    let mirror = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"static-authz-a","namespace":"default",
              "annotations":{{"kubernetes.io/config.mirror":"h"}},
              "ownerReferences":[{{"apiVersion":"v1","kind":"Node","name":"{NODE_A}","uid":"{uid}","controller":true}}]}},
            "spec":{{"nodeName":"{NODE_A}","containers":[{{"name":"c","image":"{IMAGE}"}}]}}}}"#
    );
    b.forbidden(
        &["create", "-f", "-"],
        Some(&mirror),
        "node \"authz-b\" can only create pods with spec.nodeName set to itself",
    );
    a.ok(&["create", "-f", "-"], Some(&mirror));
    a.ok(&["delete", "pod", "static-authz-a", "--wait=false"], None);
    let with_secret = mirror.replace(
        r#""containers""#,
        r#""volumes":[{"name":"s","secret":{"secretName":"db"}}],"containers""#,
    );
    // The ServiceAccount admission's mirror-pod rule runs first, as upstream orders the
    // plugins (serviceaccount before noderestriction); a configmap is NodeRestriction's alone.
    a.forbidden(
        &["create", "-f", "-"],
        Some(&with_secret),
        "a mirror pod may not reference secrets",
    );
    let with_configmap = mirror.replace(
        r#""containers""#,
        r#""volumes":[{"name":"s","configMap":{"name":"settings"}}],"containers""#,
    );
    a.forbidden(
        &["create", "-f", "-"],
        Some(&with_configmap),
        "node \"authz-a\" can not create pods that reference configmaps",
    );

    // The kubelet still works after all that: its pod stays running.
    let pod = node.pod("web");
    assert!(
        running(&pod),
        "web not running: {}\n{}",
        pod["status"],
        tail(&node.kube.log())
    );
    node.kube.ok(&["delete", "pod", "web", "--wait=false"]);
}
