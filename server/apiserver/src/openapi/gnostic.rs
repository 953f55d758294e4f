//! Encodes the Swagger 2.0 document as gnostic's `openapi_v2.Document` protobuf, the form
//! kubectl asks `/openapi/v2` for and decodes before `apply`, `create -f` and `edit`.
//!
//! The JSON document is the source of truth and this is a translation of it. Invariant: the
//! translation drops nothing: a keyword the protobuf has no field for is an
//! [`BuildError::Unencodable`], never skipped. Values gnostic holds as `Any` (extensions,
//! `default`, `enum`, `example`) are carried in `Any.yaml` as JSON text, which is YAML: the
//! clients' readers (kube-openapi's `VendorExtensionToMap`) parse that field with a YAML
//! decoder and ignore `Any.value`.

use serde_json::{Map, Value};

use super::pb;
use super::spec::BuildError;

fn unencodable(path: &str, reason: impl Into<String>) -> BuildError {
    BuildError::Unencodable {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, BuildError> {
    value
        .as_object()
        .ok_or_else(|| unencodable(path, "expected an object"))
}

fn string(value: &Value, path: &str) -> Result<String, BuildError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| unencodable(path, "expected a string"))
}

fn strings(value: &Value, path: &str) -> Result<Vec<String>, BuildError> {
    value
        .as_array()
        .ok_or_else(|| unencodable(path, "expected an array"))?
        .iter()
        .map(|v| string(v, path))
        .collect()
}

fn boolean(value: &Value, path: &str) -> Result<bool, BuildError> {
    value
        .as_bool()
        .ok_or_else(|| unencodable(path, "expected a boolean"))
}

fn integer(value: &Value, path: &str) -> Result<i64, BuildError> {
    value
        .as_i64()
        .ok_or_else(|| unencodable(path, "expected an integer"))
}

fn number(value: &Value, path: &str) -> Result<f64, BuildError> {
    value
        .as_f64()
        .ok_or_else(|| unencodable(path, "expected a number"))
}

/// A JSON value as gnostic's `Any`: its YAML text (JSON is YAML).
fn any(value: &Value) -> pb::Any {
    pb::Any {
        value: None,
        yaml: value.to_string(),
    }
}

fn extension(name: &str, value: &Value) -> pb::NamedAny {
    pb::NamedAny {
        name: name.to_string(),
        value: Some(any(value)),
    }
}

/// One JSON schema (a definition, a property, a body or response schema).
pub fn schema(value: &Value, path: &str) -> Result<pb::Schema, BuildError> {
    let mut s = pb::Schema::default();
    for (key, v) in object(value, path)? {
        let at = format!("{path}.{key}");
        match key.as_str() {
            "$ref" => s.r#ref = string(v, &at)?,
            "format" => s.format = string(v, &at)?,
            "title" => s.title = string(v, &at)?,
            "description" => s.description = string(v, &at)?,
            "pattern" => s.pattern = string(v, &at)?,
            "discriminator" => s.discriminator = string(v, &at)?,
            "default" => s.default = Some(any(v)),
            "example" => s.example = Some(any(v)),
            "multipleOf" => s.multiple_of = number(v, &at)?,
            "maximum" => s.maximum = number(v, &at)?,
            "minimum" => s.minimum = number(v, &at)?,
            "exclusiveMaximum" => s.exclusive_maximum = boolean(v, &at)?,
            "exclusiveMinimum" => s.exclusive_minimum = boolean(v, &at)?,
            "uniqueItems" => s.unique_items = boolean(v, &at)?,
            "readOnly" => s.read_only = boolean(v, &at)?,
            "maxLength" => s.max_length = integer(v, &at)?,
            "minLength" => s.min_length = integer(v, &at)?,
            "maxItems" => s.max_items = integer(v, &at)?,
            "minItems" => s.min_items = integer(v, &at)?,
            "maxProperties" => s.max_properties = integer(v, &at)?,
            "minProperties" => s.min_properties = integer(v, &at)?,
            "required" => s.required = strings(v, &at)?,
            "enum" => {
                s.r#enum = v
                    .as_array()
                    .ok_or_else(|| unencodable(&at, "expected an array"))?
                    .iter()
                    .map(any)
                    .collect();
            }
            "type" => {
                let value = match v {
                    Value::String(t) => vec![t.clone()],
                    other => strings(other, &at)?,
                };
                s.r#type = Some(pb::TypeItem { value });
            }
            "items" => {
                let schemas = match v {
                    Value::Array(items) => items
                        .iter()
                        .map(|item| schema(item, &at))
                        .collect::<Result<_, _>>()?,
                    item => vec![schema(item, &at)?],
                };
                s.items = Some(pb::ItemsItem { schema: schemas });
            }
            "additionalProperties" => {
                let oneof = match v {
                    Value::Bool(b) => pb::additional_properties_item::Oneof::Boolean(*b),
                    other => {
                        pb::additional_properties_item::Oneof::Schema(Box::new(schema(other, &at)?))
                    }
                };
                s.additional_properties = Some(Box::new(pb::AdditionalPropertiesItem {
                    oneof: Some(oneof),
                }));
            }
            "allOf" => {
                s.all_of = v
                    .as_array()
                    .ok_or_else(|| unencodable(&at, "expected an array"))?
                    .iter()
                    .map(|item| schema(item, &at))
                    .collect::<Result<_, _>>()?;
            }
            "properties" => {
                let mut properties = Vec::new();
                for (name, property) in object(v, &at)? {
                    properties.push(pb::NamedSchema {
                        name: name.clone(),
                        value: Some(schema(property, &format!("{at}.{name}"))?),
                    });
                }
                s.properties = Some(pb::Properties {
                    additional_properties: properties,
                });
            }
            x if x.starts_with("x-") => s.vendor_extension.push(extension(x, v)),
            other => {
                return Err(unencodable(
                    path,
                    format!("keyword {other:?} has no v2 field"),
                ));
            }
        }
    }
    Ok(s)
}

/// A path or query parameter's fields, shared by the two sub-schema messages.
struct NonBody {
    required: bool,
    description: String,
    name: String,
    r#type: String,
    unique_items: bool,
}

fn parameter(value: &Value, path: &str) -> Result<pb::ParametersItem, BuildError> {
    let fields = object(value, path)?;
    let location = fields.get("in").and_then(Value::as_str).unwrap_or("");
    let parameter = if location == "body" {
        let mut body = pb::BodyParameter {
            r#in: location.to_string(),
            ..Default::default()
        };
        for (key, v) in fields {
            let at = format!("{path}.{key}");
            match key.as_str() {
                "in" => {}
                "name" => body.name = string(v, &at)?,
                "description" => body.description = string(v, &at)?,
                "required" => body.required = boolean(v, &at)?,
                "schema" => body.schema = Some(schema(v, &at)?),
                x if x.starts_with("x-") => body.vendor_extension.push(extension(x, v)),
                other => {
                    return Err(unencodable(
                        &at,
                        format!("unknown body parameter field {other:?}"),
                    ));
                }
            }
        }
        pb::parameter::Oneof::BodyParameter(body)
    } else {
        let mut p = NonBody {
            required: false,
            description: String::new(),
            name: String::new(),
            r#type: String::new(),
            unique_items: false,
        };
        for (key, v) in fields {
            let at = format!("{path}.{key}");
            match key.as_str() {
                "in" => {}
                "name" => p.name = string(v, &at)?,
                "description" => p.description = string(v, &at)?,
                "required" => p.required = boolean(v, &at)?,
                "type" => p.r#type = string(v, &at)?,
                "uniqueItems" => p.unique_items = boolean(v, &at)?,
                other => {
                    return Err(unencodable(
                        &at,
                        format!("unknown parameter field {other:?}"),
                    ));
                }
            }
        }
        let sub = match location {
            "path" => {
                pb::non_body_parameter::Oneof::PathParameterSubSchema(pb::PathParameterSubSchema {
                    required: p.required,
                    r#in: location.to_string(),
                    description: p.description,
                    name: p.name,
                    r#type: p.r#type,
                    unique_items: p.unique_items,
                })
            }
            "query" => pb::non_body_parameter::Oneof::QueryParameterSubSchema(
                pb::QueryParameterSubSchema {
                    required: p.required,
                    r#in: location.to_string(),
                    description: p.description,
                    name: p.name,
                    r#type: p.r#type,
                    unique_items: p.unique_items,
                },
            ),
            other => return Err(unencodable(path, format!("parameter in {other:?}"))),
        };
        pb::parameter::Oneof::NonBodyParameter(pb::NonBodyParameter { oneof: Some(sub) })
    };
    Ok(pb::ParametersItem {
        oneof: Some(pb::parameters_item::Oneof::Parameter(pb::Parameter {
            oneof: Some(parameter),
        })),
    })
}

fn responses(value: &Value, path: &str) -> Result<pb::Responses, BuildError> {
    let mut out = pb::Responses::default();
    for (code, response) in object(value, path)? {
        let at = format!("{path}.{code}");
        let mut r = pb::Response::default();
        for (key, v) in object(response, &at)? {
            match key.as_str() {
                "description" => r.description = string(v, &at)?,
                "schema" => {
                    r.schema = Some(pb::SchemaItem {
                        oneof: Some(pb::schema_item::Oneof::Schema(schema(v, &at)?)),
                    });
                }
                other => {
                    return Err(unencodable(
                        &at,
                        format!("unknown response field {other:?}"),
                    ));
                }
            }
        }
        out.response_code.push(pb::NamedResponseValue {
            name: code.clone(),
            value: Some(pb::ResponseValue {
                oneof: Some(pb::response_value::Oneof::Response(r)),
            }),
        });
    }
    Ok(out)
}

fn operation(value: &Value, path: &str) -> Result<pb::Operation, BuildError> {
    let mut op = pb::Operation::default();
    for (key, v) in object(value, path)? {
        let at = format!("{path}.{key}");
        match key.as_str() {
            "description" => op.description = string(v, &at)?,
            "summary" => op.summary = string(v, &at)?,
            "operationId" => op.operation_id = string(v, &at)?,
            "tags" => op.tags = strings(v, &at)?,
            "consumes" => op.consumes = strings(v, &at)?,
            "produces" => op.produces = strings(v, &at)?,
            "schemes" => op.schemes = strings(v, &at)?,
            "deprecated" => op.deprecated = boolean(v, &at)?,
            "parameters" => {
                op.parameters = v
                    .as_array()
                    .ok_or_else(|| unencodable(&at, "expected an array"))?
                    .iter()
                    .map(|p| parameter(p, &at))
                    .collect::<Result<_, _>>()?;
            }
            "responses" => op.responses = Some(responses(v, &at)?),
            x if x.starts_with("x-") => op.vendor_extension.push(extension(x, v)),
            other => {
                return Err(unencodable(
                    &at,
                    format!("unknown operation field {other:?}"),
                ));
            }
        }
    }
    Ok(op)
}

fn path_item(value: &Value, path: &str) -> Result<pb::PathItem, BuildError> {
    let mut item = pb::PathItem::default();
    for (method, v) in object(value, path)? {
        let at = format!("{path}.{method}");
        if method == "parameters" {
            // A path's own parameters (a connect subresource's).
            item.parameters = v
                .as_array()
                .ok_or_else(|| unencodable(&at, "expected an array"))?
                .iter()
                .map(|p| parameter(p, &at))
                .collect::<Result<_, _>>()?;
            continue;
        }
        let op = Some(operation(v, &at)?);
        match method.as_str() {
            "get" => item.get = op,
            "put" => item.put = op,
            "post" => item.post = op,
            "delete" => item.delete = op,
            "patch" => item.patch = op,
            "head" => item.head = op,
            "options" => item.options = op,
            other => return Err(unencodable(&at, format!("unknown method {other:?}"))),
        }
    }
    Ok(item)
}

/// The whole Swagger 2.0 document.
pub fn document(value: &Value) -> Result<pb::Document, BuildError> {
    let mut doc = pb::Document::default();
    for (key, v) in object(value, "$")? {
        let at = format!("$.{key}");
        match key.as_str() {
            "swagger" => doc.swagger = string(v, &at)?,
            "info" => {
                let fields = object(v, &at)?;
                let field = |name: &str| {
                    fields
                        .get(name)
                        .map(|v| string(v, &at))
                        .transpose()
                        .map(Option::unwrap_or_default)
                };
                doc.info = Some(pb::Info {
                    title: field("title")?,
                    version: field("version")?,
                    description: field("description")?,
                });
            }
            "paths" => {
                let mut paths = pb::Paths::default();
                for (name, item) in object(v, &at)? {
                    paths.path.push(pb::NamedPathItem {
                        name: name.clone(),
                        value: Some(path_item(item, &format!("{at}[{name}]"))?),
                    });
                }
                doc.paths = Some(paths);
            }
            "definitions" => {
                let mut definitions = pb::Definitions::default();
                for (name, s) in object(v, &at)? {
                    definitions.additional_properties.push(pb::NamedSchema {
                        name: name.clone(),
                        value: Some(schema(s, name)?),
                    });
                }
                doc.definitions = Some(definitions);
            }
            "securityDefinitions" => {
                let mut definitions = pb::SecurityDefinitions::default();
                for (name, d) in object(v, &at)? {
                    let fields = object(d, &at)?;
                    let field = |f: &str| {
                        fields
                            .get(f)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string()
                    };
                    if field("type") != "apiKey" {
                        return Err(unencodable(&at, "only apiKey security is encoded"));
                    }
                    definitions
                        .additional_properties
                        .push(pb::NamedSecurityDefinitionsItem {
                            name: name.clone(),
                            value: Some(pb::SecurityDefinitionsItem {
                                oneof: Some(pb::security_definitions_item::Oneof::ApiKeySecurity(
                                    pb::ApiKeySecurity {
                                        r#type: field("type"),
                                        name: field("name"),
                                        r#in: field("in"),
                                        description: field("description"),
                                        vendor_extension: Vec::new(),
                                    },
                                )),
                            }),
                        });
                }
                doc.security_definitions = Some(definitions);
            }
            "security" => {
                for requirement in v
                    .as_array()
                    .ok_or_else(|| unencodable(&at, "expected an array"))?
                {
                    let mut r = pb::SecurityRequirement::default();
                    for (name, scopes) in object(requirement, &at)? {
                        r.additional_properties.push(pb::NamedStringArray {
                            name: name.clone(),
                            value: Some(pb::StringArray {
                                value: strings(scopes, &at)?,
                            }),
                        });
                    }
                    doc.security.push(r);
                }
            }
            other => {
                return Err(unencodable(
                    &at,
                    format!("unknown document field {other:?}"),
                ));
            }
        }
    }
    Ok(doc)
}

/// The reverse of [`schema`] for the fields skerry emits, so tests can check that a decoded
/// protobuf says what the JSON says.
#[cfg(test)]
pub fn schema_to_json(s: &pb::Schema) -> Value {
    let mut out = Map::new();
    let mut put_string = |key: &str, value: &str| {
        if !value.is_empty() {
            out.insert(key.to_string(), Value::String(value.to_string()));
        }
    };
    put_string("$ref", &s.r#ref);
    put_string("format", &s.format);
    put_string("title", &s.title);
    put_string("description", &s.description);
    put_string("pattern", &s.pattern);
    let yaml = |a: &pb::Any| serde_json::from_str::<Value>(&a.yaml).expect("skerry writes JSON");
    if let Some(d) = &s.default {
        out.insert("default".into(), yaml(d));
    }
    if !s.required.is_empty() {
        out.insert("required".into(), serde_json::json!(s.required));
    }
    if !s.r#enum.is_empty() {
        out.insert("enum".into(), s.r#enum.iter().map(yaml).collect());
    }
    if s.unique_items {
        out.insert("uniqueItems".into(), Value::Bool(true));
    }
    if let Some(t) = &s.r#type {
        let value = match t.value.as_slice() {
            [one] => Value::String(one.clone()),
            many => serde_json::json!(many),
        };
        out.insert("type".into(), value);
    }
    if let Some(items) = &s.items {
        let value = match items.schema.as_slice() {
            [one] => schema_to_json(one),
            many => many.iter().map(schema_to_json).collect(),
        };
        out.insert("items".into(), value);
    }
    if let Some(additional) = &s.additional_properties {
        let value = match &additional.oneof {
            Some(pb::additional_properties_item::Oneof::Schema(schema)) => schema_to_json(schema),
            Some(pb::additional_properties_item::Oneof::Boolean(b)) => Value::Bool(*b),
            None => Value::Null,
        };
        out.insert("additionalProperties".into(), value);
    }
    if !s.all_of.is_empty() {
        out.insert(
            "allOf".into(),
            s.all_of.iter().map(schema_to_json).collect(),
        );
    }
    if let Some(properties) = &s.properties {
        let map: Map<String, Value> = properties
            .additional_properties
            .iter()
            .map(|p| {
                let value = p.value.as_ref().map(schema_to_json).unwrap_or_default();
                (p.name.clone(), value)
            })
            .collect();
        out.insert("properties".into(), Value::Object(map));
    }
    for e in &s.vendor_extension {
        let value = e.value.as_ref().map(yaml).unwrap_or_default();
        out.insert(e.name.clone(), value);
    }
    Value::Object(out)
}
