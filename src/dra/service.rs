//! The running DRA plugin: one task follows the inventory and health reports
//! into the [`Published`] snapshot and keeps both sockets served; one task
//! keeps this node's ResourceSlices equal to the snapshot.
//!
//! Timing: the snapshot is rebuilt at once on an inventory or health change,
//! and device-node presence and the sockets are re-checked every
//! `poll_interval`; device nodes are stat'ed then only when `/dev` changed
//! since (`plugin::NodeProbe`, as the device plugin does it). Slices are
//! written as soon as the snapshot changes what they carry, and not at all
//! otherwise. Every wait is bounded or cancellable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, ObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::calls::{API_TIMEOUT, with_retries};
use super::checkpoint::{self, Checkpoint, CheckpointError};
use super::devices::{DraDevice, PcieRoots, devices_of, layout_devices_of};
use super::health::Published;
use super::prepare::{LayoutState, LayoutWriter, Preparer};
use super::server::{
    DraServices, Registration, RegistrationService, dra_router, registration_router,
};
use super::slices::{same_content, slice_name, slice_specs};
use super::{DRIVER_NAME, cdi, claim_status};
use crate::api::field_manager;
use crate::device::Inventory;
use crate::device::relayout::repartitioned;
use crate::events::{EventSink, EventType, NodeEvent, Origin};
use crate::host::HostRoot;
use crate::host::reader::{Answer, BoundedReader, Op};
use crate::plugin::{HealthReport, NodeProbe, PluginDevice, SocketServer, dri_nodes};

/// Bound on the whole stop sequence: below the service slot's 3 s grace, so
/// the slot never aborts a stop half done.
const STOP_BUDGET: Duration = Duration::from_millis(2500);
/// Bound on removing the slices when stopping.
const REMOVE_BUDGET: Duration = Duration::from_millis(1500);
/// Bound on reading the partition modes of GPUs whose nodes are missing.
const HOST_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// Wait before trying a failed slice write again (unless a change comes first).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// What the DRA plugin serves and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraConfig {
    /// The kubelet's directory as this process sees it: the registration
    /// socket goes in `plugins_registry/`, the DRA socket and the checkpoint
    /// in `plugins/gpu.amd.com/`.
    pub kubelet_dir: PathBuf,
    /// Where CDI specs go (`--cdi-dir`), read by the container runtime.
    pub cdi_dir: PathBuf,
    pub host: HostRoot,
    pub node_name: String,
    /// Taint unhealthy devices in the slices (KEP-5055; GA in 1.37, beta and
    /// on by default from 1.36). On unless `--dra-device-taints=false`.
    pub device_taints: bool,
    /// Sharing: with more than one replica, devices allow multiple
    /// allocations with consumable capacity (KEP-5075; the
    /// DRAConsumableCapacity feature, beta and on by default from 1.36).
    pub sharing: crate::api::TimeSlicing,
    pub poll_interval: Duration,
    pub health_resend: Duration,
    /// Partitions allocated on demand (`draDriver.autoPartition`): each
    /// partitionable GPU offers every layout it runs, and a Prepare puts the
    /// GPU in the layout allocated ([`super::layouts`]).
    pub auto_partition: bool,
    /// How amdgpu is reloaded after a memory mode change: the driver
    /// manager's `modprobe`, loading again what the manager loaded. `None`
    /// reloads nothing (a simulated host's driver takes a memory mode at
    /// once).
    pub reload: Option<crate::driver::reload::Reloader>,
    /// The DeviceConfig's `driver.kernelModuleConfig`: what a reload takes
    /// when the operator does not manage the driver.
    pub driver_module: crate::api::KernelModuleConfigSpec,
    /// Bounds of one layout change.
    pub partition_limits: crate::partition::Limits,
}

impl DraConfig {
    pub const DEFAULT_CDI_DIR: &'static str = "/var/run/cdi";
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);
    pub const DEFAULT_HEALTH_RESEND: Duration = Duration::from_secs(10);

    pub fn new(kubelet_dir: impl Into<PathBuf>, host: HostRoot, node_name: &str) -> Self {
        Self {
            kubelet_dir: kubelet_dir.into(),
            cdi_dir: PathBuf::from(Self::DEFAULT_CDI_DIR),
            host,
            node_name: node_name.to_owned(),
            device_taints: true,
            sharing: crate::api::TimeSlicing::default(),
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
            health_resend: Self::DEFAULT_HEALTH_RESEND,
            auto_partition: false,
            reload: None,
            driver_module: crate::api::KernelModuleConfigSpec::default(),
            partition_limits: crate::partition::Limits::default(),
        }
    }

    /// `<kubelet-dir>/plugins_registry/gpu.amd.com-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(format!("{DRIVER_NAME}-reg.sock"))
    }

    /// `<kubelet-dir>/plugins/gpu.amd.com/`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(DRIVER_NAME)
    }

    /// `<kubelet-dir>/plugins/gpu.amd.com/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }
}

/// Where the ResourceSlices stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Slices {
    #[default]
    Pending,
    /// The API holds what the snapshot says, at this pool generation.
    Published { generation: i64, devices: usize },
    /// The API server refused a slice for what it says (422 Invalid, 400):
    /// `problem` is each field with the server's message. The same content is
    /// not written again; a change of content is.
    Rejected { slice: String, problem: String },
    /// A write failed for another reason (unreachable, forbidden, a server
    /// error); tried again after [`RETRY_AFTER_FAILURE`].
    Failed(String),
}

/// What the DRA plugin is doing, for the agent's status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraStatus {
    pub running: bool,
    pub registration: Registration,
    pub slices: Slices,
    /// Why a socket could not be served.
    pub error: Option<String>,
}

impl DraStatus {
    /// Why pods cannot get GPUs through DRA here; `None` when they can: the
    /// kubelet registered the plugin and the slices are published.
    pub fn unavailable_reason(&self) -> Option<String> {
        if let Some(error) = &self.error {
            return Some(error.clone());
        }
        match (&self.registration, &self.slices) {
            (Registration::Refused(e), _) => {
                Some(format!("the kubelet refused the DRA plugin: {e}"))
            }
            (Registration::Waiting, _) => {
                Some("waiting for the kubelet to register the DRA plugin".into())
            }
            (_, Slices::Pending) => Some("publishing ResourceSlices".into()),
            (_, Slices::Rejected { slice, problem }) => Some(format!(
                "the API server refused ResourceSlice {slice}: {problem}"
            )),
            (_, Slices::Failed(e)) => Some(format!("cannot publish ResourceSlices: {e}")),
            (Registration::Registered, Slices::Published { .. }) => None,
        }
    }
}

/// A running DRA plugin.
pub struct DraPlugin {
    stop: watch::Sender<bool>,
    status: watch::Receiver<DraStatus>,
    published: watch::Receiver<Arc<Published>>,
    /// Aborted when dropped: a plugin dropped without `stop` serves nothing on.
    task: AbortOnDropHandle<()>,
}

impl DraPlugin {
    /// Starts serving. `client` reads claims and writes this node's slices;
    /// a refused slice or registration is recorded in `events`.
    pub fn start(
        config: DraConfig,
        inventory: watch::Receiver<Arc<Inventory>>,
        health: watch::Receiver<HealthReport>,
        client: kube::Client,
        events: EventSink,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let (status_tx, status) = watch::channel(DraStatus {
            running: true,
            ..DraStatus::default()
        });
        let (published_tx, published) = watch::channel(Arc::new(Published::default()));
        let task = tokio::spawn(run(
            config,
            inventory,
            health,
            client,
            events,
            published_tx,
            status_tx,
            stop_rx,
        ));
        Self {
            stop,
            status,
            published,
            task: AbortOnDropHandle::new(task),
        }
    }

    pub fn status(&self) -> watch::Receiver<DraStatus> {
        self.status.clone()
    }

    /// The devices on offer and their health.
    pub fn published(&self) -> watch::Receiver<Arc<Published>> {
        self.published.clone()
    }

    /// Stops serving, removes both sockets and this node's slices. Prepared
    /// claims (their CDI specs and the checkpoint) stay: running containers
    /// and a later unprepare still need them.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(STOP_BUDGET, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("the DRA plugin did not stop in time; aborted");
            self.task.abort();
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    config: DraConfig,
    mut inventory: watch::Receiver<Arc<Inventory>>,
    mut health: watch::Receiver<HealthReport>,
    client: kube::Client,
    events: EventSink,
    published_tx: watch::Sender<Arc<Published>>,
    status: watch::Sender<DraStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let reader = BoundedReader::new(config.host.clone(), 2);
    let checkpoint_path = config.plugin_dir().join(checkpoint::FILE_NAME);
    // Specs no entry names are removed, but only after a clean read: the
    // kubelet never prepares again a claim it counts as prepared, so a spec
    // must not go because the checkpoint could not be read.
    let mut at_start = Checkpoint::default();
    match Checkpoint::load(&checkpoint_path) {
        Ok(prepared) => {
            at_start = prepared.clone();
            for orphan in checkpoint::orphaned_specs(&config.cdi_dir, &prepared) {
                tracing::info!(spec = %orphan.display(), "removing a CDI spec no prepared claim names");
                if let Err(e) = cdi::remove_spec(&orphan) {
                    tracing::warn!(spec = %orphan.display(), error = %e, "cannot remove CDI spec");
                }
            }
        }
        Err(e @ CheckpointError::Corrupt { .. }) => {
            // Kept for a person; the new file keeps every spec there now.
            match checkpoint::set_aside(&checkpoint_path, &config.cdi_dir) {
                Ok(aside) => {
                    tracing::error!(error = %e, aside = %aside.display(), "the DRA checkpoint is unreadable; kept aside, every CDI spec there now is kept until its claim is unprepared")
                }
                Err(why) => {
                    tracing::error!(error = %e, %why, "the DRA checkpoint is unreadable and cannot be set aside; CDI specs left in place, claims cannot be prepared")
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the DRA checkpoint; CDI specs left in place");
        }
    }
    let (status_updates, status_changes) = claim_status::channel();
    let (layout_state_tx, layout_state) = watch::channel(LayoutState::default());
    let layout_writer = config.auto_partition.then(|| LayoutWriter {
        host: config.host.clone(),
        reader: reader.clone(),
        store: crate::simulate::kernel::store_for(&config.host),
        limits: config.partition_limits,
        reload: config.reload.clone(),
        not_managed: config.driver_module.clone(),
        state: layout_state_tx,
        lock: Arc::new(tokio::sync::Mutex::new(())),
    });
    let preparer = Arc::new(Preparer {
        node: config.node_name.clone(),
        cdi_dir: config.cdi_dir.clone(),
        checkpoint_path: checkpoint_path.clone(),
        client: client.clone(),
        reader: reader.clone(),
        published: published_tx.subscribe(),
        status: status_updates,
        layouts: layout_writer,
    });
    // The memory mode prepared layouts hold, from the start: their conflict
    // taints are in the first slices.
    preparer.note_holds(&at_start);
    let mut status_writer = Some((status_changes, at_start));
    let mut claim_statuses = None;
    let (registration_tx, mut registration) = watch::channel(Registration::Waiting);
    // Started once the first snapshot is made: the empty initial one would
    // publish an empty pool for a moment.
    let mut publisher = None;

    let mut sockets: Option<(SocketServer, SocketServer)> = None;
    let mut roots: Option<(Vec<String>, PcieRoots)> = None;
    // The devices of the inventory last seen, and the same as the device
    // plugin's health rules take them: rebuilt only when the inventory
    // changes, not on every presence check.
    let mut seen: Option<Arc<Inventory>> = None;
    let mut devices: Vec<DraDevice> = Vec::new();
    let mut plugin_devices: Vec<PluginDevice> = Vec::new();
    // Their DRM nodes, stat'ed by `probe` only after a change in /dev.
    let mut nodes = BTreeSet::new();
    let mut probe = NodeProbe::default();
    let mut applied_state: Option<LayoutState> = None;
    let mut feeds = crate::service::Wakes::new();
    feeds.watch("inventory", inventory.clone());
    feeds.watch("health", health.clone());
    // Its sender lives in the preparer while layouts are on; off, it is gone.
    feeds.watch("layouts", layout_state.clone());
    let mut tick = tokio::time::interval(config.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The snapshot: devices from the inventory, health from the device
        // plugin's rules over the host checks and the monitor's report.
        let inv = inventory.borrow_and_update().clone();
        // Rebuilt when the layout state differs from what was applied.
        let state_now = layout_state.borrow().clone();
        let layouts_changed = applied_state.as_ref() != Some(&state_now);
        let rebuilt = seen.as_ref().is_none_or(|s| !Arc::ptr_eq(s, &inv)) || layouts_changed;
        if rebuilt {
            let bdfs: Vec<String> = inv.gpus.iter().map(|g| g.bdf.clone()).collect();
            if roots.as_ref().is_none_or(|(known, _)| *known != bdfs) {
                let found = pcie_roots(&reader, &bdfs).await;
                roots = Some((bdfs, found));
            }
            let no_roots = PcieRoots::new();
            let roots = roots.as_ref().map_or(&no_roots, |(_, r)| r);
            devices = if config.auto_partition {
                let mut offered = layout_devices_of(&inv, roots);
                let conflicts = super::layouts::conflicts(
                    offered
                        .iter()
                        .filter_map(|d| d.layout.as_ref().map(|l| (d.name.as_str(), l))),
                    state_now.held_memory.as_deref(),
                    &state_now.stuck,
                );
                for device in &mut offered {
                    device.conflict = conflicts.get(&device.name).cloned();
                }
                offered
            } else {
                devices_of(&inv, roots)
            };
            plugin_devices = devices.iter().map(DraDevice::as_plugin_device).collect();
            nodes = dri_nodes(&plugin_devices);
            seen = Some(inv.clone());
            applied_state = Some(state_now);
        }
        let mut checks = probe.checks(&config.host, inv.driver.loaded, &nodes);
        if !checks.missing_nodes.is_empty() {
            // The missing nodes of a GPU repartitioned behind the inventory
            // are the old layout's, gone on purpose: no fault, until
            // discovery names the new layout.
            let suspects: Vec<&crate::device::Gpu> = inv
                .gpus
                .iter()
                .filter(|g| {
                    plugin_devices.iter().any(|d| {
                        d.gpu_bdf == g.bdf
                            && d.dri_nodes()
                                .iter()
                                .any(|n| checks.missing_nodes.contains(n))
                    })
                })
                .collect();
            let moved = repartitioned(&reader, &suspects, HOST_CHECK_TIMEOUT).await;
            for device in plugin_devices.iter().filter(|d| moved.contains(&d.gpu_bdf)) {
                for node in device.dri_nodes() {
                    checks.missing_nodes.remove(&node);
                }
            }
        }
        let health_now =
            Published::health_of(&plugin_devices, &checks, &health.borrow_and_update());
        published_tx.send_if_modified(|current| {
            let changed = current.health != health_now || (rebuilt && current.devices != devices);
            if changed {
                *current = Arc::new(Published {
                    devices: devices.clone(),
                    health: health_now,
                });
            }
            changed
        });
        if publisher.is_none() {
            publisher = Some(AbortOnDropHandle::new(tokio::spawn(publish_slices(
                config.clone(),
                client.clone(),
                events.clone(),
                published_tx.subscribe(),
                status.clone(),
                stop.clone(),
            ))));
        }
        // Claims' status.devices, from the same first snapshot: before it,
        // every prepared device would read as gone.
        if let Some((changes, at_start)) = status_writer.take() {
            claim_statuses = Some(AbortOnDropHandle::new(tokio::spawn(claim_status::follow(
                client.clone(),
                published_tx.subscribe(),
                changes,
                at_start,
                checkpoint_path.clone(),
            ))));
        }

        // Both sockets, (re)bound when missing or replaced: the kubelet's
        // plugin watcher registers whatever appears in plugins_registry.
        if sockets
            .as_ref()
            .is_none_or(|(r, d)| !r.is_intact() || !d.is_intact())
        {
            if let Some((r, d)) = sockets.take() {
                tracing::info!("a DRA socket is gone or replaced; serving again");
                r.shutdown().await;
                d.shutdown().await;
            }
            match bind(&config, &preparer, &published_tx, &registration_tx) {
                Ok(pair) => {
                    status.send_modify(|s| s.error = None);
                    sockets = Some(pair);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot serve the DRA sockets; will retry");
                    status.send_modify(|s| s.error = Some(e));
                }
            }
        }

        tokio::select! {
            _ = stop_requested(&mut stop) => break,
            // A feed whose sender is gone stops waking the loop, rather
            // than waking it forever.
            _ = feeds.next() => {}
            _ = registration.changed() => {
                let now = registration.borrow_and_update().clone();
                let before = status.borrow().registration.clone();
                if let Registration::Refused(why) = &now
                    && before != now
                {
                    events
                        .record(warning(
                            REGISTRATION_REFUSED,
                            format!("the kubelet refused the DRA plugin {DRIVER_NAME}: {why}"),
                        ))
                        .await;
                }
                status.send_modify(|s| s.registration = now);
            }
            _ = tick.tick() => {}
        }
    }

    // Sockets and slices go together, inside the stop budget.
    let sockets = async {
        if let Some((r, d)) = sockets.take() {
            tokio::join!(r.shutdown(), d.shutdown());
        }
    };
    let slices = async {
        if let Some(publisher) = publisher {
            let _ = publisher.await;
        }
    };
    tokio::join!(sockets, slices);
    // Entries of prepared claims stay, as the claims do; a write not made
    // yet is made by the next start, from the checkpoint.
    drop(claim_statuses);
    status.send_modify(|s| s.running = false);
}

/// Resolves when `stop` asks the plugin to stop. A dropped [`DraPlugin`]
/// (its sender gone) is not a request: its tasks are being aborted, and must
/// not start the clean-up a stop does (removing the slices) on the way.
async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn bind(
    config: &DraConfig,
    preparer: &Arc<Preparer>,
    published: &watch::Sender<Arc<Published>>,
    registration: &watch::Sender<Registration>,
) -> Result<(SocketServer, SocketServer), String> {
    let dra_path = config.dra_socket();
    let reg_path = config.registration_socket();
    for dir in [
        config.plugin_dir(),
        config.kubelet_dir.join("plugins_registry"),
    ] {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let services = DraServices {
        pool: config.node_name.clone(),
        preparer: preparer.clone(),
        published: published.subscribe(),
        health_resend: config.health_resend,
    };
    // The DRA socket first: the kubelet dials it as soon as it sees the
    // registration socket.
    let dra = SocketServer::serve(&dra_path, "DRA plugin", |stop| dra_router(services, stop))
        .map_err(|e| format!("cannot serve {}: {e}", dra_path.display()))?;
    let endpoint = dra_path.display().to_string();
    let status = registration.clone();
    let reg = SocketServer::serve(&reg_path, "DRA registration", |_| {
        registration_router(RegistrationService { endpoint, status })
    })
    .map_err(|e| format!("cannot serve {}: {e}", reg_path.display()))?;
    // A new registration socket is registered anew.
    registration.send_replace(Registration::Waiting);
    Ok((reg, dra))
}

/// Each GPU's PCIe root complex (`pci0000:00`), the first component of its
/// device path under `/sys/devices`: one batch of link reads through the
/// plugin's bounded host reader; a GPU whose root cannot be read (in time)
/// goes without the attribute.
async fn pcie_roots(reader: &BoundedReader, bdfs: &[String]) -> PcieRoots {
    let requests: Vec<(Op, String)> = bdfs
        .iter()
        .map(|bdf| (Op::Link, format!("/sys/bus/pci/devices/{bdf}")))
        .collect();
    let answers = reader.batch(requests, PCIE_ROOT_TIMEOUT).await;
    let mut roots = PcieRoots::new();
    for (bdf, answer) in bdfs.iter().zip(answers) {
        match answer {
            Ok(Answer::Text(target)) => {
                if let Some(root) = pcie_root_of(&target) {
                    roots.insert(bdf.clone(), root);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(gpu = %bdf, error = %e, "cannot read the GPU's PCIe root; publishing it without");
            }
        }
    }
    roots
}

/// How long reading one GPU's PCI device link may take.
const PCIE_ROOT_TIMEOUT: Duration = Duration::from_secs(2);

/// The PCIe root complex (`pci0000:00`) in a PCI device's sysfs path
/// (`/sys/devices/pci0000:00/0000:00:01.1/.../<bdf>`). Pure.
pub fn pcie_root_of(target: &str) -> Option<String> {
    target
        .split('/')
        .skip_while(|part| *part != "devices")
        .nth(1)
        .filter(|part| part.starts_with("pci"))
        .map(str::to_owned)
}

/// Keeps this node's ResourceSlices equal to the snapshot, and removes them
/// when the plugin stops.
///
/// It watches the node's slices (field selector on node and driver), so that
/// slices deleted or changed by someone else (a restarting kubelet wipes its
/// node's, an administrator, the garbage collector) are written again at
/// once, and compares against what the API holds, never against a cache of
/// its own writes.
async fn publish_slices(
    config: DraConfig,
    client: kube::Client,
    sink: EventSink,
    mut published: watch::Receiver<Arc<Published>>,
    status: watch::Sender<DraStatus>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let selector = format!(
        "spec.nodeName={},spec.driver={DRIVER_NAME}",
        config.node_name
    );
    let mut events = watcher(api.clone(), watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut observed = Observed::default();
    let mut slices = SlicePublisher {
        api,
        nodes: Api::all(client),
        config,
        owner: None,
        generation: 0,
        refused: None,
    };
    let mut dirty = true;
    let mut failed = false;
    loop {
        if observed.ready && dirty {
            dirty = false;
            let snapshot = published.borrow_and_update().clone();
            let synced = tokio::select! {
                synced = slices.sync(&snapshot, &mut observed.slices) => synced,
                _ = stop_requested(&mut stop) => break,
            };
            failed = false;
            match synced {
                Ok((generation, devices)) => {
                    status.send_modify(|s| {
                        s.slices = Slices::Published {
                            generation,
                            devices,
                        }
                    });
                }
                // Still the content the server refused: nothing was written.
                Err(SyncError::StillRefused) => {}
                Err(SyncError::Rejected { slice, problem }) => {
                    let note = format!("the API server refused ResourceSlice {slice}: {problem}");
                    tracing::warn!("{note}; written again when its content changes");
                    sink.record(warning(SLICE_REJECTED, note)).await;
                    status.send_modify(|s| s.slices = Slices::Rejected { slice, problem });
                }
                Err(SyncError::Failed(e)) => {
                    tracing::warn!(error = %e, "cannot publish the ResourceSlices; will retry");
                    status.send_modify(|s| s.slices = Slices::Failed(e));
                    failed = true;
                }
            }
        }
        tokio::select! {
            _ = stop_requested(&mut stop) => break,
            changed = published.changed() => {
                if changed.is_err() {
                    break;
                }
                dirty = true;
            }
            event = events.next() => match event {
                Some(Ok(event)) => dirty |= observed.apply(event),
                // The watcher backs off and lists again by itself.
                Some(Err(e)) => tracing::debug!(error = %e, "ResourceSlice watch interrupted"),
                None => break,
            },
            _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if failed => dirty = true,
        }
    }
    // One bounded try: the agent's stop budget is short, and a kubelet
    // removes a gone driver's slices itself after 30 s.
    match tokio::time::timeout(REMOVE_BUDGET, slices.remove_all(&observed)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(removed)) => tracing::info!(slices = removed, "removed this node's ResourceSlices"),
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove this node's ResourceSlices"),
        Err(_) => tracing::warn!("could not remove this node's ResourceSlices in time"),
    }
}

/// This node's slices as the watch last showed them (and our own writes'
/// answers), by name.
#[derive(Default)]
struct Observed {
    slices: BTreeMap<String, ResourceSlice>,
    /// The watch's first list has completed.
    ready: bool,
    /// A (re)list in progress.
    listing: Option<BTreeMap<String, ResourceSlice>>,
}

impl Observed {
    /// Takes in one watch event; true when the slices differ from before
    /// (another resourceVersion), which calls for a comparison.
    fn apply(&mut self, event: watcher::Event<ResourceSlice>) -> bool {
        let version = |s: &ResourceSlice| s.metadata.resource_version.clone();
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(slice) => {
                if let Some(listing) = self.listing.as_mut() {
                    listing.insert(slice.name_any(), slice);
                }
                false
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let changed = !self.ready
                    || listed.len() != self.slices.len()
                    || listed
                        .iter()
                        .any(|(name, s)| self.slices.get(name).map(version) != Some(version(s)));
                self.slices = listed;
                self.ready = true;
                changed
            }
            watcher::Event::Apply(slice) => {
                let name = slice.name_any();
                let changed = self.slices.get(&name).map(version) != Some(version(&slice));
                self.slices.insert(name, slice);
                changed
            }
            watcher::Event::Delete(slice) => self.slices.remove(&slice.name_any()).is_some(),
        }
    }
}

struct SlicePublisher {
    api: Api<ResourceSlice>,
    nodes: Api<Node>,
    config: DraConfig,
    owner: Option<OwnerReference>,
    /// The highest pool generation seen or written: a pool rewritten after
    /// its slices were deleted still moves forward.
    generation: i64,
    /// The slices (generation 0) whose writing the server refused: not
    /// written again until what they say changes.
    refused: Option<Vec<ResourceSliceSpec>>,
}

/// Why a sync did not publish.
#[derive(Debug)]
enum SyncError {
    /// The server refused this slice for its content.
    Rejected {
        slice: String,
        problem: String,
    },
    /// The content is what the server refused before; nothing was written.
    StillRefused,
    Failed(String),
}

/// `reason` of the Warning Event for a refused slice.
pub const SLICE_REJECTED: &str = "ResourceSliceRejected";
/// `reason` of the Warning Event for a refused kubelet registration.
pub const REGISTRATION_REFUSED: &str = "DRARegistrationRefused";

fn warning(reason: &str, note: String) -> NodeEvent {
    NodeEvent {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(note),
        about: None,
        origin: Origin::Agent {
            action: "PublishResourceSlices",
        },
    }
}

/// What the server said of a write it refused for the object's content
/// (`422 Invalid`, `400 BadRequest`): each cause as `field: message`, or its
/// message when it lists none. `None` for every other failure, which a retry
/// may cure. Pure.
pub fn content_refusal(error: &kube::Error) -> Option<String> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    if !matches!(status.code, 400 | 422) {
        return None;
    }
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| match c.field.as_str() {
            "" => c.message.clone(),
            field => format!("{field}: {}", c.message),
        })
        .collect();
    Some(if causes.is_empty() {
        status.message.clone()
    } else {
        causes.join("; ")
    })
}

impl SlicePublisher {
    /// Makes the API hold the snapshot's slices, writing only what differs,
    /// at a new pool generation when anything does. `observed` is what the
    /// API holds; it is updated with every answer. Returns the pool
    /// generation and the device count now published.
    async fn sync(
        &mut self,
        snapshot: &Published,
        observed: &mut BTreeMap<String, ResourceSlice>,
    ) -> Result<(i64, usize), SyncError> {
        if self.owner.is_none() {
            // Slices die with their Node (garbage collection), as upstream
            // drivers set it up. Without the Node's UID they are still correct.
            if let Ok(Ok(node)) =
                tokio::time::timeout(API_TIMEOUT, self.nodes.get(&self.config.node_name)).await
                && let Some(uid) = node.metadata.uid
            {
                self.owner = Some(OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.config.node_name.clone(),
                    uid,
                    controller: Some(true),
                    ..OwnerReference::default()
                });
            }
        }
        let node = &self.config.node_name;
        let devices = snapshot.devices.len();
        let desired = slice_specs(
            node,
            &snapshot.devices,
            &snapshot.unhealthy(),
            self.config.device_taints,
            &self.config.sharing,
            0,
        );
        let names: Vec<String> = (0..desired.len()).map(|i| slice_name(node, i)).collect();
        let current_generation = observed
            .values()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let unchanged = observed.len() == desired.len()
            && names.iter().zip(&desired).all(|(name, spec)| {
                observed
                    .get(name)
                    .is_some_and(|s| same_content(&s.spec, spec))
            })
            && observed
                .values()
                .all(|s| s.spec.pool.generation == current_generation);
        self.generation = self.generation.max(current_generation);
        if unchanged {
            self.refused = None;
            return Ok((current_generation, devices));
        }
        if self.refused.as_ref().is_some_and(|refused| {
            refused.len() == desired.len()
                && refused
                    .iter()
                    .zip(&desired)
                    .all(|(a, b)| same_content(a, b))
        }) {
            return Err(SyncError::StillRefused);
        }
        self.refused = None;
        let wanted = desired.clone();
        let generation = current_generation.max(self.generation) + 1;
        self.generation = generation;
        for (name, mut spec) in names.iter().zip(desired) {
            spec.pool.generation = generation;
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: self.owner.clone().map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec,
            };
            let params = field_manager::apply(field_manager::DRA);
            let patch = kube::api::Patch::Apply(&slice);
            let applied = match with_retries(|| self.api.patch(name, &params, &patch)).await {
                Ok(applied) => applied,
                Err(e) => {
                    return Err(match content_refusal(&e) {
                        Some(problem) => {
                            self.refused = Some(wanted);
                            SyncError::Rejected {
                                slice: name.clone(),
                                problem,
                            }
                        }
                        None => {
                            SyncError::Failed(format!("cannot apply ResourceSlice {name}: {e}"))
                        }
                    });
                }
            };
            observed.insert(name.clone(), applied);
        }
        let stale: Vec<String> = observed
            .keys()
            .filter(|k| !names.contains(k))
            .cloned()
            .collect();
        for name in stale {
            delete(&self.api, &name, true)
                .await
                .map_err(SyncError::Failed)?;
            observed.remove(&name);
        }
        tracing::info!(
            generation,
            devices,
            slices = names.len(),
            "published ResourceSlices"
        );
        Ok((generation, devices))
    }

    /// Deletes the node's slices, once each, no retries; returns how many.
    async fn remove_all(&self, observed: &Observed) -> Result<usize, String> {
        let names: Vec<String> = if observed.ready {
            observed.slices.keys().cloned().collect()
        } else {
            let params = ListParams::default().fields(&format!(
                "spec.nodeName={},spec.driver={DRIVER_NAME}",
                self.config.node_name
            ));
            self.api
                .list(&params)
                .await
                .map_err(|e| format!("cannot list ResourceSlices: {e}"))?
                .items
                .iter()
                .map(|s| s.name_any())
                .collect()
        };
        for name in &names {
            delete(&self.api, name, false).await?;
        }
        Ok(names.len())
    }
}

async fn delete(api: &Api<ResourceSlice>, name: &str, retry: bool) -> Result<(), String> {
    let params = kube::api::DeleteParams::default();
    let deleted = if retry {
        with_retries(|| api.delete(name, &params)).await
    } else {
        api.delete(name, &params).await
    };
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(format!("cannot delete ResourceSlice {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, causes: &[(&str, &str)]) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": "Invalid",
            "message": "ResourceSlice \"n-gpu.amd.com-0\" is invalid",
            "details": {"causes": causes.iter().map(|(f, m)| serde_json::json!({
                "reason": "FieldValueInvalid", "field": f, "message": m})).collect::<Vec<_>>()}
        }))
        .expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn only_a_refusal_of_the_content_is_one() {
        let refused = api_error(
            422,
            &[
                (
                    "spec.devices[0].attributes[driverVersion].version",
                    "Invalid value: \"6.19.14.31400000\"",
                ),
                ("", "no field"),
            ],
        );
        assert_eq!(
            content_refusal(&refused).as_deref(),
            Some(
                "spec.devices[0].attributes[driverVersion].version: Invalid value: \"6.19.14.31400000\"; no field"
            )
        );
        assert_eq!(
            content_refusal(&api_error(400, &[])).as_deref(),
            Some("ResourceSlice \"n-gpu.amd.com-0\" is invalid")
        );
        for code in [403, 404, 409, 429, 500, 503] {
            assert_eq!(content_refusal(&api_error(code, &[])), None, "{code}");
        }
        let io = kube::Error::Service(Box::new(std::io::Error::other("refused")));
        assert_eq!(content_refusal(&io), None);
    }

    #[test]
    fn the_pcie_root_is_the_first_part_of_the_device_path() {
        assert_eq!(
            pcie_root_of("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:03:00.0")
                .as_deref(),
            Some("pci0000:00")
        );
        assert_eq!(
            pcie_root_of("../../../devices/pci0000:c0/0000:c0:01.1/0000:c3:00.0").as_deref(),
            Some("pci0000:c0")
        );
        assert_eq!(pcie_root_of("/sys/devices/platform/amdgpu_xcp_0"), None);
        assert_eq!(pcie_root_of("nonsense"), None);
    }
}
