//! One GPU's read plan and what its answers mean: which files a sample reads
//! ([`plan_reads`], by [`Field`]), and the pure turning of the raw answers
//! into [`GpuReadings`] ([`assemble`]).
//!
//! This file owns the files and their parsing. It must not read anything
//! itself nor keep state between samples (the [`super::Sampler`] does).

use std::collections::BTreeMap;

use super::{GpuReadings, Scope};
use crate::device::Gpu;
use crate::host::reader::ReadError;
use crate::telemetry::gpu_metrics;
use crate::telemetry::sysfs::{
    self, Dpm, Sensor, device_dir, driver_link, parse_dpm, parse_link_speed, parse_link_width,
    parse_millidegrees, parse_ras_count, parse_u64,
};

/// One value to read for a GPU.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    Present,
    Bound,
    /// A device node (`/dev/dri/renderD128`) that must exist.
    Node(String),
    GfxBusy,
    MemBusy,
    VramTotal,
    VramUsed,
    VisVramTotal,
    VisVramUsed,
    GttTotal,
    GttUsed,
    Sclk,
    Mclk,
    /// A DPM clock table read for its range only (the SoC and video clocks).
    Dpm(Dpm),
    LinkSpeed,
    LinkWidth,
    MaxLinkSpeed,
    MaxLinkWidth,
    ReplayCount,
    Ras(String),
    Temp(Sensor),
    JunctionCrit,
    PowerCurrent,
    PowerAverage,
    Energy,
    /// The binary `gpu_metrics` table.
    GpuMetrics,
}

impl Field {
    pub(super) fn is_existence(&self) -> bool {
        matches!(self, Field::Present | Field::Bound | Field::Node(_))
    }

    /// Values that do not change while the GPU is bound.
    pub(super) fn is_static(&self) -> bool {
        matches!(
            self,
            Field::MaxLinkSpeed | Field::MaxLinkWidth | Field::JunctionCrit | Field::Dpm(_)
        )
    }
}

/// The raw answer for one field.
#[derive(Debug)]
pub enum Raw {
    Exists(bool),
    Text(String),
    Bytes(Vec<u8>),
    Failed(ReadError),
}

/// Where a GPU's hwmon sensors and RAS counters live. Found once per GPU (the
/// directory names are stable while the driver is bound; a GPU that leaves the
/// inventory and comes back is located afresh) and looked for again while a GPU
/// has no hwmon directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuFiles {
    pub hwmon: Option<String>,
    /// Sensor → `temp*_input` path.
    pub temps: BTreeMap<Sensor, String>,
    pub junction_crit: Option<String>,
    /// RAS block names with an `<block>_err_count` file.
    pub ras_blocks: Vec<String>,
    /// The `ras` directory could be listed (it may legitimately be empty).
    pub ras_listed: bool,
}

impl GpuFiles {
    /// Found what matters; looked for again otherwise. RAS counters are optional
    /// (consumer GPUs have none): an empty listing is an answer, a listing that
    /// timed out is not.
    pub(super) fn complete(&self) -> bool {
        self.hwmon.is_some() && self.ras_listed
    }
}

/// The files to read for one GPU, as (field, host path).
pub fn plan_reads(gpu: &Gpu, files: &GpuFiles, scope: Scope) -> Vec<(Field, String)> {
    let dev = device_dir(&gpu.bdf);
    let attr = |name: &str| format!("{dev}/{name}");
    let mut reads = vec![
        (Field::Present, dev.clone()),
        (Field::Bound, driver_link(&gpu.bdf)),
    ];
    if scope != Scope::HealthWithoutNodes {
        for node in device_nodes(gpu) {
            reads.push((Field::Node(node.clone()), node));
        }
    }
    reads.extend([
        (Field::LinkSpeed, attr("current_link_speed")),
        (Field::LinkWidth, attr("current_link_width")),
        (Field::MaxLinkSpeed, attr("max_link_speed")),
        (Field::MaxLinkWidth, attr("max_link_width")),
    ]);
    for block in &files.ras_blocks {
        reads.push((
            Field::Ras(block.clone()),
            attr(&format!("ras/{block}_err_count")),
        ));
    }
    if let Some(path) = files.temps.get(&Sensor::Junction) {
        reads.push((Field::Temp(Sensor::Junction), path.clone()));
    }
    if let Some(path) = &files.junction_crit {
        reads.push((Field::JunctionCrit, path.clone()));
    }
    if scope != Scope::Full {
        return reads;
    }
    reads.extend([
        (Field::GfxBusy, attr("gpu_busy_percent")),
        (Field::MemBusy, attr("mem_busy_percent")),
        (Field::VramTotal, attr("mem_info_vram_total")),
        (Field::VramUsed, attr("mem_info_vram_used")),
        (Field::VisVramTotal, attr("mem_info_vis_vram_total")),
        (Field::VisVramUsed, attr("mem_info_vis_vram_used")),
        (Field::GttTotal, attr("mem_info_gtt_total")),
        (Field::GttUsed, attr("mem_info_gtt_used")),
        (Field::Sclk, attr("pp_dpm_sclk")),
        (Field::Mclk, attr("pp_dpm_mclk")),
        (Field::ReplayCount, attr("pcie_replay_count")),
        (Field::GpuMetrics, attr("gpu_metrics")),
    ]);
    for dpm in RANGE_ONLY_CLOCKS {
        reads.push((Field::Dpm(dpm), attr(dpm.file())));
    }
    for sensor in [Sensor::Edge, Sensor::Memory] {
        if let Some(path) = files.temps.get(&sensor) {
            reads.push((Field::Temp(sensor), path.clone()));
        }
    }
    if let Some(hwmon) = &files.hwmon {
        reads.extend([
            (Field::PowerCurrent, format!("{hwmon}/power1_input")),
            (Field::PowerAverage, format!("{hwmon}/power1_average")),
            (Field::Energy, format!("{hwmon}/energy1_input")),
        ]);
    }
    reads
}

/// DPM clock tables read only for their lowest and highest levels, which do
/// not change while the GPU is bound (the GFX and memory clocks' tables are
/// read every sample for their current level).
pub(super) const RANGE_ONLY_CLOCKS: [Dpm; 5] =
    [Dpm::Socclk, Dpm::Vclk, Dpm::Vclk1, Dpm::Dclk, Dpm::Dclk1];

/// DRM nodes a GPU's containers get: the GPU's own and every partition's.
pub fn device_nodes(gpu: &Gpu) -> Vec<String> {
    let mut nodes = Vec::new();
    let mut push = |card: Option<u32>, render: Option<u32>| {
        if let Some(card) = card {
            nodes.push(format!("/dev/dri/card{card}"));
        }
        if let Some(minor) = render {
            nodes.push(format!("/dev/dri/renderD{minor}"));
        }
    };
    push(gpu.card, gpu.render_minor);
    for p in &gpu.partitions {
        push(p.card, p.render_minor);
    }
    nodes.sort();
    nodes.dedup();
    nodes
}

/// Turns the raw answers for one GPU into readings. Pure.
pub fn assemble(bdf: &str, answers: Vec<(&Field, &str, Raw)>) -> GpuReadings {
    let mut r = GpuReadings {
        bdf: bdf.to_owned(),
        ..GpuReadings::default()
    };
    for (field, path, raw) in answers {
        let text = match raw {
            Raw::Exists(exists) => {
                match field {
                    Field::Present => r.present = Some(exists),
                    Field::Bound => r.bound = Some(exists),
                    Field::Node(node) if !exists => r.missing_nodes.push(node.clone()),
                    _ => {}
                }
                continue;
            }
            Raw::Failed(e) if e.is_not_found() => continue,
            Raw::Failed(e) => {
                r.errors.push(e.to_string());
                continue;
            }
            Raw::Bytes(bytes) => {
                match gpu_metrics::parse(&bytes) {
                    Ok(table) => r.gpu_metrics = Some(table),
                    Err(e) => r.errors.push(format!("{path}: {e}")),
                }
                continue;
            }
            Raw::Text(text) => text,
        };
        if let Err(e) = apply(&mut r, field, &text) {
            r.errors.push(format!("{path}: {e}"));
        }
    }
    r
}

fn apply(r: &mut GpuReadings, field: &Field, text: &str) -> Result<(), sysfs::ParseError> {
    let num = |what| parse_u64(text, what);
    let pct = |what| parse_u64(text, what).map(|v| v as f64);
    match field {
        Field::Present | Field::Bound | Field::Node(_) | Field::GpuMetrics => {}
        Field::GfxBusy => r.gfx_activity_pct = Some(pct("a busy percentage")?),
        Field::MemBusy => r.umc_activity_pct = Some(pct("a busy percentage")?),
        Field::VramTotal => r.memory.vram_total = Some(num("a size in bytes")?),
        Field::VramUsed => r.memory.vram_used = Some(num("a size in bytes")?),
        Field::VisVramTotal => r.memory.vis_vram_total = Some(num("a size in bytes")?),
        Field::VisVramUsed => r.memory.vis_vram_used = Some(num("a size in bytes")?),
        Field::GttTotal => r.memory.gtt_total = Some(num("a size in bytes")?),
        Field::GttUsed => r.memory.gtt_used = Some(num("a size in bytes")?),
        Field::Sclk | Field::Mclk | Field::Dpm(_) => {
            let levels = parse_dpm(text)?;
            let dpm = match field {
                Field::Sclk => {
                    r.sclk_mhz = levels.current_mhz();
                    Dpm::Sclk
                }
                Field::Mclk => {
                    r.mclk_mhz = levels.current_mhz();
                    Dpm::Mclk
                }
                Field::Dpm(dpm) => *dpm,
                _ => return Ok(()),
            };
            if let Some(range) = levels.range() {
                r.clock_ranges.insert(dpm, range);
            }
        }
        Field::LinkSpeed => r.pcie.speed_gts = parse_link_speed(text)?,
        Field::MaxLinkSpeed => r.pcie.max_speed_gts = parse_link_speed(text)?,
        Field::LinkWidth => r.pcie.width = parse_link_width(text)?,
        Field::MaxLinkWidth => r.pcie.max_width = parse_link_width(text)?,
        Field::ReplayCount => r.pcie.replay_count = Some(num("a replay count")?),
        Field::Ras(block) => {
            r.ecc.insert(block.clone(), parse_ras_count(text)?);
        }
        Field::Temp(sensor) => {
            let value = Some(parse_millidegrees(text)?);
            match sensor {
                Sensor::Edge => r.temperature.edge_c = value,
                Sensor::Junction => r.temperature.junction_c = value,
                Sensor::Memory => r.temperature.memory_c = value,
            }
        }
        Field::JunctionCrit => r.temperature.junction_crit_c = Some(parse_millidegrees(text)?),
        Field::PowerCurrent => {
            r.power.current_w = Some(sysfs::microwatts_to_watts(num("microwatts")?))
        }
        Field::PowerAverage => {
            r.power.average_w = Some(sysfs::microwatts_to_watts(num("microwatts")?))
        }
        Field::Energy => r.power.energy_uj = Some(num("microjoules")?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::sample::tests::gpu;
    use crate::telemetry::sysfs::EccCount;
    use std::time::Duration;

    #[test]
    fn device_nodes_cover_partitions_once() {
        assert_eq!(
            device_nodes(&gpu()),
            [
                "/dev/dri/card0",
                "/dev/dri/card1",
                "/dev/dri/renderD128",
                "/dev/dri/renderD129"
            ]
        );
    }

    #[test]
    fn health_scope_reads_a_subset() {
        let files = GpuFiles {
            hwmon: Some("/h".into()),
            temps: BTreeMap::from([
                (Sensor::Edge, "/h/temp1_input".into()),
                (Sensor::Junction, "/h/temp2_input".into()),
            ]),
            junction_crit: Some("/h/temp2_crit".into()),
            ras_blocks: vec!["umc".into()],
            ras_listed: true,
        };
        let health = plan_reads(&gpu(), &files, Scope::Health);
        let full = plan_reads(&gpu(), &files, Scope::Full);
        let has = |reads: &[(Field, String)], f: &Field| reads.iter().any(|(x, _)| x == f);
        for f in [
            Field::Present,
            Field::Bound,
            Field::Ras("umc".into()),
            Field::Temp(Sensor::Junction),
            Field::JunctionCrit,
            Field::MaxLinkWidth,
        ] {
            assert!(has(&health, &f), "{f:?}");
            assert!(has(&full, &f), "{f:?}");
        }
        for f in [Field::Sclk, Field::Temp(Sensor::Edge), Field::Energy] {
            assert!(!has(&health, &f), "{f:?}");
            assert!(has(&full, &f), "{f:?}");
        }
        assert!(full.len() > health.len());
    }

    #[test]
    fn assemble_parses_and_reports_what_failed() {
        let answers: Vec<(Field, &str, Raw)> = vec![
            (Field::Present, "/p", Raw::Exists(true)),
            (Field::Bound, "/b", Raw::Exists(false)),
            (
                Field::Node("/dev/dri/renderD129".into()),
                "/dev/dri/renderD129",
                Raw::Exists(false),
            ),
            (
                Field::Temp(Sensor::Junction),
                "/t",
                Raw::Text("71500".into()),
            ),
            (
                Field::Sclk,
                "/s",
                Raw::Text("0: 500Mhz\n1: 2100Mhz *".into()),
            ),
            (
                Field::Ras("umc".into()),
                "/r",
                Raw::Text("ue: 1\nce: 4".into()),
            ),
            (
                Field::Ras("gfx".into()),
                "/g",
                Raw::Text("ue: 2\nce: 0".into()),
            ),
            (Field::LinkSpeed, "/l", Raw::Text("garbage".into())),
            (
                Field::PowerCurrent,
                "/pw",
                Raw::Failed(ReadError::TimedOut {
                    path: "/pw".into(),
                    timeout: Duration::from_millis(5),
                }),
            ),
            (
                Field::Energy,
                "/e",
                Raw::Failed(ReadError::Host(crate::host::HostError::Io {
                    path: "/e".into(),
                    source: std::io::ErrorKind::NotFound.into(),
                })),
            ),
            (Field::PowerAverage, "/pa", Raw::Text("140000000".into())),
        ];
        let (fields, reads): (Vec<Field>, Vec<(&str, Raw)>) = answers
            .into_iter()
            .map(|(field, path, raw)| (field, (path, raw)))
            .unzip();
        let answers = fields.iter().zip(reads).map(|(f, (p, r))| (f, p, r));
        let r = assemble("0000:05:00.0", answers.collect());
        assert_eq!(r.present, Some(true));
        assert_eq!(r.bound, Some(false));
        assert_eq!(r.missing_nodes, ["/dev/dri/renderD129"]);
        assert_eq!(r.temperature.junction_c, Some(71.5));
        assert_eq!(r.sclk_mhz, Some(2100.0));
        assert_eq!(
            r.ecc_totals(),
            Some(EccCount {
                ue: 3,
                ce: 4,
                de: None
            })
        );
        assert_eq!(r.pcie.speed_gts, None);
        assert_eq!(r.power.current_w, None);
        assert_eq!(r.power.average_w, Some(140.0));
        // The parse failure and the timeout are reported; the absent file is not.
        assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
        assert!(r.errors.iter().any(|e| e.starts_with("/l:")));
        assert!(r.errors.iter().any(|e| e.contains("/pw")));
    }
}
