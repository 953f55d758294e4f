//! The pod checkpoint: the pods bound to this node, one file each (`Pod_<uid>.yaml`, as
//! upstream's former bootstrap checkpoint, `pkg/kubelet/checkpoint/checkpoint.go`: `Data{Pod,
//! Checksum}`), so a box that restarts while the API is out of reach runs its pods again.
//!
//! The checksum is FNV-32a over a dump of the pod with sorted keys, the same manager and
//! function as the other checkpoints. It is not upstream's dump of a Go `v1.Pod` (skerry has
//! no Go structs for the whole pod, and no upstream kubelet reads these files any more): it
//! dumps the pod's JSON tree, each value typed by its JSON kind, maps sorted by key. A corrupt
//! file is logged and skipped: the API is the truth and will say what runs here.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tracing::warn;

use super::dump::{Dump, checksum};
use super::{Checkpoint, CheckpointError, CheckpointManager};

/// The directory under the kubelet's root dir.
pub const POD_CHECKPOINT_DIR: &str = "pod-checkpoints";
/// The key prefix (upstream `podPrefix` and `delimiter`).
const POD_PREFIX: &str = "Pod_";
/// The key suffix (upstream's files were named `.yaml`, holding JSON).
const POD_SUFFIX: &str = ".yaml";

/// One pod's checkpoint.
#[derive(Clone, Debug, Default)]
pub struct PodCheckpoint {
    pub pod: Value,
    pub checksum: u64,
}

fn dump_value(d: &mut Dump, v: &Value) {
    match v {
        Value::Null => d.str("<nil>"),
        Value::Bool(b) => d.typed("bool", |d| d.str(if *b { "true" } else { "false" })),
        Value::Number(n) => d.typed("number", |d| d.str(&n.to_string())),
        Value::String(s) => d.typed("string", |d| d.str(s)),
        Value::Array(a) => d.typed("array", |d| d.slice(Some(a.as_slice()), dump_value)),
        Value::Object(o) => {
            let mut entries: Vec<_> = o.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            d.typed("object", |d| d.map(entries, |d, k| d.str(k), dump_value));
        }
    }
}

impl PodCheckpoint {
    /// The dump the checksum covers.
    pub fn dump(&self) -> String {
        Dump::pointer_struct("checkpoint.Data", |f| {
            f.field("Pod", "*v1.Pod", |d| dump_value(d, &self.pod));
        })
        .0
    }
}

impl Checkpoint for PodCheckpoint {
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.checksum = checksum(&self.dump(), None);
        serde_json::to_vec(&serde_json::json!({"Pod": self.pod, "Checksum": self.checksum}))
            .map_err(|e| CheckpointError::Json(e.to_string()))
    }
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
        let o = super::gojson::parse_object(blob, "checkpoint.Data")?;
        self.pod = super::gojson::field(&o, "Pod")
            .cloned()
            .unwrap_or(Value::Null);
        self.checksum = super::gojson::uint(
            super::gojson::field(&o, "Checksum"),
            "checksum.Checksum",
            "Data.Checksum",
        )?;
        Ok(())
    }
    fn verify_checksum(&self) -> Result<(), CheckpointError> {
        let actual = checksum(&self.dump(), None);
        if actual == self.checksum {
            Ok(())
        } else {
            Err(CheckpointError::Corrupt {
                actual,
                expected: self.checksum,
            })
        }
    }
}

/// The key of a pod's checkpoint.
pub fn key(uid: &str) -> String {
    format!("{POD_PREFIX}{uid}{POD_SUFFIX}")
}

/// The pods bound to this node, on disk.
#[derive(Clone, Debug)]
pub struct PodCheckpoints {
    manager: CheckpointManager,
}

impl PodCheckpoints {
    /// Over `dir` (created if missing).
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Result<PodCheckpoints, CheckpointError> {
        Ok(PodCheckpoints {
            manager: CheckpointManager::new(dir)?,
        })
    }

    /// The manager (for tests).
    pub fn manager(&self) -> &CheckpointManager {
        &self.manager
    }

    /// Writes `pod`'s checkpoint.
    pub fn store(&self, pod: &Pod) -> Result<(), CheckpointError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let value = serde_json::to_value(pod).map_err(|e| CheckpointError::Json(e.to_string()))?;
        let mut cp = PodCheckpoint {
            pod: value,
            checksum: 0,
        };
        self.manager.create(&key(uid), &mut cp)
    }

    /// Removes the checkpoint of the pod `uid`.
    pub fn remove(&self, uid: &str) -> Result<(), CheckpointError> {
        self.manager.remove(&key(uid))
    }

    /// Every pod checkpointed; a file that does not verify or parse is logged and skipped
    /// (the API will say what runs here).
    pub fn load(&self) -> Vec<Arc<Pod>> {
        let keys = match self.manager.list() {
            Ok(k) => k,
            Err(e) => {
                warn!(error = %e, "pod checkpoints: listing failed");
                return Vec::new();
            }
        };
        let mut pods = Vec::new();
        for k in keys
            .iter()
            .filter(|k| k.starts_with(POD_PREFIX) && k.ends_with(POD_SUFFIX))
        {
            let mut cp = PodCheckpoint::default();
            let pod = self.manager.get(k, &mut cp).and_then(|()| {
                serde_json::from_value::<Pod>(cp.pod)
                    .map_err(|e| CheckpointError::Json(e.to_string()))
            });
            match pod {
                Ok(p) => pods.push(Arc::new(p)),
                Err(e) => warn!(checkpoint = %k, error = %e, "ignoring a pod checkpoint"),
            }
        }
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod")
    }

    #[test]
    fn pods_round_trip_and_a_corrupt_one_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = PodCheckpoints::new(dir.path()).expect("checkpoints");
        c.store(&pod("u1", "busybox")).expect("store");
        c.store(&pod("u2", "busybox")).expect("store");
        assert_eq!(c.load().len(), 2);
        // One byte changed in u2's image: the checksum catches it, u1 still loads.
        let path = c.manager().path(&key("u2"));
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.replace("busybox", "busyboy")).expect("write");
        let loaded = c.load();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].metadata.uid.as_deref(), Some("u1"));
        // Key order and whitespace do not matter to the checksum.
        let mut cp = PodCheckpoint::default();
        cp.unmarshal(&std::fs::read(c.manager().path(&key("u1"))).expect("read"))
            .expect("unmarshal");
        let pretty = serde_json::to_string_pretty(&serde_json::json!({
            "Checksum": cp.checksum, "Pod": cp.pod
        }))
        .expect("json");
        let mut again = PodCheckpoint::default();
        again.unmarshal(pretty.as_bytes()).expect("unmarshal");
        again.verify_checksum().expect("reformatted still verifies");
        c.remove("u1").expect("remove");
        assert!(c.load().is_empty());
    }
}
