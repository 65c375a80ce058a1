//! What DeviceConfig fields mean to this design: effective values after the
//! reference's fallbacks, node selection, and parsed forms of stringly-typed
//! arguments.
//!
//! The agent and the reconciler read the spec through these helpers rather than
//! re-deriving the reference's rules. Everything here is a pure function of the
//! spec; nothing judges it (that is `validate`, which these helpers mirror: a
//! value `validate` rejects comes back as `None` here).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use super::enums::{DriverType, ServiceType};
use super::syntax::{self, CountOrPercent};
use super::types::{
    ConfigManagerSpec, DeviceConfig, DeviceConfigSpec, DevicePluginSpec, DraDriverSpec, DriverSpec,
    DriverUpgradePolicySpec, MetricsExporterSpec, RemediationWorkflowSpec, TestRunnerSpec,
};

/// `devicePluginArguments` key that selects how GPUs are named as resources.
pub const ARG_RESOURCE_NAMING_STRATEGY: &str = "resource_naming_strategy";
/// `devicePluginArguments` key that tells the device plugin which driver type the node runs.
pub const ARG_DRIVER_TYPE: &str = "driver_type";
/// `devicePluginArguments` keys of GPU sharing (ours; the reference CRD has
/// no sharing field, and puts plugin options here).
pub const ARG_TIME_SLICING_REPLICAS: &str = "time_slicing_replicas";
pub const ARG_TIME_SLICING_RENAME: &str = "time_slicing_rename";
pub const ARG_TIME_SLICING_FAIL_REQUESTS: &str = "time_slicing_fail_requests_greater_than_one";
/// The `devicePluginArguments` keys accepted: the reference device plugin's,
/// then ours.
pub const KNOWN_DEVICE_PLUGIN_ARGUMENTS: &[&str] = &[
    ARG_RESOURCE_NAMING_STRATEGY,
    ARG_DRIVER_TYPE,
    ARG_TIME_SLICING_REPLICAS,
    ARG_TIME_SLICING_RENAME,
    ARG_TIME_SLICING_FAIL_REQUESTS,
];
/// Node label a person sets to give one node its own replica count; it wins
/// over `time_slicing_replicas`.
pub const SHARING_REPLICAS_LABEL: &str = "amd.com/gpu.sharing-replicas";
/// The most replicas a device may be advertised as.
pub const MAX_REPLICAS: u32 = 64;

/// Time-slicing: each GPU (or partition) advertised `replicas` times, so that
/// that many containers can share it. Scheduling-level sharing: the GPU gives
/// no memory isolation between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimeSlicing {
    /// 1 is no sharing.
    pub replicas: u32,
    /// Advertise `amd.com/<name>.shared` instead of `amd.com/<name>`.
    pub rename: bool,
    /// Refuse a container asking for more than one replica.
    pub fail_requests_greater_than_one: bool,
}

impl Default for TimeSlicing {
    fn default() -> Self {
        Self {
            replicas: 1,
            rename: false,
            fail_requests_greater_than_one: false,
        }
    }
}

impl TimeSlicing {
    pub fn is_shared(&self) -> bool {
        self.replicas > 1
    }

    /// A replica count as written (argument or Node label): 1 to
    /// [`MAX_REPLICAS`].
    pub fn parse_replicas(text: &str) -> Result<u32, String> {
        match text.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_REPLICAS).contains(&n) => Ok(n),
            _ => Err(format!(
                "{text:?} is not a replica count: an integer from 1 to {MAX_REPLICAS}"
            )),
        }
    }

    /// With the node's own replica count ([`SHARING_REPLICAS_LABEL`]), when
    /// it has a valid one; an invalid one is returned as a problem and the
    /// DeviceConfig's count stays.
    pub fn for_node(self, labels: &BTreeMap<String, String>) -> (Self, Option<String>) {
        match labels.get(SHARING_REPLICAS_LABEL) {
            None => (self, None),
            Some(text) => match Self::parse_replicas(text) {
                Ok(replicas) => (Self { replicas, ..self }, None),
                Err(why) => (
                    self,
                    Some(format!(
                        "Node label {SHARING_REPLICAS_LABEL}: {why}; using {} from the DeviceConfig",
                        self.replicas
                    )),
                ),
            },
        }
    }
}

fn parse_flag(text: &str) -> Option<bool> {
    match text {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// How GPUs (and their partitions) are advertised to the kubelet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResourceNamingStrategy {
    /// Everything is `amd.com/gpu`.
    #[default]
    Single,
    /// Partitions get their own resource names (e.g. `amd.com/cpx_nps4`).
    Mixed,
}

impl ResourceNamingStrategy {
    /// The spellings accepted in `devicePluginArguments`.
    pub const KNOWN: &'static [&'static str] = &["single", "mixed"];

    /// Parses the argument value.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "single" => Some(Self::Single),
            "mixed" => Some(Self::Mixed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Mixed => "mixed",
        }
    }
}

impl fmt::Display for ResourceNamingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One node label generator of the node labeller (`nodeLabellerArguments`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeLabellerKind {
    Vram,
    CuCount,
    SimdCount,
    DeviceId,
    Family,
    ProductName,
    DriverVersion,
    DriverSrcVersion,
    Firmware,
    ComputeMemoryPartition,
    ComputePartitioningSupported,
    MemoryPartitioningSupported,
}

impl NodeLabellerKind {
    /// Every kind with its flag spelling.
    pub const ALL: &'static [(Self, &'static str)] = &[
        (Self::Vram, "vram"),
        (Self::CuCount, "cu-count"),
        (Self::SimdCount, "simd-count"),
        (Self::DeviceId, "device-id"),
        (Self::Family, "family"),
        (Self::ProductName, "product-name"),
        (Self::DriverVersion, "driver-version"),
        (Self::DriverSrcVersion, "driver-src-version"),
        (Self::Firmware, "firmware"),
        (Self::ComputeMemoryPartition, "compute-memory-partition"),
        (
            Self::ComputePartitioningSupported,
            "compute-partitioning-supported",
        ),
        (
            Self::MemoryPartitioningSupported,
            "memory-partitioning-supported",
        ),
    ];

    /// The kinds the reference node labeller always runs, whatever the arguments say.
    pub const DEFAULTS: &'static [Self] = &[
        Self::Vram,
        Self::CuCount,
        Self::SimdCount,
        Self::DeviceId,
        Self::Family,
        Self::ProductName,
        Self::DriverVersion,
    ];

    /// Parses one `nodeLabellerArguments` entry. The reference spells them as
    /// flags, so one or two leading `-` are accepted (`-vram`, `--vram`, `vram`).
    pub fn parse(text: &str) -> Option<Self> {
        let name = text
            .strip_prefix("--")
            .or_else(|| text.strip_prefix('-'))
            .unwrap_or(text);
        Self::ALL
            .iter()
            .find(|(_, flag)| *flag == name)
            .map(|(kind, _)| *kind)
    }

    /// The flag spelling without dashes.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or("", |(_, flag)| flag)
    }
}

impl fmt::Display for NodeLabellerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The parts of the reference that have their own node selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// Driver install (spec.selector only).
    Driver,
    /// Device plugin (spec.selector only).
    DevicePlugin,
    /// Node labeller, a switch of the devicePlugin section (spec.selector only).
    NodeLabeller,
    /// DRA driver (draDriver.selector, else spec.selector).
    DraDriver,
    /// Metrics (metricsExporter.selector, else spec.selector).
    MetricsExporter,
    /// Tests (testRunner.selector, else spec.selector).
    TestRunner,
    /// Device configuration (configManager.selector, else spec.selector).
    ConfigManager,
}

/// Whether every `selector` pair is among `labels`. An empty selector matches
/// every node, as an empty Kubernetes nodeSelector does.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// Whether `config` selects a node with these labels now: it is not being
/// deleted and its selector matches. The one rule the agent (which config it
/// follows) and the leader (which configs overlap) share.
pub fn selects_node(config: &DeviceConfig, labels: &BTreeMap<String, String>) -> bool {
    config.metadata.deletion_timestamp.is_none() && config.spec.selects(labels)
}

impl DeviceConfigSpec {
    /// Whether a node with these labels is managed by this DeviceConfig
    /// (`spec.selector`; empty selects every node).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        selector_matches(&self.selector, labels)
    }

    /// The node selector that applies to `operand`. An operand's own selector,
    /// when non-empty, replaces `spec.selector` (the reference puts it on the
    /// operand's DaemonSet in place of the global one).
    pub fn selector_for(&self, operand: Operand) -> &BTreeMap<String, String> {
        let own = match operand {
            Operand::Driver | Operand::DevicePlugin | Operand::NodeLabeller => None,
            Operand::DraDriver => Some(&self.dra_driver.selector),
            Operand::MetricsExporter => Some(&self.metrics_exporter.selector),
            Operand::TestRunner => Some(&self.test_runner.selector),
            Operand::ConfigManager => Some(&self.config_manager.selector),
        };
        match own {
            Some(selector) if !selector.is_empty() => selector,
            _ => &self.selector,
        }
    }

    /// Whether `operand` runs on a node with these labels: the operand must be
    /// enabled and its selector must match.
    pub fn runs_on(&self, operand: Operand, labels: &BTreeMap<String, String>) -> bool {
        self.is_enabled(operand) && selector_matches(self.selector_for(operand), labels)
    }

    /// Whether `operand` is enabled, with the reference's defaults for unset
    /// fields. An absent `driver` or `devicePlugin` section enables nothing.
    pub fn is_enabled(&self, operand: Operand) -> bool {
        match operand {
            Operand::Driver => self.driver().enable,
            Operand::DevicePlugin => self.device_plugin().enable_device_plugin,
            Operand::NodeLabeller => self.device_plugin().enable_node_labeller,
            Operand::DraDriver => self.dra_driver.is_enabled(),
            Operand::MetricsExporter => self.metrics_exporter.is_enabled(),
            Operand::TestRunner => self.test_runner.is_enabled(),
            Operand::ConfigManager => self.config_manager.is_enabled(),
        }
    }

    /// The `driver` section as the reference's code reads it: the one written,
    /// or, when it is absent, [`DriverSpec::absent`] (installation off).
    pub fn driver(&self) -> &DriverSpec {
        static ABSENT: LazyLock<DriverSpec> = LazyLock::new(DriverSpec::absent);
        self.driver.as_ref().unwrap_or(&ABSENT)
    }

    /// The `devicePlugin` section as the reference's code reads it: the one
    /// written, or, when it is absent, [`DevicePluginSpec::absent`] (device
    /// plugin and node labeller off).
    pub fn device_plugin(&self) -> &DevicePluginSpec {
        static ABSENT: LazyLock<DevicePluginSpec> = LazyLock::new(DevicePluginSpec::absent);
        self.device_plugin.as_ref().unwrap_or(&ABSENT)
    }

    /// The `devicePlugin` section to edit, created with the reference's
    /// defaults (device plugin and node labeller on) when it is absent.
    pub fn device_plugin_mut(&mut self) -> &mut DevicePluginSpec {
        self.device_plugin
            .get_or_insert_with(DevicePluginSpec::default)
    }

    /// The `driver` section to edit, created with the reference's defaults
    /// (`enable: true`) when it is absent.
    pub fn driver_mut(&mut self) -> &mut DriverSpec {
        self.driver.get_or_insert_with(DriverSpec::default)
    }

    /// What each absent section means, for the sections whose absence differs
    /// from an empty one (`driver`, `devicePlugin`). `validate` prints these
    /// as notes.
    pub fn absent_sections(&self) -> Vec<AbsentSection> {
        let mut absent = Vec::new();
        if self.driver.is_none() {
            absent.push(AbsentSection {
                path: "spec.driver",
                meaning: "no driver is managed and no driver-type label is written \
                          (as in the reference: `enable: true` is a default only inside \
                          a present section)",
            });
        }
        if self.remediation_workflow.is_enabled()
            && self
                .remediation_workflow
                .config
                .as_ref()
                .is_none_or(|c| c.name.is_empty())
        {
            absent.push(AbsentSection {
                path: "spec.remediationWorkflow.config",
                meaning: BUILTIN_MAPPING_NOTE,
            });
        }
        if self.device_plugin.is_none() {
            absent.push(AbsentSection {
                path: "spec.devicePlugin",
                meaning: "no device plugin or node labeller runs, so no amd.com/gpu \
                          resource is offered (as in the reference: `enableDevicePlugin` \
                          and `enableNodeLabeller` default to true only inside a present \
                          section; write `devicePlugin: {}` to run both)",
            });
        }
        absent
    }
}

/// What remediation does without a mapping ConfigMap. The count is the
/// built-in mapping's (`remediation::mapping::Mapping::builtin`, whose test
/// keeps the two the same).
pub const BUILTIN_MAPPING_NOTE: &str = "the built-in mapping (24 conditions) is used: the \
     reference's operator does not remediate without a mapping, this one does \
     (docs/remediation.md); configMapImage, if set, is not acted on";

/// A section left out of a spec, and what that means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbsentSection {
    /// The section's path, e.g. `spec.devicePlugin`.
    pub path: &'static str,
    /// What runs (or not) without it.
    pub meaning: &'static str,
}

impl fmt::Display for AbsentSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} absent: {}", self.path, self.meaning)
    }
}

impl DriverSpec {
    /// What the reference's code sees for an absent `driver` section: the
    /// zero value, whose unset `enable` reads as false. Other fields keep
    /// their defaults (an empty `driverType` is `container` there).
    pub fn absent() -> Self {
        Self {
            enable: false,
            ..Self::default()
        }
    }

    /// Whether this driver type binds devices to vfio-pci instead of loading amdgpu.
    pub fn is_passthrough(&self) -> bool {
        matches!(
            self.driver_type,
            DriverType::VfPassthrough | DriverType::PfPassthrough
        )
    }

    /// Whether driver upgrades roll across nodes automatically.
    pub fn auto_upgrade(&self) -> bool {
        self.upgrade_policy
            .as_ref()
            .and_then(|policy| policy.enable)
            .unwrap_or(false)
    }
}

impl DriverUpgradePolicySpec {
    /// How many nodes may upgrade at once; `None` means no limit (`0` in the spec).
    /// A negative value (rejected by `validate`) also yields `None`.
    pub fn parallel_limit(&self) -> Option<u32> {
        u32::try_from(self.max_parallel_upgrades)
            .ok()
            .filter(|limit| *limit > 0)
    }

    /// How many of `total_nodes` may be in a failed upgrade state before upgrades
    /// stop. Percentages round up. `None` when the value is invalid.
    pub fn max_unavailable(&self, total_nodes: u32) -> Option<u32> {
        syntax::parse_count_or_percent(&self.max_unavailable_nodes)
            .ok()
            .map(|v: CountOrPercent| v.resolve(total_nodes))
    }
}

impl DevicePluginSpec {
    /// What the reference's code sees for an absent `devicePlugin` section:
    /// both switches unset, which reads as off. Other fields keep their
    /// defaults (they matter only while something runs).
    pub fn absent() -> Self {
        Self {
            enable_device_plugin: false,
            enable_node_labeller: false,
            ..Self::default()
        }
    }

    /// The resource naming strategy: `single` when unset, `None` when the value
    /// is not one the device plugin knows (`validate` reports it).
    pub fn resource_naming_strategy(&self) -> Option<ResourceNamingStrategy> {
        match self
            .device_plugin_arguments
            .get(ARG_RESOURCE_NAMING_STRATEGY)
        {
            None => Some(ResourceNamingStrategy::default()),
            Some(value) => ResourceNamingStrategy::parse(value),
        }
    }

    /// The time-slicing the arguments ask for; each unreadable value is
    /// reported and read as its default (`validate` refuses it).
    pub fn time_slicing(&self) -> (TimeSlicing, Vec<(String, String)>) {
        let mut sharing = TimeSlicing::default();
        let mut problems = Vec::new();
        let args = &self.device_plugin_arguments;
        if let Some(text) = args.get(ARG_TIME_SLICING_REPLICAS) {
            match TimeSlicing::parse_replicas(text) {
                Ok(n) => sharing.replicas = n,
                Err(why) => problems.push((ARG_TIME_SLICING_REPLICAS.to_owned(), why)),
            }
        }
        for (key, flag) in [
            (ARG_TIME_SLICING_RENAME, &mut sharing.rename),
            (
                ARG_TIME_SLICING_FAIL_REQUESTS,
                &mut sharing.fail_requests_greater_than_one,
            ),
        ] {
            if let Some(text) = args.get(key) {
                match parse_flag(text) {
                    Some(on) => *flag = on,
                    None => {
                        problems.push((key.to_owned(), format!("{text:?} is not true or false")))
                    }
                }
            }
        }
        (sharing, problems)
    }

    /// The label generators to run when the node labeller is enabled: the
    /// reference defaults plus every recognised entry of `nodeLabellerArguments`,
    /// sorted and without duplicates. Unrecognised entries are skipped
    /// (`validate` reports them).
    pub fn node_labeller_kinds(&self) -> Vec<NodeLabellerKind> {
        self.node_labeller_kinds_over(NodeLabellerKind::DEFAULTS)
    }

    /// `base` plus every recognised `nodeLabellerArguments` entry, sorted and
    /// without duplicates (the labeller picks `base` by driver type).
    pub fn node_labeller_kinds_over(&self, base: &[NodeLabellerKind]) -> Vec<NodeLabellerKind> {
        let mut kinds: Vec<NodeLabellerKind> = base
            .iter()
            .copied()
            .chain(
                self.node_labeller_arguments
                    .iter()
                    .filter_map(|arg| NodeLabellerKind::parse(arg)),
            )
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }
}

impl DraDriverSpec {
    /// Whether the DRA driver is enabled.
    pub fn is_enabled(&self) -> bool {
        self.enable
    }
}

impl MetricsExporterSpec {
    /// Whether metrics are served (off unless `enable: true`).
    pub fn is_enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }

    /// The node port to request, only for a NodePort service.
    pub fn requested_node_port(&self) -> Option<i32> {
        match self.service_type {
            ServiceType::NodePort => self.node_port,
            _ => None,
        }
    }

    /// Whether a ServiceMonitor is wanted.
    pub fn wants_service_monitor(&self) -> bool {
        self.prometheus
            .as_ref()
            .and_then(|prometheus| prometheus.service_monitor.as_ref())
            .and_then(|monitor| monitor.enable)
            .unwrap_or(false)
    }

    /// Whether the metrics endpoint requires authentication (rbacConfig.enable).
    pub fn access_control_enabled(&self) -> bool {
        self.rbac_config.enable.unwrap_or(false)
    }
}

impl TestRunnerSpec {
    /// Whether GPU tests run (off unless `enable: true`).
    pub fn is_enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }
}

/// The ConfigMap of partition profiles when `configManager.config` names
/// none, as in the reference.
pub const DEFAULT_DCM_CONFIGMAP: &str = "default-dcm-config";

impl ConfigManagerSpec {
    /// Whether device configuration is applied (off unless `enable: true`).
    pub fn is_enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }

    /// The ConfigMap `config` names, if it names one (blank names none).
    pub fn named_config(&self) -> Option<&str> {
        self.config
            .as_ref()
            .map(|c| c.name.trim())
            .filter(|n| !n.is_empty())
    }

    /// The ConfigMap the profiles are read from: the one named, else
    /// [`DEFAULT_DCM_CONFIGMAP`].
    pub fn config_map(&self) -> &str {
        self.named_config().unwrap_or(DEFAULT_DCM_CONFIGMAP)
    }
}

impl RemediationWorkflowSpec {
    /// Whether remediation is on (off unless `enable: true`).
    pub fn is_enabled(&self) -> bool {
        self.enable.unwrap_or(false)
    }

    /// How long failed workflows are kept; `None` when the value is invalid.
    pub fn ttl_for_failed_workflows(&self) -> Option<Duration> {
        syntax::parse_duration(&self.ttl_for_failed_workflows).ok()
    }

    /// How long to wait for a rebooting node; `None` when the value is invalid.
    pub fn reboot_timeout(&self) -> Option<Duration> {
        syntax::parse_duration(&self.reboot_timeout).ok()
    }

    /// How many remediations may run at once; `None` means no limit.
    pub fn parallel_limit(&self) -> Option<u32> {
        u32::try_from(self.max_parallel_workflows)
            .ok()
            .filter(|limit| *limit > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_selector_selects_every_node() {
        let spec = DeviceConfigSpec::default();
        assert!(spec.selects(&labels(&[])));
        assert!(spec.selects(&labels(&[("a", "b")])));
    }

    #[test]
    fn selector_needs_every_pair() {
        let spec = DeviceConfigSpec {
            selector: labels(&[
                ("feature.node.kubernetes.io/amd-gpu", "true"),
                ("zone", "a"),
            ]),
            ..Default::default()
        };
        assert!(spec.selects(&labels(&[
            ("feature.node.kubernetes.io/amd-gpu", "true"),
            ("zone", "a"),
            ("x", "y")
        ])));
        assert!(!spec.selects(&labels(&[("feature.node.kubernetes.io/amd-gpu", "true")])));
        assert!(!spec.selects(&labels(&[
            ("feature.node.kubernetes.io/amd-gpu", "false"),
            ("zone", "a")
        ])));
    }

    #[test]
    fn operand_selector_replaces_the_global_one() {
        let mut spec = DeviceConfigSpec {
            selector: labels(&[("gpu", "true")]),
            ..Default::default()
        };
        spec.metrics_exporter.selector = labels(&[("metrics", "on")]);
        spec.metrics_exporter.enable = Some(true);
        assert_eq!(
            spec.selector_for(Operand::MetricsExporter),
            &labels(&[("metrics", "on")])
        );
        assert_eq!(
            spec.selector_for(Operand::TestRunner),
            &labels(&[("gpu", "true")])
        );
        assert!(spec.runs_on(Operand::MetricsExporter, &labels(&[("metrics", "on")])));
        assert!(!spec.runs_on(Operand::MetricsExporter, &labels(&[("gpu", "true")])));
        // Disabled operands run nowhere.
        assert!(!spec.runs_on(Operand::TestRunner, &labels(&[("gpu", "true")])));
        // Absent driver and devicePlugin sections run nothing...
        for operand in [
            Operand::Driver,
            Operand::DevicePlugin,
            Operand::NodeLabeller,
        ] {
            assert!(
                !spec.runs_on(operand, &labels(&[("gpu", "true")])),
                "{operand:?}"
            );
        }
        // ...and present ones take the reference's defaults (on), on the
        // global selector.
        spec.driver = Some(DriverSpec::default());
        spec.device_plugin = Some(DevicePluginSpec::default());
        for operand in [
            Operand::Driver,
            Operand::DevicePlugin,
            Operand::NodeLabeller,
        ] {
            assert!(
                spec.runs_on(operand, &labels(&[("gpu", "true")])),
                "{operand:?}"
            );
            assert!(
                !spec.runs_on(operand, &labels(&[("metrics", "on")])),
                "{operand:?}"
            );
        }
    }

    #[test]
    fn absent_views_read_the_switches_as_off() {
        let spec = DeviceConfigSpec::default();
        assert!(!spec.driver().enable);
        assert_eq!(spec.driver().driver_type, DriverType::Container);
        assert!(!spec.device_plugin().enable_device_plugin);
        assert!(!spec.device_plugin().enable_node_labeller);
        assert_eq!(
            spec.absent_sections()
                .iter()
                .map(|a| a.path)
                .collect::<Vec<_>>(),
            ["spec.driver", "spec.devicePlugin"]
        );
        let mut written = spec.clone();
        written.device_plugin_mut().enable_node_labeller = false;
        assert!(
            written.is_enabled(Operand::DevicePlugin),
            "default inside the section"
        );
        assert_eq!(
            written
                .absent_sections()
                .iter()
                .map(|a| a.path)
                .collect::<Vec<_>>(),
            ["spec.driver"]
        );
    }

    #[test]
    fn naming_strategy() {
        let mut dp = DevicePluginSpec::default();
        assert_eq!(
            dp.resource_naming_strategy(),
            Some(ResourceNamingStrategy::Single)
        );
        dp.device_plugin_arguments
            .insert(ARG_RESOURCE_NAMING_STRATEGY.into(), "mixed".into());
        assert_eq!(
            dp.resource_naming_strategy(),
            Some(ResourceNamingStrategy::Mixed)
        );
        dp.device_plugin_arguments
            .insert(ARG_RESOURCE_NAMING_STRATEGY.into(), "Mixed".into());
        assert_eq!(dp.resource_naming_strategy(), None);
    }

    #[test]
    fn time_slicing_reads_its_arguments_and_a_node_label_overrides_the_count() {
        let mut dp = DevicePluginSpec::default();
        assert_eq!(dp.time_slicing(), (TimeSlicing::default(), Vec::new()));
        for (key, value) in [
            (ARG_TIME_SLICING_REPLICAS, "4"),
            (ARG_TIME_SLICING_RENAME, "true"),
            (ARG_TIME_SLICING_FAIL_REQUESTS, "true"),
        ] {
            dp.device_plugin_arguments.insert(key.into(), value.into());
        }
        let (sharing, problems) = dp.time_slicing();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            sharing,
            TimeSlicing {
                replicas: 4,
                rename: true,
                fail_requests_greater_than_one: true
            }
        );
        let labels = |v: &str| BTreeMap::from([(SHARING_REPLICAS_LABEL.to_owned(), v.to_owned())]);
        assert_eq!(sharing.for_node(&labels("8")).0.replicas, 8);
        assert_eq!(
            sharing.for_node(&labels("1")).0.replicas,
            1,
            "1 turns it off"
        );
        let (kept, problem) = sharing.for_node(&labels("65"));
        assert_eq!(kept.replicas, 4);
        assert!(problem.unwrap().contains("from 1 to 64"));
        for bad in ["0", "65", "-1", "two", ""] {
            dp.device_plugin_arguments
                .insert(ARG_TIME_SLICING_REPLICAS.into(), bad.into());
            dp.device_plugin_arguments
                .insert(ARG_TIME_SLICING_RENAME.into(), "yes".into());
            let (sharing, problems) = dp.time_slicing();
            assert_eq!(sharing.replicas, 1, "{bad:?}");
            assert_eq!(problems.len(), 2, "{bad:?}: {problems:?}");
        }
    }

    #[test]
    fn labeller_kinds_add_to_defaults() {
        let mut dp = DevicePluginSpec::default();
        assert_eq!(
            dp.node_labeller_kinds(),
            NodeLabellerKind::DEFAULTS.to_vec()
        );
        dp.node_labeller_arguments = vec![
            "-compute-memory-partition".into(),
            "firmware".into(),
            "--vram".into(),
            "bogus".into(),
        ];
        let kinds = dp.node_labeller_kinds();
        assert!(kinds.contains(&NodeLabellerKind::ComputeMemoryPartition));
        assert!(kinds.contains(&NodeLabellerKind::Firmware));
        assert_eq!(kinds.len(), NodeLabellerKind::DEFAULTS.len() + 2);
        assert_eq!(NodeLabellerKind::parse("---vram"), None);
        assert_eq!(
            NodeLabellerKind::parse("-cu-count"),
            Some(NodeLabellerKind::CuCount)
        );
    }

    #[test]
    fn upgrade_limits() {
        let mut policy = DriverUpgradePolicySpec::default();
        assert_eq!(policy.parallel_limit(), Some(1));
        assert_eq!(policy.max_unavailable(10), Some(3));
        policy.max_parallel_upgrades = 0;
        assert_eq!(policy.parallel_limit(), None);
        policy.max_unavailable_nodes = IntOrString::Int(2);
        assert_eq!(policy.max_unavailable(10), Some(2));
        policy.max_unavailable_nodes = IntOrString::String("130%".into());
        assert_eq!(policy.max_unavailable(10), None);
    }

    #[test]
    fn remediation_durations() {
        let mut rw = RemediationWorkflowSpec::default();
        assert_eq!(
            rw.ttl_for_failed_workflows(),
            Some(Duration::from_secs(24 * 3600))
        );
        assert_eq!(rw.reboot_timeout(), Some(Duration::from_secs(15 * 60)));
        rw.reboot_timeout = "soon".into();
        assert_eq!(rw.reboot_timeout(), None);
        assert_eq!(rw.parallel_limit(), None);
    }
}
