//! The node's driver as the agent shows it on the Node: the Event for what
//! the driver manager did ([`driver_load_event`]), the driver-type labels
//! ([`driver_labels`]) and the `AMDGPUDriverReady` condition
//! ([`driver_condition_intent`]). Pure: it must not do I/O, nor decide what
//! the driver manager does (that is `crate::driver::manager`'s).

use std::collections::BTreeMap;

use super::super::select::Selection;
use super::LoopState;
use crate::api::agent_status::{DriverLoad, DriverLoadState, DriverReport};
use crate::driver::condition::{CONDITION_TYPE, driver_condition};
use crate::driver::manager::DriverWanted;
use crate::events::EventType;
use crate::node_writer::{StatusIntent, condition_to_apply, find_condition};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::plan::one;
    use crate::api::DeviceConfigSpec;
    use crate::api::agent_status::ConfigKey;

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
}
