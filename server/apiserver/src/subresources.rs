//! Subresources with their own shapes: `scale` (autoscaling/v1 Scale over a workload's
//! replicas), `pods/binding` (the scheduler's write), `serviceaccounts/token`
//! (`kubectl create token`) and SelfSubjectAccessReview (`kubectl auth can-i`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Response;
use serde_json::{Value, json};
use skerry_api::strict::FieldValidation;
use skerry_api::{ApiError, ResourceInfo, meta};

use crate::auth::rbac::{self, Attributes};
use crate::auth::serviceaccount::{EXPIRATION_DEFAULT, EXPIRATION_MIN, TokenRequest};
use crate::handler::{ApiServer, Request};
use crate::response::{self, Body};
use crate::storage::{self, WriteError};
use crate::verbs::{current, name_of, write_update};
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
        match write_update(server, resource, req, &old, new).await {
            Ok(stored) => {
                return Ok(response::json(
                    200,
                    &scale_of(&CachedObject::new(stored, None)),
                    &[],
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

/// `POST selfsubjectaccessreviews`: may the requesting user do this?
pub fn self_subject_access_review(
    server: &Arc<ApiServer>,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let resource =
        skerry_api::catalogue::lookup("authorization.k8s.io", "v1", "selfsubjectaccessreviews")
            .expect("selfsubjectaccessreviews are served");
    let review = if req.content_type().starts_with(response::PROTOBUF) {
        let (_, value) = skerry_api::protobuf::decode(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding protobuf body: {e}")))?;
        skerry_api::kinds::decode_value(resource, value, FieldValidation::Strict)?.object
    } else {
        skerry_api::kinds::decode_body(
            resource,
            &req.body,
            FieldValidation::parse(req.param("fieldValidation"))?,
        )?
        .object
    };
    let user = req.user.clone();
    let attributes = if let Some(r) = review.pointer("/spec/resourceAttributes") {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let mut a = Attributes::resource(
            user,
            &s("verb"),
            &s("group"),
            &s("resource"),
            &s("namespace"),
            &s("name"),
        );
        let sub = s("subresource");
        if !sub.is_empty() {
            a = a.with_subresource(&sub);
        }
        a
    } else if let Some(n) = review.pointer("/spec/nonResourceAttributes") {
        let s = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Attributes::non_resource(user, &s("verb"), &s("path"))
    } else {
        return Err(ApiError::invalid(
            "authorization.k8s.io",
            "SelfSubjectAccessReview",
            "",
            vec![skerry_api::Cause::required("spec.resourceAttributes")],
        ));
    };
    let decision = rbac::authorize(&attributes, server.rbac.as_ref());
    let mut answer = review;
    answer["status"] = json!({"allowed": decision.allowed, "reason": decision.reason});
    answer["metadata"]["creationTimestamp"] = Value::Null;
    Ok(response::json(201, &answer, &[]))
}
