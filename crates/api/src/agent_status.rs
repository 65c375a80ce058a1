//! The node↔leader contract: the agent's per-node status, published as one
//! annotation on its Node and read by the leader into DeviceConfig status.
//!
//! Both sides use these types and the [`ServiceName`] enum, so the names the
//! agent writes and the names the leader counts cannot drift apart. This module
//! is plain data: it must not depend on the agent or the cluster role.
//!
//! Annotation [`STATUS_ANNOTATION`] holds compact JSON:
//!
//! ```json
//! {"v":1,"deviceConfig":"kube-amd-gpu/default","uid":"…","generation":3,
//!  "services":{"devicePlugin":{"state":"Running"},
//!              "metricsExporter":{"state":"Unavailable","reason":"no sample yet"}},
//!  "resources":{"amd.com/gpu":8},"gpus":8,"driverVersion":"6.12.12",
//!  "driver":{"loaded":true,"version":"6.12.12","origin":"OutOfTree",
//!            "kernelRelease":"6.8.0-57-generic","bootId":"…","secureBoot":"Disabled"},
//!  "problems":[],"since":"2026-11-30T07:00:00Z"}
//! ```
//!
//! - `deviceConfig` (a [`ConfigKey`], written `namespace/name`), `uid`,
//!   `generation`: the DeviceConfig the agent follows and the generation whose
//!   services it has applied; absent when none selects the node.
//!   The leader sets `observedGeneration` from these.
//! - `services`: state of each enabled service, by [`ServiceName`]. `Running`
//!   means available: doing its job for users (the kubelet accepted the device
//!   plugin, metrics are served, labels are written, tests can start).
//!   `Unavailable` with a `reason`: the service runs but does not serve yet.
//!   `Restarting` with `error` and `restarts`: it failed and waits to be
//!   restarted. `Finished`: it ended on its own. A disabled service is absent.
//! - `resources`: device plugin resources and their device counts.
//! - `layouts`: with DRA, the partition layouts of the node's GPUs
//!   (`["cpx_nps4"]`), and with `draDriver.autoPartition` every layout
//!   they offer, for the leader's per-layout DeviceClasses.
//! - `driver`: the amdgpu module and kernel the node runs ([`DriverReport`]),
//!   reported whatever `spec.driver` says.
//! - `problems`: what needs a person (conflicting DeviceConfigs, a partition layout
//!   the naming strategy cannot serve).
//! - `since`: when this content was first published. It is not a heartbeat: the
//!   annotation is written only when something other than `since` changes.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use kube::ResourceExt;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::DeviceConfig;

pub const STATUS_ANNOTATION: &str = "amd.com/gpu-agent-status";
pub const STATUS_VERSION: u32 = 1;
/// The Node condition the agent's health monitor sets while a GPU is
/// unhealthy (`True`), and that remediation maps by default.
pub const HEALTH_CONDITION: &str = "AMDGPUUnhealthy";

/// Which DeviceConfig: its namespace and name, typed, so that neither side
/// splits a `"namespace/name"` string back apart. Written `namespace/name` in
/// the annotation's `deviceConfig`, in logs and in messages, and ordered as
/// that text is, so sorted lists read as they always did.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConfigKey {
    pub namespace: String,
    pub name: String,
}

impl ConfigKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a DeviceConfig (an empty namespace if it has none).
    pub fn of(config: &DeviceConfig) -> Self {
        Self::new(config.namespace().unwrap_or_default(), config.name_any())
    }

    /// Reads the written form. Any text is accepted, as the annotation always
    /// accepted any string here: text without a `/` is a name in no namespace,
    /// which no DeviceConfig the leader sees has, so it matches none.
    pub fn parse(text: &str) -> Self {
        match text.split_once('/') {
            Some((namespace, name)) => Self::new(namespace, name),
            None => Self::new("", text),
        }
    }

    /// The bytes of the written form, without allocating it.
    fn written(&self) -> impl Iterator<Item = u8> + '_ {
        self.namespace
            .bytes()
            .chain(std::iter::once(b'/'))
            .chain(self.name.bytes())
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Ord for ConfigKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.written().cmp(other.written())
    }
}

impl PartialOrd for ConfigKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl From<&str> for ConfigKey {
    /// The written form, read as [`ConfigKey::parse`] does.
    fn from(text: &str) -> Self {
        Self::parse(text)
    }
}

impl PartialEq<str> for ConfigKey {
    fn eq(&self, text: &str) -> bool {
        self.written().eq(text.bytes())
    }
}

impl PartialEq<&str> for ConfigKey {
    fn eq(&self, text: &&str) -> bool {
        *self == **text
    }
}

impl Serialize for ConfigKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ConfigKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::parse(&text))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_config: Option<ConfigKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default)]
    pub services: BTreeMap<ServiceName, ServiceStatus>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, usize>,
    /// While the node runs DRA: the partition layouts of its GPUs
    /// (`cpx_nps4`...), and with `draDriver.autoPartition` every layout its
    /// partitionable GPUs offer (Prepare puts a GPU in it), as the device
    /// plugin's `mixed` strategy names its resources; the leader keeps a
    /// DeviceClass for each layout present on some node. Empty (and absent)
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layouts: Vec<String>,
    pub gpus: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The driver and kernel the node runs; absent until first read (and
    /// from agents older than this field). Without `refcnt`, which moves
    /// with every process that opens a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverReport>,
    /// What the agent did about the driver the DeviceConfig asks for
    /// (`spec.driver.enable`); absent when it asks for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_load: Option<DriverLoad>,
    /// Where the node's partition change stands, while the Node asks for a
    /// profile (`dcm.amd.com/gpu-config-profile`) and configManager is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionReport>,
    /// The answer to the leader's last remediation validation request of
    /// this node (the record's `test` id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<RemediationTestReport>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    #[serde(default)]
    pub since: String,
}

/// The agent's view of its node's partition change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionReport {
    pub profile: String,
    /// The state label's value: pending, draining, applying, success, failed.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The agent's answer to its remediation record's latest request: how the
/// validation tests, or a GPU reset and that GPU's tests, ended; or which one
/// GPU is at fault and the pods that hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemediationTestReport {
    /// The request's id, from the leader's remediation record.
    pub id: String,
    /// The tests passed (or the reset and its tests); for an isolation, one
    /// GPU is at fault.
    pub passed: bool,
    /// What ran and how it ended, for the Event.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// An isolation's faulty GPU (PCI address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// An isolation's pods holding that GPU, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// The tests did not run because their tool cannot be started here (or
    /// a COMMAND program is not allowed): why, naming the tool and the
    /// agent's flag. Not a verdict on the GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<String>,
}

/// The node services, by the name the annotation gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ServiceName {
    DevicePlugin,
    /// The DRA kubelet plugin (`draDriver`), which a node runs instead of the
    /// device plugin.
    DraDriver,
    Labeller,
    HealthMonitor,
    MetricsExporter,
    TestRunner,
    /// The reference exporter's health socket, for AMD's device plugin
    /// (`src/metricssvc/`).
    HealthSocket,
    /// A name this build does not know: written by a newer agent during a
    /// rolling upgrade. Read, never written, and counted as nothing.
    #[serde(other)]
    Unknown,
}

impl ServiceName {
    pub const ALL: [ServiceName; 7] = [
        Self::DevicePlugin,
        Self::DraDriver,
        Self::Labeller,
        Self::HealthMonitor,
        Self::MetricsExporter,
        Self::TestRunner,
        Self::HealthSocket,
    ];

    /// The annotation's (and the logs') name: `devicePlugin`, `metricsExporter`...
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DevicePlugin => "devicePlugin",
            Self::DraDriver => "draDriver",
            Self::Labeller => "labeller",
            Self::HealthMonitor => "healthMonitor",
            Self::MetricsExporter => "metricsExporter",
            Self::TestRunner => "testRunner",
            Self::HealthSocket => "healthSocket",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ServiceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A service's state as it appears in the annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum ServiceStatus {
    /// Running and available: doing its job for users.
    Running,
    /// Running, but not doing its job yet, and why.
    Unavailable {
        reason: String,
    },
    Restarting {
        error: String,
        restarts: u64,
    },
    Finished,
}

impl ServiceStatus {
    pub fn is_available(&self) -> bool {
        matches!(self, Self::Running)
    }

    /// Why the service is not available; `None` when it is.
    pub fn unavailable_reason(&self) -> Option<String> {
        match self {
            Self::Running => None,
            Self::Unavailable { reason } => Some(reason.clone()),
            Self::Restarting { error, restarts } => {
                Some(format!("restarting after {restarts} failure(s): {error}"))
            }
            Self::Finished => Some("stopped on its own".to_owned()),
        }
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

/// Where the loaded amdgpu module comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModuleOrigin {
    /// `/sys/module/amdgpu` is absent.
    #[default]
    NotLoaded,
    /// Compiled into the kernel (no `taint` file).
    BuiltIn,
    /// The distribution's loadable module, built in the kernel tree.
    InTree,
    /// An external build (DKMS, a precompiled driver image): taint flag `O`.
    OutOfTree,
    /// Loaded, but its taint flags could not be read.
    Unknown,
}

impl ModuleOrigin {
    /// The in-box driver: the one that came with the kernel.
    pub fn is_inbox(self) -> bool {
        matches!(self, ModuleOrigin::BuiltIn | ModuleOrigin::InTree)
    }
}

/// Whether UEFI Secure Boot is on, so that only signed modules load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SecureBoot {
    Enabled,
    Disabled,
    /// The host did not boot through UEFI: no Secure Boot.
    NotUefi,
    /// UEFI, but the variable could not be read (efivarfs not mounted, say).
    #[default]
    Unknown,
}

impl SecureBoot {
    /// Whether a module must carry a signature to load. Unknown counts as on:
    /// checking a signature that was not needed refuses nothing a signed
    /// bundle has.
    pub fn requires_signature(self) -> bool {
        matches!(self, SecureBoot::Enabled | SecureBoot::Unknown)
    }
}

/// The driver and kernel a node runs ([`AgentStatus::driver`]; read by the
/// agent's driver module). Plain data, the same whatever the DeviceConfig says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverReport {
    /// `/sys/module/amdgpu` exists.
    pub loaded: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srcversion: Option<String>,
    pub origin: ModuleOrigin,
    /// The module's taint flags as the kernel lists them (`O`, `OE`, empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint: Option<String>,
    /// Users of the module (`refcnt`); none for a built-in driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refcnt: Option<u32>,
    /// The running kernel (`uname -r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    pub secure_boot: SecureBoot,
    /// Files that exist but could not be read, each naming the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Where the agent's own driver loading stands ([`AgentStatus::driver_load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DriverLoadState {
    /// The driver asked for runs.
    Loaded,
    /// A verified bundle is being loaded.
    Loading,
    /// Nothing was loaded: no usable bundle, or a setting that cannot be
    /// used. The reason says which.
    Refused,
    /// Another amdgpu runs, and replacing it needs what the agent does not
    /// do yet (unloading, blacklisting, a reboot).
    ReplaceNeeded,
    /// Loading was tried and did not take.
    Failed,
    /// The node was asked to reboot into the driver (its driver upgrade
    /// asks for a reboot); done when the boot id changes.
    Rebooting,
}

/// The outcome of the agent's last look at the driver, with a reason a
/// runbook can match (`BundleMissingForKernel`, `ChecksumMismatch`,
/// `UnsignedModule`, `ModprobeFailed`, …) and a message for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverLoad {
    pub state: DriverLoadState,
    pub reason: String,
    pub message: String,
    /// The bundle directory (a host path) loaded or being loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// The driver version loaded, being loaded, or running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The version the agent was asked for when it decided this (the
    /// upgrade's target, or `driver.version`); `None`: any. The leader
    /// takes a refusal as its target's only when this says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
    /// When the target came from the node's upgrade record: the record's
    /// `since` it answers, so that the leader takes it for the current step
    /// only, not an earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told_at: Option<String>,
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
            services: [(ServiceName::DevicePlugin, ServiceStatus::Running)].into(),
            resources: [("amd.com/gpu".to_string(), 8)].into(),
            layouts: vec![],
            gpus: 8,
            driver_version: Some("6.12.12".into()),
            driver: None,
            driver_load: None,
            partition: None,
            remediation: None,
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
    fn the_config_key_keeps_its_wire_form() {
        // Byte for byte what the annotation held when the key was a string.
        let json = sample().to_json();
        assert!(
            json.starts_with(r#"{"v":1,"deviceConfig":"ns/dc","uid":"u","generation":2,"#),
            "{json}"
        );
        let key = ConfigKey::new("kube-amd-gpu", "default");
        assert_eq!(
            serde_json::to_string(&key).unwrap(),
            r#""kube-amd-gpu/default""#
        );
        assert_eq!(
            serde_json::from_str::<ConfigKey>(r#""kube-amd-gpu/default""#).unwrap(),
            key
        );
        // Any string is still accepted; one without a namespace matches no
        // namespaced DeviceConfig.
        let odd = AgentStatus::parse(r#"{"v":1,"deviceConfig":"dc","gpus":0}"#).unwrap();
        assert_eq!(odd.device_config, Some(ConfigKey::new("", "dc")));
        assert_ne!(odd.device_config, Some(ConfigKey::new("ns", "dc")));
    }

    #[test]
    fn config_keys_sort_as_their_written_form() {
        // '-' sorts before '/': "a-b/y" < "a/x" as text, unlike (namespace, name).
        let mut keys = [ConfigKey::new("a", "x"), ConfigKey::new("a-b", "y")];
        keys.sort();
        let written: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(written, ["a-b/y", "a/x"]);
        assert_eq!(ConfigKey::new("ns", "dc"), "ns/dc");
    }

    #[test]
    fn every_service_name_round_trips_and_unknown_names_count_as_nothing() {
        for name in ServiceName::ALL {
            let json = serde_json::to_string(&name).unwrap();
            assert_eq!(json, format!("\"{}\"", name.as_str()));
            assert_eq!(serde_json::from_str::<ServiceName>(&json).unwrap(), name);
        }
        // The name the leader once looked for instead of `metricsExporter`:
        // a name neither side knows is not mistaken for a known one.
        let old = r#"{"v":1,"services":{"metrics":{"state":"Running"}},"gpus":1}"#;
        let parsed = AgentStatus::parse(old).unwrap();
        assert_eq!(
            parsed.services.keys().collect::<Vec<_>>(),
            [&ServiceName::Unknown]
        );
    }

    #[test]
    fn unavailable_carries_its_reason() {
        let status = ServiceStatus::Unavailable {
            reason: "not registered with the kubelet".into(),
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["state"], "Unavailable");
        assert_eq!(json["reason"], "not registered with the kubelet");
        assert!(!status.is_available());
        assert_eq!(
            status.unavailable_reason().as_deref(),
            Some("not registered with the kubelet")
        );
        assert!(ServiceStatus::Running.unavailable_reason().is_none());
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
                ServiceName::DevicePlugin,
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
