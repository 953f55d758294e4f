//! Taints the node lifecycle controller owns, and the set arithmetic on them: which
//! `NoSchedule` taints a node's conditions call for (Kubernetes' TaintNodesByCondition), and
//! the two mutually exclusive `NoExecute` taints that mirror `Ready` (not-ready /
//! unreachable). Whether a pod tolerates a taint is `skerry_api::pod::taints`, shared with
//! the scheduler, the DaemonSet controller and the kubelet; the taint keys and effects are
//! re-exported from there under the names this controller uses.
//!
//! Invariant: the controller only ever adds or removes taints whose key it owns
//! ([`is_condition_taint`] for `NoSchedule`, [`NOT_READY`] / [`UNREACHABLE`] for
//! `NoExecute`); every other taint on a node passes through a rewrite untouched.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use skerry_api::pod::taints::{
    TAINT_EFFECT_NO_EXECUTE as NO_EXECUTE, TAINT_EFFECT_NO_SCHEDULE as NO_SCHEDULE,
    TAINT_NODE_DISK_PRESSURE as DISK_PRESSURE, TAINT_NODE_MEMORY_PRESSURE as MEMORY_PRESSURE,
    TAINT_NODE_NETWORK_UNAVAILABLE as NETWORK_UNAVAILABLE, TAINT_NODE_NOT_READY as NOT_READY,
    TAINT_NODE_PID_PRESSURE as PID_PRESSURE, TAINT_NODE_UNREACHABLE as UNREACHABLE,
    TAINT_NODE_UNSCHEDULABLE as UNSCHEDULABLE, taints_of,
};

/// Which condition status calls for which taint key (Kubernetes'
/// `nodeConditionToTaintKeyStatusMap`). `NetworkUnavailable` is listed although the
/// controller never sets that condition: a network plugin does, and the taint follows it.
const CONDITION_TAINTS: &[(&str, &str, &str)] = &[
    ("Ready", "False", NOT_READY),
    ("Ready", "Unknown", UNREACHABLE),
    ("MemoryPressure", "True", MEMORY_PRESSURE),
    ("DiskPressure", "True", DISK_PRESSURE),
    ("NetworkUnavailable", "True", NETWORK_UNAVAILABLE),
    ("PIDPressure", "True", PID_PRESSURE),
];

/// A node's condition of type `type_`.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The status (`True`, `False`, `Unknown`) of the node's `Ready` condition, if it has one.
pub fn ready_status(node: &Node) -> Option<&str> {
    condition(node, "Ready").map(|c| c.status.as_str())
}

/// A taint with `key` and `effect`, no value, and `timeAdded` only when given (the API
/// writes it for `NoExecute` taints only).
pub fn taint(key: &str, effect: &str, time_added: Option<Time>) -> Taint {
    Taint {
        key: key.to_string(),
        effect: effect.to_string(),
        value: None,
        time_added,
    }
}

/// Whether two taints are the same taint: key and effect (Kubernetes' `Taint.MatchTaint`;
/// value and timeAdded do not matter).
pub fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// Whether `taints` holds a taint with `key` and `effect`.
pub fn has_taint(taints: &[Taint], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| t.key == key && t.effect == effect)
}

/// Whether `key` is a `NoSchedule` taint this controller manages from conditions or from
/// `spec.unschedulable`.
pub fn is_condition_taint(key: &str) -> bool {
    key == UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == key)
}

/// The `NoSchedule` taints the node's conditions and `spec.unschedulable` call for
/// (Kubernetes' `doNoScheduleTaintingPass`).
pub fn desired_no_schedule_taints(node: &Node) -> Vec<Taint> {
    let mut taints = Vec::new();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    for c in conditions {
        for (type_, status, key) in CONDITION_TAINTS {
            if c.type_ == *type_ && c.status == *status && !has_taint(&taints, key, NO_SCHEDULE) {
                taints.push(taint(key, NO_SCHEDULE, None));
            }
        }
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        taints.push(taint(UNSCHEDULABLE, NO_SCHEDULE, None));
    }
    taints
}

/// `current` with its controller-managed `NoSchedule` taints replaced by `desired`; `None`
/// when nothing changes. Taints it does not manage keep their place and value.
pub fn reconcile_no_schedule(current: &[Taint], desired: &[Taint]) -> Option<Vec<Taint>> {
    let managed = |t: &Taint| t.effect == NO_SCHEDULE && is_condition_taint(&t.key);
    let to_remove = current
        .iter()
        .any(|t| managed(t) && !desired.iter().any(|d| same_taint(d, t)));
    let to_add: Vec<&Taint> = desired
        .iter()
        .filter(|d| !current.iter().any(|t| same_taint(d, t)))
        .collect();
    if !to_remove && to_add.is_empty() {
        return None;
    }
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !managed(t) || desired.iter().any(|d| same_taint(d, t)))
        .cloned()
        .collect();
    next.extend(to_add.into_iter().cloned());
    Some(next)
}

/// `current` with `add` added (unless present) and every taint matching one of `remove`
/// removed — Kubernetes' `SwapNodeControllerTaint` on a list. `None` when nothing changes.
pub fn swap_taints(current: &[Taint], add: &[Taint], remove: &[Taint]) -> Option<Vec<Taint>> {
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !remove.iter().any(|r| same_taint(r, t)))
        .cloned()
        .collect();
    for a in add {
        if !next.iter().any(|t| same_taint(t, a)) {
            next.push(a.clone());
        }
    }
    let unchanged = next.len() == current.len()
        && next
            .iter()
            .zip(current)
            .all(|(a, b)| same_taint(a, b) && a.value == b.value);
    (!unchanged).then_some(next)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};

    fn node_with(conditions: &[(&str, &str)], unschedulable: bool, taints: Vec<Taint>) -> Node {
        Node {
            spec: Some(NodeSpec {
                unschedulable: Some(unschedulable),
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..NodeCondition::default()
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn keys(taints: &[Taint]) -> Vec<(&str, &str)> {
        taints
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect()
    }

    #[test]
    fn conditions_map_to_no_schedule_taints() {
        let node = node_with(
            &[
                ("Ready", "Unknown"),
                ("MemoryPressure", "True"),
                ("DiskPressure", "False"),
                ("PIDPressure", "True"),
                ("NetworkUnavailable", "True"),
            ],
            true,
            vec![],
        );
        let desired = desired_no_schedule_taints(&node);
        assert_eq!(
            keys(&desired),
            vec![
                (UNREACHABLE, NO_SCHEDULE),
                (MEMORY_PRESSURE, NO_SCHEDULE),
                (PID_PRESSURE, NO_SCHEDULE),
                (NETWORK_UNAVAILABLE, NO_SCHEDULE),
                (UNSCHEDULABLE, NO_SCHEDULE),
            ]
        );
        let ready = node_with(&[("Ready", "True")], false, vec![]);
        assert!(desired_no_schedule_taints(&ready).is_empty());
        let not_ready = node_with(&[("Ready", "False")], false, vec![]);
        assert_eq!(
            keys(&desired_no_schedule_taints(&not_ready)),
            vec![(NOT_READY, NO_SCHEDULE)]
        );
    }

    #[test]
    fn no_schedule_reconcile_keeps_foreign_taints() {
        let user = Taint {
            key: "dedicated".into(),
            effect: NO_SCHEDULE.into(),
            value: Some("gpu".into()),
            time_added: None,
        };
        let current = vec![
            user.clone(),
            taint(MEMORY_PRESSURE, NO_SCHEDULE, None),
            taint(UNREACHABLE, NO_EXECUTE, None),
        ];
        let desired = vec![taint(DISK_PRESSURE, NO_SCHEDULE, None)];
        let next = reconcile_no_schedule(&current, &desired).unwrap();
        assert_eq!(
            keys(&next),
            vec![
                ("dedicated", NO_SCHEDULE),
                (UNREACHABLE, NO_EXECUTE),
                (DISK_PRESSURE, NO_SCHEDULE)
            ]
        );
        assert_eq!(next[0], user);
        assert_eq!(reconcile_no_schedule(&next, &desired), None);
    }

    #[test]
    fn swap_replaces_one_no_execute_taint_with_the_other() {
        let current = vec![taint(NOT_READY, NO_EXECUTE, None)];
        let next = swap_taints(
            &current,
            &[taint(UNREACHABLE, NO_EXECUTE, None)],
            &[taint(NOT_READY, NO_EXECUTE, None)],
        )
        .unwrap();
        assert_eq!(keys(&next), vec![(UNREACHABLE, NO_EXECUTE)]);
        assert_eq!(
            swap_taints(
                &next,
                &[taint(UNREACHABLE, NO_EXECUTE, None)],
                &[taint(NOT_READY, NO_EXECUTE, None)]
            ),
            None
        );
    }
}
