//! Server-side Table responses (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`),
//! which give `kubectl get` its columns. The columns and cells per resource are
//! `skerry_api::table`'s; this wraps them in a `meta.k8s.io/v1` Table with the rows' objects
//! as `includeObject` asks (PartialObjectMetadata by default).

use serde_json::{Value, json};
use skerry_api::ResourceInfo;

use crate::response::IncludeObject;
use crate::watch_cache::object::CachedObject;

/// A Table of `items`.
pub fn table(
    resource: &ResourceInfo,
    items: &[CachedObject],
    include: IncludeObject,
    resource_version: &str,
    continue_token: Option<&str>,
    remaining_item_count: Option<i64>,
) -> Value {
    let now = std::time::SystemTime::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut row = json!({"cells": skerry_api::table::row_cells(resource, o.value(), now)});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial_metadata(o.value()),
                IncludeObject::Object => row["object"] = o.value().clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({"resourceVersion": resource_version});
    if let Some(c) = continue_token {
        metadata["continue"] = json!(c);
    }
    if let Some(n) = remaining_item_count {
        metadata["remainingItemCount"] = json!(n);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": skerry_api::table::column_definitions(resource),
        "rows": rows,
    })
}

/// An object reduced to its metadata, as `PartialObjectMetadata`.
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}
