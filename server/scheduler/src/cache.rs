//! The scheduler cache (Kubernetes' `pkg/scheduler/backend/cache/cache.go`): every node's
//! [`NodeInfo`] with the pods bound — or assumed — to it, written by the informers' event
//! handlers and read by each scheduling cycle through a [`Snapshot`].
//!
//! `docs/tricks.md` #1, copy-on-write NodeInfo snapshots with generation stamps: the
//! NodeInfos sit on a doubly-linked list ordered by recency (the most
//! recently changed at the head), and every change stamps the changed NodeInfo with the next
//! value of one monotonic `generation` counter. [`Cache::update_snapshot`] walks from the
//! head only while the stamps are newer than the snapshot's generation, so a cycle after two
//! nodes changed clones two NodeInfos, not five thousand; the unchanged ones stay shared, by
//! `Arc`, with the previous cycle. The cycle then reads the snapshot without any lock.
//!
//! Invariants:
//! - the list holds each NodeInfo once, in strictly decreasing `generation` from the head,
//!   and every stamp is at most `generation` (checked in debug builds);
//! - a snapshot whose generation is `g` holds a clone of every NodeInfo as it was at `g`;
//!   `node_info_list` follows the node tree's zone-interleaved order as of the last time a
//!   node was added or removed, and the affinity lists are its subsequences;
//! - a pod is in `pod_states` exactly when it is on its node's NodeInfo; it is in `assumed`
//!   only while the apiserver has not confirmed the binding.
//!
//! The list is a slab (`Vec` of slots linked by index), not pointers: no `unsafe`, and a
//! move to the head is O(1).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::framework::{NodeInfo, PodInfo, Snapshot, pod_key};

/// How long an assumed pod whose binding finished may wait for the informer to confirm it
/// before the cache drops it. Kubernetes' `durationToExpireAssumedPod` is 0 since 1.25, and
/// 0 means *never expire*: expiry raced with slow binds on big clusters and let a node be
/// double-booked (kubernetes/kubernetes#106361, PR #110925). We keep the mechanism (a
/// nonzero TTL passed to [`Cache::new`] enables it) and default to Kubernetes' 0.
pub const DURATION_TO_EXPIRE_ASSUMED_POD: Duration = Duration::ZERO;

/// How often [`Cache::run_cleanup`] looks for expired assumed pods (Kubernetes'
/// `cleanAssumedPeriod`). Only matters with a nonzero TTL; a sweep is O(assumed pods).
pub const CLEAN_ASSUMED_PERIOD: Duration = Duration::from_secs(1);

/// Node labels that name a node's zone and region; the current name first, then the
/// deprecated `failure-domain.beta` one that old nodes still carry (Kubernetes'
/// `utilnode.GetZoneKey`).
const ZONE_LABELS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
];
const REGION_LABELS: [&str; 2] = [
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
];

/// Why a cache operation was refused. Each is an event arriving in an order the cache does
/// not expect; the caller logs it and carries on (the cache is unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The pod has no UID, the cache's key for it.
    #[error("pod {name} has no uid")]
    NoUid { name: String },
    /// The pod names no node to be added or assumed to.
    #[error("pod {key} has no spec.nodeName")]
    NoNodeName { key: String },
    /// `assume_pod` of a pod the cache already has.
    #[error("pod {key} is in the cache, so can't be assumed")]
    AlreadyInCache { key: String },
    /// `add_pod` of a pod already added (not assumed).
    #[error("pod {key} was already in added state")]
    AlreadyAdded { key: String },
    /// Update, removal or binding of a pod the cache does not have.
    #[error("pod {key} is not found in scheduler cache")]
    PodNotFound { key: String },
    /// `forget_pod` of a pod that is not assumed.
    #[error("pod {key} wasn't assumed so cannot be forgotten")]
    NotAssumed { key: String },
    /// `forget_pod` naming another node than the one the pod was assumed on.
    #[error("pod {key} was assumed on {assumed} but assigned to {given}")]
    NodeMismatch {
        key: String,
        assumed: String,
        given: String,
    },
    /// `update_pod` of an assumed pod (an assumed pod gets an Add before any Update).
    #[error("assumed pod {key} should not be updated")]
    AssumedPodUpdated { key: String },
    /// `remove_node` of a node the cache does not have.
    #[error("node {name} is not found")]
    NodeNotFound { name: String },
}

/// One NodeInfo on the recency list (Kubernetes' `nodeInfoListItem`).
#[derive(Debug)]
struct Item {
    /// Unshared between snapshots: [`Cache::update_snapshot`] deep-clones, so mutating
    /// through `Arc::make_mut` never copies.
    info: Arc<NodeInfo>,
    name: String,
    /// Towards the head (more recent).
    prev: Option<usize>,
    /// Towards the tail (older).
    next: Option<usize>,
}

/// A pod the cache holds (Kubernetes' `podState`).
#[derive(Debug)]
struct PodState {
    info: Arc<PodInfo>,
    /// When an assumed pod expires; `None` while binding or with a zero TTL (never).
    deadline: Option<Instant>,
    /// Set by `finish_binding`; an assumed pod never expires before its bind returns.
    binding_finished: bool,
}

/// Node names grouped by zone, listed round-robin across zones (Kubernetes' `nodeTree`), so
/// that the scheduler's sampling of the first nodes of the list spreads over zones.
#[derive(Debug, Default)]
struct NodeTree {
    /// Zone keys in the order their first node arrived.
    zones: Vec<String>,
    /// Node names per zone key, in arrival order.
    tree: HashMap<String, Vec<String>>,
    /// Each node's zone key (so an update needs no old object).
    zone_of: HashMap<String, String>,
    /// Bumped whenever `list()` would change (a node added, removed or moved zone).
    version: u64,
}

/// The key of a node's zone: region and zone joined with a NUL-guarded separator (a label
/// value may contain `:`, never NUL); "" when the node has neither label.
fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let first = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| labels.and_then(|l| l.get(*k)))
            .cloned()
            .unwrap_or_default()
    };
    let (zone, region) = (first(ZONE_LABELS), first(REGION_LABELS));
    if zone.is_empty() && region.is_empty() {
        String::new()
    } else {
        format!("{region}:\0:{zone}")
    }
}

impl NodeTree {
    fn num_nodes(&self) -> usize {
        self.zone_of.len()
    }

    /// Adds `node`, or moves it if its zone changed.
    fn upsert(&mut self, name: &str, node: &Node) {
        let zone = zone_key(node);
        match self.zone_of.get(name) {
            Some(current) if *current == zone => return,
            Some(_) => self.remove(name),
            None => {}
        }
        let names = self.tree.entry(zone.clone()).or_insert_with(|| {
            self.zones.push(zone.clone());
            Vec::new()
        });
        names.push(name.to_string());
        self.zone_of.insert(name.to_string(), zone);
        self.version += 1;
    }

    fn remove(&mut self, name: &str) {
        let Some(zone) = self.zone_of.remove(name) else {
            return;
        };
        self.version += 1;
        if let Some(names) = self.tree.get_mut(&zone) {
            names.retain(|n| n != name);
            if names.is_empty() {
                self.tree.remove(&zone);
                self.zones.retain(|z| *z != zone);
            }
        }
    }

    /// All node names, one per zone in turn: the first node of each zone, then the second…
    fn list(&self) -> Vec<&str> {
        let mut out = Vec::with_capacity(self.num_nodes());
        let zones: Vec<&Vec<String>> = self.zones.iter().filter_map(|z| self.tree.get(z)).collect();
        let longest = zones.iter().map(|names| names.len()).max().unwrap_or(0);
        for index in 0..longest {
            out.extend(
                zones
                    .iter()
                    .filter_map(|names| names.get(index))
                    .map(String::as_str),
            );
        }
        out
    }
}

/// Everything behind the cache's lock.
#[derive(Debug, Default)]
struct CacheState {
    /// The last generation handed out; bumped by every change to any NodeInfo.
    generation: i64,
    /// The recency list's slots; `None` slots are on `free`.
    slots: Vec<Option<Item>>,
    free: Vec<usize>,
    head: Option<usize>,
    /// Node name → slot.
    nodes: HashMap<String, usize>,
    tree: NodeTree,
    /// Pod UID → state.
    pod_states: HashMap<String, PodState>,
    /// UIDs of assumed pods (a subset of `pod_states`' keys).
    assumed: HashSet<String>,
    /// Image name → (size, nodes that have it), for `ImageStateSummary::num_nodes`.
    images: HashMap<String, (i64, HashSet<String>)>,
    /// Where each node sits in the `node_info_list` this cache last built, and in its two
    /// affinity lists. Lets `update_snapshot` replace a changed NodeInfo's `Arc` in O(1)
    /// instead of rebuilding the lists; each use is verified with `Arc::ptr_eq`, so a
    /// snapshot that was not the last one built falls back to a rebuild.
    list_positions: HashMap<String, usize>,
    affinity_positions: HashMap<String, usize>,
    anti_affinity_positions: HashMap<String, usize>,
    /// The node tree's version when `list_positions` was built: a zone move changes the
    /// tree's order without adding or removing a node, and Kubernetes keeps the stale order
    /// until the next add/remove; comparing versions rebuilds the list at once instead.
    list_tree_version: u64,
    /// NodeInfos deep-cloned into snapshots since the cache was created.
    clones_total: u64,
    /// Times a snapshot's `node_info_list` was rebuilt from the node tree (O(nodes)).
    list_rebuilds_total: u64,
}

/// The scheduler cache. Shared by `Arc` between the informer handlers and the scheduling
/// loop.
#[derive(Debug)]
pub struct Cache {
    /// One `Mutex`, not a `RwLock`: nearly every access writes (events, and
    /// `update_snapshot` writes position maps), each critical section is short and has no
    /// `.await`, and the cycle holds it only while updating its snapshot.
    state: Mutex<CacheState>,
    /// How long an assumed pod may wait for confirmation after its bind (zero: forever).
    ttl: Duration,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(DURATION_TO_EXPIRE_ASSUMED_POD)
    }
}

fn key_of(pod: &Pod) -> Result<String, CacheError> {
    pod_key(pod)
        .map(str::to_string)
        .ok_or_else(|| CacheError::NoUid {
            name: pod.metadata.name.clone().unwrap_or_default(),
        })
}

fn node_name_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

impl CacheState {
    fn item(&self, slot: usize) -> Option<&Item> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    fn item_mut(&mut self, slot: usize) -> Option<&mut Item> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// The slot of `name`, creating an empty (node-less) NodeInfo if it is unknown.
    fn slot_or_insert(&mut self, name: &str) -> usize {
        if let Some(slot) = self.nodes.get(name) {
            return *slot;
        }
        let item = Item {
            info: Arc::new(NodeInfo::default()),
            name: name.to_string(),
            prev: None,
            next: None,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(item);
                slot
            }
            None => {
                self.slots.push(Some(item));
                self.slots.len() - 1
            }
        };
        self.nodes.insert(name.to_string(), slot);
        self.link_at_head(slot);
        slot
    }

    fn unlink(&mut self, slot: usize) {
        let Some((prev, next)) = self.item(slot).map(|i| (i.prev, i.next)) else {
            return;
        };
        match prev {
            Some(p) => {
                if let Some(item) = self.item_mut(p) {
                    item.next = next;
                }
            }
            None => self.head = next,
        }
        if let Some(n) = next
            && let Some(item) = self.item_mut(n)
        {
            item.prev = prev;
        }
        if let Some(item) = self.item_mut(slot) {
            item.prev = None;
            item.next = None;
        }
    }

    fn link_at_head(&mut self, slot: usize) {
        let old_head = self.head;
        if let Some(h) = old_head
            && let Some(item) = self.item_mut(h)
        {
            item.prev = Some(slot);
        }
        if let Some(item) = self.item_mut(slot) {
            item.prev = None;
            item.next = old_head;
        }
        self.head = Some(slot);
    }

    /// Applies `change` to `name`'s NodeInfo, stamps it with the next generation and moves
    /// it to the head of the list (Kubernetes bumps in the NodeInfo, then `moveNodeInfoToHead`).
    fn change_node<R>(&mut self, name: &str, change: impl FnOnce(&mut NodeInfo) -> R) -> R {
        let slot = self.slot_or_insert(name);
        self.generation += 1;
        let generation = self.generation;
        self.unlink(slot);
        self.link_at_head(slot);
        let item = self.slots[slot]
            .as_mut()
            .expect("slot_or_insert returned a live slot");
        let info = Arc::make_mut(&mut item.info);
        let result = change(info);
        info.generation = generation;
        result
    }

    /// Drops `name`'s NodeInfo from the list entirely (no node object, no pods).
    fn remove_item(&mut self, name: &str) {
        if let Some(slot) = self.nodes.remove(name) {
            self.unlink(slot);
            self.slots[slot] = None;
            self.free.push(slot);
        }
    }

    fn add_pod_locked(
        &mut self,
        key: String,
        info: Arc<PodInfo>,
        assumed: bool,
    ) -> Result<(), CacheError> {
        let node = node_name_of(&info.pod).to_string();
        if node.is_empty() {
            return Err(CacheError::NoNodeName { key });
        }
        let stored = info.clone();
        self.change_node(&node, |n| n.add_pod(stored));
        self.pod_states.insert(
            key.clone(),
            PodState {
                info,
                deadline: None,
                binding_finished: false,
            },
        );
        if assumed {
            self.assumed.insert(key);
        }
        Ok(())
    }

    /// Removes the stored pod `key` from its node (Kubernetes' `removePod`); a node-less
    /// NodeInfo left with no pods leaves the list.
    fn remove_pod_locked(&mut self, key: &str) {
        let Some(state) = self.pod_states.remove(key) else {
            return;
        };
        self.assumed.remove(key);
        let node = node_name_of(&state.info.pod).to_string();
        if !self.nodes.contains_key(&node) {
            tracing::error!(node = %node, pod = %key, "node not found when trying to remove pod");
            return;
        }
        let (removed, ghost_empty) = self.change_node(&node, |n| {
            (
                n.remove_pod(&state.info.pod),
                n.node.is_none() && n.pods.is_empty(),
            )
        });
        if !removed {
            tracing::error!(node = %node, pod = %key, "pod in cache was not on its node");
        }
        if ghost_empty {
            self.remove_item(&node);
        }
    }

    /// Records that node `name` has `node`'s images.
    fn add_images(&mut self, node: &Node, name: &str) {
        for image in node.status.iter().flat_map(|s| s.images.iter().flatten()) {
            for image_name in image.names.iter().flatten() {
                let entry = self
                    .images
                    .entry(image_name.clone())
                    .or_insert_with(|| (image.size_bytes.unwrap_or(0), HashSet::new()));
                entry.1.insert(name.to_string());
            }
        }
    }

    fn remove_images(&mut self, node: Option<&Node>, name: &str) {
        for image in node
            .iter()
            .flat_map(|n| n.status.iter())
            .flat_map(|s| s.images.iter().flatten())
        {
            for image_name in image.names.iter().flatten() {
                if let Some((_, nodes)) = self.images.get_mut(image_name) {
                    nodes.remove(name);
                    if nodes.is_empty() {
                        self.images.remove(image_name);
                    }
                }
            }
        }
    }

    /// A deep clone of `info` for a snapshot, its image counts taken from the whole cache.
    fn snapshot_clone(&self, info: &NodeInfo) -> NodeInfo {
        let mut clone = info.clone();
        for (name, summary) in &mut clone.image_states {
            if let Some((_, nodes)) = self.images.get(name) {
                summary.num_nodes = nodes.len();
            }
        }
        clone
    }

    /// Rebuilds the snapshot's lists (Kubernetes' `updateNodeInfoSnapshotList`): the node list
    /// from the node tree when `all`, the affinity lists always; and the position maps.
    fn rebuild_lists(&mut self, snapshot: &mut Snapshot, all: bool) {
        if all {
            self.list_rebuilds_total += 1;
            let mut list = Vec::with_capacity(self.tree.num_nodes());
            for name in self.tree.list() {
                match snapshot.node_info_map.get(name) {
                    Some(info) => list.push(info.clone()),
                    None => tracing::error!(node = %name, "node in node tree but not in snapshot"),
                }
            }
            snapshot.node_info_list = list;
            self.list_tree_version = self.tree.version;
            self.list_positions = snapshot
                .node_info_list
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name().to_string(), i))
                .collect();
        }
        snapshot.have_pods_with_affinity_list = snapshot
            .node_info_list
            .iter()
            .filter(|n| !n.pods_with_affinity.is_empty())
            .cloned()
            .collect();
        snapshot.have_pods_with_required_anti_affinity_list = snapshot
            .node_info_list
            .iter()
            .filter(|n| !n.pods_with_required_anti_affinity.is_empty())
            .cloned()
            .collect();
        let positions = |list: &[Arc<NodeInfo>]| -> HashMap<String, usize> {
            list.iter()
                .enumerate()
                .map(|(i, n)| (n.name().to_string(), i))
                .collect()
        };
        self.affinity_positions = positions(&snapshot.have_pods_with_affinity_list);
        self.anti_affinity_positions =
            positions(&snapshot.have_pods_with_required_anti_affinity_list);
    }

    /// The body of [`Cache::update_snapshot`].
    fn update_snapshot(&mut self, snapshot: &mut Snapshot) -> usize {
        let mut update_all_lists = false;
        let mut update_affinity_lists = false;
        let mut clones = 0;
        // (name, the snapshot's old Arc, the new one) for each changed node already there.
        let mut replaced: Vec<(String, Arc<NodeInfo>, Arc<NodeInfo>)> = Vec::new();

        let mut cursor = self.head;
        while let Some(slot) = cursor {
            let Some(item) = self.item(slot) else { break };
            if item.info.generation <= snapshot.generation {
                // Everything further down changed before the snapshot was taken.
                break;
            }
            cursor = item.next;
            if item.info.node.is_none() {
                continue;
            }
            let clone = Arc::new(self.snapshot_clone(&item.info));
            clones += 1;
            match snapshot
                .node_info_map
                .insert(item.name.clone(), clone.clone())
            {
                None => update_all_lists = true,
                Some(old) => {
                    if old.pods_with_affinity.is_empty() != clone.pods_with_affinity.is_empty()
                        || old.pods_with_required_anti_affinity.is_empty()
                            != clone.pods_with_required_anti_affinity.is_empty()
                    {
                        update_affinity_lists = true;
                    }
                    replaced.push((item.name.clone(), old, clone));
                }
            }
        }
        snapshot.generation = self.generation;
        self.clones_total += clones as u64;

        if self.list_tree_version != self.tree.version {
            update_all_lists = true;
        }
        // Deleted nodes (and ghosts) are in the map but not in the tree.
        if snapshot.node_info_map.len() > self.tree.num_nodes() {
            let tree = &self.tree;
            snapshot
                .node_info_map
                .retain(|name, _| tree.zone_of.contains_key(name));
            update_all_lists = true;
        }

        if !update_all_lists {
            for (name, old, new) in &replaced {
                if !patch(
                    &mut snapshot.node_info_list,
                    &self.list_positions,
                    name,
                    old,
                    new,
                ) {
                    update_all_lists = true;
                    break;
                }
                if update_affinity_lists {
                    continue;
                }
                if !new.pods_with_affinity.is_empty()
                    && !patch(
                        &mut snapshot.have_pods_with_affinity_list,
                        &self.affinity_positions,
                        name,
                        old,
                        new,
                    )
                {
                    update_affinity_lists = true;
                }
                if !new.pods_with_required_anti_affinity.is_empty()
                    && !patch(
                        &mut snapshot.have_pods_with_required_anti_affinity_list,
                        &self.anti_affinity_positions,
                        name,
                        old,
                        new,
                    )
                {
                    update_affinity_lists = true;
                }
            }
        }
        if update_all_lists || update_affinity_lists {
            self.rebuild_lists(snapshot, update_all_lists);
        }

        if snapshot.node_info_list.len() != self.tree.num_nodes() {
            tracing::error!(
                list = snapshot.node_info_list.len(),
                tree = self.tree.num_nodes(),
                map = snapshot.node_info_map.len(),
                "snapshot state is not consistent; rebuilding its lists"
            );
            self.rebuild_lists(snapshot, true);
        }
        clones
    }

    #[cfg(debug_assertions)]
    fn debug_check_consistency(&self) {
        let mut seen = 0;
        let mut cursor = self.head;
        let mut previous_generation = i64::MAX;
        while let Some(slot) = cursor {
            let item = self.item(slot).expect("a linked slot is live");
            let generation = item.info.generation;
            assert!(
                generation < previous_generation,
                "list not in decreasing generation: {generation} after {previous_generation}"
            );
            assert!(
                generation <= self.generation,
                "stamp {generation} > counter {}",
                self.generation
            );
            previous_generation = generation;
            seen += 1;
            cursor = item.next;
        }
        assert_eq!(seen, self.nodes.len(), "list length != node map length");
        for key in &self.assumed {
            assert!(
                self.pod_states.contains_key(key),
                "assumed pod {key} has no state"
            );
        }
    }
}

/// Replaces `old` by `new` at `name`'s recorded position in `list`; false if the position is
/// unknown or does not hold `old` (the snapshot was not the one the positions describe).
fn patch(
    list: &mut [Arc<NodeInfo>],
    positions: &HashMap<String, usize>,
    name: &str,
    old: &Arc<NodeInfo>,
    new: &Arc<NodeInfo>,
) -> bool {
    match positions.get(name).and_then(|i| list.get_mut(*i)) {
        Some(slot) if Arc::ptr_eq(slot, old) => {
            *slot = new.clone();
            true
        }
        _ => false,
    }
}

impl Cache {
    /// An empty cache whose assumed pods expire `ttl` after their bind finished (zero: never;
    /// see [`DURATION_TO_EXPIRE_ASSUMED_POD`]).
    pub fn new(ttl: Duration) -> Cache {
        Cache {
            state: Mutex::new(CacheState::default()),
            ttl,
        }
    }

    /// Adds a node, or replaces the node object of one the cache knows (also from its pods).
    pub fn add_node(&self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut state = self.state.lock();
        let previous = state
            .nodes
            .get(&name)
            .and_then(|slot| state.item(*slot))
            .and_then(|item| item.info.node.clone());
        state.remove_images(previous.as_deref(), &name);
        state.add_images(&node, &name);
        state.tree.upsert(&name, &node);
        state.change_node(&name, |info| info.set_node(node));
        #[cfg(debug_assertions)]
        state.debug_check_consistency();
    }

    /// A node changed (allocatable, labels, images…); same as [`Cache::add_node`]. A zone
    /// change moves the node in the node tree.
    pub fn update_node(&self, node: Arc<Node>) {
        self.add_node(node);
    }

    /// Removes a node (Kubernetes' `RemoveNode`). Its pods' deletions come on another watch
    /// and may lag, so a node with pods left stays as a node-less "ghost" NodeInfo — never in
    /// a snapshot — until its last pod is removed.
    pub fn remove_node(&self, name: &str) -> Result<(), CacheError> {
        let mut state = self.state.lock();
        let Some(slot) = state.nodes.get(name).copied() else {
            return Err(CacheError::NodeNotFound {
                name: name.to_string(),
            });
        };
        let previous = state.item(slot).and_then(|i| i.info.node.clone());
        state.remove_images(previous.as_deref(), name);
        state.tree.remove(name);
        let empty = state.change_node(name, |info| {
            info.remove_node();
            info.pods.is_empty()
        });
        if empty {
            state.remove_item(name);
        }
        #[cfg(debug_assertions)]
        state.debug_check_consistency();
        Ok(())
    }

    /// Adds a pod the scheduler has chosen a node for, before the apiserver confirms it, so
    /// the next cycles see the node's resources as taken (Kubernetes' `AssumePod`). The pod
    /// must carry `spec.nodeName`.
    pub fn assume_pod(&self, pod_info: Arc<PodInfo>) -> Result<(), CacheError> {
        let key = key_of(&pod_info.pod)?;
        let mut state = self.state.lock();
        if state.pod_states.contains_key(&key) {
            return Err(CacheError::AlreadyInCache { key });
        }
        state.add_pod_locked(key, pod_info, true)
    }

    /// The bind of an assumed pod returned: its expiry clock may start (Kubernetes'
    /// `FinishBinding`).
    pub fn finish_binding(&self, pod: &Pod) -> Result<(), CacheError> {
        self.finish_binding_at(pod, Instant::now())
    }

    /// [`Cache::finish_binding`] at `now` (tests pass the time).
    pub fn finish_binding_at(&self, pod: &Pod, now: Instant) -> Result<(), CacheError> {
        let key = key_of(pod)?;
        let mut state = self.state.lock();
        let assumed = state.assumed.contains(&key);
        let ttl = self.ttl;
        match state.pod_states.get_mut(&key) {
            Some(pod_state) if assumed => {
                pod_state.deadline = (!ttl.is_zero()).then(|| now + ttl);
                pod_state.binding_finished = true;
                Ok(())
            }
            // Kubernetes ignores a finished binding of a pod already confirmed.
            Some(_) => Ok(()),
            None => Err(CacheError::PodNotFound { key }),
        }
    }

    /// Drops an assumed pod whose bind failed (Kubernetes' `ForgetPod`).
    pub fn forget_pod(&self, pod: &Pod) -> Result<(), CacheError> {
        let key = key_of(pod)?;
        let mut state = self.state.lock();
        let Some(current) = state.pod_states.get(&key) else {
            return Err(CacheError::NotAssumed { key });
        };
        let assumed_on = node_name_of(&current.info.pod);
        let given = node_name_of(pod);
        if assumed_on != given {
            return Err(CacheError::NodeMismatch {
                assumed: assumed_on.to_string(),
                given: given.to_string(),
                key,
            });
        }
        if !state.assumed.contains(&key) {
            return Err(CacheError::NotAssumed { key });
        }
        state.remove_pod_locked(&key);
        Ok(())
    }

    /// An assigned pod arrived from the informer (Kubernetes' `AddPod`): confirms an assumed
    /// pod (replacing the assumed copy with the apiserver's, possibly on another node), or
    /// re-adds one that expired.
    pub fn add_pod(&self, pod: Arc<Pod>) -> Result<(), CacheError> {
        let key = key_of(&pod)?;
        // Parse the affinity terms before taking the lock.
        let info = Arc::new(PodInfo::new(pod));
        let mut state = self.state.lock();
        let assumed = state.assumed.contains(&key);
        match state.pod_states.get(&key) {
            Some(current) if assumed => {
                let assumed_on = node_name_of(&current.info.pod).to_string();
                let added_on = node_name_of(&info.pod).to_string();
                if assumed_on != added_on {
                    tracing::info!(pod = %key, assumed_node = %assumed_on, node = %added_on,
                        "pod was added to a different node than it was assumed");
                }
                state.remove_pod_locked(&key);
                state.add_pod_locked(key, info, false)
            }
            Some(_) => Err(CacheError::AlreadyAdded { key }),
            None => state.add_pod_locked(key, info, false),
        }
    }

    /// An added pod changed (Kubernetes' `UpdatePod`).
    pub fn update_pod(&self, old: &Pod, new: Arc<Pod>) -> Result<(), CacheError> {
        let key = key_of(old)?;
        let info = Arc::new(PodInfo::new(new));
        let mut state = self.state.lock();
        let Some(current) = state.pod_states.get(&key) else {
            return Err(CacheError::PodNotFound { key });
        };
        if state.assumed.contains(&key) {
            return Err(CacheError::AssumedPodUpdated { key });
        }
        let current_node = node_name_of(&current.info.pod);
        let new_node = node_name_of(&info.pod);
        if current_node != new_node {
            // Kubernetes exits here: a pod's node never changes. We repair instead (remove from
            // the old node, add to the new) and say loudly that something upstream is wrong.
            tracing::error!(pod = %key, node = %current_node, new_node = %new_node,
                "pod updated on a different node than previously added to; scheduler cache was corrupted");
        }
        state.remove_pod_locked(&key);
        state.add_pod_locked(key, info, false)
    }

    /// A pod was deleted (Kubernetes' `RemovePod`); the copy the cache holds is removed.
    pub fn remove_pod(&self, pod: &Pod) -> Result<(), CacheError> {
        let key = key_of(pod)?;
        let mut state = self.state.lock();
        let Some(current) = state.pod_states.get(&key) else {
            return Err(CacheError::PodNotFound { key });
        };
        let given = node_name_of(pod);
        let stored = node_name_of(&current.info.pod);
        // An empty nodeName is a tombstone's last known state; anything else is corruption.
        if !given.is_empty() && given != stored {
            tracing::error!(pod = %key, node = %stored, given_node = %given,
                "pod removed from a different node than it was added to; scheduler cache was corrupted");
        }
        state.remove_pod_locked(&key);
        Ok(())
    }

    /// Whether the pod is assumed (not yet confirmed by the informer).
    pub fn is_assumed_pod(&self, pod: &Pod) -> bool {
        pod_key(pod).is_some_and(|key| self.state.lock().assumed.contains(key))
    }

    /// The cache's copy of the pod, if any.
    pub fn get_pod(&self, pod: &Pod) -> Option<Arc<Pod>> {
        let key = pod_key(pod)?;
        self.state
            .lock()
            .pod_states
            .get(key)
            .map(|s| s.info.pod.clone())
    }

    /// Removes assumed pods whose bind finished more than the TTL before `now` and that were
    /// never confirmed; returns how many (Kubernetes' `cleanupAssumedPods`). With a zero TTL
    /// nothing ever expires.
    pub fn cleanup_expired_assumed_pods(&self, now: Instant) -> usize {
        let mut state = self.state.lock();
        let expired: Vec<String> = state
            .assumed
            .iter()
            .filter(|key| {
                state.pod_states.get(*key).is_some_and(|s| {
                    s.binding_finished && s.deadline.is_some_and(|deadline| now > deadline)
                })
            })
            .cloned()
            .collect();
        for key in &expired {
            tracing::info!(pod = %key, "assumed pod expired");
            state.remove_pod_locked(key);
        }
        expired.len()
    }

    /// Sweeps expired assumed pods every [`CLEAN_ASSUMED_PERIOD`] until `stop` (Kubernetes'
    /// `cache.run`). Returns at once with a zero TTL: nothing could expire.
    pub async fn run_cleanup(self: Arc<Self>, stop: CancellationToken) {
        if self.ttl.is_zero() {
            return;
        }
        let mut ticker = tokio::time::interval(CLEAN_ASSUMED_PERIOD);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {
                    self.cleanup_expired_assumed_pods(Instant::now());
                }
            }
        }
    }

    /// Brings `snapshot` up to date and returns how many NodeInfos were cloned into it
    /// (Kubernetes' `UpdateSnapshot`, called at the start of every cycle).
    ///
    /// Walks the recency list from the head while the stamps are newer than the snapshot's
    /// generation, deep-cloning only those NodeInfos (node-less ghosts are skipped); drops
    /// deleted nodes; rebuilds `node_info_list` (zone-interleaved, from the node tree) only
    /// when a node was added or removed, and the affinity lists only when a node started or
    /// stopped having such pods — otherwise each changed entry is replaced in place.
    pub fn update_snapshot(&self, snapshot: &mut Snapshot) -> usize {
        self.state.lock().update_snapshot(snapshot)
    }

    /// A new snapshot of the whole cache (every node cloned).
    ///
    /// The position maps keep describing the snapshot last passed to
    /// [`Cache::update_snapshot`], so the scheduler's incremental updates stay O(changed).
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let mut state = self.state.lock();
        let saved = (
            std::mem::take(&mut state.list_positions),
            std::mem::take(&mut state.affinity_positions),
            std::mem::take(&mut state.anti_affinity_positions),
            state.list_tree_version,
        );
        state.update_snapshot(&mut snapshot);
        (
            state.list_positions,
            state.affinity_positions,
            state.anti_affinity_positions,
            state.list_tree_version,
        ) = saved;
        snapshot
    }

    /// Nodes the cache holds, ghosts included.
    pub fn node_count(&self) -> usize {
        self.state.lock().nodes.len()
    }

    /// Pods the cache holds, assumed ones included.
    pub fn pod_count(&self) -> usize {
        self.state.lock().pod_states.len()
    }

    /// Assumed pods not yet confirmed.
    pub fn assumed_pod_count(&self) -> usize {
        self.state.lock().assumed.len()
    }

    /// The current generation.
    pub fn generation(&self) -> i64 {
        self.state.lock().generation
    }

    /// NodeInfos deep-cloned into snapshots since the cache was created.
    pub fn clones_total(&self) -> u64 {
        self.state.lock().clones_total
    }

    /// Times a snapshot's node list was rebuilt whole (a node added or removed, a zone
    /// moved, or a snapshot the cache did not last update); otherwise updates are O(changed).
    pub fn list_rebuilds_total(&self) -> u64 {
        self.state.lock().list_rebuilds_total
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Affinity, Container, ContainerImage, NodeStatus, PodAffinityTerm, PodAntiAffinity, PodSpec,
        ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn node_in(name: &str, zone: &str) -> Arc<Node> {
        let labels: BTreeMap<String, String> = if zone.is_empty() {
            BTreeMap::new()
        } else {
            [("topology.kubernetes.io/zone".to_string(), zone.to_string())].into()
        };
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_string(), Quantity("4".into())),
                        ("memory".to_string(), Quantity("8Gi".into())),
                        ("pods".to_string(), Quantity("110".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn node(name: &str) -> Arc<Node> {
        node_in(name, "")
    }

    fn pod(uid: &str, node: &str, cpu: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("pod-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: (!node.is_empty()).then(|| node.to_string()),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn anti_affinity_pod(uid: &str, node: &str) -> Pod {
        let mut p = pod(uid, node, "100m");
        if let Some(spec) = p.spec.as_mut() {
            spec.affinity = Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![
                        PodAffinityTerm {
                            topology_key: "kubernetes.io/hostname".into(),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        p
    }

    fn info(p: &Pod) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(p.clone())))
    }

    fn names(list: &[Arc<NodeInfo>]) -> Vec<&str> {
        list.iter().map(|n| n.name()).collect()
    }

    /// Asserts `snapshot` equals a snapshot built from scratch, Arc by Arc consistent.
    fn assert_matches_fresh(cache: &Cache, snapshot: &Snapshot) {
        let fresh = cache.snapshot();
        assert_eq!(
            names(&snapshot.node_info_list),
            names(&fresh.node_info_list)
        );
        assert_eq!(
            names(&snapshot.have_pods_with_affinity_list),
            names(&fresh.have_pods_with_affinity_list)
        );
        assert_eq!(
            names(&snapshot.have_pods_with_required_anti_affinity_list),
            names(&fresh.have_pods_with_required_anti_affinity_list)
        );
        assert_eq!(snapshot.node_info_map.len(), fresh.node_info_map.len());
        for (name, info) in &fresh.node_info_map {
            let ours = &snapshot.node_info_map[name];
            assert_eq!(ours.requested, info.requested, "{name}");
            assert_eq!(ours.pods.len(), info.pods.len(), "{name}");
        }
        // Every list entry is the map's Arc, not a stale copy.
        let lists = [
            &snapshot.node_info_list,
            &snapshot.have_pods_with_affinity_list,
            &snapshot.have_pods_with_required_anti_affinity_list,
        ];
        for entry in lists.into_iter().flatten() {
            assert!(Arc::ptr_eq(entry, &snapshot.node_info_map[entry.name()]));
        }
    }

    #[test]
    fn snapshot_clones_exactly_the_changed_nodes() {
        const NODES: usize = 5_000;
        let cache = Cache::default();
        for i in 0..NODES {
            cache.add_node(node_in(&format!("node-{i}"), &format!("zone-{}", i % 3)));
        }
        let mut snapshot = Snapshot::default();
        assert_eq!(
            cache.update_snapshot(&mut snapshot),
            NODES,
            "first snapshot clones all"
        );
        assert_eq!(snapshot.num_nodes(), NODES);
        let before = snapshot.clone();

        // Two nodes change: one by an assumed pod, one by an informer add.
        let mut assumed = pod("a", "node-17", "1");
        cache.assume_pod(info(&assumed)).unwrap();
        cache
            .add_pod(Arc::new(pod("b", "node-4321", "500m")))
            .unwrap();
        let rebuilds = cache.list_rebuilds_total();
        assert_eq!(
            cache.update_snapshot(&mut snapshot),
            2,
            "two nodes changed → two clones"
        );
        assert_eq!(
            cache.list_rebuilds_total(),
            rebuilds,
            "entries replaced in place"
        );
        assert_eq!(snapshot.get("node-17").unwrap().requested.milli_cpu, 1000);
        assert_eq!(snapshot.get("node-4321").unwrap().requested.milli_cpu, 500);
        let shared = snapshot
            .node_info_map
            .iter()
            .filter(|(name, info)| Arc::ptr_eq(info, &before.node_info_map[*name]))
            .count();
        assert_eq!(shared, NODES - 2, "the rest are the previous cycle's Arcs");
        assert!(Arc::ptr_eq(
            before.get("node-17").unwrap(),
            &before.node_info_list[names(&before.node_info_list)
                .iter()
                .position(|n| *n == "node-17")
                .unwrap()]
        ),);
        assert_matches_fresh(&cache, &snapshot);
        // The previous cycle's snapshot is untouched (copy-on-write).
        assert_eq!(before.get("node-17").unwrap().requested.milli_cpu, 0);

        assert_eq!(
            cache.update_snapshot(&mut snapshot),
            0,
            "nothing changed → nothing cloned"
        );
        // The same node changed twice between cycles is still one clone.
        cache.forget_pod(&assumed).unwrap();
        assumed.metadata.uid = Some("a2".into());
        cache.assume_pod(info(&assumed)).unwrap();
        let clones_before = cache.clones_total();
        assert_eq!(cache.update_snapshot(&mut snapshot), 1);
        assert_eq!(cache.clones_total(), clones_before + 1);
        assert_matches_fresh(&cache, &snapshot);
    }

    #[test]
    fn removed_nodes_vanish_from_the_snapshot() {
        let cache = Cache::default();
        for name in ["n1", "n2", "n3"] {
            cache.add_node(node(name));
        }
        let p = pod("p", "n2", "1");
        cache.add_pod(Arc::new(p.clone())).unwrap();
        let mut snapshot = cache.snapshot();
        assert_eq!(snapshot.num_nodes(), 3);

        cache.remove_node("n1").unwrap();
        // n2 has a pod whose deletion has not arrived: it stays in the cache as a ghost,
        // but not in the snapshot.
        cache.remove_node("n2").unwrap();
        assert_eq!(cache.node_count(), 2, "n2 is a ghost");
        cache.update_snapshot(&mut snapshot);
        assert_eq!(names(&snapshot.node_info_list), vec!["n3"]);
        assert!(snapshot.get("n1").is_none() && snapshot.get("n2").is_none());
        assert_matches_fresh(&cache, &snapshot);

        cache.remove_pod(&p).unwrap();
        assert_eq!(cache.node_count(), 1, "the ghost left with its last pod");
        assert_eq!(
            cache.remove_node("n1"),
            Err(CacheError::NodeNotFound { name: "n1".into() })
        );
        // A node coming back is a new node.
        cache.add_node(node("n1"));
        assert_eq!(cache.update_snapshot(&mut snapshot), 1);
        assert_eq!(names(&snapshot.node_info_list), vec!["n3", "n1"]);
    }

    #[test]
    fn affinity_lists_follow_pods_with_affinity() {
        let cache = Cache::default();
        for name in ["n1", "n2", "n3"] {
            cache.add_node(node(name));
        }
        let mut snapshot = cache.snapshot();
        assert!(snapshot.have_pods_with_affinity_list.is_empty());

        let anti = anti_affinity_pod("anti", "n2");
        cache.add_pod(Arc::new(anti.clone())).unwrap();
        cache.update_snapshot(&mut snapshot);
        assert_eq!(names(&snapshot.have_pods_with_affinity_list), vec!["n2"]);
        assert_eq!(
            names(&snapshot.have_pods_with_required_anti_affinity_list),
            vec!["n2"]
        );

        // Another pod on n2: the lists keep n2, but must hold the new NodeInfo.
        cache.add_pod(Arc::new(pod("plain", "n2", "1"))).unwrap();
        assert_eq!(cache.update_snapshot(&mut snapshot), 1);
        let n2 = snapshot.get("n2").unwrap();
        assert_eq!(n2.pods.len(), 2);
        assert!(Arc::ptr_eq(&snapshot.have_pods_with_affinity_list[0], n2));
        assert!(Arc::ptr_eq(
            &snapshot.have_pods_with_required_anti_affinity_list[0],
            n2
        ));

        cache.remove_pod(&anti).unwrap();
        cache.update_snapshot(&mut snapshot);
        assert!(snapshot.have_pods_with_affinity_list.is_empty());
        assert!(
            snapshot
                .have_pods_with_required_anti_affinity_list
                .is_empty()
        );
        assert_matches_fresh(&cache, &snapshot);
    }

    #[test]
    fn node_list_interleaves_zones() {
        // Reference: Kubernetes node_tree_test.go — nodes listed round-robin over zones in
        // the order the zones appeared.
        let cache = Cache::default();
        for (name, zone) in [
            ("a1", "a"),
            ("a2", "a"),
            ("b1", "b"),
            ("a3", "a"),
            ("c1", "c"),
            ("b2", "b"),
            ("none", ""),
        ] {
            cache.add_node(node_in(name, zone));
        }
        let mut snapshot = cache.snapshot();
        assert_eq!(
            names(&snapshot.node_info_list),
            vec!["a1", "b1", "c1", "none", "a2", "b2", "a3"]
        );
        // A node moving zone moves in the tree; the order changes at the next rebuild.
        cache.update_node(node_in("a1", "c"));
        cache.remove_node("none").unwrap();
        cache.update_snapshot(&mut snapshot);
        assert_eq!(
            names(&snapshot.node_info_list),
            vec!["a2", "b1", "c1", "a3", "b2", "a1"]
        );
        assert_matches_fresh(&cache, &snapshot);
    }

    #[test]
    fn assumed_pods_are_confirmed_forgotten_or_kept() {
        let cache = Cache::default();
        cache.add_node(node("n1"));
        cache.add_node(node("n2"));
        let p = pod("p", "n1", "1");
        cache.assume_pod(info(&p)).unwrap();
        assert!(cache.is_assumed_pod(&p));
        assert_eq!(
            cache.assume_pod(info(&p)),
            Err(CacheError::AlreadyInCache { key: "p".into() })
        );
        assert_eq!(
            cache.snapshot().get("n1").unwrap().requested.milli_cpu,
            1000
        );

        // The informer confirms it: no longer assumed, still counted once.
        cache.finish_binding(&p).unwrap();
        cache.add_pod(Arc::new(p.clone())).unwrap();
        assert!(!cache.is_assumed_pod(&p));
        assert_eq!(cache.snapshot().get("n1").unwrap().pods.len(), 1);
        assert_eq!(
            cache.forget_pod(&p),
            Err(CacheError::NotAssumed { key: "p".into() })
        );
        assert_eq!(
            cache.add_pod(Arc::new(p.clone())),
            Err(CacheError::AlreadyAdded { key: "p".into() })
        );

        // A failed bind forgets the assumed pod.
        let q = pod("q", "n2", "2");
        cache.assume_pod(info(&q)).unwrap();
        assert_eq!(
            cache.forget_pod(&pod("q", "n1", "2")),
            Err(CacheError::NodeMismatch {
                key: "q".into(),
                assumed: "n2".into(),
                given: "n1".into()
            })
        );
        cache.forget_pod(&q).unwrap();
        assert_eq!(cache.snapshot().get("n2").unwrap().requested.milli_cpu, 0);

        // Confirmed on another node than assumed: the apiserver wins.
        let r = pod("r", "n1", "1");
        cache.assume_pod(info(&r)).unwrap();
        cache.add_pod(Arc::new(pod("r", "n2", "1"))).unwrap();
        let snapshot = cache.snapshot();
        assert_eq!(snapshot.get("n1").unwrap().pods.len(), 1);
        assert_eq!(snapshot.get("n2").unwrap().pods.len(), 1);

        // Updates of assumed pods and unknown pods are refused; a pod without uid too.
        let s = pod("s", "n1", "1");
        cache.assume_pod(info(&s)).unwrap();
        assert_eq!(
            cache.update_pod(&s, Arc::new(s.clone())),
            Err(CacheError::AssumedPodUpdated { key: "s".into() })
        );
        assert!(matches!(
            cache.remove_pod(&pod("zz", "n1", "1")),
            Err(CacheError::PodNotFound { .. })
        ));
        let mut anonymous = pod("", "n1", "1");
        anonymous.metadata.uid = None;
        assert!(matches!(
            cache.assume_pod(info(&anonymous)),
            Err(CacheError::NoUid { .. })
        ));
        assert!(matches!(
            cache.assume_pod(info(&pod("t", "", "1"))),
            Err(CacheError::NoNodeName { .. })
        ));

        // Updating an added pod replaces its requests.
        cache.update_pod(&p, Arc::new(pod("p", "n1", "3"))).unwrap();
        assert_eq!(
            cache.snapshot().get("n1").unwrap().requested.milli_cpu,
            3000 + 1000
        );
    }

    #[test]
    fn assumed_pods_expire_only_after_binding_and_ttl() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(30);
        let cache = Cache::new(ttl);
        cache.add_node(node("n1"));
        let p = pod("p", "n1", "1");
        cache.assume_pod(info(&p)).unwrap();
        assert_eq!(
            cache.cleanup_expired_assumed_pods(t0 + 10 * ttl),
            0,
            "binding in flight never expires"
        );
        cache.finish_binding_at(&p, t0).unwrap();
        assert_eq!(
            cache.cleanup_expired_assumed_pods(t0 + ttl),
            0,
            "not past the deadline"
        );
        assert_eq!(
            cache.cleanup_expired_assumed_pods(t0 + ttl + Duration::from_millis(1)),
            1
        );
        assert_eq!(cache.pod_count(), 0);
        assert_eq!(cache.snapshot().get("n1").unwrap().requested.milli_cpu, 0);
        // An expired pod confirmed late is added back.
        cache.add_pod(Arc::new(p.clone())).unwrap();
        assert_eq!(cache.pod_count(), 1);

        // Kubernetes' default: zero TTL, never expires.
        let forever = Cache::default();
        forever.add_node(node("n1"));
        forever.assume_pod(info(&p)).unwrap();
        forever.finish_binding_at(&p, t0).unwrap();
        assert_eq!(
            forever.cleanup_expired_assumed_pods(t0 + Duration::from_secs(86_400)),
            0
        );
        assert_eq!(forever.assumed_pod_count(), 1);
    }

    #[test]
    fn image_counts_span_the_cluster() {
        let with_image = |name: &str| {
            let mut n = (*node(name)).clone();
            if let Some(status) = n.status.as_mut() {
                status.images = Some(vec![ContainerImage {
                    names: Some(vec!["nginx:1.27".into()]),
                    size_bytes: Some(1000),
                }]);
            }
            Arc::new(n)
        };
        let cache = Cache::default();
        cache.add_node(with_image("n1"));
        cache.add_node(with_image("n2"));
        cache.add_node(node("n3"));
        let snapshot = cache.snapshot();
        let summary = &snapshot.get("n1").unwrap().image_states["nginx:1.27"];
        assert_eq!((summary.size, summary.num_nodes), (1000, 2));
        assert!(snapshot.get("n3").unwrap().image_states.is_empty());
        cache.remove_node("n2").unwrap();
        cache.update_node(with_image("n1"));
        let snapshot = cache.snapshot();
        assert_eq!(
            snapshot.get("n1").unwrap().image_states["nginx:1.27"].num_nodes,
            1
        );
    }

    #[test]
    fn a_snapshot_the_positions_do_not_describe_is_rebuilt_correctly() {
        // Two snapshots fed alternately from one cache: the position maps describe only the
        // last one built, so the other must detect it (Arc::ptr_eq) and rebuild.
        let cache = Cache::default();
        for i in 0..20 {
            cache.add_node(node_in(&format!("n{i}"), &format!("z{}", i % 4)));
        }
        let mut first = cache.snapshot();
        cache.add_node(node_in("n20", "z9"));
        let mut second = cache.snapshot();
        cache
            .add_pod(Arc::new(anti_affinity_pod("x", "n3")))
            .unwrap();
        cache.update_snapshot(&mut second);
        cache.update_snapshot(&mut first);
        assert_matches_fresh(&cache, &first);
        cache.add_pod(Arc::new(pod("y", "n3", "1"))).unwrap();
        cache.update_snapshot(&mut second);
        assert_matches_fresh(&cache, &second);
    }

    #[test]
    fn random_changes_keep_the_incremental_snapshot_equal_to_a_fresh_one() {
        // Model check: any mix of events, with snapshot updates in between, leaves the
        // incrementally updated snapshot equal to one built from scratch.
        let seed: u64 = 0x5ce0_1e55;
        let mut rng = StdRng::seed_from_u64(seed);
        let cache = Cache::default();
        let mut snapshot = Snapshot::default();
        let mut pods: Vec<(Pod, bool)> = Vec::new();
        let mut updates = 0;
        let mut rebuilds = 0;
        for step in 0..3_000 {
            let node_name = format!("n{}", rng.random_range(0..12));
            match rng.random_range(0..10) {
                0 => cache.add_node(node_in(&node_name, &format!("z{}", rng.random_range(0..3)))),
                1 => {
                    let _ = cache.remove_node(&node_name);
                }
                2..=4 => {
                    let p = if rng.random_bool(0.3) {
                        anti_affinity_pod(&format!("p{step}"), &node_name)
                    } else {
                        pod(&format!("p{step}"), &node_name, "100m")
                    };
                    let assume = rng.random_bool(0.5);
                    if assume {
                        cache.assume_pod(info(&p)).unwrap();
                    } else {
                        cache.add_pod(Arc::new(p.clone())).unwrap();
                    }
                    pods.push((p, assume));
                }
                5..=6 if !pods.is_empty() => {
                    let (p, assumed) = pods.swap_remove(rng.random_range(0..pods.len()));
                    if assumed {
                        cache.forget_pod(&p).unwrap();
                    } else {
                        cache.remove_pod(&p).unwrap();
                    }
                }
                7 if !pods.is_empty() => {
                    let index = rng.random_range(0..pods.len());
                    if pods[index].1 {
                        cache.add_pod(Arc::new(pods[index].0.clone())).unwrap();
                        pods[index].1 = false;
                    }
                }
                _ => {
                    let before = cache.list_rebuilds_total();
                    cache.update_snapshot(&mut snapshot);
                    rebuilds += cache.list_rebuilds_total() - before;
                    updates += 1;
                    assert_matches_fresh(&cache, &snapshot);
                }
            }
        }
        assert_eq!(cache.pod_count(), pods.len(), "seed {seed}");
        assert!(
            rebuilds < updates,
            "some updates must take the in-place path ({rebuilds} rebuilds in {updates} updates)"
        );
    }
}
