//! Each resource's rules, apart from the generic registry that applies them ([`crate::verbs`]):
//! Kubernetes' strategies (`k8s.io/apiserver/pkg/registry/rest`: `RESTCreateStrategy`,
//! `RESTUpdateStrategy`, `RESTDeleteStrategy`, `RESTGracefulDeleteStrategy`,
//! `GarbageCollectionDeleteStrategy`; one `pkg/registry/<group>/<resource>/strategy.go` per
//! resource) with the few storage decorations Kubernetes keeps beside them in
//! `pkg/registry/<group>/<resource>/storage/storage.go` (a Service's ClusterIP, an Event's
//! time to live, the Namespace's two-step deletion).
//!
//! A resource's rules are one [`Strategy`], in a file named for the resource (or the family
//! of resources that share them), registered by one line in the table [`of`] reads; a resource without rules
//! of its own gets `default::Default`, whose every hook is the trait's default. The verbs
//! never name a resource: they ask the strategy.
//!
//! The trick: a strategy is a `&'static dyn Strategy` looked up once per write request (a
//! `match` on the group and resource, no allocation, no map), and its hooks are synchronous,
//! so dynamic dispatch needs no boxed future. What a hook cannot do without the store or the
//! clock (claim a ClusterIP, join a lease) it describes — an [`Allocation`], a
//! [`LeaseManager`] — and the generic write code awaits it. Reads (get, list, watch) never
//! look a strategy up: the benchmark's hot paths do not change.
//!
//! What a kind's *metadata* does on a write stays with the object model in `skerry_api`:
//! `meta::prepare_create` (server-owned fields, the status a create drops, the generation a
//! create sets: `meta::generation_policy`) and `meta::prepare_update` (identity kept, the
//! status subresource's reset, generation bumps), defaulting (`defaults.rs`) and validation
//! (`validation/`). The default hooks here call them.

mod default;
mod events;
mod namespaces;
mod pods;
mod priorityclasses;
mod reviews;
mod services;

use bytes::Bytes;
use serde_json::Value;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::{ApiError, Cause, meta};

use crate::auth::UserInfo;
use crate::handler::{ApiServer, Request};
use crate::leases::LeaseManager;

pub use reviews::Review;

/// The resources with rules of their own, by group and resource. Adding a resource with
/// rules adds its file and one line here.
static OWN: &[(&str, &str, &dyn Strategy)] = &[
    ("", "pods", &pods::Pods),
    ("", "services", &services::Services),
    ("", "namespaces", &namespaces::Namespaces),
    ("", "events", &events::Events),
    (
        "scheduling.k8s.io",
        "priorityclasses",
        &priorityclasses::PriorityClasses,
    ),
    (
        "authentication.k8s.io",
        "selfsubjectreviews",
        &reviews::SELF_SUBJECT_REVIEW,
    ),
    (
        "authentication.k8s.io",
        "tokenreviews",
        &reviews::TOKEN_REVIEW,
    ),
    (
        "authorization.k8s.io",
        "subjectaccessreviews",
        &reviews::SUBJECT_ACCESS_REVIEW,
    ),
    (
        "authorization.k8s.io",
        "localsubjectaccessreviews",
        &reviews::LOCAL_SUBJECT_ACCESS_REVIEW,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        &reviews::SELF_SUBJECT_ACCESS_REVIEW,
    ),
];

/// The strategy of `resource`: its own where it has rules of its own, else the default.
pub fn of(resource: &ResourceInfo) -> &'static dyn Strategy {
    OWN.iter()
        .find(|(group, name, _)| *group == resource.group && *name == resource.resource)
        .map_or(&default::Default, |(_, _, strategy)| *strategy)
}

/// What a hook knows of the request (Kubernetes' `ctx`): the resource, the namespace of the
/// path, the subresource written through, and who asks.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub resource: &'static ResourceInfo,
    pub namespace: Option<&'a str>,
    /// `status`, `finalize`, `scale`, ...; `None` for the main resource.
    pub subresource: Option<&'a str>,
    pub user: &'a UserInfo,
}

impl<'a> Ctx<'a> {
    /// The context of `req` on `resource`.
    pub fn of(resource: &'static ResourceInfo, req: &'a Request) -> Self {
        Self {
            resource,
            namespace: req.info.namespace.as_deref(),
            subresource: req.info.subresource.as_deref(),
            user: &req.user,
        }
    }
}

/// What a deletion asks to happen to the object's dependents: `propagationPolicy`, or the
/// deprecated `orphanDependents` (`true` orphans; `false` is background deletion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Foreground,
    Background,
}

/// Keys a new object claims in its own create transaction, so that two apiservers cannot
/// hand out one value and no value outlives its object (a Service's ClusterIP, see
/// [`crate::ipalloc`]). The keys are released by the object's delete transaction
/// ([`Strategy::held_claims`]).
pub struct Allocation {
    /// The object with what was allocated written into it.
    pub object: Value,
    /// The claim keys and their values.
    pub claims: Vec<(String, Bytes)>,
    /// When the client asked for the value by name, the error a taken claim is; `None` when
    /// the value was picked, and a taken claim means picking again.
    pub if_taken: Option<ApiError>,
    /// What is allocated, for the error once every attempt lost its race (`a serviceIP`).
    pub what: &'static str,
    /// On an update: the claim keys the object no longer holds, deleted in the same
    /// transaction (a NodePort Service turned ClusterIP). Empty on a create.
    pub releases: Vec<String>,
}

/// One resource's rules. Every hook has Kubernetes' default; a strategy overrides the few
/// it needs. The write path calls them in Kubernetes' order (see [`crate::verbs`]).
pub trait Strategy: Sync {
    // ----- create (`RESTCreateStrategy`) -----

    /// `PrepareForCreate`: what the resource sets on a new object once server-owned metadata
    /// and defaults are filled (`meta::prepare_create`, which also drops a status the client
    /// sent), before admission and validation.
    fn prepare_for_create(&self, _ctx: &Ctx<'_>, _object: &mut Value) {}

    /// `Validate`: the causes of a 422 for a new object (after admission).
    fn validate(&self, ctx: &Ctx<'_>, object: &Value) -> Vec<Cause> {
        skerry_api::validation::validate_create(ctx.resource, object)
    }

    /// `Canonicalize`: rewrites a valid object into its one stored form, after validation,
    /// on create and on update. Most Kubernetes strategies leave the object as it is (the
    /// Endpoints strategy repacks its subsets; skerry stores them as sent).
    fn canonicalize(&self, _object: &mut Value) {}

    /// `WarningsOnCreate`: `Warning` headers for a new object that is valid but unwise.
    fn warnings_on_create(&self, _ctx: &Ctx<'_>, _object: &Value) -> Vec<String> {
        Vec::new()
    }

    /// What a new object claims in its create transaction (Kubernetes' Service storage
    /// allocates in `BeginCreate`). Called again for each attempt, with the object as it
    /// was before allocation. `None`: nothing to claim.
    fn allocate(
        &self,
        _server: &ApiServer,
        _ctx: &Ctx<'_>,
        _name: &str,
        _object: &Value,
    ) -> Result<Option<Allocation>, ApiError> {
        Ok(None)
    }

    // ----- update (`RESTUpdateStrategy`) -----

    /// What an update claims and releases in its transaction (Kubernetes' Service storage
    /// allocates in `BeginUpdate`): `new` with what was allocated written in, after
    /// validation. Called again for each attempt. `None`: nothing claimed or released.
    fn allocate_update(
        &self,
        _server: &ApiServer,
        _ctx: &Ctx<'_>,
        _name: &str,
        _old: &Value,
        _new: &Value,
    ) -> Result<Option<Allocation>, ApiError> {
        Ok(None)
    }

    /// `AllowCreateOnUpdate`: whether a PUT of an object that does not exist creates it
    /// (otherwise 404). No resource skerry serves allows it yet: Kubernetes' Service,
    /// Endpoints and Lease strategies do, and turning it on for them changes what a PUT of a
    /// missing object answers, with its tests.
    fn allow_create_on_update(&self) -> bool {
        false
    }

    /// `AllowUnconditionalUpdate`: whether a PUT without `metadata.resourceVersion`
    /// overwrites whatever is stored (otherwise 422). Every built-in Kubernetes kind allows
    /// it.
    fn allow_unconditional_update(&self) -> bool {
        true
    }

    /// `PrepareForUpdate` of the main resource and of its subresources (the status strategy
    /// is the one that keeps everything but the status): builds the object an update stores
    /// from the `old` one and what the client sent, before defaults, admission and
    /// validation.
    fn prepare_for_update(&self, ctx: &Ctx<'_>, old: &Value, new: &mut Value) {
        meta::prepare_update(ctx.resource, old, new, ctx.subresource);
    }

    /// `ValidateUpdate`: the causes of a 422 for the replacement of `old` by `new`.
    fn validate_update(&self, ctx: &Ctx<'_>, old: &Value, new: &Value) -> Vec<Cause> {
        skerry_api::validation::validate_update(ctx.resource, old, new)
    }

    /// `WarningsOnUpdate`.
    fn warnings_on_update(&self, _ctx: &Ctx<'_>, _old: &Value, _new: &Value) -> Vec<String> {
        Vec::new()
    }

    /// The generic store's `ShouldDeleteDuringUpdate`: whether an update of an object being
    /// deleted removes it instead, because it took away what the deletion waited for (the
    /// last finalizer).
    fn should_delete_during_update(&self, object: &Value) -> bool {
        is_deleting(object) && !has_finalizers(object)
    }

    // ----- delete (`RESTDeleteStrategy`, `RESTGracefulDeleteStrategy`) -----

    /// A refusal before the object is even read (a storage's own `Delete`). Only the DELETE
    /// of one object asks: DELETE of a collection goes straight to the generic deletion, as
    /// in Kubernetes.
    fn before_delete(&self, _resource: &ResourceInfo, _name: &str) -> Result<(), ApiError> {
        Ok(())
    }

    /// `CheckGracefulDelete`: the grace period, in seconds, the object waits out marked for
    /// deletion before it goes (a pod's kubelet stops its containers); `None` when the
    /// resource deletes at once.
    fn check_graceful_delete(&self, _object: &Value, _options: &Value) -> Option<i64> {
        None
    }

    /// `DefaultGarbageCollectionPolicy`: what happens to dependents when neither the
    /// DeleteOptions nor the object's finalizers say. Background for every kind skerry
    /// serves; Kubernetes' Job strategy answers Orphan at batch/v1, for backward
    /// compatibility (`pkg/registry/batch/job/strategy.go`).
    fn default_garbage_collection_policy(&self) -> Propagation {
        Propagation::Background
    }

    /// Whether every deletion marks the object and leaves it for a controller to finish,
    /// finalizers or not (the Namespace storage's `Delete`).
    fn deletion_waits(&self) -> bool {
        false
    }

    /// What the resource changes on an object it marks as being deleted, beyond
    /// `deletionTimestamp` and the finalizers.
    fn prepare_for_deletion(&self, _object: &mut Value) {}

    /// The claim keys the object holds ([`Allocation`]), released when it goes.
    fn held_claims(&self, _object: &Value) -> Vec<String> {
        Vec::new()
    }

    // ----- storage -----

    /// The leases the resource's objects ride, for a time to live (Kubernetes' generic store
    /// `TTLFunc`); `None`: objects live until deleted.
    fn ttl_leases<'s>(&self, _server: &'s ApiServer) -> Option<&'s LeaseManager> {
        None
    }

    /// The review this resource answers: create-only, never stored ([`crate::reviews`]).
    fn review(&self) -> Option<Review> {
        None
    }
}

/// Whether `object` carries a `deletionTimestamp`.
pub fn is_deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Whether `object` still has a `metadata.finalizers` entry.
fn has_finalizers(object: &Value) -> bool {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    use skerry_api::catalogue::{RESOURCES, lookup};

    use super::*;

    #[test]
    fn every_own_strategy_names_a_served_resource() {
        // A typo in `OWN` would silently give the resource the default rules.
        for (group, resource, _) in OWN {
            assert!(
                RESOURCES
                    .iter()
                    .any(|r| r.group == *group && r.resource == *resource),
                "{group}/{resource} is not served"
            );
        }
    }

    #[test]
    fn only_the_reviews_answer_without_storing() {
        for resource in RESOURCES {
            assert_eq!(
                of(resource).review().is_some(),
                !resource.has_verb("list"),
                "{}",
                resource.resource
            );
        }
    }

    #[test]
    fn the_default_update_needs_no_version_and_creates_nothing() {
        let configmaps = lookup("", "v1", "configmaps").expect("served");
        let strategy = of(configmaps);
        assert!(strategy.allow_unconditional_update());
        assert!(!strategy.allow_create_on_update());
        assert_eq!(
            strategy.default_garbage_collection_policy(),
            Propagation::Background
        );
    }

    #[test]
    fn an_update_that_removes_the_last_finalizer_deletes() {
        let strategy = of(lookup("", "v1", "configmaps").expect("served"));
        let deleting =
            serde_json::json!({"metadata": {"deletionTimestamp": "t", "finalizers": []}});
        assert!(strategy.should_delete_during_update(&deleting));
        let waiting =
            serde_json::json!({"metadata": {"deletionTimestamp": "t", "finalizers": ["x"]}});
        assert!(!strategy.should_delete_during_update(&waiting));
        let live = serde_json::json!({"metadata": {"finalizers": []}});
        assert!(!strategy.should_delete_during_update(&live));
    }
}
