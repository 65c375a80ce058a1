//! A cheap fingerprint of what discovery depends on, for deciding when a full
//! discovery is worth running.
//!
//! A full [`discover`](super::discover) of an MI300X in CPX mode opens over a
//! thousand files. Repartitioning, hot-add, removal, unbinding and driver
//! (un)loading all change at least one of a few entries:
//! - whether `/sys/module/amdgpu` and `/dev/kfd` exist, and the module's
//!   `srcversion` (one module replaced by another between two ticks leaves
//!   everything else as it was);
//! - the listing of the amdgpu PCI driver directory;
//! - each bound GPU's `current_compute_partition` and `current_memory_partition`;
//! - the listing of `/sys/class/drm` (partition DRM nodes come and go there);
//! - the KFD topology's `generation_id` (the kernel bumps it on every topology
//!   change) and the listing of its `nodes/`.
//!
//! Reading those costs a few dozen system calls, in one request to the reader
//! while the bound GPUs stay the same (the last fingerprint names their
//! partition files, [`Fingerprint::read_after`]). The watch compares fingerprints
//! each tick and runs the full discovery only when they differ (and at a long
//! safety interval). This module owns the choice of those entries and nothing
//! else: it does not interpret them.

use crate::host::{HostAnswer, HostError, HostOp, HostRead};

use super::{AMDGPU_PCI_DIRS, is_bdf, kfd};

const DRM_CLASS_DIR: &str = "/sys/class/drm";
const SRCVERSION: &str = "/sys/module/amdgpu/srcversion";

/// What the watched entries held at one moment. Equal fingerprints mean that
/// nothing discovery cares about was seen to change; they are only compared,
/// never interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    entries: Vec<String>,
    /// The partition files of the GPUs found bound (what `entries` holds
    /// them for): where the next look can ask for them at once.
    partition_paths: Vec<String>,
}

impl Fingerprint {
    /// The first request [`Fingerprint::read_after`] makes after `last`:
    /// the fixed entries and the partition modes of the GPUs bound at
    /// `last`. While those GPUs stay bound it is the only one, so a caller
    /// can read its answers ahead (the change stream's tick does, on the
    /// runtime, without a blocking thread).
    pub fn first_batch(last: Option<&Fingerprint>) -> Vec<(HostOp, String)> {
        let hinted: &[String] = last.map_or(&[], |l| &l.partition_paths);
        let fixed = [
            (HostOp::Exists, "/sys/module/amdgpu".to_owned()),
            (HostOp::Exists, "/dev/kfd".to_owned()),
            (HostOp::List, AMDGPU_PCI_DIRS[0].to_owned()),
            (HostOp::List, DRM_CLASS_DIR.to_owned()),
            (HostOp::Read, format!("{}/generation_id", kfd::TOPOLOGY_DIR)),
            (HostOp::List, format!("{}/nodes", kfd::TOPOLOGY_DIR)),
            (HostOp::Read, SRCVERSION.to_owned()),
        ];
        let mut first = fixed.to_vec();
        first.extend(hinted.iter().map(|p| (HostOp::Read, p.clone())));
        first
    }

    /// Reads the fingerprint of `host`. Never fails: an unreadable entry is
    /// recorded as its error kind, so that it changing is still seen. The
    /// entries are asked for in two batches ([`HostRead::read_many`]): the
    /// fixed ones, then the partition modes of the GPUs found bound.
    pub fn read(host: &dyn HostRead) -> Self {
        Self::read_after(host, None)
    }

    /// [`Fingerprint::read`], asking for the partition modes of the GPUs
    /// bound at the `last` look together with the fixed entries: one batch
    /// while the bound GPUs stay the same, a second one only when they
    /// changed. The result is the same as without `last`.
    pub fn read_after(host: &dyn HostRead, last: Option<&Fingerprint>) -> Self {
        let hinted: &[String] = last.map_or(&[], |l| &l.partition_paths);
        let generation = format!("{}/generation_id", kfd::TOPOLOGY_DIR);
        let kfd_nodes = format!("{}/nodes", kfd::TOPOLOGY_DIR);
        let first = Self::first_batch(last);
        let first: Vec<(HostOp, &str)> = first.iter().map(|(op, p)| (*op, p.as_str())).collect();
        let mut answers = host.read_many(&first).into_iter();
        let mut next = || {
            answers.next().unwrap_or_else(|| {
                Err(HostError::Io {
                    path: host.host().path("/"),
                    source: std::io::Error::other("no answer"),
                })
            })
        };
        let mut entries = Vec::with_capacity(32);
        let mut partition_paths = Vec::new();
        for path in ["/sys/module/amdgpu", "/dev/kfd"] {
            let exists = next().and_then(|a| match a {
                HostAnswer::Exists(exists) => Ok(exists),
                _ => Err(mismatch(host, path)),
            });
            entries.push(format!("{path} {:?}", exists.map_err(|e| io_kind(&e))));
        }
        let mut first_dir = Some(next().and_then(|a| names(host, AMDGPU_PCI_DIRS[0], a)));
        let drm = next().and_then(|a| names(host, DRM_CLASS_DIR, a));
        let generation_value = next().and_then(|a| match a {
            HostAnswer::Text(text) => Ok(text),
            _ => Err(mismatch(host, &generation)),
        });
        let kfd_listing = next().and_then(|a| names(host, &kfd_nodes, a));
        let srcversion = next().and_then(|a| match a {
            HostAnswer::Text(text) => Ok(text),
            _ => Err(mismatch(host, SRCVERSION)),
        });
        entries.push(value(SRCVERSION, srcversion));

        let mut hinted_answers = answers;
        let mut bound = None;
        for dir in AMDGPU_PCI_DIRS {
            let listed = match first_dir.take() {
                Some(listed) => listed,
                None => host.list_dir(dir),
            };
            match listed {
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
            let paths: Vec<String> = names
                .iter()
                .filter(|n| is_bdf(n))
                .flat_map(|bdf| {
                    [super::modes::COMPUTE_ATTR, super::modes::MEMORY_ATTR]
                        .map(|attr| format!("{dir}/{bdf}/{attr}"))
                })
                .collect();
            let mut answers = if paths == hinted {
                std::mem::take(&mut hinted_answers)
            } else {
                let requests: Vec<(HostOp, &str)> =
                    paths.iter().map(|p| (HostOp::Read, p.as_str())).collect();
                host.read_many(&requests).into_iter()
            };
            for path in &paths {
                let answer = answers.next().unwrap_or_else(|| Err(mismatch(host, path)));
                entries.push(value(
                    path,
                    answer.and_then(|a| match a {
                        HostAnswer::Text(text) => Ok(text),
                        _ => Err(mismatch(host, path)),
                    }),
                ));
            }
            partition_paths = paths;
        }
        entries.push(listing(DRM_CLASS_DIR, drm));
        entries.push(value(&generation, generation_value));
        entries.push(listing(&kfd_nodes, kfd_listing));
        Self {
            entries,
            partition_paths,
        }
    }
}

fn names(host: &dyn HostRead, path: &str, answer: HostAnswer) -> Result<Vec<String>, HostError> {
    match answer {
        HostAnswer::Names(names) => Ok(names),
        _ => Err(mismatch(host, path)),
    }
}

/// An answer of the wrong kind: only a bug in a [`HostRead`] gives one.
fn mismatch(host: &dyn HostRead, path: &str) -> HostError {
    HostError::Io {
        path: host.host().path(path),
        source: std::io::Error::other("answer of the wrong kind"),
    }
}

/// An attribute's entry, as [`HostRead::read_optional_attr`] sees it.
fn value(path: &str, read: Result<String, HostError>) -> String {
    match read {
        Ok(text) if text.is_empty() => format!("{path} -"),
        Ok(text) => format!("{path} {text}"),
        Err(e) if e.is_not_found() => format!("{path} -"),
        Err(e) => format!("{path} {:?}", io_kind(&e)),
    }
}

/// A directory's entry, as [`HostRead::list_dir_or_empty`] sees it.
fn listing(path: &str, listed: Result<Vec<String>, HostError>) -> String {
    match listed {
        Ok(names) => format!("{path} {}", names.join(" ")),
        Err(e) if e.is_not_found() => format!("{path} "),
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

    /// Counts the batches a fingerprint asks for, and passes them on whole
    /// (`batched`) or asks one file at a time.
    struct Probe<'a> {
        host: &'a dyn HostRead,
        batched: bool,
        batches: std::cell::Cell<usize>,
    }

    impl<'a> Probe<'a> {
        fn new(host: &'a dyn HostRead, batched: bool) -> Self {
            Self {
                host,
                batched,
                batches: std::cell::Cell::new(0),
            }
        }
    }

    impl HostRead for Probe<'_> {
        fn host(&self) -> &HostRoot {
            self.host.host()
        }
        fn read_attr(&self, path: &str) -> crate::host::Result<String> {
            self.host.read_attr(path)
        }
        fn list_dir(&self, path: &str) -> crate::host::Result<Vec<String>> {
            self.host.list_dir(path)
        }
        fn exists(&self, path: &str) -> crate::host::Result<bool> {
            self.host.exists(path)
        }
        fn read_many(&self, requests: &[(HostOp, &str)]) -> Vec<crate::host::Result<HostAnswer>> {
            self.batches.set(self.batches.get() + 1);
            if self.batched {
                return self.host.read_many(requests);
            }
            crate::host::read_each(self, requests)
        }
    }

    #[test]
    fn batched_reads_give_the_fingerprint_one_by_one_reads_give() {
        let spec = SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap();
        let (_dir, host) = sim(&spec);
        let reader = BoundedReader::new(host.clone(), 2);
        let both = || {
            run_bounded(&reader, Limits::default(), |h| {
                (
                    Fingerprint::read(h),
                    Fingerprint::read(&Probe::new(h, false)),
                )
            })
            .unwrap()
            .0
        };
        let (batched, single) = both();
        assert_eq!(batched, single);
        assert!(batched.entries.len() > 8, "{batched:?}");
        // Absent entries, an empty directory, the driver directory in its
        // second place, no driver.
        host.remove_all("/sys/class/kfd/kfd/topology/generation_id")
            .unwrap();
        host.remove_all("/sys/class/drm").unwrap();
        host.remove_all("/sys/class/kfd/kfd/topology/nodes")
            .unwrap();
        host.create_dir_all("/sys/class/kfd/kfd/topology/nodes")
            .unwrap();
        let (batched, single) = both();
        assert_eq!(batched, single);
        host.remove_all("/sys/bus/pci/drivers/amdgpu").unwrap();
        host.remove_all("/sys/module/amdgpu/drivers/pci:amdgpu")
            .unwrap();
        host.create_dir_all("/sys/module/amdgpu/drivers/pci:amdgpu")
            .unwrap();
        let (batched, single) = both();
        assert_eq!(batched, single);
        host.remove_all("/sys/module/amdgpu").unwrap();
        host.remove_all("/dev/kfd").unwrap();
        let (batched, single) = both();
        assert_eq!(batched, single);
    }

    #[test]
    fn a_look_after_the_last_takes_one_batch_while_the_bound_gpus_stay() {
        let (_dir, host) = sim(&SimSpec::new("mi300x", Some(2), None).unwrap());
        let reader = BoundedReader::new(host.clone(), 2);
        let look = |last: Option<&Fingerprint>| {
            run_bounded(&reader, Limits::default(), |h| {
                let probe = Probe::new(h, true);
                let fingerprint = Fingerprint::read_after(&probe, last);
                (fingerprint, probe.batches.get())
            })
            .unwrap()
            .0
        };
        let (first, batches) = look(None);
        assert_eq!(batches, 2, "the first look finds the GPUs, then asks");
        let (again, batches) = look(Some(&first));
        assert_eq!((&again, batches), (&first, 1));
        // A GPU more: the hint is stale, and the result as without one.
        simulate::write_host(&host, &SimSpec::new("mi300x", Some(3), None).unwrap()).unwrap();
        let (after_add, batches) = look(Some(&first));
        assert_eq!(batches, 2);
        assert_eq!(after_add, look(None).0);
        assert_ne!(after_add, first);
        // A repartition with the same GPUs is seen in the one batch.
        simulate::write_host(
            &host,
            &SimSpec::new("mi300x", Some(3), Some("cpx_nps4")).unwrap(),
        )
        .unwrap();
        let (repartitioned, batches) = look(Some(&after_add));
        assert_eq!(batches, 1);
        assert_ne!(repartitioned, after_add);
        assert_eq!(repartitioned, look(None).0);
    }

    /// The change stream's usual tick reads the first batch ahead on the
    /// runtime: that gives the fingerprint a bounded scan gives, and gives
    /// none (the tick then scans as usual) where one batch is not enough.
    #[tokio::test]
    async fn read_ahead_gives_the_fingerprint_or_none() {
        use crate::device::bounded::read_ahead;
        let (_dir, host) = sim(&SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap());
        let reader = BoundedReader::new(host.clone(), 2);
        let ahead = |last: Fingerprint| {
            let reader = reader.clone();
            async move {
                let requests = Fingerprint::first_batch(Some(&last));
                read_ahead(&reader, Limits::default(), &requests, |h| {
                    Fingerprint::read_after(h, Some(&last))
                })
                .await
            }
        };
        let first = fp(&host);
        assert_eq!(ahead(first.clone()).await, Some(first.clone()));
        // A repartition is seen in the one batch.
        simulate::write_host(&host, &SimSpec::new("mi300x", Some(2), None).unwrap()).unwrap();
        let repartitioned = ahead(first.clone()).await;
        assert_eq!(repartitioned, Some(fp(&host)));
        assert_ne!(repartitioned, Some(first.clone()));
        // A GPU more needs a second batch: none.
        let before_add = fp(&host);
        simulate::write_host(&host, &SimSpec::new("mi300x", Some(3), None).unwrap()).unwrap();
        assert_eq!(ahead(before_add).await, None);
        // An empty listing may be an absent directory: none.
        let before_empty = fp(&host);
        host.remove_all("/sys/class/kfd/kfd/topology/nodes")
            .unwrap();
        host.create_dir_all("/sys/class/kfd/kfd/topology/nodes")
            .unwrap();
        assert_eq!(ahead(before_empty).await, None);
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
        // One module replaced by another between two looks.
        let other = simulate::SimModule {
            version: Some("6.14.1".into()),
            srcversion: "0123456789ABCDEF0123456".into(),
            ..Default::default()
        };
        simulate::load_module(&host, &other).unwrap();
        expect_change("the module replaced");
    }
}
