//! `/stats/summary`, `/metrics/resource` and `/metrics` of the kubelet's API (upstream
//! `pkg/kubelet/server/stats/handler.go` `handleSummary`, and the metric handlers
//! `server.go` installs): the Summary from [`crate::stats::StatsProvider`], its CPU and
//! memory as resource metrics, and the kubelet's own metrics of [`crate::metrics`].
//! Authorized as `nodes/stats` and `nodes/metrics` by the caller (`auth.rs`).

use std::collections::HashMap;

use http::{Response, StatusCode, header};
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

use super::{Body, full, text};
use crate::stats::{StatsProvider, resource};

fn with_type(body: impl Into<bytes::Bytes>, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// `/stats/summary[?only_cpu_and_memory=true]`: the Summary as JSON; a failure to read the
/// runtime is a 500 `Internal Error: ...` as upstream's `handleError`.
pub async fn summary(
    provider: &StatsProvider,
    pods: &[Arc<Pod>],
    query: &HashMap<String, String>,
) -> Response<Body> {
    // Upstream takes the parameter only when it is exactly "true".
    let only = query.get("only_cpu_and_memory").map(String::as_str) == Some("true");
    match provider.summary(only, pods).await {
        Ok(s) => match serde_json::to_vec(&s) {
            Ok(body) => with_type(body, "application/json"),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("Internal Error: {e}"),
            ),
        },
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Internal Error: {e}"),
        ),
    }
}

/// `/metrics/resource`: always 200; a failure to read the stats is `resource_scrape_error 1`.
pub async fn resource_metrics(provider: &StatsProvider) -> Response<Body> {
    let summary = match provider.summary(true, &[]).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "kubelet: resource metrics: reading stats failed");
            None
        }
    };
    with_type(resource::render(summary.as_ref()), resource::CONTENT_TYPE)
}

/// `/metrics`: the kubelet's own metrics.
pub fn metrics() -> Response<Body> {
    match crate::metrics::metrics().encode() {
        Ok(t) => with_type(t, crate::metrics::CONTENT_TYPE),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics: {e}"),
        ),
    }
}
