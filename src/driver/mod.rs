//! The node side of the driver lifecycle: what amdgpu driver and kernel a
//! node runs ([`report`]); driver bundles, the on-disk form of one driver for
//! one kernel, with the checks a bundle must pass before it may be loaded
//! ([`bundle`]); the preflight an administrator runs before booting a new
//! kernel ([`preflight`]); and what to do about the driver, and loading a
//! verified bundle with `modprobe` ([`load`]).
//!
//! Built so far: those four, as library functions and the `driver status`
//! and `driver check` commands; the agent publishing the report in its
//! status ([`report::follow`]), from which the leader fills
//! `status.nodeModuleStatus`; and the agent's driver manager ([`manager`]),
//! which loads a verified bundle when the DeviceConfig asks for a driver.
//! The manager also keeps the amdgpu blacklist ([`blacklist`]) and replaces
//! an out-of-tree driver once nothing holds it ([`holders`]). Bundles come
//! into the store from a directory configuration management fills, or
//! ([`source`]) from the reference's precompiled driver images and from
//! sha256-pinned tarballs (`driver import`, `driver fetch`). Not built yet:
//! the agent fetching a DeviceConfig's sources, reboots, and the
//! cluster-wide upgrade.
//!
//! This module must not write the Node or decide cluster-wide: the agent
//! publishes what it reports, the leader orchestrates. All host reads go
//! through [`crate::host`]; the module's version comes from discovery
//! ([`crate::device::DriverState`]), which reads it once for everyone.

pub mod blacklist;
pub mod bundle;
pub mod condition;
pub mod holders;
pub mod load;
pub mod manager;
pub mod preflight;
pub mod report;
pub mod source;

pub use report::{DriverReport, ModuleOrigin, SecureBoot, read_report};
