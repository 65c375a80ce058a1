//! KFD topology: `/sys/class/kfd/kfd/topology/nodes/*`.
//!
//! The kernel's compute driver (KFD) describes every CPU and GPU agent as a
//! topology node with a `properties` file of `key value` lines, plus memory banks
//! and links to other nodes. A GPU split into partitions shows one node per
//! partition; the partitions of one physical GPU share `unique_id` and differ in
//! the function bits of `location_id`.
//!
//! This module parses nodes and groups them into physical GPUs. It does not know
//! about PCI or DRM; `discover` joins those in.

use std::collections::BTreeMap;

use super::model::{Link, LinkKind, NodeSize, format_bdf, split_location_id};
use crate::host::HostRead;

pub const TOPOLOGY_DIR: &str = "/sys/class/kfd/kfd/topology";

/// The subset of a node's `properties` that discovery uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeProperties {
    pub cpu_cores_count: u64,
    pub simd_count: u64,
    pub simd_per_cu: u64,
    pub gfx_target_version: u64,
    pub vendor_id: u64,
    pub device_id: u64,
    pub location_id: u64,
    pub domain: u64,
    pub drm_render_minor: Option<u64>,
    pub hive_id: u64,
    pub unique_id: u64,
    pub num_xcc: Option<u64>,
    pub local_mem_size: u64,
    /// The MEC firmware version.
    pub fw_version: Option<u64>,
    pub sdma_fw_version: Option<u64>,
}

impl NodeProperties {
    /// Parses a `properties` file. Lines that do not parse are returned as problems;
    /// the rest are kept, so one bad line costs one value, not the node.
    pub fn parse(text: &str) -> (Self, Vec<String>) {
        let mut props = NodeProperties::default();
        let mut problems = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once(char::is_whitespace) else {
                problems.push(format!("property line {:?} has no value", shown(line)));
                continue;
            };
            let value = value.trim();
            let Ok(number) = value.parse::<u64>() else {
                problems.push(format!(
                    "property {}: {:?} is not a number",
                    shown(key),
                    shown(value)
                ));
                continue;
            };
            match key {
                "cpu_cores_count" => props.cpu_cores_count = number,
                "simd_count" => props.simd_count = number,
                "simd_per_cu" => props.simd_per_cu = number,
                "gfx_target_version" => props.gfx_target_version = number,
                "vendor_id" => props.vendor_id = number,
                "device_id" => props.device_id = number,
                "location_id" => props.location_id = number,
                "domain" => props.domain = number,
                "drm_render_minor" => props.drm_render_minor = Some(number),
                "hive_id" => props.hive_id = number,
                "unique_id" => props.unique_id = number,
                "num_xcc" => props.num_xcc = Some(number),
                "local_mem_size" => props.local_mem_size = number,
                "fw_version" => props.fw_version = Some(number),
                "sdma_fw_version" => props.sdma_fw_version = Some(number),
                _ => {}
            }
        }
        (props, problems)
    }

    /// GPUs have SIMDs; CPU agents report `simd_count 0`.
    pub fn is_gpu(&self) -> bool {
        self.simd_count > 0
    }

    /// The PCI address encoded in `domain` and `location_id`.
    pub fn bdf(&self) -> String {
        let (bus, device, function) = split_location_id(self.location_id);
        format_bdf(self.domain as u32, bus, device, function)
    }

    /// The PCI address with the function bits cleared: what the partitions of one
    /// GPU have in common when `unique_id` is not reported.
    fn slot(&self) -> (u64, u64) {
        (self.domain, self.location_id & !0x7)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdLink {
    pub kind: LinkKind,
    pub node_to: u32,
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdNode {
    pub id: u32,
    pub props: NodeProperties,
    /// Sum of the framebuffer memory banks (heap types 1 and 2), when reported.
    pub vram_bytes: Option<u64>,
    /// Links are read only for the first node of each physical GPU (see
    /// [`read_topology`]); empty elsewhere.
    pub links: Vec<KfdLink>,
    pub problems: Vec<String>,
}

/// All KFD nodes of a host, ordered by node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KfdTopology {
    pub nodes: Vec<KfdNode>,
    /// Problems that belong to no single node (an unreadable nodes directory).
    pub problems: Vec<String>,
}

/// One physical GPU as KFD sees it: its nodes, first the one whose `location_id`
/// has the lowest function number (partition 0).
#[derive(Clone, Debug)]
pub struct KfdGpu<'a> {
    pub nodes: Vec<&'a KfdNode>,
}

impl KfdNode {
    /// Compute units of this node alone: `simd_count / simd_per_cu`, `None`
    /// when `simd_per_cu` is 0 or absent.
    pub fn cu_count(&self) -> Option<u64> {
        let per_cu = self.props.simd_per_cu;
        (per_cu > 0).then(|| self.props.simd_count / per_cu)
    }
}

impl KfdNode {
    /// This node's own size. Compute units are `simd_count / simd_per_cu`
    /// (none when `simd_per_cu` is 0), as the reference labeller computes them.
    pub fn size(&self) -> NodeSize {
        let props = &self.props;
        NodeSize {
            cu_count: (props.simd_per_cu > 0)
                .then(|| props.simd_count / props.simd_per_cu)
                .and_then(|c| u32::try_from(c).ok()),
            simd_count: u32::try_from(props.simd_count).ok(),
            vram_bytes: self.vram_bytes,
            xcc_count: props.num_xcc.and_then(|n| u32::try_from(n).ok()),
        }
    }
}

impl KfdGpu<'_> {
    pub fn primary(&self) -> &KfdNode {
        self.nodes[0]
    }

    pub fn bdf(&self) -> String {
        self.primary().props.bdf()
    }

    pub fn simd_count(&self) -> u64 {
        self.nodes.iter().map(|n| n.props.simd_count).sum()
    }

    pub fn cu_count(&self) -> Option<u64> {
        let per_cu = self.primary().props.simd_per_cu;
        (per_cu > 0).then(|| self.simd_count() / per_cu)
    }

    /// XCCs across the GPU's nodes; `None` when a node does not say.
    pub fn xcc_count(&self) -> Option<u64> {
        self.nodes.iter().map(|n| n.props.num_xcc).sum()
    }
}

impl KfdTopology {
    pub fn gpu_nodes(&self) -> impl Iterator<Item = &KfdNode> {
        self.nodes.iter().filter(|n| n.props.is_gpu())
    }

    pub fn node(&self, id: u32) -> Option<&KfdNode> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Groups GPU nodes into physical GPUs: by `unique_id` when the kernel reports
    /// one, else by PCI slot (domain, bus and device). Ordered by PCI address.
    pub fn gpus(&self) -> Vec<KfdGpu<'_>> {
        let mut groups: BTreeMap<GroupKey, Vec<&KfdNode>> = BTreeMap::new();
        for node in self.gpu_nodes() {
            groups.entry(group_key(&node.props)).or_default().push(node);
        }
        let mut gpus: Vec<KfdGpu<'_>> = groups
            .into_values()
            .map(|mut nodes| {
                nodes.sort_by_key(|n| (n.props.location_id, n.id));
                KfdGpu { nodes }
            })
            .collect();
        gpus.sort_by_key(|g| (g.primary().props.domain, g.primary().props.location_id));
        gpus
    }
}

impl KfdTopology {
    /// The links from one physical GPU to the others, one per peer: the fastest kind
    /// seen and the lowest weight. Links to CPUs and between partitions of the same
    /// GPU are left out. Ordered fastest first, then by address.
    pub fn links_of(&self, gpu: &KfdGpu<'_>) -> Vec<Link> {
        let owner_bdf: BTreeMap<u32, String> = self
            .gpus()
            .iter()
            .flat_map(|g| {
                let bdf = g.bdf();
                g.nodes.iter().map(move |n| (n.id, bdf.clone()))
            })
            .collect();
        let own = gpu.bdf();
        let mut best: BTreeMap<String, (LinkKind, u32)> = BTreeMap::new();
        for link in gpu.nodes.iter().flat_map(|n| &n.links) {
            let Some(to_bdf) = owner_bdf.get(&link.node_to) else {
                continue;
            };
            if *to_bdf == own {
                continue;
            }
            best.entry(to_bdf.clone())
                .and_modify(|(kind, weight)| {
                    *kind = (*kind).min(link.kind);
                    *weight = (*weight).min(link.weight);
                })
                .or_insert((link.kind, link.weight));
        }
        let mut links: Vec<Link> = best
            .into_iter()
            .map(|(to_bdf, (kind, weight))| Link {
                to_bdf,
                kind,
                weight,
            })
            .collect();
        links.sort_by(|a, b| (a.kind, a.weight, &a.to_bdf).cmp(&(b.kind, b.weight, &b.to_bdf)));
        links
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum GroupKey {
    Unique(u64),
    Slot(u64, u64),
}

fn group_key(props: &NodeProperties) -> GroupKey {
    if props.unique_id != 0 {
        GroupKey::Unique(props.unique_id)
    } else {
        let (domain, slot) = props.slot();
        GroupKey::Slot(domain, slot)
    }
}

/// [`read_topology_with`] over `host` with discovery's default deadlines.
pub fn read_topology(host: &crate::host::HostRoot, dir: &str) -> KfdTopology {
    let reader = crate::host::reader::BoundedReader::new(host.clone(), 2);
    super::bounded::run_bounded(&reader, super::Limits::default(), |h| {
        read_topology_with(h, dir)
    })
    .map(|(topology, _)| topology)
    .unwrap_or_else(|e| KfdTopology {
        problems: vec![e],
        ..KfdTopology::default()
    })
}

/// Reads the topology under `dir` (normally [`TOPOLOGY_DIR`]). An absent directory
/// is an empty topology: the driver is not loaded, or this is not a GPU host.
///
/// To stay fast on partitioned hosts (an MI300X in CPX mode has 64 GPU nodes with
/// 63 links each), links are read only for the first node of each physical GPU:
/// partitions of one GPU share its links.
pub fn read_topology_with(host: &dyn HostRead, dir: &str) -> KfdTopology {
    let mut topology = KfdTopology::default();
    let nodes_dir = format!("{dir}/nodes");
    let names = match host.list_dir_or_empty(&nodes_dir) {
        Ok(names) => names,
        Err(e) => {
            topology.problems.push(e.to_string());
            return topology;
        }
    };
    // Each node's properties, the banks and the links are read in batches
    // (`HostRead::read_attrs`): a partitioned host's topology is over a
    // thousand files (an MI300X in CPX mode: 64 GPU nodes, 63 links for each
    // of 8 GPUs), and through the bounded reader each request is a hand-off
    // to its threads and back.
    let ids: Vec<u32> = names.iter().filter_map(|n| n.parse().ok()).collect();
    let properties: Vec<String> = ids
        .iter()
        .map(|id| format!("{nodes_dir}/{id}/properties"))
        .collect();
    for (&id, answer) in ids.iter().zip(host.read_attrs(&properties)) {
        match answer {
            Ok(text) => {
                let (props, problems) = NodeProperties::parse(&text);
                let problems = problems
                    .into_iter()
                    .map(|p| format!("kfd node {id}: {p}"))
                    .collect();
                topology.nodes.push(KfdNode {
                    id,
                    props,
                    vram_bytes: None,
                    links: Vec::new(),
                    problems,
                });
            }
            // A node that vanished mid-scan is simply gone.
            Err(e) if e.is_not_found() => {}
            Err(e) => topology.problems.push(format!("kfd node {id}: {e}")),
        }
    }
    topology.nodes.sort_by_key(|n| n.id);

    let primaries: Vec<u32> = topology.gpus().iter().map(|g| g.primary().id).collect();
    let gpus: Vec<&mut KfdNode> = topology
        .nodes
        .iter_mut()
        .filter(|n| n.props.is_gpu())
        .collect();
    read_vram(host, &nodes_dir, gpus);
    let linked: Vec<&mut KfdNode> = topology
        .nodes
        .iter_mut()
        .filter(|n| n.props.is_gpu() && primaries.contains(&n.id))
        .collect();
    read_links(host, &nodes_dir, linked);
    topology
}

/// Each GPU node's device memory, from its memory banks: one request lists
/// every node's banks, one reads them all.
fn read_vram(host: &dyn HostRead, nodes_dir: &str, mut nodes: Vec<&mut KfdNode>) {
    let dirs: Vec<String> = nodes
        .iter()
        .map(|n| format!("{nodes_dir}/{}/mem_banks", n.id))
        .collect();
    let mut banks: Vec<(usize, String)> = Vec::new();
    for (at, (listing, dir)) in host
        .list_dirs_or_empty(&dirs)
        .into_iter()
        .zip(&dirs)
        .enumerate()
    {
        match listing {
            Ok(names) => banks.extend(
                names
                    .into_iter()
                    .map(|name| (at, format!("{dir}/{name}/properties"))),
            ),
            Err(e) => nodes[at].problems.push(e.to_string()),
        }
    }
    let paths: Vec<String> = banks.iter().map(|(_, path)| path.clone()).collect();
    for ((at, _), answer) in banks.iter().zip(host.read_attrs(&paths)) {
        let node = &mut nodes[*at];
        let text = match answer {
            Ok(text) => text,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                node.problems.push(e.to_string());
                continue;
            }
        };
        let fields = parse_pairs(&text);
        // Heap types 1 (FB_PUBLIC) and 2 (FB_PRIVATE) are device memory.
        if matches!(fields.get("heap_type"), Some(1 | 2))
            && let Some(size) = fields.get("size_in_bytes")
        {
            *node.vram_bytes.get_or_insert(0u64) += size;
        }
    }
}

/// The IO and peer-to-peer links of `nodes`: one request lists the links
/// of them all, one reads them all.
fn read_links(host: &dyn HostRead, nodes_dir: &str, mut nodes: Vec<&mut KfdNode>) {
    let dirs: Vec<(usize, String)> = (0..nodes.len())
        .flat_map(|at| {
            let id = nodes[at].id;
            ["io_links", "p2p_links"].map(|kind| (at, format!("{nodes_dir}/{id}/{kind}")))
        })
        .collect();
    let dir_paths: Vec<String> = dirs.iter().map(|(_, dir)| dir.clone()).collect();
    let mut links: Vec<(usize, String)> = Vec::new();
    for ((at, dir), listing) in dirs.iter().zip(host.list_dirs_or_empty(&dir_paths)) {
        match listing {
            Ok(names) => links.extend(
                names
                    .into_iter()
                    .map(|name| (*at, format!("{dir}/{name}/properties"))),
            ),
            Err(e) => nodes[*at].problems.push(e.to_string()),
        }
    }
    let paths: Vec<String> = links.iter().map(|(_, path)| path.clone()).collect();
    for ((at, path), answer) in links.iter().zip(host.read_attrs(&paths)) {
        let node = &mut nodes[*at];
        match answer {
            Ok(text) => {
                let fields = parse_pairs(&text);
                match (fields.get("type"), fields.get("node_to")) {
                    (Some(&kind), Some(&to)) => node.links.push(KfdLink {
                        kind: LinkKind::from_kfd_type(kind),
                        node_to: to as u32,
                        weight: fields.get("weight").copied().unwrap_or(0) as u32,
                    }),
                    _ => {
                        let link = path.trim_end_matches("/properties");
                        node.problems
                            .push(format!("{link}: link without type or node_to"))
                    }
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => node.problems.push(format!("unreadable link: {e}")),
        }
    }
}

/// At most [`super::MAX_NUMBER_BYTES`] of a bad value, for a problem message.
fn shown(value: &str) -> String {
    super::truncate_to(value.to_owned(), super::MAX_NUMBER_BYTES)
}

/// Parses `key value` lines, skipping any that are not `word number`.
fn parse_pairs(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.trim().split_once(char::is_whitespace)?;
            Some((key, value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_keep_good_lines_and_report_bad_ones() {
        let (props, problems) = NodeProperties::parse(
            "simd_count 152\nlocation_id 1280\nhive_id 15188982192727901047\ndomain x\nlonely\n",
        );
        assert_eq!(props.simd_count, 152);
        assert_eq!(props.hive_id, 15188982192727901047);
        assert_eq!(props.bdf(), "0000:05:00.0");
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn nodes_group_by_unique_id_else_by_slot() {
        let node = |id, location_id, unique_id| KfdNode {
            id,
            props: NodeProperties {
                simd_count: 4,
                location_id,
                unique_id,
                ..Default::default()
            },
            vram_bytes: None,
            links: vec![],
            problems: vec![],
        };
        let topology = KfdTopology {
            nodes: vec![
                node(2, 1281, 7),
                node(3, 1280, 7),
                node(4, 9984, 0),
                node(5, 9985, 0),
                node(6, 18176, 9),
            ],
            problems: vec![],
        };
        let gpus = topology.gpus();
        assert_eq!(gpus.len(), 3);
        assert_eq!(
            gpus[0].primary().id,
            3,
            "partition 0 has the lowest function"
        );
        assert_eq!(gpus[0].nodes.len(), 2);
        assert_eq!(gpus[1].nodes.len(), 2);
        assert_eq!(gpus[2].bdf(), "0000:47:00.0");
    }

    #[test]
    fn a_node_size_is_its_own() {
        // One CPX partition of the MI300X capture: 152 SIMDs, 4 per CU.
        let (props, _) = NodeProperties::parse("simd_count 152\nsimd_per_cu 4\n");
        let mut node = KfdNode {
            id: 2,
            props,
            vram_bytes: Some(24 << 30),
            links: vec![],
            problems: vec![],
        };
        let size = node.size();
        assert_eq!(
            (size.cu_count, size.simd_count, size.vram_bytes),
            (Some(38), Some(152), Some(24 << 30))
        );
        node.props.simd_per_cu = 0;
        assert_eq!(node.size().cu_count, None);
    }
}
