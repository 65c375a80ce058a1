//! Which DeviceConfig governs this node, and which services it asks for: pure
//! decisions over the node's labels and the DeviceConfigs the agent has seen.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::agent_status::ConfigKey;
use crate::api::{DeviceConfig, DeviceConfigSpec, NodeLabellerKind, Operand, selects_node};
use crate::dra::DraConfig;
use crate::health::{Damping, HealthConfig};
use crate::metrics::MetricsConfig;
use crate::metrics::access::{AccessMaterial, AccessPolicy};
use crate::metricssvc::HealthSocketConfig;
use crate::partition::PROFILE_LABEL;
use crate::plugin::PluginConfig;
use crate::testrunner::TestRunnerConfig;

/// The DeviceConfig governing a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// No DeviceConfig selects the node: nothing runs.
    None,
    One(Box<Selected>),
    /// More than one selects it: nothing runs until the administrator resolves it.
    /// Holds `namespace/name` of each, sorted.
    Conflict(Vec<String>),
}

impl Selection {
    /// The selection as the driver's decisions see it.
    pub fn for_driver(&self) -> crate::driver::decision::Governing<'_> {
        use crate::driver::decision::Governing;
        match self {
            Selection::None => Governing::None,
            Selection::One(selected) => Governing::One {
                key: &selected.key,
                spec: &selected.spec,
            },
            Selection::Conflict(_) => Governing::Conflict,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    pub key: ConfigKey,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub spec: DeviceConfigSpec,
}

/// Picks the DeviceConfig whose `spec.selector` matches the node's labels.
/// DeviceConfigs being deleted select nothing: their services are torn down.
pub fn select_config<'a>(
    node_labels: &BTreeMap<String, String>,
    configs: impl IntoIterator<Item = &'a DeviceConfig>,
) -> Selection {
    let mut matching: Vec<&DeviceConfig> = configs
        .into_iter()
        .filter(|c| selects_node(c, node_labels))
        .collect();
    matching.sort_by_key(|c| ConfigKey::of(c));
    match matching.as_slice() {
        [] => Selection::None,
        [config] => Selection::One(Box::new(Selected {
            key: ConfigKey::of(config),
            uid: config.metadata.uid.clone(),
            generation: config.metadata.generation,
            spec: config.spec.clone(),
        })),
        many => Selection::Conflict(many.iter().map(|c| ConfigKey::of(c).to_string()).collect()),
    }
}

/// Configuration of the labeller service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabellerConfig {
    pub kinds: Vec<NodeLabellerKind>,
    /// The sharing of the device plugin or the DRA plugin, whichever runs:
    /// the sharing labels.
    pub sharing: Option<crate::api::TimeSlicing>,
}

/// The services a DeviceConfig asks for on this node, with their configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredServices {
    pub device_plugin: Option<PluginConfig>,
    /// The DRA kubelet plugin; never together with the device plugin.
    pub dra: Option<DraConfig>,
    pub labeller: Option<LabellerConfig>,
    pub health: Option<HealthConfig>,
    pub metrics: Option<MetricsConfig>,
    pub test_runner: Option<TestRunnerConfig>,
    /// The reference exporter's health socket; wherever the health monitor runs.
    pub health_socket: Option<HealthSocketConfig>,
}

/// Node facts the service plan depends on besides the spec.
#[derive(Clone, Debug)]
pub struct NodeContext<'a> {
    pub node_name: &'a str,
    pub sampling: &'a Sampling,
    pub labels: &'a BTreeMap<String, String>,
    pub kubelet_dir: &'a Path,
    pub host: &'a crate::host::HostRoot,
    /// `config.json` of the ConfigMap in `metricsExporter.config.name`.
    pub metrics_config: Option<&'a str>,
    /// `config.json` of the ConfigMap in `testRunner.config`.
    pub test_config: Option<&'a str>,
    /// The host path of the reference exporter's health socket
    /// (`--health-socket`); `None` serves none (`--no-health-socket`).
    pub health_socket: Option<&'a Path>,
}

/// How often the node's GPUs are sampled and how health is damped. These come
/// from the command line: the DeviceConfig has no fields for them.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Time between metrics samples (a scrape serves the latest one).
    pub metrics_interval: Duration,
    /// Time between health samples while GPU states are settled, and while
    /// a change is being confirmed.
    pub health_interval: Duration,
    pub health_confirm_interval: Duration,
    /// Consecutive bad samples before a GPU is Unhealthy, good ones before it
    /// is Healthy again.
    pub damping: Damping,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            metrics_interval: MetricsConfig::DEFAULT_INTERVAL,
            health_interval: HealthConfig::DEFAULT_INTERVAL,
            health_confirm_interval: HealthConfig::DEFAULT_CONFIRM_INTERVAL,
            damping: Damping::default(),
        }
    }
}

impl Sampling {
    fn metrics(&self, mut config: MetricsConfig) -> MetricsConfig {
        config.interval = self.metrics_interval;
        config
    }
}

/// What runs when no DeviceConfig governs the node: only the metrics endpoint,
/// which also answers the liveness and readiness probes and carries the agent's
/// own metrics.
pub fn idle_services(node: &NodeContext<'_>) -> DesiredServices {
    DesiredServices {
        metrics: Some(
            node.sampling
                .metrics(MetricsConfig::new(node.host.clone(), node.node_name)),
        ),
        ..DesiredServices::default()
    }
}

/// The time-slicing of this node: the DeviceConfig's arguments (unreadable
/// ones read as their defaults; `validate` refuses them), with the count of
/// the Node label `amd.com/gpu.sharing-replicas` when it has a valid one; and
/// what is wrong with that label, if anything.
pub fn sharing_for(
    spec: &DeviceConfigSpec,
    labels: &BTreeMap<String, String>,
) -> (crate::api::TimeSlicing, Option<String>) {
    spec.device_plugin().time_slicing().0.for_node(labels)
}

/// Why `draDriver.autoPartition` is off on a node that `spec` asks it of:
/// the node carries a partition profile label, and the profile decides its
/// layout (the two would repartition the GPUs under each other).
pub fn auto_partition_problem(
    spec: &DeviceConfigSpec,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    let profile = labels.get(PROFILE_LABEL)?;
    (spec.dra_driver.auto_partition && spec.runs_on(Operand::DraDriver, labels)).then(|| {
        format!(
            "draDriver.autoPartition is off on this node: it carries {PROFILE_LABEL}={profile}, and the profile decides its partition layout"
        )
    })
}

/// What to run for a selected spec. The device plugin socket directory is the
/// spec's `kubeletSocketPath` when it differs from the default, else
/// `<kubelet-dir>/device-plugins`, so that `--kubelet-dir` moves everything.
pub fn plan_services(spec: &DeviceConfigSpec, node: &NodeContext<'_>) -> DesiredServices {
    let plugin_spec = spec.device_plugin();
    // DRA and the device plugin never run together on a node. Validation
    // refuses a spec enabling both; should one get through, DRA wins, as the
    // section that must be enabled on purpose.
    let dra = spec
        .runs_on(Operand::DraDriver, node.labels)
        .then(|| DraConfig {
            sharing: sharing_for(spec, node.labels).0,
            auto_partition: spec.dra_driver.auto_partition
                && !node.labels.contains_key(PROFILE_LABEL),
            driver_module: spec.driver().kernel_module_config.clone(),
            ..DraConfig::new(node.kubelet_dir, node.host.clone(), node.node_name)
        });
    let device_plugin =
        (dra.is_none() && spec.runs_on(Operand::DevicePlugin, node.labels)).then(|| {
            let dir = if plugin_spec.kubelet_socket_path.is_empty()
                || plugin_spec.kubelet_socket_path == PluginConfig::DEFAULT_DIR
            {
                node.kubelet_dir.join("device-plugins")
            } else {
                PathBuf::from(&plugin_spec.kubelet_socket_path)
            };
            // An unknown value is reported by validation; the reference falls back to single.
            let strategy = plugin_spec.resource_naming_strategy().unwrap_or_default();
            PluginConfig {
                sharing: sharing_for(spec, node.labels).0,
                ..PluginConfig::new(dir, strategy, node.host.clone())
            }
        });
    let labeller = spec
        .runs_on(Operand::NodeLabeller, node.labels)
        .then(|| LabellerConfig {
            kinds: crate::labeller::kinds_for(spec),
            sharing: device_plugin
                .as_ref()
                .map(|p| p.sharing)
                .or(dra.as_ref().map(|d| d.sharing)),
        });
    let metrics_text = node.metrics_config.map(str::to_owned);
    // The health monitor always runs under a DeviceConfig (it feeds the device
    // plugin), unless the exporter config switches the health service off.
    let health_wanted = metrics_text
        .as_deref()
        .and_then(|text| crate::telemetry::config::parse_config(text).ok())
        .is_none_or(|config| config.health_enabled);
    let health = health_wanted.then(|| HealthConfig {
        exporter_config: metrics_text.clone(),
        interval: node.sampling.health_interval,
        confirm_interval: node.sampling.health_confirm_interval,
        damping: node.sampling.damping,
        ..HealthConfig::new(node.host.clone())
    });
    // The socket shows the monitor's verdicts: no monitor, no socket (AMD's
    // device plugin then keeps its own checks). Its path is a host path.
    let health_socket = health
        .as_ref()
        .and(node.health_socket)
        .map(|path| HealthSocketConfig {
            socket: node.host.path(path),
        });
    // The endpoint runs even when metricsExporter is disabled: it serves the
    // probes. `enable` decides whether the cluster gets a Service for it.
    // `rbacConfig` as the spec says; the agent adds what it read of the Secret
    // and ConfigMap, and its API client (`plan::apply_overrides`). Without
    // them (standalone) a protected endpoint refuses /metrics.
    let metrics = Some(
        node.sampling.metrics(MetricsConfig {
            shared_gpus: device_plugin
                .as_ref()
                .is_some_and(|p| p.sharing.is_shared()),
            access: AccessPolicy::for_spec(
                &spec.metrics_exporter.rbac_config,
                "",
                AccessMaterial::default(),
                None,
            ),
            ..MetricsConfig::for_spec(
                &spec.metrics_exporter,
                node.host.clone(),
                node.node_name,
                node.kubelet_dir,
                metrics_text,
            )
        }),
    );
    let test_runner = spec.runs_on(Operand::TestRunner, node.labels).then(|| {
        TestRunnerConfig::for_spec(
            &spec.test_runner,
            node.host.clone(),
            node.node_name,
            node.test_config.map(str::to_owned),
        )
    });
    DesiredServices {
        device_plugin,
        dra,
        labeller,
        health,
        metrics,
        test_runner,
        health_socket,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_partition_is_off_on_a_node_with_a_profile_label_and_says_so() {
        let mut spec = DeviceConfigSpec::default();
        spec.dra_driver.enable = true;
        spec.dra_driver.auto_partition = true;
        let plain = BTreeMap::new();
        assert_eq!(auto_partition_problem(&spec, &plain), None);
        let labelled = BTreeMap::from([(PROFILE_LABEL.to_owned(), "cpx_nps4_all".to_owned())]);
        let problem = auto_partition_problem(&spec, &labelled).expect("a problem");
        assert!(problem.contains("cpx_nps4_all"), "{problem}");
        spec.dra_driver.auto_partition = false;
        assert_eq!(auto_partition_problem(&spec, &labelled), None);
    }
    use crate::api::{DeviceConfigSpec, ResourceNamingStrategy};

    fn config(ns: &str, name: &str, selector: &[(&str, &str)]) -> DeviceConfig {
        let spec = DeviceConfigSpec {
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..DeviceConfigSpec::default()
        };
        let mut dc = DeviceConfig::new(name, spec);
        dc.metadata.namespace = Some(ns.into());
        dc.metadata.generation = Some(3);
        dc
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_match_is_selected() {
        let configs = [
            config("ops", "gpu", &[("gpu", "amd")]),
            config("ops", "other", &[("gpu", "nvidia")]),
        ];
        match select_config(&labels(&[("gpu", "amd")]), &configs) {
            Selection::One(selected) => {
                assert_eq!(selected.key, "ops/gpu");
                assert_eq!(selected.generation, Some(3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn none_and_conflicts() {
        let configs = [
            config("b", "second", &[("gpu", "amd")]),
            config("a", "first", &[]),
        ];
        assert_eq!(
            select_config(&labels(&[("gpu", "amd")]), &configs),
            Selection::Conflict(vec!["a/first".into(), "b/second".into()])
        );
        assert_eq!(select_config(&labels(&[]), &configs[..1]), Selection::None);
    }

    #[test]
    fn a_config_being_deleted_selects_nothing() {
        let mut dc = config("ops", "gpu", &[]);
        dc.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(select_config(&labels(&[]), [&dc]), Selection::None);
    }

    #[test]
    fn services_follow_the_spec() {
        let host = crate::host::HostRoot::new("/h");
        let node_labels = labels(&[]);
        let sampling = Sampling {
            metrics_interval: Duration::from_secs(9),
            health_interval: Duration::from_millis(700),
            health_confirm_interval: Duration::from_millis(70),
            damping: Damping {
                unhealthy_after: 3,
                healthy_after: 4,
            },
        };
        let node = NodeContext {
            node_name: "n1",
            sampling: &sampling,
            labels: &node_labels,
            kubelet_dir: Path::new("/k"),
            host: &host,
            metrics_config: None,
            test_config: None,
            health_socket: Some(Path::new(crate::metricssvc::DEFAULT_SOCKET)),
        };
        let mut spec = DeviceConfigSpec::default();
        let desired = plan_services(&spec, &node);
        let (health, metrics) = (desired.health.unwrap(), desired.metrics.unwrap());
        assert_eq!(
            (
                health.interval,
                health.confirm_interval,
                health.damping,
                metrics.interval
            ),
            (
                sampling.health_interval,
                sampling.health_confirm_interval,
                sampling.damping,
                sampling.metrics_interval
            ),
            "sampling comes from the command line"
        );
        assert!(
            desired.test_runner.is_none(),
            "the test runner is off by default"
        );
        assert_eq!(
            desired.health_socket.map(|s| s.socket),
            Some(PathBuf::from(
                "/h/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket"
            )),
            "the health socket runs with the monitor, at its host path under the host root"
        );
        let no_socket = NodeContext {
            health_socket: None,
            ..node.clone()
        };
        assert_eq!(plan_services(&spec, &no_socket).health_socket, None);
        assert_eq!(
            (desired.device_plugin, desired.labeller),
            (None, None),
            "an absent devicePlugin section runs neither, as in the reference"
        );

        spec.device_plugin = Some(Default::default());
        let desired = plan_services(&spec, &node);
        let plugin = desired
            .device_plugin
            .expect("devicePlugin: {} runs the plugin");
        assert_eq!(plugin.device_plugin_dir, PathBuf::from("/k/device-plugins"));
        assert_eq!(plugin.strategy, ResourceNamingStrategy::Single);
        assert!(desired.labeller.is_some());

        let dp = spec.device_plugin_mut();
        dp.device_plugin_arguments
            .insert("resource_naming_strategy".into(), "mixed".into());
        dp.kubelet_socket_path = "/custom/dp".into();
        dp.enable_node_labeller = false;
        let desired = plan_services(&spec, &node);
        let plugin = desired.device_plugin.unwrap();
        assert_eq!(plugin.strategy, ResourceNamingStrategy::Mixed);
        assert_eq!(plugin.device_plugin_dir, PathBuf::from("/custom/dp"));
        assert_eq!(desired.labeller, None);

        spec.device_plugin_mut().enable_device_plugin = false;
        assert_eq!(plan_services(&spec, &node).device_plugin, None);

        spec.test_runner.enable = Some(true);
        let with_health_off = NodeContext {
            metrics_config: Some(r#"{"CommonConfig": {"HealthService": {"Enable": false}}}"#),
            ..node.clone()
        };
        let desired = plan_services(&spec, &with_health_off);
        assert!(desired.test_runner.is_some());
        assert!(
            desired.health.is_none(),
            "the exporter config switched health off"
        );
        assert!(desired.health_socket.is_none(), "and with it the socket");
        let idle = idle_services(&node);
        assert!(idle.device_plugin.is_none() && idle.health.is_none());
        assert!(idle.health_socket.is_none());
        assert_eq!(
            idle.metrics.map(|m| m.interval),
            Some(sampling.metrics_interval)
        );
    }
}
