//! GPU discovery: which AMD GPUs a host has, how they are partitioned and how
//! they are connected.
//!
//! Three kernel views are joined:
//! - PCI functions bound to amdgpu (`/sys/bus/pci/drivers/amdgpu/<bdf>`): identity,
//!   NUMA node, partition modes, DRM nodes;
//! - DRM nodes of partitions (`/sys/devices/platform/amdgpu_xcp_N/drm/*`);
//! - KFD topology: compute units, hive, partitions and links.
//!
//! Discovery is a read-only snapshot function over a [`HostRoot`]; it never fails
//! as a whole. What cannot be read becomes a `problems` entry on the GPU, or a
//! host-level warning when a whole GPU has to be skipped. Watching for changes
//! lives in [`watch`]. This module must not decide anything about what to do with
//! the GPUs (resources, labels, health): consumers own that.

pub mod fingerprint;
pub mod kfd;
pub mod model;
pub mod uevent;
pub mod unbound;
pub mod watch;

use std::collections::BTreeMap;
use std::str::FromStr;

pub use model::*;

use crate::host::{HostError, HostRoot, parse_hex};

/// Where the kernel lists PCI functions bound to amdgpu. The second spelling is
/// the module's view of the same set, present on hosts without `/sys/bus/pci/drivers`
/// mounted into a container.
const AMDGPU_PCI_DIRS: [&str; 2] = [
    "/sys/bus/pci/drivers/amdgpu",
    "/sys/module/amdgpu/drivers/pci:amdgpu",
];
const AMD_VENDOR_ID: u16 = 0x1002;
const PLATFORM_DIR: &str = "/sys/devices/platform";

/// Takes a snapshot of the host's GPUs.
pub fn discover(host: &HostRoot) -> Inventory {
    let mut inventory = Inventory {
        driver: driver_state(host),
        ..Inventory::default()
    };
    let topology = kfd::read_topology(host, kfd::TOPOLOGY_DIR);
    inventory.warnings.extend(topology.problems.iter().cloned());
    let kfd_gpus = topology.gpus();
    let mut render_to_card = partition_drm_nodes(host, &mut inventory.warnings);

    let (pci_dir, bdfs) = amdgpu_functions(host, &mut inventory.warnings);
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
    inventory
}

fn driver_state(host: &HostRoot) -> DriverState {
    let module = "/sys/module/amdgpu";
    DriverState {
        loaded: host.exists(module),
        version: host
            .read_optional_attr(format!("{module}/version"))
            .ok()
            .flatten(),
        srcversion: host
            .read_optional_attr(format!("{module}/srcversion"))
            .ok()
            .flatten(),
        kfd_present: host.exists("/dev/kfd"),
    }
}

/// The amdgpu PCI functions, from the first of [`AMDGPU_PCI_DIRS`] that exists.
fn amdgpu_functions(host: &HostRoot, warnings: &mut Vec<String>) -> (&'static str, Vec<String>) {
    for dir in AMDGPU_PCI_DIRS {
        match host.list_dir(dir) {
            Ok(names) => return (dir, names.into_iter().filter(|n| is_bdf(n)).collect()),
            Err(e) if e.is_not_found() => {}
            Err(e) => warnings.push(e.to_string()),
        }
    }
    (AMDGPU_PCI_DIRS[0], Vec::new())
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
fn partition_drm_nodes(host: &HostRoot, warnings: &mut Vec<String>) -> BTreeMap<u32, DrmNode> {
    let mut map = BTreeMap::new();
    let entries = host.list_dir_or_empty(PLATFORM_DIR).unwrap_or_else(|e| {
        warnings.push(e.to_string());
        Vec::new()
    });
    for entry in entries {
        if !(entry.starts_with("amdgpu_xcp_") || entry.starts_with("amdgpu_xcp.")) {
            continue;
        }
        if let Ok(names) = host.list_dir(format!("{PLATFORM_DIR}/{entry}/drm"))
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

/// Reads attributes of one device directory, turning unreadable optional values
/// into problems instead of failures.
struct AttrReader<'a> {
    host: &'a HostRoot,
    dir: &'a str,
    problems: Vec<String>,
}

impl AttrReader<'_> {
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }

    fn text(&mut self, name: &str) -> Option<String> {
        match self.host.read_optional_attr(self.path(name)) {
            Ok(value) => value,
            Err(e) => {
                self.problems.push(e.to_string());
                None
            }
        }
    }

    fn parsed<T: FromStr>(&mut self, name: &str, expected: &str) -> Option<T> {
        let text = self.text(name)?;
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
        let text = self.text(name)?;
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

/// Reads one PCI function. `Err` when its identity cannot be read (it vanished, the
/// directory is broken) or is not an AMD device: amdgpu binds nothing else.
fn read_pci_function(host: &HostRoot, dir: &str, bdf: &str) -> Result<Gpu, HostError> {
    let vendor_id = host.read_hex(format!("{dir}/vendor"))?;
    if vendor_id != u64::from(AMD_VENDOR_ID) {
        return Err(HostError::Parse {
            path: host.path(format!("{dir}/vendor")),
            value: format!("0x{vendor_id:04x}"),
            expected: "AMD's vendor id 0x1002",
        });
    }
    let device_id = host.read_hex(format!("{dir}/device"))?;
    let mut attrs = AttrReader {
        host,
        dir,
        problems: Vec::new(),
    };
    let mut gpu = Gpu {
        bdf: bdf.to_ascii_lowercase(),
        vendor_id: AMD_VENDOR_ID,
        device_id: device_id as u16,
        revision: attrs.hex16("revision"),
        subsystem_vendor_id: attrs.hex16("subsystem_vendor"),
        subsystem_device_id: attrs.hex16("subsystem_device"),
        product_name: attrs.text("product_name"),
        serial_number: attrs.text("serial_number"),
        vbios_version: attrs.text("vbios_version"),
        numa_node: attrs.parsed("numa_node", "an integer"),
        vram_bytes: attrs.parsed("mem_info_vram_total", "a byte count"),
        unique_id: attrs.text("unique_id").and_then(|t| parse_hex(&t)),
        compute_partition: attrs
            .text("current_compute_partition")
            .map(|s| s.to_ascii_lowercase()),
        memory_partition: attrs
            .text("current_memory_partition")
            .map(|s| s.to_ascii_lowercase()),
        available_compute_partitions: attrs.modes("available_compute_partition"),
        available_memory_partitions: attrs.modes("available_memory_partition"),
        ..Gpu::default()
    };
    gpu.firmware = read_firmware(&mut attrs);
    match host.list_dir(format!("{dir}/drm")) {
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
        let Some(text) = attrs.text(&file) else {
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
    gpu.simd_count = u32::try_from(kfd_gpu.simd_count()).ok();
    gpu.cu_count = kfd_gpu.cu_count().and_then(|c| u32::try_from(c).ok());
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
    }
    gpu.links = topology.links_of(kfd_gpu);
    for node in &kfd_gpu.nodes {
        gpu.problems.extend(node.problems.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
