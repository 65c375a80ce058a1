//! What the health socket answers, as a pure function of the inventory, the
//! health monitor's snapshot and the pods that hold each device.
//!
//! One [`GpuState`] per GPU as the reference counts them (each partition of
//! a partitioned GPU is one), in `gpu_id` order:
//! - `ID`: the `gpu_id` ([`crate::telemetry::devices::logical_gpus`]), which
//!   is the reference's GPU index (its GPU agent's `Status.Index`, also its
//!   `gpu_id` label and the `<id>` of its node labels);
//! - `UUID`: amd-smi's UUID of the GPU or partition (the `gpu_uuid` label);
//! - `Health`: `"healthy"` or `"unhealthy"`, the monitor's verdict for the
//!   physical GPU (all its partitions alike);
//! - `Device`: the device ID the device plugin (ours, and AMD's, which names
//!   devices the same way) gives it: the PCI bus ID for a whole GPU and for
//!   partition 0, the `amdgpu_xcp_N` platform device for other partitions;
//! - `AssociatedWorkload`: one `pod : P, namespace : N, container: C` per
//!   container holding the device, as the reference (v1.2–v1.3) writes it.
//!
//! A GPU the monitor has no verdict on yet (just hot-added) is left out
//! rather than called healthy. A GPU that vanished stays in the monitor's
//! snapshot as unhealthy; it is listed under the IDs it last had, unless a
//! present GPU has taken that ID since, and with its PCI address as `Device`.

use std::collections::{BTreeMap, BTreeSet};

use super::api::metricssvc::GpuState;
use crate::device::Inventory;
use crate::health::HealthSnapshot;
use crate::plugin::DeviceRef;
use crate::plugin::devices::xcp_names_of;
use crate::pod_resources::{DevicePods, PodRef};
use crate::telemetry::devices::{device_ids, logical_gpus};

/// `GPUState.Health` values: the reference's `GPUHealth` enum names, lower-cased.
pub const HEALTHY: &str = "healthy";
pub const UNHEALTHY: &str = "unhealthy";

/// Every GPU's state (see the module documentation).
pub fn gpu_states(
    inventory: &Inventory,
    health: &HealthSnapshot,
    pods: &DevicePods,
) -> Vec<GpuState> {
    let device_of: BTreeMap<DeviceRef, String> = device_ids(inventory, &xcp_names_of(inventory))
        .into_iter()
        .map(|(id, device)| (device, id))
        .collect();
    let logical = logical_gpus(inventory);
    // IDs present GPUs hold, judged or not: a vanished GPU does not get one.
    let mut taken: BTreeSet<String> = logical.iter().map(|l| l.gpu_id.to_string()).collect();
    let mut states = Vec::new();
    for logical in logical {
        let Some(verdict) = health.gpus.get(&logical.bdf) else {
            continue;
        };
        let device = logical.device_ref();
        let uuid = inventory
            .gpus
            .iter()
            .find(|g| g.bdf == logical.bdf)
            .and_then(|gpu| logical.uuid(gpu))
            .unwrap_or_default();
        states.push(GpuState {
            id: logical.gpu_id.to_string(),
            uuid,
            health: health_word(verdict.healthy).to_owned(),
            associated_workload: pods
                .get(&device)
                .map(|held| held.iter().map(workload).collect())
                .unwrap_or_default(),
            device: device_of
                .get(&device)
                .cloned()
                .unwrap_or_else(|| logical.bdf.clone()),
        });
    }
    let present: BTreeSet<&str> = inventory.gpus.iter().map(|g| g.bdf.as_str()).collect();
    for (bdf, verdict) in &health.gpus {
        if present.contains(bdf.as_str()) {
            continue;
        }
        for id in &verdict.gpu_ids {
            if taken.insert(id.to_string()) {
                states.push(GpuState {
                    id: id.to_string(),
                    uuid: String::new(),
                    health: health_word(verdict.healthy).to_owned(),
                    associated_workload: Vec::new(),
                    device: bdf.clone(),
                });
            }
        }
    }
    states.sort_by_key(|s| s.id.parse::<u64>().unwrap_or(u64::MAX));
    states
}

/// `GetGPUState`: the states of `ids`, in the order asked, as the reference
/// answers: an ID it does not know is left out, one asked twice is there twice.
pub fn select(states: &[GpuState], ids: &[String]) -> Vec<GpuState> {
    ids.iter()
        .filter_map(|id| states.iter().find(|s| s.id == *id).cloned())
        .collect()
}

fn health_word(healthy: bool) -> &'static str {
    if healthy { HEALTHY } else { UNHEALTHY }
}

/// One `AssociatedWorkload` entry, in the reference's words.
fn workload(pod: &PodRef) -> String {
    format!(
        "pod : {}, namespace : {}, container: {}",
        pod.pod, pod.namespace, pod.container
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Gpu;
    use crate::health::GpuHealth;

    /// A GPU at `bdf` split into `partitions` (1: whole), whose partitions
    /// after the first have `amdgpu_xcp_N` platform devices.
    fn gpu(bdf: &str, partitions: u32) -> Gpu {
        let mut gpu = Gpu::split_into(bdf, partitions);
        gpu.unique_id = Some(0x512e_2769_a3f6_a69e);
        for p in &mut gpu.partitions {
            p.render_minor = Some(129 + p.id);
            p.platform_device = (p.id > 0).then(|| format!("amdgpu_xcp_{}", p.id));
        }
        gpu
    }

    fn inventory(gpus: &[(&str, u32)]) -> Inventory {
        Inventory {
            gpus: gpus.iter().map(|(bdf, n)| gpu(bdf, *n)).collect(),
            ..Inventory::default()
        }
    }

    /// The monitor's verdicts: (PCI address, healthy, logical ids).
    fn health(verdicts: &[(&str, bool, &[u32])]) -> HealthSnapshot {
        HealthSnapshot {
            gpus: verdicts
                .iter()
                .map(|(bdf, healthy, ids)| {
                    let verdict = GpuHealth {
                        healthy: *healthy,
                        reasons: if *healthy { vec![] } else { vec!["ECC".into()] },
                        gpu_ids: ids.to_vec(),
                    };
                    (bdf.to_string(), verdict)
                })
                .collect(),
        }
    }

    fn fields(states: &[GpuState]) -> Vec<(&str, &str, &str)> {
        states
            .iter()
            .map(|s| (s.id.as_str(), s.health.as_str(), s.device.as_str()))
            .collect()
    }

    #[test]
    fn one_state_per_gpu_or_partition_named_as_the_device_plugin_names_them() {
        let inventory = inventory(&[("0000:27:00.0", 1), ("0000:05:00.0", 3)]);
        let health = health(&[
            ("0000:05:00.0", false, &[0, 1, 2]),
            ("0000:27:00.0", true, &[3]),
        ]);
        let states = gpu_states(&inventory, &health, &DevicePods::new());
        assert_eq!(
            fields(&states),
            [
                ("0", UNHEALTHY, "0000:05:00.0"),
                ("1", UNHEALTHY, "amdgpu_xcp_1"),
                ("2", UNHEALTHY, "amdgpu_xcp_2"),
                ("3", HEALTHY, "0000:27:00.0"),
            ]
        );
        // amd-smi's UUIDs: the partition index, or 0xff for a whole GPU.
        assert_eq!(states[1].uuid, "510174a1-0000-1000-802e-2769a3f6a69e");
        assert_eq!(states[3].uuid, "51ff74a1-0000-1000-802e-2769a3f6a69e");
    }

    #[test]
    fn workloads_are_the_pods_holding_the_device_in_the_references_words() {
        let inventory = inventory(&[("0000:05:00.0", 1), ("0000:27:00.0", 1)]);
        let health = health(&[("0000:05:00.0", true, &[0]), ("0000:27:00.0", true, &[1])]);
        let pod = |name: &str| PodRef {
            pod: name.into(),
            namespace: "ml".into(),
            container: "main".into(),
            ..PodRef::default()
        };
        // Two pods share the second GPU (time-slicing).
        let pods = DevicePods::from([(
            DeviceRef::gpu("0000:27:00.0"),
            vec![pod("train-a"), pod("train-b")],
        )]);
        let states = gpu_states(&inventory, &health, &pods);
        assert!(states[0].associated_workload.is_empty());
        assert_eq!(
            states[1].associated_workload,
            [
                "pod : train-a, namespace : ml, container: main",
                "pod : train-b, namespace : ml, container: main"
            ]
        );
    }

    #[test]
    fn gpus_without_a_verdict_are_left_out_and_vanished_ones_kept_unless_their_id_moved() {
        let inventory = inventory(&[("0000:05:00.0", 1), ("0000:27:00.0", 1)]);
        // 0000:27:00.0 was just added: no verdict yet. 0000:9a:00.0 is gone:
        // it was GPU 1, which 0000:27:00.0 now is, and GPU 7 before.
        let health = health(&[
            ("0000:05:00.0", true, &[0]),
            ("0000:9a:00.0", false, &[1, 7]),
        ]);
        let states = gpu_states(&inventory, &health, &DevicePods::new());
        assert_eq!(
            fields(&states),
            [
                ("0", HEALTHY, "0000:05:00.0"),
                ("7", UNHEALTHY, "0000:9a:00.0")
            ]
        );
        assert_eq!(states[1].uuid, "", "nothing left to build it from");
    }

    #[test]
    fn get_answers_the_ids_asked_in_order_and_skips_unknown_ones() {
        let inventory = inventory(&[("0000:05:00.0", 1), ("0000:27:00.0", 1)]);
        let health = health(&[("0000:05:00.0", true, &[0]), ("0000:27:00.0", false, &[1])]);
        let states = gpu_states(&inventory, &health, &DevicePods::new());
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = select(&states, &ids(&["1", "9", "0", "1"]));
        assert_eq!(
            got.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["1", "0", "1"]
        );
        assert!(select(&states, &[]).is_empty());
    }
}
