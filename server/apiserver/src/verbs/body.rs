//! What a write's body becomes: the strict decoding of a create or update body (JSON, YAML
//! or protobuf) into the resource's type, and the field manager its `managedFields` entry
//! is recorded for.

use serde_json::Value;
use skerry_api::ApiError;
use skerry_api::catalogue::ResourceInfo;
use skerry_api::strict::FieldValidation;

use crate::handler::Request;
use crate::response;

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
pub fn field_manager_of<'a>(
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
