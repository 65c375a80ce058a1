//! Applying a [`Plan`] on this node: steps 3 to 5 of a partition change.
//!
//! 1. Nothing may hold the GPUs: a process with `/dev/kfd` open (the driver
//!    refuses a compute switch while any KFD process exists) or a DRM node of
//!    a GPU that changes blocks the change, and is named. The agent itself
//!    holds no device node, only sysfs attributes, which block nothing.
//! 2. For each GPU that changes, `current_memory_partition` first, then
//!    `current_compute_partition`, as the driver checks a compute mode
//!    against the memory mode it has. Skipped GPUs and GPUs already in their
//!    modes are not written. Each write is bounded by [`Limits::write`]; the
//!    driver's refusal (`EINVAL`, `EBUSY`) is the error, with the path.
//! 3. Waits until discovery shows every assigned GPU in its modes with its
//!    partitions, within [`Limits::appear`].
//!
//! Writes go through the one [`AttrStore`] (the kernel, or the simulated
//! driver on a simulated host). This module must not drain, cordon or write
//! Nodes; the caller does, and records the outcome.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::plan::Plan;
use crate::device::model::Inventory;
use crate::device::modes;
use crate::device::watch::Rescan;
use crate::driver::holders::{self, Holder};
use crate::host::reader::BoundedReader;
use crate::host::{AttrStore, HostRoot};

/// Bounds of one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// One sysfs write: a compute switch re-initialises the GPU.
    pub write: Duration,
    /// From the last write until discovery shows the new partitions.
    pub appear: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            write: Duration::from_secs(60),
            appear: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    #[error("the GPUs are in use: {0}")]
    Held(String),
    #[error("the driver refused {value} in {path}: {error}")]
    Write {
        path: String,
        value: String,
        error: String,
    },
    #[error("writing {value} to {path} took longer than {limit:?}")]
    WriteTimedOut {
        path: String,
        value: String,
        limit: Duration,
    },
    #[error("the new partitions did not appear within {limit:?}: {missing}")]
    NotSeen { limit: Duration, missing: String },
}

/// What holds the GPUs a plan changes, for a person; empty when nothing does.
pub fn blocking_holders(holders: &[Holder], plan: &Plan, inventory: &Inventory) -> Vec<Holder> {
    let mut nodes: Vec<String> = vec!["/dev/kfd".into()];
    for change in plan.changes() {
        if let Some(gpu) = inventory.gpus.iter().find(|g| g.bdf == change.bdf) {
            let minors = std::iter::once((gpu.card, gpu.render_minor))
                .chain(gpu.partitions.iter().map(|p| (p.card, p.render_minor)));
            for (card, render) in minors {
                nodes.extend(card.map(|c| format!("/dev/dri/card{c}")));
                nodes.extend(render.map(|r| format!("/dev/dri/renderD{r}")));
            }
        }
    }
    holders
        .iter()
        .filter(|h| h.devices.iter().any(|d| nodes.contains(d)))
        .cloned()
        .collect()
}

/// Checks holders, then writes the plan's modes. Returns the paths written.
pub async fn write_plan(
    plan: &Plan,
    inventory: &Inventory,
    store: Arc<dyn AttrStore>,
    reader: &BoundedReader,
    limits: Limits,
) -> Result<Vec<String>, ApplyError> {
    if plan.is_done() {
        return Ok(Vec::new());
    }
    let in_use = holders::in_use(reader).await;
    let blocking = blocking_holders(&in_use.processes, plan, inventory);
    if !blocking.is_empty() {
        let found = holders::InUse {
            refcnt: Some(0),
            processes: blocking,
            ..Default::default()
        };
        return Err(ApplyError::Held(found.describe()));
    }
    let mut written = Vec::new();
    let mut failed = None;
    'gpus: for change in plan.changes() {
        let dir = format!("/sys/bus/pci/devices/{}", change.bdf);
        let mut writes = Vec::new();
        if change.memory_changes() {
            writes.push((format!("{dir}/{}", modes::MEMORY_ATTR), &change.memory));
        }
        if change.compute_changes() {
            writes.push((format!("{dir}/{}", modes::COMPUTE_ATTR), &change.compute));
        }
        for (path, value) in writes {
            tracing::info!(gpu = %change.bdf, %path, %value, "writing partition mode");
            if let Err(e) = store_bounded(&store, &path, value, limits.write).await {
                failed = Some(e);
                break 'gpus;
            }
            written.push(path);
        }
    }
    // What was written takes effect, a failed change's part too: the
    // layout must be what the modes say (a no-op for the kernel's sysfs).
    if !written.is_empty() {
        let settled = settle_bounded(&store, limits.write).await;
        if failed.is_none() {
            settled?;
        }
    }
    failed.map_or(Ok(written), Err)
}

/// [`AttrStore::settle`] off the runtime, within `limit`.
async fn settle_bounded(store: &Arc<dyn AttrStore>, limit: Duration) -> Result<(), ApplyError> {
    let store = store.clone();
    let work = tokio::task::spawn_blocking(move || store.settle());
    let failed = |error: String| ApplyError::Write {
        path: "the partition layout".to_owned(),
        value: "the modes written".to_owned(),
        error,
    };
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(failed(e.to_string())),
        Ok(Err(join)) => Err(failed(join.to_string())),
        Err(_) => Err(failed(format!("did not finish within {limit:?}"))),
    }
}

async fn store_bounded(
    store: &Arc<dyn AttrStore>,
    path: &str,
    value: &str,
    limit: Duration,
) -> Result<(), ApplyError> {
    let (store, owned_path, line) = (store.clone(), path.to_owned(), format!("{value}\n"));
    let work = tokio::task::spawn_blocking(move || store.store(&owned_path, &line));
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(ApplyError::Write {
            path: path.to_owned(),
            value: value.to_owned(),
            error: match &e {
                crate::host::HostError::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            },
        }),
        Ok(Err(join)) => Err(ApplyError::Write {
            path: path.to_owned(),
            value: value.to_owned(),
            error: join.to_string(),
        }),
        Err(_) => Err(ApplyError::WriteTimedOut {
            path: path.to_owned(),
            value: value.to_owned(),
            limit,
        }),
    }
}

/// What of `plan` the inventory does not show yet; empty when all of it.
pub fn missing(plan: &Plan, inventory: &Inventory) -> Vec<String> {
    plan.assignments
        .iter()
        .filter_map(|a| {
            let gpu = inventory.gpus.iter().find(|g| g.bdf == a.bdf);
            let shown = gpu.is_some_and(|g| {
                g.compute_partition
                    .as_deref()
                    .is_some_and(|m| m.eq_ignore_ascii_case(&a.compute))
                    && g.memory_partition
                        .as_deref()
                        .is_some_and(|m| m.eq_ignore_ascii_case(&a.memory))
                    && g.partitions.len().max(1) == a.partitions() as usize
            });
            (!shown).then(|| format!("{} in {}/{}", a.bdf, a.compute, a.memory))
        })
        .collect()
}

/// How often the host is looked at while the new partitions are awaited
/// without a discovery watch.
const POLL: Duration = Duration::from_millis(100);

/// Waits until discovery of `host` itself shows the plan, within `limit`;
/// the inventory then. For callers without a discovery watch to follow
/// (`partition apply` on a host, the DRA plugin's Prepare).
pub async fn seen_on_host(
    host: &HostRoot,
    plan: &Plan,
    limit: Duration,
) -> Result<Inventory, ApplyError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let now = crate::device::discover_off_runtime(host).await;
        let missing = missing(plan, &now);
        if missing.is_empty() {
            return Ok(now);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApplyError::NotSeen {
                limit,
                missing: missing.join(", "),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `inventory` shows the plan, asking discovery to look at once.
pub async fn wait_until_seen(
    plan: &Plan,
    inventory: &mut watch::Receiver<Arc<Inventory>>,
    rescan: Option<&Rescan>,
    limit: Duration,
) -> Result<(), ApplyError> {
    if let Some(rescan) = rescan {
        rescan.request();
    }
    let waited = tokio::time::timeout(limit, async {
        loop {
            if missing(plan, &inventory.borrow_and_update()).is_empty() {
                return true;
            }
            if inventory.changed().await.is_err() {
                return false;
            }
        }
    })
    .await;
    match waited {
        Ok(true) => Ok(()),
        _ => Err(ApplyError::NotSeen {
            limit,
            missing: missing(plan, &inventory.borrow()).join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::discover;
    use crate::host::HostRoot;
    use crate::partition::plan::plan;
    use crate::partition::profiles::ProfileSet;
    use crate::simulate::{self, kernel::SimulatedKernel};

    fn host() -> (tempfile::TempDir, HostRoot) {
        simulate::mi300x_in_memory()
    }

    /// `plan` written on `host` (found as `before`) by its simulated driver.
    async fn write_simulated(
        host: &HostRoot,
        plan: &Plan,
        before: &Inventory,
    ) -> Result<Vec<String>, ApplyError> {
        write_plan(
            plan,
            before,
            Arc::new(SimulatedKernel::new(host.clone())),
            &BoundedReader::new(host.clone(), 2),
            Limits::default(),
        )
        .await
    }

    #[tokio::test]
    async fn cpx_nps4_is_written_memory_first_and_seen() {
        let (_dir, host) = host();
        let before = discover(&host);
        let profiles = ProfileSet::builtin();
        let plan = plan(
            "cpx_nps4_all",
            &profiles.profiles["cpx_nps4_all"],
            &before.gpus,
        )
        .unwrap();
        let written = write_simulated(&host, &plan, &before).await.unwrap();
        // Memory first; the simulated driver then already runs CPX, which
        // is written all the same.
        assert_eq!(written.len(), 16);
        assert!(written[0].ends_with("current_memory_partition"));
        assert!(written[1].ends_with("current_compute_partition"));
        let after = discover(&host);
        assert!(
            missing(&plan, &after).is_empty(),
            "{:?}",
            missing(&plan, &after)
        );
        assert_eq!(
            after.gpus.iter().map(|g| g.partitions.len()).sum::<usize>(),
            64
        );
        let (_tx, mut rx) = watch::channel(Arc::new(after));
        wait_until_seen(&plan, &mut rx, None, Duration::from_millis(10))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_process_holding_kfd_blocks_the_change_and_is_named() {
        let (_dir, host) = host();
        // A process of the simulated host with /dev/kfd open.
        host.write("/proc/4242/comm", "pytorch\n").unwrap();
        host.symlink("/dev/kfd", "/proc/4242/fd/7").unwrap();
        let before = discover(&host);
        let profiles = ProfileSet::builtin();
        let plan = plan(
            "cpx_nps1_all",
            &profiles.profiles["cpx_nps1_all"],
            &before.gpus,
        )
        .unwrap();
        let err = write_simulated(&host, &plan, &before).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("pid 4242 (pytorch) holds /dev/kfd"),
            "{err}"
        );
        // Nothing was written.
        assert_eq!(discover(&host).gpus, before.gpus);
    }

    #[tokio::test]
    async fn a_refused_write_and_partitions_that_never_appear_are_errors() {
        let (_dir, host) = host();
        let before = discover(&host);
        let mut profile = ProfileSet::builtin().profiles["qpx_nps1_all"].clone();
        let plan_ok = plan("qpx", &profile, &before.gpus).unwrap();
        // A plan the driver refuses: QPX is made TPX behind the planner's back.
        let mut refused = plan_ok.clone();
        refused.assignments[0].compute = "TPX".into();
        let err = write_simulated(&host, &refused, &before).await.unwrap_err();
        assert!(
            matches!(&err, ApplyError::Write { error, .. } if error.contains("Invalid argument")),
            "{err}"
        );
        profile.entries[0].compute = "CPX".into();
        let unseen = plan("cpx", &profile, &before.gpus).unwrap();
        let (_tx, mut rx) = watch::channel(Arc::new(before));
        let err = wait_until_seen(&unseen, &mut rx, None, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("0000:05:00.0 in CPX/NPS1"),
            "{err}"
        );
    }
}
