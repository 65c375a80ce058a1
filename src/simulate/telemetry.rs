//! The simulated GPUs' telemetry: the attributes metrics and health read
//! (PCIe, memory, clocks, hwmon, the `gpu_metrics` table), written with the
//! tree at tick 0 and moved with time by [`advance_telemetry`], all following
//! one load wave per GPU.
//!
//! This file owns those values and how they move. It must not lay out the
//! tree (the module's `mod.rs` does) nor inject faults (`faults.rs`).

use super::faults::{deferred_line, is_fifo, ras_counts};
use super::{
    GpuLayout, GpuModel, Layout, STAGING_DIR, SimError, SimSpec, Writer, gpu_metrics, pci_dir,
    write_staged,
};
use crate::host::{HostError, HostRoot};

/// The attributes that metrics and health read. Values that change over time
/// come from [`dynamic_telemetry`] at tick 0.
pub(super) fn write_telemetry(
    w: &mut Writer<'_>,
    spec: &SimSpec,
    gpu: &GpuLayout,
    dir: &str,
) -> Result<(), HostError> {
    let model = &spec.profile.model;
    let vram = model.vram_bytes;
    w.attrs(
        dir,
        &[
            ("mem_info_vram_total", vram.to_string()),
            ("mem_info_vis_vram_total", vram.to_string()),
            ("mem_info_gtt_total", (512u64 << 30).to_string()),
            ("current_link_speed", model.max_link_speed.into()),
            ("current_link_width", model.max_link_width.to_string()),
            ("max_link_speed", model.max_link_speed.into()),
            ("max_link_width", model.max_link_width.to_string()),
            ("pcie_replay_count", "0".into()),
        ],
    )?;
    for block in model.ras_blocks {
        w.file(
            format!("{dir}/ras/{block}_err_count"),
            ras_counts(0, 0, deferred_line(block)),
        )?;
    }
    let clocks = &model.clocks;
    let tables = [
        ("pp_dpm_mclk", Some(clocks.mclk)),
        ("pp_dpm_socclk", Some(clocks.socclk)),
        ("pp_dpm_fclk", Some(clocks.fclk)),
        ("pp_dpm_vclk", Some(clocks.vclk)),
        ("pp_dpm_dclk", Some(clocks.dclk)),
        ("pp_dpm_vclk1", clocks.vclk1),
        ("pp_dpm_dclk1", clocks.dclk1),
    ];
    for (file, table) in tables {
        if let Some(table) = table {
            let text = dpm_text(table.levels_mhz, table.current);
            w.file(format!("{dir}/{file}"), format!("{text}\n"))?;
        }
    }
    // The hwmon class device, linked from /sys/class/hwmon as the kernel does;
    // its attributes are amdgpu's (millidegrees, microwatts, hertz).
    let hwmon_name = format!("hwmon{}", gpu.index);
    let hwmon = format!("{dir}/hwmon/{hwmon_name}");
    let mut attrs: Vec<(String, String)> = vec![("name".into(), "amdgpu".into())];
    for (sensor, label, crit, hyst, emergency) in [
        ("temp1", "edge", 100_000, 95_000, 105_000),
        ("temp2", "junction", 105_000, 100_000, 110_000),
        ("temp3", "mem", 95_000, 90_000, 105_000),
    ] {
        attrs.extend([
            (format!("{sensor}_label"), label.to_owned()),
            (format!("{sensor}_crit"), crit.to_string()),
            (format!("{sensor}_crit_hyst"), hyst.to_string()),
            (format!("{sensor}_emergency"), emergency.to_string()),
        ]);
    }
    attrs.extend([
        ("power1_label".into(), "PPT".into()),
        ("power1_cap".into(), POWER_CAP_UW.to_string()),
        ("power1_cap_max".into(), POWER_CAP_UW.to_string()),
        ("freq1_label".into(), "sclk".into()),
    ]);
    for (name, value) in attrs {
        w.file(format!("{hwmon}/{name}"), format!("{value}\n"))?;
    }
    // A class device without a dev_t has an empty uevent.
    w.file(format!("{hwmon}/uevent"), "")?;
    w.link(dir, &format!("{hwmon}/device"))?;
    w.link(&hwmon, &format!("/sys/class/hwmon/{hwmon_name}"))?;
    for (path, value) in dynamic_telemetry(model, gpu.index, 0) {
        w.file(format!("{dir}/{path}"), format!("{value}\n"))?;
    }
    let partitions = gpu.nodes.len() as u32;
    if let Some(blob) = gpu_metrics_blob(model, gpu.index, partitions, 0) {
        w.file(format!("{dir}/gpu_metrics"), blob)?;
    }
    Ok(())
}

/// The simulated power cap (microwatts), above the highest simulated draw.
const POWER_CAP_UW: u64 = 750_000_000;

/// A `pp_dpm_*` file's text: `N: <MHz>Mhz`, one level a line, the current
/// one marked `*`.
fn dpm_text(levels_mhz: &[u64], current: usize) -> String {
    levels_mhz
        .iter()
        .enumerate()
        .map(|(i, mhz)| format!("{i}: {mhz}Mhz{}", if i == current { " *" } else { "" }))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The load wave every moving value follows: 0 to 1, per GPU and tick.
fn load(index: usize, tick: u64) -> f64 {
    let phase = tick as f64 * 0.35 + index as f64 * 0.9;
    (phase.sin() + 1.0) / 2.0
}

fn edge_millidegrees(load: f64) -> u64 {
    35_000 + (load * 30_000.0) as u64
}

/// `power1_average`; `power1_input` is a watt above it.
fn power_microwatts(load: f64) -> u64 {
    140_000_000 + (load * 550_000_000.0) as u64
}

fn sclk_level(load: f64) -> usize {
    ((load * 2.99) as usize).min(2)
}

/// Joules per tick that `energy1_input` grows by.
const JOULES_PER_TICK: u64 = 150;

/// The `gpu_metrics` table of GPU `index` at `tick`, in the revision the
/// model's SMU writes, with the values the text attributes show at that tick
/// (activity, temperatures, power, energy, clocks); accumulators only grow.
/// `None` for models without the file.
pub(super) fn gpu_metrics_blob(
    model: &GpuModel,
    index: usize,
    partitions: u32,
    tick: u64,
) -> Option<Vec<u8>> {
    let (frev, crev) = model.gpu_metrics?;
    let members = gpu_metrics::members_of(frev, crev)?;
    let load = load(index, tick);
    let edge = edge_millidegrees(load) / 1000;
    let watts = power_microwatts(load) / 1_000_000;
    let clocks = &model.clocks;
    let sclk = clocks.sclk_mhz[sclk_level(load)];
    let (uclk, socclk) = (clocks.mclk.current_mhz(), clocks.socclk.current_mhz());
    let (vclk, dclk) = (clocks.vclk.current_mhz(), clocks.dclk.current_mhz());
    let vclk1 = clocks.vclk1.map_or(vclk, |t| t.current_mhz());
    let dclk1 = clocks.dclk1.map_or(dclk, |t| t.current_mhz());
    let busy = (load * 100.0).round() as u64;
    let instinct = model.gfx_target_version < 100000;
    // Link speed in 0.1 GT/s, from "32.0 GT/s PCIe".
    let link_speed = model
        .max_link_speed
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .map(|gts| (gts * 10.0).round() as u64);
    let partitions = u64::from(partitions.max(1));
    let xccs_per_partition = (8 / partitions).max(1);
    let values = move |name: &str, outer: usize, i: usize| -> Option<u64> {
        let i64_ = i as u64;
        let owned = (outer as u64) < partitions;
        Some(match name {
            "temperature_edge" => edge,
            "temperature_hotspot" => edge + 5,
            "temperature_mem" => edge + 3,
            "temperature_vrgfx" | "temperature_vrsoc" | "temperature_vrmem" => edge + 1,
            "temperature_hbm" if instinct => edge + 3 + i64_,
            "average_gfx_activity" => busy,
            "average_umc_activity" => (load * 60.0).round() as u64,
            "average_mm_activity" => (load * 10.0).round() as u64,
            "average_socket_power" => watts,
            "curr_socket_power" => watts + 1,
            "energy_accumulator" => tick * JOULES_PER_TICK * 65_536,
            "system_clock_counter" => tick * 1_000_000_000 + 1,
            "firmware_timestamp" => tick * 100_000_000 + 1,
            "average_gfxclk_frequency" | "current_gfxclk" => sclk,
            "average_socclk_frequency" | "current_socclk" => socclk,
            "average_uclk_frequency" | "current_uclk" => uclk,
            "average_vclk0_frequency" | "current_vclk0" => vclk,
            "average_vclk1_frequency" | "current_vclk1" => vclk1,
            "average_dclk0_frequency" | "current_dclk0" => dclk,
            "average_dclk1_frequency" | "current_dclk1" => dclk1,
            "throttle_status" | "indep_throttle_status" | "gfxclk_lock_status" => 0,
            // Instinct parts are passively cooled: no fan.
            "current_fan_speed" if !instinct => 1500 + (load * 1000.0) as u64,
            "pcie_link_width" => u64::from(model.max_link_width),
            "pcie_link_speed" => link_speed?,
            "xgmi_link_width" if instinct => 16,
            "xgmi_link_speed" if instinct => 32,
            "gfx_activity_acc" => tick * 50,
            "mem_activity_acc" => tick * 30,
            // Navi SMUs report the rails' voltages; aldebaran and MI300
            // leave them unset.
            "voltage_soc" if !instinct => 900,
            "voltage_gfx" if !instinct => 800 + (load * 200.0) as u64,
            "voltage_mem" if !instinct => 1200,
            "mem_max_bandwidth" => 5300,
            "accumulation_counter" => tick * 100 + 1,
            "prochot_residency_acc" | "vr_thm_residency_acc" | "hbm_thm_residency_acc" => 0,
            "ppt_residency_acc" => tick * 3,
            "socket_thm_residency_acc" => tick,
            "pcie_bandwidth_acc" => tick * 12,
            "pcie_bandwidth_inst" => (load * 20.0).round() as u64,
            "pcie_l0_to_recov_count_acc" => tick / 50,
            "pcie_replay_count_acc" | "pcie_replay_rover_count_acc" => 0,
            "pcie_nak_sent_count_acc" | "pcie_nak_rcvd_count_acc" => 0,
            "pcie_lc_perf_other_end_recovery" => 0,
            "xgmi_read_data_acc" | "xgmi_write_data_acc" => tick * 1_000_000 * (i64_ + 1),
            // Seven peers in an eight-GPU hive.
            "xgmi_link_status" => u64::from(i < 7),
            "num_partition" => partitions,
            "xcp_stats.gfx_busy_inst" if owned && i64_ < xccs_per_partition => {
                busy.saturating_sub(i64_)
            }
            "xcp_stats.gfx_busy_acc" if owned && i64_ < xccs_per_partition => tick * 50,
            "xcp_stats.gfx_below_host_limit_acc" | "xcp_stats.gfx_below_host_limit_ppt_acc"
                if owned && i64_ < xccs_per_partition =>
            {
                tick * 2
            }
            "xcp_stats.gfx_below_host_limit_thm_acc" if owned && i64_ < xccs_per_partition => tick,
            "xcp_stats.gfx_low_utilization_acc" if owned && i64_ < xccs_per_partition => tick * 5,
            "xcp_stats.gfx_below_host_limit_total_acc" if owned && i64_ < xccs_per_partition => {
                tick * 3
            }
            "xcp_stats.jpeg_busy" if owned && i64_ < (32 / partitions).max(1) => {
                (load * 10.0).round() as u64
            }
            "xcp_stats.vcn_busy" if owned && i64_ < (4 / partitions).max(1) => {
                (load * 10.0).round() as u64
            }
            "vcn_activity" | "jpeg_activity" => (load * 10.0).round() as u64,
            _ => return None,
        })
    };
    Some(gpu_metrics::encode(frev, crev, members, &values))
}

/// Telemetry that moves with time, as (path relative to the PCI device, value):
/// a slow load wave per GPU drives activity, memory, temperatures, power and the
/// current clock level; energy only grows.
fn dynamic_telemetry(model: &GpuModel, index: usize, tick: u64) -> Vec<(String, String)> {
    let load = load(index, tick);
    let vram = model.vram_bytes as f64;
    let vram_used = (vram * (0.01 + 0.5 * load)) as u64;
    let edge = edge_millidegrees(load);
    let power = power_microwatts(load);
    let level = sclk_level(load);
    let sclk_levels = model.clocks.sclk_mhz;
    let sclk_mhz = sclk_levels[level];
    let sclk = dpm_text(&sclk_levels, level);
    let hwmon = format!("hwmon/hwmon{index}");
    vec![
        (
            "gpu_busy_percent".into(),
            ((load * 100.0).round() as u64).to_string(),
        ),
        (
            "mem_busy_percent".into(),
            ((load * 60.0).round() as u64).to_string(),
        ),
        ("mem_info_vram_used".into(), vram_used.to_string()),
        ("mem_info_vis_vram_used".into(), vram_used.to_string()),
        (
            "mem_info_gtt_used".into(),
            ((16u64 << 20) + (load * (1u64 << 30) as f64) as u64).to_string(),
        ),
        ("pp_dpm_sclk".into(), sclk),
        (
            format!("{hwmon}/freq1_input"),
            (sclk_mhz * 1_000_000).to_string(),
        ),
        (format!("{hwmon}/temp1_input"), edge.to_string()),
        (format!("{hwmon}/temp2_input"), (edge + 5_000).to_string()),
        (format!("{hwmon}/temp3_input"), (edge + 3_000).to_string()),
        (format!("{hwmon}/power1_average"), power.to_string()),
        (
            format!("{hwmon}/power1_input"),
            (power + 1_000_000).to_string(),
        ),
        // Microjoules: about 150 J per tick.
        (
            format!("{hwmon}/energy1_input"),
            (tick * JOULES_PER_TICK * 1_000_000).to_string(),
        ),
    ]
}

/// Moves every simulated GPU's telemetry to `tick` (the standalone demo calls this
/// every sampling interval so that metrics change over time). GPUs that a test
/// removed are skipped.
pub fn advance_telemetry(host: &HostRoot, spec: &SimSpec, tick: u64) -> Result<(), SimError> {
    let staging = host.path(STAGING_DIR);
    std::fs::create_dir_all(&staging).map_err(|source| HostError::Io {
        path: staging.clone(),
        source,
    })?;
    for gpu in &Layout::new(spec).gpus {
        let dir = pci_dir(&gpu.bdf);
        if !host.exists(&dir) {
            continue;
        }
        for (path, value) in dynamic_telemetry(&spec.profile.model, gpu.index, tick) {
            let path = host.path(format!("{dir}/{path}"));
            // A file a test turned into a FIFO (a hung attribute) stays hung.
            if is_fifo(&path) {
                continue;
            }
            write_staged(&staging, &path, format!("{value}\n").as_bytes())?;
        }
        let partitions = gpu.nodes.len() as u32;
        let path = host.path(format!("{dir}/gpu_metrics"));
        if let Some(blob) = gpu_metrics_blob(&spec.profile.model, gpu.index, partitions, tick)
            && !is_fifo(&path)
        {
            write_staged(&staging, &path, &blob)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::write_host;

    #[test]
    fn telemetry_moves_with_time_and_energy_only_grows() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = SimSpec::new("mi210", Some(1), None).unwrap();
        write_host(&host, &spec).unwrap();
        let read = |name: &str| -> u64 {
            host.read_parsed(
                format!("/sys/devices/pci0000:00/0000:03:00.0/{name}"),
                "a number",
            )
            .unwrap()
        };
        let mut temps = std::collections::BTreeSet::new();
        let mut energy = 0;
        for tick in 1..8 {
            advance_telemetry(&host, &spec, tick).unwrap();
            temps.insert(read("hwmon/hwmon0/temp1_input"));
            let now = read("hwmon/hwmon0/energy1_input");
            assert!(now > energy);
            energy = now;
            assert!(read("gpu_busy_percent") <= 100);
        }
        assert!(temps.len() > 3, "temperature should change: {temps:?}");
        let sclk = host
            .read_string("/sys/devices/pci0000:00/0000:03:00.0/pp_dpm_sclk")
            .unwrap();
        assert_eq!(sclk.matches('*').count(), 1, "{sclk}");
    }

    #[test]
    fn gpu_metrics_blobs_have_the_profiles_revision_and_move() {
        for (profile, revision) in [
            ("mi300x", Some((1, 8))),
            ("mi250x", Some((1, 3))),
            ("mi210", Some((1, 3))),
            ("radeon-w7900", Some((1, 3))),
            ("mi300x-vf", None),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let host = HostRoot::new(dir.path());
            let spec = SimSpec::new(profile, Some(1), None).unwrap();
            write_host(&host, &spec).unwrap();
            let bdf = &Layout::new(&spec).gpus[0].bdf;
            let path = host.path(format!("{}/gpu_metrics", pci_dir(bdf)));
            let Some((frev, crev)) = revision else {
                assert!(!path.exists(), "{profile}");
                continue;
            };
            let first = std::fs::read(&path).unwrap();
            let members = gpu_metrics::members_of(frev, crev).unwrap();
            assert_eq!(first.len(), gpu_metrics::size(members), "{profile}");
            assert_eq!(
                usize::from(u16::from_le_bytes([first[0], first[1]])),
                first.len()
            );
            assert_eq!((first[2], first[3]), (frev, crev), "{profile}");
            advance_telemetry(&host, &spec, 3).unwrap();
            let later = std::fs::read(&path).unwrap();
            assert_eq!(later.len(), first.len());
            assert_ne!(later, first, "{profile}: the table should move");
        }
    }
}
