//! The OpenAPI documents as JSON values: the definitions of every served kind, generated from
//! k8s-openapi's `schemars` implementations and annotated with the extensions Kubernetes
//! publishes, and the operations of every served resource; rendered as one Swagger 2.0
//! document (`/openapi/v2`) and one OpenAPI 3.0 document per group-version
//! (`/openapi/v3/apis/apps/v1`).
//!
//! The definitions are built once in Swagger 2.0 form (`#/definitions/...` references with a
//! `description` beside a `$ref`, as Kubernetes' v2 document has them) and rewritten for v3
//! (`#/components/schemas/...`, a described reference wrapped in `allOf`, as Kubernetes' v3
//! documents have them).
//!
//! What kubectl reads, and where it comes from:
//! - `x-kubernetes-group-version-kind` on each kind (a list) and on each operation (one
//!   object): how `apply` and `explain` find a kind's schema.
//! - `x-kubernetes-patch-strategy`, `-patch-merge-key`, `-list-type`, `-list-map-keys` on
//!   fields, from [`skerry_api::schema`]: client-side `apply` computes its strategic merge
//!   patch from them (v3 first, v2 as the fallback).
//! - a v3 `PATCH` operation whose request body lists `application/strategic-merge-patch+json`:
//!   without it kubectl does not use the v3 document for a kind.
//!
//! Invariant (checked by [`Definitions::build`]): every `$ref` in a document names a
//! definition in that document, and every served kind and subresource kind has one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{
    apps, authentication, authorization, autoscaling, coordination, core, discovery, policy, rbac,
    scheduling,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};
use skerry_api::catalogue::{RESOURCES, ResourceInfo, Subresource};

/// How a Swagger 2.0 reference to a definition begins.
pub const V2_REF_PREFIX: &str = "#/definitions/";
/// How an OpenAPI 3.0 reference to a schema component begins.
pub const V3_REF_PREFIX: &str = "#/components/schemas/";

// Definition names of the meta types that operations and documents name directly.
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";

/// The media types a resource answers in (Kubernetes' `produces`).
const PRODUCES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];
/// What a list can also answer with `watch=true`.
const PRODUCES_WATCH: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf;stream=watch",
];
/// The patch types skerry accepts; kubectl checks the v3 `PATCH` operation for the
/// strategic-merge one before it computes a strategic merge patch from the v3 schemas.
const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// Why a document could not be built. Everything here is a defect in the compiled-in types or
/// in this module, reported as a 500 rather than a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A `$ref` names a definition the document does not have.
    #[error("{referrer} refers to {target}, which is not a definition")]
    DanglingReference { referrer: String, target: String },
    /// A catalogue kind (or subresource kind) has no schema among the registered types.
    #[error("served kind {0} has no generated schema")]
    MissingDefinition(String),
    /// The v2 document holds something gnostic's protobuf has no field for.
    #[error("schema at {path} cannot be encoded as a gnostic protobuf: {reason}")]
    Unencodable { path: String, reason: String },
    /// A document failed to serialize as JSON.
    #[error("failed to serialize the document")]
    Serialize(#[source] serde_json::Error),
}

/// A group, version and kind as the `x-kubernetes-group-version-kind` extension spells it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gvk {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    fn new(group: &str, version: &str, kind: &str) -> Self {
        Gvk {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
        }
    }

    fn to_json(&self) -> Value {
        json!({"group": self.group, "kind": self.kind, "version": self.version})
    }
}

/// Registers each type's schema, and through it everything the type refers to.
macro_rules! register {
    ($generator:expr; $($ty:ty),* $(,)?) => {
        $( let _ = $generator.subschema_for::<$ty>(); )*
    };
}

/// The JSON schemas of every served type and what they refer to, by definition name, in
/// Swagger 2.0 form.
fn generated() -> Map<String, Value> {
    let mut generator = SchemaSettings::draft07()
        .with(|s| {
            s.definitions_path = "/definitions".into();
            s.meta_schema = None;
            // Draft-07's transforms strip the `description` beside a `$ref`; Kubernetes'
            // documents keep it, and `kubectl explain` prints it.
            s.transforms.clear();
        })
        .into_generator();
    register!(generator;
        core::v1::Namespace,
        core::v1::Pod,
        core::v1::Node,
        core::v1::Service,
        core::v1::Endpoints,
        core::v1::ConfigMap,
        core::v1::Secret,
        core::v1::ServiceAccount,
        core::v1::Event,
        core::v1::Binding,
        apps::v1::Deployment,
        apps::v1::ReplicaSet,
        apps::v1::DaemonSet,
        apps::v1::StatefulSet,
        policy::v1::PodDisruptionBudget,
        policy::v1::Eviction,
        scheduling::v1::PriorityClass,
        discovery::v1::EndpointSlice,
        coordination::v1::Lease,
        rbac::v1::Role,
        rbac::v1::RoleBinding,
        rbac::v1::ClusterRole,
        rbac::v1::ClusterRoleBinding,
        authorization::v1::SelfSubjectAccessReview,
        authorization::v1::SubjectAccessReview,
        authorization::v1::LocalSubjectAccessReview,
        authentication::v1::TokenRequest,
        authentication::v1::SelfSubjectReview,
        authentication::v1::TokenReview,
        autoscaling::v1::Scale,
        meta::DeleteOptions,
        meta::Status,
        meta::Patch,
        meta::ListMeta,
        meta::WatchEvent<core::v1::Pod>,
    );
    generator.take_definitions(false)
}

/// The OpenAPI definition name of a kind (`io.k8s.api.autoscaling.v1.Scale`): Kubernetes names
/// them after the Go package, `k8s.io/api/<first label of the group>/<version>`.
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let package = if group.is_empty() {
        "core"
    } else {
        group.split('.').next().unwrap_or(group)
    };
    format!("io.k8s.api.{package}.{version}.{kind}")
}

/// The group, version and kind a subresource of `resource` speaks.
fn subresource_gvk(resource: &ResourceInfo, sub: &Subresource) -> Gvk {
    let (group, version) = sub
        .group_version
        .unwrap_or((resource.group, resource.version));
    Gvk::new(group, version, sub.kind)
}

/// The definitions of every served type, annotated, in Swagger 2.0 form.
pub struct Definitions {
    /// Definition name (`io.k8s.api.core.v1.Pod`) to schema, references in v2 form.
    pub schemas: Map<String, Value>,
}

impl Definitions {
    /// Generates, annotates and checks the definitions.
    pub fn build() -> Result<Self, BuildError> {
        let mut schemas = generated();
        let mut gvks: BTreeMap<String, BTreeSet<Gvk>> = BTreeMap::new();
        let mut add_gvk = |definition: String, gvk: Gvk| {
            gvks.entry(definition).or_default().insert(gvk);
        };
        for r in RESOURCES {
            if !schemas.contains_key(r.definition) {
                return Err(BuildError::MissingDefinition(r.definition.to_string()));
            }
            add_gvk(
                r.definition.to_string(),
                Gvk::new(r.group, r.version, r.kind),
            );
            if r.has_verb("list") {
                let list = list_schema(r, &schemas);
                schemas.insert(format!("{}List", r.definition), list);
                add_gvk(
                    format!("{}List", r.definition),
                    Gvk::new(r.group, r.version, r.list_kind),
                );
            }
            // A connect subresource's options kind has no definition (Kubernetes publishes
            // none: its operations answer a string).
            for sub in r.subresources.iter().filter(|s| !s.connect) {
                let gvk = subresource_gvk(r, sub);
                let name = definition_name(&gvk.group, &gvk.version, &gvk.kind);
                if !schemas.contains_key(&name) {
                    return Err(BuildError::MissingDefinition(name));
                }
                add_gvk(name, gvk);
            }
            // Every group-version's DELETE takes DeleteOptions and its watch sends WatchEvents
            // (Kubernetes lists each group-version on these two).
            add_gvk(
                DELETE_OPTIONS.to_string(),
                Gvk::new(r.group, r.version, "DeleteOptions"),
            );
            add_gvk(
                WATCH_EVENT.to_string(),
                Gvk::new(r.group, r.version, "WatchEvent"),
            );
        }
        add_gvk(STATUS.to_string(), Gvk::new("", "v1", "Status"));

        for (name, schema) in schemas.iter_mut() {
            let Some(object) = schema.as_object_mut() else {
                continue;
            };
            if let Some(kinds) = gvks.get(name) {
                object.insert(
                    "x-kubernetes-group-version-kind".into(),
                    Value::Array(kinds.iter().map(Gvk::to_json).collect()),
                );
                // k8s-openapi marks `metadata` required because its field is not an `Option`;
                // Kubernetes does not (`generateName` objects are created without a name).
                drop_required(object, "metadata");
            }
            add_field_extensions(name, object);
        }
        v2_scalar_fixups(&mut schemas);
        let definitions = Definitions { schemas };
        definitions.check_references()?;
        Ok(definitions)
    }

    /// Fails if any `$ref` names a definition that is not here.
    fn check_references(&self) -> Result<(), BuildError> {
        for (name, schema) in &self.schemas {
            for target in references(schema) {
                if !self.schemas.contains_key(&target) {
                    return Err(BuildError::DanglingReference {
                        referrer: name.clone(),
                        target,
                    });
                }
            }
        }
        Ok(())
    }

    /// The names reachable from `roots` through references, roots included.
    fn closure(&self, roots: impl IntoIterator<Item = String>) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut pending: Vec<String> = roots.into_iter().collect();
        while let Some(name) = pending.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(schema) = self.schemas.get(&name) {
                pending.extend(references(schema));
            }
        }
        seen
    }
}

/// Removes `field` from an object schema's `required`, and `required` if it empties.
fn drop_required(object: &mut Map<String, Value>, field: &str) {
    if let Some(Value::Array(required)) = object.get_mut("required") {
        required.retain(|f| f != field);
        if required.is_empty() {
            object.remove("required");
        }
    }
}

/// Copies the strategic-merge-patch and list markers of `definition`'s fields from the schema
/// table onto its property schemas, where kubectl's patch-meta lookup reads them.
fn add_field_extensions(definition: &str, object: &mut Map<String, Value>) {
    let Some(table) = skerry_api::schema::lookup(definition) else {
        return;
    };
    let Some(Value::Object(properties)) = object.get_mut("properties") else {
        return;
    };
    for (json_name, property) in properties.iter_mut() {
        let (Some(field), Some(property)) = (table.field(json_name), property.as_object_mut())
        else {
            continue;
        };
        if !field.list_map_keys().is_empty() {
            property.insert(
                "x-kubernetes-list-map-keys".into(),
                json!(field.list_map_keys()),
            );
        }
        if let Some(list_type) = field.list_type() {
            property.insert("x-kubernetes-list-type".into(), json!(list_type));
        }
        if let Some(key) = field.patch_merge_key() {
            property.insert("x-kubernetes-patch-merge-key".into(), json!(key));
        }
        if let Some(strategy) = field.patch_strategy() {
            property.insert("x-kubernetes-patch-strategy".into(), json!(strategy));
        }
    }
}

/// Kubernetes' v2 forms of the two scalars that are "a number or a string": a string
/// (`format: int-or-string` for IntOrString). k8s-openapi describes them with
/// `x-kubernetes-int-or-string` alone, which gnostic-based clients read as "any value".
fn v2_scalar_fixups(schemas: &mut Map<String, Value>) {
    if let Some(Value::Object(quantity)) = schemas.get_mut(QUANTITY) {
        quantity.remove("x-kubernetes-int-or-string");
        quantity.insert("type".into(), json!("string"));
    }
    if let Some(Value::Object(int_or_string)) = schemas.get_mut(INT_OR_STRING) {
        int_or_string.remove("x-kubernetes-int-or-string");
        int_or_string.insert("type".into(), json!("string"));
        int_or_string.insert("format".into(), json!("int-or-string"));
    }
}

/// The schema of `resource`'s list kind (k8s-openapi models lists as a generic `List<T>`
/// without a schema): `apiVersion`, `items`, `kind`, `metadata`, as Kubernetes has it.
fn list_schema(resource: &ResourceInfo, schemas: &Map<String, Value>) -> Value {
    // The kind's own `apiVersion`/`kind` properties carry the standard descriptions.
    let property = |name: &str| {
        schemas
            .get(resource.definition)
            .and_then(|s| s.pointer(&format!("/properties/{name}")))
            .cloned()
            .unwrap_or_else(|| json!({"type": "string"}))
    };
    json!({
        "description": format!("{} is a list of {} objects.", resource.list_kind, resource.kind),
        "type": "object",
        "properties": {
            "apiVersion": property("apiVersion"),
            "items": {
                "description": format!("List of {}.", resource.resource),
                "type": "array",
                "items": {"$ref": format!("{V2_REF_PREFIX}{}", resource.definition)},
            },
            "kind": property("kind"),
            "metadata": {
                "$ref": format!("{V2_REF_PREFIX}{LIST_META}"),
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            },
        },
        "required": ["items"],
    })
}

/// The definition names a schema refers to (by `$ref`, in v2 or v3 form), walking only the
/// keywords that hold schemas so that extension values are never mistaken for schemas.
pub fn references(schema: &Value) -> Vec<String> {
    let mut found = Vec::new();
    walk_schemas(schema, &mut |s| {
        if let Some(target) = s.get("$ref").and_then(Value::as_str) {
            let name = target
                .strip_prefix(V2_REF_PREFIX)
                .or_else(|| target.strip_prefix(V3_REF_PREFIX))
                .unwrap_or(target);
            found.push(name.to_string());
        }
    });
    found
}

/// Calls `visit` on `schema` and every schema nested in it.
fn walk_schemas(schema: &Value, visit: &mut impl FnMut(&Map<String, Value>)) {
    let Value::Object(object) = schema else {
        return;
    };
    visit(object);
    for (key, value) in object {
        match (key.as_str(), value) {
            ("properties", Value::Object(properties)) => {
                for property in properties.values() {
                    walk_schemas(property, visit);
                }
            }
            ("items" | "additionalProperties" | "schema", v) => walk_schemas(v, visit),
            ("allOf" | "oneOf" | "anyOf", Value::Array(schemas)) => {
                for s in schemas {
                    walk_schemas(s, visit);
                }
            }
            _ => {}
        }
    }
}

/// Rewrites a v2 schema into Kubernetes' v3 form, in place: references point at
/// `#/components/schemas/`, and a reference with siblings (a description) becomes
/// `allOf: [{$ref}]` beside them, since a v3 `$ref` replaces its whole object.
fn to_v3_schema(schema: &mut Value) {
    let Value::Object(object) = schema else {
        return;
    };
    if let Some(Value::String(target)) = object.remove("$ref") {
        let name = target
            .strip_prefix(V2_REF_PREFIX)
            .or_else(|| target.strip_prefix(V3_REF_PREFIX))
            .unwrap_or(&target);
        let reference = json!({"$ref": format!("{V3_REF_PREFIX}{name}")});
        if object.is_empty() {
            object.insert("$ref".into(), reference["$ref"].clone());
        } else {
            object.insert("allOf".into(), Value::Array(vec![reference]));
        }
    }
    for (key, value) in object.iter_mut() {
        match key.as_str() {
            "properties" => {
                if let Value::Object(properties) = value {
                    properties.values_mut().for_each(to_v3_schema);
                }
            }
            "items" | "additionalProperties" | "schema" => to_v3_schema(value),
            "allOf" | "oneOf" | "anyOf" => {
                if let Value::Array(schemas) = value {
                    schemas.iter_mut().for_each(to_v3_schema);
                }
            }
            _ => {}
        }
    }
}

/// Kubernetes' v3 forms of Quantity and IntOrString: `oneOf` their two JSON types.
fn v3_scalar_fixups(schemas: &mut Map<String, Value>) {
    if let Some(Value::Object(quantity)) = schemas.get_mut(QUANTITY) {
        quantity.remove("type");
        quantity.insert(
            "oneOf".into(),
            json!([{"type": "string"}, {"type": "number"}]),
        );
    }
    if let Some(Value::Object(int_or_string)) = schemas.get_mut(INT_OR_STRING) {
        int_or_string.remove("type");
        int_or_string.insert(
            "oneOf".into(),
            json!([{"type": "integer"}, {"type": "string"}]),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Operations

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Head,
    Options,
}

impl Method {
    fn key(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Put => "put",
            Method::Patch => "patch",
            Method::Delete => "delete",
            Method::Head => "head",
            Method::Options => "options",
        }
    }

    /// `Get`, as a connect operation's id spells the method.
    fn camel(self) -> &'static str {
        match self {
            Method::Get => "Get",
            Method::Post => "Post",
            Method::Put => "Put",
            Method::Patch => "Patch",
            Method::Delete => "Delete",
            Method::Head => "Head",
            Method::Options => "Options",
        }
    }
}

/// A query parameter an operation takes.
struct QueryParam {
    name: &'static str,
    /// Swagger's primitive type: `string`, `integer` or `boolean`.
    kind: &'static str,
    description: &'static str,
}

const PRETTY: QueryParam = QueryParam {
    name: "pretty",
    kind: "string",
    description: "If 'true', the output is pretty printed.",
};
const DRY_RUN: QueryParam = QueryParam {
    name: "dryRun",
    kind: "string",
    description: "When present, modifications are not persisted. The only valid value is All.",
};
const FIELD_MANAGER: QueryParam = QueryParam {
    name: "fieldManager",
    kind: "string",
    description: "A name for the actor making the change, recorded in managedFields.",
};
const FIELD_VALIDATION: QueryParam = QueryParam {
    name: "fieldValidation",
    kind: "string",
    description: "How to treat unknown or duplicate fields in the body: Ignore, Warn or Strict.",
};
const FORCE: QueryParam = QueryParam {
    name: "force",
    kind: "boolean",
    description: "Server-side apply only: take ownership of fields other managers own.",
};
const GRACE_PERIOD: QueryParam = QueryParam {
    name: "gracePeriodSeconds",
    kind: "integer",
    description: "Seconds before the object is deleted; zero deletes immediately.",
};
const PROPAGATION_POLICY: QueryParam = QueryParam {
    name: "propagationPolicy",
    kind: "string",
    description: "Whether and how dependents are garbage collected: Orphan, Background or Foreground.",
};
const LIST_PARAMS: &[QueryParam] = &[
    PRETTY,
    QueryParam {
        name: "allowWatchBookmarks",
        kind: "boolean",
        description: "Ask for BOOKMARK events during a watch.",
    },
    QueryParam {
        name: "continue",
        kind: "string",
        description: "The continue token of the previous page of a paged list.",
    },
    QueryParam {
        name: "fieldSelector",
        kind: "string",
        description: "Restrict the returned objects by their fields.",
    },
    QueryParam {
        name: "labelSelector",
        kind: "string",
        description: "Restrict the returned objects by their labels.",
    },
    QueryParam {
        name: "limit",
        kind: "integer",
        description: "The most objects to return in one page; a continue token fetches the rest.",
    },
    QueryParam {
        name: "resourceVersion",
        kind: "string",
        description: "The resource version to list at or watch from.",
    },
    QueryParam {
        name: "resourceVersionMatch",
        kind: "string",
        description: "How resourceVersion applies to a list: Exact or NotOlderThan.",
    },
    QueryParam {
        name: "sendInitialEvents",
        kind: "boolean",
        description: "Start a watch with the current objects as ADDED events.",
    },
    QueryParam {
        name: "timeoutSeconds",
        kind: "integer",
        description: "End the list or watch after this many seconds.",
    },
    QueryParam {
        name: "watch",
        kind: "boolean",
        description: "Watch for changes instead of listing.",
    },
];
const READ_PARAMS: &[QueryParam] = &[PRETTY];
const WRITE_PARAMS: &[QueryParam] = &[PRETTY, DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
const PATCH_PARAMS: &[QueryParam] = &[PRETTY, DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION, FORCE];
const DELETE_PARAMS: &[QueryParam] = &[PRETTY, DRY_RUN, GRACE_PERIOD, PROPAGATION_POLICY];

/// What an operation's request body holds.
enum RequestBody {
    /// An object of this definition (create, replace).
    Object(String),
    /// A patch in one of [`PATCH_TYPES`].
    Patch,
    /// Optional DeleteOptions.
    DeleteOptions,
}

/// One operation on one path.
struct Operation {
    path: String,
    method: Method,
    id: String,
    description: String,
    tag: String,
    /// `x-kubernetes-action`: list, post, get, put, patch, delete, deletecollection.
    action: &'static str,
    gvk: Gvk,
    path_params: Vec<&'static str>,
    query: &'static [QueryParam],
    body: Option<RequestBody>,
    /// The definition of the 200 answer.
    response: String,
    /// Answers 201 Created and 202 Accepted as well (create).
    created: bool,
    produces: &'static [&'static str],
    /// A connect operation (`x-kubernetes-action: connect`): it answers a string, and its
    /// parameters belong to its path, as Kubernetes' documents list them.
    connect: bool,
}

/// The methods a connect subresource answers (upstream's `ConnectMethods`): GET and POST
/// for exec, attach and port-forward, every proxied method for a proxy.
fn connect_methods(sub: &Subresource) -> &'static [Method] {
    if sub.name == "proxy" {
        &[
            Method::Delete,
            Method::Get,
            Method::Head,
            Method::Options,
            Method::Patch,
            Method::Post,
            Method::Put,
        ]
    } else {
        &[Method::Get, Method::Post]
    }
}

const fn bool_param(name: &'static str, description: &'static str) -> QueryParam {
    QueryParam {
        name,
        kind: "boolean",
        description,
    }
}

/// The query parameters of a connect subresource's options kind, with upstream's field
/// descriptions (`k8s.io/api/core/v1/types.go`: `PodAttachOptions`, `PodExecOptions`,
/// `PodPortForwardOptions`, `NodeProxyOptions`).
fn connect_query(kind: &str) -> &'static [QueryParam] {
    const ATTACH: &[QueryParam] = &[
        QueryParam {
            name: "container",
            kind: "string",
            description: "The container in which to execute the command. Defaults to only container if there is only one container in the pod.",
        },
        bool_param(
            "stderr",
            "Stderr if true indicates that stderr is to be redirected for the attach call. Defaults to true.",
        ),
        bool_param(
            "stdin",
            "Stdin if true, redirects the standard input stream of the pod for this call. Defaults to false.",
        ),
        bool_param(
            "stdout",
            "Stdout if true indicates that stdout is to be redirected for the attach call. Defaults to true.",
        ),
        bool_param(
            "tty",
            "TTY if true indicates that a tty will be allocated for the attach call. This is passed through the container runtime so the tty is allocated on the worker node by the container runtime. Defaults to false.",
        ),
    ];
    const EXEC: &[QueryParam] = &[
        QueryParam {
            name: "command",
            kind: "string",
            description: "Command is the remote command to execute. argv array. Not executed within a shell.",
        },
        QueryParam {
            name: "container",
            kind: "string",
            description: "Container in which to execute the command. Defaults to only container if there is only one container in the pod.",
        },
        bool_param(
            "stderr",
            "Redirect the standard error stream of the pod for this call.",
        ),
        bool_param(
            "stdin",
            "Redirect the standard input stream of the pod for this call. Defaults to false.",
        ),
        bool_param(
            "stdout",
            "Redirect the standard output stream of the pod for this call.",
        ),
        bool_param(
            "tty",
            "TTY if true indicates that a tty will be allocated for the exec call. Defaults to false.",
        ),
    ];
    const PORT_FORWARD: &[QueryParam] = &[QueryParam {
        name: "ports",
        kind: "integer",
        description: "List of ports to forward Required when using WebSockets",
    }];
    const NODE_PROXY: &[QueryParam] = &[QueryParam {
        name: "path",
        kind: "string",
        description: "Path is the URL path to use for the current proxy request to node.",
    }];
    match kind {
        "PodAttachOptions" => ATTACH,
        "PodExecOptions" => EXEC,
        "PodPortForwardOptions" => PORT_FORWARD,
        "NodeProxyOptions" => NODE_PROXY,
        _ => &[],
    }
}

/// The operations of a connect subresource (upstream's installer, `MethodConnect`): one per
/// method, `connect{Group}{Version}{Method}{Namespaced}{Kind}{Sub}`, and for a proxy the same
/// again under `{path}` (`...WithPath`).
fn connect_operations(
    r: &ResourceInfo,
    sub: &Subresource,
    item: &str,
    item_params: &[&'static str],
) -> Vec<Operation> {
    let prefix = format!("{}{}", group_camel(r.group), capitalize(r.version));
    let scope = if r.namespaced { "Namespaced" } else { "" };
    let mut paths = vec![(format!("{item}/{}", sub.name), item_params.to_vec(), "")];
    if sub.name == "proxy" {
        let mut with_path = item_params.to_vec();
        with_path.push("path");
        paths.push((
            format!("{item}/{}/{{path}}", sub.name),
            with_path,
            "WithPath",
        ));
    }
    let mut ops = Vec::new();
    for (path, params, suffix) in paths {
        for method in connect_methods(sub) {
            ops.push(Operation {
                path: path.clone(),
                method: *method,
                id: format!(
                    "connect{prefix}{}{scope}{}{}{suffix}",
                    method.camel(),
                    r.kind,
                    capitalize(sub.name)
                ),
                description: format!(
                    "connect {} requests to {} of {}",
                    method.key().to_ascii_uppercase(),
                    sub.name,
                    r.kind
                ),
                tag: tag(r.group, r.version),
                action: "connect",
                gvk: subresource_gvk(r, sub),
                path_params: params.clone(),
                query: connect_query(sub.kind),
                body: None,
                response: String::new(),
                created: false,
                produces: &["*/*"],
                connect: true,
            });
        }
    }
    ops
}

/// `RbacAuthorization` for `rbac.authorization.k8s.io`, `Core` for the core group: the group's
/// part of Kubernetes' operation ids.
fn group_camel(group: &str) -> String {
    if group.is_empty() {
        return "Core".to_string();
    }
    group
        .trim_end_matches(".k8s.io")
        .split('.')
        .map(capitalize)
        .collect()
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `core_v1`, `rbacAuthorization_v1`: Kubernetes' operation tags.
fn tag(group: &str, version: &str) -> String {
    let camel = group_camel(group);
    let mut chars = camel.chars();
    let lower: String = match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    };
    format!("{lower}_{version}")
}

/// `/api/v1` or `/apis/<group>/<version>`.
fn base_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

/// `api/v1` or `apis/<group>/<version>`: the v3 document a resource belongs to.
pub fn group_version_path(group: &str, version: &str) -> String {
    base_path(group, version)
        .trim_start_matches('/')
        .to_string()
}

/// The operations Kubernetes publishes for `resource`, one per verb it serves.
fn operations(r: &ResourceInfo) -> Vec<Operation> {
    let mut ops = Vec::new();
    let base = base_path(r.group, r.version);
    let (collection, scope_params, scope) = if r.namespaced {
        (
            format!("{base}/namespaces/{{namespace}}/{}", r.resource),
            vec!["namespace"],
            "Namespaced",
        )
    } else {
        (format!("{base}/{}", r.resource), vec![], "")
    };
    let item = format!("{collection}/{{name}}");
    let mut item_params = scope_params.clone();
    item_params.push("name");
    let prefix = format!("{}{}", group_camel(r.group), capitalize(r.version));
    let kind_gvk = Gvk::new(r.group, r.version, r.kind);
    let list = format!("{}List", r.definition);
    let op = |path: &str,
              method,
              verb: &str,
              suffix: &str,
              description: String,
              action,
              params: &[&'static str]| Operation {
        path: path.to_string(),
        method,
        id: format!("{verb}{prefix}{scope}{}{suffix}", r.kind),
        description,
        tag: tag(r.group, r.version),
        action,
        gvk: kind_gvk.clone(),
        path_params: params.to_vec(),
        query: READ_PARAMS,
        body: None,
        response: r.definition.to_string(),
        created: false,
        produces: PRODUCES,
        connect: false,
    };

    if r.has_verb("list") {
        let mut o = op(
            &collection,
            Method::Get,
            "list",
            "",
            format!("list or watch objects of kind {}", r.kind),
            "list",
            &scope_params,
        );
        o.query = LIST_PARAMS;
        o.response = list.clone();
        o.produces = PRODUCES_WATCH;
        ops.push(o);
        if r.namespaced {
            let mut o = op(
                &format!("{base}/{}", r.resource),
                Method::Get,
                "list",
                "ForAllNamespaces",
                format!("list or watch objects of kind {}", r.kind),
                "list",
                &[],
            );
            o.id = format!("list{prefix}{}ForAllNamespaces", r.kind);
            o.query = LIST_PARAMS;
            o.response = list.clone();
            o.produces = PRODUCES_WATCH;
            ops.push(o);
        }
    }
    if r.has_verb("create") {
        let mut o = op(
            &collection,
            Method::Post,
            "create",
            "",
            format!("create a {}", r.kind),
            "post",
            &scope_params,
        );
        o.query = WRITE_PARAMS;
        o.body = Some(RequestBody::Object(r.definition.to_string()));
        o.created = true;
        ops.push(o);
    }
    if r.has_verb("deletecollection") {
        let mut o = op(
            &collection,
            Method::Delete,
            "deletecollection",
            "",
            format!("delete collection of {}", r.kind),
            "deletecollection",
            &scope_params,
        );
        o.id = format!("deletecollection{prefix}{scope}{}", r.kind);
        o.query = DELETE_PARAMS;
        o.body = Some(RequestBody::DeleteOptions);
        o.response = STATUS.to_string();
        ops.push(o);
    }
    if r.has_verb("get") {
        ops.push(op(
            &item,
            Method::Get,
            "read",
            "",
            format!("read the specified {}", r.kind),
            "get",
            &item_params,
        ));
    }
    if r.has_verb("update") {
        let mut o = op(
            &item,
            Method::Put,
            "replace",
            "",
            format!("replace the specified {}", r.kind),
            "put",
            &item_params,
        );
        o.query = WRITE_PARAMS;
        o.body = Some(RequestBody::Object(r.definition.to_string()));
        ops.push(o);
    }
    if r.has_verb("patch") {
        let mut o = op(
            &item,
            Method::Patch,
            "patch",
            "",
            format!("partially update the specified {}", r.kind),
            "patch",
            &item_params,
        );
        o.query = PATCH_PARAMS;
        o.body = Some(RequestBody::Patch);
        ops.push(o);
    }
    if r.has_verb("delete") {
        let mut o = op(
            &item,
            Method::Delete,
            "delete",
            "",
            format!("delete a {}", r.kind),
            "delete",
            &item_params,
        );
        o.query = DELETE_PARAMS;
        o.body = Some(RequestBody::DeleteOptions);
        o.response = STATUS.to_string();
        ops.push(o);
    }
    for sub in r.subresources {
        if sub.connect {
            ops.extend(connect_operations(r, sub, &item, &item_params));
            continue;
        }
        let path = format!("{item}/{}", sub.name);
        let gvk = subresource_gvk(r, sub);
        let definition = definition_name(&gvk.group, &gvk.version, &gvk.kind);
        let suffix = capitalize(sub.name);
        let mut push = |method, verb: &str, description: String, action, query, body| {
            let mut o = op(
                &path,
                method,
                verb,
                &suffix,
                description,
                action,
                &item_params,
            );
            o.gvk = gvk.clone();
            o.query = query;
            o.body = body;
            o.response = definition.clone();
            o.created = method == Method::Post;
            ops.push(o);
        };
        for verb in sub.verbs {
            match *verb {
                "get" => push(
                    Method::Get,
                    "read",
                    format!("read {} of the specified {}", sub.name, r.kind),
                    "get",
                    READ_PARAMS,
                    None,
                ),
                "update" => push(
                    Method::Put,
                    "replace",
                    format!("replace {} of the specified {}", sub.name, r.kind),
                    "put",
                    WRITE_PARAMS,
                    Some(RequestBody::Object(definition.clone())),
                ),
                "patch" => push(
                    Method::Patch,
                    "patch",
                    format!("partially update {} of the specified {}", sub.name, r.kind),
                    "patch",
                    PATCH_PARAMS,
                    Some(RequestBody::Patch),
                ),
                "create" => push(
                    Method::Post,
                    "create",
                    format!("create {} of a {}", sub.name, r.kind),
                    "post",
                    WRITE_PARAMS,
                    Some(RequestBody::Object(definition.clone())),
                ),
                _ => {}
            }
        }
    }
    ops
}

/// Which document an operation or schema is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V2,
    V3,
}

impl Version {
    fn reference(self, definition: &str) -> Value {
        match self {
            Version::V2 => json!({"$ref": format!("{V2_REF_PREFIX}{definition}")}),
            Version::V3 => json!({"$ref": format!("{V3_REF_PREFIX}{definition}")}),
        }
    }
}

fn path_param_description(name: &str, op: &Operation) -> String {
    match name {
        "namespace" => "object name and auth scope, such as for teams and projects".into(),
        "path" => "path to the resource".into(),
        // A connect operation names its options kind (`name of the PodExecOptions`).
        _ if op.connect => format!("name of the {}", op.gvk.kind),
        _ => "name of the object".into(),
    }
}

fn render_parameters(op: &Operation, version: Version) -> Vec<Value> {
    let mut parameters = Vec::new();
    for name in &op.path_params {
        let mut p = json!({
            "name": name,
            "in": "path",
            "required": true,
            "description": path_param_description(name, op),
        });
        set_param_type(&mut p, "string", version);
        parameters.push(p);
    }
    if version == Version::V2
        && let Some(body) = &op.body
    {
        let (schema, required) = match body {
            RequestBody::Object(definition) => (version.reference(definition), true),
            RequestBody::Patch => (version.reference(PATCH), true),
            RequestBody::DeleteOptions => (version.reference(DELETE_OPTIONS), false),
        };
        parameters
            .push(json!({"name": "body", "in": "body", "required": required, "schema": schema}));
    }
    for q in op.query {
        let mut p = json!({"name": q.name, "in": "query", "description": q.description});
        set_param_type(&mut p, q.kind, version);
        parameters.push(p);
    }
    if op.connect {
        // Kubernetes' documents list a path's parameters by name (then `in`).
        parameters.sort_by(|a, b| {
            (a["name"].as_str(), a["in"].as_str()).cmp(&(b["name"].as_str(), b["in"].as_str()))
        });
    }
    parameters
}

/// v2 puts a parameter's type on the parameter, v3 in its `schema`.
fn set_param_type(parameter: &mut Value, kind: &str, version: Version) {
    let typed = json!({"type": kind, "uniqueItems": true});
    match version {
        Version::V2 => {
            if let (Value::Object(p), Value::Object(t)) = (parameter, typed) {
                p.extend(t);
            }
        }
        Version::V3 => parameter["schema"] = typed,
    }
}

fn render_operation(op: &Operation, version: Version) -> Value {
    let mut codes = vec!["200"];
    if op.created {
        codes.extend(["201", "202"]);
    }
    let mut responses = Map::new();
    for code in codes {
        let description = match code {
            "201" => "Created",
            "202" => "Accepted",
            _ => "OK",
        };
        // A connect operation answers whatever the kubelet sends: a string.
        let schema = if op.connect {
            json!({"type": "string"})
        } else {
            version.reference(&op.response)
        };
        let response = match version {
            Version::V2 => {
                json!({"description": description, "schema": schema})
            }
            Version::V3 => {
                let content: Map<String, Value> = op
                    .produces
                    .iter()
                    .map(|t| (t.to_string(), json!({"schema": schema.clone()})))
                    .collect();
                json!({"description": description, "content": content})
            }
        };
        responses.insert(code.to_string(), response);
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));

    let mut operation = json!({
        "description": op.description,
        "operationId": op.id,
        "tags": [op.tag],
        "responses": responses,
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": op.gvk.to_json(),
    });
    // A connect operation's parameters are its path's ([`render_paths`]).
    if !op.connect {
        operation["parameters"] = json!(render_parameters(op, version));
    }
    let consumes: &[&str] = match op.body {
        Some(RequestBody::Patch) => PATCH_TYPES,
        _ => &["*/*"],
    };
    match version {
        Version::V2 => {
            operation["consumes"] = json!(consumes);
            operation["produces"] = json!(op.produces);
            operation["schemes"] = json!(["https"]);
        }
        Version::V3 => {
            if let Some(body) = &op.body {
                let (definition, required) = match body {
                    RequestBody::Object(definition) => (definition.as_str(), true),
                    RequestBody::Patch => (PATCH, true),
                    RequestBody::DeleteOptions => (DELETE_OPTIONS, false),
                };
                let content: Map<String, Value> = consumes
                    .iter()
                    .map(|t| {
                        (
                            t.to_string(),
                            json!({"schema": version.reference(definition)}),
                        )
                    })
                    .collect();
                operation["requestBody"] = json!({"content": content, "required": required});
            }
        }
    }
    operation
}

/// Paths and the definitions their operations name, for the given resources.
fn render_paths(
    resources: &[&ResourceInfo],
    version: Version,
) -> (Map<String, Value>, Vec<String>) {
    let mut paths: Map<String, Value> = Map::new();
    let mut roots = Vec::new();
    for r in resources {
        for op in operations(r) {
            if !op.response.is_empty() {
                roots.push(op.response.clone());
            }
            match &op.body {
                Some(RequestBody::Object(definition)) => roots.push(definition.clone()),
                Some(RequestBody::Patch) => roots.push(PATCH.to_string()),
                Some(RequestBody::DeleteOptions) => roots.push(DELETE_OPTIONS.to_string()),
                None => {}
            }
            let item = paths.entry(op.path.clone()).or_insert_with(|| json!({}));
            item[op.method.key()] = render_operation(&op, version);
            if op.connect {
                item["parameters"] = json!(render_parameters(&op, version));
            }
        }
    }
    (paths, roots)
}

fn info() -> Value {
    json!({
        "title": "Kubernetes",
        "version": format!("v1.{}.0", crate::discovery::KUBERNETES_MINOR),
    })
}

/// The Swagger 2.0 document of everything served.
pub fn v2_document(definitions: &Definitions) -> Value {
    let resources: Vec<&ResourceInfo> = RESOURCES.iter().collect();
    let (paths, _) = render_paths(&resources, Version::V2);
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths,
        "definitions": definitions.schemas,
        "securityDefinitions": {
            "BearerToken": {
                "type": "apiKey",
                "name": "authorization",
                "in": "header",
                "description": "Bearer Token authentication",
            },
        },
        "security": [{"BearerToken": []}],
    })
}

/// The group-versions served, as v3 document paths (`api/v1`, `apis/apps/v1`), in catalogue
/// order.
pub fn group_versions() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in RESOURCES {
        let gv = group_version_path(r.group, r.version);
        if !out.contains(&gv) {
            out.push(gv);
        }
    }
    out
}

/// The OpenAPI 3.0 document of one group-version (`apis/apps/v1`): its resources' paths and
/// the schemas they reach. `None` if the group-version is not served.
pub fn v3_document(definitions: &Definitions, group_version: &str) -> Option<Value> {
    let resources: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| group_version_path(r.group, r.version) == group_version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let (paths, mut roots) = render_paths(&resources, Version::V3);
    roots.push(STATUS.to_string());
    roots.push(WATCH_EVENT.to_string());
    let mut schemas = Map::new();
    for name in definitions.closure(roots) {
        if let Some(schema) = definitions.schemas.get(&name) {
            let mut schema = schema.clone();
            to_v3_schema(&mut schema);
            schemas.insert(name, schema);
        }
    }
    v3_scalar_fixups(&mut schemas);
    Some(json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "BearerToken": {
                    "type": "apiKey",
                    "name": "authorization",
                    "in": "header",
                    "description": "Bearer Token authentication",
                },
            },
        },
    }))
}
