//! The node status's view of the container runtime over the CRI client: `Version` for
//! `nodeInfo.containerRuntimeVersion`, `ListImages` for `status.images` ([`RuntimeInfo`]), and
//! the runtime's health: [`watch_health`] asks CRI `Status` every [`RUNTIME_CHECK_PERIOD`], as
//! the kubelet's `updateRuntimeUp` does, so a runtime that says it is not ready, or stops
//! answering for [`RUNTIME_SYNC_THRESHOLD`], turns the node NotReady with the kubelet's words,
//! and a runtime that comes back turns it Ready again. A runtime that is not installed at all
//! is [`MissingRuntime`]: the node still registers and says why it runs no pods.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{Image, Readiness, RuntimeInfo, RuntimeVersion};
use crate::cri::{Cri, api};

/// How often the runtime's status is checked: the kubelet runs `updateRuntimeUp` every 5 s
/// (`pkg/kubelet/kubelet.go`, `Run`). Shorter finds a dead runtime sooner but costs a CRI call
/// per period on a box that is mostly idle.
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How long the runtime may go without a good status before the node reports
/// [`super::readiness::RUNTIME_DOWN`]: the kubelet's `maxWaitForContainerRuntime`
/// (`pkg/kubelet/kubelet.go`, the `runtimeState`'s `baseRuntimeSyncThreshold`). Long enough
/// that the supervisor's restart of a crashed containerd (well under a second) never flips the
/// node NotReady, which would taint it and move nothing.
pub const RUNTIME_SYNC_THRESHOLD: Duration = Duration::from_secs(30);
/// CRI's condition that the runtime can run containers (`RuntimeReady` in `api.proto`).
const RUNTIME_READY: &str = "RuntimeReady";

impl RuntimeInfo for Cri {
    fn version(&self) -> BoxFuture<'_, anyhow::Result<RuntimeVersion>> {
        Box::pin(async move {
            let v = Cri::version(self).await?;
            Ok(RuntimeVersion {
                runtime_name: v.runtime_name,
                runtime_version: v.runtime_version,
            })
        })
    }

    fn list_images(&self) -> BoxFuture<'_, anyhow::Result<Vec<Image>>> {
        Box::pin(async move {
            let images = Cri::list_images(self, None).await?;
            Ok(images
                .into_iter()
                .map(|i| Image {
                    id: i.id,
                    repo_tags: i.repo_tags,
                    repo_digests: i.repo_digests,
                    size: i.size,
                })
                .collect())
        })
    }
}

/// No container runtime on this box (its packages are not installed): every question about it
/// fails with the reason, so the Node carries no runtime version and no images.
#[derive(Debug, Clone)]
pub struct MissingRuntime(pub String);

impl RuntimeInfo for MissingRuntime {
    fn version(&self) -> BoxFuture<'_, anyhow::Result<RuntimeVersion>> {
        Box::pin(async move { Err(anyhow::anyhow!("{}", self.0)) })
    }

    fn list_images(&self) -> BoxFuture<'_, anyhow::Result<Vec<Image>>> {
        Box::pin(async move { Err(anyhow::anyhow!("{}", self.0)) })
    }
}

/// Checks the runtime's status every [`RUNTIME_CHECK_PERIOD`] until `stop`, reporting into
/// `readiness` ([`check`] decides). `status` is CRI `Status` ([`cri_status`] for a real
/// runtime).
pub async fn watch_health<F, Fut>(status: F, readiness: Readiness, stop: CancellationToken)
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<api::StatusResponse>>,
{
    let mut last_good = Instant::now();
    let mut tick = tokio::time::interval(RUNTIME_CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let answer = tokio::select! {
            a = status() => a,
            () = stop.cancelled() => return,
        };
        check(answer, &mut last_good, Instant::now(), &readiness);
    }
}

/// CRI `Status` of `cri`, for [`watch_health`].
pub fn cri_status(
    cri: Cri,
) -> impl Fn() -> BoxFuture<'static, anyhow::Result<api::StatusResponse>> {
    move || {
        let cri = cri.clone();
        Box::pin(async move { Ok(cri.status(false).await?) })
    }
}

/// One status answer folded into `readiness`, as `updateRuntimeUp` and `runtimeState` do: a
/// `RuntimeReady=true` answer is a good sync (the runtime is up); an answer without it or with
/// it false makes the runtime not ready with the condition as the kubelet prints it
/// (`container runtime not ready: RuntimeReady=false reason:... message:...`); no answer
/// changes nothing until the last good sync is [`RUNTIME_SYNC_THRESHOLD`] old, and then the
/// runtime is down.
pub fn check(
    answer: anyhow::Result<api::StatusResponse>,
    last_good: &mut Instant,
    now: Instant,
    readiness: &Readiness,
) {
    match answer {
        Ok(response) => {
            let ready = response
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.r#type == RUNTIME_READY);
            match ready {
                Some(c) if c.status => {
                    *last_good = now;
                    readiness.set_runtime_up();
                }
                Some(c) => readiness.set_runtime_down(Some(&format!(
                    "container runtime not ready: {}={} reason:{} message:{}",
                    c.r#type, c.status, c.reason, c.message
                ))),
                None => readiness.set_runtime_down(Some("container runtime not ready: <nil>")),
            }
        }
        Err(e) => {
            warn!(error = %e, "container runtime sanity check failed");
            if now.duration_since(*last_good) >= RUNTIME_SYNC_THRESHOLD {
                readiness.set_runtime_down(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodestatus::readiness::RUNTIME_DOWN;

    fn answer(ready: bool) -> anyhow::Result<api::StatusResponse> {
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![
                    api::RuntimeCondition {
                        r#type: RUNTIME_READY.into(),
                        status: ready,
                        reason: if ready {
                            String::new()
                        } else {
                            "ContainerdDown".into()
                        },
                        message: if ready {
                            String::new()
                        } else {
                            "no shim".into()
                        },
                    },
                    api::RuntimeCondition {
                        r#type: "NetworkReady".into(),
                        status: true,
                        ..Default::default()
                    },
                ],
            }),
            ..Default::default()
        })
    }

    fn runtime_errors(r: &Readiness) -> Vec<String> {
        r.errors()
            .into_iter()
            .filter(|e| !e.starts_with("container runtime network"))
            .collect()
    }

    #[test]
    fn a_silent_runtime_is_down_only_after_the_threshold() {
        let r = Readiness::new();
        let start = Instant::now();
        let mut last = start;
        check(answer(true), &mut last, start, &r);
        assert!(runtime_errors(&r).is_empty());
        // A restart's worth of silence changes nothing...
        let soon = start + RUNTIME_CHECK_PERIOD;
        check(
            Err(anyhow::anyhow!("connection refused")),
            &mut last,
            soon,
            &r,
        );
        assert!(runtime_errors(&r).is_empty());
        // ...thirty seconds of it is a dead runtime...
        let late = start + RUNTIME_SYNC_THRESHOLD;
        check(
            Err(anyhow::anyhow!("connection refused")),
            &mut last,
            late,
            &r,
        );
        assert_eq!(runtime_errors(&r), vec![RUNTIME_DOWN.to_string()]);
        // ...and one good answer brings it back.
        check(answer(true), &mut last, late + RUNTIME_CHECK_PERIOD, &r);
        assert!(runtime_errors(&r).is_empty());
    }

    #[test]
    fn a_runtime_that_says_not_ready_is_reported_in_the_kubelets_words() {
        let r = Readiness::new();
        let mut last = Instant::now();
        check(answer(false), &mut last, Instant::now(), &r);
        assert_eq!(
            runtime_errors(&r),
            vec![
                "container runtime not ready: RuntimeReady=false reason:ContainerdDown message:no shim"
                    .to_string()
            ]
        );
        check(
            Ok(api::StatusResponse::default()),
            &mut last,
            Instant::now(),
            &r,
        );
        assert_eq!(
            runtime_errors(&r),
            vec!["container runtime not ready: <nil>".to_string()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_watcher_turns_the_node_not_ready_when_the_runtime_dies_and_back() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let alive = Arc::new(AtomicBool::new(true));
        let r = Readiness::new();
        let stop = CancellationToken::new();
        let probe = alive.clone();
        let task = tokio::spawn(watch_health(
            move || {
                let up = probe.load(Ordering::SeqCst);
                async move {
                    if up {
                        answer(true)
                    } else {
                        Err(anyhow::anyhow!("connection refused"))
                    }
                }
            },
            r.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(runtime_errors(&r).is_empty());
        alive.store(false, Ordering::SeqCst);
        tokio::time::sleep(RUNTIME_SYNC_THRESHOLD - RUNTIME_CHECK_PERIOD).await;
        assert!(runtime_errors(&r).is_empty(), "down too early");
        tokio::time::sleep(RUNTIME_CHECK_PERIOD * 2).await;
        assert_eq!(runtime_errors(&r), vec![RUNTIME_DOWN.to_string()]);
        alive.store(true, Ordering::SeqCst);
        tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
        assert!(runtime_errors(&r).is_empty());
        stop.cancel();
        task.await.expect("the watcher ends");
    }
}
