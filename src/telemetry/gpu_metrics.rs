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

/// Throttler residencies as a percentage of the time between two tables:
/// how much each residency counter grew per accumulation cycle
/// (`accumulation_counter`) the firmware counted between them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ViolationPercentages {
    pub prochot: Option<f64>,
    pub ppt: Option<f64>,
    pub socket_thermal: Option<f64>,
    pub vr_thermal: Option<f64>,
    pub hbm_thermal: Option<f64>,
    /// Per partition, per XCC: the below-host-limit counters.
    pub xcp: Vec<XcpViolationPercentages>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct XcpViolationPercentages {
    pub below_host_limit_power: Vec<Option<f64>>,
    pub below_host_limit_thermal: Vec<Option<f64>>,
    pub low_utilization: Vec<Option<f64>>,
    pub below_host_limit_total: Vec<Option<f64>>,
}

/// The residency percentages from `before` to `now`; `None` when the tables
/// have no accumulation counter, it did not advance, or it went back (the
/// firmware restarted). A counter that is missing from either table or went
/// back has no percentage.
pub fn violation_percentages(
    before: &GpuMetrics,
    now: &GpuMetrics,
) -> Option<ViolationPercentages> {
    let cycles = now
        .accumulation_counter?
        .checked_sub(before.accumulation_counter?)
        .filter(|c| *c > 0)?;
    let pct = |b: Option<u64>, n: Option<u64>| -> Option<f64> {
        let grown = n?.checked_sub(b?)?;
        Some((grown as f64 * 100.0 / f64::from(cycles)).min(100.0))
    };
    let pct32 = |b: Option<u32>, n: Option<u32>| pct(b.map(u64::from), n.map(u64::from));
    let each = |b: &[Option<u64>], n: &[Option<u64>]| -> Vec<Option<f64>> {
        n.iter()
            .enumerate()
            .map(|(i, n)| pct(b.get(i).copied().flatten(), *n))
            .collect()
    };
    let xcp = now
        .xcp
        .iter()
        .enumerate()
        .map(|(p, n)| {
            let empty = XcpMetrics::default();
            let b = before.xcp.get(p).unwrap_or(&empty);
            let power = if n.gfx_below_host_limit_ppt_acc.is_empty() {
                each(&b.gfx_below_host_limit_acc, &n.gfx_below_host_limit_acc)
            } else {
                each(
                    &b.gfx_below_host_limit_ppt_acc,
                    &n.gfx_below_host_limit_ppt_acc,
                )
            };
            XcpViolationPercentages {
                below_host_limit_power: power,
                below_host_limit_thermal: each(
                    &b.gfx_below_host_limit_thm_acc,
                    &n.gfx_below_host_limit_thm_acc,
                ),
                low_utilization: each(&b.gfx_low_utilization_acc, &n.gfx_low_utilization_acc),
                below_host_limit_total: each(
                    &b.gfx_below_host_limit_total_acc,
                    &n.gfx_below_host_limit_total_acc,
                ),
            }
        })
        .collect();
    Some(ViolationPercentages {
        prochot: pct32(before.prochot_residency_acc, now.prochot_residency_acc),
        ppt: pct32(before.ppt_residency_acc, now.ppt_residency_acc),
        socket_thermal: pct32(
            before.socket_thm_residency_acc,
            now.socket_thm_residency_acc,
        ),
        vr_thermal: pct32(before.vr_thm_residency_acc, now.vr_thm_residency_acc),
        hbm_thermal: pct32(before.hbm_thm_residency_acc, now.hbm_thm_residency_acc),
        xcp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::gpu_metrics::{self as layout, CType, LAYOUTS, Member};

    /// A parsed member by its kernel name (`outer.inner` inside `xcp_stats`):
    /// `None` for a name the parser does not map (a test failure), else the
    /// value (itself `None` when not available).
    fn member(g: &GpuMetrics, name: &str, outer: usize, i: usize) -> Option<Option<u64>> {
        let one = |v: Option<u16>| Some(v.map(u64::from));
        let one32 = |v: Option<u32>| Some(v.map(u64::from));
        let at16 = |v: &Vec<Option<u16>>| v.get(i).map(|x| x.map(u64::from));
        let at32 = |v: &Vec<Option<u32>>| v.get(i).map(|x| x.map(u64::from));
        let at64 = |v: &Vec<Option<u64>>| v.get(i).copied();
        if let Some(inner) = name.strip_prefix("xcp_stats.") {
            let x = g.xcp.get(outer)?;
            return match inner {
                "gfx_busy_inst" => at32(&x.gfx_busy_inst),
                "jpeg_busy" => at16(&x.jpeg_busy),
                "vcn_busy" => at16(&x.vcn_busy),
                "gfx_busy_acc" => at64(&x.gfx_busy_acc),
                "gfx_below_host_limit_acc" => at64(&x.gfx_below_host_limit_acc),
                "gfx_below_host_limit_ppt_acc" => at64(&x.gfx_below_host_limit_ppt_acc),
                "gfx_below_host_limit_thm_acc" => at64(&x.gfx_below_host_limit_thm_acc),
                "gfx_low_utilization_acc" => at64(&x.gfx_low_utilization_acc),
                "gfx_below_host_limit_total_acc" => at64(&x.gfx_below_host_limit_total_acc),
                _ => None,
            };
        }
        match name {
            "temperature_edge" => one(g.temperature_edge),
            "temperature_hotspot" => one(g.temperature_hotspot),
            "temperature_mem" => one(g.temperature_mem),
            "temperature_vrgfx" => one(g.temperature_vrgfx),
            "temperature_vrsoc" => one(g.temperature_vrsoc),
            "temperature_vrmem" => one(g.temperature_vrmem),
            "temperature_hbm" => at16(&g.temperature_hbm),
            "average_gfx_activity" => one(g.average_gfx_activity),
            "average_umc_activity" => one(g.average_umc_activity),
            "average_mm_activity" => one(g.average_mm_activity),
            "average_socket_power" => one(g.average_socket_power),
            "curr_socket_power" => one(g.current_socket_power),
            "energy_accumulator" => Some(g.energy_accumulator),
            "system_clock_counter" => Some(g.system_clock_counter),
            "firmware_timestamp" => Some(g.firmware_timestamp),
            "throttle_status" => one32(g.throttle_status),
            "indep_throttle_status" => Some(g.indep_throttle_status),
            "gfxclk_lock_status" => one32(g.gfxclk_lock_status),
            "current_fan_speed" => one(g.current_fan_speed),
            "pcie_link_width" => one(g.pcie_link_width),
            "pcie_link_speed" => one(g.pcie_link_speed),
            "xgmi_link_width" => one(g.xgmi_link_width),
            "xgmi_link_speed" => one(g.xgmi_link_speed),
            "gfx_activity_acc" => one32(g.gfx_activity_acc),
            "mem_activity_acc" => one32(g.mem_activity_acc),
            "pcie_bandwidth_acc" => Some(g.pcie_bandwidth_acc),
            "pcie_bandwidth_inst" => Some(g.pcie_bandwidth_inst),
            "pcie_l0_to_recov_count_acc" => Some(g.pcie_l0_to_recov_count_acc),
            "pcie_replay_count_acc" => Some(g.pcie_replay_count_acc),
            "pcie_replay_rover_count_acc" => Some(g.pcie_replay_rover_count_acc),
            "pcie_nak_sent_count_acc" => one32(g.pcie_nak_sent_count_acc),
            "pcie_nak_rcvd_count_acc" => one32(g.pcie_nak_rcvd_count_acc),
            "pcie_lc_perf_other_end_recovery" => one32(g.pcie_lc_perf_other_end_recovery),
            "xgmi_read_data_acc" => at64(&g.xgmi_read_data_acc),
            "xgmi_write_data_acc" => at64(&g.xgmi_write_data_acc),
            "xgmi_link_status" => at16(&g.xgmi_link_status),
            "mem_max_bandwidth" => Some(g.mem_max_bandwidth),
            "vcn_activity" => at16(&g.vcn_activity),
            "jpeg_activity" => at16(&g.jpeg_activity),
            "accumulation_counter" => one32(g.accumulation_counter),
            "prochot_residency_acc" => one32(g.prochot_residency_acc),
            "ppt_residency_acc" => one32(g.ppt_residency_acc),
            "socket_thm_residency_acc" => one32(g.socket_thm_residency_acc),
            "vr_thm_residency_acc" => one32(g.vr_thm_residency_acc),
            "hbm_thm_residency_acc" => one32(g.hbm_thm_residency_acc),
            "average_gfxclk_frequency" => one(g.average_gfxclk_frequency),
            "average_socclk_frequency" => one(g.average_socclk_frequency),
            "average_uclk_frequency" => one(g.average_uclk_frequency),
            "average_vclk0_frequency" => one(g.average_vclk0_frequency),
            "average_dclk0_frequency" => one(g.average_dclk0_frequency),
            "average_vclk1_frequency" => one(g.average_vclk1_frequency),
            "average_dclk1_frequency" => one(g.average_dclk1_frequency),
            "current_gfxclk" => at16(&g.current_gfxclk),
            "current_socclk" => at16(&g.current_socclk),
            "current_vclk0" => at16(&g.current_vclk0),
            "current_dclk0" => at16(&g.current_dclk0),
            "current_vclk1" => one(g.current_vclk1),
            "current_dclk1" => one(g.current_dclk1),
            "current_uclk" => one(g.current_uclk),
            "voltage_soc" => one(g.voltage_soc),
            "voltage_gfx" => one(g.voltage_gfx),
            "voltage_mem" => one(g.voltage_mem),
            "num_partition" => one(g.num_partition),
            _ => None,
        }
    }

    /// A distinct value for every member and index, below every width's
    /// "not available" marker.
    fn value(name: &str, outer: usize, i: usize) -> u64 {
        let h = name
            .bytes()
            .fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        (h + outer as u64 * 1009 + i as u64 * 37) % 60_000 + 1
    }

    fn is_skipped(name: &str) -> bool {
        name.starts_with("padding")
            || ["structure_size", "format_revision", "content_revision"].contains(&name)
    }

    /// Every (name, outer, inner) a layout has, nested members included.
    fn slots(members: &[Member]) -> Vec<(String, usize, usize)> {
        let mut out = Vec::new();
        for m in members.iter().filter(|m| !is_skipped(m.name)) {
            match m.ty {
                CType::Struct(inner) => {
                    for outer in 0..m.count {
                        for f in inner {
                            for i in 0..f.count {
                                out.push((format!("{}.{}", m.name, f.name), outer, i));
                            }
                        }
                    }
                }
                _ => (0..m.count).for_each(|i| out.push((m.name.to_owned(), 0, i))),
            }
        }
        out
    }

    #[test]
    fn every_member_of_every_layout_round_trips() {
        for (frev, crev, members) in LAYOUTS {
            let blob = layout::encode(*frev, *crev, members, &|n, o, i| Some(value(n, o, i)));
            let g = parse(&blob).unwrap_or_else(|e| panic!("v{frev}.{crev}: {e}"));
            assert_eq!((g.format_revision, g.content_revision), (*frev, *crev));
            let slots = slots(members);
            assert!(slots.len() > 30, "v{frev}.{crev}");
            for (name, outer, i) in slots {
                assert_eq!(
                    member(&g, &name, outer, i),
                    Some(Some(value(&name, outer, i))),
                    "v{frev}.{crev} {name}[{outer}][{i}]"
                );
            }
        }
    }

    #[test]
    fn the_kernels_fill_reads_as_not_available() {
        for (frev, crev, members) in LAYOUTS {
            let blob = layout::encode(*frev, *crev, members, &|_, _, _| None);
            let g = parse(&blob).unwrap_or_else(|e| panic!("v{frev}.{crev}: {e}"));
            for (name, outer, i) in slots(members) {
                assert_eq!(
                    member(&g, &name, outer, i),
                    Some(None),
                    "v{frev}.{crev} {name}[{outer}][{i}]"
                );
            }
        }
    }

    #[test]
    fn the_two_v1_6_layouts_are_told_apart_by_size() {
        let early = layout::encode(1, 6, layout::V1_6_EARLY, &|n, o, i| Some(value(n, o, i)));
        let g = parse(&early).expect("early v1.6");
        assert_eq!(g.vcn_activity.len(), 4);
        assert!(g.xcp.is_empty());
        let later = layout::encode(1, 6, layout::V1_6, &|n, o, i| Some(value(n, o, i)));
        let g = parse(&later).expect("later v1.6");
        assert!(g.vcn_activity.is_empty());
        assert_eq!(g.xcp.len(), 8);
    }

    #[test]
    fn every_short_blob_is_an_error() {
        for (frev, crev, members) in LAYOUTS {
            let blob = layout::encode(*frev, *crev, members, &|n, o, i| Some(value(n, o, i)));
            for len in 0..blob.len() {
                let err = parse(&blob[..len]).expect_err("short blob");
                if len < 4 {
                    assert_eq!(err, GpuMetricsError::NoHeader { len });
                } else {
                    assert!(
                        matches!(err, GpuMetricsError::Truncated { .. }),
                        "v{frev}.{crev} len {len}: {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn trailing_bytes_are_ignored_and_a_wrong_size_is_refused() {
        let blob = layout::encode(1, 8, layout::V1_8, &|n, o, i| Some(value(n, o, i)));
        let mut longer = blob.clone();
        longer.extend_from_slice(&[0xAB; 100]);
        assert_eq!(parse(&longer), parse(&blob));
        // A size the kernel never writes for v1.8, with the bytes to back it.
        let mut wrong = longer.clone();
        wrong[..2].copy_from_slice(&((blob.len() + 8) as u16).to_le_bytes());
        assert!(matches!(
            parse(&wrong),
            Err(GpuMetricsError::Size { claimed, .. }) if claimed == blob.len() + 8
        ));
        // The v1.7 size under a v1.8 header.
        let mut mislabelled = layout::encode(1, 7, layout::V1_7, &|_, _, _| Some(1));
        mislabelled[3] = 8;
        assert!(matches!(
            parse(&mislabelled),
            Err(GpuMetricsError::Size { .. })
        ));
    }

    #[test]
    fn unknown_revisions_and_garbage_are_errors_never_panics() {
        for (frev, crev) in [(1, 2), (1, 9), (2, 3), (3, 0), (0, 0), (0xFF, 0xFF)] {
            let mut blob = vec![0u8; 4096];
            blob[..2].copy_from_slice(&120u16.to_le_bytes());
            blob[2] = frev;
            blob[3] = crev;
            assert_eq!(
                parse(&blob),
                Err(GpuMetricsError::Unsupported { frev, crev })
            );
        }
        // A fixed xorshift stream: every length up to 4 KiB, and headers that
        // name supported revisions with random sizes.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut parsed = 0;
        for round in 0..2000 {
            let len = (next() % 4200) as usize;
            let mut blob: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && len >= 4 {
                blob[2] = 1;
                blob[3] = 3 + (next() % 6) as u8;
            }
            if parse(&blob).is_ok() {
                parsed += 1;
            }
        }
        // Random sizes almost never match a layout's.
        assert!(parsed < 10, "{parsed}");
    }

    /// The simulator's tables, read back through the parser, say what its
    /// text attributes say at the same tick.
    #[test]
    fn simulated_tables_agree_with_the_text_attributes() {
        use crate::host::HostRoot;
        use crate::simulate::{self, SimSpec};
        for (profile, partition, crev) in [
            ("mi300x", None, 8),
            ("mi300x", Some("cpx_nps4"), 8),
            ("mi210", None, 3),
            ("radeon-w7900", None, 3),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let host = HostRoot::new(dir.path());
            let spec = SimSpec::new(profile, Some(2), partition)
                .or_else(|_| SimSpec::new(profile, Some(1), partition))
                .expect("spec");
            simulate::write_host(&host, &spec).expect("write");
            for tick in [1, 5] {
                simulate::advance_telemetry(&host, &spec, tick).expect("advance");
                let dev = host
                    .list_dir_or_empty("/sys/bus/pci/devices")
                    .expect("list")
                    .into_iter()
                    .next()
                    .expect("a GPU");
                let dev = format!("/sys/bus/pci/devices/{dev}");
                let blob = std::fs::read(host.path(format!("{dev}/gpu_metrics"))).expect("read");
                let g = parse(&blob).unwrap_or_else(|e| panic!("{profile}: {e}"));
                assert_eq!(g.content_revision, crev);
                let busy: u16 = host
                    .read_parsed(format!("{dev}/gpu_busy_percent"), "busy")
                    .expect("busy");
                assert_eq!(g.average_gfx_activity, Some(busy), "{profile} tick {tick}");
                let energy: f64 = host
                    .read_parsed(format!("{dev}/hwmon/hwmon0/energy1_input"), "energy")
                    .expect("energy");
                assert_eq!(g.energy_uj(), Some(energy), "{profile} tick {tick}");
                if crev == 8 {
                    let partitions = spec.partitions_of(0);
                    assert_eq!(g.num_partition, Some(partitions as u16));
                    let busy_xccs: usize = g
                        .xcp
                        .iter()
                        .map(|x| x.gfx_busy_inst.iter().flatten().count())
                        .sum();
                    assert_eq!(busy_xccs, 8, "{profile} {partition:?}: one value per XCC");
                    assert!(
                        g.xcp[partitions as usize..]
                            .iter()
                            .all(|x| x.gfx_busy_inst.iter().all(Option::is_none))
                    );
                }
            }
        }
    }

    #[test]
    fn violation_percentages_are_growth_per_accumulation_cycle() {
        let table = |cycles: u64, ppt: u64, below: u64| {
            let blob = layout::encode(1, 8, layout::V1_8, &|n, o, i| match n {
                "accumulation_counter" => Some(cycles),
                "ppt_residency_acc" => Some(ppt),
                "prochot_residency_acc" => Some(7),
                "xcp_stats.gfx_below_host_limit_ppt_acc" if o == 0 && i < 2 => Some(below),
                _ => None,
            });
            parse(&blob).expect("v1.8")
        };
        let v = violation_percentages(&table(100, 10, 0), &table(300, 60, 50)).expect("pct");
        assert_eq!(v.ppt, Some(25.0));
        assert_eq!(v.prochot, Some(0.0));
        assert_eq!(v.hbm_thermal, None, "not available in either table");
        assert_eq!(
            &v.xcp[0].below_host_limit_power[..3],
            &[Some(25.0), Some(25.0), None]
        );
        // No progress, a restart, or a counter that went back: no value.
        assert_eq!(
            violation_percentages(&table(100, 10, 0), &table(100, 20, 0)),
            None
        );
        assert_eq!(
            violation_percentages(&table(300, 10, 0), &table(100, 20, 0)),
            None
        );
        let back = violation_percentages(&table(100, 60, 0), &table(300, 10, 0)).expect("pct");
        assert_eq!(back.ppt, None);
        // Growth beyond the cycles (a firmware quirk) is capped at 100 %.
        let over = violation_percentages(&table(100, 0, 0), &table(101, 5, 0)).expect("pct");
        assert_eq!(over.ppt, Some(100.0));
    }

    #[test]
    fn units_for_callers() {
        let blob = layout::encode(1, 8, layout::V1_8, &|n, _, _| match n {
            "energy_accumulator" => Some(65_536),
            "curr_socket_power" => Some(350),
            _ => None,
        });
        let g = parse(&blob).expect("v1.8");
        assert_eq!(g.energy_uj(), Some(1_000_000.0));
        assert_eq!(g.socket_power_w(), Some(350.0));
    }
}
