//! Step 2 of a pass ([`services`]): the services the selection asks for on
//! this node with the command line's overrides (applied in
//! [`apply_overrides`], for standalone mode too), the partition profiles it
//! gives ([`partition_wanted`]) and what the node's own work holds
//! ([`hold_for_node_work`]). Pure: it must not start or apply services
//! (that is `super::super::node_services`').

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::super::select::{DesiredServices, NodeContext, Selection, idle_services, plan_services};
use super::LoopState;
use crate::api::DeviceConfigSpec;
use crate::api::agent_status::{DriverLoad, DriverReport};
use crate::metrics::access::{AccessMaterial, AccessPolicy, ReviewClient};

/// The partition profiles the selected DeviceConfig gives this node: `None`
/// when configManager does not run here. The text is the followed
/// ConfigMap's `config.json`; without one, the built-in profiles, unless
/// `configManager.config` names a ConfigMap (then nothing is decided until
/// it is seen: the leader reports a missing one in the DeviceConfig's
/// status).
pub fn partition_wanted(
    state: &mut LoopState,
    selection: &Selection,
    node_labels: &BTreeMap<String, String>,
    text: Option<&std::sync::Arc<str>>,
) -> Option<super::super::partition::Wanted> {
    let Selection::One(selected) = selection else {
        return None;
    };
    let spec = &selected.spec;
    if !spec.runs_on(crate::api::semantics::Operand::ConfigManager, node_labels) {
        return None;
    }
    let cm = &spec.config_manager;
    let profiles = match (text, cm.named_config()) {
        (Some(text), _) => {
            let parsed = match &state.partition_profiles {
                Some((last, parsed)) if last == text => parsed.clone(),
                _ => {
                    let parsed = crate::partition::ProfileSet::parse(text)
                        .map(std::sync::Arc::new)
                        .map_err(|e| e.to_string());
                    state.partition_profiles = Some((text.clone(), parsed.clone()));
                    parsed
                }
            };
            Some(parsed.map_err(|e| format!("ConfigMap {}: {e}", cm.config_map())))
        }
        (None, None) => Some(Ok(std::sync::Arc::new(
            crate::partition::ProfileSet::builtin(),
        ))),
        (None, Some(_)) => None,
    };
    Some(super::super::partition::Wanted { profiles })
}

/// What the node is doing to its own GPUs, which the services must not
/// take for a fault.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeWork<'a> {
    /// The driver report and the driver manager's last outcome.
    pub driver: Option<&'a DriverReport>,
    pub load: Option<&'a DriverLoad>,
    /// The node's partition change, as the agent's partition task reports it.
    pub partition: Option<&'a crate::api::agent_status::PartitionReport>,
}

/// Holds what would misread the node's own work: the test runner's tests
/// while the GPUs cannot be tested yet
/// ([`crate::driver::condition::gpus_pending`]), and the health monitor's
/// verdicts while a partition change is being written (its GPUs' files go
/// and come back). Returns whether that changed `desired`. Pure.
pub fn hold_for_node_work(desired: &mut DesiredServices, work: NodeWork<'_>) -> bool {
    let mut changed = false;
    if let Some(tests) = desired.test_runner.as_mut() {
        let pending = crate::driver::condition::gpus_pending(work.driver, work.load);
        changed |= tests.gpus_pending != pending;
        tests.gpus_pending = pending;
    }
    if let Some(health) = desired.health.as_mut() {
        let hold = work
            .partition
            .filter(|p| p.state == crate::partition::state::State::Applying.as_str())
            .map(|p| format!("the node is writing partition profile {}", p.profile));
        changed |= health.hold != hold;
        health.hold = hold;
    }
    changed
}

/// What the command line overrides in the services a DeviceConfig asks for,
/// in either mode, and what the agent read for the metrics endpoint's
/// `rbacConfig`. [`apply_overrides`] is the one place they are applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Where the metrics endpoint listens, instead of `metricsExporter.port`.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the test tools are.
    pub test_commands: Option<crate::testrunner::Commands>,
    /// Where the DRA plugin writes CDI specs (`--cdi-dir`).
    pub cdi_dir: Option<std::path::PathBuf>,
    /// Whether the DRA plugin taints unhealthy devices (`--dra-device-taints`);
    /// `None` keeps the plugin's default.
    pub dra_device_taints: Option<bool>,
    /// How the DRA plugin reloads amdgpu after a memory mode change it makes
    /// (`draDriver.autoPartition`): the driver manager's `modprobe`, and
    /// its record of what it loaded.
    pub reload: Option<crate::driver::reload::Reloader>,
    /// What the agent read of the Secret and ConfigMap that the selected
    /// DeviceConfig's `metricsExporter.rbacConfig` names, and the client the
    /// reviews go through; `None` (standalone mode) leaves a protected
    /// endpoint refusing /metrics.
    pub access: Option<(AccessMaterial, ReviewClient)>,
}

/// Step 2: the services the selection asks for on this node (only the metrics
/// endpoint without exactly one DeviceConfig), with the overrides applied.
pub fn services(
    selection: &Selection,
    context: &NodeContext<'_>,
    overrides: &Overrides,
) -> DesiredServices {
    let (mut desired, selected) = match selection {
        Selection::One(selected) => (
            plan_services(&selected.spec, context),
            Some((&selected.spec, selected.key.namespace.as_str())),
        ),
        Selection::None | Selection::Conflict(_) => (idle_services(context), None),
    };
    apply_overrides(&mut desired, selected, overrides);
    desired
}

/// Applies `overrides` to the services planned for `selected` (the spec and
/// the namespace of its DeviceConfig; `None` when none is selected): every
/// override of either mode, here and nowhere else. Pure.
pub fn apply_overrides(
    desired: &mut DesiredServices,
    selected: Option<(&DeviceConfigSpec, &str)>,
    overrides: &Overrides,
) {
    if let (Some(listen), Some(metrics)) = (overrides.metrics_listen, desired.metrics.as_mut()) {
        metrics.listen = listen;
    }
    if let (Some(commands), Some(tests)) = (&overrides.test_commands, desired.test_runner.as_mut())
    {
        tests.commands = commands.clone();
    }
    if let Some(dra) = desired.dra.as_mut() {
        if let Some(dir) = &overrides.cdi_dir {
            dra.cdi_dir = dir.clone();
        }
        if let Some(taints) = overrides.dra_device_taints {
            dra.device_taints = taints;
        }
        dra.reload = overrides.reload.clone();
    }
    // The metrics endpoint's `rbacConfig` policy, completed with what the
    // agent read of the objects it names (in the DeviceConfig's namespace)
    // and the client the reviews go through.
    if let (Some((spec, namespace)), Some((material, api)), Some(metrics)) =
        (selected, &overrides.access, desired.metrics.as_mut())
    {
        metrics.access = AccessPolicy::for_spec(
            &spec.metrics_exporter.rbac_config,
            namespace,
            material.clone(),
            Some(api.clone()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::plan::one;

    #[test]
    fn tests_wait_for_the_driver_and_health_waits_for_a_partition_being_written() {
        use crate::api::agent_status::PartitionReport;
        let mut desired = DesiredServices {
            test_runner: Some(crate::testrunner::TestRunnerConfig::new(
                crate::host::HostRoot::new("/nonexistent"),
                "n",
                "/var/log/amd-test-runner",
            )),
            health: Some(crate::health::HealthConfig::new(
                crate::host::HostRoot::new("/nonexistent"),
            )),
            ..DesiredServices::default()
        };
        let unloaded = DriverReport::default();
        assert!(hold_for_node_work(
            &mut desired,
            NodeWork {
                driver: Some(&unloaded),
                ..NodeWork::default()
            }
        ));
        let pending = desired
            .test_runner
            .as_ref()
            .and_then(|t| t.gpus_pending.clone());
        assert!(pending.is_some_and(|p| p.contains("not loaded")));
        let loaded = DriverReport {
            loaded: true,
            ..DriverReport::default()
        };
        let applying = PartitionReport {
            profile: "cpx_nps4_all".into(),
            state: "applying".into(),
            reason: None,
        };
        assert!(hold_for_node_work(
            &mut desired,
            NodeWork {
                driver: Some(&loaded),
                load: None,
                partition: Some(&applying),
            }
        ));
        assert_eq!(
            desired
                .test_runner
                .as_ref()
                .and_then(|t| t.gpus_pending.clone()),
            None
        );
        let hold = desired.health.as_ref().and_then(|h| h.hold.clone());
        assert!(hold.is_some_and(|h| h.contains("cpx_nps4_all")));
        // Unchanged: no change reported.
        assert!(!hold_for_node_work(
            &mut desired,
            NodeWork {
                driver: Some(&loaded),
                load: None,
                partition: Some(&applying),
            }
        ));
        let done = PartitionReport {
            state: "success".into(),
            ..applying
        };
        assert!(hold_for_node_work(
            &mut desired,
            NodeWork {
                driver: Some(&loaded),
                load: None,
                partition: Some(&done),
            }
        ));
        assert_eq!(desired.health.as_ref().and_then(|h| h.hold.clone()), None);
    }

    #[test]
    fn the_command_line_overrides_the_metrics_address_and_the_test_tools() {
        let host = crate::host::HostRoot::new("/h");
        let sampling = crate::agent::select::Sampling::default();
        let labels = BTreeMap::new();
        let context = NodeContext {
            node_name: "n1",
            sampling: &sampling,
            labels: &labels,
            kubelet_dir: std::path::Path::new("/k"),
            host: &host,
            metrics_config: None,
            test_config: None,
            health_socket: None,
        };
        let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let overrides = Overrides {
            metrics_listen: Some(listen),
            ..Overrides::default()
        };
        let idle = services(&Selection::None, &context, &overrides);
        assert_eq!(idle.metrics.map(|m| m.listen), Some(listen));
        assert_eq!(idle.device_plugin, None);
        let conflict = Selection::Conflict(vec!["a/b".into(), "a/c".into()]);
        assert_eq!(
            services(&conflict, &context, &Overrides::default()),
            idle_services(&context),
            "a conflict runs only the metrics endpoint"
        );
    }

    #[test]
    fn every_override_of_either_mode_is_applied_in_one_place() {
        let host = crate::host::HostRoot::new("/h");
        let planned = || DesiredServices {
            metrics: Some(crate::metrics::MetricsConfig::new(host.clone(), "n1")),
            test_runner: Some(crate::testrunner::TestRunnerConfig::new(
                host.clone(),
                "n1",
                "/var/log/amd-test-runner",
            )),
            dra: Some(crate::dra::DraConfig::new("/k", host.clone(), "n1")),
            ..DesiredServices::default()
        };
        // Standalone mode's: nothing of DRA, whose defaults stay.
        let mut standalone = planned();
        apply_overrides(&mut standalone, None, &Overrides::default());
        assert_eq!(standalone, planned(), "no override changes nothing");
        let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let commands = crate::testrunner::Commands {
            rvs: "/opt/rvs".into(),
            ..crate::testrunner::Commands::default()
        };
        let reload = crate::driver::reload::Reloader {
            commands: crate::driver::load::LoadCommands::default(),
            handoff: crate::driver::reload::Handoff::default(),
        };
        let agent = Overrides {
            metrics_listen: Some(listen),
            test_commands: Some(commands.clone()),
            cdi_dir: Some("/run/cdi-here".into()),
            dra_device_taints: Some(false),
            reload: Some(reload.clone()),
            access: None,
        };
        let mut desired = planned();
        apply_overrides(&mut desired, None, &agent);
        assert_eq!(desired.metrics.map(|m| m.listen), Some(listen));
        assert_eq!(desired.test_runner.map(|t| t.commands), Some(commands));
        let dra = desired.dra.expect("DRA planned");
        assert_eq!(dra.cdi_dir, std::path::PathBuf::from("/run/cdi-here"));
        assert!(!dra.device_taints);
        assert_eq!(dra.reload, Some(reload));
    }

    /// The reference's CRD has no default on `driver` or `devicePlugin`, and
    /// its code reads an absent section's switches as off: DeviceConfigs in
    /// the shapes of its examples that leave `devicePlugin` out run no device
    /// plugin and no labeller, here too. (YAML written by us, in those shapes.)
    #[test]
    fn an_absent_device_plugin_or_driver_section_runs_nothing_of_it() {
        let host = crate::host::HostRoot::new("/h");
        let sampling = crate::agent::select::Sampling::default();
        let labels = BTreeMap::from([("gpu".to_owned(), "amd".to_owned())]);
        let context = NodeContext {
            node_name: "n1",
            sampling: &sampling,
            labels: &labels,
            kubelet_dir: std::path::Path::new("/k"),
            host: &host,
            metrics_config: None,
            test_config: None,
            health_socket: None,
        };
        let spec_of = |yaml: &str| {
            let mut docs = crate::api::parse_specs(yaml).expect("parses");
            let doc = docs.remove(0);
            assert!(doc.unknown_fields.is_empty(), "{:?}", doc.unknown_fields);
            assert_eq!(crate::api::validate(&doc.spec), vec![], "{yaml}");
            doc.spec
        };
        // (spec, device plugin runs, labeller runs, driver label written)
        let table: &[(&str, bool, bool, bool)] = &[
            (
                "selector: {gpu: amd}\ndriver:\n  enable: false\nmetricsExporter:\n  enable: true\n",
                false,
                false,
                false,
            ),
            ("driver:\n  version: \"6.4.1\"\n", false, false, true),
            ("draDriver:\n  enable: true\n", false, false, false),
            ("testRunner:\n  enable: true\n", false, false, false),
            ("{}", false, false, false),
            ("devicePlugin: {}\n", true, true, false),
            (
                "devicePlugin:\n  enableNodeLabeller: false\n",
                true,
                false,
                false,
            ),
            (
                "devicePlugin:\n  enableDevicePlugin: false\ndraDriver:\n  enable: true\n",
                false,
                true,
                false,
            ),
        ];
        for (yaml, plugin, labeller, driver_label) in table {
            let spec = spec_of(yaml);
            let selection = one("kube-amd-gpu", "gpus", spec);
            let planned = services(&selection, &context, &Overrides::default());
            assert_eq!(planned.device_plugin.is_some(), *plugin, "{yaml}");
            assert_eq!(planned.labeller.is_some(), *labeller, "{yaml}");
            assert!(
                planned.metrics.is_some(),
                "the endpoint always runs: {yaml}"
            );
            let written = crate::driver::decision::Shown::default()
                .labels_to_apply(selection.for_driver(), &BTreeMap::new());
            assert_eq!(
                written.is_some_and(|labels| !labels.is_empty()),
                *driver_label,
                "{yaml}"
            );
        }
    }
}
