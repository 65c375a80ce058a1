//! Node labels that describe the node's GPUs, in the reference labeller's format,
//! so that existing nodeSelectors keep working.
//!
//! Format, per label kind (`family`, `device-id`, `vram`, ...):
//! - all GPUs agree on the value: `amd.com/gpu.<kind>=<value>`, plus
//!   `beta.amd.com/gpu.<kind>=<value>` and the counter `beta.amd.com/gpu.<kind>.<value>=<count>`;
//! - GPUs differ: `amd.com/gpu.<kind>.<value>=<count>` for each value.
//!
//! Plus single-value labels: `amd.com/gpu.compute-memory-partition` (only when every
//! GPU is in the same mode), `amd.com/gpu.compute-partitioning-supported` and
//! `amd.com/gpu.memory-partitioning-supported`. Values describe physical GPUs: an
//! MI300X in CPX mode counts as one GPU with 304 CUs, not eight partitions.
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
use crate::device::Inventory;
use crate::node_writer::NodeIntent;

/// Annotation in which earlier versions listed the label keys the labeller
/// owned, comma-separated. Read once to hand those keys over, then removed.
pub const OWNED_ANNOTATION: &str = "amd.com/gpu-labeller-keys";

/// Family acronym of a `gfx_target_version` (major*10000 + minor*100 + stepping),
/// as the reference labeller names amdgpu families.
pub fn family(gfx_target_version: u32) -> Option<&'static str> {
    let major = gfx_target_version / 10000;
    let minor = gfx_target_version / 100 % 100;
    let step = gfx_target_version % 100;
    Some(match (major, minor, step) {
        (6, ..) => "SI",
        (7, ..) => "CI",
        (8, 0, 1) => "CZ",
        (8, ..) => "VI",
        (9, 0, 2 | 0xc) | (9, 0, 9) => "RV",
        (9, ..) => "AI",
        (10, 3, 3) => "VGH",
        (10, 3, 5) => "YC",
        (10, 3, 6) => "GC_10_3_6",
        (10, 3, 7) => "GC_10_3_7",
        (10, ..) => "NV",
        (11, 0, 3) => "GC_11_0_1",
        (11, 0, _) => "GC_11_0_0",
        (11, 5, _) => "GC_11_5_0",
        (12, 0, _) => "GC_12_0_0",
        _ => return None,
    })
}

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
/// `DeviceConfigSpec::node_labeller_kinds`).
pub fn desired_labels(inventory: &Inventory, kinds: &[LabelKind]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if inventory.gpus.is_empty() {
        return labels;
    }
    for &kind in kinds {
        match kind {
            LabelKind::ComputeMemoryPartition => {
                let modes: BTreeSet<Option<String>> = inventory
                    .gpus
                    .iter()
                    .map(|g| g.partition_profile())
                    .collect();
                if let [Some(mode)] = modes.into_iter().collect::<Vec<_>>().as_slice() {
                    labels.insert(key(kind), label_value(mode));
                }
            }
            LabelKind::ComputePartitioningSupported | LabelKind::MemoryPartitioningSupported => {
                let supported = inventory.gpus.iter().all(|g| {
                    if kind == LabelKind::ComputePartitioningSupported {
                        g.supports_compute_partitioning()
                    } else {
                        g.supports_memory_partitioning()
                    }
                });
                labels.insert(key(kind), supported.to_string());
            }
            LabelKind::Firmware => firmware_labels(inventory, &mut labels),
            _ => counted_labels(inventory, kind, &mut labels),
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

/// The per-GPU value of a counted kind; `None` when the GPU does not report it.
fn gpu_value(inventory: &Inventory, gpu: &crate::device::Gpu, kind: LabelKind) -> Option<String> {
    let value = match kind {
        LabelKind::Family => family(gpu.gfx_target_version?)?.to_owned(),
        LabelKind::DeviceId => format!("{:x}", gpu.device_id),
        LabelKind::ProductName => gpu.product_name.clone()?,
        LabelKind::Vram => {
            let mib = gpu.vram_bytes? / (1024 * 1024);
            format!("{}G", (mib as f64 / 1024.0).round() as u64)
        }
        LabelKind::CuCount => gpu.cu_count?.to_string(),
        LabelKind::SimdCount => gpu.simd_count?.to_string(),
        LabelKind::DriverVersion => inventory.driver.version.clone()?,
        LabelKind::DriverSrcVersion => inventory.driver.srcversion.clone()?,
        LabelKind::Firmware
        | LabelKind::ComputeMemoryPartition
        | LabelKind::ComputePartitioningSupported
        | LabelKind::MemoryPartitioningSupported => return None,
    };
    let value = label_value(&value);
    (!value.is_empty()).then_some(value)
}

fn counted_labels(inventory: &Inventory, kind: LabelKind, labels: &mut BTreeMap<String, String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for gpu in &inventory.gpus {
        if let Some(value) = gpu_value(inventory, gpu, kind) {
            *counts.entry(value).or_default() += 1;
        }
    }
    let name = kind.as_str();
    // Agreement means every GPU reports the same value; a GPU without a value
    // (a VF without product_name) makes the set non-uniform.
    let reported: usize = counts.values().sum();
    if counts.len() == 1 && reported == inventory.gpus.len() {
        let (value, count) = counts.into_iter().next().unwrap_or_default();
        labels.insert(format!("amd.com/gpu.{name}"), value.clone());
        labels.insert(format!("beta.amd.com/gpu.{name}"), value.clone());
        labels.insert(
            format!("beta.amd.com/gpu.{name}.{value}"),
            count.to_string(),
        );
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
