//! Liveness, readiness and startup probes (upstream `pkg/kubelet/prober`: `prober_manager.go`,
//! `worker.go`, `results/results_manager.go`).
//!
//! One task per probe of each container ([`ProbeManager::sync_pod`] starts them, idempotent
//! per pod UID, container and kind; [`ProbeManager::remove_pod`] stops them). A task ticks every
//! `periodSeconds`, looks at the container as the last pod sync saw it (its instance id, how
//! long it has run, whether its startup probe passed), lets [`worker::Accounting`] decide
//! whether to probe, runs [`probe::run`] and counts the outcome against the thresholds.
//!
//! The trick it carries: results are cached by container *instance* id, so a restarted
//! container starts from the kind's initial result (not ready, alive, not started) without
//! anything being cleared, and a changed result wakes the pod's worker, whose next sync
//! reads them: readiness and startup into the status, a liveness or startup failure into a
//! kill and a restart by `restartPolicy` (`computePodActions`).

pub mod probe;
pub mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use skerry_client::events::{EventRecorder, object_reference};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::runtime::RuntimePod;
use crate::cri::Cri;
use crate::env::EVENT_WARNING;
use worker::{Accounting, Before, Target, Thresholds};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// `livenessProbe`: a failure restarts the container.
    Liveness,
    /// `readinessProbe`: a failure keeps the container out of Ready.
    Readiness,
    /// `startupProbe`: the others wait for it; a failure restarts the container.
    Startup,
}

impl ProbeKind {
    /// The name in events (`Liveness probe failed: ...`).
    pub fn title(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The result a new instance starts with (`worker.go` `newWorker`: readiness Failure,
    /// liveness Success, startup Unknown).
    pub fn initial(self) -> Option<ProbeResult> {
        match self {
            ProbeKind::Liveness => Some(ProbeResult::Success),
            ProbeKind::Readiness => Some(ProbeResult::Failure),
            ProbeKind::Startup => None,
        }
    }

    fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }
}

/// A cached result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// Passed its success threshold.
    Success,
    /// Reached its failure threshold.
    Failure,
}

/// The event reasons (`pkg/kubelet/events`).
pub const REASON_UNHEALTHY: &str = "Unhealthy";
/// See [`REASON_UNHEALTHY`].
pub const REASON_PROBE_WARNING: &str = "ProbeWarning";

/// The defaults of a probe's numbers (`pkg/apis/core/v1/defaults.go` `SetDefaults_Probe`).
pub const DEFAULT_PERIOD_SECONDS: i32 = 10;
/// See [`DEFAULT_PERIOD_SECONDS`].
pub const DEFAULT_SUCCESS_THRESHOLD: i32 = 1;
/// See [`DEFAULT_PERIOD_SECONDS`].
pub const DEFAULT_FAILURE_THRESHOLD: i32 = 3;

/// A container as the last sync saw it.
#[derive(Clone, Debug)]
struct Seen {
    id: String,
    running: bool,
    started_at_ns: i64,
}

#[derive(Default)]
struct PodSeen {
    pod_ip: String,
    containers: HashMap<String, Seen>,
}

type WorkerKey = (String, String, ProbeKind);

struct Inner {
    cri: Cri,
    events: EventRecorder,
    wake: Box<dyn Fn(&str) + Send + Sync>,
    workers: Mutex<HashMap<WorkerKey, CancellationToken>>,
    seen: Mutex<HashMap<String, PodSeen>>,
    /// By (container instance id, kind).
    results: Mutex<HashMap<(String, ProbeKind), ProbeResult>>,
}

/// The probe workers and their results.
#[derive(Clone)]
pub struct ProbeManager {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ProbeManager {
    /// A manager probing over `cri`, recording events with `events`; `wake(uid)` is called
    /// when a pod's result changes.
    pub fn new(
        cri: Cri,
        events: EventRecorder,
        wake: impl Fn(&str) + Send + Sync + 'static,
    ) -> ProbeManager {
        ProbeManager {
            inner: Arc::new(Inner {
                cri,
                events,
                wake: Box::new(wake),
                workers: Mutex::new(HashMap::new()),
                seen: Mutex::new(HashMap::new()),
                results: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Records what the sync saw of the pod and starts the workers of its regular
    /// containers' probes that do not run yet (`AddPod`).
    pub fn sync_pod(&self, pod: &Pod, rt: &RuntimePod, pod_ip: &str, stop: &CancellationToken) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        {
            let mut seen = lock(&self.inner.seen);
            let entry = seen.entry(uid.clone()).or_default();
            entry.pod_ip = pod_ip.to_string();
            entry.containers = spec
                .containers
                .iter()
                .filter_map(|c| {
                    let l = rt.latest(&c.name)?;
                    Some((
                        c.name.clone(),
                        Seen {
                            id: l.id.clone(),
                            running: l.running(),
                            started_at_ns: l.started_at,
                        },
                    ))
                })
                .collect();
        }
        let mut workers = lock(&self.inner.workers);
        for c in &spec.containers {
            for kind in [
                ProbeKind::Startup,
                ProbeKind::Liveness,
                ProbeKind::Readiness,
            ] {
                let Some(p) = kind.of(c) else { continue };
                let key = (uid.clone(), c.name.clone(), kind);
                if workers.contains_key(&key) {
                    continue;
                }
                let token = stop.child_token();
                workers.insert(key, token.clone());
                let this = self.clone();
                let pod = Arc::new(pod.clone());
                let container = c.clone();
                let probe = p.clone();
                tokio::spawn(async move {
                    this.work(pod, container, kind, probe, token).await;
                });
            }
        }
    }

    /// Stops the pod's workers and forgets its results (`RemovePod`).
    pub fn remove_pod(&self, uid: &str) {
        lock(&self.inner.workers).retain(|(u, _, _), token| {
            if u == uid {
                token.cancel();
                false
            } else {
                true
            }
        });
        if let Some(p) = lock(&self.inner.seen).remove(uid) {
            let ids: Vec<String> = p.containers.into_values().map(|s| s.id).collect();
            lock(&self.inner.results).retain(|(id, _), _| !ids.contains(id));
        }
    }

    /// The cached result of a container instance's probe.
    pub fn result(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        lock(&self.inner.results)
            .get(&(container_id.to_string(), kind))
            .copied()
    }

    /// Whether a running instance counts as started: no startup probe, or it passed
    /// (`UpdatePodStatus`).
    pub fn started(&self, c: &Container, container_id: &str) -> bool {
        c.startup_probe.is_none()
            || self.result(container_id, ProbeKind::Startup) == Some(ProbeResult::Success)
    }

    /// Whether a running instance is ready: started, and no readiness probe or it passed.
    pub fn ready(&self, c: &Container, container_id: &str) -> bool {
        self.started(c, container_id)
            && (c.readiness_probe.is_none()
                || self.result(container_id, ProbeKind::Readiness) == Some(ProbeResult::Success))
    }

    /// Why a running instance must be killed: its liveness or startup probe failed
    /// (`computePodActions`' messages).
    pub fn kill_reason(&self, name: &str, container_id: &str) -> Option<String> {
        if self.result(container_id, ProbeKind::Liveness) == Some(ProbeResult::Failure) {
            return Some(format!("Container {name} failed liveness probe"));
        }
        if self.result(container_id, ProbeKind::Startup) == Some(ProbeResult::Failure) {
            return Some(format!("Container {name} failed startup probe"));
        }
        None
    }

    fn set(&self, uid: &str, id: &str, kind: ProbeKind, r: ProbeResult) {
        let old = lock(&self.inner.results).insert((id.to_string(), kind), r);
        if old != Some(r) {
            debug!(%uid, container = %id, ?kind, ?r, "probe result changed");
            (self.inner.wake)(uid);
        }
    }

    fn target(&self, uid: &str, c: &Container) -> Option<(Target, String)> {
        let seen = lock(&self.inner.seen);
        let p = seen.get(uid)?;
        let s = p.containers.get(&c.name)?;
        let now = jiff::Timestamp::now().as_second();
        let running_for = if s.started_at_ns > 0 {
            now - s.started_at_ns / 1_000_000_000
        } else {
            0
        };
        Some((
            Target {
                id: s.id.clone(),
                running: s.running,
                running_for,
                started: self.started(c, &s.id),
            },
            p.pod_ip.clone(),
        ))
    }

    /// A worker's loop (`worker.run`).
    async fn work(
        self,
        pod: Arc<Pod>,
        c: Container,
        kind: ProbeKind,
        p: Probe,
        stop: CancellationToken,
    ) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let period = Duration::from_secs(
            u64::try_from(p.period_seconds.unwrap_or(DEFAULT_PERIOD_SECONDS).max(1)).unwrap_or(10),
        );
        let thresholds = Thresholds {
            initial_delay: i64::from(p.initial_delay_seconds.unwrap_or(0).max(0)),
            success: u32::try_from(p.success_threshold.unwrap_or(DEFAULT_SUCCESS_THRESHOLD))
                .unwrap_or(1),
            failure: u32::try_from(p.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD))
                .unwrap_or(3),
        };
        let mut acc = Accounting::new(kind, thresholds);
        loop {
            let seen = self.target(&uid, &c);
            match acc.before(seen.as_ref().map(|(t, _)| t)) {
                Before::Skip { set } => {
                    if let Some((id, r)) = set {
                        self.set(&uid, &id, kind, r);
                    }
                }
                Before::Probe => {
                    let (t, pod_ip) = seen.expect("a probe is only asked for a seen container");
                    let target = probe::ProbeTarget {
                        container_id: &t.id,
                        container: &c,
                        pod_ip: &pod_ip,
                    };
                    let outcome = tokio::select! {
                        o = probe::run(&self.inner.cri, &p, &target) => o,
                        () = stop.cancelled() => return,
                    };
                    let r = match outcome {
                        probe::Outcome::Success => ProbeResult::Success,
                        probe::Outcome::Warning(w) => {
                            self.event(
                                &pod,
                                REASON_PROBE_WARNING,
                                &format!("{} probe warning: {w}", kind.title()),
                            );
                            ProbeResult::Success
                        }
                        probe::Outcome::Failure(out) => {
                            self.event(
                                &pod,
                                REASON_UNHEALTHY,
                                &format!("{} probe failed: {out}", kind.title()),
                            );
                            ProbeResult::Failure
                        }
                    };
                    if let Some(r) = acc.after(r) {
                        self.set(&uid, &t.id, kind, r);
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    fn event(&self, pod: &Pod, reason: &str, message: &str) {
        self.inner
            .events
            .event(&object_reference(pod), EVENT_WARNING, reason, message);
    }
}
