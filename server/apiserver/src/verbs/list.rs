//! LIST: its options and selectors, served from the watch cache or from the store in pages
//! (the cache decides, `watch_cache::plan`). The options and the filter are shared with
//! WATCH ([`crate::watch`]).

use std::sync::Arc;

use http::Response;
use skerry_api::ApiError;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::selector::{FieldSelector, LabelSelector};

use super::list_response;
use crate::handler::{ApiServer, Request};
use crate::response::Body;
use crate::storage::{self, Filter, ListOptions, ResourceVersionMatch};
use crate::watch_cache::object::CachedObject;

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

pub(super) async fn list(
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
