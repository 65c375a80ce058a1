//! GPU nodes found without Node Feature Discovery: which of the labels
//! AMD's `NodeFeatureRule` gives a node its PCI functions call for, and a
//! loop that keeps them on the node's own Node.
//!
//! The agent DaemonSet and the default DeviceConfig select
//! `feature.node.kubernetes.io/amd-gpu=true` (or `amd-vgpu`), which AMD's
//! GPU Operator gets from NFD and its rule. Where NFD is not installed,
//! `gpu-operator detect` runs on every node in a small DaemonSet of its own
//! and sets the same labels from the same facts (PCI vendor 0x1002 and the
//! rule's device ids), so that a fresh cluster ends with agents on exactly
//! its GPU nodes. It reads `/sys/bus/pci/devices` through the host root and
//! writes only its own Node's labels, through the one Node writer, under its
//! own field manager; it must not do anything else (no discovery of GPUs
//! beyond the PCI ids, no other Node).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::device::unbound::{PciGpuFunction, amd_gpu_functions};
use crate::host::HostRoot;
use crate::node_writer::{Concern, NodeIntent, NodeWriter, RETRY_AFTER_FAILURE};

/// A physical AMD GPU the rule knows (any model).
pub const GPU_LABEL: &str = "feature.node.kubernetes.io/amd-gpu";
/// An SR-IOV virtual function of one (a guest's GPU).
pub const VGPU_LABEL: &str = "feature.node.kubernetes.io/amd-vgpu";

/// Device ids of the virtual functions the rule labels `amd-vgpu`.
pub const VF_DEVICE_IDS: &[(u16, &str)] = &[
    (0x7410, "MI210 VF"),
    (0x74b5, "MI300X VF"),
    (0x74bd, "MI300X HF VF"),
    (0x74b6, "MI308X VF"),
    (0x74bc, "MI308X HF VF"),
    (0x74b9, "MI325X VF"),
    (0x75b8, "MI350P VF"),
    (0x75b0, "MI350X VF"),
    (0x75b3, "MI355X VF"),
    (0x7461, "Radeon Pro V710 MxGPU"),
    (0x73ae, "Radeon Pro V620 MxGPU"),
];

/// Device ids of the physical GPUs the rule labels `amd-gpu`.
pub const GPU_DEVICE_IDS: &[(u16, &str)] = &[
    (0x75a3, "MI355X"),
    (0x75a0, "MI350X"),
    (0x75a8, "MI350P"),
    (0x74a5, "MI325X"),
    (0x74a2, "MI308X"),
    (0x74a8, "MI308X HF"),
    (0x74a0, "MI300A"),
    (0x74a1, "MI300X"),
    (0x74a9, "MI300X HF"),
    (0x740f, "MI210"),
    (0x7408, "MI250X"),
    (0x740c, "MI250/MI250X"),
    (0x738c, "MI100"),
    (0x738e, "MI100"),
    (0x7460, "V710"),
    (0x7448, "W7900"),
    (0x744b, "W7900D"),
    (0x744a, "W7900 Dual Slot"),
    (0x7449, "W7800 48GB"),
    (0x745e, "W7800"),
    (0x73a2, "W6900X"),
    (0x73a3, "W6800 GL-XL"),
    (0x73ab, "W6800X / W6800X Duo"),
    (0x73a1, "V620"),
    (0x7551, "AI PRO R9700 / R9700S / R9600D"),
    (0x7550, "RX 9070 / 9070 XT"),
    (0x744c, "RX 7900 XT / 7900 XTX / 7900 GRE / 7900M"),
    (0x73af, "RX 6900 XT"),
    (0x73bf, "RX 6800 / 6800 XT / 6900 XT"),
    (0x7590, "RX 9060 XT"),
];

/// The rule's per-model labels: `feature.node.kubernetes.io/amd-gpu-<model>`.
pub const MODEL_LABELS: &[(u16, &str)] = &[
    (0x740f, "feature.node.kubernetes.io/amd-gpu-mi210"),
    (0x74a1, "feature.node.kubernetes.io/amd-gpu-mi300x"),
];

/// The labels the rule gives a node with these PCI functions, each `"true"`.
/// Pure.
pub fn labels_for(functions: &[PciGpuFunction]) -> BTreeMap<String, String> {
    let has = |ids: &[(u16, &str)], f: &PciGpuFunction| {
        f.device_id
            .is_some_and(|id| ids.iter().any(|(known, _)| *known == id))
    };
    let mut labels = BTreeMap::new();
    for f in functions {
        if has(GPU_DEVICE_IDS, f) {
            labels.insert(GPU_LABEL.to_owned(), "true".to_owned());
        }
        if has(VF_DEVICE_IDS, f) {
            labels.insert(VGPU_LABEL.to_owned(), "true".to_owned());
        }
        for (id, label) in MODEL_LABELS {
            if f.device_id == Some(*id) {
                labels.insert((*label).to_owned(), "true".to_owned());
            }
        }
    }
    labels
}

/// How `detect` runs.
#[derive(Clone, Debug)]
pub struct DetectConfig {
    pub host: HostRoot,
    /// How often the PCI bus is looked at again: GPUs come and go only with
    /// a maintenance window, so rarely.
    pub recheck: Duration,
}

/// Keeps the labels [`labels_for`] the host's PCI functions call for on
/// `writer`'s Node (and no other label of this concern) until `stop`. A
/// failed write is tried again after [`RETRY_AFTER_FAILURE`]. Returns the
/// labels last written, for the caller's log.
pub async fn run(
    writer: NodeWriter,
    config: DetectConfig,
    stop: CancellationToken,
) -> BTreeMap<String, String> {
    let mut written: Option<BTreeMap<String, String>> = None;
    loop {
        let host = config.host.clone();
        let functions = tokio::task::spawn_blocking(move || amd_gpu_functions(&host))
            .await
            .unwrap_or_default();
        let labels = labels_for(&functions);
        let wait = if written.as_ref() == Some(&labels) {
            config.recheck
        } else {
            let intent = NodeIntent {
                labels: labels.clone(),
                ..NodeIntent::default()
            };
            match writer.apply(Concern::Detect, &intent).await {
                Ok(_) => {
                    tracing::info!(
                        node = %writer.name(),
                        gpus = functions.len(),
                        labels = ?labels.keys().collect::<Vec<_>>(),
                        "node labels for the AMD GPUs on the PCI bus"
                    );
                    written = Some(labels);
                    config.recheck
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot label the node; will retry");
                    RETRY_AFTER_FAILURE
                }
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return written.unwrap_or_default(),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(device_id: u16) -> PciGpuFunction {
        PciGpuFunction {
            bdf: "0000:05:00.0".into(),
            device_id: Some(device_id),
            driver: None,
        }
    }

    #[test]
    fn the_rules_labels_follow_the_device_ids() {
        assert_eq!(
            labels_for(&[function(0x74a1)]),
            BTreeMap::from([
                (GPU_LABEL.to_owned(), "true".to_owned()),
                (
                    "feature.node.kubernetes.io/amd-gpu-mi300x".to_owned(),
                    "true".to_owned()
                ),
            ])
        );
        assert_eq!(
            labels_for(&[function(0x74b5)]),
            BTreeMap::from([(VGPU_LABEL.to_owned(), "true".to_owned())])
        );
        // An AMD display function the rule does not name (an APU's iGPU,
        // say) is not a GPU node.
        assert!(labels_for(&[function(0x1681)]).is_empty());
        assert!(labels_for(&[]).is_empty());
    }

    #[test]
    fn simulated_hosts_are_labelled_as_the_rule_labels_their_models() {
        use crate::simulate::{self, SimSpec};
        for (profile, wanted) in [
            ("mi300x", Some(GPU_LABEL)),
            ("mi210", Some(GPU_LABEL)),
            ("mi300x-vf", Some(VGPU_LABEL)),
            ("radeon-w7900", Some(GPU_LABEL)),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let host = HostRoot::new(dir.path());
            let mut spec = SimSpec::new(profile, Some(1), None).unwrap();
            // A fresh node: no amdgpu bound yet.
            spec.driver_loaded = false;
            simulate::write_host(&host, &spec).unwrap();
            let labels = labels_for(&amd_gpu_functions(&host));
            assert_eq!(
                wanted.map(|w| labels.contains_key(w)),
                Some(true),
                "{profile}: {labels:?}"
            );
        }
        let empty = tempfile::tempdir().unwrap();
        assert!(labels_for(&amd_gpu_functions(&HostRoot::new(empty.path()))).is_empty());
    }
}
