//! `SyncPod` and the pod's termination (upstream `kuberuntime_manager.go` `SyncPod`,
//! `killPodWithSyncResult`; `kuberuntime_container.go` `startContainer`, `killContainer`,
//! `executePreStopHook`; `images/image_manager.go` `EnsureImageExists`): the side of the
//! kubelet that talks to CRI, driven by [`super::actions`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, PodStatus};
use skerry_client::events::object_reference;
use tracing::{debug, info, warn};

use super::actions::{self, ContainerRef, Kind, compute_pod_actions, container_hash};
use super::backoff::{container_key, image_key};
use super::container::{ContainerInput, DEFAULT_GRACE_SECONDS, container_config};
use super::keyring;
use super::pod_workers::{SyncResult, pod_name};
use super::runtime::{self, RuntimePod};
use super::sandbox::{self, host_network};
use super::status::{self, Reason, StatusInput};
use super::{Kubelet, pod_workers};
use crate::cri::api;
use crate::env::{EVENT_WARNING, EnvInput, make_environment};
use crate::volume::ContainerMount;

/// `Normal` events.
const EVENT_NORMAL: &str = "Normal";
/// The least time a container gets to stop (`kuberuntime_container.go`:
/// `minimumGracePeriodInSeconds = 2`), even when the pod was deleted with grace 0.
pub const MINIMUM_GRACE: Duration = Duration::from_secs(2);
/// The file of the pod's managed `/etc/hosts` in its directory (upstream's name).
pub const ETC_HOSTS_FILE: &str = "etc-hosts";
/// The longest termination message kept (`kuberuntime_container.go`:
/// `maxMsgSize = 4 * 1024`).
pub const MAX_TERMINATION_MESSAGE: u64 = 4 * 1024;
/// The `imagePullPolicy` values.
const PULL_ALWAYS: &str = "Always";
const PULL_NEVER: &str = "Never";
const PULL_IF_NOT_PRESENT: &str = "IfNotPresent";

/// Why a container could not be started this sync.
struct StartFailure {
    reason: &'static str,
    message: String,
    /// Try again after this long (backoff), if known.
    retry_in: Option<Duration>,
}

impl Kubelet {
    fn record(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        self.events
            .event(&object_reference(pod), type_, reason, message);
    }

    /// The QoS cgroups to the pods admitted now (`UpdateQOSCgroups`).
    pub(super) fn update_qos_cgroups(&self) {
        let pods: Vec<Arc<Pod>> = self
            .admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        if let Err(e) = self
            .config
            .cgroups
            .update_qos(pods.iter().map(|p| p.as_ref()))
        {
            warn!(error = %e, "updating the QoS cgroups failed");
        }
    }

    fn set_reason(&self, uid: &str, name: &str, reason: Option<Reason>) {
        let mut reasons = self.reasons.lock().unwrap_or_else(|p| p.into_inner());
        let pod = reasons.entry(uid.to_string()).or_default();
        match reason {
            Some(r) => {
                pod.insert(name.to_string(), r);
            }
            None => {
                pod.remove(name);
            }
        }
    }

    fn reasons_of(&self, uid: &str) -> HashMap<String, Reason> {
        self.reasons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    /// The grace period a stop of `pod` gets: the deletion's, else the spec's (default 30 s).
    pub fn grace_period(&self, pod: &Pod) -> Duration {
        let seconds = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.volumes.pod_dir(uid)
    }

    /// Whether the pod ran past `activeDeadlineSeconds`, and how long until it does.
    fn deadline(&self, pod: &Pod) -> (bool, Option<Duration>) {
        let Some(limit) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
            return (false, None);
        };
        let Some(start) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()) else {
            return (
                false,
                Some(Duration::from_secs(u64::try_from(limit).unwrap_or(0))),
            );
        };
        let now = jiff::Timestamp::now();
        let elapsed = now.as_second() - start.0.as_second();
        if elapsed >= limit {
            (true, None)
        } else {
            (false, Some(Duration::from_secs((limit - elapsed) as u64)))
        }
    }

    /// One sync of a running pod (`SyncPod`): computes the actions, kills what must go,
    /// creates the sandbox if needed, starts containers, writes the status.
    pub async fn sync_pod(self: &Arc<Self>, pod: &Pod) -> anyhow::Result<SyncResult> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or_default();
        if status::is_terminal_phase(phase) {
            return Ok(SyncResult::Terminal);
        }
        let (exceeded, deadline_in) = self.deadline(pod);
        if exceeded {
            self.record(
                pod,
                EVENT_NORMAL,
                status::REASON_DEADLINE_EXCEEDED,
                status::MESSAGE_DEADLINE_EXCEEDED,
            );
            self.kill_pod(pod, Some(self.grace_period(pod))).await;
            let rt = runtime::pod_status(&self.cri, &uid).await?;
            let mut input = self.status_input(pod, &rt);
            input.terminal = true;
            input.deadline_exceeded = true;
            self.set_status(pod, &status::generate(pod, &rt, &input))
                .await?;
            return Ok(SyncResult::Terminal);
        }
        let rt = runtime::pod_status(&self.cri, &uid)
            .await
            .context("read the pod from the runtime")?;
        let mut actions = compute_pod_actions(pod, &rt);
        actions::add_probe_kills(pod, &rt, &mut actions, |name, id| {
            self.probes.kill_reason(name, id)
        });
        debug!(pod = %pod_name(pod), ?actions, "sync");
        if actions.kill_pod {
            if actions.create_sandbox && !rt.sandboxes.is_empty() {
                self.record(
                    pod,
                    EVENT_NORMAL,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                );
            }
            self.kill_running(pod, &rt, self.grace_period(pod)).await;
            for s in &rt.sandboxes {
                if let Err(e) = self.cri.stop_pod_sandbox(&s.id).await {
                    warn!(pod = %pod_name(pod), error = %e, "stopping a sandbox failed");
                }
            }
        }
        let spec_containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
        for k in &actions.kill {
            // `computePodActions`: ", will be restarted" only when it is.
            let restarted = actions.start.iter().any(|r| {
                r.kind == Kind::Regular
                    && spec_containers
                        .and_then(|l| l.get(r.index))
                        .is_some_and(|c| c.name == k.name)
            }) || actions.start.iter().any(|r| r.kind == Kind::Init);
            let message = if restarted {
                format!("{}, will be restarted", k.message)
            } else {
                k.message.clone()
            };
            self.record(pod, EVENT_NORMAL, "Killing", &message);
            if let Some(c) = rt.containers.iter().find(|c| c.id == k.id) {
                self.stop_container(pod, c, self.grace_period(pod)).await;
            }
        }
        let mut retry: Option<Duration> = deadline_in;
        if !actions.start.is_empty() {
            retry = min(retry, self.start_all(pod, &rt, &actions).await?);
        } else {
            self.refresh_volumes(pod).await;
        }
        let rt = runtime::pod_status(&self.cri, &uid).await?;
        let input = self.status_input(pod, &rt);
        let generated = status::generate(pod, &rt, &input);
        let terminal = generated
            .phase
            .as_deref()
            .is_some_and(status::is_terminal_phase);
        if !terminal {
            self.probes.sync_pod(
                pod,
                &rt,
                generated.pod_ip.as_deref().unwrap_or_default(),
                &self.stop,
            );
        }
        if !terminal {
            self.set_status(pod, &generated).await?;
            if generated.phase.as_deref() == Some("Running") {
                crate::metrics::metrics().pod_running(&uid);
            }
        }
        self.gc_dead_containers(&rt).await;
        if terminal {
            return Ok(SyncResult::Terminal);
        }
        Ok(SyncResult::Again(
            retry
                .unwrap_or(pod_workers::RESYNC)
                .min(pod_workers::RESYNC),
        ))
    }

    fn status_input(&self, pod: &Pod, rt: &RuntimePod) -> StatusInput {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut messages = HashMap::new();
        for c in rt.containers.iter().filter(|c| c.exited()) {
            if let Some(m) = termination_message(c) {
                messages.insert(c.id.clone(), m);
            }
        }
        let mut probed = HashMap::new();
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            if let Some(l) = rt.latest(&c.name).filter(|l| l.running()) {
                let state = status::Probed {
                    ready: self.probes.ready(c, &l.id),
                    started: self.probes.started(c, &l.id),
                };
                probed.insert(l.id.clone(), state);
            }
        }
        StatusInput {
            probed,
            host_ips: self.config.node_ips.clone(),
            reasons: self.reasons_of(&uid),
            messages,
            terminal: false,
            deadline_exceeded: false,
            now: jiff::Timestamp::now(),
        }
    }

    /// Creates the sandbox if needed and starts the containers the actions name; returns
    /// when to look again (the shortest backoff), if anything waits.
    async fn start_all(
        &self,
        pod: &Pod,
        rt: &RuntimePod,
        actions: &actions::PodActions,
    ) -> anyhow::Result<Option<Duration>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !host_network(pod) && actions.create_sandbox {
            let status = self.cri.status(false).await?;
            let network = status
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .find(|c| c.r#type == "NetworkReady");
            if let Some(c) = network.filter(|c| !c.status) {
                let message = format!(
                    "network is not ready: container runtime network not ready: NetworkReady=false reason:{} message:{}",
                    c.reason, c.message
                );
                self.record(pod, EVENT_WARNING, "NetworkNotReady", &message);
                anyhow::bail!(message);
            }
        }
        // The pod's cgroup before anything runs in it (`syncPod`: `UpdateQOSCgroups`, then
        // the pod container manager's `EnsureExists`).
        if !self.config.cgroups.cgroups().exists(
            &self
                .config
                .cgroups
                .pod_cgroup(&sandbox::qos_class(pod), &uid),
        ) {
            self.update_qos_cgroups();
            if let Err(e) = self.config.cgroups.ensure_pod(pod) {
                let message = format!("unable to ensure pod container exists: {e}");
                self.record(pod, EVENT_WARNING, "FailedToCreatePodContainer", &message);
                anyhow::bail!(message);
            }
        }
        // Volumes first: nothing starts without them (`WaitForAttachAndMount`).
        if let Err(e) = self.volumes.set_up(pod).await {
            for f in &e.failures {
                let ev = f.event();
                self.record(pod, ev.type_, ev.reason, &ev.message);
            }
            anyhow::bail!("volumes: {e}");
        }
        let sandbox_config = sandbox::sandbox_config(pod, actions.attempt, &self.sandbox_env);
        let (sandbox_id, ips) = if actions.create_sandbox {
            tokio::fs::create_dir_all(&sandbox_config.log_directory)
                .await
                .with_context(|| format!("create {}", sandbox_config.log_directory))?;
            let created = self.cri.run_pod_sandbox(sandbox_config.clone(), "").await;
            crate::metrics::metrics().pod_started(created.is_err());
            let id = match created {
                Ok(id) => id,
                Err(e) => {
                    let message = format!("Failed to create pod sandbox: {e}");
                    self.record(pod, EVENT_WARNING, "FailedCreatePodSandBox", &message);
                    anyhow::bail!(message);
                }
            };
            let ips = self
                .cri
                .pod_sandbox_status(&id, false)
                .await?
                .status
                .and_then(|s| s.network)
                .map(|n| {
                    let mut ips = vec![n.ip];
                    ips.extend(n.additional_ips.into_iter().map(|i| i.ip));
                    ips.retain(|i| !i.is_empty());
                    ips
                })
                .unwrap_or_default();
            (id, ips)
        } else {
            let id = actions
                .sandbox_id
                .clone()
                .expect("a sync without a new sandbox has one");
            let ips = rt
                .sandboxes
                .first()
                .map(|s| s.ips.clone())
                .unwrap_or_default();
            (id, ips)
        };
        let pod_ips = if host_network(pod) {
            self.config.node_ips.clone()
        } else {
            ips
        };
        self.write_hosts_file(pod, &pod_ips).await?;
        let spec = pod.spec.clone().unwrap_or_default();
        let mut retry = None;
        for r in &actions.start {
            let c = match r.kind {
                Kind::Init => spec.init_containers.as_ref().and_then(|l| l.get(r.index)),
                Kind::Regular => spec.containers.get(r.index),
            };
            let Some(c) = c else { continue };
            match self
                .start_container(pod, &sandbox_id, &sandbox_config, c, &pod_ips, rt, *r)
                .await
            {
                Ok(()) => self.set_reason(&uid, &c.name, None),
                Err(f) => {
                    self.set_reason(
                        &uid,
                        &c.name,
                        Some(Reason {
                            reason: f.reason.to_string(),
                            message: f.message.clone(),
                        }),
                    );
                    retry = min(retry, Some(f.retry_in.unwrap_or(super::SYNC_ERROR_RETRY)));
                    if r.kind == Kind::Init && !actions::is_sidecar(c) {
                        break;
                    }
                }
            }
        }
        Ok(retry)
    }

    async fn write_hosts_file(&self, pod: &Pod, pod_ips: &[String]) -> anyhow::Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = self.pod_dir(&uid);
        tokio::fs::create_dir_all(&dir).await?;
        let node_hosts = if host_network(pod) {
            tokio::fs::read_to_string(&self.config.hosts_file)
                .await
                .unwrap_or_default()
        } else {
            String::new()
        };
        let text = sandbox::hosts_file(pod, pod_ips, &self.config.cluster_domain, &node_hosts);
        tokio::fs::write(dir.join(ETC_HOSTS_FILE), text).await?;
        Ok(())
    }

    /// Makes sure the image is there per `imagePullPolicy`; returns its id.
    async fn ensure_image(&self, pod: &Pod, c: &Container) -> Result<String, StartFailure> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let image = c.image.clone().unwrap_or_default();
        // `applyDefaultImageTag`: a reference that cannot be normalized never reaches CRI.
        let normalized = match crate::images::reference::normalize(&image) {
            Ok(n) => n,
            Err(_) => {
                let message = format!(
                    "Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": invalid reference format"
                );
                self.record(pod, EVENT_WARNING, "InspectFailed", &message);
                return Err(StartFailure {
                    reason: "InvalidImageName",
                    message,
                    retry_in: None,
                });
            }
        };
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| default_pull_policy(&image).to_string());
        let present = self
            .cri
            .image_status(&image)
            .await
            .map_err(|e| StartFailure {
                reason: "ErrImageInspect",
                message: format!("Failed to inspect image \"{image}\": {e}"),
                retry_in: None,
            })?;
        if policy != PULL_ALWAYS {
            if let Some(img) = present {
                self.record(
                    pod,
                    EVENT_NORMAL,
                    "Pulled",
                    &format!("Container image \"{image}\" already present on machine"),
                );
                return Ok(img.id);
            }
            if policy == PULL_NEVER {
                let message =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.record(pod, EVENT_WARNING, "ErrImageNeverPull", &message);
                return Err(StartFailure {
                    reason: "ErrImageNeverPull",
                    message,
                    retry_in: None,
                });
            }
        }
        let key = image_key(&uid, &image);
        let now = SystemTime::now();
        {
            let backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(wait) = backoff.remaining(&key, last_failure(&backoff, &key, now), now) {
                let message = format!("Back-off pulling image \"{image}\"");
                self.record(pod, EVENT_NORMAL, "BackOff", &message);
                self.record(pod, EVENT_WARNING, "Failed", "Error: ImagePullBackOff");
                return Err(StartFailure {
                    reason: "ImagePullBackOff",
                    message,
                    retry_in: Some(wait),
                });
            }
        }
        self.record(
            pod,
            EVENT_NORMAL,
            "Pulling",
            &format!("Pulling image \"{image}\""),
        );
        let started = Instant::now();
        let result = match self.pull_credentials(pod, &normalized).await {
            Ok(creds) => self.pull_with(&image, creds).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(id) => {
                // Truncated to the millisecond, as `image_manager.go` writes it.
                let took = Duration::from_millis(
                    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                );
                let size = match self.cri.image_status(&image).await {
                    Ok(Some(img)) => img.size,
                    _ => 0,
                };
                self.record(
                    pod,
                    EVENT_NORMAL,
                    "Pulled",
                    &format!(
                        "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {size} bytes.",
                        go_duration(took),
                        go_duration(took)
                    ),
                );
                Ok(id)
            }
            Err(e) => {
                let delay = self
                    .backoff
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .next(&key, SystemTime::now());
                let message = format!("Failed to pull image \"{image}\": {e}");
                self.record(pod, EVENT_WARNING, "Failed", &message);
                self.record(pod, EVENT_WARNING, "Failed", "Error: ErrImagePull");
                Err(StartFailure {
                    reason: "ErrImagePull",
                    message,
                    retry_in: Some(delay),
                })
            }
        }
    }

    /// The credentials to try, in order, for a pull of `image` (normalized): those of the
    /// pod's `imagePullSecrets` (its ServiceAccount's when it named none: the ServiceAccount
    /// admission copied them on create) matched by the keyring, then the registries
    /// file's. Empty: pull without credentials. A secret that is missing or unreadable is a
    /// `FailedToRetrieveImagePullSecret` event and is skipped (`getPullSecretsForPod`).
    async fn pull_credentials(
        &self,
        pod: &Pod,
        image: &str,
    ) -> Result<Vec<crate::cri::api::AuthConfig>, String> {
        use crate::env::Lookup as _;
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        // The ServiceAccount's pull secrets are already here: the apiserver's ServiceAccount
        // admission copies them into a pod naming none (the node may not read accounts).
        let names: Vec<String> = spec
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        let mut secrets = Vec::new();
        let mut failed = Vec::new();
        for name in names {
            match self.lookup.secret(&namespace, &name).await {
                Ok(Some(secret)) => secrets.push((*secret).clone()),
                Ok(None) | Err(_) => failed.push(name),
            }
        }
        if !failed.is_empty() {
            self.record(
                pod,
                EVENT_WARNING,
                "FailedToRetrieveImagePullSecret",
                &format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        let keyring = keyring::Keyring::from_secrets(&secrets)?;
        let mut creds: Vec<_> = keyring
            .lookup(keyring::repository(image))
            .iter()
            .map(keyring::Credentials::auth_config)
            .collect();
        let registry = image.split('/').next().unwrap_or_default();
        creds.extend(self.config.registries.credentials(registry));
        Ok(creds)
    }

    /// `PullImage` with each credential in turn until one works (`pullImage` of
    /// `kuberuntime_image.go`); the errors of all, joined, when none does.
    async fn pull_with(
        &self,
        image: &str,
        creds: Vec<crate::cri::api::AuthConfig>,
    ) -> Result<String, String> {
        if creds.is_empty() {
            return self
                .cri
                .pull_image(image, None, None)
                .await
                .map_err(|e| e.to_string());
        }
        let mut errors = Vec::new();
        for auth in creds {
            match self.cri.pull_image(image, Some(auth), None).await {
                Ok(id) => return Ok(id),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        })
    }

    /// Starts one container (`startContainer`): backoff, image, config, create, start.
    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        pod: &Pod,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        c: &Container,
        pod_ips: &[String],
        rt: &RuntimePod,
        r: ContainerRef,
    ) -> Result<(), StartFailure> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let hash = container_hash(c);
        let latest = rt.latest(&c.name);
        // CrashLoopBackOff (`doBackOff`): only for a container that exited before.
        if let Some(l) = latest.filter(|l| l.exited()) {
            let key = container_key(&uid, &c.name, &hash);
            let finished =
                SystemTime::UNIX_EPOCH + Duration::from_nanos(l.finished_at.max(0) as u64);
            let now = SystemTime::now();
            let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(wait) = backoff.remaining(&key, finished, now) {
                let delay = backoff.delay(&key).unwrap_or_default();
                let message = format!(
                    "back-off {} restarting failed container={} pod={}_{}({uid})",
                    go_duration(delay),
                    c.name,
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                );
                self.record(
                    pod,
                    EVENT_WARNING,
                    "BackOff",
                    &format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        pod_name(pod)
                    ),
                );
                return Err(StartFailure {
                    reason: "CrashLoopBackOff",
                    message,
                    retry_in: Some(wait),
                });
            }
            backoff.next(&key, finished);
        }
        let restart_count = latest.map_or(0, |l| l.restart_count + 1);
        let image_ref = self.ensure_image(pod, c).await?;

        let config_error = |message: String| {
            self.record(pod, EVENT_WARNING, "Failed", &format!("Error: {message}"));
            StartFailure {
                reason: crate::env::REASON_CREATE_CONTAINER_CONFIG_ERROR,
                message,
                retry_in: None,
            }
        };
        let input = EnvInput {
            pod,
            container: c,
            pod_ips,
            host_ips: &self.config.node_ips,
            node_allocatable: &self.config.allocatable,
        };
        let env = if self.api_synced.load(std::sync::atomic::Ordering::SeqCst) {
            make_environment(input, &self.lookup).await
        } else {
            make_environment(input, &super::env_lookup::Offline(&self.lookup)).await
        }
        .map_err(|e| config_error(e.message))?;
        for ev in &env.events {
            self.record(pod, ev.type_, ev.reason, &ev.message);
        }
        let env_map = env.to_map();
        let (command, args) = crate::env::expand_command_and_args(c, &env_map);
        let mut mounts = self
            .volumes
            .container_mounts(pod, c, &env_map)
            .map_err(config_error)?;
        let pod_dir = self.pod_dir(&uid);
        if !mounts.iter().any(|m| m.container_path == "/etc/hosts") {
            mounts.push(ContainerMount {
                container_path: "/etc/hosts".to_string(),
                host_path: pod_dir.join(ETC_HOSTS_FILE),
                read_only: false,
            });
        }
        let message_path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| super::container::TERMINATION_MESSAGE_PATH_DEFAULT.to_string());
        let message_file = make_termination_message_file(&pod_dir, &c.name)
            .map_err(|e| config_error(format!("create the termination-message file: {e}")))?;
        mounts.push(ContainerMount {
            container_path: message_path,
            host_path: message_file,
            read_only: false,
        });
        let log_dir = Path::new(&sandbox_config.log_directory).join(&c.name);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| config_error(format!("create {}: {e}", log_dir.display())))?;
        let qos = sandbox::qos_class(pod);
        // The device plugins' part (`GetResources` -> `GetDeviceRunContainerOptions`), after
        // their `PreStartContainer` when they asked for it.
        let devices = match &self.config.resource_managers {
            Some(m) => {
                m.devices
                    .pre_start(&uid, &c.name)
                    .await
                    .map_err(config_error)?;
                m.device_options(&uid, &c.name)
            }
            None => None,
        };
        let mut config = container_config(&ContainerInput {
            pod,
            container: c,
            restart_count,
            image_ref: &image_ref,
            command,
            args,
            env: env.vars.clone(),
            mounts,
            qos: &qos,
            memory_capacity: self.config.memory_capacity,
            cgroup_host: self.config.cgroups.host(),
            hash,
            devices,
        });
        // The CPU manager's set (`PreCreateContainer`): its exclusive CPUs or the shared pool.
        let cpus = self
            .config
            .resource_managers
            .as_ref()
            .and_then(|m| m.cpuset_for(&uid, &c.name));
        if let Some(cpus) = &cpus
            && let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            r.cpuset_cpus = crate::checkpoint::cpu_manager::format_cpuset(cpus);
        }
        // The memory manager's NUMA nodes (`PreCreateContainer`'s `CpusetMems`).
        if let Some(mems) = self
            .config
            .resource_managers
            .as_ref()
            .and_then(|m| m.cpuset_mems_for(&uid, &c.name))
            && let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            r.cpuset_mems = mems;
        }
        let id = match self
            .cri
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
        {
            Ok(id) => {
                if let (Some(m), Some(cpus)) = (&self.config.resource_managers, &cpus) {
                    m.cpu.created(&id, cpus);
                }
                id
            }
            Err(e) => {
                let message = e.to_string();
                self.record(pod, EVENT_WARNING, "Failed", &format!("Error: {message}"));
                return Err(StartFailure {
                    reason: "CreateContainerError",
                    message,
                    retry_in: None,
                });
            }
        };
        self.record(
            pod,
            EVENT_NORMAL,
            "Created",
            &format!("Created container {}", c.name),
        );
        crate::metrics::metrics().container_started(match r.kind {
            Kind::Init => crate::metrics::INIT_CONTAINER,
            Kind::Regular => crate::metrics::CONTAINER,
        });
        if let Err(e) = self.cri.start_container(&id).await {
            let message = e.to_string();
            self.record(pod, EVENT_WARNING, "Failed", &format!("Error: {message}"));
            return Err(StartFailure {
                reason: "RunContainerError",
                message,
                retry_in: None,
            });
        }
        self.record(
            pod,
            EVENT_NORMAL,
            "Started",
            &format!("Started container {}", c.name),
        );
        info!(pod = %pod_name(pod), container = %c.name, kind = ?r.kind, restart_count, "container started");
        Ok(())
    }

    /// Stops one container: its preStop exec hook within the grace period, then CRI
    /// `StopContainer` with what is left of it (`killContainer`).
    async fn stop_container(&self, pod: &Pod, c: &runtime::RuntimeContainer, grace: Duration) {
        let started = Instant::now();
        let handler = c
            .pre_stop
            .as_deref()
            .and_then(|j| serde_json::from_str::<LifecycleHandler>(j).ok());
        if let Some(h) = handler.as_ref().and_then(|h| h.http_get.as_ref()) {
            match self.run_http_hook(pod, c, h, grace).await {
                Ok(None) => {}
                Ok(Some(host)) => self.record(
                    pod,
                    EVENT_WARNING,
                    "LifecycleHTTPFallback",
                    &format!(
                        "request to HTTPS lifecycle hook {host} got HTTP response, retry with HTTP succeeded"
                    ),
                ),
                Err(e) => self.record(pod, EVENT_WARNING, "FailedPreStopHook", &e),
            }
        }
        {
            if let Some(exec) = handler.and_then(|h| h.exec).and_then(|e| e.command) {
                let hook =
                    tokio::time::timeout(grace, self.cri.exec_sync(&c.id, exec, grace)).await;
                match hook {
                    Ok(Ok(r)) if r.exit_code == 0 => {}
                    Ok(Ok(r)) => self.record(
                        pod,
                        EVENT_WARNING,
                        "FailedPreStopHook",
                        &format!("PreStopHook failed: exit code {}", r.exit_code),
                    ),
                    Ok(Err(e)) => self.record(
                        pod,
                        EVENT_WARNING,
                        "FailedPreStopHook",
                        &format!("PreStopHook failed: {e}"),
                    ),
                    Err(_) => self.record(
                        pod,
                        EVENT_WARNING,
                        "FailedPreStopHook",
                        "PreStopHook failed: timed out",
                    ),
                }
            }
        }
        let left = grace.saturating_sub(started.elapsed()).max(MINIMUM_GRACE);
        self.record(
            pod,
            EVENT_NORMAL,
            "Killing",
            &format!("Stopping container {}", c.name),
        );
        if let Err(e) = self.cri.stop_container(&c.id, left).await
            && !e.is_not_found()
        {
            warn!(pod = %pod_name(pod), container = %c.name, error = %e, "stopping a container failed");
        }
    }

    /// A preStop `httpGet` (`lifecycle/handlers.go` `runHTTPHandler`): the port by number
    /// or by the container's port name, the host the pod's IP by default (the node's for a
    /// host-network pod), within `grace`; a failure is upstream's message
    /// (`HTTP lifecycle hook (<path>) for Container "c" in Pod "name_ns(uid)" failed -
    /// error: ...`); `Ok(Some(host))` when an HTTPS hook was answered over HTTP.
    async fn run_http_hook(
        &self,
        pod: &Pod,
        c: &runtime::RuntimeContainer,
        h: &k8s_openapi::api::core::v1::HTTPGetAction,
        grace: Duration,
    ) -> Result<Option<String>, String> {
        let spec = pod.spec.as_ref();
        let container = spec
            .into_iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|s| s.name == c.name)
            .cloned()
            .unwrap_or_else(|| Container {
                name: c.name.clone(),
                ..Default::default()
            });
        let fail = |e: String| {
            format!(
                "HTTP lifecycle hook ({}) for Container {:?} in Pod \"{}_{}({})\" failed - error: {e}",
                h.path.as_deref().unwrap_or_default(),
                c.name,
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.uid.as_deref().unwrap_or_default(),
            )
        };
        let pod_ip = if host_network(pod) {
            self.config.node_ips.first().cloned().unwrap_or_default()
        } else {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let rt = runtime::pod_status(&self.cri, &uid)
                .await
                .map_err(|e| fail(e.to_string()))?;
            rt.sandboxes
                .iter()
                .find_map(|s| s.ips.first().cloned())
                .ok_or_else(|| fail("failed to find networking container".to_string()))?
        };
        let port = super::prober::probe::port(&h.port, &container).map_err(fail)?;
        super::prober::probe::lifecycle_http_get(h, port, &pod_ip, grace)
            .await
            .map_err(fail)
    }

    async fn kill_running(&self, pod: &Pod, rt: &RuntimePod, grace: Duration) {
        let stops = rt
            .running()
            .map(|c| self.stop_container(pod, c, grace))
            .collect::<Vec<_>>();
        futures::future::join_all(stops).await;
    }

    /// Stops every container (in parallel, each with `grace`) and every sandbox of the pod.
    pub async fn kill_pod(&self, pod: &Pod, grace: Option<Duration>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.probes.remove_pod(&uid);
        self.release_admission(&uid);
        let rt = match runtime::pod_status(&self.cri, &uid).await {
            Ok(rt) => rt,
            Err(e) => {
                warn!(pod = %pod_name(pod), error = %e, "reading the pod to stop it failed");
                return;
            }
        };
        self.kill_running(pod, &rt, grace.unwrap_or(MINIMUM_GRACE))
            .await;
        for s in &rt.sandboxes {
            if let Err(e) = self.cri.stop_pod_sandbox(&s.id).await {
                warn!(pod = %pod_name(pod), error = %e, "stopping a sandbox failed");
            }
        }
    }

    /// Writes the status of a stopped pod: every container terminated, the phase final.
    pub async fn write_final_status(&self, pod: &Pod) {
        self.write_final_status_with(pod, |_| {}).await;
    }

    /// [`Kubelet::write_final_status`], the generated status changed by `adjust` before it
    /// is written (the eviction manager's `PodStatusFunc`: phase, reason, message, the
    /// `DisruptionTarget` condition).
    pub async fn write_final_status_with(&self, pod: &Pod, adjust: impl FnOnce(&mut PodStatus)) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Ok(rt) = runtime::pod_status(&self.cri, &uid).await else {
            return;
        };
        let mut input = self.status_input(pod, &rt);
        input.terminal = true;
        input.reasons.clear();
        let (exceeded, _) = self.deadline(pod);
        input.deadline_exceeded = exceeded;
        let mut status = status::generate(pod, &rt, &input);
        adjust(&mut status);
        if let Err(e) = self.set_status(pod, &status).await {
            warn!(pod = %pod_name(pod), error = %e, "writing the final status failed");
        }
    }

    /// Rewrites the running pod's configMap, secret, downwardAPI and projected volumes whose
    /// objects changed (through the atomic writer, so a reader sees the old or the new
    /// version whole), at most once per `--sync-frequency`: upstream's volume manager remounts
    /// these volumes at a pod's periodic sync (`ReprocessPod`, `RequiresRemount`). The first
    /// call after a start only notes the time: the volumes were just set up.
    async fn refresh_volumes(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let now = std::time::Instant::now();
        {
            let mut last = self
                .volumes_refreshed
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match last.get(&uid) {
                Some(at) if now.duration_since(*at) < self.config.sync_frequency => return,
                None => {
                    last.insert(uid, now);
                    return;
                }
                Some(_) => {
                    last.insert(uid.clone(), now);
                }
            }
        }
        if let Err(e) = self.volumes.refresh(pod).await {
            for f in &e.failures {
                let ev = f.event();
                self.record(pod, ev.type_, ev.reason, &ev.message);
            }
        }
    }

    /// Tears down a stopped pod's volumes (they are not needed once nothing runs).
    pub async fn release_volumes(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.volumes_refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        if let Err(e) = self.volumes.tear_down(&uid).await {
            warn!(pod = %pod_name(pod), error = %e, "tearing down volumes failed");
        }
    }

    /// Deletes a terminated pod from the API; returns whether that is done.
    pub async fn delete_from_api(&self, pod: &Pod) -> bool {
        match self.statuses.delete(pod).await {
            Ok(()) => true,
            Err(e) => {
                warn!(pod = %pod_name(pod), error = %e, "deleting the pod from the API failed");
                false
            }
        }
    }

    /// Removes everything of a pod gone from the API: its containers and sandboxes, its
    /// volumes, its directory, logs and cgroups, and what the kubelet remembered of it.
    pub async fn clean_up(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Ok(rt) = runtime::pod_status(&self.cri, &uid).await {
            for c in &rt.containers {
                let _ = self.cri.remove_container(&c.id).await;
            }
            for s in &rt.sandboxes {
                let _ = self.cri.stop_pod_sandbox(&s.id).await;
                if let Err(e) = self.cri.remove_pod_sandbox(&s.id).await {
                    warn!(pod = %pod_name(pod), error = %e, "removing a sandbox failed");
                }
            }
        }
        self.volumes_refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        match self.volumes.tear_down(&uid).await {
            Ok(()) => {
                let _ = tokio::fs::remove_dir_all(self.pod_dir(&uid)).await;
            }
            Err(e) => {
                warn!(pod = %pod_name(pod), error = %e, "tearing down volumes failed; the pod's directory stays")
            }
        }
        let _ = tokio::fs::remove_dir_all(sandbox::pod_logs_dir(&self.sandbox_env.logs_root, pod))
            .await;
        // Its containers are gone: its cgroup goes, and the QoS cgroups follow.
        if let Err(e) = self
            .config
            .cgroups
            .destroy_pod(&sandbox::qos_class(pod), &uid)
            .await
        {
            warn!(pod = %pod_name(pod), error = %e, "removing the pod's cgroup failed");
        }
        self.update_qos_cgroups();
        self.statuses.forget(&uid);
        self.probes.remove_pod(&uid);
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_prefix(&format!("{uid}/"));
        self.reasons
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        info!(pod = %pod_name(pod), "pod cleaned up");
    }

    /// Removes exited instances beyond the newest dead one of each container (upstream's
    /// container GC keeps `MaxPerPodContainer = 1` dead instance, for `logs --previous`).
    async fn gc_dead_containers(&self, rt: &RuntimePod) {
        let mut dead_seen: HashMap<&str, usize> = HashMap::new();
        for c in rt.containers.iter().filter(|c| c.exited()) {
            let n = dead_seen.entry(c.name.as_str()).or_default();
            *n += 1;
            if *n > 1 {
                match self.cri.remove_container(&c.id).await {
                    // Its logs go with it, rotated ones included (`removeContainerLog`).
                    Ok(()) if !c.log_path.is_empty() => {
                        let log = Path::new(&c.log_path);
                        super::log_rotation::remove_rotated(log);
                        let _ = std::fs::remove_file(log);
                    }
                    Ok(()) => {}
                    Err(e) => {
                        debug!(container = %c.id, error = %e, "removing a dead container failed");
                    }
                }
            }
        }
    }
}

/// The pull policy of a container that names none (the API's `SetDefaults_Container`):
/// `Always` for `:latest` or no tag (a digest alone counts as a tag), else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let last = name.rsplit('/').next().unwrap_or_default();
    if image.contains('@') {
        return if last.ends_with(":latest") {
            PULL_ALWAYS
        } else {
            PULL_IF_NOT_PRESENT
        };
    }
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => PULL_ALWAYS,
        Some(_) => PULL_IF_NOT_PRESENT,
    }
}

/// A duration as Go's `time.Duration.String` writes it (`1.234567s`, `250ms`): the text of
/// upstream's `Pulled` event.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    let (value, unit, scale) = if nanos < 1_000 {
        return format!("{nanos}ns");
    } else if nanos < 1_000_000 {
        (nanos, "µs", 1_000u128)
    } else if nanos < 1_000_000_000 {
        (nanos, "ms", 1_000_000)
    } else {
        let secs = nanos / 1_000_000_000;
        let frac = nanos % 1_000_000_000;
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        let frac = if frac == 0 {
            String::new()
        } else {
            format!(".{frac:09}").trim_end_matches('0').to_string()
        };
        return match (h, m) {
            (0, 0) => format!("{s}{frac}s"),
            (0, m) => format!("{m}m{s}{frac}s"),
            (h, m) => format!("{h}h{m}m{s}{frac}s"),
        };
    };
    let whole = value / scale;
    let frac = value % scale;
    let digits = scale.ilog10() as usize;
    let frac = if frac == 0 {
        String::new()
    } else {
        format!(".{frac:0digits$}")
            .trim_end_matches('0')
            .to_string()
    };
    format!("{whole}{frac}{unit}")
}

fn min(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The image backoff's failures are timed by the table itself: the last failure is `now`
/// minus nothing known, so [`super::backoff::Backoff::remaining`] measures from when
/// [`super::backoff::Backoff::next`] was called.
fn last_failure(backoff: &super::backoff::Backoff, key: &str, now: SystemTime) -> SystemTime {
    backoff.last_failure(key).unwrap_or(now)
}

/// Creates an empty, world-writable termination-message file for a container under the pod's
/// directory (`containers/<name>/<random>`, as upstream).
fn make_termination_message_file(pod_dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = pod_dir.join("containers").join(name);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{:08x}", rand::random::<u32>()));
    std::fs::write(&path, b"")?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    Ok(path)
}

/// A container's termination message: its file, bounded.
fn termination_message(c: &runtime::RuntimeContainer) -> Option<String> {
    use std::io::Read as _;
    let path = c.termination_message_host_path.as_ref()?;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_TERMINATION_MESSAGE)
        .read_to_end(&mut buf)
        .ok()?;
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(80)), "1m20s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_millis(1594)), "1.594s");
        assert_eq!(go_duration(Duration::from_millis(313)), "313ms");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(go_duration(Duration::from_secs(3725)), "1h2m5s");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn pull_policy_defaults_from_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("r.example:5000/busybox"), "Always");
        assert_eq!(
            default_pull_policy("r.example:5000/busybox:1"),
            "IfNotPresent"
        );
        assert_eq!(
            default_pull_policy(
                "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"
            ),
            "IfNotPresent"
        );
    }
}
