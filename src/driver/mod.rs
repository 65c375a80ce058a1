//! The node side of the driver lifecycle: what amdgpu driver and kernel a
//! node runs ([`report`]); driver bundles, the on-disk form of one driver for
//! one kernel, with the checks a bundle must pass before it may be loaded
//! ([`bundle`]); the preflight an administrator runs before booting a new
//! kernel ([`preflight`]); what to do about the driver, and loading a
//! verified bundle with `modprobe` ([`load`]); what the node's driver should
//! be and how that shows on the Node, decided in one place ([`decision`],
//! pure: the agent's one door to the driver's decisions); and the agent's
//! driver manager ([`manager`]), which does that when the DeviceConfig asks for a
//! driver, keeps the amdgpu blacklist ([`blacklist`]), replaces an
//! out-of-tree driver once nothing holds it ([`holders`]), follows the
//! target of the node's rolling upgrade and reboots when it asks
//! ([`reboot`]); what a reload by another (the DRA plugin's memory mode
//! change) loads again, and keeping it and the manager apart ([`reload`]); one GPU is reset when its remediation asks ([`gpu_reset`]). Bundles come into the store from a directory configuration
//! management fills, or ([`source`]) from the reference's precompiled driver
//! images and from sha256-pinned tarballs (`driver import`, `driver fetch`),
//! within a bound on the disk a fetch takes ([`space`]).
//! The cluster-wide upgrade is the leader's (`cluster::upgrade`).
//!
//! This module must not write the Node or decide cluster-wide: the agent
//! publishes what it reports, the leader orchestrates. All host reads go
//! through [`crate::host`]; the module's version comes from discovery
//! ([`crate::device::DriverState`]), which reads it once for everyone.

pub mod blacklist;
pub mod bundle;
pub mod condition;
pub mod decision;
pub mod gpu_reset;
pub mod holders;
pub mod load;
pub mod manager;
pub mod preflight;
pub mod reboot;
pub mod reload;
pub mod report;
pub mod source;
pub mod space;

pub use report::{DriverReport, ModuleOrigin, SecureBoot, read_report};
