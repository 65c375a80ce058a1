//! GPU discovery: which AMD GPUs a host has, how they are partitioned and how
//! they are connected.
//!
//! Three kernel views are joined:
//! - PCI functions bound to amdgpu (`/sys/bus/pci/drivers/amdgpu/<bdf>`): identity,
//!   NUMA node, partition modes, DRM nodes;
//! - DRM nodes of partitions (`/sys/devices/platform/amdgpu_xcp_N/drm/*`);
//! - KFD topology: compute units, hive, partitions and links.
//!
//! Discovery is a read-only snapshot function over a [`HostRead`] whose every
//! read is deadline-bounded ([`bounded`]); it never fails and never blocks for
//! long as a whole. What cannot be read becomes a `problems` entry on the GPU, or a
//! host-level warning when a whole GPU has to be skipped. Watching for changes
//! lives in [`watch`]. This module must not decide anything about what to do with
//! the GPUs (resources, labels, health): consumers own that.

pub mod bounded;
pub mod fingerprint;
pub mod kfd;
pub mod model;
pub mod modes;
pub mod relayout;
pub mod uevent;
pub mod unbound;
pub mod watch;

use std::collections::BTreeMap;
use std::str::FromStr;

pub use model::*;

use crate::host::reader::BoundedReader;
use crate::host::{HostAnswer, HostError, HostOp, HostRead, HostRoot, parse_hex};

pub use bounded::Limits;

/// Where the kernel lists PCI functions bound to amdgpu. The second spelling is
/// the module's view of the same set, present on hosts without `/sys/bus/pci/drivers`
/// mounted into a container.
const AMDGPU_PCI_DIRS: [&str; 2] = [
    "/sys/bus/pci/drivers/amdgpu",
    "/sys/module/amdgpu/drivers/pci:amdgpu",
];
const AMD_VENDOR_ID: u16 = 0x1002;
const PLATFORM_DIR: &str = "/sys/devices/platform";

/// A scan's result: the inventory, and why it must not replace the last one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    pub inventory: Inventory,
    /// Empty when the scan saw the whole host. Otherwise what went wrong: the
    /// scan missed its deadline, or a directory that says which GPUs exist
    /// could not be read. Such an inventory may lack GPUs that are there.
    pub incomplete: Vec<String>,
}

/// Takes a snapshot of the host's GPUs with the default [`Limits`]. Returns
/// within about the scan deadline whatever hangs; see [`discover_bounded`].
pub fn discover(host: &HostRoot) -> Inventory {
    let reader = BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS);
    let scan = discover_bounded(&reader, Limits::default());
    let mut inventory = scan.inventory;
    inventory.warnings.extend(scan.incomplete);
    inventory
}

/// [`discover`] on a blocking thread, for async callers: a runtime thread stays
/// free, so a timer around the call (a command's deadline) can end the wait.
/// An empty inventory if that thread fails.
pub async fn discover_off_runtime(host: &HostRoot) -> Inventory {
    let host = host.clone();
    tokio::task::spawn_blocking(move || discover(&host))
        .await
        .unwrap_or_default()
}

/// Takes a snapshot through `reader` (whose host it reads), every file bounded
/// by `limits`. Callable from any context: it runs on a thread of its own.
pub fn discover_bounded(reader: &BoundedReader, limits: Limits) -> Discovery {
    match bounded::run_bounded(reader, limits, |h| discover_with(h)) {
        Ok((mut scan, deadline_missed)) => {
            if deadline_missed {
                scan.incomplete.push(format!(
                    "discovery missed its {:?} deadline",
                    limits.scan_deadline
                ));
            }
            scan
        }
        Err(error) => Discovery {
            incomplete: vec![error],
            ..Discovery::default()
        },
    }
}

/// Takes a snapshot through `host`.
pub fn discover_with(host: &dyn HostRead) -> Discovery {
    let (mut incomplete, mut warnings) = (Vec::new(), Vec::new());
    let driver = driver_state(host, &mut incomplete, &mut warnings);
    let mut inventory = Inventory {
        driver,
        warnings,
        ..Inventory::default()
    };
    let topology = kfd::read_topology_with(host, kfd::TOPOLOGY_DIR);
    inventory.warnings.extend(topology.problems.iter().cloned());
    let kfd_gpus = topology.gpus();
    let mut render_to_card = partition_drm_nodes(host, &mut inventory.warnings);

    let (pci_dir, bdfs) = match amdgpu_functions(host) {
        Ok(found) => found,
        Err(e) => {
            let error = format!("cannot list the GPUs bound to amdgpu: {e}");
            inventory.warnings.push(error.clone());
            incomplete.push(error);
            (AMDGPU_PCI_DIRS[0], Vec::new())
        }
    };
    // KFD nodes that could not be read: a GPU without a KFD node may be one.
    let kfd_unread: Vec<&String> = topology
        .problems
        .iter()
        .filter(|p| p.contains("properties"))
        .collect();
    let mut claimed = vec![false; kfd_gpus.len()];
    for bdf in bdfs {
        let mut gpu = match read_pci_function(host, &format!("{pci_dir}/{bdf}"), &bdf) {
            Ok(gpu) => gpu,
            Err(e) => {
                inventory
                    .warnings
                    .push(format!("skipped GPU {bdf}: {e} (it may have been removed)"));
                continue;
            }
        };
        if let (Some(card), Some(minor)) = (gpu.card, gpu.render_minor) {
            render_to_card.insert(
                minor,
                DrmNode {
                    card,
                    platform_device: None,
                },
            );
        }
        let matched = kfd_gpus
            .iter()
            .position(|k| k.bdf() == gpu.bdf)
            .or_else(|| {
                let unique = gpu.unique_id?;
                kfd_gpus
                    .iter()
                    .position(|k| k.primary().props.unique_id == unique)
            });
        match matched {
            Some(index) => {
                claimed[index] = true;
                join_kfd(&mut gpu, &topology, &kfd_gpus[index], &render_to_card);
            }
            None if inventory.driver.kfd_present && !kfd_unread.is_empty() => {
                gpu.problems.push(format!(
                    "no KFD topology node; unreadable KFD nodes: {}",
                    kfd_unread
                        .iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ))
            }
            None if inventory.driver.kfd_present => gpu
                .problems
                .push("no KFD topology node: the GPU is not usable for compute".into()),
            None => {}
        }
        inventory.gpus.push(gpu);
    }
    for (kfd_gpu, claimed) in kfd_gpus.iter().zip(claimed) {
        if !claimed {
            inventory.warnings.push(format!(
                "KFD node {} ({}) has no amdgpu PCI function",
                kfd_gpu.primary().id,
                kfd_gpu.bdf()
            ));
        }
    }
    Discovery {
        inventory,
        incomplete,
    }
}

/// The driver's state. Whether the module and `/dev/kfd` exist decides what
/// the GPUs are, so not knowing is an `incomplete` scan; an unreadable version
/// is a warning.
fn driver_state(
    host: &dyn HostRead,
    incomplete: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> DriverState {
    let module = "/sys/module/amdgpu";
    let mut exists = |path: &str| {
        host.exists(path).unwrap_or_else(|e| {
            incomplete.push(e.to_string());
            false
        })
    };
    let (loaded, kfd_present) = (exists(module), exists("/dev/kfd"));
    let mut version = |name: &str| match host.read_optional_attr(&format!("{module}/{name}")) {
        Ok(value) => value.map(|v| truncate_to(v, MAX_TEXT_BYTES)),
        Err(e) if e.is_timeout() => {
            warnings.push(e.to_string());
            None
        }
        Err(_) => None,
    };
    DriverState {
        loaded,
        version: version("version"),
        srcversion: version("srcversion"),
        kfd_present,
    }
}

/// The amdgpu PCI functions, from the first of [`AMDGPU_PCI_DIRS`] that exists.
/// `Err` when a directory that exists cannot be listed: that is not "no GPUs".
fn amdgpu_functions(host: &dyn HostRead) -> Result<(&'static str, Vec<String>), HostError> {
    for dir in AMDGPU_PCI_DIRS {
        match host.list_dir(dir) {
            Ok(names) => return Ok((dir, names.into_iter().filter(|n| is_bdf(n)).collect())),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok((AMDGPU_PCI_DIRS[0], Vec::new()))
}

/// The DRM card of a render node, and the platform device that carries it when
/// it belongs to a partition.
#[derive(Clone, Debug, Default)]
struct DrmNode {
    card: u32,
    platform_device: Option<String>,
}

/// Render minor to DRM node for partition DRM nodes. Both `amdgpu_xcp_N` and
/// `amdgpu_xcp.N` are accepted: kernels differ in the spelling.
fn partition_drm_nodes(host: &dyn HostRead, warnings: &mut Vec<String>) -> BTreeMap<u32, DrmNode> {
    let mut map = BTreeMap::new();
    let entries = host.list_dir_or_empty(PLATFORM_DIR).unwrap_or_else(|e| {
        warnings.push(e.to_string());
        Vec::new()
    });
    let partitions: Vec<String> = entries
        .into_iter()
        .filter(|e| e.starts_with("amdgpu_xcp_") || e.starts_with("amdgpu_xcp."))
        .collect();
    // One request for all their listings (a CPX host has 56 partition
    // devices), not one each.
    let dirs: Vec<String> = partitions
        .iter()
        .map(|entry| format!("{PLATFORM_DIR}/{entry}/drm"))
        .collect();
    for (entry, listing) in partitions.into_iter().zip(host.list_dirs_or_empty(&dirs)) {
        if let Ok(names) = listing
            && let (Some(card), Some(minor)) = drm_nodes(&names)
        {
            map.insert(
                minor,
                DrmNode {
                    card,
                    platform_device: Some(entry),
                },
            );
        }
    }
    map
}

/// Picks `cardN` and `renderDN` out of a `drm/` directory listing.
fn drm_nodes(names: &[String]) -> (Option<u32>, Option<u32>) {
    let pick = |prefix: &str| {
        names
            .iter()
            .find_map(|n| n.strip_prefix(prefix).and_then(|rest| rest.parse().ok()))
    };
    (pick("card"), pick("renderD"))
}

/// Longest value kept for a string that flows into labels and metrics
/// (product name, VBIOS version, serial number, partition modes). Longer ones
/// are truncated and the GPU gets a problem saying so.
pub const MAX_TEXT_BYTES: usize = 256;
/// Longest value accepted as a number; a longer one is refused as a problem.
pub const MAX_NUMBER_BYTES: usize = 64;

/// `value` cut to at most `max` bytes, on a character boundary.
pub fn truncate_to(mut value: String, max: usize) -> String {
    if value.len() > max {
        let mut end = max;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
    value
}

/// Reads attributes of one device directory, turning unreadable optional values
/// into problems instead of failures, and bounding every value by its kind.
struct AttrReader<'a> {
    host: &'a dyn HostRead,
    dir: &'a str,
    problems: Vec<String>,
    /// Answers read ahead in one request ([`AttrReader::read_ahead`]), by
    /// file name; a name not among them is read on its own.
    ahead: BTreeMap<String, crate::host::Result<HostAnswer>>,
}

impl AttrReader<'_> {
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    /// Reads the files `names` of the directory in one request: a GPU has
    /// thirty-odd, and each request costs a hand-off to the bounded
    /// reader's threads and back.
    fn read_ahead(&mut self, names: impl IntoIterator<Item = (HostOp, String)>) {
        let wanted: Vec<(HostOp, String, String)> = names
            .into_iter()
            .map(|(op, name)| (op, self.path(&name), name))
            .collect();
        let requests: Vec<(HostOp, &str)> = wanted
            .iter()
            .map(|(op, path, _)| (*op, path.as_str()))
            .collect();
        let answers = self.host.read_many(&requests);
        for ((_, _, name), answer) in wanted.into_iter().zip(answers) {
            self.ahead.insert(name, answer);
        }
    }

    /// The file's text, `None` when it is absent or empty (as
    /// [`HostRead::read_optional_attr`]).
    fn raw(&mut self, name: &str) -> Option<String> {
        let read = match self.ahead.remove(name) {
            Some(Ok(HostAnswer::Text(value))) => Ok((!value.is_empty()).then_some(value)),
            Some(Ok(_)) => Err(HostError::wrong_answer(
                self.host.host().path(self.path(name)),
            )),
            Some(Err(e)) if e.is_not_found() => Ok(None),
            Some(Err(e)) => Err(e),
            None => self.host.read_optional_attr(&self.path(name)),
        };
        match read {
            Ok(value) => value,
            Err(e) => {
                self.problems.push(e.to_string());
                None
            }
        }
    }

    /// A listing of a subdirectory, read ahead or now.
    fn list(&mut self, name: &str) -> crate::host::Result<Vec<String>> {
        match self.ahead.remove(name) {
            Some(Ok(HostAnswer::Names(names))) => Ok(names),
            Some(Ok(_)) => Err(HostError::wrong_answer(
                self.host.host().path(self.path(name)),
            )),
            Some(Err(e)) => Err(e),
            None => self.host.list_dir(&self.path(name)),
        }
    }

    /// A string, at most [`MAX_TEXT_BYTES`].
    fn text(&mut self, name: &str) -> Option<String> {
        let value = self.raw(name)?;
        if value.len() > MAX_TEXT_BYTES {
            self.problems.push(format!(
                "{name}: {} bytes, longer than {MAX_TEXT_BYTES}; truncated",
                value.len()
            ));
            return Some(truncate_to(value, MAX_TEXT_BYTES));
        }
        Some(value)
    }

    /// The text of a number, at most [`MAX_NUMBER_BYTES`].
    fn number(&mut self, name: &str) -> Option<String> {
        let value = self.raw(name)?;
        if value.len() > MAX_NUMBER_BYTES {
            self.problems.push(format!(
                "{name}: {} bytes, too long for a number",
                value.len()
            ));
            return None;
        }
        Some(value)
    }

    fn parsed<T: FromStr>(&mut self, name: &str, expected: &str) -> Option<T> {
        let text = self.number(name)?;
        match text.parse() {
            Ok(value) => Some(value),
            Err(_) => {
                self.problems
                    .push(format!("{name}: {text:?} is not {expected}"));
                None
            }
        }
    }

    fn hex16(&mut self, name: &str) -> Option<u16> {
        let text = self.number(name)?;
        match parse_hex(&text).and_then(|v| u16::try_from(v).ok()) {
            Some(value) => Some(value),
            None => {
                self.problems
                    .push(format!("{name}: {text:?} is not a 16-bit hex number"));
                None
            }
        }
    }

    /// `SPX, DPX, QPX, CPX` (or `SPX DPX`) as lowercase modes.
    fn modes(&mut self, name: &str) -> Vec<String> {
        self.text(name)
            .map(|text| {
                text.split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(str::to_ascii_lowercase)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The attributes [`read_pci_function`] reads of a PCI function besides its
/// identity, read ahead in one request with its firmware versions and DRM
/// listing. One it reads and this list lacks costs a request of its own
/// (the request count test in this module sees it).
const PCI_FUNCTION_ATTRS: [&str; 15] = [
    "revision",
    "subsystem_vendor",
    "subsystem_device",
    "product_name",
    "product_number",
    "manufacturer",
    "serial_number",
    "vbios_version",
    "numa_node",
    "mem_info_vram_total",
    "unique_id",
    modes::COMPUTE_ATTR,
    modes::MEMORY_ATTR,
    "available_compute_partition",
    "available_memory_partition",
];

/// Reads one PCI function. `Err` when its identity cannot be read (it vanished, the
/// directory is broken) or is not an AMD device: amdgpu binds nothing else. An
/// identity file that hangs is a problem, not a reason to drop the GPU: it is
/// still bound, and dropping it would publish it as removed.
fn read_pci_function(host: &dyn HostRead, dir: &str, bdf: &str) -> Result<Gpu, HostError> {
    let mut problems = Vec::new();
    let vendor_path = format!("{dir}/vendor");
    match host.read_hex(&vendor_path) {
        Ok(id) if id == u64::from(AMD_VENDOR_ID) => {}
        Ok(id) => {
            return Err(HostError::Parse {
                path: host.host().path(&vendor_path),
                value: format!("0x{id:04x}"),
                expected: "AMD's vendor id 0x1002",
            });
        }
        Err(e) if e.is_timeout() => problems.push(e.to_string()),
        Err(e) => return Err(e),
    }
    let device_id = match host.read_hex(&format!("{dir}/device")) {
        Ok(id) => id as u16,
        Err(e) if e.is_timeout() => {
            problems.push(e.to_string());
            0
        }
        Err(e) => return Err(e),
    };
    let mut attrs = AttrReader {
        host,
        dir,
        problems,
        ahead: BTreeMap::new(),
    };
    let firmware = FIRMWARE_ENGINES.map(|(stem, _)| format!("fw_version/{stem}_fw_version"));
    attrs.read_ahead(
        PCI_FUNCTION_ATTRS
            .iter()
            .map(|name| (HostOp::Read, (*name).to_owned()))
            .chain(firmware.into_iter().map(|file| (HostOp::Read, file)))
            .chain([(HostOp::List, "drm".to_owned())]),
    );
    let mut gpu = Gpu {
        bdf: bdf.to_ascii_lowercase(),
        vendor_id: AMD_VENDOR_ID,
        device_id,
        revision: attrs.hex16("revision"),
        subsystem_vendor_id: attrs.hex16("subsystem_vendor"),
        subsystem_device_id: attrs.hex16("subsystem_device"),
        product_name: attrs.text("product_name"),
        product_number: attrs.text("product_number"),
        manufacturer: attrs.text("manufacturer"),
        serial_number: attrs.text("serial_number"),
        vbios_version: attrs.text("vbios_version"),
        numa_node: attrs.parsed("numa_node", "an integer"),
        vram_bytes: attrs.parsed("mem_info_vram_total", "a byte count"),
        unique_id: attrs.number("unique_id").and_then(|t| parse_hex(&t)),
        compute_partition: attrs
            .text(modes::COMPUTE_ATTR)
            .map(|s| s.to_ascii_lowercase()),
        memory_partition: attrs
            .text(modes::MEMORY_ATTR)
            .map(|s| s.to_ascii_lowercase()),
        available_compute_partitions: attrs.modes("available_compute_partition"),
        available_memory_partitions: attrs.modes("available_memory_partition"),
        ..Gpu::default()
    };
    gpu.firmware = read_firmware(&mut attrs);
    match attrs.list("drm") {
        Ok(names) => (gpu.card, gpu.render_minor) = drm_nodes(&names),
        Err(e) if e.is_not_found() => attrs.problems.push("no DRM nodes (drm/ is missing)".into()),
        Err(e) => attrs.problems.push(e.to_string()),
    }
    gpu.problems = attrs.problems;
    Ok(gpu)
}

/// Firmware engines the reference labeller reports: the sysfs file stem under
/// `fw_version/` and the name the reference gives it.
pub const FIRMWARE_ENGINES: [(&str, &str); 10] = [
    ("vce", "VCE"),
    ("uvd", "UVD"),
    ("mc", "MC"),
    ("me", "ME"),
    ("pfp", "PFP"),
    ("ce", "CE"),
    ("rlc", "RLC"),
    ("mec", "MEC"),
    ("smc", "SMC"),
    ("sdma", "SDMA0"),
];

/// Reads `fw_version/<engine>_fw_version` (`0x%08x`). Engines a GPU lacks have
/// no file; that is normal and not a problem.
fn read_firmware(attrs: &mut AttrReader<'_>) -> BTreeMap<String, u32> {
    let mut firmware = BTreeMap::new();
    for (stem, name) in FIRMWARE_ENGINES {
        let file = format!("fw_version/{stem}_fw_version");
        let Some(text) = attrs.number(&file) else {
            continue;
        };
        match parse_hex(&text).and_then(|v| u32::try_from(v).ok()) {
            Some(version) => {
                firmware.insert(name.to_owned(), version);
            }
            None => attrs
                .problems
                .push(format!("{file}: {text:?} is not a 32-bit hex number")),
        }
    }
    firmware
}

/// Fills in what KFD knows about a GPU: compute size, hive, partitions and links.
fn join_kfd(
    gpu: &mut Gpu,
    topology: &kfd::KfdTopology,
    kfd_gpu: &kfd::KfdGpu<'_>,
    render_to_card: &BTreeMap<u32, DrmNode>,
) {
    let primary = kfd_gpu.primary();
    let props = &primary.props;
    gpu.kfd_node = Some(primary.id);
    if gpu.device_id == 0 {
        // The PCI `device` file did not answer; KFD reports the same id.
        gpu.device_id = props.device_id as u16;
    }
    gpu.simd_count = u32::try_from(kfd_gpu.simd_count()).ok();
    gpu.cu_count = kfd_gpu.cu_count().and_then(|c| u32::try_from(c).ok());
    gpu.xcc_count = kfd_gpu.xcc_count().and_then(|c| u32::try_from(c).ok());
    gpu.gfx_target_version = u32::try_from(props.gfx_target_version).ok();
    gpu.hive_id = (props.hive_id != 0).then_some(props.hive_id);
    if gpu.unique_id.is_none() && props.unique_id != 0 {
        gpu.unique_id = Some(props.unique_id);
    }
    if gpu.vram_bytes.is_none() {
        gpu.vram_bytes = kfd_gpu
            .nodes
            .iter()
            .map(|n| n.vram_bytes)
            .sum::<Option<u64>>();
    }
    // KFD carries the MEC and SDMA versions too: a fallback when sysfs has no
    // fw_version/ directory (older kernels, some virtual functions).
    for (name, version) in [("MEC", props.fw_version), ("SDMA0", props.sdma_fw_version)] {
        if let Some(version) = version.and_then(|v| u32::try_from(v).ok()) {
            gpu.firmware.entry(name.to_owned()).or_insert(version);
        }
    }
    let kfd_minor = props.drm_render_minor.and_then(|m| u32::try_from(m).ok());
    match (gpu.render_minor, kfd_minor) {
        (None, minor) => gpu.render_minor = minor,
        (Some(pci), Some(kfd)) if pci != kfd => gpu.problems.push(format!(
            "render minor {pci} from drm/ differs from {kfd} in KFD node {}",
            primary.id
        )),
        _ => {}
    }
    if kfd_gpu.nodes.len() > 1 {
        gpu.partitions = kfd_gpu
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let minor = node
                    .props
                    .drm_render_minor
                    .and_then(|m| u32::try_from(m).ok());
                let drm = minor.and_then(|m| render_to_card.get(&m));
                Partition {
                    id: index as u32,
                    card: drm.map(|d| d.card),
                    render_minor: minor,
                    kfd_node: Some(node.id),
                    platform_device: drm.and_then(|d| d.platform_device.clone()),
                }
            })
            .collect();
        gpu.partition_sizes = kfd_gpu.nodes.iter().map(|node| node.size()).collect();
    }
    gpu.links = topology.links_of(kfd_gpu);
    for node in &kfd_gpu.nodes {
        gpu.problems.extend(node.problems.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Counts the requests a scan makes of its host (a single read is one,
    /// a batch is one), and answers batches whole (`batched`) or one read
    /// at a time.
    struct Counted<'a> {
        host: &'a dyn HostRead,
        batched: bool,
        requests: Cell<usize>,
    }

    impl<'a> Counted<'a> {
        fn new(host: &'a dyn HostRead, batched: bool) -> Self {
            Self {
                host,
                batched,
                requests: Cell::new(0),
            }
        }

        fn count(&self) {
            self.requests.set(self.requests.get() + 1);
        }
    }

    impl HostRead for Counted<'_> {
        fn host(&self) -> &HostRoot {
            self.host.host()
        }
        fn read_attr(&self, path: &str) -> crate::host::Result<String> {
            self.count();
            self.host.read_attr(path)
        }
        fn list_dir(&self, path: &str) -> crate::host::Result<Vec<String>> {
            self.count();
            self.host.list_dir(path)
        }
        fn exists(&self, path: &str) -> crate::host::Result<bool> {
            self.count();
            self.host.exists(path)
        }
        fn read_many(&self, requests: &[(HostOp, &str)]) -> Vec<crate::host::Result<HostAnswer>> {
            if self.batched {
                self.count();
                return self.host.read_many(requests);
            }
            crate::host::read_each(self, requests)
        }
    }

    /// Each request is a hand-off to the reader's threads and back; a scan
    /// of a partitioned host once made over a thousand of them, a minute
    /// apart on an idle node.
    #[test]
    fn a_scan_of_a_partitioned_host_asks_in_few_requests_and_finds_what_single_reads_find() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = crate::simulate::SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap();
        crate::simulate::write_host(&host, &spec).unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let (batched, single) = bounded::run_bounded(&reader, Limits::default(), |h| {
            let (batched, single) = (Counted::new(h, true), Counted::new(h, false));
            let found = (discover_with(&batched), discover_with(&single));
            (
                (found.0, batched.requests.get()),
                (found.1, single.requests.get()),
            )
        })
        .unwrap()
        .0;
        assert_eq!(batched.0.inventory, single.0.inventory);
        assert_eq!(batched.0.inventory.gpus.len(), 8);
        assert!(single.1 > 1_000, "one read at a time: {}", single.1);
        assert!(batched.1 < 40, "{} requests", batched.1);
    }

    #[test]
    fn drm_listing_yields_card_and_render_minor() {
        let names: Vec<String> = ["card3", "controlD67", "renderD131"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(drm_nodes(&names), (Some(3), Some(131)));
        assert_eq!(drm_nodes(&[]), (None, None));
    }
}
