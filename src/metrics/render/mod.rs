//! From a sample to the exposition: which series exist, with which labels and
//! values, in the reference exporter's names; then the Prometheus text format
//! (0.0.4, through `prometheus-client`) and the JSON view.
//!
//! Scope of each metric on partitioned GPUs. The reference reports every
//! partition as a GPU, and the driver reports device-level values (power,
//! temperatures, ECC, PCIe, memory, clocks, activity) only on the primary
//! partition. So device-level metrics have their value on the GPU's partition
//! 0 (`gpu_partition_id="0"`): 8 series of `gpu_junction_temperature` on an
//! MI300X in any mode. As the reference documents, the other partitions carry
//! power, CPU-visible VRAM, the VRAM bandwidth and GTT as 0
//! ([`ZERO_ON_OTHER_PARTITIONS`]), and no temperatures, clocks, energy,
//! activity, PCIe or ECC series. Per-partition series are those whose value is
//! known per partition: `gpu_health`, 64 series on an MI300X in CPX mode, and
//! the per-XCC families of the firmware's metrics table (`gpu_metrics`), each
//! partition from its own XCP entry: `gpu_gfx_busy_instantaneous{xcc_index}`
//! (the reference's per-partition activity: its `gpu_gfx_activity` is the
//! primary's only, since amd-smi has no per-partition value) and the
//! below-host-limit violation counters.
//!
//! Types: every family is a gauge, as the reference declares them, the ECC
//! totals, `gpu_nodes_total` and the `pcie_*_count` families included
//! (promtool's lint advises against a gauge named `_total` or `_count`; a
//! drop-in keeps the reference's names and types, which scrapers and
//! `rate()`-free dashboards already expect).
//!
//! Pure, except that encoding allocates.
//!
//! This file holds the families and their series ([`families`]); the labels
//! of a GPU's series are `labels.rs`'s, the text format `encode.rs`'s, the
//! JSON view `json.rs`'s.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::device::{Gpu, Inventory};
use crate::health::HealthSnapshot;
use crate::pod_resources::{DevicePods, PodRef, pods_of};
use crate::telemetry::config::ExporterConfig;
use crate::telemetry::devices::{LogicalGpu, logical_gpus};
use crate::telemetry::fields::{
    DEVICE_FIELDS, ECC_BLOCKS, INDEXED_FIELDS, Kind, Scope, ZERO_ON_OTHER_PARTITIONS,
    clocks as clocks_of, ecc_suffix,
};
use crate::telemetry::sample::{GpuReadings, HostSample};

mod encode;
mod json;
mod labels;

use labels::{gpu_labels, kfd_node};

pub use encode::{CONTENT_TYPE, HistogramFamily, encode, encode_with_histograms};
pub use json::{GpuView, JsonView, SampleInfo, json_view};

/// One metric family and its series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub series: Vec<Series>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series {
    /// Sorted by name.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Everything a render needs.
#[derive(Clone, Copy, Debug)]
pub struct RenderInput<'a> {
    pub inventory: &'a Inventory,
    pub sample: &'a HostSample,
    /// The containers holding each device: several when it is shared.
    pub pods: &'a DevicePods,
    /// The health monitor's view; without one, `gpu_health` is not exported.
    pub health: Option<&'a HealthSnapshot>,
    pub config: &'a ExporterConfig,
    pub hostname: &'a str,
    /// The GPUs are shared (time-slicing): `gpu_shared_pods` is exported.
    pub shared_gpus: bool,
}

/// Builds every family the configuration enables. Families without series are
/// left out.
pub fn families(input: &RenderInput<'_>) -> Vec<Family> {
    let config = input.config;
    let prefix = &config.prefix;
    let gpus: BTreeMap<&str, &Gpu> = input
        .inventory
        .gpus
        .iter()
        .map(|g| (g.bdf.as_str(), g))
        .collect();
    let logical = logical_gpus(input.inventory);
    let mut out: Vec<Family> = Vec::new();
    let mut family = |field: &str, name: &str, help: &str, kind: Kind, series: Vec<Series>| {
        if config.exports(field) && !series.is_empty() {
            out.push(Family {
                name: format!("{prefix}{name}"),
                help: help.to_owned(),
                kind,
                series,
            });
        }
    };

    let mut node_labels: BTreeMap<String, String> =
        BTreeMap::from([("hostname".to_owned(), input.hostname.to_owned())]);
    for (name, value) in &config.custom_labels {
        node_labels
            .entry(name.clone())
            .or_insert_with(|| value.clone());
    }
    family(
        "GPU_NODES_TOTAL",
        "gpu_nodes_total",
        "Number of GPUs on the node, partitions counted as GPUs",
        Kind::Gauge,
        vec![Series {
            labels: node_labels.into_iter().collect(),
            value: logical.len() as f64,
        }],
    );

    // Labels of every logical GPU and, per physical GPU, of its primary one:
    // a GPU that several pods share has a label set (and so series) per pod,
    // each naming its pod, as dashboards that filter on `pod` expect.
    let labelled: Vec<(&LogicalGpu, Vec<(String, String)>)> = logical
        .iter()
        .filter_map(|l| Some((l, *gpus.get(l.bdf.as_str())?)))
        .flat_map(|(l, gpu)| {
            let holders = pods_of(input.pods, &l.device_ref());
            let none = [PodRef::default()];
            let holders = if holders.is_empty() {
                &none[..]
            } else {
                holders
            };
            holders
                .iter()
                .map(|pod| (l, gpu_labels(input, gpu, l, pod)))
                .collect::<Vec<_>>()
        })
        .collect();
    let primaries: Vec<(&GpuReadings, &Vec<(String, String)>)> = labelled
        .iter()
        .filter(|(l, _)| l.is_primary())
        .filter_map(|(l, labels)| input.sample.gpus.get(&l.bdf).map(|r| (r, labels)))
        .collect();

    // How many containers share each logical GPU, once per GPU; ours, so
    // only where GPUs are shared (the default families stay the reference's).
    let shared_pods = logical
        .iter()
        .filter(|_| input.shared_gpus)
        .filter_map(|l| {
            let gpu = gpus.get(l.bdf.as_str())?;
            Some(Series {
                labels: gpu_labels(input, gpu, l, &PodRef::default()),
                value: pods_of(input.pods, &l.device_ref()).len() as f64,
            })
        })
        .collect();
    family(
        "GPU_SHARED_PODS",
        "gpu_shared_pods",
        "Number of containers the kubelet gave this GPU (more than one when it is shared)",
        Kind::Gauge,
        shared_pods,
    );

    if let Some(health) = input.health {
        let series = labelled
            .iter()
            .filter_map(|(l, labels)| {
                health.gpus.get(&l.bdf).map(|h| Series {
                    labels: labels.clone(),
                    value: if h.healthy { 1.0 } else { 0.0 },
                })
            })
            .collect();
        family(
            "GPU_HEALTH",
            "gpu_health",
            "GPU health: 1 healthy, 0 unhealthy",
            Kind::Gauge,
            series,
        );
    }

    for f in DEVICE_FIELDS {
        let zero_elsewhere = ZERO_ON_OTHER_PARTITIONS.contains(&f.field);
        let series = labelled
            .iter()
            .filter(|(l, _)| l.is_primary() || zero_elsewhere)
            .filter_map(|(l, labels)| {
                let value = (f.value)(input.sample.gpus.get(&l.bdf)?)?;
                Some(Series {
                    labels: labels.clone(),
                    value: if l.is_primary() { value } else { 0.0 },
                })
            })
            .collect();
        family(f.field, f.name, f.help, Kind::Gauge, series);
    }

    for f in INDEXED_FIELDS {
        let mut series = Vec::new();
        for (l, labels) in &labelled {
            if f.scope == Scope::Device && !l.is_primary() {
                continue;
            }
            let Some(r) = input.sample.gpus.get(&l.bdf) else {
                continue;
            };
            let partition = match f.scope {
                Scope::Device => 0,
                Scope::Partition => l.partition,
            };
            for (index, value) in (f.values)(r, partition).into_iter().enumerate() {
                if let Some(value) = value {
                    series.push(Series {
                        labels: with_label(labels, f.label, index),
                        value,
                    });
                }
            }
        }
        family(f.field, f.name, f.help, Kind::Gauge, series);
    }

    // clock_type values are the reference exporter's (lower case since its
    // v1.4.2), which its dashboards filter on. clock_index numbers the clocks of one GPU in the
    // order `fields::clocks` lists them, as the reference numbers its list.
    // `gpu_min_clock` and `gpu_max_clock` carry the same labels: each
    // clock's DPM table range, where the kernel writes one.
    let (mut clocks, mut min_clocks, mut max_clocks) = (Vec::new(), Vec::new(), Vec::new());
    for (r, labels) in &primaries {
        for (index, clock) in clocks_of(r).into_iter().enumerate() {
            let mut labels = with_label(labels, "clock_index", index);
            labels.push(("clock_type".into(), clock.clock_type.into()));
            labels.sort();
            if let Some(range) = clock.range {
                min_clocks.push(Series {
                    labels: labels.clone(),
                    value: range.min_mhz,
                });
                max_clocks.push(Series {
                    labels: labels.clone(),
                    value: range.max_mhz,
                });
            }
            clocks.push(Series {
                labels,
                value: clock.mhz,
            });
        }
    }
    family(
        "GPU_CLOCK",
        "gpu_clock",
        "Current clock frequency in MHz, by clock type",
        Kind::Gauge,
        clocks,
    );
    family(
        "GPU_MIN_CLOCK",
        "gpu_min_clock",
        "Lowest DPM level of each clock in MHz, by clock type",
        Kind::Gauge,
        min_clocks,
    );
    family(
        "GPU_MAX_CLOCK",
        "gpu_max_clock",
        "Highest DPM level of each clock in MHz, by clock type",
        Kind::Gauge,
        max_clocks,
    );

    // Each KFD process's compute-unit occupancy on the logical GPU it has
    // queues on, in percent of that GPU's (or partition's) CUs, as rocm-smi
    // converts KFD's CU count: `cu_occupancy * 100 / cu_count`, rounded down.
    let mut occupancy = Vec::new();
    for (l, labels) in &labelled {
        let Some(gpu) = gpus.get(l.bdf.as_str()) else {
            continue;
        };
        let node = kfd_node(gpu, l.partition);
        let cus = gpu
            .cu_count
            .map(|cus| cus / (gpu.partitions.len().max(1) as u32))
            .filter(|cus| *cus > 0);
        let (Some(node), Some(cus)) = (node, cus) else {
            continue;
        };
        for (pid, occupied) in input
            .sample
            .kfd_cu_occupancy
            .get(&node)
            .into_iter()
            .flatten()
        {
            let mut labels = labels.clone();
            labels.push(("process_id".into(), pid.to_string()));
            labels.sort();
            occupancy.push(Series {
                labels,
                value: f64::from(occupied.saturating_mul(100) / cus),
            });
        }
    }
    family(
        "GPU_PROCESS_CU_OCCUPANCY",
        "gpu_process_cu_occupancy",
        "Compute Unit occupancy for a process in percent",
        Kind::Gauge,
        occupancy,
    );

    // Per-block ECC counts, for blocks the reference names.
    let blocks: BTreeSet<&str> = primaries
        .iter()
        .flat_map(|(r, _)| r.ecc.keys().map(String::as_str))
        .filter(|b| ecc_suffix(b).is_some())
        .collect();
    // Deferred counts exist only where the kernel reports them (UMC on
    // MI300), so a block without them has no deferred series.
    for (kind_upper, kind_lower, adjective, pick) in [
        (
            "CORRECT",
            "correct",
            "Correctable",
            (|c: &crate::telemetry::sysfs::EccCount| Some(c.ce)) as fn(&_) -> Option<u64>,
        ),
        ("UNCORRECT", "uncorrect", "Uncorrectable", |c| Some(c.ue)),
        ("DEFERRED", "deferred", "Deferred", |c| c.de),
    ] {
        // Each suffix once, in the reference's order, over every sysfs
        // name the kernel gives its block (MP0 is `mca.mp0` on MI200).
        let mut suffixes: Vec<&str> = Vec::new();
        for &(_, suffix) in ECC_BLOCKS {
            let present = ECC_BLOCKS
                .iter()
                .any(|(sysfs, s)| *s == suffix && blocks.contains(sysfs));
            if present && !suffixes.contains(&suffix) {
                suffixes.push(suffix);
            }
        }
        for suffix in suffixes {
            let series = primaries
                .iter()
                .filter_map(|(r, labels)| {
                    let counts: Vec<u64> = ECC_BLOCKS
                        .iter()
                        .filter(|(_, s)| *s == suffix)
                        .filter_map(|(sysfs, _)| r.ecc.get(*sysfs).and_then(pick))
                        .collect();
                    (!counts.is_empty()).then(|| Series {
                        labels: (*labels).clone(),
                        value: counts.iter().sum::<u64>() as f64,
                    })
                })
                .collect();
            family(
                &format!("GPU_ECC_{kind_upper}_{}", suffix.to_ascii_uppercase()),
                &format!("gpu_ecc_{kind_lower}_{suffix}"),
                &format!(
                    "{adjective} ECC errors in the {} block",
                    suffix.to_ascii_uppercase()
                ),
                Kind::Gauge,
                series,
            );
        }
    }
    out
}

/// `labels` with `name="index"` added, sorted.
fn with_label(labels: &[(String, String)], name: &str, index: usize) -> Vec<(String, String)> {
    let mut labels = labels.to_vec();
    labels.push((name.into(), index.to_string()));
    labels.sort();
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Partition;
    use crate::health::GpuHealth;
    use crate::plugin::DeviceRef;
    use crate::telemetry::config::parse_config;
    use crate::telemetry::sysfs::EccCount;

    pub(super) fn inventory() -> Inventory {
        let partitioned = Gpu {
            bdf: "0000:05:00.0".into(),
            device_id: 0x74a1,
            product_name: Some("AMD Instinct MI300X".into()),
            serial_number: Some("S1".into()),
            compute_partition: Some("cpx".into()),
            memory_partition: Some("nps4".into()),
            partitions: (0..2)
                .map(|id| Partition {
                    id,
                    card: Some(id),
                    render_minor: Some(128 + id),
                    kfd_node: Some(2 + id),
                    platform_device: None,
                })
                .collect(),
            ..Gpu::default()
        };
        let whole = Gpu {
            bdf: "0000:27:00.0".into(),
            device_id: 0x74b5,
            ..Gpu::default()
        };
        Inventory {
            gpus: vec![whole, partitioned],
            ..Inventory::default()
        }
    }

    fn readings(bdf: &str, edge: f64) -> GpuReadings {
        let mut r = GpuReadings {
            bdf: bdf.into(),
            ..GpuReadings::default()
        };
        r.temperature.edge_c = Some(edge);
        r.memory.vram_total = Some(4 << 20);
        r.memory.vram_used = Some(1 << 20);
        r.sclk_mhz = Some(2100.0);
        r.ecc.insert(
            "umc".into(),
            EccCount {
                ue: 1,
                ce: 2,
                de: Some(6),
            },
        );
        r.ecc.insert(
            "pcie_bif".into(),
            EccCount {
                ue: 0,
                ce: 3,
                de: None,
            },
        );
        r.ecc.insert(
            "unknown_block".into(),
            EccCount {
                ue: 4,
                ce: 0,
                de: None,
            },
        );
        r
    }

    pub(super) fn sample() -> HostSample {
        let mut s = HostSample::default();
        for (bdf, edge) in [("0000:05:00.0", 40.0), ("0000:27:00.0", 50.0)] {
            s.gpus.insert(bdf.into(), readings(bdf, edge));
        }
        s
    }

    pub(super) fn health() -> HealthSnapshot {
        let mut h = HealthSnapshot::default();
        h.gpus.insert(
            "0000:05:00.0".into(),
            GpuHealth {
                healthy: false,
                reasons: vec!["ECC".into()],
                gpu_ids: vec![0, 1],
            },
        );
        h.gpus.insert(
            "0000:27:00.0".into(),
            GpuHealth {
                healthy: true,
                reasons: vec![],
                gpu_ids: vec![2],
            },
        );
        h
    }

    /// The families of `sample` with the default config, no pods and no
    /// health monitor.
    fn render_default(inventory: &Inventory, sample: &HostSample) -> Vec<Family> {
        families(&RenderInput {
            inventory,
            sample,
            pods: &BTreeMap::new(),
            health: None,
            config: &ExporterConfig::default(),
            hostname: "n",
            shared_gpus: false,
        })
    }

    pub(super) fn family<'a>(families: &'a [Family], name: &str) -> &'a Family {
        families
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no family {name}"))
    }

    pub(super) fn label<'a>(series: &'a Series, name: &str) -> &'a str {
        series
            .labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no label {name}"))
    }

    /// The families a host gives through sysfs and the table besides the
    /// first set: clock ranges, XGMI links, the PCIe accumulator, voltages,
    /// per-process CU occupancy, and MI200's MCA-named RAS blocks.
    #[test]
    fn clock_ranges_links_voltages_and_process_occupancy() {
        use crate::telemetry::gpu_metrics::GpuMetrics;
        use crate::telemetry::sysfs::{ClockRange, Dpm};
        let mut inv = inventory();
        inv.gpus[1].cu_count = Some(304);
        let mut sample = sample();
        let range = |min_mhz, max_mhz| ClockRange { min_mhz, max_mhz };
        let r = sample.gpus.get_mut("0000:05:00.0").unwrap();
        r.gpu_metrics = Some(GpuMetrics {
            current_gfxclk: vec![Some(2100), Some(2000)],
            current_uclk: Some(1300),
            current_vclk0: vec![Some(1000)],
            xgmi_read_data_acc: vec![Some(0), Some(700), None],
            xgmi_write_data_acc: vec![Some(0), Some(900), None],
            pcie_bandwidth_acc: Some(42),
            voltage_gfx: Some(0),
            voltage_soc: Some(900),
            ..GpuMetrics::default()
        });
        r.clock_ranges = BTreeMap::from([
            (Dpm::Sclk, range(500.0, 2100.0)),
            (Dpm::Mclk, range(900.0, 1300.0)),
        ]);
        r.ecc.insert(
            "mca.mp0".into(),
            EccCount {
                ue: 2,
                ce: 1,
                de: None,
            },
        );
        // Partition 1 of the partitioned GPU is KFD node 3: 304 / 2 = 152 CUs.
        sample.kfd_cu_occupancy = BTreeMap::from([(3, BTreeMap::from([(17, 38), (4242, 0)]))]);
        let families = render_default(&inv, &sample);
        let by = |name: &str, index: &str| -> Vec<(String, f64)> {
            family(&families, name)
                .series
                .iter()
                .filter(|s| label(s, "gpu_id") == "0")
                .map(|s| (label(s, index).to_owned(), s.value))
                .collect()
        };
        // The video clock has no table range here: no min or max series.
        assert_eq!(
            by("gpu_min_clock", "clock_index"),
            [
                ("0".into(), 500.0),
                ("1".into(), 500.0),
                ("2".into(), 900.0)
            ]
        );
        assert_eq!(
            by("gpu_max_clock", "clock_index"),
            [
                ("0".into(), 2100.0),
                ("1".into(), 2100.0),
                ("2".into(), 1300.0)
            ]
        );
        let types: Vec<&str> = family(&families, "gpu_max_clock")
            .series
            .iter()
            .map(|s| label(s, "clock_type"))
            .collect();
        assert_eq!(types, ["system", "system", "memory"]);
        assert_eq!(
            by("gpu_xgmi_link_rx", "link_index"),
            [("0".into(), 0.0), ("1".into(), 700.0)]
        );
        assert_eq!(
            by("gpu_xgmi_link_tx", "link_index"),
            [("0".into(), 0.0), ("1".into(), 900.0)]
        );
        let device = |name: &str| -> Vec<(String, f64)> {
            family(&families, name)
                .series
                .iter()
                .map(|s| (label(s, "gpu_id").to_owned(), s.value))
                .collect()
        };
        assert_eq!(device("pcie_bidirectional_bandwidth"), [("0".into(), 42.0)]);
        assert_eq!(device("gpu_voltage"), [("0".into(), 900.0)]);
        assert!(
            !families.iter().any(|f| f.name == "gpu_gfx_voltage"),
            "a rail reading 0 is not reported"
        );
        // MP0 counted under the reference's name, whatever the kernel calls it.
        assert_eq!(device("gpu_ecc_uncorrect_mp0"), [("0".into(), 2.0)]);
        assert!(!families.iter().any(|f| f.name.contains("mca")));
        let occupancy: Vec<(&str, &str, f64)> = family(&families, "gpu_process_cu_occupancy")
            .series
            .iter()
            .map(|s| (label(s, "gpu_id"), label(s, "process_id"), s.value))
            .collect();
        assert_eq!(occupancy, [("1", "17", 25.0), ("1", "4242", 0.0)]);
    }

    /// The reference documents the per-XCC violation percentages as the
    /// primary partition's only, where the accumulated counters they come
    /// from are on every partition.
    #[test]
    fn per_xcc_violation_percentages_are_the_primary_partitions_only() {
        use crate::telemetry::gpu_metrics::{
            GpuMetrics, ViolationPercentages, XcpMetrics, XcpViolationPercentages,
        };
        let inv = inventory();
        let mut sample = sample();
        let r = sample.gpus.get_mut("0000:05:00.0").unwrap();
        let xcp = |acc| XcpMetrics {
            gfx_low_utilization_acc: vec![Some(acc)],
            ..XcpMetrics::default()
        };
        r.gpu_metrics = Some(GpuMetrics {
            xcp: vec![xcp(5), xcp(6)],
            ..GpuMetrics::default()
        });
        let pct = |v| XcpViolationPercentages {
            low_utilization: vec![Some(v)],
            ..XcpViolationPercentages::default()
        };
        r.violations = Some(ViolationPercentages {
            xcp: vec![pct(25.0), pct(50.0)],
            ..ViolationPercentages::default()
        });
        let families = render_default(&inv, &sample);
        let of = |name: &str| -> Vec<(String, String, f64)> {
            family(&families, name)
                .series
                .iter()
                .map(|s| {
                    (
                        label(s, "gpu_partition_id").to_owned(),
                        label(s, "xcc_index").to_owned(),
                        s.value,
                    )
                })
                .collect()
        };
        assert_eq!(
            of("gpu_violation_low_utilization_accumulated"),
            [("0".into(), "0".into(), 5.0), ("1".into(), "0".into(), 6.0)]
        );
        assert_eq!(
            of("gpu_violation_low_utilization_percentage"),
            [("0".into(), "0".into(), 25.0)],
            "partition 0 only, from its own XCP entry"
        );
    }

    #[test]
    fn gpu_metrics_families_per_index_and_per_partition() {
        use crate::telemetry::gpu_metrics::{GpuMetrics, XcpMetrics};
        let inv = inventory();
        let mut sample = sample();
        // The partitioned GPU (two partitions, one XCC each) has a table.
        let table = GpuMetrics {
            temperature_hbm: vec![Some(41), Some(0), None, Some(44)],
            pcie_nak_sent_count_acc: Some(3),
            pcie_bandwidth_inst: Some(12),
            prochot_residency_acc: Some(9),
            current_gfxclk: vec![Some(2100), Some(2000), None],
            current_uclk: Some(1300),
            current_socclk: vec![Some(1143)],
            xcp: vec![
                XcpMetrics {
                    gfx_busy_inst: vec![Some(70), None],
                    gfx_below_host_limit_ppt_acc: vec![Some(5)],
                    ..XcpMetrics::default()
                },
                XcpMetrics {
                    gfx_busy_inst: vec![Some(30), None],
                    gfx_below_host_limit_ppt_acc: vec![Some(6)],
                    ..XcpMetrics::default()
                },
            ],
            ..GpuMetrics::default()
        };
        if let Some(r) = sample.gpus.get_mut("0000:05:00.0") {
            r.gpu_metrics = Some(table);
        }
        let config = ExporterConfig::default();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &BTreeMap::new(),
            health: None,
            config: &config,
            hostname: "node-1",
            shared_gpus: false,
        };
        let families = families(&input);
        let hbm = family(&families, "gpu_hbm_temperature");
        let stacks: Vec<(&str, f64)> = hbm
            .series
            .iter()
            .map(|s| (label(s, "hbm_index"), s.value))
            .collect();
        assert_eq!(
            stacks,
            [("0", 41.0), ("3", 44.0)],
            "zero and N/A stacks dropped"
        );
        assert_eq!(family(&families, "pcie_nack_sent_count").series.len(), 1);
        assert_eq!(family(&families, "pcie_bandwidth").series[0].value, 12.0);
        assert_eq!(
            family(
                &families,
                "gpu_violation_processor_hot_residency_accumulated"
            )
            .series[0]
                .value,
            9.0
        );
        // Per partition: each logical GPU from its own XCP entry.
        let busy = family(&families, "gpu_gfx_busy_instantaneous");
        let per: Vec<(&str, &str, f64)> = busy
            .series
            .iter()
            .map(|s| (label(s, "gpu_partition_id"), label(s, "xcc_index"), s.value))
            .collect();
        assert_eq!(per, [("0", "0", 70.0), ("1", "0", 30.0)]);
        let below = family(
            &families,
            "gpu_violation_gfx_clock_below_host_limit_power_accumulated",
        );
        assert_eq!(below.series.len(), 2);
        // Clocks from the table, numbered across types; the GPU without a
        // table keeps its pp_dpm_sclk clock.
        let clocks = family(&families, "gpu_clock");
        let of = |gpu: &str| -> Vec<(String, String, f64)> {
            clocks
                .series
                .iter()
                .filter(|s| label(s, "gpu_id") == gpu)
                .map(|s| {
                    (
                        label(s, "clock_index").to_owned(),
                        label(s, "clock_type").to_owned(),
                        s.value,
                    )
                })
                .collect()
        };
        let sys = "system".to_owned();
        assert_eq!(
            of("0"),
            [
                ("0".into(), sys.clone(), 2100.0),
                ("1".into(), sys.clone(), 2000.0),
                ("2".into(), "memory".into(), 1300.0),
                ("3".into(), "soc".into(), 1143.0),
            ]
        );
        assert_eq!(of("2"), [("0".into(), sys, 2100.0)]);
        for f in &families {
            assert_eq!(f.kind, Kind::Gauge, "{}: the reference's type", f.name);
        }
    }

    #[test]
    fn a_shared_gpu_has_a_series_per_pod_and_counts_its_pods() {
        let (inv, sample, health) = (inventory(), sample(), health());
        let pod = |name: &str, namespace: &str| PodRef {
            pod: name.into(),
            namespace: namespace.into(),
            container: "main".into(),
            ..PodRef::default()
        };
        let pods = BTreeMap::from([(
            DeviceRef::gpu("0000:27:00.0"),
            vec![pod("a", "ml"), pod("b", "research")],
        )]);
        let config = ExporterConfig::default();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &pods,
            health: Some(&health),
            config: &config,
            hostname: "n",
            shared_gpus: true,
        };
        let families = families(&input);
        let edge: Vec<(&str, &str, &str, f64)> = family(&families, "gpu_edge_temperature")
            .series
            .iter()
            .map(|s| {
                (
                    label(s, "gpu_id"),
                    label(s, "pod"),
                    label(s, "namespace"),
                    s.value,
                )
            })
            .collect();
        assert_eq!(
            edge,
            [
                ("0", "", "", 40.0),
                ("2", "a", "ml", 50.0),
                ("2", "b", "research", 50.0)
            ],
            "each pod on its own series, with the GPU's value"
        );
        let shared: Vec<(&str, &str, f64)> = family(&families, "gpu_shared_pods")
            .series
            .iter()
            .map(|s| (label(s, "gpu_id"), label(s, "pod"), s.value))
            .collect();
        assert_eq!(shared, [("0", "", 0.0), ("1", "", 0.0), ("2", "", 2.0)]);
        assert_eq!(family(&families, "gpu_nodes_total").series[0].value, 3.0);
        let exclusive = RenderInput {
            shared_gpus: false,
            ..input
        };
        assert!(
            super::families(&exclusive)
                .iter()
                .all(|f| f.name != "gpu_shared_pods"),
            "not exported where GPUs are not shared"
        );
    }

    #[test]
    fn device_metrics_once_per_gpu_health_once_per_partition() {
        let (inv, sample, health) = (inventory(), sample(), health());
        let pods = BTreeMap::from([(
            DeviceRef::partition("0000:05:00.0", 1),
            vec![PodRef {
                pod: "train".into(),
                namespace: "ml".into(),
                container: "c".into(),
                ..PodRef::default()
            }],
        )]);
        let config = ExporterConfig::default();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &pods,
            health: Some(&health),
            config: &config,
            hostname: "node-1",
            shared_gpus: false,
        };
        let families = families(&input);
        let edge = family(&families, "gpu_edge_temperature");
        assert_eq!(edge.series.len(), 2);
        let first = &edge.series[0];
        assert_eq!(label(first, "gpu_id"), "0");
        assert_eq!(label(first, "gpu_partition_id"), "0");
        assert_eq!(label(first, "gpu_compute_partition_type"), "cpx");
        assert_eq!(label(first, "gpu_memory_partition_type"), "nps4");
        assert_eq!(label(first, "card_model"), "AMD Instinct MI300X");
        assert_eq!(label(first, "serial_number"), "S1");
        assert_eq!(label(first, "hostname"), "node-1");
        assert_eq!(label(first, "pod"), "");
        assert_eq!(first.value, 40.0);
        let second = &edge.series[1];
        assert_eq!(label(second, "gpu_id"), "2");
        assert_eq!(label(second, "card_model"), "0x74b5");
        assert_eq!(label(second, "gpu_compute_partition_type"), "none");
        let names: Vec<&str> = first.labels.iter().map(|(k, _)| k.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "labels are sorted");

        let health = family(&families, "gpu_health");
        let values: Vec<(&str, &str, f64)> = health
            .series
            .iter()
            .map(|s| (label(s, "gpu_id"), label(s, "pod"), s.value))
            .collect();
        assert_eq!(
            values,
            [("0", "", 0.0), ("1", "train", 0.0), ("2", "", 1.0)]
        );

        assert_eq!(family(&families, "gpu_nodes_total").series[0].value, 3.0);
        assert_eq!(family(&families, "gpu_free_vram").series[0].value, 3.0);
        let clock = &family(&families, "gpu_clock").series[0];
        assert_eq!(label(clock, "clock_type"), "system");
        assert_eq!(clock.value, 2100.0);
        assert_eq!(
            family(&families, "gpu_ecc_uncorrect_total").series[0].value,
            5.0
        );
        assert_eq!(
            family(&families, "gpu_ecc_correct_bif").series[0].value,
            3.0
        );
        assert_eq!(
            family(&families, "gpu_ecc_uncorrect_umc").series[0].value,
            1.0
        );
        // Deferred errors: UMC reports them, PCIe BIF does not.
        assert_eq!(
            family(&families, "gpu_ecc_deferred_umc").series[0].value,
            6.0
        );
        assert_eq!(
            family(&families, "gpu_ecc_deferred_total").series[0].value,
            6.0
        );
        assert!(!families.iter().any(|f| f.name == "gpu_ecc_deferred_bif"));
        assert!(!families.iter().any(|f| f.name.contains("unknown_block")));
        assert!(
            !families.iter().any(|f| f.name == "gpu_package_power"),
            "no values, no family"
        );
    }

    #[test]
    fn other_partitions_report_power_and_gtt_as_zero_and_nothing_else() {
        let inv = inventory();
        let mut sample = sample();
        for r in sample.gpus.values_mut() {
            r.power.current_w = Some(300.0);
            r.memory.gtt_total = Some(8 << 20);
            r.memory.gtt_used = Some(1 << 20);
        }
        let config = ExporterConfig::default();
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
        let by_gpu = |name: &str| -> Vec<(String, f64)> {
            family(&families, name)
                .series
                .iter()
                .map(|s| (label(s, "gpu_id").to_owned(), s.value))
                .collect()
        };
        // gpu 1 is the partitioned GPU's second partition.
        let zero_on_1 = |v: f64| vec![("0".into(), v), ("1".into(), 0.0), ("2".into(), v)];
        assert_eq!(by_gpu("gpu_package_power"), zero_on_1(300.0));
        assert_eq!(by_gpu("gpu_total_gtt"), zero_on_1(8.0));
        assert_eq!(by_gpu("gpu_free_gtt"), zero_on_1(7.0));
        assert_eq!(
            by_gpu("gpu_edge_temperature"),
            [("0".into(), 40.0), ("2".into(), 50.0)]
        );
        assert_eq!(
            by_gpu("gpu_used_vram"),
            [("0".into(), 1.0), ("2".into(), 1.0)]
        );
        let clocks: BTreeSet<String> = by_gpu("gpu_clock").into_iter().map(|(g, _)| g).collect();
        assert_eq!(clocks, BTreeSet::from(["0".into(), "2".into()]));
    }

    #[test]
    fn labels_the_reference_always_sets_are_on_every_gpu_series() {
        let (inv, sample, health) = (inventory(), sample(), health());
        let config = ExporterConfig::default();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &BTreeMap::new(),
            health: Some(&health),
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let families = families(&input);
        let mandatory = [
            "gpu_id",
            "card_model",
            "gpu_partition_id",
            "gpu_compute_partition_type",
            "gpu_memory_partition_type",
            "deployment_mode",
            "serial_number",
            "pod",
            "namespace",
            "container",
            "job_id",
            "job_user",
            "job_partition",
            "hostname",
        ];
        for f in families.iter().filter(|f| f.name != "gpu_nodes_total") {
            for s in &f.series {
                for name in mandatory {
                    label(s, name);
                }
                assert_eq!(label(s, "job_id"), "", "no Slurm job under Kubernetes");
                let expected = if label(s, "gpu_id") == "2" {
                    "vm_vf"
                } else {
                    "baremetal"
                };
                assert_eq!(label(s, "deployment_mode"), expected, "{}", f.name);
            }
        }
    }

    #[test]
    fn kfd_process_id_lists_the_partition_s_processes() {
        let inv = inventory();
        let mut sample = sample();
        // The partitioned GPU's partition 1 is KFD node 3.
        sample.kfd_processes = BTreeMap::from([(3, vec![17, 4242])]);
        let config = parse_config(r#"{"GPUConfig": {"Labels": ["KFD_PROCESS_ID"]}}"#).unwrap();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &BTreeMap::new(),
            health: Some(&health()),
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let families = families(&input);
        let pids: Vec<(&str, &str)> = family(&families, "gpu_health")
            .series
            .iter()
            .map(|s| (label(s, "gpu_id"), label(s, "kfd_process_id")))
            .collect();
        assert_eq!(pids, [("0", ""), ("1", "17,4242"), ("2", "")]);
    }

    #[test]
    fn pod_uuid_and_extra_pod_labels_come_from_the_pod() {
        let (inv, sample, health) = (inventory(), sample(), health());
        let pods = BTreeMap::from([(
            DeviceRef::partition("0000:05:00.0", 1),
            vec![PodRef {
                pod: "train".into(),
                namespace: "ml".into(),
                container: "c".into(),
                uid: "6f1c-uid".into(),
                labels: BTreeMap::from([("example.com/workload".into(), "w7".into())]),
            }],
        )]);
        let config = parse_config(
            r#"{"GPUConfig": {"Labels": ["POD_UUID"],
                "ExtraPodLabels": {"WORKLOAD_ID": "example.com/workload",
                                   "TEAM": "example.com/team"}}}"#,
        )
        .unwrap();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &pods,
            health: Some(&health),
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let families = families(&input);
        let rows: Vec<(&str, &str, &str, &str)> = family(&families, "gpu_health")
            .series
            .iter()
            .map(|s| {
                (
                    label(s, "gpu_id"),
                    label(s, "pod_uuid"),
                    label(s, "workload_id"),
                    label(s, "team"),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("0", "", "", ""),
                ("1", "6f1c-uid", "w7", ""),
                ("2", "", "", "")
            ]
        );
    }

    #[test]
    fn config_selects_fields_adds_labels_and_prefixes_names() {
        let (inv, sample) = (inventory(), sample());
        let config = parse_config(
            r#"{"CommonConfig": {"MetricsFieldPrefix": "amd_"},
                "GPUConfig": {"Fields": ["GPU_EDGE_TEMPERATURE", "GPU_ECC_UNCORRECT_UMC"],
                              "Labels": ["DRIVER_VERSION"],
                              "CustomLabels": {"CLUSTER_NAME": "lab"}}}"#,
        )
        .unwrap();
        let pods = BTreeMap::new();
        let input = RenderInput {
            inventory: &inv,
            sample: &sample,
            pods: &pods,
            health: None,
            config: &config,
            hostname: "n",
            shared_gpus: false,
        };
        let families = families(&input);
        let names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["amd_gpu_edge_temperature", "amd_gpu_ecc_uncorrect_umc"]
        );
        let series = &families[0].series[0];
        assert_eq!(label(series, "cluster_name"), "lab");
        assert_eq!(label(series, "driver_version"), "");
    }
}
