//! `docs/tricks.md` #29, the garbage collector's solid / dangling / waiting: an item's owner
//! references are sorted into three buckets by looking each owner
//! up **live** through the metadata-only API (the graph may lag the apiserver), and what the
//! collector does to the item follows from the buckets alone. The decisions are pure
//! functions of the item's graph view, its live metadata and the buckets; only
//! [`classify_references`] does I/O, through an [`OwnerLookup`].
//!
//! - **solid**: the owner exists with the referenced UID and is not waiting for its
//!   dependents' deletion;
//! - **dangling**: the owner does not exist, or a different object (another UID) has its
//!   name;
//! - **waitingForDependentsDeletion**: the owner exists and is being deleted with the
//!   `foregroundDeletion` finalizer.
//!
//! Kubernetes: `pkg/controller/garbagecollector/garbagecollector.go`
//! (`classifyReferences`, `isDangling`, `attemptToDeleteItem`,
//! `processDeletingDependentsItem`).

use std::future::Future;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use parking_lot::Mutex;
use skerry_api::ResourceInfo;

use super::graph::{AbsentOwnerCache, FINALIZER_FOREGROUND, FINALIZER_ORPHAN, Identity, NodeView};

/// A live read of an owner's metadata, bypassing every cache.
pub trait OwnerLookup: Send + Sync {
    /// GET `name` of `resource` in `namespace` (`None` for cluster-scoped resources):
    /// `Ok(None)` on 404.
    fn get_meta(
        &self,
        resource: &'static ResourceInfo,
        namespace: Option<&str>,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>, skerry_client::Error>> + Send;
}

/// Why a reference could not be classified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClassifyError {
    /// The reference names a kind skerry does not serve (retried: it may be served later,
    /// and deleting on an unknown kind would delete objects during an upgrade).
    #[error("owner kind {kind} in {api_version} is not served")]
    UnknownKind {
        /// The reference's apiVersion.
        api_version: String,
        /// The reference's kind.
        kind: String,
    },
    /// A cluster-scoped object names a namespaced owner: invalid, and retrying will not
    /// make it valid.
    #[error("a cluster-scoped object refers to the namespaced owner {0}")]
    NamespacedOwnerOfClusterScopedObject(String),
    /// The live lookup failed (retried).
    #[error("looking up owner {owner}")]
    Lookup {
        /// The owner looked up.
        owner: String,
        /// Why.
        #[source]
        source: skerry_client::Error,
    },
}

/// The served resource of an `apiVersion` + `kind`, if it can be looked up and deleted.
pub fn resource_of(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    skerry_api::catalogue::by_kind(api_version, kind).filter(|r| r.has_verb("get"))
}

/// An item's owner references, sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Classification {
    /// Owners that exist and are not waiting for their dependents' deletion.
    pub solid: Vec<OwnerReference>,
    /// Owners that are gone (or replaced by another object of the same name).
    pub dangling: Vec<OwnerReference>,
    /// Owners in foreground deletion.
    pub waiting_for_dependents_deletion: Vec<OwnerReference>,
}

/// Kubernetes' `classifyReferences`: looks each owner of an item in `item_namespace` up
/// (the absent-owner cache first, then a live GET, recording what is found absent).
pub async fn classify_references<L: OwnerLookup>(
    item_namespace: &str,
    references: &[OwnerReference],
    lookup: &L,
    absent: &Mutex<AbsentOwnerCache>,
) -> Result<Classification, ClassifyError> {
    let mut classification = Classification::default();
    for reference in references {
        match owner_of(item_namespace, reference, lookup, absent).await? {
            None => classification.dangling.push(reference.clone()),
            Some(owner) => {
                let waiting = owner.deletion_timestamp.is_some()
                    && owner
                        .finalizers
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .any(|f| f == FINALIZER_FOREGROUND);
                if waiting {
                    classification
                        .waiting_for_dependents_deletion
                        .push(reference.clone());
                } else {
                    classification.solid.push(reference.clone());
                }
            }
        }
    }
    Ok(classification)
}

/// Kubernetes' `isDangling`: `None` when the owner is dangling, else its live metadata.
async fn owner_of<L: OwnerLookup>(
    item_namespace: &str,
    reference: &OwnerReference,
    lookup: &L,
    absent: &Mutex<AbsentOwnerCache>,
) -> Result<Option<ObjectMeta>, ClassifyError> {
    // Known absent, as a cluster-scoped owner or as one in the item's namespace.
    let mut key = Identity::of_reference(reference, "");
    if absent.lock().has(&key) {
        return Ok(None);
    }
    key.namespace = item_namespace.to_string();
    if absent.lock().has(&key) {
        return Ok(None);
    }
    let resource = resource_of(&reference.api_version, &reference.kind).ok_or_else(|| {
        ClassifyError::UnknownKind {
            api_version: reference.api_version.clone(),
            kind: reference.kind.clone(),
        }
    })?;
    if !resource.namespaced {
        key.namespace.clear();
    }
    if item_namespace.is_empty() && resource.namespaced {
        return Err(ClassifyError::NamespacedOwnerOfClusterScopedObject(
            key.to_string(),
        ));
    }
    let namespace = resource.namespaced.then_some(item_namespace);
    let owner = lookup
        .get_meta(resource, namespace, &reference.name)
        .await
        .map_err(|source| ClassifyError::Lookup {
            owner: key.to_string(),
            source,
        })?;
    match owner {
        Some(owner) if owner.uid.as_deref() == Some(reference.uid.as_str()) => Ok(Some(owner)),
        // Gone, or another object now has the name: dangling either way.
        _ => {
            absent.lock().add(key);
            Ok(None)
        }
    }
}

/// How a deletion propagates to the deleted object's dependents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The object goes at once; its dependents are collected afterwards.
    Background,
    /// The object waits (`foregroundDeletion`) until its blocking dependents are gone.
    Foreground,
    /// The object waits (`orphan`) until its dependents no longer reference it.
    Orphan,
}

impl Propagation {
    /// The `propagationPolicy` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Propagation::Background => "Background",
            Propagation::Foreground => "Foreground",
            Propagation::Orphan => "Orphan",
        }
    }
}

/// What attemptToDelete does with an item that is not itself in foreground deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The item has no owner, or only solid ones: leave it.
    Keep,
    /// A solid owner remains: only drop the references to dangling and waiting owners
    /// (by UID) — a waiting owner would otherwise wait on the item forever.
    RemoveReferences(Vec<String>),
    /// No solid owner remains: delete the item.
    Delete {
        /// How its own dependents go.
        propagation: Propagation,
        /// The cycle breaker: first make the item's references non-blocking, because the
        /// item and one of its dependents are both in foreground deletion.
        unblock_first: bool,
    },
}

/// Kubernetes' `attemptToDeleteItem` after classification.
pub fn decide(item: &NodeView, latest: &ObjectMeta, classification: &Classification) -> Decision {
    let Classification {
        solid,
        dangling,
        waiting_for_dependents_deletion: waiting,
    } = classification;
    if !solid.is_empty() {
        if dangling.is_empty() && waiting.is_empty() {
            return Decision::Keep;
        }
        return Decision::RemoveReferences(
            dangling
                .iter()
                .chain(waiting)
                .map(|r| r.uid.clone())
                .collect(),
        );
    }
    if !waiting.is_empty() && !item.dependents.is_empty() {
        // An owner waits for the item, and the item has dependents of its own: delete it in
        // the foreground too, so the owner waits for the whole subtree. If a dependent is
        // itself in foreground deletion, the two may be waiting on each other (Kubernetes:
        // "to prevent potential cycle, its ownerReferences are going to be modified to be
        // non-blocking"); the detection has false positives, which cost only ordering.
        let unblock_first = item.dependents.iter().any(|d| d.deleting_dependents);
        return Decision::Delete {
            propagation: Propagation::Foreground,
            unblock_first,
        };
    }
    // No solid owner and nobody waits for a subtree: delete, honouring a policy the item
    // was already given.
    let finalizers = latest.finalizers.as_deref().unwrap_or_default();
    let propagation = if finalizers.iter().any(|f| f == FINALIZER_ORPHAN) {
        Propagation::Orphan
    } else if finalizers.iter().any(|f| f == FINALIZER_FOREGROUND) {
        Propagation::Foreground
    } else {
        Propagation::Background
    };
    Decision::Delete {
        propagation,
        unblock_first: false,
    }
}

/// What attemptToDelete does with an item in foreground deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletingDependentsDecision {
    /// No blocking dependent is left: remove `foregroundDeletion`, and the item is deleted.
    RemoveFinalizer,
    /// Blocking dependents remain; these (the ones not themselves in foreground deletion)
    /// go to attemptToDelete.
    Wait(Vec<Identity>),
    /// The item waits on itself through a cycle of items in foreground deletion: make its
    /// references to these owners (UIDs) non-blocking so that they can finish, then wait.
    BreakCycle {
        /// The owners the item stops blocking.
        unblock: Vec<String>,
        /// Blocking dependents to attemptToDelete.
        enqueue: Vec<Identity>,
    },
}

/// Kubernetes' `processDeletingDependentsItem`, with skerry's extension of its cycle
/// breaker. Kubernetes breaks a cycle only when the GC itself deletes an item whose owner
/// and dependent are in foreground deletion ([`Decision::Delete`] with `unblock_first`); two
/// objects a user deleted in the foreground at the same moment, each blocking the other,
/// would each wait for the other forever, since neither is deleted by the GC. Here an item
/// in foreground deletion that is on such a cycle (found on the graph, exactly, not by the
/// heuristic) stops blocking its owners in foreground deletion; the cycle then unwinds.
pub fn deleting_dependents_decision(item: &NodeView) -> DeletingDependentsDecision {
    let blocking: Vec<_> = item.blocking_dependents().collect();
    if blocking.is_empty() {
        return DeletingDependentsDecision::RemoveFinalizer;
    }
    let enqueue: Vec<Identity> = blocking
        .iter()
        .filter(|d| !d.deleting_dependents)
        .map(|d| d.identity.clone())
        .collect();
    if item.in_foreground_cycle && !item.blocked_owners_deleting_dependents.is_empty() {
        return DeletingDependentsDecision::BreakCycle {
            unblock: item.blocked_owners_deleting_dependents.clone(),
            enqueue,
        };
    }
    DeletingDependentsDecision::Wait(enqueue)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::super::graph::{
        ABSENT_OWNER_CACHE_ENTRIES_MAX, EventType, Graph, GraphEvent, ObjectState,
    };
    use super::*;

    /// A fake apiserver: objects' metadata by (resource, namespace, name), and a count of
    /// live lookups.
    #[derive(Default)]
    struct FakeLookup {
        objects: HashMap<(String, String, String), ObjectMeta>,
        gets: std::sync::atomic::AtomicUsize,
        fail: bool,
    }

    impl FakeLookup {
        fn put(&mut self, resource: &str, namespace: &str, meta: ObjectMeta) {
            let name = meta.name.clone().expect("name");
            self.objects
                .insert((resource.into(), namespace.into(), name), meta);
        }
        fn gets(&self) -> usize {
            self.gets.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl OwnerLookup for FakeLookup {
        async fn get_meta(
            &self,
            resource: &'static ResourceInfo,
            namespace: Option<&str>,
            name: &str,
        ) -> Result<Option<ObjectMeta>, skerry_client::Error> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.fail {
                return Err(skerry_client::Error::Transport("connection refused".into()));
            }
            Ok(self
                .objects
                .get(&(
                    resource.resource.to_string(),
                    namespace.unwrap_or_default().to_string(),
                    name.to_string(),
                ))
                .cloned())
        }
    }

    fn meta(name: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        }
    }

    fn deleting(mut m: ObjectMeta, finalizer: &str) -> ObjectMeta {
        m.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        m.finalizers = Some(vec![finalizer.into()]);
        m
    }

    fn reference(kind: &str, name: &str, uid: &str, blocking: bool) -> OwnerReference {
        OwnerReference {
            api_version: if kind == "ReplicaSet" {
                "apps/v1"
            } else {
                "v1"
            }
            .into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: None,
            block_owner_deletion: blocking.then_some(true),
        }
    }

    fn cache() -> Mutex<AbsentOwnerCache> {
        Mutex::new(AbsentOwnerCache::new(ABSENT_OWNER_CACHE_ENTRIES_MAX))
    }

    fn names(refs: &[OwnerReference]) -> Vec<&str> {
        refs.iter().map(|r| r.name.as_str()).collect()
    }

    #[tokio::test]
    async fn owners_are_solid_dangling_or_waiting() {
        let mut api = FakeLookup::default();
        api.put("configmaps", "ns", meta("solid", "s"));
        api.put("configmaps", "ns", meta("renamed", "new-uid"));
        api.put(
            "replicasets",
            "ns",
            deleting(meta("waiting", "w"), FINALIZER_FOREGROUND),
        );
        // Being deleted without foregroundDeletion is not waiting: still solid.
        api.put(
            "configmaps",
            "ns",
            deleting(meta("orphaning", "o"), FINALIZER_ORPHAN),
        );
        let refs = [
            reference("ConfigMap", "solid", "s", false),
            reference("ConfigMap", "gone", "g", false),
            reference("ConfigMap", "renamed", "old-uid", true),
            reference("ReplicaSet", "waiting", "w", true),
            reference("ConfigMap", "orphaning", "o", false),
        ];
        let absent = cache();
        let c = classify_references("ns", &refs, &api, &absent)
            .await
            .expect("classified");
        assert_eq!(names(&c.solid), ["solid", "orphaning"]);
        assert_eq!(names(&c.dangling), ["gone", "renamed"]);
        assert_eq!(names(&c.waiting_for_dependents_deletion), ["waiting"]);
        assert_eq!(api.gets(), 5, "every owner looked up live");
        assert_eq!(absent.lock().len(), 2, "the dangling owners are remembered");

        // The second dependent of a dangling owner does not ask the apiserver again.
        let c = classify_references("ns", &refs[1..2], &api, &absent)
            .await
            .expect("classified");
        assert_eq!(names(&c.dangling), ["gone"]);
        assert_eq!(api.gets(), 5);
    }

    #[tokio::test]
    async fn the_live_lookup_wins_over_a_lagging_graph() {
        // The graph still holds the owner (its deletion not yet seen by the informer); the
        // live GET says it is gone, so the dependent is dangling.
        let mut graph = Graph::new();
        graph.process(GraphEvent::observed(
            EventType::Add,
            ObjectState::from_meta("v1", "ConfigMap", &meta("owner", "o")),
            None,
        ));
        assert!(graph.node("o").is_some());
        let api = FakeLookup::default();
        let c = classify_references(
            "ns",
            &[reference("ConfigMap", "owner", "o", false)],
            &api,
            &cache(),
        )
        .await
        .expect("classified");
        assert_eq!(names(&c.dangling), ["owner"]);
    }

    #[tokio::test]
    async fn lookups_that_cannot_answer_are_errors_not_dangling() {
        let api = FakeLookup {
            fail: true,
            ..FakeLookup::default()
        };
        let absent = cache();
        let refs = [reference("ConfigMap", "x", "x", false)];
        let err = classify_references("ns", &refs, &api, &absent)
            .await
            .expect_err("a failed GET must not make an owner dangling");
        assert!(matches!(err, ClassifyError::Lookup { .. }), "{err}");
        assert!(absent.lock().is_empty());

        let unknown = OwnerReference {
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            ..reference("ConfigMap", "w", "w", false)
        };
        let err = classify_references("ns", &[unknown], &FakeLookup::default(), &absent)
            .await
            .expect_err("unknown kind");
        assert!(matches!(err, ClassifyError::UnknownKind { .. }), "{err}");

        let err = classify_references(
            "",
            &[reference("ConfigMap", "c", "c", false)],
            &FakeLookup::default(),
            &absent,
        )
        .await
        .expect_err("cluster-scoped item, namespaced owner");
        assert!(
            matches!(err, ClassifyError::NamespacedOwnerOfClusterScopedObject(_)),
            "{err}"
        );
    }

    fn view_of(graph: &Graph, uid: &str) -> NodeView {
        graph.view(uid).expect("in the graph")
    }

    fn add(graph: &mut Graph, m: &ObjectMeta, owners: Vec<OwnerReference>) {
        let mut m = m.clone();
        m.owner_references = Some(owners);
        graph.process(GraphEvent::observed(
            EventType::Add,
            ObjectState::from_meta("v1", "ConfigMap", &m),
            None,
        ));
    }

    #[test]
    fn decisions_follow_the_buckets() {
        let mut graph = Graph::new();
        let item = meta("item", "i");
        add(&mut graph, &item, vec![]);
        let leaf = view_of(&graph, "i");
        let solid = reference("ConfigMap", "s", "s", false);
        let gone = reference("ConfigMap", "g", "g", false);
        let waiting = reference("ConfigMap", "w", "w", true);

        let c = Classification {
            solid: vec![solid.clone()],
            ..Classification::default()
        };
        assert_eq!(decide(&leaf, &item, &c), Decision::Keep);

        let c = Classification {
            solid: vec![solid],
            dangling: vec![gone.clone()],
            waiting_for_dependents_deletion: vec![waiting.clone()],
        };
        assert_eq!(
            decide(&leaf, &item, &c),
            Decision::RemoveReferences(vec!["g".into(), "w".into()])
        );

        let c = Classification {
            dangling: vec![gone],
            ..Classification::default()
        };
        let background = Decision::Delete {
            propagation: Propagation::Background,
            unblock_first: false,
        };
        assert_eq!(decide(&leaf, &item, &c), background);
        // The item's own finalizers say how its subtree goes.
        assert_eq!(
            decide(&leaf, &deleting(item.clone(), FINALIZER_ORPHAN), &c),
            Decision::Delete {
                propagation: Propagation::Orphan,
                unblock_first: false
            }
        );

        // A waiting owner and no dependents: nothing to wait for, background.
        let c = Classification {
            waiting_for_dependents_deletion: vec![waiting],
            ..Classification::default()
        };
        assert_eq!(decide(&leaf, &item, &c), background);

        // With dependents: foreground, so the owner waits for the whole subtree.
        add(
            &mut graph,
            &meta("child", "c"),
            vec![reference("ConfigMap", "item", "i", true)],
        );
        assert_eq!(
            decide(&view_of(&graph, "i"), &item, &c),
            Decision::Delete {
                propagation: Propagation::Foreground,
                unblock_first: false
            }
        );
    }

    #[test]
    fn a_dependent_in_foreground_deletion_makes_the_item_unblock_first() {
        // a owns b and b owns a, both blocking; a is being deleted in the foreground. b's
        // owner (a) is waiting and b's dependent (a) is deleting dependents: b unblocks its
        // reference to a, then is deleted in the foreground itself.
        let mut graph = Graph::new();
        let a = deleting(meta("a", "a"), FINALIZER_FOREGROUND);
        let b = meta("b", "b");
        add(&mut graph, &a, vec![reference("ConfigMap", "b", "b", true)]);
        add(&mut graph, &b, vec![reference("ConfigMap", "a", "a", true)]);
        let c = Classification {
            waiting_for_dependents_deletion: vec![reference("ConfigMap", "a", "a", true)],
            ..Classification::default()
        };
        assert_eq!(
            decide(&view_of(&graph, "b"), &b, &c),
            Decision::Delete {
                propagation: Propagation::Foreground,
                unblock_first: true
            }
        );
    }

    #[test]
    fn foreground_deletion_waits_for_blocking_dependents_only() {
        let mut graph = Graph::new();
        let owner = deleting(meta("owner", "o"), FINALIZER_FOREGROUND);
        add(&mut graph, &owner, vec![]);
        assert_eq!(
            deleting_dependents_decision(&view_of(&graph, "o")),
            DeletingDependentsDecision::RemoveFinalizer
        );
        add(
            &mut graph,
            &meta("free", "f"),
            vec![reference("ConfigMap", "owner", "o", false)],
        );
        assert_eq!(
            deleting_dependents_decision(&view_of(&graph, "o")),
            DeletingDependentsDecision::RemoveFinalizer,
            "a non-blocking dependent does not hold the owner"
        );
        add(
            &mut graph,
            &meta("blocker", "b"),
            vec![reference("ConfigMap", "owner", "o", true)],
        );
        match deleting_dependents_decision(&view_of(&graph, "o")) {
            DeletingDependentsDecision::Wait(enqueue) => {
                let names: Vec<&str> = enqueue.iter().map(|i| i.name.as_str()).collect();
                assert_eq!(names, ["blocker"]);
            }
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    #[test]
    fn two_objects_in_foreground_deletion_blocking_each_other_break_the_cycle() {
        let mut graph = Graph::new();
        let a = deleting(meta("a", "a"), FINALIZER_FOREGROUND);
        let b = deleting(meta("b", "b"), FINALIZER_FOREGROUND);
        add(&mut graph, &a, vec![reference("ConfigMap", "b", "b", true)]);
        add(&mut graph, &b, vec![reference("ConfigMap", "a", "a", true)]);
        assert!(graph.in_foreground_cycle("a"));
        assert!(graph.in_foreground_cycle("b"));
        assert_eq!(
            deleting_dependents_decision(&view_of(&graph, "a")),
            DeletingDependentsDecision::BreakCycle {
                unblock: vec!["b".into()],
                enqueue: vec![],
            }
        );

        // A chain in foreground deletion that does not loop back waits as usual.
        let mut graph = Graph::new();
        let top = deleting(meta("top", "t"), FINALIZER_FOREGROUND);
        let middle = deleting(meta("middle", "m"), FINALIZER_FOREGROUND);
        add(&mut graph, &top, vec![]);
        add(
            &mut graph,
            &middle,
            vec![reference("ConfigMap", "top", "t", true)],
        );
        add(
            &mut graph,
            &meta("leaf", "l"),
            vec![reference("ConfigMap", "middle", "m", true)],
        );
        assert!(!graph.in_foreground_cycle("t"));
        assert!(!graph.in_foreground_cycle("m"));
        assert_eq!(
            deleting_dependents_decision(&view_of(&graph, "t")),
            DeletingDependentsDecision::Wait(vec![]),
            "the middle is deleting its own dependents; nothing to enqueue"
        );
        match deleting_dependents_decision(&view_of(&graph, "m")) {
            DeletingDependentsDecision::Wait(enqueue) => assert_eq!(enqueue.len(), 1),
            other => panic!("expected to wait, got {other:?}"),
        }

        // A three-object cycle all in foreground deletion is found too.
        let mut graph = Graph::new();
        let x = deleting(meta("x", "x"), FINALIZER_FOREGROUND);
        let y = deleting(meta("y", "y"), FINALIZER_FOREGROUND);
        let z = deleting(meta("z", "z"), FINALIZER_FOREGROUND);
        add(&mut graph, &x, vec![reference("ConfigMap", "z", "z", true)]);
        add(&mut graph, &y, vec![reference("ConfigMap", "x", "x", true)]);
        add(&mut graph, &z, vec![reference("ConfigMap", "y", "y", true)]);
        assert!(graph.in_foreground_cycle("y"));
    }
}
