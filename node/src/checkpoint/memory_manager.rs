//! The memory manager's checkpoint, `memory_manager_state` (upstream
//! `pkg/kubelet/cm/memorymanager/state/checkpoint.go`, `state_checkpoint.go`, `state.go`):
//! the policy's name, the machine state per NUMA node and the memory blocks per pod and
//! container, with upstream's JSON and checksum.
//!
//! The rename: upstream now calls this format `MemoryManagerCheckpointV1` and hashes it with
//! that name replaced by `MemoryManagerCheckpoint`, the name the kubelets that wrote it used;
//! skerry's dump names it V1 and applies the same rename, so files move both ways.
//! A corrupt file or another policy refuses the start ([`restore`] -> `RestoreError`).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::cpu_manager::{RestoreError, Restored};
use super::dump::{Dump, checksum};
use super::gojson;
use super::{Checkpoint, CheckpointError, CheckpointManager};

/// The file name under the kubelet's root dir (upstream `memoryManagerStateFileName`).
pub const MEMORY_MANAGER_STATE_FILE: &str = "memory_manager_state";

const V1_TYPE: &str = "state.MemoryManagerCheckpointV1";
const HASHED_TYPE: &str = "state.MemoryManagerCheckpoint";
const S: &str = "MemoryManagerCheckpointV1";

/// Upstream `MemoryTable`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemoryTable {
    #[serde(rename = "total")]
    pub total_mem_size: u64,
    #[serde(rename = "systemReserved")]
    pub system_reserved: u64,
    pub allocatable: u64,
    pub reserved: u64,
    pub free: u64,
}

/// Upstream `NUMANodeState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NumaNodeState {
    #[serde(rename = "numberOfAssignments")]
    pub number_of_assignments: i64,
    /// Resource name (`memory`, `hugepages-2Mi`) -> table.
    #[serde(rename = "memoryMap")]
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// `None` is Go's nil slice (`null`), which dumps differently from `[]`.
    pub cells: Option<Vec<i64>>,
}

/// Upstream `Block`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Block {
    #[serde(rename = "numaAffinity")]
    pub numa_affinity: Option<Vec<i64>>,
    #[serde(rename = "type")]
    pub resource: String,
    pub size: u64,
}

/// The checkpoint (upstream `MemoryManagerCheckpointV1`, formerly `MemoryManagerCheckpoint`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemoryManagerCheckpoint {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    /// NUMA node id -> state.
    #[serde(rename = "machineState")]
    pub machine_state: BTreeMap<i64, NumaNodeState>,
    /// Pod UID -> container name -> blocks.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub entries: BTreeMap<String, BTreeMap<String, Option<Vec<Block>>>>,
    pub checksum: u64,
}

fn ints(d: &mut Dump, v: &Option<Vec<i64>>) {
    d.slice(v.as_deref(), |d, x| d.int(x));
}

fn block(d: &mut Dump, b: &Block) {
    d.struct_body(|f| {
        f.field("NUMAAffinity", "[]int", |d| ints(d, &b.numa_affinity));
        f.field("Type", "v1.ResourceName", |d| d.str(&b.resource));
        f.field("Size", "uint64", |d| d.int(b.size));
    });
}

impl MemoryManagerCheckpoint {
    /// The spew dump of `*MemoryManagerCheckpointV1` with the checksum zeroed.
    pub fn dump(&self) -> String {
        Dump::pointer_struct(V1_TYPE, |f| {
            f.field("PolicyName", "string", |d| d.str(&self.policy_name));
            f.field("MachineState", "state.NUMANodeMap", |d| {
                d.map(
                    &self.machine_state,
                    |d, k| d.int(k),
                    |d, n| {
                        d.untyped_pointer_struct(|f| {
                            f.field("NumberOfAssignments", "int", |d| {
                                d.int(n.number_of_assignments)
                            });
                            f.field("MemoryMap", "map[v1.ResourceName]*state.MemoryTable", |d| {
                                d.map(
                                    &n.memory_map,
                                    |d, k| d.str(k),
                                    |d, t| {
                                        d.untyped_pointer_struct(|f| {
                                            f.field("TotalMemSize", "uint64", |d| {
                                                d.int(t.total_mem_size)
                                            });
                                            f.field("SystemReserved", "uint64", |d| {
                                                d.int(t.system_reserved)
                                            });
                                            f.field("Allocatable", "uint64", |d| {
                                                d.int(t.allocatable)
                                            });
                                            f.field("Reserved", "uint64", |d| d.int(t.reserved));
                                            f.field("Free", "uint64", |d| d.int(t.free));
                                        })
                                    },
                                )
                            });
                            f.field("Cells", "[]int", |d| ints(d, &n.cells));
                        })
                    },
                )
            });
            f.field("Entries", "state.ContainerMemoryAssignments", |d| {
                d.map(
                    &self.entries,
                    |d, k| d.str(k),
                    |d, c| {
                        d.map(
                            c,
                            |d, k| d.str(k),
                            |d, blocks| d.slice(blocks.as_deref(), block),
                        )
                    },
                )
            });
            f.field("Checksum", "checksum.Checksum", |d| d.int(0));
        })
        .0
    }

    /// The checksum (the rename applied).
    pub fn compute_checksum(&self) -> u64 {
        checksum(&self.dump(), Some((V1_TYPE, HASHED_TYPE)))
    }
}

fn p(field: &str) -> String {
    format!("{S}.{field}")
}

fn int_slice(v: Option<&Value>, path: &str) -> Result<Option<Vec<i64>>, CheckpointError> {
    gojson::slice(v, "[]int", path, |x| gojson::int(Some(x), "int", path))
}

fn table(v: &Value) -> Result<MemoryTable, CheckpointError> {
    let path = p("machineState.memoryMap");
    let Value::Object(o) = v else {
        return Err(gojson::mismatch(v, "state.MemoryTable", &path));
    };
    let u = |name: &str| gojson::uint(gojson::field(o, name), "uint64", &p(name));
    Ok(MemoryTable {
        total_mem_size: u("total")?,
        system_reserved: u("systemReserved")?,
        allocatable: u("allocatable")?,
        reserved: u("reserved")?,
        free: u("free")?,
    })
}

fn node(v: &Value) -> Result<NumaNodeState, CheckpointError> {
    let Value::Object(o) = v else {
        return Err(gojson::mismatch(
            v,
            "state.NUMANodeState",
            &p("machineState"),
        ));
    };
    Ok(NumaNodeState {
        number_of_assignments: gojson::int(
            gojson::field(o, "numberOfAssignments"),
            "int",
            &p("machineState.numberOfAssignments"),
        )?,
        memory_map: gojson::string_map(
            gojson::field(o, "memoryMap"),
            "map[v1.ResourceName]*state.MemoryTable",
            &p("machineState.memoryMap"),
            table,
        )?,
        cells: int_slice(gojson::field(o, "cells"), &p("machineState.cells"))?,
    })
}

fn parse_block(v: &Value) -> Result<Block, CheckpointError> {
    let path = p("entries");
    let Value::Object(o) = v else {
        return Err(gojson::mismatch(v, "state.Block", &path));
    };
    Ok(Block {
        numa_affinity: int_slice(gojson::field(o, "numaAffinity"), &path)?,
        resource: gojson::string(gojson::field(o, "type"), &path)?,
        size: gojson::uint(gojson::field(o, "size"), "uint64", &path)?,
    })
}

impl Checkpoint for MemoryManagerCheckpoint {
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.checksum = self.compute_checksum();
        serde_json::to_vec(self).map_err(|e| CheckpointError::Json(e.to_string()))
    }
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
        let o = gojson::parse_object(blob, "state.MemoryManagerCheckpointV1")?;
        *self = MemoryManagerCheckpoint {
            policy_name: gojson::string(gojson::field(&o, "policyName"), &p("policyName"))?,
            machine_state: gojson::int_map(
                gojson::field(&o, "machineState"),
                "state.NUMANodeMap",
                &p("machineState"),
                node,
            )?,
            entries: gojson::string_map(
                gojson::field(&o, "entries"),
                "state.ContainerMemoryAssignments",
                &p("entries"),
                |v| {
                    gojson::string_map(Some(v), "map[string][]state.Block", &p("entries"), |v| {
                        gojson::slice(Some(v), "[]state.Block", &p("entries"), parse_block)
                    })
                },
            )?,
            checksum: gojson::uint(
                gojson::field(&o, "checksum"),
                "checksum.Checksum",
                &p("checksum"),
            )?,
        };
        Ok(())
    }
    fn verify_checksum(&self) -> Result<(), CheckpointError> {
        let actual = self.compute_checksum();
        // Zero accepted "for compatibility with old file backend", as upstream's V1.
        if self.checksum == 0 || self.checksum == actual {
            Ok(())
        } else {
            Err(CheckpointError::Corrupt {
                actual,
                expected: self.checksum,
            })
        }
    }
}

/// The memory manager's state as the managers use it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryManagerState {
    pub machine_state: BTreeMap<i64, NumaNodeState>,
    pub assignments: BTreeMap<String, BTreeMap<String, Option<Vec<Block>>>>,
}

/// Restores the state for `policy_name` (upstream `restoreState`): no file stores an empty
/// state; a corrupt file or another policy refuses the start.
pub fn restore(
    manager: &CheckpointManager,
    policy_name: &str,
) -> Result<Restored<MemoryManagerState>, RestoreError> {
    let fail = |reason: String| RestoreError {
        manager: "memory manager",
        reason,
        path: manager.path(MEMORY_MANAGER_STATE_FILE),
    };
    let mut cp = MemoryManagerCheckpoint::default();
    match manager.get(MEMORY_MANAGER_STATE_FILE, &mut cp) {
        Ok(()) => {}
        Err(CheckpointError::NotFound) => {
            let state = MemoryManagerState::default();
            store(manager, policy_name, &state).map_err(|e| fail(e.to_string()))?;
            return Ok(Restored::Absent(state));
        }
        Err(e) => return Err(fail(e.to_string())),
    }
    if cp.policy_name != policy_name {
        return Err(fail(format!(
            "[memorymanager] configured policy {policy_name:?} differs from state checkpoint policy {:?}",
            cp.policy_name
        )));
    }
    Ok(Restored::Checkpoint(MemoryManagerState {
        machine_state: cp.machine_state,
        assignments: cp.entries,
    }))
}

/// Writes `state` (upstream `storeState`).
pub fn store(
    manager: &CheckpointManager,
    policy_name: &str,
    state: &MemoryManagerState,
) -> Result<(), CheckpointError> {
    let mut cp = MemoryManagerCheckpoint {
        policy_name: policy_name.to_string(),
        machine_state: state.machine_state.clone(),
        entries: state.assignments.clone(),
        checksum: 0,
    };
    manager.create(MEMORY_MANAGER_STATE_FILE, &mut cp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::dump::fnv32a;

    /// Upstream `memorymanager/state/state_checkpoint_test.go`'s V1 fixture, and the file a
    /// kubelet with the `None` policy writes.
    const FIXTURES: &[&str] = &[
        r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":4215593881}"#,
        r#"{"policyName":"None","machineState":{},"checksum":4236770233}"#,
    ];

    fn read(blob: &str) -> MemoryManagerCheckpoint {
        let mut cp = MemoryManagerCheckpoint::default();
        cp.unmarshal(blob.as_bytes()).expect("unmarshal");
        cp
    }

    #[test]
    fn upstream_fixtures_verify_and_round_trip() {
        for f in FIXTURES {
            let mut cp = read(f);
            assert_eq!(cp.compute_checksum(), cp.checksum, "{f}\n{}", cp.dump());
            let before = cp.checksum;
            let blob = cp.marshal().expect("marshal");
            assert_eq!(cp.checksum, before);
            read(std::str::from_utf8(&blob).expect("utf-8"))
                .verify_checksum()
                .expect("round trip");
        }
    }

    #[test]
    fn one_corrupted_byte_and_the_older_name() {
        let bad = FIXTURES[0].replace("\"size\":512", "\"size\":513");
        assert!(matches!(
            read(&bad).verify_checksum(),
            Err(CheckpointError::Corrupt { .. })
        ));
        // `cells: []` and `cells: null` are different values to Go (and to the checksum).
        let nil_cells = FIXTURES[0].replace("\"cells\":[]", "\"cells\":null");
        assert!(read(&nil_cells).verify_checksum().is_err());
        // The checksum is the older type name's: what a kubelet that had no V1 computes.
        let cp = read(FIXTURES[0]);
        let older = cp.dump().replacen(V1_TYPE, HASHED_TYPE, 1);
        assert_eq!(cp.checksum, fnv32a(older.as_bytes()));
        assert_ne!(cp.checksum, fnv32a(cp.dump().as_bytes()));
    }

    #[test]
    fn restore_refuses_a_corrupt_file_and_another_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = CheckpointManager::new(dir.path()).expect("manager");
        assert!(matches!(restore(&m, "Static"), Ok(Restored::Absent(_))));
        std::fs::write(
            m.path(MEMORY_MANAGER_STATE_FILE),
            FIXTURES[0].replace("\"free\":1024", "\"free\":1025"),
        )
        .expect("write");
        let err = restore(&m, "static").expect_err("corrupt");
        assert_eq!(
            err.to_string(),
            format!(
                "could not restore state from checkpoint: checkpoint is corrupted, please drain this node and delete the memory manager checkpoint file {:?} before restarting Kubelet",
                m.path(MEMORY_MANAGER_STATE_FILE)
            )
        );
        std::fs::write(m.path(MEMORY_MANAGER_STATE_FILE), FIXTURES[0]).expect("write");
        let Ok(Restored::Checkpoint(s)) = restore(&m, "static") else {
            panic!("the fixture restores");
        };
        assert_eq!(s.machine_state[&0].memory_map["memory"].free, 1024);
        let err = restore(&m, "None").expect_err("policy");
        assert!(
            err.to_string().contains(
                r#"[memorymanager] configured policy "None" differs from state checkpoint policy "static""#
            ),
            "{err}"
        );
    }
}
