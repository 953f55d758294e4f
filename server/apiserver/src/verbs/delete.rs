//! DELETE of one object and of a collection: DeleteOptions (preconditions, propagation,
//! grace period), then the removal, or — when finalizers, a grace period or the strategy
//! say the deletion waits — the mark (`deletionTimestamp`) that leaves the object to its
//! finalizers, its kubelet or its controller.

use http::Response;
use serde_json::{Value, json};
use skerry_api::catalogue::ResourceInfo;
use skerry_api::strict::FieldValidation;
use skerry_api::{ApiError, meta};

use super::list::{filter_of, list_options};
use super::{current, name_of, object_response};
use crate::handler::{ApiServer, Request};
use crate::response::{self, Body};
use crate::storage::{self, WriteError};
use crate::strategy::{Propagation, Strategy, is_deleting};
use crate::watch_cache::object::CachedObject;

/// The finalizer `propagationPolicy=Orphan` sets: the garbage collector orphans dependents
/// before the object goes.
pub const FINALIZER_ORPHAN: &str = "orphan";
/// The finalizer `propagationPolicy=Foreground` sets: dependents go first.
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

/// DeleteOptions from the body or the query.
fn delete_options(req: &Request) -> Result<Value, ApiError> {
    let mut options = if req.body.is_empty() {
        json!({})
    } else {
        skerry_api::kinds::decode_definition(
            "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
            &req.body,
            FieldValidation::Ignore,
            ("v1", "DeleteOptions"),
        )?
        .object
    };
    if let Some(p) = req.param("propagationPolicy") {
        options["propagationPolicy"] = json!(p);
    }
    if let Some(g) = req.param("gracePeriodSeconds") {
        let g: i64 = g
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g:?}")))?;
        options["gracePeriodSeconds"] = json!(g);
    }
    if let Some(orphan) = req.bool_param("orphanDependents") {
        options["orphanDependents"] = json!(orphan);
    }
    Ok(options)
}

/// The propagation a DeleteOptions names, `None` when it names none.
fn propagation(options: &Value) -> Result<Option<Propagation>, ApiError> {
    let policy = options.get("propagationPolicy").and_then(Value::as_str);
    let orphan = options.get("orphanDependents").and_then(Value::as_bool);
    match (policy, orphan) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "orphanDependents and propagationPolicy cannot both be set",
        )),
        (Some("Orphan"), None) | (None, Some(true)) => Ok(Some(Propagation::Orphan)),
        (Some("Foreground"), None) => Ok(Some(Propagation::Foreground)),
        (Some("Background"), None) | (None, Some(false)) => Ok(Some(Propagation::Background)),
        (None, None) => Ok(None),
        (Some(other), None) => Err(ApiError::bad_request(format!(
            "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
        ))),
    }
}

/// The finalizers a deletion leaves on an object that has `current` (Kubernetes'
/// `deletionFinalizersForGarbageCollection`, on the first deletion and on every repeated
/// one): `Orphan` adds `orphan` and drops `foregroundDeletion`, `Foreground` the reverse,
/// `Background` drops both. Without a policy the object's own finalizer decides (the first
/// of the two, should both be there), and with neither the strategy's
/// `DefaultGarbageCollectionPolicy` (`default`). `current` itself (same order) when the set
/// does not change.
fn deletion_finalizers(
    propagation: Option<Propagation>,
    default: Propagation,
    current: &[String],
) -> Vec<String> {
    let is_gc = |f: &String| f == FINALIZER_ORPHAN || f == FINALIZER_FOREGROUND;
    let propagation = propagation.unwrap_or_else(|| {
        match current.iter().find(|f| is_gc(f)).map(String::as_str) {
            Some(FINALIZER_ORPHAN) => Propagation::Orphan,
            Some(_) => Propagation::Foreground,
            None => default,
        }
    });
    let (orphan, foreground) = match propagation {
        Propagation::Orphan => (true, false),
        Propagation::Foreground => (false, true),
        Propagation::Background => (false, false),
    };
    let mut finalizers: Vec<String> = current.iter().filter(|f| !is_gc(f)).cloned().collect();
    if orphan {
        finalizers.push(FINALIZER_ORPHAN.to_string());
    }
    if foreground {
        finalizers.push(FINALIZER_FOREGROUND.to_string());
    }
    if finalizer_set(&finalizers) == finalizer_set(current) {
        current.to_vec()
    } else {
        finalizers
    }
}

/// A finalizer list as a set: Kubernetes compares the lists before and after a deletion's
/// policy as sets.
fn finalizer_set(list: &[String]) -> std::collections::BTreeSet<&str> {
    list.iter().map(String::as_str).collect()
}

/// Marks `object` as being deleted with `finalizers` and `grace` seconds (Kubernetes'
/// `markAsDeleting` and `BeforeDelete`): the first mark sets `deletionTimestamp` and bumps a
/// tracked `generation` (the object's controllers must now stand down); a repeated one keeps
/// the timestamp unless it lies in the future (set by a member whose clock runs ahead). The
/// strategy then marks what else its resource shows while being deleted.
fn mark_deleting(
    strategy: &dyn Strategy,
    object: &mut Value,
    grace: i64,
    finalizers: Vec<String>,
) -> Result<(), ApiError> {
    let now = meta::now();
    let metadata = object["metadata"]
        .as_object_mut()
        .ok_or_else(|| ApiError::internal("object without metadata"))?;
    let existing = metadata
        .get("deletionTimestamp")
        .and_then(Value::as_str)
        .map(|t| t.parse::<jiff::Timestamp>().ok());
    match existing {
        None => {
            if let Some(generation) = metadata
                .get("generation")
                .and_then(Value::as_i64)
                .filter(|g| *g > 0)
            {
                metadata.insert("generation".into(), json!(generation + 1));
            }
            metadata.insert("deletionTimestamp".into(), json!(now));
        }
        Some(Some(at)) if now.parse::<jiff::Timestamp>().is_ok_and(|now| at > now) => {
            metadata.insert("deletionTimestamp".into(), json!(now));
        }
        Some(_) => {}
    }
    metadata.insert("deletionGracePeriodSeconds".into(), json!(grace));
    metadata.insert("finalizers".into(), json!(finalizers));
    strategy.prepare_for_deletion(object);
    Ok(())
}

/// Deletes one object: preconditions, then either a graceful deletion (the strategy's
/// `CheckGracefulDelete`: pods on a node), a deletion that waits on finalizers or on the
/// resource's controller (the object gets `deletionTimestamp` and stays), or the removal
/// itself.
///
/// Deleting an object that is already being deleted (Kubernetes' store.go `Delete` on a
/// terminating object) applies the request's propagation policy to its finalizers again —
/// `kubectl delete --cascade=foreground` on a terminating object turns its deletion into a
/// foreground one — and answers 200 with the object; if the policy took away its last
/// finalizer, the object goes at once. A pod still counting down its grace period is left
/// as it is (Kubernetes' `pendingGraceful`: DeleteOptions no longer change its finalizers).
pub async fn delete_one(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &dyn Strategy,
    req: &Request,
    old: CachedObject,
    options: &Value,
) -> Result<(u16, Value), ApiError> {
    let namespace = req
        .info
        .namespace
        .as_deref()
        .or(old.namespace())
        .map(str::to_string);
    let name = old.name().to_string();
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
        && old.value().pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
    {
        return Err(ApiError::conflict(
            resource.group,
            resource.resource,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old.value()
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && rv != old.resource_version().to_string()
    {
        return Err(ApiError::conflict(
            resource.group,
            resource.resource,
            &name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.resource_version()
            ),
        ));
    }
    let propagation = propagation(options)?;
    let object = old.value();
    let current_finalizers: Vec<String> = object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let finalizers = deletion_finalizers(
        propagation,
        strategy.default_garbage_collection_policy(),
        &current_finalizers,
    );
    let already_deleting = is_deleting(object);
    let grace = strategy.check_graceful_delete(object, options);
    let dry_run = req.dry_run()?;
    if already_deleting && grace.is_some_and(|g| g > 0) {
        return Ok((200, object.clone()));
    }
    if !finalizers.is_empty() || grace.is_some_and(|g| g > 0) || strategy.deletion_waits() {
        // Mark, do not remove: finalizers (or the kubelet, or the namespace controller)
        // finish the deletion.
        let mut marked = object.clone();
        mark_deleting(strategy, &mut marked, grace.unwrap_or(0), finalizers)?;
        if already_deleting && marked == *object {
            // Nothing to change: no write, as Kubernetes skips an update that changes no byte.
            return Ok((200, marked));
        }
        // A first deletion that waits is answered 202 (what skerry's clients were built
        // against; Kubernetes answers 200 unless `orphanDependents=false`), a repeated one
        // 200 with the updated object, as Kubernetes does.
        let code = if already_deleting { 200 } else { 202 };
        if dry_run {
            return Ok((code, marked));
        }
        let stored = server
            .timed(
                "update",
                resource,
                storage::update(
                    &server.store,
                    resource,
                    namespace.as_deref(),
                    &name,
                    marked,
                    old.resource_version(),
                ),
            )
            .await
            .map_err(|e| e.into_api_error(resource, &name))?;
        return Ok((code, stored));
    }
    // Nothing to wait for — on a first deletion, or on a repeated one whose policy took
    // away the last finalizer (Kubernetes' `errDeleteNow`): the object goes now.
    if dry_run {
        return Ok((200, object.clone()));
    }
    let deleted = remove(server, resource, strategy, namespace.as_deref(), &old)
        .await
        .map_err(|e| e.into_api_error(resource, &name))?;
    Ok((200, deleted))
}

/// Removes `old` from the store if it is still at its version, releasing the claims it
/// holds in the same transaction; the removed object.
pub(super) async fn remove(
    server: &ApiServer,
    resource: &ResourceInfo,
    strategy: &dyn Strategy,
    namespace: Option<&str>,
    old: &CachedObject,
) -> Result<Value, WriteError> {
    server
        .timed(
            "delete",
            resource,
            storage::delete_releasing(
                &server.store,
                resource,
                namespace,
                old.name(),
                Some(old.resource_version()),
                &strategy.held_claims(old.value()),
            ),
        )
        .await
}

pub(super) async fn delete(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &'static dyn Strategy,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    strategy.before_delete(resource, name)?;
    let options = delete_options(req)?;
    let old = current(server, resource, req.info.namespace.as_deref(), name).await?;
    crate::noderestriction::admit(
        server,
        &crate::noderestriction::Request {
            resource,
            subresource: None,
            operation: crate::noderestriction::Operation::Delete,
            name,
            namespace: req.info.namespace.as_deref(),
            object: None,
            old: Some(old.value()),
            user: &req.user,
        },
    )
    .await?;
    let format = req.format()?;
    let (code, object) = delete_one(server, resource, strategy, req, old, &options).await?;
    Ok(object_response(
        resource,
        code,
        &CachedObject::new(object, None),
        format,
        &[],
    ))
}

/// DELETE of a collection: every object the selectors match, one by one, as Kubernetes'
/// `DeleteCollection` calls the generic `Delete` for each (not a storage's own override).
pub(super) async fn delete_collection(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &'static dyn Strategy,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let options = delete_options(req)?;
    let mut opts = list_options(req)?;
    opts.limit = None;
    opts.continue_token = None;
    let filter = filter_of(resource, req)?;
    let list = server
        .timed(
            "list",
            resource,
            storage::list(&server.store, resource, &opts, filter.as_ref()),
        )
        .await?;
    let mut deleted = Vec::with_capacity(list.items.len());
    for item in list.items {
        match delete_one(server, resource, strategy, req, item, &options).await {
            Ok((_, object)) => deleted.push(object),
            // Someone else deleted it first: the collection is still gone.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let value = json!({
        "kind": resource.list_kind,
        "apiVersion": resource.api_version(),
        "metadata": {"resourceVersion": list.resource_version.to_string()},
        "items": deleted,
    });
    Ok(response::json(200, &value, &[]))
}
