//! Step 3 of a pass ([`report`]): once the services were applied, whether
//! to remove the GPU labels, start or stop publishing health on the Node,
//! which Warning Events to record and which status annotation to write.
//! Pure: it must not write the Node nor record the Events itself.

use std::collections::BTreeMap;

use super::super::node_services::{Applied, DiscoveryProgress};
use super::super::select::Selection;
use super::LoopState;
use crate::api::agent_status::{
    AgentStatus, DriverLoad, DriverReport, STATUS_VERSION, ServiceName, ServiceStatus,
};
use crate::device::Inventory;
use crate::plugin::PluginStatus;

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
    /// The DRA plugin offers every layout of its GPUs
    /// (`draDriver.autoPartition` on this node).
    pub auto_partition: bool,
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
            layouts: if observed.services.contains_key(&ServiceName::DraDriver) {
                dra_layouts(observed.inventory, observed.auto_partition)
            } else {
                Vec::new()
            },
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

/// The layouts a DRA node reports, for the leader's per-layout
/// DeviceClasses to serve: those its GPUs are in, and with
/// `draDriver.autoPartition` every layout its GPUs offer (the plugin
/// publishes a device for each, and Prepare puts the GPU in it). Sorted,
/// each once.
fn dra_layouts(inventory: &Inventory, auto_partition: bool) -> Vec<String> {
    let mut layouts = crate::plugin::layouts_of(inventory);
    if auto_partition {
        layouts.extend(crate::dra::layouts::offered_profiles(inventory));
        layouts.sort();
        layouts.dedup();
    }
    layouts
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
        layouts: Vec::new(),
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
    use crate::agent::plan::one;
    use crate::api::DeviceConfigSpec;
    use crate::plugin::LayoutConflict;

    /// The leader's per-layout classes come from these: an autoPartition
    /// node reports every layout its partitionable GPUs offer, beside the
    /// one they are in; otherwise only the one they are in.
    #[test]
    fn an_auto_partition_node_reports_the_layouts_its_gpus_offer() {
        let gpu = crate::device::Gpu {
            bdf: "0000:05:00.0".into(),
            compute_partition: Some("SPX".into()),
            memory_partition: Some("NPS1".into()),
            available_compute_partitions: ["SPX", "CPX"].map(String::from).to_vec(),
            available_memory_partitions: ["NPS1", "NPS4"].map(String::from).to_vec(),
            ..crate::device::Gpu::default()
        };
        let inventory = Inventory {
            gpus: vec![gpu],
            ..Inventory::default()
        };
        assert_eq!(dra_layouts(&inventory, false), ["spx_nps1"]);
        assert_eq!(
            dra_layouts(&inventory, true),
            ["cpx_nps1", "cpx_nps4", "spx_nps1"]
        );
    }

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
                    auto_partition: false,
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
