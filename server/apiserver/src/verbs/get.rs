//! GET of one object: read linearizably from the store, or from the watch cache when the
//! client accepts any state (`resourceVersion=0`).

use http::Response;
use skerry_api::ApiError;
use skerry_api::catalogue::ResourceInfo;

use super::{current, name_of, object_response};
use crate::handler::{ApiServer, Request};
use crate::response::Body;

pub(super) async fn get(
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
