//! What the agent does on one pass over its Node, decided as plain data.
//!
//! A pass has three steps, because the node services only say how they are
//! after they have been given their configuration:
//!
//! 1. [`follow`]: from the selection, what the agent follows (the line to log
//!    when that changed) and which ConfigMaps and `rbacConfig` objects to watch;
//! 2. [`services`]: the services to run, with the command line's overrides;
//! 3. [`report`]: once the services were applied, whether to remove the GPU
//!    labels, start or stop publishing health on the Node, which Warning Events
//!    to record and which status annotation to write.
//!
//! [`LoopState`] is what the agent remembers between passes: what it logged it
//! follows, the problems already recorded as Events, the status last written.
//!
//! This module owns those decisions. It must not do I/O of any kind: no
//! Kubernetes API, no clock, no tasks; the agent loop (`super::run`) reads the
//! inputs and carries the plan out.
//!
//! This file holds [`LoopState`]; each decision has a file of its own:
//! `follow.rs` (step 1), `services.rs` (step 2) and `report.rs` (step 3).
//! The driver's Event, labels and condition on the Node are the driver's
//! decisions (`crate::driver::decision`); the agent keeps what it last
//! showed in [`LoopState::driver`].

use std::collections::BTreeSet;

use crate::api::agent_status::AgentStatus;

mod follow;
mod report;
mod services;

pub use follow::{Following, follow};
pub use report::{HealthPublishing, Observed, Report, StatusUpdate, Warning, report};
pub use services::{
    NodeWork, Overrides, apply_overrides, hold_for_node_work, partition_wanted, services,
};

/// What the agent remembers from one pass to the next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopState {
    /// What the agent follows, as last logged.
    followed: Option<String>,
    /// The problems recorded as Events, by message: each is recorded once for
    /// as long as it lasts.
    reported: BTreeSet<String>,
    /// What was last written: `Some(None)` means the annotation was removed.
    last_status: Option<Option<AgentStatus>>,
    /// Set while the latest status write failed: it is retried on a timer.
    status_write_failed: bool,
    /// What the agent last showed of the driver on the Node (its labels,
    /// the Event for what the driver manager did).
    pub driver: crate::driver::decision::Shown,
    /// The partition profiles text last parsed, and what it gave: a pass
    /// parses it again only when it changed.
    partition_profiles: Option<(std::sync::Arc<str>, ParsedProfiles)>,
}

type ParsedProfiles = Result<std::sync::Arc<crate::partition::ProfileSet>, String>;

impl LoopState {
    /// Whether the latest status write failed, so that the loop retries it
    /// without waiting for another change.
    pub fn status_write_failed(&self) -> bool {
        self.status_write_failed
    }

    /// Takes in how the write of `update` went.
    pub fn status_written(&mut self, update: StatusUpdate, written: bool) {
        if written {
            self.last_status = Some(update.status);
            self.status_write_failed = false;
        } else {
            self.status_write_failed = true;
        }
    }
}

/// A selection of one DeviceConfig, `namespace/name`, with `spec`.
#[cfg(test)]
fn one(
    namespace: &str,
    name: &str,
    spec: crate::api::DeviceConfigSpec,
) -> super::select::Selection {
    super::select::Selection::One(Box::new(super::select::Selected {
        key: crate::api::agent_status::ConfigKey {
            namespace: namespace.into(),
            name: name.into(),
        },
        uid: Some("uid-1".into()),
        generation: Some(4),
        spec,
    }))
}
