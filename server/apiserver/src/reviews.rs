//! The reviews: `authorization.k8s.io/v1` SubjectAccessReview, LocalSubjectAccessReview and
//! SelfSubjectAccessReview (`kubectl auth can-i`), and `authentication.k8s.io/v1` TokenReview
//! and SelfSubjectReview (`kubectl auth whoami`, `pkg/registry/authentication/selfsubjectreview`:
//! the requester's own username, uid, groups and extra) — how components that delegate authentication and authorization to the apiserver (a
//! kubelet's API) ask it "who is this token?" and "may this user do that?".
//!
//! They are create-only and never stored: a POST is decoded (JSON, YAML or protobuf) like any
//! create, gets its `managedFields` as Kubernetes' create handler records them, is validated
//! (`skerry_api::validation`, Kubernetes' `pkg/apis/authorization/validation`), and comes back
//! 201 with its `status` filled in, as Kubernetes' `pkg/registry/authorization/*` and
//! `pkg/registry/authentication/tokenreview` REST storages answer. RBAC `create` on the
//! resource was checked before this module runs, like for every request.
//!
//! The answers come from the same code that answers requests: access reviews from
//! [`ApiServer::authorize_attributes`] (the `system:masters` privileged group, the Node
//! authorizer, RBAC: Kubernetes' authorizer chain), TokenReview from
//! [`crate::auth::Authenticator::review_token`]. The access reviews never set `denied` or
//! `evaluationError`: Node and RBAC only allow or have no opinion, and none of the three
//! returns evaluation errors, in Kubernetes either.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use http::Response;
use serde_json::{Map, Value, json};
use skerry_api::catalogue::ResourceInfo;
use skerry_api::{ApiError, meta};

use crate::auth::UserInfo;
use crate::auth::rbac::Attributes;
use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::strategy::Review;
use crate::verbs::{decode_body, field_manager_of, object_response};
use crate::watch_cache::object::CachedObject;

/// The message of a TokenReview without a token (`tokenreview.REST.Create`).
pub const TOKEN_REQUIRED: &str = "token is required for TokenReview in authentication";

/// `POST` of a review: decodes, validates and answers it. `review_kind` is what the resource's
/// strategy says it is ([`crate::strategy::Strategy::review`]).
pub async fn create(
    server: &Arc<ApiServer>,
    resource: &'static ResourceInfo,
    review_kind: Review,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    // Only to refuse a bad `dryRun`: nothing is stored either way.
    req.dry_run()?;
    let format = req.format()?;
    let (mut review, warnings) = decode_body(resource, req)?;
    if !review.is_object() {
        return Err(ApiError::bad_request("the body is not an object"));
    }
    if review_kind == Review::SelfSubject {
        return Ok(object_response(
            resource,
            201,
            &CachedObject::new(self_subject_review(resource, &req.user), None),
            format,
            &warnings,
        ));
    }
    ensure_namespace(resource, &mut review, req.info.namespace.as_deref())?;
    let now = meta::now();
    let manager = field_manager_of(resource, req, "create", &now)?;
    skerry_api::patch::record_update(&manager, None, &mut review);

    if let Review::Access { of_requester } = review_kind {
        let causes = skerry_api::validation::validate_create(resource, &review);
        if !causes.is_empty() {
            // Kubernetes builds this error from the decoded object's own (internal, hence
            // empty) kind: `authorizationapi.Kind(review.Kind)`, so the message reads
            // `.authorization.k8s.io "" is invalid: ...`.
            return Err(ApiError::invalid(resource.group, "", "", causes));
        }
        let user = if of_requester {
            req.user.clone()
        } else {
            subject(&review["spec"])
        };
        let attributes = attributes(user, &review["spec"]);
        let decision = server.authorize_attributes(&attributes);
        let mut status = Map::new();
        status.insert("allowed".into(), Value::Bool(decision.allowed));
        if !decision.reason.is_empty() {
            status.insert("reason".into(), Value::String(decision.reason));
        }
        review["status"] = Value::Object(status);
    } else {
        review_token(server, &mut review)?;
    }
    // A Go zero time, as Kubernetes prints the metadata of an object it did not store (a
    // TokenReview's own timestamp, which nothing checks, comes back as sent).
    if review["metadata"].get("creationTimestamp").is_none() {
        review["metadata"]["creationTimestamp"] = Value::Null;
    }
    Ok(object_response(
        resource,
        201,
        &CachedObject::new(review, None),
        format,
        &warnings,
    ))
}

/// A SelfSubjectReview's answer (`selfsubjectreview.REST.Create`): a new object, whatever the
/// request held, with only its creation time and the requester's user info (after
/// impersonation, as the request runs as that user).
fn self_subject_review(resource: &ResourceInfo, user: &UserInfo) -> Value {
    json!({
        "apiVersion": resource.api_version(),
        "kind": resource.kind,
        "metadata": {"creationTimestamp": meta::now()},
        "status": {"userInfo": user_info(user)},
    })
}

/// The create handler's `EnsureObjectNamespaceMatchesRequestNamespace`: a namespaced review
/// takes the path's namespace unless it names another (400), a cluster-scoped one loses any.
fn ensure_namespace(
    resource: &ResourceInfo,
    review: &mut Value,
    path_namespace: Option<&str>,
) -> Result<(), ApiError> {
    if !review["metadata"].is_object() {
        review["metadata"] = json!({});
    }
    let metadata = review["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object");
    let namespace = path_namespace.filter(|_| resource.namespaced).unwrap_or("");
    match metadata.get("namespace").and_then(Value::as_str) {
        Some(own) if !own.is_empty() && !namespace.is_empty() && own != namespace => {
            Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ))
        }
        _ if namespace.is_empty() => {
            metadata.remove("namespace");
            Ok(())
        }
        _ => {
            metadata.insert("namespace".into(), Value::String(namespace.to_string()));
            Ok(())
        }
    }
}

/// The user a SubjectAccessReview asks about, exactly as its spec gives it
/// (`authorizationutil.AuthorizationAttributesFrom`): no group is added, so a review for
/// `jane` without groups is not one for an authenticated `jane`.
fn subject(spec: &Value) -> UserInfo {
    let text = |k: &str| {
        spec.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let extra: BTreeMap<String, Vec<String>> = spec
        .get("extra")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
        .unwrap_or_default();
    UserInfo {
        name: text("user"),
        uid: text("uid"),
        groups: strings(spec.get("groups").unwrap_or(&Value::Null)),
        extra,
    }
}

/// The authorizer's attributes of a review's spec (`ResourceAttributesFrom`,
/// `NonResourceAttributesFrom`); validation made sure exactly one kind is there.
fn attributes(user: UserInfo, spec: &Value) -> Attributes {
    match spec.get("resourceAttributes").filter(|v| !v.is_null()) {
        Some(r) => {
            let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
            Attributes::resource(
                user,
                text("verb"),
                text("group"),
                text("resource"),
                text("namespace"),
                text("name"),
            )
            .with_subresource(text("subresource"))
            // 1.31's `fieldSelector.rawSelector` (AuthorizeWithSelectors); the structured
            // `requirements` form is not read.
            .with_field_selector(
                r.pointer("/fieldSelector/rawSelector")
                    .and_then(Value::as_str),
            )
        }
        None => {
            let n = spec.get("nonResourceAttributes").unwrap_or(&Value::Null);
            let text = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or("");
            Attributes::non_resource(user, text("verb"), text("path"))
        }
    }
}

/// Fills a TokenReview's status as `tokenreview.REST.Create` does: `authenticated` always
/// (omitted when false, Go's `omitempty`), `user` and `audiences` when the token
/// authenticated, `error` when it did not; whatever else the client put in `status` stays.
fn review_token(server: &ApiServer, review: &mut Value) -> Result<(), ApiError> {
    let spec = &review["spec"];
    let token = spec
        .get("token")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request(TOKEN_REQUIRED));
    }
    let audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let outcome = server
        .authenticator
        .review_token(&token, &audiences, SystemTime::now());
    let mut status = match review.get("status") {
        Some(Value::Object(status)) => status.clone(),
        _ => Map::new(),
    };
    if outcome.user.is_some() {
        status.insert("authenticated".into(), Value::Bool(true));
    } else {
        status.remove("authenticated");
    }
    if let Some(error) = outcome.error {
        status.insert("error".into(), Value::String(error));
    }
    if let Some(user) = &outcome.user {
        status.insert("user".into(), user_info(user));
        if outcome.audiences.is_empty() {
            status.remove("audiences");
        } else {
            status.insert("audiences".into(), json!(outcome.audiences));
        }
    }
    // `user` is a struct in Go: printed even when empty.
    status.entry("user").or_insert_with(|| json!({}));
    review["status"] = Value::Object(status);
    Ok(())
}

/// `authentication/v1.UserInfo` of a user, every field `omitempty`.
fn user_info(user: &UserInfo) -> Value {
    let mut info = Map::new();
    if !user.name.is_empty() {
        info.insert("username".into(), json!(user.name));
    }
    if !user.uid.is_empty() {
        info.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        info.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        info.insert("extra".into(), json!(user.extra));
    }
    Value::Object(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_taken_as_given() {
        let spec = json!({
            "user": "jane",
            "uid": "42",
            "groups": ["ops"],
            "extra": {"scopes": ["a", "b"]},
            "resourceAttributes": {"verb": "get", "resource": "pods", "subresource": "log", "namespace": "n", "name": "p"},
        });
        let user = subject(&spec);
        assert_eq!(user.name, "jane");
        assert_eq!(user.uid, "42");
        assert_eq!(user.groups, ["ops"], "no system:authenticated is added");
        assert_eq!(user.extra["scopes"], ["a", "b"]);
        let a = attributes(user, &spec);
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str(),
                a.name.as_str()
            ),
            ("get", "pods", "log", "n", "p")
        );
        let a = attributes(
            UserInfo::default(),
            &json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}),
        );
        assert_eq!(a.non_resource_path.as_deref(), Some("/healthz"));
    }

    #[test]
    fn namespaces_follow_the_path() {
        let lsar = skerry_api::catalogue::lookup(
            "authorization.k8s.io",
            "v1",
            "localsubjectaccessreviews",
        )
        .expect("served");
        let sar =
            skerry_api::catalogue::lookup("authorization.k8s.io", "v1", "subjectaccessreviews")
                .expect("served");
        let mut review = json!({"spec": {}});
        ensure_namespace(lsar, &mut review, Some("a")).expect("defaulted");
        assert_eq!(review["metadata"]["namespace"], "a");
        let mut other = json!({"metadata": {"namespace": "b"}});
        let err = ensure_namespace(lsar, &mut other, Some("a")).expect_err("mismatch");
        assert_eq!(err.code, 400);
        let mut cluster = json!({"metadata": {"namespace": "b"}});
        ensure_namespace(sar, &mut cluster, None).expect("cleared");
        assert_eq!(cluster["metadata"], json!({}));
    }

    #[test]
    fn user_info_omits_empty_fields() {
        assert_eq!(user_info(&UserInfo::default()), json!({}));
        let user = UserInfo::authenticated("jane", "", vec![]);
        assert_eq!(
            user_info(&user),
            json!({"username": "jane", "groups": ["system:authenticated"]})
        );
    }
}
