//! Compatibility fixtures: the metric family names and GPU label names we
//! write on a simulated MI300X (gpu_metrics v1.8) in CPX/NPS4 mode, as
//! expected-output tables. Each name was checked against the reference
//! exporter's field and label enums (its `exporterconfig.proto`) and the
//! per-family labels its GPU agent client adds; the tables are written for
//! this project, not copied. (`gpu_vcn_activity`, `gpu_jpeg_activity` and
//! `gpu_mma_activity` are absent: MI300's firmware leaves those device-level
//! fields unset, and the reference lists them as deprecated.)
//!
//! Also the metric names the reference's own Grafana dashboards query
//! ([`DASHBOARD_METRICS`]), with the ones a simulated MI300X cannot carry
//! listed, each with its reason ([`DASHBOARD_EXCLUSIONS`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::render::{RenderInput, families};
use crate::health::{Damping, MonitorState, Thresholds};
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
    "pcie_bidirectional_bandwidth",
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
    "gpu_xgmi_link_rx",
    "gpu_xgmi_link_tx",
    "gpu_gfx_busy_instantaneous",
    "gpu_vcn_busy_instantaneous",
    "gpu_jpeg_busy_instantaneous",
    "gpu_violation_gfx_clock_below_host_limit_power_accumulated",
    "gpu_violation_gfx_clock_below_host_limit_thermal_accumulated",
    "gpu_violation_low_utilization_accumulated",
    "gpu_violation_gfx_clock_below_host_limit_total_accumulated",
    "gpu_clock",
    "gpu_min_clock",
    "gpu_max_clock",
    // The RAS blocks an MI300X has, correctable, uncorrectable, then
    // deferred (UMC only: the `de:` line the kernel writes for UMC).
    "gpu_ecc_correct_sdma",
    "gpu_ecc_correct_gfx",
    "gpu_ecc_correct_mmhub",
    "gpu_ecc_correct_bif",
    "gpu_ecc_correct_hdp",
    "gpu_ecc_correct_xgmi_wafl",
    "gpu_ecc_correct_umc",
    "gpu_ecc_correct_vcn",
    "gpu_ecc_correct_jpeg",
    "gpu_ecc_uncorrect_sdma",
    "gpu_ecc_uncorrect_gfx",
    "gpu_ecc_uncorrect_mmhub",
    "gpu_ecc_uncorrect_bif",
    "gpu_ecc_uncorrect_hdp",
    "gpu_ecc_uncorrect_xgmi_wafl",
    "gpu_ecc_uncorrect_umc",
    "gpu_ecc_uncorrect_vcn",
    "gpu_ecc_uncorrect_jpeg",
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

/// Every GPU metric name the reference's Grafana dashboards query: the union
/// over `grafana/dashboard_overview.json`, `dashboard_gpu.json`,
/// `dashboard_job.json`, `dashboard_node.json`, `dashboard_system.json` and
/// the GPU panels of `dashboard_ainic_job.json` and
/// `dashboard_ainic_system.json` in ROCm/device-metrics-exporter at
/// afd0fe81cfb1a36cf15e79edb057e92adb197946, listed here by us. The
/// dashboards write each as `${g_metrics_prefix}<name>`: a text variable,
/// empty by default, that a user sets to the exporter's `MetricsFieldPrefix`
/// (`amd_`), so the exported name must be exactly prefix + name. Not listed:
/// the AINIC exporter's `eth_*`, `nic_*` and `rdma_*` families (a NIC
/// exporter's, not this GPU exporter's), and `dashboard_gpu.json`'s
/// `{__name__=~".*ecc.*"}` table, which matches whatever ECC families exist.
const DASHBOARD_METRICS: &[&str] = &[
    "gpu_average_package_power",
    "gpu_ecc_correct_total",
    "gpu_ecc_uncorrect_total",
    "gpu_edge_temperature",
    "gpu_energy_consumed",
    "gpu_gfx_activity",
    "gpu_gfx_busy_instantaneous",
    "gpu_hbm_temperature",
    "gpu_health",
    "gpu_junction_temperature",
    "gpu_memory_temperature",
    "gpu_nodes_total",
    "gpu_package_power",
    "gpu_prof_gui_util_percent",
    "gpu_prof_occupancy_per_active_cu",
    "gpu_prof_occupancy_per_cu",
    "gpu_prof_simd_utilization",
    "gpu_prof_sm_active",
    "gpu_prof_tensor_active_percent",
    "gpu_total_vram",
    "gpu_used_vram",
    "pcie_bandwidth",
    "pcie_max_speed",
    "pcie_nack_received_count",
    "pcie_nack_sent_count",
    "pcie_recovery_count",
    "pcie_replay_count",
    "pcie_replay_rollover_count",
];

/// The label names the GPU dashboards above select, group or title by, on
/// GPU series (`hbm_index` is checked on an MI210, below). Not listed:
/// `GPU_UUID`, which only `dashboard_overview.json`'s hidden, unused
/// `g_gpu_uuids` variable names; the reference lower-cases every label, so
/// its exporter never writes it either.
const DASHBOARD_LABELS: &[&str] = &[
    "card_model",
    "card_series",
    "card_vendor",
    "cluster_name",
    "driver_version",
    "gpu_id",
    "gpu_partition_id",
    "gpu_uuid",
    "hostname",
    "job_id",
    "pod",
    "serial_number",
    "vbios_version",
    "xcc_index",
];

/// The reason every `gpu_prof_*` dashboard metric is absent.
const PROFILER: &str = "a rocprofiler counter (the reference's GPU_PROF_* fields): \
    read from the GPU's performance counters through rocprofiler-sdk, which \
    neither sysfs nor the gpu_metrics table exposes";

/// Dashboard metrics a render of a simulated MI300X does not carry, each with
/// why. The test below fails if one of them appears, so that a name is taken
/// off this list when it is implemented.
const DASHBOARD_EXCLUSIONS: &[(&str, &str)] = &[
    ("gpu_prof_gui_util_percent", PROFILER),
    ("gpu_prof_occupancy_per_active_cu", PROFILER),
    ("gpu_prof_occupancy_per_cu", PROFILER),
    ("gpu_prof_simd_utilization", PROFILER),
    ("gpu_prof_sm_active", PROFILER),
    ("gpu_prof_tensor_active_percent", PROFILER),
    // Exported where the hardware reports it: see
    // `dashboard_hbm_temperature_is_exported_where_the_table_has_it`.
    (
        "gpu_hbm_temperature",
        "MI200 only, in the reference too (its metricslist.md: GPU_HBM_TEMPERATURE \
         [MI2xx]; it marks the field unsupported when the list is empty or its first \
         stack reads 0). MI300's gpu_metrics v1.4 to v1.8 have no temperature_hbm \
         member, the early v1.3 tables of smu_v13_0_6 write it as 0, and its hwmon \
         has only the `mem` sensor (gpu_memory_temperature). The only newer source is \
         the attribute-encoded v1.9 table, which this parser does not decode",
    ),
];

/// The families that have at least one series: a panel needs a sample, not
/// only a `# TYPE` line.
pub(super) fn names_with_series(families: &[super::render::Family]) -> BTreeSet<&str> {
    families
        .iter()
        .filter(|f| !f.series.is_empty())
        .map(|f| f.name.as_str())
        .collect()
}

/// The families of one full sample of a simulated CPX/NPS4 MI300X, with
/// `config.json` text, without a health monitor.
async fn render(config_text: &str) -> Vec<super::render::Family> {
    render_host(
        SimSpec::new("mi300x", None, Some("cpx_nps4")).expect("profile"),
        config_text,
        false,
    )
    .await
}

/// The families of one full sample of a simulated host, with `config.json`
/// text; with `health`, also the health monitor's verdict on that sample, as
/// the exporter shows it when the monitor runs beside it (standalone and the
/// DaemonSet both do).
async fn render_host(spec: SimSpec, config_text: &str, health: bool) -> Vec<super::render::Family> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let host = HostRoot::new(dir.path());
    write_host(&host, &spec).expect("simulated host");
    let inventory = crate::device::discover(&host);
    let mut sampler = Sampler::new(BoundedReader::new(host, 2), Duration::from_secs(1));
    sampler.set_processes(true);
    let sample = sampler.sample(&inventory, Scope::Full).await;
    let config = parse_config(config_text).expect("config");
    let snapshot = health.then(|| {
        MonitorState::default()
            .step(
                &inventory,
                &sample,
                &Thresholds::default(),
                &Damping::default(),
            )
            .0
    });
    families(&RenderInput {
        inventory: &inventory,
        sample: &sample,
        pods: &BTreeMap::new(),
        health: snapshot.as_ref(),
        config: &config,
        hostname: "node-1",
        shared_gpus: false,
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
        "gpu_clock" | "gpu_min_clock" | "gpu_max_clock" => &["clock_index", "clock_type"],
        "gpu_xgmi_link_rx" | "gpu_xgmi_link_tx" => &["link_index"],
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

#[tokio::test]
async fn every_dashboard_metric_but_the_excluded_is_exported_with_and_without_prefix() {
    for (name, reason) in DASHBOARD_EXCLUSIONS {
        assert!(
            DASHBOARD_METRICS.contains(name),
            "{name} is not a dashboard metric"
        );
        assert!(!reason.is_empty(), "{name} has no reason");
    }
    let unexplained: Vec<&str> = DASHBOARD_METRICS
        .iter()
        .copied()
        .filter(|n| n.starts_with("gpu_prof_"))
        .filter(|n| !DASHBOARD_EXCLUSIONS.iter().any(|(e, _)| e == n))
        .collect();
    assert_eq!(
        unexplained,
        Vec::<&str>::new(),
        "profiler counters not listed"
    );
    for prefix in ["", "amd_"] {
        let config = format!(r#"{{"CommonConfig": {{"MetricsFieldPrefix": "{prefix}"}}}}"#);
        let spec = SimSpec::new("mi300x", None, Some("cpx_nps4")).expect("profile");
        let families = render_host(spec, &config, true).await;
        let exported = names_with_series(&families);
        for name in DASHBOARD_METRICS {
            let wanted = format!("{prefix}{name}");
            let excluded = DASHBOARD_EXCLUSIONS.iter().any(|(e, _)| e == name);
            assert_eq!(
                exported.contains(wanted.as_str()),
                !excluded,
                "{wanted}: excluded {excluded}, exported {exported:?}"
            );
        }
    }
}

/// The HBM stack temperatures the dashboards plot, on an MI210 (aldebaran's
/// v1.3 table has `temperature_hbm`): one series per stack, labelled
/// `hbm_index` as the reference labels them.
#[tokio::test]
async fn dashboard_hbm_temperature_is_exported_where_the_table_has_it() {
    let spec = SimSpec::new("mi210", Some(1), None).expect("profile");
    let families = render_host(spec, "", false).await;
    let hbm = families
        .iter()
        .find(|f| f.name == "gpu_hbm_temperature")
        .expect("gpu_hbm_temperature on an MI210");
    let stacks: BTreeSet<&str> = hbm
        .series
        .iter()
        .flat_map(|s| s.labels.iter())
        .filter(|(k, _)| k == "hbm_index")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(stacks, BTreeSet::from(["0", "1", "2", "3"]));
    assert!(hbm.series.iter().all(|s| s.value > 0.0), "{:?}", hbm.series);
}

/// With the labels the dashboards' variables read turned on (the optional
/// ones through `Labels`, `cluster_name` through `CustomLabels`, as the
/// reference's example config does), every one is on the GPU series.
#[tokio::test]
async fn dashboard_label_names_are_written() {
    let config = r#"{"GPUConfig": {
        "Labels": ["GPU_UUID", "VBIOS_VERSION", "DRIVER_VERSION", "CARD_SERIES", "CARD_VENDOR"],
        "CustomLabels": {"CLUSTER_NAME": "lab"}}}"#;
    let spec = SimSpec::new("mi300x", None, Some("cpx_nps4")).expect("profile");
    let families = render_host(spec, config, true).await;
    let written: BTreeSet<&str> = families
        .iter()
        .filter(|f| f.name != "gpu_nodes_total")
        .flat_map(label_names)
        .collect();
    let missing: Vec<&str> = DASHBOARD_LABELS
        .iter()
        .copied()
        .filter(|l| !written.contains(l))
        .collect();
    assert_eq!(missing, Vec::<&str>::new(), "written: {written:?}");
    // The overview sums it by `cluster_name`: the node-level family carries
    // the custom labels, as the reference's does.
    let nodes = families
        .iter()
        .find(|f| f.name == "gpu_nodes_total")
        .expect("gpu_nodes_total");
    assert_eq!(
        label_names(nodes),
        BTreeSet::from(["cluster_name", "hostname"])
    );
}
