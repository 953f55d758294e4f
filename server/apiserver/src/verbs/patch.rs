//! PATCH: JSON patch, merge patch, strategic merge patch and server-side apply, applied to
//! the current object and written as an update (`update::write_update_as`) —
//! retried when the object moved under it, as Kubernetes' patcher does — or, for an apply
//! of an object that does not exist, as a create ([`super::create`]).

use http::Response;
use serde_json::Value;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::strict::FieldValidation;
use skerry_api::{ApiError, meta};

use super::create::{admit_then_validate, prepare_new, store_new};
use super::update::{Ownership, write_update_as};
use super::{current, invalid, name_of, object_response};
use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::storage::{self, WriteError};
use crate::strategy::{Ctx, Strategy};
use crate::watch_cache::object::CachedObject;

/// Times a patch is retried when the object changed under it (Kubernetes'
/// `maxRetryWhenPatchConflicts = 5`); past that the client gets the 409.
const PATCH_CONFLICT_RETRIES_MAX: usize = 5;

pub(super) async fn patch(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    strategy: &'static dyn Strategy,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let ctx = Ctx::of(resource, req);
    let namespace = req.info.namespace.as_deref();
    let patch_type = skerry_api::patch::PatchType::from_content_type(req.content_type())
        .ok_or_else(|| ApiError::unsupported_media_type(req.content_type()))?;
    let validation = FieldValidation::parse(req.param("fieldValidation"))?;
    let format = req.format()?;
    let is_apply = patch_type == skerry_api::patch::PatchType::Apply;
    // Kubernetes' `ValidatePatchOptions`: `force` in any form, `force=false` too, is refused
    // on a patch that is not an apply.
    let force = req.bool_param("force");
    if force.is_some() && !is_apply {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            vec![skerry_api::Cause::new(
                "FieldValueForbidden",
                "force",
                "Forbidden: may not be specified for non-apply patch",
            )],
        ));
    }
    let force = force.unwrap_or(false);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let old = match current(server, resource, namespace, name).await {
            Ok(o) => Some(o),
            Err(e) if e.code == 404 && is_apply => None,
            Err(e) => return Err(e),
        };
        let patched = if is_apply {
            let manager = req
                .param("fieldManager")
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "PATCH, application/apply-patch+yaml requests require fieldManager",
                    )
                })?;
            let applied = crate::yaml::to_json(&req.body)?;
            let now = meta::now();
            let field_manager = skerry_api::patch::FieldManager {
                schema: &skerry_api::patch::BuiltinSchema,
                definition: resource.definition,
                manager,
                subresource: req.info.subresource.as_deref().unwrap_or(""),
                now: &now,
            };
            skerry_api::patch::server_side_apply(
                &field_manager,
                old.as_ref().map(|o| o.value()),
                &applied,
                force,
            )?
        } else {
            let old = old.as_ref().expect("non-apply patches return 404 above");
            skerry_api::patch::apply_patch(
                patch_type,
                old.value(),
                &req.body,
                &skerry_api::patch::BuiltinSchema,
                resource.definition,
            )?
        };
        // The patched object passes the same strict check a body would.
        let decoded = skerry_api::kinds::decode_value(resource, patched, validation)?;
        patched_preconditions(resource, name, old.as_ref(), &decoded.object)?;
        let mut warnings = decoded.warnings;
        let result = match &old {
            Some(old) => {
                let ownership = if is_apply {
                    Ownership::Applied
                } else {
                    Ownership::Update
                };
                write_update_as(
                    server,
                    resource,
                    strategy,
                    req,
                    old,
                    decoded.object,
                    ownership,
                )
                .await
            }
            None => {
                // Server-side apply creates what does not exist.
                // Its `managedFields` are the apply's own, recorded above.
                let mut object = decoded.object;
                prepare_new(&ctx, strategy, &mut object)?;
                let more = admit_then_validate(server, &ctx, strategy, name, &mut object).await?;
                if req.dry_run()? {
                    Ok((object, more))
                } else {
                    store_new(server, &ctx, strategy, name, object)
                        .await
                        .map(|stored| (stored, more))
                }
            }
        };
        match result {
            Ok((stored, more)) => {
                let code = if old.is_none() { 201 } else { 200 };
                warnings.extend(more);
                return Ok(object_response(
                    resource,
                    code,
                    &CachedObject::new(stored, None),
                    format,
                    &warnings,
                ));
            }
            Err(WriteError::Conflict { .. } | WriteError::AlreadyExists)
                if attempt <= PATCH_CONFLICT_RETRIES_MAX =>
            {
                continue;
            }
            Err(e) => return Err(e.into_api_error(resource, name)),
        }
    }
}

/// The preconditions a patch carries in the object it produces, checked as Kubernetes'
/// registry checks them (`Store.Update` after the patcher ran): the patch is applied to the
/// current object, which carries the current `resourceVersion` and `uid`, so only a patch
/// that *sets* them to something else fails — one that leaves them out (or removes the
/// resourceVersion) is unconditional.
///
/// - a `resourceVersion` other than the current one: 409, the optimistic-lock conflict an
///   update at a stale version gets. Not retried: the patch would set the same version again.
/// - a `uid` other than the current one: 422, `metadata.uid` is immutable (Kubernetes has no
///   UID precondition on PATCH; `BeforeUpdate`'s common-field validation rejects the change,
///   and controllers — `ReleasePod`, the garbage collector — take the 422 to mean "the object
///   was replaced").
/// - an apply that would create the object but names a `uid`: 409, as Kubernetes'
///   `applyPatch` answers ("uid mismatch ... no existing object was found").
fn patched_preconditions(
    resource: &ResourceInfo,
    name: &str,
    current: Option<&CachedObject>,
    patched: &Value,
) -> Result<(), ApiError> {
    let set = |field: &str| {
        patched
            .pointer(field)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let Some(current) = current else {
        return match set("/metadata/uid") {
            Some(uid) => Err(ApiError::conflict(
                resource.group,
                resource.resource,
                name,
                &format!(
                    "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                ),
            )),
            None => Ok(()),
        };
    };
    if let Some(rv) = set("/metadata/resourceVersion")
        && rv != current.resource_version().to_string()
    {
        return Err(ApiError::conflict(
            resource.group,
            resource.resource,
            name,
            storage::CONFLICT_MESSAGE,
        ));
    }
    let current_uid = current
        .value()
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(uid) = set("/metadata/uid")
        && uid != current_uid
    {
        return invalid(
            resource,
            name,
            vec![skerry_api::Cause::invalid(
                "metadata.uid",
                uid,
                UID_IMMUTABLE_MESSAGE,
            )],
        );
    }
    Ok(())
}

/// Kubernetes' message for a changed immutable field (`field.Invalid` by
/// `ValidateImmutableField`).
const UID_IMMUTABLE_MESSAGE: &str = "field is immutable";
