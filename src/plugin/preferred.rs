//! Topology-aware choice for `GetPreferredAllocation`: which `size` devices out of
//! the available ones a container should get. Pure, over plain data.
//!
//! The rules, in order of weight:
//! 1. Fewest GPUs. Partitions are taken from one GPU before another is touched,
//!    and a request that fits in one GPU goes to the GPU with the fewest free
//!    partitions that can hold it, so that GPUs with many free partitions stay
//!    whole for larger requests.
//! 2. Between GPUs, XGMI beats PCIe beats anything else (worst link first, then
//!    the sum over all pairs).
//! 3. Then the same NUMA node beats different ones (unknown NUMA counts as
//!    different).
//! 4. `must_include` devices are always in the answer, first.
//!
//! Replicas of shared devices ([`preferred_replicas`]) are spread first: one
//! replica per device, the devices chosen by the rules above, so a container
//! asking for four replicas gets four GPUs while four are free; only then are
//! more replicas of the devices already chosen packed in.
//!
//! The search is greedy from each possible first GPU, keeping the best result;
//! first GPUs that already belong to an earlier result are skipped, as they
//! would mostly find the same set. That makes it a heuristic (a preference, which
//! is all the kubelet asks for) that stays well under a millisecond for 64
//! devices (see `benches/plugin.rs`). This module must not do I/O.

use std::collections::{HashMap, HashSet};

use crate::device::{Gpu, LinkKind};

use super::devices::{PluginDevice, parent_id};

/// Link ranks: lower is closer.
const RANK_XGMI: u8 = 0;
const RANK_PCIE: u8 = 1;
const RANK_OTHER: u8 = 2;
const RANK_NONE: u8 = 3;

fn rank(kind: LinkKind) -> u8 {
    match kind {
        LinkKind::Xgmi => RANK_XGMI,
        LinkKind::Pcie => RANK_PCIE,
        LinkKind::Other => RANK_OTHER,
    }
}

/// Where devices sit: their GPU, the GPUs' NUMA nodes and the links between
/// GPUs. Built once per device set, read by every request.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    numa: Vec<Option<i64>>,
    /// Row-major `n × n` link ranks between GPUs.
    ranks: Vec<u8>,
    /// Device ID → (GPU index, position of the device within its GPU).
    devices: HashMap<String, (usize, usize)>,
}

impl Topology {
    /// `devices` are the advertised devices; `gpus` supply links (and XGMI hive
    /// membership, used when a link is missing). Replicas count as their
    /// device: the topology knows devices, [`preferred_replicas`] replicas.
    pub fn new(devices: &[PluginDevice], gpus: &[Gpu]) -> Self {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut numa = Vec::new();
        let mut device_map = HashMap::with_capacity(devices.len());
        let mut per_gpu: Vec<usize> = Vec::new();
        for device in devices {
            let id = parent_id(&device.id);
            if device_map.contains_key(id) {
                continue;
            }
            let g = *index.entry(device.gpu_bdf.as_str()).or_insert_with(|| {
                numa.push(device.numa_node);
                per_gpu.push(0);
                numa.len() - 1
            });
            device_map.insert(id.to_owned(), (g, per_gpu[g]));
            per_gpu[g] += 1;
        }
        let n = numa.len();
        let mut ranks = vec![RANK_NONE; n * n];
        for g in 0..n {
            ranks[g * n + g] = RANK_XGMI;
        }
        let mut set = |a: usize, b: usize, r: u8| {
            ranks[a * n + b] = ranks[a * n + b].min(r);
            ranks[b * n + a] = ranks[b * n + a].min(r);
        };
        for gpu in gpus {
            let Some(&a) = index.get(gpu.bdf.as_str()) else {
                continue;
            };
            for link in &gpu.links {
                if let Some(&b) = index.get(link.to_bdf.as_str()) {
                    set(a, b, rank(link.kind));
                }
            }
            for other in gpus {
                let same_hive =
                    matches!((gpu.hive_id, other.hive_id), (Some(x), Some(y)) if x != 0 && x == y);
                if let (true, Some(&b)) = (same_hive, index.get(other.bdf.as_str())) {
                    set(a, b, RANK_XGMI);
                }
            }
        }
        Self {
            numa,
            ranks,
            devices: device_map,
        }
    }

    fn gpu_count(&self) -> usize {
        self.numa.len()
    }

    fn rank(&self, a: usize, b: usize) -> u8 {
        self.ranks[a * self.gpu_count() + b]
    }

    fn same_numa(&self, a: usize, b: usize) -> bool {
        matches!((self.numa[a], self.numa[b]), (Some(x), Some(y)) if x == y)
    }
}

/// Chooses `size` devices from `available`, always including `must_include`.
/// Returns fewer when not enough are available, and `must_include` alone when
/// it already has `size` or more. IDs the topology does not know are used last.
pub fn preferred_allocation(
    topology: &Topology,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    // `size` comes from the kubelet's request; never reserve more than could be
    // returned.
    let mut chosen: Vec<String> =
        Vec::with_capacity(size.min(available.len()).max(must_include.len()));
    let mut taken: HashSet<&str> = HashSet::new();
    for id in must_include {
        if taken.insert(id) {
            chosen.push(id.clone());
        }
    }
    if chosen.len() >= size {
        return chosen;
    }

    let n = topology.gpu_count();
    let mut free: Vec<Vec<(usize, &str)>> = vec![Vec::new(); n];
    let mut unknown: Vec<&str> = Vec::new();
    for id in available {
        if !taken.insert(id) {
            continue;
        }
        match topology.devices.get(id.as_str()) {
            Some(&(g, pos)) => free[g].push((pos, id)),
            None => unknown.push(id),
        }
    }
    for list in &mut free {
        list.sort_unstable();
    }
    let mut forced: Vec<usize> = must_include
        .iter()
        .filter_map(|id| topology.devices.get(id.as_str()).map(|&(g, _)| g))
        .collect();
    forced.sort_unstable();
    forced.dedup();

    let need = size - chosen.len();
    let free_counts: Vec<usize> = free.iter().map(Vec::len).collect();
    let mut best: Option<(Score, Vec<(usize, usize)>)> = None;
    let mut search = Search::new(topology, &free_counts);
    let tightest_fit = (0..n)
        .filter(|&g| free_counts[g] >= need)
        .min_by_key(|&g| (free_counts[g], g));
    if let (true, Some(g)) = (forced.is_empty(), tightest_fit) {
        // Rule 1: one GPU beats any set of several.
        best = Some((Score::default(), vec![(g, need)]));
    } else if forced.is_empty() {
        // Every GPU with free devices may start the best set, but a GPU that
        // already ended up in an earlier result would mostly find that same set
        // again: skipping those keeps the search near O(G²) instead of O(G³).
        let mut covered = vec![false; n];
        for seed in 0..n {
            if free_counts[seed] == 0 || covered[seed] {
                continue;
            }
            let (score, picks) = search.run(&forced, Some(seed), need);
            for &(g, _) in &picks {
                covered[g] = true;
            }
            if best.as_ref().is_none_or(|(s, _)| score < *s) {
                best = Some((score, picks));
            }
        }
    } else {
        best = Some(search.run(&forced, None, need));
    }

    let mut left = need;
    if let Some((_, mut picks)) = best {
        // In topology order, so that equal sets read the same whichever GPU
        // the search started from (must_include is already in front).
        picks.sort_unstable();
        for (g, count) in picks {
            chosen.extend(free[g].iter().take(count).map(|(_, id)| (*id).to_owned()));
            left -= count;
        }
    }
    chosen.extend(unknown.into_iter().take(left).map(str::to_owned));
    chosen
}

/// [`preferred_allocation`] for replicas of shared devices: `size` replicas
/// out of `available`, `must_include` first; then one replica of each of the
/// devices [`preferred_allocation`] picks among those with a free replica and
/// none in `must_include`; then, while more are needed, further replicas of
/// the devices already in the answer (packing), then of any other.
pub fn preferred_replicas(
    topology: &Topology,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut chosen: Vec<String> =
        Vec::with_capacity(size.min(available.len() + must_include.len()));
    let mut taken: HashSet<&str> = HashSet::new();
    let mut used_parents: Vec<&str> = Vec::new();
    for id in must_include {
        if taken.insert(id) {
            chosen.push(id.clone());
            let parent = parent_id(id);
            if !used_parents.contains(&parent) {
                used_parents.push(parent);
            }
        }
    }
    if chosen.len() >= size {
        return chosen;
    }
    // The free replicas of each device, in the order the kubelet gave them.
    let mut free: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut parents: Vec<&str> = Vec::new();
    for id in available {
        if taken.contains(id.as_str()) {
            continue;
        }
        let parent = parent_id(id);
        let replicas = free.entry(parent).or_insert_with(|| {
            parents.push(parent);
            Vec::new()
        });
        if !replicas.contains(&id.as_str()) {
            replicas.push(id);
        }
    }
    let need = size - chosen.len();
    let spread_over: Vec<String> = parents
        .iter()
        .filter(|p| !used_parents.contains(p))
        .map(|p| (*p).to_owned())
        .collect();
    let used: Vec<String> = used_parents.iter().map(|p| (*p).to_owned()).collect();
    let spread = need.min(spread_over.len());
    let picked = preferred_allocation(topology, &spread_over, &used, used.len() + spread);
    let mut take_one = |parent: &str, chosen: &mut Vec<String>| -> bool {
        let Some(replicas) = free.get_mut(parent) else {
            return false;
        };
        if replicas.is_empty() {
            return false;
        }
        chosen.push(replicas.remove(0).to_owned());
        true
    };
    let mut order: Vec<String> = used.clone();
    for parent in picked.iter().skip(used.len()) {
        if chosen.len() >= size {
            break;
        }
        if take_one(parent, &mut chosen) {
            order.push(parent.clone());
        }
    }
    // Packing: more replicas of the devices in the answer, then the rest.
    order.extend(parents.iter().map(|p| (*p).to_owned()));
    for parent in &order {
        while chosen.len() < size && take_one(parent, &mut chosen) {}
        if chosen.len() >= size {
            break;
        }
    }
    chosen
}

/// Lexicographic quality of a result; lower is better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    shortfall: usize,
    gpus: usize,
    worst_link: u8,
    link_sum: u32,
    numa_mismatches: u32,
    /// Free partitions on the GPUs used, before allocation: lower packs tighter.
    packing: usize,
    seed: usize,
}

/// Scratch space for greedy runs, reused across seeds.
struct Search<'a> {
    topology: &'a Topology,
    free: &'a [usize],
    remaining: Vec<usize>,
    touched: Vec<bool>,
    order: Vec<usize>,
    worst: Vec<u8>,
    sum: Vec<u32>,
    numa_mismatches: Vec<u32>,
    /// Pairwise totals over the touched GPUs.
    set_worst: u8,
    set_sum: u32,
    set_numa_mismatches: u32,
}

impl<'a> Search<'a> {
    fn new(topology: &'a Topology, free: &'a [usize]) -> Self {
        let n = free.len();
        Self {
            topology,
            free,
            remaining: Vec::with_capacity(n),
            touched: Vec::with_capacity(n),
            order: Vec::with_capacity(n),
            worst: Vec::with_capacity(n),
            sum: Vec::with_capacity(n),
            numa_mismatches: Vec::with_capacity(n),
            set_worst: 0,
            set_sum: 0,
            set_numa_mismatches: 0,
        }
    }

    fn reset(&mut self) {
        let n = self.free.len();
        self.remaining.clear();
        self.remaining.extend_from_slice(self.free);
        self.touched.clear();
        self.touched.resize(n, false);
        self.order.clear();
        self.worst.clear();
        self.worst.resize(n, 0);
        self.sum.clear();
        self.sum.resize(n, 0);
        self.numa_mismatches.clear();
        self.numa_mismatches.resize(n, 0);
        self.set_worst = 0;
        self.set_sum = 0;
        self.set_numa_mismatches = 0;
    }

    /// Adds a GPU to the selection and updates every GPU's distance to it.
    fn touch(&mut self, g: usize) {
        if self.touched[g] {
            return;
        }
        self.touched[g] = true;
        self.order.push(g);
        // g's distances to the GPUs touched before it are exactly the new pairs.
        self.set_worst = self.set_worst.max(self.worst[g]);
        self.set_sum += self.sum[g];
        self.set_numa_mismatches += self.numa_mismatches[g];
        for h in 0..self.free.len() {
            let r = self.topology.rank(h, g);
            self.worst[h] = self.worst[h].max(r);
            self.sum[h] += u32::from(r);
            self.numa_mismatches[h] += u32::from(!self.topology.same_numa(h, g));
        }
    }

    fn run(
        &mut self,
        forced: &[usize],
        seed: Option<usize>,
        mut need: usize,
    ) -> (Score, Vec<(usize, usize)>) {
        self.reset();
        for &g in forced {
            self.touch(g);
        }
        if let Some(g) = seed {
            self.touch(g);
        }
        let mut picks = Vec::new();
        while need > 0 {
            // Rule 1: finish GPUs already in use, the fullest first.
            let next = self
                .order
                .iter()
                .copied()
                .filter(|&g| self.remaining[g] > 0)
                .min_by_key(|&g| (self.remaining[g], g));
            let g = match next {
                Some(g) => g,
                None => {
                    let candidate = (0..self.free.len())
                        .filter(|&g| !self.touched[g] && self.remaining[g] > 0)
                        .min_by_key(|&g| {
                            let free = self.remaining[g];
                            let fits = free >= need;
                            (
                                self.worst[g],
                                self.sum[g],
                                self.numa_mismatches[g],
                                !fits,
                                // Fits: the tightest fit. Does not: the largest, to
                                // use as few GPUs as possible.
                                if fits { free } else { usize::MAX - free },
                                g,
                            )
                        });
                    match candidate {
                        Some(g) => {
                            self.touch(g);
                            g
                        }
                        None => break,
                    }
                }
            };
            let take = need.min(self.remaining[g]);
            self.remaining[g] -= take;
            need -= take;
            picks.push((g, take));
        }

        let score = Score {
            shortfall: need,
            gpus: self.order.len(),
            worst_link: self.set_worst,
            link_sum: self.set_sum,
            numa_mismatches: self.set_numa_mismatches,
            packing: picks.iter().map(|&(g, _)| self.free[g]).sum(),
            seed: seed.unwrap_or(0),
        };
        (score, picks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Link;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// GPU `g` has `parts` partitions with IDs `g<g>p<i>`.
    fn devices(layout: &[(usize, Option<i64>)]) -> Vec<PluginDevice> {
        let mut out = Vec::new();
        for (g, &(parts, numa)) in layout.iter().enumerate() {
            for i in 0..parts {
                out.push(PluginDevice {
                    id: format!("g{g}p{i}"),
                    gpu_bdf: bdf(g),
                    partition: (parts > 1).then_some(i as u32),
                    numa_node: numa,
                    card: Some(i as u32),
                    render_minor: Some(128 + i as u32),
                });
            }
        }
        out
    }

    fn bdf(g: usize) -> String {
        format!("0000:{:02x}:00.0", g + 1)
    }

    fn gpus(count: usize, links: &[(usize, usize, LinkKind)]) -> Vec<Gpu> {
        let mut gpus: Vec<Gpu> = (0..count)
            .map(|g| Gpu {
                bdf: bdf(g),
                ..Gpu::default()
            })
            .collect();
        for &(a, b, kind) in links {
            gpus[a].links.push(Link {
                to_bdf: bdf(b),
                kind,
                weight: 15,
            });
            gpus[b].links.push(Link {
                to_bdf: bdf(a),
                kind,
                weight: 15,
            });
        }
        gpus
    }

    fn all_ids(devs: &[PluginDevice]) -> Vec<String> {
        devs.iter().map(|d| d.id.clone()).collect()
    }

    fn gpus_of(ids: &[String]) -> Vec<String> {
        let mut g: Vec<String> = ids
            .iter()
            .map(|id| id.split('p').next().unwrap().to_owned())
            .collect();
        g.sort();
        g.dedup();
        g
    }

    fn strings(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_partition_goes_to_the_gpu_with_fewest_free_partitions() {
        let devs = devices(&[(8, Some(0)), (8, Some(0)), (8, Some(0))]);
        let topo = Topology::new(&devs, &gpus(3, &[]));
        // GPU 1 has 3 free, GPU 0 all 8, GPU 2 has 5.
        let available: Vec<String> = all_ids(&devs)
            .into_iter()
            .filter(|id| !id.starts_with("g1") || id.as_str() >= "g1p5")
            .filter(|id| !id.starts_with("g2") || id.as_str() >= "g2p3")
            .collect();
        let got = preferred_allocation(&topo, &available, &[], 1);
        assert_eq!(got, ["g1p5"]);
    }

    #[test]
    fn an_absurd_allocation_size_returns_what_there_is() {
        let devs = devices(&[(8, Some(0))]);
        let topo = Topology::new(&devs, &gpus(1, &[]));
        // The kubelet's field is an i32; i32::MAX must not reserve gigabytes.
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], i32::MAX as usize);
        assert_eq!(got.len(), 8);
    }

    #[test]
    fn a_request_that_fits_one_gpu_takes_the_tightest_fit() {
        let devs = devices(&[(8, Some(0)), (8, Some(0)), (8, Some(0))]);
        let topo = Topology::new(&devs, &gpus(3, &[]));
        // Free: GPU 0 = 8, GPU 1 = 2, GPU 2 = 4. Four fit GPU 2 exactly.
        let available: Vec<String> = all_ids(&devs)
            .into_iter()
            .filter(|id| !id.starts_with("g1") || id.as_str() >= "g1p6")
            .filter(|id| !id.starts_with("g2") || id.as_str() >= "g2p4")
            .collect();
        let got = preferred_allocation(&topo, &available, &[], 4);
        assert_eq!(got, ["g2p4", "g2p5", "g2p6", "g2p7"]);
        // Three also go to GPU 2, not split over GPU 1 and another.
        assert_eq!(
            gpus_of(&preferred_allocation(&topo, &available, &[], 3)),
            ["g2"]
        );
    }

    #[test]
    fn a_large_request_fills_whole_gpus_before_touching_another() {
        let devs = devices(&[(8, Some(0)), (8, Some(0)), (8, Some(0))]);
        let topo = Topology::new(&devs, &gpus(3, &[]));
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], 12);
        assert_eq!(got.len(), 12);
        assert_eq!(gpus_of(&got).len(), 2, "{got:?}");
    }

    /// `devs` advertised `n` times each.
    fn replicated(devs: &[PluginDevice], n: usize) -> Vec<PluginDevice> {
        devs.iter()
            .flat_map(|d| {
                (0..n).map(move |r| PluginDevice {
                    id: format!("{}::{r}", d.id),
                    ..d.clone()
                })
            })
            .collect()
    }

    fn parents_of(ids: &[String]) -> BTreeSet<&str> {
        ids.iter().map(|id| parent_id(id)).collect()
    }

    #[test]
    fn replicas_spread_over_devices_first_then_pack() {
        let devs = devices(&[(1, Some(0)), (1, Some(0)), (1, Some(1)), (1, Some(1))]);
        let shared = replicated(&devs, 4);
        let topo = Topology::new(&shared, &gpus(4, &[]));
        let ids = all_ids(&shared);
        let got = preferred_replicas(&topo, &ids, &[], 2);
        assert_eq!(
            parents_of(&got),
            BTreeSet::from(["g0p0", "g1p0"]),
            "one NUMA node: {got:?}"
        );
        let got = preferred_replicas(&topo, &ids, &[], 4);
        assert_eq!(parents_of(&got).len(), 4, "{got:?}");
        // Six: every device once, then two more of devices already in it.
        let got = preferred_replicas(&topo, &ids, &[], 6);
        assert_eq!((got.len(), parents_of(&got).len()), (6, 4), "{got:?}");
        // must_include counts its device as used: the rest go elsewhere.
        let must = strings(&["g2p0::3"]);
        let got = preferred_replicas(&topo, &ids, &must, 2);
        assert_eq!(got[0], "g2p0::3");
        assert_eq!(
            parents_of(&got),
            BTreeSet::from(["g2p0", "g3p0"]),
            "same NUMA node: {got:?}"
        );
        // Only replicas of one device free: packed.
        let one: Vec<String> = ids
            .iter()
            .filter(|id| id.starts_with("g1"))
            .cloned()
            .collect();
        let got = preferred_replicas(&topo, &one, &[], 3);
        assert_eq!(got, ["g1p0::0", "g1p0::1", "g1p0::2"]);
        assert_eq!(
            preferred_replicas(&topo, &one, &[], 9).len(),
            4,
            "what there is"
        );
    }

    #[test]
    fn xgmi_beats_pcie() {
        let devs = devices(&[(1, Some(0)), (1, Some(0)), (1, Some(0))]);
        let links = [
            (0, 1, LinkKind::Pcie),
            (0, 2, LinkKind::Xgmi),
            (1, 2, LinkKind::Pcie),
        ];
        let topo = Topology::new(&devs, &gpus(3, &links));
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], 2);
        assert_eq!(got, ["g0p0", "g2p0"]);
        let got = preferred_allocation(&topo, &all_ids(&devs), &strings(&["g2p0"]), 2);
        assert_eq!(got, ["g2p0", "g0p0"]);
        // Replicas go to the linked GPUs too.
        let shared = replicated(&devs, 2);
        let topo = Topology::new(&shared, &gpus(3, &links));
        let got = preferred_replicas(&topo, &all_ids(&shared), &[], 2);
        assert_eq!(
            parents_of(&got),
            BTreeSet::from(["g0p0", "g2p0"]),
            "{got:?}"
        );
    }

    #[test]
    fn xgmi_hive_membership_stands_in_for_missing_links() {
        let devs = devices(&[(1, Some(0)), (1, Some(0)), (1, Some(0))]);
        let mut gpus = gpus(3, &[(0, 1, LinkKind::Pcie), (1, 2, LinkKind::Pcie)]);
        gpus[0].hive_id = Some(42);
        gpus[2].hive_id = Some(42);
        let topo = Topology::new(&devs, &gpus);
        let got = preferred_allocation(&topo, &all_ids(&devs), &strings(&["g2p0"]), 2);
        assert_eq!(got, ["g2p0", "g0p0"]);
    }

    #[test]
    fn same_numa_beats_different_numa_when_links_are_equal() {
        let devs = devices(&[(1, Some(0)), (1, Some(1)), (1, Some(1)), (1, Some(0))]);
        let all_xgmi: Vec<_> = (0..4)
            .flat_map(|a| (a + 1..4).map(move |b| (a, b, LinkKind::Xgmi)))
            .collect();
        let topo = Topology::new(&devs, &gpus(4, &all_xgmi));
        let got = preferred_allocation(&topo, &all_ids(&devs), &strings(&["g0p0"]), 2);
        assert_eq!(got, ["g0p0", "g3p0"]);
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], 2);
        assert_eq!(got, ["g0p0", "g3p0"]);
        let got = preferred_allocation(&topo, &all_ids(&devs), &strings(&["g1p0"]), 2);
        assert_eq!(got, ["g1p0", "g2p0"]);
    }

    #[test]
    fn links_weigh_more_than_numa() {
        // GPU 1: XGMI to GPU 0 but another NUMA node; GPU 2: PCIe, same node.
        let devs = devices(&[(1, Some(0)), (1, Some(1)), (1, Some(0))]);
        let links = [
            (0, 1, LinkKind::Xgmi),
            (0, 2, LinkKind::Pcie),
            (1, 2, LinkKind::Pcie),
        ];
        let topo = Topology::new(&devs, &gpus(3, &links));
        let got = preferred_allocation(&topo, &all_ids(&devs), &strings(&["g0p0"]), 2);
        assert_eq!(got, ["g0p0", "g1p0"]);
    }

    #[test]
    fn the_first_gpu_is_chosen_for_the_best_whole_set() {
        // Greedy from GPU 0 would pair it over PCIe; GPUs 1 and 2 share XGMI.
        let devs = devices(&[(1, Some(0)), (1, Some(1)), (1, Some(1))]);
        let links = [
            (0, 1, LinkKind::Pcie),
            (0, 2, LinkKind::Pcie),
            (1, 2, LinkKind::Xgmi),
        ];
        let topo = Topology::new(&devs, &gpus(3, &links));
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], 2);
        assert_eq!(got, ["g1p0", "g2p0"]);
    }

    #[test]
    fn whole_gpus_come_from_one_xgmi_hive() {
        // 16 GPUs, hives of four, NUMA node by half; GPU 0 and 5 are taken.
        let layout: Vec<_> = (0..16).map(|g| (1, Some((g / 8) as i64))).collect();
        let devs = devices(&layout);
        let links: Vec<_> = (0..16)
            .flat_map(|a| (a + 1..16).map(move |b| (a, b)))
            .map(|(a, b)| {
                let kind = if a / 4 == b / 4 {
                    LinkKind::Xgmi
                } else {
                    LinkKind::Pcie
                };
                (a, b, kind)
            })
            .collect();
        let topo = Topology::new(&devs, &gpus(16, &links));
        let available: Vec<String> = all_ids(&devs)
            .into_iter()
            .filter(|id| id != "g0p0" && id != "g5p0")
            .collect();
        let got = preferred_allocation(&topo, &available, &[], 4);
        assert_eq!(got, ["g8p0", "g9p0", "g10p0", "g11p0"]);
        // Two hives' worth on one NUMA node.
        let got = preferred_allocation(&topo, &all_ids(&devs), &[], 8);
        let hives: HashSet<usize> = got
            .iter()
            .map(|id| id[1..id.find('p').unwrap()].parse::<usize>().unwrap() / 4)
            .collect();
        assert!(
            hives == HashSet::from([0, 1]) || hives == HashSet::from([2, 3]),
            "{got:?}"
        );
    }

    #[test]
    fn must_include_fills_its_own_gpu_first() {
        let devs = devices(&[(8, Some(0)), (8, Some(0))]);
        let topo = Topology::new(&devs, &gpus(2, &[]));
        // GPU 0 is fuller (4 free) but g1p7 must be in: the rest comes from GPU 1.
        let available: Vec<String> = all_ids(&devs)
            .into_iter()
            .filter(|id| !id.starts_with("g0") || id.as_str() >= "g0p4")
            .collect();
        let got = preferred_allocation(&topo, &available, &strings(&["g1p7"]), 3);
        assert_eq!(got, ["g1p7", "g1p0", "g1p1"]);
    }

    #[test]
    fn must_include_alone_when_it_is_enough() {
        let devs = devices(&[(2, Some(0))]);
        let topo = Topology::new(&devs, &gpus(1, &[]));
        let must = strings(&["g0p1", "g0p0", "g0p1"]);
        assert_eq!(
            preferred_allocation(&topo, &all_ids(&devs), &must, 2),
            ["g0p1", "g0p0"]
        );
        assert_eq!(
            preferred_allocation(&topo, &all_ids(&devs), &must, 0),
            ["g0p1", "g0p0"]
        );
    }

    #[test]
    fn short_supply_returns_everything_and_unknown_ids_last() {
        let devs = devices(&[(2, Some(0))]);
        let topo = Topology::new(&devs, &gpus(1, &[]));
        let available = strings(&["zz", "g0p1", "g0p0"]);
        assert_eq!(
            preferred_allocation(&topo, &available, &[], 5),
            ["g0p0", "g0p1", "zz"]
        );
    }

    proptest! {
        #[test]
        fn answers_are_well_formed(
            layout in prop::collection::vec((1usize..5, prop::option::of(0i64..2)), 1..6),
            mask in prop::collection::vec(any::<bool>(), 30),
            must_mask in prop::collection::vec(any::<bool>(), 30),
            size in 0usize..20,
        ) {
            let devs = devices(&layout);
            let topo = Topology::new(&devs, &gpus(layout.len(), &[]));
            let ids = all_ids(&devs);
            let available: Vec<String> = ids.iter().zip(mask.iter().cycle()).filter(|(_, m)| **m).map(|(i, _)| i.clone()).collect();
            let must: Vec<String> = available.iter().zip(must_mask.iter().cycle()).filter(|(_, m)| **m).map(|(i, _)| i.clone()).take(size).collect();
            let got = preferred_allocation(&topo, &available, &must, size);
            let unique: HashSet<&String> = got.iter().collect();
            prop_assert_eq!(unique.len(), got.len(), "duplicates in {:?}", got);
            prop_assert_eq!(got.len(), size.min(available.len()).max(must.len()));
            prop_assert_eq!(&got[..must.len()], &must[..]);
            for id in &got {
                prop_assert!(available.contains(id));
            }
        }
    }
}
