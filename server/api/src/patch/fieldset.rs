//! Sets of field paths, as server-side apply records who owns what, and their `FieldsV1`
//! encoding in `metadata.managedFields`.
//!
//! The trick carried here (`docs/tricks.md` #20, managedFields as sorted-slice sets): a set
//! is a trie whose levels are sorted vectors rather than hash maps, so it serializes in one
//! deterministic order, and union, intersection and difference are merge-joins of two sorted
//! vectors, linear in the sizes of the sets.
//!
//! Invariants, checked in debug builds after every operation: at every level `members`
//! and the elements of `children` are strictly increasing, and no child set is empty.

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Map, Value};

/// One step of a path into an object.
///
/// `Key` and `Value` hold the canonical JSON text (compact, object keys sorted) of a
/// list-map item's key fields and of a set item, so elements compare and order as plain
/// strings, exactly as they appear in `FieldsV1`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// A named field or map key: `f:<name>`.
    Field(String),
    /// An item of a list of type map, by its key fields: `k:{"name":"web"}`.
    Key(String),
    /// An item of a list of type set, by value: `v:"finalizer"`.
    Value(String),
    /// An item of a list by position: `i:0` (decoded for completeness; apply never makes one).
    Index(usize),
}

impl PathElement {
    /// A named field.
    pub fn field(name: &str) -> Self {
        Self::Field(name.to_string())
    }

    /// A list-map item identified by the given key fields.
    pub fn key(fields: &Map<String, Value>) -> Self {
        Self::Key(Value::Object(fields.clone()).to_string())
    }

    /// A set item.
    pub fn value(value: &Value) -> Self {
        Self::Value(value.to_string())
    }

    /// The `FieldsV1` spelling: `f:name`, `k:{...}`, `v:...`, `i:N`.
    pub fn encode(&self) -> String {
        match self {
            Self::Field(name) => format!("f:{name}"),
            Self::Key(json) => format!("k:{json}"),
            Self::Value(json) => format!("v:{json}"),
            Self::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a `FieldsV1` key. `Key` and `Value` are re-encoded canonically.
    pub fn decode(text: &str) -> Result<Self, String> {
        let (prefix, rest) = text
            .split_once(':')
            .ok_or_else(|| format!("unknown path element {text:?}"))?;
        match prefix {
            "f" => Ok(Self::Field(rest.to_string())),
            "k" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(m)) => Ok(Self::key(&m)),
                _ => Err(format!(
                    "path element {text:?}: the key is not a JSON object"
                )),
            },
            "v" => serde_json::from_str::<Value>(rest)
                .map(|v| Self::value(&v))
                .map_err(|e| format!("path element {text:?}: {e}")),
            "i" => rest
                .parse()
                .map(Self::Index)
                .map_err(|_| format!("path element {text:?}: not an index")),
            _ => Err(format!("unknown path element {text:?}")),
        }
    }
}

/// Kubernetes' path syntax in conflict messages: `.spec.containers[name="web"].image`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Field(name) => write!(f, ".{name}"),
            Self::Key(json) => {
                let fields = match serde_json::from_str::<Value>(json) {
                    Ok(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "[{}]", parts.join(","))
            }
            Self::Value(json) => write!(f, "[={json}]"),
            Self::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// Displays a whole path in Kubernetes' syntax.
pub fn display_path(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// A set of paths, held as a trie of sorted levels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    /// Paths that end at this level, strictly increasing.
    members: Vec<PathElement>,
    /// Paths that go deeper, by their next element, strictly increasing; never empty sets.
    children: Vec<(PathElement, FieldSet)>,
}

impl FieldSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds a path. The empty path (the whole object) is not tracked, as in Kubernetes.
    pub fn insert(&mut self, path: &[PathElement]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        if rest.is_empty() {
            if let Err(at) = self.members.binary_search(first) {
                self.members.insert(at, first.clone());
            }
        } else {
            let at = match self.children.binary_search_by(|(e, _)| e.cmp(first)) {
                Ok(at) => at,
                Err(at) => {
                    self.children.insert(at, (first.clone(), FieldSet::new()));
                    at
                }
            };
            self.children[at].1.insert(rest);
        }
    }

    /// Whether the path is a member (not merely a prefix of one).
    pub fn contains(&self, path: &[PathElement]) -> bool {
        match path.split_first() {
            None => false,
            Some((first, [])) => self.members.binary_search(first).is_ok(),
            Some((first, rest)) => self.child(first).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Whether `element` is a member at this level.
    pub fn has_member(&self, element: &PathElement) -> bool {
        self.members.binary_search(element).is_ok()
    }

    /// The paths below `element` at this level.
    pub fn child(&self, element: &PathElement) -> Option<&FieldSet> {
        self.children
            .binary_search_by(|(e, _)| e.cmp(element))
            .ok()
            .map(|at| &self.children[at].1)
    }

    /// The members of this level.
    pub fn members(&self) -> &[PathElement] {
        &self.members
    }

    /// The deeper levels, by element.
    pub fn children(&self) -> &[(PathElement, FieldSet)] {
        &self.children
    }

    /// Adds `element` as a member of this level.
    pub(crate) fn insert_member(&mut self, element: PathElement) {
        if let Err(at) = self.members.binary_search(&element) {
            self.members.insert(at, element);
        }
    }

    /// Adds every path of `child` below `element` at this level.
    pub(crate) fn insert_child(&mut self, element: PathElement, child: FieldSet) {
        if child.is_empty() {
            return;
        }
        match self.children.binary_search_by(|(e, _)| e.cmp(&element)) {
            Ok(at) => self.children[at].1 = self.children[at].1.union(&child),
            Err(at) => self.children.insert(at, (element, child)),
        }
    }

    /// Builds a level from parts already sorted (used by the set operations).
    fn from_parts(members: Vec<PathElement>, children: Vec<(PathElement, FieldSet)>) -> Self {
        let set = Self { members, children };
        #[cfg(debug_assertions)]
        set.debug_check();
        set
    }

    #[cfg(debug_assertions)]
    fn debug_check(&self) {
        for pair in self.members.windows(2) {
            assert!(
                pair[0] < pair[1],
                "members out of order: {:?} {:?}",
                pair[0],
                pair[1]
            );
        }
        for pair in self.children.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "children out of order: {:?} {:?}",
                pair[0].0,
                pair[1].0
            );
        }
        for (element, child) in &self.children {
            assert!(!child.is_empty(), "empty child set under {element:?}");
        }
    }

    /// Every path in `self` or in `other`.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let members = merge_join(&self.members, &other.members, |e| e, Join::Union)
            .into_iter()
            .map(|(a, b)| a.or(b).expect("a union row has a side").clone())
            .collect();
        let children = merge_join(&self.children, &other.children, |(e, _)| e, Join::Union)
            .into_iter()
            .map(|(a, b)| match (a, b) {
                (Some((e, x)), Some((_, y))) => (e.clone(), x.union(y)),
                (Some(one), None) | (None, Some(one)) => one.clone(),
                (None, None) => unreachable!("merge_join yields no empty rows"),
            })
            .collect();
        Self::from_parts(members, children)
    }

    /// Every path in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let members = merge_join(&self.members, &other.members, |e| e, Join::Both)
            .into_iter()
            .filter_map(|(a, _)| a.cloned())
            .collect();
        let children = merge_join(&self.children, &other.children, |(e, _)| e, Join::Both)
            .into_iter()
            .filter_map(|(a, b)| {
                let ((e, x), (_, y)) = (a?, b?);
                let common = x.intersection(y);
                (!common.is_empty()).then(|| (e.clone(), common))
            })
            .collect();
        Self::from_parts(members, children)
    }

    /// Every path in `self` and not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let members = merge_join(&self.members, &other.members, |e| e, Join::Left)
            .into_iter()
            .filter_map(|(a, b)| if b.is_none() { a.cloned() } else { None })
            .collect();
        let children = merge_join(&self.children, &other.children, |(e, _)| e, Join::Left)
            .into_iter()
            .filter_map(|(a, b)| {
                let (e, x) = a?;
                let rest = match b {
                    Some((_, y)) => x.difference(y),
                    None => x.clone(),
                };
                (!rest.is_empty()).then(|| (e.clone(), rest))
            })
            .collect();
        Self::from_parts(members, children)
    }

    /// Every member path, each level's members before its deeper paths, in order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for member in &self.members {
            prefix.push(member.clone());
            out.push(prefix.clone());
            prefix.pop();
        }
        for (element, child) in &self.children {
            prefix.push(element.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// The `FieldsV1` object: one key per element, `{}` for a member, `".": {}` inside an
    /// element that is both a member and a prefix.
    pub fn to_fields_v1(&self) -> Value {
        let mut out = Map::new();
        for member in &self.members {
            out.insert(member.encode(), Value::Object(Map::new()));
        }
        for (element, child) in &self.children {
            let mut inner = match child.to_fields_v1() {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            if self.has_member(element) {
                inner.insert(".".to_string(), Value::Object(Map::new()));
            }
            out.insert(element.encode(), Value::Object(inner));
        }
        Value::Object(out)
    }

    /// Parses a `FieldsV1` object.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, String> {
        let Value::Object(map) = value else {
            return Err("FieldsV1 must be a JSON object".to_string());
        };
        let mut set = FieldSet::new();
        for (key, inner) in map {
            if key == "." {
                continue;
            }
            let element = PathElement::decode(key)?;
            let Value::Object(inner_map) = inner else {
                return Err(format!("FieldsV1 entry {key:?} must be a JSON object"));
            };
            if inner_map.is_empty() || inner_map.contains_key(".") {
                set.insert_member(element.clone());
            }
            set.insert_child(element, FieldSet::from_fields_v1(inner)?);
        }
        Ok(set)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Join {
    /// Rows from either side.
    Union,
    /// Rows present on both sides.
    Both,
    /// Rows present on the left.
    Left,
}

/// The merge-join of two sorted slices by a key: each row pairs the items with equal keys.
fn merge_join<'a, T, K: Ord + 'a>(
    left: &'a [T],
    right: &'a [T],
    key: impl Fn(&'a T) -> &'a K,
    join: Join,
) -> Vec<(Option<&'a T>, Option<&'a T>)> {
    let mut rows = Vec::with_capacity(left.len().max(right.len()));
    let (mut l, mut r) = (0, 0);
    while l < left.len() || r < right.len() {
        let order = match (left.get(l), right.get(r)) {
            (Some(a), Some(b)) => key(a).cmp(key(b)),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => break,
        };
        let row = match order {
            Ordering::Less => {
                l += 1;
                (Some(&left[l - 1]), None)
            }
            Ordering::Greater => {
                r += 1;
                (None, Some(&right[r - 1]))
            }
            Ordering::Equal => {
                l += 1;
                r += 1;
                (Some(&left[l - 1]), Some(&right[r - 1]))
            }
        };
        let keep = match join {
            Join::Union => true,
            Join::Both => row.0.is_some() && row.1.is_some(),
            Join::Left => row.0.is_some(),
        };
        if keep {
            rows.push(row);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::BTreeSet;

    fn f(name: &str) -> PathElement {
        PathElement::field(name)
    }

    fn set(paths: &[Vec<PathElement>]) -> FieldSet {
        let mut s = FieldSet::new();
        for p in paths {
            s.insert(p);
        }
        s
    }

    #[test]
    fn fields_v1_round_trips_kubernetes_shape() {
        // As Kubernetes writes it for `kubectl apply --server-side` of a Deployment.
        let v1 = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:replicas": {},
                "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"nginx\"}": {".": {}, "f:image": {}, "f:name": {}}
                }}},
                "f:finalizers": {"v:\"a\"": {}}
            }
        });
        let parsed = FieldSet::from_fields_v1(&v1).expect("valid FieldsV1");
        assert!(parsed.contains(&[f("metadata"), f("labels")]));
        assert!(!parsed.contains(&[f("metadata")]));
        let nginx = PathElement::key(json!({"name": "nginx"}).as_object().expect("object"));
        let containers = [f("spec"), f("template"), f("spec"), f("containers")];
        assert!(parsed.contains(&[&containers[..], std::slice::from_ref(&nginx)].concat()));
        assert!(parsed.contains(&[&containers[..], &[nginx, f("image")]].concat()));
        assert_eq!(parsed.to_fields_v1(), v1);
    }

    #[test]
    fn paths_display_like_kubernetes() {
        let key = PathElement::key(
            json!({"name": "web", "containerPort": 80})
                .as_object()
                .expect("object"),
        );
        assert_eq!(
            display_path(&[f("spec"), f("ports"), key, f("protocol")]),
            ".spec.ports[containerPort=80,name=\"web\"].protocol"
        );
        assert_eq!(
            display_path(&[f("finalizers"), PathElement::value(&json!("x"))]),
            ".finalizers[=\"x\"]"
        );
    }

    #[test]
    fn bad_fields_v1_is_an_error() {
        assert!(FieldSet::from_fields_v1(&json!({"x:a": {}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"k:[1]": {}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"f:a": 1})).is_err());
        assert!(FieldSet::from_fields_v1(&json!([])).is_err());
    }

    fn path() -> impl Strategy<Value = Vec<PathElement>> {
        let element = prop_oneof![
            "[a-c]".prop_map(PathElement::Field),
            "[a-b]".prop_map(|s| PathElement::value(&json!(s))),
            (0usize..2).prop_map(PathElement::Index),
        ];
        prop::collection::vec(element, 1..4)
    }

    proptest! {
        // Model check against a BTreeSet of whole paths.
        #[test]
        fn set_operations_match_a_model(
            a in prop::collection::vec(path(), 0..12),
            b in prop::collection::vec(path(), 0..12),
        ) {
            let (sa, sb) = (set(&a), set(&b));
            let (ma, mb): (BTreeSet<_>, BTreeSet<_>) = (a.into_iter().collect(), b.into_iter().collect());
            let as_model = |s: &FieldSet| s.paths().into_iter().collect::<BTreeSet<_>>();
            prop_assert_eq!(as_model(&sa), ma.clone());
            prop_assert_eq!(as_model(&sa.union(&sb)), ma.union(&mb).cloned().collect::<BTreeSet<_>>());
            prop_assert_eq!(as_model(&sa.intersection(&sb)), ma.intersection(&mb).cloned().collect::<BTreeSet<_>>());
            prop_assert_eq!(as_model(&sa.difference(&sb)), ma.difference(&mb).cloned().collect::<BTreeSet<_>>());
            for p in &ma {
                prop_assert!(sa.contains(p));
            }
            let round = FieldSet::from_fields_v1(&sa.to_fields_v1()).expect("own encoding parses");
            prop_assert_eq!(round, sa);
        }
    }
}
