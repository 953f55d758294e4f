//! The answers of the verbs in the format the client asked for: one object, or a list —
//! JSON, YAML, protobuf, kubectl's Table or PartialObjectMetadata.

use bytes::Bytes;
use http::Response;
use serde_json::{Value, json};
use skerry_api::ApiError;
use skerry_api::catalogue::ResourceInfo;

use crate::response::{self, Body, Format};
use crate::storage;
use crate::watch_cache::object::CachedObject;

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
