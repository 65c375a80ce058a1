//! Validation of a DeviceConfig spec, and the notes on fields this design ignores.
//!
//! [`validate`] is a pure function over the spec that returns every problem at
//! once, each with its field path. The `validate` subcommand uses it on files
//! and the reconciler uses it on every DeviceConfig it sees, so the two always
//! agree. It checks what the spec alone can tell: enum values, syntax of
//! durations, labels, taints and int-or-percent values, ranges, and
//! combinations the reference rejects. It must not look at the cluster: whether
//! referenced Secrets and ConfigMaps exist is the reconciler's check.
//!
//! Fields that only configure the reference's operand pods (images, pull
//! policies, per-operand tolerations, ...) are accepted, kept, and listed by
//! [`ignored_field_notes`]. Their meaning is never judged, but a value the CRD
//! schema rejects is a problem here too (an image that does not match the
//! reference's image pattern, a resource quantity that is none), so that
//! `validate` and the API server, and standalone mode, which has none, agree.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{ResourceRequirements, Taint};
use regex::Regex;

use super::enums::{PullPolicy, RELABEL_ACTIONS, TAINT_EFFECTS, UpgradeStrategy};
use super::semantics::{
    ARG_DRIVER_TYPE, ARG_RESOURCE_NAMING_STRATEGY, ARG_TIME_SLICING_FAIL_REQUESTS,
    ARG_TIME_SLICING_RENAME, ARG_TIME_SLICING_REPLICAS, KNOWN_DEVICE_PLUGIN_ARGUMENTS,
    NodeLabellerKind, Operand, ResourceNamingStrategy,
};
use super::syntax;
use super::types::{
    DRIVER_IMAGE_PATTERN, DeviceConfigSpec, DrainSpec, DriverUpgradePolicySpec, IMAGE_PATTERN,
    LocalObjectRef, MetricsExporterSpec, PodDeletionSpec, QUANTITY_PATTERN, REBOOT_TIMEOUT_PATTERN,
    RemediationWorkflowSpec, ServiceMonitorConfig,
};
use super::yaml::{Document, DocumentKind, KIND, api_version};
use super::{DriverType, ServiceType};

mod notes;
pub use notes::{IgnoredField, NOT_ACTED_ON_YET, ignored_field_notes, ignored_fields};

/// One thing wrong with a DeviceConfig, at a field path such as
/// `spec.driver.upgradePolicy.maxUnavailableNodes`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// Where, as a dotted path from the object root.
    pub path: String,
    /// What is wrong, as a sentence fragment that names the bad value.
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem with `spec`, in field order. Empty means valid.
pub fn validate(spec: &DeviceConfigSpec) -> Vec<Problem> {
    let mut check = Checker::default();
    check.driver(spec);
    check.device_plugin(spec);
    check.dra_driver(spec);
    check.metrics_exporter(&spec.metrics_exporter);
    check.labels("spec.testRunner.selector", &spec.test_runner.selector);
    check.path(
        "spec.testRunner.logsLocation.hostPath",
        &spec.test_runner.logs_location.host_path,
    );
    // A relative path already has its problem (not absolute).
    let logs = &spec.test_runner.logs_location.host_path;
    if let Some(why) = logs_host_path_problem(logs).filter(|_| logs.starts_with('/')) {
        check.push("spec.testRunner.logsLocation.hostPath", why);
    }
    check.image("spec.testRunner.image", &spec.test_runner.image);
    check.labels("spec.configManager.selector", &spec.config_manager.selector);
    check.image("spec.configManager.image", &spec.config_manager.image);
    check.image(
        "spec.commonConfig.utilsContainer.image",
        &spec.common_config.utils_container.image,
    );
    check.labels("spec.selector", &spec.selector);
    check.remediation(&spec.remediation_workflow);
    check.operand_enums(spec);
    check.problems
}

/// A pattern of the CRD schema, compiled once. The API server matches with
/// Go's RE2 syntax, which `regex` shares for these patterns.
pub struct CrdPattern {
    /// The pattern as the CRD writes it.
    pub pattern: &'static str,
    regex: LazyLock<Option<Regex>>,
}

impl CrdPattern {
    const fn new(pattern: &'static str, compile: fn() -> Option<Regex>) -> Self {
        Self {
            pattern,
            regex: LazyLock::new(compile),
        }
    }

    /// Whether `value` matches, as the API server would judge it. A pattern
    /// that does not compile (a bug, caught by the tests) matches nothing.
    pub fn matches(&self, value: &str) -> bool {
        self.regex.as_ref().is_some_and(|re| re.is_match(value))
    }
}

/// `image` fields of the operands (the reference's image reference pattern).
pub static IMAGE: CrdPattern = CrdPattern::new(IMAGE_PATTERN, || Regex::new(IMAGE_PATTERN).ok());
/// `driver.image`, which may also hold `$VARIABLE` path parts.
pub static DRIVER_IMAGE: CrdPattern = CrdPattern::new(DRIVER_IMAGE_PATTERN, || {
    Regex::new(DRIVER_IMAGE_PATTERN).ok()
});
/// `remediationWorkflow.rebootTimeout`: durations in s, m and h only.
pub static REBOOT_TIMEOUT: CrdPattern = CrdPattern::new(REBOOT_TIMEOUT_PATTERN, || {
    Regex::new(REBOOT_TIMEOUT_PATTERN).ok()
});
/// Resource quantities (`metricsExporter.resource`).
pub static QUANTITY: CrdPattern =
    CrdPattern::new(QUANTITY_PATTERN, || Regex::new(QUANTITY_PATTERN).ok());

/// Why `name` is not a DNS-1123 subdomain, the form the API server requires of
/// object names: at most 253 characters of lowercase letters, digits, `-` and
/// `.`, each dot-separated part starting and ending with a letter or digit.
pub fn dns_subdomain_problem(name: &str) -> Option<String> {
    if name.len() > 253 {
        return Some(format!(
            "is {} characters long; at most 253 are allowed",
            name.len()
        ));
    }
    let part_ok = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    (!name.split('.').all(part_ok)).then(|| {
        "is not a valid name: use lowercase letters, digits, '-' and '.', \
         starting and ending with a letter or digit (a DNS-1123 subdomain)"
            .to_owned()
    })
}

/// Why `name` is not a DNS-1123 label, the form of namespace names: as a
/// subdomain part, at most 63 characters and no dots.
pub fn dns_label_problem(name: &str) -> Option<String> {
    if name.len() > 63 || name.contains('.') {
        return Some(
            "is not a valid namespace: at most 63 lowercase letters, digits and '-' (a DNS-1123 label)"
                .to_owned(),
        );
    }
    dns_subdomain_problem(name)
        .map(|_| "is not a valid namespace: use lowercase letters, digits and '-', starting and ending with a letter or digit (a DNS-1123 label)".to_owned())
}

/// Where test logs may go on the host: the agent runs as root, so a
/// DeviceConfig naming `/etc` or `/var/lib/kubelet` must not make it write there.
pub const TEST_LOGS_PREFIX: &str = "/var/log/";

/// Why `testRunner.logsLocation.hostPath` is not a directory under
/// [`TEST_LOGS_PREFIX`] (no `.` or `..` parts). The agent checks it again
/// before writing (`TestRunnerConfig::for_spec`).
pub fn logs_host_path_problem(path: &str) -> Option<String> {
    let rest = path.strip_prefix(TEST_LOGS_PREFIX).unwrap_or_default();
    let parts_ok = !rest.is_empty() && rest.split('/').all(|p| p != ".." && p != ".");
    (!parts_ok).then(|| {
        format!(
            "{path:?} is not a directory under {TEST_LOGS_PREFIX}: test logs are written \
             as root, so they stay under {TEST_LOGS_PREFIX} (without \"..\")"
        )
    })
}

/// Every problem with a parsed document: its apiVersion, fields the API does
/// not know, and [`validate`] on its spec. Paths are from the object root.
/// Documents that are not DeviceConfigs have none.
pub fn document_problems(doc: &Document) -> Vec<Problem> {
    let DocumentKind::DeviceConfig {
        config,
        api_version: written,
        unknown_fields,
    } = &doc.kind
    else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let expected = api_version();
    match written {
        Some(written) if *written == expected => {}
        Some(written) => problems.push(Problem::new(
            "apiVersion",
            format!("{written:?} is not {expected} (kind {KIND})"),
        )),
        None => problems.push(Problem::new(
            "apiVersion",
            format!("is missing; set it to {expected}"),
        )),
    }
    match config.metadata.name.as_deref().unwrap_or("") {
        "" => problems.push(Problem::new(
            "metadata.name",
            "is missing; every Kubernetes object needs a name",
        )),
        name => {
            if let Some(why) = dns_subdomain_problem(name) {
                problems.push(Problem::new("metadata.name", format!("{name:?} {why}")));
            }
        }
    }
    if let Some(namespace) = config.metadata.namespace.as_deref()
        && let Some(why) = dns_label_problem(namespace)
    {
        problems.push(Problem::new(
            "metadata.namespace",
            format!("{namespace:?} {why}"),
        ));
    }
    problems.extend(
        unknown_fields
            .iter()
            .map(|path| Problem::new(path.clone(), "is not a field of DeviceConfig")),
    );
    problems.extend(validate(&config.spec));
    problems
}

#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    fn one_of(&mut self, path: &str, value: &str, known: &[&str]) {
        if !known.contains(&value) {
            self.push(
                path,
                format!("{value:?} is not one of {}", known.join(", ")),
            );
        }
    }

    fn at_least(&mut self, path: &str, value: i64, min: i64) {
        if value < min {
            self.push(path, format!("{value} is less than {min}"));
        }
    }

    fn labels(&mut self, path: &str, labels: &BTreeMap<String, String>) {
        for (key, value) in labels {
            if let Err(why) = syntax::check_label_key(key) {
                self.push(path, format!("label key {key:?} {why}"));
            }
            if let Err(why) = syntax::check_label_value(value) {
                self.push(
                    format!("{path}.{key}"),
                    format!("label value {value:?} {why}"),
                );
            }
        }
    }

    fn annotation_keys(&mut self, path: &str, annotations: &BTreeMap<String, String>) {
        for key in annotations.keys() {
            if let Err(why) = syntax::check_label_key(key) {
                self.push(path, format!("annotation key {key:?} {why}"));
            }
        }
    }

    fn duration(&mut self, path: &str, value: &str) {
        if let Err(why) = syntax::parse_duration(value) {
            self.push(path, why);
        }
    }

    fn path(&mut self, path: &str, value: &str) {
        if let Err(why) = syntax::check_absolute_path(value) {
            self.push(path, why);
        }
    }

    /// The pull policies and DaemonSet update strategies of the operands:
    /// ignored in this design, but the CRD's enums reject unknown values.
    fn operand_enums(&mut self, spec: &DeviceConfigSpec) {
        let dp = spec.device_plugin();
        let (dra, me, tr, cm) = (
            &spec.dra_driver,
            &spec.metrics_exporter,
            &spec.test_runner,
            &spec.config_manager,
        );
        for (path, policy) in [
            (
                "spec.devicePlugin.devicePluginImagePullPolicy",
                &dp.device_plugin_image_pull_policy,
            ),
            (
                "spec.devicePlugin.nodeLabellerImagePullPolicy",
                &dp.node_labeller_image_pull_policy,
            ),
            ("spec.draDriver.imagePullPolicy", &dra.image_pull_policy),
            (
                "spec.metricsExporter.imagePullPolicy",
                &me.image_pull_policy,
            ),
            ("spec.testRunner.imagePullPolicy", &tr.image_pull_policy),
            ("spec.configManager.imagePullPolicy", &cm.image_pull_policy),
            (
                "spec.commonConfig.utilsContainer.imagePullPolicy",
                &spec.common_config.utils_container.image_pull_policy,
            ),
        ] {
            if let Some(policy) = policy {
                self.one_of(path, policy.as_str(), PullPolicy::KNOWN);
            }
        }
        for (path, policy) in [
            (
                "spec.devicePlugin.upgradePolicy.upgradeStrategy",
                &dp.upgrade_policy,
            ),
            (
                "spec.draDriver.upgradePolicy.upgradeStrategy",
                &dra.upgrade_policy,
            ),
            (
                "spec.metricsExporter.upgradePolicy.upgradeStrategy",
                &me.upgrade_policy,
            ),
            (
                "spec.testRunner.upgradePolicy.upgradeStrategy",
                &tr.upgrade_policy,
            ),
            (
                "spec.configManager.upgradePolicy.upgradeStrategy",
                &cm.upgrade_policy,
            ),
        ] {
            if let Some(strategy) = policy.as_ref().and_then(|p| p.upgrade_strategy.as_ref()) {
                self.one_of(path, strategy.as_str(), UpgradeStrategy::KNOWN);
            }
        }
    }

    /// A kubelet socket directory: absolute, or empty, which the CRD's path
    /// pattern accepts and which means the default (here and in the
    /// reference's code).
    fn kubelet_dir(&mut self, path: &str, value: &str) {
        if !value.is_empty() {
            self.path(path, value);
        }
    }

    /// An image field, which the CRD restricts to the reference's pattern.
    fn image(&mut self, path: &str, image: &Option<String>) {
        self.image_matching(path, image, &IMAGE);
    }

    fn image_matching(&mut self, path: &str, image: &Option<String>, pattern: &CrdPattern) {
        if let Some(image) = image
            && !pattern.matches(image)
        {
            self.push(
                path,
                format!(
                    "{image:?} is not an image reference the CRD accepts \
                     (lowercase registry/name[:tag][@digest], pattern {})",
                    pattern.pattern
                ),
            );
        }
    }

    /// Resource quantities and claim names, as the CRD's copy of
    /// Kubernetes' ResourceRequirements schema restricts them.
    fn resources(&mut self, path: &str, resources: &ResourceRequirements) {
        for (name, map) in [
            ("limits", &resources.limits),
            ("requests", &resources.requests),
        ] {
            for (resource, quantity) in map.iter().flatten() {
                if !QUANTITY.matches(&quantity.0) {
                    self.push(
                        format!("{path}.{name}.{resource}"),
                        format!(
                            "{:?} is not a resource quantity such as \"500m\", \"4G\" or \"1Gi\"",
                            quantity.0
                        ),
                    );
                }
            }
        }
        let mut names = BTreeSet::new();
        for (index, claim) in resources.claims.iter().flatten().enumerate() {
            if !names.insert(claim.name.as_str()) {
                self.push(
                    format!("{path}.claims[{index}].name"),
                    format!(
                        "{:?} is listed twice; claim names must be unique",
                        claim.name
                    ),
                );
            }
        }
    }

    fn object_ref(&mut self, path: &str, reference: &Option<LocalObjectRef>) {
        if let Some(reference) = reference
            && reference.name.is_empty()
        {
            self.push(
                format!("{path}.name"),
                "is empty; name the object or leave the reference out",
            );
        }
    }

    fn driver(&mut self, spec: &DeviceConfigSpec) {
        let driver = spec.driver();
        self.one_of(
            "spec.driver.driverType",
            driver.driver_type.as_str(),
            DriverType::KNOWN,
        );
        if let Some(policy) = &driver.upgrade_policy {
            self.driver_upgrade("spec.driver.upgradePolicy", policy);
        }
        self.image_matching("spec.driver.image", &driver.image, &DRIVER_IMAGE);
        self.object_ref(
            "spec.driver.imageSign.keySecret",
            &driver.image_sign.key_secret,
        );
        self.object_ref(
            "spec.driver.imageSign.certSecret",
            &driver.image_sign.cert_secret,
        );
        let modules = &driver.kernel_module_config;
        for (at, entry, why) in super::modprobe::module_config_problems(
            &modules.load_args,
            &modules.unload_args,
            &modules.parameters,
        ) {
            self.push(
                format!("spec.driver.kernelModuleConfig.{at}"),
                format!("{entry:?}: {why}"),
            );
        }
    }

    fn driver_upgrade(&mut self, path: &str, policy: &DriverUpgradePolicySpec) {
        self.at_least(
            &format!("{path}.maxParallelUpgrades"),
            policy.max_parallel_upgrades,
            0,
        );
        if let Err(why) = syntax::parse_count_or_percent(&policy.max_unavailable_nodes) {
            self.push(format!("{path}.maxUnavailableNodes"), why);
        }
        if let Some(drain) = &policy.node_drain_policy {
            self.drain(&format!("{path}.nodeDrainPolicy"), drain);
        }
        if let Some(deletion) = &policy.pod_deletion_policy {
            self.pod_deletion(&format!("{path}.podDeletionPolicy"), deletion);
        }
    }

    /// `gracePeriodSeconds` takes any value: a negative one uses each pod's
    /// own, as `kubectl drain --grace-period` does (the reference's CRD has
    /// no minimum, and its own tests store -2).
    fn drain(&mut self, path: &str, drain: &DrainSpec) {
        self.at_least(&format!("{path}.timeoutSeconds"), drain.timeout_seconds, 0);
    }

    fn pod_deletion(&mut self, path: &str, deletion: &PodDeletionSpec) {
        self.at_least(
            &format!("{path}.timeoutSeconds"),
            deletion.timeout_seconds,
            0,
        );
    }

    fn device_plugin(&mut self, spec: &DeviceConfigSpec) {
        let dp = spec.device_plugin();
        // As in the reference's validator, the arguments are judged only
        // while the device plugin runs: a disabled section may hold anything.
        let arguments = if spec.is_enabled(Operand::DevicePlugin) {
            &dp.device_plugin_arguments
        } else {
            &BTreeMap::new()
        };
        for (key, value) in arguments {
            let path = format!("spec.devicePlugin.devicePluginArguments.{key}");
            match key.as_str() {
                ARG_RESOURCE_NAMING_STRATEGY => {
                    self.one_of(&path, value, ResourceNamingStrategy::KNOWN)
                }
                ARG_DRIVER_TYPE => self.one_of(&path, value, DriverType::KNOWN),
                ARG_TIME_SLICING_REPLICAS
                | ARG_TIME_SLICING_RENAME
                | ARG_TIME_SLICING_FAIL_REQUESTS => {}
                _ => self.push(
                    "spec.devicePlugin.devicePluginArguments",
                    format!(
                        "{key:?} is not a device plugin argument (known: {})",
                        KNOWN_DEVICE_PLUGIN_ARGUMENTS.join(", ")
                    ),
                ),
            }
        }
        // Sharing serves DRA too (consumable capacity), where the device
        // plugin is off.
        if spec.is_enabled(Operand::DevicePlugin) || spec.is_enabled(Operand::DraDriver) {
            for (key, why) in dp.time_slicing().1 {
                self.push(
                    format!("spec.devicePlugin.devicePluginArguments.{key}"),
                    why,
                );
            }
        }
        for (index, arg) in dp.node_labeller_arguments.iter().enumerate() {
            if NodeLabellerKind::parse(arg).is_none() {
                let known: Vec<&str> = NodeLabellerKind::ALL
                    .iter()
                    .map(|(_, flag)| *flag)
                    .collect();
                self.push(
                    format!("spec.devicePlugin.nodeLabellerArguments[{index}]"),
                    format!(
                        "{arg:?} is not a node labeller argument (known: {})",
                        known.join(", ")
                    ),
                );
            }
        }
        self.kubelet_dir(
            "spec.devicePlugin.kubeletSocketPath",
            &dp.kubelet_socket_path,
        );
        self.image(
            "spec.devicePlugin.devicePluginImage",
            &dp.device_plugin_image,
        );
        self.image(
            "spec.devicePlugin.nodeLabellerImage",
            &dp.node_labeller_image,
        );
    }

    fn dra_driver(&mut self, spec: &DeviceConfigSpec) {
        // An absent devicePlugin section runs no device plugin, so
        // `draDriver: {enable: true}` alone is valid, as in the reference.
        if spec.is_enabled(Operand::DraDriver) && spec.is_enabled(Operand::DevicePlugin) {
            self.push(
                "spec.draDriver.enable",
                "the DRA driver and the device plugin cannot both be enabled; \
                 set spec.devicePlugin.enableDevicePlugin: false (or leave devicePlugin out) to use DRA",
            );
        }
        self.labels("spec.draDriver.selector", &spec.dra_driver.selector);
        self.image("spec.draDriver.image", &spec.dra_driver.image);
    }

    fn metrics_exporter(&mut self, me: &MetricsExporterSpec) {
        self.image("spec.metricsExporter.image", &me.image);
        self.image(
            "spec.metricsExporter.rbacConfig.image",
            &me.rbac_config.image,
        );
        self.resources("spec.metricsExporter.resource", &me.resource);
        if !(1..=65535).contains(&me.port) {
            self.push(
                "spec.metricsExporter.port",
                format!("{} is not a port between 1 and 65535", me.port),
            );
        }
        self.one_of(
            "spec.metricsExporter.serviceType",
            me.service_type.as_str(),
            ServiceType::KNOWN,
        );
        if let Some(node_port) = me.node_port
            && !(30000..=32767).contains(&node_port)
        {
            self.push(
                "spec.metricsExporter.nodePort",
                format!("{node_port} is not between 30000 and 32767"),
            );
        }
        self.labels("spec.metricsExporter.selector", &me.selector);
        self.kubelet_dir(
            "spec.metricsExporter.podResourceAPISocketPath",
            &me.pod_resource_api_socket_path,
        );
        self.annotation_keys(
            "spec.metricsExporter.serviceAnnotations",
            &me.service_annotations,
        );
        if let Some(monitor) = me
            .prometheus
            .as_ref()
            .and_then(|p| p.service_monitor.as_ref())
        {
            self.service_monitor("spec.metricsExporter.prometheus.serviceMonitor", monitor);
        }
        let rbac = &me.rbac_config;
        if let Some(auth) = &rbac.static_authorization
            && auth.enable == Some(true)
            && auth.client_name.as_deref().unwrap_or("").is_empty()
        {
            self.push(
                "spec.metricsExporter.rbacConfig.staticAuthorization.clientName",
                "is required when static authorization is enabled",
            );
        }
        self.object_ref("spec.metricsExporter.rbacConfig.secret", &rbac.secret);
        self.object_ref(
            "spec.metricsExporter.rbacConfig.clientCAConfigMap",
            &rbac.client_ca_config_map,
        );
    }

    fn service_monitor(&mut self, path: &str, monitor: &ServiceMonitorConfig) {
        if let Some(interval) = &monitor.interval
            && let Err(why) = syntax::parse_interval(interval)
        {
            self.push(format!("{path}.interval"), why);
        }
        self.labels(&format!("{path}.labels"), &monitor.labels);
        for (name, rules) in [
            ("relabelings", &monitor.relabelings),
            ("metricRelabelings", &monitor.metric_relabelings),
        ] {
            for (index, rule) in rules.iter().enumerate() {
                let rule_path = format!("{path}.{name}[{index}]");
                self.one_of(
                    &format!("{rule_path}.action"),
                    &rule.action,
                    RELABEL_ACTIONS,
                );
                for (label_index, label) in rule.source_labels.iter().enumerate() {
                    let valid = label.chars().enumerate().all(|(i, c)| {
                        c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
                    }) && !label.is_empty();
                    if !valid {
                        self.push(
                            format!("{rule_path}.sourceLabels[{label_index}]"),
                            format!("{label:?} is not a Prometheus label name"),
                        );
                    }
                }
            }
        }
        if let Some(tls) = &monitor.tls_config {
            for (name, version) in [
                ("minVersion", &tls.min_version),
                ("maxVersion", &tls.max_version),
            ] {
                if let Some(version) = version {
                    self.one_of(
                        &format!("{path}.tlsConfig.{name}"),
                        version.as_str(),
                        super::TlsVersion::KNOWN,
                    );
                }
            }
        }
    }

    fn remediation(&mut self, rw: &RemediationWorkflowSpec) {
        const PATH: &str = "spec.remediationWorkflow";
        // Without `config`, the built-in mapping (the reference's former
        // default ConfigMap) is used: no error.
        self.object_ref(&format!("{PATH}.config"), &rw.config);
        self.duration(
            &format!("{PATH}.ttlForFailedWorkflows"),
            &rw.ttl_for_failed_workflows,
        );
        if REBOOT_TIMEOUT.matches(&rw.reboot_timeout) {
            self.duration(&format!("{PATH}.rebootTimeout"), &rw.reboot_timeout);
        } else {
            self.push(
                format!("{PATH}.rebootTimeout"),
                format!(
                    "{:?} is not a duration in s, m and h such as \"30s\", \"15m\" or \"1h30m\" \
                     (the CRD allows no other unit here)",
                    rw.reboot_timeout
                ),
            );
        }
        self.at_least(
            &format!("{PATH}.maxParallelWorkflows"),
            rw.max_parallel_workflows.into(),
            0,
        );
        self.image(&format!("{PATH}.testerImage"), &rw.tester_image);
        self.image(&format!("{PATH}.configMapImage"), &rw.config_map_image);
        // The reference judges taints and labels only while remediation is
        // on; so does this check, to be no stricter.
        if rw.is_enabled() {
            for (index, taint) in rw.node_remediation_taints.iter().enumerate() {
                self.taint(&format!("{PATH}.nodeRemediationTaints[{index}]"), taint);
            }
            self.labels(
                &format!("{PATH}.nodeRemediationLabels"),
                &rw.node_remediation_labels,
            );
        }
        if let Some(drain) = &rw.node_drain_policy {
            self.drain(&format!("{PATH}.nodeDrainPolicy"), drain);
        }
    }

    fn taint(&mut self, path: &str, taint: &Taint) {
        if let Err(why) = syntax::check_label_key(&taint.key) {
            self.push(
                format!("{path}.key"),
                format!("taint key {:?} {why}", taint.key),
            );
        }
        if let Some(value) = &taint.value
            && let Err(why) = syntax::check_label_value(value)
        {
            self.push(
                format!("{path}.value"),
                format!("taint value {value:?} {why}"),
            );
        }
        self.one_of(&format!("{path}.effect"), &taint.effect, TAINT_EFFECTS);
    }
}

#[cfg(test)]
mod tests {
    use super::notes::WHY_PULL_SECRET;
    use super::*;
    use crate::types::{DaemonSetUpgradeSpec, DriverUpgradePolicySpec, ServiceMonitorConfig};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn names_must_be_dns_1123() {
        for good in ["default", "gpu-operator", "a.b-c.d0", "0"] {
            assert_eq!(dns_subdomain_problem(good), None, "{good}");
        }
        for bad in [
            "Bad_Name",
            "-a",
            "a-",
            "a..b",
            "UPPER",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(dns_subdomain_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(dns_label_problem("kube-amd-gpu"), None);
        assert!(dns_label_problem("a.b").is_some());
        assert!(dns_label_problem(&"a".repeat(64)).is_some());
    }

    #[test]
    fn test_logs_stay_under_var_log() {
        for good in [
            "/var/log/amd-test-runner",
            "/var/log/gpu/tests/",
            "/var/log/a..b",
        ] {
            assert_eq!(logs_host_path_problem(good), None, "{good}");
        }
        for bad in [
            "/etc",
            "/var/log",
            "/var/log/",
            "/var/logs/x",
            "/var/log/../../etc",
            "/var/log/./x",
            "var/log/x",
            "/var/lib/kubelet",
        ] {
            let why = logs_host_path_problem(bad).unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(why.contains("/var/log/"), "{why}");
        }
        let mut spec = DeviceConfigSpec::default();
        spec.test_runner.logs_location.host_path = "/etc/cron.d".into();
        assert_eq!(
            paths(&validate(&spec)),
            ["spec.testRunner.logsLocation.hostPath"]
        );
    }

    fn paths(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.path.as_str()).collect()
    }

    #[test]
    fn empty_spec_is_valid_and_notes_nothing_it_ignores() {
        let spec = DeviceConfigSpec::default();
        assert_eq!(validate(&spec), vec![]);
        // Absent, `driver` installs nothing, in the reference too: no note.
        assert!(ignored_fields(&spec).is_empty());
        // A present driver section defaults to `enable: true`, which the
        // agent acts on (it loads from the node's bundle store): no note
        // either, on or off.
        let mut present = spec;
        present.driver = Some(Default::default());
        assert!(ignored_fields(&present).is_empty());
        present.driver_mut().enable = false;
        assert!(ignored_fields(&present).is_empty());
    }

    #[test]
    fn dra_alone_is_valid_since_an_absent_device_plugin_is_off() {
        let mut spec = DeviceConfigSpec::default();
        spec.dra_driver.enable = true;
        assert_eq!(validate(&spec), vec![]);
        spec.device_plugin = Some(Default::default());
        assert_eq!(paths(&validate(&spec)), ["spec.draDriver.enable"]);
        spec.device_plugin_mut().enable_device_plugin = false;
        assert_eq!(validate(&spec), vec![]);
    }

    #[test]
    fn problem_display_is_path_colon_message() {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().upgrade_policy = Some(DriverUpgradePolicySpec {
            max_unavailable_nodes: IntOrString::String("130%".into()),
            ..Default::default()
        });
        let problems = validate(&spec);
        assert_eq!(
            problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                r#"spec.driver.upgradePolicy.maxUnavailableNodes: "130%" is not a percentage between 0% and 100%"#
            ]
        );
    }

    #[test]
    fn module_arguments_are_judged_as_modprobe_reads_them() {
        let mut spec = DeviceConfigSpec::default();
        let modules = &mut spec.driver_mut().kernel_module_config;
        modules.load_args = vec!["-v".into(), "--config=/x".into(), "--di=/x".into()];
        modules.unload_args = vec!["--force".into()];
        modules.parameters = vec!["ras_enable=1".into(), "-x".into()];
        let problems = validate(&spec);
        assert_eq!(
            paths(&problems),
            vec![
                "spec.driver.kernelModuleConfig.loadArgs[1]",
                "spec.driver.kernelModuleConfig.loadArgs[2]",
                "spec.driver.kernelModuleConfig.unloadArgs[0]",
                "spec.driver.kernelModuleConfig.parameters[1]",
            ]
        );
        assert!(
            problems[1]
                .message
                .contains("\"--di=/x\": --di means --dirname"),
            "{}",
            problems[1].message
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut spec = DeviceConfigSpec {
            device_plugin: Some(Default::default()),
            ..Default::default()
        };
        spec.driver_mut().driver_type = "gpu".into();
        spec.dra_driver.enable = true;
        spec.metrics_exporter.node_port = Some(80);
        spec.remediation_workflow.reboot_timeout = "later".into();
        let problems = validate(&spec);
        assert_eq!(
            paths(&problems),
            vec![
                "spec.driver.driverType",
                "spec.draDriver.enable",
                "spec.metricsExporter.nodePort",
                "spec.remediationWorkflow.rebootTimeout"
            ]
        );
    }

    #[test]
    fn the_crd_patterns_compile() {
        for pattern in [&IMAGE, &DRIVER_IMAGE, &REBOOT_TIMEOUT, &QUANTITY] {
            assert!(pattern.regex.is_some(), "{}", pattern.pattern);
        }
        assert!(IMAGE.matches("docker.io/rocm/k8s-device-plugin:latest"));
        assert!(!IMAGE.matches("NOT A VALID IMAGE"));
        assert!(DRIVER_IMAGE.matches("image-registry:5000/$MOD_NAMESPACE/amdgpu_kmod"));
        assert!(!IMAGE.matches("image-registry:5000/$MOD_NAMESPACE/amdgpu_kmod"));
        assert!(REBOOT_TIMEOUT.matches("1h30m") && !REBOOT_TIMEOUT.matches("500ms"));
        assert!(QUANTITY.matches("500m") && QUANTITY.matches("1Gi") && !QUANTITY.matches("lots"));
    }

    #[test]
    fn ignored_fields_are_judged_only_by_the_crd_schema() {
        let mut spec = DeviceConfigSpec::default();
        spec.device_plugin_mut().device_plugin_image = Some("NOT A VALID IMAGE".into());
        assert_eq!(
            paths(&validate(&spec)),
            ["spec.devicePlugin.devicePluginImage"],
            "the CRD's image pattern rejects it"
        );
    }

    #[test]
    fn ignored_fields_are_never_problems() {
        let mut spec = DeviceConfigSpec::default();
        spec.device_plugin_mut().device_plugin_image = Some("rocm/k8s-device-plugin:latest".into());
        spec.device_plugin_mut().device_plugin_image_pull_policy = Some("Sometimes".into());
        spec.metrics_exporter.upgrade_policy = Some(DaemonSetUpgradeSpec {
            upgrade_strategy: Some("Sideways".into()),
            max_unavailable: -3,
        });
        // The CRD's enums reject these two; their meaning is not judged
        // (a negative maxUnavailable is no problem).
        assert_eq!(
            paths(&validate(&spec)),
            [
                "spec.devicePlugin.devicePluginImagePullPolicy",
                "spec.metricsExporter.upgradePolicy.upgradeStrategy"
            ]
        );
        spec.device_plugin_mut().device_plugin_image_pull_policy = Some("IfNotPresent".into());
        spec.metrics_exporter.upgrade_policy = Some(DaemonSetUpgradeSpec {
            upgrade_strategy: Some("OnDelete".into()),
            max_unavailable: -3,
        });
        assert_eq!(validate(&spec), vec![]);
        let notes = ignored_field_notes(&spec);
        assert_eq!(
            notes.iter().map(|n| n.path.as_str()).collect::<Vec<_>>(),
            vec![
                "spec.devicePlugin.devicePluginImage",
                "spec.devicePlugin.devicePluginImagePullPolicy",
                "spec.metricsExporter.upgradePolicy"
            ]
        );
        assert_eq!(notes[1].reason, WHY_PULL_SECRET);
    }

    #[test]
    fn service_monitor_rules() {
        let mut spec = DeviceConfigSpec::default();
        spec.metrics_exporter.prometheus = Some(crate::types::PrometheusConfig {
            service_monitor: Some(ServiceMonitorConfig {
                interval: Some("1m30s".into()),
                relabelings: vec![crate::types::RelabelConfig {
                    action: "rename".into(),
                    source_labels: vec!["ok_label".into(), "9bad".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
        });
        assert_eq!(
            paths(&validate(&spec)),
            vec![
                "spec.metricsExporter.prometheus.serviceMonitor.interval",
                "spec.metricsExporter.prometheus.serviceMonitor.relabelings[0].action",
                "spec.metricsExporter.prometheus.serviceMonitor.relabelings[0].sourceLabels[1]"
            ]
        );
    }
}
