//! The simulated driver's answers to sysfs writes: what the amdgpu driver
//! does when `current_compute_partition` or `current_memory_partition` of a
//! GPU is written.
//!
//! - A mode the GPU does not offer (`available_*_partition`), or a compute
//!   mode the driver does not run with the GPU's memory mode, is refused with
//!   `EINVAL`, as the kernel answers.
//! - The mode the GPU already has is accepted and changes nothing.
//! - A new compute mode re-creates the GPU's partitions: their DRM nodes,
//!   platform devices and KFD topology nodes (the whole topology, with
//!   `generation_id` bumped). Here that happens when the writer settles
//!   ([`AttrStore::settle`]), once for the modes written since, rather than
//!   once per write: a profile writes up to two modes per GPU, and laying out
//!   a 64-partition topology sixteen times took most of a minute on a disk.
//!   A reader waiting for the new partitions sees the same end.
//! - A new memory mode takes effect at once, as it does with a driver
//!   reload (ROCm 6's amd-smi reloads the driver itself); a compute mode it
//!   no longer runs with becomes the one with most partitions that it does,
//!   as the driver picks after the reload.
//! - Other attributes are read-only here (`EACCES`, as opening a 0444
//!   sysfs file for writing gives).
//!
//! Simplifications, stated: the kernel answers `EBUSY` to a compute switch
//! while any process has `/dev/kfd` open; this model does not look at
//! processes (the partitioner checks holders itself before it writes). A
//! hive's memory mode is set per GPU here, not per hive.
//!
//! This module owns those semantics only; it writes through the simulator's
//! layout ([`super::set_modes`], [`super::settle_partitions`]).

use std::io;

use super::{SimError, SimSpec, gpu_addresses, set_modes, settle_partitions, spec_of};
use crate::device::modes;
use crate::host::{AttrStore, HostError, HostRoot, Result};

/// The simulated driver of the simulated host under a root.
#[derive(Clone, Debug)]
pub struct SimulatedKernel {
    host: HostRoot,
}

impl SimulatedKernel {
    pub fn new(host: HostRoot) -> Self {
        Self { host }
    }
}

/// Whether `host` holds a tree the simulator wrote: where a
/// [`SimulatedKernel`] answers writes instead of the real kernel.
pub fn is_simulated(host: &HostRoot) -> bool {
    host.exists(super::MARKER)
}

/// The store for `host`: the simulated driver on a simulated host, the
/// kernel's own sysfs files anywhere else.
pub fn store_for(host: &HostRoot) -> std::sync::Arc<dyn AttrStore> {
    if is_simulated(host) {
        std::sync::Arc::new(SimulatedKernel::new(host.clone()))
    } else {
        std::sync::Arc::new(crate::host::Sysfs(host.clone()))
    }
}

impl AttrStore for SimulatedKernel {
    fn store(&self, host_path: &str, value: &str) -> Result<()> {
        let errno = |code: i32| HostError::Io {
            path: self.host.path(host_path),
            source: io::Error::from_raw_os_error(code),
        };
        let (dir, attr) = host_path.rsplit_once('/').unwrap_or(("", host_path));
        let bdf = dir.rsplit('/').next().unwrap_or_default();
        let spec = spec_of(&self.host).map_err(|e| match e {
            SimError::Host(e) => e,
            other => HostError::Io {
                path: self.host.path(host_path),
                source: io::Error::other(other.to_string()),
            },
        })?;
        let Some(index) = gpu_addresses(&spec).iter().position(|b| b == bdf) else {
            return Err(errno(libc::ENOENT));
        };
        let Some((compute, memory)) = spec.modes(index) else {
            // Not partitionable: the attributes do not exist.
            return Err(errno(libc::ENOENT));
        };
        let model = &spec.profile.model;
        let wanted = value.trim().to_ascii_lowercase();
        let next = match attr {
            "current_compute_partition" => {
                if !modes::offered(model.compute_modes, &wanted)
                    || !modes::compatible(&wanted, &memory)
                {
                    return Err(errno(libc::EINVAL));
                }
                (wanted, memory.clone())
            }
            "current_memory_partition" => {
                if !modes::offered(model.memory_modes, &wanted) {
                    return Err(errno(libc::EINVAL));
                }
                let compute = if modes::compatible(&compute, &wanted) {
                    compute.clone()
                } else {
                    model
                        .compute_modes
                        .iter()
                        .filter(|c| modes::compatible(c, &wanted))
                        .max_by_key(|c| modes::compute_partitions(c))
                        .map(|c| c.to_ascii_lowercase())
                        .ok_or_else(|| errno(libc::EINVAL))?
                };
                (compute, wanted)
            }
            _ => {
                return Err(if self.host.exists(host_path) {
                    errno(libc::EACCES)
                } else {
                    errno(libc::ENOENT)
                });
            }
        };
        if next == (compute, memory) {
            return Ok(());
        }
        let mut spec: SimSpec = spec;
        spec.gpu_partitions.insert(index, next);
        set_modes(&self.host, &spec, index)
    }

    /// Lays the partitions out for the modes written since the last time:
    /// once per batch, where the driver re-lays them per write (readers
    /// that wait for the new partitions see the same end; the work on a
    /// disk is a fraction).
    fn settle(&self) -> Result<()> {
        settle_partitions(&self.host).map_err(|e| match e {
            SimError::Host(e) => e,
            other => HostError::Io {
                path: self.host.root().to_path_buf(),
                source: io::Error::other(other.to_string()),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::discover;
    use crate::simulate::write_host;

    fn mi300x() -> (tempfile::TempDir, HostRoot, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = SimSpec::new("mi300x", None, None).unwrap();
        write_host(&host, &spec).unwrap();
        let bdfs = gpu_addresses(&spec);
        (dir, host, bdfs)
    }

    fn attr(bdf: &str, name: &str) -> String {
        format!("/sys/bus/pci/devices/{bdf}/{name}")
    }

    #[test]
    fn a_compute_write_re_creates_that_gpus_partitions_only() {
        let (_dir, host, bdfs) = mi300x();
        let kernel = SimulatedKernel::new(host.clone());
        let before = discover(&host);
        let generation = host
            .read_attr("/sys/class/kfd/kfd/topology/generation_id")
            .unwrap();
        kernel
            .store(&attr(&bdfs[2], "current_compute_partition"), "CPX\n")
            .unwrap();
        kernel.settle().unwrap();
        let after = discover(&host);
        assert!(after.warnings.is_empty(), "{:?}", after.warnings);
        let gpu = after.gpus.iter().find(|g| g.bdf == bdfs[2]).unwrap();
        assert_eq!(gpu.compute_partition.as_deref(), Some("cpx"));
        assert_eq!(gpu.partitions.len(), 8);
        // The others are as they were, but for their KFD node ids: the
        // kernel numbers the rebuilt topology afresh.
        let renumbered = |g: &crate::device::model::Gpu| crate::device::model::Gpu {
            kfd_node: None,
            ..g.clone()
        };
        for (old, new) in before.gpus.iter().zip(&after.gpus) {
            if new.bdf != bdfs[2] {
                assert_eq!(renumbered(old), renumbered(new), "{} is untouched", new.bdf);
            }
        }
        assert_eq!(after.gpus.len(), before.gpus.len());
        assert_ne!(
            host.read_attr("/sys/class/kfd/kfd/topology/generation_id")
                .unwrap(),
            generation
        );
        // Written through the driver's link, lower case: the same GPU.
        kernel
            .store(
                &format!(
                    "/sys/bus/pci/drivers/amdgpu/{}/current_compute_partition",
                    bdfs[2]
                ),
                "spx",
            )
            .unwrap();
        kernel.settle().unwrap();
        let back = discover(&host);
        assert_eq!(back.gpus, before.gpus, "back as it was");
    }

    /// Every file and link under the host root, with its contents (or
    /// target), but the KFD topology, which the kernel rebuilds whole on any
    /// change, and the simulator's own bookkeeping under `/sys/.gpu-operator-*`.
    fn tree(host: &HostRoot) -> std::collections::BTreeMap<String, Vec<u8>> {
        let mut out = std::collections::BTreeMap::new();
        let mut stack = vec![host.root().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let rel = format!("/{}", path.strip_prefix(host.root()).unwrap().display());
                if rel.starts_with("/sys/class/kfd") || rel.starts_with("/sys/.gpu-operator") {
                    continue;
                }
                let kind = entry.file_type().unwrap();
                if kind.is_symlink() {
                    let target = std::fs::read_link(&path).unwrap();
                    out.insert(rel, target.display().to_string().into_bytes());
                } else if kind.is_dir() {
                    stack.push(path);
                } else {
                    out.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
        out
    }

    /// A mode write changes that GPU's files only: its attributes and
    /// gpu_metrics, its partitions' DRM nodes and platform devices; nothing
    /// of the other GPUs (the KFD topology aside, renumbered whole as the
    /// kernel does).
    #[test]
    fn a_partition_write_changes_that_gpus_files_only() {
        let (_dir, host, bdfs) = mi300x();
        let kernel = SimulatedKernel::new(host.clone());
        let before = tree(&host);
        kernel
            .store(&attr(&bdfs[2], "current_compute_partition"), "CPX")
            .unwrap();
        kernel.settle().unwrap();
        let after = tree(&host);
        let changed: Vec<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert!(!changed.is_empty());
        // What belongs to the GPU: its own directory, and the DRM nodes and
        // platform devices its partitions have after the write.
        let gpu = discover(&host)
            .gpus
            .into_iter()
            .find(|g| g.bdf == bdfs[2])
            .unwrap();
        let minors: Vec<String> = gpu
            .partitions
            .iter()
            .flat_map(|p| {
                [p.card, p.render_minor]
                    .into_iter()
                    .flatten()
                    .map(|m| m.to_string())
            })
            .collect();
        let platforms: Vec<&str> = gpu
            .partitions
            .iter()
            .filter_map(|p| p.platform_device.as_deref())
            .collect();
        let its_own = |path: &str| {
            path.contains(&bdfs[2])
                || platforms.iter().any(|d| path.contains(&format!("/{d}")))
                || minors.iter().any(|m| {
                    path.ends_with(&format!("/card{m}"))
                        || path.ends_with(&format!("/renderD{m}"))
                        || path.contains(&format!("/card{m}/"))
                        || path.contains(&format!("/renderD{m}/"))
                })
        };
        let others: Vec<&&String> = changed.iter().filter(|p| !its_own(p)).collect();
        assert!(
            others.is_empty(),
            "changed beyond GPU {}: {others:#?}",
            bdfs[2]
        );
        for other in &bdfs {
            if other != &bdfs[2] {
                assert!(
                    !changed.iter().any(|p| p.contains(other.as_str())),
                    "{other} changed"
                );
            }
        }
    }

    #[test]
    fn refused_writes_answer_einval_and_change_nothing() {
        let (_dir, host, bdfs) = mi300x();
        let kernel = SimulatedKernel::new(host.clone());
        let before = discover(&host);
        for (name, value) in [
            ("current_compute_partition", "XPX"),
            // Not offered by MI300X.
            ("current_compute_partition", "TPX"),
            ("current_memory_partition", "NPS2"),
        ] {
            let err = kernel.store(&attr(&bdfs[0], name), value).unwrap_err();
            let HostError::Io { source, .. } = &err else {
                panic!("{err}")
            };
            assert_eq!(source.raw_os_error(), Some(libc::EINVAL), "{name}={value}");
        }
        // QPX runs with NPS4, SPX does not: after NPS4, SPX is refused.
        kernel
            .store(&attr(&bdfs[0], "current_memory_partition"), "NPS4")
            .unwrap();
        kernel.settle().unwrap();
        let err = kernel
            .store(&attr(&bdfs[0], "current_compute_partition"), "SPX")
            .unwrap_err();
        assert!(err.to_string().contains("Invalid argument"), "{err}");
        // Read-only and unknown attributes.
        let err = kernel
            .store(&attr(&bdfs[0], "available_compute_partition"), "CPX")
            .unwrap_err();
        assert!(err.to_string().contains("Permission denied"), "{err}");
        let err = kernel
            .store(&attr("0000:99:00.0", "current_compute_partition"), "CPX")
            .unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(discover(&host).gpus.len(), before.gpus.len());
    }

    #[test]
    fn a_memory_write_applies_at_once_and_picks_a_compute_mode_it_runs_with() {
        let (_dir, host, bdfs) = mi300x();
        let kernel = SimulatedKernel::new(host.clone());
        kernel
            .store(&attr(&bdfs[1], "current_memory_partition"), "nps4")
            .unwrap();
        kernel.settle().unwrap();
        let gpu = discover(&host)
            .gpus
            .into_iter()
            .find(|g| g.bdf == bdfs[1])
            .unwrap();
        assert_eq!(gpu.memory_partition.as_deref(), Some("nps4"));
        assert_eq!(gpu.compute_partition.as_deref(), Some("cpx"));
        assert_eq!(gpu.partitions.len(), 8);
        // The same mode again: accepted, nothing rewritten.
        let generation = host
            .read_attr("/sys/class/kfd/kfd/topology/generation_id")
            .unwrap();
        kernel
            .store(&attr(&bdfs[1], "current_memory_partition"), "NPS4")
            .unwrap();
        kernel.settle().unwrap();
        assert_eq!(
            host.read_attr("/sys/class/kfd/kfd/topology/generation_id")
                .unwrap(),
            generation
        );
    }

    #[test]
    fn ras_counts_survive_a_repartition() {
        let (_dir, host, bdfs) = mi300x();
        crate::simulate::set_ecc_counts(&host, &bdfs[0], "umc", 7, 0).unwrap();
        let kernel = SimulatedKernel::new(host.clone());
        kernel
            .store(&attr(&bdfs[0], "current_compute_partition"), "CPX")
            .unwrap();
        kernel.settle().unwrap();
        let umc = host
            .read_string(format!(
                "/sys/bus/pci/devices/{}/ras/umc_err_count",
                bdfs[0]
            ))
            .unwrap();
        assert!(umc.contains("ue: 7"), "{umc}");
    }

    #[test]
    fn the_store_for_a_host_follows_the_marker() {
        let (_dir, host, _) = mi300x();
        assert!(format!("{:?}", store_for(&host)).contains("SimulatedKernel"));
        let plain = tempfile::tempdir().unwrap();
        assert!(format!("{:?}", store_for(&HostRoot::new(plain.path()))).contains("Sysfs"));
    }
}
