//! Logical GPUs as the reference exporter numbers them, and the device IDs the
//! kubelet knows them by.
//!
//! The reference (AMD's device-metrics-exporter, through amd-smi) lists every
//! compute partition as a GPU of its own and numbers them in order: by PCI
//! address, then partition. That number is the `gpu_id` label and the `<id>` in
//! the `metricsexporter.amd.com.gpu.<id>.state` node labels. An unpartitioned
//! GPU is one logical GPU with partition id 0. Device IDs are the device plugin's
//! ([`crate::plugin::plan_resources`]), so that pods found through the kubelet's
//! PodResources API map back to GPUs. Pure.

use std::collections::BTreeMap;

use crate::device::{Gpu, Inventory};
use crate::plugin::devices::XcpNames;
use crate::plugin::{DeviceRef, ResourceNamingStrategy, plan_resources};

/// One GPU as the reference counts them: a whole GPU, or one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalGpu {
    pub gpu_id: u32,
    pub bdf: String,
    /// Partition index; 0 for an unpartitioned GPU.
    pub partition: u32,
    /// The GPU is split into several partitions.
    pub partitioned: bool,
}

impl LogicalGpu {
    /// The partition carries the GPU's device-level metrics (power, temperature,
    /// ECC, PCIe): partition 0, which the driver and amd-smi treat as the GPU.
    pub fn is_primary(&self) -> bool {
        self.partition == 0
    }

    /// How the device plugin and health reports name it.
    pub fn device_ref(&self) -> DeviceRef {
        if self.partitioned {
            DeviceRef::partition(self.bdf.clone(), self.partition)
        } else {
            DeviceRef::gpu(self.bdf.clone())
        }
    }

    /// Its UUID as amd-smi builds it, which the reference exports
    /// (`gpu_uuid`) and its health socket sends: a version-1 UUID layout
    /// holding `gpu`'s unique ID (`u`), its PCI device ID and a function
    /// byte: `{u[63:56]}{fn}{device}-0000-1000-80{u[55:48]}-{u[47:0]}`. The
    /// function byte is 0xff for a whole GPU (the reference's documented
    /// `51ff74a1-0000-1000-802e-2769a3f6a69e`); amd-smi puts the partition
    /// index there on partitions, which keeps their UUIDs apart. `None`
    /// without a unique ID.
    pub fn uuid(&self, gpu: &Gpu) -> Option<String> {
        let id = gpu.unique_id?;
        let function = if self.partitioned {
            (self.partition & 0xff) as u8
        } else {
            0xff
        };
        Some(format!(
            "{:02x}{function:02x}{:04x}-0000-1000-80{:02x}-{:012x}",
            id >> 56,
            gpu.device_id,
            (id >> 48) & 0xff,
            id & 0xffff_ffff_ffff,
        ))
    }
}

/// The logical GPUs of an inventory, numbered.
pub fn logical_gpus(inventory: &Inventory) -> Vec<LogicalGpu> {
    let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let mut out = Vec::new();
    for gpu in gpus {
        let mut partitions: Vec<u32> = gpu.partitions.iter().map(|p| p.id).collect();
        partitions.sort_unstable();
        partitions.dedup();
        let partitioned = partitions.len() > 1;
        if partitions.is_empty() {
            partitions.push(0);
        }
        for partition in partitions {
            out.push(LogicalGpu {
                gpu_id: out.len() as u32,
                bdf: gpu.bdf.clone(),
                partition,
                partitioned,
            });
        }
    }
    out
}

/// Device ID (as the kubelet reports it) → the GPU or partition it names.
/// IDs do not depend on the naming strategy; `mixed` is used because it offers
/// every GPU, whatever their partition layouts.
pub fn device_ids(inventory: &Inventory, xcp_names: &XcpNames) -> BTreeMap<String, DeviceRef> {
    plan_resources(inventory, ResourceNamingStrategy::Mixed, xcp_names)
        .resources
        .into_values()
        .flatten()
        .map(|d| {
            let device = match d.partition {
                Some(p) => DeviceRef::partition(d.gpu_bdf, p),
                None => DeviceRef::gpu(d.gpu_bdf),
            };
            (d.id, device)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bdf: &str, partitions: u32) -> Gpu {
        let mut gpu = Gpu::split_into(bdf, partitions);
        (gpu.card, gpu.render_minor) = (Some(0), Some(128));
        for p in &mut gpu.partitions {
            (p.card, p.render_minor, p.kfd_node) = (Some(p.id), Some(128 + p.id), Some(p.id + 2));
        }
        gpu
    }

    #[test]
    fn partitions_are_numbered_after_their_gpu_in_address_order() {
        let inventory = Inventory {
            gpus: vec![gpu("0000:27:00.0", 1), gpu("0000:05:00.0", 3)],
            ..Inventory::default()
        };
        let logical = logical_gpus(&inventory);
        let ids: Vec<(u32, &str, u32, bool)> = logical
            .iter()
            .map(|g| (g.gpu_id, g.bdf.as_str(), g.partition, g.partitioned))
            .collect();
        assert_eq!(
            ids,
            [
                (0, "0000:05:00.0", 0, true),
                (1, "0000:05:00.0", 1, true),
                (2, "0000:05:00.0", 2, true),
                (3, "0000:27:00.0", 0, false),
            ]
        );
    }

    #[test]
    fn uuid_is_amd_smi_s_layout() {
        let gpu = Gpu {
            device_id: 0x74a1,
            unique_id: Some(0x512e_2769_a3f6_a69e),
            ..Gpu::default()
        };
        let whole = LogicalGpu {
            gpu_id: 0,
            bdf: String::new(),
            partition: 0,
            partitioned: false,
        };
        // The example in the reference's documentation.
        assert_eq!(
            whole.uuid(&gpu).as_deref(),
            Some("51ff74a1-0000-1000-802e-2769a3f6a69e")
        );
        let third = LogicalGpu {
            partition: 3,
            partitioned: true,
            ..whole.clone()
        };
        assert_eq!(
            third.uuid(&gpu).as_deref(),
            Some("510374a1-0000-1000-802e-2769a3f6a69e")
        );
        let no_id = Gpu {
            unique_id: None,
            ..gpu
        };
        assert_eq!(whole.uuid(&no_id), None);
    }

    #[test]
    fn device_ids_follow_the_device_plugin() {
        let inventory = Inventory {
            gpus: vec![gpu("0000:05:00.0", 2), gpu("0000:27:00.0", 1)],
            ..Inventory::default()
        };
        let xcp = XcpNames::from([(129, "amdgpu_xcp_0".to_owned())]);
        let ids = device_ids(&inventory, &xcp);
        assert_eq!(
            ids,
            BTreeMap::from([
                (
                    "0000:05:00.0".to_owned(),
                    DeviceRef::partition("0000:05:00.0", 0)
                ),
                (
                    "amdgpu_xcp_0".to_owned(),
                    DeviceRef::partition("0000:05:00.0", 1)
                ),
                ("0000:27:00.0".to_owned(), DeviceRef::gpu("0000:27:00.0")),
            ])
        );
        let logical = logical_gpus(&inventory);
        assert_eq!(
            logical[1].device_ref(),
            DeviceRef::partition("0000:05:00.0", 1)
        );
        assert_eq!(logical[2].device_ref(), DeviceRef::gpu("0000:27:00.0"));
    }
}
