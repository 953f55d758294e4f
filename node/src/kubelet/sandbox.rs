//! A pod's sandbox configuration, as upstream's `kuberuntime_sandbox.go`
//! `generatePodSandboxConfig` builds it: metadata, hostname, the log directory, DNS by
//! `dnsPolicy` (`pkg/kubelet/network/dns/dns.go` `GetPodDNS`), port mappings, the labels the
//! kubelet finds it by, the cgroup parent of its QoS class, and the namespaces and security
//! context CRI takes; and the pod's managed `/etc/hosts` (`kubelet_pods.go`
//! `managedHostsFileContent`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::runtime::{LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use crate::cri::api;

/// `dnsPolicy: ClusterFirst`, the API's default.
pub const DNS_CLUSTER_FIRST: &str = "ClusterFirst";
/// `dnsPolicy: ClusterFirstWithHostNet`.
pub const DNS_CLUSTER_FIRST_WITH_HOST_NET: &str = "ClusterFirstWithHostNet";
/// `dnsPolicy: Default`: the node's resolver configuration.
pub const DNS_DEFAULT: &str = "Default";
/// `dnsPolicy: None`: only `dnsConfig`.
pub const DNS_NONE: &str = "None";
/// The `ndots` option of cluster DNS (`dns.go`: `ndotsDNSOption = "ndots:5"`).
pub const CLUSTER_NDOTS: &str = "ndots:5";
/// Most search domains a resolver takes (`validation.MaxDNSSearchPaths`, glibc 2.26+).
pub const MAX_DNS_SEARCH_PATHS: usize = 32;
/// The longest hostname (a DNS label; `kubelet_pods.go` truncates the pod name to it).
pub const HOSTNAME_MAX_LEN: usize = 63;

/// The node facts a sandbox needs.
#[derive(Clone, Debug)]
pub struct SandboxEnv {
    /// `--cluster-dns` (empty: no cluster DNS, ClusterFirst falls back to the node's).
    pub cluster_dns: Vec<String>,
    /// `--cluster-domain` (`cluster.local` by convention).
    pub cluster_domain: String,
    /// The node's resolver configuration (`/etc/resolv.conf`).
    pub host_dns: api::DnsConfig,
    /// The root of the pods' log directories (`<root-dir>/pods-logs`).
    pub logs_root: PathBuf,
    /// The cgroup under which pods go (`/kubepods`).
    pub cgroup_root: String,
}

/// `<logs-root>/<namespace>_<name>_<uid>` (upstream `BuildPodLogsDirectory`).
pub fn pod_logs_dir(logs_root: &Path, pod: &Pod) -> PathBuf {
    let m = &pod.metadata;
    logs_root.join(format!(
        "{}_{}_{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    ))
}

/// The labels of the pod's sandbox: its own labels plus the kubelet's (`newPodLabels`).
pub fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let m = &pod.metadata;
    labels.insert(LABEL_POD_NAME.into(), m.name.clone().unwrap_or_default());
    labels.insert(
        LABEL_POD_NAMESPACE.into(),
        m.namespace.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_POD_UID.into(), m.uid.clone().unwrap_or_default());
    labels
}

/// Whether the pod uses the node's network.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
}

/// The pod's hostname and domain (`GeneratePodHostNameAndDomain`): `spec.hostname` or the
/// pod's name cut to 63 characters without a trailing `-` or `.`; the domain
/// `<subdomain>.<namespace>.svc.<cluster-domain>` when a subdomain is set.
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let hostname = match spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
    {
        Some(h) => h,
        None => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut cut: String = name.chars().take(HOSTNAME_MAX_LEN).collect();
            while cut.ends_with(['-', '.']) {
                cut.pop();
            }
            cut
        }
    };
    let domain = spec
        .and_then(|s| s.subdomain.clone())
        .filter(|d| !d.is_empty())
        .map(|sub| {
            format!(
                "{sub}.{}.svc.{cluster_domain}",
                pod.metadata.namespace.as_deref().unwrap_or_default()
            )
        });
    (hostname, domain)
}

/// The pod's DNS configuration (`GetPodDNS`): `ClusterFirst` uses `--cluster-dns` with the
/// namespace's search path and `ndots:5` (falling back to the node's resolver when there is
/// no cluster DNS, or for a host-network pod); `Default` the node's; `None` only
/// `dnsConfig`; then `dnsConfig` is merged in (servers and searches appended, options by
/// name overridden).
pub fn dns_config(pod: &Pod, env: &SandboxEnv) -> api::DnsConfig {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or(DNS_CLUSTER_FIRST);
    let cluster = match policy {
        DNS_CLUSTER_FIRST => !host_network(pod) && !env.cluster_dns.is_empty(),
        DNS_CLUSTER_FIRST_WITH_HOST_NET => !env.cluster_dns.is_empty(),
        _ => false,
    };
    let mut dns = if policy == DNS_NONE {
        api::DnsConfig::default()
    } else if cluster {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let d = &env.cluster_domain;
        let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
        searches.extend(env.host_dns.searches.iter().cloned());
        api::DnsConfig {
            servers: env.cluster_dns.clone(),
            searches,
            options: vec![CLUSTER_NDOTS.to_string()],
        }
    } else {
        env.host_dns.clone()
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        dns.searches
            .extend(extra.searches.iter().flatten().cloned());
        for o in extra.options.iter().flatten() {
            let text = match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let name = text.split(':').next().unwrap_or_default().to_string();
            dns.options
                .retain(|existing| existing.split(':').next() != Some(name.as_str()));
            dns.options.push(text);
        }
    }
    let mut seen = std::collections::HashSet::new();
    dns.searches.retain(|s| seen.insert(s.clone()));
    dns.searches.truncate(MAX_DNS_SEARCH_PATHS);
    dns
}

/// Parses a `resolv.conf` (nameserver, search, options lines; `domain` counts as a search).
pub fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut dns = api::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search") | Some("domain") => dns.searches.extend(words.map(str::to_string)),
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// The QoS cgroup of a pod under `root` (`/kubepods`, `/kubepods/burstable`,
/// `/kubepods/besteffort`) and the pod's own below it (`pod<uid>`), as the cgroupfs driver
/// names them (`pkg/kubelet/cm/pod_container_manager_linux.go` `GetPodContainerName`).
pub fn cgroup_parent(root: &str, qos: &str, uid: &str) -> String {
    let root = root.trim_end_matches('/');
    match qos {
        "Guaranteed" => format!("{root}/pod{uid}"),
        "Burstable" => format!("{root}/burstable/pod{uid}"),
        _ => format!("{root}/besteffort/pod{uid}"),
    }
}

/// The pod's QoS class: the one the apiserver recorded, else computed.
pub fn qos_class(pod: &Pod) -> String {
    if let Some(q) = pod.status.as_ref().and_then(|s| s.qos_class.clone()) {
        return q;
    }
    let value = serde_json::to_value(pod).unwrap_or_default();
    skerry_api::defaults::qos_class(&value).to_string()
}

/// The pod's namespaces (`namespacesForPod`): the node's network, PID and IPC namespaces
/// when `hostNetwork`, `hostPID`, `hostIPC`; else the pod's network and IPC and, unless
/// `shareProcessNamespace`, a PID namespace per container. Both the sandbox and every
/// container carry it: a container without it would join the sandbox's PID namespace.
pub fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let node = api::NamespaceMode::Node as i32;
    api::NamespaceOption {
        network: if host_network(pod) {
            node
        } else {
            api::NamespaceMode::Pod as i32
        },
        pid: if spec.host_pid == Some(true) {
            node
        } else if spec.share_process_namespace == Some(true) {
            api::NamespaceMode::Pod as i32
        } else {
            api::NamespaceMode::Container as i32
        },
        ipc: if spec.host_ipc == Some(true) {
            node
        } else {
            api::NamespaceMode::Pod as i32
        },
        ..Default::default()
    }
}

/// The sandbox configuration of `pod`, attempt `attempt`.
pub fn sandbox_config(pod: &Pod, attempt: u32, env: &SandboxEnv) -> api::PodSandboxConfig {
    let m = &pod.metadata;
    let spec = pod.spec.clone().unwrap_or_default();
    let host_net = host_network(pod);
    let (hostname, _) = hostname_and_domain(pod, &env.cluster_domain);
    let mut port_mappings = Vec::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            port_mappings.push(api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp as i32,
                    Some("SCTP") => api::Protocol::Sctp as i32,
                    _ => api::Protocol::Tcp as i32,
                },
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or(0),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    let psc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let namespace_options = namespace_options(pod);
    let qos = qos_class(pod);
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            namespace: m.namespace.clone().unwrap_or_default(),
            attempt,
        }),
        hostname: if host_net { String::new() } else { hostname },
        log_directory: pod_logs_dir(&env.logs_root, pod).display().to_string(),
        dns_config: Some(dns_config(pod, env)),
        port_mappings,
        labels: pod_labels(pod),
        annotations: m
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(
                &env.cgroup_root,
                &qos,
                m.uid.as_deref().unwrap_or_default(),
            ),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options),
                run_as_user: psc.run_as_user.map(|value| api::Int64Value { value }),
                run_as_group: psc.run_as_group.map(|value| api::Int64Value { value }),
                supplemental_groups: psc.supplemental_groups.clone().unwrap_or_default(),
                privileged,
                seccomp: Some(api::SecurityProfile {
                    profile_type: api::security_profile::ProfileType::Unconfined as i32,
                    localhost_ref: String::new(),
                }),
                ..Default::default()
            }),
            sysctls: psc
                .sysctls
                .iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..Default::default()
        }),
    }
}

/// The header of a managed hosts file (upstream's exact first line).
const HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// The header of a host-network pod's hosts file.
const HOSTS_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";

/// The pod's `/etc/hosts` (`managedHostsFileContent`): for a host-network pod the node's own
/// file, else localhost lines and the pod's IPs with its hostname; then `hostAliases`.
pub fn hosts_file(pod: &Pod, pod_ips: &[String], cluster_domain: &str, node_hosts: &str) -> String {
    let mut out = String::new();
    if host_network(pod) {
        out.push_str(HOSTS_HEADER_HOST_NETWORK);
        out.push_str(node_hosts);
        if !node_hosts.ends_with('\n') && !node_hosts.is_empty() {
            out.push('\n');
        }
    } else {
        out.push_str(HOSTS_HEADER);
        out.push_str("127.0.0.1\tlocalhost\n");
        out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str("fe00::0\tip6-localnet\n");
        out.push_str("fe00::0\tip6-mcastprefix\n");
        out.push_str("fe00::1\tip6-allnodes\n");
        out.push_str("fe00::2\tip6-allrouters\n");
        let (hostname, domain) = hostname_and_domain(pod, cluster_domain);
        for ip in pod_ips {
            match &domain {
                Some(d) => out.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
                None => out.push_str(&format!("{ip}\t{hostname}\n")),
            }
        }
    }
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_ref())
        .filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.clone().unwrap_or_default().join("\t");
            out.push_str(&format!("{}\t{names}\n", a.ip));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn env(dns: &[&str]) -> SandboxEnv {
        SandboxEnv {
            cluster_dns: dns.iter().map(|s| s.to_string()).collect(),
            cluster_domain: "cluster.local".into(),
            host_dns: parse_resolv_conf(
                "nameserver 192.0.2.53\nsearch corp.example\noptions edns0\n",
            ),
            logs_root: PathBuf::from("/r/pods-logs"),
            cgroup_root: "/kubepods".into(),
        }
    }

    #[test]
    fn dns_follows_the_policy() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}),
        );
        let d = dns_config(&p, &env(&["10.96.0.10"]));
        assert_eq!(d.servers, ["10.96.0.10"]);
        assert_eq!(
            d.searches,
            [
                "ns.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(d.options, ["ndots:5"]);
        // No cluster DNS: the node's.
        assert_eq!(dns_config(&p, &env(&[])).servers, ["192.0.2.53"]);
        // Host network with ClusterFirst: the node's; with ClusterFirstWithHostNet: the cluster's.
        let host = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"hostNetwork": true, "containers": []}}),
        );
        assert_eq!(
            dns_config(&host, &env(&["10.96.0.10"])).servers,
            ["192.0.2.53"]
        );
        let host2 = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []}}),
        );
        assert_eq!(
            dns_config(&host2, &env(&["10.96.0.10"])).servers,
            ["10.96.0.10"]
        );
        // None with dnsConfig; options merged by name.
        let none = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"dnsPolicy": "None", "containers": [], "dnsConfig": {
                "nameservers": ["1.1.1.1"], "searches": ["a.example"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "rotate"}]}}}),
        );
        let d = dns_config(&none, &env(&["10.96.0.10"]));
        assert_eq!(d.servers, ["1.1.1.1"]);
        assert_eq!(d.searches, ["a.example"]);
        assert_eq!(d.options, ["ndots:2", "rotate"]);
        let merged = pod(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}}),
        );
        assert_eq!(
            dns_config(&merged, &env(&["10.96.0.10"])).options,
            ["ndots:1"]
        );
    }

    #[test]
    fn sandbox_carries_the_kubelet_labels_ports_and_cgroup() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "a", "image": "i",
                "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "protocol": "UDP"}]}]},
            "status": {"qosClass": "Burstable"}}));
        let c = sandbox_config(&p, 2, &env(&[]));
        assert_eq!(c.labels["io.kubernetes.pod.uid"], "u1");
        assert_eq!(c.labels["io.kubernetes.pod.name"], "web-0");
        assert_eq!(c.labels["io.kubernetes.pod.namespace"], "ns");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.hostname, "web-0");
        assert_eq!(c.metadata.as_ref().map(|m| m.attempt), Some(2));
        assert_eq!(c.log_directory, "/r/pods-logs/ns_web-0_u1");
        assert_eq!(c.port_mappings.len(), 2);
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.port_mappings[1].protocol, api::Protocol::Udp as i32);
        let linux = c.linux.expect("linux");
        assert_eq!(linux.cgroup_parent, "/kubepods/burstable/podu1");
        let ns = linux
            .security_context
            .and_then(|s| s.namespace_options)
            .expect("ns");
        assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, api::NamespaceMode::Container as i32);
    }

    #[test]
    fn hostnames_are_cut_to_a_dns_label_and_hosts_files_list_the_pod() {
        let long = format!("{}-x", "a".repeat(62));
        let p = pod(
            serde_json::json!({"metadata": {"name": long, "namespace": "ns"},
            "spec": {"containers": [], "subdomain": "sub",
                "hostAliases": [{"ip": "192.0.2.1", "hostnames": ["foo", "bar"]}]}}),
        );
        let (h, d) = hostname_and_domain(&p, "cluster.local");
        assert_eq!(h, "a".repeat(62), "cut to 63 and the trailing '-' dropped");
        assert_eq!(d.as_deref(), Some("sub.ns.svc.cluster.local"));
        let hosts = hosts_file(&p, &["10.1.0.7".into()], "cluster.local", "");
        assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(hosts.contains(&format!("10.1.0.7\t{h}.sub.ns.svc.cluster.local\t{h}\n")));
        assert!(hosts.ends_with("# Entries added by HostAliases.\n192.0.2.1\tfoo\tbar\n"));
        let host = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"hostNetwork": true, "containers": []}}),
        );
        assert_eq!(
            hosts_file(&host, &[], "cluster.local", "127.0.0.1 localhost\n"),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );
    }
}
