//! A profile checked against a node's GPUs, before anything is drained: which
//! GPU gets which modes, and which of them change.
//!
//! Rejected, with a reason a person can act on:
//! - the GPUs the profile assigns plus those it skips are not the node's GPUs;
//! - a skipped index that is not a GPU, or is skipped twice;
//! - a GPU that cannot be partitioned, or a mode it does not offer
//!   (`available_compute_partition`, `available_memory_partition`);
//! - a compute/memory pair the driver does not run ([`modes::compatible`]);
//! - entries with different memory modes (the driver sets the memory mode
//!   for a whole XGMI hive, and the reference refuses such profiles too).
//!
//! GPUs are numbered from 0 in PCI address order; entries take the GPUs
//! that are not skipped in ascending order. Pure.

use crate::device::model::Gpu;
use crate::device::modes;

use super::profiles::Profile;

/// What a profile does to one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub index: usize,
    pub bdf: String,
    /// Upper case, as written to the driver.
    pub compute: String,
    pub memory: String,
    /// The GPU's modes now, upper case.
    pub current_compute: String,
    pub current_memory: String,
}

impl Assignment {
    pub fn memory_changes(&self) -> bool {
        !self.memory.eq_ignore_ascii_case(&self.current_memory)
    }

    pub fn compute_changes(&self) -> bool {
        !self.compute.eq_ignore_ascii_case(&self.current_compute)
    }

    pub fn changes(&self) -> bool {
        self.memory_changes() || self.compute_changes()
    }

    /// Partitions the GPU has once the assignment is done.
    pub fn partitions(&self) -> u32 {
        modes::compute_partitions(&self.compute).unwrap_or(1)
    }
}

/// A profile laid onto a node's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub assignments: Vec<Assignment>,
    /// Addresses of the skipped GPUs.
    pub skipped: Vec<String>,
}

impl Plan {
    /// The assignments that change something.
    pub fn changes(&self) -> impl Iterator<Item = &Assignment> {
        self.assignments.iter().filter(|a| a.changes())
    }

    /// Nothing to change: the node already runs the profile.
    pub fn is_done(&self) -> bool {
        self.changes().next().is_none()
    }
}

/// Lays `profile` (named `name`, for messages) onto `gpus`, or says why not.
pub fn plan(name: &str, profile: &Profile, gpus: &[Gpu]) -> Result<Plan, String> {
    let mut gpus: Vec<&Gpu> = gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let total = gpus.len();
    if total == 0 {
        return Err("the node has no GPUs to partition".into());
    }
    let mut skipped = Vec::new();
    for &id in &profile.skipped {
        let id = id as usize;
        if id >= total {
            return Err(format!(
                "profile {name} skips GPU {id}, but the node's GPUs are 0 to {}",
                total - 1
            ));
        }
        if skipped.contains(&id) {
            return Err(format!("profile {name} skips GPU {id} twice"));
        }
        skipped.push(id);
    }
    let counted: usize = profile
        .entries
        .iter()
        .filter_map(|e| e.count)
        .map(|c| c as usize)
        .sum();
    let available = total - skipped.len();
    let remainder = match profile.entries.iter().any(|e| e.count.is_none()) {
        true if counted <= available => available - counted,
        false if counted == available => 0,
        _ => {
            return Err(format!(
                "profile {name} assigns {counted} GPUs and skips {}, but the node has {total}",
                skipped.len()
            ));
        }
    };
    if let Some(memory) = profile.entries.first().map(|e| &e.memory)
        && let Some(other) = profile.entries.iter().find(|e| e.memory != *memory)
    {
        return Err(format!(
            "profile {name} mixes memory modes {memory} and {}: the driver sets one memory mode for all GPUs of a hive",
            other.memory
        ));
    }
    let mut free = (0..total).filter(|i| !skipped.contains(i));
    let mut assignments = Vec::new();
    for entry in &profile.entries {
        let count = entry.count.map_or(remainder, |c| c as usize);
        for index in free.by_ref().take(count) {
            let gpu = gpus[index];
            let current =
                |mode: &Option<String>| mode.as_deref().unwrap_or("").to_ascii_uppercase();
            if gpu.available_compute_partitions.is_empty() || gpu.compute_partition.is_none() {
                return Err(format!(
                    "GPU {index} ({}) cannot be partitioned: it offers no partition modes",
                    gpu.bdf
                ));
            }
            for (mode, available, what) in [
                (&entry.compute, &gpu.available_compute_partitions, "compute"),
                (&entry.memory, &gpu.available_memory_partitions, "memory"),
            ] {
                if !modes::offered(available, mode) {
                    return Err(format!(
                        "GPU {index} ({}) does not offer {what} mode {mode}; it offers {}",
                        gpu.bdf,
                        upper(available)
                    ));
                }
            }
            if !modes::compatible(&entry.compute, &entry.memory) {
                return Err(format!(
                    "the driver does not run compute mode {} with memory mode {}",
                    entry.compute, entry.memory
                ));
            }
            assignments.push(Assignment {
                index,
                bdf: gpu.bdf.clone(),
                compute: entry.compute.clone(),
                memory: entry.memory.clone(),
                current_compute: current(&gpu.compute_partition),
                current_memory: current(&gpu.memory_partition),
            });
        }
    }
    skipped.sort_unstable();
    Ok(Plan {
        assignments,
        skipped: skipped.into_iter().map(|i| gpus[i].bdf.clone()).collect(),
    })
}

fn upper(modes: &[String]) -> String {
    modes
        .iter()
        .map(|m| m.to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::profiles::{Entry, ProfileSet};

    fn mi300x(n: usize) -> Vec<Gpu> {
        (0..n)
            .map(|i| Gpu {
                bdf: format!("0000:{:02x}:00.0", 0x05 + i * 0x20),
                compute_partition: Some("spx".into()),
                memory_partition: Some("nps1".into()),
                available_compute_partitions: ["spx", "dpx", "qpx", "cpx"].map(String::from).into(),
                available_memory_partitions: ["nps1", "nps4"].map(String::from).into(),
                ..Gpu::default()
            })
            .rev() // out of order: the plan sorts by address
            .collect()
    }

    fn entry(compute: &str, memory: &str, count: Option<u32>) -> Entry {
        Entry {
            compute: compute.into(),
            memory: memory.into(),
            count,
        }
    }

    #[test]
    fn a_builtin_profile_takes_every_gpu() {
        let set = ProfileSet::builtin();
        let plan = plan("cpx_nps4_all", &set.profiles["cpx_nps4_all"], &mi300x(8)).unwrap();
        assert_eq!(plan.assignments.len(), 8);
        assert_eq!(plan.changes().count(), 8);
        assert_eq!(plan.assignments[0].bdf, "0000:05:00.0");
        assert!(
            plan.assignments
                .iter()
                .all(|a| a.memory_changes() && a.compute_changes())
        );
        assert_eq!(plan.assignments[0].partitions(), 8);
        // The default on a node already at SPX/NPS1 changes nothing.
        let default = super::plan("default", &set.profiles["default"], &mi300x(8)).unwrap();
        assert!(default.is_done());
    }

    #[test]
    fn a_heterogeneous_profile_fills_the_free_gpus_in_address_order() {
        let profile = Profile {
            skipped: vec![3, 6],
            entries: vec![entry("CPX", "NPS1", Some(2)), entry("SPX", "NPS1", None)],
        };
        let plan = plan("mixed", &profile, &mi300x(8)).unwrap();
        let indices: Vec<(usize, &str)> = plan
            .assignments
            .iter()
            .map(|a| (a.index, a.compute.as_str()))
            .collect();
        assert_eq!(
            indices,
            [
                (0, "CPX"),
                (1, "CPX"),
                (2, "SPX"),
                (4, "SPX"),
                (5, "SPX"),
                (7, "SPX")
            ]
        );
        assert_eq!(plan.skipped, ["0000:65:00.0", "0000:c5:00.0"]);
        assert_eq!(plan.changes().count(), 2);
    }

    #[test]
    fn profiles_that_do_not_fit_the_node_are_rejected_with_a_reason() {
        let gpus = mi300x(8);
        let cases = [
            (
                Profile {
                    skipped: vec![],
                    entries: vec![entry("CPX", "NPS1", Some(4))],
                },
                "assigns 4 GPUs and skips 0, but the node has 8",
            ),
            (
                Profile {
                    skipped: vec![1],
                    entries: vec![entry("CPX", "NPS1", Some(8))],
                },
                "assigns 8 GPUs and skips 1, but the node has 8",
            ),
            (
                Profile {
                    skipped: vec![9],
                    entries: vec![entry("CPX", "NPS1", None)],
                },
                "skips GPU 9, but the node's GPUs are 0 to 7",
            ),
            (
                Profile {
                    skipped: vec![2, 2],
                    entries: vec![entry("CPX", "NPS1", None)],
                },
                "skips GPU 2 twice",
            ),
            (
                Profile {
                    skipped: vec![],
                    entries: vec![entry("DPX", "NPS2", None)],
                },
                "does not offer memory mode NPS2; it offers NPS1, NPS4",
            ),
            (
                Profile {
                    skipped: vec![],
                    entries: vec![entry("SPX", "NPS4", None)],
                },
                "does not run compute mode SPX with memory mode NPS4",
            ),
            (
                Profile {
                    skipped: vec![],
                    entries: vec![entry("CPX", "NPS4", Some(4)), entry("SPX", "NPS1", Some(4))],
                },
                "mixes memory modes NPS4 and NPS1",
            ),
        ];
        for (profile, expected) in cases {
            let err = plan("p", &profile, &gpus).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
        let mut flat = mi300x(1);
        flat[0].available_compute_partitions.clear();
        flat[0].compute_partition = None;
        let err = plan("p", &ProfileSet::builtin().profiles["default"], &flat).unwrap_err();
        assert!(err.contains("cannot be partitioned"), "{err}");
        assert!(plan("p", &ProfileSet::builtin().profiles["default"], &[]).is_err());
    }
}
