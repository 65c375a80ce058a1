//! Simulated GPU hosts: writes sysfs and devfs trees that mirror the kernel's
//! layout, so that discovery and every later component run their real code path
//! on a machine without GPUs.
//!
//! What is written, per GPU:
//! - the PCI function under `/sys/devices/pci0000:00/<bdf>` with identity, partition
//!   modes, memory, clock, PCIe, RAS and hwmon attributes, the binary
//!   `gpu_metrics` table in the revision the part's SMU writes (layouts in
//!   [`gpu_metrics`]) and the kernel's `uevent`,
//!   linked from `/sys/bus/pci/drivers/amdgpu` and `/sys/bus/pci/devices`, its hwmon
//!   directory from `/sys/class/hwmon`;
//! - DRM nodes (`drm/cardN`, `drm/renderDN` with `dev`, `uevent` and a `device`
//!   link, linked from `/sys/class/drm`), and for partitions beyond the first,
//!   driverless `amdgpu_xcp_N` platform devices that carry their own;
//! - KFD topology nodes with memory banks and io/p2p links;
//! - `/sys/module/amdgpu` (`version`, `srcversion`, `refcnt`, `taint`,
//!   `initstate`, as a loadable out-of-tree module shows them), `/dev/kfd` and
//!   `/dev/dri/*` (plain files: a simulated host cannot create device nodes
//!   without privileges);
//! - per host, whatever the GPUs: the running kernel
//!   (`/proc/sys/kernel/osrelease`) and the boot id
//!   (`/proc/sys/kernel/random/boot_id`). No efivars: a simulated host boots
//!   without UEFI Secure Boot unless a test writes the variable.
//!
//! Every file is written atomically (see [`write_atomic`]), as readers of sysfs
//! never see half a value. Writing is idempotent: the GPU parts of the tree are replaced, so writing again
//! with another partition mode or GPU count is how tests repartition or hotplug.
//! The simulator refuses to touch a directory that looks like a live root.
//!
//! This module owns writing simulated trees; it uses only `host` and `device`.
//! Production code of the modules below it must not use it; their tests may,
//! as a fixture (see `tests/architecture.rs`).

mod amdgpu_module;
mod faults;
pub mod gpu_metrics;
pub mod kernel;
mod kfd;
mod profiles;
mod telemetry;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

pub use profiles::{Fabric, GpuModel, PROFILES, Profile, compute_mode_partitions};

pub use amdgpu_module::{
    SIM_BOOT_ID, SIM_KERNEL_RELEASE, SimModule, load_module, set_boot, unload_module,
};
use amdgpu_module::{write_driver, write_kernel};
pub use faults::{hang_file, release_hung_file, set_ecc_counts, set_ecc_counts_with_deferred};
pub use kfd::add_kfd_process;
use kfd::write_kfd;
pub use telemetry::advance_telemetry;
use telemetry::{gpu_metrics_blob, write_telemetry};

use crate::device::model::format_bdf;
use crate::device::modes;
use crate::host::{HostError, HostRoot};

/// Marks a directory as written by the simulator; its presence lets a rewrite
/// clear the previous GPU tree.
pub const MARKER: &str = "/.gpu-operator-simulated";

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("unknown profile {name:?}; known profiles: {}", profiles::names().join(", "))]
    UnknownProfile { name: String },
    #[error("profile {profile} supports 1 to {max} GPUs, not {requested}")]
    GpuCount {
        profile: &'static str,
        max: usize,
        requested: usize,
    },
    #[error("profile {profile} is not partitionable")]
    NotPartitionable { profile: &'static str },
    #[error("bad partition {value:?}: {reason}")]
    BadPartition { value: String, reason: String },
    #[error(
        "refusing to write a simulated host into {path}: it looks like a live root or holds \
         files the simulator did not write (use an empty or previously simulated directory)"
    )]
    UnsafeTarget { path: String },
    #[error(transparent)]
    Host(#[from] HostError),
}

/// The most GPUs any profile simulates (each profile has its own maximum).
pub const MAX_GPUS: usize = 8;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimSpec {
    pub profile: &'static Profile,
    pub gpus: usize,
    /// Compute and memory mode, lowercase (`cpx`, `nps4`); `None` for the
    /// profile's default (`spx`/`nps1` when partitionable).
    pub partition: Option<(String, String)>,
    /// Per-GPU partition modes that differ from `partition`, by GPU index: how a
    /// heterogeneous node (some GPUs repartitioned, some not) is simulated.
    pub gpu_partitions: BTreeMap<usize, (String, String)>,
    /// When false, the PCI functions exist but no driver is bound: no
    /// `/sys/module/amdgpu`, no KFD, no DRM nodes.
    pub driver_loaded: bool,
    /// Name partition platform devices `amdgpu_xcp.N` instead of `amdgpu_xcp_N`,
    /// as some kernels do.
    pub xcp_dot_spelling: bool,
}

impl SimSpec {
    /// Validates a profile name, GPU count and `COMPUTE_MEMORY` partition string.
    pub fn new(
        profile: &str,
        gpus: Option<usize>,
        partition: Option<&str>,
    ) -> Result<Self, SimError> {
        let profile = profiles::find(profile).ok_or_else(|| SimError::UnknownProfile {
            name: profile.to_owned(),
        })?;
        let gpus = gpus.unwrap_or(profile.default_gpus);
        if gpus == 0 || gpus > profile.max_gpus {
            return Err(SimError::GpuCount {
                profile: profile.name,
                max: profile.max_gpus,
                requested: gpus,
            });
        }
        let partition = partition
            .map(|value| parse_partition(profile, value))
            .transpose()?;
        Ok(Self {
            profile,
            gpus,
            partition,
            gpu_partitions: BTreeMap::new(),
            driver_loaded: true,
            xcp_dot_spelling: false,
        })
    }

    fn partitionable(&self) -> bool {
        !self.profile.model.compute_modes.is_empty()
    }

    /// Sets GPU `index` to its own `COMPUTE_MEMORY` partition mode.
    pub fn with_gpu_partition(mut self, index: usize, partition: &str) -> Result<Self, SimError> {
        if index >= self.gpus {
            return Err(SimError::BadPartition {
                value: format!("{index}={partition}"),
                reason: format!("there are only {} GPUs", self.gpus),
            });
        }
        let modes = parse_partition(self.profile, partition)?;
        self.gpu_partitions.insert(index, modes);
        Ok(self)
    }

    /// Current (compute, memory) modes of GPU `index`, lowercase, when partitionable.
    fn modes(&self, index: usize) -> Option<(String, String)> {
        self.partitionable().then(|| {
            self.gpu_partitions
                .get(&index)
                .or(self.partition.as_ref())
                .cloned()
                .unwrap_or_else(|| ("spx".into(), "nps1".into()))
        })
    }

    /// Partitions of GPU `index`.
    pub fn partitions_of(&self, index: usize) -> u32 {
        self.modes(index)
            .and_then(|(compute, _)| compute_mode_partitions(&compute))
            .unwrap_or(1)
    }
}

fn parse_partition(profile: &'static Profile, value: &str) -> Result<(String, String), SimError> {
    let bad = |reason: String| SimError::BadPartition {
        value: value.to_owned(),
        reason,
    };
    let model = &profile.model;
    if model.compute_modes.is_empty() {
        return Err(SimError::NotPartitionable {
            profile: profile.name,
        });
    }
    let (compute, memory) = value
        .to_ascii_lowercase()
        .split_once('_')
        .map(|(c, m)| (c.to_owned(), m.to_owned()))
        .ok_or_else(|| bad("expected COMPUTE_MEMORY, e.g. cpx_nps4".into()))?;
    let offered = |modes: &[&str], mode: &str| modes.iter().any(|m| m.eq_ignore_ascii_case(mode));
    if !offered(model.compute_modes, &compute) {
        return Err(bad(format!(
            "compute mode must be one of {}",
            model.compute_modes.join(", ").to_ascii_lowercase()
        )));
    }
    if !offered(model.memory_modes, &memory) {
        return Err(bad(format!(
            "memory mode must be one of {}",
            model.memory_modes.join(", ").to_ascii_lowercase()
        )));
    }
    if !modes::compatible(&compute, &memory) {
        return Err(bad(format!(
            "the driver does not run {compute} with {memory}"
        )));
    }
    Ok((compute, memory))
}

/// What [`write_host`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimSummary {
    pub gpus: usize,
    pub partitions: usize,
    pub files: usize,
}

/// Writes (or rewrites) the simulated host under `host`'s root.
pub fn write_host(host: &HostRoot, spec: &SimSpec) -> Result<SimSummary, SimError> {
    check_target(host.root())?;
    clear_gpu_tree(host)?;
    let mut w = Writer::new(host);
    w.file(
        MARKER,
        format!("{} {} gpus\n", spec.profile.name, spec.gpus),
    )?;
    write_kernel(&mut w)?;
    let layout = Layout::new(spec);
    for gpu in &layout.gpus {
        write_pci_function(&mut w, spec, gpu)?;
    }
    if spec.driver_loaded {
        write_driver(&mut w, &SimModule::default())?;
        write_kfd(&mut w, spec, &layout, 1, KFD_TOPOLOGY)?;
    }
    w.file(LAYOUT_MARKER, layout_key(spec))?;
    Ok(SimSummary {
        gpus: layout.gpus.len(),
        partitions: layout.gpus.iter().map(|g| g.nodes.len()).sum::<usize>(),
        files: w.files,
    })
}

/// Refuses `/` and anything that looks like a mounted root, and any non-empty
/// directory the simulator did not write.
fn check_target(root: &Path) -> Result<(), SimError> {
    let unsafe_target = || SimError::UnsafeTarget {
        path: root.display().to_string(),
    };
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if canonical == Path::new("/") || canonical.join("proc/self").exists() {
        return Err(unsafe_target());
    }
    let marked = canonical.join(MARKER.trim_start_matches('/')).exists();
    let empty = match std::fs::read_dir(&canonical) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            return Err(HostError::Io {
                path: canonical,
                source: e,
            }
            .into());
        }
    };
    if marked || empty {
        Ok(())
    } else {
        Err(unsafe_target())
    }
}

fn clear_gpu_tree(host: &HostRoot) -> Result<(), HostError> {
    for path in [
        "/sys/bus/pci/drivers/amdgpu",
        "/sys/bus/pci/devices",
        "/sys/devices/pci0000:00",
        "/sys/class/kfd",
        "/sys/class/drm",
        "/sys/class/hwmon",
        "/sys/module/amdgpu",
        "/dev/dri",
        "/dev/kfd",
    ] {
        host.remove_all(path)?;
    }
    remove_xcp_devices(host)
}

/// Removes the partition platform devices (`amdgpu_xcp_N`).
fn remove_xcp_devices(host: &HostRoot) -> Result<(), HostError> {
    for entry in host.list_dir_or_empty("/sys/devices/platform")? {
        if entry.starts_with("amdgpu_xcp") {
            host.remove_all(format!("/sys/devices/platform/{entry}"))?;
        }
    }
    Ok(())
}

const KFD_TOPOLOGY: &str = "/sys/class/kfd/kfd/topology";

/// The partition modes the tree's partitions are laid out for, written with
/// them: a mode write the simulated driver took is laid out once the writer
/// settles ([`settle_partitions`]). Under `/sys`, which nothing lists.
const LAYOUT_MARKER: &str = "/sys/.gpu-operator-simulate-layout";
/// Where a new KFD topology is written before it replaces the live one in
/// one rename, and where the old one goes to be removed.
const KFD_NEXT: &str = "/sys/.gpu-operator-simulate-kfd-next";
const KFD_TRASH: &str = "/sys/.gpu-operator-simulate-kfd-trash";

/// Every GPU's partition modes, as [`LAYOUT_MARKER`] records them.
fn layout_key(spec: &SimSpec) -> String {
    let modes: Vec<String> = (0..gpu_addresses(spec).len())
        .map(|i| {
            spec.modes(i)
                .map(|(c, m)| format!("{c}_{m}"))
                .unwrap_or_else(|| "-".to_owned())
        })
        .collect();
    format!("{}\n", modes.join(" "))
}

/// Records a mode write the simulated driver took: the GPU's
/// `current_*_partition` attributes. Its partitions follow when the writer
/// settles ([`settle_partitions`]).
pub(crate) fn set_modes(host: &HostRoot, spec: &SimSpec, index: usize) -> Result<(), HostError> {
    let mut w = Writer::new(host);
    let dir = pci_dir(&gpu_addresses(spec)[index]);
    for (name, value) in partition_attrs(spec, index) {
        if name.starts_with("current_") {
            w.file(format!("{dir}/{name}"), format!("{value}\n"))?;
        }
    }
    Ok(())
}

/// Lays the partitions out for the modes the GPUs' attributes say, when the
/// tree is not laid out for them yet: once per batch of mode writes, as a
/// reader waiting for the new partitions sees it.
pub(crate) fn settle_partitions(host: &HostRoot) -> Result<(), SimError> {
    let spec = spec_of(host)?;
    if host.read_string(LAYOUT_MARKER).ok().as_deref() == Some(layout_key(&spec).as_str()) {
        return Ok(());
    }
    rewrite_partitions(host, &spec)?;
    Ok(())
}

/// Re-creates what a partition change replaces, as the driver does after it
/// switched: every GPU's partition DRM nodes and platform devices, its
/// partition modes, its `gpu_metrics` (which has a row per partition) and the
/// KFD topology, with `generation_id` bumped. The PCI functions and what
/// else they hold (RAS counts, telemetry, the module) stay as they are.
pub(crate) fn rewrite_partitions(host: &HostRoot, spec: &SimSpec) -> Result<(), HostError> {
    let layout = Layout::new(spec);
    for entry in host.list_dir_or_empty("/sys/class/drm")? {
        if entry.starts_with("card") || entry.starts_with("renderD") {
            host.remove_all(format!("/sys/class/drm/{entry}"))?;
        }
    }
    host.remove_all("/dev/dri")?;
    remove_xcp_devices(host)?;
    for gpu in &layout.gpus {
        host.remove_all(format!("{}/drm", pci_dir(&gpu.bdf)))?;
    }
    let generation = host
        .read_attr(format!("{KFD_TOPOLOGY}/generation_id"))
        .ok()
        .and_then(|g| g.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    let mut w = Writer::new(host);
    for gpu in &layout.gpus {
        let dir = pci_dir(&gpu.bdf);
        w.attrs(&dir, &partition_attrs(spec, gpu.index))?;
        let partitions = gpu.nodes.len() as u32;
        if let Some(blob) = gpu_metrics_blob(&spec.profile.model, gpu.index, partitions, 0) {
            w.file(format!("{dir}/gpu_metrics"), blob)?;
        }
        write_drm_nodes(&mut w, spec, gpu)?;
    }
    replace_kfd(host, spec, &layout, generation)?;
    w.file(LAYOUT_MARKER, layout_key(spec))
}

/// Replaces the live KFD topology with one for `layout`, as the driver
/// re-creates it: written whole where no reader looks, then put in place
/// with one rename, so that a reader sees the old topology or the new one.
/// The old tree is removed on a thread of its own (a topology of 64
/// partitions is thousands of files: on a disk, the removal is what costs),
/// and whatever an earlier process left of one before the next replacement.
fn replace_kfd(
    host: &HostRoot,
    spec: &SimSpec,
    layout: &Layout,
    generation: u64,
) -> Result<(), HostError> {
    host.remove_all(KFD_NEXT)?;
    let next = format!("{KFD_NEXT}/topology");
    let mut staged = Writer {
        fresh: true,
        ..Writer::new(host)
    };
    write_kfd(&mut staged, spec, layout, generation, &next)?;
    let trash = format!("{KFD_TRASH}/{}-{generation}", std::process::id());
    host.create_dir_all(KFD_TRASH)?;
    if host.exists(KFD_TOPOLOGY) {
        host.rename(KFD_TOPOLOGY, &trash)?;
    }
    host.create_dir_all("/sys/class/kfd/kfd")?;
    host.rename(&next, KFD_TOPOLOGY)?;
    let trash_dir = host.path(KFD_TRASH);
    // Detached: the tree is out of every reader's way already, and a process
    // that ends first leaves the rest to the next replacement.
    std::thread::spawn(move || {
        for entry in std::fs::read_dir(&trash_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    });
    Ok(())
}

/// The spec of the simulated host under `host` as its tree shows it now:
/// the profile and GPU count the simulator recorded, each GPU's partition
/// modes, whether the driver is bound, and the platform devices' spelling.
pub fn spec_of(host: &HostRoot) -> Result<SimSpec, SimError> {
    let marker = host.read_attr(MARKER)?;
    let mut words = marker.split_whitespace();
    let (Some(profile), Some(gpus)) = (words.next(), words.next()) else {
        return Err(SimError::BadPartition {
            value: marker.clone(),
            reason: format!("{MARKER} does not name a profile and a GPU count"),
        });
    };
    let gpus = gpus.parse().ok();
    let mut spec = SimSpec::new(profile, gpus, None)?;
    spec.driver_loaded = host.exists("/sys/module/amdgpu");
    spec.xcp_dot_spelling = host
        .list_dir_or_empty("/sys/devices/platform")?
        .iter()
        .any(|e| e.starts_with("amdgpu_xcp."));
    if spec.partitionable() {
        for gpu in Layout::new(&spec).gpus {
            let dir = pci_dir(&gpu.bdf);
            let compute = host.read_attr(format!("{dir}/current_compute_partition"));
            let memory = host.read_attr(format!("{dir}/current_memory_partition"));
            if let (Ok(compute), Ok(memory)) = (compute, memory) {
                spec.gpu_partitions.insert(
                    gpu.index,
                    (compute.to_ascii_lowercase(), memory.to_ascii_lowercase()),
                );
            }
        }
    }
    Ok(spec)
}

/// The PCI address of each GPU of `spec`, in index order.
pub fn gpu_addresses(spec: &SimSpec) -> Vec<String> {
    Layout::new(spec).gpus.into_iter().map(|g| g.bdf).collect()
}

/// Counts files as it writes them, for the summary.
struct Writer<'a> {
    host: &'a HostRoot,
    files: usize,
    /// Writes into a tree no reader sees yet (a staged KFD topology): each
    /// file written as it is, without the staging and rename that keeps a
    /// live file whole.
    fresh: bool,
}

impl<'a> Writer<'a> {
    fn new(host: &'a HostRoot) -> Self {
        Self {
            host,
            files: 0,
            fresh: false,
        }
    }

    fn file(
        &mut self,
        path: impl AsRef<Path>,
        contents: impl AsRef<[u8]>,
    ) -> Result<(), HostError> {
        self.files += 1;
        if self.fresh {
            return self.host.write(path, contents);
        }
        write_atomic(self.host, path, contents)
    }

    fn attrs(&mut self, dir: &str, attrs: &[(&str, String)]) -> Result<(), HostError> {
        for (name, value) in attrs {
            self.file(format!("{dir}/{name}"), format!("{value}\n"))?;
        }
        Ok(())
    }

    fn link(&mut self, target: &str, link: &str) -> Result<(), HostError> {
        self.host.symlink(target, link)
    }
}

/// Where [`write_atomic`] stages its temporary files: on the same file system as
/// the tree (so that a rename moves them into place) but outside every attribute
/// directory, so that no reader that lists a directory (ours, the node
/// exporter's) ever sees one. `/sys` itself is never listed.
pub const STAGING_DIR: &str = "/sys/.gpu-operator-simulate-tmp";

/// Writes a file as sysfs readers expect to see it: whole or not at all. The
/// contents go to a fresh file in [`STAGING_DIR`], which is then renamed over the
/// target; a reader that opened the old file keeps reading the old value, and
/// one that opens after the rename reads the new one. Never an empty or half
/// value, as an in-place rewrite (truncate, then write) lets readers see.
pub fn write_atomic(
    host: &HostRoot,
    host_path: impl AsRef<Path>,
    contents: impl AsRef<[u8]>,
) -> Result<(), HostError> {
    let staging = host.path(STAGING_DIR);
    std::fs::create_dir_all(&staging).map_err(|source| HostError::Io {
        path: staging.clone(),
        source,
    })?;
    write_staged(&staging, &host.path(host_path), contents.as_ref())
}

/// [`write_atomic`] with the staging directory known to exist: a fresh file
/// there, renamed over `path`. The parent of `path` is made only when the
/// rename says it is missing, so that rewriting existing files (telemetry,
/// every second) costs no directory checks.
fn write_staged(staging: &Path, path: &Path, contents: &[u8]) -> Result<(), HostError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let io = |path: &Path, source: std::io::Error| HostError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Unique per process and per write, so that concurrent writers (the ticking
    // demo, a test injecting ECC errors) never share a temporary file.
    let tmp = staging.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, contents).map_err(|e| io(&tmp, e))?;
    let renamed = match std::fs::rename(&tmp, path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match path.parent() {
            Some(parent) => std::fs::create_dir_all(parent)
                .map_err(|e| io(parent, e))
                .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| io(path, e))),
            None => Err(io(path, e)),
        },
        other => other.map_err(|e| io(path, e)),
    };
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// Where every GPU and partition sits: addresses, DRM numbers, KFD node ids.
struct Layout {
    gpus: Vec<GpuLayout>,
}

struct GpuLayout {
    index: usize,
    bus: u8,
    bdf: String,
    numa: i32,
    unique_id: u64,
    hive_id: u64,
    nodes: Vec<NodeLayout>,
}

struct NodeLayout {
    kfd_id: u32,
    partition: u32,
    card: u32,
    render_minor: u32,
    /// Index of the `amdgpu_xcp` platform device, for partitions after the first.
    xcp: Option<u32>,
}

impl Layout {
    fn new(spec: &SimSpec) -> Self {
        let profile = spec.profile;
        // Partitionable GPUs reserve eight DRM minors each, as MI300 and MI308 hosts do.
        let stride = if spec.partitionable() { 8 } else { 1 };
        let mut next_xcp = 0;
        let mut next_kfd = profile.cpu_nodes;
        let gpus = (0..spec.gpus)
            .map(|index| {
                let bus = profile.buses[index];
                let nodes = (0..spec.partitions_of(index))
                    .map(|p| {
                        let render_minor = 128 + index as u32 * stride + p;
                        let xcp = (p > 0).then(|| {
                            next_xcp += 1;
                            next_xcp - 1
                        });
                        next_kfd += 1;
                        NodeLayout {
                            kfd_id: next_kfd - 1,
                            partition: p,
                            card: render_minor - 128,
                            render_minor,
                            xcp,
                        }
                    })
                    .collect();
                GpuLayout {
                    index,
                    bus,
                    bdf: format_bdf(0, bus, 0, 0),
                    numa: profile.numa[index * profile.numa.len() / spec.gpus],
                    unique_id: mix(u64::from(profile.model.device_id) << 16 | index as u64),
                    hive_id: match profile.fabric {
                        Fabric::OneHive => mix(u64::from(profile.model.device_id)),
                        Fabric::BridgedPairs => mix(0x4856 << 8 | (index / 2) as u64),
                        Fabric::PcieOnly => 0,
                    },
                    nodes,
                }
            })
            .collect();
        Self { gpus }
    }
}

/// A fixed bit mixer (splitmix64's finaliser) for stable, non-zero, distinct ids.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

fn pci_dir(bdf: &str) -> String {
    format!("/sys/devices/pci0000:00/{bdf}")
}

fn write_pci_function(
    w: &mut Writer<'_>,
    spec: &SimSpec,
    gpu: &GpuLayout,
) -> Result<(), HostError> {
    let model = &spec.profile.model;
    let dir = pci_dir(&gpu.bdf);
    let is_display = model.gfx_target_version >= 100000;
    // Display controller (VGA) for Radeon, processing accelerator for Instinct.
    let class: u32 = if is_display { 0x03_0000 } else { 0x12_0000 };
    let mut attrs = vec![
        ("vendor", "0x1002".to_owned()),
        ("device", format!("0x{:04x}", model.device_id)),
        ("revision", format!("0x{:02x}", model.revision)),
        ("subsystem_vendor", "0x1002".to_owned()),
        (
            "subsystem_device",
            format!("0x{:04x}", model.subsystem_device),
        ),
        ("class", format!("0x{class:06x}")),
        ("numa_node", gpu.numa.to_string()),
        ("serial_number", format!("{:016X}", gpu.unique_id)),
        ("unique_id", format!("{:x}", gpu.unique_id)),
        ("vbios_version", model.vbios.to_owned()),
    ];
    if let Some(name) = model.product_name {
        attrs.push(("product_name", name.to_owned()));
        attrs.push(("manufacturer", "AMD".to_owned()));
    }
    if let Some(number) = model.product_number {
        attrs.push(("product_number", number.to_owned()));
    }
    attrs.extend(partition_attrs(spec, gpu.index));
    w.attrs(&dir, &attrs)?;
    for (stem, _) in crate::device::FIRMWARE_ENGINES {
        w.file(
            format!("{dir}/fw_version/{stem}_fw_version"),
            format!("0x{:08x}\n", model.firmware_version(stem)),
        )?;
    }
    w.file(
        format!("{dir}/uevent"),
        pci_uevent(model, &gpu.bdf, class, spec.driver_loaded),
    )?;
    w.link(&dir, &format!("/sys/bus/pci/devices/{}", gpu.bdf))?;
    if !spec.driver_loaded {
        return Ok(());
    }
    w.link(&dir, &format!("/sys/bus/pci/drivers/amdgpu/{}", gpu.bdf))?;
    w.link("/sys/bus/pci/drivers/amdgpu", &format!("{dir}/driver"))?;
    write_telemetry(w, spec, gpu, &dir)?;
    write_drm_nodes(w, spec, gpu)
}

/// A partitionable GPU's partition modes, current and available.
fn partition_attrs(spec: &SimSpec, index: usize) -> Vec<(&'static str, String)> {
    let model = &spec.profile.model;
    match spec.modes(index) {
        Some((compute, memory)) => vec![
            ("current_compute_partition", compute.to_ascii_uppercase()),
            (
                "available_compute_partition",
                model.compute_modes.join(", "),
            ),
            ("current_memory_partition", memory.to_ascii_uppercase()),
            ("available_memory_partition", model.memory_modes.join(", ")),
        ],
        None => Vec::new(),
    }
}

/// The DRM nodes of each of a GPU's partitions: the first on the PCI
/// function, the others on driverless `amdgpu_xcp` platform devices.
fn write_drm_nodes(w: &mut Writer<'_>, spec: &SimSpec, gpu: &GpuLayout) -> Result<(), HostError> {
    let dir = pci_dir(&gpu.bdf);
    for node in &gpu.nodes {
        let node_dir = match node.xcp {
            None => dir.clone(),
            Some(xcp) => {
                let sep = if spec.xcp_dot_spelling { '.' } else { '_' };
                let platform = format!("/sys/devices/platform/amdgpu_xcp{sep}{xcp}");
                // A partition's platform device has no driver of its own.
                w.file(
                    format!("{platform}/uevent"),
                    "MODALIAS=platform:amdgpu_xcp\n",
                )?;
                platform
            }
        };
        for (name, minor) in [
            (format!("card{}", node.card), node.card),
            (format!("renderD{}", node.render_minor), node.render_minor),
        ] {
            let drm_dir = format!("{node_dir}/drm/{name}");
            w.file(format!("{drm_dir}/dev"), format!("226:{minor}\n"))?;
            w.file(
                format!("{drm_dir}/uevent"),
                format!("MAJOR=226\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"),
            )?;
            w.link(&node_dir, &format!("{drm_dir}/device"))?;
            w.link(&drm_dir, &format!("/sys/class/drm/{name}"))?;
            w.file(format!("/dev/dri/{name}"), "")?;
        }
    }
    Ok(())
}

/// A PCI function's `uevent`, as the kernel's PCI core writes it: `DRIVER=` only
/// while a driver is bound; ids in upper-case hex; the class without leading zeros.
fn pci_uevent(model: &GpuModel, bdf: &str, class: u32, driver_bound: bool) -> String {
    const VENDOR: u16 = 0x1002;
    let (device, subsystem) = (model.device_id, model.subsystem_device);
    let mut out = String::new();
    if driver_bound {
        out.push_str("DRIVER=amdgpu\n");
    }
    let _ = write!(
        out,
        "PCI_CLASS={class:X}\nPCI_ID={VENDOR:04X}:{device:04X}\n\
         PCI_SUBSYS_ID={VENDOR:04X}:{subsystem:04X}\nPCI_SLOT_NAME={bdf}\n\
         MODALIAS=pci:v{VENDOR:08X}d{device:08X}sv{VENDOR:08X}sd{subsystem:08X}\
         bc{:02X}sc{:02X}i{:02X}\n",
        class >> 16,
        (class >> 8) & 0xff,
        class & 0xff,
    );
    out
}

/// A whole-GPU MI300X written under `<dir>/host`, in memory where the
/// machine has `/dev/shm` (partition writes re-lay many files), for tests
/// that change what is on it. The directory holds anything else a test
/// writes beside the host.
#[cfg(test)]
pub(crate) fn mi300x_in_memory() -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory");
    let host = HostRoot::new(dir.path().join("host"));
    let spec = SimSpec::new("mi300x", None, None).expect("the mi300x profile");
    write_host(&host, &spec).expect("the simulated host written");
    (dir, host)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a real board of each model has: its RAS blocks' files, the DPM
    /// clock tables, and a part number the reference's dashboards select.
    #[test]
    fn boards_have_their_ras_blocks_clock_tables_and_part_numbers() {
        for (profile, bus, part, blocks) in [
            ("mi300x", "05", "102-G30211-00", profiles::MI300_RAS_BLOCKS),
            ("mi210", "03", "102-D67305-00", profiles::MI200_RAS_BLOCKS),
            ("mi250x", "c1", "102-D65200-0A", profiles::MI200_RAS_BLOCKS),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let host = HostRoot::new(dir.path());
            write_host(&host, &SimSpec::new(profile, Some(1), None).unwrap()).unwrap();
            let dev = format!("/sys/devices/pci0000:00/0000:{bus}:00.0");
            assert_eq!(
                host.read_attr(format!("{dev}/product_number")).unwrap(),
                part
            );
            let mut written: Vec<String> = host
                .list_dir_or_empty(format!("{dev}/ras"))
                .unwrap()
                .into_iter()
                .filter_map(|f| f.strip_suffix("_err_count").map(str::to_owned))
                .collect();
            written.sort();
            let mut expected: Vec<&str> = blocks.to_vec();
            expected.sort();
            assert_eq!(written, expected, "{profile}");
            for file in [
                "pp_dpm_sclk",
                "pp_dpm_mclk",
                "pp_dpm_socclk",
                "pp_dpm_fclk",
                "pp_dpm_vclk",
                "pp_dpm_dclk",
            ] {
                let text = host.read_string(format!("{dev}/{file}")).unwrap();
                assert_eq!(text.matches('*').count(), 1, "{profile} {file}: {text}");
            }
        }
        // The dashboards' MI300 and MI200 lists.
        assert!(
            "102-G30211-00|102-G30211-0C|102-G30211-4C|102-G30212-0C|102-G30213-00"
                .split('|')
                .any(|p| Some(p) == profiles::find("mi300x").unwrap().model.product_number)
        );
        assert!(
            "102-D65208-0C|102-D67305-00|102-D65209-0C"
                .split('|')
                .any(|p| Some(p) == profiles::find("mi210").unwrap().model.product_number)
        );
    }

    #[test]
    fn partition_strings_are_checked() {
        assert!(SimSpec::new("mi300x", None, Some("cpx_nps4")).is_ok());
        assert!(SimSpec::new("mi300x", None, Some("CPX_NPS1")).is_ok());
        let err = SimSpec::new("mi300x", None, Some("spx_nps4")).unwrap_err();
        assert!(
            err.to_string().contains("does not run spx with nps4"),
            "{err}"
        );
        assert!(matches!(
            SimSpec::new("mi300x", None, Some("cpx")),
            Err(SimError::BadPartition { .. })
        ));
        assert!(matches!(
            SimSpec::new("mi300x", None, Some("xpx_nps1")),
            Err(SimError::BadPartition { .. })
        ));
        assert!(matches!(
            SimSpec::new("mi210", None, Some("cpx_nps4")),
            Err(SimError::NotPartitionable { .. })
        ));
        assert!(matches!(
            SimSpec::new("mi400", None, None),
            Err(SimError::UnknownProfile { .. })
        ));
        assert!(matches!(
            SimSpec::new("mi300x", Some(9), None),
            Err(SimError::GpuCount { .. })
        ));
    }

    #[test]
    fn refuses_live_roots_and_foreign_directories() {
        assert!(matches!(
            check_target(Path::new("/")),
            Err(SimError::UnsafeTarget { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), "x").unwrap();
        assert!(matches!(
            check_target(dir.path()),
            Err(SimError::UnsafeTarget { .. })
        ));
        let empty = tempfile::tempdir().unwrap();
        assert!(check_target(empty.path()).is_ok());
        assert!(check_target(&empty.path().join("new")).is_ok());
    }

    #[test]
    fn device_directories_look_like_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write_host(
            &host,
            &SimSpec::new("mi300x", Some(1), Some("dpx_nps1")).unwrap(),
        )
        .unwrap();
        let pci = "/sys/devices/pci0000:00/0000:05:00.0";
        assert_eq!(
            host.read_string(format!("{pci}/uevent")).unwrap(),
            "DRIVER=amdgpu\nPCI_CLASS=120000\nPCI_ID=1002:74A1\nPCI_SUBSYS_ID=1002:74A1\n\
             PCI_SLOT_NAME=0000:05:00.0\n\
             MODALIAS=pci:v00001002d000074A1sv00001002sd000074A1bc12sc00i00\n"
        );
        assert_eq!(
            host.read_string("/sys/class/drm/card0/uevent").unwrap(),
            "MAJOR=226\nMINOR=0\nDEVNAME=dri/card0\nDEVTYPE=drm_minor\n"
        );
        let resolved = |p: &str| host.path(p).canonicalize().unwrap();
        assert_eq!(resolved("/sys/class/drm/card0/device"), resolved(pci));
        assert_eq!(resolved("/sys/class/drm/renderD128/device"), resolved(pci));
        assert_eq!(
            resolved("/sys/class/drm/card1/device"),
            resolved("/sys/devices/platform/amdgpu_xcp_0")
        );
        assert!(
            host.read_string("/sys/class/drm/card1/device/uevent")
                .unwrap()
                .starts_with("MODALIAS=platform:")
        );
        assert_eq!(
            resolved("/sys/class/hwmon/hwmon0"),
            resolved(&format!("{pci}/hwmon/hwmon0"))
        );
        assert_eq!(resolved("/sys/class/hwmon/hwmon0/device"), resolved(pci));
        assert_eq!(
            resolved(&format!("{pci}/driver")),
            resolved("/sys/bus/pci/drivers/amdgpu")
        );
        // Without a driver the uevent names none.
        write_host(
            &host,
            &SimSpec {
                driver_loaded: false,
                ..SimSpec::new("mi300x", Some(1), None).unwrap()
            },
        )
        .unwrap();
        let uevent = host.read_string(format!("{pci}/uevent")).unwrap();
        assert!(uevent.starts_with("PCI_CLASS="), "{uevent}");
        // Atomic writes leave no temporary file behind.
        assert_eq!(
            host.list_dir_or_empty(STAGING_DIR).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn max_gpus_bounds_every_profile() {
        assert!(PROFILES.iter().all(|p| p.max_gpus <= MAX_GPUS));
        assert!(PROFILES.iter().any(|p| p.max_gpus == MAX_GPUS));
    }

    #[test]
    fn ids_are_distinct_and_non_zero() {
        let ids: std::collections::BTreeSet<u64> = (0..64).map(mix).collect();
        assert_eq!(ids.len(), 64);
        assert!(!ids.contains(&0));
    }
}
