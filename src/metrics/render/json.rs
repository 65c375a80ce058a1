//! The `/gpumetrics` JSON view: one entry per logical GPU, with its health
//! and pod, and the device-level readings on the primary partition. It must
//! not decide the Prometheus families (that is [`super::families`]'s).

use std::collections::BTreeMap;

use serde::Serialize;

use super::RenderInput;
use super::labels::card_model;
use crate::device::Gpu;
use crate::pod_resources::{PodRef, pods_of};
use crate::telemetry::devices::logical_gpus;
use crate::telemetry::sample::GpuReadings;

/// One logical GPU in the JSON view.
#[derive(Clone, Debug, Serialize)]
pub struct GpuView<'a> {
    pub gpu_id: u32,
    pub bdf: &'a str,
    pub partition_id: u32,
    pub card_model: String,
    pub serial_number: Option<&'a str>,
    pub compute_partition: Option<&'a str>,
    pub memory_partition: Option<&'a str>,
    pub healthy: Option<bool>,
    pub health_reasons: Vec<String>,
    pub pod: Option<&'a PodRef>,
    /// Device-level readings, on the primary partition only.
    pub readings: Option<&'a GpuReadings>,
}

/// The `/gpumetrics` document.
#[derive(Clone, Debug, Serialize)]
pub struct JsonView<'a> {
    pub hostname: &'a str,
    pub sample: SampleInfo,
    pub gpus: Vec<GpuView<'a>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SampleInfo {
    pub taken_at_unix: f64,
    pub duration_ms: f64,
    pub kfd_present: Option<bool>,
}

pub fn json_view<'a>(input: &RenderInput<'a>) -> JsonView<'a> {
    let gpus: BTreeMap<&str, &'a Gpu> = input
        .inventory
        .gpus
        .iter()
        .map(|g| (g.bdf.as_str(), g))
        .collect();
    let views = logical_gpus(input.inventory)
        .into_iter()
        .filter_map(|l| {
            let gpu = *gpus.get(l.bdf.as_str())?;
            let health = input.health.and_then(|h| h.gpus.get(&l.bdf));
            Some(GpuView {
                gpu_id: l.gpu_id,
                bdf: &gpu.bdf,
                partition_id: l.partition,
                card_model: card_model(gpu),
                serial_number: gpu.serial_number.as_deref(),
                compute_partition: gpu.compute_partition.as_deref(),
                memory_partition: gpu.memory_partition.as_deref(),
                healthy: health.map(|h| h.healthy),
                health_reasons: health.map(|h| h.reasons.clone()).unwrap_or_default(),
                pod: pods_of(input.pods, &l.device_ref()).first(),
                readings: l
                    .is_primary()
                    .then(|| input.sample.gpus.get(&gpu.bdf))
                    .flatten(),
            })
        })
        .collect();
    let taken_at_unix = input
        .sample
        .taken_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    JsonView {
        hostname: input.hostname,
        sample: SampleInfo {
            taken_at_unix,
            duration_ms: input.sample.duration_ms,
            kfd_present: input.sample.kfd_present,
        },
        gpus: views,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::render::tests::{health, inventory, sample};
    use crate::telemetry::config::ExporterConfig;

    #[test]
    fn json_view_lists_logical_gpus_with_readings_on_primaries() {
        let (inv, sample, health) = (inventory(), sample(), health());
        let pods = BTreeMap::new();
        let config = ExporterConfig::default();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &pods,
            health: Some(&health),
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let json = serde_json::to_value(json_view(&input)).unwrap();
        let gpus = json["gpus"].as_array().unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[0]["readings"]["temperature"]["edge_c"], 40.0);
        assert!(gpus[1]["readings"].is_null());
        assert_eq!(gpus[1]["partition_id"], 1);
        assert_eq!(gpus[1]["healthy"], false);
        assert_eq!(gpus[2]["gpu_id"], 2);
    }
}
