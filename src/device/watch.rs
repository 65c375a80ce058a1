//! Watching the host for GPU changes: hotplug, removal, repartitioning.
//!
//! Kernel events are hints, the inventory is the truth. Every `rescan_interval`
//! the watch reads a cheap [`Fingerprint`] (a few dozen system calls) and runs a
//! full [`discover`] only when it changed, once more on the tick after a change
//! (to see the end of a change that was still being written), and at least every
//! [`FULL_RESCAN_INTERVAL`] as a safety net. Kernel events make it run a full
//! discovery at once: the udev monitor (subsystems `drm` and `pci`, with the
//! `udev` feature, on host root `/` with udevd running), else the kernel's uevent
//! netlink socket when the host root's `/sys` is a real sysfs (see
//! [`uevent::choose`]). Simulated hosts get neither; the tick alone drives them.
//!
//! A full discovery's result is compared with the last one. Differences become
//! [`DeviceEvent`]s on one broadcast stream, and the new inventory is published
//! on a `watch` channel that consumers (device plugin, labeller, metrics) read
//! without ever touching sysfs.
//!
//! This module owns the change stream only. It must not interpret the changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use super::bounded::{Limits, read_ahead, run_bounded_here};
use super::fingerprint::Fingerprint;
use super::uevent::{self, HintSource, HostFacts, UeventSocket};
use super::{Discovery, Gpu, Inventory, discover_with};
use crate::host::HostRoot;
use crate::host::alarm::Ticker;
use crate::host::reader::BoundedReader;

static INCOMPLETE_SCANS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Scans not trusted since start (the agent's `gpu_operator_discovery_incomplete_total`).
pub fn incomplete_scans() -> u64 {
    INCOMPLETE_SCANS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A full discovery runs at least this often, whatever the fingerprint says.
pub const FULL_RESCAN_INTERVAL: Duration = Duration::from_secs(60);

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
    /// A kernel uevent, through udevd or the kernel's netlink socket.
    Udev,
    /// The periodic tick (its fingerprint changed, or the safety interval).
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
    /// How often to look for changes (a cheap fingerprint; the full discovery
    /// only on change). With kernel events this is a safety net; without them,
    /// the only way changes are seen.
    pub rescan_interval: Duration,
    /// Listen to kernel events: udevd's monitor when the `udev` feature is
    /// compiled in and the host root is `/`, else the kernel's uevent socket
    /// when the host root's `/sys` is a real sysfs.
    pub use_udev: bool,
    /// Deadlines of discovery's reads.
    pub limits: Limits,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            rescan_interval: Duration::from_secs(1),
            use_udev: true,
            limits: Limits::default(),
        }
    }
}

/// How far the watch has got, for readiness and status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanState {
    /// Scans attempted, complete or not.
    pub attempts: u64,
    /// A scan has seen the whole host: the inventory is real.
    pub discovered: bool,
    /// Why the latest scan was not trusted (it missed its deadline, the driver
    /// directory could not be read); `None` after a complete scan.
    pub last_incomplete: Option<String>,
}

/// Asks a [`DeviceWatch`] for a full scan now: for whoever just changed the
/// host itself (a partition switch) and need not wait for the next tick.
#[derive(Clone, Debug)]
pub struct Rescan(mpsc::Sender<()>);

impl Rescan {
    /// Asks for a scan; requests that come while one is queued are one.
    pub fn request(&self) {
        let _ = self.0.try_send(());
    }
}

/// A running watch. Dropping it stops the watch.
pub struct DeviceWatch {
    inventory: watch::Receiver<Arc<Inventory>>,
    rescan: Rescan,
    events: broadcast::Sender<DeviceEvent>,
    state: watch::Receiver<ScanState>,
    task: JoinHandle<()>,
}

impl Drop for DeviceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DeviceWatch {
    /// Starts the watch and waits for its first scan (complete or not; see
    /// [`DeviceWatch::start_undiscovered`]). Must be called inside a tokio runtime.
    pub async fn start(host: HostRoot, config: WatchConfig) -> Self {
        let watch = Self::start_undiscovered(host, config);
        let mut state = watch.state();
        // The sender lives in the task, which runs until the watch is dropped.
        let _ = state.wait_for(|s| s.attempts > 0).await;
        watch
    }

    /// Starts the watch at once, with an empty inventory that the first
    /// complete scan replaces: callers can serve health meanwhile and wait for
    /// [`ScanState::discovered`]. Must be called inside a tokio runtime.
    pub fn start_undiscovered(host: HostRoot, config: WatchConfig) -> Self {
        let (inventory_tx, inventory) = watch::channel(Arc::new(Inventory::default()));
        let (state_tx, state) = watch::channel(ScanState::default());
        let (events, _) = broadcast::channel(256);
        let (hint_tx, hint_rx) = mpsc::channel(16);
        let facts = HostFacts {
            wanted: config.use_udev,
            udev_compiled: cfg!(feature = "udev"),
            root_is_slash: host.root() == std::path::Path::new("/"),
            run_udev: host.exists("/run/udev"),
            sys_is_sysfs: crate::host::is_sysfs(&host.path("/sys")),
        };
        let mut netlink = None;
        match uevent::choose(facts) {
            HintSource::Udev => udev_monitor::spawn(hint_tx.clone()),
            HintSource::Netlink => match UeventSocket::open() {
                Ok(socket) => {
                    tracing::debug!("listening to kernel uevents");
                    netlink = Some(socket);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open the uevent socket; relying on rescans")
                }
            },
            HintSource::TickOnly => {
                tracing::debug!("no kernel events for this host root; relying on rescans")
            }
        }
        let task = tokio::spawn(run(
            Watcher {
                reader: BoundedReader::new(host, BoundedReader::DEFAULT_MAX_THREADS),
                limits: config.limits,
                rescan_interval: config.rescan_interval,
                inventory_tx,
                state_tx,
                events: events.clone(),
            },
            hint_rx,
            hint_tx.clone(),
            netlink,
        ));
        Self {
            inventory,
            rescan: Rescan(hint_tx),
            events,
            state,
            task,
        }
    }

    /// A handle that asks for a full scan now, as a kernel event would.
    pub fn rescan(&self) -> Rescan {
        self.rescan.clone()
    }

    /// How far the watch has got; `changed()` wakes on every scan.
    pub fn state(&self) -> watch::Receiver<ScanState> {
        self.state.clone()
    }

    /// The latest inventory; `changed()` on the receiver wakes on every change.
    pub fn inventory(&self) -> watch::Receiver<Arc<Inventory>> {
        self.inventory.clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DeviceEvent> {
        self.events.subscribe()
    }
}

/// One look at the host: its fingerprint, and the full discovery when it was
/// asked for (`deep`) or the fingerprint differs from `previous`.
struct Scan {
    fingerprint: Fingerprint,
    discovery: Option<Discovery>,
    fingerprint_changed: bool,
    /// Why this look is not to be trusted, when it is not.
    incomplete: Option<String>,
}

async fn scan(
    reader: &BoundedReader,
    limits: Limits,
    previous: Option<Arc<Fingerprint>>,
    deep: bool,
) -> Scan {
    // The usual tick: the fingerprint, in one request while the bound GPUs
    // stay, read on the runtime (a blocking thread would cost two more
    // wake-ups a second on an idle node). Anything else, or a change, is
    // looked at on a blocking thread below, which reads it again.
    if !deep && let Some(last) = previous.as_deref() {
        let requests = Fingerprint::first_batch(Some(last));
        let read = read_ahead(reader, limits, &requests, |host| {
            Fingerprint::read_after(host, Some(last))
        });
        if let Some(fingerprint) = read.await
            && fingerprint == *last
        {
            return Scan {
                fingerprint,
                discovery: None,
                fingerprint_changed: false,
                incomplete: None,
            };
        }
    }
    let reader = reader.clone();
    let work = tokio::task::spawn_blocking(move || {
        // Already on a blocking thread: no thread of its own per scan.
        Ok::<_, String>(run_bounded_here(&reader, limits, |host| {
            // The fingerprint is read before the inventory: a change that lands
            // in between shows in the next tick's fingerprint.
            let fingerprint = Fingerprint::read_after(host, previous.as_deref());
            let fingerprint_changed = previous.is_some_and(|p| *p != fingerprint);
            let mut discovery = (deep || fingerprint_changed).then(|| discover_with(host));
            // A host that changed while it was being read (a driver binding
            // GPUs one by one, a rewrite) gives a half-old, half-new inventory:
            // publish nothing this time, and look in full again next tick.
            if discovery.is_some() {
                let after = Fingerprint::read_after(host, Some(&fingerprint));
                if after != fingerprint {
                    discovery = None;
                    return (after, discovery, true);
                }
            }
            (fingerprint, discovery, fingerprint_changed)
        }))
    });
    // Every read is bounded by the scan's deadline; the margin covers the
    // thread's start and the last read's answer.
    let result =
        match tokio::time::timeout(limits.scan_deadline + Duration::from_secs(2), work).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(format!("discovery failed: {e}")),
            Err(_) => Err(format!(
                "discovery missed its {:?} deadline",
                limits.scan_deadline
            )),
        };
    match result {
        Ok(((fingerprint, discovery, fingerprint_changed), deadline_missed)) => {
            let mut incomplete = discovery
                .as_ref()
                .map(|d| d.incomplete.join("; "))
                .filter(|reason| !reason.is_empty());
            if deadline_missed {
                incomplete = Some(format!(
                    "discovery missed its {:?} deadline{}",
                    limits.scan_deadline,
                    incomplete.map(|r| format!(" ({r})")).unwrap_or_default()
                ));
            }
            Scan {
                fingerprint,
                discovery,
                fingerprint_changed,
                incomplete,
            }
        }
        Err(reason) => Scan {
            fingerprint: Fingerprint::default(),
            discovery: None,
            fingerprint_changed: true,
            incomplete: Some(reason),
        },
    }
}

/// Whether a tick must run the full discovery whatever the fingerprint says:
/// on the tick after a change (the change may still have been under way when
/// it was scanned), and when the safety interval is up.
pub fn tick_goes_deep(settling: bool, since_full: Duration, safety_interval: Duration) -> bool {
    settling || since_full >= safety_interval
}

/// The watch task's state.
struct Watcher {
    reader: BoundedReader,
    limits: Limits,
    rescan_interval: Duration,
    inventory_tx: watch::Sender<Arc<Inventory>>,
    state_tx: watch::Sender<ScanState>,
    events: broadcast::Sender<DeviceEvent>,
}

async fn run(
    watcher: Watcher,
    mut hints: mpsc::Receiver<()>,
    // Kept so that `hints` stays open when no udev monitor holds a sender.
    _hint_tx: mpsc::Sender<()>,
    mut netlink: Option<UeventSocket>,
) {
    // The ticks fall on the process's grid of the interval, where the
    // health monitor's samples fall too, and wait on an alarm: one wake-up
    // of the runtime serves both (see `Ticker`).
    let mut ticker = Ticker::new(watcher.rescan_interval);
    let first = scan(&watcher.reader, watcher.limits, None, true).await;
    let mut fingerprint = Arc::new(first.fingerprint.clone());
    let mut last_full = tokio::time::Instant::now();
    let mut settling = watcher.accept(first, EventSource::Rescan);
    loop {
        let kernel_event = async {
            match netlink.as_mut() {
                Some(socket) => socket.next_gpu_event().await,
                None => std::future::pending().await,
            }
        };
        let (source, deep) = tokio::select! {
            _ = ticker.tick() => (
                EventSource::Rescan,
                tick_goes_deep(settling, last_full.elapsed(), FULL_RESCAN_INTERVAL),
            ),
            Some(()) = hints.recv() => {
                settle(&mut hints, None).await;
                (EventSource::Udev, true)
            }
            result = kernel_event => {
                match result {
                    Ok(()) => settle(&mut hints, netlink.as_mut()).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "uevent socket failed; relying on rescans");
                        netlink = None;
                    }
                }
                (EventSource::Udev, true)
            }
        };
        let scan = scan(
            &watcher.reader,
            watcher.limits,
            Some(fingerprint.clone()),
            deep,
        )
        .await;
        if scan.incomplete.is_none() {
            fingerprint = Arc::new(scan.fingerprint.clone());
        }
        if scan.discovery.is_some() || scan.incomplete.is_some() {
            last_full = tokio::time::Instant::now();
        }
        settling = watcher.accept(scan, source);
    }
}

/// A hotplug comes as a burst of events; let it settle, then look once.
async fn settle(hints: &mut mpsc::Receiver<()>, netlink: Option<&mut UeventSocket>) {
    let pause = tokio::time::sleep(Duration::from_millis(100));
    match netlink {
        // Drain the socket meanwhile, so that the burst does not wake us again.
        Some(socket) => {
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    _ = &mut pause => break,
                    result = socket.next_gpu_event() => if result.is_err() { break },
                }
            }
        }
        None => pause.await,
    }
    while hints.try_recv().is_ok() {}
}

impl Watcher {
    /// Takes in one scan: publishes a complete discovery, keeps the last
    /// inventory (and says so) for an incomplete one. True when the next tick
    /// must look in full again: something changed, or the scan was not trusted.
    fn accept(&self, scan: Scan, source: EventSource) -> bool {
        if let Some(reason) = &scan.incomplete {
            INCOMPLETE_SCANS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(%reason, "discovery incomplete; keeping the last inventory");
            self.state_tx.send_modify(|s| {
                s.attempts += 1;
                s.last_incomplete = Some(reason.clone());
            });
            return true;
        }
        // A look that published nothing (only the fingerprint was read, or
        // the host changed while it was read) does not make the host
        // discovered: the inventory may still be the empty one of the start.
        let saw_whole_host = scan.discovery.is_some();
        let changed = match scan.discovery {
            Some(discovery) => self.publish(discovery.inventory, source),
            None => false,
        };
        self.state_tx.send_modify(|s| {
            s.attempts += 1;
            s.discovered |= saw_whole_host;
            s.last_incomplete = None;
        });
        changed || scan.fingerprint_changed
    }

    /// Publishes `next` if it differs from the current inventory; true if it did.
    fn publish(&self, next: Inventory, source: EventSource) -> bool {
        let previous = self.inventory_tx.borrow().clone();
        let changes = diff(&previous, &next);
        if changes.is_empty() && previous.driver == next.driver {
            return false;
        }
        for (action, bdf) in changes {
            tracing::info!(?action, bdf = %bdf, ?source, "GPU change");
            // No receivers is fine: the inventory channel still carries the change.
            let _ = self.events.send(DeviceEvent {
                action,
                bdf,
                source,
            });
        }
        self.inventory_tx.send_replace(Arc::new(next));
        true
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

    /// Starts the monitor; [`super::uevent::choose`] decided that udev is reachable.
    pub fn spawn(hints: mpsc::Sender<()>) {
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

    /// Never called: [`super::uevent::choose`] picks udev only when compiled in.
    pub fn spawn(_hints: mpsc::Sender<()>) {
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

    #[test]
    fn ticks_go_deep_after_a_change_and_at_the_safety_interval() {
        let safety = Duration::from_secs(60);
        assert!(!tick_goes_deep(false, Duration::from_secs(1), safety));
        assert!(tick_goes_deep(true, Duration::from_secs(1), safety));
        assert!(tick_goes_deep(false, safety, safety));
        assert!(tick_goes_deep(false, Duration::from_secs(61), safety));
    }
}
