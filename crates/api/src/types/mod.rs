//! The DeviceConfig resource (`amd.com/v1alpha1`), field for field as AMD's GPU
//! Operator defines it.
//!
//! These types own the wire format: JSON names, types, defaults and the schema
//! markers that end up in the CRD. They must not interpret fields (that is
//! `semantics`) nor judge them (that is `validate`).
//!
//! # "Not set" versus default
//!
//! One rule, applied to every field, mirrors what the Kubernetes API server does
//! with the reference CRD:
//!
//! * A field that has a default in the reference CRD (`enable: true`, `port: 5000`,
//!   `maxUnavailableNodes: "25%"`, ...) is a plain Rust value. Deserialization fills
//!   the default when the field is absent, just as the API server does, so the agent
//!   reading a file in standalone mode sees what the reference operator sees. It is
//!   always written back, as the API server would store it.
//! * A field without a default is an `Option` (or an empty `Vec`/map) and is written
//!   back only when it was set. An administrator's `blacklist: false` stays
//!   `blacklist: false`; an absent one stays absent.
//! * A section that the reference declares as a value (not a pointer) and that
//!   holds a default `true` switch, `driver` and `devicePlugin`, is an `Option`
//!   too. The reference CRD puts no default on the section itself, so the API
//!   server fills `enable: true` only into a section that is present, and the
//!   reference's code reads the switch of an absent one as off (a nil pointer).
//!   Presence therefore changes meaning: an absent `devicePlugin` runs no device
//!   plugin, `devicePlugin: {}` runs it. `semantics` gives callers one view of
//!   either ([`DeviceConfigSpec::driver`](super::semantics)).
//! * The other value sections (`metricsExporter`, `testRunner`, ...) mean the
//!   same absent or empty (their switches have no default, or `false`), so they
//!   are plain structs left out on write-back while they equal their default.
//!   So `spec: {}` round-trips to `spec: {}`.
//! * A section the reference declares as a pointer (`upgradePolicy`,
//!   `nodeDrainPolicy`, `prometheus`, ...) is an `Option`: its presence carries
//!   meaning (a drain policy takes precedence over a pod deletion policy), so it is
//!   never invented. Its own defaults apply once it is present.
//!
//! Field docs become the CRD's `description`s, so they describe the API. Fields
//! that have no effect in this design say so in one sentence; the full mapping is
//! in `docs/deviceconfig.md`.
//!
//! This file holds the resource (`DeviceConfigSpec`), the patterns and
//! defaults every section shares, and the smaller sections; the `driver`
//! section is `driver.rs`'s, the metrics exporter's `metrics.rs`'s, and the
//! status `status.rs`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::enums::PullPolicy;

mod driver;
mod metrics;
mod status;

pub use driver::{
    DaemonSetUpgradeSpec, DrainSpec, DriverSpec, DriverUpgradePolicySpec, ImageBuildSpec,
    ImageSignSpec, KernelModuleConfigSpec, PodDeletionSpec, RegistryTls, VfioConfigSpec,
};
pub use metrics::{
    AttachMetadata, ConfigMapKeySelector, KubeRbacConfig, MetricsConfig, MetricsExporterSpec,
    PrometheusConfig, RelabelConfig, SafeAuthorization, SecretKeySelector, SecretOrConfigMap,
    ServiceMonitorConfig, StaticAuthConfig, TlsConfig, default_exporter_resources,
};
pub use status::{
    CONDITION_ERROR, CONDITION_READY, CONDITION_REMEDIATION_MAPPING, DeploymentStatus,
    DeviceConfigStatus, ModuleStatus, REASON_BUILTIN_MAPPING, REASON_CONFIGMAP_MAPPING,
    REASON_ERROR, REASON_NO_MAPPING, REASON_NO_MATCHING_NODES, REASON_NODES_NOT_SERVING,
    REASON_OPERATOR_READY, REASON_VALIDATION_ERROR, UpgradeSummary,
};

/// Image reference pattern the reference CRD puts on operand image fields.
pub const IMAGE_PATTERN: &str = r"^([a-z0-9]+(?:[._-][a-z0-9]+)*(:[0-9]+)?)(/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[a-z0-9._-]+)?(?:@[a-zA-Z0-9]+:[a-f0-9]+)?$";
/// The driver image pattern, which also allows `$VARIABLE` path parts.
pub const DRIVER_IMAGE_PATTERN: &str = r"^([a-z0-9]+(?:[._-][a-z0-9]+)*(:[0-9]+)?)(/[$a-zA-Z0-9_]+(?:[._-][$a-zA-Z0-9_]+)*)*(?::[a-z0-9._-]+)?(?:@[a-zA-Z0-9]+:[a-f0-9]+)?$";
/// Go duration strings as the reference CRD restricts them (`24h`, `1h30m`, `1.5s`).
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// `remediationWorkflow.rebootTimeout` as the reference CRD restricts it:
/// seconds, minutes and hours only.
pub const REBOOT_TIMEOUT_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(s|m|h))+$";
/// A Kubernetes resource quantity (`500m`, `4G`, `1Gi`), the pattern the
/// reference CRD carries on `metricsExporter.resource` limits and requests.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// Prometheus scrape intervals: one number and one unit.
pub const INTERVAL_PATTERN: &str = r"^([0-9]+)(ms|s|m|h)$";
/// An absolute unix path that may end in a slash.
pub const ABSOLUTE_PATH_PATTERN: &str = r"^(/[^/\0]+)*(/)?$";
/// A Prometheus label name.
pub const PROMETHEUS_LABEL_PATTERN: &str = r"^[a-zA-Z_][a-zA-Z0-9_]*$";

/// Default host directory of the kubelet's device plugin sockets.
pub const DEFAULT_KUBELET_SOCKET_PATH: &str = "/var/lib/kubelet/device-plugins";
/// Default host directory of the kubelet's pod-resources socket.
pub const DEFAULT_POD_RESOURCES_PATH: &str = "/var/lib/kubelet/pod-resources";
/// Default test runner log directory (host and mount).
pub const DEFAULT_TEST_RUNNER_LOGS: &str = "/var/log/amd-test-runner";

pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn is_zero_i32(value: &i32) -> bool {
    *value == 0
}

fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

// The reference uses Kubernetes' `LocalObjectReference`, whose `name` defaults to
// `""` rather than being required (k8s-openapi's type requires it); this type keeps
// the reference's schema.
/// A reference to an object (Secret or ConfigMap) in the DeviceConfig's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct LocalObjectRef {
    /// Name of the referent.
    pub name: String,
}

impl LocalObjectRef {
    /// A reference to `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// DeviceConfigSpec describes how AMD GPUs are enabled on the nodes it selects.
// kube's `printcolumn(...)` repeats the same keys once per column by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "amd.com",
    version = "v1alpha1",
    kind = "DeviceConfig",
    namespaced,
    shortname = "gpue",
    status = "DeviceConfigStatus",
    derive = "PartialEq",
    doc = "DeviceConfig describes how to enable AMD GPU devices on the nodes it selects.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the configuration is applied on every selected node"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.devicePlugin.nodesMatchingSelectorNumber",
        description = "Nodes matched by the selector"
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.devicePlugin.availableNumber",
        description = "Matched nodes where pods can get GPUs (the kubelet accepted the device plugin)"
    ),
    printcolumn(
        name = "Upgraded",
        type_ = "integer",
        json_path = ".status.driverUpgrade.complete",
        description = "Selected nodes that run the driver version asked for (rolling upgrades)"
    ),
    printcolumn(
        name = "Upgrading",
        type_ = "integer",
        json_path = ".status.driverUpgrade.inProgress",
        description = "Nodes whose driver is being upgraded now"
    ),
    printcolumn(
        name = "Upgrade-Failed",
        type_ = "integer",
        json_path = ".status.driverUpgrade.failed",
        description = "Nodes whose driver upgrade failed and waits for a person"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceConfigSpec {
    /// The GPU kernel driver: whether and how it is installed and upgraded.
    /// Absent, no driver is managed (as in the reference, whose `enable: true`
    /// default applies only inside a present section).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverSpec>,

    /// GPU metrics for Prometheus.
    #[serde(skip_serializing_if = "is_default")]
    pub metrics_exporter: MetricsExporterSpec,

    /// GPU partitioning and other device configuration.
    #[serde(skip_serializing_if = "is_default")]
    pub config_manager: ConfigManagerSpec,

    /// The kubelet device plugin (`amd.com/gpu` resources) and the node labeller.
    /// Absent, neither runs (as in the reference, whose `enableDevicePlugin` and
    /// `enableNodeLabeller` defaults apply only inside a present section).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin: Option<DevicePluginSpec>,

    /// The Dynamic Resource Allocation driver, an alternative to the device plugin.
    #[serde(skip_serializing_if = "is_default")]
    pub dra_driver: DraDriverSpec,

    /// GPU tests run on the nodes.
    #[serde(skip_serializing_if = "is_default")]
    pub test_runner: TestRunnerSpec,

    /// Settings shared by all operands.
    #[serde(skip_serializing_if = "is_default")]
    pub common_config: CommonConfigSpec,

    /// Node labels that select the nodes this DeviceConfig manages. Every pair must
    /// match; an empty selector selects every node.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,

    /// Automatic remediation of nodes whose GPUs report problems.
    #[serde(skip_serializing_if = "is_default")]
    pub remediation_workflow: RemediationWorkflowSpec,
}

/// The kubelet device plugin and the node labeller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DevicePluginSpec {
    /// Advertise GPUs to the kubelet as extended resources. Must be false when the
    /// DRA driver is enabled.
    pub enable_device_plugin: bool,

    /// Device plugin image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub device_plugin_image: Option<String>,

    /// Device plugin image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_plugin_image_pull_policy: Option<PullPolicy>,

    /// Device plugin tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_plugin_tolerations: Vec<Toleration>,

    /// Device plugin flags. Known keys: resource_naming_strategy (single or mixed)
    /// and driver_type.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub device_plugin_arguments: BTreeMap<String, String>,

    /// Node labeller image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub node_labeller_image: Option<String>,

    /// Node labeller image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_labeller_image_pull_policy: Option<PullPolicy>,

    /// Node labeller tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_labeller_tolerations: Vec<Toleration>,

    /// Extra node label generators on top of the defaults (vram, cu-count,
    /// simd-count, device-id, family, product-name, driver-version), e.g.
    /// compute-memory-partition. A leading "-" is accepted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_labeller_arguments: Vec<String>,

    /// Pull secret for the device plugin and node labeller images. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,

    /// Label nodes with GPU properties.
    pub enable_node_labeller: bool,

    /// Update policy of the device plugin DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,

    /// Host directory of the kubelet's device plugin sockets.
    #[schemars(regex(pattern = ABSOLUTE_PATH_PATTERN))]
    pub kubelet_socket_path: String,

    /// Run the device plugin in the host network namespace. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

impl Default for DevicePluginSpec {
    fn default() -> Self {
        Self {
            enable_device_plugin: true,
            device_plugin_image: None,
            device_plugin_image_pull_policy: None,
            device_plugin_tolerations: Vec::new(),
            device_plugin_arguments: BTreeMap::new(),
            node_labeller_image: None,
            node_labeller_image_pull_policy: None,
            node_labeller_tolerations: Vec::new(),
            node_labeller_arguments: Vec::new(),
            image_registry_secret: None,
            enable_node_labeller: true,
            upgrade_policy: None,
            kubelet_socket_path: DEFAULT_KUBELET_SOCKET_PATH.into(),
            host_network: None,
        }
    }
}

/// The Dynamic Resource Allocation driver.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DraDriverSpec {
    /// Publish GPUs through DRA ResourceSlices. Cannot be enabled together with the
    /// device plugin.
    pub enable: bool,
    /// DRA driver image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// DRA driver image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// DRA driver tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Pull secret for the DRA driver image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
    /// Update policy of the DRA driver DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,
    /// Flags for the DRA kubelet plugin, without the leading "--".
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cmd_line_arguments: BTreeMap<String, String>,
    /// Node selector for the DRA driver; empty reuses spec.selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Allocate GPU partitions on demand: each partitionable GPU offers every
    /// layout it runs (gpu-<index>-<compute>-<memory>, as AMD's AutoPartition
    /// names them), and the GPU is repartitioned when a claim for another
    /// layout is prepared. Off by default. Not on a node that carries the
    /// dcm.amd.com/gpu-config-profile label.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auto_partition: bool,
}

/// Where test runner logs go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct LogsLocationConfig {
    /// Log directory inside the test runner container. Ignored in this design.
    pub mount_path: String,
    /// Host directory for test logs and the test status database.
    pub host_path: String,
    /// Secrets with cloud storage credentials for exporting logs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs_export_secrets: Vec<LocalObjectRef>,
}

impl Default for LogsLocationConfig {
    fn default() -> Self {
        Self {
            mount_path: DEFAULT_TEST_RUNNER_LOGS.into(),
            host_path: DEFAULT_TEST_RUNNER_LOGS.into(),
            logs_export_secrets: Vec::new(),
        }
    }
}

/// GPU tests run on the nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct TestRunnerSpec {
    /// Run GPU tests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Test runner image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Test runner image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Test runner tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Pull secret for the test runner image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
    /// ConfigMap with the test configuration; a default applies when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<LocalObjectRef>,
    /// Node selector for tests; empty reuses spec.selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Update policy of the test runner DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,
    /// Where test logs go.
    #[serde(skip_serializing_if = "is_default")]
    pub logs_location: LogsLocationConfig,
}

/// GPU partitioning and other device configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ConfigManagerSpec {
    /// Apply device configuration (partition profiles) to the nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Config manager image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Config manager image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Pull secret for the config manager image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
    /// ConfigMap with the device configuration; a default applies when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<LocalObjectRef>,
    /// Node selector for device configuration; empty reuses spec.selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Update policy of the config manager DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,
    /// Config manager tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config_manager_tolerations: Vec<Toleration>,
}

/// The utilities container (reboots, blacklisting). Ignored in this design.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct UtilsContainerSpec {
    /// Utilities image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Utilities image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Pull secret for the utilities image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
}

/// Settings shared by all operands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct CommonConfigSpec {
    /// Init container image of operand pods. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_container_image: Option<String>,
    /// Pull secrets for all operand images. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image_registry_secrets: Vec<LocalObjectRef>,
    /// The utilities container. Ignored in this design.
    #[serde(skip_serializing_if = "is_default")]
    pub utils_container: UtilsContainerSpec,
}

/// Automatic remediation of nodes whose GPUs report problems.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RemediationWorkflowSpec {
    /// Remediate nodes automatically.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// ConfigMap mapping node conditions to workflows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<LocalObjectRef>,
    /// How long a failed workflow is kept, as a duration ("24h", "1h30m").
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub ttl_for_failed_workflows: String,
    /// Image that verifies a remediation. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub tester_image: Option<String>,
    /// Remediations run at once; 0 means no limit.
    #[schemars(range(min = 0))]
    pub max_parallel_workflows: i32,
    /// Taints put on a node under remediation (default: amd-gpu-unhealthy:NoSchedule).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_remediation_taints: Vec<Taint>,
    /// Labels put on a node under remediation.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_remediation_labels: BTreeMap<String, String>,
    /// How a node is drained during remediation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_drain_policy: Option<DrainSpec>,
    /// Start a remediation as soon as its condition matches; false waits for a
    /// person to start it.
    pub auto_start_workflow: bool,
    /// Image that carries the condition-to-workflow mappings.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub config_map_image: Option<String>,
    /// How long to wait for a node to come back from a reboot, as a duration
    /// in seconds, minutes or hours ("30s", "15m", "1h30m").
    #[schemars(regex(pattern = REBOOT_TIMEOUT_PATTERN))]
    pub reboot_timeout: String,
}

impl Default for RemediationWorkflowSpec {
    fn default() -> Self {
        Self {
            enable: None,
            config: None,
            ttl_for_failed_workflows: "24h".into(),
            tester_image: None,
            max_parallel_workflows: 0,
            node_remediation_taints: Vec::new(),
            node_remediation_labels: BTreeMap::new(),
            node_drain_policy: None,
            auto_start_workflow: true,
            config_map_image: None,
            reboot_timeout: "15m".into(),
        }
    }
}
