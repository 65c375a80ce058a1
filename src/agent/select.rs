//! Which DeviceConfig governs this node, and which services it asks for: pure
//! decisions over the node's labels and the DeviceConfigs the agent has seen.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::ResourceExt;

use crate::api::{DeviceConfig, DeviceConfigSpec, NodeLabellerKind, Operand};
use crate::plugin::PluginConfig;

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

#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    /// `namespace/name`.
    pub key: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub spec: DeviceConfigSpec,
}

/// `namespace/name` of a DeviceConfig.
pub fn config_key(config: &DeviceConfig) -> String {
    format!(
        "{}/{}",
        config.namespace().unwrap_or_default(),
        config.name_any()
    )
}

/// Picks the DeviceConfig whose `spec.selector` matches the node's labels.
/// DeviceConfigs being deleted select nothing: their services are torn down.
pub fn select_config<'a>(
    node_labels: &BTreeMap<String, String>,
    configs: impl IntoIterator<Item = &'a DeviceConfig>,
) -> Selection {
    let mut matching: Vec<&DeviceConfig> = configs
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && c.spec.selects(node_labels))
        .collect();
    matching.sort_by_key(|c| config_key(c));
    match matching.as_slice() {
        [] => Selection::None,
        [config] => Selection::One(Box::new(Selected {
            key: config_key(config),
            uid: config.metadata.uid.clone(),
            generation: config.metadata.generation,
            spec: config.spec.clone(),
        })),
        many => Selection::Conflict(many.iter().map(|c| config_key(c)).collect()),
    }
}

/// Configuration of the labeller service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabellerConfig {
    pub kinds: Vec<NodeLabellerKind>,
}

/// The services a DeviceConfig asks for on this node, with their configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredServices {
    pub device_plugin: Option<PluginConfig>,
    pub labeller: Option<LabellerConfig>,
}

/// Node facts the service plan depends on besides the spec.
#[derive(Clone, Debug)]
pub struct NodeContext<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub kubelet_dir: &'a Path,
    pub host: &'a crate::host::HostRoot,
}

/// What to run for a selected spec. The device plugin socket directory is the
/// spec's `kubeletSocketPath` when it differs from the default, else
/// `<kubelet-dir>/device-plugins`, so that `--kubelet-dir` moves everything.
pub fn plan_services(spec: &DeviceConfigSpec, node: &NodeContext<'_>) -> DesiredServices {
    let plugin_spec = &spec.device_plugin;
    let device_plugin = spec.runs_on(Operand::DevicePlugin, node.labels).then(|| {
        let dir = if plugin_spec.kubelet_socket_path.is_empty()
            || plugin_spec.kubelet_socket_path == PluginConfig::DEFAULT_DIR
        {
            node.kubelet_dir.join("device-plugins")
        } else {
            PathBuf::from(&plugin_spec.kubelet_socket_path)
        };
        // An unknown value is reported by validation; the reference falls back to single.
        let strategy = spec
            .device_plugin
            .resource_naming_strategy()
            .unwrap_or_default();
        PluginConfig::new(dir, strategy, node.host.clone())
    });
    let labeller =
        (plugin_spec.enable_node_labeller && spec.selects(node.labels)).then(|| LabellerConfig {
            kinds: spec.device_plugin.node_labeller_kinds(),
        });
    DesiredServices {
        device_plugin,
        labeller,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let node = NodeContext {
            labels: &node_labels,
            kubelet_dir: Path::new("/k"),
            host: &host,
        };
        let mut spec = DeviceConfigSpec::default();
        let desired = plan_services(&spec, &node);
        let plugin = desired.device_plugin.expect("plugin on by default");
        assert_eq!(plugin.device_plugin_dir, PathBuf::from("/k/device-plugins"));
        assert_eq!(plugin.strategy, ResourceNamingStrategy::Single);
        assert!(desired.labeller.is_some());

        spec.device_plugin
            .device_plugin_arguments
            .insert("resource_naming_strategy".into(), "mixed".into());
        spec.device_plugin.kubelet_socket_path = "/custom/dp".into();
        spec.device_plugin.enable_node_labeller = false;
        let desired = plan_services(&spec, &node);
        let plugin = desired.device_plugin.unwrap();
        assert_eq!(plugin.strategy, ResourceNamingStrategy::Mixed);
        assert_eq!(plugin.device_plugin_dir, PathBuf::from("/custom/dp"));
        assert_eq!(desired.labeller, None);

        spec.device_plugin.enable_device_plugin = false;
        assert_eq!(plan_services(&spec, &node).device_plugin, None);
    }
}
