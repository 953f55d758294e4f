//! What a pod requests of a node (Kubernetes' `k8s.io/component-helpers/resource`
//! `PodRequests` and `AggregateContainerRequests`, 1.32, without the alpha pod-level
//! resources and in-place resize gates): the scheduler's NodeResourcesFit and its scoring,
//! its queueing hints and (next) the kubelet's admission count the same numbers.
//!
//! - the app containers' requests add up;
//! - init containers run one at a time before them, so each only sets a floor: the pod needs
//!   at least the largest;
//! - a sidecar (an init container with `restartPolicy: Always`, 1.29+) keeps running: its
//!   requests add to the app containers', and every init container after it runs beside it,
//!   so init container *i* needs its own request plus the sidecars started before it;
//! - `spec.overhead` (the RuntimeClass's) comes on top.
//!
//! Quantities are summed exactly, in nano-units ([`Quantity`]), and rounded only by the
//! caller (Kubernetes sums `resource.Quantity` values the same way).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::validation::quantity::Quantity;

/// Resource name of CPU.
pub const RESOURCE_CPU: &str = "cpu";
/// Resource name of memory.
pub const RESOURCE_MEMORY: &str = "memory";

/// The container restart policy that makes an init container a sidecar (Kubernetes'
/// `ContainerRestartPolicyAlways`).
pub const SIDECAR_RESTART_POLICY: &str = "Always";

/// Requests by resource name, in nano-units.
pub type ResourceList = BTreeMap<String, Quantity>;

/// How [`pod_requests`] counts (Kubernetes' `PodResourcesOptions`, the fields skerry uses).
#[derive(Clone, Copy, Debug, Default)]
pub struct PodResourcesOptions<'a> {
    /// For each resource here, a container that does not request it at all counts this much
    /// instead (`NonMissingContainerRequests`: the scheduler scores a best-effort container
    /// as 100m CPU and 200 MiB). An explicit 0 stays 0.
    pub non_missing_container_requests: Option<&'a ResourceList>,
    /// Leave `spec.overhead` out (`ExcludeOverhead`).
    pub exclude_overhead: bool,
}

/// Parses an API resource list; a quantity that does not parse counts as nothing (the
/// apiserver validates quantities, so it is a corrupt object: better to count nothing for
/// that resource than to fail the whole pod or node).
pub fn resource_list(list: Option<&BTreeMap<String, ApiQuantity>>) -> ResourceList {
    let mut out = ResourceList::new();
    for (name, quantity) in list.into_iter().flatten() {
        match Quantity::parse(quantity.0.trim()) {
            Some(q) => {
                out.insert(name.clone(), q);
            }
            None => {
                tracing::warn!(resource = %name, quantity = %quantity.0, "ignoring unparsable quantity");
            }
        }
    }
    out
}

/// Adds `source` into `target`, resource by resource.
pub fn add_resource_list(target: &mut ResourceList, source: &ResourceList) {
    for (name, value) in source {
        let entry = target.entry(name.clone()).or_insert(Quantity(0));
        entry.0 = entry.0.saturating_add(value.0);
    }
}

/// Raises each resource of `target` to at least `source`'s (`maxResourceList`).
pub fn max_resource_list(target: &mut ResourceList, source: &ResourceList) {
    for (name, value) in source {
        let entry = target.entry(name.clone()).or_insert(*value);
        *entry = (*entry).max(*value);
    }
}

/// One container's requests, with the non-missing defaults applied.
fn container_requests(container: &Container, options: &PodResourcesOptions<'_>) -> ResourceList {
    let mut requests = resource_list(
        container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()),
    );
    for (name, default) in options.non_missing_container_requests.into_iter().flatten() {
        requests.entry(name.clone()).or_insert(*default);
    }
    requests
}

/// The fold over a pod's containers that its requests and its limits share (upstream's
/// `AggregateContainerRequests` and `AggregateContainerLimits`): regular containers add up,
/// a sidecar (restartable init container) adds to them and to every later init step, and the
/// largest init step counts. `each` is a container's own list; `seen` is shown each regular
/// container's list and what runs during each init step.
pub fn aggregate_containers(
    spec: &PodSpec,
    mut each: impl FnMut(&Container) -> ResourceList,
    mut seen: impl FnMut(&ResourceList),
) -> ResourceList {
    let mut total = ResourceList::new();
    for container in &spec.containers {
        let own = each(container);
        seen(&own);
        add_resource_list(&mut total, &own);
    }
    // The sidecars started so far, and the peak of the init phase.
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for container in spec.init_containers.iter().flatten() {
        let own = each(container);
        let during = if container.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY) {
            add_resource_list(&mut total, &own);
            add_resource_list(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut during = own;
            add_resource_list(&mut during, &sidecars);
            during
        };
        seen(&during);
        max_resource_list(&mut init_peak, &during);
    }
    max_resource_list(&mut total, &init_peak);
    total
}

/// `PodRequests`: the pod's requests per resource (see the module docs for the rules).
pub fn pod_requests(pod: &Pod, options: &PodResourcesOptions<'_>) -> ResourceList {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceList::new();
    };
    let mut requests = aggregate_containers(spec, |c| container_requests(c, options), |_| {});
    if !options.exclude_overhead
        && let Some(overhead) = spec.overhead.as_ref()
    {
        add_resource_list(&mut requests, &resource_list(Some(overhead)));
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("a pod")
    }

    fn cpu(millis: i128) -> Quantity {
        Quantity(millis * 1_000_000)
    }

    fn container(name: &str, cpu: &str) -> Value {
        json!({"name": name, "resources": {"requests": {"cpu": cpu}}})
    }

    fn sidecar(name: &str, cpu: &str) -> Value {
        let mut c = container(name, cpu);
        c["restartPolicy"] = json!("Always");
        c
    }

    fn requested_cpu(spec: Value) -> Quantity {
        pod_requests(&pod(spec), &PodResourcesOptions::default())[RESOURCE_CPU]
    }

    // Reference: the example in Kubernetes' `computePodResourceRequest` doc comment: app
    // containers 2 and 1 CPU (sum 3), init containers 2 CPU/1G and 2 CPU/3G (peak 3G).
    #[test]
    fn containers_add_up_and_init_containers_set_a_floor() {
        let p = pod(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1G"}}}],
            "initContainers": [
                {"name": "i1", "resources": {"requests": {"cpu": "2", "memory": "1G"}}},
                {"name": "i2", "resources": {"requests": {"cpu": "2", "memory": "3G"}}}],
            "overhead": {"cpu": "250m", "memory": "120Mi"}
        }));
        let requests = pod_requests(&p, &PodResourcesOptions::default());
        assert_eq!(requests[RESOURCE_CPU], cpu(3250), "3 CPU plus the overhead");
        assert_eq!(
            requests[RESOURCE_MEMORY],
            Quantity((3_000_000_000 + 120 * 1024 * 1024) * 1_000_000_000)
        );
        let without = pod_requests(
            &p,
            &PodResourcesOptions {
                exclude_overhead: true,
                ..PodResourcesOptions::default()
            },
        );
        assert_eq!(without[RESOURCE_CPU], cpu(3000));
    }

    // Reference: KEP-753 (sidecar containers), "Exposing Pod Resource Requirements": init
    // container i runs beside the sidecars started before it; sidecars add to the app
    // containers' sum.
    #[test]
    fn sidecars_add_to_the_sum_and_to_later_init_containers() {
        // Sum 1 + 0.5 = 1.5; the init container after the sidecar needs 2 + 0.5.
        assert_eq!(
            requested_cpu(json!({
                "containers": [container("app", "1")],
                "initContainers": [sidecar("s", "500m"), container("i", "2")]})),
            cpu(2500)
        );
        // A small init container: the running sum wins.
        assert_eq!(
            requested_cpu(json!({
                "containers": [container("app", "1")],
                "initContainers": [sidecar("s", "500m"), container("i", "100m")]})),
            cpu(1500)
        );
        // An init container before the sidecar runs alone.
        assert_eq!(
            requested_cpu(json!({
                "containers": [container("app", "1")],
                "initContainers": [container("i", "2"), sidecar("s", "500m")]})),
            cpu(2000)
        );
        // Several of each: sum 1 + 1 + 2 + 3 = 7; peaks 5, 1, 3, 5 + 3 = 8, 6: the pod
        // needs 8.
        assert_eq!(
            requested_cpu(json!({
                "containers": [container("app", "1")],
                "initContainers": [
                    container("i1", "5"), sidecar("s1", "1"), sidecar("s2", "2"),
                    container("i2", "5"), sidecar("s3", "3")]})),
            cpu(8000)
        );
    }

    // Reference: the scheduler's `NonMissingContainerRequests` (100m CPU, 200 MiB for a
    // container that requests neither).
    #[test]
    fn non_missing_defaults_apply_only_where_nothing_is_requested() {
        let defaults: ResourceList = [
            (RESOURCE_CPU.to_string(), cpu(100)),
            (
                RESOURCE_MEMORY.to_string(),
                Quantity((200i128 << 20) * 1_000_000_000),
            ),
        ]
        .into();
        let options = PodResourcesOptions {
            non_missing_container_requests: Some(&defaults),
            ..PodResourcesOptions::default()
        };
        let p = pod(json!({"containers": [
            {"name": "a"},
            {"name": "b", "resources": {"requests": {"cpu": "0", "memory": "1Mi"}}}]}));
        let requests = pod_requests(&p, &options);
        assert_eq!(requests[RESOURCE_CPU], cpu(100), "an explicit 0 stays 0");
        let mebibyte = 1_000_000_000i128 << 20;
        assert_eq!(
            requests[RESOURCE_MEMORY],
            Quantity(200 * mebibyte + mebibyte)
        );
        let plain = pod_requests(&p, &PodResourcesOptions::default());
        assert_eq!(plain[RESOURCE_CPU], cpu(0));
    }

    #[test]
    fn an_unparsable_quantity_counts_nothing() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "lots", "memory": "1Gi"}}}]}));
        let requests = pod_requests(&p, &PodResourcesOptions::default());
        assert!(!requests.contains_key(RESOURCE_CPU));
        assert!(requests.contains_key(RESOURCE_MEMORY));
        assert!(pod_requests(&Pod::default(), &PodResourcesOptions::default()).is_empty());
    }
}
