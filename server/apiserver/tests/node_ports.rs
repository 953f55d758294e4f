//! NodePorts through the registry, as kubectl writes them: a NodePort Service gets a port of
//! `--service-node-port-range` claimed in its create transaction, a port another Service
//! holds or one out of the range is refused with Kubernetes' 422, an update that turns the
//! Service into a ClusterIP releases the port in its own transaction, turning it back claims
//! a new one, a LoadBalancer with `externalTrafficPolicy: Local` gets a health check port,
//! `allocateLoadBalancerNodePorts: false` gets none, and the delete releases everything.
//!
//! The claims are read back from the store (`/registry/servicenodeports/<protocol>/<port>`).

mod common;

use common::{Server, start};

use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};
use skerry_store::pb::etcdserverpb::RangeRequest;

const SERVICES: &str = "/api/v1/namespaces/default/services";
const MERGE: &str = "application/merge-patch+json";

/// One write through the registry: the status and the body (the Status on an error).
async fn write(
    server: &Server,
    method: Method,
    path: &str,
    content_type: &str,
    body: Value,
) -> (u16, Value) {
    let request = common::request(
        method,
        path,
        None,
        Some(content_type),
        Bytes::from(body.to_string()),
    );
    match common::exchange(server, request).await {
        Ok((status, body)) => (status, serde_json::from_slice(&body).expect("JSON")),
        Err(e) => (e.code, json!({"message": e.message, "reason": e.reason})),
    }
}

/// The node ports claimed in the store.
fn claims(server: &Server) -> Vec<String> {
    let prefix = skerry_apiserver::portalloc::CLAIM_PREFIX;
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let resp = server
        .api
        .store
        .range(&RangeRequest {
            key: Bytes::from(prefix),
            range_end: Bytes::from(end),
            keys_only: true,
            ..Default::default()
        })
        .expect("range");
    resp.kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key)[prefix.len()..].to_string())
        .collect()
}

fn node_port(svc: &Value, i: usize) -> u64 {
    svc["spec"]["ports"][i]["nodePort"]
        .as_u64()
        .unwrap_or_else(|| panic!("port {i} has a nodePort: {svc}"))
}

fn service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

#[tokio::test]
async fn node_ports_are_claimed_checked_released_and_kept() {
    let server = start().await;

    // Allocated in range, claimed with the Service.
    let (status, web) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service(
            "web",
            json!({"type": "NodePort", "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080}]}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{web}");
    let port = node_port(&web, 0);
    assert!((30000..=32767).contains(&port), "{port}");
    assert_eq!(claims(&server), vec![format!("TCP/{port}")]);

    // Taken by web: refused with Kubernetes' message.
    let (status, refused) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service(
            "copy",
            json!({"type": "NodePort",
            "ports": [{"port": 80, "nodePort": port}]}),
        ),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["message"],
        format!(
            "Service \"copy\" is invalid: spec.ports[0].nodePort: Invalid value: {port}: provided port is already allocated"
        )
    );
    // Out of range.
    let (status, refused) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service(
            "low",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 8080}]}),
        ),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["message"],
        "Service \"low\" is invalid: spec.ports[0].nodePort: Invalid value: 8080: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );
    assert_eq!(claims(&server).len(), 1, "refused creates claim nothing");

    // An unrelated update keeps the port.
    let path = format!("{SERVICES}/web");
    let (status, kept) = write(
        &server,
        Method::PATCH,
        &path,
        MERGE,
        json!({"metadata": {"labels": {"tier": "front"}}}),
    )
    .await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(node_port(&kept, 0), port);

    // To ClusterIP: the port is dropped and released in the same write.
    let (status, cluster_ip) = write(
        &server,
        Method::PATCH,
        &path,
        MERGE,
        json!({"spec": {"type": "ClusterIP"}}),
    )
    .await;
    assert_eq!(status, 200, "{cluster_ip}");
    assert!(
        cluster_ip["spec"]["ports"][0].get("nodePort").is_none(),
        "{cluster_ip}"
    );
    assert!(claims(&server).is_empty());
    // The released port can be asked for by another Service.
    let (status, other) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service(
            "other",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{other}");

    // Back to NodePort: a new port, claimed.
    let (status, again) = write(
        &server,
        Method::PATCH,
        &path,
        MERGE,
        json!({"spec": {"type": "NodePort"}}),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    let second = node_port(&again, 0);
    assert_ne!(second, port);
    assert_eq!(claims(&server).len(), 2);

    // Deleting both releases everything.
    for name in ["web", "other"] {
        let request = common::request(
            Method::DELETE,
            &format!("{SERVICES}/{name}"),
            None,
            None,
            Bytes::new(),
        );
        common::exchange(&server, request).await.expect("deleted");
    }
    assert!(claims(&server).is_empty(), "{:?}", claims(&server));
}

#[tokio::test]
async fn load_balancers_get_health_check_ports_unless_told_otherwise() {
    let server = start().await;
    let (status, local) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service("local", json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"name": "dns-tcp", "port": 53, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]})),
    )
    .await;
    assert_eq!(status, 201, "{local}");
    let shared = node_port(&local, 0);
    assert_eq!(
        node_port(&local, 1),
        shared,
        "53/TCP and 53/UDP share a port"
    );
    let health = local["spec"]["healthCheckNodePort"]
        .as_u64()
        .expect("health check port");
    let mut held = claims(&server);
    held.sort();
    let mut expected = vec![
        format!("TCP/{shared}"),
        format!("UDP/{shared}"),
        format!("TCP/{health}"),
    ];
    expected.sort();
    assert_eq!(held, expected);

    // Cluster policy: the health check port goes, and its claim with it.
    let (status, cluster) = write(
        &server,
        Method::PATCH,
        &format!("{SERVICES}/local"),
        MERGE,
        json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
    )
    .await;
    assert_eq!(status, 200, "{cluster}");
    assert!(
        cluster["spec"].get("healthCheckNodePort").is_none(),
        "{cluster}"
    );
    assert_eq!(claims(&server).len(), 2);

    let (status, bare) = write(
        &server,
        Method::POST,
        SERVICES,
        "application/json",
        service(
            "bare",
            json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
            "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{bare}");
    assert!(bare["spec"]["ports"][0].get("nodePort").is_none(), "{bare}");
    assert_eq!(claims(&server).len(), 2);
}
