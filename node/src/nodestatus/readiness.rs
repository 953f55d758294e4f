//! What decides the node's Ready condition besides its capacity: is the container runtime up,
//! is the pod network configured. The upstream kubelet keeps this in `runtimeState`
//! (`pkg/kubelet/runtime.go`) and folds it into the Ready condition in
//! `nodestatus/setters.go` (`ReadyCondition`); here the pod workers and the network setup
//! report through [`Readiness`], and every change wakes the status loop so a new condition
//! is posted at once rather than at the next periodic sync.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// The runtime has not answered a status check yet (`runtime.go`, `runtimeErrors`).
pub const RUNTIME_NOT_CHECKED: &str = "container runtime status check may not have completed yet";
/// The runtime stopped answering (`runtime.go`, `runtimeErrors`).
pub const RUNTIME_DOWN: &str = "container runtime is down";
/// The reason a runtime gives while the pod network is not set up (CRI's
/// `NetworkReady` condition, containerd's and dockershim's `NetworkPluginNotReady`).
pub const NETWORK_PLUGIN_NOT_READY: &str = "NetworkPluginNotReady";
/// The message while no CNI configuration exists (dockershim's wording, the one operators
/// search for).
pub const CNI_CONFIG_UNINITIALIZED: &str = "network plugin is not ready: cni config uninitialized";

/// The runtime's health as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RuntimeHealth {
    /// Never checked.
    Unknown,
    /// Answering.
    Up,
    /// Not answering, or answering with an error: the error, or [`RUNTIME_DOWN`].
    Down(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    runtime: RuntimeHealth,
    /// `None` when the network is ready, else the kubelet's error text.
    network: Option<String>,
}

/// The readiness inputs: cheap to clone, shared by the pod workers, the network setup and
/// the status loop. A change (and only a change) bumps a generation the status loop waits
/// on.
#[derive(Clone)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
    generation: Arc<watch::Sender<u64>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new()
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("state", &*self.state.lock())
            .finish()
    }
}

impl Readiness {
    /// A node whose runtime has not been checked and whose network is not configured.
    pub fn new() -> Readiness {
        Readiness {
            state: Arc::new(Mutex::new(State {
                runtime: RuntimeHealth::Unknown,
                network: Some(network_error(
                    NETWORK_PLUGIN_NOT_READY,
                    CNI_CONFIG_UNINITIALIZED,
                )),
            })),
            generation: Arc::new(watch::channel(0).0),
        }
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        let changed = {
            let mut state = self.state.lock();
            let before = state.clone();
            change(&mut state);
            *state != before
        };
        if changed {
            self.generation.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// The runtime answered its status check and says it is ready.
    pub fn set_runtime_up(&self) {
        self.update(|s| s.runtime = RuntimeHealth::Up);
    }

    /// The runtime did not answer (`None`: [`RUNTIME_DOWN`]) or answered not ready (the
    /// reason it gave).
    pub fn set_runtime_down(&self, reason: Option<&str>) {
        let message = reason.unwrap_or(RUNTIME_DOWN).to_string();
        self.update(|s| s.runtime = RuntimeHealth::Down(message));
    }

    /// The pod network is configured.
    pub fn set_network_ready(&self) {
        self.update(|s| s.network = None);
    }

    /// The pod network is not ready, with the runtime's (or the CNI setup's) reason and
    /// message, e.g. [`NETWORK_PLUGIN_NOT_READY`] and [`CNI_CONFIG_UNINITIALIZED`].
    pub fn set_network_not_ready(&self, reason: &str, message: &str) {
        let error = network_error(reason, message);
        self.update(|s| s.network = Some(error));
    }

    /// Whether the network is ready.
    pub fn network_ready(&self) -> bool {
        self.state.lock().network.is_none()
    }

    /// The errors that keep the node not ready, runtime first then network, as the kubelet
    /// lists them; empty when ready.
    pub fn errors(&self) -> Vec<String> {
        let state = self.state.lock();
        let mut errors = Vec::new();
        match &state.runtime {
            RuntimeHealth::Unknown => errors.push(RUNTIME_NOT_CHECKED.to_string()),
            RuntimeHealth::Up => {}
            RuntimeHealth::Down(why) => errors.push(why.clone()),
        }
        errors.extend(state.network.clone());
        errors
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

/// The kubelet's network error (`kubelet.go`, `updateRuntimeUp`, with the CRI condition
/// printed as `NetworkReady=false reason:... message:...`).
fn network_error(reason: &str, message: &str) -> String {
    format!(
        "container runtime network not ready: NetworkReady=false reason:{reason} message:{message}"
    )
}

/// Errors joined as apimachinery's `utilerrors.NewAggregate(...).Error()` joins them: one
/// distinct message alone, several as `[a, b]`, duplicates once.
pub fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_node_waits_for_runtime_and_network() {
        let r = Readiness::new();
        assert_eq!(
            r.errors(),
            [
                RUNTIME_NOT_CHECKED.to_string(),
                "container runtime network not ready: NetworkReady=false \
                 reason:NetworkPluginNotReady message:network plugin is not ready: cni config uninitialized"
                    .to_string()
            ]
        );
        r.set_runtime_up();
        r.set_network_ready();
        assert!(r.errors().is_empty());
        r.set_runtime_down(None);
        assert_eq!(r.errors(), [RUNTIME_DOWN]);
    }

    #[test]
    fn only_changes_wake_the_status_loop() {
        let r = Readiness::new();
        let mut rx = r.subscribe();
        rx.mark_unchanged();
        r.set_runtime_up();
        assert!(rx.has_changed().expect("sender alive"));
        rx.mark_unchanged();
        r.set_runtime_up();
        assert!(
            !rx.has_changed().expect("sender alive"),
            "same state, no wake-up"
        );
    }

    #[test]
    fn errors_aggregate_as_apimachinery_does() {
        assert_eq!(aggregate(&[]), "");
        assert_eq!(aggregate(&["a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "b".into()]), "[a, b]");
    }
}
