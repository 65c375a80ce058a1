//! The start of the node side, one for the Kubernetes agent and standalone
//! mode: the device watch, the driver's report and manager (run as
//! followers), and the node services ([`NodeServices`]) over them.
//!
//! What only one mode has it starts itself on top: the agent its Node and
//! DeviceConfig watches, partition changes and remediation; standalone mode
//! its events file. This module owns the start and the stop of the shared
//! parts. It must not decide what runs: the services a mode applies come from
//! `select` and `plan` (the command line's overrides in
//! `plan::apply_overrides`), and it must not talk to the Kubernetes API
//! itself (the services do, through the [`KubeSide`] a mode hands them).

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::AbortOnDropHandle;

use super::node_services::{KubeSide, NodeServices};
use crate::api::agent_status::{DriverLoad, DriverReport};
use crate::device::watch::{DeviceWatch, WatchConfig};
use crate::driver::decision::DriverWanted;
use crate::driver::manager::ManagerConfig;
use crate::host::HostRoot;
use crate::host::reader::BoundedReader;
use crate::service::Followers;

/// The followers' names, as the status and the log name one that ended.
pub const DRIVER_REPORT: &str = "driver-report";
pub const DRIVER_MANAGER: &str = "driver-manager";

/// What the node side is started with.
#[derive(Clone, Debug)]
pub struct Start {
    pub host: HostRoot,
    /// Discovery rescan interval (the safety net behind udev).
    pub rescan_interval: Duration,
    /// The driver bundle store and the commands that load from it.
    pub driver: ManagerConfig,
    /// The driver asked for at the start (standalone mode's spec); the agent
    /// asks later, per pass ([`NodeSide::want_driver`]).
    pub driver_wanted: Option<DriverWanted>,
}

/// The node side, running. Dropping it stops its followers and the device
/// watch; [`NodeSide::stop`] stops the services first (removing their
/// sockets).
pub struct NodeSide {
    /// Stops the followers when dropped; first, so that their ends that
    /// follow are expected ones.
    _stop: DropGuard,
    pub services: NodeServices,
    pub devices: DeviceWatch,
    /// One small reader pool for the driver's own host reads: the report
    /// and the holder scans of the driver manager and of partition changes.
    pub reader: BoundedReader,
    /// What driver and kernel the node runs, whatever the DeviceConfig says
    /// about drivers.
    pub driver_report: watch::Receiver<Option<DriverReport>>,
    /// What the driver manager last did.
    pub driver_load: watch::Receiver<Option<DriverLoad>>,
    driver_wanted: watch::Sender<Option<DriverWanted>>,
    followers: Followers,
    _driver_report: AbortOnDropHandle<()>,
    _driver_manager: AbortOnDropHandle<()>,
}

impl NodeSide {
    /// Starts the device watch (not waiting for the first scan: a hung host
    /// must not keep the metrics endpoint, and /healthz, down; the other
    /// services wait for discovery), the driver's report and manager as
    /// followers under `followers`, and the node services with `kube`
    /// (`None` in standalone mode). No service runs until a mode applies
    /// what it wants ([`NodeServices::apply`]).
    pub fn start(start: Start, kube: Option<KubeSide>, followers: Followers) -> Self {
        let devices = DeviceWatch::start_undiscovered(
            start.host.clone(),
            WatchConfig {
                rescan_interval: start.rescan_interval,
                use_udev: true,
                ..WatchConfig::default()
            },
        );
        // Every follower stops with the node side; ends after that are
        // expected.
        let stop = followers.stopping();
        let reader = BoundedReader::new(start.host, 2);
        let (driver_report, report_task) = crate::driver::report::follow(
            reader.clone(),
            devices.inventory(),
            devices.state(),
            stop.clone(),
        );
        let report_handle = followers.spawn(DRIVER_REPORT, report_task);
        // Loads the driver asked for, if any.
        let (driver_wanted, wanted_rx) = watch::channel(start.driver_wanted);
        let (driver_load, manager_task) = crate::driver::manager::follow(
            reader.clone(),
            start.driver,
            wanted_rx,
            driver_report.clone(),
            stop.clone(),
        );
        let manager_handle = followers.spawn(DRIVER_MANAGER, manager_task);
        let services = NodeServices::new(devices.inventory(), devices.state(), kube);
        Self {
            _stop: stop.drop_guard(),
            services,
            devices,
            reader,
            driver_report,
            driver_load,
            driver_wanted,
            followers,
            _driver_report: report_handle,
            _driver_manager: manager_handle,
        }
    }

    /// The followers the node side runs under, for what a mode adds.
    pub fn followers(&self) -> &Followers {
        &self.followers
    }

    /// What stops the followers; cancelled when the node side is dropped.
    pub fn stopping(&self) -> CancellationToken {
        self.followers.stopping()
    }

    /// Asks the driver manager for `wanted`; the manager wakes only when
    /// that differs from what it was asked before.
    pub fn want_driver(&self, wanted: Option<DriverWanted>) {
        self.driver_wanted.send_if_modified(|current| {
            let changed = *current != wanted;
            *current = wanted;
            changed
        });
    }
}
