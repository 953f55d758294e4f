//! The in-cluster configuration for real: a pod created with no ServiceAccount named runs as
//! `default`, and finds at `/var/run/secrets/kubernetes.io/serviceaccount` the three files
//! every client library's in-cluster configuration reads — a token the apiserver authenticates
//! as `system:serviceaccount:<ns>:default` (kubectl with only that token and that CA), the cluster CA (published as `kube-root-ca.crt` in
//! its namespace) that verifies the apiserver, and its namespace. Each piece is a different
//! component: the ServiceAccount admission adds the projected volume, the root CA publisher
//! the ConfigMap, the serviceaccount controller the account, the kubelet the files and the
//! token (TokenRequest). A pod with `automountServiceAccountToken: false` has no such
//! directory.
//!
//! The real `skerry server` with its node agent and containerd, the real kubectl; the node
//! harness is `common::node`.

mod common;

use std::time::Instant;

use base64::Engine as _;
use common::kube::tail;
use common::node::{IMAGE, Node, POD_TIMEOUT, missing_prerequisite};
use serde_json::{Value, json};

const NODE: &str = "sa-node";
const NAMESPACE: &str = "apps";
const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// What the printing pod ends its output with.
const END: &str = "END-OF-FILES";

impl Node {
    /// Applies a host-network pod in [`NAMESPACE`] running `script`, with `spec_extra`.
    fn apply_script_pod(&self, name: &str, script: &str, spec_extra: Value) {
        let mut spec = json!({"hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sh", "-c", script]}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            spec.extend(extra.clone());
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec});
        self.kube
            .ok_in(&["apply", "-f", "-"], Some(&pod.to_string()));
    }

    /// `kubectl logs` of the pod once its output holds [`END`].
    fn full_log(&self, name: &str) -> String {
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let out = self
                .kube
                .kubectl_output(&["logs", "-n", NAMESPACE, name], None);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && stdout.contains(END) {
                return stdout;
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} never printed its files: {stdout:?}\nstderr: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail(&self.kube.log())
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// The marker the pod prints before each file (not `---`: a PEM's own lines start so).
const MARK: &str = "==>";

/// The text between the marker line of `start` and the next marker line.
fn section<'a>(log: &'a str, start: &str) -> &'a str {
    let after = log
        .split_once(&format!("{MARK}{start}\n"))
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no {start} in {log:?}"));
    after
        .split_once(&format!("\n{MARK}"))
        .map_or(after, |(s, _)| s)
}

#[test]
fn a_pod_reads_its_token_ca_and_namespace() {
    if missing_prerequisite() {
        return;
    }
    let node = Node::start(NODE);
    node.import_busybox();
    node.kube.ok(&["create", "namespace", NAMESPACE]);

    // Created right after its namespace: the admission waits for the `default` account the
    // serviceaccount controller is creating.
    let script = format!(
        "echo '{MARK}token'; cat {MOUNT}/token; echo; echo '{MARK}ca'; cat {MOUNT}/ca.crt; \
         echo '{MARK}namespace'; cat {MOUNT}/namespace; echo; echo '{MARK}{END}'; exec sleep 3600"
    );
    node.apply_script_pod("reader", &script, json!({}));
    node.apply_script_pod(
        "opted-out",
        &format!("ls {MOUNT} 2>&1; echo '{MARK}{END}'; exec sleep 3600"),
        json!({"automountServiceAccountToken": false}),
    );

    // What the admission wrote into the pod.
    let pod: Value = serde_json::from_str(
        &node
            .kube
            .ok(&["get", "pod", "-n", NAMESPACE, "reader", "-o", "json"]),
    )
    .expect("pod JSON");
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    let volume = &pod["spec"]["volumes"][0];
    let volume_name = volume["name"].as_str().expect("a volume");
    assert!(volume_name.starts_with("kube-api-access-"), "{volume}");
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0],
        json!({"name": volume_name, "readOnly": true, "mountPath": MOUNT})
    );

    let log = node.full_log("reader");
    let token = section(&log, "token").trim();
    let ca = section(&log, "ca");
    let namespace = section(&log, "namespace").trim();
    assert_eq!(namespace, NAMESPACE);

    // ca.crt is the cluster CA: the one the admin kubeconfig trusts.
    let config: Value =
        serde_json::from_str(&node.kube.ok(&["config", "view", "--raw", "-o", "json"]))
            .expect("kubeconfig JSON");
    let cluster = &config["clusters"][0]["cluster"];
    let cluster_ca = base64::engine::general_purpose::STANDARD
        .decode(
            cluster["certificate-authority-data"]
                .as_str()
                .expect("embedded CA"),
        )
        .expect("base64");
    assert_eq!(
        ca.trim(),
        String::from_utf8_lossy(&cluster_ca).trim(),
        "the pod's ca.crt"
    );
    let published = node.kube.ok(&[
        "get",
        "configmap",
        "-n",
        NAMESPACE,
        "kube-root-ca.crt",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    assert_eq!(published.trim(), ca.trim());

    // The token works as a bearer token, with the pod's ca.crt verifying the server, and
    // nothing else of the admin's: an empty kubeconfig.
    let ca_file = node.kube.path("pod-ca.crt");
    std::fs::write(&ca_file, ca).expect("write the CA");
    let empty = node.kube.path("empty.kubeconfig");
    std::fs::write(&empty, "").expect("write an empty kubeconfig");
    let server = cluster["server"].as_str().expect("the server URL");
    // skerry serves no SelfSubjectReview (`kubectl auth whoami`); RBAC's refusal names the
    // user the token authenticated as just as well (`default` may read nothing).
    let stderr = node.kube.fails(
        &[
            "--kubeconfig",
            &empty.display().to_string(),
            "--server",
            server,
            "--certificate-authority",
            &ca_file.display().to_string(),
            "--token",
            token,
            "get",
            "pods",
            "-n",
            NAMESPACE,
        ],
        None,
    );
    assert!(
        stderr.contains(&format!(
            "User \"system:serviceaccount:{NAMESPACE}:default\" cannot list resource \"pods\""
        )),
        "{stderr}"
    );
    // A token that is not one is refused outright: the line above was the token's doing.
    let stderr = node.kube.fails(
        &[
            "--kubeconfig",
            &empty.display().to_string(),
            "--server",
            server,
            "--certificate-authority",
            &ca_file.display().to_string(),
            "--token",
            &format!("{token}x"),
            "get",
            "pods",
            "-n",
            NAMESPACE,
        ],
        None,
    );
    assert!(stderr.contains("Unauthorized"), "{stderr}");

    // Opted out: no volume, no directory.
    let log = node.full_log("opted-out");
    assert!(log.contains("No such file or directory"), "{log:?}");
    let pod: Value = serde_json::from_str(&node.kube.ok(&[
        "get",
        "pod",
        "-n",
        NAMESPACE,
        "opted-out",
        "-o",
        "json",
    ]))
    .expect("pod JSON");
    assert!(pod["spec"].get("volumes").is_none(), "{}", pod["spec"]);
}
