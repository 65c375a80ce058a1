//! The node side of the driver lifecycle: what amdgpu driver and kernel a
//! node runs ([`report`]).
//!
//! This module owns reading the driver's and the kernel's state. Built so
//! far: the report only. Not built yet: bundles and their verification,
//! loading, blacklisting, unloading, reboots, and the cluster-wide upgrade;
//! `spec.driver` is still accepted and not acted on.
//!
//! It must not write the Node or decide cluster-wide: the agent publishes
//! what it reports, the leader orchestrates. All host reads go through
//! [`crate::host`]; the module's version comes from discovery
//! ([`crate::device::DriverState`]), which reads it once for everyone.

pub mod report;

pub use report::{DriverReport, ModuleOrigin, SecureBoot, read_report};
