//! Resource naming and device IDs: which `amd.com/...` resources this node offers
//! and which devices each one advertises, as a pure function of the inventory.
//!
//! This module owns the naming rules and the device ID scheme. It must not do
//! I/O: the one host fact it needs beyond the inventory (the names of the
//! `amdgpu_xcp_N` platform devices behind partitions) is passed in.
//!
//! Naming (`resource_naming_strategy`, as in AMD's device plugin):
//! - `single`: every device is `amd.com/gpu`. When partitionable GPUs run different
//!   partition layouts (say two in `cpx_nps4`, the rest in `spx_nps1`) a single
//!   resource would mix unequal devices, so the plan reports a [`LayoutConflict`]
//!   and leaves all partitionable GPUs out: `amd.com/gpu` then carries only the
//!   GPUs without partition support (often none). The resource itself is always
//!   offered, possibly with zero devices, so that the node's capacity drops to
//!   what can really be handed out rather than going stale.
//! - `mixed`: one resource per `<compute>_<memory>` layout (`amd.com/cpx_nps4`,
//!   `amd.com/spx_nps1`); a resource exists only while it has devices.
//! - In both, GPUs without partition support, and partitionable GPUs whose
//!   current layout could not be read, are `amd.com/gpu`.
//!
//! Device IDs follow AMD's device plugin so that kubelet checkpoints and tools
//! that read pod resources keep working when a node switches plugins:
//! - a whole GPU is its PCI address (`0000:05:00.0`);
//! - partition 0 of a partitioned GPU lives on the PCI function itself and is
//!   also its PCI address;
//! - every other partition is the name of the platform device the kernel created
//!   for it (`amdgpu_xcp_12`, or `amdgpu_xcp.12` on kernels that spell it so),
//!   found through its render node;
//! - when that name is unknown (no such platform device visible), the ID is
//!   `<pci address>-p<index>` (`0000:05:00.0-p3`): stable and unique, just not
//!   AMD's spelling.
//!
//! All IDs are at most 63 characters, as the kubelet requires.
//!
//! Sharing (time-slicing, [`shared_plan`]): each device is advertised
//! `replicas` times as `<id>::<n>` (n from 0), with its parent's NUMA node,
//! DRM nodes and so its health; with renaming, the resource is
//! `amd.com/<name>.shared`. [`parent_id`] maps a replica back.

use std::collections::{BTreeMap, BTreeSet};

use crate::device::{Gpu, Inventory};

/// Vendor prefix of every resource name.
pub const RESOURCE_NAMESPACE: &str = "amd.com";
/// Short name of the whole-GPU resource.
pub const GPU_RESOURCE: &str = "gpu";

/// How resources are named (`devicePluginArguments.resource_naming_strategy`);
/// see the module documentation. The API owns the type and its parsing.
pub use crate::api::ResourceNamingStrategy;
/// Sharing (`devicePluginArguments.time_slicing_*`); the API owns it.
pub use crate::api::TimeSlicing;

/// Between a device's ID and its replica number in a replica's ID.
pub const REPLICA_SEPARATOR: &str = "::";
/// What renaming adds to a shared resource's name.
pub const SHARED_SUFFIX: &str = ".shared";

/// Host platform devices behind partitions: render minor → `amdgpu_xcp_N`.
pub type XcpNames = BTreeMap<u32, String>;

/// The platform device names discovery found for the inventory's partitions.
pub fn xcp_names_of(inventory: &Inventory) -> XcpNames {
    inventory
        .gpus
        .iter()
        .flat_map(|g| &g.partitions)
        .filter_map(|p| Some((p.render_minor?, p.platform_device.clone()?)))
        .collect()
}

/// One allocatable device: a whole GPU or one partition of a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginDevice {
    /// The ID advertised to the kubelet.
    pub id: String,
    /// PCI address of the GPU the device is (or is part of).
    pub gpu_bdf: String,
    /// Partition index within the GPU; `None` for a whole GPU.
    pub partition: Option<u32>,
    /// NUMA node; `None` when the kernel reports none (`-1`) or it is unknown.
    pub numa_node: Option<i64>,
    /// DRM card index (`/dev/dri/cardN`).
    pub card: Option<u32>,
    /// DRM render minor (`/dev/dri/renderDN`).
    pub render_minor: Option<u32>,
}

impl PluginDevice {
    /// Host paths of the device's DRM nodes that are known, card first.
    pub fn dri_nodes(&self) -> Vec<String> {
        let mut nodes = Vec::with_capacity(2);
        if let Some(card) = self.card {
            nodes.push(format!("/dev/dri/card{card}"));
        }
        if let Some(minor) = self.render_minor {
            nodes.push(format!("/dev/dri/renderD{minor}"));
        }
        nodes
    }
}

/// Partitionable GPUs disagree on their partition layout under the `single`
/// strategy. The caller reports it (Event, agent status); it is not fatal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "resource naming strategy 'single' needs all partitionable GPUs in one partition layout, \
     found {}; these GPUs are not offered until they are repartitioned alike or the \
     strategy is 'mixed'",
    describe_profiles(.profiles)
)]
pub struct LayoutConflict {
    /// Layout (`cpx_nps4`) → PCI addresses of the GPUs in it.
    pub profiles: BTreeMap<String, Vec<String>>,
}

fn describe_profiles(profiles: &BTreeMap<String, Vec<String>>) -> String {
    profiles
        .iter()
        .map(|(profile, bdfs)| format!("{profile} on {}", bdfs.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The resources to offer, each with its devices in a stable order (by PCI
/// address, then partition index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourcePlan {
    /// Short resource name (`gpu`, `cpx_nps4`) → devices.
    pub resources: BTreeMap<String, Vec<PluginDevice>>,
    /// Set when the `single` strategy had to leave GPUs out.
    pub conflict: Option<LayoutConflict>,
}

impl ResourcePlan {
    pub fn device_count(&self) -> usize {
        self.resources.values().map(Vec::len).sum()
    }
}

/// `amd.com/<short>`.
pub fn resource_name(short: &str) -> String {
    format!("{RESOURCE_NAMESPACE}/{short}")
}

/// File name of the plugin socket for a resource: `amd.com_<short>.sock`.
pub fn socket_name(short: &str) -> String {
    format!("{RESOURCE_NAMESPACE}_{short}.sock")
}

/// The device a replica's ID names; any other ID is its own. Device IDs
/// never contain [`REPLICA_SEPARATOR`] (PCI addresses, `amdgpu_xcp_N`,
/// `<address>-pN`).
pub fn parent_id(id: &str) -> &str {
    id.split_once(REPLICA_SEPARATOR)
        .map_or(id, |(parent, _)| parent)
}

/// `plan` as advertised with `sharing`: unchanged without sharing; else each
/// device `replicas` times (replicas of one device next to each other) and,
/// with renaming, every resource named `<short>.shared`. Pure.
pub fn shared_plan(plan: &ResourcePlan, sharing: &TimeSlicing) -> ResourcePlan {
    if !sharing.is_shared() {
        return plan.clone();
    }
    let resources = plan
        .resources
        .iter()
        .map(|(short, devices)| {
            let name = if sharing.rename {
                format!("{short}{SHARED_SUFFIX}")
            } else {
                short.clone()
            };
            let replicas = devices
                .iter()
                .flat_map(|device| {
                    (0..sharing.replicas).map(move |n| PluginDevice {
                        id: format!("{}{REPLICA_SEPARATOR}{n}", device.id),
                        ..device.clone()
                    })
                })
                .collect();
            (name, replicas)
        })
        .collect();
    ResourcePlan {
        resources,
        conflict: plan.conflict.clone(),
    }
}

/// Decides resources and devices for an inventory. Pure.
pub fn plan_resources(
    inventory: &Inventory,
    strategy: ResourceNamingStrategy,
    xcp_names: &XcpNames,
) -> ResourcePlan {
    let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));

    let mut profiles: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for gpu in &gpus {
        if let Some(profile) = layout(gpu) {
            profiles.entry(profile).or_default().push(gpu.bdf.clone());
        }
    }

    let mut plan = ResourcePlan::default();
    let mut used_ids = BTreeSet::new();
    match strategy {
        ResourceNamingStrategy::Single => {
            if profiles.len() > 1 {
                plan.conflict = Some(LayoutConflict { profiles });
            }
            let devices = plan.resources.entry(GPU_RESOURCE.to_owned()).or_default();
            for gpu in &gpus {
                if plan.conflict.is_some() && layout(gpu).is_some() {
                    continue;
                }
                devices.extend(gpu_devices(gpu, xcp_names, &mut used_ids));
            }
        }
        ResourceNamingStrategy::Mixed => {
            for gpu in &gpus {
                let short = layout(gpu).unwrap_or_else(|| GPU_RESOURCE.to_owned());
                let devices = gpu_devices(gpu, xcp_names, &mut used_ids);
                if !devices.is_empty() {
                    plan.resources.entry(short).or_default().extend(devices);
                }
            }
        }
    }
    plan
}

/// The partition layouts of the inventory's GPUs, each once and sorted, as
/// the `mixed` strategy names its resources after them (`cpx_nps4` for
/// `amd.com/cpx_nps4`). GPUs without a layout (no partition support, or an
/// unreadable mode) add none. Pure.
pub fn layouts_of(inventory: &Inventory) -> Vec<String> {
    let layouts: BTreeSet<String> = inventory.gpus.iter().filter_map(layout).collect();
    layouts.into_iter().collect()
}

/// The partition layout a GPU counts under, or `None` when it has none (no
/// partition support, or the current mode could not be read).
fn layout(gpu: &Gpu) -> Option<String> {
    if !gpu.supports_compute_partitioning() {
        return None;
    }
    gpu.partition_profile()
        .filter(|p| is_resource_safe(p))
        .map(|p| p.to_ascii_lowercase())
}

/// Resource names are DNS-label-like; a layout read from sysfs must not smuggle
/// anything else into one.
fn is_resource_safe(profile: &str) -> bool {
    !profile.is_empty()
        && profile.len() <= 63
        && profile
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn gpu_devices(gpu: &Gpu, xcp_names: &XcpNames, used: &mut BTreeSet<String>) -> Vec<PluginDevice> {
    let numa_node = gpu.numa_node.filter(|n| *n >= 0).map(i64::from);
    let base = |id: String, partition, card, render_minor| PluginDevice {
        id,
        gpu_bdf: gpu.bdf.clone(),
        partition,
        numa_node,
        card,
        render_minor,
    };
    if gpu.partitions.is_empty() {
        if !used.insert(gpu.bdf.clone()) {
            return Vec::new();
        }
        return vec![base(gpu.bdf.clone(), None, gpu.card, gpu.render_minor)];
    }
    let mut partitions: Vec<_> = gpu.partitions.iter().collect();
    partitions.sort_by_key(|p| p.id);
    let mut out = Vec::with_capacity(partitions.len());
    for part in partitions {
        let fallback = format!("{}-p{}", gpu.bdf, part.id);
        let preferred = if part.id == 0 {
            Some(gpu.bdf.clone())
        } else {
            part.render_minor
                .and_then(|minor| xcp_names.get(&minor))
                .filter(|name| name.len() <= 63)
                .cloned()
        };
        // A name already taken (two partitions claiming one platform device)
        // would make the kubelet merge two devices; the fallback keeps both.
        let id = match preferred {
            Some(id) if !used.contains(&id) => id,
            _ => fallback,
        };
        if !used.insert(id.clone()) {
            continue;
        }
        out.push(base(id, Some(part.id), part.card, part.render_minor));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::{DriverState, Partition};

    pub(crate) fn whole_gpu(bdf: &str, numa: i32, card: u32) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            numa_node: Some(numa),
            card: Some(card),
            render_minor: Some(128 + card),
            ..Gpu::default()
        }
    }

    /// A partitionable GPU in `<compute>_<memory>` with `count` partitions
    /// (`count == 1` means SPX: no partition list).
    pub(crate) fn partitioned_gpu(
        bdf: &str,
        numa: i32,
        compute: &str,
        memory: &str,
        count: u32,
        first_card: u32,
    ) -> Gpu {
        let mut gpu = whole_gpu(bdf, numa, first_card);
        gpu.available_compute_partitions = vec!["spx".into(), "dpx".into(), "cpx".into()];
        gpu.available_memory_partitions = vec!["nps1".into(), "nps4".into()];
        gpu.compute_partition = Some(compute.into());
        gpu.memory_partition = Some(memory.into());
        if count > 1 {
            gpu.partitions = (0..count)
                .map(|i| Partition {
                    id: i,
                    card: Some(first_card + i),
                    render_minor: Some(128 + first_card + i),
                    kfd_node: Some(first_card + i + 1),
                    platform_device: None,
                })
                .collect();
        }
        gpu
    }

    fn inventory(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            driver: DriverState {
                loaded: true,
                ..DriverState::default()
            },
            gpus,
            warnings: vec![],
        }
    }

    fn ids(devices: &[PluginDevice]) -> Vec<&str> {
        devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn whole_gpus_are_named_gpu_and_identified_by_pci_address() {
        let inv = inventory(vec![
            whole_gpu("0000:c1:00.0", 1, 1),
            whole_gpu("0000:05:00.0", 0, 0),
        ]);
        for strategy in [
            ResourceNamingStrategy::Single,
            ResourceNamingStrategy::Mixed,
        ] {
            let plan = plan_resources(&inv, strategy, &XcpNames::new());
            assert_eq!(plan.resources.len(), 1, "{strategy}");
            assert_eq!(
                ids(&plan.resources["gpu"]),
                ["0000:05:00.0", "0000:c1:00.0"],
                "sorted by PCI address"
            );
            assert_eq!(plan.conflict, None);
        }
    }

    /// An MI300X platform in CPX/NPS4: 8 GPUs of 8 partitions.
    fn eight_cpx_nps4_gpus() -> Vec<Gpu> {
        (0..8)
            .map(|i| {
                partitioned_gpu(
                    &format!("0000:{:02x}:00.0", i + 1),
                    0,
                    "cpx",
                    "nps4",
                    8,
                    i * 8,
                )
            })
            .collect()
    }

    #[test]
    fn single_offers_every_partition_as_gpu() {
        let gpus = eight_cpx_nps4_gpus();
        let plan = plan_resources(
            &inventory(gpus),
            ResourceNamingStrategy::Single,
            &XcpNames::new(),
        );
        assert_eq!(plan.resources.keys().collect::<Vec<_>>(), ["gpu"]);
        assert_eq!(plan.resources["gpu"].len(), 64);
        assert_eq!(plan.conflict, None);
    }

    #[test]
    fn single_with_no_gpus_still_offers_an_empty_gpu_resource() {
        let plan = plan_resources(
            &inventory(vec![]),
            ResourceNamingStrategy::Single,
            &XcpNames::new(),
        );
        assert_eq!(plan.resources.get("gpu"), Some(&vec![]));
    }

    #[test]
    fn single_reports_heterogeneous_layouts_and_leaves_partitionable_gpus_out() {
        let inv = inventory(vec![
            partitioned_gpu("0000:05:00.0", 0, "cpx", "nps4", 8, 0),
            partitioned_gpu("0000:15:00.0", 0, "spx", "nps1", 1, 8),
            whole_gpu("0000:75:00.0", 1, 9),
        ]);
        let plan = plan_resources(&inv, ResourceNamingStrategy::Single, &XcpNames::new());
        let conflict = plan.conflict.clone().expect("conflict");
        assert_eq!(
            conflict.profiles,
            BTreeMap::from([
                ("cpx_nps4".to_owned(), vec!["0000:05:00.0".to_owned()]),
                ("spx_nps1".to_owned(), vec!["0000:15:00.0".to_owned()]),
            ])
        );
        let message = conflict.to_string();
        assert!(message.contains("cpx_nps4 on 0000:05:00.0"), "{message}");
        assert_eq!(ids(&plan.resources["gpu"]), ["0000:75:00.0"]);
    }

    #[test]
    fn mixed_names_one_resource_per_layout() {
        let inv = inventory(vec![
            partitioned_gpu("0000:05:00.0", 0, "cpx", "nps4", 8, 0),
            partitioned_gpu("0000:15:00.0", 0, "spx", "nps1", 1, 8),
            whole_gpu("0000:75:00.0", 1, 9),
        ]);
        let plan = plan_resources(&inv, ResourceNamingStrategy::Mixed, &XcpNames::new());
        assert_eq!(plan.conflict, None);
        assert_eq!(
            plan.resources.keys().collect::<Vec<_>>(),
            ["cpx_nps4", "gpu", "spx_nps1"]
        );
        assert_eq!(plan.resources["cpx_nps4"].len(), 8);
        assert_eq!(ids(&plan.resources["spx_nps1"]), ["0000:15:00.0"]);
        assert_eq!(ids(&plan.resources["gpu"]), ["0000:75:00.0"]);
    }

    #[test]
    fn layouts_are_the_mixed_strategy_s_resource_names() {
        let mut unreadable = partitioned_gpu("0000:25:00.0", 0, "spx", "nps1", 1, 9);
        unreadable.memory_partition = None;
        let inv = inventory(vec![
            partitioned_gpu("0000:05:00.0", 0, "cpx", "nps4", 8, 0),
            partitioned_gpu("0000:15:00.0", 0, "SPX", "NPS1", 1, 8),
            partitioned_gpu("0000:35:00.0", 0, "cpx", "nps4", 8, 10),
            unreadable,
            whole_gpu("0000:75:00.0", 1, 18),
        ]);
        assert_eq!(layouts_of(&inv), ["cpx_nps4", "spx_nps1"]);
        let plan = plan_resources(&inv, ResourceNamingStrategy::Mixed, &XcpNames::new());
        let mut named: Vec<&String> = plan
            .resources
            .keys()
            .filter(|k| *k != GPU_RESOURCE)
            .collect();
        named.sort();
        assert_eq!(named, layouts_of(&inv).iter().collect::<Vec<_>>());
        assert!(layouts_of(&inventory(vec![whole_gpu("0000:75:00.0", 1, 9)])).is_empty());
    }

    #[test]
    fn partitionable_gpu_with_unreadable_layout_is_a_gpu() {
        let mut gpu = partitioned_gpu("0000:05:00.0", 0, "spx", "nps1", 1, 0);
        gpu.memory_partition = None;
        let plan = plan_resources(
            &inventory(vec![gpu]),
            ResourceNamingStrategy::Mixed,
            &XcpNames::new(),
        );
        assert_eq!(ids(&plan.resources["gpu"]), ["0000:05:00.0"]);
    }

    #[test]
    fn layouts_that_are_not_resource_safe_are_ignored() {
        let mut gpu = partitioned_gpu("0000:05:00.0", 0, "spx", "nps1", 1, 0);
        gpu.compute_partition = Some("sp x/../".into());
        let plan = plan_resources(
            &inventory(vec![gpu]),
            ResourceNamingStrategy::Mixed,
            &XcpNames::new(),
        );
        assert_eq!(plan.resources.keys().collect::<Vec<_>>(), ["gpu"]);
    }

    #[test]
    fn partition_ids_follow_amd_naming_with_a_stable_fallback() {
        let gpu = partitioned_gpu("0000:05:00.0", 0, "cpx", "nps4", 3, 0);
        // Render minors 128, 129, 130; only 129 has a platform device.
        let xcp = XcpNames::from([(129, "amdgpu_xcp_0".to_owned())]);
        let plan = plan_resources(&inventory(vec![gpu]), ResourceNamingStrategy::Mixed, &xcp);
        let devices = &plan.resources["cpx_nps4"];
        assert_eq!(
            ids(devices),
            ["0000:05:00.0", "amdgpu_xcp_0", "0000:05:00.0-p2"]
        );
        assert_eq!(devices[1].partition, Some(1));
        assert_eq!(
            devices[1].dri_nodes(),
            ["/dev/dri/card1", "/dev/dri/renderD129"]
        );
    }

    #[test]
    fn duplicate_platform_names_do_not_merge_devices() {
        let gpu = partitioned_gpu("0000:05:00.0", 0, "cpx", "nps4", 3, 0);
        let xcp = XcpNames::from([
            (129, "amdgpu_xcp_0".to_owned()),
            (130, "amdgpu_xcp_0".to_owned()),
        ]);
        let plan = plan_resources(&inventory(vec![gpu]), ResourceNamingStrategy::Single, &xcp);
        assert_eq!(
            ids(&plan.resources["gpu"]),
            ["0000:05:00.0", "amdgpu_xcp_0", "0000:05:00.0-p2"]
        );
    }

    #[test]
    fn numa_minus_one_means_no_topology() {
        let plan = plan_resources(
            &inventory(vec![
                whole_gpu("0000:05:00.0", -1, 0),
                whole_gpu("0000:06:00.0", 3, 1),
            ]),
            ResourceNamingStrategy::Single,
            &XcpNames::new(),
        );
        let numa: Vec<_> = plan.resources["gpu"].iter().map(|d| d.numa_node).collect();
        assert_eq!(numa, [None, Some(3)]);
    }

    #[test]
    fn replicas_are_numbered_under_their_device_and_renaming_adds_shared() {
        let gpus = eight_cpx_nps4_gpus();
        let plan = plan_resources(
            &inventory(gpus),
            ResourceNamingStrategy::Mixed,
            &XcpNames::new(),
        );
        let off = TimeSlicing::default();
        assert_eq!(shared_plan(&plan, &off), plan, "one replica is no sharing");
        let sharing = TimeSlicing {
            replicas: 8,
            ..TimeSlicing::default()
        };
        let shared = shared_plan(&plan, &sharing);
        let devices = &shared.resources["cpx_nps4"];
        assert_eq!(devices.len(), 512);
        let ids: BTreeSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids.len(), 512, "unique");
        assert!(devices.iter().all(|d| d.id.len() <= 63));
        let parent = &plan.resources["cpx_nps4"][9];
        for n in 0..8 {
            let replica = &devices[9 * 8 + n];
            assert_eq!(replica.id, format!("{}::{n}", parent.id));
            assert_eq!(parent_id(&replica.id), parent.id);
            assert_eq!(
                (
                    replica.gpu_bdf.as_str(),
                    replica.partition,
                    replica.dri_nodes()
                ),
                (
                    parent.gpu_bdf.as_str(),
                    parent.partition,
                    parent.dri_nodes()
                )
            );
        }
        assert_eq!(parent_id("0000:05:00.0"), "0000:05:00.0");
        let renamed = shared_plan(
            &plan,
            &TimeSlicing {
                rename: true,
                ..sharing
            },
        );
        assert_eq!(
            renamed.resources.keys().collect::<Vec<_>>(),
            ["cpx_nps4.shared"]
        );
        assert_eq!(resource_name("gpu.shared"), "amd.com/gpu.shared");
    }

    #[test]
    fn names_and_sockets() {
        assert_eq!(resource_name("cpx_nps4"), "amd.com/cpx_nps4");
        assert_eq!(socket_name("gpu"), "amd.com_gpu.sock");
    }
}
