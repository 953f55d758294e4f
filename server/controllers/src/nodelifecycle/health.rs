//! Node health as the controller sees it: when did *this controller* last see a sign of life
//! from each node, and is that longer ago than the grace period? (Kubernetes'
//! `nodeHealthData` and `tryUpdateNodeHealth`.)
//!
//! A node shows life two ways: the kubelet posts its `Ready` condition with a new
//! `lastHeartbeatTime`, or renews its Lease (`spec.renewTime`) in `kube-node-lease`. Both are
//! timestamps written with the *node's* clock, so they are never compared with ours: the
//! controller only notices that a value *changed* since it last looked, and records its own
//! clock reading at that moment as the probe timestamp. A node whose clock is an hour off is
//! therefore judged exactly like one whose clock is right.
//!
//! Invariant: `probe_timestamp` only ever holds readings of the controller's clock
//! ([`super::Clock`]), never a timestamp copied from an object.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::NodeLifecycleConfig;
use super::taints::condition;

/// The conditions a silent node gets set to `Unknown`. `NetworkUnavailable` is left alone: a
/// network plugin on the control-plane side owns it, not the kubelet (as in Kubernetes).
pub const CONDITIONS_SET_UNKNOWN: [&str; 4] =
    ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The reason on a condition the controller set to `Unknown` because the node went silent.
pub const REASON_NODE_STATUS_UNKNOWN: &str = "NodeStatusUnknown";
/// Its message.
pub const MESSAGE_NODE_STATUS_UNKNOWN: &str = "Kubelet stopped posting node status.";
/// The reason on a condition the kubelet never posted at all.
pub const REASON_NODE_STATUS_NEVER_UPDATED: &str = "NodeStatusNeverUpdated";
/// Its message.
pub const MESSAGE_NODE_STATUS_NEVER_UPDATED: &str = "Kubelet never posted node status.";

/// What the controller last saw of one node's health signals, and when (its own clock).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeHealth {
    /// When the controller last saw either signal change (its own clock).
    pub probe_timestamp: Timestamp,
    /// When the controller last saw the `Ready` condition transition (its own clock).
    pub ready_transition_timestamp: Timestamp,
    /// The `Ready` condition last seen, as the node wrote it (compared only for equality).
    pub ready: Option<NodeCondition>,
    /// The Lease's `renewTime` last seen (compared only with later renewals of the same
    /// Lease); `None` when no Lease has been seen.
    pub lease_renew_time: Option<Option<Timestamp>>,
}

/// What one look at a node decided.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The grace period the node was judged by (startup or monitor).
    pub grace_period: Duration,
    /// The `Ready` status before this pass (`Unknown` when the node has no `Ready`
    /// condition yet).
    pub observed_ready: String,
    /// The `Ready` status after this pass's status write, if any.
    pub current_ready: Option<String>,
    /// The node with its conditions set to `Unknown`, to be written through the status
    /// subresource; `None` when nothing is to be written.
    pub status_update: Option<Node>,
}

fn ready_changed(saved: &NodeCondition, current: &NodeCondition) -> (bool, bool) {
    (
        saved.last_heartbeat_time != current.last_heartbeat_time,
        saved.last_transition_time != current.last_transition_time,
    )
}

/// Folds one look at `node` (and its cached `lease`) at controller time `now` into the
/// previous record `saved`, and decides whether the node has been silent past its grace
/// period. Pure: the caller writes `status_update` and keeps the returned record.
pub fn observe(
    saved: Option<&NodeHealth>,
    node: &Node,
    lease: Option<&Lease>,
    now: Timestamp,
    config: &NodeLifecycleConfig,
) -> (NodeHealth, Observation) {
    let current_ready = condition(node, "Ready");
    // A node without a `Ready` condition has never been heard from: it gets the longer
    // startup grace period, counted from when this controller first saw it (Kubernetes
    // counts from `creationTimestamp`, a remote clock reading; ours is only ever later).
    let grace_period = if current_ready.is_some() {
        config.node_monitor_grace_period
    } else {
        config.node_startup_grace_period
    };
    let fresh = |ready: Option<&NodeCondition>| NodeHealth {
        probe_timestamp: now,
        ready_transition_timestamp: now,
        ready: ready.cloned(),
        lease_renew_time: None,
    };
    let mut health = match (saved, current_ready) {
        (None, _) => fresh(current_ready),
        (Some(s), Some(cur)) if s.ready.is_none() => NodeHealth {
            lease_renew_time: s.lease_renew_time,
            ..fresh(Some(cur))
        },
        (Some(s), None) if s.ready.is_some() => {
            tracing::warn!(
                node = node_name(node),
                "the Ready condition was removed from the node's status"
            );
            NodeHealth {
                lease_renew_time: s.lease_renew_time,
                ..fresh(None)
            }
        }
        (Some(s), Some(cur)) => {
            let (heartbeat, transition) = match &s.ready {
                Some(saved_ready) => ready_changed(saved_ready, cur),
                None => (true, true),
            };
            if heartbeat {
                NodeHealth {
                    probe_timestamp: now,
                    ready_transition_timestamp: if transition {
                        now
                    } else {
                        s.ready_transition_timestamp
                    },
                    ready: Some(cur.clone()),
                    lease_renew_time: s.lease_renew_time,
                }
            } else {
                s.clone()
            }
        }
        (Some(s), None) => s.clone(),
    };
    // A renewed Lease is a heartbeat too. A kubelet that renews its Lease but never posts
    // status is taken as healthy, as in Kubernetes.
    if let Some(lease) = lease {
        let renew = lease_renew_time(lease);
        let renewed = match health.lease_renew_time {
            None => true,
            Some(saved) => renew > saved,
        };
        if renewed {
            health.lease_renew_time = Some(renew);
            health.probe_timestamp = now;
        }
    }

    let observed_ready = current_ready
        .map(|c| c.status.clone())
        .unwrap_or_else(|| "Unknown".to_string());
    let mut observation = Observation {
        grace_period,
        observed_ready: observed_ready.clone(),
        current_ready: current_ready.map(|c| c.status.clone()),
        status_update: None,
    };
    let silent_for = now.duration_since(health.probe_timestamp);
    let grace = k8s_openapi::jiff::SignedDuration::try_from(grace_period)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    if silent_for > grace {
        let updated = mark_unknown(node, Time(now));
        let updated_ready = condition(&updated, "Ready").cloned();
        if updated_ready.as_ref() != current_ready {
            observation.current_ready = updated_ready.map(|c| c.status);
            observation.status_update = Some(updated);
        }
    }
    (health, observation)
}

/// `node` with [`CONDITIONS_SET_UNKNOWN`] set to `Unknown` (added when missing), each
/// changed one with `lastTransitionTime` = `now`; `lastHeartbeatTime` stays what the node
/// last wrote, so the controller's own write never looks like a heartbeat.
pub fn mark_unknown(node: &Node, now: Time) -> Node {
    let mut node = node.clone();
    let created = node.metadata.creation_timestamp.clone();
    let status = node.status.get_or_insert_with(NodeStatus::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for type_ in CONDITIONS_SET_UNKNOWN {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != "Unknown" {
                    c.status = "Unknown".to_string();
                    c.reason = Some(REASON_NODE_STATUS_UNKNOWN.to_string());
                    c.message = Some(MESSAGE_NODE_STATUS_UNKNOWN.to_string());
                    c.last_transition_time = Some(now.clone());
                }
            }
            None => conditions.push(NodeCondition {
                type_: type_.to_string(),
                status: "Unknown".to_string(),
                reason: Some(REASON_NODE_STATUS_NEVER_UPDATED.to_string()),
                message: Some(MESSAGE_NODE_STATUS_NEVER_UPDATED.to_string()),
                last_heartbeat_time: created.clone(),
                last_transition_time: Some(now.clone()),
            }),
        }
    }
    node
}

/// A Lease's `spec.renewTime` (`None` when unset).
pub fn lease_renew_time(lease: &Lease) -> Option<Timestamp> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0)
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test panics to fail")]

    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn node(ready: Option<(&str, i64)>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: ready.map(|(status, heartbeat)| {
                    vec![
                        NodeCondition {
                            type_: "Ready".into(),
                            status: status.into(),
                            // The node's clock is a day off: it must not matter.
                            last_heartbeat_time: Some(Time(at(heartbeat - 86_400))),
                            last_transition_time: Some(Time(at(-86_400))),
                            ..NodeCondition::default()
                        },
                        NodeCondition {
                            type_: "MemoryPressure".into(),
                            status: "False".into(),
                            ..NodeCondition::default()
                        },
                    ]
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn lease(renew: i64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(at(renew + 3_600))),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    fn config() -> NodeLifecycleConfig {
        NodeLifecycleConfig::default()
    }

    #[test]
    fn silent_past_grace_becomes_unknown() {
        let config = config();
        let n = node(Some(("True", 0)));
        let (h, o) = observe(None, &n, None, at(0), &config);
        assert!(o.status_update.is_none());
        // Same heartbeat 50 s later: exactly the grace period, not past it.
        let (h, o) = observe(Some(&h), &n, None, at(50), &config);
        assert!(o.status_update.is_none(), "not past the grace period yet");
        let (_, o) = observe(Some(&h), &n, None, at(51), &config);
        let updated = o.status_update.expect("past the grace period");
        assert_eq!(o.observed_ready, "True");
        assert_eq!(o.current_ready.as_deref(), Some("Unknown"));
        for type_ in CONDITIONS_SET_UNKNOWN {
            let c = condition(&updated, type_).unwrap();
            assert_eq!(c.status, "Unknown", "{type_}");
        }
        let ready = condition(&updated, "Ready").unwrap();
        assert_eq!(ready.reason.as_deref(), Some(REASON_NODE_STATUS_UNKNOWN));
        assert_eq!(ready.message.as_deref(), Some(MESSAGE_NODE_STATUS_UNKNOWN));
        assert_eq!(ready.last_transition_time, Some(Time(at(51))));
        // The node's own heartbeat is kept: our write is not a heartbeat.
        assert_eq!(ready.last_heartbeat_time, Some(Time(at(-86_400))));
        let disk = condition(&updated, "DiskPressure").unwrap();
        assert_eq!(
            disk.reason.as_deref(),
            Some(REASON_NODE_STATUS_NEVER_UPDATED)
        );
    }

    #[test]
    fn a_changed_heartbeat_resets_the_clock_whatever_its_value() {
        let config = config();
        let (h, _) = observe(None, &node(Some(("True", 0))), None, at(0), &config);
        // The new heartbeat is *older* than the last (the node's clock stepped back): it
        // still counts, because it changed.
        let (h, o) = observe(Some(&h), &node(Some(("True", -500))), None, at(45), &config);
        assert!(o.status_update.is_none());
        assert_eq!(h.probe_timestamp, at(45));
        let (_, o) = observe(Some(&h), &node(Some(("True", -500))), None, at(90), &config);
        assert!(
            o.status_update.is_none(),
            "45 s since the change seen at 45"
        );
    }

    #[test]
    fn a_renewed_lease_is_a_heartbeat() {
        let config = config();
        let n = node(Some(("True", 0)));
        let (h, _) = observe(None, &n, Some(&lease(0)), at(0), &config);
        let (h, _) = observe(Some(&h), &n, Some(&lease(10)), at(40), &config);
        let (h, o) = observe(Some(&h), &n, Some(&lease(10)), at(85), &config);
        assert!(o.status_update.is_none(), "lease renewal seen at 40");
        let (_, o) = observe(Some(&h), &n, Some(&lease(10)), at(91), &config);
        assert!(o.status_update.is_some(), "51 s since the renewal was seen");
    }

    #[test]
    fn a_node_never_heard_from_gets_the_startup_grace() {
        let config = config();
        let n = node(None);
        let (h, o) = observe(None, &n, None, at(0), &config);
        assert_eq!(o.grace_period, config.node_startup_grace_period);
        let (h, o) = observe(Some(&h), &n, None, at(55), &config);
        assert!(o.status_update.is_none(), "55 s < 60 s startup grace");
        let (_, o) = observe(Some(&h), &n, None, at(61), &config);
        let updated = o.status_update.unwrap();
        let ready = condition(&updated, "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(
            ready.reason.as_deref(),
            Some(REASON_NODE_STATUS_NEVER_UPDATED)
        );
    }

    #[test]
    fn an_already_unknown_node_is_not_rewritten() {
        let config = config();
        let n = mark_unknown(&node(Some(("True", 0))), Time(at(0)));
        let (h, _) = observe(None, &n, None, at(0), &config);
        let (_, o) = observe(Some(&h), &n, None, at(100), &config);
        assert!(o.status_update.is_none());
        assert_eq!(o.current_ready.as_deref(), Some("Unknown"));
    }
}
