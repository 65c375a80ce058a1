//! One test at a time on a GPU, whoever starts it. The test runner's
//! scheduler keeps its own runs apart, but a remediation's validation runs
//! outside it (`agent::remediation`), so both take the GPUs' locks here
//! before a test case starts on them. One set per agent, that is per node,
//! shared by the two; the locks are held only for the case's run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

/// The GPUs' locks, by PCI address. Cheap to clone: clones share the locks.
#[derive(Clone, Debug, Default)]
pub struct GpuLocks(Arc<Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>>);

/// GPUs held until this is dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] Vec<OwnedMutexGuard<()>>);

impl GpuLocks {
    /// Waits until every GPU of `bdfs` is free, then holds them all until the
    /// [`Held`] is dropped. Taken in address order, so that two holders of
    /// overlapping sets never wait on each other. Cancel by dropping the
    /// future: nothing is held then.
    pub async fn hold<'a>(&self, bdfs: impl IntoIterator<Item = &'a str>) -> Held {
        let mut bdfs: Vec<&str> = bdfs.into_iter().collect();
        bdfs.sort_unstable();
        bdfs.dedup();
        let locks: Vec<Arc<tokio::sync::Mutex<()>>> = {
            let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            bdfs.iter()
                .map(|bdf| map.entry((*bdf).to_owned()).or_default().clone())
                .collect()
        };
        let mut held = Vec::with_capacity(locks.len());
        for lock in locks {
            held.push(lock.lock_owned().await);
        }
        Held(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn a_held_gpu_waits_for_its_holder_and_other_gpus_do_not() {
        let locks = GpuLocks::default();
        let first = locks.hold(["0000:05:00.0", "0000:03:00.0"]).await;
        assert!(
            locks.hold(["0000:03:00.0"]).now_or_never().is_none(),
            "a GPU under test is not free"
        );
        let other = locks.clone().hold(["0000:07:00.0"]).now_or_never();
        assert!(other.is_some(), "another GPU is free");
        let waiting = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.hold(["0000:05:00.0", "0000:03:00.0"]).await })
        };
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("held once the first holder is done")
            .expect("no panic");
    }
}
