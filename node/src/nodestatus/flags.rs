//! The node's registration flags, parsed as the upstream kubelet parses them: `--node-labels`
//! (`cmd/kubelet/app/options/options.go`, `ValidateKubeletFlags`: the `kubernetes.io` and
//! `k8s.io` namespaces are the kubelet's own, so only the labels it is allowed to set may be
//! given) and `--register-with-taints` (`pkg/util/taints/taints.go`, `parseTaint`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use skerry_api::pod::taints::{
    TAINT_EFFECT_NO_EXECUTE, TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_PREFER_NO_SCHEDULE,
};
use skerry_api::validation::names;

use crate::machine::{FlagError, parse_map_flag};

/// The node labels the kubelet sets itself (`pkg/kubelet/apis/well_known_labels.go`,
/// `KubeletLabels`), so `--node-labels` may name them too.
pub const KUBELET_LABELS: &[&str] = &[
    LABEL_HOSTNAME,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    LABEL_OS,
    LABEL_ARCH,
    LABEL_OS_BETA,
    LABEL_ARCH_BETA,
];

/// The label namespaces `--node-labels` may use inside `kubernetes.io`
/// (`KubeletLabelNamespaces`).
pub const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// `beta.kubernetes.io/os`: deprecated, still set by the kubelet for old selectors.
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// `beta.kubernetes.io/arch`: deprecated, still set by the kubelet for old selectors.
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";

/// The namespace (the part before `/`) of a label key, empty when it has none.
fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

/// Whether `key` is in a namespace Kubernetes reserves (`kubernetes.io`, `k8s.io` and their
/// subdomains).
fn is_kubernetes_label(key: &str) -> bool {
    let ns = label_namespace(key);
    ns == "kubernetes.io"
        || ns.ends_with(".kubernetes.io")
        || ns == "k8s.io"
        || ns.ends_with(".k8s.io")
}

/// Whether the kubelet may set `key` (`IsKubeletLabel`).
fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let ns = label_namespace(key);
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|allowed| ns == *allowed || ns.ends_with(&format!(".{allowed}")))
}

/// Parses `--node-labels` (`key=value,key=value`): valid label keys and values, and in the
/// reserved namespaces only the labels a kubelet may set, with the kubelet's messages.
pub fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, FlagError> {
    let labels: BTreeMap<String, String> = parse_map_flag(text, '=')?.into_iter().collect();
    let unknown: Vec<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k))
        .collect();
    if !unknown.is_empty() {
        return Err(FlagError(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]\n\
             --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix ({}) \
             or be in the specifically allowed set ({})",
            unknown.join(" "),
            KUBELET_LABEL_NAMESPACES.join(", "),
            KUBELET_LABELS.join(", ")
        )));
    }
    let mut invalid = Vec::new();
    for (k, v) in &labels {
        let errs = names::qualified_name(k);
        if !errs.is_empty() {
            invalid.push(format!("'{k}' - {}", errs.join(", ")));
        }
        let errs = names::label_value(v);
        if !errs.is_empty() {
            invalid.push(format!("'{v}' - {}", errs.join(", ")));
        }
    }
    if !invalid.is_empty() {
        return Err(FlagError(format!(
            "invalid node labels: {}",
            invalid.join("; ")
        )));
    }
    Ok(labels)
}

/// Parses `--register-with-taints` (`key=value:Effect,key:Effect`), with `parseTaint`'s
/// messages. A taint must name its effect: the apiserver refuses a Node with an effectless
/// taint, so it is refused here, where the flag can be named.
pub fn parse_taints(text: &str) -> Result<Vec<Taint>, FlagError> {
    let mut taints = Vec::new();
    for spec in text.split(',').filter(|s| !s.is_empty()) {
        taints.push(parse_taint(spec)?);
    }
    Ok(taints)
}

fn parse_taint(spec: &str) -> Result<Taint, FlagError> {
    let invalid = |why: &[String]| {
        if why.is_empty() {
            FlagError(format!("invalid taint spec: {spec}"))
        } else {
            FlagError(format!("invalid taint spec: {spec}, {}", why.join("; ")))
        }
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (key_value, effect) = match parts.as_slice() {
        [kv, effect] => (*kv, *effect),
        [_] => {
            return Err(FlagError(format!(
                "invalid taint spec: {spec}, a taint needs an effect ({TAINT_EFFECT_NO_SCHEDULE}, \
                 {TAINT_EFFECT_PREFER_NO_SCHEDULE} or {TAINT_EFFECT_NO_EXECUTE})"
            )));
        }
        _ => return Err(invalid(&[])),
    };
    if ![
        TAINT_EFFECT_NO_SCHEDULE,
        TAINT_EFFECT_PREFER_NO_SCHEDULE,
        TAINT_EFFECT_NO_EXECUTE,
    ]
    .contains(&effect)
    {
        return Err(FlagError(format!(
            "invalid taint effect: {effect}, unsupported taint effect"
        )));
    }
    let kv: Vec<&str> = key_value.split('=').collect();
    let (key, value) = match kv.as_slice() {
        [k] => (*k, None),
        [k, v] => {
            let errs = names::label_value(v);
            if !errs.is_empty() {
                return Err(invalid(&errs));
            }
            (*k, Some((*v).to_string()))
        }
        _ => return Err(invalid(&[])),
    };
    let errs = names::qualified_name(key);
    if !errs.is_empty() {
        return Err(invalid(&errs));
    }
    Ok(Taint {
        key: key.to_string(),
        value: value.filter(|v| !v.is_empty()),
        effect: effect.to_string(),
        time_added: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_parse_and_reserved_namespaces_are_guarded() {
        let labels =
            parse_node_labels("tier=edge,node.kubernetes.io/pool=a,kubernetes.io/arch=arm64")
                .expect("valid labels");
        assert_eq!(labels["tier"], "edge");
        assert_eq!(labels["node.kubernetes.io/pool"], "a");
        assert_eq!(labels["kubernetes.io/arch"], "arm64");
        assert!(
            parse_node_labels("sub.node.kubernetes.io/x=1").is_ok(),
            "subdomains of an allowed namespace are allowed"
        );
        let e = parse_node_labels("node-role.kubernetes.io/master=").unwrap_err();
        assert!(
            e.0.starts_with("unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [node-role.kubernetes.io/master]"),
            "{e}"
        );
        let e = parse_node_labels("bad key=1").unwrap_err();
        assert!(e.0.starts_with("invalid node labels: 'bad key' - "), "{e}");
        let e = parse_node_labels("k=-bad-").unwrap_err();
        assert!(e.0.starts_with("invalid node labels: '-bad-' - "), "{e}");
        assert_eq!(
            parse_node_labels("justakey").unwrap_err().0,
            "malformed pair, expect string=string"
        );
    }

    #[test]
    fn taints_parse_as_the_kubelet_parses_them() {
        let taints = parse_taints("dedicated=edge:NoSchedule,gpu:NoExecute").expect("valid");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].key, "dedicated");
        assert_eq!(taints[0].value.as_deref(), Some("edge"));
        assert_eq!(taints[0].effect, "NoSchedule");
        assert_eq!(taints[1].key, "gpu");
        assert_eq!(taints[1].value, None);
        assert!(parse_taints("").expect("none").is_empty());
        assert_eq!(
            parse_taints("a=b:Sometimes").unwrap_err().0,
            "invalid taint effect: Sometimes, unsupported taint effect"
        );
        assert_eq!(
            parse_taints("a=b=c:NoSchedule").unwrap_err().0,
            "invalid taint spec: a=b=c:NoSchedule"
        );
        assert_eq!(
            parse_taints("a:b:NoSchedule").unwrap_err().0,
            "invalid taint spec: a:b:NoSchedule"
        );
        assert!(
            parse_taints("a=b")
                .unwrap_err()
                .0
                .starts_with("invalid taint spec: a=b, a taint needs an effect")
        );
        assert!(
            parse_taints("bad key:NoSchedule")
                .unwrap_err()
                .0
                .starts_with("invalid taint spec: bad key:NoSchedule, ")
        );
    }
}
