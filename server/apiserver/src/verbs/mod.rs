//! The verbs on resources: get, list, watch, create, update, patch, delete and
//! deletecollection, and the subresources (status, scale, binding, token) — Kubernetes'
//! generic registry, over the store ([`crate::storage`]) and the watch caches. What differs
//! between resources is their strategy ([`crate::strategy`]), looked up once per write: no
//! verb names a resource. The reviews, created but never stored, are [`crate::reviews`].
//!
//! One file per verb: [`get`], [`list`], [`create`], [`update`], [`patch`], [`delete`]; the
//! decoding of a write's body and its field manager in [`body`]; the answers in the asked
//! format in [`encode`].
//!
//! A write is, in Kubernetes' order (`handlers/create.go`/`update.go`, then the registry's
//! `BeforeCreate`/`BeforeUpdate`): decode strictly → fill server-owned metadata and defaults,
//! then the strategy's `PrepareForCreate`/`PrepareForUpdate` → record `managedFields` →
//! admission (NamespaceLifecycle, then the plugins; mutating admission such as Priority's
//! copy of `spec.priority` runs *before* validation, so that validation judges the object
//! that will be stored) → the strategy's `Validate`/`ValidateUpdate` and `Canonicalize` →
//! one store transaction with the optimistic-concurrency compare (`mod_revision ==
//! expected`), with the strategy's claims and lease. See `create::admit_then_validate` and
//! [`update::write_update`].
//! Patches retry that loop on a conflict, as Kubernetes' patcher does, since the client did
//! not ask for a precondition — unless the patch itself sets `metadata.resourceVersion`,
//! which makes it conditional like an update (see `patched_preconditions`).

pub mod body;
pub mod create;
pub mod delete;
pub mod encode;
pub mod get;
pub mod list;
pub mod patch;
pub mod update;

use std::sync::Arc;

use http::Response;
use skerry_api::ApiError;
use skerry_api::catalogue::{self, ResourceInfo};

pub use body::{decode_body, field_manager_of};
pub use delete::{FINALIZER_FOREGROUND, FINALIZER_ORPHAN, delete_one};
pub use encode::{list_response, object_response};
pub use list::{filter_of, list_options, wait_for_cache};
pub use update::write_update;

use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::storage;
use crate::strategy;
use crate::watch_cache::object::CachedObject;

/// Serves one resource request.
pub async fn serve(server: &Arc<ApiServer>, req: Request) -> Result<Response<Body>, ApiError> {
    let info = &req.info;
    let resource = catalogue::lookup(&info.group, &info.version, &info.resource)
        .ok_or_else(|| ApiError::no_route(&info.path))?;
    let subresource = match &info.subresource {
        Some(sub) => Some(
            resource
                .subresource(sub)
                .ok_or_else(|| ApiError::no_route(&info.path))?,
        ),
        None => None,
    };
    if !resource.namespaced && info.namespace.is_some() {
        return Err(ApiError::no_route(&info.path));
    }
    // A namespaced object is reached through its namespace; only list and watch may span
    // every namespace.
    if resource.namespaced
        && info.namespace.is_none()
        && !matches!(info.verb.as_str(), "list" | "watch")
    {
        return Err(ApiError::no_route(&info.path));
    }
    let verb_allowed = match subresource {
        Some(sub) => sub.verbs.contains(&info.verb.as_str()),
        None => resource.has_verb(&info.verb),
    };
    if !verb_allowed {
        return Err(method_not_allowed(&info.path));
    }
    // A subresource that speaks the object's own kind (`status`, a Namespace's `finalize`)
    // reads and writes the object through the generic verbs, the strategy resetting what
    // that subresource may not change; the others (`scale`, `binding`, `eviction`, `token`)
    // have their own shapes.
    let own_kind = subresource.is_none_or(|s| s.kind == resource.kind && s.group_version.is_none());
    match (info.verb.as_str(), info.subresource.as_deref()) {
        ("get", Some("log")) => crate::podlogs::get(server, resource, &req).await,
        ("get", _) if own_kind => get::get(server, resource, &req).await,
        ("get", Some("scale")) => crate::subresources::get_scale(server, resource, &req).await,
        ("list", None) => list::list(server, resource, &req).await,
        ("watch", None) => crate::watch::serve(server, resource, &req).await,
        ("create", None) => {
            let strategy = strategy::of(resource);
            match strategy.review() {
                Some(review) => crate::reviews::create(server, resource, review, &req).await,
                None => create::create(server, resource, strategy, &req).await,
            }
        }
        ("create", Some("binding")) => crate::subresources::bind(server, resource, &req).await,
        ("create", Some("token")) => crate::subresources::token(server, resource, &req).await,
        ("create", Some("eviction")) => crate::subresources::evict(server, resource, &req).await,
        ("update", _) if own_kind => {
            update::update(server, resource, strategy::of(resource), &req).await
        }
        ("update", Some("scale")) => {
            crate::subresources::update_scale(server, resource, &req).await
        }
        ("patch", _) if own_kind => {
            patch::patch(server, resource, strategy::of(resource), &req).await
        }
        ("patch", Some("scale")) => crate::subresources::patch_scale(server, resource, &req).await,
        ("delete", None) => delete::delete(server, resource, strategy::of(resource), &req).await,
        ("deletecollection", None) => {
            delete::delete_collection(server, resource, strategy::of(resource), &req).await
        }
        _ => Err(method_not_allowed(&info.path)),
    }
}

/// The 405 of a verb the resource (or subresource) does not serve.
fn method_not_allowed(path: &str) -> ApiError {
    ApiError::method_not_allowed(format!(
        "the server does not allow this method on the requested resource ({path})"
    ))
}

pub(crate) fn name_of(req: &Request) -> Result<&str, ApiError> {
    req.info
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("a name is required"))
}

/// Reads the current object, linearizably unless `resourceVersion=0` lets the cache answer.
pub async fn current(
    server: &ApiServer,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
) -> Result<CachedObject, ApiError> {
    server
        .timed(
            "get",
            resource,
            storage::get(&server.store, resource, namespace, name),
        )
        .await?
        .ok_or_else(|| ApiError::not_found(resource.group, resource.resource, name))
}

/// A 422 for `name` when validation found `causes`.
fn invalid(
    resource: &ResourceInfo,
    name: &str,
    causes: Vec<skerry_api::Cause>,
) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            resource.group,
            resource.kind,
            name,
            causes,
        ))
    }
}
