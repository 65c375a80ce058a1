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

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::enums::{
    DriverType, PullPolicy, ServiceType, TlsVersion, UpgradeState, UpgradeStrategy,
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

/// Registry TLS settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RegistryTls {
    /// If true, check whether the image exists using plain HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure: Option<bool>,
    /// If true, skip TLS server certificate verification.
    #[serde(
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "Option::is_none"
    )]
    pub insecure_skip_tls_verify: Option<bool>,
}

/// PCI devices to bind to vfio-pci.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct VfioConfigSpec {
    /// PCI device IDs to bind to vfio-pci. Defaults to the AMD GPU PF or VF IDs that
    /// match the driver type.
    #[serde(rename = "deviceIDs", skip_serializing_if = "Vec::is_empty")]
    pub device_ids: Vec<String>,
}

/// Arguments for loading and unloading the kernel module.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct KernelModuleConfigSpec {
    /// Arguments to `modprobe` when loading: `modprobe ${loadArgs} amdgpu ${parameters}`.
    /// Only options that change what modprobe reports: `-v`/`--verbose`,
    /// `-q`/`--quiet`, `-s`/`--syslog` (abbreviations as modprobe reads them).
    /// The module directory, configuration and forcing are the agent's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::modprobe::LOAD_ARG_PATTERN)))]
    pub load_args: Vec<String>,
    /// Arguments to `modprobe -r` when unloading: those of `loadArgs`, and
    /// `--wait=MSEC`. Unloading is never forced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::modprobe::UNLOAD_ARG_PATTERN)))]
    pub unload_args: Vec<String>,
    /// Module parameters passed when loading, each `name` or `name=value`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::modprobe::PARAMETER_PATTERN)))]
    pub parameters: Vec<String>,
}

/// Secrets for signing kernel modules on secure-boot systems.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageSignSpec {
    /// Secret holding the private signing key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<LocalObjectRef>,
    /// Secret holding the public certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_secret: Option<LocalObjectRef>,
}

/// How a driver image is built on the fly. Ignored in this design: no driver image
/// is built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageBuildSpec {
    /// Registry for the base image of driver image builds.
    pub base_image_registry: String,
    /// Image repository of the driver source (OpenShift).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_image_repo: Option<String>,
    /// Package repository URL used while building.
    #[serde(rename = "packageRepoURL", skip_serializing_if = "Option::is_none")]
    pub package_repo_url: Option<String>,
    /// URL of the package repository's GPG key.
    #[serde(rename = "gpgKeyURL", skip_serializing_if = "Option::is_none")]
    pub gpg_key_url: Option<String>,
    /// TLS settings for the base image registry.
    #[serde(rename = "baseImageRegistryTLS", skip_serializing_if = "is_default")]
    pub base_image_registry_tls: RegistryTls,
}

impl Default for ImageBuildSpec {
    fn default() -> Self {
        Self {
            base_image_registry: "docker.io".into(),
            source_image_repo: None,
            package_repo_url: None,
            gpg_key_url: None,
            base_image_registry_tls: RegistryTls::default(),
        }
    }
}

/// The GPU kernel driver.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DriverSpec {
    /// Install and manage the driver. False leaves the driver already on the node
    /// (e.g. the inbox amdgpu module) alone.
    pub enable: bool,

    /// Kind of driver: container (amdgpu), vf-passthrough or pf-passthrough.
    pub driver_type: DriverType,

    /// vfio-pci binding for the passthrough driver types.
    #[serde(skip_serializing_if = "is_default")]
    pub vfio_config: VfioConfigSpec,

    /// modprobe arguments and module parameters.
    #[serde(skip_serializing_if = "is_default")]
    pub kernel_module_config: KernelModuleConfigSpec,

    /// Blacklist the inbox amdgpu module (takes effect after a reboot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blacklist: Option<bool>,

    /// Build the driver image from a source image (OpenShift). Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_source_image: Option<bool>,

    /// Repository for the amdgpu installer packages.
    #[serde(
        rename = "amdgpuInstallerRepoURL",
        skip_serializing_if = "Option::is_none"
    )]
    pub amdgpu_installer_repo_url: Option<String>,

    /// Driver version to install (e.g. "6.4.1" or "30.10").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// Driver image repository without tag. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DRIVER_IMAGE_PATTERN))]
    pub image: Option<String>,

    /// Driver image registry TLS settings. Ignored in this design.
    #[serde(rename = "imageRegistryTLS", skip_serializing_if = "is_default")]
    pub image_registry_tls: RegistryTls,

    /// Pull/push secret for the driver image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,

    /// Kernel module signing for secure boot.
    #[serde(skip_serializing_if = "is_default")]
    pub image_sign: ImageSignSpec,

    /// Driver image build settings. Ignored in this design.
    #[serde(skip_serializing_if = "is_default")]
    pub image_build: ImageBuildSpec,

    /// Tolerations for the driver's operand pods. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// How driver upgrades roll across nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DriverUpgradePolicySpec>,
}

impl Default for DriverSpec {
    fn default() -> Self {
        Self {
            enable: true,
            driver_type: DriverType::default(),
            vfio_config: VfioConfigSpec::default(),
            kernel_module_config: KernelModuleConfigSpec::default(),
            blacklist: None,
            use_source_image: None,
            amdgpu_installer_repo_url: None,
            version: None,
            image: None,
            image_registry_tls: RegistryTls::default(),
            image_registry_secret: None,
            image_sign: ImageSignSpec::default(),
            image_build: ImageBuildSpec::default(),
            tolerations: Vec::new(),
            upgrade_policy: None,
        }
    }
}

/// How driver upgrades roll across nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DriverUpgradePolicySpec {
    /// Upgrade nodes automatically when the driver version changes. When unset or
    /// false, nodes are upgraded by hand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,

    /// How many nodes are upgraded at once; 0 means no limit.
    #[schemars(range(min = 0))]
    pub max_parallel_upgrades: i64,

    /// How many nodes may be in a failed upgrade state before upgrades stop: an
    /// integer, or a percentage of the selected nodes (rounded up).
    pub max_unavailable_nodes: IntOrString,

    /// Drain nodes before upgrading; takes precedence over podDeletionPolicy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_drain_policy: Option<DrainSpec>,

    /// Delete GPU pods before upgrading (when no drain policy applies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_deletion_policy: Option<PodDeletionSpec>,

    /// Reboot the node between driver versions.
    pub reboot_required: bool,
}

impl Default for DriverUpgradePolicySpec {
    fn default() -> Self {
        Self {
            enable: None,
            max_parallel_upgrades: 1,
            max_unavailable_nodes: IntOrString::String("25%".into()),
            node_drain_policy: None,
            pod_deletion_policy: None,
            reboot_required: true,
        }
    }
}

/// How a node is drained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DrainSpec {
    /// Force the drain (delete pods not managed by a controller).
    pub force: bool,
    /// Seconds to wait before giving up on the drain; 0 waits forever.
    #[schemars(range(min = 0))]
    pub timeout_seconds: i64,
    /// Grace period for pod termination; a negative value (the default -1)
    /// uses each pod's own.
    pub grace_period_seconds: i64,
    /// Leave DaemonSet-managed pods in place.
    pub ignore_daemon_sets: bool,
    /// Namespaces whose pods are not drained.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignore_namespaces: Vec<String>,
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            force: false,
            timeout_seconds: 300,
            grace_period_seconds: -1,
            ignore_daemon_sets: true,
            ignore_namespaces: Vec::new(),
        }
    }
}

/// How GPU pods are deleted from a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PodDeletionSpec {
    /// Force the deletion.
    pub force: bool,
    /// Seconds to wait before giving up; 0 waits forever.
    #[schemars(range(min = 0))]
    pub timeout_seconds: i64,
    /// Grace period for pod termination; a negative value (the default -1)
    /// uses each pod's own.
    pub grace_period_seconds: i64,
}

impl Default for PodDeletionSpec {
    fn default() -> Self {
        Self {
            force: false,
            timeout_seconds: 300,
            grace_period_seconds: -1,
        }
    }
}

/// A DaemonSet update policy. Ignored in this design: there are no operand DaemonSets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct DaemonSetUpgradeSpec {
    /// RollingUpdate or OnDelete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<UpgradeStrategy>,
    /// Pods that may be unavailable during a rolling update.
    pub max_unavailable: i32,
}

impl Default for DaemonSetUpgradeSpec {
    fn default() -> Self {
        Self {
            upgrade_strategy: None,
            max_unavailable: 1,
        }
    }
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
}

/// Prometheus integration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PrometheusConfig {
    /// Create a ServiceMonitor for the metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorConfig>,
}

/// Attach node metadata to discovered targets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct AttachMetadata {
    /// Attach node metadata (needs list/watch on Nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<bool>,
}

// `key` is required, as in the reference (and in Kubernetes' own selector
// types): it has no default, so a selector without one does not parse.
/// A key of a Secret in the DeviceConfig's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct SecretKeySelector {
    /// The key of the Secret.
    pub key: String,
    /// Name of the Secret.
    #[serde(default)]
    pub name: String,
    /// Whether the Secret or its key may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A key of a ConfigMap in the DeviceConfig's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ConfigMapKeySelector {
    /// The key of the ConfigMap.
    pub key: String,
    /// Name of the ConfigMap.
    #[serde(default)]
    pub name: String,
    /// Whether the ConfigMap or its key may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Data from a Secret or a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretOrConfigMap {
    /// ConfigMap holding the data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeySelector>,
    /// Secret holding the data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretKeySelector>,
}

/// Prometheus authorization for scraping the endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SafeAuthorization {
    /// Authentication type (default "Bearer"; "Basic" is not supported).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Secret key holding the credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretKeySelector>,
}

/// TLS settings Prometheus uses to scrape the endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsConfig {
    /// Certificate authority for verifying the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretOrConfigMap>,
    /// Path to the CA certificate in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate for client authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<SecretOrConfigMap>,
    /// Path to the client certificate in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Disable target certificate verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// Path to the client key in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// Secret holding the client key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<SecretKeySelector>,
    /// Highest TLS version accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_version: Option<TlsVersion>,
    /// Lowest TLS version accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
    /// Server name used to verify the target's certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// A Prometheus relabeling rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RelabelConfig {
    /// Action to perform on a regex match.
    #[schemars(extend("enum" = super::enums::RELABEL_ACTIONS))]
    pub action: String,
    /// Modulus of the hash of the source label values (HashMod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modulus: Option<i64>,
    /// Regular expression matched against the extracted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Replacement value; regex capture groups are available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Separator between concatenated source label values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// Labels whose values are concatenated and matched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = PROMETHEUS_LABEL_PATTERN)))]
    pub source_labels: Vec<String>,
    /// Label the result is written to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
}

impl Default for RelabelConfig {
    fn default() -> Self {
        Self {
            action: "replace".into(),
            modulus: None,
            regex: None,
            replacement: None,
            separator: None,
            source_labels: Vec::new(),
            target_label: None,
        }
    }
}

/// ServiceMonitor settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceMonitorConfig {
    /// Create the ServiceMonitor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Scrape interval: a number and one unit of ms, s, m or h (e.g. "30s").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = INTERVAL_PATTERN))]
    pub interval: Option<String>,
    /// Attach node metadata to targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_metadata: Option<AttachMetadata>,
    /// Keep the metric's labels when they collide with target labels.
    pub honor_labels: bool,
    /// Honor timestamps exposed by the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub honor_timestamps: Option<bool>,
    /// Labels of the ServiceMonitor object.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Relabelings applied to targets before scraping.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<RelabelConfig>,
    /// Relabelings applied to scraped samples.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metric_relabelings: Vec<RelabelConfig>,
    /// Authorization for scraping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization: Option<SafeAuthorization>,
    /// Bearer token file (deprecated; use authorization).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    /// TLS settings for scraping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<TlsConfig>,
}

impl Default for ServiceMonitorConfig {
    fn default() -> Self {
        Self {
            enable: None,
            interval: None,
            attach_metadata: None,
            honor_labels: true,
            honor_timestamps: None,
            labels: BTreeMap::new(),
            relabelings: Vec::new(),
            metric_relabelings: Vec::new(),
            authorization: None,
            bearer_token_file: None,
            tls_config: None,
        }
    }
}

/// Static authorization by client certificate common name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct StaticAuthConfig {
    /// Authorize clients by certificate CN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// The expected client certificate CN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
}

/// Access control on the metrics endpoint (kube-rbac-proxy in the reference).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeRbacConfig {
    /// Protect the metrics endpoint with authentication and authorization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// kube-rbac-proxy image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Serve plain HTTP instead of HTTPS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_https: Option<bool>,
    /// TLS certificate Secret; a self-signed certificate is generated when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<LocalObjectRef>,
    /// ConfigMap with the client CA (key ca.crt) for mutual TLS.
    #[serde(rename = "clientCAConfigMap", skip_serializing_if = "Option::is_none")]
    pub client_ca_config_map: Option<LocalObjectRef>,
    /// Authorize by client certificate CN instead of SubjectAccessReviews.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_authorization: Option<StaticAuthConfig>,
}

/// Which metrics are collected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct MetricsConfig {
    /// Name of the ConfigMap that lists the metrics to export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// GPU metrics for Prometheus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct MetricsExporterSpec {
    /// Serve GPU metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Metrics exporter image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Prometheus integration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusConfig>,
    /// Pull secret for the exporter image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
    /// Exporter image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Exporter tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Port the metrics endpoint listens on.
    pub port: i32,
    /// Service type: ClusterIP or NodePort.
    pub service_type: ServiceType,
    /// Node port (30000-32767) when serviceType is NodePort; assigned when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30000, max = 32767))]
    pub node_port: Option<i32>,
    /// Metrics selection.
    #[serde(skip_serializing_if = "is_default")]
    pub config: MetricsConfig,
    /// Access control on the metrics endpoint.
    #[serde(skip_serializing_if = "is_default")]
    pub rbac_config: KubeRbacConfig,
    /// Node selector for metrics; empty reuses spec.selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Update policy of the exporter DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,
    /// Host directory of the kubelet pod-resources socket.
    #[serde(rename = "podResourceAPISocketPath")]
    #[schemars(regex(pattern = ABSOLUTE_PATH_PATTERN))]
    pub pod_resource_api_socket_path: String,
    /// Exporter pod resources. Ignored in this design.
    pub resource: ResourceRequirements,
    /// Exporter pod annotations. Ignored in this design.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Annotations of the metrics Service.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_annotations: BTreeMap<String, String>,
    /// Run the exporter in the host network namespace. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

/// The reference's default exporter pod resources.
pub fn default_exporter_resources() -> ResourceRequirements {
    let pair = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])
    };
    ResourceRequirements {
        claims: None,
        limits: Some(pair("2", "4G")),
        requests: Some(pair("500m", "512M")),
    }
}

impl Default for MetricsExporterSpec {
    fn default() -> Self {
        Self {
            enable: None,
            image: None,
            prometheus: None,
            image_registry_secret: None,
            image_pull_policy: None,
            tolerations: Vec::new(),
            port: 5000,
            service_type: ServiceType::default(),
            node_port: None,
            config: MetricsConfig::default(),
            rbac_config: KubeRbacConfig::default(),
            selector: BTreeMap::new(),
            upgrade_policy: None,
            pod_resource_api_socket_path: DEFAULT_POD_RESOURCES_PATH.into(),
            resource: default_exporter_resources(),
            pod_annotations: BTreeMap::new(),
            service_annotations: BTreeMap::new(),
            host_network: None,
        }
    }
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
