//! The metric field catalogue: every field this exporter knows, by the
//! reference's config name (`GPU_EDGE_TEMPERATURE`), with its metric name,
//! help, type and where its value comes from in a GPU's readings; and the RAS
//! blocks that have per-block ECC fields.
//!
//! Both the `config.json` parser ([`super::config`], which warns about unknown
//! `Fields`) and the exporter's renderer (`metrics::render`) read it, so
//! neither imports the other. This module is data and pure lookups: it must not render, parse
//! configuration or read the host.

use serde::Serialize;

use super::gpu_metrics::GpuMetrics;
use super::sample::GpuReadings;
use super::sysfs::{ClockRange, Dpm, bytes_to_mib};

/// How a family is declared. The reference declares every GPU family a
/// gauge; counters are for the agent's own families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Gauge,
    Counter,
}

/// RAS blocks: the sysfs name (`ras/<name>_err_count`) and the suffix of the
/// reference's per-block metrics (`gpu_ecc_uncorrect_<suffix>`). MI200's
/// MP0, MP1 and MPIO errors are collected from MCA banks, and the kernel
/// names their blocks `mca.mp0`, `mca.mp1` and `mca.mpio`; they count as the
/// reference's MP0, MP1 and MPIO (a host has one spelling or the other).
pub const ECC_BLOCKS: &[(&str, &str)] = &[
    ("sdma", "sdma"),
    ("gfx", "gfx"),
    ("mmhub", "mmhub"),
    ("athub", "athub"),
    ("pcie_bif", "bif"),
    ("hdp", "hdp"),
    ("xgmi_wafl", "xgmi_wafl"),
    ("df", "df"),
    ("smn", "smn"),
    ("sem", "sem"),
    ("mp0", "mp0"),
    ("mp1", "mp1"),
    ("fuse", "fuse"),
    ("umc", "umc"),
    ("mca", "mca"),
    ("vcn", "vcn"),
    ("jpeg", "jpeg"),
    ("ih", "ih"),
    ("mpio", "mpio"),
    ("mca.mp0", "mp0"),
    ("mca.mp1", "mp1"),
    ("mca.mpio", "mpio"),
];

/// The reference's metric suffix of a sysfs RAS block, if it has one.
pub fn ecc_suffix(sysfs_block: &str) -> Option<&'static str> {
    ECC_BLOCKS
        .iter()
        .find(|(sysfs, _)| *sysfs == sysfs_block)
        .map(|(_, suffix)| *suffix)
}

/// A field's value in one GPU's readings.
pub type Value = fn(&GpuReadings) -> Option<f64>;

/// A device-level field: one series per physical GPU, a gauge.
pub struct DeviceField {
    /// The config name (`GPU_EDGE_TEMPERATURE`).
    pub field: &'static str,
    /// The metric name, before the configured prefix.
    pub name: &'static str,
    pub help: &'static str,
    pub value: Value,
}

fn mib(v: Option<u64>) -> Option<f64> {
    v.map(bytes_to_mib)
}

/// A table value that reads 0 where the firmware does not report it (the
/// rail voltages): no value, as the reference marks a zero unsupported.
fn nonzero(v: Option<f64>) -> Option<f64> {
    v.filter(|v| *v != 0.0)
}

/// A value from the GPU's `gpu_metrics` table.
fn table<T: Into<f64>>(r: &GpuReadings, pick: fn(&GpuMetrics) -> Option<T>) -> Option<f64> {
    r.gpu_metrics.as_ref().and_then(pick).map(Into::into)
}

/// A 64-bit table value (counters; exact up to 2^53).
fn table64(r: &GpuReadings, pick: fn(&GpuMetrics) -> Option<u64>) -> Option<f64> {
    r.gpu_metrics.as_ref().and_then(pick).map(|v| v as f64)
}

fn free(total: Option<u64>, used: Option<u64>) -> Option<f64> {
    Some(bytes_to_mib(total?.saturating_sub(used?)))
}

pub const DEVICE_FIELDS: &[DeviceField] = &[
    DeviceField {
        field: "GPU_PACKAGE_POWER",
        name: "gpu_package_power",
        help: "Current socket power in watts",
        value: |r| r.power.current_w,
    },
    DeviceField {
        field: "GPU_AVERAGE_PACKAGE_POWER",
        name: "gpu_average_package_power",
        help: "Average socket power in watts",
        value: |r| r.power.average_w,
    },
    DeviceField {
        field: "GPU_POWER_USAGE",
        name: "gpu_power_usage",
        help: "GPU power usage in watts",
        value: |r| r.power.current_w.or(r.power.average_w),
    },
    DeviceField {
        field: "GPU_ENERGY_CONSUMED",
        name: "gpu_energy_consumed",
        help: "Energy the GPU has consumed, in microjoules",
        value: |r| r.power.energy_uj.map(|v| v as f64),
    },
    DeviceField {
        field: "GPU_EDGE_TEMPERATURE",
        name: "gpu_edge_temperature",
        help: "Edge temperature in degrees Celsius",
        value: |r| r.temperature.edge_c,
    },
    DeviceField {
        field: "GPU_JUNCTION_TEMPERATURE",
        name: "gpu_junction_temperature",
        help: "Junction (hotspot) temperature in degrees Celsius",
        value: |r| r.temperature.junction_c,
    },
    DeviceField {
        field: "GPU_MEMORY_TEMPERATURE",
        name: "gpu_memory_temperature",
        help: "Memory temperature in degrees Celsius",
        value: |r| r.temperature.memory_c,
    },
    DeviceField {
        field: "GPU_GFX_ACTIVITY",
        name: "gpu_gfx_activity",
        help: "Graphics engine busy, percent (0-100)",
        value: |r| r.gfx_activity_pct,
    },
    DeviceField {
        field: "GPU_UMC_ACTIVITY",
        name: "gpu_umc_activity",
        help: "Memory controller busy, percent (0-100)",
        value: |r| r.umc_activity_pct,
    },
    DeviceField {
        field: "GPU_TOTAL_VRAM",
        name: "gpu_total_vram",
        help: "Total VRAM in MiB",
        value: |r| mib(r.memory.vram_total),
    },
    DeviceField {
        field: "GPU_USED_VRAM",
        name: "gpu_used_vram",
        help: "Used VRAM in MiB",
        value: |r| mib(r.memory.vram_used),
    },
    DeviceField {
        field: "GPU_FREE_VRAM",
        name: "gpu_free_vram",
        help: "Free VRAM in MiB",
        value: |r| free(r.memory.vram_total, r.memory.vram_used),
    },
    DeviceField {
        field: "GPU_TOTAL_VISIBLE_VRAM",
        name: "gpu_total_visible_vram",
        help: "Total CPU-visible VRAM in MiB",
        value: |r| mib(r.memory.vis_vram_total),
    },
    DeviceField {
        field: "GPU_USED_VISIBLE_VRAM",
        name: "gpu_used_visible_vram",
        help: "Used CPU-visible VRAM in MiB",
        value: |r| mib(r.memory.vis_vram_used),
    },
    DeviceField {
        field: "GPU_FREE_VISIBLE_VRAM",
        name: "gpu_free_visible_vram",
        help: "Free CPU-visible VRAM in MiB",
        value: |r| free(r.memory.vis_vram_total, r.memory.vis_vram_used),
    },
    DeviceField {
        field: "GPU_TOTAL_GTT",
        name: "gpu_total_gtt",
        help: "Total GTT (graphics translation table) memory in MiB",
        value: |r| mib(r.memory.gtt_total),
    },
    DeviceField {
        field: "GPU_USED_GTT",
        name: "gpu_used_gtt",
        help: "Used GTT memory in MiB",
        value: |r| mib(r.memory.gtt_used),
    },
    DeviceField {
        field: "GPU_FREE_GTT",
        name: "gpu_free_gtt",
        help: "Free GTT memory in MiB",
        value: |r| free(r.memory.gtt_total, r.memory.gtt_used),
    },
    DeviceField {
        field: "PCIE_SPEED",
        name: "pcie_speed",
        help: "Current PCIe link speed in GT/s",
        value: |r| r.pcie.speed_gts,
    },
    DeviceField {
        field: "PCIE_MAX_SPEED",
        name: "pcie_max_speed",
        help: "Maximum PCIe link speed in GT/s",
        value: |r| r.pcie.max_speed_gts,
    },
    DeviceField {
        field: "PCIE_REPLAY_COUNT",
        name: "pcie_replay_count",
        help: "PCIe replays (NAKs) since the driver loaded",
        value: |r| r.pcie.replay_count.map(|v| v as f64),
    },
    DeviceField {
        field: "GPU_ECC_CORRECT_TOTAL",
        name: "gpu_ecc_correct_total",
        help: "Correctable ECC errors, all blocks",
        value: |r| r.ecc_totals().map(|c| c.ce as f64),
    },
    DeviceField {
        field: "GPU_ECC_UNCORRECT_TOTAL",
        name: "gpu_ecc_uncorrect_total",
        help: "Uncorrectable ECC errors, all blocks",
        value: |r| r.ecc_totals().map(|c| c.ue as f64),
    },
    DeviceField {
        field: "GPU_ECC_DEFERRED_TOTAL",
        name: "gpu_ecc_deferred_total",
        help: "Deferred ECC errors, all blocks that report them",
        value: |r| r.ecc_totals().and_then(|c| c.de).map(|de| de as f64),
    },
    // From the `gpu_metrics` table.
    DeviceField {
        field: "PCIE_BANDWIDTH",
        name: "pcie_bandwidth",
        help: "Current PCIe bandwidth in Mb/s",
        value: |r| table64(r, |g| g.pcie_bandwidth_inst),
    },
    DeviceField {
        field: "PCIE_BIDIRECTIONAL_BANDWIDTH",
        name: "pcie_bidirectional_bandwidth",
        help: "Accumulated bandwidth on PCIe link in GB/sec",
        // The table's `pcie_bandwidth_acc`, which the kernel documents as
        // "PCIE accumulated bandwidth (GB/sec)", both directions.
        value: |r| table64(r, |g| g.pcie_bandwidth_acc),
    },
    DeviceField {
        field: "PCIE_RECOVERY_COUNT",
        name: "pcie_recovery_count",
        help: "Total number of PCIe recoveries",
        value: |r| table64(r, |g| g.pcie_l0_to_recov_count_acc),
    },
    DeviceField {
        field: "PCIE_REPLAY_ROLLOVER_COUNT",
        name: "pcie_replay_rollover_count",
        help: "PCIe replay rollover accumulated count",
        value: |r| table64(r, |g| g.pcie_replay_rover_count_acc),
    },
    DeviceField {
        field: "PCIE_NACK_SENT_COUNT",
        name: "pcie_nack_sent_count",
        help: "PCIe NAK sent accumulated count",
        value: |r| table(r, |g| g.pcie_nak_sent_count_acc),
    },
    DeviceField {
        field: "PCIE_NACK_RECEIVED_COUNT",
        name: "pcie_nack_received_count",
        help: "PCIe NAK received accumulated count",
        value: |r| table(r, |g| g.pcie_nak_rcvd_count_acc),
    },
    DeviceField {
        field: "GPU_MMA_ACTIVITY",
        name: "gpu_mma_activity",
        help: "Average multimedia (MM) engine usage in percent (0-100)",
        value: |r| table(r, |g| g.average_mm_activity),
    },
    // The rails' voltages, which Navi SMUs write in the v1.3 table and
    // Instinct SMUs leave unset (the reference lists them as deprecated on
    // every Instinct platform).
    DeviceField {
        field: "GPU_VOLTAGE",
        name: "gpu_voltage",
        help: "Current SoC voltage in mV",
        value: |r| nonzero(table(r, |g| g.voltage_soc)),
    },
    DeviceField {
        field: "GPU_GFX_VOLTAGE",
        name: "gpu_gfx_voltage",
        help: "Current gfx voltage in mV",
        value: |r| nonzero(table(r, |g| g.voltage_gfx)),
    },
    DeviceField {
        field: "GPU_MEMORY_VOLTAGE",
        name: "gpu_memory_voltage",
        help: "Current memory voltage in mV",
        value: |r| nonzero(table(r, |g| g.voltage_mem)),
    },
    DeviceField {
        field: "GPU_VRAM_MAX_BANDWIDTH",
        name: "gpu_vram_max_bandwidth",
        help: "VRAM maximum bandwidth at the maximum memory clock in GB/s",
        value: |r| table64(r, |g| g.mem_max_bandwidth),
    },
    DeviceField {
        field: "GPU_VIOLATION_CURRENT_ACCUMULATED_COUNTER",
        name: "gpu_violation_current_accumulated_counter",
        help: "Accumulation cycles of the violation residency counters",
        value: |r| table(r, |g| g.accumulation_counter),
    },
    DeviceField {
        field: "GPU_VIOLATION_PROCESSOR_HOT_RESIDENCY_ACCUMULATED",
        name: "gpu_violation_processor_hot_residency_accumulated",
        help: "Processor hot residency, accumulated violation counter",
        value: |r| table(r, |g| g.prochot_residency_acc),
    },
    DeviceField {
        field: "GPU_VIOLATION_PPT_RESIDENCY_ACCUMULATED",
        name: "gpu_violation_ppt_residency_accumulated",
        help: "Package power tracking residency, accumulated violation counter",
        value: |r| table(r, |g| g.ppt_residency_acc),
    },
    DeviceField {
        field: "GPU_VIOLATION_SOCKET_THERMAL_RESIDENCY_ACCUMULATED",
        name: "gpu_violation_socket_thermal_residency_accumulated",
        help: "Socket thermal residency, accumulated violation counter",
        value: |r| table(r, |g| g.socket_thm_residency_acc),
    },
    DeviceField {
        field: "GPU_VIOLATION_VR_THERMAL_RESIDENCY_ACCUMULATED",
        name: "gpu_violation_vr_thermal_residency_accumulated",
        help: "Voltage rail thermal residency, accumulated violation counter",
        value: |r| table(r, |g| g.vr_thm_residency_acc),
    },
    DeviceField {
        field: "GPU_VIOLATION_HBM_THERMAL_RESIDENCY_ACCUMULATED",
        name: "gpu_violation_hbm_thermal_residency_accumulated",
        help: "HBM thermal residency, accumulated violation counter",
        value: |r| table(r, |g| g.hbm_thm_residency_acc),
    },
    // Percentages: residency growth per accumulation cycle since the
    // previous sample (see `gpu_metrics::violation_percentages`).
    DeviceField {
        field: "GPU_VIOLATION_PROCESSOR_HOT_RESIDENCY_PERCENTAGE",
        name: "gpu_violation_processor_hot_residency_percentage",
        help: "Processor hot residency since the previous sample, percent",
        value: |r| r.violations.as_ref()?.prochot,
    },
    DeviceField {
        field: "GPU_VIOLATION_PPT_RESIDENCY_PERCENTAGE",
        name: "gpu_violation_ppt_residency_percentage",
        help: "Package power tracking residency since the previous sample, percent",
        value: |r| r.violations.as_ref()?.ppt,
    },
    DeviceField {
        field: "GPU_VIOLATION_SOCKET_THERMAL_RESIDENCY_PERCENTAGE",
        name: "gpu_violation_socket_thermal_residency_percentage",
        help: "Socket thermal residency since the previous sample, percent",
        value: |r| r.violations.as_ref()?.socket_thermal,
    },
    DeviceField {
        field: "GPU_VIOLATION_VR_THERMAL_RESIDENCY_PERCENTAGE",
        name: "gpu_violation_vr_thermal_residency_percentage",
        help: "Voltage rail thermal residency since the previous sample, percent",
        value: |r| r.violations.as_ref()?.vr_thermal,
    },
    DeviceField {
        field: "GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE",
        name: "gpu_violation_hbm_thermal_residency_percentage",
        help: "HBM thermal residency since the previous sample, percent",
        value: |r| r.violations.as_ref()?.hbm_thermal,
    },
];

/// Device-level fields that the reference also reports on every other
/// partition of a partitioned GPU, as 0: the driver has no per-partition power
/// sensor, CPU-visible VRAM or GTT there, and amd-smi reads 0. Every other
/// device-level field (temperatures, energy, activity, PCIe, ECC, violation
/// counters) is reported on the primary partition only.
pub const ZERO_ON_OTHER_PARTITIONS: &[&str] = &[
    "GPU_PACKAGE_POWER",
    "GPU_POWER_USAGE",
    "GPU_TOTAL_VISIBLE_VRAM",
    "GPU_USED_VISIBLE_VRAM",
    "GPU_FREE_VISIBLE_VRAM",
    "GPU_VRAM_MAX_BANDWIDTH",
    "GPU_TOTAL_GTT",
    "GPU_USED_GTT",
    "GPU_FREE_GTT",
];

/// Which series an [`IndexedField`] has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Device-level: on the primary partition of each physical GPU (for
    /// the per-XCP fields, from the primary partition's own entry).
    Device,
    /// One set per partition (logical GPU), from its XCP's entry of the table.
    Partition,
}

/// A field with one series per instance (HBM stack, VCN, JPEG engine, XCC),
/// labelled with the instance's index as the reference labels it.
pub struct IndexedField {
    pub field: &'static str,
    pub name: &'static str,
    pub help: &'static str,
    /// `hbm_index`, `vcn_index`, `jpeg_index`, `xcc_index`, `link_index`.
    pub label: &'static str,
    pub scope: Scope,
    /// The values by index, for a partition (0 for device-level fields);
    /// `None` entries have no series.
    pub values: fn(&GpuReadings, u32) -> Vec<Option<f64>>,
}

fn list<T: Copy + Into<f64>>(v: &[Option<T>]) -> Vec<Option<f64>> {
    v.iter().map(|x| x.map(Into::into)).collect()
}

fn list64(v: &[Option<u64>]) -> Vec<Option<f64>> {
    v.iter().map(|x| x.map(|v| v as f64)).collect()
}

/// A partition's entry of the per-XCP statistics, mapped.
fn xcp(
    r: &GpuReadings,
    partition: u32,
    pick: fn(&super::gpu_metrics::XcpMetrics) -> Vec<Option<f64>>,
) -> Vec<Option<f64>> {
    r.gpu_metrics
        .as_ref()
        .and_then(|g| g.xcp.get(partition as usize))
        .map(pick)
        .unwrap_or_default()
}

/// A partition's per-XCC violation percentages, mapped.
fn xcp_pct(
    r: &GpuReadings,
    partition: u32,
    pick: fn(&super::gpu_metrics::XcpViolationPercentages) -> &Vec<Option<f64>>,
) -> Vec<Option<f64>> {
    r.violations
        .as_ref()
        .and_then(|v| v.xcp.get(partition as usize))
        .map(|x| pick(x).clone())
        .unwrap_or_default()
}

/// HBM stack temperatures as the reference exports them: a stack reading 0
/// (or N/A) has no sensor, and when the first stack has none the GPU has no
/// HBM sensors at all (early MI300 tables write every stack as 0).
fn hbm_temperatures(stacks: Vec<Option<f64>>) -> Vec<Option<f64>> {
    let readable = |v: Option<f64>| v.filter(|t| *t != 0.0);
    match stacks.first() {
        Some(first) if readable(*first).is_some() => stacks.into_iter().map(readable).collect(),
        _ => Vec::new(),
    }
}

fn device(r: &GpuReadings, pick: fn(&GpuMetrics) -> Vec<Option<f64>>) -> Vec<Option<f64>> {
    r.gpu_metrics.as_ref().map(pick).unwrap_or_default()
}

pub const INDEXED_FIELDS: &[IndexedField] = &[
    IndexedField {
        field: "GPU_HBM_TEMPERATURE",
        name: "gpu_hbm_temperature",
        help: "HBM stack temperatures in degrees Celsius",
        label: "hbm_index",
        scope: Scope::Device,
        values: |r, _| hbm_temperatures(device(r, |g| list(&g.temperature_hbm))),
    },
    IndexedField {
        field: "GPU_VCN_ACTIVITY",
        name: "gpu_vcn_activity",
        help: "Video Core Next (VCN) encode/decode usage in percent",
        label: "vcn_index",
        scope: Scope::Device,
        values: |r, _| device(r, |g| list(&g.vcn_activity)),
    },
    IndexedField {
        field: "GPU_JPEG_ACTIVITY",
        name: "gpu_jpeg_activity",
        help: "JPEG engine usage in percent (0-100)",
        label: "jpeg_index",
        scope: Scope::Device,
        values: |r, _| device(r, |g| list(&g.jpeg_activity)),
    },
    // Each XGMI link's accumulated traffic, in KB, from the table's
    // `xgmi_read_data_acc`/`xgmi_write_data_acc` (MI300's v1.4 and later;
    // MI200's v1.3 has no such members).
    IndexedField {
        field: "GPU_XGMI_LINK_RX",
        name: "gpu_xgmi_link_rx",
        help: "Accumulated XGMI Link Data Read in KB",
        label: "link_index",
        scope: Scope::Device,
        values: |r, _| device(r, |g| list64(&g.xgmi_read_data_acc)),
    },
    IndexedField {
        field: "GPU_XGMI_LINK_TX",
        name: "gpu_xgmi_link_tx",
        help: "Accumulated XGMI Link Data Write in KB",
        label: "link_index",
        scope: Scope::Device,
        values: |r, _| device(r, |g| list64(&g.xgmi_write_data_acc)),
    },
    IndexedField {
        field: "GPU_GFX_BUSY_INSTANTANEOUS",
        name: "gpu_gfx_busy_instantaneous",
        help: "GFX busy percent per compute die (XCC) of the partition",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list(&x.gfx_busy_inst)),
    },
    IndexedField {
        field: "GPU_VCN_BUSY_INSTANTANEOUS",
        name: "gpu_vcn_busy_instantaneous",
        help: "VCN busy percent per engine of the partition",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list(&x.vcn_busy)),
    },
    IndexedField {
        field: "GPU_JPEG_BUSY_INSTANTANEOUS",
        name: "gpu_jpeg_busy_instantaneous",
        help: "JPEG busy percent per engine of the partition",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list(&x.jpeg_busy)),
    },
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_POWER_ACCUMULATED",
        name: "gpu_violation_gfx_clock_below_host_limit_power_accumulated",
        help: "GFX clock below host limit (power), accumulated violation counter",
        label: "xcc_index",
        scope: Scope::Partition,
        // v1.8 splits by cause; v1.7's one counter is the power one.
        values: |r, p| {
            xcp(r, p, |x| {
                if x.gfx_below_host_limit_ppt_acc.is_empty() {
                    list64(&x.gfx_below_host_limit_acc)
                } else {
                    list64(&x.gfx_below_host_limit_ppt_acc)
                }
            })
        },
    },
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_THERMAL_ACCUMULATED",
        name: "gpu_violation_gfx_clock_below_host_limit_thermal_accumulated",
        help: "GFX clock below host limit (thermal), accumulated violation counter",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list64(&x.gfx_below_host_limit_thm_acc)),
    },
    IndexedField {
        field: "GPU_VIOLATION_LOW_UTILIZATION_ACCUMULATED",
        name: "gpu_violation_low_utilization_accumulated",
        help: "GFX low utilization, accumulated violation counter",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list64(&x.gfx_low_utilization_acc)),
    },
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_TOTAL_ACCUMULATED",
        name: "gpu_violation_gfx_clock_below_host_limit_total_accumulated",
        help: "GFX clock below host limit (all causes), accumulated violation counter",
        label: "xcc_index",
        scope: Scope::Partition,
        values: |r, p| xcp(r, p, |x| list64(&x.gfx_below_host_limit_total_acc)),
    },
    // The percentages are the primary partition's only, from its own XCP
    // entry: the reference documents them "applicable for primary partition
    // (partition_id=0); suppressed for all other partitions", where the
    // accumulated counters above are "emitted for all partitions".
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_POWER_PERCENTAGE",
        name: "gpu_violation_gfx_clock_below_host_limit_power_percentage",
        help: "GFX clock below host limit (power) since the previous sample, percent",
        label: "xcc_index",
        scope: Scope::Device,
        values: |r, p| xcp_pct(r, p, |x| &x.below_host_limit_power),
    },
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_THERMAL_PERCENTAGE",
        name: "gpu_violation_gfx_clock_below_host_limit_thermal_percentage",
        help: "GFX clock below host limit (thermal) since the previous sample, percent",
        label: "xcc_index",
        scope: Scope::Device,
        values: |r, p| xcp_pct(r, p, |x| &x.below_host_limit_thermal),
    },
    IndexedField {
        field: "GPU_VIOLATION_LOW_UTILIZATION_PERCENTAGE",
        name: "gpu_violation_low_utilization_percentage",
        help: "GFX low utilization since the previous sample, percent",
        label: "xcc_index",
        scope: Scope::Device,
        values: |r, p| xcp_pct(r, p, |x| &x.low_utilization),
    },
    IndexedField {
        field: "GPU_VIOLATION_GFX_CLOCK_BELOW_HOST_LIMIT_TOTAL_PERCENTAGE",
        name: "gpu_violation_gfx_clock_below_host_limit_total_percentage",
        help: "GFX clock below host limit (all causes) since the previous sample, percent",
        label: "xcc_index",
        scope: Scope::Device,
        values: |r, p| xcp_pct(r, p, |x| &x.below_host_limit_total),
    },
];

/// The reference's `clock_type` label values: its `GPUClockType` enum names
/// without the `GPU_CLOCK_TYPE_` prefix, lower case, as its exporter writes
/// them since v1.4.2 (v1.4.1 wrote the enum names). Its enum also has
/// `fabric`, `dce` and `pcie`; sysfs and the metrics table give no current
/// frequency for them, so no series carries those values.
pub const CLOCK_SYSTEM: &str = "system";
pub const CLOCK_MEMORY: &str = "memory";
pub const CLOCK_VIDEO: &str = "video";
pub const CLOCK_DATA: &str = "data";
pub const CLOCK_SOC: &str = "soc";

/// One of a GPU's clocks: its `clock_type`, current frequency, and the
/// lowest and highest level of the DPM table it runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clock {
    pub clock_type: &'static str,
    pub mhz: f64,
    pub range: Option<ClockRange>,
}

/// A GPU's current clocks in `clock_index` order: from the `gpu_metrics`
/// table when there is one (every XCC's GFX clock, memory, then each VCN's
/// video and data clocks and each SoC clock), else the current
/// `pp_dpm_sclk` and `pp_dpm_mclk` levels. Each carries the range of its
/// `pp_dpm_*` table (every XCC runs on `pp_dpm_sclk`, every VCN but a second
/// one with clocks of its own on `pp_dpm_vclk`/`pp_dpm_dclk`), which is
/// what the reference's `gpu_min_clock` and `gpu_max_clock` report.
pub fn clocks(r: &GpuReadings) -> Vec<Clock> {
    let clock = |clock_type, mhz: f64, dpm: Dpm| Clock {
        clock_type,
        mhz,
        range: r.clock_ranges.get(&dpm).copied(),
    };
    let Some(g) = r.gpu_metrics.as_ref() else {
        return [
            (CLOCK_SYSTEM, r.sclk_mhz, Dpm::Sclk),
            (CLOCK_MEMORY, r.mclk_mhz, Dpm::Mclk),
        ]
        .into_iter()
        .filter_map(|(t, v, dpm)| Some(clock(t, v?, dpm)))
        .collect();
    };
    let mut out = Vec::new();
    let mut push = |ty: &'static str, values: &[Option<u16>], dpm: Dpm| {
        out.extend(
            values
                .iter()
                .flatten()
                .map(|v| clock(ty, f64::from(*v), dpm)),
        );
    };
    let own_or = |own: Dpm, shared: Dpm| {
        if r.clock_ranges.contains_key(&own) {
            own
        } else {
            shared
        }
    };
    push(CLOCK_SYSTEM, &g.current_gfxclk, Dpm::Sclk);
    push(CLOCK_MEMORY, &[g.current_uclk], Dpm::Mclk);
    push(CLOCK_VIDEO, &g.current_vclk0, Dpm::Vclk);
    push(
        CLOCK_VIDEO,
        &[g.current_vclk1],
        own_or(Dpm::Vclk1, Dpm::Vclk),
    );
    push(CLOCK_DATA, &g.current_dclk0, Dpm::Dclk);
    push(
        CLOCK_DATA,
        &[g.current_dclk1],
        own_or(Dpm::Dclk1, Dpm::Dclk),
    );
    push(CLOCK_SOC, &g.current_socclk, Dpm::Socclk);
    out
}

/// Fields exported besides [`DEVICE_FIELDS`] and the per-block ECC fields.
pub const OTHER_FIELDS: &[&str] = &[
    "GPU_NODES_TOTAL",
    "GPU_HEALTH",
    "GPU_CLOCK",
    "GPU_MIN_CLOCK",
    "GPU_MAX_CLOCK",
    "GPU_PROCESS_CU_OCCUPANCY",
];

/// Whether this implementation exports a config field name (upper case).
pub fn is_known_field(field: &str) -> bool {
    DEVICE_FIELDS.iter().any(|f| f.field == field)
        || INDEXED_FIELDS.iter().any(|f| f.field == field)
        || OTHER_FIELDS.contains(&field)
        || ECC_BLOCKS.iter().any(|(_, suffix)| {
            let suffix = suffix.to_ascii_uppercase();
            field == format!("GPU_ECC_CORRECT_{suffix}")
                || field == format!("GPU_ECC_UNCORRECT_{suffix}")
                || field == format!("GPU_ECC_DEFERRED_{suffix}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_field_and_ecc_block_is_known() {
        for f in DEVICE_FIELDS {
            assert!(is_known_field(f.field), "{}", f.field);
        }
        assert!(is_known_field("GPU_ECC_CORRECT_XGMI_WAFL"));
        assert!(is_known_field("GPU_ECC_DEFERRED_UMC"));
        assert!(is_known_field("GPU_ECC_DEFERRED_TOTAL"));
        assert!(is_known_field("GPU_HEALTH"));
        assert!(is_known_field("GPU_GFX_BUSY_INSTANTANEOUS"));
        assert!(is_known_field("PCIE_NACK_SENT_COUNT"));
        assert!(is_known_field("GPU_MIN_CLOCK"));
        assert!(is_known_field("GPU_XGMI_LINK_TX"));
        assert!(is_known_field("GPU_ECC_UNCORRECT_MPIO"));
        // CPER records, which amd-smi reads from the kernel's CPER ring.
        assert!(!is_known_field("GPU_AFID_ERRORS"));
    }

    #[test]
    fn hbm_stacks_without_a_sensor_have_no_series_and_no_first_stack_means_none() {
        assert_eq!(
            hbm_temperatures(vec![Some(41.0), Some(0.0), None, Some(44.0)]),
            [Some(41.0), None, None, Some(44.0)]
        );
        assert_eq!(
            hbm_temperatures(vec![Some(0.0), Some(40.0), Some(42.0)]),
            Vec::<Option<f64>>::new()
        );
        assert_eq!(
            hbm_temperatures(vec![None, Some(40.0)]),
            Vec::<Option<f64>>::new()
        );
        assert_eq!(hbm_temperatures(Vec::new()), Vec::<Option<f64>>::new());
    }
}
