//! The labels of one logical GPU's series, as the reference exporter sets
//! them: its identity, the board's model and vendor, the deployment mode,
//! the KFD node, and the pod that holds it. Pure; it must not choose which
//! series exist (that is [`super::families`]'s).

use std::collections::BTreeMap;

use super::RenderInput;
use crate::device::Gpu;
use crate::pod_resources::PodRef;
use crate::telemetry::devices::LogicalGpu;

/// The labels of one logical GPU as held by `pod` (the default: none),
/// sorted by name.
pub(super) fn gpu_labels(
    input: &RenderInput<'_>,
    gpu: &Gpu,
    logical: &LogicalGpu,
    pod: &PodRef,
) -> Vec<(String, String)> {
    let pod = pod.clone();
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        ("gpu_id".into(), logical.gpu_id.to_string()),
        ("serial_number".into(), text(&gpu.serial_number)),
        ("card_model".into(), card_model(gpu)),
        ("hostname".into(), input.hostname.to_owned()),
        ("gpu_partition_id".into(), logical.partition.to_string()),
        (
            "gpu_compute_partition_type".into(),
            gpu.compute_partition
                .clone()
                .unwrap_or_else(|| "none".into()),
        ),
        (
            "gpu_memory_partition_type".into(),
            gpu.memory_partition
                .clone()
                .unwrap_or_else(|| "none".into()),
        ),
        ("deployment_mode".into(), deployment_mode(gpu).into()),
        ("pod".into(), pod.pod),
        ("namespace".into(), pod.namespace),
        ("container".into(), pod.container),
        // The reference always sets these; they name a Slurm job, and
        // under Kubernetes there is none.
        ("job_id".into(), String::new()),
        ("job_user".into(), String::new()),
        ("job_partition".into(), String::new()),
    ]);
    let optional = &input.config.labels;
    if optional.contains("GPU_UUID") {
        labels.insert("gpu_uuid".into(), logical.uuid(gpu).unwrap_or_default());
    }
    if optional.contains("CARD_SERIES") {
        // amd-smi's board product name.
        labels.insert("card_series".into(), text(&gpu.product_name));
    }
    if optional.contains("CARD_VENDOR") {
        labels.insert("card_vendor".into(), card_vendor(gpu));
    }
    if optional.contains("POD_UUID") {
        labels.insert("pod_uuid".into(), pod.uid.clone());
    }
    for (name, pod_label) in &input.config.extra_pod_labels {
        let value = pod.labels.get(pod_label).cloned().unwrap_or_default();
        labels.entry(name.clone()).or_insert(value);
    }
    if optional.contains("KFD_PROCESS_ID") {
        // The pids with queues on this partition's KFD node, ascending,
        // comma-separated, as the reference joins them.
        let node = kfd_node(gpu, logical.partition);
        let pids: Vec<String> = node
            .and_then(|n| input.sample.kfd_processes.get(&n))
            .map(|pids| pids.iter().map(u32::to_string).collect())
            .unwrap_or_default();
        labels.insert("kfd_process_id".into(), pids.join(","));
    }
    if optional.contains("VBIOS_VERSION") {
        labels.insert("vbios_version".into(), text(&gpu.vbios_version));
    }
    if optional.contains("DRIVER_VERSION") {
        labels.insert(
            "driver_version".into(),
            text(&input.inventory.driver.version),
        );
    }
    for (name, value) in &input.config.custom_labels {
        labels.entry(name.clone()).or_insert_with(|| value.clone());
    }
    labels.into_iter().collect()
}

/// The KFD topology node of a GPU's partition (the GPU's own when it is not
/// partitioned).
pub(super) fn kfd_node(gpu: &Gpu, partition: u32) -> Option<u32> {
    gpu.partitions
        .iter()
        .find(|p| p.id == partition)
        .and_then(|p| p.kfd_node)
        .or(gpu.kfd_node)
}

/// `card_model` as the reference fills it: amd-smi's board model number
/// (sysfs `product_number`), else the card series (`product_name`); else,
/// where the reference falls back to amd-smi's market name from its own ID
/// table, the PCI device ID (virtual functions have neither file).
pub(super) fn card_model(gpu: &Gpu) -> String {
    gpu.product_number
        .clone()
        .or_else(|| gpu.product_name.clone())
        .unwrap_or_else(|| format!("0x{:04x}", gpu.device_id))
}

/// `card_vendor` as the reference fills it: amd-smi's board manufacturer
/// (sysfs `manufacturer`), else the PCI vendor's name in the PCI ID
/// database, which is this one for every GPU amdgpu drives.
fn card_vendor(gpu: &Gpu) -> String {
    gpu.manufacturer
        .clone()
        .unwrap_or_else(|| "Advanced Micro Devices, Inc. [AMD/ATI]".into())
}

/// PCI device IDs of AMD's SR-IOV virtual functions, as the reference
/// operator lists them for vGPU nodes (MI355X, MI350X, MI325X, MI308X,
/// MI308X-HF, MI300X, MI300X-HF, MI210).
const VF_DEVICE_IDS: &[u16] = &[
    0x75b3, 0x75b0, 0x74b9, 0x74b6, 0x74bc, 0x74b5, 0x74bd, 0x7410,
];

/// The reference's `deployment_mode`: its GPU agent's virtualization mode
/// mapped to `baremetal`, `hypervisor` (host), `vm_vf` (guest) or `vm_pf`
/// (passthrough), `baremetal` when unknown. amdgpu bound to a virtual
/// function is a guest. A whole GPU passed through to a VM is not told apart
/// from bare metal here (the kernel's hint is the CPU's hypervisor flag, which
/// is not read), and a hypervisor's GPUs are bound to AMD's host driver, not
/// amdgpu, so they are never seen.
fn deployment_mode(gpu: &Gpu) -> &'static str {
    if VF_DEVICE_IDS.contains(&gpu.device_id) {
        "vm_vf"
    } else {
        "baremetal"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Inventory;
    use crate::metrics::render::families;
    use crate::metrics::render::tests::{family, label, sample};
    use crate::telemetry::config::parse_config;

    #[test]
    fn card_labels_come_from_the_board_as_amd_smi_reads_it() {
        let board = Gpu {
            device_id: 0x74a1,
            product_name: Some("AMD Instinct MI300X".into()),
            product_number: Some("102-X".into()),
            manufacturer: Some("AMD".into()),
            ..Gpu::default()
        };
        assert_eq!(card_model(&board), "102-X");
        assert_eq!(card_vendor(&board), "AMD");
        let older_kernel = Gpu {
            product_number: None,
            manufacturer: None,
            ..board.clone()
        };
        assert_eq!(card_model(&older_kernel), "AMD Instinct MI300X");
        assert_eq!(
            card_vendor(&older_kernel),
            "Advanced Micro Devices, Inc. [AMD/ATI]"
        );
        let config =
            parse_config(r#"{"GPUConfig": {"Labels": ["CARD_SERIES", "CARD_VENDOR"]}}"#).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        let inv = Inventory {
            gpus: vec![Gpu {
                bdf: "0000:05:00.0".into(),
                ..board
            }],
            ..Inventory::default()
        };
        let sample = sample();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &BTreeMap::new(),
            health: None,
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let families = families(&input);
        let edge = &family(&families, "gpu_edge_temperature").series[0];
        assert_eq!(label(edge, "card_series"), "AMD Instinct MI300X");
        assert_eq!(label(edge, "card_vendor"), "AMD");
        assert_eq!(label(edge, "card_model"), "102-X");
    }
}
