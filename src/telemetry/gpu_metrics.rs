//! The binary `gpu_metrics` file of a GPU's sysfs directory, parsed: the
//! `struct gpu_metrics_v1_x` table the amdgpu power-play code fills from the
//! SMU firmware (per-XCC busy, clocks, temperatures, throttle residencies,
//! PCIe counters, VCN/JPEG activity, energy, power).
//!
//! Layouts follow `drivers/gpu/drm/amd/include/kgd_pp_interface.h` as read in
//! `ROCm/amdgpu` at 0ce779bf9fdad70e015c5a503f1e45e966fe5c42 (AMD's kernel
//! tree, which defines v1.0 to v1.9), and for the first v1.6 in
//! `torvalds/linux` at 00dedab07b52ca16107e82ce5ca7caaaedf6a417. Supported:
//! v1.3 (MI200 `aldebaran`, Navi2x/Navi3x, early MI300), v1.4, v1.5, both
//! v1.6 layouts (the kernel redefined v1.6 in place; `structure_size` tells
//! them apart), v1.7 and v1.8 (MI300 `smu_v13_0_6`). v1.9 is a list of
//! kernel pointers, not a byte layout, and is refused like any other unknown
//! revision.
//!
//! Each version is decoded by reading its members in declaration order with
//! the C alignment rules, so the decoders share no table with the simulator's
//! writer (`simulate::gpu_metrics`), and each checks the other in the tests.
//!
//! Bounds: nothing is read past the bytes actually given, whatever the header
//! says; the header's size must be one the kernel writes for that revision and
//! no larger than the blob. A short, unknown or inconsistent blob is an error
//! value, never a panic. Values the kernel leaves at its 0xFF fill (0xFFFF,
//! 0xFFFF_FFFF, `u64::MAX`) are "not available": `None`.
//!
//! Pure: no I/O (the sampler reads the file), no rendering.

use serde::Serialize;

/// Why a blob could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuMetricsError {
    #[error("gpu_metrics: {len} bytes, shorter than its 4-byte header")]
    NoHeader { len: usize },
    #[error("gpu_metrics v{frev}.{crev}: not a supported revision")]
    Unsupported { frev: u8, crev: u8 },
    #[error(
        "gpu_metrics v{frev}.{crev}: header says {claimed} bytes, the kernel writes {expected:?}"
    )]
    Size {
        frev: u8,
        crev: u8,
        claimed: usize,
        expected: Vec<usize>,
    },
    #[error("gpu_metrics v{frev}.{crev}: header says {claimed} bytes, only {len} were read")]
    Truncated {
        frev: u8,
        crev: u8,
        claimed: usize,
        len: usize,
    },
}

/// One partition's (XCP's) activity, v1.6 and later.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct XcpMetrics {
    /// Instantaneous busy percent of each of the partition's XCCs.
    pub gfx_busy_inst: Vec<Option<u32>>,
    pub jpeg_busy: Vec<Option<u16>>,
    pub vcn_busy: Vec<Option<u16>>,
    pub gfx_busy_acc: Vec<Option<u64>>,
    /// v1.7: cycles the GFX clock ran below the host's limit.
    pub gfx_below_host_limit_acc: Vec<Option<u64>>,
    /// v1.8: the same, split by cause.
    pub gfx_below_host_limit_ppt_acc: Vec<Option<u64>>,
    pub gfx_below_host_limit_thm_acc: Vec<Option<u64>>,
    pub gfx_low_utilization_acc: Vec<Option<u64>>,
    pub gfx_below_host_limit_total_acc: Vec<Option<u64>>,
}

/// What one `gpu_metrics` table says, in the kernel's units: degrees Celsius,
/// watts, percent, MHz, mV; energy in 15.259 µJ (2^-16 J) units; PCIe speed
/// in 0.1 GT/s; XGMI data in KB. Members a version lacks are `None` or empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuMetrics {
    pub format_revision: u8,
    pub content_revision: u8,
    pub temperature_edge: Option<u16>,
    pub temperature_hotspot: Option<u16>,
    pub temperature_mem: Option<u16>,
    pub temperature_vrgfx: Option<u16>,
    pub temperature_vrsoc: Option<u16>,
    pub temperature_vrmem: Option<u16>,
    /// Per HBM stack (v1.3).
    pub temperature_hbm: Vec<Option<u16>>,
    pub average_gfx_activity: Option<u16>,
    pub average_umc_activity: Option<u16>,
    /// Multimedia (UVD/VCN) activity (v1.3).
    pub average_mm_activity: Option<u16>,
    pub average_socket_power: Option<u16>,
    pub current_socket_power: Option<u16>,
    pub energy_accumulator: Option<u64>,
    pub system_clock_counter: Option<u64>,
    pub firmware_timestamp: Option<u64>,
    pub throttle_status: Option<u32>,
    pub indep_throttle_status: Option<u64>,
    pub gfxclk_lock_status: Option<u32>,
    pub current_fan_speed: Option<u16>,
    pub pcie_link_width: Option<u16>,
    pub pcie_link_speed: Option<u16>,
    pub xgmi_link_width: Option<u16>,
    pub xgmi_link_speed: Option<u16>,
    pub gfx_activity_acc: Option<u32>,
    pub mem_activity_acc: Option<u32>,
    pub pcie_bandwidth_acc: Option<u64>,
    pub pcie_bandwidth_inst: Option<u64>,
    pub pcie_l0_to_recov_count_acc: Option<u64>,
    pub pcie_replay_count_acc: Option<u64>,
    pub pcie_replay_rover_count_acc: Option<u64>,
    pub pcie_nak_sent_count_acc: Option<u32>,
    pub pcie_nak_rcvd_count_acc: Option<u32>,
    pub pcie_lc_perf_other_end_recovery: Option<u32>,
    pub xgmi_read_data_acc: Vec<Option<u64>>,
    pub xgmi_write_data_acc: Vec<Option<u64>>,
    pub xgmi_link_status: Vec<Option<u16>>,
    pub mem_max_bandwidth: Option<u64>,
    /// Device-level VCN/JPEG activity (v1.4, v1.5, first v1.6).
    pub vcn_activity: Vec<Option<u16>>,
    pub jpeg_activity: Vec<Option<u16>>,
    pub accumulation_counter: Option<u32>,
    pub prochot_residency_acc: Option<u32>,
    pub ppt_residency_acc: Option<u32>,
    pub socket_thm_residency_acc: Option<u32>,
    pub vr_thm_residency_acc: Option<u32>,
    pub hbm_thm_residency_acc: Option<u32>,
    pub average_gfxclk_frequency: Option<u16>,
    pub average_socclk_frequency: Option<u16>,
    pub average_uclk_frequency: Option<u16>,
    pub average_vclk0_frequency: Option<u16>,
    pub average_dclk0_frequency: Option<u16>,
    pub average_vclk1_frequency: Option<u16>,
    pub average_dclk1_frequency: Option<u16>,
    /// Per XCC on MI300 (8 entries), one entry on v1.3.
    pub current_gfxclk: Vec<Option<u16>>,
    pub current_socclk: Vec<Option<u16>>,
    pub current_vclk0: Vec<Option<u16>>,
    pub current_dclk0: Vec<Option<u16>>,
    pub current_vclk1: Option<u16>,
    pub current_dclk1: Option<u16>,
    pub current_uclk: Option<u16>,
    pub voltage_soc: Option<u16>,
    pub voltage_gfx: Option<u16>,
    pub voltage_mem: Option<u16>,
    pub num_partition: Option<u16>,
    /// Per partition (all `NUM_XCP` = 8 entries; those beyond the partition
    /// count hold nothing).
    pub xcp: Vec<XcpMetrics>,
}

/// Reads little-endian members in order, aligning each to its size as a C
/// compiler lays them out. Reading past the end yields `None`; the caller has
/// checked the size first, so that only happens on a bug, never a panic.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.at = self.at.div_ceil(N) * N;
        let out = self.bytes.get(self.at..self.at + N)?.try_into().ok()?;
        self.at += N;
        Some(out)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take()
            .map(u16::from_le_bytes)
            .filter(|v| *v != u16::MAX)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take()
            .map(u32::from_le_bytes)
            .filter(|v| *v != u32::MAX)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take()
            .map(u64::from_le_bytes)
            .filter(|v| *v != u64::MAX)
    }
    fn u16s(&mut self, n: usize) -> Vec<Option<u16>> {
        (0..n).map(|_| self.u16()).collect()
    }
    fn u32s(&mut self, n: usize) -> Vec<Option<u32>> {
        (0..n).map(|_| self.u32()).collect()
    }
    fn u64s(&mut self, n: usize) -> Vec<Option<u64>> {
        (0..n).map(|_| self.u64()).collect()
    }
    /// Skips a padding member of `N` bytes.
    fn pad<const N: usize>(&mut self) {
        let _ = self.take::<N>();
    }
    /// Aligns to `n`, as before a struct member whose widest member is `n`.
    fn align(&mut self, n: usize) {
        self.at = self.at.div_ceil(n) * n;
    }
}

/// `sizeof` of each layout, as the kernel writes in `structure_size`.
const V1_3_SIZE: usize = 120;
const V1_4_SIZE: usize = 288;
const V1_5_SIZE: usize = 360;
const V1_6_EARLY_SIZE: usize = 384;
const V1_6_SIZE: usize = 1664;
const V1_7_SIZE: usize = 2208;
const V1_8_SIZE: usize = 3872;

const NUM_XCP: usize = 8;
const MAX_XCC: usize = 8;

/// The sizes the kernel writes for a revision.
fn sizes(frev: u8, crev: u8) -> Option<&'static [usize]> {
    match (frev, crev) {
        (1, 3) => Some(&[V1_3_SIZE]),
        (1, 4) => Some(&[V1_4_SIZE]),
        (1, 5) => Some(&[V1_5_SIZE]),
        (1, 6) => Some(&[V1_6_EARLY_SIZE, V1_6_SIZE]),
        (1, 7) => Some(&[V1_7_SIZE]),
        (1, 8) => Some(&[V1_8_SIZE]),
        _ => None,
    }
}

/// Parses a `gpu_metrics` blob. Bytes after the size the header gives are
/// ignored (the kernel never writes any).
pub fn parse(bytes: &[u8]) -> Result<GpuMetrics, GpuMetricsError> {
    let header = bytes
        .get(..4)
        .ok_or(GpuMetricsError::NoHeader { len: bytes.len() })?;
    let claimed = usize::from(u16::from_le_bytes([header[0], header[1]]));
    let (frev, crev) = (header[2], header[3]);
    let expected = sizes(frev, crev).ok_or(GpuMetricsError::Unsupported { frev, crev })?;
    if !expected.contains(&claimed) {
        return Err(GpuMetricsError::Size {
            frev,
            crev,
            claimed,
            expected: expected.to_vec(),
        });
    }
    let body = bytes.get(..claimed).ok_or(GpuMetricsError::Truncated {
        frev,
        crev,
        claimed,
        len: bytes.len(),
    })?;
    let mut c = Cursor::new(body);
    // The header again, so that offsets count from the start.
    let _ = (c.u16(), c.u8(), c.u8());
    let mut g = GpuMetrics {
        format_revision: frev,
        content_revision: crev,
        ..GpuMetrics::default()
    };
    match (crev, claimed) {
        (3, _) => v1_3(&mut c, &mut g),
        (4, _) => v1_4_to_early_v1_6(&mut c, &mut g, 4),
        (5, _) => v1_4_to_early_v1_6(&mut c, &mut g, 5),
        (6, V1_6_EARLY_SIZE) => v1_4_to_early_v1_6(&mut c, &mut g, 6),
        _ => v1_6_to_v1_8(&mut c, &mut g, crev),
    }
    Ok(g)
}

fn v1_3(c: &mut Cursor<'_>, g: &mut GpuMetrics) {
    g.temperature_edge = c.u16();
    g.temperature_hotspot = c.u16();
    g.temperature_mem = c.u16();
    g.temperature_vrgfx = c.u16();
    g.temperature_vrsoc = c.u16();
    g.temperature_vrmem = c.u16();
    g.average_gfx_activity = c.u16();
    g.average_umc_activity = c.u16();
    g.average_mm_activity = c.u16();
    g.average_socket_power = c.u16();
    g.energy_accumulator = c.u64();
    g.system_clock_counter = c.u64();
    g.average_gfxclk_frequency = c.u16();
    g.average_socclk_frequency = c.u16();
    g.average_uclk_frequency = c.u16();
    g.average_vclk0_frequency = c.u16();
    g.average_dclk0_frequency = c.u16();
    g.average_vclk1_frequency = c.u16();
    g.average_dclk1_frequency = c.u16();
    g.current_gfxclk = vec![c.u16()];
    g.current_socclk = vec![c.u16()];
    g.current_uclk = c.u16();
    g.current_vclk0 = vec![c.u16()];
    g.current_dclk0 = vec![c.u16()];
    g.current_vclk1 = c.u16();
    g.current_dclk1 = c.u16();
    g.throttle_status = c.u32();
    g.current_fan_speed = c.u16();
    g.pcie_link_width = c.u16();
    g.pcie_link_speed = c.u16();
    c.pad::<2>();
    g.gfx_activity_acc = c.u32();
    g.mem_activity_acc = c.u32();
    g.temperature_hbm = c.u16s(4);
    g.firmware_timestamp = c.u64();
    g.voltage_soc = c.u16();
    g.voltage_gfx = c.u16();
    g.voltage_mem = c.u16();
    c.pad::<2>();
    g.indep_throttle_status = c.u64();
}

/// The members v1.4 to v1.8 open with: temperatures, power, activity.
fn mi300_head(c: &mut Cursor<'_>, g: &mut GpuMetrics) {
    g.temperature_hotspot = c.u16();
    g.temperature_mem = c.u16();
    g.temperature_vrsoc = c.u16();
    g.current_socket_power = c.u16();
    g.average_gfx_activity = c.u16();
    g.average_umc_activity = c.u16();
}

fn residencies(c: &mut Cursor<'_>, g: &mut GpuMetrics) {
    g.accumulation_counter = c.u32();
    g.prochot_residency_acc = c.u32();
    g.ppt_residency_acc = c.u32();
    g.socket_thm_residency_acc = c.u32();
    g.vr_thm_residency_acc = c.u32();
    g.hbm_thm_residency_acc = c.u32();
}

/// From `gfxclk_lock_status` to the PCIe replay rollover count, and the NAK
/// counters from v1.5 on.
fn links_and_pcie(c: &mut Cursor<'_>, g: &mut GpuMetrics, naks: bool) {
    g.gfxclk_lock_status = c.u32();
    g.pcie_link_width = c.u16();
    g.pcie_link_speed = c.u16();
    g.xgmi_link_width = c.u16();
    g.xgmi_link_speed = c.u16();
    g.gfx_activity_acc = c.u32();
    g.mem_activity_acc = c.u32();
    g.pcie_bandwidth_acc = c.u64();
    g.pcie_bandwidth_inst = c.u64();
    g.pcie_l0_to_recov_count_acc = c.u64();
    g.pcie_replay_count_acc = c.u64();
    g.pcie_replay_rover_count_acc = c.u64();
    if naks {
        g.pcie_nak_sent_count_acc = c.u32();
        g.pcie_nak_rcvd_count_acc = c.u32();
    }
    g.xgmi_read_data_acc = c.u64s(8);
    g.xgmi_write_data_acc = c.u64s(8);
}

fn mi300_clocks(c: &mut Cursor<'_>, g: &mut GpuMetrics) {
    g.firmware_timestamp = c.u64();
    g.current_gfxclk = c.u16s(8);
    g.current_socclk = c.u16s(4);
    g.current_vclk0 = c.u16s(4);
    g.current_dclk0 = c.u16s(4);
    g.current_uclk = c.u16();
}

/// v1.4, v1.5 and the first v1.6: device-level VCN (and JPEG) activity.
fn v1_4_to_early_v1_6(c: &mut Cursor<'_>, g: &mut GpuMetrics, crev: u8) {
    mi300_head(c, g);
    g.vcn_activity = c.u16s(4);
    if crev >= 5 {
        g.jpeg_activity = c.u16s(32);
    }
    g.energy_accumulator = c.u64();
    g.system_clock_counter = c.u64();
    if crev >= 6 {
        residencies(c, g);
    }
    g.throttle_status = c.u32();
    links_and_pcie(c, g, crev >= 5);
    mi300_clocks(c, g);
}

/// The later v1.6, v1.7 and v1.8: per-partition activity.
fn v1_6_to_v1_8(c: &mut Cursor<'_>, g: &mut GpuMetrics, crev: u8) {
    mi300_head(c, g);
    if crev >= 7 {
        g.mem_max_bandwidth = c.u64();
    }
    g.energy_accumulator = c.u64();
    g.system_clock_counter = c.u64();
    residencies(c, g);
    links_and_pcie(c, g, true);
    if crev >= 7 {
        g.xgmi_link_status = c.u16s(8);
        c.pad::<2>();
    }
    mi300_clocks(c, g);
    g.num_partition = c.u16();
    let jpeg = if crev >= 8 { 40 } else { 32 };
    g.xcp = (0..NUM_XCP)
        .map(|_| {
            c.align(8);
            let mut x = XcpMetrics {
                gfx_busy_inst: c.u32s(MAX_XCC),
                jpeg_busy: c.u16s(jpeg),
                vcn_busy: c.u16s(4),
                gfx_busy_acc: c.u64s(MAX_XCC),
                ..XcpMetrics::default()
            };
            match crev {
                7 => x.gfx_below_host_limit_acc = c.u64s(MAX_XCC),
                8 => {
                    x.gfx_below_host_limit_ppt_acc = c.u64s(MAX_XCC);
                    x.gfx_below_host_limit_thm_acc = c.u64s(MAX_XCC);
                    x.gfx_low_utilization_acc = c.u64s(MAX_XCC);
                    x.gfx_below_host_limit_total_acc = c.u64s(MAX_XCC);
                }
                _ => {}
            }
            x
        })
        .collect();
    g.pcie_lc_perf_other_end_recovery = c.u32();
}

impl GpuMetrics {
    /// Energy in microjoules (the accumulator counts 2^-16 J).
    pub fn energy_uj(&self) -> Option<f64> {
        self.energy_accumulator
            .map(|v| v as f64 * 1_000_000.0 / 65_536.0)
    }

    /// Socket power in watts: the current value where the version has one,
    /// else the average.
    pub fn socket_power_w(&self) -> Option<f64> {
        self.current_socket_power
            .or(self.average_socket_power)
            .map(f64::from)
    }
}
