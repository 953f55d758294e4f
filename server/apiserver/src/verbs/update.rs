//! UPDATE (PUT) of an object or of a subresource that speaks its kind (`status`,
//! `finalize`), and [`write_update`], the read-modify-write every update-like write ends in
//! (patches, scale): the strategy's `PrepareForUpdate` → defaults → `managedFields` →
//! admission → `ValidateUpdate` → the compare-and-swap write, or the removal of an object
//! whose deletion no longer waits for anything.

use http::Response;
use serde_json::Value;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::{ApiError, Cause, meta};

use super::{body, create, current, invalid, name_of, object_response};
use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::storage::{self, WriteError};
use crate::strategy::{Ctx, Strategy};
use crate::watch_cache::object::CachedObject;

pub(super) async fn update(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &'static dyn Strategy,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let namespace = req.info.namespace.as_deref();
    let (new, warnings) = body::decode_body(resource, req)?;
    if meta::name(&new) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta::name(&new)
        )));
    }
    if let Some(ns) = meta::namespace(&new)
        && resource.namespaced
        && !ns.is_empty()
        && Some(ns) != namespace
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let ctx = Ctx::of(resource, req);
    let old = match current(server, resource, namespace, name).await {
        Ok(old) => old,
        Err(e) if creates_on_update(strategy, &ctx, &e) => {
            return create::create_object(server, &ctx, strategy, req, new, warnings, "update")
                .await;
        }
        Err(e) => return Err(e),
    };
    update_uid_precondition(resource, name, &old, &new)?;
    check_resource_version(strategy, resource, name, &old, &new)?;
    let format = req.format()?;
    let (stored, more_warnings) = write_update(server, resource, strategy, req, &old, new)
        .await
        .map_err(|e| e.into_api_error(resource, name))?;
    let mut warnings = warnings;
    warnings.extend(more_warnings);
    Ok(object_response(
        resource,
        200,
        &CachedObject::new(stored, None),
        format,
        &warnings,
    ))
}

/// Whether a PUT that found no object (`missing`) creates it: the strategy's
/// `AllowCreateOnUpdate`, for the main resource only (a subresource of nothing is 404).
fn creates_on_update(strategy: &dyn Strategy, ctx: &Ctx<'_>, missing: &ApiError) -> bool {
    missing.code == 404 && ctx.subresource.is_none() && strategy.allow_create_on_update()
}

/// An update that names a resourceVersion is conditional on it: 409 when the object moved
/// on. One that names none is unconditional when the strategy allows it
/// (`AllowUnconditionalUpdate`), else refused as Kubernetes' generic store refuses it (a 422
/// whose kind is the resource, as its `Update` builds it).
fn check_resource_version(
    strategy: &dyn Strategy,
    resource: &ResourceInfo,
    name: &str,
    old: &CachedObject,
    new: &Value,
) -> Result<(), ApiError> {
    match new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
    {
        Some(rv) if rv != old.resource_version().to_string() => Err(ApiError::conflict(
            resource.group,
            resource.resource,
            name,
            storage::CONFLICT_MESSAGE,
        )),
        Some(_) => Ok(()),
        None if strategy.allow_unconditional_update() => Ok(()),
        None => Err(ApiError::invalid(
            resource.group,
            resource.resource,
            name,
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.resourceVersion",
                RESOURCE_VERSION_REQUIRED,
            )],
        )),
    }
}

/// Kubernetes' cause for an update without a resourceVersion where one is required (the
/// generic store's `Update`; the value is Go's rendering of the unsigned 0 it parsed).
const RESOURCE_VERSION_REQUIRED: &str = "Invalid value: 0x0: must be specified for an update";

/// Kubernetes' UID precondition of an update: a PUT whose body names a `uid` is conditional
/// on it (`defaultUpdatedObjectInfo.Preconditions`), checked by the storage before anything
/// else and answered 409 as a failed precondition.
fn update_uid_precondition(
    resource: &ResourceInfo,
    name: &str,
    current: &CachedObject,
    new: &Value,
) -> Result<(), ApiError> {
    let Some(uid) = new
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    else {
        return Ok(());
    };
    let current_uid = current
        .value()
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if uid == current_uid {
        return Ok(());
    }
    Err(ApiError::conflict(
        resource.group,
        resource.resource,
        name,
        &format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}"
        ),
    ))
}

/// Stores `new` over `old` (the object read at `old`'s resourceVersion), finishing a deletion
/// when the update took away what it waited for. Returns the stored object and the
/// strategy's warnings, or the conflict for the caller to retry.
///
/// Order, as Kubernetes': the strategy's `PrepareForUpdate` (server-owned metadata, the
/// subresource's reset) and defaults → `managedFields` → admission → validation → the
/// compare-and-swap write.
pub async fn write_update(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &dyn Strategy,
    req: &Request,
    old: &CachedObject,
    new: Value,
) -> Result<(Value, Vec<String>), WriteError> {
    write_update_as(server, resource, strategy, req, old, new, Ownership::Update).await
}

/// How a write's field ownership is recorded in `managedFields`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ownership {
    /// Every write but an apply: the request's manager takes the fields it changed in an
    /// `Update` entry.
    Update,
    /// A server-side apply, whose `Apply` entry the apply itself already recorded: recording
    /// it again as an update would move the applier's fields to an `Update` entry of the same
    /// manager, and its next apply would then conflict with itself.
    Applied,
}

/// [`write_update`], with the ownership recorded as `ownership` says.
pub(super) async fn write_update_as(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &dyn Strategy,
    req: &Request,
    old: &CachedObject,
    mut new: Value,
    ownership: Ownership,
) -> Result<(Value, Vec<String>), WriteError> {
    let ctx = Ctx::of(resource, req);
    let name = old.name().to_string();
    strategy.prepare_for_update(&ctx, old.value(), &mut new);
    if ctx.subresource.is_none() {
        skerry_api::defaults::apply_defaults(resource, &mut new);
    }
    if ownership == Ownership::Update {
        let now = meta::now();
        let manager = body::field_manager_of(resource, req, "update", &now)?;
        skerry_api::patch::record_update(&manager, Some(old.value()), &mut new);
    }
    // Kubernetes' order (`handlers/update.go`): the field manager and mutating admission are
    // transformers of the new object, applied before the registry's `BeforeUpdate`
    // validates it — so Priority's copy-back of `spec.priority` on a pod replacement that
    // left it out happens before pod-update validation, which would otherwise see the
    // priority "changed" to nothing.
    crate::admission::admit_update(
        server,
        resource,
        ctx.subresource,
        old.value(),
        &mut new,
        ctx.user,
    )
    .await?;
    invalid(
        resource,
        &name,
        strategy.validate_update(&ctx, old.value(), &new),
    )?;
    let warnings = strategy.warnings_on_update(&ctx, old.value(), &new);
    strategy.canonicalize(&mut new);
    let delete = strategy.should_delete_during_update(&new);
    if req.dry_run()? {
        return Ok((new, warnings));
    }
    if delete {
        let deleted = super::delete::remove(server, resource, strategy, ctx.namespace, old).await?;
        return Ok((deleted, warnings));
    }
    let lease = match strategy.ttl_leases(server) {
        Some(leases) => leases.lease(&server.store).await?,
        None => 0,
    };
    let at = storage::Revisions {
        expected: old.resource_version(),
        lease,
    };
    let stored = store_update(server, &ctx, strategy, &name, old, new, at).await?;
    Ok((stored, warnings))
}

/// The compare-and-swap write of an update, with what the strategy claims and releases in
/// the same transaction (allocating again when a concurrent write took a claim first, as a
/// create does).
async fn store_update(
    server: &ApiServer,
    ctx: &Ctx<'_>,
    strategy: &dyn Strategy,
    name: &str,
    old: &CachedObject,
    new: Value,
    at: storage::Revisions,
) -> Result<Value, WriteError> {
    let resource = ctx.resource;
    let mut what = "";
    for _ in 0..create::ALLOCATION_ATTEMPTS_MAX {
        let (object, claims, releases) =
            match strategy.allocate_update(server, ctx, name, old.value(), &new)? {
                Some(a) => (a.object, a.claims, a.releases),
                None => (new.clone(), Vec::new(), Vec::new()),
            };
        let write = storage::update_claiming(
            &server.store,
            resource,
            ctx.namespace,
            name,
            object,
            at,
            &claims,
            &releases,
        );
        match server.timed("update", resource, write).await {
            Err(WriteError::ClaimTaken { .. }) => what = "a claimed value",
            stored => return stored,
        }
    }
    Err(WriteError::Api(ApiError::internal(format!(
        "failed to allocate {what} after {} attempts",
        create::ALLOCATION_ATTEMPTS_MAX
    ))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use skerry_api::catalogue::lookup;

    use super::*;
    use crate::auth::UserInfo;

    /// A strategy that wants every update conditional and lets a PUT create.
    struct Strict;

    impl Strategy for Strict {
        fn allow_unconditional_update(&self) -> bool {
            false
        }

        fn allow_create_on_update(&self) -> bool {
            true
        }
    }

    fn stored(rv: i64) -> CachedObject {
        CachedObject::new(
            json!({"metadata": {"name": "c", "resourceVersion": rv.to_string()}}),
            None,
        )
    }

    #[test]
    fn an_update_without_a_version_needs_the_strategy_to_allow_it() {
        let configmaps = lookup("", "v1", "configmaps").expect("served");
        let old = stored(7);
        let unversioned = json!({"metadata": {"name": "c"}});
        let lenient = crate::strategy::of(configmaps);
        assert!(check_resource_version(lenient, configmaps, "c", &old, &unversioned).is_ok());
        let e = check_resource_version(&Strict, configmaps, "c", &old, &unversioned)
            .expect_err("refused");
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "configmaps \"c\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
        );
        let stale = json!({"metadata": {"name": "c", "resourceVersion": "6"}});
        let e = check_resource_version(lenient, configmaps, "c", &old, &stale).expect_err("409");
        assert_eq!(e.code, 409);
        let fresh = json!({"metadata": {"name": "c", "resourceVersion": "7"}});
        assert!(check_resource_version(&Strict, configmaps, "c", &old, &fresh).is_ok());
    }

    #[test]
    fn only_a_put_of_the_main_resource_creates_and_only_where_allowed() {
        let configmaps = lookup("", "v1", "configmaps").expect("served");
        let user = UserInfo::authenticated("u", "", Vec::new());
        let main = Ctx {
            resource: configmaps,
            namespace: Some("ns"),
            subresource: None,
            user: &user,
        };
        let missing = ApiError::not_found("", "configmaps", "c");
        assert!(creates_on_update(&Strict, &main, &missing));
        assert!(!creates_on_update(
            crate::strategy::of(configmaps),
            &main,
            &missing
        ));
        let status = Ctx {
            subresource: Some("status"),
            ..main
        };
        assert!(!creates_on_update(&Strict, &status, &missing));
        let unavailable = ApiError::internal("store down");
        assert!(!creates_on_update(&Strict, &main, &unavailable));
    }
}
