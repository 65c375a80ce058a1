//! The agent's per-node status, published as one annotation on its Node.
//!
//! Annotation [`STATUS_ANNOTATION`] holds compact JSON:
//!
//! ```json
//! {"v":1,"deviceConfig":"kube-amd-gpu/default","uid":"…","generation":3,
//!  "services":{"devicePlugin":{"state":"Running"},"labeller":{"state":"Running"}},
//!  "resources":{"amd.com/gpu":8},"gpus":8,"driverVersion":"6.12.12",
//!  "problems":[],"since":"2026-11-30T07:00:00Z"}
//! ```
//!
//! - `deviceConfig`, `uid`, `generation`: the DeviceConfig the agent follows and the
//!   generation whose services it has applied; absent when none selects the node.
//!   The leader sets `observedGeneration` from these.
//! - `services`: state of each running service (`Running`, `Restarting` with
//!   `error` and `restarts`, `Finished`); a disabled service is absent.
//! - `resources`: device plugin resources and their device counts.
//! - `problems`: what needs a person (conflicting DeviceConfigs, a partition layout
//!   the naming strategy cannot serve).
//! - `since`: when this content was first published. It is not a heartbeat: the
//!   annotation is written only when something other than `since` changes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::supervisor::ServiceState;

pub const STATUS_ANNOTATION: &str = "amd.com/gpu-agent-status";
pub const STATUS_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_config: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default)]
    pub services: BTreeMap<String, ServiceStatus>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, usize>,
    pub gpus: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    #[serde(default)]
    pub since: String,
}

/// A service's state as it appears in the annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum ServiceStatus {
    Running,
    Restarting { error: String, restarts: u64 },
    Finished,
}

impl ServiceStatus {
    /// The annotation form of a slot state; `None` for a stopped service.
    pub fn from_state(state: &ServiceState) -> Option<Self> {
        match state {
            ServiceState::Running => Some(Self::Running),
            ServiceState::Restarting { error, restarts } => Some(Self::Restarting {
                error: error.clone(),
                restarts: *restarts,
            }),
            ServiceState::Finished => Some(Self::Finished),
            ServiceState::Stopped => None,
        }
    }

    pub fn is_available(&self) -> bool {
        matches!(self, Self::Running)
    }
}

impl AgentStatus {
    /// True when `self` and `other` differ in anything but `since`.
    pub fn differs_from(&self, other: &AgentStatus) -> bool {
        let strip = |s: &AgentStatus| AgentStatus {
            since: String::new(),
            ..s.clone()
        };
        strip(self) != strip(other)
    }

    pub fn to_json(&self) -> String {
        // Serialising plain maps and strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AgentStatus {
        AgentStatus {
            v: STATUS_VERSION,
            device_config: Some("ns/dc".into()),
            uid: Some("u".into()),
            generation: Some(2),
            services: [("devicePlugin".to_string(), ServiceStatus::Running)].into(),
            resources: [("amd.com/gpu".to_string(), 8)].into(),
            gpus: 8,
            driver_version: Some("6.12.12".into()),
            problems: vec![],
            since: "2026-11-30T07:00:00Z".into(),
        }
    }

    #[test]
    fn round_trips_in_the_documented_shape() {
        let json = sample().to_json();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["deviceConfig"], "ns/dc");
        assert_eq!(value["services"]["devicePlugin"]["state"], "Running");
        assert_eq!(value["resources"]["amd.com/gpu"], 8);
        assert_eq!(AgentStatus::parse(&json).unwrap(), sample());
    }

    #[test]
    fn since_alone_is_not_a_change() {
        let later = AgentStatus {
            since: "2026-11-30T08:00:00Z".into(),
            ..sample()
        };
        assert!(!later.differs_from(&sample()));
        let failing = AgentStatus {
            services: [(
                "devicePlugin".to_string(),
                ServiceStatus::Restarting {
                    error: "x".into(),
                    restarts: 1,
                },
            )]
            .into(),
            ..sample()
        };
        assert!(failing.differs_from(&sample()));
    }
}
