//! Kubelet device plugin: offers AMD GPUs and GPU partitions to the kubelet as
//! `amd.com/...` extended resources through the device plugin API v1beta1.
//!
//! This module owns resource naming, device IDs, device health as advertised,
//! allocation answers and the plugin's sockets and registration. It must not
//! discover GPUs (it consumes [`crate::device::Inventory`] from a watch channel),
//! decide health beyond device-node presence (other monitors feed a
//! [`HealthReport`]), or talk to the Kubernetes API (the agent turns
//! [`PluginStatus`] into Events and status).
//!
//! Use from the agent:
//!
//! ```no_run
//! # async fn demo(inventory: tokio::sync::watch::Receiver<std::sync::Arc<gpu_operator::device::Inventory>>) {
//! use gpu_operator::host::HostRoot;
//! use gpu_operator::plugin::{DevicePluginService, HealthReport, PluginConfig, ResourceNamingStrategy};
//!
//! let config = PluginConfig::new(PluginConfig::DEFAULT_DIR, ResourceNamingStrategy::Single, HostRoot::new("/host"));
//! let (_health_tx, health) = tokio::sync::watch::channel(HealthReport::default());
//! let plugin = DevicePluginService::start(config, inventory, health);
//! let mut status = plugin.status(); // PluginStatus: resources, conflict, error
//! # let _ = status.changed().await;
//! plugin.stop().await; // removes the sockets
//! # }
//! ```
//!
//! gRPC clients: the kubelet dials the plugin sockets with `:authority:
//! localhost`, and any client doing so is served. Clients that send the socket
//! path as the authority (grpcio 1.57 and later, grpc-java) are refused by
//! hyper's HTTP/2 layer, which checks the authority before this code sees the
//! request; point such a client at `localhost` (e.g. grpcio's
//! `grpc.default_authority` channel option).
//!
//! Layout: [`devices`] (naming and IDs), [`health`], [`preferred`]
//! (GetPreferredAllocation) and [`state`] (ListAndWatch lists, Allocate answers)
//! are pure; `probe` reads the host, `server` speaks gRPC, [`service`] runs it all.

pub mod api;
pub mod devices;
pub mod health;
pub mod preferred;
mod probe;
mod server;
pub mod service;
pub mod state;

pub use devices::{
    LayoutConflict, PluginDevice, ResourceNamingStrategy, ResourcePlan, TimeSlicing, layouts_of,
    parent_id, plan_resources, shared_plan,
};
pub use health::{DeviceRef, Health, HealthReport};
pub use preferred::{Topology, preferred_allocation, preferred_replicas};
pub(crate) use probe::{NodeProbe, dri_nodes};
pub(crate) use server::SocketServer;
pub use server::{RegisterError, plugin_options};
pub use service::{DevicePluginService, PluginConfig, PluginStatus, ResourceStatus, Stopped};
pub use state::{AllocateError, ResourceState};
