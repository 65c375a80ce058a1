//! Partitions allocated on demand (`draDriver.autoPartition`): each
//! partitionable GPU offers every layout it can run as one partitionable
//! device per layout (KEP-4815), named and described as AMD's AutoPartition
//! (ROCm/k8s-gpu-dra-driver#88) names them, so that a claim written for it
//! works here unchanged:
//!
//! - `gpu-<index>-<compute>-<memory>` (`gpu-0-cpx-nps4`), where `index` is the
//!   GPU's place in PCI address order, as the partition profiles count GPUs;
//! - attributes `type`, `computePartition`, `memoryPartition`, `gpuIndex`,
//!   `pciAddr`, the standard ones and the GPU's common ones (no
//!   `partitionProfile`: that names the layout a GPU has, these are layouts
//!   it can take);
//! - capacity `partitions` (how many the layout makes), and `memory`,
//!   `computeUnits`, `simdUnits` as one partition's worth times that count.
//!   A layout of more than one partition takes several allocations, each of
//!   exactly one partition's worth (the request policy's default and only
//!   valid value), so that a claim's share is one partition;
//! - each consumes counter `partition-mode` (1) of the GPU's counter set
//!   `gpu-<index>-mutex`, whose value is 1. The scheduler charges a device
//!   that takes several allocations once, however many shares it hands out:
//!   it can allocate the eight CPX partitions of a GPU to eight claims, and
//!   never two layouts of one GPU at a time.
//!
//! The driver sets one memory mode for all of a node's GPUs, which counters
//! cannot say. So while any claim holds a layout device, every layout device
//! of another memory mode carries `gpu.amd.com/memory-partition-conflict=<the
//! node's mode>:NoExecute`, as AutoPartition taints it; and the layout
//! devices of a GPU that a failed change could not put back carry it until a
//! change succeeds.
//!
//! Also decided here: what a Prepare must write for a layout
//! ([`change_for`]), and which partitions a share gets ([`assign`]). Pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Counter, CounterSet, DeviceAttribute, DeviceCapacity,
    DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::device::modes;
use crate::device::{Gpu, Inventory};
use crate::partition::plan::{Assignment, Plan};

/// The counter every layout device of a GPU consumes one of.
pub const MUTEX_COUNTER: &str = "partition-mode";
/// The capacity that counts a layout's partitions.
pub const PARTITIONS: &str = "partitions";
/// AutoPartition's taint on layout devices that cannot be had now.
pub const CONFLICT_TAINT_KEY: &str = "gpu.amd.com/memory-partition-conflict";
/// `type` of a whole-GPU layout (SPX); the others are partitions.
const TYPE_GPU: &str = "amdgpu";
const TYPE_PARTITION: &str = "amdgpu-partition";

/// The layout a device stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The GPU's place in PCI address order.
    pub gpu_index: u32,
    /// Lower case, as named (`cpx`, `nps4`).
    pub compute: String,
    pub memory: String,
    /// Partitions the layout makes of the GPU.
    pub partitions: u32,
}

impl Layout {
    /// `cpx_nps4`: the profile name the rest of the operator uses.
    pub fn profile(&self) -> String {
        format!("{}_{}", self.compute, self.memory)
    }
}

/// `gpu-<index>-<compute>-<memory>`.
pub fn layout_name(index: u32, compute: &str, memory: &str) -> String {
    format!(
        "gpu-{index}-{}-{}",
        compute.to_ascii_lowercase(),
        memory.to_ascii_lowercase()
    )
}

/// `gpu-<index>-mutex`: the GPU's counter set.
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}-mutex")
}

/// Whether a GPU can be offered by layout: it names its modes and the modes
/// it offers, and has DRM nodes to check its health by.
pub fn partitionable(gpu: &Gpu) -> bool {
    gpu.supports_compute_partitioning()
        && gpu.supports_memory_partitioning()
        && gpu.compute_partition.is_some()
        && gpu.memory_partition.is_some()
}

/// The GPUs in PCI address order, as layouts number them.
pub fn ordered(inventory: &Inventory) -> Vec<&Gpu> {
    let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    gpus
}

/// Every (compute, memory) pair `gpu` offers and the driver runs, lower
/// case, in the order the GPU lists them.
pub fn layouts_of(gpu: &Gpu) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for memory in &gpu.available_memory_partitions {
        for compute in &gpu.available_compute_partitions {
            if modes::compatible(compute, memory) && modes::compute_partitions(compute).is_some() {
                out.push((compute.to_ascii_lowercase(), memory.to_ascii_lowercase()));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The profiles (`cpx_nps4`) of every layout the partitionable GPUs of
/// `inventory` offer, as the device plugin's `mixed` strategy names them:
/// what a node in this mode reports, so that the leader keeps a class
/// serving each. Sorted, each once.
pub fn offered_profiles(inventory: &Inventory) -> Vec<String> {
    let profiles: BTreeSet<String> = inventory
        .gpus
        .iter()
        .filter(|gpu| partitionable(gpu))
        .flat_map(layouts_of)
        .map(|(compute, memory)| format!("{compute}_{memory}"))
        .collect();
    profiles.into_iter().collect()
}

/// One partition's worth of each capacity of `gpu` in a layout of `count`.
pub fn capacity_of(gpu: &Gpu, count: u32) -> BTreeMap<String, DeviceCapacity> {
    let count = u64::from(count.max(1));
    let per = |whole: Option<u64>| whole.unwrap_or(0) / count;
    let mut out = BTreeMap::new();
    for (name, one) in [
        (PARTITIONS, 1),
        ("memory", per(gpu.vram_bytes)),
        ("computeUnits", per(gpu.cu_count.map(u64::from))),
        ("simdUnits", per(gpu.simd_count.map(u64::from))),
    ] {
        let policy = (count > 1).then(|| CapacityRequestPolicy {
            default: Some(Quantity(one.to_string())),
            valid_values: Some(vec![Quantity(one.to_string())]),
            valid_range: None,
        });
        out.insert(
            name.to_owned(),
            DeviceCapacity {
                value: Quantity((one * count).to_string()),
                request_policy: policy,
            },
        );
    }
    out
}

/// The attributes a layout device adds to its GPU's common ones.
pub fn layout_attributes(
    gpu: &Gpu,
    layout: &Layout,
    mut common: BTreeMap<String, DeviceAttribute>,
) -> BTreeMap<String, DeviceAttribute> {
    let string = |v: &str| DeviceAttribute {
        string: Some(v.to_owned()),
        ..DeviceAttribute::default()
    };
    common.remove("partitionProfile");
    let kind = if layout.partitions > 1 {
        TYPE_PARTITION
    } else {
        TYPE_GPU
    };
    common.insert("type".into(), string(kind));
    common.insert("computePartition".into(), string(&layout.compute));
    common.insert("memoryPartition".into(), string(&layout.memory));
    common.insert(
        "gpuIndex".into(),
        DeviceAttribute {
            int: Some(i64::from(layout.gpu_index)),
            ..DeviceAttribute::default()
        },
    );
    common.insert("pciAddr".into(), string(&gpu.bdf));
    common
}

/// The counter sets of the layout devices among `layouts`: one per GPU.
pub fn counter_sets<'a>(layouts: impl IntoIterator<Item = &'a Layout>) -> Vec<CounterSet> {
    let indexes: BTreeSet<u32> = layouts.into_iter().map(|l| l.gpu_index).collect();
    indexes
        .into_iter()
        .map(|index| CounterSet {
            name: counter_set_name(index),
            counters: BTreeMap::from([(MUTEX_COUNTER.to_owned(), one())]),
        })
        .collect()
}

/// What a layout device consumes of its GPU's counter set.
pub fn consumption(layout: &Layout) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(layout.gpu_index),
        counters: BTreeMap::from([(MUTEX_COUNTER.to_owned(), one())]),
    }
}

fn one() -> Counter {
    Counter {
        value: Quantity("1".into()),
    }
}

/// Which layout devices carry [`CONFLICT_TAINT_KEY`], with the taint's
/// value: every layout not of `held_memory` (the memory mode of the layouts
/// claims hold; `None` while none is held), and every layout of a GPU in
/// `stuck` (by index: a failed change left it in a layout no claim asked
/// for), whose value is then the GPU's memory mode now.
pub fn conflicts<'a>(
    layouts: impl IntoIterator<Item = (&'a str, &'a Layout)>,
    held_memory: Option<&str>,
    stuck: &BTreeMap<u32, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, layout) in layouts {
        if let Some(now) = stuck.get(&layout.gpu_index) {
            out.insert(name.to_owned(), now.to_ascii_lowercase());
        } else if let Some(held) = held_memory
            && !layout.memory.eq_ignore_ascii_case(held)
        {
            out.insert(name.to_owned(), held.to_ascii_lowercase());
        }
    }
    out
}

/// What holds a node's GPUs: for each GPU (by PCI address), the layout
/// devices and other devices prepared claims hold on it.
pub type Holds = BTreeMap<String, BTreeSet<String>>;

/// What a Prepare of `layout` must do on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The GPU runs the layout already.
    None,
    /// Write these modes; `reload` when a memory mode changes.
    Write { plan: Plan, reload: bool },
    /// It cannot be done now, and why (a claim holds what would change).
    Refused(String),
}

/// What putting `layout` on GPU `index` of `gpus` (in PCI address order)
/// needs, given what prepared claims hold. `device` is the layout's name:
/// holds of that very device (other shares of it) never block.
///
/// A compute change needs the GPU free; a memory change needs every GPU of
/// the node free (the driver sets one memory mode for all, and reloads).
/// On a memory change the other partitionable GPUs keep their compute mode
/// when it runs with the new memory mode, and otherwise take the one with the
/// most partitions that does, as the driver picks after a reload.
pub fn change_for(gpus: &[&Gpu], layout: &Layout, device: &str, holds: &Holds) -> Change {
    let Some(gpu) = gpus.get(layout.gpu_index as usize) else {
        return Change::Refused(format!("the node has no GPU {}", layout.gpu_index));
    };
    let now = |mode: &Option<String>| mode.as_deref().unwrap_or("").to_ascii_uppercase();
    let (compute_now, memory_now) = (now(&gpu.compute_partition), now(&gpu.memory_partition));
    let compute_changes = !layout.compute.eq_ignore_ascii_case(&compute_now);
    let memory_changes = !layout.memory.eq_ignore_ascii_case(&memory_now);
    if !compute_changes && !memory_changes {
        return Change::None;
    }
    if !modes::offered(&gpu.available_compute_partitions, &layout.compute)
        || !modes::offered(&gpu.available_memory_partitions, &layout.memory)
        || !modes::compatible(&layout.compute, &layout.memory)
    {
        return Change::Refused(format!(
            "GPU {} ({}) does not run {}",
            layout.gpu_index,
            gpu.bdf,
            layout.profile()
        ));
    }
    let others = |bdf: &str| -> Vec<String> {
        holds
            .get(bdf)
            .into_iter()
            .flatten()
            .filter(|d| d.as_str() != device)
            .cloned()
            .collect()
    };
    let held_here = others(&gpu.bdf);
    if !held_here.is_empty() {
        return Change::Refused(format!(
            "GPU {} ({}) runs {}_{} for prepared claims on {}; {} needs it free",
            layout.gpu_index,
            gpu.bdf,
            compute_now.to_ascii_lowercase(),
            memory_now.to_ascii_lowercase(),
            held_here.join(", "),
            layout.profile()
        ));
    }
    if memory_changes {
        let held: Vec<String> = gpus.iter().flat_map(|g| others(&g.bdf)).collect();
        if !held.is_empty() {
            return Change::Refused(format!(
                "memory mode {} needs every GPU of the node free (the driver sets one for all and reloads); prepared claims hold {}",
                layout.memory,
                held.join(", ")
            ));
        }
    }
    let upper = |s: &str| s.to_ascii_uppercase();
    let mut assignments = Vec::new();
    for (index, other) in gpus.iter().enumerate() {
        let target = index == layout.gpu_index as usize;
        // The target, and on a memory change every partitionable GPU.
        let written = target || (memory_changes && partitionable(other));
        if !written {
            continue;
        }
        let current_compute = now(&other.compute_partition);
        let compute = if target {
            upper(&layout.compute)
        } else if modes::compatible(&current_compute, &layout.memory) {
            current_compute.clone()
        } else {
            match widest_compute(other, &layout.memory) {
                Some(mode) => mode,
                None => continue,
            }
        };
        assignments.push(Assignment {
            index,
            bdf: other.bdf.clone(),
            compute,
            memory: if memory_changes {
                upper(&layout.memory)
            } else {
                now(&other.memory_partition)
            },
            current_compute,
            current_memory: now(&other.memory_partition),
        });
    }
    Change::Write {
        plan: Plan {
            assignments,
            skipped: Vec::new(),
        },
        reload: memory_changes,
    }
}

/// The compute mode with the most partitions that `gpu` offers and that runs
/// with `memory`, upper case.
fn widest_compute(gpu: &Gpu, memory: &str) -> Option<String> {
    gpu.available_compute_partitions
        .iter()
        .filter(|c| modes::compatible(c, memory))
        .max_by_key(|c| modes::compute_partitions(c).unwrap_or(0))
        .map(|c| c.to_ascii_uppercase())
}

/// The plan that puts the GPUs of `plan` back as they were, judged against
/// what they run now (`gpus`, after a failed change).
pub fn undo(plan: &Plan, gpus: &[&Gpu]) -> Plan {
    let now = |mode: &Option<String>| mode.as_deref().unwrap_or("").to_ascii_uppercase();
    let assignments = plan
        .assignments
        .iter()
        .filter_map(|a| {
            let gpu = gpus.iter().find(|g| g.bdf == a.bdf)?;
            Some(Assignment {
                index: a.index,
                bdf: a.bdf.clone(),
                compute: a.current_compute.clone(),
                memory: a.current_memory.clone(),
                current_compute: now(&gpu.compute_partition),
                current_memory: now(&gpu.memory_partition),
            })
        })
        .collect();
    Plan {
        assignments,
        skipped: Vec::new(),
    }
}

/// How many partitions a share takes: what it consumed of
/// [`PARTITIONS`] (one partition's worth each), at least one.
pub fn partitions_wanted(consumed: &BTreeMap<String, String>) -> u32 {
    consumed
        .get(PARTITIONS)
        .and_then(|q| q.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The lowest `wanted` partitions of `count` not in `taken`, or `None` when
/// fewer are free.
pub fn assign(count: u32, taken: &BTreeSet<u32>, wanted: u32) -> Option<Vec<u32>> {
    let free: Vec<u32> = (0..count)
        .filter(|p| !taken.contains(p))
        .take(wanted as usize)
        .collect();
    (free.len() == wanted as usize).then_some(free)
}

/// The layout a device name stands for, given the GPUs in PCI order:
/// `None` for a name that is not `gpu-<index>-<compute>-<memory>` of a
/// known mode pair.
pub fn parse_layout_name(name: &str) -> Option<(u32, String, String)> {
    let rest = name.strip_prefix("gpu-")?;
    let mut parts = rest.splitn(3, '-');
    let index = parts.next()?.parse().ok()?;
    let compute = parts.next()?;
    let memory = parts.next()?;
    (modes::compute_partitions(compute).is_some() && modes::memory_domains(memory).is_some())
        .then(|| (index, compute.to_owned(), memory.to_owned()))
}

/// Whether `gpu` runs `layout` now: its modes, and its partitions made.
pub fn runs(gpu: &Gpu, layout: &Layout) -> bool {
    let is = |mode: &Option<String>, want: &str| {
        mode.as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case(want))
    };
    is(&gpu.compute_partition, &layout.compute)
        && is(&gpu.memory_partition, &layout.memory)
        && gpu.partitions.len().max(1) == layout.partitions as usize
}

/// The memory mode of the layout devices among `held` (prepared devices'
/// names); `None` when none is a layout device.
pub fn held_memory<'a>(held: impl IntoIterator<Item = &'a str>) -> Option<String> {
    held.into_iter()
        .find_map(parse_layout_name)
        .map(|(_, _, memory)| memory)
}

/// The PCI address of the GPU a prepared device is on: a layout device by
/// its index into `gpus` (in PCI order), a GPU or partition
/// (`gpu-<card>-<render>`) by its DRM nodes.
pub fn gpu_of_device(name: &str, gpus: &[&Gpu]) -> Option<String> {
    if let Some((index, ..)) = parse_layout_name(name) {
        return gpus.get(index as usize).map(|g| g.bdf.clone());
    }
    let (card, render) = name.strip_prefix("gpu-")?.split_once('-')?;
    let (card, render): (u32, u32) = (card.parse().ok()?, render.parse().ok()?);
    gpus.iter()
        .find(|g| {
            (g.card == Some(card) && g.render_minor == Some(render))
                || g.partitions
                    .iter()
                    .any(|p| p.card == Some(card) && p.render_minor == Some(render))
        })
        .map(|g| g.bdf.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mi300x(bdf: &str, compute: &str, memory: &str) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            vram_bytes: Some(192 << 30),
            cu_count: Some(304),
            simd_count: Some(1216),
            compute_partition: Some(compute.into()),
            memory_partition: Some(memory.into()),
            available_compute_partitions: ["SPX", "DPX", "QPX", "CPX"].map(String::from).to_vec(),
            available_memory_partitions: ["NPS1", "NPS4"].map(String::from).to_vec(),
            ..Gpu::default()
        }
    }

    fn layout(index: u32, compute: &str, memory: &str) -> Layout {
        Layout {
            gpu_index: index,
            compute: compute.into(),
            memory: memory.into(),
            partitions: modes::compute_partitions(compute).unwrap_or(1),
        }
    }

    #[test]
    fn a_node_offers_the_profiles_of_its_partitionable_gpus_once() {
        let plain = Gpu {
            bdf: "0000:07:00.0".into(),
            ..Gpu::default()
        };
        let inventory = Inventory {
            gpus: vec![
                mi300x("0000:05:00.0", "spx", "nps1"),
                mi300x("0000:06:00.0", "CPX", "NPS4"),
                plain,
            ],
            ..Inventory::default()
        };
        assert_eq!(
            offered_profiles(&inventory),
            [
                "cpx_nps1", "cpx_nps4", "dpx_nps1", "qpx_nps1", "qpx_nps4", "spx_nps1"
            ]
        );
        assert!(offered_profiles(&Inventory::default()).is_empty());
    }

    #[test]
    fn an_mi300x_offers_the_pairs_the_driver_runs() {
        let gpu = mi300x("0000:05:00.0", "spx", "nps1");
        assert_eq!(
            layouts_of(&gpu),
            [
                ("cpx", "nps1"),
                ("cpx", "nps4"),
                ("dpx", "nps1"),
                ("qpx", "nps1"),
                ("qpx", "nps4"),
                ("spx", "nps1")
            ]
            .map(|(c, m)| (c.to_owned(), m.to_owned()))
        );
        assert_eq!(layout_name(3, "CPX", "NPS4"), "gpu-3-cpx-nps4");
        assert_eq!(
            parse_layout_name("gpu-3-cpx-nps4"),
            Some((3, "cpx".into(), "nps4".into()))
        );
        assert_eq!(parse_layout_name("gpu-1-128"), None);
        assert_eq!(parse_layout_name("gpu-1-cpx"), None);
    }

    #[test]
    fn a_layout_of_eight_is_shared_one_partition_at_a_time() {
        let gpu = mi300x("0000:05:00.0", "spx", "nps1");
        let cpx = capacity_of(&gpu, 8);
        assert_eq!(cpx[PARTITIONS].value.0, "8");
        assert_eq!(cpx["computeUnits"].value.0, "304");
        let policy = cpx["memory"].request_policy.as_ref().unwrap();
        assert_eq!(
            policy.default.as_ref().unwrap().0,
            (24u64 << 30).to_string()
        );
        assert_eq!(policy.valid_values.as_ref().unwrap().len(), 1);
        // The whole GPU is one allocation, with no policy.
        let spx = capacity_of(&gpu, 1);
        assert_eq!(spx[PARTITIONS].value.0, "1");
        assert!(spx.values().all(|c| c.request_policy.is_none()));
        let sets = counter_sets([&layout(0, "spx", "nps1"), &layout(0, "cpx", "nps1")]);
        assert_eq!(sets.len(), 1, "one set per GPU");
        assert_eq!(sets[0].name, "gpu-0-mutex");
        assert_eq!(sets[0].counters[MUTEX_COUNTER].value.0, "1");
        assert_eq!(
            consumption(&layout(0, "cpx", "nps1")).counter_set,
            "gpu-0-mutex"
        );
    }

    #[test]
    fn a_compute_change_needs_the_gpu_free_and_a_memory_change_the_node() {
        let a = mi300x("0000:05:00.0", "spx", "nps1");
        let b = mi300x("0000:26:00.0", "qpx", "nps1");
        let gpus = [&a, &b];
        let free = Holds::new();
        match change_for(&gpus, &layout(0, "cpx", "nps1"), "gpu-0-cpx-nps1", &free) {
            Change::Write { plan, reload } => {
                assert!(!reload);
                assert_eq!(plan.assignments.len(), 1, "{plan:?}");
                assert_eq!(plan.assignments[0].compute, "CPX");
                assert_eq!(plan.assignments[0].current_compute, "SPX");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            change_for(&gpus, &layout(0, "spx", "nps1"), "gpu-0-spx-nps1", &free),
            Change::None
        );
        // GPU 0 held by another layout's claim: refused, naming the holder.
        let held = Holds::from([(
            "0000:05:00.0".into(),
            BTreeSet::from(["gpu-0-spx-nps1".into()]),
        )]);
        let Change::Refused(why) =
            change_for(&gpus, &layout(0, "cpx", "nps1"), "gpu-0-cpx-nps1", &held)
        else {
            panic!("a held GPU is not changed");
        };
        assert!(why.contains("gpu-0-spx-nps1"), "{why}");
        // Another share of the same layout device does not block.
        let same = Holds::from([(
            "0000:05:00.0".into(),
            BTreeSet::from(["gpu-0-cpx-nps1".into()]),
        )]);
        assert!(matches!(
            change_for(&gpus, &layout(0, "cpx", "nps1"), "gpu-0-cpx-nps1", &same),
            Change::Write { .. }
        ));
        // A memory change: every GPU free, every partitionable GPU written,
        // each keeping a compute mode that runs with the new memory mode.
        let other_held = Holds::from([(
            "0000:26:00.0".into(),
            BTreeSet::from(["gpu-1-qpx-nps1".into()]),
        )]);
        assert!(matches!(
            change_for(&gpus, &layout(0, "cpx", "nps4"), "gpu-0-cpx-nps4", &other_held),
            Change::Refused(why) if why.contains("every GPU")
        ));
        let Change::Write { plan, reload } =
            change_for(&gpus, &layout(0, "cpx", "nps4"), "gpu-0-cpx-nps4", &free)
        else {
            panic!("a free node takes a memory change");
        };
        assert!(reload);
        let modes: Vec<(&str, &str)> = plan
            .assignments
            .iter()
            .map(|a| (a.compute.as_str(), a.memory.as_str()))
            .collect();
        assert_eq!(modes, [("CPX", "NPS4"), ("QPX", "NPS4")]);
        // SPX does not run with NPS4: the widest mode that does.
        let c = mi300x("0000:26:00.0", "spx", "nps1");
        let Change::Write { plan, .. } = change_for(
            &[&a, &c],
            &layout(0, "qpx", "nps4"),
            "gpu-0-qpx-nps4",
            &free,
        ) else {
            panic!();
        };
        assert_eq!(plan.assignments[1].compute, "CPX");
        // Undone: back to what each had, judged from where each is now.
        let after_a = mi300x("0000:05:00.0", "qpx", "nps4");
        let after_c = mi300x("0000:26:00.0", "cpx", "nps4");
        let back = undo(&plan, &[&after_a, &after_c]);
        assert_eq!(back.assignments[0].compute, "SPX");
        assert_eq!(back.assignments[0].memory, "NPS1");
        assert_eq!(back.assignments[0].current_compute, "QPX");
        assert_eq!(back.assignments[1].compute, "SPX");
        // A layout the GPU does not offer is refused.
        assert!(matches!(
            change_for(&gpus, &layout(0, "spx", "nps4"), "gpu-0-spx-nps4", &free),
            Change::Refused(_)
        ));
    }

    #[test]
    fn shares_take_the_lowest_free_partitions() {
        assert_eq!(assign(8, &BTreeSet::new(), 1), Some(vec![0]));
        assert_eq!(assign(8, &BTreeSet::from([0, 1, 3]), 2), Some(vec![2, 4]));
        assert_eq!(assign(2, &BTreeSet::from([0]), 2), None);
        assert_eq!(
            partitions_wanted(&BTreeMap::from([(PARTITIONS.into(), "2".into())])),
            2
        );
        assert_eq!(partitions_wanted(&BTreeMap::new()), 1);
    }

    #[test]
    fn layouts_of_another_memory_mode_and_of_a_stuck_gpu_are_tainted() {
        let devices = [
            ("gpu-0-spx-nps1", layout(0, "spx", "nps1")),
            ("gpu-0-cpx-nps4", layout(0, "cpx", "nps4")),
            ("gpu-1-cpx-nps1", layout(1, "cpx", "nps1")),
        ];
        let all = || devices.iter().map(|(n, l)| (*n, l));
        assert!(conflicts(all(), None, &BTreeMap::new()).is_empty());
        assert_eq!(
            conflicts(all(), Some("nps1"), &BTreeMap::new()),
            BTreeMap::from([("gpu-0-cpx-nps4".into(), "nps1".into())])
        );
        let stuck = BTreeMap::from([(1, "NPS1".into())]);
        assert_eq!(
            conflicts(all(), None, &stuck),
            BTreeMap::from([("gpu-1-cpx-nps1".into(), "nps1".into())])
        );
    }
}
