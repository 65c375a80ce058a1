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
    /// EEPROM as `product_name`, with `manufacturer` beside it: one a real
    /// board of the model carries where we know it (AMD's Grafana dashboards
    /// select boards by these numbers), else made up.
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
    /// The RAS blocks with a `ras/<name>_err_count` file: those the kernel
    /// registers for this ASIC's IP blocks (see [`MI300_RAS_BLOCKS`],
    /// [`MI200_RAS_BLOCKS`]).
    pub ras_blocks: &'static [&'static str],
    /// The `pp_dpm_*` clock tables.
    pub clocks: Clocks,
}

/// One `pp_dpm_<clock>` file: its levels (MHz, ascending) and the current one.
#[derive(Clone, Copy, Debug)]
pub struct DpmTable {
    pub levels_mhz: &'static [u64],
    pub current: usize,
}

impl DpmTable {
    pub fn current_mhz(&self) -> u64 {
        self.levels_mhz[self.current]
    }
}

/// A model's DPM clock tables. `pp_dpm_sclk` moves with the load (its
/// current level is the simulated load's); the others stay where they are.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    /// GFX clock levels: the minimum, a middle level and the maximum, as
    /// fine-grained DPM parts (MI200, MI300) print them.
    pub sclk_mhz: [u64; 3],
    pub mclk: DpmTable,
    pub socclk: DpmTable,
    pub fclk: DpmTable,
    pub vclk: DpmTable,
    pub dclk: DpmTable,
    /// The second VCN's clocks (`pp_dpm_vclk1`, `pp_dpm_dclk1`), on parts
    /// with two VCN instances of their own clock (Navi3x).
    pub vclk1: Option<DpmTable>,
    pub dclk1: Option<DpmTable>,
}

/// RAS blocks of GC 9.4.3 (MI300): each IP block that registers one with
/// `amdgpu_ras_register_ras_block` there (`gfx_v9_4_3`, `sdma_v4_4_2`,
/// `mmhub_v1_8`, `umc_v12_0`, `hdp_v4_0` through `gmc_v9_0`, XGMI, and
/// `vcn_v4_0_3`/`jpeg_v4_0_3`), and `pcie_bif` from `nbio_v7_9_ras`, which
/// `amdgpu_ras_init` sets for NBIO 7.9 on a dGPU. The sysfs file is named
/// after the block (`amdgpu_ras_sysfs_create`: `<name>_err_count`). Blocks
/// of `ras_block_string[]` that no IP of this ASIC registers (athub, df, smn,
/// sem, mp0, mp1, fuse, mca, ih, mpio) have no file.
pub const MI300_RAS_BLOCKS: &[&str] = &[
    "umc",
    "sdma",
    "gfx",
    "mmhub",
    "pcie_bif",
    "hdp",
    "xgmi_wafl",
    "vcn",
    "jpeg",
];

/// RAS blocks of aldebaran (MI200: MI210, MI250X): as GC 9.4.3's with
/// `pcie_bif` from `nbio_v7_4_ras`, VCN/JPEG from `vcn_v2_6`/`jpeg_v2_6`
/// (`amdgpu_ras_check_supported` enables both for VCN 2.6.0), and the three
/// MCA banks `gmc_v9_0` registers for UMC 6.7 (`mca_v3_0`), which
/// `amdgpu_mca.c` names `mca.mp0`, `mca.mp1` and `mca.mpio`.
pub const MI200_RAS_BLOCKS: &[&str] = &[
    "umc",
    "sdma",
    "gfx",
    "mmhub",
    "pcie_bif",
    "hdp",
    "xgmi_wafl",
    "mca.mp0",
    "mca.mp1",
    "mca.mpio",
    "vcn",
    "jpeg",
];

const fn dpm(levels_mhz: &'static [u64], current: usize) -> DpmTable {
    DpmTable {
        levels_mhz,
        current,
    }
}

/// MI300X: GFX 500 to 2100 MHz (KFD's `max_engine_clk_fcompute`), HBM3
/// 900 to 1300 MHz (rocm-smi's `--showmclkrange` on MI300); the SoC, fabric
/// and video tables are illustrative.
const MI300_CLOCKS: Clocks = Clocks {
    sclk_mhz: [500, 1500, 2100],
    mclk: dpm(&[900, 1100, 1200, 1300], 3),
    socclk: dpm(&[500, 1143, 1200], 1),
    fclk: dpm(&[1200, 1400, 1600, 1900], 3),
    vclk: dpm(&[914, 1000, 1333], 1),
    dclk: dpm(&[711, 800, 1143], 1),
    vclk1: None,
    dclk1: None,
};

/// MI200: GFX 500 to 1700 MHz and HBM2e 400 to 1600 MHz, as rocm-smi shows
/// an MI250X's valid ranges; the others illustrative.
const MI200_CLOCKS: Clocks = Clocks {
    sclk_mhz: [500, 1300, 1700],
    mclk: dpm(&[400, 700, 1200, 1600], 3),
    socclk: dpm(&[500, 1000, 1143], 2),
    fclk: dpm(&[400, 800, 1200, 1600], 3),
    vclk: dpm(&[400, 1000, 1300], 1),
    dclk: dpm(&[400, 800, 1133], 1),
    vclk1: None,
    dclk1: None,
};

/// Navi31 (illustrative): two VCNs with clocks of their own.
const NAVI31_CLOCKS: Clocks = Clocks {
    sclk_mhz: [500, 1500, 2500],
    mclk: dpm(&[96, 456, 772, 1124], 3),
    socclk: dpm(&[500, 1143, 1200], 1),
    fclk: dpm(&[500, 1400, 1900], 2),
    vclk: dpm(&[500, 1000, 1500], 1),
    dclk: dpm(&[500, 800, 1100], 1),
    vclk1: Some(dpm(&[500, 1000, 1500], 1)),
    dclk1: Some(dpm(&[500, 800, 1100], 1)),
};

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
    // An MI300X OAM board (amd-smi's model number), one of the MI300 part
    // numbers the reference's dashboards select by `card_model`.
    product_number: Some("102-G30211-00"),
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
    ras_blocks: MI300_RAS_BLOCKS,
    clocks: MI300_CLOCKS,
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
            ras_blocks: MI200_RAS_BLOCKS,
            clocks: MI200_CLOCKS,
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
            // The MI210 board number of the reference dashboards' MI200 list
            // (`102-D65208-0C|102-D67305-00|102-D65209-0C`).
            product_number: Some("102-D67305-00"),
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
            ras_blocks: MI200_RAS_BLOCKS,
            clocks: MI200_CLOCKS,
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
            // Not checked against the kernel for Navi31: the blocks the
            // simulator has always written.
            ras_blocks: &[
                "umc",
                "sdma",
                "gfx",
                "mmhub",
                "pcie_bif",
                "hdp",
                "xgmi_wafl",
            ],
            clocks: NAVI31_CLOCKS,
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
