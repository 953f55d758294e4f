//! WATCH over HTTP: events from the resource's watch cache in Kubernetes' framing, kept open
//! until `timeoutSeconds` (kubectl's `get -w` exits when the stream ends, so streams stay
//! open for minutes). Two encodings, negotiated from `Accept`:
//! - JSON (`application/json`): `{"type":"ADDED","object":{...}}` per line;
//! - protobuf (`application/vnd.kubernetes.protobuf`, with or without `;stream=watch`):
//!   length-prefixed `WatchEvent` messages, answered as
//!   `application/vnd.kubernetes.protobuf;stream=watch` (client-go's protobuf watch).
//!
//! JSON and protobuf watchers receive the cache's frames as they are: one serialization per
//! event and encoding, the same bytes for every watcher of that encoding. kubectl's `get -w`
//! asks for Table rows instead; those few JSON frames are converted per watcher. Kinds with
//! no protobuf schema (custom resources) are refused protobuf with 406, as Kubernetes
//! refuses protobuf for CRDs.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::Rng;
use serde_json::{Value, json};
use skerry_api::{ApiError, ResourceInfo};

use crate::handler::{ApiServer, Request};
use crate::response::{self, Body, Format, IncludeObject};
use crate::verbs::filter_of;
use crate::watch_cache::object::CachedObject;
use crate::watch_cache::{Encoding, WatchOptions};

/// A watch without `timeoutSeconds` ends after a random time in [this, 2 × this), so that
/// the watches of many clients that started together do not all end and relist together
/// (kube-apiserver's `--min-request-timeout` default, 1800 s, randomised the same way).
pub const WATCH_TIMEOUT_MIN: Duration = Duration::from_secs(1800);

/// The longest `timeoutSeconds` honoured; past it the server's own bound applies. A day is
/// far beyond any client's need and bounds how long a stream holds its watcher slot.
pub const WATCH_TIMEOUT_MAX: Duration = Duration::from_secs(24 * 3600);

pub async fn serve(
    server: &Arc<ApiServer>,
    resource: &'static ResourceInfo,
    req: &Request,
) -> Result<Response<Body>, ApiError> {
    let cache = server.caches.get(resource.resource).ok_or_else(|| {
        ApiError::method_not_allowed(format!("{} cannot be watched", resource.resource))
    })?;
    let format = req.format()?;
    if matches!(format, Format::Yaml | Format::AggregatedDiscovery) {
        return Err(ApiError::not_acceptable(
            "watch streams are served as application/json (or as=Table) or application/vnd.kubernetes.protobuf only",
        ));
    }
    let encoding = match format {
        Format::Protobuf => {
            let api_version = resource.api_version();
            if skerry_api::schema::definition_for_kind(&api_version, resource.kind).is_none() {
                return Err(ApiError::not_acceptable(format!(
                    "{} {api_version} has no protobuf serialization; watch it as application/json",
                    resource.kind
                )));
            }
            Encoding::Protobuf
        }
        // Table and metadata-only frames are rewritten from the JSON ones.
        _ => Encoding::Json,
    };
    let resource_version =
        match req.param("resourceVersion") {
            None | Some("") => None,
            Some(rv) => Some(rv.parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                ApiError::bad_request(format!("invalid resource version: {rv:?}"))
            })?),
        };
    let timeout = match req.param("timeoutSeconds") {
        Some(t) if !t.is_empty() => {
            let secs: u64 = t
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}")))?;
            Duration::from_secs(secs).min(WATCH_TIMEOUT_MAX)
        }
        _ => {
            let factor: f64 = rand::rng().random_range(1.0..2.0);
            WATCH_TIMEOUT_MIN.mul_f64(factor)
        }
    };
    let mut filter = filter_of(resource, req)?;
    if let Some(name) = req.info.name.clone() {
        // `GET .../watch/.../pods/<name>`: a watch of one object.
        let inner = filter.take();
        filter = Some(Arc::new(move |o: &CachedObject| {
            o.name() == name && inner.as_ref().is_none_or(|f| f(o))
        }));
    }
    let opts = WatchOptions {
        resource_version,
        send_initial_events: req.bool_param("sendInitialEvents"),
        allow_bookmarks: req.bool_param("allowWatchBookmarks").unwrap_or(false),
        timeout: Some(timeout),
        filter,
        namespace: req.info.namespace.clone(),
        encoding,
    };
    crate::verbs::wait_for_cache(server, cache, opts.resource_version).await?;
    let stream = cache.watch(opts).await?;
    let body: Body = match format {
        Format::Table(include) => {
            let frames = stream.map(move |frame| {
                Ok::<_, std::convert::Infallible>(Frame::data(table_frame(
                    resource, &frame, include,
                )))
            });
            StreamBody::new(frames).boxed_unsync()
        }
        Format::PartialObjectMetadata => {
            let frames = stream.map(|frame| {
                Ok::<_, std::convert::Infallible>(Frame::data(metadata_frame(&frame)))
            });
            StreamBody::new(frames).boxed_unsync()
        }
        _ => StreamBody::new(
            stream.map(|frame| Ok::<_, std::convert::Infallible>(Frame::data(frame))),
        )
        .boxed_unsync(),
    };
    let mut response = Response::new(body);
    let content_type = match format {
        Format::Protobuf => encoding.watch_content_type(),
        _ => response::JSON,
    };
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    Ok(response)
}

/// A JSON watch frame turned into one whose object is a one-row Table (BOOKMARK and ERROR
/// frames pass unchanged, as Kubernetes sends them).
fn table_frame(resource: &ResourceInfo, frame: &[u8], include: IncludeObject) -> bytes::Bytes {
    let Ok(event) = serde_json::from_slice::<Value>(frame) else {
        return bytes::Bytes::copy_from_slice(frame);
    };
    let kind = event["type"].as_str().unwrap_or("");
    if matches!(kind, "BOOKMARK" | "ERROR") {
        return bytes::Bytes::copy_from_slice(frame);
    }
    let object = CachedObject::new(event["object"].clone(), None);
    let rv = object.resource_version().to_string();
    let table = crate::table::table(
        resource,
        std::slice::from_ref(&object),
        include,
        &rv,
        None,
        None,
    );
    let mut out = serde_json::to_vec(&json!({"type": kind, "object": table})).unwrap_or_default();
    out.push(b'\n');
    out.into()
}

fn metadata_frame(frame: &[u8]) -> bytes::Bytes {
    let Ok(event) = serde_json::from_slice::<Value>(frame) else {
        return bytes::Bytes::copy_from_slice(frame);
    };
    let kind = event["type"].as_str().unwrap_or("");
    if kind == "ERROR" {
        return bytes::Bytes::copy_from_slice(frame);
    }
    let mut out = serde_json::to_vec(
        &json!({"type": kind, "object": crate::table::partial_metadata(&event["object"])}),
    )
    .unwrap_or_default();
    out.push(b'\n');
    out.into()
}
