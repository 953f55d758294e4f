//! The PATCH body formats Kubernetes accepts, applied to the current object as JSON.
//!
//! - [`json`]: `application/json-patch+json`, RFC 6902 operations.
//! - [`merge`]: `application/merge-patch+json`, RFC 7386, and the diff that produces one.
//! - [`strategic`]: `application/strategic-merge-patch+json`, Kubernetes' merge driven by each
//!   field's patch strategy and merge key, with the `$patch`, `$retainKeys`,
//!   `$deleteFromPrimitiveList/` and `$setElementOrder/` directives kubectl's client-side apply
//!   sends.
//! - [`apply`]: `application/apply-patch+yaml`, server-side apply: the applied configuration is
//!   merged by list type and every field's owners are recorded in `metadata.managedFields`.
//! - [`fieldset`]: the field-ownership sets of server-side apply and their `FieldsV1` encoding.
//!
//! The formats that need to know the shape of a type (strategic merge and apply) ask a
//! [`PatchSchema`] by OpenAPI definition name (`io.k8s.api.core.v1.PodSpec`) and JSON field
//! name. A type or field the schema does not know is treated as Kubernetes treats untyped
//! content: objects are merged key by key and lists are replaced whole.
//!
//! Invariant: no function here mutates its inputs or panics on a client's body; every
//! malformed patch is a [`PatchError`], which [`From<PatchError> for ApiError`] turns into
//! the status Kubernetes answers (400, 409, 413 or 422).

pub mod apply;
pub mod fieldset;
pub mod json;
pub mod merge;
pub mod strategic;

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::status::{ApiError, Cause};

pub use apply::{FieldManager, ManagerConflict, record_update, server_side_apply};
pub use fieldset::{FieldSet, PathElement};

/// The PATCH content types Kubernetes serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply; the body may be JSON, which is YAML).
    Apply,
}

impl PatchType {
    /// The patch type of a request's `Content-Type`, parameters (`; charset=utf-8`) ignored.
    /// `None` for anything else, which the apiserver answers with 415.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        match media_type.to_ascii_lowercase().as_str() {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" => Some(Self::Apply),
            _ => None,
        }
    }

    /// The media type as Kubernetes spells it (for the `Accept-Patch` header).
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Json => "application/json-patch+json",
            Self::Merge => "application/merge-patch+json",
            Self::Strategic => "application/strategic-merge-patch+json",
            Self::Apply => "application/apply-patch+yaml",
        }
    }
}

/// A field's `x-kubernetes-list-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole; owned as one field.
    Atomic,
    /// Scalars merged as a set; each value owned separately.
    Set,
    /// Objects merged by `x-kubernetes-list-map-keys`; each item owned separately.
    Map,
}

/// The shape of a field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldKind {
    /// A string, number or boolean (or a type the schema keeps opaque, like `Quantity`).
    #[default]
    Scalar,
    /// An object with named fields, described by [`FieldInfo::element`].
    Object,
    /// An object with arbitrary keys (`additionalProperties`), whose values are described
    /// by [`FieldInfo::element`] (`None`: scalars).
    Map,
    /// A list whose items are described by [`FieldInfo::element`] (`None`: scalars).
    List,
}

/// The patch-relevant facts of one field of one OpenAPI definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldInfo {
    pub kind: FieldKind,
    /// The definition of the object, of a map's values or of a list's items.
    pub element: Option<String>,
    /// `x-kubernetes-patch-strategy` contains `merge`.
    pub strategy_merge: bool,
    /// `x-kubernetes-patch-strategy` contains `replace`.
    pub strategy_replace: bool,
    /// `x-kubernetes-patch-strategy` contains `retainKeys`.
    pub strategy_retain_keys: bool,
    /// `x-kubernetes-patch-merge-key`.
    pub patch_merge_key: Option<String>,
    /// `x-kubernetes-list-type`.
    pub list_type: Option<ListType>,
    /// `x-kubernetes-list-map-keys`.
    pub list_map_keys: Vec<String>,
    /// Values of list-map key fields that items may omit (the OpenAPI `default` of the key
    /// field, such as a port's `protocol: TCP`): server-side apply identifies an item by
    /// its keys with these filled in, as Kubernetes does.
    pub list_map_key_defaults: Map<String, Value>,
    /// `x-kubernetes-map-type: atomic` (on the field or on its definition): owned and
    /// replaced as one value by server-side apply.
    pub map_atomic: bool,
}

impl FieldInfo {
    /// A scalar field.
    pub fn scalar() -> Self {
        Self::default()
    }

    /// An object field of the given definition.
    pub fn object(definition: &str) -> Self {
        Self {
            kind: FieldKind::Object,
            element: Some(definition.to_string()),
            ..Self::default()
        }
    }

    /// A map (`additionalProperties`) of scalars (`None`) or of objects of a definition.
    pub fn map(values: Option<&str>) -> Self {
        Self {
            kind: FieldKind::Map,
            element: values.map(str::to_string),
            ..Self::default()
        }
    }

    /// A list of scalars (`None`) or of objects of a definition, replaced whole.
    pub fn list(items: Option<&str>) -> Self {
        Self {
            kind: FieldKind::List,
            element: items.map(str::to_string),
            ..Self::default()
        }
    }

    /// Adds `patchStrategy=merge` with `patchMergeKey=key` (`None` for scalar lists).
    pub fn merge_by(mut self, key: Option<&str>) -> Self {
        self.strategy_merge = true;
        self.patch_merge_key = key.map(str::to_string);
        self
    }

    /// Sets `x-kubernetes-list-type` (and the map keys for [`ListType::Map`]).
    pub fn list_type(mut self, list_type: ListType, keys: &[&str]) -> Self {
        self.list_type = Some(list_type);
        self.list_map_keys = keys.iter().map(|k| k.to_string()).collect();
        self
    }

    /// Declares the value a list-map key field takes when an item omits it.
    pub fn key_default(mut self, key: &str, value: Value) -> Self {
        self.list_map_key_defaults.insert(key.to_string(), value);
        self
    }

    /// Adds `patchStrategy=retainKeys`.
    pub fn retain_keys(mut self) -> Self {
        self.strategy_retain_keys = true;
        self
    }

    /// Adds `patchStrategy=replace`.
    pub fn replace(mut self) -> Self {
        self.strategy_replace = true;
        self
    }

    /// Marks the map or object as `x-kubernetes-map-type: atomic`.
    pub fn atomic(mut self) -> Self {
        self.map_atomic = true;
        self
    }

    /// How server-side apply treats this list: an explicit `x-kubernetes-list-type` wins;
    /// otherwise, as Kubernetes converts its OpenAPI, `patchStrategy=merge` with a merge key
    /// is a map keyed by it, `merge` without one a set, and anything else atomic.
    pub fn apply_list_type(&self) -> (ListType, Vec<String>) {
        match self.list_type {
            Some(ListType::Map) => (ListType::Map, self.list_map_keys.clone()),
            Some(other) => (other, Vec::new()),
            None if self.strategy_merge => match &self.patch_merge_key {
                Some(key) => (ListType::Map, vec![key.clone()]),
                None => (ListType::Set, Vec::new()),
            },
            None => (ListType::Atomic, Vec::new()),
        }
    }
}

/// The per-type field table the patch formats consult.
///
/// `definition` is an OpenAPI definition name (`io.k8s.api.apps.v1.DeploymentSpec`).
pub trait PatchSchema {
    /// The facts of `json_name` in `definition`; `None` if either is unknown.
    fn field(&self, definition: &str, json_name: &str) -> Option<FieldInfo>;

    /// Whether the definition is known at all (an unknown field of a known definition is
    /// still opaque; a known definition's named fields take part in apply's pruning).
    fn has_definition(&self, definition: &str) -> bool;
}

/// A schema that knows nothing: objects merge key by key, lists are replaced.
/// Kubernetes treats custom resources without a structural schema the same way.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSchema;

impl PatchSchema for NoSchema {
    fn field(&self, _definition: &str, _json_name: &str) -> Option<FieldInfo> {
        None
    }

    fn has_definition(&self, _definition: &str) -> bool {
        false
    }
}

/// A schema held in a table, for tests and for types registered at run time.
#[derive(Debug, Clone, Default)]
pub struct SchemaTable {
    /// definition -> JSON field name -> facts.
    fields: HashMap<String, HashMap<String, FieldInfo>>,
}

impl SchemaTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a field (and so the definition) and returns the table for chaining.
    pub fn with(mut self, definition: &str, json_name: &str, info: FieldInfo) -> Self {
        self.insert(definition, json_name, info);
        self
    }

    /// Declares a field (and so the definition).
    pub fn insert(&mut self, definition: &str, json_name: &str, info: FieldInfo) {
        self.fields
            .entry(definition.to_string())
            .or_default()
            .insert(json_name.to_string(), info);
    }
}

impl PatchSchema for SchemaTable {
    fn field(&self, definition: &str, json_name: &str) -> Option<FieldInfo> {
        self.fields.get(definition)?.get(json_name).cloned()
    }

    fn has_definition(&self, definition: &str) -> bool {
        self.fields.contains_key(definition)
    }
}

/// The built-in types' table ([`crate::schema`]) seen through [`PatchSchema`].
///
/// The generated table carries the patch markers but not `x-kubernetes-map-type` or
/// OpenAPI defaults, so two facts are kept here by hand: the definitions Kubernetes marks
/// `+structType=atomic` and the map fields marked `+mapType=atomic` ([`ATOMIC_DEFINITIONS`],
/// [`ATOMIC_MAP_FIELDS`]), and the default of the `protocol` list-map key (`TCP` on every
/// port type that is keyed by it).
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinSchema;

/// Definitions Kubernetes 1.32 marks `+structType=atomic`: owned and replaced whole by
/// server-side apply. Hand-kept from `k8s.io/api` and `apimachinery` types.
pub const ATOMIC_DEFINITIONS: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.NodeSelectorTerm",
    "io.k8s.api.core.v1.TopologySelectorTerm",
    "io.k8s.api.core.v1.ObjectReference",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.api.core.v1.SecretReference",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
    "io.k8s.api.core.v1.ScopeSelector",
];

/// `(definition, field)` maps Kubernetes 1.32 marks `+mapType=atomic`.
pub const ATOMIC_MAP_FIELDS: &[(&str, &str)] = &[("io.k8s.api.core.v1.PodSpec", "nodeSelector")];

/// The list-map key with an OpenAPI default, and the default (ports' `protocol`).
const KEY_DEFAULTS: &[(&str, &str)] = &[("protocol", "TCP")];

impl PatchSchema for BuiltinSchema {
    fn field(&self, definition: &str, json_name: &str) -> Option<FieldInfo> {
        use crate::schema::Kind;
        let field = crate::schema::lookup(definition)?.field(json_name)?;
        let element_type = field.element_type();
        // Types with their own JSON form (Time, Quantity, IntOrString, RawExtension, ...)
        // are scalars to a patch.
        let element = element_type
            .filter(|t| t.special.is_none())
            .and(field.message_type.clone());
        let kind = if field.repeated {
            FieldKind::List
        } else if field.kind == Kind::Map {
            FieldKind::Map
        } else if element.is_some() {
            FieldKind::Object
        } else {
            FieldKind::Scalar
        };
        let list_type = match field.list_type() {
            Some("atomic") => Some(ListType::Atomic),
            Some("set") => Some(ListType::Set),
            Some("map") => Some(ListType::Map),
            _ => None,
        };
        let mut key_defaults = Map::new();
        for (key, default) in KEY_DEFAULTS {
            if field.list_map_keys().iter().any(|k| k == key) {
                key_defaults.insert(key.to_string(), Value::String(default.to_string()));
            }
        }
        let map_atomic = ATOMIC_MAP_FIELDS.contains(&(definition, json_name))
            || (kind == FieldKind::Object
                && element
                    .as_deref()
                    .is_some_and(|e| ATOMIC_DEFINITIONS.contains(&e)));
        Some(FieldInfo {
            kind,
            element,
            strategy_merge: field.has_patch_strategy("merge"),
            strategy_replace: field.has_patch_strategy("replace"),
            strategy_retain_keys: field.has_patch_strategy("retainKeys"),
            patch_merge_key: field.patch_merge_key().map(str::to_string),
            list_type,
            list_map_keys: field.list_map_keys().to_vec(),
            list_map_key_defaults: key_defaults,
            map_atomic,
        })
    }

    fn has_definition(&self, definition: &str) -> bool {
        crate::schema::lookup(definition).is_some()
    }
}

/// What the walkers know about the object they are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Nothing: keys are untyped and lists atomic.
    Untyped,
    /// An object of a definition, whose keys are its named fields.
    Struct(String),
    /// An object with arbitrary keys whose values are objects of a definition (`Some`) or
    /// scalars (`None`).
    MapOf(Option<String>),
}

impl Shape {
    /// The shape of the root object of a definition.
    pub(crate) fn root(definition: &str) -> Self {
        Self::Struct(definition.to_string())
    }

    /// The facts of one key of this object.
    pub(crate) fn field(&self, schema: &dyn PatchSchema, key: &str) -> Option<FieldInfo> {
        match self {
            Self::Untyped => None,
            Self::Struct(definition) => schema.field(definition, key),
            Self::MapOf(Some(definition)) => Some(FieldInfo::object(definition)),
            Self::MapOf(None) => Some(FieldInfo::scalar()),
        }
    }

    /// Whether `key` is a named field of a known definition (not a map entry).
    pub(crate) fn is_named_field(&self, schema: &dyn PatchSchema, key: &str) -> bool {
        match self {
            Self::Struct(definition) => schema.field(definition, key).is_some(),
            Self::Untyped | Self::MapOf(_) => false,
        }
    }

    /// The shape of the object a field holds.
    pub(crate) fn of_value(info: Option<&FieldInfo>) -> Self {
        match info {
            Some(FieldInfo {
                kind: FieldKind::Object,
                element: Some(d),
                ..
            }) => Self::Struct(d.clone()),
            Some(FieldInfo {
                kind: FieldKind::Map,
                element,
                ..
            }) => Self::MapOf(element.clone()),
            _ => Self::Untyped,
        }
    }

    /// The shape of the items of a list field.
    pub(crate) fn of_items(info: Option<&FieldInfo>) -> Self {
        match info {
            Some(FieldInfo {
                kind: FieldKind::List,
                element: Some(d),
                ..
            }) => Self::Struct(d.clone()),
            _ => Self::Untyped,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The body is not the JSON (or YAML) the patch type requires. 400.
    #[error("error decoding patch: {0}")]
    Decode(String),
    /// The body decodes but breaks the patch format's own rules (an unknown `$patch`,
    /// a list item without its merge key, a malformed directive). 400.
    #[error("{0}")]
    BadRequest(String),
    /// The patch is well formed but cannot apply to this object (a JSON patch `test` that
    /// fails, a path that does not exist, a list of lists). 422.
    #[error("{0}")]
    Invalid(String),
    /// More JSON patch operations than the server accepts. 413.
    #[error("The allowed maximum operations in a JSON patch is {max}, got {count}")]
    TooManyOperations { count: usize, max: usize },
    /// Server-side apply would change fields other managers own. 409.
    #[error("{}", apply::conflict_message(.0))]
    Conflict(Vec<ManagerConflict>),
}

impl From<PatchError> for ApiError {
    fn from(error: PatchError) -> Self {
        let message = error.to_string();
        match error {
            PatchError::Decode(_) | PatchError::BadRequest(_) => ApiError::bad_request(message),
            // Kubernetes answers these with a generic 422 whose message is the error.
            PatchError::Invalid(_) => ApiError::new(422, "Invalid", message),
            PatchError::TooManyOperations { .. } => {
                ApiError::new(413, "RequestEntityTooLarge", message)
            }
            PatchError::Conflict(conflicts) => {
                let mut e = ApiError::new(409, "Conflict", message);
                e.causes = conflicts
                    .iter()
                    .map(|c| {
                        Cause::new(
                            "FieldManagerConflict",
                            c.path.clone(),
                            format!("conflict with {}", c.manager),
                        )
                    })
                    .collect();
                e
            }
        }
    }
}

/// Applies a JSON, merge or strategic merge patch to `current` and returns the new object.
/// `definition` names `current`'s OpenAPI definition for the strategic merge.
///
/// Server-side apply needs a field manager and the time; it is [`server_side_apply`].
/// Asked for [`PatchType::Apply`], this answers [`PatchError::BadRequest`].
pub fn apply_patch(
    patch_type: PatchType,
    current: &Value,
    patch: &[u8],
    schema: &dyn PatchSchema,
    definition: &str,
) -> Result<Value, PatchError> {
    match patch_type {
        PatchType::Json => json::apply(current, patch),
        PatchType::Merge => merge::apply(current, patch),
        PatchType::Strategic => strategic::apply(current, patch, schema, definition),
        PatchType::Apply => Err(PatchError::BadRequest(
            "server-side apply needs a field manager: use server_side_apply".to_string(),
        )),
    }
}

/// Parses a patch body as JSON, refusing bodies nested deeper than [`DEPTH_MAX`].
pub(crate) fn parse_body(body: &[u8]) -> Result<Value, PatchError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| PatchError::Decode(e.to_string()))?;
    if depth(&value) > DEPTH_MAX {
        return Err(PatchError::Decode(format!(
            "the patch nests deeper than {DEPTH_MAX} levels"
        )));
    }
    Ok(value)
}

/// Nesting accepted in a patch body. The merges recurse once per level, so this bounds
/// their stack; serde_json already stops at 128 while parsing, and no Kubernetes object
/// comes near it (a Pod template in a CronJob is about 12 levels deep).
pub const DEPTH_MAX: usize = 128;

fn depth(value: &Value) -> usize {
    // Iterative so that measuring depth cannot itself overflow the stack.
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Object(m) => stack.extend(m.values().map(|c| (c, d + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, d + 1))),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_parse_with_parameters() {
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json; charset=utf-8"),
            Some(PatchType::Strategic)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        for t in [
            PatchType::Json,
            PatchType::Merge,
            PatchType::Strategic,
            PatchType::Apply,
        ] {
            assert_eq!(PatchType::from_content_type(t.media_type()), Some(t));
        }
    }

    #[test]
    fn errors_become_kubernetes_statuses() {
        let e: ApiError = PatchError::Decode("eof".into()).into();
        assert_eq!((e.code, e.reason), (400, "BadRequest"));
        let e: ApiError = PatchError::Invalid("lists of lists are not supported".into()).into();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let e: ApiError = PatchError::TooManyOperations {
            count: 10_001,
            max: 10_000,
        }
        .into();
        assert_eq!(e.code, 413);
        assert_eq!(
            e.message,
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
    }

    #[test]
    fn apply_list_type_follows_kubernetes_conversion() {
        let containers = FieldInfo::list(Some("C")).merge_by(Some("name"));
        assert_eq!(
            containers.apply_list_type(),
            (ListType::Map, vec!["name".to_string()])
        );
        let finalizers = FieldInfo::list(None).merge_by(None);
        assert_eq!(finalizers.apply_list_type(), (ListType::Set, vec![]));
        let args = FieldInfo::list(None);
        assert_eq!(args.apply_list_type(), (ListType::Atomic, vec![]));
        let ports = FieldInfo::list(Some("P"))
            .merge_by(Some("containerPort"))
            .list_type(ListType::Map, &["containerPort", "protocol"]);
        assert_eq!(ports.apply_list_type().1, vec!["containerPort", "protocol"]);
    }

    #[test]
    fn builtin_schema_reads_the_generated_table() {
        // Types skerry does not serve (StorageClass's TopologySelectorTerm) may be absent.
        for definition in [
            "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
            "io.k8s.api.core.v1.NodeSelector",
            "io.k8s.api.core.v1.ObjectReference",
            "io.k8s.api.core.v1.SecretKeySelector",
        ] {
            assert!(ATOMIC_DEFINITIONS.contains(&definition));
            assert!(BuiltinSchema.has_definition(definition), "{definition}");
        }
        let containers = BuiltinSchema
            .field("io.k8s.api.core.v1.PodSpec", "containers")
            .expect("PodSpec.containers");
        assert_eq!(containers.kind, FieldKind::List);
        assert_eq!(
            containers.element.as_deref(),
            Some("io.k8s.api.core.v1.Container")
        );
        assert_eq!(containers.patch_merge_key.as_deref(), Some("name"));
        let ports = BuiltinSchema
            .field("io.k8s.api.core.v1.Container", "ports")
            .expect("Container.ports");
        assert_eq!(
            ports.list_map_key_defaults.get("protocol"),
            Some(&Value::from("TCP"))
        );
        let selector = BuiltinSchema
            .field("io.k8s.api.apps.v1.DeploymentSpec", "selector")
            .expect("DeploymentSpec.selector");
        assert!(selector.map_atomic);
        let created = BuiltinSchema
            .field(
                "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                "creationTimestamp",
            )
            .expect("ObjectMeta.creationTimestamp");
        assert_eq!(
            created.kind,
            FieldKind::Scalar,
            "Time is a string on the wire"
        );
        let labels = BuiltinSchema
            .field("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "labels")
            .expect("ObjectMeta.labels");
        assert_eq!(labels.kind, FieldKind::Map);
    }

    // The real table end to end: kubectl's client-side apply patch, then a server-side
    // apply of another container by another manager.
    #[test]
    fn deployment_patches_with_the_builtin_schema() {
        let definition = "io.k8s.api.apps.v1.Deployment";
        let live = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "web", "image": "nginx:1", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
                ]}},
            },
        });
        let patch = serde_json::json!({"spec": {
            "strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"},
            "template": {"spec": {
                "$setElementOrder/containers": [{"name": "web"}],
                "containers": [{"$setElementOrder/env": [{"name": "A"}],
                                "env": [{"$patch": "delete", "name": "B"}], "name": "web"}],
            }},
        }});
        let out = apply_patch(
            PatchType::Strategic,
            &live,
            patch.to_string().as_bytes(),
            &BuiltinSchema,
            definition,
        )
        .expect("kubectl's patch applies");
        assert_eq!(
            out["spec"]["strategy"],
            serde_json::json!({"type": "Recreate"})
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            serde_json::json!([{"name": "A", "value": "1"}])
        );

        let fm = FieldManager {
            schema: &BuiltinSchema,
            definition,
            manager: "kubectl",
            subresource: "",
            now: "2025-01-01T00:00:00Z",
        };
        let applied = server_side_apply(&fm, None, &out, false).expect("creates");
        let owned = applied["metadata"]["managedFields"][0]["fieldsV1"].clone();
        assert_eq!(
            owned["f:spec"]["f:selector"],
            serde_json::json!({}),
            "atomic selector"
        );
        assert!(
            owned["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]
                ["f:ports"]["k:{\"containerPort\":80,\"protocol\":\"TCP\"}"]
                .is_object()
        );
        let other = FieldManager {
            manager: "injector",
            ..fm
        };
        let sidecar = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "web", "ports": [{"containerPort": 80}]},
                {"name": "envoy", "image": "envoy"},
            ]}}},
        });
        let both = server_side_apply(&other, Some(&applied), &sidecar, false)
            .expect("port 80 defaults to TCP: the same item, the same value");
        let containers = &both["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers.as_array().map(Vec::len), Some(2));
        assert_eq!(
            containers[0]["ports"],
            serde_json::json!([{"containerPort": 80, "protocol": "TCP"}])
        );
    }

    #[test]
    fn deep_bodies_are_refused() {
        let mut body = String::new();
        for _ in 0..(DEPTH_MAX + 1) {
            body.push_str("{\"a\":");
        }
        body.push('1');
        for _ in 0..(DEPTH_MAX + 1) {
            body.push('}');
        }
        // serde_json stops at 128 itself; either way the answer is a decode error.
        assert!(matches!(
            parse_body(body.as_bytes()),
            Err(PatchError::Decode(_))
        ));
    }
}
