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

use super::sample::GpuReadings;
use super::sysfs::bytes_to_mib;

/// How a family is declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Gauge,
    Counter,
    Untyped,
}

/// RAS blocks: the sysfs name (`ras/<name>_err_count`) and the suffix of the
/// reference's per-block metrics (`gpu_ecc_uncorrect_<suffix>`).
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

/// A device-level field: one series per physical GPU.
pub struct DeviceField {
    /// The config name (`GPU_EDGE_TEMPERATURE`).
    pub field: &'static str,
    /// The metric name, before the configured prefix.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub value: Value,
}

fn mib(v: Option<u64>) -> Option<f64> {
    v.map(bytes_to_mib)
}

fn free(total: Option<u64>, used: Option<u64>) -> Option<f64> {
    Some(bytes_to_mib(total?.saturating_sub(used?)))
}

pub const DEVICE_FIELDS: &[DeviceField] = &[
    DeviceField {
        field: "GPU_PACKAGE_POWER",
        name: "gpu_package_power",
        help: "Current socket power in watts",
        kind: Kind::Gauge,
        value: |r| r.power.current_w,
    },
    DeviceField {
        field: "GPU_AVERAGE_PACKAGE_POWER",
        name: "gpu_average_package_power",
        help: "Average socket power in watts",
        kind: Kind::Gauge,
        value: |r| r.power.average_w,
    },
    DeviceField {
        field: "GPU_POWER_USAGE",
        name: "gpu_power_usage",
        help: "GPU power usage in watts",
        kind: Kind::Gauge,
        value: |r| r.power.current_w.or(r.power.average_w),
    },
    DeviceField {
        field: "GPU_ENERGY_CONSUMED",
        name: "gpu_energy_consumed",
        help: "Energy the GPU has consumed, in microjoules",
        kind: Kind::Gauge,
        value: |r| r.power.energy_uj.map(|v| v as f64),
    },
    DeviceField {
        field: "GPU_EDGE_TEMPERATURE",
        name: "gpu_edge_temperature",
        help: "Edge temperature in degrees Celsius",
        kind: Kind::Gauge,
        value: |r| r.temperature.edge_c,
    },
    DeviceField {
        field: "GPU_JUNCTION_TEMPERATURE",
        name: "gpu_junction_temperature",
        help: "Junction (hotspot) temperature in degrees Celsius",
        kind: Kind::Gauge,
        value: |r| r.temperature.junction_c,
    },
    DeviceField {
        field: "GPU_MEMORY_TEMPERATURE",
        name: "gpu_memory_temperature",
        help: "Memory temperature in degrees Celsius",
        kind: Kind::Gauge,
        value: |r| r.temperature.memory_c,
    },
    DeviceField {
        field: "GPU_GFX_ACTIVITY",
        name: "gpu_gfx_activity",
        help: "Graphics engine busy, percent (0-100)",
        kind: Kind::Gauge,
        value: |r| r.gfx_activity_pct,
    },
    DeviceField {
        field: "GPU_UMC_ACTIVITY",
        name: "gpu_umc_activity",
        help: "Memory controller busy, percent (0-100)",
        kind: Kind::Gauge,
        value: |r| r.umc_activity_pct,
    },
    DeviceField {
        field: "GPU_TOTAL_VRAM",
        name: "gpu_total_vram",
        help: "Total VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.vram_total),
    },
    DeviceField {
        field: "GPU_USED_VRAM",
        name: "gpu_used_vram",
        help: "Used VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.vram_used),
    },
    DeviceField {
        field: "GPU_FREE_VRAM",
        name: "gpu_free_vram",
        help: "Free VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| free(r.memory.vram_total, r.memory.vram_used),
    },
    DeviceField {
        field: "GPU_TOTAL_VISIBLE_VRAM",
        name: "gpu_total_visible_vram",
        help: "Total CPU-visible VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.vis_vram_total),
    },
    DeviceField {
        field: "GPU_USED_VISIBLE_VRAM",
        name: "gpu_used_visible_vram",
        help: "Used CPU-visible VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.vis_vram_used),
    },
    DeviceField {
        field: "GPU_FREE_VISIBLE_VRAM",
        name: "gpu_free_visible_vram",
        help: "Free CPU-visible VRAM in MiB",
        kind: Kind::Gauge,
        value: |r| free(r.memory.vis_vram_total, r.memory.vis_vram_used),
    },
    DeviceField {
        field: "GPU_TOTAL_GTT",
        name: "gpu_total_gtt",
        help: "Total GTT (graphics translation table) memory in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.gtt_total),
    },
    DeviceField {
        field: "GPU_USED_GTT",
        name: "gpu_used_gtt",
        help: "Used GTT memory in MiB",
        kind: Kind::Gauge,
        value: |r| mib(r.memory.gtt_used),
    },
    DeviceField {
        field: "GPU_FREE_GTT",
        name: "gpu_free_gtt",
        help: "Free GTT memory in MiB",
        kind: Kind::Gauge,
        value: |r| free(r.memory.gtt_total, r.memory.gtt_used),
    },
    DeviceField {
        field: "PCIE_SPEED",
        name: "pcie_speed",
        help: "Current PCIe link speed in GT/s",
        kind: Kind::Gauge,
        value: |r| r.pcie.speed_gts,
    },
    DeviceField {
        field: "PCIE_MAX_SPEED",
        name: "pcie_max_speed",
        help: "Maximum PCIe link speed in GT/s",
        kind: Kind::Gauge,
        value: |r| r.pcie.max_speed_gts,
    },
    DeviceField {
        field: "PCIE_REPLAY_COUNT",
        name: "pcie_replay_count",
        help: "PCIe replays (NAKs) since the driver loaded",
        kind: Kind::Untyped,
        value: |r| r.pcie.replay_count.map(|v| v as f64),
    },
    DeviceField {
        field: "GPU_ECC_CORRECT_TOTAL",
        name: "gpu_ecc_correct_total",
        help: "Correctable ECC errors, all blocks",
        kind: Kind::Counter,
        value: |r| r.ecc_totals().map(|c| c.ce as f64),
    },
    DeviceField {
        field: "GPU_ECC_UNCORRECT_TOTAL",
        name: "gpu_ecc_uncorrect_total",
        help: "Uncorrectable ECC errors, all blocks",
        kind: Kind::Counter,
        value: |r| r.ecc_totals().map(|c| c.ue as f64),
    },
];

/// Fields exported besides [`DEVICE_FIELDS`] and the per-block ECC fields.
pub const OTHER_FIELDS: &[&str] = &["GPU_NODES_TOTAL", "GPU_HEALTH", "GPU_CLOCK"];

/// Whether this implementation exports a config field name (upper case).
pub fn is_known_field(field: &str) -> bool {
    DEVICE_FIELDS.iter().any(|f| f.field == field)
        || OTHER_FIELDS.contains(&field)
        || ECC_BLOCKS.iter().any(|(_, suffix)| {
            let suffix = suffix.to_ascii_uppercase();
            field == format!("GPU_ECC_CORRECT_{suffix}")
                || field == format!("GPU_ECC_UNCORRECT_{suffix}")
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
        assert!(is_known_field("GPU_HEALTH"));
        assert!(!is_known_field("GPU_VOLTAGE"));
    }
}
