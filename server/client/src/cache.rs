//! The indexed, thread-safe store that listers read (client-go's `ThreadSafeStore` +
//! `Indexer`), and the informer's `knownObjects` that the DeltaFIFO consults on relist.
//!
//! Objects are held as `Arc<K>`: the informer hands the same allocation to the store and to
//! every handler, and a lister's `list` clones pointers, not objects.
//!
//! Invariant: for every index `name` and every key `k` in `items`, `indices[name][v]` holds `k`
//! exactly for the values `v` that the index function returns for `items[k]` — no more. On
//! upsert the old object's values are removed before the new object's are added, so an object
//! whose label changed is no longer found under the old value, and a value set that becomes
//! empty is dropped (an index never grows with values no object has).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::object::Object;

/// An index function: the index values of one object (e.g. its namespace).
pub type IndexFunc<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// The name of the namespace index every informer has.
pub const NAMESPACE_INDEX: &str = "namespace";

/// client-go's `MetaNamespaceIndexFunc`: the object's namespace (empty for cluster-scoped
/// objects, so `list_namespace("")` lists them).
fn namespace_index_func<K: Object>(obj: &K) -> Vec<String> {
    vec![obj.metadata().namespace.clone().unwrap_or_default()]
}

/// index value → keys of the objects with that value.
type Index = HashMap<String, HashSet<String>>;

/// The state behind the lock.
struct Store<K> {
    /// key → object.
    items: HashMap<String, Arc<K>>,
    /// index name → index function.
    indexers: HashMap<String, IndexFunc<K>>,
    /// index name → (value → keys). Has an entry for every name in `indexers`.
    indices: HashMap<String, Index>,
}

impl<K> Store<K> {
    /// Removes `key` from every index under the values `obj` has (client-go's
    /// `deleteKeyFromIndex`), dropping value sets that become empty.
    fn unindex(&mut self, key: &str, obj: &K) {
        for (name, f) in &self.indexers {
            let Some(index) = self.indices.get_mut(name) else {
                continue;
            };
            for value in f(obj) {
                if let Some(keys) = index.get_mut(&value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        index.remove(&value);
                    }
                }
            }
        }
    }

    /// Adds `key` to every index under the values `obj` has.
    fn index(&mut self, key: &str, obj: &K) {
        for (name, f) in &self.indexers {
            let index = self.indices.entry(name.clone()).or_default();
            for value in f(obj) {
                index.entry(value).or_default().insert(key.to_string());
            }
        }
    }
}

/// A shared, indexed store of objects by key (`namespace/name`). Clones share the store.
pub struct Indexer<K> {
    /// A read-write lock: listers read far more often than the informer writes, and every
    /// critical section is a few map operations with no `.await` inside (parking_lot's lock
    /// does not poison, so a panicking index function cannot wedge every lister).
    inner: Arc<RwLock<Store<K>>>,
}

impl<K> Clone for Indexer<K> {
    fn clone(&self) -> Self {
        Indexer {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Object> Indexer<K> {
    /// An empty store with the namespace index.
    pub fn new() -> Indexer<K> {
        let mut indexers: HashMap<String, IndexFunc<K>> = HashMap::new();
        indexers.insert(
            NAMESPACE_INDEX.to_string(),
            Arc::new(namespace_index_func::<K>),
        );
        let indices = indexers.keys().map(|n| (n.clone(), Index::new())).collect();
        Indexer {
            inner: Arc::new(RwLock::new(Store {
                items: HashMap::new(),
                indexers,
                indices,
            })),
        }
    }

    /// Adds an index; fails if one of that name exists or the store is not empty.
    pub fn add_index(&self, name: &str, f: IndexFunc<K>) -> Result<(), String> {
        let mut store = self.inner.write();
        if store.indexers.contains_key(name) {
            return Err(format!("index {name:?} already exists"));
        }
        if !store.items.is_empty() {
            return Err(format!(
                "cannot add index {name:?} to a store holding {} objects",
                store.items.len()
            ));
        }
        store.indexers.insert(name.to_string(), f);
        store.indices.insert(name.to_string(), Index::new());
        Ok(())
    }

    /// The object with `key`.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.inner.read().items.get(key).cloned()
    }

    /// The object `namespace/name` (`name` alone for cluster-scoped objects when `namespace`
    /// is empty).
    pub fn get_by(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        if namespace.is_empty() {
            self.get(name)
        } else {
            self.get(&format!("{namespace}/{name}"))
        }
    }

    /// Every object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.read().items.values().cloned().collect()
    }

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.inner.read().items.keys().cloned().collect()
    }

    /// The objects whose index `name` has value `value` (none if there is no such index).
    pub fn by_index(&self, name: &str, value: &str) -> Vec<Arc<K>> {
        let store = self.inner.read();
        let Some(keys) = store.indices.get(name).and_then(|index| index.get(value)) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|k| store.items.get(k).cloned())
            .collect()
    }

    /// The keys whose index `name` has value `value` (client-go's `IndexKeys`).
    pub fn index_keys(&self, name: &str, value: &str) -> Vec<String> {
        let store = self.inner.read();
        store
            .indices
            .get(name)
            .and_then(|index| index.get(value))
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The values index `name` currently has (client-go's `ListIndexFuncValues`).
    pub fn index_values(&self, name: &str) -> Vec<String> {
        let store = self.inner.read();
        store
            .indices
            .get(name)
            .map(|index| index.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The objects in `namespace`.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.by_index(NAMESPACE_INDEX, namespace)
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.inner.read().items.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts or replaces the object at `key`, updating indices; returns the old one.
    pub fn upsert(&self, key: &str, obj: Arc<K>) -> Option<Arc<K>> {
        let mut store = self.inner.write();
        let old = store.items.insert(key.to_string(), obj.clone());
        if let Some(old) = &old {
            store.unindex(key, old);
        }
        store.index(key, &obj);
        old
    }

    /// Removes the object at `key`; returns it.
    pub fn remove(&self, key: &str) -> Option<Arc<K>> {
        let mut store = self.inner.write();
        let old = store.items.remove(key)?;
        store.unindex(key, &old);
        Some(old)
    }
}

impl<K: Object> Default for Indexer<K> {
    fn default() -> Self {
        Indexer::new()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};

    fn pod(namespace: &str, name: &str, app: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.namespace = Some(namespace.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        Arc::new(p)
    }

    fn by_app() -> IndexFunc<Pod> {
        Arc::new(|p: &Pod| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app").cloned())
                .into_iter()
                .collect()
        })
    }

    fn names(mut objs: Vec<Arc<Pod>>) -> Vec<String> {
        objs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        objs.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn namespace_index() {
        let store = Indexer::<Pod>::new();
        store.upsert("a/x", pod("a", "x", "web"));
        store.upsert("a/y", pod("a", "y", "web"));
        store.upsert("b/z", pod("b", "z", "db"));
        assert_eq!(names(store.list_namespace("a")), ["x", "y"]);
        assert_eq!(names(store.list_namespace("b")), ["z"]);
        assert!(store.list_namespace("c").is_empty());
        assert_eq!(store.len(), 3);
        assert_eq!(
            store.get_by("b", "z").and_then(|p| p.metadata.name.clone()),
            Some("z".to_string())
        );
    }

    #[test]
    fn cluster_scoped_objects_are_in_the_empty_namespace() {
        let store = Indexer::<Node>::new();
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        store.upsert("n1", Arc::new(n));
        assert!(store.get_by("", "n1").is_some());
        assert_eq!(store.list_namespace("").len(), 1);
    }

    #[test]
    fn custom_index_and_its_update_when_a_label_changes() {
        let store = Indexer::<Pod>::new();
        store.add_index("app", by_app()).unwrap();
        store.upsert("a/x", pod("a", "x", "web"));
        store.upsert("b/y", pod("b", "y", "web"));
        assert_eq!(names(store.by_index("app", "web")), ["x", "y"]);

        // x's label changes: it leaves the old value and joins the new one.
        let old = store.upsert("a/x", pod("a", "x", "db"));
        assert_eq!(old.and_then(|p| p.metadata.name.clone()), Some("x".into()));
        assert_eq!(names(store.by_index("app", "web")), ["y"]);
        assert_eq!(names(store.by_index("app", "db")), ["x"]);
        assert_eq!(store.index_keys("app", "db"), ["a/x"]);

        // y's label changes too: the now-empty "web" value is dropped from the index.
        store.upsert("b/y", pod("b", "y", "db"));
        assert!(store.by_index("app", "web").is_empty());
        assert_eq!(store.index_values("app"), ["db"]);
    }

    #[test]
    fn remove_clears_the_object_from_every_index() {
        let store = Indexer::<Pod>::new();
        store.add_index("app", by_app()).unwrap();
        store.upsert("a/x", pod("a", "x", "web"));
        store.upsert("a/y", pod("a", "y", "web"));
        let removed = store.remove("a/x");
        assert!(removed.is_some());
        assert!(
            store.remove("a/x").is_none(),
            "a second remove finds nothing"
        );
        assert_eq!(names(store.by_index("app", "web")), ["y"]);
        assert_eq!(names(store.list_namespace("a")), ["y"]);
        assert_eq!(store.keys(), ["a/y"]);
        store.remove("a/y");
        assert!(store.is_empty());
        assert!(store.index_values("app").is_empty());
        assert!(store.index_values(NAMESPACE_INDEX).is_empty());
    }

    #[test]
    fn add_index_rules() {
        let store = Indexer::<Pod>::new();
        assert!(
            store.add_index(NAMESPACE_INDEX, by_app()).is_err(),
            "duplicate name"
        );
        store.add_index("app", by_app()).unwrap();
        store.upsert("a/x", pod("a", "x", "web"));
        assert!(
            store.add_index("late", by_app()).is_err(),
            "store not empty"
        );
        assert!(store.by_index("no-such-index", "web").is_empty());
    }
}
