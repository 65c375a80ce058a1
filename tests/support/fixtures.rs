//! Fixture builders for the API objects tests and benches write by hand: the
//! agent's status annotation (`AgentStatus`) and the `DeviceConfig`. Each
//! starts from what every such literal sets and names only what differs, so
//! a test shows the fields it is about. Pure values, no I/O. Included by
//! `support/mod.rs` and, for the benches' Nodes, by
//! `benches/support/kubelet_node.rs` with `#[path]`.
#![allow(dead_code)]

use gpu_operator::api::DeviceConfig;
use gpu_operator::api::agent_status::{
    AgentStatus, ConfigKey, DriverReport, STATUS_VERSION, ServiceName, ServiceStatus,
};
use gpu_operator::detect::GPU_LABEL;
use serde_json::{Value, json};

/// An `AgentStatus` as an agent of one DeviceConfig reports it.
pub struct AgentStatusBuilder(AgentStatus);

impl AgentStatusBuilder {
    /// An agent of DeviceConfig `namespace/name` on 8 GPUs, at the current
    /// status version, running no service yet.
    pub fn of(namespace: &str, name: &str) -> Self {
        Self(AgentStatus {
            v: STATUS_VERSION,
            device_config: Some(ConfigKey::new(namespace, name)),
            gpus: 8,
            since: "2026-11-30T00:00:00Z".into(),
            ..AgentStatus::default()
        })
    }

    /// `of`, with the device plugin running.
    pub fn serving(namespace: &str, name: &str) -> Self {
        Self::of(namespace, name).service(ServiceName::DevicePlugin, ServiceStatus::Running)
    }

    /// The DeviceConfig's uid and generation the agent acts on.
    pub fn acting_on(mut self, uid: &str, generation: i64) -> Self {
        self.0.uid = Some(uid.to_owned());
        self.0.generation = Some(generation);
        self
    }

    pub fn service(mut self, name: ServiceName, status: ServiceStatus) -> Self {
        self.0.services.insert(name, status);
        self
    }

    /// An extended resource the device plugin advertises.
    pub fn resource(mut self, name: &str, count: usize) -> Self {
        self.0.resources.insert(name.to_owned(), count);
        self
    }

    pub fn layout(mut self, layout: &str) -> Self {
        self.0.layouts.push(layout.to_owned());
        self
    }

    pub fn driver_version(mut self, version: &str) -> Self {
        self.0.driver_version = Some(version.to_owned());
        self
    }

    pub fn driver(mut self, driver: DriverReport) -> Self {
        self.0.driver = Some(driver);
        self
    }

    pub fn since(mut self, since: &str) -> Self {
        self.0.since = since.to_owned();
        self
    }

    pub fn build(self) -> AgentStatus {
        self.0
    }

    /// The status annotation's value.
    pub fn to_json(&self) -> String {
        self.0.to_json()
    }
}

/// A driver report of `version` loaded in the boot `boot_id`.
pub fn loaded_driver(version: &str, boot_id: &str) -> DriverReport {
    DriverReport {
        loaded: true,
        version: Some(version.to_owned()),
        boot_id: Some(boot_id.to_owned()),
        ..DriverReport::default()
    }
}

/// A `DeviceConfig` as JSON (what the emulator takes) or typed.
pub struct DeviceConfigBuilder(Value);

impl DeviceConfigBuilder {
    /// DeviceConfig `namespace/name` with an empty spec.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(
            json!({"apiVersion": "amd.com/v1alpha1", "kind": "DeviceConfig",
            "metadata": {"name": name, "namespace": namespace}, "spec": {}}),
        )
    }

    /// DeviceConfig `namespace/fleet`, selecting the Nodes labelled
    /// `GPU_LABEL` (what discovery puts on a Node with an AMD GPU), as the fleet benches and tests have it.
    pub fn fleet(namespace: &str) -> Self {
        Self::new(namespace, "fleet").spec("selector", json!({ GPU_LABEL: "true" }))
    }

    /// Sets the whole `spec`.
    pub fn with_spec(mut self, spec: Value) -> Self {
        self.0["spec"] = spec;
        self
    }

    /// Sets `spec.<field>`.
    pub fn spec(mut self, field: &str, value: Value) -> Self {
        self.0["spec"][field] = value;
        self
    }

    /// Sets `metadata.<field>` (uid, generation, annotations, finalizers...).
    pub fn metadata(mut self, field: &str, value: Value) -> Self {
        self.0["metadata"][field] = value;
        self
    }

    pub fn json(self) -> Value {
        self.0
    }

    pub fn build(self) -> DeviceConfig {
        serde_json::from_value(self.0).expect("a DeviceConfig")
    }
}
