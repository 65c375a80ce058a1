//! What the agent does on one pass over its Node, decided as plain data.
//!
//! A pass has three steps, because the node services only say how they are
//! after they have been given their configuration:
//!
//! 1. [`follow`]: from the selection, what the agent follows (the line to log
//!    when that changed) and which ConfigMaps and `rbacConfig` objects to watch;
//! 2. [`services`]: the services to run, with the command line's overrides;
//! 3. [`report`]: once the services were applied, whether to remove the GPU
//!    labels, start or stop publishing health on the Node, which Warning Events
//!    to record and which status annotation to write.
//!
//! [`LoopState`] is what the agent remembers between passes: what it logged it
//! follows, the problems already recorded as Events, the status last written.
//!
//! This module owns those decisions. It must not do I/O of any kind: no
//! Kubernetes API, no clock, no tasks; the agent loop (`super::run`) reads the
//! inputs and carries the plan out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::configmaps::ConfigMapRef;
use super::node_services::{Applied, DiscoveryProgress};
use super::select::{DesiredServices, NodeContext, Selection, idle_services, plan_services};
use crate::api::KubeRbacConfig;
use crate::api::agent_status::{
    AgentStatus, DriverLoad, DriverLoadState, DriverReport, STATUS_VERSION, ServiceName,
    ServiceStatus,
};
use crate::device::Inventory;
use crate::driver::condition::{CONDITION_TYPE, driver_condition};
use crate::driver::manager::DriverWanted;
use crate::events::EventType;
use crate::node_writer::{StatusIntent, condition_to_apply, find_condition};
use crate::plugin::PluginStatus;

/// What the agent remembers from one pass to the next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopState {
    /// What the agent follows, as last logged.
    followed: Option<String>,
    /// The problems recorded as Events, by message: each is recorded once for
    /// as long as it lasts.
    reported: BTreeSet<String>,
    /// What was last written: `Some(None)` means the annotation was removed.
    last_status: Option<Option<AgentStatus>>,
    /// Set while the latest status write failed: it is retried on a timer.
    status_write_failed: bool,
    /// The driver-type labels last applied; `None` before the first write.
    driver_labels: Option<BTreeMap<String, String>>,
    /// What the driver manager did, as last recorded in an Event.
    driver_load: Option<DriverLoad>,
    /// The partition profiles text last parsed, and what it gave: a pass
    /// parses it again only when it changed.
    partition_profiles: Option<(std::sync::Arc<str>, ParsedProfiles)>,
}

type ParsedProfiles = Result<std::sync::Arc<crate::partition::ProfileSet>, String>;

impl LoopState {
    /// Whether the latest status write failed, so that the loop retries it
    /// without waiting for another change.
    pub fn status_write_failed(&self) -> bool {
        self.status_write_failed
    }

    /// Takes in how the write of `update` went.
    pub fn status_written(&mut self, update: StatusUpdate, written: bool) {
        if written {
            self.last_status = Some(update.status);
            self.status_write_failed = false;
        } else {
            self.status_write_failed = true;
        }
    }
}

/// The Event for what the driver manager did, when it differs from what was
/// last recorded (state and reason): a Warning for a refusal, a failure or a
/// driver that must be replaced, a Normal one when the manager's own load
/// took (`DriverLoaded`). A load under way is skipped, so that a failure
/// retried at each recheck is one Event, not one per try; a driver found
/// running is not worth one. Pure.
pub fn driver_load_event(
    state: &mut LoopState,
    load: Option<&DriverLoad>,
) -> Option<(EventType, &'static str, String, String)> {
    if load.is_some_and(|l| l.state == DriverLoadState::Loading) {
        return None;
    }
    let same = |a: &DriverLoad, b: &DriverLoad| a.state == b.state && a.reason == b.reason;
    let changed = match (&state.driver_load, load) {
        (Some(last), Some(now)) => !same(last, now),
        (None, None) => false,
        _ => true,
    };
    if !changed {
        return None;
    }
    state.driver_load = load.cloned();
    let load = load?;
    let type_ = match load.state {
        DriverLoadState::Loaded if load.reason == crate::driver::manager::LOADED_HERE => {
            EventType::Normal
        }
        DriverLoadState::Loaded | DriverLoadState::Loading => return None,
        // A reboot asked for is news to whoever looks at the node.
        DriverLoadState::Rebooting => EventType::Normal,
        DriverLoadState::Refused | DriverLoadState::ReplaceNeeded | DriverLoadState::Failed => {
            EventType::Warning
        }
    };
    Some((
        type_,
        "LoadDriver",
        load.reason.clone(),
        load.message.clone(),
    ))
}

/// Step 1: what the selection has the agent follow.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Following {
    /// What the agent follows now, to log, when that changed.
    pub log: Option<String>,
    /// The ConfigMap of `metricsExporter.config`.
    pub metrics_config: Option<ConfigMapRef>,
    /// The ConfigMap of `testRunner.config`.
    pub test_config: Option<ConfigMapRef>,
    /// The namespace and `metricsExporter.rbacConfig` whose objects to follow.
    pub access: Option<(String, KubeRbacConfig)>,
    /// The ConfigMap of `configManager.config` (the reference's
    /// `default-dcm-config` when it names none), while configManager is on.
    pub partition_config: Option<ConfigMapRef>,
}

/// The operator-side driver-type label the reference writes on each Node a
/// DeviceConfig with `driver.enable` selects, when it differs from what was
/// last applied: `Some(labels)` is the whole set to apply (empty removes
/// it). Under a conflict nothing changes. Before the first write, an empty
/// set is applied only if the Node carries such a label (`node_labels`), so
/// that an agent on a node nothing selects writes nothing at start.
pub fn driver_labels(
    state: &LoopState,
    selection: &Selection,
    node_labels: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    let wanted = match selection {
        Selection::One(selected) => crate::labeller::driver_type_labels(
            &selected.key.namespace,
            &selected.key.name,
            &selected.spec,
        ),
        Selection::None => BTreeMap::new(),
        Selection::Conflict(_) => return None,
    };
    match &state.driver_labels {
        Some(last) if *last == wanted => None,
        None if wanted.is_empty()
            && !node_labels
                .keys()
                .any(|k| k.starts_with("gpu.operator.amd.com/") && k.ends_with(".driver")) =>
        {
            None
        }
        _ => Some(wanted),
    }
}

/// What to write of the `AMDGPUDriverReady` condition on `node`: `None`
/// when the Node already says it. With a DeviceConfig selecting the node and
/// the driver report read, the condition ([`driver_condition`], from the report
/// and what the driver manager did, `load`; keeping the
/// Node's times when it says the same); with none selecting it, an empty
/// intent that removes it, if there. Under a conflict nothing changes.
///
/// While the manager's last answer (`load`) answers an earlier ask than
/// what is asked of it now (`wanted`: a new `driver.version`, a new upgrade
/// record), nothing changes either: judging the new ask by the old answer
/// would write `DriverVersionMismatch` for the moment the manager takes to
/// answer, and move `lastTransitionTime` twice. Pure.
pub fn driver_condition_intent(
    selection: &Selection,
    report: Option<&DriverReport>,
    load: Option<&DriverLoad>,
    wanted: Option<&DriverWanted>,
    node: &k8s_openapi::api::core::v1::Node,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<StatusIntent> {
    let on_node = find_condition(node, CONDITION_TYPE);
    let answers_an_earlier_ask = match (load, wanted) {
        (Some(load), Some(wanted)) => {
            load.asked != wanted.version || load.told_at != wanted.told_at
        }
        _ => false,
    };
    match (selection, report) {
        (Selection::One(_), Some(_)) if answers_an_earlier_ask => None,
        (Selection::One(selected), Some(report)) => {
            let desired = driver_condition(report, selected.spec.driver(), load, now);
            let condition = condition_to_apply(node, desired);
            (on_node != Some(&condition)).then(|| StatusIntent {
                conditions: vec![condition],
            })
        }
        (Selection::None, _) => on_node.map(|_| StatusIntent::default()),
        _ => None,
    }
}

impl LoopState {
    /// Takes in that `labels` were applied as the driver-type labels.
    pub fn driver_labels_written(&mut self, labels: BTreeMap<String, String>) {
        self.driver_labels = Some(labels);
    }
}

/// Step 1 (see the module doc).
pub fn follow(state: &mut LoopState, selection: &Selection) -> Following {
    let now_following = match selection {
        Selection::One(selected) => format!("following DeviceConfig {}", selected.key),
        Selection::Conflict(keys) => format!(
            "DeviceConfigs {} all select this node; running only the metrics endpoint",
            keys.join(", ")
        ),
        Selection::None => {
            "no DeviceConfig selects this node; running only the metrics endpoint".into()
        }
    };
    let log = (state.followed.as_ref() != Some(&now_following)).then(|| {
        state.followed = Some(now_following.clone());
        now_following
    });
    let Selection::One(selected) = selection else {
        return Following {
            log,
            ..Following::default()
        };
    };
    let namespace = &selected.key.namespace;
    let spec = &selected.spec;
    Following {
        log,
        metrics_config: spec
            .metrics_exporter
            .config
            .name
            .clone()
            .map(|n| (namespace.clone(), n)),
        test_config: spec
            .test_runner
            .config
            .as_ref()
            .map(|c| (namespace.clone(), c.name.clone())),
        access: Some((namespace.clone(), spec.metrics_exporter.rbac_config.clone())),
        partition_config: spec.config_manager.is_enabled().then(|| {
            (
                namespace.clone(),
                spec.config_manager.config_map().to_owned(),
            )
        }),
    }
}

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
) -> Option<super::partition::Wanted> {
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
    Some(super::partition::Wanted { profiles })
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

/// What the agent's command line overrides in the services a DeviceConfig
/// asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Where the metrics endpoint listens, instead of `metricsExporter.port`.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the test tools are.
    pub test_commands: Option<crate::testrunner::Commands>,
    /// Where the DRA plugin writes CDI specs (`--cdi-dir`).
    pub cdi_dir: Option<std::path::PathBuf>,
    /// Whether the DRA plugin taints unhealthy devices (`--dra-device-taints`).
    pub dra_device_taints: bool,
}

/// Step 2: the services the selection asks for on this node (only the metrics
/// endpoint without exactly one DeviceConfig), with the overrides applied.
/// The metrics endpoint's `rbacConfig` material is the caller's to add: it
/// needs the API client that reviews tokens.
pub fn services(
    selection: &Selection,
    context: &NodeContext<'_>,
    overrides: &Overrides,
) -> DesiredServices {
    let mut desired = match selection {
        Selection::One(selected) => plan_services(&selected.spec, context),
        Selection::None | Selection::Conflict(_) => idle_services(context),
    };
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
        dra.device_taints = overrides.dra_device_taints;
    }
    desired
}

/// What step 3 looks at: the node as the services left it.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub selection: &'a Selection,
    /// The watched Node carries the status annotation.
    pub annotated: bool,
    pub plugin: &'a PluginStatus,
    /// Why the exporter rejected its config, if it did.
    pub metrics_config_error: Option<&'a str>,
    /// The values and keys of its config the exporter ignored.
    pub metrics_config_warnings: &'a [String],
    pub discovery: &'a DiscoveryProgress,
    /// What is wrong with the metrics endpoint's `rbacConfig`.
    pub access_problems: &'a [String],
    /// Node labels a person set that cannot be used (a bad sharing count).
    pub node_label_problems: &'a [String],
    /// Each service's state, as the annotation shows it.
    pub services: BTreeMap<ServiceName, ServiceStatus>,
    pub inventory: &'a Inventory,
    /// The driver and kernel the node runs, once read.
    pub driver: Option<&'a DriverReport>,
    /// What the driver manager did, when the DeviceConfig asks for a driver.
    pub driver_load: Option<&'a DriverLoad>,
    pub partition: Option<&'a crate::api::agent_status::PartitionReport>,
    /// The answer to the leader's last remediation validation request.
    pub remediation: Option<&'a crate::api::agent_status::RemediationTestReport>,
    /// What applying the services stopped.
    pub applied: Applied,
    /// The health monitor runs.
    pub health_running: bool,
    /// The Node's health is being published.
    pub publishing_health: bool,
    /// The followers that ended unasked, in words.
    pub followers_ended: &'a [String],
    /// The time now, for the status's `since`.
    pub now: String,
}

/// Whether the Node's health is published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HealthPublishing {
    /// As it is.
    #[default]
    Keep,
    /// The monitor runs: publish its condition, labels and Events.
    Start,
    /// No monitor, no verdict: stop publishing, then remove the condition and
    /// labels it wrote.
    StopAndClear,
}

/// A Warning Event to record on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub reason: &'static str,
    pub message: String,
}

/// The status annotation to write.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusUpdate {
    /// `None` removes the annotation.
    pub status: Option<AgentStatus>,
    /// False when there is nothing to do on the Node (removing an annotation
    /// it does not carry).
    pub write: bool,
}

/// Step 3: what to do once the services were applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The labeller was disabled or the node deselected: remove its labels.
    pub remove_labels: bool,
    pub health: HealthPublishing,
    /// New problems worth an Event, in the order found.
    pub warnings: Vec<Warning>,
    /// The status to publish, when it changed since the last write (or that
    /// write failed).
    pub status: Option<StatusUpdate>,
}

/// Step 3 (see the module doc).
pub fn report(state: &mut LoopState, observed: Observed<'_>) -> Report {
    let remove_labels = observed.applied.labeller_stopped;
    let health = if observed.applied.health_stopped {
        HealthPublishing::StopAndClear
    } else if observed.health_running && !observed.publishing_health {
        HealthPublishing::Start
    } else {
        HealthPublishing::Keep
    };
    let mut found = problems(
        observed.selection,
        observed.plugin,
        observed.metrics_config_error,
    );
    // While the node writes a partition profile, its GPUs pass through
    // mixed layouts on purpose: no Warning Event for each of them (the
    // status still says what the plugin sees).
    if let Some(partition) = observed
        .partition
        .filter(|p| p.state == crate::partition::state::State::Applying.as_str())
    {
        for problem in found
            .iter_mut()
            .filter(|p| p.event_reason == Some("PartitionLayoutConflict"))
        {
            problem.event_reason = None;
            problem.message = format!(
                "{} (while partition profile {} is being written)",
                problem.message, partition.profile
            );
        }
    }
    found.extend(config_warnings_problem(observed.metrics_config_warnings));
    found.extend(discovery_problem(observed.discovery));
    found.extend(observed.access_problems.iter().map(|message| Problem {
        event_reason: Some("MetricsAccessProblem"),
        message: format!("metrics endpoint: {message}"),
    }));
    found.extend(observed.node_label_problems.iter().map(|message| Problem {
        event_reason: Some("InvalidNodeLabel"),
        message: message.clone(),
    }));
    found.extend(observed.followers_ended.iter().map(|message| Problem {
        event_reason: Some("FollowerEnded"),
        message: message.clone(),
    }));
    let warnings = found
        .iter()
        .filter_map(|problem| {
            let reason = problem.event_reason?;
            state
                .reported
                .insert(problem.message.clone())
                .then(|| Warning {
                    reason,
                    message: problem.message.clone(),
                })
        })
        .collect();
    state
        .reported
        .retain(|p| found.iter().any(|q| &q.message == p));
    let problems: Vec<String> = found.into_iter().map(|p| p.message).collect();
    // The status annotation exists while a DeviceConfig selects the node (or
    // several do, which needs a person); with none, the agent removes it, and
    // the leader reads its absence as torn down.
    let status = match observed.selection {
        Selection::None => None,
        selection => Some(AgentStatus {
            driver_load: observed.driver_load.cloned(),
            partition: observed.partition.cloned(),
            remediation: observed.remediation.cloned(),
            ..build_status(
                selection,
                observed.services,
                observed.plugin,
                observed.inventory,
                observed.driver,
                problems,
                observed.now,
            )
        }),
    };
    let changed = match (&status, &state.last_status) {
        (Some(now), Some(Some(last))) => now.differs_from(last),
        (None, Some(None)) => false,
        _ => true,
    };
    let status = changed.then(|| StatusUpdate {
        write: status.is_some() || observed.annotated,
        status,
    });
    Report {
        remove_labels,
        health,
        warnings,
        status,
    }
}

/// Something on this node that needs a person's attention.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Problem {
    /// The Reason of the Warning Event it is worth, if any.
    event_reason: Option<&'static str>,
    message: String,
}

/// What needs a person's attention on this node. Conflicts and a rejected
/// metrics config are worth an Event; device plugin errors (a failed
/// registration, say) often clear on their own as the plugin retries, so they
/// show in the status annotation only.
fn problems(
    selection: &Selection,
    plugin: &PluginStatus,
    metrics_config_error: Option<&str>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Selection::Conflict(keys) = selection {
        problems.push(Problem {
            event_reason: Some("ConflictingDeviceConfigs"),
            message: format!(
                "DeviceConfigs {} all select this node; nothing runs until exactly one does",
                keys.join(", ")
            ),
        });
    }
    let conflict = plugin.conflict.as_ref().map(ToString::to_string);
    if let Some(conflict) = &conflict {
        problems.push(Problem {
            event_reason: Some("PartitionLayoutConflict"),
            message: conflict.clone(),
        });
    }
    if let Some(error) = &plugin.error
        && Some(error) != conflict.as_ref()
    {
        problems.push(Problem {
            event_reason: None,
            message: format!("device plugin: {error}"),
        });
    }
    if let Some(error) = metrics_config_error {
        problems.push(Problem {
            event_reason: Some("MetricsConfigError"),
            message: format!("metrics config rejected, the last good one stays in force: {error}"),
        });
    }
    problems
}

/// How many of the exporter's config warnings a problem names; the rest are
/// counted (each is in the agent's log). A reference config lists metrics
/// this implementation lacks, one warning each, and the status annotation
/// and Events must stay short.
const WARNINGS_NAMED: usize = 3;

/// The values and keys the exporter ignored, as one problem (one Event
/// while the set stays the same).
fn config_warnings_problem(warnings: &[String]) -> Option<Problem> {
    let (named, rest) = warnings.split_at(warnings.len().min(WARNINGS_NAMED));
    let first = named.first()?;
    let mut message = format!(
        "metrics config: {} ignored: {first}",
        if warnings.len() == 1 {
            "1 value".to_owned()
        } else {
            format!("{} values", warnings.len())
        }
    );
    for warning in &named[1..] {
        message.push_str("; ");
        message.push_str(warning);
    }
    if !rest.is_empty() {
        message.push_str(&format!("; and {} more (see the agent log)", rest.len()));
    }
    Some(Problem {
        event_reason: Some("MetricsConfigWarning"),
        message,
    })
}

/// What the discovery watch's progress means for the node: not discovered
/// yet (only the metrics endpoint runs), or the latest scan was not trusted
/// and the last inventory stays (a warning Event, once per reason).
fn discovery_problem(progress: &DiscoveryProgress) -> Option<Problem> {
    match (progress.discovered, &progress.last_incomplete) {
        (false, reason) => Some(Problem {
            event_reason: reason.as_ref().map(|_| "DiscoveryIncomplete"),
            message: match reason {
                Some(reason) => format!(
                    "GPU discovery has not completed yet; only the metrics endpoint runs: {reason}"
                ),
                None => {
                    "GPU discovery has not completed yet; only the metrics endpoint runs".into()
                }
            },
        }),
        (true, Some(reason)) => Some(Problem {
            event_reason: Some("DiscoveryIncomplete"),
            message: format!("GPU discovery incomplete, the last inventory stays in use: {reason}"),
        }),
        (true, None) => None,
    }
}

fn build_status(
    selection: &Selection,
    services: BTreeMap<ServiceName, ServiceStatus>,
    plugin_status: &PluginStatus,
    inventory: &Inventory,
    driver: Option<&DriverReport>,
    problems: Vec<String>,
    since: String,
) -> AgentStatus {
    let (device_config, uid, generation) = match selection {
        Selection::One(s) => (Some(s.key.clone()), s.uid.clone(), s.generation),
        _ => (None, None, None),
    };
    // The leader's per-layout DeviceClasses serve these through DRA.
    let layouts = if services.contains_key(&ServiceName::DraDriver) {
        crate::plugin::layouts_of(inventory)
    } else {
        Vec::new()
    };
    AgentStatus {
        v: STATUS_VERSION,
        device_config,
        uid,
        generation,
        services,
        resources: plugin_status
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.devices))
            .collect(),
        layouts,
        gpus: inventory.gpus.len(),
        driver_version: inventory.driver.version.clone(),
        driver: driver.cloned(),
        driver_load: None,
        partition: None,
        remediation: None,
        problems,
        since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceConfigSpec;
    use crate::api::agent_status::ConfigKey;
    use crate::plugin::LayoutConflict;

    #[test]
    fn discovery_problems_say_what_runs_and_warn_once_per_reason() {
        let whole = DiscoveryProgress {
            discovered: true,
            last_incomplete: None,
        };
        assert_eq!(discovery_problem(&whole), None);

        let starting = DiscoveryProgress::default();
        let problem = discovery_problem(&starting).expect("not discovered is a problem");
        assert_eq!(
            problem.event_reason, None,
            "a normal start is not worth an Event"
        );
        assert!(problem.message.contains("only the metrics endpoint runs"));

        let stuck = DiscoveryProgress {
            discovered: false,
            last_incomplete: Some("discovery missed its 5s deadline".into()),
        };
        let problem = discovery_problem(&stuck).expect("a stuck first scan");
        assert_eq!(problem.event_reason, Some("DiscoveryIncomplete"));
        assert!(
            problem
                .message
                .ends_with("discovery missed its 5s deadline")
        );

        let later = DiscoveryProgress {
            discovered: true,
            ..stuck
        };
        let problem = discovery_problem(&later).expect("an untrusted later scan");
        assert_eq!(problem.event_reason, Some("DiscoveryIncomplete"));
        assert!(problem.message.contains("the last inventory stays in use"));
    }

    #[test]
    fn conflicts_are_worth_events_plugin_errors_only_status() {
        let conflict = Selection::Conflict(vec!["ns/a".into(), "ns/b".into()]);
        let found = problems(&conflict, &PluginStatus::default(), None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].event_reason, Some("ConflictingDeviceConfigs"));
        assert!(found[0].message.contains("ns/a, ns/b"));

        let failing = PluginStatus {
            error: Some("registering amd.com/gpu: kubelet.sock refused".into()),
            ..PluginStatus::default()
        };
        let found = problems(&Selection::None, &failing, None);
        assert_eq!(
            found,
            [Problem {
                event_reason: None,
                message: "device plugin: registering amd.com/gpu: kubelet.sock refused".into()
            }]
        );

        // A layout conflict is also the plugin's error line: reported once.
        let layout = LayoutConflict {
            profiles: [
                ("cpx_nps4".to_owned(), vec!["0000:05:00.0".to_owned()]),
                ("spx_nps1".to_owned(), vec!["0000:27:00.0".to_owned()]),
            ]
            .into(),
        };
        let with_layout = PluginStatus {
            error: Some(layout.to_string()),
            conflict: Some(layout),
            ..PluginStatus::default()
        };
        let found = problems(&Selection::None, &with_layout, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].event_reason, Some("PartitionLayoutConflict"));

        let found = problems(
            &Selection::None,
            &PluginStatus::default(),
            Some("line 1: bad"),
        );
        assert_eq!(found[0].event_reason, Some("MetricsConfigError"));
        assert!(found[0].message.ends_with("line 1: bad"));
    }

    #[test]
    fn driver_load_events_mark_refusals_once_and_a_load_that_took() {
        let load = |state, reason: &str| DriverLoad {
            state,
            reason: reason.into(),
            message: format!("{reason} message"),
            bundle: None,
            version: None,
            asked: None,
            told_at: None,
        };
        let mut state = LoopState::default();
        let refused = load(DriverLoadState::Refused, "ChecksumMismatch");
        let event = driver_load_event(&mut state, Some(&refused)).unwrap();
        assert_eq!(
            (event.0, event.2.as_str(), event.3.as_str()),
            (
                EventType::Warning,
                "ChecksumMismatch",
                "ChecksumMismatch message"
            )
        );
        // The same refusal again (a recheck) is not a second Event.
        assert_eq!(driver_load_event(&mut state, Some(&refused)), None);
        let unsigned = load(DriverLoadState::Refused, "UnsignedModule");
        assert!(driver_load_event(&mut state, Some(&unsigned)).is_some());
        let loading = load(DriverLoadState::Loading, "DriverLoading");
        assert_eq!(driver_load_event(&mut state, Some(&loading)), None);
        let loaded = load(DriverLoadState::Loaded, "DriverLoaded");
        let event = driver_load_event(&mut state, Some(&loaded)).unwrap();
        assert_eq!(
            (event.0, event.2.as_str()),
            (EventType::Normal, "DriverLoaded")
        );
        // Found running, not loaded by us: no Event.
        let mut fresh = LoopState::default();
        let running = load(DriverLoadState::Loaded, "DriverRunning");
        assert_eq!(driver_load_event(&mut fresh, Some(&running)), None);
        // A failure retried at each recheck (loading, failed, ...) is one Event.
        let failed = load(DriverLoadState::Failed, "ModprobeFailed");
        assert!(driver_load_event(&mut fresh, Some(&failed)).is_some());
        assert_eq!(driver_load_event(&mut fresh, Some(&loading)), None);
        assert_eq!(driver_load_event(&mut fresh, Some(&failed)), None);
        assert_eq!(driver_load_event(&mut fresh, None), None);
    }

    #[test]
    fn the_driver_condition_is_written_once_kept_while_true_and_removed_when_deselected() {
        use crate::api::agent_status::ModuleOrigin;
        use k8s_openapi::api::core::v1::{Node, NodeStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let report = DriverReport {
            loaded: true,
            origin: ModuleOrigin::InTree,
            kernel_release: Some("6.8.0".into()),
            ..DriverReport::default()
        };
        let selection = one("ns", "gpus", DeviceConfigSpec::default());
        let mut node = Node::default();
        // Nothing until the report is read.
        assert_eq!(
            driver_condition_intent(&selection, None, None, None, &node, &now),
            None
        );
        let intent = driver_condition_intent(&selection, Some(&report), None, None, &node, &now)
            .expect("a first condition");
        assert_eq!(intent.conditions[0].type_, CONDITION_TYPE);
        assert_eq!(intent.conditions[0].status, "True");
        node.status = Some(NodeStatus {
            conditions: Some(intent.conditions.clone()),
            ..NodeStatus::default()
        });
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
        assert_eq!(
            driver_condition_intent(&selection, Some(&report), None, None, &node, &later),
            None,
            "the Node says it already: no write for a heartbeat"
        );
        let unloaded = DriverReport {
            loaded: false,
            origin: ModuleOrigin::NotLoaded,
            ..report.clone()
        };
        let intent =
            driver_condition_intent(&selection, Some(&unloaded), None, None, &node, &later)
                .unwrap();
        assert_eq!(intent.conditions[0].status, "False");
        assert_eq!(
            driver_condition_intent(&Selection::None, Some(&report), None, None, &node, &later),
            Some(StatusIntent::default()),
            "deselected: removed"
        );
        let conflict = Selection::Conflict(vec!["a/x".into(), "b/y".into()]);
        assert_eq!(
            driver_condition_intent(&conflict, Some(&unloaded), None, None, &node, &later),
            None
        );
        assert_eq!(
            driver_condition_intent(&Selection::None, None, None, None, &Node::default(), &later),
            None
        );
    }

    #[test]
    fn a_new_driver_version_is_not_judged_by_the_answer_to_the_old_one() {
        use crate::api::agent_status::ModuleOrigin;
        use crate::api::{DriverSpec, DriverUpgradePolicySpec};
        use k8s_openapi::api::core::v1::{Node, NodeStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
        let report = DriverReport {
            loaded: true,
            origin: ModuleOrigin::OutOfTree,
            version: Some("6.12.12".into()),
            kernel_release: Some("6.8.0".into()),
            ..DriverReport::default()
        };
        let spec_of = |version: &str| {
            let driver = DriverSpec {
                enable: true,
                version: Some(version.into()),
                upgrade_policy: Some(DriverUpgradePolicySpec {
                    enable: Some(true),
                    ..DriverUpgradePolicySpec::default()
                }),
                ..DriverSpec::default()
            };
            DeviceConfigSpec {
                driver: Some(driver),
                ..DeviceConfigSpec::default()
            }
        };
        let key = ConfigKey {
            namespace: "ns".into(),
            name: "gpus".into(),
        };
        let wanted_of = |spec: &DeviceConfigSpec| DriverWanted::for_node(spec.driver(), &key, None);
        let old = spec_of("6.12.12");
        let running = DriverLoad {
            state: DriverLoadState::Loaded,
            reason: crate::driver::manager::RUNNING.into(),
            message: "amdgpu 6.12.12 runs".into(),
            bundle: None,
            version: Some("6.12.12".into()),
            asked: Some("6.12.12".into()),
            told_at: None,
        };
        let intent = driver_condition_intent(
            &one("ns", "gpus", old.clone()),
            Some(&report),
            Some(&running),
            wanted_of(&old).as_ref(),
            &Node::default(),
            &now,
        )
        .expect("the first condition");
        assert_eq!(intent.conditions[0].status, "True");
        let node = Node {
            status: Some(NodeStatus {
                conditions: Some(intent.conditions.clone()),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        // driver.version moves on: until the manager answers the new ask,
        // the Node keeps what it says (no DriverVersionMismatch blip).
        let new = spec_of("6.14.1");
        assert_eq!(
            driver_condition_intent(
                &one("ns", "gpus", new.clone()),
                Some(&report),
                Some(&running),
                wanted_of(&new).as_ref(),
                &node,
                &now,
            ),
            None
        );
        // The manager's answer to the new ask: the upgrade is pending.
        let pending = DriverLoad {
            reason: crate::driver::condition::UPGRADE_PENDING.into(),
            asked: Some("6.14.1".into()),
            ..running.clone()
        };
        let intent = driver_condition_intent(
            &one("ns", "gpus", new.clone()),
            Some(&report),
            Some(&pending),
            wanted_of(&new).as_ref(),
            &node,
            &now,
        )
        .expect("the answer to the new ask");
        assert_eq!(
            (
                intent.conditions[0].status.as_str(),
                intent.conditions[0].reason.as_deref()
            ),
            ("True", Some("UpgradePending"))
        );
    }

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

    fn one(namespace: &str, name: &str, spec: DeviceConfigSpec) -> Selection {
        Selection::One(Box::new(super::super::select::Selected {
            key: ConfigKey {
                namespace: namespace.into(),
                name: name.into(),
            },
            uid: Some("uid-1".into()),
            generation: Some(4),
            spec,
        }))
    }

    #[test]
    fn what_is_followed_is_logged_once_and_watched_in_the_configs_namespace() {
        let mut spec = DeviceConfigSpec::default();
        spec.metrics_exporter.config.name = Some("metrics-cm".into());
        let selected = one("kube-amd-gpu", "gpus", spec);
        let conflict = Selection::Conflict(vec!["ns/a".into(), "ns/b".into()]);
        // (selection, line logged, metrics ConfigMap, test ConfigMap, access followed)
        type Row<'a> = (
            &'a Selection,
            Option<&'a str>,
            Option<(&'a str, &'a str)>,
            bool,
        );
        let table: &[Row] = &[
            (
                &selected,
                Some("following DeviceConfig kube-amd-gpu/gpus"),
                Some(("kube-amd-gpu", "metrics-cm")),
                true,
            ),
            // The same again: nothing new to log, the same to follow.
            (&selected, None, Some(("kube-amd-gpu", "metrics-cm")), true),
            (
                &conflict,
                Some(
                    "DeviceConfigs ns/a, ns/b all select this node; running only the metrics endpoint",
                ),
                None,
                false,
            ),
            (
                &Selection::None,
                Some("no DeviceConfig selects this node; running only the metrics endpoint"),
                None,
                false,
            ),
            (&Selection::None, None, None, false),
        ];
        let mut state = LoopState::default();
        for (i, (selection, log, metrics, access)) in table.iter().enumerate() {
            let following = follow(&mut state, selection);
            assert_eq!(following.log.as_deref(), *log, "row {i}");
            assert_eq!(
                following.metrics_config,
                metrics.map(|(ns, n)| (ns.to_owned(), n.to_owned())),
                "row {i}"
            );
            assert_eq!(following.test_config, None, "row {i}");
            assert_eq!(
                following.access.as_ref().map(|(ns, _)| ns.as_str()),
                access.then_some("kube-amd-gpu"),
                "row {i}"
            );
        }
    }

    #[test]
    fn the_command_line_overrides_the_metrics_address_and_the_test_tools() {
        let host = crate::host::HostRoot::new("/h");
        let sampling = super::super::select::Sampling::default();
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

    /// The reference's CRD has no default on `driver` or `devicePlugin`, and
    /// its code reads an absent section's switches as off: DeviceConfigs in
    /// the shapes of its examples that leave `devicePlugin` out run no device
    /// plugin and no labeller, here too. (YAML written by us, in those shapes.)
    #[test]
    fn an_absent_device_plugin_or_driver_section_runs_nothing_of_it() {
        let host = crate::host::HostRoot::new("/h");
        let sampling = super::super::select::Sampling::default();
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
            let written = driver_labels(&LoopState::default(), &selection, &BTreeMap::new());
            assert_eq!(
                written.is_some_and(|labels| !labels.is_empty()),
                *driver_label,
                "{yaml}"
            );
        }
    }

    #[test]
    fn the_driver_type_label_follows_the_selected_config() {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = true;
        let one = one("kube-amd-gpu", "gpus", spec);
        let key = "gpu.operator.amd.com/kube-amd-gpu.gpus.driver";
        let no_labels = BTreeMap::new();
        let mut state = LoopState::default();
        assert_eq!(
            driver_labels(&state, &Selection::None, &no_labels),
            None,
            "nothing selects a clean node: no write at start"
        );
        let wanted = driver_labels(&state, &one, &no_labels).expect("a first write");
        assert_eq!(wanted, [(key.to_owned(), "container".to_owned())].into());
        state.driver_labels_written(wanted.clone());
        assert_eq!(driver_labels(&state, &one, &wanted), None, "unchanged");
        assert_eq!(
            driver_labels(&state, &Selection::Conflict(vec!["a".into()]), &wanted),
            None
        );
        assert_eq!(
            driver_labels(&state, &Selection::None, &wanted),
            Some(BTreeMap::new()),
            "deselected: removed"
        );
        let restarted = LoopState::default();
        assert_eq!(
            driver_labels(&restarted, &Selection::None, &wanted),
            Some(BTreeMap::new()),
            "a restarted agent removes a label it finds"
        );
    }

    #[test]
    fn config_warnings_are_one_short_problem() {
        let warnings = |n: usize| -> Vec<String> { (1..=n).map(|i| format!("w{i}")).collect() };
        assert_eq!(config_warnings_problem(&[]), None);
        let message = |n| config_warnings_problem(&warnings(n)).map(|p| p.message);
        assert_eq!(
            message(1).as_deref(),
            Some("metrics config: 1 value ignored: w1")
        );
        assert_eq!(
            message(3).as_deref(),
            Some("metrics config: 3 values ignored: w1; w2; w3")
        );
        assert_eq!(
            message(150).as_deref(),
            Some(
                "metrics config: 150 values ignored: w1; w2; w3; and 147 more (see the agent log)"
            )
        );
    }

    /// One pass's observations, with a discovered host and nothing wrong.
    struct Pass {
        selection: Selection,
        annotated: bool,
        plugin: PluginStatus,
        metrics_config_error: Option<&'static str>,
        metrics_config_warnings: Vec<String>,
        discovery: DiscoveryProgress,
        access_problems: Vec<String>,
        partition: Option<crate::api::agent_status::PartitionReport>,
        applied: Applied,
        health_running: bool,
        publishing_health: bool,
    }

    impl Pass {
        fn new(selection: Selection) -> Self {
            Self {
                selection,
                annotated: false,
                plugin: PluginStatus::default(),
                metrics_config_error: None,
                metrics_config_warnings: Vec::new(),
                discovery: DiscoveryProgress {
                    discovered: true,
                    last_incomplete: None,
                },
                access_problems: Vec::new(),
                partition: None,
                applied: Applied::default(),
                health_running: false,
                publishing_health: false,
            }
        }

        fn report(&self, state: &mut LoopState, now: &str) -> Report {
            let inventory = Inventory::default();
            report(
                state,
                Observed {
                    selection: &self.selection,
                    annotated: self.annotated,
                    plugin: &self.plugin,
                    metrics_config_error: self.metrics_config_error,
                    metrics_config_warnings: &self.metrics_config_warnings,
                    discovery: &self.discovery,
                    access_problems: &self.access_problems,
                    node_label_problems: &[],
                    services: [(ServiceName::MetricsExporter, ServiceStatus::Running)].into(),
                    inventory: &inventory,
                    driver: None,
                    driver_load: None,
                    partition: self.partition.as_ref(),
                    remediation: None,
                    applied: self.applied,
                    health_running: self.health_running,
                    publishing_health: self.publishing_health,
                    followers_ended: &[],
                    now: now.into(),
                },
            )
        }
    }

    #[test]
    fn mixed_layouts_while_the_node_writes_a_profile_are_no_warning() {
        let layout = LayoutConflict {
            profiles: [
                ("cpx_nps4".to_owned(), vec!["0000:05:00.0".to_owned()]),
                ("spx_nps1".to_owned(), vec!["0000:27:00.0".to_owned()]),
            ]
            .into(),
        };
        let mut pass = Pass::new(one("ns", "a", DeviceConfigSpec::default()));
        pass.plugin = PluginStatus {
            error: Some(layout.to_string()),
            conflict: Some(layout),
            ..PluginStatus::default()
        };
        pass.partition = Some(crate::api::agent_status::PartitionReport {
            profile: "cpx_nps4_all".into(),
            state: "applying".into(),
            reason: None,
        });
        let mut state = LoopState::default();
        let report = pass.report(&mut state, "t1");
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        let said = report
            .status
            .and_then(|s| s.status)
            .map(|s| s.problems)
            .unwrap_or_default();
        assert!(
            said.iter()
                .any(|p| p.contains("while partition profile cpx_nps4_all is being written")),
            "{said:?}"
        );
        // The same layout once the change is over: a Warning.
        pass.partition = None;
        let report = pass.report(&mut state, "t2");
        assert_eq!(
            report.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(),
            ["PartitionLayoutConflict"]
        );
    }

    /// Each row is one pass on the same state: what it saw, and which Events,
    /// status write and health publishing it decided.
    #[test]
    fn each_problem_is_recorded_once_while_it_lasts_and_the_status_only_when_it_changes() {
        let conflict = || Selection::Conflict(vec!["ns/a".into(), "ns/b".into()]);
        let selected = || one("ns", "a", DeviceConfigSpec::default());
        let with = |selection: Selection, change: &dyn Fn(&mut Pass)| {
            let mut pass = Pass::new(selection);
            change(&mut pass);
            pass
        };
        // (what the pass saw, Event reasons, status written: None = no write,
        // Some(true) = an annotation, Some(false) = its removal; the write
        // succeeds)
        let table: Vec<(&str, Pass, Vec<&str>, Option<bool>)> = vec![
            (
                "nothing selects an unannotated node: nothing to remove",
                Pass::new(Selection::None),
                vec![],
                None,
            ),
            (
                "a conflict: one Event and the status",
                Pass::new(conflict()),
                vec!["ConflictingDeviceConfigs"],
                Some(true),
            ),
            (
                "the same conflict later: no new Event, the same status",
                Pass::new(conflict()),
                vec![],
                None,
            ),
            (
                "selected, with a rejected metrics config",
                with(selected(), &|p| p.metrics_config_error = Some("line 1")),
                vec!["MetricsConfigError"],
                Some(true),
            ),
            (
                "a plugin error shows in the status only",
                with(selected(), &|p| {
                    p.metrics_config_error = Some("line 1");
                    p.plugin.error = Some("kubelet.sock refused".into());
                }),
                vec![],
                Some(true),
            ),
            (
                "the config error cleared",
                Pass::new(selected()),
                vec![],
                Some(true),
            ),
            (
                "the conflict back: an Event again",
                Pass::new(conflict()),
                vec!["ConflictingDeviceConfigs"],
                Some(true),
            ),
            (
                "ignored config values: one Event for them all",
                with(selected(), &|p| {
                    p.metrics_config_warnings = vec![
                        "GPUConfig.Fields[2]: not a field; ignored".into(),
                        "Bogus: unknown key; ignored".into(),
                    ];
                }),
                vec!["MetricsConfigWarning"],
                Some(true),
            ),
            (
                "access problems and an untrusted scan, each an Event",
                with(selected(), &|p| {
                    p.access_problems = vec!["Secret s does not exist".into()];
                    p.discovery.last_incomplete = Some("deadline".into());
                }),
                vec!["DiscoveryIncomplete", "MetricsAccessProblem"],
                Some(true),
            ),
            (
                "deselected: the annotation is removed",
                with(Selection::None, &|p| p.annotated = true),
                vec![],
                Some(false),
            ),
            (
                "removed already",
                with(Selection::None, &|p| p.annotated = true),
                vec![],
                None,
            ),
        ];
        let mut state = LoopState::default();
        for (i, (what, pass, reasons, written)) in table.into_iter().enumerate() {
            let report = pass.report(&mut state, &format!("t{i}"));
            let got: Vec<&str> = report.warnings.iter().map(|w| w.reason).collect();
            assert_eq!(got, reasons, "{what}");
            let write = report
                .status
                .as_ref()
                .filter(|u| u.write)
                .map(|u| u.status.is_some());
            assert_eq!(write, written, "{what}");
            assert_eq!(report.health, HealthPublishing::Keep, "{what}");
            if let Some(update) = report.status {
                if let Some(status) = &update.status {
                    assert_eq!(status.since, format!("t{i}"), "{what}");
                    assert_eq!(
                        status.device_config.is_some(),
                        matches!(pass.selection, Selection::One(_)),
                        "{what}"
                    );
                }
                state.status_written(update, true);
            }
        }
    }

    #[test]
    fn a_failed_status_write_is_retried_until_it_succeeds() {
        let pass = Pass::new(one("ns", "a", DeviceConfigSpec::default()));
        let mut state = LoopState::default();
        let update = pass
            .report(&mut state, "t0")
            .status
            .expect("a first status");
        state.status_written(update, false);
        assert!(state.status_write_failed());
        // Unchanged, but not written yet: written again.
        let update = pass.report(&mut state, "t1").status.expect("the retry");
        assert_eq!(update.status.as_ref().map(|s| s.since.as_str()), Some("t1"));
        state.status_written(update, true);
        assert!(!state.status_write_failed());
        // Only `since` differs: nothing to write.
        assert_eq!(pass.report(&mut state, "t2").status, None);
    }

    #[test]
    fn labels_and_health_follow_what_applying_the_services_stopped() {
        let selected = one("ns", "a", DeviceConfigSpec::default());
        // (applied, monitor runs, publishing, remove labels, health)
        let table = [
            (
                Applied::default(),
                false,
                false,
                false,
                HealthPublishing::Keep,
            ),
            (
                Applied::default(),
                true,
                false,
                false,
                HealthPublishing::Start,
            ),
            (
                Applied::default(),
                true,
                true,
                false,
                HealthPublishing::Keep,
            ),
            (
                Applied {
                    labeller_stopped: true,
                    health_stopped: false,
                },
                true,
                true,
                true,
                HealthPublishing::Keep,
            ),
            (
                Applied {
                    labeller_stopped: true,
                    health_stopped: true,
                },
                false,
                true,
                true,
                HealthPublishing::StopAndClear,
            ),
        ];
        for (i, (applied, running, publishing, remove, health)) in table.into_iter().enumerate() {
            let mut pass = Pass::new(selected.clone());
            pass.applied = applied;
            pass.health_running = running;
            pass.publishing_health = publishing;
            let report = pass.report(&mut LoopState::default(), "t");
            assert_eq!(report.remove_labels, remove, "row {i}");
            assert_eq!(report.health, health, "row {i}");
        }
    }
}
