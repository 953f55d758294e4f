//! Server-side apply and field ownership: `application/apply-patch+yaml`, and the
//! `metadata.managedFields` bookkeeping every write does.
//!
//! An apply merges the applied configuration into the live object by each field's list
//! type (atomic lists replaced, sets united, list-maps merged item by item by their keys,
//! maps and structs field by field), then:
//! 1. prunes what the manager applied last time and no longer applies, unless another
//!    manager owns it (Kubernetes' remove / add back owned / add back dangling passes);
//! 2. compares live and new: a changed field owned by another manager is a conflict,
//!    answered 409 unless `force`, in which case the other manager loses it;
//! 3. records the applied configuration's fields as the manager's `Apply` entry.
//!
//! An update (any other write) takes the fields it changed from their owners and adds them
//! to the writer's `Update` entry; it never conflicts.
//!
//! Invariants: every set recorded in `managedFields` excludes the fields nobody owns
//! (`apiVersion`, `kind`, `metadata.name`, `uid`, `resourceVersion`, ...); entries with
//! empty sets are dropped; entries are sorted as Kubernetes sorts them (operation, time,
//! manager, apiVersion, subresource), so the same ownership always encodes the same bytes.
//!
//! The trick it relies on, managedFields as sorted-slice sets (`docs/tricks.md` #20), is in
//! [`super::fieldset`].

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, PathElement, display_path};
use super::{FieldInfo, FieldKind, ListType, PatchError, PatchSchema, Shape};

/// `operation` of an apply's entry.
const OPERATION_APPLY: &str = "Apply";
/// `operation` of an update's entry.
const OPERATION_UPDATE: &str = "Update";
/// The only `fieldsType` Kubernetes defines.
const FIELDS_TYPE_V1: &str = "FieldsV1";

/// `Update` entries kept per object; past this the oldest are merged into one entry per
/// API version named [`ANCIENT_CHANGES_MANAGER`]. Every writer with a distinct name adds an
/// entry, so without a cap a controller that names itself per pod would grow the object
/// without bound. The number is Kubernetes' (`DefaultMaxUpdateManagers`).
pub const UPDATE_MANAGERS_MAX: usize = 10;

/// The manager that old `Update` entries are merged into (Kubernetes' name).
pub const ANCIENT_CHANGES_MANAGER: &str = "ancient-changes";

/// Fields nobody owns: identity and server-set metadata (Kubernetes' strip-meta list).
const UNOWNED_PATHS: &[&[&str]] = &[
    &["apiVersion"],
    &["kind"],
    &["metadata"],
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "creationTimestamp"],
    &["metadata", "selfLink"],
    &["metadata", "uid"],
    &["metadata", "clusterName"],
    &["metadata", "generation"],
    &["metadata", "managedFields"],
    &["metadata", "resourceVersion"],
];

/// Who is writing, to what type, and when.
#[derive(Clone, Copy)]
pub struct FieldManager<'a> {
    pub schema: &'a dyn PatchSchema,
    /// The OpenAPI definition of the object (`io.k8s.api.apps.v1.Deployment`).
    pub definition: &'a str,
    /// The request's `fieldManager`.
    pub manager: &'a str,
    /// `status`, `scale`, or empty for the main resource.
    pub subresource: &'a str,
    /// The time of the write, RFC 3339 in UTC to the second (`2024-05-01T12:00:00Z`), as
    /// `metav1.Time` is written; entries sort by it as text.
    pub now: &'a str,
}

/// One field that an apply would take from another manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConflict {
    /// The other manager as Kubernetes prints it: `"kubectl"` for an applier,
    /// `"kube-controller-manager" using apps/v1` for an updater.
    pub manager: String,
    /// The field in Kubernetes' path syntax: `.spec.replicas`.
    pub path: String,
}

/// Kubernetes' message for an apply conflict (kubectl prints it after `error: `).
pub(crate) fn conflict_message(conflicts: &[ManagerConflict]) -> String {
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            only.manager, only.path
        );
    }
    let mut lines = Vec::new();
    let mut previous: Option<&str> = None;
    for conflict in conflicts {
        if previous != Some(conflict.manager.as_str()) {
            lines.push(format!("conflicts with {}:", conflict.manager));
            previous = Some(&conflict.manager);
        }
        lines.push(format!("- {}", conflict.path));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Server-side apply of `applied` (the decoded body) to `current` (`None`: the object does
/// not exist yet). Returns the new object with its `managedFields`.
pub fn server_side_apply(
    field_manager: &FieldManager<'_>,
    current: Option<&Value>,
    applied: &Value,
    force: bool,
) -> Result<Value, PatchError> {
    field_manager.apply(current, applied, force)
}

/// Records an update by `field_manager` (a create when `old` is `None`) in
/// `new`'s `managedFields`. Never fails: as in Kubernetes, an object whose ownership cannot
/// be worked out (a list-map item without its key) is written with `managedFields` cleared.
pub fn record_update(field_manager: &FieldManager<'_>, old: Option<&Value>, new: &mut Value) {
    field_manager.record_update(old, new)
}

/// Decodes an `application/apply-patch+yaml` body.
///
/// Only the JSON form of YAML is accepted (what kubectl and client-go send); a body in
/// block YAML is a decode error.
pub fn parse_apply_body(body: &[u8]) -> Result<Value, PatchError> {
    super::parse_body(body).map_err(|e| match e {
        PatchError::Decode(detail) => {
            PatchError::Decode(format!("{detail} (only the JSON form of YAML is accepted)"))
        }
        other => other,
    })
}

impl FieldManager<'_> {
    fn root(&self) -> Ty {
        Ty::Object(Shape::root(self.definition))
    }

    /// See [`server_side_apply`].
    pub fn apply(
        &self,
        current: Option<&Value>,
        applied: &Value,
        force: bool,
    ) -> Result<Value, PatchError> {
        if !applied.is_object() {
            return Err(PatchError::BadRequest(
                "the applied configuration must be an object".to_string(),
            ));
        }
        if applied
            .pointer("/metadata/managedFields")
            .is_some_and(|v| !v.is_null())
        {
            return Err(PatchError::BadRequest(
                "metadata.managedFields must be nil".to_string(),
            ));
        }
        let (live, mut entries) = split_managed_fields(current);
        let root = self.root();
        let merged = merge_node(Some(&live), applied, &root, self.schema)?;

        let me = Identity::new(self.manager, OPERATION_APPLY, "", self.subresource);
        let applied_set = field_set(applied, &root, self.schema)?;
        let previous = entries.iter().position(|e| e.identity() == me);
        let (last_set, last_time) = match previous {
            Some(at) => (Some(entries[at].set.clone()), entries[at].time.clone()),
            None => (None, None),
        };
        let mine = Entry {
            manager: self.manager.to_string(),
            operation: OPERATION_APPLY.to_string(),
            api_version: api_version(applied),
            time: last_time.clone(),
            subresource: self.subresource.to_string(),
            set: applied_set.clone(),
        };
        match previous {
            Some(at) => entries[at] = mine,
            None => entries.push(mine),
        }

        let new = match &last_set {
            Some(last) if !last.is_empty() => self.prune(&merged, &entries, last)?,
            _ => merged,
        };

        let comparison = compare(&live, &new, &root, self.schema)?;
        let changed = comparison.modified.union(&comparison.added);
        let mut conflicts = Vec::new();
        for entry in entries.iter().filter(|e| e.identity() != me) {
            for path in entry.set.intersection(&changed).paths() {
                conflicts.push((entry.identity(), entry.printed(), path));
            }
        }
        if !force && !conflicts.is_empty() {
            conflicts.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
            return Err(PatchError::Conflict(
                conflicts
                    .into_iter()
                    .map(|(_, manager, path)| ManagerConflict {
                        manager,
                        path: display_path(&path),
                    })
                    .collect(),
            ));
        }
        let taken = changed.union(&comparison.removed);
        let unowned = unowned_set();
        let object_changed = live != new;
        for entry in &mut entries {
            if entry.identity() == me {
                entry.set = entry.set.difference(&unowned);
                if object_changed || entry.time.is_none() {
                    entry.time = Some(self.now.to_string());
                }
            } else {
                entry.set = entry.set.difference(&taken);
            }
        }
        Ok(with_managed_fields(new, entries))
    }

    /// Removes from `merged` what this manager applied last time (`last`) and owns no
    /// longer, unless another manager owns it. The three passes are Kubernetes': remove all
    /// of `last`; add back what anyone owns; then remove only what was in `last`.
    fn prune(
        &self,
        merged: &Value,
        entries: &[Entry],
        last: &FieldSet,
    ) -> Result<Value, PatchError> {
        let root = self.root();
        let schema = self.schema;
        let last = ensure_named_fields(last, &root, schema);
        let without_last = remove_items(merged, &last, &root, schema);

        let merged_set = ensure_named_fields(&field_set(merged, &root, schema)?, &root, schema);
        let without_last_set =
            ensure_named_fields(&field_set(&without_last, &root, schema)?, &root, schema);
        let owned = entries
            .iter()
            .fold(FieldSet::new(), |all, e| all.union(&e.set));
        let owned = ensure_named_fields(&owned, &root, schema);
        let unclaimed = merged_set.difference(&without_last_set.union(&owned));
        let pruned = remove_items(merged, &unclaimed, &root, schema);

        let pruned_set = ensure_named_fields(&field_set(&pruned, &root, schema)?, &root, schema);
        let dangling = merged_set.difference(&pruned_set).intersection(&last);
        Ok(remove_items(merged, &dangling, &root, schema))
    }

    /// See [`record_update`].
    pub fn record_update(&self, old: Option<&Value>, new: &mut Value) {
        match self.try_record_update(old, new) {
            Ok(recorded) => *new = recorded,
            Err(_) => {
                if let Some(Value::Object(meta)) = new.get_mut("metadata") {
                    meta.remove("managedFields");
                }
            }
        }
    }

    fn try_record_update(&self, old: Option<&Value>, new: &Value) -> Result<Value, PatchError> {
        let (old_body, old_entries) = split_managed_fields(old);
        let requested = new.pointer("/metadata/managedFields");
        // A client may set managedFields; `[{}]` resets them; anything empty or undecodable
        // keeps the live object's, so clients that do not know about them cannot drop them.
        let mut entries = match requested {
            Some(Value::Array(items)) if is_reset(items) => Vec::new(),
            Some(v) => match decode_entries(v) {
                Ok(decoded) if !decoded.is_empty() => decoded,
                _ => old_entries,
            },
            None => old_entries,
        };
        let (new_body, _) = split_managed_fields(Some(new));
        let root = self.root();
        let comparison = compare(&old_body, &new_body, &root, self.schema)?;
        let changed = comparison.modified.union(&comparison.added);
        let taken = changed.union(&comparison.removed);
        let unowned = unowned_set();
        for entry in &mut entries {
            entry.set = entry.set.difference(&taken);
        }
        let mine = changed.difference(&unowned);
        if !mine.is_empty() {
            let me = Identity::new(
                self.manager,
                OPERATION_UPDATE,
                &api_version(&new_body),
                self.subresource,
            );
            match entries.iter_mut().find(|e| e.identity() == me) {
                Some(entry) => {
                    entry.set = entry.set.union(&mine);
                    entry.time = Some(self.now.to_string());
                }
                None => entries.push(Entry {
                    manager: self.manager.to_string(),
                    operation: OPERATION_UPDATE.to_string(),
                    api_version: api_version(&new_body),
                    time: Some(self.now.to_string()),
                    subresource: self.subresource.to_string(),
                    set: mine,
                }),
            }
        }
        Ok(with_managed_fields(new_body, entries))
    }
}

/// The object without `metadata.managedFields`, and its decoded entries (none if they do
/// not decode: Kubernetes also starts over rather than fail the write).
fn split_managed_fields(object: Option<&Value>) -> (Value, Vec<Entry>) {
    let mut body = object.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    let raw = match body.get_mut("metadata") {
        Some(Value::Object(meta)) => meta.remove("managedFields"),
        _ => None,
    };
    let entries = raw
        .map(|v| decode_entries(&v).unwrap_or_default())
        .unwrap_or_default();
    (body, entries)
}

fn is_reset(items: &[Value]) -> bool {
    matches!(items, [Value::Object(m)] if m.is_empty())
}

fn api_version(object: &Value) -> String {
    object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn unowned_set() -> FieldSet {
    let mut set = FieldSet::new();
    for path in UNOWNED_PATHS {
        let path: Vec<PathElement> = path.iter().map(|f| PathElement::field(f)).collect();
        set.insert(&path);
    }
    set
}

/// Who an entry belongs to: appliers are one manager across API versions, updaters one per
/// version (Kubernetes' manager identifier).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Identity {
    manager: String,
    operation: String,
    api_version: String,
    subresource: String,
}

impl Identity {
    fn new(manager: &str, operation: &str, api_version: &str, subresource: &str) -> Self {
        let api_version = if operation == OPERATION_APPLY {
            ""
        } else {
            api_version
        };
        Self {
            manager: manager.to_string(),
            operation: operation.to_string(),
            api_version: api_version.to_string(),
            subresource: subresource.to_string(),
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<String>,
    subresource: String,
    set: FieldSet,
}

impl Entry {
    fn identity(&self) -> Identity {
        Identity::new(
            &self.manager,
            &self.operation,
            &self.api_version,
            &self.subresource,
        )
    }

    /// As Kubernetes names a manager in conflicts.
    fn printed(&self) -> String {
        let mut out = Value::String(self.manager.clone()).to_string();
        if !self.subresource.is_empty() {
            out.push_str(&format!(
                " with subresource {}",
                Value::String(self.subresource.clone())
            ));
        }
        if self.operation == OPERATION_UPDATE {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }

    fn decode(value: &Value) -> Result<Entry, String> {
        let text = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let fields_type = text("fieldsType");
        if fields_type != FIELDS_TYPE_V1 {
            return Err(format!("unsupported fieldsType {fields_type:?}"));
        }
        let set = match value.get("fieldsV1") {
            Some(v) => FieldSet::from_fields_v1(v)?,
            None => FieldSet::new(),
        };
        Ok(Entry {
            manager: text("manager"),
            operation: text("operation"),
            api_version: text("apiVersion"),
            time: value
                .get("time")
                .and_then(Value::as_str)
                .map(str::to_string),
            subresource: text("subresource"),
            set,
        })
    }

    fn encode(&self) -> Value {
        let mut out = Map::new();
        out.insert("manager".into(), Value::String(self.manager.clone()));
        out.insert("operation".into(), Value::String(self.operation.clone()));
        out.insert("apiVersion".into(), Value::String(self.api_version.clone()));
        if let Some(time) = &self.time {
            out.insert("time".into(), Value::String(time.clone()));
        }
        out.insert("fieldsType".into(), Value::String(FIELDS_TYPE_V1.into()));
        out.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            out.insert(
                "subresource".into(),
                Value::String(self.subresource.clone()),
            );
        }
        Value::Object(out)
    }
}

fn decode_entries(value: &Value) -> Result<Vec<Entry>, String> {
    let Value::Array(items) = value else {
        return Err("managedFields must be a list".to_string());
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(items.len());
    for item in items {
        let entry = Entry::decode(item)?;
        // The same manager twice (hand-written managedFields): one entry owning both.
        match entries
            .iter_mut()
            .find(|e| e.identity() == entry.identity())
        {
            Some(existing) => existing.set = existing.set.union(&entry.set),
            None => entries.push(entry),
        }
    }
    Ok(entries)
}

/// Puts the entries, capped and sorted, into `object`'s metadata.
fn with_managed_fields(mut object: Value, entries: Vec<Entry>) -> Value {
    let mut entries: Vec<Entry> = entries.into_iter().filter(|e| !e.set.is_empty()).collect();
    cap_update_managers(&mut entries);
    entries.sort_by(|a, b| {
        (
            &a.operation,
            a.time.as_deref().unwrap_or(""),
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                b.time.as_deref().unwrap_or(""),
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let Value::Object(root) = &mut object else {
        return object;
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            let encoded = entries.iter().map(Entry::encode).collect();
            meta.insert("managedFields".into(), Value::Array(encoded));
        }
    }
    object
}

/// Merges the oldest `Update` entries into one [`ANCIENT_CHANGES_MANAGER`] entry per API
/// version until at most [`UPDATE_MANAGERS_MAX`] remain.
fn cap_update_managers(entries: &mut Vec<Entry>) {
    loop {
        let updates = entries
            .iter()
            .filter(|e| e.operation == OPERATION_UPDATE)
            .count();
        if updates <= UPDATE_MANAGERS_MAX {
            return;
        }
        let oldest = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.operation == OPERATION_UPDATE && e.manager != ANCIENT_CHANGES_MANAGER
            })
            .min_by(|(_, a), (_, b)| {
                (a.time.as_deref().unwrap_or(""), a.identity())
                    .cmp(&(b.time.as_deref().unwrap_or(""), b.identity()))
            })
            .map(|(at, _)| at);
        let Some(at) = oldest else {
            return;
        };
        let old = entries.remove(at);
        let bucket = Identity::new(
            ANCIENT_CHANGES_MANAGER,
            OPERATION_UPDATE,
            &old.api_version,
            "",
        );
        match entries.iter_mut().find(|e| e.identity() == bucket) {
            Some(existing) => {
                existing.set = existing.set.union(&old.set);
                existing.time = existing.time.clone().max(old.time);
            }
            None => entries.push(Entry {
                manager: ANCIENT_CHANGES_MANAGER.to_string(),
                subresource: String::new(),
                ..old
            }),
        }
    }
}

/// How a value is merged and owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ty {
    /// Owned and replaced whole: scalars, atomic lists and maps, untyped lists.
    Leaf,
    /// Merged and owned key by key.
    Object(Shape),
    /// A list of scalars merged as a set, each value owned.
    Set,
    /// A list of objects merged by key fields, each item owned.
    ListMap {
        keys: Vec<String>,
        defaults: Map<String, Value>,
        items: Shape,
    },
}

impl Ty {
    /// The type a field's facts give, before looking at a value (`None`: untyped object).
    fn of_field(info: Option<&FieldInfo>) -> Ty {
        let Some(info) = info else {
            return Ty::Object(Shape::Untyped);
        };
        match info.kind {
            FieldKind::Scalar => Ty::Leaf,
            FieldKind::Object | FieldKind::Map if info.map_atomic => Ty::Leaf,
            FieldKind::Object | FieldKind::Map => Ty::Object(Shape::of_value(Some(info))),
            FieldKind::List => match info.apply_list_type() {
                (ListType::Atomic, _) => Ty::Leaf,
                (ListType::Set, _) => Ty::Set,
                (ListType::Map, keys) => Ty::ListMap {
                    keys,
                    defaults: info.list_map_key_defaults.clone(),
                    items: Shape::of_items(Some(info)),
                },
            },
        }
    }

    /// The type of a value of a field: a value that does not have the declared shape (and
    /// every untyped list) is a leaf.
    fn of_value(info: Option<&FieldInfo>, value: &Value) -> Ty {
        match (Ty::of_field(info), value) {
            (ty @ Ty::Object(_), Value::Object(_)) => ty,
            (ty @ (Ty::Set | Ty::ListMap { .. }), Value::Array(_)) => ty,
            _ => Ty::Leaf,
        }
    }

    /// The type of a field whose value is `left` on one side and `right` on the other.
    fn of_pair(info: Option<&FieldInfo>, left: Option<&Value>, right: Option<&Value>) -> Ty {
        match (left, right) {
            (Some(l), Some(r)) => {
                let (tl, tr) = (Ty::of_value(info, l), Ty::of_value(info, r));
                if tl == tr { tl } else { Ty::Leaf }
            }
            (Some(v), None) | (None, Some(v)) => Ty::of_value(info, v),
            (None, None) => Ty::Leaf,
        }
    }

    /// The type below one path element of a set of this type (no value at hand).
    fn child(&self, element: &PathElement, schema: &dyn PatchSchema) -> Ty {
        match (self, element) {
            (Ty::Object(shape), PathElement::Field(name)) => {
                Ty::of_field(shape.field(schema, name).as_ref())
            }
            (Ty::ListMap { items, .. }, PathElement::Key(_)) => Ty::Object(items.clone()),
            _ => Ty::Leaf,
        }
    }
}

/// The path element of a list-map item: its key fields, defaults filled in.
fn item_key(
    item: &Value,
    keys: &[String],
    defaults: &Map<String, Value>,
) -> Result<PathElement, PatchError> {
    let Value::Object(map) = item else {
        return Err(PatchError::Invalid(format!(
            "associative list with keys {keys:?} has an element that is not an object: {item}"
        )));
    };
    let mut fields = Map::new();
    for key in keys {
        match map
            .get(key)
            .filter(|v| !v.is_null())
            .or_else(|| defaults.get(key))
        {
            Some(v) => {
                fields.insert(key.clone(), v.clone());
            }
            None => {
                return Err(PatchError::Invalid(format!(
                    "associative list with keys has an element that omits key field {key:?}"
                )));
            }
        }
    }
    Ok(PathElement::key(&fields))
}

/// Every path the value sets, by Kubernetes' rules: leaves, set values and list-map items
/// are members; an object field is a member itself only when it is null or empty, or is a
/// map entry rather than a named field.
fn field_set(value: &Value, ty: &Ty, schema: &dyn PatchSchema) -> Result<FieldSet, PatchError> {
    let mut set = FieldSet::new();
    collect_set(value, ty, schema, &mut Vec::new(), &mut set)?;
    Ok(set)
}

fn collect_set(
    value: &Value,
    ty: &Ty,
    schema: &dyn PatchSchema,
    path: &mut Vec<PathElement>,
    out: &mut FieldSet,
) -> Result<(), PatchError> {
    match (ty, value) {
        (Ty::Object(shape), Value::Object(map)) => {
            for (key, v) in map {
                let info = shape.field(schema, key);
                path.push(PathElement::field(key));
                collect_set(v, &Ty::of_value(info.as_ref(), v), schema, path, out)?;
                let empty = v.is_null() || v.as_object().is_some_and(Map::is_empty);
                if empty || !shape.is_named_field(schema, key) {
                    out.insert(path);
                }
                path.pop();
            }
        }
        (Ty::Set, Value::Array(items)) => {
            for item in items {
                path.push(PathElement::value(item));
                out.insert(path);
                path.pop();
            }
        }
        (
            Ty::ListMap {
                keys,
                defaults,
                items: shape,
            },
            Value::Array(items),
        ) => {
            for item in items {
                path.push(item_key(item, keys, defaults)?);
                collect_set(item, &Ty::Object(shape.clone()), schema, path, out)?;
                out.insert(path);
                path.pop();
            }
        }
        _ => out.insert(path),
    }
    Ok(())
}

/// `set` plus, as members, the named fields (not map keys or list items) that are only
/// prefixes in it, so that pruning can remove a struct a manager stopped setting.
fn ensure_named_fields(set: &FieldSet, ty: &Ty, schema: &dyn PatchSchema) -> FieldSet {
    let mut out = FieldSet::new();
    for member in set.members() {
        out.insert_member(member.clone());
    }
    for (element, child) in set.children() {
        if let (Ty::Object(shape), PathElement::Field(name)) = (ty, element)
            && shape.is_named_field(schema, name)
        {
            out.insert_member(element.clone());
        }
        let child = ensure_named_fields(child, &ty.child(element, schema), schema);
        out.insert_child(element.clone(), child);
    }
    out
}

/// `value` without the members of `set` (a member object or list item goes whole).
fn remove_items(value: &Value, set: &FieldSet, ty: &Ty, schema: &dyn PatchSchema) -> Value {
    match (ty, value) {
        (Ty::Object(shape), Value::Object(map)) => {
            let mut out = Map::new();
            for (key, v) in map {
                let element = PathElement::field(key);
                if set.has_member(&element) {
                    continue;
                }
                let kept = match set.child(&element) {
                    Some(child) => {
                        let info = shape.field(schema, key);
                        remove_items(v, child, &Ty::of_value(info.as_ref(), v), schema)
                    }
                    None => v.clone(),
                };
                out.insert(key.clone(), kept);
            }
            Value::Object(out)
        }
        (Ty::Set, Value::Array(items)) => Value::Array(
            items
                .iter()
                .filter(|item| !set.has_member(&PathElement::value(item)))
                .cloned()
                .collect(),
        ),
        (
            Ty::ListMap {
                keys,
                defaults,
                items: shape,
            },
            Value::Array(items),
        ) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                // An item without its keys cannot be named by a set: keep it.
                let Ok(element) = item_key(item, keys, defaults) else {
                    out.push(item.clone());
                    continue;
                };
                if set.has_member(&element) {
                    continue;
                }
                match set.child(&element) {
                    Some(child) => out.push(remove_items(
                        item,
                        child,
                        &Ty::Object(shape.clone()),
                        schema,
                    )),
                    None => out.push(item.clone()),
                }
            }
            Value::Array(out)
        }
        _ => value.clone(),
    }
}

/// What changed between two versions of an object, as sets of paths.
#[derive(Debug, Default)]
struct Comparison {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn compare(
    left: &Value,
    right: &Value,
    ty: &Ty,
    schema: &dyn PatchSchema,
) -> Result<Comparison, PatchError> {
    let mut out = Comparison::default();
    compare_node(
        Some(left),
        Some(right),
        ty,
        schema,
        &mut Vec::new(),
        &mut out,
    )?;
    Ok(out)
}

/// Kubernetes' comparison walk: a leaf is added, removed or modified; an object, list or
/// list item is itself added or removed when one side lacks it, and its contents are
/// compared below it.
fn compare_node(
    left: Option<&Value>,
    right: Option<&Value>,
    ty: &Ty,
    schema: &dyn PatchSchema,
    path: &mut Vec<PathElement>,
    out: &mut Comparison,
) -> Result<(), PatchError> {
    match ty {
        Ty::Leaf => {
            match (left, right) {
                (None, Some(_)) => out.added.insert(path),
                (Some(_), None) => out.removed.insert(path),
                (Some(l), Some(r)) if l != r => out.modified.insert(path),
                _ => {}
            }
            return Ok(());
        }
        Ty::Object(shape) => {
            let empty = Map::new();
            let l = left.and_then(Value::as_object).unwrap_or(&empty);
            let r = right.and_then(Value::as_object).unwrap_or(&empty);
            let keys: std::collections::BTreeSet<&String> = l.keys().chain(r.keys()).collect();
            for key in keys {
                let (lv, rv) = (l.get(key), r.get(key));
                let info = shape.field(schema, key);
                path.push(PathElement::field(key));
                compare_node(
                    lv,
                    rv,
                    &Ty::of_pair(info.as_ref(), lv, rv),
                    schema,
                    path,
                    out,
                )?;
                path.pop();
            }
        }
        Ty::Set => {
            let l = index_set(left);
            let r = index_set(right);
            for element in l.keys().filter(|e| !r.contains_key(*e)) {
                path.push(element.clone());
                out.removed.insert(path);
                path.pop();
            }
            for element in r.keys().filter(|e| !l.contains_key(*e)) {
                path.push(element.clone());
                out.added.insert(path);
                path.pop();
            }
        }
        Ty::ListMap {
            keys,
            defaults,
            items,
        } => {
            let l = index_list_map(left, keys, defaults)?;
            let r = index_list_map(right, keys, defaults)?;
            let elements: std::collections::BTreeSet<&PathElement> =
                l.keys().chain(r.keys()).collect();
            let item_ty = Ty::Object(items.clone());
            for element in elements {
                path.push(element.clone());
                compare_node(
                    l.get(element).copied(),
                    r.get(element).copied(),
                    &item_ty,
                    schema,
                    path,
                    out,
                )?;
                path.pop();
            }
        }
    }
    match (left, right) {
        (None, Some(_)) => out.added.insert(path),
        (Some(_), None) => out.removed.insert(path),
        _ => {}
    }
    Ok(())
}

fn index_set(list: Option<&Value>) -> BTreeMap<PathElement, &Value> {
    let items = list
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    items.iter().map(|v| (PathElement::value(v), v)).collect()
}

/// A list-map's items by key; the first of duplicates wins.
fn index_list_map<'v>(
    list: Option<&'v Value>,
    keys: &[String],
    defaults: &Map<String, Value>,
) -> Result<BTreeMap<PathElement, &'v Value>, PatchError> {
    let items = list
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for item in items {
        out.entry(item_key(item, keys, defaults)?).or_insert(item);
    }
    Ok(out)
}

/// Merges an applied value into a live one.
fn merge_node(
    live: Option<&Value>,
    applied: &Value,
    ty: &Ty,
    schema: &dyn PatchSchema,
) -> Result<Value, PatchError> {
    match (ty, applied) {
        (Ty::Object(shape), Value::Object(config)) => {
            let mut out = live.and_then(Value::as_object).cloned().unwrap_or_default();
            for (key, value) in config {
                if value.is_null() {
                    // Applying null owns the field's absence.
                    out.remove(key);
                    continue;
                }
                let info = shape.field(schema, key);
                let current = out.get(key);
                let child_ty = Ty::of_pair(info.as_ref(), current, Some(value));
                let merged = merge_node(current, value, &child_ty, schema)?;
                out.insert(key.clone(), merged);
            }
            Ok(Value::Object(out))
        }
        (Ty::Set, Value::Array(config)) => {
            let live_items = live
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let l: Vec<_> = live_items
                .iter()
                .map(|v| (PathElement::value(v), v))
                .collect();
            let r: Vec<_> = config.iter().map(|v| (PathElement::value(v), v)).collect();
            Ok(Value::Array(
                interleave(&l, &r)
                    .into_iter()
                    .filter_map(|(lv, rv)| rv.or(lv).cloned())
                    .collect(),
            ))
        }
        (
            Ty::ListMap {
                keys,
                defaults,
                items,
            },
            Value::Array(config),
        ) => {
            let live_items = live
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let (l, r) = (
                keyed_items(live_items, keys, defaults)?,
                keyed_items(config, keys, defaults)?,
            );
            let item_ty = Ty::Object(items.clone());
            let mut out = Vec::with_capacity(l.len().max(r.len()));
            for (lv, rv) in interleave(&l, &r) {
                match (lv, rv) {
                    (lv, Some(rv)) => out.push(merge_node(lv, rv, &item_ty, schema)?),
                    (Some(lv), None) => out.push(lv.clone()),
                    (None, None) => {}
                }
            }
            Ok(Value::Array(out))
        }
        _ => Ok(applied.clone()),
    }
}

fn keyed_items<'v>(
    list: &'v [Value],
    keys: &[String],
    defaults: &Map<String, Value>,
) -> Result<Vec<(PathElement, &'v Value)>, PatchError> {
    list.iter()
        .map(|v| Ok((item_key(v, keys, defaults)?, v)))
        .collect()
}

/// The order of a merged list, as Kubernetes' merge walks it: applied items keep the
/// applied order, live-only items keep their place among the live items around them, and
/// a live item that the configuration moved waits until its turn in the applied order.
fn interleave<'v>(
    live: &[(PathElement, &'v Value)],
    applied: &[(PathElement, &'v Value)],
) -> Vec<(Option<&'v Value>, Option<&'v Value>)> {
    let live_by_key: BTreeMap<&PathElement, &'v Value> =
        live.iter().rev().map(|(e, v)| (e, *v)).collect();
    let applied_keys: std::collections::BTreeSet<&PathElement> =
        applied.iter().map(|(e, _)| e).collect();
    // The applied items the live list also has, in applied order.
    let mut shared = applied
        .iter()
        .map(|(e, _)| e)
        .filter(|e| live_by_key.contains_key(e))
        .peekable();
    let mut next_shared = shared.next();
    let mut emitted = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(live.len().max(applied.len()));
    let (mut l, mut r) = (0, 0);
    while l < live.len() || r < applied.len() {
        if l < live.len() && r < applied.len() {
            let element = &live[l].0;
            if *element == applied[r].0 {
                emitted.insert(element);
                out.push((live_by_key.get(element).copied(), Some(applied[r].1)));
                l += 1;
                r += 1;
                next_shared = shared.next();
                continue;
            }
            if applied_keys.contains(element) && next_shared.is_some_and(|n| n != element) {
                l += 1;
                continue;
            }
        }
        if l < live.len() {
            let element = &live[l].0;
            if !applied_keys.contains(element) {
                out.push((Some(live[l].1), None));
                l += 1;
                continue;
            }
            if emitted.contains(element) {
                l += 1;
                continue;
            }
        }
        if r < applied.len() {
            let element = &applied[r].0;
            emitted.insert(element);
            out.push((live_by_key.get(element).copied(), Some(applied[r].1)));
            r += 1;
            if next_shared == Some(element) {
                next_shared = shared.next();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::SchemaTable;
    use crate::status::ApiError;
    use serde_json::json;

    const T1: &str = "2025-01-01T00:00:01Z";
    const T2: &str = "2025-01-01T00:00:02Z";
    const T3: &str = "2025-01-01T00:00:03Z";

    fn schema() -> SchemaTable {
        crate::patch::strategic::tests::schema()
    }

    fn manager<'a>(schema: &'a SchemaTable, name: &'a str, now: &'a str) -> FieldManager<'a> {
        FieldManager {
            schema,
            definition: "Deployment",
            manager: name,
            subresource: "",
            now,
        }
    }

    fn deployment(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": spec})
    }

    fn nginx_config() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx"}]},
                },
            },
        })
    }

    fn entries(object: &Value) -> Vec<(String, String, Value)> {
        object["metadata"]["managedFields"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|e| {
                        (
                            e["manager"].as_str().unwrap_or_default().to_string(),
                            e["operation"].as_str().unwrap_or_default().to_string(),
                            e["fieldsV1"].clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn owns(object: &Value, manager: &str, path: &[&str]) -> bool {
        let Some(list) = object["metadata"]["managedFields"].as_array() else {
            return false;
        };
        list.iter().filter(|e| e["manager"] == manager).any(|e| {
            let set = FieldSet::from_fields_v1(&e["fieldsV1"]).expect("valid");
            let path: Vec<PathElement> = path
                .iter()
                .map(|p| PathElement::decode(p).expect("element"))
                .collect();
            set.contains(&path)
        })
    }

    // Reference: the managedFields Kubernetes records for `kubectl apply --server-side`.
    #[test]
    fn apply_creates_and_records_kubernetes_fields_v1() {
        let schema = schema();
        let out = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mut expected = nginx_config();
        expected["metadata"]["managedFields"] = json!([{
            "manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1", "time": T1,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {
                            "k:{\"name\":\"nginx\"}": {".": {}, "f:image": {}, "f:name": {}}
                        }},
                    },
                },
            },
        }]);
        assert_eq!(out, expected);
    }

    #[test]
    fn changing_another_managers_field_conflicts_unless_forced() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mine = deployment(json!({"replicas": 3}));
        let err = server_side_apply(&manager(&schema, "hpa", T2), Some(&live), &mine, false)
            .expect_err("replicas belongs to kubectl");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"
        );
        let status: ApiError = err.into();
        assert_eq!((status.code, status.reason), (409, "Conflict"));
        assert_eq!(status.causes[0].reason, "FieldManagerConflict");
        assert_eq!(status.causes[0].field, ".spec.replicas");
        assert_eq!(status.causes[0].message, "conflict with \"kubectl\"");

        let forced = server_side_apply(&manager(&schema, "hpa", T2), Some(&live), &mine, true)
            .expect("force takes the field");
        assert_eq!(forced["spec"]["replicas"], 3);
        assert!(owns(&forced, "hpa", &["f:spec", "f:replicas"]));
        assert!(!owns(&forced, "kubectl", &["f:spec", "f:replicas"]));
        assert!(owns(&forced, "kubectl", &["f:spec", "f:selector"]));
    }

    #[test]
    fn applying_the_same_value_shares_the_field() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let shared = deployment(json!({"replicas": 1}));
        let out = server_side_apply(&manager(&schema, "other", T2), Some(&live), &shared, false)
            .expect("no change, no conflict");
        assert!(owns(&out, "kubectl", &["f:spec", "f:replicas"]));
        assert!(owns(&out, "other", &["f:spec", "f:replicas"]));
        // The object did not change, so it is the same object with one more entry.
        assert_eq!(out["spec"], live["spec"]);
    }

    #[test]
    fn fields_dropped_from_a_config_are_released_and_deleted_if_unowned() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mut smaller = nginx_config();
        smaller["metadata"] = json!({"name": "web"});
        smaller["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("replicas");
        let out = server_side_apply(
            &manager(&schema, "kubectl", T2),
            Some(&live),
            &smaller,
            false,
        )
        .expect("applies");
        assert_eq!(
            out["metadata"].get("labels"),
            None,
            "unowned label and its map are pruned"
        );
        assert_eq!(out["spec"].get("replicas"), None);
        assert!(!owns(&out, "kubectl", &["f:spec", "f:replicas"]));
        assert_eq!(out["spec"]["template"], nginx_config()["spec"]["template"]);
    }

    #[test]
    fn released_fields_another_manager_owns_stay() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let labels = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web", "labels": {"app": "web"}}});
        let live = server_side_apply(
            &manager(&schema, "labeller", T2),
            Some(&live),
            &labels,
            false,
        )
        .expect("shares the label");
        let mut smaller = nginx_config();
        smaller["metadata"] = json!({"name": "web"});
        let out = server_side_apply(
            &manager(&schema, "kubectl", T3),
            Some(&live),
            &smaller,
            false,
        )
        .expect("applies");
        assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));
        assert!(owns(&out, "labeller", &["f:metadata", "f:labels", "f:app"]));
        assert!(!owns(&out, "kubectl", &["f:metadata", "f:labels", "f:app"]));
    }

    #[test]
    fn list_map_items_are_owned_per_manager() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let sidecar = deployment(
            json!({"template": {"spec": {"containers": [{"name": "envoy", "image": "envoy"}]}}}),
        );
        let live = server_side_apply(
            &manager(&schema, "injector", T2),
            Some(&live),
            &sidecar,
            false,
        )
        .expect("adds its own item");
        let names = |o: &Value| -> Vec<String> {
            o["spec"]["template"]["spec"]["containers"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(names(&live), ["nginx", "envoy"]);
        // kubectl re-applies its config: the injector's container stays.
        let live = server_side_apply(
            &manager(&schema, "kubectl", T3),
            Some(&live),
            &nginx_config(),
            false,
        )
        .expect("re-applies");
        assert_eq!(names(&live), ["nginx", "envoy"]);
        // The injector stops applying its container: it goes, nginx stays.
        let none = deployment(json!({"replicas": 1}));
        let out = server_side_apply(&manager(&schema, "injector", T3), Some(&live), &none, false)
            .expect("applies");
        assert_eq!(names(&out), ["nginx"]);
    }

    #[test]
    fn sets_unite_and_atomic_lists_replace() {
        let schema = schema();
        let first = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "finalizers": ["a"]},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["-x", "-y"]}]}}}});
        let live =
            server_side_apply(&manager(&schema, "one", T1), None, &first, false).expect("creates");
        let second = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "finalizers": ["b"]}});
        let out = server_side_apply(&manager(&schema, "two", T2), Some(&live), &second, false)
            .expect("set items do not conflict");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert!(owns(
            &out,
            "two",
            &["f:metadata", "f:finalizers", "v:\"b\""]
        ));
        let args = deployment(
            json!({"template": {"spec": {"containers": [{"name": "c", "args": ["-z"]}]}}}),
        );
        let err = server_side_apply(&manager(&schema, "two", T3), Some(&out), &args, false)
            .expect_err("atomic list owned whole by one");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"one\": .spec.template.spec.containers[name=\"c\"].args"
        );
    }

    #[test]
    fn updates_take_ownership_and_conflict_with_later_applies() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(
            &manager(&schema, "kube-controller-manager", T2),
            Some(&live),
            &mut scaled,
        );
        assert_eq!(
            entries(&scaled),
            vec![
                (
                    "kubectl".to_string(),
                    "Apply".to_string(),
                    live["metadata"]["managedFields"][0]["fieldsV1"]
                        .as_object()
                        .map(|m| {
                            let mut v = Value::Object(m.clone());
                            v["f:spec"]
                                .as_object_mut()
                                .expect("spec")
                                .remove("f:replicas");
                            v
                        })
                        .expect("fields")
                ),
                (
                    "kube-controller-manager".to_string(),
                    "Update".to_string(),
                    json!({"f:spec": {"f:replicas": {}}})
                ),
            ]
        );
        let mut config = nginx_config();
        config["spec"]["replicas"] = json!(2);
        let relabel = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                             "metadata": {"name": "web", "labels": {"app": "other"}}});
        let live = server_side_apply(
            &manager(&schema, "other", T2),
            Some(&scaled),
            &relabel,
            true,
        )
        .expect("forced");
        let err = server_side_apply(
            &manager(&schema, "kubectl", T3),
            Some(&live),
            &config,
            false,
        )
        .expect_err("two owners changed");
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"kube-controller-manager\" using apps/v1:\n- .spec.replicas\nconflicts with \"other\":\n- .metadata.labels.app"
        );
    }

    #[test]
    fn create_by_update_records_every_field() {
        let schema = schema();
        let mut created =
            deployment(json!({"replicas": 1, "template": {"metadata": {"labels": {"a": "b"}}}}));
        record_update(&manager(&schema, "kubectl-create", T1), None, &mut created);
        assert_eq!(
            entries(&created),
            vec![(
                "kubectl-create".to_string(),
                "Update".to_string(),
                json!({"f:spec": {".": {}, "f:replicas": {}, "f:template": {".": {}, "f:metadata": {".": {}, "f:labels": {".": {}, "f:a": {}}}}}}),
            )]
        );
        assert_eq!(
            created["metadata"]["managedFields"][0]["apiVersion"],
            "apps/v1"
        );
        assert_eq!(created["metadata"]["managedFields"][0]["time"], T1);
    }

    #[test]
    fn updates_that_change_nothing_record_nothing_and_reset_clears() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mut same = live.clone();
        record_update(&manager(&schema, "noop", T2), Some(&live), &mut same);
        assert_eq!(same, live);
        let mut reset = live.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        record_update(&manager(&schema, "noop", T2), Some(&live), &mut reset);
        assert_eq!(reset["metadata"].get("managedFields"), None);
    }

    #[test]
    fn unkeyed_items_clear_managed_fields_on_update() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let mut broken = live.clone();
        broken["spec"]["template"]["spec"]["containers"] = json!([{"image": "no-name"}]);
        record_update(&manager(&schema, "x", T2), Some(&live), &mut broken);
        assert_eq!(broken["metadata"].get("managedFields"), None);
        let err = server_side_apply(
            &manager(&schema, "x", T2),
            Some(&live),
            &deployment(json!({"template": {"spec": {"containers": [{"image": "i"}]}}})),
            false,
        )
        .expect_err("apply needs keys");
        assert!(
            matches!(err, PatchError::Invalid(ref m) if m.contains("omits key field \"name\""))
        );
    }

    #[test]
    fn list_map_key_defaults_identify_items() {
        let schema = schema();
        let with_protocol = deployment(json!({"template": {"spec": {"containers": [
            {"name": "c", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}));
        let live = server_side_apply(&manager(&schema, "a", T1), None, &with_protocol, false)
            .expect("creates");
        let without = deployment(json!({"template": {"spec": {"containers": [
            {"name": "c", "ports": [{"containerPort": 80, "name": "http"}]}]}}}));
        let out = server_side_apply(&manager(&schema, "b", T2), Some(&live), &without, false)
            .expect("same item");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}])
        );
    }

    #[test]
    fn noop_apply_keeps_the_time_and_entries_sort_like_kubernetes() {
        let schema = schema();
        let live = server_side_apply(
            &manager(&schema, "kubectl", T1),
            None,
            &nginx_config(),
            false,
        )
        .expect("creates");
        let again = server_side_apply(
            &manager(&schema, "kubectl", T3),
            Some(&live),
            &nginx_config(),
            false,
        )
        .expect("no-op");
        assert_eq!(again, live);
        let mut updated = again.clone();
        updated["metadata"]["annotations"] = json!({"x": "y"});
        record_update(
            &manager(&schema, "a-updater", T2),
            Some(&again),
            &mut updated,
        );
        let labels = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"z": "1"}}});
        let out = server_side_apply(
            &manager(&schema, "b-applier", T2),
            Some(&updated),
            &labels,
            false,
        )
        .expect("applies");
        let order: Vec<(String, String)> =
            entries(&out).into_iter().map(|(m, o, _)| (m, o)).collect();
        // Operation first (Apply < Update), then time, then manager.
        assert_eq!(
            order,
            [
                ("kubectl".to_string(), "Apply".to_string()),
                ("b-applier".to_string(), "Apply".to_string()),
                ("a-updater".to_string(), "Update".to_string()),
            ]
        );
    }

    #[test]
    fn update_managers_are_capped() {
        let mut list = Vec::new();
        for i in 0..12 {
            let mut set = FieldSet::new();
            set.insert(&[
                PathElement::field("spec"),
                PathElement::field(&format!("f{i}")),
            ]);
            list.push(Entry {
                manager: format!("u{i:02}"),
                operation: OPERATION_UPDATE.to_string(),
                api_version: "v1".to_string(),
                time: Some(format!("2025-01-01T00:00:{i:02}Z")),
                subresource: String::new(),
                set,
            });
        }
        let out = with_managed_fields(json!({}), list);
        let managed = out["metadata"]["managedFields"]
            .as_array()
            .expect("entries");
        assert_eq!(managed.len(), UPDATE_MANAGERS_MAX);
        assert_eq!(managed[0]["manager"], ANCIENT_CHANGES_MANAGER);
        assert_eq!(managed[0]["time"], "2025-01-01T00:00:02Z");
        assert_eq!(
            managed[0]["fieldsV1"],
            json!({"f:spec": {"f:f0": {}, "f:f1": {}, "f:f2": {}}})
        );
        assert_eq!(managed[1]["manager"], "u03");
    }

    #[test]
    fn applied_managed_fields_are_refused() {
        let schema = schema();
        let mut config = nginx_config();
        config["metadata"]["managedFields"] = json!([]);
        let err = server_side_apply(&manager(&schema, "k", T1), None, &config, false)
            .expect_err("refused");
        assert_eq!(
            err,
            PatchError::BadRequest("metadata.managedFields must be nil".into())
        );
        assert!(matches!(
            parse_apply_body(b"a: b"),
            Err(PatchError::Decode(_))
        ));
        assert_eq!(
            parse_apply_body(b"{\"a\":1}").expect("json is yaml"),
            json!({"a": 1})
        );
    }

    #[test]
    fn untyped_objects_merge_granularly_and_lists_atomically() {
        let schema = SchemaTable::new();
        let fm = FieldManager {
            schema: &schema,
            definition: "Unknown",
            manager: "a",
            subresource: "",
            now: T1,
        };
        let live = fm
            .apply(
                None,
                &json!({"spec": {"x": {"y": 1}, "list": [1, 2]}}),
                false,
            )
            .expect("creates");
        assert_eq!(
            live["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:spec": {".": {}, "f:list": {}, "f:x": {".": {}, "f:y": {}}}})
        );
        let fm_b = FieldManager {
            manager: "b",
            now: T2,
            ..fm
        };
        let out = fm_b
            .apply(Some(&live), &json!({"spec": {"x": {"z": 2}}}), false)
            .expect("merges");
        assert_eq!(out["spec"], json!({"x": {"y": 1, "z": 2}, "list": [1, 2]}));
    }
}
