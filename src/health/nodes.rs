//! Whether every GPU's device nodes (`/dev/dri/cardN`, `/dev/dri/renderDN`)
//! and `/dev/kfd` exist, without stat'ing them all on every sample.
//!
//! Device nodes come and go only when the kernel (devtmpfs, udev) or an
//! administrator creates or removes them, and the kernel tells inotify
//! watchers of `/dev` and `/dev/dri` about each. So [`NodeWatch`] stats the
//! nodes when one of these happens: at the first sample; after an inotify
//! event in `/dev` or `/dev/dri` (or a lost event: queue overflow, a watch
//! removed); when the inventory names other nodes; after a check that could
//! not read every node; and at least every [`NodeWatch::SAFETY_INTERVAL`]
//! whatever inotify says. Without inotify (it cannot be set up, or setting it
//! up did not return in time) it stats them every sample, as before. A
//! change is thus seen by the next sample, as when every sample stats.
//!
//! When a check finds nodes missing, it reads the partition modes of the GPUs
//! they belong to: a GPU whose modes differ from the inventory's was
//! repartitioned, and its missing nodes are the old layout's (see
//! [`NodeStatus::relaid_out`]); they are checked again every sample until the
//! inventory names the new layout.
//!
//! The watches are set up before the first check, so that no change between
//! a check and the start of watching goes unseen. Setting up a watch resolves
//! a host path, which could block on a broken host mount: it runs on a
//! blocking thread, bounded by the sample's file timeout. Reading the inotify
//! descriptor never blocks.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::device::Inventory;
use crate::host::HostRoot;
use crate::host::inotify::DevWatch;
use crate::host::reader::{Answer, BoundedReader, Op};
use crate::telemetry::sample::{HostSample, device_nodes, drm_minors};
use crate::telemetry::sysfs::KFD_PATH;

const DEV: &str = "/dev";
const DRI: &str = "/dev/dri";

/// What the last check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// `/dev/kfd` exists; `None` when it could not be checked.
    pub kfd_present: Option<bool>,
    /// Host paths of the nodes checked.
    pub checked: BTreeSet<String>,
    /// Those that do not exist.
    pub missing: BTreeSet<String>,
    /// Every node (and `/dev/kfd`) got an answer.
    pub complete: bool,
    /// GPUs with missing nodes whose partition modes on sysfs are no longer
    /// those of the inventory: being repartitioned, or repartitioned and not
    /// yet discovered again. Their missing nodes are the old layout's, gone
    /// on purpose, and are no evidence (see [`relaid_out`]).
    pub relaid_out: BTreeSet<String>,
}

impl NodeStatus {
    /// Fills `sample`'s `kfd_present` and each GPU's `missing_nodes`.
    pub fn apply(&self, inventory: &Inventory, sample: &mut HostSample) {
        sample.kfd_present = self.kfd_present;
        for gpu in &inventory.gpus {
            if let Some(r) = sample.gpus.get_mut(&gpu.bdf) {
                // Nothing missing is the usual case: no node names to build.
                r.missing_nodes = if self.missing.is_empty() || self.relaid_out.contains(&gpu.bdf) {
                    Vec::new()
                } else {
                    device_nodes(gpu)
                        .into_iter()
                        .filter(|n| self.missing.contains(n))
                        .collect()
                };
            }
        }
    }
}

/// Why a check is due (for tests and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The last check still holds.
    No,
    First,
    /// inotify reported a change in `/dev` or `/dev/dri`, or lost events.
    Event,
    /// The inventory names other nodes.
    Inventory,
    /// The last check missed some answers.
    Incomplete,
    SafetyInterval,
    /// No inotify: every sample checks.
    NoWatch,
}

/// Watches the device nodes of an inventory; see the module doc.
pub struct NodeWatch {
    host: HostRoot,
    inotify: Option<DevWatch>,
    /// Set up (or given up on) yet.
    started: bool,
    status: Option<NodeStatus>,
    checked_at: Option<Instant>,
    /// The nodes the last inventory names, and the DRM minors they were
    /// named from: rebuilt only when those change, not on every sample.
    wanted: (Vec<Option<u32>>, Arc<BTreeSet<String>>),
}

impl NodeWatch {
    /// A check runs at least this often, whatever inotify says: a safety net
    /// for a `/dev` whose filesystem does not report changes.
    pub const SAFETY_INTERVAL: Duration = Duration::from_secs(10);

    pub fn new(host: HostRoot) -> Self {
        Self {
            host,
            inotify: None,
            started: false,
            status: None,
            checked_at: None,
            wanted: (Vec::new(), Arc::default()),
        }
    }

    /// The device nodes `inventory` names (see [`device_nodes`]).
    fn wanted(&mut self, inventory: &Inventory) -> Arc<BTreeSet<String>> {
        let minors: Vec<Option<u32>> = inventory.gpus.iter().flat_map(drm_minors).collect();
        if minors != self.wanted.0 {
            let nodes = inventory.gpus.iter().flat_map(device_nodes).collect();
            self.wanted = (minors, Arc::new(nodes));
        }
        self.wanted.1.clone()
    }

    /// True when changes are watched (else every sample checks).
    pub fn watching(&self) -> bool {
        self.inotify.is_some()
    }

    /// Sets up the watches, once; bounded by `timeout`.
    async fn start(&mut self, timeout: Duration) {
        if self.started {
            return;
        }
        self.started = true;
        let (dev, dri) = (self.host.path(DEV), self.host.path(DRI));
        let setup = tokio::task::spawn_blocking(move || DevWatch::open(&dev, &dri));
        self.inotify = match tokio::time::timeout(timeout, setup).await {
            Ok(Ok(Ok(inotify))) => Some(inotify),
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, "cannot watch /dev; checking device nodes every sample");
                None
            }
            Ok(Err(_)) | Err(_) => {
                tracing::debug!(
                    "watching /dev did not return in time; checking device nodes every sample"
                );
                None
            }
        };
    }

    /// Whether the nodes must be checked now; drains inotify's events.
    pub fn due(&mut self, wanted: &BTreeSet<String>, now: Instant) -> Due {
        // Drain first, so that events already seen do not count again.
        let event = match self.inotify.as_mut().map(DevWatch::drain) {
            Some(Ok(changed)) => changed,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "inotify failed; checking device nodes every sample");
                self.inotify = None;
                true
            }
            None => false,
        };
        let Some(status) = &self.status else {
            return Due::First;
        };
        if self.inotify.is_none() {
            Due::NoWatch
        } else if event {
            Due::Event
        } else if status.checked != *wanted {
            Due::Inventory
        } else if !status.complete {
            Due::Incomplete
        } else if self
            .checked_at
            .is_none_or(|at| now.saturating_duration_since(at) >= Self::SAFETY_INTERVAL)
        {
            Due::SafetyInterval
        } else {
            Due::No
        }
    }

    /// The nodes' status for this sample: checked through `reader` when due,
    /// else the last check's.
    pub async fn status(
        &mut self,
        reader: &BoundedReader,
        inventory: &Inventory,
        timeout: Duration,
    ) -> &NodeStatus {
        self.start(timeout).await;
        let wanted = self.wanted(inventory);
        let now = Instant::now();
        let due = self.due(&wanted, now);
        if due != Due::No || self.status.is_none() {
            // A watch lost with its directory (/dev/dri removed and made
            // again) is set up again before the nodes are looked at.
            if let Some(inotify) = self.inotify.as_mut()
                && !inotify.watching_dri()
            {
                rewatch_dri(inotify, timeout).await;
            }
            let mut status = check(reader, (*wanted).clone(), timeout).await;
            if !status.missing.is_empty() {
                status.relaid_out = relaid_out(reader, inventory, &status.missing, timeout).await;
                // Looked at again next sample, until the inventory names
                // the new layout's nodes.
                status.complete &= status.relaid_out.is_empty();
            }
            self.status = Some(status);
            self.checked_at = Some(now);
        }
        self.status.get_or_insert_with(NodeStatus::default)
    }
}

/// Stats every node and `/dev/kfd` in one batch.
async fn check(reader: &BoundedReader, wanted: BTreeSet<String>, timeout: Duration) -> NodeStatus {
    let mut requests: Vec<(Op, String)> = wanted.iter().map(|n| (Op::Exists, n.clone())).collect();
    requests.push((Op::Exists, KFD_PATH.to_owned()));
    let mut answers = reader.batch(requests, timeout).await;
    let mut complete = true;
    let kfd_present = match answers.pop() {
        Some(Ok(Answer::Exists(exists))) => Some(exists),
        _ => {
            complete = false;
            None
        }
    };
    let mut missing = BTreeSet::new();
    for (node, answer) in wanted.iter().zip(answers) {
        match answer {
            Ok(Answer::Exists(true)) => {}
            Ok(Answer::Exists(false)) => {
                missing.insert(node.clone());
            }
            // Unknown is no evidence (see the checks), but is asked again.
            _ => complete = false,
        }
    }
    NodeStatus {
        kfd_present,
        checked: wanted,
        missing,
        complete,
        relaid_out: BTreeSet::new(),
    }
}

/// The GPUs of `inventory` with a node in `missing` whose compute or memory
/// partition mode, read now, differs from the inventory's. A repartition
/// removes the old layout's partition nodes before the device watch has
/// looked again (up to its rescan interval later on a host without kernel
/// events; a moment later with them); until it has, the inventory names
/// nodes that are gone on purpose. A mode that cannot be read is no sign of
/// a repartition: the missing nodes then count, as they would without it.
/// Read only when a node is missing, so a healthy node costs nothing more.
async fn relaid_out(
    reader: &BoundedReader,
    inventory: &Inventory,
    missing: &BTreeSet<String>,
    timeout: Duration,
) -> BTreeSet<String> {
    let suspects: Vec<&crate::device::Gpu> = inventory
        .gpus
        .iter()
        .filter(|gpu| device_nodes(gpu).iter().any(|n| missing.contains(n)))
        .collect();
    crate::device::relayout::repartitioned(reader, &suspects, timeout).await
}

/// Watches `/dev/dri` again, bounded by `timeout`.
async fn rewatch_dri(watch: &mut DevWatch, timeout: Duration) {
    let rewatch = watch.dri_rewatch();
    let setup = tokio::task::spawn_blocking(move || rewatch.run());
    if let Ok(Ok(Ok(wd))) = tokio::time::timeout(timeout, setup).await {
        watch.dri_watched(wd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::discover;
    use crate::simulate::{self, SimSpec};

    fn rig() -> (tempfile::TempDir, HostRoot, Inventory, BoundedReader) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        simulate::write_host(
            &host,
            &SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap(),
        )
        .unwrap();
        let inventory = discover(&host);
        let reader = BoundedReader::new(host.clone(), 2);
        (dir, host, inventory, reader)
    }

    const T: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn checks_once_then_only_on_changes() {
        let (_dir, host, inventory, reader) = rig();
        let mut watch = NodeWatch::new(host.clone());
        let status = watch.status(&reader, &inventory, T).await.clone();
        assert!(watch.watching());
        assert_eq!(
            status.checked.len(),
            32,
            "2 GPUs, 8 partitions, card and render each"
        );
        assert!(status.missing.is_empty() && status.complete);
        assert_eq!(status.kfd_present, Some(true));
        let wanted = status.checked.clone();
        let reads = reader.stats().reads;
        watch.status(&reader, &inventory, T).await;
        assert_eq!(reader.stats().reads, reads, "nothing changed: nothing read");
        assert_eq!(watch.due(&wanted, Instant::now()), Due::No);

        // A node removed is seen by the next look.
        host.remove_all("/dev/dri/renderD129").unwrap();
        let status = watch.status(&reader, &inventory, T).await;
        assert_eq!(
            status.missing,
            BTreeSet::from(["/dev/dri/renderD129".to_owned()])
        );
        host.write("/dev/dri/renderD129", "").unwrap();
        assert!(
            watch
                .status(&reader, &inventory, T)
                .await
                .missing
                .is_empty()
        );
        host.remove_all("/dev/kfd").unwrap();
        assert_eq!(
            watch.status(&reader, &inventory, T).await.kfd_present,
            Some(false)
        );

        // /dev/dri removed and made again: watched again.
        host.remove_all("/dev/dri").unwrap();
        let status = watch.status(&reader, &inventory, T).await;
        assert_eq!(status.missing.len(), 32);
        simulate::write_host(
            &host,
            &SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap(),
        )
        .unwrap();
        assert!(
            watch
                .status(&reader, &inventory, T)
                .await
                .missing
                .is_empty()
        );
        watch.status(&reader, &inventory, T).await;
        host.remove_all("/dev/dri/card3").unwrap();
        let status = watch.status(&reader, &inventory, T).await;
        assert_eq!(
            status.missing,
            BTreeSet::from(["/dev/dri/card3".to_owned()])
        );
    }

    #[tokio::test]
    async fn other_nodes_in_the_inventory_are_checked() {
        let (_dir, host, inventory, reader) = rig();
        let mut watch = NodeWatch::new(host.clone());
        watch.status(&reader, &inventory, T).await;
        let mut fewer = inventory.clone();
        fewer.gpus.truncate(1);
        let wanted: BTreeSet<String> = fewer.gpus.iter().flat_map(device_nodes).collect();
        assert_eq!(watch.due(&wanted, Instant::now()), Due::Inventory);
        let status = watch.status(&reader, &fewer, T).await;
        assert_eq!(status.checked, wanted);
        let later = Instant::now() + NodeWatch::SAFETY_INTERVAL;
        assert_eq!(watch.due(&wanted, later), Due::SafetyInterval);
    }

    #[tokio::test]
    async fn without_a_dev_directory_every_sample_checks() {
        let (_dir, host, inventory, reader) = rig();
        host.remove_all("/dev").unwrap();
        let mut watch = NodeWatch::new(host.clone());
        let status = watch.status(&reader, &inventory, T).await.clone();
        assert!(!watch.watching());
        assert_eq!(status.missing.len(), 32);
        assert_eq!(status.kfd_present, Some(false));
        assert_eq!(watch.due(&status.checked, Instant::now()), Due::NoWatch);
    }
}
