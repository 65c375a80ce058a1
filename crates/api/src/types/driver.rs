//! The DeviceConfig's `driver` section, wire format only: the kernel module,
//! its image and signing, its upgrade and drain policies. It must not
//! interpret fields (`semantics`) nor judge them (`validate`).

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::super::enums::{DriverType, UpgradeStrategy};
use super::{DRIVER_IMAGE_PATTERN, LocalObjectRef, is_default};

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct KernelModuleConfigSpec {
    /// Arguments to `modprobe` when loading: `modprobe ${loadArgs} amdgpu ${parameters}`.
    /// Only options that change what modprobe reports: `-v`/`--verbose`,
    /// `-q`/`--quiet`, `-s`/`--syslog` (abbreviations as modprobe reads them).
    /// The module directory, configuration and forcing are the agent's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::super::modprobe::LOAD_ARG_PATTERN)))]
    pub load_args: Vec<String>,
    /// Arguments to `modprobe -r` when unloading: those of `loadArgs`, and
    /// `--wait=MSEC`. Unloading is never forced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::super::modprobe::UNLOAD_ARG_PATTERN)))]
    pub unload_args: Vec<String>,
    /// Module parameters passed when loading, each `name` or `name=value`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = super::super::modprobe::PARAMETER_PATTERN)))]
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
