//! The scheduler: informers feeding the cache and the queue, and one loop of scheduling
//! cycles (Kubernetes' `pkg/scheduler/scheduler.go`, `schedule_one.go`, `eventhandlers.go`).
//!
//! A cycle, as kube-scheduler's `scheduleOne`:
//! 1. pop the next pod from the [`SchedulingQueue`] (highest priority, then oldest);
//! 2. bring the cycle's snapshot up to date from the [`Cache`] — only the NodeInfos whose
//!    generation moved are cloned, so the cache's lock is held for microseconds and the rest of
//!    the cycle reads the snapshot without any lock (`docs/tricks.md` #1);
//! 3. run the [`Algorithm`]: PreFilter, Filter over a sample of the nodes from a rotating
//!    start (`docs/tricks.md` #2, 50 - N/125), PreScore, Score, and a uniformly random pick among
//!    the best;
//! 4. no node: PostFilter, i.e. preemption (remove every victim, then reprieve), then a
//!    `FailedScheduling` event, a `PodScheduled=False` condition, and the pod back to the queue
//!    as unschedulable until a relevant cluster event;
//! 5. a node: **assume** the pod there in the cache (the next cycle already sees the room it
//!    takes), then **bind asynchronously** — a task posts `pods/<name>/binding` while the loop
//!    moves on to the next pod. A failed bind forgets the assumed pod and requeues it.
//!
//! The loop runs on its own OS thread: a cycle is CPU work of a millisecond or so, which would
//! otherwise hold a tokio worker that informers and binds need. Only the loop touches the
//! [`Algorithm`] (snapshot, start index), so it needs no lock.
//!
//! Informer handlers (each on its own thread, fed by its own ring): unassigned pods with
//! this scheduler's name go to the queue; assigned pods and nodes go to the cache, and their
//! changes are cluster events that move unschedulable pods back to the active queue.
//! PodDisruptionBudgets feed preemption; Namespaces feed inter-pod affinity's namespace
//! selectors. The scheduler's pod informer sees every pod and drops terminal ones itself
//! (kube-scheduler's informer has a `status.phase` field selector for that).

pub mod algorithm;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use skerry_client::api::http_method::Method;
use skerry_client::events::{
    EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING, EventRecorder, EventWriter, RecorderOptions,
    object_reference,
};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::leaderelection::{Callbacks, LeaderElectionConfig, LeaderElector, RunOutcome};
use skerry_client::{Client, Patch, PatchParams};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use algorithm::{
    Algorithm, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND, MIN_FEASIBLE_NODES_TO_FIND, NoNominatedPods,
    NominatedPods, PARALLELISM_MAX, PERCENTAGE_ADAPTIVE, ScheduleError, ScheduleResult,
    num_feasible_nodes_to_find, select_host,
};

use crate::cache::{Cache, DURATION_TO_EXPIRE_ASSUMED_POD};
use crate::framework::runtime::Framework;
use crate::framework::{CycleState, PodInfo};
use crate::metrics::{self, AttemptResult};
use crate::plugins::{self, interpodaffinity, podtopologyspread};
use crate::preemption::{self, FrameworkRunner, PreemptionArgs, Preemptor};
use crate::queue::{
    ClusterEvent, QueueConfig, QueuedPodInfo, SchedulingQueue, node_scheduling_properties_change,
    pod_scheduling_properties_change, queue_key,
};

/// The name of the default profile, matched against `spec.schedulerName` (Kubernetes'
/// `v1.DefaultSchedulerName`); also the events' reporting component.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// The Lease kube-scheduler elects its leader on (`kube-system/kube-scheduler`); the
/// bootstrap RBAC role lets `system:kube-scheduler` get and update exactly this one.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// See [`LEASE_NAMESPACE`].
pub const LEASE_NAME: &str = "kube-scheduler";

/// The default number of threads a cycle filters on. Kubernetes uses 16 goroutines; skerry's
/// appliance nodes have 2 cores that the apiserver and controllers share. Measured on such a
/// box (`algorithm::tests::filter_parallelism_cost`, release build, default plugins, one
/// cycle): 500 nodes 0.20 ms on 1 thread vs 0.34 ms on 2; 5,000 nodes (500 feasible sought)
/// 0.50 ms vs 0.72 ms. Starting the scoped threads each cycle costs more than the filtering
/// they share, so the default filters on the calling thread; more threads pay only with more
/// cores and heavier filters.
pub const DEFAULT_PARALLELISM: usize = 1;

/// Binds in flight at once. The cycle waits for a slot when this many binding requests are
/// outstanding, so a slow apiserver slows scheduling down instead of piling up tasks and
/// assumed pods without bound. 1,024: far above what the apiserver answers concurrently, so it
/// never limits a healthy cluster; each slot holds one small task. Semi-arbitrary.
pub const BINDS_IN_FLIGHT_MAX: usize = 1_024;

/// Kubernetes' `validation.NoteLengthLimit`: an event message longer than this is truncated
/// (a FailedScheduling message lists one reason per filter, which grows with the plugins).
pub const EVENT_MESSAGE_LENGTH_MAX: usize = 1_024;

/// The longest the scheduler waits for its informer handlers to take in the first lists
/// before it schedules anyway. Taking in a list is memory work, milliseconds for thousands of
/// objects; 30 s only guards against a handler that never catches up.
pub const HANDLERS_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the handlers' progress is checked meanwhile.
const HANDLERS_SYNC_POLL: Duration = Duration::from_millis(10);

/// The reason of a `PodScheduled=False` condition when no node fits (`v1.PodReasonUnschedulable`).
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";
/// The reason when the scheduler itself failed (`v1.PodReasonSchedulerError`).
pub const REASON_SCHEDULER_ERROR: &str = "SchedulerError";

/// The event reason when no node fits.
pub const EVENT_FAILED_SCHEDULING: &str = "FailedScheduling";
/// The event reason when a pod was bound.
pub const EVENT_SCHEDULED: &str = "Scheduled";

/// Called once per finished attempt (for benchmarks and tests).
pub type AttemptObserver = Arc<dyn Fn(&Attempt) + Send + Sync>;

/// One finished scheduling attempt.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// `namespace/name`.
    pub pod: String,
    /// Scheduled, unschedulable or error.
    pub result: AttemptResult,
    /// From the start of the cycle to the end of the attempt (the bind's answer, for a
    /// scheduled pod): kube-scheduler's `scheduling_attempt_duration_seconds`.
    pub duration: Duration,
    /// The node, when scheduled.
    pub node: Option<String>,
    /// Attempts so far for this pod, this one included.
    pub attempts: u32,
}

/// Why a [`Config`] was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `percentage_of_nodes_to_score` above 100.
    #[error("percentageOfNodesToScore must be in [0, 100], got {0}")]
    Percentage(u32),
    /// `parallelism` of 0 or above [`PARALLELISM_MAX`].
    #[error("parallelism must be in [1, {PARALLELISM_MAX}], got {0}")]
    Parallelism(usize),
    /// `binds_in_flight_max` of 0.
    #[error("binds_in_flight_max must be at least 1")]
    BindsInFlight,
    /// An empty scheduler name.
    #[error("scheduler_name must not be empty")]
    SchedulerName,
    /// The queue's configuration.
    #[error("queue: {0}")]
    Queue(String),
    /// Preemption's configuration.
    #[error("preemption: {0}")]
    Preemption(String),
}

/// The scheduler's tunables (a slice of kube-scheduler's `KubeSchedulerConfiguration`).
#[derive(Clone)]
pub struct Config {
    /// The profile: pods whose `spec.schedulerName` is this are ours.
    pub scheduler_name: String,
    /// `percentageOfNodesToScore`: 0 is adaptive (`50 - N/125`, at least 5 %); 100 filters
    /// every node. Lower is faster on large clusters and spreads less well.
    pub percentage_of_nodes_to_score: u32,
    /// Threads a cycle filters on (see [`DEFAULT_PARALLELISM`]).
    pub parallelism: usize,
    /// See [`BINDS_IN_FLIGHT_MAX`].
    pub binds_in_flight_max: usize,
    /// The queue's backoffs and flush periods.
    pub queue: QueueConfig,
    /// Preemption's candidate sampling.
    pub preemption: PreemptionArgs,
    /// Seeds the tie-breaking and preemption offsets (tests); `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Told of every finished attempt.
    pub attempt_observer: Option<AttemptObserver>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("scheduler_name", &self.scheduler_name)
            .field(
                "percentage_of_nodes_to_score",
                &self.percentage_of_nodes_to_score,
            )
            .field("parallelism", &self.parallelism)
            .field("binds_in_flight_max", &self.binds_in_flight_max)
            .field("queue", &self.queue)
            .field("preemption", &self.preemption)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_string(),
            percentage_of_nodes_to_score: PERCENTAGE_ADAPTIVE,
            parallelism: DEFAULT_PARALLELISM,
            binds_in_flight_max: BINDS_IN_FLIGHT_MAX,
            queue: QueueConfig::default(),
            preemption: PreemptionArgs::default(),
            seed: None,
            attempt_observer: None,
        }
    }
}

impl Config {
    /// Checks every tunable's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.percentage_of_nodes_to_score > 100 {
            return Err(ConfigError::Percentage(self.percentage_of_nodes_to_score));
        }
        if self.parallelism == 0 || self.parallelism > PARALLELISM_MAX {
            return Err(ConfigError::Parallelism(self.parallelism));
        }
        if self.binds_in_flight_max == 0 {
            return Err(ConfigError::BindsInFlight);
        }
        if self.scheduler_name.is_empty() {
            return Err(ConfigError::SchedulerName);
        }
        self.queue
            .validate()
            .map_err(|e| ConfigError::Queue(e.to_string()))?;
        self.preemption
            .validate()
            .map_err(ConfigError::Preemption)?;
        Ok(())
    }
}

/// Counters of what the scheduler did, readable at any time (benchmarks, tests).
#[derive(Debug, Default)]
pub struct Stats {
    scheduled: AtomicU64,
    unschedulable: AtomicU64,
    errors: AtomicU64,
    bind_failures: AtomicU64,
    preemptions: AtomicU64,
    cycles: AtomicU64,
}

impl Stats {
    /// Pods bound.
    pub fn scheduled(&self) -> u64 {
        self.scheduled.load(Ordering::Relaxed)
    }
    /// Attempts that found no node.
    pub fn unschedulable(&self) -> u64 {
        self.unschedulable.load(Ordering::Relaxed)
    }
    /// Attempts that failed on an internal error (failed binds included).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// Binds the apiserver refused.
    pub fn bind_failures(&self) -> u64 {
        self.bind_failures.load(Ordering::Relaxed)
    }
    /// Preemptions started (a node nominated and victims deleted).
    pub fn preemptions(&self) -> u64 {
        self.preemptions.load(Ordering::Relaxed)
    }
    /// Scheduling cycles run.
    pub fn cycles(&self) -> u64 {
        self.cycles.load(Ordering::Relaxed)
    }
}

/// Where the pod's nomination goes after a failed cycle.
enum Nominating {
    /// Leave it as it is.
    Keep,
    /// Preemption chose this node.
    Node(String),
    /// Preemption found nothing: an old nomination is stale.
    Clear,
}

/// A scheduler for one profile.
pub struct Scheduler {
    client: Client,
    config: Config,
    framework: Arc<Framework>,
    cache: Arc<Cache>,
    queue: Arc<SchedulingQueue>,
    recorder: EventRecorder,
    /// The recorder's writer, spawned by `run`. A mutex only to take it out once.
    event_writer: Mutex<Option<EventWriter>>,
    pods: SharedInformer<Pod>,
    nodes: SharedInformer<Node>,
    pdbs: SharedInformer<PodDisruptionBudget>,
    namespaces: SharedInformer<Namespace>,
    /// Namespace labels by name, shared with InterPodAffinity (its lock is the plugin's).
    namespace_labels: interpodaffinity::NamespaceLabelsHandle,
    /// Slots for binds in flight (see [`BINDS_IN_FLIGHT_MAX`]). A semaphore because the
    /// scheduling loop waits for a slot and each bind task gives one back when it ends.
    binds: Arc<Semaphore>,
    stats: Stats,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("framework", &self.framework)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Whether the pod is bound (or assumed) to a node.
fn assigned(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// Whether the pod has finished (`Succeeded` or `Failed`): the scheduler ignores it, as
/// kube-scheduler's informer does with its `status.phase` field selector.
fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn scheduler_name_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_SCHEDULER_NAME)
}

fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// `message`, cut to [`EVENT_MESSAGE_LENGTH_MAX`] with " ..." as Kubernetes'
/// `truncateMessage` (at a character boundary).
pub fn truncate_message(message: &str) -> String {
    if message.len() <= EVENT_MESSAGE_LENGTH_MAX {
        return message.to_string();
    }
    const SUFFIX: &str = " ...";
    let mut end = EVENT_MESSAGE_LENGTH_MAX - SUFFIX.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{SUFFIX}", &message[..end])
}

/// The strategic-merge patch that sets the pod's `PodScheduled=False` condition (and clears
/// its nomination if asked), or `None` when the pod already says exactly that (Kubernetes'
/// `updatePod` skips such writes: a pod retried every few seconds would otherwise rewrite its
/// status each time).
pub fn pod_scheduled_false_patch(
    pod: &Pod,
    reason: &str,
    message: &str,
    clear_nominated_node_name: bool,
) -> Option<Value> {
    let status = pod.status.as_ref();
    let current = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
    let condition_same = current.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(message)
    });
    let has_nomination = status
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let clear = clear_nominated_node_name && has_nomination;
    if condition_same && !clear {
        return None;
    }
    // The transition time moves only when the status does.
    let transition = match current {
        Some(c) if c.status == "False" => c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| Timestamp::now().to_string()),
        _ => Timestamp::now().to_string(),
    };
    let mut patch = json!({"status": {"conditions": [{
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": null,
        "lastTransitionTime": transition,
    }]}});
    if clear {
        patch["status"]["nominatedNodeName"] = Value::Null;
    }
    Some(patch)
}

/// The v1 Binding that assigns `pod` to `node`.
pub fn binding_body(pod: &Pod, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": pod.metadata.name,
            "namespace": pod.metadata.namespace,
            "uid": pod.metadata.uid,
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })
}

/// The queue's nominator as Filter reads it.
struct QueueNominator<'a>(&'a SchedulingQueue);

impl NominatedPods for QueueNominator<'_> {
    fn nominated_pods_for_node(&self, node: &str) -> Vec<Arc<PodInfo>> {
        self.0.nominated_pods_for_node(node)
    }
    fn has_nominated_pods(&self) -> bool {
        self.0.has_nominated_pods()
    }
}

impl crate::metrics::PendingPods for SchedulingQueue {
    fn pending_pods(&self) -> Vec<(&'static str, i64)> {
        SchedulingQueue::pending_pods(self)
            .samples()
            .iter()
            .map(|(queue, count)| (*queue, i64::try_from(*count).unwrap_or(i64::MAX)))
            .collect()
    }
}

impl Scheduler {
    /// A scheduler reading and writing through `client` (identity `system:kube-scheduler` in
    /// a real cluster), with Kubernetes' default plugins. Nothing runs until [`Self::run`].
    pub fn new(client: Client, config: Config) -> Result<Arc<Scheduler>, ConfigError> {
        config.validate()?;
        let namespace_labels: interpodaffinity::NamespaceLabelsHandle = Arc::default();
        // Kubernetes' default profile. PodTopologySpread and InterPodAffinity come after
        // NodeResourcesFit (default_plugins ends its Filter list there; the Score order does
        // not matter) unless default_plugins already has them; InterPodAffinity reads the
        // namespace labels this scheduler's Namespace informer keeps.
        let mut profile = plugins::default_plugins();
        let has = |profile: &plugins::Plugins, name: &str| {
            profile.filter.iter().any(|p| p.name() == name)
        };
        if !has(&profile, podtopologyspread::NAME) {
            profile = profile.with(podtopologyspread::PodTopologySpread::default());
        }
        if !has(&profile, interpodaffinity::NAME) {
            profile = profile.with(interpodaffinity::InterPodAffinity::new(
                namespace_labels.clone(),
            ));
        }
        let framework = Arc::new(Framework::new(
            &config.scheduler_name,
            profile.pre_filter,
            profile.filter,
            profile.pre_score,
            profile.score,
        ));
        Ok(Scheduler::with_framework(
            client,
            config,
            framework,
            namespace_labels,
        ))
    }

    /// A scheduler running `framework`'s plugins (benchmarks and tests choose their own).
    /// `namespace_labels` is kept up to date from the Namespace informer.
    ///
    /// # Panics
    /// If `config` does not [`Config::validate`].
    pub fn with_framework(
        client: Client,
        config: Config,
        framework: Arc<Framework>,
        namespace_labels: interpodaffinity::NamespaceLabelsHandle,
    ) -> Arc<Scheduler> {
        assert_eq!(config.validate(), Ok(()), "invalid scheduler configuration");
        let cache = Arc::new(Cache::new(DURATION_TO_EXPIRE_ASSUMED_POD));
        let queue = Arc::new(SchedulingQueue::new(config.queue.clone()));
        let (recorder, writer) = EventRecorder::with_options(
            client.clone(),
            RecorderOptions::new(&config.scheduler_name),
        );
        let pods = SharedInformer::new(client.api::<Pod>(None), None);
        let nodes = SharedInformer::new(client.api::<Node>(None), None);
        let pdbs = SharedInformer::new(client.api::<PodDisruptionBudget>(None), None);
        let namespaces = SharedInformer::new(client.api::<Namespace>(None), None);
        pods.add_handler(PodHandler {
            cache: cache.clone(),
            queue: queue.clone(),
            scheduler_name: config.scheduler_name.clone(),
        });
        nodes.add_handler(NodeHandler {
            cache: cache.clone(),
            queue: queue.clone(),
        });
        namespaces.add_handler(NamespaceHandler {
            labels: namespace_labels.clone(),
        });
        let binds = Arc::new(Semaphore::new(config.binds_in_flight_max));
        let scheduler = Arc::new(Scheduler {
            client,
            config,
            framework,
            cache,
            queue,
            recorder,
            event_writer: Mutex::new(Some(writer)),
            pods,
            nodes,
            pdbs,
            namespaces,
            namespace_labels,
            binds,
            stats: Stats::default(),
        });
        let pending: Arc<dyn metrics::PendingPods> = scheduler.queue.clone();
        metrics::watch_pending_pods(Arc::downgrade(&pending));
        scheduler
    }

    /// What the scheduler did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The scheduling queue (pending counts, nominations).
    pub fn queue(&self) -> &Arc<SchedulingQueue> {
        &self.queue
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The profile's plugins.
    pub fn framework(&self) -> &Arc<Framework> {
        &self.framework
    }

    /// Starts the informers, waits for their first lists, then schedules until `stop`.
    /// Returns once the scheduling loop has ended (binds still in flight finish on their
    /// own).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        if let Some(writer) = self.event_writer.lock().take() {
            tokio::spawn(writer.run());
        }
        self.pods.run(stop.clone());
        self.nodes.run(stop.clone());
        self.pdbs.run(stop.clone());
        self.namespaces.run(stop.clone());
        for (name, synced) in [
            ("pods", self.pods.wait_for_sync(&stop).await),
            ("nodes", self.nodes.wait_for_sync(&stop).await),
            ("poddisruptionbudgets", self.pdbs.wait_for_sync(&stop).await),
            ("namespaces", self.namespaces.wait_for_sync(&stop).await),
        ] {
            if !synced {
                info!(
                    informer = name,
                    "scheduler stopped before its caches synced"
                );
                self.queue.close();
                self.recorder.shutdown();
                return;
            }
        }
        if !self.wait_for_handlers_sync(&stop).await {
            self.queue.close();
            self.recorder.shutdown();
            return;
        }
        info!(profile = %self.config.scheduler_name, "scheduler caches synced; scheduling");

        let queue = self.queue.clone();
        let queue_stop = stop.clone();
        tokio::spawn(async move { queue.run(queue_stop).await });
        tokio::spawn(self.cache.clone().run_cleanup(stop.clone()));

        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let this = self.clone();
        let handle = Handle::current();
        let loop_stop = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("scheduler-loop".to_string())
            .spawn(move || {
                this.scheduling_loop(&handle, &loop_stop);
                let _ = done_tx.send(());
            });
        if let Err(e) = spawned {
            error!(error = %e, "cannot start the scheduling loop thread");
            self.queue.close();
            return;
        }
        stop.cancelled().await;
        // Wakes the loop if it waits for a pod.
        self.queue.close();
        let _ = done_rx.await;
        self.recorder.flush().await;
        info!(profile = %self.config.scheduler_name, "scheduler stopped");
    }

    /// Waits until the handlers have caught up with the informers' first lists: the cache
    /// holds every node and every assigned pod the informers hold, and the namespace labels
    /// every namespace (client-go's `WaitForHandlersSync`). An informer is synced once its
    /// store has the first list, but its handlers get it asynchronously; a cycle run before
    /// they caught up would see too few nodes, or nodes emptier than they are. Counts are
    /// compared, not keys: both sides converge, so equal counts mean the handler caught up.
    /// Gives up (and schedules anyway) after [`HANDLERS_SYNC_TIMEOUT`]; `false` on `stop`.
    async fn wait_for_handlers_sync(&self, stop: &CancellationToken) -> bool {
        let deadline = Instant::now() + HANDLERS_SYNC_TIMEOUT;
        loop {
            let nodes = self.nodes.store().list().len();
            let pods = self
                .pods
                .store()
                .list()
                .iter()
                .filter(|p| assigned(p) && !terminal(p))
                .count();
            let namespaces = self.namespaces.store().list().len();
            if self.cache.node_count() >= nodes
                && self.cache.pod_count() >= pods
                && self.namespace_labels.read().len() >= namespaces
            {
                return true;
            }
            if Instant::now() >= deadline {
                warn!(
                    nodes,
                    pods,
                    cached_nodes = self.cache.node_count(),
                    cached_pods = self.cache.pod_count(),
                    "scheduler: handlers did not catch up with the informers; scheduling anyway"
                );
                return true;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(HANDLERS_SYNC_POLL) => {}
            }
        }
    }

    /// Pops and schedules pods until the queue closes or `stop`.
    fn scheduling_loop(self: &Arc<Self>, handle: &Handle, stop: &CancellationToken) {
        let mut algorithm = Algorithm::new(
            self.framework.clone(),
            self.config.percentage_of_nodes_to_score,
            self.config.parallelism,
            self.config.seed,
        );
        let mut rng = match self.config.seed {
            Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(1)),
            None => StdRng::from_os_rng(),
        };
        loop {
            // `stop` wakes the loop too: the runtime may be shutting down without `run`
            // getting to close the queue.
            let popped = handle.block_on(async {
                tokio::select! {
                    popped = self.queue.pop() => popped,
                    () = stop.cancelled() => None,
                }
            });
            let Some(queued) = popped else { break };
            if stop.is_cancelled() {
                break;
            }
            let cycle = self.queue.scheduling_cycle();
            self.schedule_one(&mut algorithm, &mut rng, queued, cycle, handle);
        }
    }

    /// One cycle for one pod (Kubernetes' `ScheduleOne`).
    fn schedule_one(
        self: &Arc<Self>,
        algorithm: &mut Algorithm,
        rng: &mut StdRng,
        queued: QueuedPodInfo,
        cycle: i64,
        handle: &Handle,
    ) {
        let start = Instant::now();
        self.stats.cycles.fetch_add(1, Ordering::Relaxed);
        let pod = queued.pod().clone();
        if pod.metadata.deletion_timestamp.is_some() {
            self.recorder.event(
                &object_reference(pod.as_ref()),
                EVENT_TYPE_WARNING,
                EVENT_FAILED_SCHEDULING,
                &format!("skip schedule deleting pod: {}", queue_key(&pod)),
            );
            self.queue.done(pod_uid(&pod));
            return;
        }
        // Updated while its earlier cycle was assuming it: already placed.
        if self.cache.is_assumed_pod(&pod) {
            self.queue.done(pod_uid(&pod));
            return;
        }

        self.cache.update_snapshot(algorithm.snapshot_mut());
        let mut state = CycleState::default();
        let outcome =
            algorithm.schedule_pod(&mut state, &queued.pod_info, &QueueNominator(&self.queue));
        metrics::observe_algorithm(start.elapsed());
        match outcome {
            Ok(result) => {
                debug!(
                    pod = %queue_key(&pod),
                    node = %result.suggested_host,
                    evaluated = result.evaluated_nodes,
                    feasible = result.feasible_nodes,
                    "scheduled"
                );
                self.assume_and_bind(queued, cycle, result.suggested_host, start, handle);
            }
            Err(ScheduleError::Fit(mut fit)) => {
                let nominating =
                    self.post_filter(&state, &queued, algorithm, &mut fit.diagnosis, rng, handle);
                let plugins = fit
                    .diagnosis
                    .unschedulable_plugins
                    .iter()
                    .map(|p| p.to_string())
                    .collect();
                self.handle_failure(
                    queued,
                    cycle,
                    AttemptResult::Unschedulable,
                    &fit.to_string(),
                    plugins,
                    start,
                    nominating,
                    handle,
                );
            }
            Err(error @ ScheduleError::NoNodesAvailable) => {
                debug!(pod = %queue_key(&pod), "no nodes are registered; waiting");
                self.handle_failure(
                    queued,
                    cycle,
                    AttemptResult::Unschedulable,
                    &error.to_string(),
                    BTreeSet::new(),
                    start,
                    Nominating::Clear,
                    handle,
                );
            }
            Err(error @ ScheduleError::Internal(_)) => {
                error!(pod = %queue_key(&pod), error = %error, "error selecting a node for the pod");
                self.handle_failure(
                    queued,
                    cycle,
                    AttemptResult::Error,
                    &error.to_string(),
                    BTreeSet::new(),
                    start,
                    Nominating::Clear,
                    handle,
                );
            }
        }
    }

    /// PostFilter: preemption. Chooses a node and victims on the snapshot; the API calls
    /// (victims deleted, the preemptor nominated) run in a task. Records the outcome's message
    /// in `diagnosis` and says what becomes of the pod's nomination.
    fn post_filter(
        &self,
        state: &CycleState,
        queued: &QueuedPodInfo,
        algorithm: &Algorithm,
        diagnosis: &mut crate::framework::runtime::Diagnosis,
        rng: &mut StdRng,
        handle: &Handle,
    ) -> Nominating {
        let pdbs = self.pdbs.store().list();
        let nominated = |node: &str| self.queue.nominated_pods_for_node(node);
        let runner = FrameworkRunner::new(&self.framework).with_nominated_pods(&nominated);
        let preemptor = Preemptor::new(&runner, &pdbs).with_args(self.config.preemption);
        match preemptor.preempt(
            state,
            &queued.pod_info,
            algorithm.snapshot(),
            diagnosis,
            rng,
        ) {
            Ok(result) => {
                self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
                let nominated_to_node: Vec<Arc<Pod>> = self
                    .queue
                    .nominated_pods_for_node(&result.node)
                    .iter()
                    .map(|p| p.pod.clone())
                    .collect();
                let client = self.client.clone();
                let recorder = self.recorder.clone();
                let preemptor_pod = queued.pod().clone();
                let node = result.node.clone();
                // `preemption::execute`'s future is not `Send` (a stream over borrowed
                // victims), so it runs to completion on a blocking-pool thread rather than a
                // task; preemptions are rare and their API calls short.
                let runtime = handle.clone();
                handle.spawn_blocking(move || {
                    let outcome = runtime.block_on(preemption::execute(
                        &client,
                        Some(&recorder),
                        &preemptor_pod,
                        &result,
                        &nominated_to_node,
                    ));
                    if let Err(e) = outcome {
                        warn!(pod = %queue_key(&preemptor_pod), error = %e, "preemption failed");
                    }
                });
                Nominating::Node(node)
            }
            Err(failure) => {
                if !failure.status.is_rejected() {
                    warn!(
                        pod = %queue_key(queued.pod()),
                        status = %failure.status.reasons.join(", "),
                        "preemption error"
                    );
                }
                diagnosis.post_filter_msg = Some(failure.status.reasons.join(", "));
                if failure.clear_nominated_node_name {
                    Nominating::Clear
                } else {
                    Nominating::Keep
                }
            }
        }
    }

    /// Assumes the pod on `host` and starts its bind (Kubernetes' `assume` + `bindingCycle`).
    fn assume_and_bind(
        self: &Arc<Self>,
        queued: QueuedPodInfo,
        cycle: i64,
        host: String,
        start: Instant,
        handle: &Handle,
    ) {
        let pod = queued.pod().clone();
        let mut assumed_pod = (*pod).clone();
        assumed_pod
            .spec
            .get_or_insert_with(Default::default)
            .node_name = Some(host.clone());
        let assumed_pod = Arc::new(assumed_pod);
        let assumed_info = Arc::new(PodInfo {
            pod: assumed_pod.clone(),
            ..(*queued.pod_info).clone()
        });
        if let Err(e) = self.cache.assume_pod(assumed_info) {
            // A bug in the retry logic (Kubernetes says the same): retry the pod later.
            error!(pod = %queue_key(&pod), error = %e, "cannot assume the pod");
            self.handle_failure(
                queued,
                cycle,
                AttemptResult::Error,
                &e.to_string(),
                BTreeSet::new(),
                start,
                Nominating::Clear,
                handle,
            );
            return;
        }
        // A nominated pod that found a home no longer reserves room elsewhere.
        self.queue.delete_nominated_pod(&pod);

        // Wait for a bind slot: back-pressure on a slow apiserver.
        let permit = match handle.block_on(self.binds.clone().acquire_owned()) {
            Ok(permit) => permit,
            Err(_) => return, // closed: never, the semaphore lives as long as the scheduler
        };
        let scheduler = self.clone();
        handle.spawn(async move {
            let _permit = permit;
            scheduler
                .binding_cycle(queued, cycle, assumed_pod, host, start)
                .await;
        });
    }

    /// Binds the assumed pod (Kubernetes' `bindingCycle` with the DefaultBinder): POST
    /// `pods/<name>/binding`. On success the pod's cycle is done and a `Scheduled` event says
    /// where it went; on failure the assumed pod is forgotten (its room is free again, which
    /// may help other unschedulable pods) and the pod is retried.
    async fn binding_cycle(
        self: Arc<Self>,
        queued: QueuedPodInfo,
        cycle: i64,
        assumed_pod: Arc<Pod>,
        host: String,
        start: Instant,
    ) {
        let pod = queued.pod().clone();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let result = self
            .client
            .api::<Pod>(pod.metadata.namespace.as_deref())
            .subresource(
                Method::Post,
                name,
                "binding",
                Some(&binding_body(&pod, &host)),
            )
            .await;
        if let Err(e) = self.cache.finish_binding(&assumed_pod) {
            error!(pod = %queue_key(&pod), error = %e, "cache: finish binding");
        }
        match result {
            Ok(_) => {
                self.queue.done(pod_uid(&pod));
                let duration = start.elapsed();
                self.stats.scheduled.fetch_add(1, Ordering::Relaxed);
                metrics::observe_attempt(
                    &self.config.scheduler_name,
                    AttemptResult::Scheduled,
                    duration,
                );
                if let Some(first) = queued.initial_attempt_timestamp {
                    metrics::observe_pod_scheduled(queued.attempts, first.elapsed());
                }
                self.recorder.event(
                    &object_reference(pod.as_ref()),
                    EVENT_TYPE_NORMAL,
                    EVENT_SCHEDULED,
                    &format!("Successfully assigned {} to {host}", queue_key(&pod)),
                );
                self.observe(&queued, AttemptResult::Scheduled, duration, Some(host));
            }
            Err(e) => {
                self.stats.bind_failures.fetch_add(1, Ordering::Relaxed);
                warn!(pod = %queue_key(&pod), node = %host, error = %e, "binding rejected");
                if let Err(e) = self.cache.forget_pod(&assumed_pod) {
                    error!(pod = %queue_key(&pod), error = %e, "cannot forget the assumed pod");
                }
                // The assumed pod's room is free again.
                self.queue
                    .move_all_to_active_or_backoff(ClusterEvent::ASSIGNED_POD_DELETE);
                let handle = Handle::current();
                self.handle_failure(
                    queued,
                    cycle,
                    AttemptResult::Error,
                    &format!("binding rejected: {e}"),
                    BTreeSet::new(),
                    start,
                    Nominating::Clear,
                    &handle,
                );
            }
        }
    }

    /// Tells the observer, if any.
    fn observe(
        &self,
        queued: &QueuedPodInfo,
        result: AttemptResult,
        duration: Duration,
        node: Option<String>,
    ) {
        if let Some(observer) = &self.config.attempt_observer {
            observer(&Attempt {
                pod: queued.key(),
                result,
                duration,
                node,
                attempts: queued.attempts,
            });
        }
    }

    /// A failed attempt (Kubernetes' `handleSchedulingFailure`): metrics, the pod back to the
    /// queue (unless it was deleted or bound meanwhile), its nomination, a `FailedScheduling`
    /// event and the `PodScheduled=False` condition.
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors Kubernetes' failure handler"
    )]
    fn handle_failure(
        &self,
        mut queued: QueuedPodInfo,
        cycle: i64,
        result: AttemptResult,
        message: &str,
        unschedulable_plugins: BTreeSet<String>,
        start: Instant,
        nominating: Nominating,
        handle: &Handle,
    ) {
        let duration = start.elapsed();
        match result {
            AttemptResult::Error => self.stats.errors.fetch_add(1, Ordering::Relaxed),
            _ => self.stats.unschedulable.fetch_add(1, Ordering::Relaxed),
        };
        metrics::observe_attempt(&self.config.scheduler_name, result, duration);
        self.observe(&queued, result, duration, None);

        let pod = queued.pod().clone();
        let key = queue_key(&pod);
        // The informer's copy says whether the pod still waits for us.
        match self.pods.store().get(&key) {
            None => {
                debug!(pod = %key, "pod no longer exists; not requeued");
                self.queue.done(pod_uid(&pod));
            }
            Some(cached) if assigned(&cached) => {
                debug!(pod = %key, "pod was bound meanwhile; not requeued");
                self.queue.done(pod_uid(&pod));
            }
            Some(cached) => {
                if !Arc::ptr_eq(&cached, &pod) {
                    queued.pod_info = Arc::new(PodInfo::new(cached));
                }
                queued.unschedulable_plugins = unschedulable_plugins;
                let pod_info = queued.pod_info.clone();
                if let Err(e) = self.queue.add_unschedulable_if_not_present(queued, cycle) {
                    error!(pod = %key, error = %e, "cannot requeue the pod");
                }
                match &nominating {
                    Nominating::Keep => self.queue.add_nominated_pod(pod_info, None),
                    Nominating::Node(node) => self.queue.add_nominated_pod(pod_info, Some(node)),
                    Nominating::Clear => self.queue.add_nominated_pod(pod_info, Some("")),
                }
            }
        }

        let message = truncate_message(message);
        self.recorder.event(
            &object_reference(pod.as_ref()),
            EVENT_TYPE_WARNING,
            EVENT_FAILED_SCHEDULING,
            &message,
        );
        let reason = match result {
            AttemptResult::Error => REASON_SCHEDULER_ERROR,
            _ => REASON_UNSCHEDULABLE,
        };
        let clear = matches!(nominating, Nominating::Clear);
        if let Some(patch) = pod_scheduled_false_patch(&pod, reason, &message, clear) {
            let client = self.client.clone();
            handle.spawn(async move {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                let result = client
                    .api::<Pod>(pod.metadata.namespace.as_deref())
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await;
                match result {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        warn!(pod = %queue_key(&pod), error = %e, "cannot update the pod's PodScheduled condition");
                    }
                }
            });
        }
    }
}

/// Pods: unassigned ones of this profile to the queue, assigned ones to the cache (Kubernetes'
/// `addPodToSchedulingQueue`, `addPodToCache` and friends).
struct PodHandler {
    cache: Arc<Cache>,
    queue: Arc<SchedulingQueue>,
    scheduler_name: String,
}

impl PodHandler {
    /// A bound pod that has not finished: the cache counts it on its node.
    fn in_cache(&self, pod: &Pod) -> bool {
        assigned(pod) && !terminal(pod)
    }

    /// An unbound pod of this profile that has not finished: the queue holds it.
    fn pending(&self, pod: &Pod) -> bool {
        !assigned(pod) && !terminal(pod) && scheduler_name_of(pod) == self.scheduler_name
    }

    fn add_assigned(&self, pod: &Arc<Pod>) {
        if let Err(e) = self.cache.add_pod(pod.clone()) {
            error!(pod = %queue_key(pod), error = %e, "cache: add pod");
        }
        self.queue
            .move_all_to_active_or_backoff(ClusterEvent::ASSIGNED_POD_ADD);
    }

    fn delete_assigned(&self, pod: &Pod) {
        if let Err(e) = self.cache.remove_pod(pod) {
            error!(pod = %queue_key(pod), error = %e, "cache: remove pod");
        }
        self.queue
            .move_all_to_active_or_backoff(ClusterEvent::ASSIGNED_POD_DELETE);
    }

    fn delete_unassigned(&self, pod: &Pod) {
        let was_nominated = self.queue.nominated_node_of(pod_uid(pod)).is_some();
        self.queue.delete(pod);
        if was_nominated {
            // The room it reserved is free for others.
            self.queue
                .move_all_to_active_or_backoff(ClusterEvent::UNSCHEDULED_POD_DELETE);
        }
    }
}

impl EventHandler<Pod> for PodHandler {
    fn on_add(&self, pod: &Arc<Pod>, _is_initial_list: bool) {
        if self.in_cache(pod) {
            self.add_assigned(pod);
        } else if self.pending(pod) {
            self.queue.add(pod.clone());
        }
    }

    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        match (self.in_cache(old), self.in_cache(new)) {
            (true, true) => {
                if let Err(e) = self.cache.update_pod(old, new.clone()) {
                    error!(pod = %queue_key(new), error = %e, "cache: update pod");
                }
                let changes = pod_scheduling_properties_change(old, new);
                if !changes.is_empty() {
                    self.queue
                        .move_all_to_active_or_backoff(ClusterEvent::assigned_pod_update(changes));
                }
            }
            // Finished: its room is free.
            (true, false) => self.delete_assigned(old),
            // Bound (by us, or by anyone): now on a node.
            (false, true) => self.add_assigned(new),
            (false, false) => {}
        }
        match (self.pending(old), self.pending(new)) {
            (true, true) => {
                // A resync or a no-op update carries nothing new.
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                // Its earlier cycle assumed it already; the bind will land.
                if self.cache.is_assumed_pod(new) {
                    return;
                }
                self.queue.update(Some(old), new.clone());
            }
            // Bound or finished: no longer ours to schedule.
            (true, false) => self.delete_unassigned(old),
            (false, true) => self.queue.add(new.clone()),
            (false, false) => {}
        }
    }

    fn on_delete(&self, deleted: &Deleted<Pod>) {
        let pod = deleted.object();
        if self.in_cache(pod) {
            self.delete_assigned(pod);
        } else if self.pending(pod) {
            self.delete_unassigned(pod);
        }
    }
}

/// Nodes to the cache; each change is a cluster event for the queue.
struct NodeHandler {
    cache: Arc<Cache>,
    queue: Arc<SchedulingQueue>,
}

impl EventHandler<Node> for NodeHandler {
    fn on_add(&self, node: &Arc<Node>, _is_initial_list: bool) {
        self.cache.add_node(node.clone());
        self.queue
            .move_all_to_active_or_backoff(ClusterEvent::NODE_ADD);
    }

    fn on_update(&self, old: &Arc<Node>, new: &Arc<Node>) {
        self.cache.update_node(new.clone());
        let changes = node_scheduling_properties_change(old, new);
        if !changes.is_empty() {
            self.queue
                .move_all_to_active_or_backoff(ClusterEvent::node_update(changes));
        }
    }

    fn on_delete(&self, deleted: &Deleted<Node>) {
        let name = deleted
            .object()
            .metadata
            .name
            .as_deref()
            .unwrap_or_default();
        if let Err(e) = self.cache.remove_node(name) {
            error!(node = name, error = %e, "cache: remove node");
        }
        self.queue
            .move_all_to_active_or_backoff(ClusterEvent::NODE_DELETE);
    }
}

/// Namespace labels for inter-pod affinity's namespace selectors.
struct NamespaceHandler {
    labels: interpodaffinity::NamespaceLabelsHandle,
}

impl NamespaceHandler {
    fn set(&self, namespace: &Namespace) {
        if let Some(name) = namespace.metadata.name.clone() {
            let labels = namespace.metadata.labels.clone().unwrap_or_default();
            self.labels.write().insert(name, labels);
        }
    }
}

impl EventHandler<Namespace> for NamespaceHandler {
    fn on_add(&self, namespace: &Arc<Namespace>, _is_initial_list: bool) {
        self.set(namespace);
    }
    fn on_update(&self, _old: &Arc<Namespace>, new: &Arc<Namespace>) {
        self.set(new);
    }
    fn on_delete(&self, deleted: &Deleted<Namespace>) {
        if let Some(name) = deleted.object().metadata.name.as_deref() {
            self.labels.write().remove(name);
        }
    }
}

/// Campaigns for the `kube-system/kube-scheduler` Lease as `identity` and schedules while
/// leading, with the default [`Config`], until `stop`. Each term builds a fresh scheduler
/// (fresh informers, cache and queue): what a former leader knew may be stale.
pub async fn run_leader_elected(client: Client, identity: String, stop: CancellationToken) {
    let election = LeaderElectionConfig::new(LEASE_NAMESPACE, LEASE_NAME, &identity);
    run_leader_elected_with(client, election, Config::default(), stop).await;
}

/// [`run_leader_elected`] with explicit election and scheduler configurations (tests shorten
/// the timeouts).
pub async fn run_leader_elected_with(
    client: Client,
    mut election: LeaderElectionConfig,
    config: Config,
    stop: CancellationToken,
) {
    if let Err(e) = config.validate() {
        error!(error = %e, "scheduler: bad configuration");
        return;
    }
    // A stopping member hands the Lease back so another takes over at once.
    election.release_on_cancel = true;
    let retry = election.retry_period;
    let identity = election.identity.clone();
    let lead_client = client.clone();
    let callbacks = Callbacks::new(move |token| {
        let client = lead_client.clone();
        let config = config.clone();
        async move {
            match Scheduler::new(client, config) {
                Ok(scheduler) => scheduler.run(token).await,
                Err(e) => error!(error = %e, "scheduler: bad configuration"),
            }
        }
    })
    .on_new_leader(|holder| info!(leader = holder, "kube-scheduler leader"));
    let elector = match LeaderElector::for_client(&client, election, callbacks) {
        Ok(elector) => elector,
        Err(e) => {
            error!(error = %e, "scheduler: bad leader-election configuration");
            return;
        }
    };
    loop {
        let outcome = elector.run(&stop).await;
        info!(?outcome, %identity, "scheduler term ended");
        if stop.is_cancelled() {
            return;
        }
        debug_assert_eq!(outcome, RunOutcome::LostLeadership);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retry) => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod_with(condition: Option<PodCondition>, nominated: Option<&str>) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: condition.map(|c| vec![c]),
                nominated_node_name: nominated.map(str::to_string),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn condition_patch_only_when_something_changes() {
        let message = "0/3 nodes are available: 3 Insufficient cpu.";
        // No condition yet: set it.
        let patch =
            pod_scheduled_false_patch(&pod_with(None, None), "Unschedulable", message, false)
                .unwrap();
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["type"], "PodScheduled");
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "Unschedulable");
        assert_eq!(condition["message"], message);
        assert!(patch["status"].get("nominatedNodeName").is_none());

        // The same condition again: no write.
        let since = Time(Timestamp::from_second(1_700_000_000).unwrap());
        let same = PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.into()),
            last_transition_time: Some(since.clone()),
            ..PodCondition::default()
        };
        assert_eq!(
            pod_scheduled_false_patch(
                &pod_with(Some(same.clone()), None),
                "Unschedulable",
                message,
                false
            ),
            None
        );
        // Same condition but a stale nomination to clear: write, keeping the transition time.
        let patch = pod_scheduled_false_patch(
            &pod_with(Some(same.clone()), Some("node-a")),
            "Unschedulable",
            message,
            true,
        )
        .unwrap();
        assert_eq!(patch["status"]["nominatedNodeName"], Value::Null);
        assert_eq!(
            patch["status"]["conditions"][0]["lastTransitionTime"],
            since.0.to_string()
        );
        // A new message: write.
        assert!(
            pod_scheduled_false_patch(&pod_with(Some(same), None), "Unschedulable", "other", false)
                .is_some()
        );
    }

    #[test]
    fn long_messages_are_truncated_like_kubernetes() {
        assert_eq!(truncate_message("short"), "short");
        let long = "é".repeat(EVENT_MESSAGE_LENGTH_MAX);
        let cut = truncate_message(&long);
        assert!(cut.len() <= EVENT_MESSAGE_LENGTH_MAX, "{}", cut.len());
        assert!(cut.ends_with(" ..."));
    }

    #[test]
    fn binding_names_the_pod_and_the_node() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web-0".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("uid-1".into());
        let body = binding_body(&pod, "node-a");
        assert_eq!(body["kind"], "Binding");
        assert_eq!(body["metadata"]["name"], "web-0");
        assert_eq!(body["metadata"]["uid"], "uid-1");
        assert_eq!(body["target"]["kind"], "Node");
        assert_eq!(body["target"]["name"], "node-a");
    }

    #[test]
    fn config_is_validated() {
        assert_eq!(Config::default().validate(), Ok(()));
        let bad = |f: fn(&mut Config)| {
            let mut config = Config::default();
            f(&mut config);
            config.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.percentage_of_nodes_to_score = 101),
            ConfigError::Percentage(101)
        );
        assert_eq!(bad(|c| c.parallelism = 0), ConfigError::Parallelism(0));
        assert_eq!(
            bad(|c| c.parallelism = PARALLELISM_MAX + 1),
            ConfigError::Parallelism(PARALLELISM_MAX + 1)
        );
        assert_eq!(
            bad(|c| c.binds_in_flight_max = 0),
            ConfigError::BindsInFlight
        );
        assert_eq!(
            bad(|c| c.scheduler_name.clear()),
            ConfigError::SchedulerName
        );
    }

    #[test]
    fn terminal_and_assigned_pods_are_recognised() {
        let mut pod = Pod::default();
        assert!(!assigned(&pod));
        pod.spec = Some(Default::default());
        pod.spec.as_mut().unwrap().node_name = Some(String::new());
        assert!(!assigned(&pod), "an empty nodeName is unassigned");
        pod.spec.as_mut().unwrap().node_name = Some("n".into());
        assert!(assigned(&pod));
        assert!(!terminal(&pod));
        for phase in ["Succeeded", "Failed"] {
            pod.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            });
            assert!(terminal(&pod));
        }
        assert_eq!(scheduler_name_of(&pod), DEFAULT_SCHEDULER_NAME);
    }
}
