//! Which pod goes first, and what it is told (upstream `pkg/kubelet/eviction/helpers.go`:
//! `rankMemoryPressure`, `rankDiskPressureFunc`, `rankPIDPressure`, `evictionMessage`,
//! `getThresholdMetInfo`; seed trick 23).
//!
//! The trick it carries: the ranking is three keys, in order. First whether the pod uses
//! more than it requested (the pod that misbehaves), then its priority (lower first), and
//! only then how far over its request it is. A large pod that stays within its request is
//! therefore evicted after every small pod that exceeds its own, however small: the culprit
//! goes first and the merely large goes last. Disk pressure ranks the same way over the
//! pod's disk use (writable layers, logs, local volumes); PID pressure by priority, then
//! process count.

use std::cmp::Ordering;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use skerry_api::pod::resources::{PodResourcesOptions, pod_requests};

use super::thresholds::{Observations, Threshold, threshold_amount};
use crate::machine::{NANO, format_quantity, signals};
use crate::stats::types::PodStats;
use skerry_api::validation::quantity::Quantity;

/// The resource a signal reclaims (`signalToResource`).
pub const RESOURCE_MEMORY: &str = "memory";
/// See [`RESOURCE_MEMORY`].
pub const RESOURCE_EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// See [`RESOURCE_MEMORY`] (internal to the eviction manager, as upstream's).
pub const RESOURCE_INODES: &str = "inodes";
/// See [`RESOURCE_MEMORY`] (internal to the eviction manager, as upstream's).
pub const RESOURCE_PIDS: &str = "pids";

/// The Failed pod's `reason` (`Reason`).
pub const REASON_EVICTED: &str = "Evicted";

/// `signalToResource`.
pub fn signal_resource(signal: &str) -> Option<&'static str> {
    match signal {
        signals::MEMORY_AVAILABLE | signals::ALLOCATABLE_MEMORY_AVAILABLE => Some(RESOURCE_MEMORY),
        signals::NODEFS_AVAILABLE | signals::IMAGEFS_AVAILABLE | signals::CONTAINERFS_AVAILABLE => {
            Some(RESOURCE_EPHEMERAL_STORAGE)
        }
        signals::NODEFS_INODES_FREE
        | signals::IMAGEFS_INODES_FREE
        | signals::CONTAINERFS_INODES_FREE => Some(RESOURCE_INODES),
        signals::PID_AVAILABLE => Some(RESOURCE_PIDS),
        _ => None,
    }
}

/// The pods' stats by UID.
pub type StatsByUid<'a> = HashMap<&'a str, &'a PodStats>;

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn stats<'a>(stats: &StatsByUid<'a>, pod: &Pod) -> Option<&'a PodStats> {
    stats.get(uid(pod)).copied()
}

/// The pod's request of `resource` in whole units (`GetResourceRequestQuantity`; zero for
/// inodes and pids, which nothing requests).
pub fn request(pod: &Pod, resource: &str) -> i128 {
    pod_requests(pod, &PodResourcesOptions::default())
        .get(resource)
        .map_or(0, |q| q.0.div_euclid(NANO))
}

/// `corev1helpers.PodPriority`.
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// `cmpBool`: true before false.
fn cmp_bool(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// The pod's working set (`memoryUsage` of the pod's stats).
fn memory_usage(s: &PodStats) -> i128 {
    i128::from(
        s.memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0),
    )
}

/// `IsLocalEphemeralVolume`: the volumes whose data lives on the node's disk.
fn local_ephemeral_volume(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|vs| vs.iter().find(|v| v.name == name))
        .is_some_and(|v| {
            v.config_map.is_some()
                || v.empty_dir
                    .as_ref()
                    .is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty())
        })
}

/// `podDiskUsage` over the root filesystems, logs and local volumes: bytes, or inodes when
/// `inodes`.
pub fn disk_usage(pod: &Pod, s: &PodStats, inodes: bool) -> i128 {
    let used = |fs: &Option<crate::stats::types::FsStats>| -> i128 {
        fs.as_ref()
            .and_then(|f| if inodes { f.inodes_used } else { f.used_bytes })
            .map_or(0, i128::from)
    };
    let containers: i128 = s
        .containers
        .iter()
        .map(|c| used(&c.rootfs) + used(&c.logs))
        .sum();
    let volumes: i128 = s
        .volume_stats
        .iter()
        .filter(|v| local_ephemeral_volume(pod, &v.name))
        .map(|v| used(&Some(v.fs.clone())))
        .sum();
    containers + volumes
}

/// `orderedBy(exceed, priority, usage)`: the three keys. `usage` gives a pod's use; a pod
/// without stats goes first on the first key, as upstream's `cmpBool(!p1Found, !p2Found)`
/// (what cannot be measured cannot be shown innocent).
fn rank_by(
    pods: &mut [Pod],
    stats_by_uid: &StatsByUid<'_>,
    usage: impl Fn(&Pod, &PodStats) -> i128,
    resource: &str,
) {
    let key = |p: &Pod| -> Option<(bool, i128)> {
        let s = stats(stats_by_uid, p)?;
        let used = usage(p, s);
        let req = request(p, resource);
        Some((used > req, used - req))
    };
    pods.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        let exceeds = match (ka, kb) {
            (Some((ea, _)), Some((eb, _))) => cmp_bool(ea, eb),
            _ => cmp_bool(ka.is_none(), kb.is_none()),
        };
        exceeds
            .then_with(|| priority(a).cmp(&priority(b)))
            .then_with(|| match (ka, kb) {
                // The larger consumption beyond the request first.
                (Some((_, ua)), Some((_, ub))) => ub.cmp(&ua),
                _ => cmp_bool(ka.is_none(), kb.is_none()),
            })
    });
}

/// `rankMemoryPressure`: exceeds its memory request, then priority, then working set minus
/// request.
pub fn rank_memory_pressure(pods: &mut [Pod], stats: &StatsByUid<'_>) {
    rank_by(pods, stats, |_, s| memory_usage(s), RESOURCE_MEMORY);
}

/// `rankDiskPressureFunc` for bytes (`ephemeral-storage`) or inodes.
pub fn rank_disk_pressure(pods: &mut [Pod], stats: &StatsByUid<'_>, inodes: bool) {
    let resource = if inodes {
        RESOURCE_INODES
    } else {
        RESOURCE_EPHEMERAL_STORAGE
    };
    rank_by(pods, stats, |p, s| disk_usage(p, s, inodes), resource);
}

/// `rankPIDPressure`: priority, then the most processes first.
pub fn rank_pid_pressure(pods: &mut [Pod], stats_by_uid: &StatsByUid<'_>) {
    let count = |p: &Pod| {
        stats(stats_by_uid, p)
            .and_then(|s| s.process_stats.as_ref())
            .and_then(|s| s.process_count)
            .unwrap_or(0)
    };
    pods.sort_by(|a, b| {
        priority(a)
            .cmp(&priority(b))
            .then_with(|| count(b).cmp(&count(a)))
    });
}

/// Ranks `pods` for the resource a threshold reclaims.
pub fn rank(pods: &mut [Pod], stats: &StatsByUid<'_>, resource: &str) {
    match resource {
        RESOURCE_MEMORY => rank_memory_pressure(pods, stats),
        RESOURCE_EPHEMERAL_STORAGE => rank_disk_pressure(pods, stats, false),
        RESOURCE_INODES => rank_disk_pressure(pods, stats, true),
        _ => rank_pid_pressure(pods, stats),
    }
}

fn bytes(n: i128) -> String {
    format_quantity(RESOURCE_MEMORY, Quantity(n * NANO))
}

/// `evictionMessage`: the starved resource, the threshold and what was available
/// (`getThresholdMetInfo`: the first met threshold of that resource), then each container
/// using more than it requested. Each sentence ends with a space, as upstream's.
pub fn eviction_message(
    resource: &str,
    pod: &Pod,
    pod_stats: Option<&PodStats>,
    met: &[Threshold],
    observations: &Observations,
) -> String {
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some((t, o)) = met
        .iter()
        .filter(|t| signal_resource(&t.signal) == Some(resource))
        .find_map(|t| Some((t, observations.get(&t.signal)?)))
    {
        let quantity = match t.value {
            crate::machine::ThresholdValue::Quantity(q) => format_quantity(RESOURCE_MEMORY, q),
            _ => bytes(threshold_amount(&t.value, o.capacity)),
        };
        message += &format!(
            "Threshold quantity: {quantity}, available: {}. ",
            bytes(o.available)
        );
    }
    let Some(s) = pod_stats else {
        return message;
    };
    let specs = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for cs in &s.containers {
        let Some(spec) = specs.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let requested = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource));
        let request_text = requested.map_or_else(|| "0".to_string(), |q| q.0.clone());
        let request_units = requested
            .and_then(|q| Quantity::parse(&q.0))
            .map_or(0, |q| q.0.div_euclid(NANO));
        let usage = match resource {
            RESOURCE_MEMORY => cs
                .memory
                .as_ref()
                .and_then(|m| m.working_set_bytes)
                .map(i128::from),
            RESOURCE_EPHEMERAL_STORAGE => {
                match (
                    cs.rootfs.as_ref().and_then(|f| f.used_bytes),
                    cs.logs.as_ref().and_then(|f| f.used_bytes),
                ) {
                    (Some(r), Some(l)) => Some(i128::from(r) + i128::from(l)),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(u) = usage
            && u > request_units
        {
            message += &format!(
                "Container {} was using {}, request is {request_text}, has larger consumption of {resource}. ",
                cs.name,
                bytes(u)
            );
        }
    }
    message
}

/// `"The node had condition: [MemoryPressure DiskPressure]. "`, Go's `%v` of the list.
pub fn condition_message(conditions: &[&str]) -> String {
    format!("The node had condition: [{}]. ", conditions.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::types::{ContainerStats, FsStats, MemoryStats, PodReference};

    fn pod(name: &str, priority: i32, requests: &[(&str, &str)]) -> Pod {
        let req: serde_json::Map<String, serde_json::Value> = requests
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": name},
            "spec": {"priority": priority, "containers": [
                {"name": "c", "image": "i", "resources": {"requests": req}}
            ]}
        }))
        .expect("pod")
    }

    fn mem_stats(name: &str, ws: u64) -> PodStats {
        PodStats {
            pod_ref: PodReference {
                name: name.into(),
                namespace: "ns".into(),
                uid: name.into(),
            },
            memory: Some(MemoryStats {
                working_set_bytes: Some(ws),
                ..MemoryStats::default()
            }),
            containers: vec![ContainerStats {
                name: "c".into(),
                memory: Some(MemoryStats {
                    working_set_bytes: Some(ws),
                    ..MemoryStats::default()
                }),
                ..ContainerStats::default()
            }],
            ..PodStats::default()
        }
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter()
            .map(|p| p.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    const MI: u64 = 1 << 20;

    /// A pod of a ranking case: name, priority, memory request, working set.
    type MemCase = (&'static str, i32, &'static str, u64);

    /// `TestOrderedByExceedsRequestMemory`, `TestOrderedByPriority`,
    /// `TestOrderedbyMemory` and `TestSortByEvictionPriority`'s shape: each key alone, then
    /// the three together.
    #[test]
    fn memory_ranks_by_exceeding_then_priority_then_usage_over_request() {
        // name, priority, request, working set, expected position.
        let table: &[(&[MemCase], &[&str])] = &[
            // Exceeding its request beats being large.
            (
                &[
                    ("large", 0, "500Mi", 400 * MI),
                    ("culprit", 0, "10Mi", 50 * MI),
                ],
                &["culprit", "large"],
            ),
            // Among those exceeding, lower priority first even when smaller.
            (
                &[
                    ("high", 100, "10Mi", 300 * MI),
                    ("low", -10, "10Mi", 20 * MI),
                ],
                &["low", "high"],
            ),
            // Same priority: the larger excess over the request first, not the larger usage.
            (
                &[
                    ("big", 0, "300Mi", 400 * MI),
                    ("small", 0, "10Mi", 150 * MI),
                ],
                &["small", "big"],
            ),
            // Within requests: lower priority, then usage minus request.
            (
                &[
                    ("a", 0, "1Gi", 100 * MI),
                    ("b", 0, "200Mi", 150 * MI),
                    ("c", -1, "1Gi", 1),
                ],
                &["c", "b", "a"],
            ),
            // No request (BestEffort) exceeds with any usage.
            (
                &[
                    ("guaranteed", 0, "1Gi", 900 * MI),
                    ("besteffort", 0, "", MI),
                ],
                &["besteffort", "guaranteed"],
            ),
        ];
        for (pods, want) in table {
            let mut ps: Vec<Pod> = pods
                .iter()
                .map(|(n, prio, req, _)| {
                    if req.is_empty() {
                        pod(n, *prio, &[])
                    } else {
                        pod(n, *prio, &[("memory", req)])
                    }
                })
                .collect();
            let stats: Vec<PodStats> = pods.iter().map(|(n, _, _, ws)| mem_stats(n, *ws)).collect();
            let by_uid: StatsByUid<'_> =
                stats.iter().map(|s| (s.pod_ref.uid.as_str(), s)).collect();
            rank_memory_pressure(&mut ps, &by_uid);
            assert_eq!(names(&ps), *want, "{pods:?}");
        }
        // A pod without stats ranks before those with stats.
        let mut ps = vec![pod("seen", 0, &[("memory", "1Gi")]), pod("unseen", 0, &[])];
        let s = [mem_stats("seen", 1)];
        let by_uid: StatsByUid<'_> = s.iter().map(|s| (s.pod_ref.uid.as_str(), s)).collect();
        rank_memory_pressure(&mut ps, &by_uid);
        assert_eq!(names(&ps), ["unseen", "seen"]);
    }

    fn disk_stats(name: &str, rootfs: u64, logs: u64, volume: u64) -> PodStats {
        let fs = |used: u64| FsStats {
            used_bytes: Some(used),
            inodes_used: Some(used / 1000),
            ..FsStats::default()
        };
        PodStats {
            pod_ref: PodReference {
                uid: name.into(),
                ..PodReference::default()
            },
            containers: vec![ContainerStats {
                name: "c".into(),
                rootfs: Some(fs(rootfs)),
                logs: Some(fs(logs)),
                ..ContainerStats::default()
            }],
            volume_stats: vec![crate::stats::types::VolumeStats {
                name: "scratch".into(),
                fs: fs(volume),
            }],
            ..PodStats::default()
        }
    }

    /// `TestOrderedByExceedsRequestDisk`, `TestOrderedbyDisk`: rootfs + logs + local
    /// volumes against the ephemeral-storage request.
    #[test]
    fn disk_ranks_the_same_way_over_disk_usage() {
        let with_volume = |name: &str, req: &str| {
            let mut p = if req.is_empty() {
                pod(name, 0, &[])
            } else {
                pod(name, 0, &[("ephemeral-storage", req)])
            };
            p.spec.as_mut().expect("spec").volumes = Some(vec![
                serde_json::from_value(serde_json::json!({"name": "scratch", "emptyDir": {}}))
                    .expect("volume"),
            ]);
            p
        };
        let mut ps = vec![
            with_volume("within", "1Gi"),
            with_volume("over", "10Mi"),
            with_volume("none", ""),
        ];
        let stats = [
            disk_stats("within", 300 * MI, 10 * MI, 200 * MI),
            disk_stats("over", MI, MI, 20 * MI),
            disk_stats("none", 0, 0, 5 * MI),
        ];
        let by_uid: StatsByUid<'_> = stats.iter().map(|s| (s.pod_ref.uid.as_str(), s)).collect();
        assert_eq!(disk_usage(&ps[0], &stats[0], false), i128::from(510 * MI));
        rank_disk_pressure(&mut ps, &by_uid, false);
        assert_eq!(names(&ps), ["over", "none", "within"]);
        // Inodes: nothing requests inodes, so every user exceeds; the most inodes first.
        rank_disk_pressure(&mut ps, &by_uid, true);
        assert_eq!(names(&ps), ["within", "over", "none"]);
    }

    #[test]
    fn pids_rank_by_priority_then_process_count() {
        let mut ps = vec![pod("few", 0, &[]), pod("many", 0, &[]), pod("vip", 10, &[])];
        let with = |n: &str, c: u64| PodStats {
            pod_ref: PodReference {
                uid: n.into(),
                ..PodReference::default()
            },
            process_stats: Some(crate::stats::types::ProcessStats {
                process_count: Some(c),
            }),
            ..PodStats::default()
        };
        let stats = [with("few", 2), with("many", 200), with("vip", 900)];
        let by_uid: StatsByUid<'_> = stats.iter().map(|s| (s.pod_ref.uid.as_str(), s)).collect();
        rank_pid_pressure(&mut ps, &by_uid);
        assert_eq!(names(&ps), ["many", "few", "vip"]);
    }

    /// `TestEvictionMessage`'s texts.
    #[test]
    fn messages_as_upstream_words_them() {
        let p = pod("p", 0, &[("memory", "10Mi")]);
        let s = mem_stats("p", 150 * MI);
        let met = vec![Threshold {
            signal: "allocatableMemory.available".into(),
            value: crate::machine::ThresholdValue::Quantity(Quantity::parse("400Mi").expect("q")),
            grace_period: std::time::Duration::ZERO,
            min_reclaim: None,
        }];
        let obs = Observations::from([(
            "allocatableMemory.available".to_string(),
            super::super::thresholds::Observation {
                available: 300 * 1024 * 1024 + 4096,
                capacity: 1 << 30,
            },
        )]);
        assert_eq!(
            eviction_message("memory", &p, Some(&s), &met, &obs),
            "The node was low on resource: memory. Threshold quantity: 400Mi, available: 307204Ki. \
             Container c was using 150Mi, request is 10Mi, has larger consumption of memory. "
        );
        // A container within its request is not named; no stats: the node's part only.
        let within = mem_stats("p", 5 * MI);
        assert_eq!(
            eviction_message("memory", &p, Some(&within), &met, &obs),
            "The node was low on resource: memory. Threshold quantity: 400Mi, available: 307204Ki. "
        );
        assert_eq!(
            eviction_message("ephemeral-storage", &p, None, &met, &obs),
            "The node was low on resource: ephemeral-storage. "
        );
        // A percentage threshold is written as the bytes it stands for.
        let pct = vec![Threshold {
            signal: "nodefs.available".into(),
            value: crate::machine::ThresholdValue::PercentageMillionths(100_000),
            grace_period: std::time::Duration::ZERO,
            min_reclaim: None,
        }];
        let fs = Observations::from([(
            "nodefs.available".to_string(),
            super::super::thresholds::Observation {
                available: 1 << 20,
                capacity: 10 << 30,
            },
        )]);
        assert_eq!(
            eviction_message("ephemeral-storage", &p, None, &pct, &fs),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 1Mi. "
        );
        assert_eq!(
            condition_message(&["MemoryPressure"]),
            "The node had condition: [MemoryPressure]. "
        );
        assert_eq!(
            condition_message(&["MemoryPressure", "DiskPressure"]),
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
    }
}
