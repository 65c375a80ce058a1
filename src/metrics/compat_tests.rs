//! Compatibility fixtures: the metric family names and GPU label names we
//! write on a simulated MI300X (gpu_metrics v1.8) in CPX/NPS4 mode, as
//! expected-output tables. Each name was checked against the reference
//! exporter's field and label enums (its `exporterconfig.proto`) and the
//! per-family labels its GPU agent client adds; the tables are written for
//! this project, not copied. (`gpu_vcn_activity`, `gpu_jpeg_activity` and
//! `gpu_mma_activity` are absent: MI300's firmware leaves those device-level
//! fields unset, and the reference lists them as deprecated.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::render::{RenderInput, families};
use crate::host::HostRoot;
use crate::host::reader::BoundedReader;
use crate::simulate::{SimSpec, write_host};
use crate::telemetry::config::parse_config;
use crate::telemetry::sample::{Sampler, Scope};

/// GPU families on the simulated MI300X, in the reference's names.
const FAMILIES: &[&str] = &[
    "gpu_nodes_total",
    "gpu_package_power",
    "gpu_average_package_power",
    "gpu_power_usage",
    "gpu_energy_consumed",
    "gpu_edge_temperature",
    "gpu_junction_temperature",
    "gpu_memory_temperature",
    "gpu_gfx_activity",
    "gpu_umc_activity",
    "gpu_total_vram",
    "gpu_used_vram",
    "gpu_free_vram",
    "gpu_total_visible_vram",
    "gpu_used_visible_vram",
    "gpu_free_visible_vram",
    "gpu_total_gtt",
    "gpu_used_gtt",
    "gpu_free_gtt",
    "pcie_speed",
    "pcie_max_speed",
    "pcie_replay_count",
    "gpu_ecc_correct_total",
    "gpu_ecc_uncorrect_total",
    "gpu_ecc_deferred_total",
    "pcie_bandwidth",
    "pcie_recovery_count",
    "pcie_replay_rollover_count",
    "pcie_nack_sent_count",
    "pcie_nack_received_count",
    "gpu_vram_max_bandwidth",
    "gpu_violation_current_accumulated_counter",
    "gpu_violation_processor_hot_residency_accumulated",
    "gpu_violation_ppt_residency_accumulated",
    "gpu_violation_socket_thermal_residency_accumulated",
    "gpu_violation_vr_thermal_residency_accumulated",
    "gpu_violation_hbm_thermal_residency_accumulated",
    "gpu_gfx_busy_instantaneous",
    "gpu_vcn_busy_instantaneous",
    "gpu_jpeg_busy_instantaneous",
    "gpu_violation_gfx_clock_below_host_limit_power_accumulated",
    "gpu_violation_gfx_clock_below_host_limit_thermal_accumulated",
    "gpu_violation_low_utilization_accumulated",
    "gpu_violation_gfx_clock_below_host_limit_total_accumulated",
    "gpu_clock",
    // The RAS blocks the simulator writes, correctable, uncorrectable, then
    // deferred (UMC only: the `de:` line MI300 kernels write).
    "gpu_ecc_correct_sdma",
    "gpu_ecc_correct_gfx",
    "gpu_ecc_correct_mmhub",
    "gpu_ecc_correct_bif",
    "gpu_ecc_correct_hdp",
    "gpu_ecc_correct_xgmi_wafl",
    "gpu_ecc_correct_umc",
    "gpu_ecc_uncorrect_sdma",
    "gpu_ecc_uncorrect_gfx",
    "gpu_ecc_uncorrect_mmhub",
    "gpu_ecc_uncorrect_bif",
    "gpu_ecc_uncorrect_hdp",
    "gpu_ecc_uncorrect_xgmi_wafl",
    "gpu_ecc_uncorrect_umc",
    "gpu_ecc_deferred_umc",
];

/// Labels on every GPU series by default: the reference's mandatory list.
const MANDATORY: &[&str] = &[
    "card_model",
    "container",
    "deployment_mode",
    "gpu_compute_partition_type",
    "gpu_id",
    "gpu_memory_partition_type",
    "gpu_partition_id",
    "hostname",
    "job_id",
    "job_partition",
    "job_user",
    "namespace",
    "pod",
    "serial_number",
];

/// What `Labels` adds, by the reference's config name.
const OPTIONAL: &[(&str, &str)] = &[
    ("GPU_UUID", "gpu_uuid"),
    ("VBIOS_VERSION", "vbios_version"),
    ("DRIVER_VERSION", "driver_version"),
    ("CARD_SERIES", "card_series"),
    ("CARD_VENDOR", "card_vendor"),
    ("KFD_PROCESS_ID", "kfd_process_id"),
];

/// The families of one full sample of a simulated CPX/NPS4 MI300X, with
/// `config.json` text.
async fn render(config_text: &str) -> Vec<super::render::Family> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", None, Some("cpx_nps4")).expect("profile");
    write_host(&host, &spec).expect("simulated host");
    let inventory = crate::device::discover(&host);
    let mut sampler = Sampler::new(BoundedReader::new(host, 2), Duration::from_secs(1));
    sampler.set_processes(true);
    let sample = sampler.sample(&inventory, Scope::Full).await;
    let config = parse_config(config_text).expect("config");
    families(&RenderInput {
        inventory: &inventory,
        sample: &sample,
        pods: &BTreeMap::new(),
        health: None,
        config: &config,
        hostname: "node-1",
    })
}

fn label_names(family: &super::render::Family) -> BTreeSet<&str> {
    family
        .series
        .iter()
        .flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str()))
        .collect()
}

/// Per-family labels the reference adds to the GPU labels.
fn own_labels(name: &str) -> &'static [&'static str] {
    match name {
        "gpu_clock" => &["clock_index", "clock_type"],
        n if n.ends_with("_instantaneous") || n.starts_with("gpu_violation_gfx_") => &["xcc_index"],
        "gpu_violation_low_utilization_accumulated" => &["xcc_index"],
        _ => &[],
    }
}

#[tokio::test]
async fn family_and_label_names_are_the_references() {
    let families = render("").await;
    let names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, FAMILIES);
    for f in families.iter().filter(|f| f.name != "gpu_nodes_total") {
        let mut expected: BTreeSet<&str> = MANDATORY.iter().copied().collect();
        expected.extend(own_labels(&f.name));
        assert_eq!(label_names(f), expected, "{}", f.name);
    }
    let clock_types: BTreeSet<&str> = families
        .iter()
        .find(|f| f.name == "gpu_clock")
        .map(|f| {
            f.series
                .iter()
                .flat_map(|s| s.labels.iter())
                .filter(|(k, _)| k == "clock_type")
                .map(|(_, v)| v.as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        clock_types,
        BTreeSet::from(["data", "memory", "soc", "system", "video"])
    );
}

#[tokio::test]
async fn optional_labels_are_named_as_the_reference_names_them() {
    let wanted: Vec<String> = OPTIONAL.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    let families = render(&format!(
        r#"{{"GPUConfig": {{"Labels": [{}]}}}}"#,
        wanted.join(", ")
    ))
    .await;
    let edge = families
        .iter()
        .find(|f| f.name == "gpu_junction_temperature")
        .expect("junction temperature");
    let names = label_names(edge);
    let mut expected: BTreeSet<&str> = MANDATORY.iter().copied().collect();
    expected.extend(OPTIONAL.iter().map(|(_, l)| *l));
    assert_eq!(names, expected);
}
