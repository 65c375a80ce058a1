//! Taking a sample: which files to read for each GPU, reading them all at once
//! through the [`BoundedReader`], and turning the answers into [`GpuReadings`].
//!
//! The I/O part ([`Sampler::sample`]) only gathers raw answers; [`assemble`],
//! which parses them, is pure. A value that cannot be read (absent, hung, timed
//! out, unparsable) is `None` and, unless the file is simply absent, noted in
//! `errors`; it never fails the sample. The health monitor samples a subset
//! ([`Scope::Health`]) often; the exporter samples everything ([`Scope::Full`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use super::gpu_metrics::{self, GpuMetrics, ViolationPercentages};
use super::sysfs::{self, ClockRange, Dpm, EccCount, Sensor, device_dir, parse_temp_label};
use crate::device::{Gpu, Inventory};
use crate::host::reader::{Answer, BoundedReader, Op, ReadError, Requests};

mod kfd;
mod plan;
pub use kfd::processes_by_node;
use kfd::{KfdProcesses, kfd_processes};
use plan::RANGE_ONLY_CLOCKS;
pub use plan::{Field, GpuFiles, Raw, assemble, device_nodes, plan_reads};

/// Which files a sample reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// What the health checks need: presence, device nodes, RAS counts, junction
    /// temperature, PCIe link.
    Health,
    /// [`Scope::Health`] without the device nodes and `/dev/kfd`, for a caller
    /// that checks those on its own schedule (the health monitor watches
    /// `/dev`): `missing_nodes` stays empty and `kfd_present` `None`.
    HealthWithoutNodes,
    /// Everything the exporter reports.
    Full,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Temperatures {
    pub edge_c: Option<f64>,
    pub junction_c: Option<f64>,
    pub memory_c: Option<f64>,
    /// The junction sensor's critical limit (`temp*_crit`), when the driver gives one.
    pub junction_crit_c: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Power {
    /// `power1_input`: current socket power.
    pub current_w: Option<f64>,
    /// `power1_average`.
    pub average_w: Option<f64>,
    /// `energy1_input`, microjoules.
    pub energy_uj: Option<u64>,
}

/// Memory sizes in bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Memory {
    pub vram_total: Option<u64>,
    pub vram_used: Option<u64>,
    pub vis_vram_total: Option<u64>,
    pub vis_vram_used: Option<u64>,
    pub gtt_total: Option<u64>,
    pub gtt_used: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Pcie {
    pub speed_gts: Option<f64>,
    pub max_speed_gts: Option<f64>,
    pub width: Option<u32>,
    pub max_width: Option<u32>,
    pub replay_count: Option<u64>,
}

/// What one sample found out about one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuReadings {
    pub bdf: String,
    /// The PCI function exists.
    pub present: Option<bool>,
    /// The PCI function is bound to amdgpu.
    pub bound: Option<bool>,
    /// Device nodes of the GPU and its partitions that do not exist (host paths).
    pub missing_nodes: Vec<String>,
    pub temperature: Temperatures,
    pub power: Power,
    /// `gpu_busy_percent`.
    pub gfx_activity_pct: Option<f64>,
    /// `mem_busy_percent`.
    pub umc_activity_pct: Option<f64>,
    pub memory: Memory,
    /// Current `pp_dpm_sclk` level, MHz.
    pub sclk_mhz: Option<f64>,
    /// Current `pp_dpm_mclk` level, MHz.
    pub mclk_mhz: Option<f64>,
    /// The lowest and highest level of each `pp_dpm_*` clock table.
    pub clock_ranges: BTreeMap<Dpm, ClockRange>,
    pub pcie: Pcie,
    /// RAS blocks (sysfs names: `umc`, `pcie_bif`, ...) whose counts could be read.
    pub ecc: BTreeMap<String, EccCount>,
    /// The firmware's metrics table (`gpu_metrics`), where the GPU has one.
    pub gpu_metrics: Option<GpuMetrics>,
    /// Throttler residencies since the previous sample's table.
    pub violations: Option<ViolationPercentages>,
    /// Values that could not be read or parsed, one line each, naming the file.
    pub errors: Vec<String>,
}

impl GpuReadings {
    pub fn ecc_totals(&self) -> Option<EccCount> {
        (!self.ecc.is_empty()).then(|| EccCount {
            ue: self.ecc.values().map(|c| c.ue).sum(),
            ce: self.ecc.values().map(|c| c.ce).sum(),
            // Only blocks that report deferred errors add up; none: no total.
            de: self.ecc.values().filter_map(|c| c.de).reduce(|a, b| a + b),
        })
    }
}

/// One sample of the whole host.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostSample {
    #[serde(with = "unix_seconds")]
    pub taken_at: SystemTime,
    /// How long reading took.
    pub duration_ms: f64,
    /// `/dev/kfd` exists.
    pub kfd_present: Option<bool>,
    /// By PCI address.
    pub gpus: BTreeMap<String, GpuReadings>,
    /// KFD topology node → the processes with queues on it, ascending; read
    /// only when the sampler is asked to ([`Sampler::set_processes`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kfd_processes: BTreeMap<u32, Vec<u32>>,
    /// KFD topology node → pid → the compute units that process's waves
    /// occupy on it now (`stats_<gpu_id>/cu_occupancy`), for the processes
    /// of [`Self::kfd_processes`] whose kernel has the file.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kfd_cu_occupancy: BTreeMap<u32, BTreeMap<u32, u32>>,
}

impl Default for HostSample {
    fn default() -> Self {
        Self {
            taken_at: SystemTime::UNIX_EPOCH,
            duration_ms: 0.0,
            kfd_present: None,
            gpus: BTreeMap::new(),
            kfd_processes: BTreeMap::new(),
            kfd_cu_occupancy: BTreeMap::new(),
        }
    }
}

mod unix_seconds {
    use std::time::SystemTime;

    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        s.serialize_f64(secs)
    }
}

/// Reads samples for an inventory, remembering where each GPU's files are.
#[derive(Debug)]
pub struct Sampler {
    reader: BoundedReader,
    /// Deadline for each file.
    timeout: Duration,
    files: HashMap<String, GpuFiles>,
    statics: HashMap<String, Statics>,
    /// Each GPU's last `gpu_metrics` table that moved, and the residency
    /// percentages it gave (kept while the firmware has not updated it).
    tables: HashMap<String, (GpuMetrics, Option<ViolationPercentages>)>,
    /// Whether a [`Scope::Full`] sample lists the KFD processes.
    processes: bool,
    /// The last sample's reads, reused while nothing they depend on changed.
    plan: Option<BatchPlan>,
    /// Counts changes to `files`, so that a plan can tell it is still current
    /// without comparing them.
    files_changed: u64,
}

/// One sample's reads, planned from the inventory and the files found.
/// Kept between samples while neither changed: planning formats a few hundred
/// paths, which the health monitor's four samples a second should not redo.
#[derive(Debug)]
struct BatchPlan {
    scope: Scope,
    /// What it was planned from: each GPU's address and DRM minors (all of a
    /// GPU that [`plan_reads`] uses), and the files' change count.
    gpus: Vec<(String, Vec<Option<u32>>)>,
    files_changed: u64,
    /// Which GPUs' static values were cached (and so not read).
    with_statics: Vec<bool>,
    /// The reads as handed to the reader each sample: first one per
    /// [`Self::owners`] entry (GPU index and field), then a listing of each
    /// of [`Self::dirs`], then `/dev/kfd` for scopes that check it.
    requests: Requests,
    owners: Vec<(usize, Field)>,
    /// GPUs to stat for presence if they turn out not to be bound.
    presence: Vec<(usize, String)>,
    /// Existence looked up in a listing of the parent directory ([`Self::dirs`]).
    listed: Vec<(usize, Field, String)>,
    dirs: Vec<String>,
}

impl BatchPlan {
    fn new(
        inventory: &Inventory,
        files: &HashMap<String, GpuFiles>,
        files_changed: u64,
        with_statics: Vec<bool>,
        scope: Scope,
    ) -> Self {
        let mut plan = BatchPlan {
            scope,
            gpus: inventory
                .gpus
                .iter()
                .map(|g| (g.bdf.clone(), drm_minors(g).collect()))
                .collect(),
            files_changed,
            with_statics,
            requests: Requests::default(),
            owners: Vec::new(),
            presence: Vec::new(),
            listed: Vec::new(),
            dirs: Vec::new(),
        };
        let no_files = GpuFiles::default();
        let mut requests: Vec<(Op, String)> = Vec::new();
        for (index, gpu) in inventory.gpus.iter().enumerate() {
            let statics = plan.with_statics.get(index).copied().unwrap_or(false);
            let files = files.get(&gpu.bdf).unwrap_or(&no_files);
            for (field, path) in plan_reads(gpu, files, scope) {
                if statics && field.is_static() {
                    continue;
                }
                // A GPU bound to amdgpu is present (its driver link resolves
                // to its device directory); only the others are stat'ed for
                // presence, after.
                if field == Field::Present {
                    plan.presence.push((index, path));
                    continue;
                }
                // Device nodes and driver links are looked up in a listing of
                // their directory: one read of `/dev/dri` instead of a `stat`
                // for each of a partitioned host's hundred-odd nodes, one of
                // the driver's directory instead of resolving each GPU's link.
                if matches!(field, Field::Node(_) | Field::Bound) {
                    let dir = parent_dir(&path).to_owned();
                    if !plan.dirs.contains(&dir) {
                        plan.dirs.push(dir);
                    }
                    plan.listed.push((index, field, path));
                    continue;
                }
                let op = if field.is_existence() {
                    Op::Exists
                } else if field == Field::GpuMetrics {
                    Op::Bytes
                } else {
                    Op::Read
                };
                requests.push((op, path));
                plan.owners.push((index, field));
            }
        }
        requests.extend(plan.dirs.iter().map(|d| (Op::List, d.clone())));
        if scope != Scope::HealthWithoutNodes {
            requests.push((Op::Exists, sysfs::KFD_PATH.to_owned()));
        }
        plan.requests = requests.into();
        plan
    }

    /// Planned from these inputs.
    fn is_for(
        &self,
        inventory: &Inventory,
        files_changed: u64,
        with_statics: &[bool],
        scope: Scope,
    ) -> bool {
        self.scope == scope
            && self.files_changed == files_changed
            && self.with_statics == with_statics
            && self.gpus.len() == inventory.gpus.len()
            && self
                .gpus
                .iter()
                .zip(&inventory.gpus)
                .all(|((bdf, minors), g)| *bdf == g.bdf && drm_minors(g).eq(minors.iter().copied()))
    }
}

/// A GPU's DRM minors and its partitions', in order: what its device nodes
/// are named after.
pub fn drm_minors(gpu: &Gpu) -> impl Iterator<Item = Option<u32>> + '_ {
    let partitions = gpu.partitions.iter().flat_map(|p| [p.card, p.render_minor]);
    [gpu.card, gpu.render_minor].into_iter().chain(partitions)
}

/// How long the static values of a GPU are kept before they are read again.
pub const STATICS_TTL: Duration = Duration::from_secs(60);

impl Sampler {
    pub fn new(reader: BoundedReader, timeout: Duration) -> Self {
        Self {
            reader,
            timeout,
            files: HashMap::new(),
            statics: HashMap::new(),
            tables: HashMap::new(),
            processes: false,
            plan: None,
            files_changed: 0,
        }
    }

    /// Whether full samples also find which processes use each GPU (a few
    /// reads per process; the exporter asks only for `KFD_PROCESS_ID`).
    pub fn set_processes(&mut self, on: bool) {
        self.processes = on;
    }

    pub fn reader(&self) -> &BoundedReader {
        &self.reader
    }

    /// Reads every GPU of `inventory` at once: one batch of reads through
    /// the reader. Static values (the PCIe maximums, the junction sensor's
    /// critical limit) are read once per GPU and again every [`STATICS_TTL`].
    pub async fn sample(&mut self, inventory: &Inventory, scope: Scope) -> HostSample {
        let started = Instant::now();
        let taken_at = SystemTime::now();
        let in_inventory = |bdf: &String| inventory.gpus.iter().any(|g| &g.bdf == bdf);
        let files_before = self.files.len();
        self.files.retain(|bdf, _| in_inventory(bdf));
        if self.files.len() != files_before {
            self.files_changed += 1;
        }
        self.statics.retain(|bdf, _| in_inventory(bdf));
        self.tables.retain(|bdf, _| in_inventory(bdf));
        let missing: Vec<&Gpu> = inventory
            .gpus
            .iter()
            .filter(|g| !self.files.get(&g.bdf).is_some_and(GpuFiles::complete))
            .collect();
        let located = futures::future::join_all(
            missing
                .iter()
                .map(|g| locate(&self.reader, &g.bdf, self.timeout)),
        )
        .await;
        for (gpu, files) in missing.iter().zip(located) {
            if self.files.get(&gpu.bdf) != Some(&files) {
                self.files.insert(gpu.bdf.clone(), files);
                self.files_changed += 1;
            }
        }
        let cached: Vec<Option<Statics>> = inventory
            .gpus
            .iter()
            .map(|gpu| {
                self.statics
                    .get(&gpu.bdf)
                    .filter(|s| started.saturating_duration_since(s.read_at) < STATICS_TTL)
                    // A health sample reads no clock tables.
                    .filter(|s| s.full || scope != Scope::Full)
                    .cloned()
            })
            .collect();
        let with_statics: Vec<bool> = cached.iter().map(Option::is_some).collect();
        if !self
            .plan
            .as_ref()
            .is_some_and(|p| p.is_for(inventory, self.files_changed, &with_statics, scope))
        {
            self.plan = None;
        }
        let plan = self.plan.get_or_insert_with(|| {
            BatchPlan::new(
                inventory,
                &self.files,
                self.files_changed,
                with_statics,
                scope,
            )
        });
        let BatchPlan {
            requests: planned_requests,
            owners,
            presence,
            listed: nodes,
            dirs: node_dirs,
            ..
        } = plan;
        let planned = owners.len();
        let with_kfd = scope != Scope::HealthWithoutNodes;
        let mut answers = self
            .reader
            .batch(planned_requests.clone(), self.timeout)
            .await;
        let mut extra = answers.split_off(planned.min(answers.len())).into_iter();
        let listings: Vec<Result<Answer, ReadError>> =
            extra.by_ref().take(node_dirs.len()).collect();
        let kfd_answer = if with_kfd { extra.next() } else { None };
        let kfd_present = match kfd_answer {
            Some(Ok(Answer::Exists(exists))) => Some(exists),
            _ => None,
        };
        // The answers borrow their fields and paths from the plan: a health
        // sample would otherwise copy a hundred-odd strings it only reads.
        let mut per_gpu: Vec<Vec<Read<'_>>> = inventory.gpus.iter().map(|_| Vec::new()).collect();
        for ((&(index, ref field), (_, path)), answer) in
            owners.iter().zip(planned_requests.iter()).zip(answers)
        {
            let raw = match answer {
                Ok(Answer::Exists(exists)) => Raw::Exists(exists),
                Ok(Answer::Text(text)) => Raw::Text(text),
                Ok(Answer::Bytes(bytes)) => Raw::Bytes(bytes),
                Ok(Answer::Names(_)) => Raw::Failed(ReadError::Closed { path: path.into() }),
                Err(e) => Raw::Failed(e),
            };
            if let Some(list) = per_gpu.get_mut(index) {
                list.push((field, path, raw));
            }
        }
        for (index, field, path) in nodes.iter() {
            let dir = parent_dir(path);
            let listing = node_dirs
                .iter()
                .position(|d| d == dir)
                .and_then(|i| listings.get(i));
            let raw = match listing {
                Some(Ok(Answer::Names(names))) => {
                    let name = &path[dir.len()..].trim_start_matches('/');
                    Raw::Exists(names.iter().any(|n| n == name))
                }
                Some(Err(e)) => Raw::Failed(listing_failed(e, path)),
                _ => Raw::Failed(ReadError::Closed { path: path.clone() }),
            };
            if let Some(list) = per_gpu.get_mut(*index) {
                list.push((field, path, raw));
            }
        }
        let mut unbound: Vec<(usize, &str)> = Vec::new();
        for (index, path) in presence.iter() {
            let index = *index;
            let bound = per_gpu.get(index).is_some_and(|answers| {
                answers
                    .iter()
                    .any(|(f, _, raw)| **f == Field::Bound && matches!(raw, Raw::Exists(true)))
            });
            match per_gpu.get_mut(index) {
                Some(answers) if bound => answers.push((&PRESENT, path, Raw::Exists(true))),
                Some(_) => unbound.push((index, path)),
                None => {}
            }
        }
        if !unbound.is_empty() {
            let requests: Requests = unbound
                .iter()
                .map(|(_, p)| (Op::Exists, (*p).to_owned()))
                .collect();
            let answers = self.reader.batch(requests, self.timeout).await;
            for ((index, path), answer) in unbound.into_iter().zip(answers) {
                let raw = match answer {
                    Ok(Answer::Exists(exists)) => Raw::Exists(exists),
                    Ok(_) => Raw::Failed(ReadError::Closed { path: path.into() }),
                    Err(e) => Raw::Failed(e),
                };
                if let Some(list) = per_gpu.get_mut(index) {
                    list.push((&PRESENT, path, raw));
                }
            }
        }
        let KfdProcesses {
            by_node: kfd_processes,
            cu_occupancy: kfd_cu_occupancy,
        } = if self.processes && scope == Scope::Full {
            kfd_processes(&self.reader, inventory, self.timeout).await
        } else {
            KfdProcesses::default()
        };
        let mut gpus = BTreeMap::new();
        for ((gpu, answers), statics) in inventory.gpus.iter().zip(per_gpu).zip(cached) {
            let fresh = statics.is_none() && statics_answered(&answers);
            let static_paths: Vec<&str> = answers
                .iter()
                .filter(|(f, _, _)| f.is_static())
                .map(|(_, p, _)| *p)
                .collect();
            let mut r = assemble(&gpu.bdf, answers);
            match statics {
                Some(s) => s.apply(&mut r),
                None if fresh
                    && !r
                        .errors
                        .iter()
                        .any(|e| static_paths.iter().any(|p| e.starts_with(p))) =>
                {
                    self.statics.insert(
                        gpu.bdf.clone(),
                        Statics::of(&r, started, scope == Scope::Full),
                    );
                }
                None => {}
            }
            if let Some(now) = &r.gpu_metrics {
                match self.tables.get(&gpu.bdf) {
                    // Not updated since: the same percentages.
                    Some((before, last))
                        if before.accumulation_counter == now.accumulation_counter =>
                    {
                        r.violations = last.clone();
                    }
                    before => {
                        r.violations = before.and_then(|(before, _)| {
                            gpu_metrics::violation_percentages(before, now)
                        });
                        self.tables
                            .insert(gpu.bdf.clone(), (now.clone(), r.violations.clone()));
                    }
                }
            }
            gpus.insert(gpu.bdf.clone(), r);
        }
        HostSample {
            taken_at,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            kfd_present,
            gpus,
            kfd_processes,
            kfd_cu_occupancy,
        }
    }
}

/// One read of a sample: what it is for, its path, and what it gave.
type Read<'a> = (&'a Field, &'a str, Raw);

/// [`Field::Present`], for answers that borrow their field.
static PRESENT: Field = Field::Present;

/// The directory part of a host path (`/dev/dri/card0` → `/dev/dri`).
fn parent_dir(path: &str) -> &str {
    path.rfind('/').map_or("", |at| &path[..at])
}

/// Why `path` is unknown when the listing of its directory failed with `e`.
fn listing_failed(e: &ReadError, path: &str) -> ReadError {
    let path = path.to_owned();
    match e {
        ReadError::Stuck { .. } => ReadError::Stuck { path },
        ReadError::TimedOut { timeout, .. } => ReadError::TimedOut {
            path,
            timeout: *timeout,
        },
        ReadError::Closed { .. } => ReadError::Closed { path },
        ReadError::Host(e) => ReadError::Host(crate::host::HostError::Io {
            path: path.into(),
            source: std::io::Error::other(format!("cannot list its directory: {e}")),
        }),
    }
}

/// Static values of one GPU, as last read.
#[derive(Clone, Debug)]
struct Statics {
    max_speed_gts: Option<f64>,
    max_width: Option<u32>,
    junction_crit_c: Option<f64>,
    clock_ranges: Vec<(Dpm, ClockRange)>,
    /// Read by a [`Scope::Full`] sample, which also reads the clock tables.
    full: bool,
    read_at: Instant,
}

impl Statics {
    fn of(r: &GpuReadings, read_at: Instant, full: bool) -> Self {
        Self {
            max_speed_gts: r.pcie.max_speed_gts,
            max_width: r.pcie.max_width,
            junction_crit_c: r.temperature.junction_crit_c,
            clock_ranges: RANGE_ONLY_CLOCKS
                .iter()
                .filter_map(|d| Some((*d, *r.clock_ranges.get(d)?)))
                .collect(),
            full,
            read_at,
        }
    }

    fn apply(&self, r: &mut GpuReadings) {
        r.pcie.max_speed_gts = self.max_speed_gts;
        r.pcie.max_width = self.max_width;
        r.temperature.junction_crit_c = self.junction_crit_c;
        r.clock_ranges.extend(self.clock_ranges.iter().copied());
    }
}

/// Every static file of a GPU answered (or is absent): the values can be
/// kept. One that timed out or failed is read again next sample.
fn statics_answered(answers: &[Read<'_>]) -> bool {
    answers
        .iter()
        .filter(|(field, _, _)| field.is_static())
        .all(|(_, _, raw)| match raw {
            Raw::Text(_) | Raw::Bytes(_) => true,
            Raw::Failed(e) => e.is_not_found(),
            Raw::Exists(_) => false,
        })
}

/// Finds a GPU's hwmon directory, its temperature sensors and RAS blocks.
/// Whatever cannot be listed stays empty and is looked for again next time.
pub async fn locate(reader: &BoundedReader, bdf: &str, timeout: Duration) -> GpuFiles {
    let dev = device_dir(bdf);
    let mut files = GpuFiles::default();
    let (hwmon_dir, ras_dir) = (format!("{dev}/hwmon"), format!("{dev}/ras"));
    let (hwmons, ras) = tokio::join!(
        reader.list_dir(&hwmon_dir, timeout),
        reader.list_dir(&ras_dir, timeout),
    );
    if let Ok(names) = ras {
        files.ras_listed = true;
        files.ras_blocks = names
            .iter()
            .filter_map(|name| name.strip_suffix("_err_count"))
            .map(str::to_owned)
            .collect();
    }
    let Some(hwmon) = hwmons
        .unwrap_or_default()
        .into_iter()
        .find(|n| n.starts_with("hwmon"))
    else {
        return files;
    };
    let hwmon = format!("{dev}/hwmon/{hwmon}");
    let names = reader.list_dir(&hwmon, timeout).await.unwrap_or_default();
    let labels: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_suffix("_label"))
        .filter(|n| n.starts_with("temp"))
        .map(str::to_owned)
        .collect();
    let texts = futures::future::join_all(labels.iter().map(|t| {
        let path = format!("{hwmon}/{t}_label");
        async move { reader.read_attr(&path, timeout).await }
    }))
    .await;
    for (sensor_file, text) in labels.iter().zip(texts) {
        let Some(sensor) = text.ok().as_deref().and_then(parse_temp_label) else {
            continue;
        };
        files
            .temps
            .insert(sensor, format!("{hwmon}/{sensor_file}_input"));
        let crit = format!("{sensor_file}_crit");
        if sensor == Sensor::Junction && names.contains(&crit) {
            files.junction_crit = Some(format!("{hwmon}/{crit}"));
        }
    }
    files.hwmon = Some(hwmon);
    files
}

/// Readings as tests build them.
#[cfg(test)]
impl GpuReadings {
    /// A GPU that is there and bound to amdgpu, with nothing else read.
    pub(crate) fn bound_gpu(bdf: &str) -> Self {
        GpuReadings {
            bdf: bdf.into(),
            present: Some(true),
            bound: Some(true),
            ..GpuReadings::default()
        }
    }

    /// The same with a RAS block's counts.
    pub(crate) fn with_ecc(mut self, block: &str, ue: u64, ce: u64) -> Self {
        let count = crate::telemetry::sysfs::EccCount { ue, ce, de: None };
        self.ecc.insert(block.into(), count);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::kfd::{KFD_NODES, KFD_PROC};
    use super::*;
    use crate::device::Partition;

    pub(super) fn gpu() -> Gpu {
        Gpu {
            bdf: "0000:05:00.0".into(),
            card: Some(0),
            render_minor: Some(128),
            partitions: vec![
                Partition {
                    id: 0,
                    card: Some(0),
                    render_minor: Some(128),
                    kfd_node: Some(2),
                    platform_device: None,
                },
                Partition {
                    id: 1,
                    card: Some(1),
                    render_minor: Some(129),
                    kfd_node: Some(3),
                    platform_device: None,
                },
            ],
            ..Gpu::default()
        }
    }

    #[tokio::test]
    async fn static_values_are_read_once_and_nodes_can_be_left_to_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let spec = crate::simulate::SimSpec::new("mi210", Some(1), None).unwrap();
        crate::simulate::write_host(&host, &spec).unwrap();
        let inventory = crate::device::discover(&host);
        let bdf = "0000:03:00.0";
        let render = format!(
            "/dev/dri/renderD{}",
            inventory.gpus[0].render_minor.expect("a render node")
        );
        let timeout = Duration::from_millis(200);
        let mut sampler = Sampler::new(BoundedReader::new(host.clone(), 2), timeout);
        let first = sampler.sample(&inventory, Scope::Health).await;
        let r = &first.gpus[bdf];
        assert_eq!(r.pcie.max_width, Some(16));
        assert!(r.temperature.junction_crit_c.is_some());
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(first.kfd_present, Some(true));

        // Once read, static files are not read again: one that hangs now
        // costs nothing, and its value stays.
        let max_width = "/sys/devices/pci0000:00/0000:03:00.0/max_link_width";
        crate::simulate::hang_file(&host, max_width).unwrap();
        host.remove_all(&render).unwrap();
        let again = sampler.sample(&inventory, Scope::HealthWithoutNodes).await;
        let r = &again.gpus[bdf];
        assert_eq!(r.pcie.max_width, Some(16), "kept");
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(sampler.reader().stats().timeouts, 0);
        assert!(
            r.missing_nodes.is_empty() && again.kfd_present.is_none(),
            "nodes are the caller's"
        );

        // A new sampler reads them: the hung file is an error, the node missing.
        let mut fresh = Sampler::new(BoundedReader::new(host.clone(), 2), timeout);
        let sample = fresh.sample(&inventory, Scope::Health).await;
        let r = &sample.gpus[bdf];
        assert!(
            r.errors.iter().any(|e| e.contains("max_link_width")),
            "{:?}",
            r.errors
        );
        assert_eq!(r.pcie.max_width, None);
        assert_eq!(r.missing_nodes, [render]);
        crate::simulate::release_hung_file(&host, max_width, "16").unwrap();
    }

    #[tokio::test]
    async fn the_kept_read_plan_follows_a_repartition_and_its_device_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let write = |mode: &str| {
            let spec = crate::simulate::SimSpec::new("mi300x", Some(2), Some(mode)).unwrap();
            crate::simulate::write_host(&host, &spec).unwrap();
            crate::device::discover(&host)
        };
        let cpx = write("cpx_nps4");
        let mut sampler = Sampler::new(BoundedReader::new(host.clone(), 2), Duration::from_secs(1));
        for _ in 0..2 {
            let sample = sampler.sample(&cpx, Scope::Health).await;
            for r in sample.gpus.values() {
                assert!(r.missing_nodes.is_empty(), "{:?}", r.missing_nodes);
                assert_eq!(r.bound, Some(true));
            }
        }
        // A node removed is seen through the listing of /dev/dri.
        let render = format!(
            "/dev/dri/renderD{}",
            cpx.gpus[0].partitions[3].render_minor.unwrap()
        );
        host.remove_all(&render).unwrap();
        let sample = sampler.sample(&cpx, Scope::Health).await;
        assert_eq!(sample.gpus[&cpx.gpus[0].bdf].missing_nodes, [render]);
        // Back to SPX: the partitions' nodes are gone, and a plan kept from
        // CPX would report them missing.
        let spx = write("spx_nps1");
        assert_ne!(spx, cpx);
        let sample = sampler.sample(&spx, Scope::Health).await;
        for r in sample.gpus.values() {
            assert!(r.missing_nodes.is_empty(), "{:?}", r.missing_nodes);
        }
        // And an unbound GPU, through the listing of the driver's directory.
        host.remove_all(format!("/sys/bus/pci/drivers/amdgpu/{}", spx.gpus[1].bdf))
            .unwrap();
        let sample = sampler.sample(&spx, Scope::Health).await;
        assert_eq!(sample.gpus[&spx.gpus[1].bdf].bound, Some(false));
        assert_eq!(sample.gpus[&spx.gpus[0].bdf].bound, Some(true));
    }

    #[tokio::test]
    async fn presence_is_looked_at_when_the_gpu_is_not_bound() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let spec = crate::simulate::SimSpec::new("mi210", Some(1), None).unwrap();
        crate::simulate::write_host(&host, &spec).unwrap();
        let inventory = crate::device::discover(&host);
        let bdf = "0000:03:00.0";
        let mut sampler = Sampler::new(BoundedReader::new(host.clone(), 2), Duration::from_secs(1));
        let mut presence = async || {
            let r = &sampler.sample(&inventory, Scope::Health).await.gpus[bdf];
            (r.present, r.bound)
        };
        assert_eq!(presence().await, (Some(true), Some(true)));
        host.remove_all(format!("/sys/bus/pci/drivers/amdgpu/{bdf}"))
            .unwrap();
        assert_eq!(presence().await, (Some(true), Some(false)));
        host.remove_all(format!("/sys/devices/pci0000:00/{bdf}"))
            .unwrap();
        assert_eq!(presence().await, (Some(false), Some(false)));
    }

    #[tokio::test]
    async fn full_samples_list_kfd_processes_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let spec = crate::simulate::SimSpec::new("mi210", Some(2), None).unwrap();
        crate::simulate::write_host(&host, &spec).unwrap();
        let inventory = crate::device::discover(&host);
        let node = inventory.gpus[1].kfd_node.expect("a KFD node");
        let gpu_id = host
            .read_attr(format!("{KFD_NODES}/{node}/gpu_id"))
            .unwrap();
        // As the kernel lays it out: a process with one queue on the second
        // GPU, and one with no queues yet.
        host.write(format!("{KFD_PROC}/4242/queues/0/gpuid"), &gpu_id)
            .unwrap();
        host.write(format!("{KFD_PROC}/4242/pasid"), "32769")
            .unwrap();
        host.create_dir_all(format!("{KFD_PROC}/77/queues"))
            .unwrap();
        let timeout = Duration::from_millis(500);
        let mut sampler = Sampler::new(BoundedReader::new(host.clone(), 2), timeout);
        assert!(
            sampler
                .sample(&inventory, Scope::Full)
                .await
                .kfd_processes
                .is_empty(),
            "not asked"
        );
        sampler.set_processes(true);
        let sample = sampler.sample(&inventory, Scope::Full).await;
        assert_eq!(sample.kfd_processes, BTreeMap::from([(node, vec![4242])]));
        // This kernel has no `cu_occupancy` file: no occupancy.
        assert!(sample.kfd_cu_occupancy.is_empty());
        // A third with waves on 13 CUs of the first GPU, and 0 on the second.
        let first = inventory.gpus[0].kfd_node.expect("a KFD node");
        crate::simulate::add_kfd_process(&host, 555, &[(first, 13), (node, 0)]).unwrap();
        let sample = sampler.sample(&inventory, Scope::Full).await;
        assert_eq!(
            sample.kfd_processes,
            BTreeMap::from([(first, vec![555]), (node, vec![555, 4242])])
        );
        assert_eq!(
            sample.kfd_cu_occupancy,
            BTreeMap::from([
                (first, BTreeMap::from([(555, 13)])),
                (node, BTreeMap::from([(555, 0)]))
            ])
        );
        assert!(
            sampler
                .sample(&inventory, Scope::Health)
                .await
                .kfd_processes
                .is_empty(),
            "health samples never list processes"
        );
    }

    #[tokio::test]
    async fn locate_finds_sensors_and_ras_blocks_of_a_simulated_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let host = crate::host::HostRoot::new(dir.path());
        let spec = crate::simulate::SimSpec::new("mi210", Some(1), None).unwrap();
        crate::simulate::write_host(&host, &spec).unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let timeout = Duration::from_secs(1);
        let files = locate(&reader, "0000:03:00.0", timeout).await;
        let hwmon = "/sys/bus/pci/devices/0000:03:00.0/hwmon/hwmon0";
        assert_eq!(files.hwmon.as_deref(), Some(hwmon));
        assert_eq!(
            files.temps.get(&Sensor::Junction).map(String::as_str),
            Some(format!("{hwmon}/temp2_input").as_str())
        );
        assert_eq!(files.temps.len(), 3);
        assert_eq!(files.junction_crit, Some(format!("{hwmon}/temp2_crit")));
        assert!(files.ras_listed && files.ras_blocks.contains(&"umc".to_owned()));
        assert!(files.complete());
        // A GPU without RAS counters is complete with none; one whose hwmon
        // directory is missing is not.
        host.remove_all("/sys/devices/pci0000:00/0000:03:00.0/ras")
            .unwrap();
        host.remove_all("/sys/devices/pci0000:00/0000:03:00.0/hwmon")
            .unwrap();
        let files = locate(&reader, "0000:03:00.0", timeout).await;
        assert!(files.ras_listed && files.ras_blocks.is_empty());
        assert!(!files.complete());
    }
}
