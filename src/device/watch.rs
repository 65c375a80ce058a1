//! Watching the host for GPU changes: hotplug, removal, repartitioning.
//!
//! Kernel events are hints, the inventory is the truth. A udev monitor (subsystems
//! `drm` and `pci`, with the `udev` feature, on a real host root) and a periodic
//! rescan both lead to the same thing: a fresh [`discover`] whose result is
//! compared with the last one. Differences become [`DeviceEvent`]s on one
//! broadcast stream, and the new inventory is published on a `watch` channel that
//! consumers (device plugin, labeller, metrics) read without ever touching sysfs.
//! Udev is unavailable in containers without `/run/udev` and on simulated hosts;
//! there the rescan alone drives the stream.
//!
//! This module owns the change stream only. It must not interpret the changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use super::{Gpu, Inventory, discover};
use crate::host::HostRoot;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAction {
    Added,
    Removed,
    /// The GPU is still there but something discovery reports about it changed:
    /// its partition layout, DRM nodes, problems.
    Changed,
}

/// What made discovery look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSource {
    Udev,
    Rescan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEvent {
    pub action: DeviceAction,
    pub bdf: String,
    pub source: EventSource,
}

#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// How often to rescan. With udev this is a safety net; without it, the only
    /// way changes are seen.
    pub rescan_interval: Duration,
    /// Listen to udev when the feature is compiled in and the host root is `/`.
    pub use_udev: bool,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            rescan_interval: Duration::from_secs(1),
            use_udev: true,
        }
    }
}

/// A running watch. Dropping it stops the watch.
pub struct DeviceWatch {
    inventory: watch::Receiver<Arc<Inventory>>,
    events: broadcast::Sender<DeviceEvent>,
    task: JoinHandle<()>,
}

impl Drop for DeviceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DeviceWatch {
    /// Takes the first snapshot, then watches. Must be called inside a tokio runtime.
    pub async fn start(host: HostRoot, config: WatchConfig) -> Self {
        let first = rediscover(&host).await;
        let (inventory_tx, inventory) = watch::channel(Arc::new(first));
        let (events, _) = broadcast::channel(256);
        let (hint_tx, hint_rx) = mpsc::channel(16);
        if config.use_udev {
            udev_monitor::spawn(&host, hint_tx.clone());
        }
        let task = tokio::spawn(run(
            host,
            config.rescan_interval,
            inventory_tx,
            events.clone(),
            hint_rx,
            hint_tx,
        ));
        Self {
            inventory,
            events,
            task,
        }
    }

    /// The latest inventory; `changed()` on the receiver wakes on every change.
    pub fn inventory(&self) -> watch::Receiver<Arc<Inventory>> {
        self.inventory.clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DeviceEvent> {
        self.events.subscribe()
    }
}

async fn rediscover(host: &HostRoot) -> Inventory {
    let host = host.clone();
    match tokio::task::spawn_blocking(move || discover(&host)).await {
        Ok(inventory) => inventory,
        // Discovery does not panic on bad input; if it ever did, an empty
        // inventory with the reason is safer than taking the agent down.
        Err(e) => Inventory {
            warnings: vec![format!("discovery failed: {e}")],
            ..Inventory::default()
        },
    }
}

async fn run(
    host: HostRoot,
    rescan_interval: Duration,
    inventory_tx: watch::Sender<Arc<Inventory>>,
    events: broadcast::Sender<DeviceEvent>,
    mut hints: mpsc::Receiver<()>,
    // Kept so that `hints` stays open when no udev monitor holds a sender.
    _hint_tx: mpsc::Sender<()>,
) {
    let mut ticker = tokio::time::interval(rescan_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let source = tokio::select! {
            _ = ticker.tick() => EventSource::Rescan,
            Some(()) = hints.recv() => {
                // A hotplug comes as a burst of events; let it settle, then look once.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while hints.try_recv().is_ok() {}
                EventSource::Udev
            }
        };
        let next = rediscover(&host).await;
        let previous = inventory_tx.borrow().clone();
        let changes = diff(&previous, &next);
        if changes.is_empty() && previous.driver == next.driver {
            continue;
        }
        for (action, bdf) in changes {
            tracing::info!(?action, bdf = %bdf, ?source, "GPU change");
            // No receivers is fine: the inventory channel still carries the change.
            let _ = events.send(DeviceEvent {
                action,
                bdf,
                source,
            });
        }
        inventory_tx.send_replace(Arc::new(next));
    }
}

/// The per-GPU differences between two snapshots, ordered by address.
pub fn diff(before: &Inventory, after: &Inventory) -> Vec<(DeviceAction, String)> {
    let index = |inv: &Inventory| -> BTreeMap<String, Gpu> {
        inv.gpus
            .iter()
            .map(|g| (g.bdf.clone(), g.clone()))
            .collect()
    };
    let (before, after) = (index(before), index(after));
    let mut out = Vec::new();
    for (bdf, gpu) in &before {
        match after.get(bdf) {
            None => out.push((DeviceAction::Removed, bdf.clone())),
            Some(now) if now != gpu => out.push((DeviceAction::Changed, bdf.clone())),
            Some(_) => {}
        }
    }
    for bdf in after.keys().filter(|bdf| !before.contains_key(*bdf)) {
        out.push((DeviceAction::Added, bdf.clone()));
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

#[cfg(feature = "udev")]
mod udev_monitor {
    //! A blocking thread on the udev netlink socket. It only sends hints; it
    //! stops when the watch is dropped (the hint channel closes).
    use std::os::fd::AsRawFd;

    use tokio::sync::mpsc;

    use crate::host::HostRoot;

    pub fn spawn(host: &HostRoot, hints: mpsc::Sender<()>) {
        if host.root() != std::path::Path::new("/") || !host.exists("/run/udev") {
            tracing::info!("udev not available for this host root; relying on rescans");
            return;
        }
        // libudev handles are not Send, so the socket is opened on its own thread.
        let spawned = std::thread::Builder::new()
            .name("udev-monitor".into())
            .spawn(move || {
                let socket = match udev::MonitorBuilder::new()
                    .and_then(|b| b.match_subsystem("drm"))
                    .and_then(|b| b.match_subsystem("pci"))
                    .and_then(|b| b.listen())
                {
                    Ok(socket) => socket,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot open udev monitor; relying on rescans");
                        return;
                    }
                };
                let mut fds = [libc::pollfd {
                    fd: socket.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                while !hints.is_closed() {
                    // SAFETY: `fds` is a valid array of one pollfd for the whole call.
                    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 500) };
                    if ready <= 0 {
                        continue;
                    }
                    let mut any = false;
                    for event in socket.iter() {
                        tracing::debug!(
                            action = ?event.event_type(),
                            syspath = %event.syspath().display(),
                            "udev event"
                        );
                        any = true;
                    }
                    if any && hints.try_send(()).is_err() && hints.is_closed() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start udev thread; relying on rescans");
        }
    }
}

#[cfg(not(feature = "udev"))]
mod udev_monitor {
    use tokio::sync::mpsc;

    use crate::host::HostRoot;

    pub fn spawn(_host: &HostRoot, _hints: mpsc::Sender<()>) {
        tracing::debug!("built without the udev feature; relying on rescans");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bdf: &str, render: u32) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            render_minor: Some(render),
            ..Gpu::default()
        }
    }

    #[test]
    fn diff_reports_added_removed_and_changed() {
        let before = Inventory {
            gpus: vec![gpu("0000:01:00.0", 128), gpu("0000:02:00.0", 129)],
            ..Inventory::default()
        };
        let after = Inventory {
            gpus: vec![gpu("0000:02:00.0", 130), gpu("0000:03:00.0", 131)],
            ..Inventory::default()
        };
        assert_eq!(
            diff(&before, &after),
            vec![
                (DeviceAction::Removed, "0000:01:00.0".to_string()),
                (DeviceAction::Changed, "0000:02:00.0".to_string()),
                (DeviceAction::Added, "0000:03:00.0".to_string()),
            ]
        );
        assert!(diff(&after, &after).is_empty());
    }
}
