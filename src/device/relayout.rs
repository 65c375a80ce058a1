//! Whether GPUs were repartitioned behind the inventory: their partition
//! modes on sysfs now differ from the modes the inventory has. A device node
//! of such a GPU that is missing belongs to the old layout and is gone on
//! purpose, until discovery names the new one; health checks (the health
//! monitor's, the DRA plugin's) must not take it for a fault.
//!
//! Reads go through the one [`BoundedReader`], two attributes per GPU asked
//! about, in one batch. This module decides nothing about health.

use std::collections::BTreeSet;
use std::time::Duration;

use super::model::Gpu;
use super::modes::{COMPUTE_ATTR, MEMORY_ATTR};
use crate::host::reader::{Answer, BoundedReader, Op};

/// The PCI addresses of `gpus` whose modes on sysfs differ from theirs, as
/// read within `timeout`. A mode that cannot be read is no evidence either
/// way and counts as unchanged.
pub async fn repartitioned(
    reader: &BoundedReader,
    gpus: &[&Gpu],
    timeout: Duration,
) -> BTreeSet<String> {
    if gpus.is_empty() {
        return BTreeSet::new();
    }
    let requests: Vec<(Op, String)> = gpus
        .iter()
        .flat_map(|gpu| {
            let dir = format!("/sys/bus/pci/devices/{}", gpu.bdf);
            [
                (Op::Read, format!("{dir}/{COMPUTE_ATTR}")),
                (Op::Read, format!("{dir}/{MEMORY_ATTR}")),
            ]
        })
        .collect();
    let answers = reader.batch(requests, timeout).await;
    gpus.iter()
        .zip(answers.chunks(2))
        .filter(|(gpu, modes)| {
            let differs = |known: &Option<String>, answer: Option<&Result<Answer, _>>| {
                matches!(answer, Some(Ok(Answer::Text(now)))
                    if known.as_deref() != Some(now.trim().to_ascii_lowercase().as_str()))
            };
            differs(&gpu.compute_partition, modes.first())
                || differs(&gpu.memory_partition, modes.get(1))
        })
        .map(|(gpu, _)| gpu.bdf.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoot;

    #[tokio::test]
    async fn a_gpu_whose_modes_moved_on_is_named_and_an_unreadable_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let gpu = |bdf: &str| Gpu {
            bdf: bdf.into(),
            compute_partition: Some("spx".into()),
            memory_partition: Some("nps1".into()),
            ..Gpu::default()
        };
        let (moved, same, unreadable) = (
            gpu("0000:05:00.0"),
            gpu("0000:26:00.0"),
            gpu("0000:46:00.0"),
        );
        for (bdf, compute) in [("0000:05:00.0", "CPX\n"), ("0000:26:00.0", "SPX\n")] {
            host.write(
                format!("/sys/bus/pci/devices/{bdf}/{COMPUTE_ATTR}"),
                compute,
            )
            .unwrap();
            host.write(
                format!("/sys/bus/pci/devices/{bdf}/{MEMORY_ATTR}"),
                "NPS1\n",
            )
            .unwrap();
        }
        let reader = BoundedReader::new(host, 1);
        let found = repartitioned(
            &reader,
            &[&moved, &same, &unreadable],
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(found, BTreeSet::from(["0000:05:00.0".to_owned()]));
    }
}
