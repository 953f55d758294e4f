//! Subresources with their own shapes: `scale` (autoscaling/v1 Scale over a workload's
//! replicas), `pods/binding` (the scheduler's write), `pods/eviction` (a deletion that
//! honours PodDisruptionBudgets: `kubectl drain`), `serviceaccounts/token`
//! (`kubectl create token`).
//!
//! Eviction invariant: a pod covered by a budget is deleted only after that budget's
//! `status.disruptionsAllowed` was decremented by a compare-and-swap on the PDB's
//! resourceVersion, with the pod recorded in `status.disruptedPods` — so two evictions
//! racing for the last allowed disruption cannot both win, and the disruption controller
//! (which recomputes the budget from the pods it sees) does not count the pod as healthy
//! while its deletion is on the way.

use std::time::{Duration, SystemTime};

use http::Response;
use serde_json::{Value, json};
use skerry_api::retry::{Backoff, Conflict as _, on_error, retry_on_conflict};
use skerry_api::strict::FieldValidation;
use skerry_api::{ApiError, ResourceInfo, meta};

use crate::auth::serviceaccount::{EXPIRATION_DEFAULT, EXPIRATION_MIN, TokenRequest};
use crate::handler::{ApiServer, Request};
use crate::response::{self, Body};
use crate::storage::{self, WriteError};
use crate::strategy;
use crate::verbs::{current, delete_one, name_of, write_update};
use crate::watch_cache::object::CachedObject;

/// Times a scale or binding write is retried on a conflict (as patches are).
const WRITE_CONFLICT_RETRIES_MAX: usize = 5;

/// `a=b,c=d` from a LabelSelector, requirements sorted by key as Kubernetes prints them.
fn selector_string(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return String::new();
    };
    let mut parts: Vec<(String, String)> = Vec::new();
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            parts.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    if let Some(exprs) = selector.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e["key"].as_str().unwrap_or("").to_string();
            let mut values: Vec<&str> = e["values"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            values.sort_unstable();
            let text = match e["operator"].as_str().unwrap_or("") {
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.clone(),
                "DoesNotExist" => format!("!{key}"),
                _ => continue,
            };
            parts.push((key, text));
        }
    }
    parts.sort();
    parts
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// The Scale of a workload.
fn scale_of(object: &CachedObject) -> Value {
    let v = object.value();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": object.name(),
            "namespace": object.namespace(),
            "uid": v.pointer("/metadata/uid"),
            "resourceVersion": object.resource_version().to_string(),
            "creationTimestamp": v.pointer("/metadata/creationTimestamp"),
        },
        "spec": {"replicas": v.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0)},
        "status": {
            "replicas": v.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector_string(v.pointer("/spec/selector")),
        },
    })
}

pub async fn get_scale(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let object = current(
        server,
        resource,
        req.info.namespace.as_deref(),
        name_of(req)?,
    )
    .await?;
    Ok(response::json(200, &scale_of(&object), &[]))
}

/// From the workload's current Scale: the replicas to set and the resourceVersion the client
/// required (if any).
type ScaleComputation<'a> = dyn Fn(&Value) -> Result<(i64, Option<String>), ApiError> + Sync + 'a;

/// Writes `replicas` into the workload, conditional on `expected_rv` when the client named one.
async fn set_replicas(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
    compute: &ScaleComputation<'_>,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let strategy = strategy::of(resource);
    for _ in 0..=WRITE_CONFLICT_RETRIES_MAX {
        let old = current(server, resource, req.info.namespace.as_deref(), name).await?;
        let scale = scale_of(&old);
        let (replicas, expected_rv) = compute(&scale)?;
        if replicas < 0 {
            return Err(ApiError::invalid(
                "autoscaling",
                "Scale",
                name,
                vec![skerry_api::Cause::new(
                    "FieldValueInvalid",
                    "spec.replicas",
                    format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                )],
            ));
        }
        if let Some(rv) = expected_rv.filter(|rv| !rv.is_empty())
            && rv != old.resource_version().to_string()
        {
            return Err(ApiError::conflict(
                resource.group,
                resource.resource,
                name,
                storage::CONFLICT_MESSAGE,
            ));
        }
        let mut new = old.value().clone();
        new["spec"]["replicas"] = json!(replicas);
        match write_update(server, resource, strategy, req, &old, new).await {
            Ok((stored, warnings)) => {
                return Ok(response::json(
                    200,
                    &scale_of(&CachedObject::new(stored, None)),
                    &warnings,
                ));
            }
            Err(WriteError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into_api_error(resource, name)),
        }
    }
    Err(ApiError::conflict(
        resource.group,
        resource.resource,
        name,
        storage::CONFLICT_MESSAGE,
    ))
}

pub async fn update_scale(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let body = skerry_api::kinds::decode_definition(
        "io.k8s.api.autoscaling.v1.Scale",
        &req.body,
        FieldValidation::parse(req.param("fieldValidation"))?,
        ("autoscaling/v1", "Scale"),
    )?
    .object;
    let replicas = body
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let rv = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    set_replicas(server, resource, req, &|_| Ok((replicas, rv.clone()))).await
}

pub async fn patch_scale(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let patch_type = skerry_api::patch::PatchType::from_content_type(req.content_type())
        .ok_or_else(|| ApiError::unsupported_media_type(req.content_type()))?;
    if patch_type == skerry_api::patch::PatchType::Apply {
        return Err(ApiError::unsupported_media_type(
            "application/apply-patch+yaml on scale",
        ));
    }
    let body = req.body.clone();
    set_replicas(server, resource, req, &|scale| {
        let patched = skerry_api::patch::apply_patch(
            patch_type,
            scale,
            &body,
            &skerry_api::patch::BuiltinSchema,
            "io.k8s.api.autoscaling.v1.Scale",
        )?;
        let replicas = patched
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| ApiError::bad_request("spec.replicas must be an integer"))?;
        Ok((replicas, None))
    })
    .await
}

/// `POST pods/<name>/binding`: sets the pod's node, once.
pub async fn bind(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let binding = skerry_api::kinds::decode_definition(
        "io.k8s.api.core.v1.Binding",
        &req.body,
        FieldValidation::parse(req.param("fieldValidation"))?,
        ("v1", "Binding"),
    )?
    .object;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![skerry_api::Cause::required("target.name")],
        ));
    }
    for _ in 0..=WRITE_CONFLICT_RETRIES_MAX {
        let old = current(server, resource, req.info.namespace.as_deref(), name).await?;
        if old
            .value()
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(current_node) = old
            .value()
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            && !current_node.is_empty()
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node {current_node:?}"),
            ));
        }
        let mut new = old.value().clone();
        new["spec"]["nodeName"] = json!(node);
        let conditions = new["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut conditions: Vec<Value> = conditions
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}));
        new["status"]["conditions"] = json!(conditions);
        if req.dry_run()? {
            break;
        }
        match server
            .timed(
                "update",
                resource,
                storage::update(
                    &server.store,
                    resource,
                    req.info.namespace.as_deref(),
                    name,
                    new,
                    old.resource_version(),
                ),
            )
            .await
        {
            Ok(_) => break,
            Err(WriteError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into_api_error(resource, name)),
        }
    }
    Ok(response::json(201, &skerry_api::status::success(None), &[]))
}

// ----- pods/eviction -----

/// Most pods a PDB's `status.disruptedPods` may hold before evictions under it are refused
/// (Kubernetes' `MaxDisruptedPodSize`): that many approved evictions not yet confirmed by the
/// disruption controller means it is not keeping up, and approving more could overrun the
/// budget. The controller drops entries after its own timeout, so this heals by itself.
const DISRUPTED_PODS_MAX: usize = 2000;

/// Attempts of one eviction step that loses a compare-and-swap (Kubernetes' `EvictionsRetry`:
/// 20 steps 500 ms apart with 10 % jitter, about 10 s in all): long enough to ride out the
/// disruption controller's own status writes to the same PDB, short enough that a client
/// (kubectl drain retries on its own) is not held for long.
const EVICTION_ATTEMPTS_MAX: u32 = 20;

/// Kubernetes' `EvictionsRetry` (`pkg/registry/core/pod/storage/eviction.go`), which its
/// eviction wraps each step in with client-go's `retry.OnError` / `RetryOnConflict`: the
/// same retry the controllers use, [`skerry_api::retry`]. The jitter (10 %) keeps evictions
/// racing for one budget from retrying in lockstep.
const EVICTIONS_RETRY: Backoff = Backoff {
    duration: Duration::from_millis(500),
    factor: 1.0,
    jitter: 0.1,
    steps: EVICTION_ATTEMPTS_MAX,
    cap: Duration::ZERO,
};

/// `retryAfterSeconds` of the 429 for a budget the disruption controller has not processed
/// yet (Kubernetes' `createTooManyRequestsError`: a small hint that stops well-behaved
/// clients from hammering the server while the controller catches up).
const PDB_PROCESSING_RETRY_AFTER_SECONDS: u32 = 10;

/// Kubernetes' words for an eviction the budget does not allow now.
const EVICTION_BLOCKED: &str = "Cannot evict pod as it would violate the pod's disruption budget.";
/// Kubernetes' words for a pod under two or more budgets.
const MULTIPLE_PDBS: &str = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
/// The `details.causes[].reason` of a budget refusal (policy/v1 `DisruptionBudgetCause`).
const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// The PDB condition the eviction updates when it spends the last disruption (policy/v1
/// `DisruptionAllowedCondition`, with `InsufficientPodsReason`).
const DISRUPTION_ALLOWED_CONDITION: &str = "DisruptionAllowed";
const INSUFFICIENT_PODS_REASON: &str = "InsufficientPods";
/// `spec.unhealthyPodEvictionPolicy` that lets a not-ready pod go whatever the budget says.
const ALWAYS_ALLOW: &str = "AlwaysAllow";

/// The pod condition an eviction sets before it deletes the pod (Kubernetes 1.31+,
/// `PodDisruptionConditions`): it tells a Job's pod-failure policy, and whoever reads the pod,
/// that the pod went because it was evicted, not because it failed. The disruption controller
/// sets it back to False if the pod is then not deleted.
const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// The condition's reason and message, Kubernetes' words.
const EVICTION_BY_EVICTION_API: &str = "EvictionByEvictionAPI";
const EVICTION_BY_EVICTION_API_MESSAGE: &str = "Eviction API: evicting";

/// The 429 of an eviction the budget refuses, `Too many requests: ...` as Kubernetes'
/// `NewTooManyRequests` words it, with the budget named in a `DisruptionBudget` cause.
/// `retry_after_seconds` 0 leaves the hint out, as Kubernetes omits a zero.
fn budget_refusal(cause: String, retry_after_seconds: u32) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        format!("Too many requests: {EVICTION_BLOCKED}"),
    );
    e.retry_after_seconds = Some(retry_after_seconds).filter(|s| *s > 0);
    e.causes
        .push(skerry_api::Cause::new(DISRUPTION_BUDGET_CAUSE, "", cause));
    e
}

/// The 429 for a budget whose spec changed since the disruption controller last computed
/// its status (`observedGeneration` behind `generation`), or whose pod changed under the
/// eviction: its numbers cannot be trusted yet.
fn budget_being_processed(pdb_name: &str) -> ApiError {
    budget_refusal(
        format!("The disruption budget {pdb_name} is still being processed by the server."),
        PDB_PROCESSING_RETRY_AFTER_SECONDS,
    )
}

/// A 403 about a budget, as Kubernetes words it (`policy.Resource("poddisruptionbudget")`,
/// singular, is what Kubernetes names).
fn budget_forbidden(pdb_name: &str, reason: &str) -> ApiError {
    let mut e = ApiError::forbidden(format!(
        "poddisruptionbudget.policy {pdb_name:?} is forbidden: {reason}"
    ));
    e.group = Some("policy".into());
    e.kind = Some("poddisruptionbudget".into());
    e.name = Some(pdb_name.into());
    e
}

fn int_at(value: &Value, pointer: &str) -> i64 {
    value.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Kubernetes' `checkAndDecrement` on one budget, as a pure step: the budget's next status
/// (one disruption fewer, `pod` listed in `disruptedPods` at `now`), or the refusal.
pub fn check_and_decrement(pdb: &Value, pod: &str, now: &str) -> Result<Value, ApiError> {
    let name = meta::name(pdb);
    if int_at(pdb, "/status/observedGeneration") < int_at(pdb, "/metadata/generation") {
        return Err(budget_being_processed(name));
    }
    let allowed = int_at(pdb, "/status/disruptionsAllowed");
    if allowed < 0 {
        return Err(budget_forbidden(
            name,
            "pdb disruptions allowed is negative",
        ));
    }
    let disrupted = pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .map_or(0, serde_json::Map::len);
    if disrupted > DISRUPTED_PODS_MAX {
        return Err(budget_forbidden(
            name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(budget_refusal(
            format!(
                "The disruption budget {name} needs {} healthy pods and has {} currently",
                int_at(pdb, "/status/desiredHealthy"),
                int_at(pdb, "/status/currentHealthy"),
            ),
            0,
        ));
    }
    let mut next = pdb.clone();
    if !next.get("status").is_some_and(Value::is_object) {
        next["status"] = json!({});
    }
    next["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if allowed - 1 == 0 {
        set_disruption_allowed_false(&mut next["status"], now);
    }
    if !next["status"]
        .get("disruptedPods")
        .is_some_and(Value::is_object)
    {
        next["status"]["disruptedPods"] = json!({});
    }
    next["status"]["disruptedPods"][pod] = json!(now);
    Ok(next)
}

/// component-helpers' `UpdateDisruptionAllowedCondition` for a budget with no disruption
/// left, through `meta.SetStatusCondition`: the transition time moves only when the status
/// does.
fn set_disruption_allowed_false(status: &mut Value, now: &str) {
    let observed = status
        .get("observedGeneration")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let mut conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let existing = conditions
        .iter_mut()
        .find(|c| c["type"] == DISRUPTION_ALLOWED_CONDITION);
    match existing {
        Some(c) => {
            if c["status"] != "False" {
                c["status"] = json!("False");
                c["lastTransitionTime"] = json!(now);
            }
            c["reason"] = json!(INSUFFICIENT_PODS_REASON);
            c["message"] = json!("");
            c["observedGeneration"] = json!(observed);
        }
        None => conditions.push(json!({
            "type": DISRUPTION_ALLOWED_CONDITION,
            "status": "False",
            "reason": INSUFFICIENT_PODS_REASON,
            "message": "",
            "observedGeneration": observed,
            "lastTransitionTime": now,
        })),
    }
    status["conditions"] = Value::Array(conditions);
}

/// Kubernetes' `canIgnorePDB`: a pod that is not running yet (Pending), is done
/// (Succeeded, Failed) or is already being deleted disrupts nothing its budget counts.
fn can_ignore_pdb(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Pending" | "Succeeded" | "Failed")
    ) || pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Kubernetes' `shouldEnforceResourceVersion`: a pod that could still become ready (not
/// terminal, not being deleted) is deleted only at the version the decision was made on.
fn should_enforce_resource_version(pod: &Value) -> bool {
    !matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    ) && pod
        .pointer("/metadata/deletionTimestamp")
        .is_none_or(Value::is_null)
}

/// `IsPodReady`: the pod's `Ready` condition is `True`.
fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Whether `pdb` covers `pod` (Kubernetes' `getPodDisruptionBudgets`): same namespace and a
/// selector that matches its labels. policy/v1 semantics: a null selector covers no pod and an
/// empty one (`{}`) every pod of the namespace. A malformed selector covers nothing — a
/// budget that slipped through with one must not freeze every pod of its namespace.
fn pdb_covers(pdb: &Value, pod: &Value) -> bool {
    if meta::namespace(pdb) != meta::namespace(pod) {
        return false;
    }
    let Some(selector) = pdb.pointer("/spec/selector").filter(|s| !s.is_null()) else {
        return false;
    };
    let Ok(selector) = serde_json::from_value::<
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    >(selector.clone()) else {
        return false;
    };
    match skerry_api::selector::LabelSelector::from_api(&selector) {
        Ok(selector) => selector.matches(&skerry_api::selector::labels_of(pod)),
        Err(_) => false,
    }
}

/// The Eviction in a request body (policy/v1, or the identical policy/v1beta1 that older
/// clients send, as Kubernetes accepts both), decoded strictly.
fn decode_eviction(req: &Request) -> Result<Value, ApiError> {
    let media = req.content_type().split(';').next().unwrap_or("").trim();
    if !matches!(media, "" | "application/json") {
        // The protobuf schema table holds no Eviction; kubectl and client-go send JSON.
        return Err(ApiError::unsupported_media_type(req.content_type()));
    }
    let mut body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}")))?;
    if body.get("apiVersion").and_then(Value::as_str) == Some("policy/v1beta1") {
        body["apiVersion"] = json!("policy/v1");
    }
    let bytes = serde_json::to_vec(&body)
        .map_err(|e| ApiError::internal(format!("re-encoding the Eviction: {e}")))?;
    Ok(
        skerry_api::strict::decode::<k8s_openapi::api::policy::v1::Eviction>(
            &bytes,
            FieldValidation::parse(req.param("fieldValidation"))?,
            ("policy/v1", "Eviction"),
        )?
        .object,
    )
}

/// The Eviction's DeleteOptions, with the request's `dryRun` carried into them (Kubernetes'
/// `propagateDryRun`), and whether the eviction is a dry run.
fn eviction_delete_options(req: &Request, eviction: &Value) -> Result<(Value, bool), ApiError> {
    let mut options = eviction
        .get("deleteOptions")
        .filter(|o| o.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    let body_dry_run: Vec<&str> = options
        .get("dryRun")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(other) = body_dry_run.iter().find(|v| **v != "All") {
        return Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
        )));
    }
    let dry_run = req.dry_run()? || !body_dry_run.is_empty();
    if dry_run {
        options["dryRun"] = json!(["All"]);
    }
    Ok((options, dry_run))
}

/// The request the eviction's pod deletion runs as: the same user and pod, with the dry
/// run the eviction decided on.
fn deletion_request(req: &Request, dry_run: bool) -> Request {
    let mut query = req.query.clone();
    if dry_run {
        query.insert("dryRun".into(), "All".into());
    } else {
        query.remove("dryRun");
    }
    Request {
        info: req.info.clone(),
        query,
        headers: req.headers.clone(),
        body: bytes::Bytes::new(),
        user: req.user.clone(),
    }
}

/// The answer to an eviction that went through: a success Status, 201 as the create
/// handler sets it.
fn evicted() -> Response<Body> {
    let mut status = skerry_api::status::success(None);
    status["code"] = json!(201);
    response::json(201, &status, &[])
}

/// `POST pods/<name>/eviction`: Kubernetes' `EvictionREST.Create`
/// (`pkg/registry/core/pod/storage/eviction.go`, 1.32).
///
/// 1. A pod its budget cannot count (Pending, terminal, already deleting) is deleted at once.
/// 2. Otherwise the budgets of its namespace whose selector matches it are found: more than
///    one is a 500 (a Status, not an error reason, as Kubernetes answers); none lets the pod
///    go; one must allow a disruption, spent by [`decrement_budget`] — unless the pod is not
///    ready and the budget can spare it (`AlwaysAllow`, or enough healthy pods without it),
///    in which case nothing is spent and the pod is deleted only at the version judged.
/// 3. The pod is marked `DisruptionTarget=True` (unless dry run) and deleted with the
///    Eviction's DeleteOptions (grace period, preconditions, propagation), as a DELETE would
///    ([`add_condition_and_delete`]).
pub async fn evict(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let namespace = req.info.namespace.as_deref();
    let eviction = decode_eviction(req)?;
    if meta::name(&eviction) != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    if let Some(ns) = meta::namespace(&eviction).filter(|ns| !ns.is_empty())
        && Some(ns) != namespace
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let (options, dry_run) = eviction_delete_options(req, &eviction)?;
    let deletion = deletion_request(req, dry_run);
    // A resourceVersion the client set is a precondition it owns: a conflict against it is
    // its answer, never retried.
    let client_resource_version = options
        .pointer("/preconditions/resourceVersion")
        .is_some_and(|v| !v.is_null());
    let client_preconditions = client_resource_version
        || options
            .pointer("/preconditions/uid")
            .is_some_and(|v| !v.is_null());

    // A conflict (the pod changed) is retried, unless it is against the client's own
    // preconditions: that is its answer.
    let retriable = |e: &ApiError| e.is_conflict() && !client_preconditions;

    // 1. Pods no budget counts go at once.
    let counted = on_error(EVICTIONS_RETRY, retriable, || async {
        let pod = current(server, resource, namespace, name).await?;
        crate::noderestriction::admit(
            server,
            &crate::noderestriction::Request {
                resource,
                subresource: Some("eviction"),
                operation: crate::noderestriction::Operation::Create,
                name,
                namespace,
                object: Some(&eviction),
                old: Some(pod.value()),
                user: &req.user,
            },
        )
        .await?;
        if !can_ignore_pdb(pod.value()) {
            return Ok(Some(pod));
        }
        let mut pod_options = options.clone();
        if should_enforce_resource_version(pod.value()) && !client_resource_version {
            pod_options["preconditions"]["resourceVersion"] =
                json!(pod.resource_version().to_string());
        }
        add_condition_and_delete(server, resource, &deletion, pod, &pod_options, dry_run).await?;
        Ok(None)
    })
    .await?;
    let Some(pod) = counted else {
        return Ok(evicted());
    };

    // 2. The budget.
    let pdbs = skerry_api::catalogue::lookup("policy", "v1", "poddisruptionbudgets")
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))?;
    let list_options = storage::ListOptions {
        namespace: namespace.map(str::to_string),
        ..Default::default()
    };
    let listed = server
        .timed(
            "list",
            pdbs,
            storage::list(&server.store, pdbs, &list_options, None),
        )
        .await?;
    let mut covering: Vec<CachedObject> = listed
        .items
        .into_iter()
        .filter(|pdb| pdb_covers(pdb.value(), pod.value()))
        .collect();
    if covering.len() > 1 {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": MULTIPLE_PDBS, "code": 500,
        });
        return Ok(response::json(500, &status, &[]));
    }
    let mut judged_at_version = false;
    let budget = covering.pop();
    if let Some(pdb) = &budget {
        let unhealthy_may_go = !pod_ready(pod.value())
            && (pdb
                .value()
                .pointer("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str)
                == Some(ALWAYS_ALLOW)
                || (int_at(pdb.value(), "/status/currentHealthy")
                    >= int_at(pdb.value(), "/status/desiredHealthy")
                    && int_at(pdb.value(), "/status/desiredHealthy") > 0));
        if unhealthy_may_go {
            // A pod that is not ready is not counted as healthy: deleting it spends nothing,
            // provided it is still not ready when it goes.
            judged_at_version = true;
        } else {
            decrement_budget(server, pdbs, pdb.clone(), name, dry_run).await?;
        }
    }

    // 3. The deletion.
    if judged_at_version {
        let mut pod_options = options.clone();
        if !client_resource_version {
            pod_options["preconditions"]["resourceVersion"] =
                json!(pod.resource_version().to_string());
        }
        return match add_condition_and_delete(
            server,
            resource,
            &deletion,
            pod,
            &pod_options,
            dry_run,
        )
        .await
        {
            Ok(_) => Ok(evicted()),
            Err(e) if e.is_conflict() && !client_resource_version => {
                let pdb_name = budget.as_ref().map_or("", |p| p.name());
                Err(budget_being_processed(pdb_name))
            }
            Err(e) => Err(e),
        };
    }
    // The budget is spent (or there is none): the pod goes at whatever version it is now,
    // as Kubernetes' store deletes the latest object.
    on_error(EVICTIONS_RETRY, retriable, || async {
        let latest = current(server, resource, namespace, name).await?;
        add_condition_and_delete(server, resource, &deletion, latest, &options, dry_run).await
    })
    .await?;
    Ok(evicted())
}

/// `pod` with `DisruptionTarget=True` (reason `EvictionByEvictionAPI`) set as Kubernetes'
/// `UpdatePodCondition` sets a condition: appended if absent, replaced if present, its
/// `lastTransitionTime` kept when the status does not change. `None` when nothing changes.
fn with_disruption_target(pod: &Value, now: &str) -> Option<Value> {
    let mut next = pod.clone();
    let status = next
        .as_object_mut()?
        .entry("status")
        .or_insert_with(|| json!({}));
    let status = status.as_object_mut()?;
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let conditions = conditions.as_array_mut()?;
    let mut condition = json!({
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": EVICTION_BY_EVICTION_API,
        "message": EVICTION_BY_EVICTION_API_MESSAGE,
        "lastTransitionTime": now,
    });
    match conditions
        .iter_mut()
        .find(|c| c["type"] == DISRUPTION_TARGET)
    {
        None => conditions.push(condition),
        Some(old) => {
            if old["status"] == "True" {
                condition["lastTransitionTime"] = old["lastTransitionTime"].clone();
                if let Some(probe) = old.get("lastProbeTime") {
                    condition["lastProbeTime"] = probe.clone();
                }
            }
            if *old == condition {
                return None;
            }
            *old = condition;
        }
    }
    Some(next)
}

/// Kubernetes' `addConditionAndDeletePod`: unless this is a dry run, `DisruptionTarget=True`
/// is written on the latest pod through its status first — a conflict with the eviction's
/// own preconditions (UID, resourceVersion) is answered as one, any other conflict re-reads
/// and retries — and a resourceVersion precondition then moves to the version that write
/// produced (this request made that change). Then the pod is deleted as a DELETE would.
async fn add_condition_and_delete(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    deletion: &Request,
    mut pod: CachedObject,
    options: &Value,
    dry_run: bool,
) -> Result<(u16, Value), ApiError> {
    let strategy = strategy::of(resource);
    if dry_run {
        return delete_one(server, resource, strategy, deletion, pod, options).await;
    }
    let name = pod.name().to_string();
    let namespace = pod.namespace().map(str::to_string);
    let precondition = |key: &str| {
        options
            .pointer(&format!("/preconditions/{key}"))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (uid, resource_version) = (precondition("uid"), precondition("resourceVersion"));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let latest = pod.value();
        let latest_uid = latest.pointer("/metadata/uid").and_then(Value::as_str);
        if let Some(uid) = &uid
            && latest_uid != Some(uid.as_str())
        {
            return Err(ApiError::conflict(
                resource.group,
                resource.resource,
                &name,
                &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). \
                     The object might have been deleted and then recreated",
                    latest_uid.unwrap_or_default()
                ),
            ));
        }
        let latest_version = pod.resource_version().to_string();
        if let Some(version) = &resource_version
            && *version != latest_version
        {
            return Err(ApiError::conflict(
                resource.group,
                resource.resource,
                &name,
                &format!(
                    "the ResourceVersion in the precondition ({version}) does not match the \
                     ResourceVersion in record ({latest_version}). The object might have been \
                     modified"
                ),
            ));
        }
        let Some(next) = with_disruption_target(latest, &meta::now()) else {
            break;
        };
        let written = server
            .timed(
                "update",
                resource,
                storage::update(
                    &server.store,
                    resource,
                    namespace.as_deref(),
                    &name,
                    next,
                    pod.resource_version(),
                ),
            )
            .await;
        match written {
            Ok(value) => {
                pod = CachedObject::new(value, None);
                break;
            }
            // A compare-and-swap inside the store, retried at once on the object the store
            // holds now (Kubernetes' `GuaranteedUpdate` under `store.Update`), bounded.
            Err(WriteError::Conflict { current })
                if resource_version.is_none() && attempt < EVICTION_ATTEMPTS_MAX =>
            {
                pod = current;
            }
            Err(e) => return Err(e.into_api_error(resource, &name)),
        }
    }
    let mut options = options.clone();
    if resource_version.is_some() {
        options["preconditions"]["resourceVersion"] = json!(pod.resource_version().to_string());
    }
    delete_one(server, resource, strategy, deletion, pod, &options).await
}

/// Spends one disruption of `pdb` for `pod` (Kubernetes' `checkAndDecrement`), and on a
/// conflict reads the budget as it now is and judges again, on [`EVICTIONS_RETRY`]'s schedule
/// (Kubernetes' `RetryOnConflict` around `checkAndDecrement` and `UpdateStatus`). A dry run
/// judges without writing.
async fn decrement_budget(
    server: &ApiServer,
    pdbs: &'static ResourceInfo,
    pdb: CachedObject,
    pod: &str,
    dry_run: bool,
) -> Result<(), ApiError> {
    let pdb_name = &pdb.name().to_string();
    let namespace = pdb.namespace().map(str::to_string);
    let (namespace, listed) = (namespace.as_deref(), &pdb);
    let mut runs = 0;
    retry_on_conflict(EVICTIONS_RETRY, || {
        runs += 1;
        // The listed budget first; after a conflict, the budget as it now is.
        let refresh = runs > 1;
        async move {
            let pdb = if refresh {
                current(server, pdbs, namespace, pdb_name).await?
            } else {
                listed.clone()
            };
            let next = check_and_decrement(pdb.value(), pod, &meta::now())?;
            if dry_run {
                return Ok(());
            }
            server
                .timed(
                    "update",
                    pdbs,
                    storage::update(
                        &server.store,
                        pdbs,
                        namespace,
                        pdb_name,
                        next,
                        pdb.resource_version(),
                    ),
                )
                .await
                .map(|_| ())
                .map_err(|e| e.into_api_error(pdbs, pdb_name))
        }
    })
    .await
}

/// `POST serviceaccounts/<name>/token`: a signed, bound service-account token.
pub async fn token(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let namespace = req.info.namespace.clone().unwrap_or_default();
    let issuer = server.token_issuer.as_ref().ok_or_else(|| {
        ApiError::service_unavailable("this server has no service-account signing key")
    })?;
    let body = if req.content_type().starts_with(response::PROTOBUF) {
        let (_, value) = skerry_api::protobuf::decode(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding protobuf body: {e}")))?;
        value
    } else {
        skerry_api::kinds::decode_definition(
            "io.k8s.api.authentication.v1.TokenRequest",
            &req.body,
            FieldValidation::parse(req.param("fieldValidation"))?,
            ("authentication.k8s.io/v1", "TokenRequest"),
        )?
        .object
    };
    crate::noderestriction::admit(
        server,
        &crate::noderestriction::Request {
            resource,
            subresource: Some("token"),
            operation: crate::noderestriction::Operation::Create,
            name,
            namespace: Some(&namespace),
            object: Some(&body),
            old: None,
            user: &req.user,
        },
    )
    .await?;
    let account = current(server, resource, Some(&namespace), name).await?;
    let expiration = body
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
        .map(Duration::from_secs)
        .unwrap_or(EXPIRATION_DEFAULT);
    if expiration < EXPIRATION_MIN {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            vec![skerry_api::Cause::new(
                "FieldValueInvalid",
                "spec.expirationSeconds",
                format!(
                    "Invalid value: {}: may not specify a duration less than {} seconds",
                    expiration.as_secs(),
                    EXPIRATION_MIN.as_secs()
                ),
            )],
        ));
    }
    let audiences: Vec<String> = body
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let request = TokenRequest {
        namespace: namespace.clone(),
        name: name.to_string(),
        uid: account
            .value()
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        audiences: audiences.clone(),
        expiration,
        pod: None,
        node: None,
    };
    let now = SystemTime::now();
    let token = issuer
        .issue(&request, now)
        .map_err(|e| ApiError::internal(format!("signing a token: {e}")))?;
    let expires = jiff::Timestamp::try_from(now + expiration)
        .map(|t| {
            jiff::Timestamp::from_second(t.as_second())
                .unwrap_or(t)
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        })
        .unwrap_or_default();
    let answer = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": expiration.as_secs(), "boundObjectRef": null},
        "status": {"token": token, "expirationTimestamp": expires},
    });
    Ok(response::json(201, &answer, &[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2024-06-01T12:00:00Z";

    fn pdb(allowed: i64, observed: i64, generation: i64) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default", "generation": generation},
               "spec": {"selector": {"matchLabels": {"app": "web"}}},
               "status": {"disruptionsAllowed": allowed, "observedGeneration": observed,
                          "currentHealthy": 3, "desiredHealthy": 2}})
    }

    // Reference: Kubernetes 1.32 pkg/registry/core/pod/storage/eviction.go checkAndDecrement.
    #[test]
    fn a_disruption_is_spent_and_the_pod_recorded() {
        let next = check_and_decrement(&pdb(2, 1, 1), "web-0", NOW).expect("allowed");
        assert_eq!(next["status"]["disruptionsAllowed"], 1);
        assert_eq!(next["status"]["disruptedPods"]["web-0"], NOW);
        assert!(
            next["status"].get("conditions").is_none(),
            "the condition moves only when the last disruption goes"
        );
        let last = check_and_decrement(&next, "web-1", NOW).expect("one left");
        assert_eq!(last["status"]["disruptionsAllowed"], 0);
        assert_eq!(
            last["status"]["disruptedPods"],
            json!({"web-0": NOW, "web-1": NOW})
        );
        assert_eq!(
            last["status"]["conditions"],
            json!([{"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                    "message": "", "observedGeneration": 1, "lastTransitionTime": NOW}])
        );
    }

    #[test]
    fn a_spent_budget_is_a_429_with_its_numbers() {
        let e = check_and_decrement(&pdb(0, 1, 1), "web-0", NOW).expect_err("spent");
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(e.retry_after_seconds, None);
        assert_eq!(e.causes[0].reason, DISRUPTION_BUDGET_CAUSE);
        assert_eq!(
            e.causes[0].message,
            "The disruption budget web needs 2 healthy pods and has 3 currently"
        );
    }

    #[test]
    fn an_unprocessed_or_broken_budget_refuses() {
        let stale = check_and_decrement(&pdb(5, 1, 2), "web-0", NOW).expect_err("stale");
        assert_eq!(stale.code, 429);
        assert_eq!(
            stale.retry_after_seconds,
            Some(PDB_PROCESSING_RETRY_AFTER_SECONDS)
        );
        let negative = check_and_decrement(&pdb(-1, 1, 1), "web-0", NOW).expect_err("negative");
        assert_eq!(negative.code, 403);
        assert_eq!(
            negative.message,
            "poddisruptionbudget.policy \"web\" is forbidden: pdb disruptions allowed is negative"
        );
        let mut crowded = pdb(5, 1, 1);
        crowded["status"]["disruptedPods"] = Value::Object(
            (0..=DISRUPTED_PODS_MAX)
                .map(|i| (format!("p{i}"), json!(NOW)))
                .collect(),
        );
        let e = check_and_decrement(&crowded, "web-0", NOW).expect_err("crowded");
        assert_eq!(e.code, 403);
    }

    #[test]
    fn a_budget_covers_the_pods_its_selector_matches_in_its_namespace() {
        let budget = pdb(1, 1, 1);
        let pod = |ns: &str, labels: Value| json!({"metadata": {"name": "p", "namespace": ns, "labels": labels}});
        assert!(pdb_covers(
            &budget,
            &pod("default", json!({"app": "web", "x": "y"}))
        ));
        assert!(!pdb_covers(&budget, &pod("default", json!({"app": "db"}))));
        assert!(!pdb_covers(&budget, &pod("other", json!({"app": "web"}))));
        // No selector or a malformed one covers nothing.
        for selector in [
            Value::Null,
            json!({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}),
        ] {
            let mut b = budget.clone();
            b["spec"]["selector"] = selector;
            assert!(!pdb_covers(&b, &pod("default", json!({"app": "web"}))));
        }
        // An empty one covers every pod of its namespace (policy/v1), and no other.
        let mut everything = budget.clone();
        everything["spec"]["selector"] = json!({});
        assert!(pdb_covers(
            &everything,
            &pod("default", json!({"app": "db"}))
        ));
        assert!(pdb_covers(&everything, &pod("default", Value::Null)));
        assert!(!pdb_covers(
            &everything,
            &pod("other", json!({"app": "db"}))
        ));
    }

    #[test]
    fn the_disruption_target_condition_is_set_as_update_pod_condition_sets_it() {
        let pod = json!({"metadata": {"name": "p"}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "T0"}]}});
        let marked = with_disruption_target(&pod, "T1").expect("appended");
        let conditions = marked["status"]["conditions"].as_array().expect("list");
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(
            conditions[1],
            json!({"type": "DisruptionTarget", "status": "True",
                   "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
                   "lastTransitionTime": "T1"})
        );
        // Already there: nothing to write, and the transition time is the first one.
        assert_eq!(with_disruption_target(&marked, "T2"), None);
        // A False one (set back by the disruption controller) turns True, with a new time.
        let mut cleared = marked.clone();
        cleared["status"]["conditions"][1]["status"] = json!("False");
        let again = with_disruption_target(&cleared, "T3").expect("changed");
        assert_eq!(again["status"]["conditions"][1]["status"], "True");
        assert_eq!(again["status"]["conditions"][1]["lastTransitionTime"], "T3");
        // A pod with no status gets one.
        let bare = with_disruption_target(&json!({"metadata": {}}), "T4").expect("status");
        assert_eq!(bare["status"]["conditions"][0]["type"], "DisruptionTarget");
    }

    #[test]
    fn only_running_live_pods_are_judged_against_the_budget() {
        let pod = |phase: &str| json!({"metadata": {}, "status": {"phase": phase}});
        assert!(can_ignore_pdb(&pod("Pending")));
        assert!(can_ignore_pdb(&pod("Succeeded")));
        assert!(can_ignore_pdb(&pod("Failed")));
        assert!(!can_ignore_pdb(&pod("Running")));
        let mut deleting = pod("Running");
        deleting["metadata"]["deletionTimestamp"] = json!(NOW);
        assert!(can_ignore_pdb(&deleting));
        assert!(!should_enforce_resource_version(&deleting));
        assert!(should_enforce_resource_version(&pod("Pending")));
        assert!(!should_enforce_resource_version(&pod("Failed")));
    }
}
