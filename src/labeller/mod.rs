//! Node labels that describe the node's GPUs, in the reference labeller's format,
//! so that existing nodeSelectors keep working.
//!
//! Every rule here is the reference's: ROCm/k8s-device-plugin,
//! `cmd/k8s-node-labeller/main.go` (`labelGenerators`, `createLabels`) and
//! `internal/pkg/amdgpu/amdgpu.go` (`GetAMDGPUs`, `UniquePartitionConfigCount`,
//! `IsComputePartitionSupported`, `IsMemoryPartitionSupported`).
//!
//! Counted kinds (`family`, `device-id`, `product-name`, `vram`, `cu-count`,
//! `simd-count`), as `createLabels` writes them:
//! - always the counter `beta.amd.com/gpu.<kind>.<value>=<count>` per value;
//! - one value on the node: also `amd.com/gpu.<kind>=<value>` and
//!   `beta.amd.com/gpu.<kind>=<value>`;
//! - several values: also `amd.com/gpu.<kind>.<value>=<count>` per value.
//!
//! A device that has no value for a kind is left out of its count: it neither
//! counts nor makes the node's values differ.
//!
//! What is counted is the reference's device: each PCI function bound to
//! amdgpu, plus each partition's `amdgpu_xcp_*` platform device ([`devices`]).
//! `cu-count`, `simd-count` and `vram` come from the device's own KFD node
//! (matched by render minor), so a CPX MI300X is 64 devices of 38 CUs.
//! `family` and `product-name` the reference reads through libdrm on each
//! device's own card node (product-name from sysfs first, which a partition's
//! card has not, then libdrm): one per device too, the GPU's value. Only
//! `device-id` is read from sysfs alone (`device/device`, which a partition's
//! platform device has not): it counts one per GPU.
//!
//! Single-value labels: `driver-version` and `driver-src-version` (no `beta.`
//! twin), `compute-memory-partition` (only when the GPUs that report a layout
//! all report the same), `compute-partitioning-supported` and
//! `memory-partitioning-supported` (what the first GPU by PCI address offers).
//!
//! Which labels are the labeller's is the API server's to know: they are
//! applied through the Node writer under the labeller's own field manager
//! ([`crate::node_writer`]), so a label it stops wanting is removed and a label
//! someone else wrote is never touched. One exception, on purpose: a label the
//! labeller wants that already exists under the same key (written by AMD's
//! labeller before a migration, say) is taken over, so that it is kept current
//! and removed with the rest. Earlier versions listed their keys in the
//! annotation [`OWNED_ANNOTATION`]; those keys are handed over once and the
//! annotation removed. This module computes labels and intents as plain data;
//! writing them is the Node writer's job.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::NodeLabellerKind as LabelKind;
use crate::api::TimeSlicing;
use crate::device::{Gpu, Inventory, NodeSize};
use crate::node_writer::NodeIntent;

mod operator;

pub use operator::kinds_for;

/// Annotation in which earlier versions listed the label keys the labeller
/// owned, comma-separated. Read once to hand those keys over, then removed.
pub const OWNED_ANNOTATION: &str = "amd.com/gpu-labeller-keys";

pub use crate::device::family;

/// Makes a string a valid label value: at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending with an alphanumeric. Spaces become `_`, parentheses and
/// anything else invalid are dropped, as the reference does with product names.
pub fn label_value(raw: &str) -> String {
    let mapped: String = raw
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('_'),
            c if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') => Some(c),
            _ => None,
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// The labels this node should carry for the selected kinds (normally
/// [`kinds_for`] the node's DeviceConfig).
pub fn desired_labels(inventory: &Inventory, kinds: &[LabelKind]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    // Nothing on a node without GPUs, as the reference's newer labeller
    // (`generateContainerLabels`, branch gpu-virtualization) does; its master
    // would still write an empty driver-version and `false` for the
    // partitioning-supported kinds.
    if inventory.gpus.is_empty() {
        return labels;
    }
    for &kind in kinds {
        match kind {
            LabelKind::ComputeMemoryPartition => {
                // `UniquePartitionConfigCount`: GPUs that report no layout are
                // left out; one layout among the rest is the label.
                let modes: BTreeSet<String> = inventory
                    .gpus
                    .iter()
                    .filter_map(|g| g.partition_profile())
                    .collect();
                if let [mode] = modes.into_iter().collect::<Vec<_>>().as_slice() {
                    labels.insert(key(kind), label_value(mode));
                }
            }
            LabelKind::ComputePartitioningSupported | LabelKind::MemoryPartitioningSupported => {
                labels.insert(
                    key(kind),
                    partitioning_supported(inventory, kind).to_string(),
                );
            }
            LabelKind::DriverVersion | LabelKind::DriverSrcVersion => {
                // A single label, empty when the module reports no version
                // (the inbox driver), as the reference writes it.
                let driver = &inventory.driver;
                let version = if kind == LabelKind::DriverVersion {
                    &driver.version
                } else {
                    &driver.srcversion
                };
                labels.insert(key(kind), label_value(version.as_deref().unwrap_or("")));
            }
            LabelKind::Firmware => firmware_labels(inventory, &mut labels),
            LabelKind::Family
            | LabelKind::DeviceId
            | LabelKind::ProductName
            | LabelKind::Vram
            | LabelKind::CuCount
            | LabelKind::SimdCount => {
                let counts = count_values(inventory, kind);
                counted_labels(kind.as_str(), &counts, &mut labels);
            }
        }
    }
    // A key whose name part is too long (a long product name in a counter key)
    // would make the API server reject the whole patch, every label with it.
    labels.retain(|key, _| {
        let valid = key_name_fits(key);
        if !valid {
            tracing::warn!(label = %key, "label key longer than Kubernetes allows; not written");
        }
        valid
    });
    labels
}

/// Kubernetes allows at most 63 characters after the `prefix/` of a label key.
fn key_name_fits(key: &str) -> bool {
    key.rsplit_once('/').map_or(key, |(_, name)| name).len() <= 63
}

fn key(kind: LabelKind) -> String {
    format!("amd.com/gpu.{}", kind.as_str())
}

/// `IsComputePartitionSupported` / `IsMemoryPartitionSupported`: whether the
/// first GPU by PCI address (the first match of the reference's sorted glob)
/// offers modes. The reference assumes every GPU of a node is the same model.
fn partitioning_supported(inventory: &Inventory, kind: LabelKind) -> bool {
    inventory
        .gpus
        .iter()
        .min_by(|a, b| a.bdf.cmp(&b.bdf))
        .is_some_and(|gpu| {
            if kind == LabelKind::ComputePartitioningSupported {
                gpu.supports_compute_partitioning()
            } else {
                gpu.supports_memory_partitioning()
            }
        })
}

/// The devices the reference labeller counts for one GPU (`GetAMDGPUs`), each
/// with the size its own KFD node reports.
///
/// The PCI function is always one, with the size of the KFD node of its
/// render minor: the whole GPU, or partition 0 when partitioned. Each further
/// partition is one more, when the reference finds it:
/// - its platform device is named `amdgpu_xcp_N` (the reference globs
///   `/sys/devices/platform/amdgpu_xcp_*`; kernels that name it `amdgpu_xcp.N`
///   are not matched, and their partitions are not counted);
/// - the GPU reports both a compute and a memory partition mode, and a NUMA
///   node other than -1 (a partition inherits both from its GPU and is skipped
///   without them).
pub fn devices(gpu: &Gpu) -> Vec<NodeSize> {
    let Some(first) = gpu.partition_sizes.first() else {
        return vec![NodeSize {
            cu_count: gpu.cu_count,
            simd_count: gpu.simd_count,
            vram_bytes: gpu.vram_bytes,
            xcc_count: gpu.xcc_count,
        }];
    };
    let partitions_found = gpu.compute_partition.is_some()
        && gpu.memory_partition.is_some()
        && gpu.numa_node.is_some_and(|n| n != -1);
    let mut devices = vec![*first];
    if partitions_found {
        devices.extend(
            gpu.partitions
                .iter()
                .zip(&gpu.partition_sizes)
                .skip(1)
                .filter(|(p, _)| {
                    p.platform_device
                        .as_deref()
                        .is_some_and(|d| d.starts_with("amdgpu_xcp_"))
                })
                .map(|(_, size)| *size),
        );
    }
    devices
}

/// How many devices report each value of a counted kind.
fn count_values(inventory: &Inventory, kind: LabelKind) -> BTreeMap<String, usize> {
    let mut values: Vec<Option<String>> = Vec::new();
    for gpu in &inventory.gpus {
        match kind {
            // From the device's own KFD node: one value per device.
            LabelKind::Vram | LabelKind::CuCount | LabelKind::SimdCount => {
                values.extend(devices(gpu).iter().map(|size| size_value(size, kind)));
            }
            // Through libdrm on each device's card node: one per device,
            // the GPU's value.
            LabelKind::Family => {
                let value = gpu.gfx_target_version.and_then(family).map(str::to_owned);
                values.extend(std::iter::repeat_n(value, devices(gpu).len()));
            }
            LabelKind::ProductName => {
                values.extend(std::iter::repeat_n(
                    gpu.product_name.clone(),
                    devices(gpu).len(),
                ));
            }
            // From the PCI device's sysfs only: partitions' platform devices
            // have none.
            LabelKind::DeviceId => values.push(Some(format!("{:x}", gpu.device_id))),
            _ => {}
        }
    }
    let mut counts = BTreeMap::new();
    for value in values.into_iter().flatten() {
        let value = label_value(&value);
        if !value.is_empty() {
            *counts.entry(value).or_default() += 1;
        }
    }
    counts
}

/// `vram` in whole GiB, rounded (the reference: MiB, then `math.Round` of
/// MiB / 1024); `cu-count` and `simd-count` as numbers.
fn size_value(size: &NodeSize, kind: LabelKind) -> Option<String> {
    match kind {
        LabelKind::Vram => {
            let mib = size.vram_bytes? / (1024 * 1024);
            Some(format!("{}G", (mib as f64 / 1024.0).round() as u64))
        }
        LabelKind::CuCount => size.cu_count.map(|c| c.to_string()),
        LabelKind::SimdCount => size.simd_count.map(|s| s.to_string()),
        _ => None,
    }
}

/// `createLabels`: the `beta.` counter for every value; with one value the
/// value labels, with several the `amd.com` counters.
fn counted_labels(
    name: &str,
    counts: &BTreeMap<String, usize>,
    labels: &mut BTreeMap<String, String>,
) {
    for (value, count) in counts {
        labels.insert(
            format!("beta.amd.com/gpu.{name}.{value}"),
            count.to_string(),
        );
    }
    if let [(value, _)] = counts.iter().collect::<Vec<_>>().as_slice() {
        labels.insert(format!("amd.com/gpu.{name}"), (*value).clone());
        labels.insert(format!("beta.amd.com/gpu.{name}"), (*value).clone());
    } else {
        for (value, count) in counts {
            labels.insert(format!("amd.com/gpu.{name}.{value}"), count.to_string());
        }
    }
}

/// `beta.amd.com/gpu.firmware.<ENGINE>.fw.<version>=<count>`, as the reference
/// writes them: engine names as it spells them, versions in decimal, counted
/// over GPUs. The reference also writes `<ENGINE>.feat.<version>` feature
/// versions, which it reads through a DRM ioctl; sysfs does not expose them, so
/// they are not produced here.
fn firmware_labels(inventory: &Inventory, labels: &mut BTreeMap<String, String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for gpu in &inventory.gpus {
        for (engine, version) in &gpu.firmware {
            *counts
                .entry(format!("{}.fw.{version}", label_value(engine)))
                .or_default() += 1;
        }
    }
    for (suffix, count) in counts {
        labels.insert(
            format!("beta.amd.com/gpu.firmware.{suffix}"),
            count.to_string(),
        );
    }
}

/// Labels of GPU sharing (NVIDIA's feature discovery writes the same three
/// for its time-slicing, so selectors read alike).
pub const REPLICAS_LABEL: &str = "amd.com/gpu.replicas";
pub const SHARING_STRATEGY_LABEL: &str = "amd.com/gpu.sharing-strategy";
/// Added to the product name of a node whose GPUs are shared under their
/// own resource name, so that a selector can tell it from an exclusive one.
pub const SHARED_PRODUCT_SUFFIX: &str = "-SHARED";
const PRODUCT_NAME_LABELS: [&str; 2] =
    ["amd.com/gpu.product-name", "beta.amd.com/gpu.product-name"];

/// Adds the sharing labels to a node's `labels` (nothing on a node without
/// GPU labels): `amd.com/gpu.replicas=N`, `amd.com/gpu.sharing-strategy` =
/// `time-slicing` or `none`, and, when shared without renaming, the
/// `-SHARED` product name. Pure.
pub fn add_sharing_labels(labels: &mut BTreeMap<String, String>, sharing: &TimeSlicing) {
    if labels.is_empty() {
        return;
    }
    labels.insert(REPLICAS_LABEL.to_owned(), sharing.replicas.to_string());
    let strategy = if sharing.is_shared() {
        "time-slicing"
    } else {
        "none"
    };
    labels.insert(SHARING_STRATEGY_LABEL.to_owned(), strategy.to_owned());
    if sharing.is_shared() && !sharing.rename {
        for key in PRODUCT_NAME_LABELS {
            if let Some(name) = labels.get_mut(key) {
                let room = 63 - SHARED_PRODUCT_SUFFIX.len();
                let kept: String = name.chars().take(room).collect();
                let kept = kept.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                // A value must start with an alphanumeric: a name with
                // none left is just "SHARED".
                *name = if kept.is_empty() {
                    SHARED_PRODUCT_SUFFIX.trim_start_matches('-').to_owned()
                } else {
                    format!("{kept}{SHARED_PRODUCT_SUFFIX}")
                };
            }
        }
    }
}

/// What the labeller wants on a Node whose annotations are given: exactly
/// `desired`, with the keys an earlier version listed in [`OWNED_ANNOTATION`]
/// handed over as the labeller's (and the annotation retired).
pub fn label_intent(
    desired: BTreeMap<String, String>,
    current_annotations: &BTreeMap<String, String>,
) -> NodeIntent {
    let Some(listed) = current_annotations.get(OWNED_ANNOTATION) else {
        return NodeIntent {
            labels: desired,
            ..NodeIntent::default()
        };
    };
    NodeIntent {
        labels: desired,
        retired_labels: listed
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect(),
        retired_annotations: BTreeSet::from([OWNED_ANNOTATION.to_owned()]),
        ..NodeIntent::default()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod compat_tests;
