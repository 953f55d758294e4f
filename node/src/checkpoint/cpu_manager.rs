//! The CPU manager's checkpoint, `cpu_manager_state` (upstream
//! `pkg/kubelet/cm/cpumanager/state/checkpoint.go`, `state_checkpoint.go`): the policy's
//! name, the shared pool (`defaultCpuSet`) and the exclusive assignments per pod and
//! container, in upstream's JSON and with upstream's checksum, V1 (entries by container ID)
//! and V2 (by pod UID, then container name) and the V1 to V2 migration.
//!
//! The rename: the V2 struct's dump names it `state.CPUManagerCheckpointV2`; marshal and
//! verify hash it as `state.CPUManagerCheckpoint` (V1 likewise), the name a kubelet that only
//! knew one format used, so the checkpoint written here verifies after a rollback there.
//!
//! For the managers: [`restore`] at start gives the state (a fresh one, stored, when there is
//! no file) or a [`RestoreError`] the kubelet must refuse to start with (upstream's text:
//! drain the node and delete the file); [`store`] writes the state after every change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use serde::Serialize;

use super::dump::{Dump, checksum};
use super::gojson;
use super::{Checkpoint, CheckpointError, CheckpointManager};

/// The file name under the kubelet's root dir (upstream `cpumanager.cpuManagerStateFileName`).
pub const CPU_MANAGER_STATE_FILE: &str = "cpu_manager_state";

/// The Go type name a V2 checkpoint is hashed under (the older name, see the module docs).
const HASHED_TYPE: &str = "state.CPUManagerCheckpoint";
/// The V2 struct's own name in its dump.
const V2_TYPE: &str = "state.CPUManagerCheckpointV2";
/// The V1 struct's own name in its dump.
const V1_TYPE: &str = "state.CPUManagerCheckpointV1";

/// The V2 checkpoint (upstream `CPUManagerCheckpointV2`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuManagerCheckpointV2 {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    pub default_cpu_set: String,
    /// Pod UID -> container name -> cpuset.
    #[serde(rename = "entries", skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: BTreeMap<String, BTreeMap<String, String>>,
    pub checksum: u64,
}

/// The V1 checkpoint (upstream `CPUManagerCheckpointV1`): entries by container ID.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuManagerCheckpointV1 {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    pub default_cpu_set: String,
    #[serde(rename = "entries", skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: BTreeMap<String, String>,
    pub checksum: u64,
}

impl CpuManagerCheckpointV2 {
    /// The spew dump of `*CPUManagerCheckpointV2` with the checksum zeroed.
    pub fn dump(&self) -> String {
        Dump::pointer_struct(V2_TYPE, |f| {
            f.field("PolicyName", "string", |d| d.str(&self.policy_name));
            f.field("DefaultCPUSet", "string", |d| d.str(&self.default_cpu_set));
            f.field("Entries", "map[string]map[string]string", |d| {
                d.map(
                    &self.entries,
                    |d, k| d.str(k),
                    |d, v| d.map(v, |d, k| d.str(k), |d, v| d.str(v)),
                )
            });
            f.field("Checksum", "checksum.Checksum", |d| d.int(0));
        })
        .0
    }

    /// The checksum an older kubelet computes for this content (the rename applied).
    pub fn compute_checksum(&self) -> u64 {
        checksum(&self.dump(), Some((V2_TYPE, HASHED_TYPE)))
    }
}

impl CpuManagerCheckpointV1 {
    /// The spew dump of `*CPUManagerCheckpointV1` with the checksum zeroed.
    pub fn dump(&self) -> String {
        Dump::pointer_struct(V1_TYPE, |f| {
            f.field("PolicyName", "string", |d| d.str(&self.policy_name));
            f.field("DefaultCPUSet", "string", |d| d.str(&self.default_cpu_set));
            f.field("Entries", "map[string]string", |d| {
                d.map(&self.entries, |d, k| d.str(k), |d, v| d.str(v))
            });
            f.field("Checksum", "checksum.Checksum", |d| d.int(0));
        })
        .0
    }

    /// The checksum (the rename applied, as upstream's V1 `VerifyChecksum`).
    pub fn compute_checksum(&self) -> u64 {
        checksum(&self.dump(), Some((V1_TYPE, HASHED_TYPE)))
    }
}

fn verify(stored: u64, actual: u64) -> Result<(), CheckpointError> {
    // A zero checksum is accepted "for compatibility with old file backend" (upstream).
    if stored == 0 || stored == actual {
        Ok(())
    } else {
        Err(CheckpointError::Corrupt {
            actual,
            expected: stored,
        })
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<Vec<u8>, CheckpointError> {
    serde_json::to_vec(v).map_err(|e| CheckpointError::Json(e.to_string()))
}

impl Checkpoint for CpuManagerCheckpointV2 {
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.checksum = self.compute_checksum();
        to_json(self)
    }
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
        let o = gojson::parse_object(blob, "state.CPUManagerCheckpointV2")?;
        const S: &str = "CPUManagerCheckpointV2";
        *self = CpuManagerCheckpointV2 {
            policy_name: gojson::string(
                gojson::field(&o, "policyName"),
                &format!("{S}.policyName"),
            )?,
            default_cpu_set: gojson::string(
                gojson::field(&o, "defaultCpuSet"),
                &format!("{S}.defaultCpuSet"),
            )?,
            entries: gojson::string_map(
                gojson::field(&o, "entries"),
                "map[string]map[string]string",
                &format!("{S}.entries"),
                |v| {
                    gojson::string_map(Some(v), "map[string]string", &format!("{S}.entries"), |v| {
                        gojson::str_value(v, &format!("{S}.entries"))
                    })
                },
            )?,
            checksum: gojson::uint(
                gojson::field(&o, "checksum"),
                "checksum.Checksum",
                &format!("{S}.checksum"),
            )?,
        };
        Ok(())
    }
    fn verify_checksum(&self) -> Result<(), CheckpointError> {
        verify(self.checksum, self.compute_checksum())
    }
}

impl Checkpoint for CpuManagerCheckpointV1 {
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.checksum = self.compute_checksum();
        to_json(self)
    }
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
        let o = gojson::parse_object(blob, "state.CPUManagerCheckpointV1")?;
        const S: &str = "CPUManagerCheckpointV1";
        *self = CpuManagerCheckpointV1 {
            policy_name: gojson::string(
                gojson::field(&o, "policyName"),
                &format!("{S}.policyName"),
            )?,
            default_cpu_set: gojson::string(
                gojson::field(&o, "defaultCpuSet"),
                &format!("{S}.defaultCpuSet"),
            )?,
            entries: gojson::string_map(
                gojson::field(&o, "entries"),
                "map[string]string",
                &format!("{S}.entries"),
                |v| gojson::str_value(v, &format!("{S}.entries")),
            )?,
            checksum: gojson::uint(
                gojson::field(&o, "checksum"),
                "checksum.Checksum",
                &format!("{S}.checksum"),
            )?,
        };
        Ok(())
    }
    fn verify_checksum(&self) -> Result<(), CheckpointError> {
        verify(self.checksum, self.compute_checksum())
    }
}

/// A set of CPU ids (`k8s.io/utils/cpuset`).
pub type CpuSet = BTreeSet<u32>;

/// `cpuset.Parse`: `""` is empty; `0-3,7` and the like; Go's messages on bad input.
pub fn parse_cpuset(s: &str) -> Result<CpuSet, String> {
    let mut set = CpuSet::new();
    if s.is_empty() {
        return Ok(set);
    }
    let atoi = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| format!("strconv.Atoi: parsing {x:?}: invalid syntax"))
    };
    for part in s.split(',') {
        match part.split_once('-') {
            None => {
                set.insert(atoi(part)?);
            }
            Some((a, b)) => {
                let (a, b) = (atoi(a)?, atoi(b)?);
                if a > b {
                    return Err(format!("invalid range {part:?} ({a} > {b})"));
                }
                set.extend(a..=b);
            }
        }
    }
    Ok(set)
}

/// `CPUSet.String`: ranges of consecutive ids, comma-separated (`0-2,5`).
pub fn format_cpuset(set: &CpuSet) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// The CPU manager's state as the managers use it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuManagerState {
    pub default_cpu_set: CpuSet,
    /// Pod UID -> container name -> exclusive CPUs.
    pub assignments: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

/// Where a state came from.
#[derive(Debug, PartialEq)]
pub enum Restored<S> {
    /// No file: a fresh state, already stored (upstream writes it at once).
    Absent(S),
    /// Read from the checkpoint (migrated from V1 if it was one).
    Checkpoint(S),
}

/// The kubelet must not start: the checkpoint is corrupt or does not fit the configuration.
#[derive(Debug, thiserror::Error)]
#[error(
    "could not restore state from checkpoint: {reason}, please drain this node and delete the {manager} checkpoint file {path:?} before restarting Kubelet"
)]
pub struct RestoreError {
    /// "CPU manager" or "memory manager".
    pub manager: &'static str,
    /// Why (upstream's inner error text).
    pub reason: String,
    /// The file to delete.
    pub path: PathBuf,
}

/// Restores the CPU manager's state for `policy_name` (upstream `NewCheckpointState` ->
/// `restoreState`): V2 first, then V1 migrated through `initial_containers` (container ID
/// -> (pod UID, container name)); no file stores an empty state; anything else refuses.
pub fn restore(
    manager: &CheckpointManager,
    policy_name: &str,
    initial_containers: &HashMap<String, (String, String)>,
) -> Result<Restored<CpuManagerState>, RestoreError> {
    let fail = |reason: String| RestoreError {
        manager: "CPU manager",
        reason,
        path: manager.path(CPU_MANAGER_STATE_FILE),
    };
    let mut v2 = CpuManagerCheckpointV2::default();
    match manager.get(CPU_MANAGER_STATE_FILE, &mut v2) {
        Ok(()) => {}
        Err(CheckpointError::NotFound) => {
            let state = CpuManagerState::default();
            store(manager, policy_name, &state).map_err(|e| fail(e.to_string()))?;
            return Ok(Restored::Absent(state));
        }
        Err(_) => {
            let mut v1 = CpuManagerCheckpointV1::default();
            manager
                .get(CPU_MANAGER_STATE_FILE, &mut v1)
                .map_err(|e| fail(e.to_string()))?;
            v2 = migrate_v1(&v1, initial_containers).map_err(|e| {
                fail(format!(
                    "error migrating v1 checkpoint state to v2 checkpoint state: {e}"
                ))
            })?;
        }
    }
    if v2.policy_name != policy_name {
        return Err(fail(format!(
            "configured policy {policy_name:?} differs from state checkpoint policy {:?}",
            v2.policy_name
        )));
    }
    let default_cpu_set = parse_cpuset(&v2.default_cpu_set).map_err(|e| {
        fail(format!(
            "could not parse default cpu set {:?}: {e}",
            v2.default_cpu_set
        ))
    })?;
    let mut assignments = BTreeMap::new();
    for (pod, containers) in &v2.entries {
        let mut per = BTreeMap::new();
        for (container, cpus) in containers {
            let set = parse_cpuset(cpus).map_err(|e| {
                fail(format!(
                    "could not parse cpuset {cpus:?} for container {container:?} in pod {pod:?}: {e}"
                ))
            })?;
            per.insert(container.clone(), set);
        }
        assignments.insert(pod.clone(), per);
    }
    Ok(Restored::Checkpoint(CpuManagerState {
        default_cpu_set,
        assignments,
    }))
}

/// Upstream `migrateV1CheckpointToV2Checkpoint`.
pub fn migrate_v1(
    v1: &CpuManagerCheckpointV1,
    initial_containers: &HashMap<String, (String, String)>,
) -> Result<CpuManagerCheckpointV2, String> {
    let mut v2 = CpuManagerCheckpointV2 {
        policy_name: v1.policy_name.clone(),
        default_cpu_set: v1.default_cpu_set.clone(),
        ..Default::default()
    };
    for (id, cpus) in &v1.entries {
        let (pod, container) = initial_containers
            .get(id)
            .ok_or_else(|| format!("containerID '{id}' not found in initial containers list"))?;
        v2.entries
            .entry(pod.clone())
            .or_default()
            .insert(container.clone(), cpus.clone());
    }
    Ok(v2)
}

/// Writes `state` as a V2 checkpoint (upstream `storeState`).
pub fn store(
    manager: &CheckpointManager,
    policy_name: &str,
    state: &CpuManagerState,
) -> Result<(), CheckpointError> {
    let mut cp = CpuManagerCheckpointV2 {
        policy_name: policy_name.to_string(),
        default_cpu_set: format_cpuset(&state.default_cpu_set),
        entries: state
            .assignments
            .iter()
            .map(|(pod, c)| {
                (
                    pod.clone(),
                    c.iter()
                        .map(|(name, set)| (name.clone(), format_cpuset(set)))
                        .collect(),
                )
            })
            .collect(),
        checksum: 0,
    };
    manager.create(CPU_MANAGER_STATE_FILE, &mut cp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::dump::fnv32a;

    fn v2(blob: &str) -> CpuManagerCheckpointV2 {
        let mut cp = CpuManagerCheckpointV2::default();
        cp.unmarshal(blob.as_bytes()).expect("unmarshal");
        cp
    }

    /// Upstream `state_checkpoint_test.go` fixtures (JSON as there, checksums as an upstream
    /// kubelet computed them), and a file a running kubelet wrote.
    const V2_FIXTURES: &[&str] = &[
        r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}"#,
        r#"{"policyName": "none", "defaultCPUSet": "1-3",
            "entries": {"pod": {"container1": "4-6", "container2": "1-3"}}, "checksum": 3610638499}"#,
        r#"{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, "checksum": 1394507217}"#,
        r#"{"policyName": "none", "defaultCPUSet": "1.3", "entries": {}, "checksum": 3021697696}"#,
        r#"{"policyName": "none", "defaultCPUSet": "1-3",
            "entries": {"pod": {"container1": "4-6", "container2": "asd"}}, "checksum": 962272150}"#,
        r#"{"policyName":"static","defaultCpuSet":"0,4-8,12-15","entries":{"088fe178-cec9-4eb9-ba3c-cf45cba46371":{"qos-demo-ctr":"1,9"},"681eca58-a216-4ec4-a57b-941cad3c4e0f":{"qos-demo-ctr":"2-3,10-11"}},"checksum":2993692383}"#,
    ];

    #[test]
    fn upstream_v2_fixtures_verify() {
        for f in V2_FIXTURES {
            let cp = v2(f);
            assert_ne!(cp.checksum, 0);
            assert_eq!(cp.compute_checksum(), cp.checksum, "{f}");
            cp.verify_checksum().expect("verifies");
        }
    }

    #[test]
    fn upstream_v1_fixtures_verify_as_v1_only() {
        for f in [
            r#"{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}"#,
            r#"{"policyName": "none", "defaultCPUSet": "1-3",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 3680390589}"#,
            r#"{"policyName": "static", "defaultCPUSet": "7-9",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 2026311253}"#,
        ] {
            let mut cp = CpuManagerCheckpointV1::default();
            cp.unmarshal(f.as_bytes()).expect("unmarshal");
            cp.verify_checksum().expect("a V1 checksum verifies as V1");
        }
        // The first has no entries, so it reads as V2 too, but its checksum is V1's: the
        // `Entries` type in the dump differs.
        let cp = v2(r#"{"policyName": "none", "defaultCPUSet": "1-3", "checksum": 1694838852}"#);
        assert!(matches!(
            cp.verify_checksum(),
            Err(CheckpointError::Corrupt { .. })
        ));
    }

    #[test]
    fn one_corrupted_byte_is_detected() {
        let good = V2_FIXTURES[1];
        let bad = good.replace("4-6\", \"container2", "4-7\", \"container2");
        assert_ne!(good, bad);
        assert!(matches!(
            v2(&bad).verify_checksum(),
            Err(CheckpointError::Corrupt { .. })
        ));
        // Reformatting is not a change: the dump does not see whitespace or field order.
        let reordered = r#"{"checksum":3610638499,"entries":{"pod":{"container2":"1-3","container1":"4-6"}},"defaultCpuSet":"1-3","policyName":"none"}"#;
        v2(reordered).verify_checksum().expect("same values");
    }

    #[test]
    fn a_v2_checkpoint_written_here_verifies_as_the_older_type() {
        let mut cp = CpuManagerCheckpointV2 {
            policy_name: "static".into(),
            default_cpu_set: "0,3".into(),
            entries: BTreeMap::from([(
                "pod-a".into(),
                BTreeMap::from([("c".to_string(), "1-2".to_string())]),
            )]),
            checksum: 0,
        };
        let blob = cp.marshal().expect("marshal");
        // What an older kubelet computes: its struct was called CPUManagerCheckpoint, with no
        // rename in its `VerifyChecksum` (`ck.Verify(cp)` over `dump.ForHash(cp)`).
        let older_dump = cp.dump().replace(V2_TYPE, HASHED_TYPE);
        assert!(older_dump.starts_with("(*state.CPUManagerCheckpoint){"));
        assert_eq!(cp.checksum, fnv32a(older_dump.as_bytes()));
        // Without the rename the newer name would be hashed and the older kubelet would call
        // the file corrupt.
        assert_ne!(cp.checksum, fnv32a(cp.dump().as_bytes()));
        let text = String::from_utf8(blob).expect("utf-8");
        assert_eq!(
            text,
            format!(
                r#"{{"policyName":"static","defaultCpuSet":"0,3","entries":{{"pod-a":{{"c":"1-2"}}}},"checksum":{}}}"#,
                cp.checksum
            )
        );
    }

    #[test]
    fn restore_absent_stored_migrated_and_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = CheckpointManager::new(dir.path()).expect("manager");
        let none = HashMap::new();
        assert_eq!(
            restore(&m, "none", &none).expect("absent"),
            Restored::Absent(CpuManagerState::default())
        );
        assert!(m.path(CPU_MANAGER_STATE_FILE).exists(), "stored at once");

        let state = CpuManagerState {
            default_cpu_set: parse_cpuset("0,4-5").expect("cpuset"),
            assignments: BTreeMap::from([(
                "pod".into(),
                BTreeMap::from([("c".to_string(), parse_cpuset("1-3").expect("cpuset"))]),
            )]),
        };
        store(&m, "static", &state).expect("store");
        assert_eq!(
            restore(&m, "static", &none).expect("restored"),
            Restored::Checkpoint(state)
        );

        // A V1 file migrates through the runtime's containers.
        std::fs::write(
            m.path(CPU_MANAGER_STATE_FILE),
            r#"{"policyName": "none", "defaultCPUSet": "1-3",
                "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 3680390589}"#,
        )
        .expect("write");
        let initial = HashMap::from([
            (
                "containerID1".to_string(),
                ("pod".to_string(), "container1".to_string()),
            ),
            (
                "containerID2".to_string(),
                ("pod".to_string(), "container2".to_string()),
            ),
        ]);
        let Restored::Checkpoint(s) = restore(&m, "none", &initial).expect("migrated") else {
            panic!("not from the checkpoint");
        };
        assert_eq!(format_cpuset(&s.assignments["pod"]["container1"]), "4-6");

        // Corrupt: the kubelet refuses to start, with upstream's words and the file to delete.
        std::fs::write(
            m.path(CPU_MANAGER_STATE_FILE),
            r#"{"policyName": "none", "defaultCPUSet": "4-7", "entries": {}, "checksum": 354655845}"#,
        )
        .expect("write");
        let err = restore(&m, "none", &none).expect_err("corrupt");
        assert_eq!(
            err.to_string(),
            format!(
                "could not restore state from checkpoint: checkpoint is corrupted, please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
                m.path(CPU_MANAGER_STATE_FILE)
            )
        );
        // Another policy is refused too.
        store(&m, "none", &CpuManagerState::default()).expect("store");
        let err = restore(&m, "static", &none).expect_err("policy");
        assert!(
            err.to_string().contains(
                r#"configured policy "static" differs from state checkpoint policy "none""#
            ),
            "{err}"
        );
        // The file is left for the operator: nothing was overwritten.
        assert!(m.path(CPU_MANAGER_STATE_FILE).exists());
    }

    #[test]
    fn cpusets_parse_and_print_as_upstream() {
        assert_eq!(
            format_cpuset(&parse_cpuset("0,4-8,12-15").expect("ok")),
            "0,4-8,12-15"
        );
        assert_eq!(
            parse_cpuset("1.3").expect_err("bad"),
            r#"strconv.Atoi: parsing "1.3": invalid syntax"#
        );
        assert!(parse_cpuset("").expect("empty").is_empty());
    }
}
