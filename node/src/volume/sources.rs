//! The desired contents of the volumes the atomic writer fills: configMap, secret,
//! downwardAPI and projected (upstream's `pkg/volume/configmap` and `secret` `MakePayload`,
//! `pkg/volume/downwardapi` `CollectData`, `pkg/volume/projected` `collectData`).
//!
//! Rules: without `items` every key becomes a file; with `items` only those keys, each at its
//! `path` and with its own `mode` or the volume's `defaultMode` (0644 when the API left it
//! out); a key an item names that is missing fails the volume unless it is `optional`; a
//! missing object fails it unless `optional`, in which case the volume is empty. A projected
//! volume collects every source into one payload and reports every source that failed, not
//! only the first.

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource, Secret,
};

use super::atomic_writer::{FileProjection, Payload};
use super::token::{TokenManager, TokenSource, projected_request};
use crate::env::fieldpath::{self, Allocatable};
use crate::env::{Lookup, config_map_not_found, secret_not_found};

/// `defaultMode` when the API object carries none (the API's default, 0644).
pub const DEFAULT_MODE: u32 = 0o644;

/// The file mode of a configured mode (the API carries it as an `int32`).
fn mode_of(mode: Option<i32>, default_mode: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .unwrap_or(default_mode)
}

/// The payload of a ConfigMap (`configmap.MakePayload`): `data` and `binaryData`.
pub fn config_map_payload(
    items: Option<&[KeyToPath]>,
    config_map: &ConfigMap,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let data = config_map.data.as_ref();
    let binary = config_map.binary_data.as_ref();
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (name, value) in data.into_iter().flatten() {
                payload.insert(name.clone(), file(value.as_bytes().to_vec(), default_mode));
            }
            for (name, value) in binary.into_iter().flatten() {
                payload.insert(name.clone(), file(value.0.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let bytes = if let Some(v) = data.and_then(|d| d.get(&item.key)) {
                    v.as_bytes().to_vec()
                } else if let Some(v) = binary.and_then(|d| d.get(&item.key)) {
                    v.0.clone()
                } else if optional {
                    continue;
                } else {
                    return Err(format!(
                        "configmap references non-existent config key: {}",
                        item.key
                    ));
                };
                payload.insert(
                    item.path.clone(),
                    file(bytes, mode_of(item.mode, default_mode)),
                );
            }
        }
    }
    Ok(payload)
}

/// The payload of a Secret (`secret.MakePayload`): `data`, already base64-decoded.
pub fn secret_payload(
    items: Option<&[KeyToPath]>,
    secret: &Secret,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let data = secret.data.as_ref();
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (name, value) in data.into_iter().flatten() {
                payload.insert(name.clone(), file(value.0.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.and_then(|d| d.get(&item.key)) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("references non-existent secret key: {}", item.key));
                };
                payload.insert(
                    item.path.clone(),
                    file(value.0.clone(), mode_of(item.mode, default_mode)),
                );
            }
        }
    }
    Ok(payload)
}

/// The payload of downwardAPI items (`downwardapi.CollectData`): metadata fields and
/// container resources as files. Every item is tried; the errors are returned together.
pub fn downward_api_payload(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    allocatable: &Allocatable,
    default_mode: u32,
) -> Result<Payload, Vec<String>> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let mode = mode_of(item.mode, default_mode);
        let mut data = Vec::new();
        if let Some(field) = &item.field_ref {
            match fieldpath::extract_field_path(pod, &field.field_path) {
                Ok(v) => data = v.into_bytes(),
                Err(e) => errors.push(e),
            }
        } else if let Some(selector) = &item.resource_field_ref {
            let name = selector.container_name.as_deref().unwrap_or_default();
            let value = fieldpath::find_container(pod, name).and_then(|c| {
                fieldpath::container_resource_value(
                    selector,
                    &fieldpath::merge_limits(c, allocatable),
                )
            });
            match value {
                Ok(v) => data = v.into_bytes(),
                Err(e) => errors.push(e),
            }
        }
        payload.insert(clean(&item.path), file(data, mode));
    }
    if errors.is_empty() {
        Ok(payload)
    } else {
        Err(errors)
    }
}

fn clean(path: &str) -> String {
    path.split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn file(data: Vec<u8>, mode: u32) -> FileProjection {
    FileProjection { data, mode }
}

/// The payload of a configMap volume: the object read through `lookup`; a missing one is an
/// empty volume when `optional`, otherwise `configmap "<name>" not found`.
pub async fn config_map_volume<L: Lookup>(
    lookup: &L,
    namespace: &str,
    source: &k8s_openapi::api::core::v1::ConfigMapVolumeSource,
) -> Result<Payload, String> {
    let optional = source.optional.unwrap_or(false);
    let default_mode = mode_of(source.default_mode, DEFAULT_MODE);
    let name = source.name.as_str();
    let config_map = match lookup.config_map(namespace, name).await.map_err(|e| e.0)? {
        Some(cm) => cm,
        None if optional => return Ok(Payload::new()),
        None => return Err(config_map_not_found(name)),
    };
    config_map_payload(source.items.as_deref(), &config_map, default_mode, optional)
}

/// The payload of a secret volume (`secretName`), as [`config_map_volume`].
pub async fn secret_volume<L: Lookup>(
    lookup: &L,
    namespace: &str,
    source: &k8s_openapi::api::core::v1::SecretVolumeSource,
) -> Result<Payload, String> {
    let optional = source.optional.unwrap_or(false);
    let default_mode = mode_of(source.default_mode, DEFAULT_MODE);
    let name = source.secret_name.as_deref().unwrap_or_default();
    let secret = match lookup.secret(namespace, name).await.map_err(|e| e.0)? {
        Some(s) => s,
        None if optional => return Ok(Payload::new()),
        None => return Err(secret_not_found(name)),
    };
    secret_payload(source.items.as_deref(), &secret, default_mode, optional)
}

/// The payload of a projected volume (`projected.collectData`): every source into one
/// directory, later sources overwriting earlier ones on the same path. The errors of all
/// failed sources are returned together, as upstream's aggregate: one alone, several as
/// `[a, b]`.
pub async fn projected_volume<L: Lookup, T: TokenSource>(
    lookup: &L,
    tokens: &TokenManager<T>,
    pod: &Pod,
    allocatable: &Allocatable,
    source: &ProjectedVolumeSource,
) -> Result<Payload, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let default_mode = mode_of(source.default_mode, DEFAULT_MODE);
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for projection in source.sources.iter().flatten() {
        if let Some(s) = &projection.secret {
            let optional = s.optional.unwrap_or(false);
            let secret = match lookup.secret(namespace, &s.name).await {
                Ok(Some(secret)) => secret,
                Ok(None) if optional => std::sync::Arc::new(Secret::default()),
                Ok(None) => {
                    errors.push(secret_not_found(&s.name));
                    continue;
                }
                Err(e) => {
                    errors.push(e.0);
                    continue;
                }
            };
            match secret_payload(s.items.as_deref(), &secret, default_mode, optional) {
                Ok(p) => payload.extend(p),
                Err(e) => errors.push(e),
            }
        } else if let Some(c) = &projection.config_map {
            let optional = c.optional.unwrap_or(false);
            let config_map = match lookup.config_map(namespace, &c.name).await {
                Ok(Some(cm)) => cm,
                Ok(None) if optional => std::sync::Arc::new(ConfigMap::default()),
                Ok(None) => {
                    errors.push(config_map_not_found(&c.name));
                    continue;
                }
                Err(e) => {
                    errors.push(e.0);
                    continue;
                }
            };
            match config_map_payload(c.items.as_deref(), &config_map, default_mode, optional) {
                Ok(p) => payload.extend(p),
                Err(e) => errors.push(e),
            }
        } else if let Some(d) = &projection.downward_api {
            match downward_api_payload(
                d.items.as_deref().unwrap_or_default(),
                pod,
                allocatable,
                default_mode,
            ) {
                Ok(p) => payload.extend(p),
                Err(e) => errors.push(aggregate(e)),
            }
        } else if let Some(t) = &projection.service_account_token {
            let request = projected_request(
                t.audience.as_deref(),
                t.expiration_seconds,
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.metadata.uid.as_deref().unwrap_or_default(),
            );
            let account = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .filter(|s| !s.is_empty())
                .unwrap_or("default");
            match tokens
                .get_service_account_token(namespace, account, &request)
                .await
            {
                Ok(tr) => {
                    let token = tr.status.map(|s| s.token).unwrap_or_default();
                    payload.insert(t.path.clone(), file(token.into_bytes(), default_mode));
                }
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        Ok(payload)
    } else {
        Err(aggregate(errors))
    }
}

/// apimachinery's `NewAggregate(...).Error()`: one message alone, several as `[a, b]`
/// (duplicates once).
pub fn aggregate(mut errors: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errors.retain(|e| seen.insert(e.clone()));
    match errors.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}
