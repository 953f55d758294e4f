//! CREATE, and the steps every new object goes through — a POST and a server-side apply of
//! an object that does not exist alike: server-owned metadata, defaults and the strategy's
//! `PrepareForCreate` (`prepare_new`), admission then validation (`admit_then_validate`),
//! and the store write with what the strategy claims and the lease it rides (`store_new`).

use http::Response;
use serde_json::Value;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::{ApiError, meta};

use super::{body, invalid, object_response};
use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::storage::{self, WriteError};
use crate::strategy::{Ctx, Strategy};
use crate::watch_cache::object::CachedObject;

/// Attempts at storing an object whose allocation was taken by a concurrent create between
/// reading the claims and writing: each attempt allocates again from fresh claims, so two
/// almost always suffice; the bound stops a pathological race from spinning.
pub(super) const ALLOCATION_ATTEMPTS_MAX: usize = 8;

pub(super) async fn create(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &'static dyn Strategy,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let (object, warnings) = body::decode_body(resource, req)?;
    let ctx = Ctx::of(resource, req);
    create_object(server, &ctx, strategy, req, object, warnings, "create").await
}

/// Creates the decoded `object` of a POST, or of a PUT where the strategy allows creating
/// on update; `fallback` names the field manager when the request names none
/// (`kubectl-create`, ...: Kubernetes derives it from the user agent and the verb).
pub(super) async fn create_object(
    server: &ApiServer,
    ctx: &Ctx<'_>,
    strategy: &dyn Strategy,
    req: &Request,
    mut object: Value,
    mut warnings: Vec<String>,
    fallback: &str,
) -> Result<Response<Body>, ApiError> {
    let resource = ctx.resource;
    prepare_new(ctx, strategy, &mut object)?;
    let name = meta::name(&object).to_string();
    {
        let now = meta::now();
        let manager = body::field_manager_of(resource, req, fallback, &now)?;
        skerry_api::patch::record_update(&manager, None, &mut object);
    }
    warnings.extend(admit_then_validate(server, ctx, strategy, &name, &mut object).await?);
    let format = req.format()?;
    if req.dry_run()? {
        return Ok(object_response(
            resource,
            201,
            &CachedObject::new(object, None),
            format,
            &warnings,
        ));
    }
    let stored = store_new(server, ctx, strategy, &name, object)
        .await
        .map_err(|e| e.into_api_error(resource, &name))?;
    Ok(object_response(
        resource,
        201,
        &CachedObject::new(stored, None),
        format,
        &warnings,
    ))
}

/// What every create does before admission: server-owned metadata (the status a client
/// may not send dropped, the generation set), defaults, then the strategy's
/// `PrepareForCreate` (a pod's `Pending` status with its QoS class).
pub(super) fn prepare_new(
    ctx: &Ctx<'_>,
    strategy: &dyn Strategy,
    object: &mut Value,
) -> Result<(), ApiError> {
    meta::prepare_create(ctx.resource, object, ctx.namespace)?;
    skerry_api::defaults::apply_defaults(ctx.resource, object);
    strategy.prepare_for_create(ctx, object);
    Ok(())
}

/// Admission and validation of a new object, in Kubernetes' order: NamespaceLifecycle (the
/// first admission plugin), the other plugins — mutating ones such as Priority, which turns
/// `spec.priorityClassName` into `spec.priority`, run before validation (`handlers/
/// create.go` calls `Admit` before the registry's `BeforeCreate` validates) — then the
/// strategy's `Validate`, its `WarningsOnCreate` (returned) and its `Canonicalize`. A pod
/// that is both invalid and names an unknown class is refused by admission (403), as
/// Kubernetes refuses it.
///
/// The plugins' validating halves (Priority's single-default check for PriorityClasses,
/// OwnerReferencesPermissionEnforcement) run in the same call for now: `admission` does
/// not yet split its plugins into a mutating and a validating phase.
pub(super) async fn admit_then_validate(
    server: &ApiServer,
    ctx: &Ctx<'_>,
    strategy: &dyn Strategy,
    name: &str,
    object: &mut Value,
) -> Result<Vec<String>, ApiError> {
    crate::admission::admit_create(server, ctx.resource, ctx.namespace, object, ctx.user).await?;
    invalid(ctx.resource, name, strategy.validate(ctx, object))?;
    let warnings = strategy.warnings_on_create(ctx, object);
    strategy.canonicalize(object);
    Ok(warnings)
}

/// Stores a new object: with what the strategy allocates claimed in the same transaction
/// (allocating again when a concurrent create took it first), and on the strategy's TTL
/// lease when its objects expire.
pub(super) async fn store_new(
    server: &ApiServer,
    ctx: &Ctx<'_>,
    strategy: &dyn Strategy,
    name: &str,
    object: Value,
) -> Result<Value, WriteError> {
    let lease = match strategy.ttl_leases(server) {
        Some(leases) => leases.lease(&server.store).await?,
        None => 0,
    };
    let mut what = "";
    for _ in 0..ALLOCATION_ATTEMPTS_MAX {
        let Some(allocation) = strategy.allocate(server, ctx, name, &object)? else {
            return insert(server, ctx, name, object, &[], lease).await;
        };
        match insert(
            server,
            ctx,
            name,
            allocation.object,
            &allocation.claims,
            lease,
        )
        .await
        {
            Err(WriteError::ClaimTaken { .. }) => match allocation.if_taken {
                Some(e) => return Err(WriteError::Api(e)),
                None => what = allocation.what,
            },
            stored => return stored,
        }
    }
    Err(WriteError::Api(ApiError::internal(format!(
        "failed to allocate {what} after {ALLOCATION_ATTEMPTS_MAX} attempts"
    ))))
}

/// One create transaction: the object, its claims, its lease.
async fn insert(
    server: &ApiServer,
    ctx: &Ctx<'_>,
    name: &str,
    object: Value,
    claims: &[(String, bytes::Bytes)],
    lease: i64,
) -> Result<Value, WriteError> {
    server
        .timed(
            "create",
            ctx.resource,
            storage::create_with(
                &server.store,
                ctx.resource,
                ctx.namespace,
                name,
                object,
                claims,
                lease,
            ),
        )
        .await
}
