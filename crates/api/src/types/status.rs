//! The DeviceConfig's status, wire format only: per-part progress across the
//! nodes, each node's module status, the upgrade summary and the condition
//! types and reasons the operator writes. It must not decide them (that is
//! the leader's, `cluster::status`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::super::enums::UpgradeState;
use super::{is_default, is_zero_i32, is_zero_i64};

/// Progress of one part of the configuration across the selected nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DeploymentStatus {
    /// Nodes matched by the selector.
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub nodes_matching_selector_number: i32,
    /// Nodes that should run this part.
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub desired_number: i32,
    /// Nodes where this part is running and ready.
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub available_number: i32,
}

/// The driver on one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ModuleStatus {
    /// Image (or package source) the loaded driver came from.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_image: String,
    /// Kernel version the driver was loaded for.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kernel_version: String,
    /// When the status last changed (RFC 3339).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
    /// Upgrade state of the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub status: Option<UpgradeState>,
    /// When the current upgrade started (RFC 3339).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub upgrade_start_time: String,
    /// Boot ID of the node, to notice reboots.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
}

/// How many selected nodes are where in the rolling driver upgrade.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct UpgradeSummary {
    /// The driver version the nodes are upgraded to.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// Nodes that run the target (Upgrade-Complete, Install-Complete).
    pub complete: i32,
    /// Nodes being upgraded or installed now.
    pub in_progress: i32,
    /// Nodes waiting for their turn (Upgrade-Not-Started).
    pub not_started: i32,
    /// Nodes in a failed state: they wait for a person
    /// (`operator.amd.com/gpu-driver-upgrade-state=upgrade-required`).
    pub failed: i32,
}

/// Condition type: the configuration is applied.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the configuration cannot be applied.
pub const CONDITION_ERROR: &str = "Error";
/// Condition reason: the spec failed validation.
pub const REASON_VALIDATION_ERROR: &str = "ValidationError";
/// Condition reason: everything is applied.
pub const REASON_OPERATOR_READY: &str = "OperatorReady";
/// Condition reason: the selector matches no node.
pub const REASON_NO_MATCHING_NODES: &str = "NoMatchingNodes";
/// Condition reason: another error.
pub const REASON_ERROR: &str = "Error";
/// Condition reason: some selected nodes do not serve what the DeviceConfig
/// enables (the message says which and why).
pub const REASON_NODES_NOT_SERVING: &str = "NodesNotServing";
/// Condition type (ours): which remediation mapping is in force, while
/// remediation is enabled: the reference's operator does not remediate
/// without a mapping, ours uses its built-in one, and says so here.
pub const CONDITION_REMEDIATION_MAPPING: &str = "RemediationMapping";
/// Its reasons: the built-in mapping, the ConfigMap `config` names, or none
/// (the ConfigMap cannot be read: the Error condition says why).
pub const REASON_BUILTIN_MAPPING: &str = "BuiltInMapping";
pub const REASON_CONFIGMAP_MAPPING: &str = "ConfigMapMapping";
pub const REASON_NO_MAPPING: &str = "MappingUnreadable";

/// Observed state of a DeviceConfig.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceConfigStatus {
    /// Device plugin progress.
    #[serde(skip_serializing_if = "is_default")]
    pub device_plugin: DeploymentStatus,
    /// Driver progress.
    #[serde(skip_serializing_if = "is_default")]
    pub driver: DeploymentStatus,
    /// Metrics progress.
    #[serde(skip_serializing_if = "is_default")]
    pub metrics_exporter: DeploymentStatus,
    /// Device configuration progress.
    #[serde(skip_serializing_if = "is_default")]
    pub config_manager: DeploymentStatus,
    /// Remediation progress.
    #[serde(skip_serializing_if = "is_default")]
    pub remediation_workflow: DeploymentStatus,
    /// Driver state per node name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_module_status: BTreeMap<String, ModuleStatus>,
    /// The rolling driver upgrade's progress, counted over the selected
    /// nodes (`driver.upgradePolicy.enable`); absent when none runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_upgrade: Option<UpgradeSummary>,
    /// Conditions of types Ready and Error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
}
