//! The device manager's checkpoint, `device-plugins/kubelet_internal_checkpoint` (upstream
//! `pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go`): the devices allocated to each
//! pod's containers and the devices each plugin registered. The checksum covers `Data` only.
//!
//! Unlike the CPU and memory managers' files, a bad device checkpoint does not stop the
//! kubelet: upstream's `ManagerImpl.Start` logs "Continue after failing to read checkpoint
//! file. Device allocation info may NOT be up-to-date" and starts empty (the plugins
//! re-register and report their devices again). [`restore`] does the same.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use tracing::warn;

use super::dump::{Dump, checksum};
use super::gojson;
use super::{Checkpoint, CheckpointError, CheckpointManager};

/// The directory under the kubelet's root dir (upstream `DevicePluginPath`'s last element).
pub const DEVICE_PLUGINS_DIR: &str = "device-plugins";
/// The file name (upstream `kubeletDeviceManagerCheckpoint`).
pub const DEVICE_MANAGER_CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// Upstream `PodDevicesEntry` (JSON by Go field name: the struct has no tags).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub container_name: String,
    pub resource_name: String,
    /// NUMA node (`-1`: none) -> device ids (`DevicesPerNUMA`).
    #[serde(rename = "DeviceIDs")]
    pub device_ids: BTreeMap<i64, Option<Vec<String>>>,
    /// The plugin's `Allocate` answer in protobuf, base64 in JSON as Go's `[]byte`.
    #[serde(serialize_with = "bytes_b64")]
    pub alloc_resp: Option<Vec<u8>>,
}

fn bytes_b64<S: serde::Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
    }
}

/// Upstream `checkpointData`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeviceData {
    pub pod_device_entries: Option<Vec<PodDevicesEntry>>,
    pub registered_devices: BTreeMap<String, Option<Vec<String>>>,
}

/// Upstream `Data`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DeviceManagerCheckpoint {
    pub data: DeviceData,
    pub checksum: u64,
}

fn strings(d: &mut Dump, v: &Option<Vec<String>>) {
    d.slice(v.as_deref(), |d, s| d.str(s));
}

impl DeviceData {
    /// The spew dump of the `checkpointData` value (not a pointer: `checksum.New(cp.Data)`).
    pub fn dump(&self) -> String {
        Dump::value_struct("checkpoint.checkpointData", |f| {
            f.field("PodDeviceEntries", "[]checkpoint.PodDevicesEntry", |d| {
                d.slice(self.pod_device_entries.as_deref(), |d, e| {
                    d.struct_body(|f| {
                        f.field("PodUID", "string", |d| d.str(&e.pod_uid));
                        f.field("ContainerName", "string", |d| d.str(&e.container_name));
                        f.field("ResourceName", "string", |d| d.str(&e.resource_name));
                        f.field("DeviceIDs", "checkpoint.DevicesPerNUMA", |d| {
                            d.map(&e.device_ids, |d, k| d.int(k), strings)
                        });
                        f.field("AllocResp", "[]uint8", |d| {
                            d.slice(e.alloc_resp.as_deref(), |d, b| d.int(b))
                        });
                    })
                })
            });
            f.field("RegisteredDevices", "map[string][]string", |d| {
                d.map(&self.registered_devices, |d, k| d.str(k), strings)
            });
        })
        .0
    }
}

fn string_slice(v: Option<&Value>, path: &str) -> Result<Option<Vec<String>>, CheckpointError> {
    gojson::slice(v, "[]string", path, |x| gojson::str_value(x, path))
}

fn entry(v: &Value) -> Result<PodDevicesEntry, CheckpointError> {
    let path = "checkpointData.PodDeviceEntries";
    let Value::Object(o) = v else {
        return Err(gojson::mismatch(v, "checkpoint.PodDevicesEntry", path));
    };
    let alloc_resp = match gojson::field(o, "AllocResp") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| CheckpointError::Json(format!("illegal base64 data: {e}")))?,
        ),
        Some(other) => return Err(gojson::mismatch(other, "[]uint8", path)),
    };
    Ok(PodDevicesEntry {
        pod_uid: gojson::string(gojson::field(o, "PodUID"), path)?,
        container_name: gojson::string(gojson::field(o, "ContainerName"), path)?,
        resource_name: gojson::string(gojson::field(o, "ResourceName"), path)?,
        device_ids: gojson::int_map(
            gojson::field(o, "DeviceIDs"),
            "checkpoint.DevicesPerNUMA",
            path,
            |v| string_slice(Some(v), path),
        )?,
        alloc_resp,
    })
}

impl Checkpoint for DeviceManagerCheckpoint {
    fn marshal(&mut self) -> Result<Vec<u8>, CheckpointError> {
        self.checksum = checksum(&self.data.dump(), None);
        serde_json::to_vec(self).map_err(|e| CheckpointError::Json(e.to_string()))
    }
    fn unmarshal(&mut self, blob: &[u8]) -> Result<(), CheckpointError> {
        let o = gojson::parse_object(blob, "checkpoint.Data")?;
        let data = match gojson::field(&o, "Data") {
            None | Some(Value::Null) => DeviceData::default(),
            Some(Value::Object(d)) => DeviceData {
                pod_device_entries: gojson::slice(
                    gojson::field(d, "PodDeviceEntries"),
                    "[]checkpoint.PodDevicesEntry",
                    "Data.Data.PodDeviceEntries",
                    entry,
                )?,
                registered_devices: gojson::string_map(
                    gojson::field(d, "RegisteredDevices"),
                    "map[string][]string",
                    "Data.Data.RegisteredDevices",
                    |v| string_slice(Some(v), "Data.Data.RegisteredDevices"),
                )?,
            },
            Some(other) => {
                return Err(gojson::mismatch(
                    other,
                    "checkpoint.checkpointData",
                    "Data.Data",
                ));
            }
        };
        *self = DeviceManagerCheckpoint {
            data,
            checksum: gojson::uint(
                gojson::field(&o, "Checksum"),
                "checksum.Checksum",
                "Data.Checksum",
            )?,
        };
        Ok(())
    }
    fn verify_checksum(&self) -> Result<(), CheckpointError> {
        // No zero exception here: upstream's `cp.Checksum.Verify(cp.Data)`.
        let actual = checksum(&self.data.dump(), None);
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

/// Reads the device checkpoint at start (upstream `readCheckpoint` from `Start`): absent or
/// unreadable, the device manager starts empty, with upstream's log line for the latter.
pub fn restore(manager: &CheckpointManager) -> DeviceData {
    let mut cp = DeviceManagerCheckpoint::default();
    match manager.get(DEVICE_MANAGER_CHECKPOINT_FILE, &mut cp) {
        Ok(()) => cp.data,
        Err(CheckpointError::NotFound) => DeviceData::default(),
        Err(e) => {
            warn!(error = %e, "Continue after failing to read checkpoint file. Device allocation info may NOT be up-to-date");
            DeviceData::default()
        }
    }
}

/// Writes the device manager's data.
pub fn store(manager: &CheckpointManager, data: &DeviceData) -> Result<(), CheckpointError> {
    let mut cp = DeviceManagerCheckpoint {
        data: data.clone(),
        checksum: 0,
    };
    manager.create(DEVICE_MANAGER_CHECKPOINT_FILE, &mut cp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files upstream kubelets wrote (a GPU plugin's registration without allocations, and
    /// an allocation with its `AllocResp`), byte for byte.
    const FIXTURES: &[&str] = &[
        r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#,
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#,
    ];

    fn read(blob: &str) -> DeviceManagerCheckpoint {
        let mut cp = DeviceManagerCheckpoint::default();
        cp.unmarshal(blob.as_bytes()).expect("unmarshal");
        cp
    }

    #[test]
    fn kubelet_written_files_verify_and_round_trip_byte_for_byte() {
        for f in FIXTURES {
            let mut cp = read(f);
            cp.verify_checksum()
                .unwrap_or_else(|e| panic!("{e}: {f}\n{}", cp.data.dump()));
            let blob = cp.marshal().expect("marshal");
            assert_eq!(std::str::from_utf8(&blob).expect("utf-8"), *f);
        }
    }

    #[test]
    fn a_corrupt_device_checkpoint_is_ignored_not_fatal() {
        let bad = FIXTURES[1].replace("\"tegra\"]},\"AllocResp", "\"tegrb\"]},\"AllocResp");
        assert!(matches!(
            read(&bad).verify_checksum(),
            Err(CheckpointError::Corrupt { .. })
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let m = CheckpointManager::new(dir.path().join(DEVICE_PLUGINS_DIR)).expect("manager");
        std::fs::write(m.path(DEVICE_MANAGER_CHECKPOINT_FILE), bad).expect("write");
        assert_eq!(restore(&m), DeviceData::default());
        std::fs::write(m.path(DEVICE_MANAGER_CHECKPOINT_FILE), FIXTURES[1]).expect("write");
        let data = restore(&m);
        assert_eq!(
            data.registered_devices["nvidia.com/gpu"],
            Some(vec!["tegra".to_string()])
        );
        store(&m, &data).expect("store");
        assert_eq!(
            std::fs::read_to_string(m.path(DEVICE_MANAGER_CHECKPOINT_FILE)).expect("read"),
            FIXTURES[1]
        );
    }
}
