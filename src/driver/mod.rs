//! The node side of the driver lifecycle: what amdgpu driver and kernel a
//! node runs ([`report`]), and driver bundles, the on-disk form of one driver
//! for one kernel, with the checks a bundle must pass before it may be
//! loaded ([`bundle`]), and the preflight an administrator runs before
//! booting a new kernel ([`preflight`]).
//!
//! Built so far: the report, bundle verification and the preflight. Not built yet: fetching
//! bundles (driver images, tarballs), loading, blacklisting, unloading,
//! reboots, and the cluster-wide upgrade; `spec.driver` is still accepted
//! and not acted on.
//!
//! This module must not write the Node or decide cluster-wide: the agent
//! publishes what it reports, the leader orchestrates. All host reads go
//! through [`crate::host`]; the module's version comes from discovery
//! ([`crate::device::DriverState`]), which reads it once for everyone.

pub mod bundle;
pub mod preflight;
pub mod report;

pub use report::{DriverReport, ModuleOrigin, SecureBoot, read_report};
