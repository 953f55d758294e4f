//! The node IPAM controller (kube-controller-manager's `nodeipam` with
//! `--allocate-node-cidrs`, the range allocator of `pkg/controller/nodeipam/ipam/
//! range_allocator.go` over `cidrset/cidr_set.go`): every Node gets a pod range carved from
//! `--cluster-cidr` (a /24 of k3s's `10.42.0.0/16` by default), written to `spec.podCIDR` and
//! `spec.podCIDRs`; the kubelet configures the node's pod network from it.
//!
//! The allocator is a bitmap of the cluster range's subnets, one set per IP family (dual
//! stack gives a node one range of each). It is rebuilt at start from the Nodes that already
//! have ranges, so nothing is kept outside the API; a Node that arrives with a range (set by
//! hand, or before a restart) keeps it and marks it used; a deleted Node's range is released
//! and the Nodes still waiting for one are queued again. The Service range is marked used
//! where it overlaps the cluster range (`filterOutServiceRange`). A full range is a
//! `CIDRNotAvailable` Warning event on the Node, retried with backoff.
//!
//! Acting on a cache that lags (`docs/tricks.md`, part 5): the decision to allocate is taken
//! on the informer's copy, which may not show a range this controller wrote a moment ago.
//! So before writing, the Node is read live: one with a range already is only marked, never
//! given a second one.
//!
//! Differences from Kubernetes, on purpose: the lowest free subnet is taken (upstream walks
//! round-robin from the last allocation), so the ranges of a small cluster stay packed and
//! predictable, and a re-created node gets the range its predecessor had; and a Node whose
//! range cannot be parsed or lies outside the cluster range at start is logged and skipped
//! rather than stopping the whole controller manager.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use parking_lot::Mutex;
use serde_json::json;
use skerry_api::node::pod_cidrs;
use skerry_client::cache::Indexer;
use skerry_client::events::{EVENT_TYPE_WARNING, EventRecorder};
use skerry_client::informer::{Deleted, EventHandler, SharedInformer};
use skerry_client::workqueue::WorkQueue;
use skerry_client::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::runtime::{self, Reconciler};

/// k3s's `--cluster-cidr` default: the pod addresses of the whole cluster.
pub const CLUSTER_CIDR_DEFAULT: &str = "10.42.0.0/16";
/// `--node-cidr-mask-size` default for IPv4 (kube-controller-manager's): 254 pods a node,
/// over twice the kubelet's 110-pod default, so addresses are never what limits a node.
pub const NODE_CIDR_MASK_SIZE_V4_DEFAULT: u8 = 24;
/// `--node-cidr-mask-size` default for IPv6.
pub const NODE_CIDR_MASK_SIZE_V6_DEFAULT: u8 = 64;
/// An IPv6 node mask may be at most 16 bits longer than the cluster's (`cidr_set.go`,
/// `clusterSubnetMaxDiff`): the bitmap is uncompressed, 2^16 bits.
pub const CLUSTER_SUBNET_MAX_DIFF_V6: u8 = 16;
/// skerry's bound for IPv4, which upstream leaves open: 2^24 subnets is a 2 MiB bitmap, and
/// a 10.0.0.0/8 cut into /32s, the worst a typo can ask for, would otherwise take 512 MiB.
pub const CLUSTER_SUBNET_MAX_DIFF_V4: u8 = 24;
/// Tries of the podCIDR patch before the range is given back (`cidrUpdateRetries`).
pub const CIDR_UPDATE_RETRIES: usize = 3;
/// Workers (`cidr_allocator.go`, `cidrUpdateWorkers`): a sync is a bitmap scan and one
/// patch, and nodes joining together are served together.
pub const DEFAULT_WORKERS: usize = 30;
/// The event source of the allocator (`range_allocator.go`).
pub const EVENT_COMPONENT: &str = "cidrAllocator";
/// The event when the range is full (`RecordNodeStatusChange`, status `CIDRNotAvailable`).
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
/// The event when the patch kept failing.
pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
/// `ErrCIDRRangeNoCIDRsRemaining`.
pub const NO_CIDRS_REMAINING: &str =
    "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range";

/// A network: its address (host bits zero) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The address as an integer (IPv4 in the low 32 bits).
    base: u128,
    /// The prefix length.
    prefix: u8,
    /// IPv4 or IPv6.
    v4: bool,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or `x::/n`. Host bits are masked off, as Go's `ParseCIDR` returns
    /// the network (`10.42.1.7/24` is `10.42.1.0/24`).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = text
            .split_once('/')
            .ok_or_else(|| format!("invalid CIDR address: {text}"))?;
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("invalid CIDR address: {text}"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("invalid CIDR address: {text}"))?;
        let (value, v4) = match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)), true),
            IpAddr::V6(a) => (u128::from(a), false),
        };
        let bits = if v4 { 32 } else { 128 };
        if prefix > bits {
            return Err(format!("invalid CIDR address: {text}"));
        }
        let cidr = Cidr {
            base: value,
            prefix,
            v4,
        };
        Ok(Cidr {
            base: value & !cidr.host_mask(),
            ..cidr
        })
    }

    fn bits(&self) -> u8 {
        if self.v4 { 32 } else { 128 }
    }

    fn host_mask(&self) -> u128 {
        let host_bits = u32::from(self.bits() - self.prefix);
        if host_bits == 0 {
            0
        } else {
            u128::MAX >> (128 - host_bits)
        }
    }

    /// The last address of the network.
    fn last(&self) -> u128 {
        self.base | self.host_mask()
    }

    /// Whether the two networks share an address.
    fn overlaps(&self, other: &Cidr) -> bool {
        self.v4 == other.v4 && self.base <= other.last() && other.base <= self.last()
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ip: IpAddr = if self.v4 {
            IpAddr::V4(u32::try_from(self.base).unwrap_or(u32::MAX).into())
        } else {
            IpAddr::V6(self.base.into())
        };
        write!(f, "{ip}/{}", self.prefix)
    }
}

/// The subnets of one cluster range and which are used (`cidrset.CidrSet`).
#[derive(Debug, Clone)]
pub struct CidrSet {
    cluster: Cidr,
    node_prefix: u8,
    /// One bit per subnet; bit `i` is the subnet at `base + i << (bits - node_prefix)`.
    used: Vec<u64>,
    count: usize,
}

impl CidrSet {
    /// The subnets of `cluster` of length `node_prefix`.
    pub fn new(cluster: Cidr, node_prefix: u8) -> Result<CidrSet, String> {
        if node_prefix < cluster.prefix || node_prefix > cluster.bits() {
            return Err(format!(
                "invalid --cluster-cidr {cluster}: the mask size of the cluster CIDR must be less \
                 than or equal to the node CIDR mask size {node_prefix}"
            ));
        }
        let diff = node_prefix - cluster.prefix;
        let max = if cluster.v4 {
            CLUSTER_SUBNET_MAX_DIFF_V4
        } else {
            CLUSTER_SUBNET_MAX_DIFF_V6
        };
        if diff > max {
            return Err(format!(
                "New CIDR set failed; the node CIDR size is too big (more than 2^{max} node \
                 ranges: use a longer --cluster-cidr prefix or a shorter --node-cidr-mask-size)"
            ));
        }
        let count = 1usize << diff;
        Ok(CidrSet {
            cluster,
            node_prefix,
            used: vec![0; count.div_ceil(64)],
            count,
        })
    }

    fn shift(&self) -> u32 {
        u32::from(self.cluster.bits() - self.node_prefix)
    }

    fn subnet(&self, index: usize) -> Cidr {
        let offset = if self.shift() >= 128 {
            0
        } else {
            (index as u128) << self.shift()
        };
        Cidr {
            base: self.cluster.base | offset,
            prefix: self.node_prefix,
            v4: self.cluster.v4,
        }
    }

    fn index_of(&self, address: u128) -> usize {
        let shift = self.shift();
        let relative = address.saturating_sub(self.cluster.base);
        usize::try_from(if shift >= 128 { 0 } else { relative >> shift }).unwrap_or(usize::MAX)
    }

    fn is_used(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize, on: bool) {
        if on {
            self.used[i / 64] |= 1 << (i % 64);
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
        }
    }

    /// The subnets `cidr` covers (`getBeginingAndEndIndices`): all of them when it contains
    /// the cluster range; an error when it lies outside.
    fn span(&self, cidr: &Cidr) -> Result<(usize, usize), String> {
        if !self.cluster.overlaps(cidr) {
            return Err(format!(
                "cidr {cidr} is out the range of cluster cidr {}",
                self.cluster
            ));
        }
        let first = cidr.base.max(self.cluster.base);
        let last = cidr.last().min(self.cluster.last());
        Ok((self.index_of(first), self.index_of(last)))
    }

    /// The lowest free subnet, now used.
    pub fn allocate_next(&mut self) -> Result<Cidr, String> {
        let word = self
            .used
            .iter()
            .position(|w| *w != u64::MAX)
            .ok_or_else(|| NO_CIDRS_REMAINING.to_string())?;
        let i = word * 64 + self.used[word].trailing_ones() as usize;
        if i >= self.count {
            return Err(NO_CIDRS_REMAINING.to_string());
        }
        self.set(i, true);
        Ok(self.subnet(i))
    }

    /// Marks every subnet `cidr` covers used.
    pub fn occupy(&mut self, cidr: &Cidr) -> Result<(), String> {
        let (begin, end) = self.span(cidr)?;
        for i in begin..=end {
            self.set(i, true);
        }
        Ok(())
    }

    /// Marks every subnet `cidr` covers free.
    pub fn release(&mut self, cidr: &Cidr) -> Result<(), String> {
        let (begin, end) = self.span(cidr)?;
        for i in begin..=end {
            self.set(i, false);
        }
        Ok(())
    }

    /// How many subnets are in use.
    pub fn used_count(&self) -> usize {
        (0..self.count).filter(|i| self.is_used(*i)).count()
    }

    /// The cluster range.
    pub fn cluster(&self) -> Cidr {
        self.cluster
    }
}

/// The controller's flags (kube-controller-manager's names).
#[derive(Debug, Clone)]
pub struct NodeIpamConfig {
    /// `--allocate-node-cidrs`: the controller runs only when set.
    pub allocate_node_cidrs: bool,
    /// `--cluster-cidr`: one range, or an IPv4 and an IPv6 one (dual stack).
    pub cluster_cidrs: Vec<Cidr>,
    /// The node mask per range (`--node-cidr-mask-size`, or the family's default).
    pub node_mask_sizes: Vec<u8>,
    /// `--service-cluster-ip-range`, kept out of the pod ranges where they overlap.
    pub service_cidr: Option<Cidr>,
}

impl Default for NodeIpamConfig {
    /// k3s's: allocation on, `10.42.0.0/16` in /24s.
    fn default() -> Self {
        NodeIpamConfig::parse(true, CLUSTER_CIDR_DEFAULT, None, None)
            .expect("the default cluster CIDR parses")
    }
}

impl NodeIpamConfig {
    /// The configuration of the flags' texts, with kube-controller-manager's checks: at most
    /// two cluster ranges and then one per family; `--node-cidr-mask-size` not with two.
    pub fn parse(
        allocate_node_cidrs: bool,
        cluster_cidr: &str,
        node_cidr_mask_size: Option<u8>,
        service_cidr: Option<&str>,
    ) -> Result<NodeIpamConfig, String> {
        let cluster_cidrs = cluster_cidr
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| Cidr::parse(s.trim()).map_err(|e| format!("--cluster-cidr: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if allocate_node_cidrs && cluster_cidrs.is_empty() {
            return Err("--cluster-cidr is required when --allocate-node-cidrs is set".into());
        }
        if cluster_cidrs.len() > 2 {
            return Err(
                "--cluster-cidr: at most two CIDRs (one per IP family) are supported".into(),
            );
        }
        if cluster_cidrs.len() == 2 && cluster_cidrs[0].v4 == cluster_cidrs[1].v4 {
            return Err(
                "--cluster-cidr: two CIDRs must be one IPv4 and one IPv6 (dual stack)".into(),
            );
        }
        if cluster_cidrs.len() == 2 && node_cidr_mask_size.is_some() {
            return Err(
                "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".into(),
            );
        }
        let node_mask_sizes = cluster_cidrs
            .iter()
            .map(|c| {
                node_cidr_mask_size.unwrap_or(if c.v4 {
                    NODE_CIDR_MASK_SIZE_V4_DEFAULT
                } else {
                    NODE_CIDR_MASK_SIZE_V6_DEFAULT
                })
            })
            .collect::<Vec<_>>();
        for (c, m) in cluster_cidrs.iter().zip(&node_mask_sizes) {
            CidrSet::new(*c, *m)?;
        }
        let service_cidr = service_cidr
            .map(|s| Cidr::parse(s).map_err(|e| format!("--service-cluster-ip-range: {e}")))
            .transpose()?;
        Ok(NodeIpamConfig {
            allocate_node_cidrs,
            cluster_cidrs,
            node_mask_sizes,
            service_cidr,
        })
    }

    /// The allocator's empty sets.
    fn sets(&self) -> Vec<CidrSet> {
        self.cluster_cidrs
            .iter()
            .zip(&self.node_mask_sizes)
            .map(|(c, m)| CidrSet::new(*c, *m).expect("checked when the configuration was parsed"))
            .collect()
    }
}

/// The range allocator. Build with [`NodeIpamController::new`], run with
/// [`NodeIpamController::run`].
pub struct NodeIpamController {
    nodes_api: Api<Node>,
    nodes: Indexer<Node>,
    informer: SharedInformer<Node>,
    queue: WorkQueue<String>,
    sets: Mutex<Vec<CidrSet>>,
    /// The ranges each Node was last seen with or given: what its deletion releases when
    /// the deletion is only known from a tombstone whose last state predates the range.
    by_node: Mutex<HashMap<String, Vec<String>>>,
    config: NodeIpamConfig,
    recorder: EventRecorder,
}

impl NodeIpamController {
    /// A controller over the context's shared Node informer, with its handlers registered.
    pub fn new(ctx: &Context, config: NodeIpamConfig) -> Arc<NodeIpamController> {
        let informer = ctx.informers.informer::<Node>();
        let controller = Arc::new(NodeIpamController {
            nodes_api: ctx.client.api::<Node>(None),
            nodes: informer.store(),
            informer: informer.clone(),
            queue: WorkQueue::new("cidrallocator_node"),
            sets: Mutex::new(config.sets()),
            by_node: Mutex::new(HashMap::new()),
            config,
            recorder: EventRecorder::new(ctx.client.clone(), EVENT_COMPONENT),
        });
        informer.add_handler(NodeHandler(Arc::downgrade(&controller)));
        controller
    }

    /// The controller's work queue of node names.
    pub fn queue(&self) -> &WorkQueue<String> {
        &self.queue
    }

    /// How many subnets of each cluster range are in use.
    pub fn used(&self) -> Vec<usize> {
        self.sets.lock().iter().map(CidrSet::used_count).collect()
    }

    /// Waits for the Node cache, rebuilds the bitmaps from the Nodes' ranges and the Service
    /// range, then runs `workers` workers until `stop`.
    pub async fn run(self: Arc<Self>, workers: usize, stop: CancellationToken) {
        if !self.informer.wait_for_sync(&stop).await {
            tracing::info!("nodeipam controller stopped before its cache synced");
            return;
        }
        {
            let mut sets = self.sets.lock();
            if let Some(service) = self.config.service_cidr {
                for set in sets.iter_mut().filter(|s| s.cluster().overlaps(&service)) {
                    if let Err(e) = set.occupy(&service) {
                        tracing::error!(error = %e, "filtering the service range out of the cluster range");
                    }
                }
            }
            for node in self.nodes.list() {
                match occupy(&mut sets, &node) {
                    Ok(()) => self.remember(&node, pod_cidrs(&node)),
                    Err(e) => {
                        tracing::error!(node = ?node.metadata.name, error = %e, "a node's pod CIDR could not be marked used")
                    }
                }
            }
        }
        tracing::info!(workers, used = ?self.used(), "starting range CIDR allocator");
        let queue = self.queue.clone();
        runtime::run_workers(self.clone(), queue, workers, stop).await;
        self.recorder.shutdown();
    }

    /// Gives `name` its ranges, marks the ranges it has, or releases those of a Node being
    /// deleted (`syncNode`).
    pub async fn sync_node(&self, name: &str) -> anyhow::Result<()> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(());
        };
        if node.metadata.deletion_timestamp.is_some() {
            self.release(&node);
            return Ok(());
        }
        if !pod_cidrs(&node).is_empty() {
            occupy(&mut self.sets.lock(), &node).map_err(anyhow::Error::msg)?;
            self.remember(&node, pod_cidrs(&node));
            return Ok(());
        }
        // The cache may be behind a range written a moment ago: ask the apiserver.
        let Some(live) = self.nodes_api.get_opt(name).await? else {
            return Ok(());
        };
        if !pod_cidrs(&live).is_empty() {
            occupy(&mut self.sets.lock(), &live).map_err(anyhow::Error::msg)?;
            self.remember(&live, pod_cidrs(&live));
            return Ok(());
        }
        let allocated = {
            let mut sets = self.sets.lock();
            let mut allocated = Vec::with_capacity(sets.len());
            let mut failure = None;
            for (i, set) in sets.iter_mut().enumerate() {
                match set.allocate_next() {
                    Ok(c) => allocated.push(c),
                    Err(e) => {
                        failure = Some(format!(
                            "failed to allocate cidr from cluster cidr at idx:{i}: {e}"
                        ));
                        break;
                    }
                }
            }
            if let Some(e) = failure {
                for (set, cidr) in sets.iter_mut().zip(&allocated) {
                    let _ = set.release(cidr);
                }
                drop(sets);
                self.node_event(&live, CIDR_NOT_AVAILABLE);
                anyhow::bail!(e);
            }
            allocated
        };
        let cidrs: Vec<String> = allocated.iter().map(ToString::to_string).collect();
        let patch = json!({"spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}});
        let mut last = None;
        for _ in 0..CIDR_UPDATE_RETRIES {
            match self
                .nodes_api
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(patch.clone()),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(node = name, pod_cidrs = ?cidrs, "set node PodCIDR");
                    self.remember(&live, cidrs);
                    return Ok(());
                }
                Err(e) if e.is_not_found() => {
                    last = Some(e);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        {
            let mut sets = self.sets.lock();
            for (set, cidr) in sets.iter_mut().zip(&allocated) {
                let _ = set.release(cidr);
            }
        }
        self.node_event(&live, CIDR_ASSIGNMENT_FAILED);
        Err(anyhow::anyhow!(
            "failed to update node {name} PodCIDR {cidrs:?} after {CIDR_UPDATE_RETRIES} attempts: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        ))
    }

    /// Records the ranges `node` holds.
    fn remember(&self, node: &Node, cidrs: Vec<String>) {
        if let Some(name) = &node.metadata.name {
            self.by_node.lock().insert(name.clone(), cidrs);
        }
    }

    /// Frees a deleted Node's ranges (those of its last state, or those it was last seen
    /// with) and queues the Nodes still waiting for one.
    fn release(&self, node: &Node) {
        let remembered = node
            .metadata
            .name
            .as_ref()
            .and_then(|n| self.by_node.lock().remove(n));
        let mut cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            cidrs = remembered.unwrap_or_default();
        }
        if cidrs.is_empty() {
            return;
        }
        {
            let mut sets = self.sets.lock();
            for (i, text) in cidrs.iter().enumerate() {
                let released = Cidr::parse(text).and_then(|c| match sets.get_mut(i) {
                    Some(set) => set.release(&c),
                    None => Err(format!(
                        "an allocated cidr {text} at index {i} does not exist in the cluster cidrs configuration"
                    )),
                });
                if let Err(e) = released {
                    tracing::error!(node = ?node.metadata.name, error = %e, "error when releasing CIDR");
                }
            }
        }
        for waiting in self.nodes.list() {
            if let Some(name) = waiting.metadata.name.as_ref()
                && pod_cidrs(&waiting).is_empty()
            {
                self.queue.add(name.clone());
            }
        }
    }

    /// `RecordNodeStatusChange`: a Warning on the Node, "Node <name> status is now: <status>".
    fn node_event(&self, node: &Node, status: &str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.clone()),
            uid: node.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        self.recorder.event(
            &reference,
            EVENT_TYPE_WARNING,
            status,
            &format!("Node {name} status is now: {status}"),
        );
    }
}

/// Marks `node`'s ranges used, one per family in order (`occupyCIDRs`).
fn occupy(sets: &mut [CidrSet], node: &Node) -> Result<(), String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    for (i, text) in pod_cidrs(node).iter().enumerate() {
        let cidr =
            Cidr::parse(text).map_err(|_| format!("failed to parse node {name}, CIDR {text}"))?;
        let set = sets.get_mut(i).ok_or_else(|| {
            format!(
                "node:{name} has an allocated cidr: {text} at index:{i} that does not exist in cluster cidrs configuration"
            )
        })?;
        set.occupy(&cidr).map_err(|e| {
            format!("failed to mark cidr[{text}] at idx [{i}] as occupied for node: {name}: {e}")
        })?;
    }
    Ok(())
}

impl Reconciler for NodeIpamController {
    fn name(&self) -> &'static str {
        "nodeipam"
    }

    async fn sync(&self, key: &str) -> anyhow::Result<()> {
        self.sync_node(key).await
    }
}

/// Queues added and updated Nodes; releases a deleted Node's ranges at once (Nodes have no
/// finalizer, so the deletion is the only chance), then queues it.
struct NodeHandler(Weak<NodeIpamController>);

impl EventHandler<Node> for NodeHandler {
    fn on_add(&self, obj: &Arc<Node>, _is_initial_list: bool) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), obj.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_update(&self, _old: &Arc<Node>, new: &Arc<Node>) {
        if let (Some(c), Some(name)) = (self.0.upgrade(), new.metadata.name.as_ref()) {
            c.queue.add(name.clone());
        }
    }
    fn on_delete(&self, obj: &Deleted<Node>) {
        if let Some(c) = self.0.upgrade() {
            c.release(obj.object());
            if let Some(name) = obj.object().metadata.name.as_ref() {
                c.queue.add(name.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).expect("test CIDR")
    }

    #[test]
    fn cidrs_parse_and_print() {
        assert_eq!(cidr("10.42.0.0/16").to_string(), "10.42.0.0/16");
        assert_eq!(cidr("10.42.1.7/24").to_string(), "10.42.1.0/24");
        assert_eq!(cidr("fd00:42::/56").to_string(), "fd00:42::/56");
        assert_eq!(
            Cidr::parse("10.42.0.0").unwrap_err(),
            "invalid CIDR address: 10.42.0.0"
        );
        assert!(Cidr::parse("10.42.0.0/33").is_err());
        assert!(cidr("10.96.0.0/12").overlaps(&cidr("10.100.0.0/16")));
        assert!(!cidr("10.42.0.0/16").overlaps(&cidr("10.96.0.0/12")));
    }

    #[test]
    fn the_lowest_free_subnet_is_allocated_and_released_ones_reused() {
        let mut set = CidrSet::new(cidr("10.42.0.0/16"), 24).expect("valid");
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "10.42.0.0/24"
        );
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "10.42.1.0/24"
        );
        set.occupy(&cidr("10.42.2.0/24")).expect("inside");
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "10.42.3.0/24"
        );
        set.release(&cidr("10.42.1.0/24")).expect("inside");
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "10.42.1.0/24"
        );
        assert_eq!(
            set.occupy(&cidr("10.43.0.0/24")).unwrap_err(),
            "cidr 10.43.0.0/24 is out the range of cluster cidr 10.42.0.0/16"
        );
        // A smaller range marks the subnet that holds it.
        set.occupy(&cidr("10.42.9.128/25")).expect("inside");
        assert_eq!(set.used_count(), 5);
    }

    #[test]
    fn a_full_range_says_so() {
        let mut set = CidrSet::new(cidr("10.42.0.0/23"), 24).expect("valid");
        set.allocate_next().expect("first");
        set.allocate_next().expect("second");
        assert_eq!(set.allocate_next().unwrap_err(), NO_CIDRS_REMAINING);
    }

    #[test]
    fn a_service_range_inside_the_cluster_range_is_kept_out() {
        let mut set = CidrSet::new(cidr("10.0.0.0/8"), 16).expect("valid");
        set.occupy(&cidr("10.0.0.0/15")).expect("overlaps");
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "10.2.0.0/16"
        );
        // A range containing the whole cluster range fills it.
        let mut small = CidrSet::new(cidr("10.42.0.0/23"), 24).expect("valid");
        small.occupy(&cidr("10.0.0.0/8")).expect("overlaps");
        assert!(small.allocate_next().is_err());
    }

    #[test]
    fn ipv6_ranges_allocate_too() {
        let mut set = CidrSet::new(cidr("fd00:42::/56"), 64).expect("valid");
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "fd00:42::/64"
        );
        assert_eq!(
            set.allocate_next().expect("room").to_string(),
            "fd00:42:0:1::/64"
        );
        assert!(
            CidrSet::new(cidr("fd00::/32"), 64).is_err(),
            "32 bits of subnets"
        );
    }

    #[test]
    fn the_flags_are_checked() {
        let c = NodeIpamConfig::default();
        assert!(c.allocate_node_cidrs);
        assert_eq!(c.cluster_cidrs[0].to_string(), "10.42.0.0/16");
        assert_eq!(c.node_mask_sizes, [24]);
        let dual = NodeIpamConfig::parse(true, "10.42.0.0/16,fd00:42::/56", None, None)
            .expect("dual stack");
        assert_eq!(dual.node_mask_sizes, [24, 64]);
        assert_eq!(
            NodeIpamConfig::parse(true, "10.42.0.0/16,fd00:42::/56", Some(24), None).unwrap_err(),
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters"
        );
        assert!(NodeIpamConfig::parse(true, "10.42.0.0/16,10.43.0.0/16", None, None).is_err());
        assert!(
            NodeIpamConfig::parse(true, "10.42.0.0/24", Some(16), None)
                .unwrap_err()
                .contains("must be less than or equal to the node CIDR mask size")
        );
        assert!(NodeIpamConfig::parse(true, "", None, None).is_err());
        assert!(NodeIpamConfig::parse(false, "", None, None).is_ok());
    }
}
