//! The simulated machines: what each profile's GPUs are and how they connect.
//!
//! Values follow the real parts and the captured KFD topologies in the project's
//! fixtures (bus numbers and link weights of the MI300X capture, the render-minor
//! spacing of eight per GPU seen on MI300 and MI308 hosts).

/// What one GPU model looks like to the kernel.
#[derive(Clone, Debug)]
pub struct GpuModel {
    pub device_id: u16,
    pub revision: u16,
    pub subsystem_device: u16,
    /// `None` for SR-IOV virtual functions, which have no `product_name` file.
    pub product_name: Option<&'static str>,
    /// The board's part number (`product_number`), read from the same FRU
    /// EEPROM as `product_name`, with `manufacturer` beside it; made up here.
    pub product_number: Option<&'static str>,
    pub gfx_target_version: u32,
    pub cu_count: u32,
    pub simd_per_cu: u32,
    pub vram_bytes: u64,
    pub vbios: &'static str,
    /// Compute partition modes in the kernel's spelling; empty when not partitionable.
    pub compute_modes: &'static [&'static str],
    pub memory_modes: &'static [&'static str],
    pub max_link_speed: &'static str,
    pub max_link_width: u32,
    /// Firmware versions by `fw_version/` file stem (`mec`, `sdma`, ...); engines
    /// not listed read 0, as the kernel reports engines a GPU does not have.
    pub firmware: &'static [(&'static str, u32)],
    /// The `gpu_metrics` revision (format, content) the kernel's SMU code
    /// for this part writes; `None` where the file is absent (an SR-IOV
    /// guest has no access to the SMU).
    pub gpu_metrics: Option<(u8, u8)>,
    /// The kernel collects this part's RAS errors through ACA, and UMC's
    /// `ras/umc_err_count` has a third line, `de:` (deferred errors), as
    /// `amdgpu_ras.c` writes it for MI300.
    pub ras_deferred: bool,
}

/// How the GPUs of a host are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fabric {
    /// Every GPU in one XGMI hive.
    OneHive,
    /// XGMI bridges join GPUs in pairs (0-1, 2-3, ...); pairs talk over PCIe.
    BridgedPairs,
    /// PCIe only.
    PcieOnly,
}

#[derive(Clone, Debug)]
pub struct Profile {
    pub name: &'static str,
    pub summary: &'static str,
    pub model: GpuModel,
    pub default_gpus: usize,
    pub max_gpus: usize,
    pub fabric: Fabric,
    /// PCI bus of each GPU, in order.
    pub buses: &'static [u8],
    /// `numa_node` reported for GPU i is `numa[i * numa.len() / gpus]`; `-1` is no affinity.
    pub numa: &'static [i32],
    /// Number of CPU agents in the KFD topology.
    pub cpu_nodes: u32,
}

const MI300X: GpuModel = GpuModel {
    device_id: 0x74a1,
    revision: 0x00,
    subsystem_device: 0x74a1,
    product_name: Some("AMD Instinct MI300X"),
    product_number: Some("102-G30200-0A"),
    gfx_target_version: 90402,
    cu_count: 304,
    simd_per_cu: 4,
    vram_bytes: 192 * GIB,
    vbios: "113-M3000100-102",
    compute_modes: &["SPX", "DPX", "QPX", "CPX"],
    memory_modes: &["NPS1", "NPS4"],
    max_link_speed: "32.0 GT/s PCIe",
    max_link_width: 16,
    // MEC and SDMA as in the MI300X capture's KFD topology.
    firmware: &[
        ("mec", 177),
        ("sdma", 24),
        ("rlc", 17),
        ("smc", 0x0055_7100),
    ],
    // smu_v13_0_6 writes v1.8 since the below-host-limit counters (after v1.4
    // to v1.7 on earlier kernels).
    gpu_metrics: Some((1, 8)),
    ras_deferred: true,
};

impl GpuModel {
    /// The version `fw_version/<stem>_fw_version` reports: 0 for engines the
    /// model does not list.
    pub fn firmware_version(&self, stem: &str) -> u32 {
        self.firmware
            .iter()
            .find(|(s, _)| *s == stem)
            .map_or(0, |(_, v)| *v)
    }
}

const GIB: u64 = 1024 * 1024 * 1024;

pub const PROFILES: &[Profile] = &[
    Profile {
        name: "mi300x",
        summary: "8 MI300X OAM GPUs in one XGMI hive, partitionable (spx/dpx/qpx/cpx x nps1/nps4)",
        model: MI300X,
        default_gpus: 8,
        max_gpus: 8,
        fabric: Fabric::OneHive,
        buses: &[0x05, 0x27, 0x47, 0x65, 0x85, 0xa7, 0xc7, 0xe5],
        numa: &[0, 1],
        cpu_nodes: 2,
    },
    Profile {
        name: "mi250x",
        summary: "4 MI250X cards, each exposing two GCDs as separate GPUs (8 GPUs), one XGMI hive",
        model: GpuModel {
            device_id: 0x740c,
            revision: 0x01,
            subsystem_device: 0x0b0c,
            product_name: Some("AMD Instinct MI250X"),
            product_number: Some("102-D65200-0A"),
            gfx_target_version: 90010,
            cu_count: 110,
            simd_per_cu: 4,
            vram_bytes: 64 * GIB,
            vbios: "113-D65201-042",
            compute_modes: &[],
            memory_modes: &[],
            max_link_speed: "16.0 GT/s PCIe",
            max_link_width: 16,
            firmware: &[("mec", 95), ("sdma", 9), ("rlc", 17), ("smc", 0x0044_3800)],
            // aldebaran (SMU 13.0.2) writes v1.3.
            gpu_metrics: Some((1, 3)),
            ras_deferred: false,
        },
        default_gpus: 8,
        max_gpus: 8,
        fabric: Fabric::OneHive,
        buses: &[0xc1, 0xc6, 0xc9, 0xce, 0xd1, 0xd6, 0xd9, 0xde],
        numa: &[0, 1],
        cpu_nodes: 2,
    },
    Profile {
        name: "mi210",
        summary: "4 MI210 PCIe cards in two XGMI-bridged pairs",
        model: GpuModel {
            device_id: 0x740f,
            revision: 0x02,
            subsystem_device: 0x0c34,
            product_name: Some("AMD Instinct MI210"),
            product_number: Some("102-D67300-0A"),
            gfx_target_version: 90010,
            cu_count: 104,
            simd_per_cu: 4,
            vram_bytes: 64 * GIB,
            vbios: "113-D67301-063",
            compute_modes: &[],
            memory_modes: &[],
            max_link_speed: "16.0 GT/s PCIe",
            max_link_width: 16,
            firmware: &[("mec", 92), ("sdma", 9), ("rlc", 17), ("smc", 0x0044_3b00)],
            gpu_metrics: Some((1, 3)),
            ras_deferred: false,
        },
        default_gpus: 4,
        max_gpus: 8,
        fabric: Fabric::BridgedPairs,
        buses: &[0x03, 0x26, 0x43, 0x63, 0x83, 0xa3, 0xc3, 0xe3],
        numa: &[0, 1],
        cpu_nodes: 2,
    },
    Profile {
        name: "radeon-w7900",
        summary: "one Radeon PRO W7900 workstation GPU, not partitionable",
        model: GpuModel {
            device_id: 0x7448,
            revision: 0x00,
            subsystem_device: 0x0e0d,
            product_name: Some("AMD Radeon PRO W7900"),
            product_number: Some("100-300000000"),
            gfx_target_version: 110000,
            cu_count: 96,
            simd_per_cu: 2,
            vram_bytes: 48 * GIB,
            vbios: "113-D7070100-100",
            compute_modes: &[],
            memory_modes: &[],
            max_link_speed: "16.0 GT/s PCIe",
            max_link_width: 16,
            firmware: &[
                ("me", 1980),
                ("pfp", 2020),
                ("mec", 2140),
                ("rlc", 110),
                ("sdma", 21),
                ("smc", 0x004e_5c00),
            ],
            // Navi31's SMU 13.0.0 writes v1.3.
            gpu_metrics: Some((1, 3)),
            ras_deferred: false,
        },
        default_gpus: 1,
        max_gpus: 4,
        fabric: Fabric::PcieOnly,
        buses: &[0x03, 0x23, 0x43, 0x63],
        numa: &[0],
        cpu_nodes: 1,
    },
    Profile {
        name: "mi300x-vf",
        summary: "MI300X SR-IOV virtual functions as a guest sees them: no product_name, no NUMA affinity",
        model: GpuModel {
            device_id: 0x74b5,
            product_name: None,
            product_number: None,
            // A guest has no access to the SMU's firmware.
            firmware: &[("mec", 177), ("sdma", 24), ("rlc", 17)],
            gpu_metrics: None,
            compute_modes: &[],
            memory_modes: &[],
            ..MI300X
        },
        default_gpus: 8,
        max_gpus: 8,
        fabric: Fabric::PcieOnly,
        buses: &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18],
        numa: &[-1],
        cpu_nodes: 1,
    },
];

pub fn find(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.name).collect()
}

/// Number of partitions of a compute mode (see [`crate::device::modes`]).
pub fn compute_mode_partitions(mode: &str) -> Option<u32> {
    crate::device::modes::compute_partitions(mode)
}
