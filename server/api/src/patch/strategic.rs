//! `application/strategic-merge-patch+json`: a JSON merge patch that knows, per field,
//! whether a list is replaced or merged item by item.
//!
//! The rules are Kubernetes' (`apimachinery/pkg/util/strategicpatch`, applying side):
//! - objects merge key by key; `null` deletes a key; a field with `patchStrategy=replace`
//!   is replaced whole;
//! - lists are replaced unless the field has `patchStrategy=merge`: lists of objects then
//!   merge by `patchMergeKey`, lists of scalars as sets;
//! - `$patch: replace` in an object replaces it, `$patch: delete` empties it; in a list
//!   item, `{"$patch": "replace"}` makes the list exactly the other items and
//!   `{"$patch": "delete", <key>: v}` removes the item with that key;
//! - `$retainKeys: [...]` drops every key of the live object not listed (a union type such
//!   as a Deployment's `strategy` switching from `RollingUpdate` to `Recreate`);
//! - `$deleteFromPrimitiveList/<field>: [...]` removes values from a merged scalar list;
//! - `$setElementOrder/<field>: [...]` gives the order of a merged list.
//!
//! The trick carried here (`docs/tricks.md` #21, `$setElementOrder`): merging by key loses
//! order, so the result is split into the items the patch names and the items only the
//! server has; each part is sorted by its own order (the patch's, the live object's), and
//! the two sorted parts are interleaved, a server-only item going before a patch item only
//! when the live list had it there.
//!
//! Where Kubernetes' behaviour is an accident this module differs, and says so at the spot:
//! malformed directives are 400 (Kubernetes answers several with 500), and values new to
//! the object are stored without the directives they carry.

use serde_json::{Map, Value};

use super::{FieldInfo, PatchError, PatchSchema, Shape, parse_body};

/// The key of the `$patch` directive.
const DIRECTIVE_MARKER: &str = "$patch";
/// The key of the `$retainKeys` directive.
const RETAIN_KEYS: &str = "$retainKeys";
/// `$deleteFromPrimitiveList/<field>`: values to remove from a merged scalar list.
const DELETE_FROM_PRIMITIVE_LIST_PREFIX: &str = "$deleteFromPrimitiveList/";
/// `$setElementOrder/<field>`: the order of a merged list.
const SET_ELEMENT_ORDER_PREFIX: &str = "$setElementOrder/";

/// Applies a strategic merge patch body to `current`, an object of `definition`.
pub fn apply(
    current: &Value,
    patch: &[u8],
    schema: &dyn PatchSchema,
    definition: &str,
) -> Result<Value, PatchError> {
    let patch = parse_body(patch)?;
    strategic_merge(current, &patch, schema, definition)
}

/// Applies a decoded strategic merge patch to `current`, an object of `definition`.
pub fn strategic_merge(
    current: &Value,
    patch: &Value,
    schema: &dyn PatchSchema,
    definition: &str,
) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Decode(
            "a strategic merge patch must be a JSON object".to_string(),
        ));
    };
    let original = match current {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let merged = merge_map(original, patch.clone(), &Shape::root(definition), schema)?;
    Ok(Value::Object(merged))
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    shape: &Shape,
    schema: &dyn PatchSchema,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE_MARKER) {
        return match directive.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE_MARKER);
                Ok(strip_directives_map(patch))
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(bad_patch_type(directive, &patch)),
        };
    }
    apply_retain_keys(&mut original, &mut patch)?;
    merge_ordered_lists(&mut original, &mut patch, shape, schema)?;

    // serde_json's map is sorted, so `$deleteFromPrimitiveList/x` is handled before `x`'s
    // additions: a value both added and deleted ends up added, the same every time
    // (Kubernetes iterates a Go map, so for it the order is random).
    for (patch_key, patch_value) in patch {
        let (key, is_delete_list) = match patch_key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
        {
            Some("") => return Err(bad_primitive_list()),
            Some(field) => (field.to_string(), true),
            None if patch_key.starts_with("$deleteFromPrimitiveList") => {
                return Err(bad_primitive_list());
            }
            None => (patch_key, false),
        };
        if patch_value.is_null() {
            original.remove(&key);
            continue;
        }
        let Some(original_value) = original.get_mut(&key) else {
            if !is_delete_list && let Some(v) = new_value(patch_value) {
                original.insert(key, v);
            }
            continue;
        };
        if json_kind(original_value) != json_kind(&patch_value) {
            if !is_delete_list {
                match new_value(patch_value) {
                    Some(v) => *original_value = v,
                    None => {
                        original.remove(&key);
                    }
                }
            }
            continue;
        }
        let info = shape.field(schema, &key);
        let merged = match (original_value.take(), patch_value) {
            (Value::Object(o), Value::Object(p)) => {
                if info.as_ref().is_some_and(|i| i.strategy_replace) {
                    Value::Object(p)
                } else {
                    Value::Object(merge_map(o, p, &Shape::of_value(info.as_ref()), schema)?)
                }
            }
            (Value::Array(o), Value::Array(p)) => Value::Array(merge_list_field(
                o,
                p,
                &key,
                info.as_ref(),
                is_delete_list,
                schema,
            )?),
            (_, p) => p,
        };
        *original_value = merged;
    }
    Ok(original)
}

/// A list field: merged if its strategy says so, replaced otherwise.
fn merge_list_field(
    original: Vec<Value>,
    patch: Vec<Value>,
    field: &str,
    info: Option<&FieldInfo>,
    is_delete_list: bool,
    schema: &dyn PatchSchema,
) -> Result<Vec<Value>, PatchError> {
    match info {
        Some(info) if info.strategy_merge => {
            merge_list(original, patch, field, info, is_delete_list, schema)
        }
        // Kubernetes would store the deletion list itself as the new value of a list that
        // is not merged; removing the listed values is what the directive means.
        _ if is_delete_list => delete_values(original, &patch),
        _ => Ok(patch),
    }
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    field: &str,
    info: &FieldInfo,
    is_delete_list: bool,
    schema: &dyn PatchSchema,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let of_objects = element_kind(&original, &patch)? == JsonKind::Object;
    if !of_objects {
        if is_delete_list {
            return delete_values(original, &patch);
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(&patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (patch_items, server_only) = partition(merged, &patch, None);
        return normalize_element_order(patch_items, server_only, &patch, &original, None);
    }
    if is_delete_list {
        return Err(bad_primitive_list());
    }
    let Some(key) = info.patch_merge_key.as_deref() else {
        return Err(PatchError::BadRequest(format!(
            "cannot merge lists without merge key for {field}"
        )));
    };
    let (original, patch) = apply_list_directives(original, patch, key)?;
    let item_shape = Shape::of_items(Some(info));
    let mut merged = original.clone();
    for item in &patch {
        let Some(item_map) = item.as_object() else {
            return Err(mixed_kinds());
        };
        let Some(wanted) = item_map.get(key) else {
            return Err(no_merge_key(item, key));
        };
        match merged.iter().position(|o| o.get(key) == Some(wanted)) {
            Some(index) => {
                let existing = match merged[index].take() {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                merged[index] =
                    Value::Object(merge_map(existing, item_map.clone(), &item_shape, schema)?);
            }
            None => {
                if let Some(v) = new_value(item.clone()) {
                    merged.push(v);
                }
            }
        }
    }
    let (patch_items, server_only) = partition(merged, &patch, Some(key));
    normalize_element_order(patch_items, server_only, &patch, &original, Some(key))
}

/// Handles the `$patch` items of a merged list of objects: deletions are applied to the
/// original, a `replace` makes the other items the whole list. Returns the original and
/// the patch items left to merge.
fn apply_list_directives(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut rest = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Some(directive) = item.get(DIRECTIVE_MARKER) else {
            rest.push(item);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let Some(wanted) = item.get(key) else {
                    return Err(no_merge_key(&item, key));
                };
                original.retain(|o| o.get(key) != Some(wanted));
            }
            // Keep going: the other `$patch` items are pruned from the patch all the same.
            Some("replace") => replace = true,
            Some("merge") => {
                return Err(PatchError::BadRequest(
                    "merging lists cannot yet be specified in the patch".to_string(),
                ));
            }
            _ => {
                let map = item.as_object().cloned().unwrap_or_default();
                return Err(bad_patch_type(directive, &map));
            }
        }
    }
    if replace {
        Ok((rest, Vec::new()))
    } else {
        Ok((original, rest))
    }
}

/// Processes every `$setElementOrder/<field>` of `patch`: the field's list is merged now
/// (and removed from the patch) and put in the directive's order.
fn merge_ordered_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    shape: &Shape,
    schema: &dyn PatchSchema,
) -> Result<(), PatchError> {
    let directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with("$setElementOrder"))
        .cloned()
        .collect();
    for directive in directives {
        let order = patch.remove(&directive).unwrap_or(Value::Null);
        let field = match directive.strip_prefix(SET_ELEMENT_ORDER_PREFIX) {
            Some(field) if !field.is_empty() => field.to_string(),
            _ => return Err(bad_set_element_order()),
        };
        let Value::Array(order) = order else {
            return Err(bad_set_element_order());
        };
        let original_list = match original.get(&field) {
            None => None,
            Some(Value::Array(list)) => Some(list.clone()),
            Some(_) => return Err(bad_set_element_order()),
        };
        let patch_list = match patch.get(&field) {
            None => None,
            Some(Value::Array(list)) => Some(list.clone()),
            Some(_) => return Err(bad_set_element_order()),
        };
        let info = shape.field(schema, &field);
        let key = info.as_ref().and_then(|i| i.patch_merge_key.as_deref());
        validate_order(patch_list.as_deref().unwrap_or_default(), &order, key)?;

        let merged = match (&original_list, patch_list) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => match new_value(Value::Array(p)) {
                Some(Value::Array(v)) => v,
                _ => Vec::new(),
            },
            (Some(o), Some(p)) => {
                merge_list_field(o.clone(), p, &field, info.as_ref(), false, schema)?
            }
            (None, None) => continue,
        };
        let (patch_items, server_only) = partition(merged, &order, key);
        let live = original_list.unwrap_or_default();
        let ordered = normalize_element_order(patch_items, server_only, &order, &live, key)?;
        original.insert(field.clone(), Value::Array(ordered));
        patch.remove(&field);
    }
    Ok(())
}

/// The patch list's items (deletions and other `$patch` items aside) must appear in the
/// `$setElementOrder` list, in the same relative order.
fn validate_order(
    patch_list: &[Value],
    order: &[Value],
    key: Option<&str>,
) -> Result<(), PatchError> {
    if patch_list.is_empty() || order.is_empty() {
        return Ok(());
    }
    let items: Vec<&Value> = patch_list
        .iter()
        .filter(|item| item.get(DIRECTIVE_MARKER).is_none())
        .collect();
    let (mut p, mut o) = (0, 0);
    while p < items.len() && o < order.len() {
        if same_item(items[p], &order[o], key)? {
            p += 1;
        }
        o += 1;
    }
    if p < items.len() {
        return Err(PatchError::BadRequest(format!(
            "the order in patch list:\n{}\n doesn't match $setElementOrder list:\n{}",
            Value::Array(patch_list.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

fn same_item(left: &Value, right: &Value, key: Option<&str>) -> Result<bool, PatchError> {
    let Some(key) = key else {
        return Ok(left == right);
    };
    let l = left.get(key).ok_or_else(|| no_merge_key(left, key))?;
    let r = right.get(key).ok_or_else(|| no_merge_key(right, key))?;
    Ok(l == r)
}

/// Splits `items` into those present in `by` (by merge key, or by value without one) and
/// the rest, each in its original order.
fn partition(items: Vec<Value>, by: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    items
        .into_iter()
        .partition(|item| position(by, item, key).is_some())
}

/// Where `item` is in `list`, matched by merge key (or by value without one).
fn position(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        None => list.iter().position(|v| v == item),
        Some(key) => {
            let wanted = item.get(key)?;
            list.iter().position(|v| v.get(key) == Some(wanted))
        }
    }
}

/// Sorts the patch items by `patch_order` and the server-only items by `server_order`,
/// then interleaves them: a server-only item goes before a patch item only when both are
/// in the live list and it came first there.
fn normalize_element_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    if let Some(key) = key {
        for item in patch_items.iter().chain(&server_only).chain(patch_order) {
            if item.get(key).is_none() {
                return Err(no_merge_key(item, key));
            }
        }
    }
    // Stable sorts, items missing from the order list last, as they were.
    patch_items.sort_by_key(|item| position(patch_order, item, key).unwrap_or(usize::MAX));
    server_only.sort_by_key(|item| position(server_order, item, key).unwrap_or(usize::MAX));

    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut server = server_only.into_iter().peekable();
    let mut patched = patch_items.into_iter().peekable();
    loop {
        let take_server = match (server.peek(), patched.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(s), Some(p)) => {
                match (
                    position(server_order, s, key),
                    position(server_order, p, key),
                ) {
                    (Some(si), Some(pi)) => si < pi,
                    _ => false,
                }
            }
        };
        let next = if take_server {
            server.next()
        } else {
            patched.next()
        };
        out.extend(next);
    }
    Ok(out)
}

/// `original` without the values listed in `to_delete`.
fn delete_values(mut original: Vec<Value>, to_delete: &[Value]) -> Result<Vec<Value>, PatchError> {
    original.retain(|v| !to_delete.contains(v));
    Ok(original)
}

/// `$retainKeys`: keep only the listed keys of the live object; every key the patch sets
/// must be listed.
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), PatchError> {
    let Some(retain) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(bad_retain_keys());
    };
    let listed = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    for (key, value) in patch.iter() {
        if value.is_null()
            || key.starts_with("$deleteFromPrimitiveList")
            || key.starts_with("$setElementOrder")
        {
            continue;
        }
        if !listed(key) {
            return Err(bad_retain_keys());
        }
    }
    original.retain(|k, _| listed(k));
    Ok(())
}

/// A patch value stored where the object had nothing to merge it with: nulls dropped and
/// directives removed. `None` if the value is itself a `$patch` object to drop.
///
/// Kubernetes drops any object carrying `$patch`; this keeps a `$patch: replace` object's
/// content (replacing nothing is setting), and also removes the `$retainKeys`,
/// `$setElementOrder/` and `$deleteFromPrimitiveList/` keys Kubernetes would store.
fn new_value(value: Value) -> Option<Value> {
    match value {
        Value::Object(mut m) => {
            match m.remove(DIRECTIVE_MARKER) {
                None => {}
                Some(d) if d.as_str() == Some("replace") => {}
                Some(_) => return None,
            }
            Some(Value::Object(strip_directives_map(m)))
        }
        Value::Array(items) => Some(Value::Array(
            items
                .into_iter()
                .filter(|item| item.get(DIRECTIVE_MARKER).is_none())
                .filter_map(new_value)
                .collect(),
        )),
        other => Some(other),
    }
}

fn strip_directives_map(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, v)| !v.is_null() && !is_directive_key(k))
        .filter_map(|(k, v)| new_value(v).map(|v| (k, v)))
        .collect()
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE_MARKER
        || key == RETAIN_KEYS
        || key.starts_with("$setElementOrder")
        || key.starts_with("$deleteFromPrimitiveList")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonKind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn json_kind(value: &Value) -> JsonKind {
    match value {
        Value::Null => JsonKind::Null,
        Value::Bool(_) => JsonKind::Bool,
        Value::Number(_) => JsonKind::Number,
        Value::String(_) => JsonKind::String,
        Value::Array(_) => JsonKind::Array,
        Value::Object(_) => JsonKind::Object,
    }
}

/// The one kind of every item of both lists (at least one item between them).
fn element_kind(original: &[Value], patch: &[Value]) -> Result<JsonKind, PatchError> {
    let mut kinds = original.iter().chain(patch).map(json_kind);
    let first = kinds.next().unwrap_or(JsonKind::Null);
    if first == JsonKind::Array {
        return Err(PatchError::Invalid(
            "lists of lists are not supported".to_string(),
        ));
    }
    if kinds.any(|k| k != first) {
        return Err(mixed_kinds());
    }
    Ok(first)
}

fn mixed_kinds() -> PatchError {
    PatchError::BadRequest("list element types are not identical".to_string())
}

fn no_merge_key(item: &Value, key: &str) -> PatchError {
    PatchError::BadRequest(format!(
        "map: {item} does not contain declared merge key: {key}"
    ))
}

fn bad_patch_type(directive: &Value, map: &Map<String, Value>) -> PatchError {
    let directive = directive
        .as_str()
        .map(str::to_string)
        .unwrap_or(directive.to_string());
    PatchError::BadRequest(format!(
        "unknown patch type: {directive} in map: {}",
        Value::Object(map.clone())
    ))
}

fn bad_primitive_list() -> PatchError {
    PatchError::BadRequest("invalid patch format of primitive list".to_string())
}

fn bad_retain_keys() -> PatchError {
    PatchError::BadRequest("invalid patch format of retainKeys".to_string())
}

fn bad_set_element_order() -> PatchError {
    PatchError::BadRequest("invalid patch format of setElementOrder list".to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::patch::{FieldInfo, ListType, SchemaTable};
    use serde_json::json;

    /// A hand-made slice of the Kubernetes types, with their real patch metadata.
    pub(crate) fn schema() -> SchemaTable {
        SchemaTable::new()
            .with("Deployment", "metadata", FieldInfo::object("ObjectMeta"))
            .with("Deployment", "spec", FieldInfo::object("DeploymentSpec"))
            .with("DeploymentSpec", "replicas", FieldInfo::scalar())
            .with(
                "DeploymentSpec",
                "selector",
                FieldInfo::object("LabelSelector").atomic(),
            )
            .with(
                "DeploymentSpec",
                "strategy",
                FieldInfo::object("DeploymentStrategy").retain_keys(),
            )
            .with(
                "DeploymentSpec",
                "template",
                FieldInfo::object("PodTemplateSpec"),
            )
            .with("DeploymentStrategy", "type", FieldInfo::scalar())
            .with(
                "DeploymentStrategy",
                "rollingUpdate",
                FieldInfo::object("RollingUpdateDeployment"),
            )
            .with("RollingUpdateDeployment", "maxSurge", FieldInfo::scalar())
            .with("LabelSelector", "matchLabels", FieldInfo::map(None))
            .with(
                "PodTemplateSpec",
                "metadata",
                FieldInfo::object("ObjectMeta"),
            )
            .with("PodTemplateSpec", "spec", FieldInfo::object("PodSpec"))
            .with("ObjectMeta", "name", FieldInfo::scalar())
            .with("ObjectMeta", "labels", FieldInfo::map(None))
            .with("ObjectMeta", "annotations", FieldInfo::map(None))
            .with(
                "ObjectMeta",
                "finalizers",
                FieldInfo::list(None).merge_by(None),
            )
            .with(
                "PodSpec",
                "containers",
                FieldInfo::list(Some("Container")).merge_by(Some("name")),
            )
            .with(
                "PodSpec",
                "volumes",
                FieldInfo::list(Some("Volume"))
                    .merge_by(Some("name"))
                    .retain_keys(),
            )
            .with(
                "PodSpec",
                "tolerations",
                FieldInfo::list(Some("Toleration")),
            )
            .with("PodSpec", "nodeSelector", FieldInfo::map(None).replace())
            .with("Volume", "name", FieldInfo::scalar())
            .with("Volume", "emptyDir", FieldInfo::object("EmptyDir"))
            .with("Volume", "hostPath", FieldInfo::object("HostPath"))
            .with("Container", "name", FieldInfo::scalar())
            .with("Container", "image", FieldInfo::scalar())
            .with("Container", "args", FieldInfo::list(None))
            .with(
                "Container",
                "env",
                FieldInfo::list(Some("EnvVar")).merge_by(Some("name")),
            )
            .with(
                "Container",
                "ports",
                FieldInfo::list(Some("ContainerPort"))
                    .merge_by(Some("containerPort"))
                    .list_type(ListType::Map, &["containerPort", "protocol"])
                    .key_default("protocol", json!("TCP")),
            )
            .with("EnvVar", "name", FieldInfo::scalar())
            .with("EnvVar", "value", FieldInfo::scalar())
            .with("ContainerPort", "containerPort", FieldInfo::scalar())
            .with("ContainerPort", "protocol", FieldInfo::scalar())
    }

    fn smp(current: Value, patch: Value) -> Result<Value, PatchError> {
        apply(
            &current,
            patch.to_string().as_bytes(),
            &schema(),
            "Deployment",
        )
    }

    fn pod_spec(spec: Value) -> Value {
        json!({"spec": {"template": {"spec": spec}}})
    }

    #[test]
    fn containers_merge_by_name() {
        let current = pod_spec(json!({"containers": [
            {"name": "web", "image": "nginx:1"},
            {"name": "log", "image": "busybox"},
        ]}));
        let out = smp(
            current,
            pod_spec(json!({"containers": [
                {"name": "web", "image": "nginx:2"},
                {"name": "cache", "image": "redis"},
            ]})),
        )
        .expect("merges");
        // Reference: strategicpatch ordering: patch items keep the patch's order, and a
        // server-only item goes first only where the live list had it before a patch item.
        assert_eq!(
            out,
            pod_spec(json!({"containers": [
                {"name": "web", "image": "nginx:2"},
                {"name": "cache", "image": "redis"},
                {"name": "log", "image": "busybox"},
            ]}))
        );
    }

    #[test]
    fn server_only_items_interleave_by_live_order() {
        let current =
            pod_spec(json!({"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}));
        let out = smp(
            current,
            pod_spec(json!({"containers": [{"name": "b", "image": "x"}, {"name": "d"}]})),
        )
        .expect("merges");
        assert_eq!(
            out,
            pod_spec(json!({"containers": [
                {"name": "a"}, {"name": "b", "image": "x"}, {"name": "d"}, {"name": "c"}
            ]}))
        );
    }

    #[test]
    fn null_deletes_and_maps_merge() {
        let current =
            json!({"metadata": {"labels": {"a": "1", "b": "2"}, "annotations": {"x": "y"}}});
        let out = smp(
            current,
            json!({"metadata": {"labels": {"a": null, "c": "3"}, "annotations": null}}),
        )
        .expect("merges");
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn lists_without_merge_strategy_are_replaced() {
        let current = pod_spec(json!({
            "tolerations": [{"key": "a"}, {"key": "b"}],
            "containers": [{"name": "web", "args": ["-a", "-b"]}],
        }));
        let out = smp(
            current,
            pod_spec(json!({
                "tolerations": [{"key": "c"}],
                "containers": [{"name": "web", "args": ["-c"]}],
            })),
        )
        .expect("replaces");
        assert_eq!(
            out,
            pod_spec(json!({
                "tolerations": [{"key": "c"}],
                "containers": [{"name": "web", "args": ["-c"]}],
            }))
        );
    }

    #[test]
    fn replace_strategy_on_a_map_field() {
        let current = pod_spec(json!({"nodeSelector": {"a": "1", "b": "2"}}));
        let out = smp(current, pod_spec(json!({"nodeSelector": {"c": "3"}}))).expect("replaces");
        assert_eq!(out, pod_spec(json!({"nodeSelector": {"c": "3"}})));
    }

    // Reference: strategicpatch test cases "Delete one item from a merging list" and
    // kubectl's three-way patch removing an env var and a container.
    #[test]
    fn kubectl_apply_patch_removes_env_var_and_container() {
        let current = pod_spec(json!({"containers": [
            {"name": "web", "image": "nginx:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "sidecar", "image": "envoy"},
        ]}));
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}],
            "containers": [
                {"$setElementOrder/env": [{"name": "A"}], "env": [{"$patch": "delete", "name": "B"}],
                 "image": "nginx:2", "name": "web"},
                {"$patch": "delete", "name": "sidecar"},
            ],
        }}}});
        let out = smp(current, patch).expect("applies");
        assert_eq!(
            out,
            pod_spec(json!({"containers": [
                {"name": "web", "image": "nginx:2", "env": [{"name": "A", "value": "1"}]},
            ]}))
        );
    }

    // Reference: the "$setElementOrder" design (preserve-order-in-strategic-merge-patch):
    // the directive's order wins over the patch's and the live object's.
    #[test]
    fn set_element_order_reorders_the_merged_list() {
        let current = pod_spec(json!({"containers": [
            {"name": "a", "image": "1"}, {"name": "b", "image": "1"}, {"name": "c", "image": "1"},
        ]}));
        let patch = pod_spec(json!({
            "$setElementOrder/containers": [{"name": "c"}, {"name": "new"}, {"name": "a"}, {"name": "b"}],
            "containers": [{"name": "new", "image": "2"}, {"name": "a", "image": "2"}],
        }));
        let out = smp(current, patch).expect("applies");
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .map(|c| c["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["c", "new", "a", "b"]);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][2]["image"],
            "2"
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "1"
        );
    }

    #[test]
    fn set_element_order_alone_only_reorders() {
        let current = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let out = smp(
            current,
            json!({"metadata": {"$setElementOrder/finalizers": ["c", "b", "a"]}}),
        )
        .expect("applies");
        assert_eq!(out, json!({"metadata": {"finalizers": ["c", "b", "a"]}}));
    }

    #[test]
    fn set_element_order_must_agree_with_the_patch() {
        let current = pod_spec(json!({"containers": [{"name": "a"}, {"name": "b"}]}));
        let patch = pod_spec(json!({
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b"}, {"name": "a"}],
        }));
        let err = smp(current, patch).expect_err("patch order contradicts the directive");
        assert!(
            matches!(err, PatchError::BadRequest(ref m) if m.contains("doesn't match $setElementOrder"))
        );
    }

    #[test]
    fn primitive_merge_lists_are_sets() {
        let current = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = smp(current, json!({"metadata": {"finalizers": ["c", "a"]}})).expect("merges");
        // "a" is in the patch and live: patch items first in patch order unless the live
        // list puts a server-only item before them.
        assert_eq!(out, json!({"metadata": {"finalizers": ["c", "a", "b"]}}));
    }

    #[test]
    fn delete_from_primitive_list() {
        let current = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let out = smp(
            current,
            json!({"metadata": {
                "$setElementOrder/finalizers": ["a", "c"],
                "$deleteFromPrimitiveList/finalizers": ["b"],
            }}),
        )
        .expect("deletes");
        assert_eq!(out, json!({"metadata": {"finalizers": ["a", "c"]}}));
        let err = smp(json!({}), json!({"$deleteFromPrimitiveList": ["b"]})).expect_err("no field");
        assert_eq!(
            err,
            PatchError::BadRequest("invalid patch format of primitive list".into())
        );
    }

    #[test]
    fn patch_replace_in_a_list_replaces_it() {
        let current = pod_spec(json!({"containers": [{"name": "a"}, {"name": "b"}]}));
        let out = smp(
            current,
            pod_spec(json!({"containers": [{"name": "c"}, {"$patch": "replace"}]})),
        )
        .expect("replaces");
        assert_eq!(out, pod_spec(json!({"containers": [{"name": "c"}]})));
    }

    #[test]
    fn patch_directives_in_maps() {
        let current = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 2, "strategy": {"type": "Recreate"}}});
        let out = smp(
            current.clone(),
            json!({"metadata": {"labels": {"$patch": "replace", "b": "2"}}}),
        )
        .expect("replaces");
        assert_eq!(out["metadata"], json!({"labels": {"b": "2"}}));
        let out = smp(current, json!({"spec": {"$patch": "delete"}})).expect("deletes");
        assert_eq!(out["spec"], json!({}));
    }

    #[test]
    fn patch_merge_in_a_list_is_refused() {
        let current = pod_spec(json!({"containers": [{"name": "a"}]}));
        let err = smp(
            current,
            pod_spec(json!({"containers": [{"$patch": "merge"}]})),
        )
        .expect_err("not supported");
        assert_eq!(
            err,
            PatchError::BadRequest("merging lists cannot yet be specified in the patch".into())
        );
    }

    // Reference: kubectl apply switching a Deployment from RollingUpdate to Recreate sends
    // `$retainKeys` for the strategy union.
    #[test]
    fn retain_keys_clears_the_other_union_members() {
        let current = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        let out = smp(
            current,
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": null, "type": "Recreate"}}}),
        )
        .expect("applies");
        assert_eq!(out, json!({"spec": {"strategy": {"type": "Recreate"}}}));
    }

    #[test]
    fn retain_keys_in_a_volume_item() {
        let current = pod_spec(json!({"volumes": [{"name": "data", "emptyDir": {}}]}));
        let out = smp(
            current,
            pod_spec(json!({"volumes": [
                {"$retainKeys": ["hostPath", "name"], "hostPath": {"path": "/d"}, "name": "data"}
            ]})),
        )
        .expect("applies");
        assert_eq!(
            out,
            pod_spec(json!({"volumes": [{"name": "data", "hostPath": {"path": "/d"}}]}))
        );
    }

    #[test]
    fn retain_keys_must_list_every_patched_key() {
        let err = smp(
            json!({"spec": {"strategy": {}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 2}}}}),
        )
        .expect_err("rollingUpdate is not retained");
        assert_eq!(
            err,
            PatchError::BadRequest("invalid patch format of retainKeys".into())
        );
    }

    #[test]
    fn malformed_directives_are_bad_requests() {
        let current = pod_spec(json!({"containers": [{"name": "a"}]}));
        let err = smp(
            current.clone(),
            pod_spec(json!({"containers": [{"image": "x"}]})),
        )
        .expect_err("no merge key");
        assert_eq!(
            err,
            PatchError::BadRequest(
                "map: {\"image\":\"x\"} does not contain declared merge key: name".into()
            )
        );
        let err = smp(current.clone(), json!({"spec": {"$patch": "frob"}})).expect_err("unknown");
        assert!(
            matches!(err, PatchError::BadRequest(ref m) if m.starts_with("unknown patch type: frob"))
        );
        let err = smp(
            json!({"metadata": {"finalizers": [["a"]]}}),
            json!({"metadata": {"finalizers": [["b"]]}}),
        )
        .expect_err("list of lists");
        assert_eq!(
            err,
            PatchError::Invalid("lists of lists are not supported".into())
        );
        assert!(matches!(
            smp(current, json!([1])),
            Err(PatchError::Decode(_))
        ));
    }

    #[test]
    fn new_values_are_stored_without_directives_or_nulls() {
        let out = smp(
            json!({}),
            pod_spec(json!({
                "$setElementOrder/containers": [{"name": "a"}],
                "containers": [{"name": "a", "env": [{"name": "X", "value": null}], "$retainKeys": ["name"]}],
            })),
        )
        .expect("applies");
        assert_eq!(
            out,
            pod_spec(json!({"containers": [{"name": "a", "env": [{"name": "X"}]}]}))
        );
    }

    #[test]
    fn ports_merge_by_their_patch_merge_key() {
        let current = pod_spec(
            json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}),
        );
        let out = smp(
            current,
            pod_spec(json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}]}]})),
        )
        .expect("merges");
        assert_eq!(
            out,
            pod_spec(json!({"containers": [{"name": "a", "ports": [
                {"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}
            ]}]}))
        );
    }
}
