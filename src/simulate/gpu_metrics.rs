//! The byte layout of the kernel's `gpu_metrics` sysfs file, as tables, and a
//! writer of blobs in it: what the simulator puts in each GPU's
//! `gpu_metrics`, and what the telemetry parser's tests parse.
//!
//! Each layout is the member list of one `struct gpu_metrics_v1_x` in the
//! kernel's `drivers/gpu/drm/amd/include/kgd_pp_interface.h`, transcribed in
//! declaration order as (name, C type, array length); offsets and the size
//! come from the C rules the kernel is built with (every member at a multiple
//! of its own size, the struct padded to a multiple of its widest member),
//! not from a second transcription. Sources read:
//! - `ROCm/amdgpu` at 0ce779bf9fdad70e015c5a503f1e45e966fe5c42 (AMD's kernel
//!   tree; defines v1.0 to v1.9): v1.3, v1.4, v1.5, v1.6 (with `xcp_stats`),
//!   v1.7, v1.8, and the constants `MAX_XCC = 8`, `NUM_XCP = 8`,
//!   `NUM_VCN = 4`, `NUM_JPEG_ENG = 32`, `NUM_JPEG_ENG_V1 = 40`,
//!   `NUM_XGMI_LINKS = 8`, `MAX_GFX_CLKS = 8`, `MAX_CLKS = 4`,
//!   `NUM_HBM_INSTANCES = 4`;
//! - `torvalds/linux` at 00dedab07b52ca16107e82ce5ca7caaaedf6a417: the first
//!   v1.6 (per-device VCN/JPEG activity and throttle status, no partitions),
//!   which later kernels replaced in place under the same revision;
//! - the amd-gfx patches "drm/amd/pm: Add gpu_metrics_v1_7" (Nov 2024) and
//!   "Add gpu_metrics_v1_8" (below host limit counters), which agree with
//!   `ROCm/amdgpu`.
//!
//! The kernel first fills the whole table with 0xFF ("not available") and then
//! sets what the firmware reports; [`encode`] does the same. The table is
//! native-endian; every host the exporter runs on is little-endian.
//!
//! Data and pure functions only: no I/O, and nothing here may parse a blob
//! (the parser lives in `telemetry::gpu_metrics` and must stay independent of
//! these tables, so that each checks the other).

/// A C member type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CType {
    U8,
    U16,
    U32,
    U64,
    /// A nested struct (the per-partition `amdgpu_xcp_metrics*`).
    Struct(&'static [Member]),
}

/// One member: `ty name[count]` (count 1 for a scalar).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: &'static str,
    pub ty: CType,
    pub count: usize,
}

const fn m(name: &'static str, ty: CType, count: usize) -> Member {
    Member { name, ty, count }
}

use CType::{Struct, U8, U16, U32, U64};

const HEADER: [Member; 3] = [
    m("structure_size", U16, 1),
    m("format_revision", U8, 1),
    m("content_revision", U8, 1),
];

/// `struct amdgpu_xcp_metrics` (v1.6).
pub const XCP_V1_0: &[Member] = &[
    m("gfx_busy_inst", U32, 8),
    m("jpeg_busy", U16, 32),
    m("vcn_busy", U16, 4),
    m("gfx_busy_acc", U64, 8),
];

/// `struct amdgpu_xcp_metrics_v1_1` (v1.7).
pub const XCP_V1_1: &[Member] = &[
    m("gfx_busy_inst", U32, 8),
    m("jpeg_busy", U16, 32),
    m("vcn_busy", U16, 4),
    m("gfx_busy_acc", U64, 8),
    m("gfx_below_host_limit_acc", U64, 8),
];

/// `struct amdgpu_xcp_metrics_v1_2` (v1.8).
pub const XCP_V1_2: &[Member] = &[
    m("gfx_busy_inst", U32, 8),
    m("jpeg_busy", U16, 40),
    m("vcn_busy", U16, 4),
    m("gfx_busy_acc", U64, 8),
    m("gfx_below_host_limit_ppt_acc", U64, 8),
    m("gfx_below_host_limit_thm_acc", U64, 8),
    m("gfx_low_utilization_acc", U64, 8),
    m("gfx_below_host_limit_total_acc", U64, 8),
];

/// `struct gpu_metrics_v1_3` (aldebaran, sienna cichlid, SMU 13.0.0/7 Navi3x,
/// and the first MI300 kernels).
pub const V1_3: &[Member] = &[
    HEADER[0],
    HEADER[1],
    HEADER[2],
    m("temperature_edge", U16, 1),
    m("temperature_hotspot", U16, 1),
    m("temperature_mem", U16, 1),
    m("temperature_vrgfx", U16, 1),
    m("temperature_vrsoc", U16, 1),
    m("temperature_vrmem", U16, 1),
    m("average_gfx_activity", U16, 1),
    m("average_umc_activity", U16, 1),
    m("average_mm_activity", U16, 1),
    m("average_socket_power", U16, 1),
    m("energy_accumulator", U64, 1),
    m("system_clock_counter", U64, 1),
    m("average_gfxclk_frequency", U16, 1),
    m("average_socclk_frequency", U16, 1),
    m("average_uclk_frequency", U16, 1),
    m("average_vclk0_frequency", U16, 1),
    m("average_dclk0_frequency", U16, 1),
    m("average_vclk1_frequency", U16, 1),
    m("average_dclk1_frequency", U16, 1),
    m("current_gfxclk", U16, 1),
    m("current_socclk", U16, 1),
    m("current_uclk", U16, 1),
    m("current_vclk0", U16, 1),
    m("current_dclk0", U16, 1),
    m("current_vclk1", U16, 1),
    m("current_dclk1", U16, 1),
    m("throttle_status", U32, 1),
    m("current_fan_speed", U16, 1),
    m("pcie_link_width", U16, 1),
    m("pcie_link_speed", U16, 1),
    m("padding", U16, 1),
    m("gfx_activity_acc", U32, 1),
    m("mem_activity_acc", U32, 1),
    m("temperature_hbm", U16, 4),
    m("firmware_timestamp", U64, 1),
    m("voltage_soc", U16, 1),
    m("voltage_gfx", U16, 1),
    m("voltage_mem", U16, 1),
    m("padding1", U16, 1),
    m("indep_throttle_status", U64, 1),
];

/// v1.4 to v1.8 open with these: header, temperatures, power, activity.
const MI300_HEAD: &[Member] = &[
    HEADER[0],
    HEADER[1],
    HEADER[2],
    m("temperature_hotspot", U16, 1),
    m("temperature_mem", U16, 1),
    m("temperature_vrsoc", U16, 1),
    m("curr_socket_power", U16, 1),
    m("average_gfx_activity", U16, 1),
    m("average_umc_activity", U16, 1),
];

const ENERGY: &[Member] = &[
    m("energy_accumulator", U64, 1),
    m("system_clock_counter", U64, 1),
];

/// v1.6 and later: the accumulated throttler residencies.
const RESIDENCIES: &[Member] = &[
    m("accumulation_counter", U32, 1),
    m("prochot_residency_acc", U32, 1),
    m("ppt_residency_acc", U32, 1),
    m("socket_thm_residency_acc", U32, 1),
    m("vr_thm_residency_acc", U32, 1),
    m("hbm_thm_residency_acc", U32, 1),
];

/// From the clock lock status to the PCIe replay rollover count.
const LINKS: &[Member] = &[
    m("gfxclk_lock_status", U32, 1),
    m("pcie_link_width", U16, 1),
    m("pcie_link_speed", U16, 1),
    m("xgmi_link_width", U16, 1),
    m("xgmi_link_speed", U16, 1),
    m("gfx_activity_acc", U32, 1),
    m("mem_activity_acc", U32, 1),
    m("pcie_bandwidth_acc", U64, 1),
    m("pcie_bandwidth_inst", U64, 1),
    m("pcie_l0_to_recov_count_acc", U64, 1),
    m("pcie_replay_count_acc", U64, 1),
    m("pcie_replay_rover_count_acc", U64, 1),
];

/// v1.5 and later.
const NAKS: &[Member] = &[
    m("pcie_nak_sent_count_acc", U32, 1),
    m("pcie_nak_rcvd_count_acc", U32, 1),
];

const XGMI_DATA: &[Member] = &[
    m("xgmi_read_data_acc", U64, 8),
    m("xgmi_write_data_acc", U64, 8),
];

/// From the firmware timestamp to the memory clock.
const CLOCKS: &[Member] = &[
    m("firmware_timestamp", U64, 1),
    m("current_gfxclk", U16, 8),
    m("current_socclk", U16, 4),
    m("current_vclk0", U16, 4),
    m("current_dclk0", U16, 4),
    m("current_uclk", U16, 1),
];

const VCN: &[Member] = &[m("vcn_activity", U16, 4)];
const JPEG: &[Member] = &[m("jpeg_activity", U16, 32)];
const THROTTLE: &[Member] = &[m("throttle_status", U32, 1)];
const PADDING: &[Member] = &[m("padding", U16, 1)];

/// `struct gpu_metrics_v1_4` (MI300, smu_v13_0_6).
pub const V1_4: &[Member] = &join::<34>(&[
    MI300_HEAD, VCN, ENERGY, THROTTLE, LINKS, XGMI_DATA, CLOCKS, PADDING,
]);

/// `struct gpu_metrics_v1_5`: v1.4 with JPEG activity and NAK counters.
pub const V1_5: &[Member] = &join::<37>(&[
    MI300_HEAD, VCN, JPEG, ENERGY, THROTTLE, LINKS, NAKS, XGMI_DATA, CLOCKS, PADDING,
]);

/// The first `struct gpu_metrics_v1_6` (torvalds/linux 00dedab): v1.5 with
/// the accumulated throttler residencies after the clock counter.
pub const V1_6_EARLY: &[Member] = &join::<43>(&[
    MI300_HEAD,
    VCN,
    JPEG,
    ENERGY,
    RESIDENCIES,
    THROTTLE,
    LINKS,
    NAKS,
    XGMI_DATA,
    CLOCKS,
    PADDING,
]);

/// The `struct gpu_metrics_v1_6` of later kernels: per-partition activity
/// (`xcp_stats`) instead of per-device VCN/JPEG activity and throttle status.
pub const V1_6: &[Member] = &join::<42>(&[
    MI300_HEAD,
    ENERGY,
    RESIDENCIES,
    LINKS,
    NAKS,
    XGMI_DATA,
    CLOCKS,
    &[
        m("num_partition", U16, 1),
        m("xcp_stats", Struct(XCP_V1_0), 8),
        m("pcie_lc_perf_other_end_recovery", U32, 1),
    ],
]);

/// v1.7 and v1.8 up to `num_partition`: the later v1.6 with the VRAM
/// bandwidth and the XGMI link status.
const V1_7_PREFIX: &[Member] = &join::<43>(&[
    MI300_HEAD,
    &[m("mem_max_bandwidth", U64, 1)],
    ENERGY,
    RESIDENCIES,
    LINKS,
    NAKS,
    XGMI_DATA,
    &[m("xgmi_link_status", U16, 8)],
    PADDING,
    CLOCKS,
    &[m("num_partition", U16, 1)],
]);

/// `struct gpu_metrics_v1_7`.
pub const V1_7: &[Member] = &join::<45>(&[
    V1_7_PREFIX,
    &[
        m("xcp_stats", Struct(XCP_V1_1), 8),
        m("pcie_lc_perf_other_end_recovery", U32, 1),
    ],
]);

/// `struct gpu_metrics_v1_8`: v1.7 with the v1.2 per-partition counters.
pub const V1_8: &[Member] = &join::<45>(&[
    V1_7_PREFIX,
    &[
        m("xcp_stats", Struct(XCP_V1_2), 8),
        m("pcie_lc_perf_other_end_recovery", U32, 1),
    ],
]);

/// The members of `parts`, in order; `N` must be their number (a wrong one
/// fails to compile).
const fn join<const N: usize>(parts: &[&[Member]]) -> [Member; N] {
    let mut out = [m("", U8, 0); N];
    let mut at = 0;
    let mut p = 0;
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            out[at] = parts[p][i];
            at += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(at == N, "join: N is not the number of members");
    out
}
/// Every layout: (format revision, content revision, members). v1.6 appears
/// twice; its `structure_size` tells the two apart.
pub const LAYOUTS: &[(u8, u8, &[Member])] = &[
    (1, 3, V1_3),
    (1, 4, V1_4),
    (1, 5, V1_5),
    (1, 6, V1_6_EARLY),
    (1, 6, V1_6),
    (1, 7, V1_7),
    (1, 8, V1_8),
];

fn align_of(ty: CType) -> usize {
    match ty {
        U8 => 1,
        U16 => 2,
        U32 => 4,
        U64 => 8,
        Struct(members) => members.iter().map(|m| align_of(m.ty)).max().unwrap_or(1),
    }
}

fn size_of(ty: CType) -> usize {
    match ty {
        U8 => 1,
        U16 => 2,
        U32 => 4,
        U64 => 8,
        Struct(members) => layout(members).1,
    }
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Each member's offset, and the struct's size, by the C layout rules.
pub fn layout(members: &[Member]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(members.len());
    let mut at = 0;
    for member in members {
        at = round_up(at, align_of(member.ty));
        offsets.push(at);
        at += size_of(member.ty) * member.count;
    }
    let align = members.iter().map(|m| align_of(m.ty)).max().unwrap_or(1);
    (offsets, round_up(at, align))
}

/// The size of a layout in bytes (`sizeof(struct gpu_metrics_v1_x)`).
pub fn size(members: &[Member]) -> usize {
    layout(members).1
}

/// The value to store at `name[index]`, where a member of a nested struct is
/// named `outer.inner` and `index` is `(outer index, inner index)`; `None`
/// leaves the kernel's "not available" fill.
pub type Values<'a> = dyn Fn(&str, usize, usize) -> Option<u64> + 'a;

/// A blob of `members` as the kernel writes it: 0xFF everywhere, the header
/// (size and revisions) set, then every value `values` gives, little-endian.
pub fn encode(frev: u8, crev: u8, members: &[Member], values: &Values<'_>) -> Vec<u8> {
    let (offsets, total) = layout(members);
    let mut out = vec![0xFF; total];
    let header = |name: &str| match name {
        "structure_size" => Some(total as u64),
        "format_revision" => Some(u64::from(frev)),
        "content_revision" => Some(u64::from(crev)),
        _ => None,
    };
    for (member, offset) in members.iter().zip(offsets) {
        match member.ty {
            Struct(inner) => {
                let (inner_offsets, inner_size) = layout(inner);
                for outer in 0..member.count {
                    let base = offset + outer * inner_size;
                    for (field, at) in inner.iter().zip(&inner_offsets) {
                        let name = format!("{}.{}", member.name, field.name);
                        for i in 0..field.count {
                            if let Some(v) = values(&name, outer, i) {
                                put(&mut out, base + at + i * size_of(field.ty), field.ty, v);
                            }
                        }
                    }
                }
            }
            ty => {
                for i in 0..member.count {
                    let value = header(member.name).or_else(|| values(member.name, 0, i));
                    if let Some(v) = value {
                        put(&mut out, offset + i * size_of(ty), ty, v);
                    }
                }
            }
        }
    }
    out
}

/// Stores `value`, truncated to the member's width, little-endian.
fn put(out: &mut [u8], at: usize, ty: CType, value: u64) {
    let bytes = value.to_le_bytes();
    let width = size_of(ty);
    if let Some(slot) = out.get_mut(at..at + width) {
        slot.copy_from_slice(&bytes[..width]);
    }
}

/// The layout the kernel uses for a revision (the later v1.6 for 1.6).
pub fn members_of(frev: u8, crev: u8) -> Option<&'static [Member]> {
    LAYOUTS
        .iter()
        .rev()
        .find(|(f, c, _)| (*f, *c) == (frev, crev))
        .map(|(_, _, members)| *members)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes worked out by hand from the header, member by member; the
    /// computed layout must agree, so that a member left out or mistyped in a
    /// table shows here.
    #[test]
    fn sizes_match_the_hand_counted_structs() {
        assert_eq!(size(XCP_V1_0), 168);
        assert_eq!(size(XCP_V1_1), 232);
        assert_eq!(size(XCP_V1_2), 440);
        assert_eq!(size(V1_3), 120);
        assert_eq!(size(V1_4), 288);
        assert_eq!(size(V1_5), 360);
        assert_eq!(size(V1_6_EARLY), 384);
        assert_eq!(size(V1_6), 312 + 8 * 168 + 8);
        assert_eq!(size(V1_7), 344 + 8 * 232 + 8);
        assert_eq!(size(V1_8), 344 + 8 * 440 + 8);
        // Every size fits the header's u16.
        for (_, _, members) in LAYOUTS {
            assert!(size(members) <= usize::from(u16::MAX));
        }
    }

    #[test]
    fn offsets_of_landmarks() {
        let at = |members: &[Member], name: &str| {
            let (offsets, _) = layout(members);
            members
                .iter()
                .position(|m| m.name == name)
                .map(|i| offsets[i])
        };
        assert_eq!(at(V1_3, "energy_accumulator"), Some(24));
        assert_eq!(at(V1_3, "temperature_hbm"), Some(88));
        assert_eq!(at(V1_5, "energy_accumulator"), Some(88));
        assert_eq!(at(V1_6, "xcp_stats"), Some(312));
        assert_eq!(at(V1_7, "firmware_timestamp"), Some(288));
        assert_eq!(at(V1_8, "num_partition"), Some(338));
        assert_eq!(at(V1_8, "xcp_stats"), Some(344));
    }

    #[test]
    fn encode_fills_header_values_and_not_available() {
        let blob = encode(1, 8, V1_8, &|name, outer, i| match name {
            "curr_socket_power" => Some(412),
            "xcp_stats.gfx_busy_inst" if outer == 1 && i == 2 => Some(77),
            _ => None,
        });
        assert_eq!(blob.len(), size(V1_8));
        assert_eq!(u16::from_le_bytes([blob[0], blob[1]]) as usize, blob.len());
        assert_eq!((blob[2], blob[3]), (1, 8));
        assert_eq!(u16::from_le_bytes([blob[10], blob[11]]), 412);
        // xcp_stats[1].gfx_busy_inst[2]
        let at = 344 + 440 + 2 * 4;
        assert_eq!(
            u32::from_le_bytes([blob[at], blob[at + 1], blob[at + 2], blob[at + 3]]),
            77
        );
        assert_eq!(&blob[4..10], &[0xFF; 6]);
    }
}
