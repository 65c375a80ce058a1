//! A cheap fingerprint of what discovery depends on, for deciding when a full
//! discovery is worth running.
//!
//! A full [`discover`](super::discover) of an MI300X in CPX mode opens over a
//! thousand files. Repartitioning, hot-add, removal, unbinding and driver
//! (un)loading all change at least one of a few entries:
//! - whether `/sys/module/amdgpu` and `/dev/kfd` exist;
//! - the listing of the amdgpu PCI driver directory;
//! - each bound GPU's `current_compute_partition` and `current_memory_partition`;
//! - the listing of `/sys/class/drm` (partition DRM nodes come and go there);
//! - the KFD topology's `generation_id` (the kernel bumps it on every topology
//!   change) and the listing of its `nodes/`.
//!
//! Reading those costs a few dozen system calls. The watch compares fingerprints
//! each tick and runs the full discovery only when they differ (and at a long
//! safety interval). This module owns the choice of those entries and nothing
//! else: it does not interpret them.

use crate::host::HostRead;

use super::{AMDGPU_PCI_DIRS, is_bdf, kfd};

const DRM_CLASS_DIR: &str = "/sys/class/drm";

/// What the watched entries held at one moment. Equal fingerprints mean that
/// nothing discovery cares about was seen to change; they are only compared,
/// never interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint(Vec<String>);

impl Fingerprint {
    /// Reads the fingerprint of `host`. Never fails: an unreadable entry is
    /// recorded as its error kind, so that it changing is still seen.
    pub fn read(host: &dyn HostRead) -> Self {
        let mut entries = Vec::with_capacity(32);
        for path in ["/sys/module/amdgpu", "/dev/kfd"] {
            entries.push(format!(
                "{path} {:?}",
                host.exists(path).map_err(|e| io_kind(&e))
            ));
        }
        let mut bound = None;
        for dir in AMDGPU_PCI_DIRS {
            match host.list_dir(dir) {
                Ok(names) => {
                    bound = Some((dir, names));
                    break;
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => entries.push(format!("{dir} {:?}", io_kind(&e))),
            }
        }
        if let Some((dir, names)) = bound {
            entries.push(format!("{dir} {}", names.join(" ")));
            for bdf in names.iter().filter(|n| is_bdf(n)) {
                for attr in ["current_compute_partition", "current_memory_partition"] {
                    entries.push(value(host, &format!("{dir}/{bdf}/{attr}")));
                }
            }
        }
        entries.push(listing(host, DRM_CLASS_DIR));
        entries.push(value(host, &format!("{}/generation_id", kfd::TOPOLOGY_DIR)));
        entries.push(listing(host, &format!("{}/nodes", kfd::TOPOLOGY_DIR)));
        Self(entries)
    }
}

fn value(host: &dyn HostRead, path: &str) -> String {
    match host.read_optional_attr(path) {
        Ok(Some(text)) => format!("{path} {text}"),
        Ok(None) => format!("{path} -"),
        Err(e) => format!("{path} {:?}", io_kind(&e)),
    }
}

fn listing(host: &dyn HostRead, path: &str) -> String {
    match host.list_dir_or_empty(path) {
        Ok(names) => format!("{path} {}", names.join(" ")),
        Err(e) => format!("{path} {:?}", io_kind(&e)),
    }
}

/// The kind of an I/O error, without the path and message: stable across reads.
fn io_kind(e: &crate::host::HostError) -> Option<std::io::ErrorKind> {
    match e {
        crate::host::HostError::Io { source, .. } => Some(source.kind()),
        crate::host::HostError::Parse { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::bounded::{Limits, run_bounded};
    use crate::host::HostRoot;
    use crate::host::reader::BoundedReader;
    use crate::simulate::{self, SimSpec};

    fn fp(host: &HostRoot) -> Fingerprint {
        let reader = BoundedReader::new(host.clone(), 2);
        run_bounded(&reader, Limits::default(), |h| Fingerprint::read(h))
            .unwrap()
            .0
    }

    fn sim(spec: &SimSpec) -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        simulate::write_host(&host, spec).unwrap();
        (dir, host)
    }

    #[test]
    fn stable_while_nothing_changes_and_telemetry_moves() {
        let spec = SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap();
        let (_dir, host) = sim(&spec);
        let first = fp(&host);
        simulate::advance_telemetry(&host, &spec, 7).unwrap();
        simulate::set_ecc_counts(&host, "0000:05:00.0", "umc", 1, 0).unwrap();
        assert_eq!(fp(&host), first);
    }

    #[test]
    fn repartition_hot_add_unbind_and_kfd_removal_change_it() {
        let (_dir, host) = sim(&SimSpec::new("mi300x", Some(2), None).unwrap());
        let mut last = fp(&host);
        let mut expect_change = |what: &str| {
            let now = fp(&host);
            assert_ne!(now, last, "{what} not seen");
            last = now;
        };
        simulate::write_host(
            &host,
            &SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap(),
        )
        .unwrap();
        expect_change("repartition");
        simulate::write_host(
            &host,
            &SimSpec::new("mi300x", Some(3), Some("cpx_nps4")).unwrap(),
        )
        .unwrap();
        expect_change("hot-add");
        host.remove_all("/sys/bus/pci/drivers/amdgpu/0000:05:00.0")
            .unwrap();
        expect_change("unbind");
        host.remove_all("/dev/kfd").unwrap();
        expect_change("/dev/kfd removal");
        // Only the memory partition of one GPU.
        host.write(
            "/sys/bus/pci/drivers/amdgpu/0000:27:00.0/current_memory_partition",
            "NPS1\n",
        )
        .unwrap();
        expect_change("memory repartition");
        host.write("/sys/class/kfd/kfd/topology/generation_id", "9\n")
            .unwrap();
        expect_change("KFD generation");
    }
}
