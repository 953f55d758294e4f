//! The dependency graph the garbage collector keeps of every object with owners or
//! dependents (Kubernetes' `GraphBuilder` and `uidToNode`), built from the metadata-only
//! informers' events, with no I/O: [`Graph::process`] applies one event and returns the
//! [`Effect`]s — which items the attemptToDelete / attemptToOrphan queues must look at, and
//! which owner identities are now known absent.
//!
//! Invariants:
//! - nodes are keyed by UID; a node's `dependents` holds only UIDs of nodes in the graph
//!   whose `owners` name it (`n ∈ owner.dependents` ⇒ `owner.uid ∈ n.owners`, checked by
//!   [`Graph::check_consistency`] in debug builds). The converse does not hold, as in
//!   Kubernetes: once an owner's node is removed, a later reference to the same UID
//!   creates a fresh virtual node linked to that referrer only — the earlier dependents
//!   were queued when the owner went;
//! - an owner that is referenced but has not been observed yet is a *virtual* node whose
//!   identity comes from the first reference to it; it leaves the graph only when the
//!   collector has verified with a live GET that it does not exist (a virtual delete event),
//!   or is replaced by the observed identity when its informer reports it;
//! - `being_deleted` and `deleting_dependents` only ever go from false to true: an object's
//!   deletion is a one-way trip.
//!
//! Events are applied in order by one task (the collector's graph builder); workers read
//! views of nodes under the graph's lock.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The finalizer of foreground deletion: the object stays until its blocking dependents are
/// gone (`metav1.FinalizerDeleteDependents`).
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of orphan deletion: the object stays until its dependents no longer
/// reference it (`metav1.FinalizerOrphanDependents`).
pub const FINALIZER_ORPHAN: &str = "orphan";

/// Who an object is: an owner reference's coordinates plus the namespace (Kubernetes'
/// `objectReference`). For a virtual node the namespace is the referencing dependent's, and
/// the coordinates are what that dependent claims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    /// `apps/v1`, `v1`.
    pub api_version: String,
    /// `ReplicaSet`.
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's UID: the graph's key.
    pub uid: String,
}

impl Identity {
    /// The identity an owner reference names, seen from a dependent in `namespace`.
    pub fn of_reference(reference: &OwnerReference, namespace: &str) -> Identity {
        Identity {
            api_version: reference.api_version.clone(),
            kind: reference.kind.clone(),
            namespace: namespace.to_string(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
        }
    }

    /// Whether `reference` names exactly these coordinates (apiVersion, kind, name, uid;
    /// Kubernetes' `ownerReferenceMatchesCoordinates`).
    pub fn matches_coordinates(&self, reference: &OwnerReference) -> bool {
        self.uid == reference.uid
            && self.name == reference.name
            && self.kind == reference.kind
            && self.api_version == reference.api_version
    }

    /// Kubernetes' `referenceLessThan`: kind, namespace, name, apiVersion, uid.
    fn order(&self, other: &Identity) -> Ordering {
        (
            &self.kind,
            &self.namespace,
            &self.name,
            &self.api_version,
            &self.uid,
        )
            .cmp(&(
                &other.kind,
                &other.namespace,
                &other.name,
                &other.api_version,
                &other.uid,
            ))
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(
                f,
                "{}/{} {} ({})",
                self.api_version, self.kind, self.name, self.uid
            )
        } else {
            write!(
                f,
                "{}/{} {}/{} ({})",
                self.api_version, self.kind, self.namespace, self.name, self.uid
            )
        }
    }
}

/// Whether an owner reference blocks its owner's foreground deletion.
pub fn is_blocking(reference: &OwnerReference) -> bool {
    reference.block_owner_deletion == Some(true)
}

/// One object in the graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    /// Who the object is (for a virtual node: who its dependents say it is).
    pub identity: Identity,
    /// The object's owner references, as last observed.
    pub owners: Vec<OwnerReference>,
    /// UIDs of the nodes that name this one as an owner.
    pub dependents: BTreeSet<String>,
    /// The object has a deletionTimestamp.
    pub being_deleted: bool,
    /// The object has a deletionTimestamp and the `foregroundDeletion` finalizer: it waits
    /// for its blocking dependents to go.
    pub deleting_dependents: bool,
    /// The node was created from an owner reference, not from an informer event.
    pub virtual_node: bool,
    /// An informer has reported the object (a virtual node becomes observed then).
    pub observed: bool,
}

/// What an informer reports of one object: its identity (the coordinates come from the
/// monitor's resource, since a PartialObjectMetadata does not carry the object's own kind)
/// and the metadata the graph keeps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectState {
    /// Who the object is.
    pub identity: Identity,
    /// Its owner references.
    pub owners: Vec<OwnerReference>,
    /// It has a deletionTimestamp.
    pub being_deleted: bool,
    /// Its finalizers.
    pub finalizers: Vec<String>,
}

impl ObjectState {
    /// The state of an object of kind `kind` in `api_version` from its metadata.
    pub fn from_meta(api_version: &str, kind: &str, meta: &ObjectMeta) -> ObjectState {
        ObjectState {
            identity: Identity {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
            },
            owners: meta.owner_references.clone().unwrap_or_default(),
            being_deleted: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
        }
    }

    fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Being deleted with the `foregroundDeletion` finalizer.
    pub fn deleting_dependents(&self) -> bool {
        self.being_deleted && self.has_finalizer(FINALIZER_FOREGROUND)
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Added (or first listed).
    Add,
    /// Updated (or resynced).
    Update,
    /// Deleted.
    Delete,
}

/// One change for the graph builder.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphEvent {
    /// Add, update or delete.
    pub event_type: EventType,
    /// The object's new state (its last state for a delete).
    pub object: ObjectState,
    /// The previous state, for updates (the transitions into orphan / foreground deletion
    /// are detected against it).
    pub old: Option<ObjectState>,
    /// Not from an informer: the collector verified with a live GET that `object` does not
    /// exist (Kubernetes' virtual delete event). Only deletes are virtual.
    pub virtual_event: bool,
}

impl GraphEvent {
    /// An informer event.
    pub fn observed(
        event_type: EventType,
        object: ObjectState,
        old: Option<ObjectState>,
    ) -> GraphEvent {
        GraphEvent {
            event_type,
            object,
            old,
            virtual_event: false,
        }
    }

    /// The collector's verdict that `identity` does not exist.
    pub fn virtual_delete(identity: Identity) -> GraphEvent {
        GraphEvent {
            event_type: EventType::Delete,
            object: ObjectState {
                identity,
                ..ObjectState::default()
            },
            old: None,
            virtual_event: true,
        }
    }
}

/// What processing an event asks of the collector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Add the node with this identity to attemptToDelete.
    AttemptToDelete(Identity),
    /// Add it to attemptToDelete after the rate limiter's delay (a virtual node given a new
    /// identity to verify).
    AttemptToDeleteRateLimited(Identity),
    /// Add the node to attemptToOrphan.
    AttemptToOrphan(Identity),
    /// Remember that this owner identity is absent.
    Absent(Identity),
}

/// A worker's view of one node: what attemptToDelete decides on.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// The node itself.
    pub node: Node,
    /// Its dependents.
    pub dependents: Vec<DependentView>,
    /// UIDs of the owners in foreground deletion that this node's references block.
    pub blocked_owners_deleting_dependents: Vec<String>,
    /// The node is in foreground deletion and on a cycle of nodes in foreground deletion
    /// each blocked by the next (see [`Graph::in_foreground_cycle`]).
    pub in_foreground_cycle: bool,
}

/// A dependent as its owner's worker sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DependentView {
    /// Who the dependent is.
    pub identity: Identity,
    /// The dependent is itself in foreground deletion.
    pub deleting_dependents: bool,
    /// The dependent's reference to the owner has `blockOwnerDeletion: true`.
    pub blocks_owner: bool,
}

impl NodeView {
    /// The dependents whose reference to this node blocks its deletion (Kubernetes'
    /// `blockingDependents`).
    pub fn blocking_dependents(&self) -> impl Iterator<Item = &DependentView> {
        self.dependents.iter().filter(|d| d.blocks_owner)
    }
}

/// The graph: nodes by UID.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: HashMap<String, Node>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The node with `uid`.
    pub fn node(&self, uid: &str) -> Option<&Node> {
        self.nodes.get(uid)
    }

    /// Number of nodes (virtual ones included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A worker's view of the node with `uid`: the node and its dependents.
    pub fn view(&self, uid: &str) -> Option<NodeView> {
        let node = self.nodes.get(uid)?;
        let dependents = node
            .dependents
            .iter()
            .filter_map(|d| self.nodes.get(d))
            .map(|d| DependentView {
                identity: d.identity.clone(),
                deleting_dependents: d.deleting_dependents,
                blocks_owner: d
                    .owners
                    .iter()
                    .any(|o| o.uid == node.identity.uid && is_blocking(o)),
            })
            .collect();
        let blocked_owners_deleting_dependents = node
            .owners
            .iter()
            .filter(|o| is_blocking(o))
            .filter(|o| {
                self.nodes
                    .get(&o.uid)
                    .is_some_and(|n| n.deleting_dependents)
            })
            .map(|o| o.uid.clone())
            .collect();
        Some(NodeView {
            node: node.clone(),
            dependents,
            blocked_owners_deleting_dependents,
            in_foreground_cycle: self.in_foreground_cycle(uid),
        })
    }

    /// Whether the node `uid` is in foreground deletion and waits on itself: following
    /// "is blocked by" edges from it — to each blocking dependent that is itself in
    /// foreground deletion (a dependent that is not will be deleted, so it cannot deadlock) —
    /// leads back to it. Such nodes wait forever unless one of them gives way: the case the
    /// cycle breaker exists for. A depth-first search over the graph; it visits each node at
    /// most once, so it is bounded by the graph's size.
    pub fn in_foreground_cycle(&self, uid: &str) -> bool {
        let Some(start) = self.nodes.get(uid) else {
            return false;
        };
        if !start.deleting_dependents {
            return false;
        }
        let mut visited: HashSet<&str> = HashSet::new();
        let mut stack: Vec<&Node> = vec![start];
        while let Some(node) = stack.pop() {
            for dependent_uid in &node.dependents {
                let Some(dependent) = self.nodes.get(dependent_uid) else {
                    continue;
                };
                let blocks = dependent
                    .owners
                    .iter()
                    .any(|o| o.uid == node.identity.uid && is_blocking(o));
                if !blocks || !dependent.deleting_dependents {
                    continue;
                }
                if dependent_uid == uid {
                    return true;
                }
                if visited.insert(dependent_uid.as_str()) {
                    stack.push(dependent);
                }
            }
        }
        false
    }

    /// Applies one event (Kubernetes' `processGraphChanges`) and returns what the collector
    /// must do about it.
    pub fn process(&mut self, event: GraphEvent) -> Vec<Effect> {
        let mut effects = Vec::new();
        let uid = event.object.identity.uid.clone();
        if uid.is_empty() {
            // An object without a UID cannot be a node (nor anyone's owner).
            return effects;
        }
        let found = self.nodes.contains_key(&uid);
        if found && !event.virtual_event {
            self.observe(&event.object.identity, &mut effects);
        }
        match event.event_type {
            EventType::Add | EventType::Update if !found => {
                let node = Node {
                    identity: event.object.identity.clone(),
                    owners: event.object.owners.clone(),
                    dependents: BTreeSet::new(),
                    being_deleted: event.object.being_deleted,
                    deleting_dependents: event.object.deleting_dependents(),
                    virtual_node: false,
                    observed: true,
                };
                let owners = node.owners.clone();
                self.nodes.insert(uid.clone(), node);
                self.add_dependent_to_owners(&uid, &owners, &mut effects);
                self.process_transitions(event.old.as_ref(), &event.object, &mut effects);
            }
            EventType::Add | EventType::Update => {
                let old_owners = self
                    .nodes
                    .get(&uid)
                    .map(|n| n.owners.clone())
                    .unwrap_or_default();
                let diff = references_diff(&old_owners, &event.object.owners);
                if !diff.is_empty() {
                    // A blocking reference removed or unblocked may be what an owner in
                    // foreground deletion waits for.
                    self.add_unblocked_owners(&diff, &mut effects);
                    if let Some(n) = self.nodes.get_mut(&uid) {
                        n.owners = event.object.owners.clone();
                    }
                    self.add_dependent_to_owners(&uid, &diff.added, &mut effects);
                    self.remove_dependent_from_owners(&uid, &diff.removed);
                }
                if event.object.being_deleted
                    && let Some(n) = self.nodes.get_mut(&uid)
                {
                    n.being_deleted = true;
                }
                self.process_transitions(event.old.as_ref(), &event.object, &mut effects);
            }
            EventType::Delete => self.process_delete(&event, &mut effects),
        }
        #[cfg(debug_assertions)]
        self.check_consistency();
        effects
    }

    /// An informer reported an object the graph already holds: a virtual node becomes
    /// observed, and if its real identity differs from what its dependents claimed, those
    /// dependents are re-checked (the bad child → good parent order of observation).
    fn observe(&mut self, observed: &Identity, effects: &mut Vec<Effect>) {
        let Some(existing) = self.nodes.get(&observed.uid) else {
            return;
        };
        if existing.observed {
            return;
        }
        if existing.identity != *observed {
            let dependents = self.dependent_nodes(&observed.uid);
            let (_, mismatching) = partition_dependents(&dependents, observed);
            for dependent in mismatching {
                effects.push(Effect::AttemptToDelete(dependent.identity.clone()));
            }
        }
        if let Some(node) = self.nodes.get_mut(&observed.uid) {
            node.identity = observed.clone();
            node.observed = true;
        }
    }

    /// Kubernetes' `processTransitions`: an object that has just started orphan deletion
    /// goes to attemptToOrphan; one that has just started foreground deletion is marked and
    /// goes to attemptToDelete with all its dependents.
    fn process_transitions(
        &mut self,
        old: Option<&ObjectState>,
        new: &ObjectState,
        effects: &mut Vec<Effect>,
    ) {
        let uid = &new.identity.uid;
        let Some(node) = self.nodes.get_mut(uid) else {
            return;
        };
        if deletion_starts_with(old, new, FINALIZER_ORPHAN) {
            effects.push(Effect::AttemptToOrphan(node.identity.clone()));
            return;
        }
        if deletion_starts_with(old, new, FINALIZER_FOREGROUND) {
            // A node first added as virtual did not know; set it here in every case.
            node.deleting_dependents = true;
            node.being_deleted = true;
            let identity = node.identity.clone();
            for dependent in self.dependent_nodes(uid) {
                effects.push(Effect::AttemptToDelete(dependent.identity.clone()));
            }
            effects.push(Effect::AttemptToDelete(identity));
        }
    }

    /// Kubernetes' `addDependentToOwners`: link `uid` under each owner, creating virtual
    /// owners (to be verified by attemptToDelete), and re-check the dependent if a reference
    /// disagrees with an owner's known coordinates.
    fn add_dependent_to_owners(
        &mut self,
        uid: &str,
        owners: &[OwnerReference],
        effects: &mut Vec<Effect>,
    ) {
        let Some(dependent_identity) = self.nodes.get(uid).map(|n| n.identity.clone()) else {
            return;
        };
        let mut potentially_invalid = false;
        for reference in owners {
            if reference.uid.is_empty() {
                continue;
            }
            match self.nodes.get_mut(&reference.uid) {
                None => {
                    let identity = Identity::of_reference(reference, &dependent_identity.namespace);
                    let mut owner = Node {
                        identity: identity.clone(),
                        virtual_node: true,
                        ..Node::default()
                    };
                    owner.dependents.insert(uid.to_string());
                    self.nodes.insert(reference.uid.clone(), owner);
                    effects.push(Effect::AttemptToDelete(identity));
                }
                Some(owner) => {
                    owner.dependents.insert(uid.to_string());
                    let owner_namespaced = !owner.identity.namespace.is_empty();
                    if owner_namespaced && owner.identity.namespace != dependent_identity.namespace
                    {
                        // A namespaced owner in another namespace is never a valid owner.
                        potentially_invalid = true;
                    } else if !owner.identity.matches_coordinates(reference) {
                        potentially_invalid = true;
                    } else if !owner_namespaced
                        && owner.identity.namespace != dependent_identity.namespace
                        && !owner.observed
                    {
                        // A virtual cluster-scoped owner seen from a namespace: it could be a
                        // missing namespaced owner wrongly referenced (kubernetes#98040).
                        potentially_invalid = true;
                    }
                }
            }
        }
        if potentially_invalid {
            effects.push(Effect::AttemptToDelete(dependent_identity));
        }
    }

    fn remove_dependent_from_owners(&mut self, uid: &str, owners: &[OwnerReference]) {
        for reference in owners {
            if let Some(owner) = self.nodes.get_mut(&reference.uid) {
                owner.dependents.remove(uid);
            }
        }
    }

    /// Kubernetes' `addUnblockedOwnersToDeleteQueue`: owners whose blocking reference was
    /// removed or unblocked are looked at again (they may be waiting for exactly that).
    fn add_unblocked_owners(&self, diff: &ReferencesDiff, effects: &mut Vec<Effect>) {
        let unblocked = diff.removed.iter().filter(|r| is_blocking(r)).chain(
            diff.changed
                .iter()
                .filter(|(old, new)| is_blocking(old) && !is_blocking(new))
                .map(|(_, new)| new),
        );
        for reference in unblocked {
            if let Some(owner) = self.nodes.get(&reference.uid) {
                effects.push(Effect::AttemptToDelete(owner.identity.clone()));
            }
        }
    }

    /// A delete, observed or virtual.
    fn process_delete(&mut self, event: &GraphEvent, effects: &mut Vec<Effect>) {
        let deleted = &event.object.identity;
        let Some(existing) = self.nodes.get(&deleted.uid).cloned() else {
            // Not in the graph: nothing depended on it and it depended on nothing.
            return;
        };
        let mut remove = true;
        if event.virtual_event {
            let dependents = self.dependent_nodes(&deleted.uid);
            let (matching, mismatching) = partition_dependents(&dependents, deleted);
            if existing.virtual_node {
                // Not sure of our coordinates: keep the node while some dependents name it
                // differently, and try the next identity they give.
                if !mismatching.is_empty() {
                    remove = false;
                    if !matching.is_empty() {
                        effects.push(Effect::Absent(deleted.clone()));
                        for d in &matching {
                            effects.push(Effect::AttemptToDelete(d.identity.clone()));
                        }
                    }
                    if existing.identity == *deleted
                        && let Some(replacement) = alternate_owner_identity(&mismatching, deleted)
                    {
                        if let Some(node) = self.nodes.get_mut(&deleted.uid) {
                            node.identity = replacement.clone();
                        }
                        effects.push(Effect::AttemptToDeleteRateLimited(replacement));
                    }
                }
            } else if existing.identity != *deleted {
                // A virtual delete never removes an observed node it does not describe, but
                // the dependents that named those coordinates are dangling.
                remove = false;
                if !matching.is_empty() {
                    effects.push(Effect::Absent(deleted.clone()));
                    for d in &matching {
                        effects.push(Effect::AttemptToDelete(d.identity.clone()));
                    }
                }
            }
        }
        if !remove {
            return;
        }
        self.nodes.remove(&deleted.uid);
        self.remove_dependent_from_owners(&deleted.uid, &existing.owners);
        if !existing.dependents.is_empty() {
            effects.push(Effect::Absent(deleted.clone()));
        }
        for dependent in &existing.dependents {
            if let Some(d) = self.nodes.get(dependent) {
                effects.push(Effect::AttemptToDelete(d.identity.clone()));
            }
        }
        for reference in &existing.owners {
            if let Some(owner) = self.nodes.get(&reference.uid)
                && owner.deleting_dependents
            {
                // The owner may have been waiting for just this dependent.
                effects.push(Effect::AttemptToDelete(owner.identity.clone()));
            }
        }
    }

    fn dependent_nodes(&self, uid: &str) -> Vec<Node> {
        self.nodes
            .get(uid)
            .map(|n| {
                n.dependents
                    .iter()
                    .filter_map(|d| self.nodes.get(d).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Checks the graph's invariant: every dependents edge has its owner reference.
    ///
    /// # Panics
    /// If a dependents edge is not backed by a reference (a bug in the builder).
    pub fn check_consistency(&self) {
        for (uid, node) in &self.nodes {
            assert_eq!(uid, &node.identity.uid, "node keyed by another uid");
            for dependent in &node.dependents {
                let d = self
                    .nodes
                    .get(dependent)
                    .unwrap_or_else(|| panic!("dependent {dependent} of {uid} not in the graph"));
                assert!(
                    d.owners.iter().any(|o| o.uid == *uid),
                    "{dependent} is a dependent of {uid} but does not name it"
                );
            }
        }
    }
}

/// Kubernetes' `deletionStartsWithFinalizer`: `new` is being deleted with `finalizer`, and
/// `old` (if known) was not.
fn deletion_starts_with(old: Option<&ObjectState>, new: &ObjectState, finalizer: &str) -> bool {
    if !new.being_deleted || !new.has_finalizer(finalizer) {
        return false;
    }
    match old {
        None => true,
        Some(old) => !old.being_deleted || !old.has_finalizer(finalizer),
    }
}

/// How an object's owner references changed.
#[derive(Debug, Default, PartialEq)]
pub struct ReferencesDiff {
    /// References to new owners.
    pub added: Vec<OwnerReference>,
    /// References no longer there.
    pub removed: Vec<OwnerReference>,
    /// References to the same owner UID that differ (old, new).
    pub changed: Vec<(OwnerReference, OwnerReference)>,
}

impl ReferencesDiff {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Kubernetes' `referencesDiffs`, by owner UID.
pub fn references_diff(old: &[OwnerReference], new: &[OwnerReference]) -> ReferencesDiff {
    let mut diff = ReferencesDiff::default();
    let mut old_by_uid: HashMap<&str, &OwnerReference> =
        old.iter().map(|r| (r.uid.as_str(), r)).collect();
    for reference in new {
        match old_by_uid.remove(reference.uid.as_str()) {
            Some(previous) if previous != reference => {
                diff.changed.push((previous.clone(), reference.clone()));
            }
            Some(_) => {}
            None => diff.added.push(reference.clone()),
        }
    }
    // In the old order, so the result is deterministic.
    diff.removed = old
        .iter()
        .filter(|r| old_by_uid.contains_key(r.uid.as_str()))
        .cloned()
        .collect();
    diff
}

/// Kubernetes' `partitionDependents`: the dependents whose reference to `owner.uid` matches
/// `owner`'s coordinates (and namespace), and those with one that does not (a dependent can
/// be in both).
fn partition_dependents<'a>(
    dependents: &'a [Node],
    owner: &Identity,
) -> (Vec<&'a Node>, Vec<&'a Node>) {
    let owner_namespaced = !owner.namespace.is_empty();
    let mut matching = Vec::new();
    let mut mismatching = Vec::new();
    for dependent in dependents {
        let (mut found_match, mut found_mismatch) = (false, false);
        if owner_namespaced && owner.namespace != dependent.identity.namespace {
            found_mismatch = true;
        } else {
            for reference in dependent.owners.iter().filter(|r| r.uid == owner.uid) {
                if owner.matches_coordinates(reference) {
                    found_match = true;
                } else {
                    found_mismatch = true;
                }
            }
        }
        if found_match {
            matching.push(dependent);
        }
        if found_mismatch {
            mismatching.push(dependent);
        }
    }
    (matching, mismatching)
}

/// Kubernetes' `getAlternateOwnerIdentity`: among the identities `dependents` give the
/// owner `absent.uid` other than `absent`, the first after `absent` in
/// [`Identity::order`], else the first.
fn alternate_owner_identity(dependents: &[&Node], absent: &Identity) -> Option<Identity> {
    let absent_cluster_scoped = absent.namespace.is_empty();
    let mut seen: HashSet<Identity> = HashSet::from([absent.clone()]);
    let mut first: Option<Identity> = None;
    let mut first_following: Option<Identity> = None;
    for dependent in dependents {
        for reference in dependent.owners.iter().filter(|r| r.uid == absent.uid) {
            if absent.matches_coordinates(reference)
                && (absent_cluster_scoped || absent.namespace == dependent.identity.namespace)
            {
                continue;
            }
            let mut candidate = Identity::of_reference(reference, &dependent.identity.namespace);
            if absent_cluster_scoped
                && candidate.api_version == absent.api_version
                && candidate.kind == absent.kind
            {
                // This apiVersion/kind is known cluster-scoped.
                candidate.namespace.clear();
            }
            if !seen.insert(candidate.clone()) {
                continue;
            }
            if first
                .as_ref()
                .is_none_or(|f| candidate.order(f) == Ordering::Less)
            {
                first = Some(candidate.clone());
            }
            if absent.order(&candidate) == Ordering::Less
                && first_following
                    .as_ref()
                    .is_none_or(|f| candidate.order(f) == Ordering::Less)
            {
                first_following = Some(candidate);
            }
        }
    }
    first_following.or(first)
}

/// Owner identities verified absent, so that the dependents of one deleted owner do not
/// each GET it again (Kubernetes' `absentOwnerCache`, a `ReferenceCache`). Least recently
/// used entries go first.
#[derive(Debug)]
pub struct AbsentOwnerCache {
    capacity: usize,
    /// Each identity's last use, and the identities by last use.
    stamps: HashMap<Identity, u64>,
    order: VecDeque<(u64, Identity)>,
    clock: u64,
}

/// Owner identities remembered absent: kube-controller-manager's `NewReferenceCache(500)`.
/// Larger saves GETs when more owners with many dependents go at once; an entry is only a
/// few hundred bytes.
pub const ABSENT_OWNER_CACHE_ENTRIES_MAX: usize = 500;

impl AbsentOwnerCache {
    /// A cache of at most `capacity` identities.
    ///
    /// # Panics
    /// If `capacity` is 0.
    pub fn new(capacity: usize) -> AbsentOwnerCache {
        assert!(
            capacity > 0,
            "an absent-owner cache holds at least one entry"
        );
        AbsentOwnerCache {
            capacity,
            stamps: HashMap::new(),
            order: VecDeque::new(),
            clock: 0,
        }
    }

    /// Remembers `identity` as absent.
    pub fn add(&mut self, identity: Identity) {
        self.touch(identity);
        while self.stamps.len() > self.capacity {
            let Some((stamp, oldest)) = self.order.pop_front() else {
                break;
            };
            if self.stamps.get(&oldest) == Some(&stamp) {
                self.stamps.remove(&oldest);
            }
        }
    }

    /// Whether `identity` is known absent (and marks it used).
    pub fn has(&mut self, identity: &Identity) -> bool {
        if self.stamps.contains_key(identity) {
            self.touch(identity.clone());
            true
        } else {
            false
        }
    }

    /// Number of identities held.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Whether no identity is held.
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    fn touch(&mut self, identity: Identity) {
        self.clock += 1;
        self.stamps.insert(identity.clone(), self.clock);
        self.order.push_back((self.clock, identity));
        // Stale entries in `order` (re-touched identities) are dropped lazily; bound them.
        if self.order.len() > self.capacity * 2 {
            let stamps = &self.stamps;
            self.order.retain(|(s, i)| stamps.get(i) == Some(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn reference(kind: &str, name: &str, uid: &str, blocking: bool) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: None,
            block_owner_deletion: blocking.then_some(true),
        }
    }

    fn state(name: &str, uid: &str, owners: Vec<OwnerReference>) -> ObjectState {
        ObjectState {
            identity: Identity {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: "ns".into(),
                name: name.into(),
                uid: uid.into(),
            },
            owners,
            being_deleted: false,
            finalizers: vec![],
        }
    }

    fn add(graph: &mut Graph, s: &ObjectState) -> Vec<Effect> {
        graph.process(GraphEvent::observed(EventType::Add, s.clone(), None))
    }

    fn deletes(effects: &[Effect]) -> Vec<&str> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::AttemptToDelete(i) => Some(i.name.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_unseen_owner_becomes_a_virtual_node_to_verify() {
        let mut graph = Graph::new();
        let child = state(
            "child",
            "c",
            vec![reference("ConfigMap", "parent", "p", false)],
        );
        let effects = add(&mut graph, &child);
        let parent = graph.node("p").expect("virtual owner");
        assert!(parent.virtual_node);
        assert!(!parent.observed);
        assert_eq!(parent.identity.name, "parent");
        assert_eq!(parent.identity.namespace, "ns", "the dependent's namespace");
        assert!(parent.dependents.contains("c"));
        assert_eq!(
            deletes(&effects),
            ["parent"],
            "the virtual owner is verified"
        );

        // The owner's own event makes it observed, without re-checking a matching child.
        let effects = add(&mut graph, &state("parent", "p", vec![]));
        let parent = graph.node("p").expect("owner");
        assert!(parent.observed);
        assert!(
            parent.dependents.contains("c"),
            "edges survive the observation"
        );
        assert!(deletes(&effects).is_empty());
    }

    #[test]
    fn an_owner_observed_with_other_coordinates_rechecks_its_dependents() {
        let mut graph = Graph::new();
        add(
            &mut graph,
            &state(
                "child",
                "c",
                vec![reference("ConfigMap", "wrong-name", "p", false)],
            ),
        );
        let effects = add(&mut graph, &state("parent", "p", vec![]));
        assert_eq!(graph.node("p").expect("owner").identity.name, "parent");
        assert_eq!(deletes(&effects), ["child"]);
        // A later child naming the observed owner wrongly is checked at once.
        let effects = add(
            &mut graph,
            &state(
                "child2",
                "c2",
                vec![reference("ConfigMap", "nope", "p", false)],
            ),
        );
        assert_eq!(deletes(&effects), ["child2"]);
    }

    #[test]
    fn owner_reference_changes_move_edges_and_wake_unblocked_owners() {
        let mut graph = Graph::new();
        add(&mut graph, &state("a", "a", vec![]));
        add(&mut graph, &state("b", "b", vec![]));
        let child_v1 = state("child", "c", vec![reference("ConfigMap", "a", "a", true)]);
        add(&mut graph, &child_v1);
        assert!(graph.node("a").expect("a").dependents.contains("c"));

        // Re-owned from a to b: a loses the dependent, b gains it, and a — whose blocking
        // reference went away — is looked at again.
        let child_v2 = state("child", "c", vec![reference("ConfigMap", "b", "b", false)]);
        let effects = graph.process(GraphEvent::observed(
            EventType::Update,
            child_v2.clone(),
            Some(child_v1),
        ));
        assert!(graph.node("a").expect("a").dependents.is_empty());
        assert!(graph.node("b").expect("b").dependents.contains("c"));
        assert_eq!(graph.node("c").expect("c").owners, child_v2.owners);
        assert_eq!(deletes(&effects), ["a"]);

        // Blocking → non-blocking on the same owner counts as unblocking.
        let child_v3 = state("child", "c", vec![reference("ConfigMap", "b", "b", true)]);
        graph.process(GraphEvent::observed(
            EventType::Update,
            child_v3.clone(),
            Some(child_v2),
        ));
        let child_v4 = state("child", "c", vec![reference("ConfigMap", "b", "b", false)]);
        let effects = graph.process(GraphEvent::observed(
            EventType::Update,
            child_v4,
            Some(child_v3),
        ));
        assert_eq!(deletes(&effects), ["b"]);
    }

    #[test]
    fn removing_an_owner_marks_it_absent_and_queues_its_dependents() {
        let mut graph = Graph::new();
        let parent = state("parent", "p", vec![]);
        add(&mut graph, &parent);
        add(
            &mut graph,
            &state(
                "child",
                "c",
                vec![reference("ConfigMap", "parent", "p", false)],
            ),
        );
        let effects = graph.process(GraphEvent::observed(
            EventType::Delete,
            parent.clone(),
            None,
        ));
        assert!(graph.node("p").is_none());
        assert!(effects.contains(&Effect::Absent(parent.identity.clone())));
        assert_eq!(deletes(&effects), ["child"]);
        // The child still names the owner; the edge is gone with the owner.
        assert_eq!(graph.len(), 1);

        // Removing a dependent wakes an owner in foreground deletion.
        let mut graph = Graph::new();
        let mut owner = state("owner", "o", vec![]);
        add(&mut graph, &owner);
        let dependent = state("dep", "d", vec![reference("ConfigMap", "owner", "o", true)]);
        add(&mut graph, &dependent);
        let old = owner.clone();
        owner.being_deleted = true;
        owner.finalizers = vec![FINALIZER_FOREGROUND.into()];
        let effects = graph.process(GraphEvent::observed(EventType::Update, owner, Some(old)));
        assert!(graph.node("o").expect("owner").deleting_dependents);
        assert_eq!(deletes(&effects), ["dep", "owner"]);
        let effects = graph.process(GraphEvent::observed(EventType::Delete, dependent, None));
        assert_eq!(deletes(&effects), ["owner"]);
    }

    #[test]
    fn orphan_transition_fires_once() {
        let mut graph = Graph::new();
        let mut owner = state("owner", "o", vec![]);
        add(&mut graph, &owner);
        let old = owner.clone();
        owner.being_deleted = true;
        owner.finalizers = vec![FINALIZER_ORPHAN.into()];
        let effects = graph.process(GraphEvent::observed(
            EventType::Update,
            owner.clone(),
            Some(old),
        ));
        assert_eq!(effects, [Effect::AttemptToOrphan(owner.identity.clone())]);
        // A resync (old == new) is no transition.
        let effects = graph.process(GraphEvent::observed(
            EventType::Update,
            owner.clone(),
            Some(owner),
        ));
        assert!(effects.is_empty());
    }

    #[test]
    fn virtual_deletes_remove_virtual_nodes_but_not_observed_ones() {
        let mut graph = Graph::new();
        add(
            &mut graph,
            &state(
                "child",
                "c",
                vec![reference("ConfigMap", "ghost", "g", false)],
            ),
        );
        let ghost = graph.node("g").expect("virtual").identity.clone();
        let effects = graph.process(GraphEvent::virtual_delete(ghost.clone()));
        assert!(graph.node("g").is_none());
        assert!(effects.contains(&Effect::Absent(ghost)));
        assert_eq!(deletes(&effects), ["child"]);
        assert!(
            graph.node("c").expect("child").owners.len() == 1,
            "the child is untouched"
        );

        // A virtual delete naming other coordinates leaves an observed node alone, but the
        // dependents that used those coordinates are dangling.
        let mut graph = Graph::new();
        add(&mut graph, &state("real", "r", vec![]));
        add(
            &mut graph,
            &state("liar", "l", vec![reference("Secret", "real", "r", false)]),
        );
        let claimed = Identity {
            kind: "Secret".into(),
            ..graph.node("r").expect("real").identity.clone()
        };
        let effects = graph.process(GraphEvent::virtual_delete(claimed.clone()));
        assert!(graph.node("r").is_some());
        assert!(effects.contains(&Effect::Absent(claimed)));
        assert_eq!(deletes(&effects), ["liar"]);
    }

    #[test]
    fn a_virtual_owner_named_two_ways_tries_the_other_identity() {
        let mut graph = Graph::new();
        add(
            &mut graph,
            &state(
                "c1",
                "c1",
                vec![reference("ConfigMap", "a-name", "o", false)],
            ),
        );
        add(
            &mut graph,
            &state(
                "c2",
                "c2",
                vec![reference("ConfigMap", "b-name", "o", false)],
            ),
        );
        let first = graph.node("o").expect("virtual").identity.clone();
        assert_eq!(first.name, "a-name");
        let effects = graph.process(GraphEvent::virtual_delete(first.clone()));
        let node = graph.node("o").expect("kept: c2 names it otherwise");
        assert_eq!(node.identity.name, "b-name");
        assert!(effects.contains(&Effect::Absent(first)));
        assert!(effects.contains(&Effect::AttemptToDeleteRateLimited(node.identity.clone())));
        assert_eq!(deletes(&effects), ["c1"]);
    }

    #[test]
    fn views_report_blocking_dependents() {
        let mut graph = Graph::new();
        add(&mut graph, &state("owner", "o", vec![]));
        add(
            &mut graph,
            &state(
                "blocker",
                "b",
                vec![reference("ConfigMap", "owner", "o", true)],
            ),
        );
        add(
            &mut graph,
            &state(
                "free",
                "f",
                vec![reference("ConfigMap", "owner", "o", false)],
            ),
        );
        let view = graph.view("o").expect("view");
        let blocking: Vec<&str> = view
            .blocking_dependents()
            .map(|d| d.identity.name.as_str())
            .collect();
        assert_eq!(blocking, ["blocker"]);
        assert_eq!(view.dependents.len(), 2);
    }

    #[test]
    fn references_diff_by_uid() {
        let a = reference("ConfigMap", "a", "a", false);
        let b = reference("ConfigMap", "b", "b", false);
        let b_blocking = reference("ConfigMap", "b", "b", true);
        let c = reference("ConfigMap", "c", "c", false);
        let diff = references_diff(&[a.clone(), b.clone()], &[b_blocking.clone(), c.clone()]);
        assert_eq!(diff.added, [c]);
        assert_eq!(diff.removed, [a]);
        assert_eq!(diff.changed, [(b, b_blocking)]);
    }

    #[test]
    fn absent_owner_cache_forgets_the_least_recently_used() {
        let id = |n: &str| Identity {
            name: n.into(),
            uid: n.into(),
            ..Identity::default()
        };
        let mut cache = AbsentOwnerCache::new(2);
        cache.add(id("a"));
        cache.add(id("b"));
        assert!(cache.has(&id("a")), "a is now the most recently used");
        cache.add(id("c"));
        assert!(!cache.has(&id("b")));
        assert!(cache.has(&id("a")));
        assert!(cache.has(&id("c")));
        assert_eq!(cache.len(), 2);
        for _ in 0..100 {
            cache.has(&id("a"));
        }
        assert!(cache.order.len() <= 4, "stale order entries are bounded");
    }
}
