//! The running device plugin: one supervisor task that follows the inventory,
//! health reports and the kubelet, and one task per resource that keeps its
//! socket served and registered.
//!
//! The supervisor owns the plan (which resources, which devices, what health)
//! and publishes each resource's [`ResourceState`] through a watch channel;
//! resource tasks own their socket and registration. Decisions are delegated to
//! the pure modules; this module only wires them to time, files and sockets. It
//! must not block: every wait is bounded or cancellable by `stop`.
//!
//! Timing: the supervisor looks at the device nodes, at the identity of
//! `kubelet.sock` and (through its resource tasks) at each plugin socket when
//! inotify says the device-plugin directory, `/dev` or `/dev/dri` changed. A
//! recreated `kubelet.sock` therefore leads to re-registration, and a deleted
//! plugin socket is bound again and re-registered, as soon as the event is
//! read. It also looks every [`BACKSTOP`] (a safety net for a filesystem that
//! does not report a change), and every `poll_interval` (200 ms by default)
//! while a watch is missing: the directory does not exist yet, inotify is
//! unavailable, or the runtime cannot wait on it. On an idle node the plugin
//! thus wakes the process every ten seconds instead of five times a second.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::device::Inventory;
use crate::host::HostRoot;
use crate::host::alarm::Ticker;
use crate::host::inotify::{DirWatch, Readiness};

use super::api;
use super::devices::{
    LayoutConflict, PluginDevice, ResourceNamingStrategy, ResourcePlan, TimeSlicing,
    plan_resources, resource_name, shared_plan, socket_name,
};
use super::health::{HealthReport, NodeChecks, device_health};
use super::preferred::Topology;
use super::probe;
use super::server::{FileId, SocketServer, file_id, register};
use super::state::{AdvertisedDevice, ResourceState};

/// How often registration is retried while the kubelet is unreachable.
const REGISTER_RETRY: Duration = Duration::from_secs(1);
/// With every watch in place, the supervisor still looks this often (or
/// every `poll_interval`, if longer): the device-node probe's own safety
/// interval, so one look serves both.
const BACKSTOP: Duration = probe::NodeProbe::SAFETY_INTERVAL;
/// Bound on the whole stop sequence; the agent has 5 s from SIGTERM to exit.
const STOP_BUDGET: Duration = Duration::from_secs(3);

/// What the plugin serves and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    /// The kubelet's device plugin directory as this process sees it (usually
    /// mounted at the same path in the agent's container). Not mapped under
    /// `host`: the kubelet and the plugin talk through this directory directly.
    pub device_plugin_dir: PathBuf,
    pub strategy: ResourceNamingStrategy,
    /// Time-slicing: replicas per device, renaming, the one-replica rule.
    pub sharing: TimeSlicing,
    /// Where device nodes (`/dev/kfd`, `/dev/dri/...`) and sysfs are read.
    pub host: HostRoot,
    /// Period of the presence checks while a watch is missing (see the
    /// module documentation); with the watches in place, the backstop's
    /// period when longer than [`BACKSTOP`].
    pub poll_interval: Duration,
}

impl PluginConfig {
    /// The kubelet's default device plugin directory.
    pub const DEFAULT_DIR: &'static str = "/var/lib/kubelet/device-plugins";
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

    pub fn new(
        device_plugin_dir: impl Into<PathBuf>,
        strategy: ResourceNamingStrategy,
        host: HostRoot,
    ) -> Self {
        Self {
            device_plugin_dir: device_plugin_dir.into(),
            strategy,
            sharing: TimeSlicing::default(),
            host,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }
}

/// What the plugin is doing, for the agent's status and Events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginStatus {
    /// Served resources, by name.
    pub resources: Vec<ResourceStatus>,
    /// Set when the `single` strategy meets mixed partition layouts; the GPUs
    /// concerned are not offered. Worth an Event.
    pub conflict: Option<LayoutConflict>,
    /// One line summing up every current problem (conflict, socket and
    /// registration errors); `None` when all is well.
    pub error: Option<String>,
    /// False once the service has stopped.
    pub running: bool,
}

impl PluginStatus {
    /// Why pods cannot get devices from this plugin; `None` when they can,
    /// which is when the kubelet accepted the registration of every resource.
    pub fn unavailable_reason(&self) -> Option<String> {
        if !self.running {
            return Some("the device plugin is not running".to_owned());
        }
        if self.resources.is_empty() {
            return Some(match &self.error {
                Some(error) => format!("no device to offer: {error}"),
                None => "no device to offer".to_owned(),
            });
        }
        let waiting: Vec<String> = self
            .resources
            .iter()
            .filter(|r| !r.registered)
            .map(|r| match &r.error {
                Some(error) => format!("{}: {error}", r.name),
                None => format!("{}: waiting for the kubelet to accept it", r.name),
            })
            .collect();
        if waiting.is_empty() {
            None
        } else {
            Some(format!(
                "not registered with the kubelet ({})",
                waiting.join("; ")
            ))
        }
    }
}

/// One served resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceStatus {
    /// `amd.com/gpu`, `amd.com/cpx_nps4`...
    pub name: String,
    pub devices: usize,
    pub healthy: usize,
    /// The kubelet accepted the current registration.
    pub registered: bool,
    /// The latest socket or registration problem, cleared on success.
    pub error: Option<String>,
}

/// Returned when the service is no longer running.
#[derive(Debug, thiserror::Error)]
#[error("the device plugin service has stopped")]
pub struct Stopped;

enum Command {
    Reconfigure(PluginConfig),
    Stop,
}

/// Handle on the running device plugin. Dropping it stops the plugin too, but
/// without waiting; call [`DevicePluginService::stop`] for a clean exit.
pub struct DevicePluginService {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<PluginStatus>,
    task: JoinHandle<()>,
}

impl DevicePluginService {
    /// Starts serving. `inventory` is the feed of discovery results; `health`
    /// the feed of other health sources (pass the receiver of a channel holding
    /// `HealthReport::default()` when there are none). Either feed may close;
    /// the plugin then keeps the last value. Must be called inside a tokio
    /// runtime; problems are reported through [`DevicePluginService::status`].
    pub fn start(
        config: PluginConfig,
        inventory: watch::Receiver<Arc<Inventory>>,
        health: watch::Receiver<HealthReport>,
    ) -> Self {
        let (commands, command_rx) = mpsc::channel(8);
        let (status_tx, status) = watch::channel(PluginStatus {
            running: true,
            ..PluginStatus::default()
        });
        let supervisor = Supervisor::new(config, Arc::new(status_tx));
        let task = tokio::spawn(supervisor.run(command_rx, inventory, health));
        Self {
            commands,
            status,
            task,
        }
    }

    /// A receiver of the current status; it changes whenever the status does.
    pub fn status(&self) -> watch::Receiver<PluginStatus> {
        self.status.clone()
    }

    /// Applies a new configuration. A new directory or poll interval restarts
    /// every resource server; a new strategy or host root only re-plans, keeping
    /// the servers of resources whose names survive.
    pub async fn reconfigure(&self, config: PluginConfig) -> Result<(), Stopped> {
        self.commands
            .send(Command::Reconfigure(config))
            .await
            .map_err(|_| Stopped)
    }

    /// Stops every server, ends open streams and removes the plugin's sockets.
    /// Returns within a few seconds whatever the peers do.
    pub async fn stop(mut self) {
        let _ = self.commands.send(Command::Stop).await;
        if tokio::time::timeout(STOP_BUDGET + Duration::from_secs(1), &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("device plugin did not stop in time; aborting it");
            self.task.abort();
        }
    }
}

/// A running resource task and the channels that drive it.
struct ResourceHandle {
    state: watch::Sender<Arc<ResourceState>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

struct Supervisor {
    config: PluginConfig,
    inventory: Arc<Inventory>,
    report: HealthReport,
    /// The devices as advertised (replicas, when shared).
    plan: ResourcePlan,
    /// The devices themselves: what the presence checks look at.
    devices: ResourcePlan,
    checks: NodeChecks,
    /// The DRM nodes of `devices`, and the presence checks' memory.
    nodes: std::collections::BTreeSet<String>,
    probe: probe::NodeProbe,
    servers: BTreeMap<String, ResourceHandle>,
    status: Arc<watch::Sender<PluginStatus>>,
    kubelet_generation: watch::Sender<u64>,
    kubelet_id: Option<FileId>,
    /// Bumped at each look at the directory: resource tasks then check
    /// their sockets.
    looks: watch::Sender<u64>,
    /// `None` while the directory cannot be watched.
    dir_events: Option<DirEvents>,
}

/// The device-plugin directory's inotify watch, with what wakes the
/// supervisor when it has events.
struct DirEvents {
    watch: DirWatch,
    ready: Readiness,
}

impl DirEvents {
    /// Watches `dir`; `None`, logged at debug, when it cannot (the directory
    /// does not exist yet, or no inotify or runtime). The directory is on the
    /// node's own disk, so setting the watch up does not block for long.
    fn open(dir: &std::path::Path) -> Option<Self> {
        let opened = DirWatch::open(dir).and_then(|watch| {
            let ready = Readiness::new(watch.inotify())?;
            Ok(Self { watch, ready })
        });
        match opened {
            Ok(events) => Some(events),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch the device-plugin directory; looking every poll interval");
                None
            }
        }
    }
}

impl Supervisor {
    fn new(config: PluginConfig, status: Arc<watch::Sender<PluginStatus>>) -> Self {
        // Watched before the first look, so no change in between goes unseen.
        let dir_events = DirEvents::open(&config.device_plugin_dir);
        let kubelet_id = file_id(&config.device_plugin_dir.join(api::KUBELET_SOCKET));
        Self {
            config,
            inventory: Arc::default(),
            report: HealthReport::default(),
            plan: ResourcePlan::default(),
            devices: ResourcePlan::default(),
            checks: NodeChecks::default(),
            nodes: Default::default(),
            probe: probe::NodeProbe::default(),
            servers: BTreeMap::new(),
            status,
            kubelet_generation: watch::channel(0).0,
            kubelet_id,
            looks: watch::channel(0).0,
            dir_events,
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut inventory: watch::Receiver<Arc<Inventory>>,
        mut health: watch::Receiver<HealthReport>,
    ) {
        self.inventory = inventory.borrow_and_update().clone();
        self.report = health.borrow_and_update().clone();
        self.replan().await;
        let (mut inventory_open, mut health_open) = (true, true);
        let mut period = self.look_period();
        let mut tick = ticker(period);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Reconfigure(config)) => {
                        let restart = config.device_plugin_dir != self.config.device_plugin_dir
                            || config.poll_interval != self.config.poll_interval;
                        if restart {
                            self.stop_all().await;
                            self.dir_events = DirEvents::open(&config.device_plugin_dir);
                            self.kubelet_id = file_id(&config.device_plugin_dir.join(api::KUBELET_SOCKET));
                        }
                        self.config = config;
                        self.replan().await;
                    }
                    Some(Command::Stop) | None => break,
                },
                changed = inventory.changed(), if inventory_open => match changed {
                    Ok(()) => {
                        self.inventory = inventory.borrow_and_update().clone();
                        self.replan().await;
                    }
                    Err(_) => inventory_open = false,
                },
                changed = health.changed(), if health_open => match changed {
                    Ok(()) => {
                        self.report = health.borrow_and_update().clone();
                        self.publish();
                    }
                    Err(_) => health_open = false,
                },
                () = Readiness::queued_or_never(self.dir_events.as_ref().map(|e| &e.ready)) => self.look_at_dir(),
                () = self.probe.changed() => self.look_at_nodes(),
                _ = tick.tick() => {
                    self.look_at_dir();
                    self.look_at_nodes();
                }
            }
            // A watch set up or lost changes how often the plugin must look.
            let wanted = self.look_period();
            if wanted != period {
                period = wanted;
                tick = ticker(period);
            }
        }
        self.stop_all().await;
        self.status.send_modify(|s| {
            s.resources.clear();
            s.running = false;
            s.error = None;
        });
    }

    /// How often to look without being told: every `poll_interval` while a
    /// watch is missing, else the backstop.
    fn look_period(&self) -> Duration {
        if self.dir_events.is_some() && self.probe.event_driven() {
            self.config.poll_interval.max(BACKSTOP)
        } else {
            self.config.poll_interval
        }
    }

    /// Reads the directory's events (watching it again if its watch is
    /// missing), then looks at `kubelet.sock` and has the resource tasks
    /// look at their sockets.
    fn look_at_dir(&mut self) {
        match &mut self.dir_events {
            Some(events) => {
                if let Err(e) = events.watch.drain() {
                    tracing::debug!(error = %e, "lost the device-plugin directory's watch; looking every poll interval");
                    self.dir_events = None;
                }
            }
            None => self.dir_events = DirEvents::open(&self.config.device_plugin_dir),
        }
        self.check_kubelet();
        self.looks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Looks at the device nodes; publishes if their checks changed.
    fn look_at_nodes(&mut self) {
        // Unchanged checks change no device's health.
        if self.refresh_checks() {
            self.publish();
        }
    }

    /// Bumps the kubelet generation when `kubelet.sock` appears or is replaced.
    fn check_kubelet(&mut self) {
        let id = file_id(&self.config.device_plugin_dir.join(api::KUBELET_SOCKET));
        if id != self.kubelet_id {
            if id.is_some() {
                tracing::info!("kubelet.sock was (re)created; registering again");
                self.kubelet_generation.send_modify(|g| *g += 1);
            }
            self.kubelet_id = id;
        }
    }

    /// Looks at the device nodes again; true if the checks changed.
    fn refresh_checks(&mut self) -> bool {
        let checks =
            self.probe
                .checks(&self.config.host, self.inventory.driver.loaded, &self.nodes);
        let changed = checks != self.checks;
        self.checks = checks;
        changed
    }

    /// Recomputes resources and devices, then starts, updates and stops servers.
    async fn replan(&mut self) {
        let xcp = super::devices::xcp_names_of(&self.inventory);
        self.devices = plan_resources(&self.inventory, self.config.strategy, &xcp);
        self.plan = shared_plan(&self.devices, &self.config.sharing);
        self.nodes = probe::dri_nodes(self.devices.resources.values().flatten());
        if let Some(conflict) = &self.plan.conflict {
            tracing::warn!(%conflict, "partition layouts conflict");
        }
        self.refresh_checks();

        let gone: Vec<String> = self
            .servers
            .keys()
            .filter(|name| !self.plan.resources.contains_key(*name))
            .cloned()
            .collect();
        let mut stopping = Vec::new();
        for name in gone {
            if let Some(handle) = self.servers.remove(&name) {
                tracing::info!(resource = %resource_name(&name), "resource withdrawn");
                let _ = handle.stop.send(true);
                stopping.push(handle.task);
            }
        }
        join_bounded(stopping).await;

        for (short, devices) in &self.plan.resources {
            let topology = Arc::new(Topology::new(devices, &self.inventory.gpus));
            let state = Arc::new(build_state(
                short,
                devices,
                &self.checks,
                &self.report,
                topology,
                self.config.sharing,
            ));
            match self.servers.get(short) {
                Some(handle) => {
                    handle.state.send_replace(state);
                }
                None => {
                    tracing::info!(resource = %resource_name(short), devices = devices.len(), "serving resource");
                    let handle = self.spawn_resource(short, state);
                    self.servers.insert(short.clone(), handle);
                }
            }
        }
        self.publish_status();
    }

    /// Pushes fresh health into every resource whose advertised list changed.
    fn publish(&mut self) {
        for (short, handle) in &self.servers {
            let Some(devices) = self.plan.resources.get(short) else {
                continue;
            };
            handle.state.send_if_modified(|current| {
                let next = build_state(
                    short,
                    devices,
                    &self.checks,
                    &self.report,
                    current.topology.clone(),
                    current.sharing,
                );
                if next.devices == current.devices {
                    return false;
                }
                *current = Arc::new(next);
                true
            });
        }
        self.publish_status();
    }

    fn publish_status(&self) {
        let mut entries: Vec<ResourceStatus> = Vec::new();
        for (short, handle) in &self.servers {
            let state = handle.state.borrow();
            entries.push(ResourceStatus {
                name: resource_name(short),
                devices: state.devices.len(),
                healthy: state.healthy_count(),
                ..ResourceStatus::default()
            });
        }
        let conflict = self.plan.conflict.clone();
        self.status.send_if_modified(|s| {
            // Registration state belongs to the resource tasks; keep theirs.
            for entry in &mut entries {
                if let Some(old) = s.resources.iter().find(|r| r.name == entry.name) {
                    entry.registered = old.registered;
                    entry.error = old.error.clone();
                }
            }
            let mut next = s.clone();
            next.resources = entries;
            next.conflict = conflict;
            next.error = summarize(&next);
            if next == *s {
                return false;
            }
            *s = next;
            true
        });
    }

    fn spawn_resource(&self, short: &str, state: Arc<ResourceState>) -> ResourceHandle {
        let (state_tx, state_rx) = watch::channel(state);
        let (stop, stop_rx) = watch::channel(false);
        let task = ResourceTask {
            short: short.to_owned(),
            dir: self.config.device_plugin_dir.clone(),
            status: self.status.clone(),
        };
        // The entry exists before the task can report on it.
        let name = resource_name(short);
        self.status.send_modify(|s| {
            if !s.resources.iter().any(|r| r.name == name) {
                s.resources.push(ResourceStatus {
                    name,
                    ..ResourceStatus::default()
                });
            }
        });
        let kubelet = self.kubelet_generation.subscribe();
        let looks = self.looks.subscribe();
        let task = tokio::spawn(task.run(state_rx, kubelet, looks, stop_rx));
        ResourceHandle {
            state: state_tx,
            stop,
            task,
        }
    }

    async fn stop_all(&mut self) {
        let mut tasks = Vec::new();
        for (_, handle) in std::mem::take(&mut self.servers) {
            let _ = handle.stop.send(true);
            tasks.push(handle.task);
        }
        join_bounded(tasks).await;
        self.publish_status();
    }
}

/// Waits for tasks (already told to stop) within the stop budget, then aborts
/// the stragglers.
async fn join_bounded(tasks: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + STOP_BUDGET;
    for mut task in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            tracing::warn!("resource server did not stop in time; aborting it");
            task.abort();
        }
    }
}

/// A ticker of `period` on the process's grid ([`Ticker`]): the supervisor's
/// looks fall where the health monitor's and discovery's ticks fall, so one
/// wake-up of the runtime serves them all.
fn ticker(period: Duration) -> Ticker {
    Ticker::new(period.max(Duration::from_millis(10)))
}

fn build_state(
    short: &str,
    devices: &[PluginDevice],
    checks: &NodeChecks,
    report: &HealthReport,
    topology: Arc<Topology>,
    sharing: TimeSlicing,
) -> ResourceState {
    let advertised = devices
        .iter()
        .map(|d| AdvertisedDevice {
            device: d.clone(),
            health: device_health(d, checks, report),
        })
        .collect();
    ResourceState::new(short, advertised, topology).shared(sharing)
}

fn summarize(status: &PluginStatus) -> Option<String> {
    let mut problems: Vec<String> = status.conflict.iter().map(ToString::to_string).collect();
    problems.extend(
        status
            .resources
            .iter()
            .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.name))),
    );
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Keeps one resource's socket served and registered. It checks its socket
/// when the supervisor looks at the directory (`looks`), and retries a
/// failed registration every [`REGISTER_RETRY`].
struct ResourceTask {
    short: String,
    dir: PathBuf,
    status: Arc<watch::Sender<PluginStatus>>,
}

impl ResourceTask {
    async fn run(
        self,
        state: watch::Receiver<Arc<ResourceState>>,
        mut kubelet: watch::Receiver<u64>,
        mut looks: watch::Receiver<u64>,
        mut stop: watch::Receiver<bool>,
    ) {
        let socket = self.dir.join(socket_name(&self.short));
        let mut server: Option<SocketServer> = None;
        let kubelet_socket = self.dir.join(api::KUBELET_SOCKET);
        let mut need_register = true;
        let mut next_attempt = Instant::now();
        // The kubelet socket our registration went to. A restart that wipes our
        // socket as well is seen twice (our socket, then kubelet.sock); this
        // keeps it to one registration.
        let mut registered_with: Option<FileId> = None;
        loop {
            if !server.as_ref().is_some_and(SocketServer::is_intact) {
                if let Some(old) = server.take() {
                    tracing::info!(socket = %socket.display(), "plugin socket vanished; serving it again");
                    old.shutdown().await;
                }
                match SocketServer::bind(&socket, state.clone()) {
                    Ok(s) => {
                        server = Some(s);
                        need_register = true;
                        next_attempt = Instant::now();
                    }
                    Err(e) => self.report(
                        false,
                        Some(format!("cannot serve on {}: {e}", socket.display())),
                    ),
                }
            }
            if need_register && server.is_some() && Instant::now() >= next_attempt {
                let target = file_id(&kubelet_socket);
                let result = tokio::select! {
                    result = register(&self.dir, &self.short) => result,
                    _ = stop.wait_for(|s| *s) => break,
                };
                match result {
                    Ok(()) => {
                        tracing::info!(resource = %resource_name(&self.short), "registered with the kubelet");
                        need_register = false;
                        registered_with = target;
                        self.report(true, None);
                    }
                    Err(e) => {
                        next_attempt = Instant::now() + REGISTER_RETRY;
                        self.report(false, Some(e.to_string()));
                    }
                }
            }
            let retrying = need_register && server.is_some();
            tokio::select! {
                changed = looks.changed() => if changed.is_err() {
                    break;
                },
                () = tokio::time::sleep_until(next_attempt), if retrying => {}
                changed = kubelet.changed() => match changed {
                    Ok(()) => {
                        let current = file_id(&kubelet_socket);
                        if need_register || registered_with.is_none() || current != registered_with {
                            need_register = true;
                            next_attempt = Instant::now();
                        }
                    }
                    Err(_) => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        if let Some(server) = server {
            server.shutdown().await;
        }
    }

    /// Records registration state; logs problems once per change, not per retry.
    fn report(&self, registered: bool, error: Option<String>) {
        let name = resource_name(&self.short);
        self.status.send_if_modified(|s| {
            let Some(entry) = s.resources.iter_mut().find(|r| r.name == name) else {
                return false;
            };
            if entry.registered == registered && entry.error == error {
                return false;
            }
            if let Some(e) = &error
                && entry.error.as_ref() != Some(e)
            {
                tracing::warn!(resource = %name, error = %e, "device plugin problem");
            }
            entry.registered = registered;
            entry.error = error;
            s.error = summarize(s);
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(registered: bool, error: Option<&str>) -> ResourceStatus {
        ResourceStatus {
            name: "amd.com/gpu".into(),
            devices: 8,
            healthy: 8,
            registered,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn available_only_once_the_kubelet_accepted_every_resource() {
        let serving = PluginStatus {
            resources: vec![resource(true, None)],
            running: true,
            ..PluginStatus::default()
        };
        assert_eq!(serving.unavailable_reason(), None);

        let refused = PluginStatus {
            resources: vec![
                resource(true, None),
                ResourceStatus {
                    name: "amd.com/cpx_nps4".into(),
                    ..resource(false, Some("cannot connect to the kubelet at kubelet.sock"))
                },
            ],
            running: true,
            ..PluginStatus::default()
        };
        assert_eq!(
            refused.unavailable_reason().as_deref(),
            Some(
                "not registered with the kubelet (amd.com/cpx_nps4: cannot connect to the kubelet at kubelet.sock)"
            )
        );

        let pending = PluginStatus {
            resources: vec![resource(false, None)],
            running: true,
            ..PluginStatus::default()
        };
        assert!(
            pending
                .unavailable_reason()
                .is_some_and(|r| r.contains("waiting for the kubelet"))
        );

        let nothing = PluginStatus {
            running: true,
            error: Some("GPUs disagree on partition layout".into()),
            ..PluginStatus::default()
        };
        assert_eq!(
            nothing.unavailable_reason().as_deref(),
            Some("no device to offer: GPUs disagree on partition layout")
        );
        assert!(PluginStatus::default().unavailable_reason().is_some());
    }
}
