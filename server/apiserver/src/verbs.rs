//! The verbs on resources: get, list, watch, create, update, patch, delete and
//! deletecollection, and the subresources (status, scale, binding, token) — Kubernetes'
//! generic registry, over the store ([`crate::storage`]) and the watch caches. The reviews,
//! created but never stored, are [`crate::reviews`].
//!
//! A write is, in Kubernetes' order (`handlers/create.go`/`update.go`, then the registry's
//! `BeforeCreate`/`BeforeUpdate`): decode strictly → fill server-owned metadata → default →
//! record `managedFields` → admission (NamespaceLifecycle, then the plugins; mutating
//! admission such as Priority's copy of `spec.priority` runs *before* validation, so that
//! validation judges the object that will be stored) → validate → one store transaction
//! with the optimistic-concurrency compare (`mod_revision == expected`). See
//! [`admit_then_validate_create`] and [`write_update`].
//! Patches retry that loop on a conflict, as Kubernetes' patcher does, since the client did
//! not ask for a precondition — unless the patch itself sets `metadata.resourceVersion`,
//! which makes it conditional like an update (see `patched_preconditions`).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use serde_json::{Value, json};
use skerry_api::catalogue::{self, ResourceInfo};
use skerry_api::selector::{FieldSelector, LabelSelector};
use skerry_api::strict::FieldValidation;
use skerry_api::{ApiError, meta};

use crate::handler::{ApiServer, Request};
use crate::response::{self, Body, Format};
use crate::storage::{self, Filter, ListOptions, ResourceVersionMatch, WriteError};
use crate::watch_cache::object::CachedObject;

/// Times a patch is retried when the object changed under it (Kubernetes'
/// `maxRetryWhenPatchConflicts = 5`); past that the client gets the 409.
const PATCH_CONFLICT_RETRIES_MAX: usize = 5;

/// The finalizer `propagationPolicy=Orphan` sets: the garbage collector orphans dependents
/// before the object goes.
pub const FINALIZER_ORPHAN: &str = "orphan";
/// The finalizer `propagationPolicy=Foreground` sets: dependents go first.
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

/// Serves one resource request.
pub async fn serve(server: &Arc<ApiServer>, req: Request) -> Result<Response<Body>, ApiError> {
    let info = &req.info;
    let resource = catalogue::lookup(&info.group, &info.version, &info.resource)
        .ok_or_else(|| ApiError::no_route(&info.path))?;
    if let Some(sub) = &info.subresource
        && resource.subresource(sub).is_none()
    {
        return Err(ApiError::no_route(&info.path));
    }
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
    let verb_allowed = match &info.subresource {
        Some(sub) => resource
            .subresource(sub)
            .is_some_and(|s| s.verbs.contains(&info.verb.as_str())),
        None => resource.has_verb(&info.verb),
    };
    if !verb_allowed {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            info.path
        )));
    }
    match (info.verb.as_str(), info.subresource.as_deref()) {
        ("get", None | Some("status")) => get(server, resource, &req).await,
        ("get", Some("scale")) => crate::subresources::get_scale(server, resource, &req).await,
        ("list", None) => list(server, resource, &req).await,
        ("watch", None) => crate::watch::serve(server, resource, &req).await,
        ("create", None) if crate::reviews::is_review(resource) => {
            crate::reviews::create(server, resource, &req).await
        }
        ("create", None) => create(server, resource, &req).await,
        ("create", Some("binding")) => crate::subresources::bind(server, resource, &req).await,
        ("create", Some("token")) => crate::subresources::token(server, resource, &req).await,
        ("create", Some("eviction")) => crate::subresources::evict(server, resource, &req).await,
        ("update", None | Some("status") | Some("finalize")) => {
            update(server, resource, &req).await
        }
        ("update", Some("scale")) => {
            crate::subresources::update_scale(server, resource, &req).await
        }
        ("patch", None | Some("status")) => patch(server, resource, &req).await,
        ("patch", Some("scale")) => crate::subresources::patch_scale(server, resource, &req).await,
        ("delete", None) => delete(server, resource, &req).await,
        ("deletecollection", None) => delete_collection(server, resource, &req).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({})",
            info.path
        ))),
    }
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

async fn get(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let format = req.format()?;
    let namespace = req.info.namespace.as_deref();
    let object = match req.param("resourceVersion") {
        Some("0") => match server.caches.get(resource.resource) {
            Some(cache) => cache
                .get(namespace, name)
                .ok_or_else(|| ApiError::not_found(resource.group, resource.resource, name))?,
            None => current(server, resource, namespace, name).await?,
        },
        _ => current(server, resource, namespace, name).await?,
    };
    Ok(object_response(resource, 200, &object, format, &[]))
}

/// One object in the asked format.
pub fn object_response(
    resource: &ResourceInfo,
    code: u16,
    object: &CachedObject,
    format: Format,
    warnings: &[String],
) -> Response<Body> {
    match format {
        Format::Table(include) => {
            let rv = object.resource_version().to_string();
            let table = crate::table::table(
                resource,
                std::slice::from_ref(object),
                include,
                &rv,
                None,
                None,
            );
            response::json(code, &table, warnings)
        }
        Format::PartialObjectMetadata => response::json(
            code,
            &crate::table::partial_metadata(object.value()),
            warnings,
        ),
        Format::Protobuf => match skerry_api::protobuf::encode(
            &resource.api_version(),
            resource.kind,
            object.value(),
        ) {
            Ok(bytes) => response::bytes(code, response::PROTOBUF, bytes, warnings),
            Err(e) => response::error(&ApiError::internal(format!("encoding protobuf: {e}"))),
        },
        Format::Yaml => response::yaml(code, object.value(), warnings),
        _ => response::bytes(code, response::JSON, object.json(), warnings),
    }
}

/// The LIST options of a request.
pub fn list_options(req: &Request) -> Result<ListOptions, ApiError> {
    let resource_version =
        match req.param("resourceVersion") {
            None | Some("") => None,
            Some(rv) => Some(rv.parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                ApiError::bad_request(format!("invalid resource version: {rv:?}"))
            })?),
        };
    let resource_version_match = match req.param("resourceVersionMatch") {
        None | Some("") => None,
        Some("NotOlderThan") => Some(ResourceVersionMatch::NotOlderThan),
        Some("Exact") => Some(ResourceVersionMatch::Exact),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
    };
    if resource_version_match.is_some() && resource_version.is_none() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    let limit = match req.param("limit") {
        None | Some("") => None,
        Some(l) => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
        ),
    };
    let continue_token = req
        .param("continue")
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok(ListOptions {
        resource_version,
        resource_version_match,
        limit,
        continue_token,
        namespace: req.info.namespace.clone(),
    })
}

/// The filter of a request's label and field selectors, or `None` when it selects all.
pub fn filter_of(resource: &ResourceInfo, req: &Request) -> Result<Option<Filter>, ApiError> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""), resource.resource)?;
    if labels.is_empty() && fields.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(move |o: &CachedObject| {
        labels.matches_object(o.value()) && fields.matches(o.value())
    })))
}

async fn list(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let opts = list_options(req)?;
    let filter = filter_of(resource, req)?;
    let format = req.format()?;
    let cache = server.caches.get(resource.resource);
    // The cache decides where a LIST is served (`watch_cache::plan`, Kubernetes 1.32's
    // rules): from memory for `resourceVersion=0`, NotOlderThan, an Exact version inside its
    // window, and consistent reads (the store's current revision, read linearizably, then
    // waited for in the cache); from the store for continue tokens and limited reads at a
    // version.
    let list = match cache {
        Some(cache) => {
            if opts.continue_token.is_none() && opts.page_limit().is_none() {
                wait_for_cache(server, cache, opts.resource_version).await?;
            }
            cache.list(&opts, filter).await?
        }
        None => {
            server
                .timed(
                    "list",
                    resource,
                    storage::list(&server.store, resource, &opts, filter.as_ref()),
                )
                .await?
        }
    };
    Ok(list_response(resource, &list, format))
}

/// Waits (at most the cache's 3 seconds) until `cache` has reached `resource_version`,
/// recording the wait as `apiserver_watch_cache_read_wait_seconds`. A fresh cache returns at
/// once; the cache's own list or watch then finds it fresh too.
pub async fn wait_for_cache(
    server: &ApiServer,
    cache: &crate::watch_cache::WatchCache,
    resource_version: Option<i64>,
) -> Result<(), ApiError> {
    let Some(rv) = resource_version.filter(|rv| *rv > 0) else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let result = cache.wait_fresh(rv).await;
    server
        .metrics
        .observe_cache_wait(cache.resource().resource, started.elapsed());
    result
}

/// A list in the asked format.
pub fn list_response(
    resource: &ResourceInfo,
    list: &storage::CachedList,
    format: Format,
) -> Response<Body> {
    let rv = list.resource_version.to_string();
    match format {
        Format::Table(include) => {
            let table = crate::table::table(
                resource,
                &list.items,
                include,
                &rv,
                list.continue_token.as_deref(),
                list.remaining_item_count,
            );
            response::json(200, &table, &[])
        }
        Format::Protobuf => {
            let mut items = Vec::with_capacity(list.items.len());
            for o in &list.items {
                items.push(o.value().clone());
            }
            let value = list_value(resource, items, &rv, list);
            match skerry_api::protobuf::encode(&resource.api_version(), resource.list_kind, &value)
            {
                Ok(bytes) => response::bytes(200, response::PROTOBUF, bytes, &[]),
                Err(e) => response::error(&ApiError::internal(format!("encoding protobuf: {e}"))),
            }
        }
        Format::Yaml => {
            let items = list.items.iter().map(|o| o.value().clone()).collect();
            response::yaml(200, &list_value(resource, items, &rv, list), &[])
        }
        Format::PartialObjectMetadata => {
            let items = list
                .items
                .iter()
                .map(|o| crate::table::partial_metadata(o.value()))
                .collect();
            let mut value = list_value(resource, items, &rv, list);
            value["kind"] = json!("PartialObjectMetadataList");
            value["apiVersion"] = json!("meta.k8s.io/v1");
            response::json(200, &value, &[])
        }
        _ => {
            // The items are spliced in as their memoized JSON: a LIST from the cache
            // serializes no object that a watcher already caused to be serialized.
            let mut head = list_value(resource, Vec::new(), &rv, list);
            head.as_object_mut().map(|o| o.remove("items"));
            let mut out = serde_json::to_vec(&head).unwrap_or_default();
            out.pop(); // the closing brace
            out.extend_from_slice(b",\"items\":[");
            for (i, o) in list.items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&o.json());
            }
            out.extend_from_slice(b"]}");
            response::bytes(200, response::JSON, Bytes::from(out), &[])
        }
    }
}

fn list_value(
    resource: &ResourceInfo,
    items: Vec<Value>,
    rv: &str,
    list: &storage::CachedList,
) -> Value {
    let mut metadata = json!({"resourceVersion": rv});
    if let Some(c) = &list.continue_token {
        metadata["continue"] = json!(c);
    }
    if let Some(n) = list.remaining_item_count {
        metadata["remainingItemCount"] = json!(n);
    }
    json!({
        "kind": resource.list_kind,
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    })
}

/// Decodes a create/update body (JSON or protobuf) strictly into the resource's type.
pub fn decode_body(
    resource: &ResourceInfo,
    req: &Request,
) -> Result<(Value, Vec<String>), ApiError> {
    let validation = FieldValidation::parse(req.param("fieldValidation"))?;
    let content_type = req.content_type();
    let media = content_type.split(';').next().unwrap_or("").trim();
    let decoded = match media {
        "application/json" | "" => skerry_api::kinds::decode_body(resource, &req.body, validation)?,
        response::PROTOBUF => {
            let (type_meta, value) = skerry_api::protobuf::decode(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding protobuf body: {e}")))?;
            if type_meta.kind != resource.kind || type_meta.api_version != resource.api_version() {
                return Err(ApiError::bad_request(format!(
                    "the body is a {} {}, expected {} {}",
                    type_meta.api_version,
                    type_meta.kind,
                    resource.api_version(),
                    resource.kind
                )));
            }
            skerry_api::kinds::decode_value(resource, value, validation)?
        }
        "application/yaml" => {
            let value = crate::yaml::to_json(&req.body)?;
            let bytes = serde_json::to_vec(&value).unwrap_or_default();
            skerry_api::kinds::decode_body(resource, &bytes, validation)?
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    Ok((decoded.object, decoded.warnings))
}

/// Refuses writes into a namespace that does not exist or is being deleted (Kubernetes'
/// NamespaceLifecycle admission).
async fn admit_namespace(
    server: &ApiServer,
    resource: &ResourceInfo,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    let Some(ns) = namespace.filter(|_| resource.namespaced) else {
        return Ok(());
    };
    let namespaces = catalogue::lookup("", "v1", "namespaces").expect("namespaces are served");
    let found = match server
        .caches
        .get("namespaces")
        .and_then(|c| c.get(None, ns))
    {
        Some(o) => Some(o),
        None => {
            server
                .timed(
                    "get",
                    namespaces,
                    storage::get(&server.store, namespaces, None, ns),
                )
                .await?
        }
    };
    match found {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(o)
            if o.value()
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null()) =>
        {
            let message = format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            );
            // Kubernetes' NamespaceLifecycle admission adds this cause; controllers (and
            // client-go's `HasStatusCause`) recognise a terminating namespace by it.
            let mut err = ApiError::forbidden(message.clone());
            err.causes.push(skerry_api::Cause::new(
                "NamespaceTerminating",
                "metadata.namespace",
                message,
            ));
            Err(err)
        }
        Some(_) => Ok(()),
    }
}

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

async fn create(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let (mut object, warnings) = decode_body(resource, req)?;
    let namespace = req.info.namespace.as_deref();
    prepare_new(resource, &mut object, namespace)?;
    let name = meta::name(&object).to_string();
    {
        let now = meta::now();
        let manager = field_manager_of(resource, req, "create", &now)?;
        skerry_api::patch::record_update(&manager, None, &mut object);
    }
    admit_then_validate_create(server, resource, req, &name, &mut object).await?;
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
    let stored = if resource.resource == "services" && crate::ipalloc::wants_cluster_ip(&object) {
        create_service(server, resource, namespace, &name, object).await?
    } else if resource.resource == "events" {
        // Events expire: they ride a shared store lease (see `crate::leases`).
        let lease = server.event_leases.lease(&server.store).await?;
        server
            .timed(
                "create",
                resource,
                storage::create_leased(&server.store, resource, namespace, &name, object, lease),
            )
            .await
            .map_err(|e| e.into_api_error(resource, &name))?
    } else {
        server
            .timed(
                "create",
                resource,
                storage::create(&server.store, resource, namespace, &name, object),
            )
            .await
            .map_err(|e| e.into_api_error(resource, &name))?
    };
    Ok(object_response(
        resource,
        201,
        &CachedObject::new(stored, None),
        format,
        &warnings,
    ))
}

/// Admission and validation of a new object, in Kubernetes' order: NamespaceLifecycle (the
/// first admission plugin), the other plugins — mutating ones such as Priority, which turns
/// `spec.priorityClassName` into `spec.priority`, run before validation (`handlers/
/// create.go` calls `Admit` before the registry's `BeforeCreate` validates) — then
/// validation. A pod that is both invalid and names an unknown class is refused by
/// admission (403), as Kubernetes refuses it.
///
/// The plugins' validating halves (Priority's single-default check for PriorityClasses,
/// OwnerReferencesPermissionEnforcement) run in the same call for now: `admission` does
/// not yet split its plugins into a mutating and a validating phase.
async fn admit_then_validate_create(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
    name: &str,
    object: &mut Value,
) -> Result<(), ApiError> {
    admit_namespace(server, resource, req.info.namespace.as_deref()).await?;
    crate::admission::admit_create(server, resource, object, &req.user).await?;
    invalid(
        resource,
        name,
        skerry_api::validation::validate_create(resource, object),
    )
}

/// What every create does before validation: server-owned metadata, defaults, and the
/// status a new object starts with (a pod's `Pending` with its QoS class, the pod strategy's
/// PrepareForCreate).
fn prepare_new(
    resource: &ResourceInfo,
    object: &mut Value,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    meta::prepare_create(resource, object, namespace)?;
    skerry_api::defaults::apply_defaults(resource, object);
    if resource.resource == "pods" {
        object["status"] = skerry_api::defaults::initial_pod_status(object);
    }
    Ok(())
}

/// Attempts to allocate a ClusterIP when the one picked was taken by a concurrent create
/// between reading the claims and writing: each retry re-reads them, so two attempts almost
/// always suffice; the bound stops a pathological race from spinning.
const CLUSTER_IP_ATTEMPTS_MAX: usize = 8;

/// Creates a Service with its ClusterIP: the address it asks for, or one the allocator picks,
/// claimed in the same transaction as the Service (see [`crate::ipalloc`]).
async fn create_service(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    mut object: Value,
) -> Result<Value, ApiError> {
    use crate::ipalloc;
    let requested = ipalloc::requested(&server.service_cidr, &object, name)?;
    for _ in 0..CLUSTER_IP_ATTEMPTS_MAX {
        let ip = match requested {
            Some(ip) => ip,
            None => {
                let used = used_cluster_ips(server)?;
                let offset = ipalloc::pick(&server.service_cidr, &used, &mut rand::rng())
                    .ok_or_else(|| {
                        ApiError::internal(format!(
                            "failed to allocate a serviceIP: range is full ({})",
                            server.service_cidr
                        ))
                    })?;
                server.service_cidr.address(offset)
            }
        };
        object["spec"]["clusterIP"] = json!(ip.to_string());
        object["spec"]["clusterIPs"] = json!([ip.to_string()]);
        let claim = (
            ipalloc::claim_key(ip),
            ipalloc::claim_value(ip, namespace.unwrap_or(""), name),
        );
        let result = server
            .timed(
                "create",
                resource,
                storage::create_claiming(
                    &server.store,
                    resource,
                    namespace,
                    name,
                    object.clone(),
                    std::slice::from_ref(&claim),
                ),
            )
            .await;
        match result {
            Ok(stored) => return Ok(stored),
            Err(WriteError::ClaimTaken { .. }) if requested.is_some() => {
                return Err(ipalloc::already_allocated(ip, name));
            }
            Err(WriteError::ClaimTaken { .. }) => continue,
            Err(e) => return Err(e.into_api_error(resource, name)),
        }
    }
    Err(ApiError::internal(format!(
        "failed to allocate a serviceIP after {CLUSTER_IP_ATTEMPTS_MAX} attempts"
    )))
}

/// The offsets of every claimed ClusterIP.
fn used_cluster_ips(server: &ApiServer) -> Result<std::collections::BTreeSet<u32>, ApiError> {
    let prefix = crate::ipalloc::CLAIM_PREFIX;
    let resp = server
        .store
        .range(&skerry_store::pb::etcdserverpb::RangeRequest {
            key: Bytes::from(prefix),
            range_end: Bytes::from(storage::prefix_end(prefix)),
            keys_only: true,
            serializable: true,
            ..Default::default()
        })
        .map_err(storage::store_error)?;
    Ok(resp
        .kvs
        .iter()
        .filter_map(|kv| std::str::from_utf8(&kv.key).ok())
        .filter_map(|k| k.strip_prefix(prefix))
        .filter_map(|ip| ip.parse().ok())
        .filter_map(|ip| server.service_cidr.offset(ip))
        .collect())
}

/// The claim keys an object holds, released when it is deleted (a Service's ClusterIP).
pub(crate) fn held_claims(resource: &ResourceInfo, object: &Value) -> Vec<String> {
    if resource.resource == "services" {
        crate::ipalloc::held_claims(object)
    } else {
        Vec::new()
    }
}

/// The `fieldManager` of a write, or the default Kubernetes derives from the user agent
/// (`kubectl-create`, ...); validated as Kubernetes does (at most 128 characters).
fn field_manager<'a>(req: &'a Request, fallback: &'a str) -> Result<&'a str, ApiError> {
    match req.param("fieldManager") {
        Some(m) if m.chars().count() > FIELD_MANAGER_LEN_MAX => Err(ApiError::bad_request(
            format!("fieldManager: Too long: may not be more than {FIELD_MANAGER_LEN_MAX} bytes"),
        )),
        Some(m) if !m.is_empty() => Ok(m),
        _ => Ok(req
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or(fallback)),
    }
}

/// The field manager of a write, for `managedFields`.
pub(crate) fn field_manager_of<'a>(
    resource: &'a ResourceInfo,
    req: &'a Request,
    fallback: &'a str,
    now: &'a str,
) -> Result<skerry_api::patch::FieldManager<'a>, ApiError> {
    Ok(skerry_api::patch::FieldManager {
        schema: &skerry_api::patch::BuiltinSchema,
        definition: resource.definition,
        manager: field_manager(req, fallback)?,
        subresource: req.info.subresource.as_deref().unwrap_or(""),
        now,
    })
}

/// Kubernetes' limit on `fieldManager` (`validation.FieldManagerMaxLength`).
const FIELD_MANAGER_LEN_MAX: usize = 128;

/// Stores `new` over `old` (the object read at `old`'s resourceVersion), finishing a deletion
/// when the last finalizer of a deleted object goes. Returns the stored object, or the
/// conflict for the caller to retry.
///
/// Order, as Kubernetes': server-owned metadata and defaults → `managedFields` → admission
/// → validation → the compare-and-swap write.
pub(crate) async fn write_update(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
    old: &CachedObject,
    new: Value,
) -> Result<Value, WriteError> {
    write_update_as(server, resource, req, old, new, Ownership::Update).await
}

/// How a write's field ownership is recorded in `managedFields`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Every write but an apply: the request's manager takes the fields it changed in an
    /// `Update` entry.
    Update,
    /// A server-side apply, whose `Apply` entry the apply itself already recorded: recording
    /// it again as an update would move the applier's fields to an `Update` entry of the same
    /// manager, and its next apply would then conflict with itself.
    Applied,
}

/// [`write_update`], with the ownership recorded as `ownership` says.
async fn write_update_as(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
    old: &CachedObject,
    mut new: Value,
    ownership: Ownership,
) -> Result<Value, WriteError> {
    let namespace = req.info.namespace.as_deref();
    let name = old.name().to_string();
    meta::prepare_update(
        resource,
        old.value(),
        &mut new,
        req.info.subresource.as_deref(),
    );
    if resource.resource == "services" {
        // An update that leaves the allocated addresses out keeps them (Kubernetes'
        // PatchAllocatedValues): kubectl apply never sends what the server allocated.
        for field in ["clusterIP", "clusterIPs"] {
            let missing = new["spec"]
                .get(field)
                .is_none_or(|v| v.is_null() || v == "");
            if missing && let Some(v) = old.value()["spec"].get(field) {
                new["spec"][field] = v.clone();
            }
        }
    }
    if req.info.subresource.is_none() {
        skerry_api::defaults::apply_defaults(resource, &mut new);
    }
    if ownership == Ownership::Update {
        let now = meta::now();
        let manager = field_manager_of(resource, req, "update", &now)?;
        skerry_api::patch::record_update(&manager, Some(old.value()), &mut new);
    }
    // Kubernetes' order (`handlers/update.go`): the field manager and mutating admission are
    // transformers of the new object, applied before the registry's `BeforeUpdate`
    // validates it — so Priority's copy-back of `spec.priority` on a pod replacement that
    // left it out happens before pod-update validation, which would otherwise see the
    // priority "changed" to nothing.
    crate::admission::admit_update(server, resource, old.value(), &mut new, &req.user).await?;
    invalid(
        resource,
        &name,
        skerry_api::validation::validate_update(resource, old.value(), &new),
    )?;
    let deleting = new
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let finalizers_left = new
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
        // A terminating namespace also waits for its `spec.finalizers` (the namespace
        // controller's `kubernetes`, removed through `/finalize` once the content is gone):
        // Kubernetes' `ShouldDeleteNamespaceDuringUpdate`. Without this, any status write to
        // a terminating namespace would remove it with its content still in place.
        || (resource.resource == "namespaces"
            && new
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty()));
    if req.dry_run()? {
        return Ok(new);
    }
    if deleting && !finalizers_left {
        return server
            .timed(
                "delete",
                resource,
                storage::delete_releasing(
                    &server.store,
                    resource,
                    namespace,
                    &name,
                    Some(old.resource_version()),
                    &held_claims(resource, old.value()),
                ),
            )
            .await;
    }
    // An updated Event gets a fresh TTL, as in Kubernetes (its count went up: it happened
    // again).
    let lease = if resource.resource == "events" {
        server.event_leases.lease(&server.store).await?
    } else {
        0
    };
    server
        .timed(
            "update",
            resource,
            storage::update_leased(
                &server.store,
                resource,
                namespace,
                &name,
                new,
                old.resource_version(),
                lease,
            ),
        )
        .await
}

async fn update(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    let namespace = req.info.namespace.as_deref();
    let (new, warnings) = decode_body(resource, req)?;
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
    let old = current(server, resource, namespace, name).await?;
    update_uid_precondition(resource, name, &old, &new)?;
    // An update that names a resourceVersion is conditional on it; one that does not is
    // unconditional (Kubernetes' AllowUnconditionalUpdate, true for every served kind).
    if let Some(rv) = new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        && !rv.is_empty()
        && rv != old.resource_version().to_string()
    {
        return Err(ApiError::conflict(
            resource.group,
            resource.resource,
            name,
            storage::CONFLICT_MESSAGE,
        ));
    }
    let format = req.format()?;
    let stored = write_update(server, resource, req, &old, new)
        .await
        .map_err(|e| e.into_api_error(resource, name))?;
    Ok(object_response(
        resource,
        200,
        &CachedObject::new(stored, None),
        format,
        &warnings,
    ))
}

async fn patch(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
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
        let result = match &old {
            Some(old) => {
                let ownership = if is_apply {
                    Ownership::Applied
                } else {
                    Ownership::Update
                };
                write_update_as(server, resource, req, old, decoded.object, ownership).await
            }
            None => {
                // Server-side apply creates what does not exist.
                // Its `managedFields` are the apply's own, recorded above.
                let mut object = decoded.object;
                prepare_new(resource, &mut object, namespace)?;
                admit_then_validate_create(server, resource, req, name, &mut object).await?;
                if req.dry_run()? {
                    Ok(object)
                } else if resource.resource == "services"
                    && crate::ipalloc::wants_cluster_ip(&object)
                {
                    create_service(server, resource, namespace, name, object)
                        .await
                        .map_err(WriteError::Api)
                } else {
                    server
                        .timed(
                            "create",
                            resource,
                            storage::create(&server.store, resource, namespace, name, object),
                        )
                        .await
                }
            }
        };
        match result {
            Ok(stored) => {
                let code = if old.is_none() { 201 } else { 200 };
                return Ok(object_response(
                    resource,
                    code,
                    &CachedObject::new(stored, None),
                    format,
                    &decoded.warnings,
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

/// What a deletion asks to happen to the object's dependents: `propagationPolicy`, or the
/// deprecated `orphanDependents` (`true` orphans; `false` is background deletion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Propagation {
    Orphan,
    Foreground,
    Background,
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
/// of the two, should both be there), and with neither the default is background: Kubernetes
/// orphans by default for a few old API versions only, and skerry serves none of them.
/// `current` itself (same order) when the set does not change.
fn deletion_finalizers(propagation: Option<Propagation>, current: &[String]) -> Vec<String> {
    let is_gc = |f: &String| f == FINALIZER_ORPHAN || f == FINALIZER_FOREGROUND;
    let (orphan, foreground) = match propagation {
        Some(Propagation::Orphan) => (true, false),
        Some(Propagation::Foreground) => (false, true),
        Some(Propagation::Background) => (false, false),
        None => match current.iter().find(|f| is_gc(f)).map(String::as_str) {
            Some(FINALIZER_ORPHAN) => (true, false),
            Some(_) => (false, true),
            None => (false, false),
        },
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
/// the timestamp unless it lies in the future (set by a member whose clock runs ahead).
fn mark_deleting(
    resource: &ResourceInfo,
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
    if resource.resource == "namespaces" {
        object["status"]["phase"] = json!("Terminating");
    }
    Ok(())
}

/// Deletes one object: preconditions, then either a graceful deletion (pods on a node),
/// a deletion that waits on finalizers (the object gets `deletionTimestamp` and stays), or
/// the removal itself.
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
    let finalizers = deletion_finalizers(propagation, &current_finalizers);
    let already_deleting = object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null());
    let grace = graceful_period(resource, object, options);
    let dry_run = req.dry_run()?;
    if already_deleting && grace.is_some_and(|g| g > 0) {
        return Ok((200, object.clone()));
    }
    if !finalizers.is_empty() || grace.is_some_and(|g| g > 0) || resource.resource == "namespaces" {
        // Mark, do not remove: finalizers (or the kubelet, or the namespace controller)
        // finish the deletion.
        let mut marked = object.clone();
        mark_deleting(resource, &mut marked, grace.unwrap_or(0), finalizers)?;
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
    let deleted = server
        .timed(
            "delete",
            resource,
            storage::delete_releasing(
                &server.store,
                resource,
                namespace.as_deref(),
                &name,
                Some(old.resource_version()),
                &held_claims(resource, old.value()),
            ),
        )
        .await
        .map_err(|e| e.into_api_error(resource, &name))?;
    Ok((200, deleted))
}

/// The grace period of a deletion: only pods bound to a node wait for their kubelet
/// (Kubernetes deletes unscheduled pods at once); `None` for every other kind.
fn graceful_period(resource: &ResourceInfo, object: &Value, options: &Value) -> Option<i64> {
    if resource.resource != "pods" {
        return None;
    }
    let bound = object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let terminal = matches!(
        object.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !bound || terminal {
        return Some(0);
    }
    let requested = options.get("gracePeriodSeconds").and_then(Value::as_i64);
    let spec = object
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    Some(
        requested
            .or(spec)
            .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS)
            .max(0),
    )
}

/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

async fn delete(
    server: &ApiServer,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let name = name_of(req)?;
    refuse_system_priority_class_delete(resource, name)?;
    let options = delete_options(req)?;
    let old = current(server, resource, req.info.namespace.as_deref(), name).await?;
    let format = req.format()?;
    let (code, object) = delete_one(server, resource, req, old, &options).await?;
    Ok(object_response(
        resource,
        code,
        &CachedObject::new(object, None),
        format,
        &[],
    ))
}

/// Kubernetes' reason for refusing to delete a built-in PriorityClass.
const SYSTEM_PRIORITY_CLASS_UNDELETABLE: &str =
    "this is a system priority class and cannot be deleted";

/// The PriorityClass storage's `Delete` (Kubernetes' `registry/scheduling/priorityclass/
/// storage`): `system-node-critical` and `system-cluster-critical` cannot be deleted — every
/// node's critical pods name them, and only a restart of kube-apiserver would bring them
/// back. Checked on the name before the object is read, as Kubernetes does (a dry run is
/// refused too).
///
/// DELETE of the collection does not pass here, as in Kubernetes, whose `DeleteCollection`
/// calls the generic store's `Delete` and not this override.
fn refuse_system_priority_class_delete(
    resource: &ResourceInfo,
    name: &str,
) -> Result<(), ApiError> {
    let system = resource.group == "scheduling.k8s.io"
        && resource.resource == "priorityclasses"
        && skerry_api::validation::scheduling::SYSTEM_PRIORITY_CLASSES
            .iter()
            .any(|c| c.name == name);
    if !system {
        return Ok(());
    }
    let mut e = ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {SYSTEM_PRIORITY_CLASS_UNDELETABLE}",
        skerry_api::status::qualified(resource.group, resource.resource)
    ));
    e.group = Some(resource.group.to_string());
    e.kind = Some(resource.resource.to_string());
    e.name = Some(name.to_string());
    Err(e)
}

async fn delete_collection(
    server: &ApiServer,
    resource: &'static ResourceInfo,
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
        match delete_one(server, resource, req, item, &options).await {
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
