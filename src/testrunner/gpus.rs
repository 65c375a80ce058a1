//! The GPUs a test can run on, numbered the way the test tools and the
//! reference's labels number them.
//!
//! RVS (`-i`), AGFHC (`-i`) and the reference's labels use the amd-smi GPU
//! index: GPUs in PCI address order, each compute partition counting as one GPU.
//! Tests run on whole GPUs (the reference's RVS recipes do not support
//! partitioned GPUs), so a partitioned GPU is named by the index of its first
//! partition. The KFD id is the topology node's `gpu_id`, read from the host at
//! the edge ([`read_targets`]); everything else here is pure.

use crate::device::{Gpu, Inventory};
use crate::host::HostRoot;

use super::report::GpuLabel;

/// A GPU a test runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetGpu {
    /// PCI address: how the agent (health, device plugin) names the GPU.
    pub bdf: String,
    /// amd-smi GPU index: how the tools and the labels name it.
    pub index: u32,
    /// KFD `gpu_id`, when the topology could be read.
    pub kfd_id: Option<u64>,
    /// Model directory for per-model recipes (`MI300X`), when known.
    pub model: Option<&'static str>,
}

impl TargetGpu {
    pub fn label(&self) -> GpuLabel {
        GpuLabel {
            index: self.index,
            kfd_id: self.kfd_id,
        }
    }
}

/// Numbers the inventory's GPUs (without KFD ids).
pub fn number_gpus(inventory: &Inventory) -> Vec<TargetGpu> {
    let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let mut next = 0u32;
    gpus.into_iter()
        .map(|gpu| {
            let index = next;
            next += u32::try_from(gpu.partitions.len().max(1)).unwrap_or(1);
            TargetGpu {
                bdf: gpu.bdf.clone(),
                index,
                kfd_id: None,
                model: model_dir(gpu.device_id),
            }
        })
        .collect()
}

/// Numbers the inventory's GPUs and reads their KFD ids from the host.
pub(super) fn read_targets(inventory: &Inventory, host: &HostRoot) -> Vec<TargetGpu> {
    let mut targets = number_gpus(inventory);
    for target in &mut targets {
        let kfd_node = inventory
            .gpus
            .iter()
            .find(|g| g.bdf == target.bdf)
            .and_then(|g| g.kfd_node);
        target.kfd_id = kfd_node.and_then(|node| {
            host.read_parsed::<u64>(
                format!("{}/nodes/{node}/gpu_id", crate::device::kfd::TOPOLOGY_DIR),
                "a KFD gpu_id",
            )
            .ok()
        });
    }
    targets
}

/// The recipe sub-directory the reference uses for a GPU model, by PCI device id.
pub fn model_dir(device_id: u16) -> Option<&'static str> {
    Some(match device_id {
        0x740f | 0x7410 => "MI210",
        0x74a0 => "MI300A",
        0x74a1 | 0x74b5 => "MI300X",
        0x74a2 => "MI308X",
        0x74a5 | 0x74b9 => "MI325X",
        0x74a9 | 0x74bd => "MI300X-HF",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bdf: &str, partitions: u32) -> Gpu {
        Gpu::split_into(bdf, partitions)
    }

    #[test]
    fn numbers_by_address_and_counts_partitions() {
        let inventory = Inventory {
            gpus: vec![
                gpu("0000:27:00.0", 0),
                gpu("0000:05:00.0", 8),
                gpu("0000:49:00.0", 0),
            ],
            ..Inventory::default()
        };
        let numbered: Vec<(String, u32)> = number_gpus(&inventory)
            .into_iter()
            .map(|t| (t.bdf, t.index))
            .collect();
        assert_eq!(
            numbered,
            vec![
                ("0000:05:00.0".to_owned(), 0),
                ("0000:27:00.0".to_owned(), 8),
                ("0000:49:00.0".to_owned(), 9)
            ]
        );
        assert_eq!(number_gpus(&inventory)[0].model, Some("MI300X"));
        assert_eq!(model_dir(0x1234), None);
    }
}
