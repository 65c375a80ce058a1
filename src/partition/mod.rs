//! GPU partitioning: the reference's partition profiles, checked against the
//! node's GPUs and applied through the driver's sysfs attributes.
//!
//! - [`profiles`]: the `config.json` format and the built-in profiles (pure);
//! - [`plan`]: a profile laid onto the node's GPUs, or the reason it cannot
//!   be (pure), decided before anything is drained;
//! - [`apply`]: holders checked, modes written, the new partitions awaited;
//! - [`local`]: a whole change on a host without Kubernetes, its GPU client
//!   services stopped meanwhile;
//! - [`state`]: the change of a Kubernetes node as its labels and the
//!   leader's record show it, and each side's next step (pure).
//!
//! Every other service follows a change by itself: the inventory drives the
//! device plugin, the DRA slices, labels, metrics and health. This module
//! must not drain, cordon or write Nodes; the agent and the leader do.

pub mod apply;
pub mod local;
pub mod plan;
pub mod profiles;
pub mod state;

pub use apply::{ApplyError, Limits};
pub use plan::{Assignment, Plan, plan};
pub use profiles::{Profile, ProfileSet};

/// The Node label that selects a profile, as in the reference.
pub const PROFILE_LABEL: &str = "dcm.amd.com/gpu-config-profile";
/// The Node label that says how far the change got.
pub const STATE_LABEL: &str = "dcm.amd.com/gpu-config-profile-state";
