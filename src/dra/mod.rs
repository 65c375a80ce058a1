//! The DRA kubelet plugin (`resource.k8s.io/v1`): offers this node's GPUs and
//! GPU partitions as driver `gpu.amd.com`, from the same inventory and health
//! reports as the device plugin, in the same process.
//!
//! This module owns device naming and attributes as ResourceSlices carry them,
//! the node's ResourceSlices, prepared claims' `status.devices` entries of
//! this driver, the kubelet's registration, DRA and resource health sockets,
//! CDI specs of prepared claims and the checkpoint. It must
//! not discover GPUs or decide health (it reads [`crate::device::Inventory`]
//! and [`crate::plugin::HealthReport`] and applies the device plugin's health
//! rules), write Nodes, or create DeviceClasses (the leader does).
//!
//! Layout: [`devices`] (naming, attributes), [`slices`] (the node's
//! ResourceSlices, cut at the API's limits), [`layouts`] (partitions
//! allocated on demand: layout devices, counters, the changes a Prepare
//! makes), [`claims`] (which devices of a claim are ours), [`cdi`] (spec content and files), [`checkpoint`] and
//! [`health`] are pure or plain file I/O; [`prepare`] reads claims and writes
//! specs; [`claim_status`] writes prepared claims' `status.devices`; `server`
//! speaks gRPC; [`service`] runs it all.

pub mod api;
mod calls;
pub mod cdi;
pub mod checkpoint;
pub mod claim_status;
pub mod claims;
pub mod devices;
pub mod health;
pub mod layouts;
pub mod prepare;
mod server;
pub mod service;
pub mod slices;

pub use devices::{DRIVER_NAME, DraDevice};
pub use health::Published;
pub use server::Registration;
pub use service::{DraConfig, DraPlugin, DraStatus, Slices};
pub use slices::UNHEALTHY_TAINT_KEY;
