//! The pod lifecycle event generator (upstream `pkg/kubelet/pleg/generic.go`): every
//! [`RELIST_PERIOD`] it lists the runtime's sandboxes and containers, compares each one's
//! state with the last listing, and wakes the worker of every pod where something changed (a
//! container started, exited, vanished). Workers read the runtime themselves; the PLEG only
//! says when to look.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::runtime::LABEL_POD_UID;
use crate::cri::Cri;

/// How often the runtime is relisted (`kubelet.go`: `genericPlegRelistPeriod = 1s`). A
/// container's exit is noticed within it; each relist is two CRI list calls.
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// Added to a container's CRI state in a [`Snapshot`], so sandbox and container states
/// (both small enums from 0) stay apart.
const CONTAINER_OFFSET: i32 = 10;
/// CRI's `SANDBOX_READY`.
const SANDBOX_READY: i32 = crate::cri::api::PodSandboxState::SandboxReady as i32;

/// `(id, state)` of everything listed, by pod UID.
type Snapshot = HashMap<String, HashSet<(String, i32)>>;

/// One relist: the state of every sandbox and container, by pod UID.
pub async fn relist(cri: &Cri) -> Result<Snapshot, crate::cri::CriError> {
    let mut out = Snapshot::new();
    for s in cri.list_pod_sandbox(None).await? {
        if let Some(uid) = s.labels.get(LABEL_POD_UID) {
            out.entry(uid.clone()).or_default().insert((s.id, s.state));
        }
    }
    for c in cri.list_containers(None).await? {
        if let Some(uid) = c.labels.get(LABEL_POD_UID) {
            out.entry(uid.clone())
                .or_default()
                .insert((c.id, c.state + CONTAINER_OFFSET));
        }
    }
    Ok(out)
}

/// The pods whose set of (id, state) differs between two relists.
pub fn changed(old: &Snapshot, new: &Snapshot) -> Vec<String> {
    let mut uids: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|uid| old.get(*uid) != new.get(*uid))
        .cloned()
        .collect();
    uids.sort();
    uids.dedup();
    uids
}

/// The pods with a ready sandbox and the containers by state in a relist
/// (`updateRunningPodAndContainerMetrics`).
pub fn running(snapshot: &Snapshot) -> (usize, HashMap<&'static str, usize>) {
    let mut pods = 0;
    let mut states = HashMap::new();
    for items in snapshot.values() {
        if items.iter().any(|(_, s)| *s == SANDBOX_READY) {
            pods += 1;
        }
        for (_, s) in items.iter().filter(|(_, s)| *s >= CONTAINER_OFFSET) {
            let state = match s - CONTAINER_OFFSET {
                0 => "created",
                1 => "running",
                2 => "exited",
                _ => "unknown",
            };
            *states.entry(state).or_default() += 1;
        }
    }
    (pods, states)
}

/// Relists until `stop`, calling `wake` with each pod that changed.
pub async fn run(cri: Cri, wake: impl Fn(&str) + Send, stop: CancellationToken) {
    let mut last = Snapshot::new();
    loop {
        let started = std::time::Instant::now();
        match relist(&cri).await {
            Ok(now) => {
                let (pods, states) = running(&now);
                crate::metrics::metrics().relisted(started.elapsed(), pods, &states);
                for uid in changed(&last, &now) {
                    wake(&uid);
                }
                last = now;
            }
            Err(e) => debug!(error = %e, "PLEG relist failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(RELIST_PERIOD) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pods_with_a_state_change_are_woken() {
        let snap = |items: &[(&str, &str, i32)]| {
            let mut s = Snapshot::new();
            for (uid, id, state) in items {
                s.entry(uid.to_string())
                    .or_default()
                    .insert((id.to_string(), *state));
            }
            s
        };
        let a = snap(&[("u1", "c1", 11), ("u2", "c2", 11)]);
        let b = snap(&[("u1", "c1", 12), ("u2", "c2", 11), ("u3", "s3", 0)]);
        assert_eq!(changed(&a, &b), ["u1", "u3"]);
        let c = snap(&[("u2", "c2", 11), ("u3", "s3", 0)]);
        assert_eq!(changed(&b, &c), ["u1"], "a pod whose containers vanished");
        assert!(changed(&c, &c).is_empty());
        let (pods, states) = running(&b);
        assert_eq!(pods, 1, "u3's ready sandbox");
        assert_eq!((states["running"], states["exited"]), (1, 1));
    }
}
