//! The tests of the node's driver decision ([`super`]).

use super::*;

#[test]
fn decisions_without_a_command_have_their_outcome_and_a_load_has_none() {
    let refuse = LoadDecision::Refuse {
        reason: "ChecksumMismatch",
        message: "lib/modules/x/amdgpu.ko: sha256 differs".into(),
    };
    let outcome = outcome_of(&refuse).unwrap();
    assert_eq!(
        (outcome.state, outcome.reason.as_str()),
        (DriverLoadState::Refused, "ChecksumMismatch")
    );
    assert!(outcome.message.contains("sha256 differs"));
    let nothing = outcome_of(&LoadDecision::Nothing {
        version: "6.12.12".into(),
    })
    .unwrap();
    assert_eq!(nothing.state, DriverLoadState::Loaded);
    let replace = outcome_of(&LoadDecision::ReplaceNeeded {
        loaded: crate::api::agent_status::ModuleOrigin::InTree,
        version: None,
        why: "the in-box amdgpu is loaded".into(),
    })
    .unwrap();
    assert_eq!(
        (replace.state, replace.reason.as_str()),
        (DriverLoadState::ReplaceNeeded, "DriverReplaceNeeded")
    );
}

#[test]
fn a_report_alone_wakes_no_retry_of_a_failure_and_no_second_load() {
    let report = |version: &str| DriverReport {
        loaded: true,
        version: Some(version.into()),
        ..DriverReport::default()
    };
    let outcome = |state| DriverLoad {
        state,
        reason: "r".into(),
        message: "m".into(),
        bundle: None,
        version: None,
        asked: None,
        told_at: None,
    };
    let old = report("6.12.12");
    assert!(acts_on_report(None, None, &old));
    assert!(acts_on_report(
        Some(&outcome(DriverLoadState::Refused)),
        None,
        &old
    ));
    // A failed load waits for its recheck.
    assert!(!acts_on_report(
        Some(&outcome(DriverLoadState::Failed)),
        None,
        &old
    ));
    // Just loaded 6.14.1: a report still saying 6.12.12 was read before.
    let loaded = outcome(DriverLoadState::Loaded);
    assert!(!acts_on_report(Some(&loaded), Some("6.14.1"), &old));
    assert!(acts_on_report(
        Some(&loaded),
        Some("6.14.1"),
        &report("6.14.1")
    ));
}

#[test]
fn a_new_ask_does_not_load_again_while_the_report_lags_behind_the_load() {
    let not_loaded = DriverReport {
        loaded: false,
        boot_id: Some("boot-2".into()),
        ..DriverReport::default()
    };
    let loaded = DriverLoad {
        state: DriverLoadState::Loaded,
        reason: LOADED_HERE.into(),
        message: "loaded".into(),
        bundle: None,
        version: Some("6.14.1".into()),
        asked: Some("6.14.1".into()),
        told_at: Some("t1".into()),
    };
    let asked = |version: Option<&str>, told_at: &str| DriverWanted {
        driver_type: DriverType::Container,
        version: version.map(str::to_owned),
        blacklist: None,
        module: KernelModuleConfigSpec::default(),
        replace: true,
        reboot_from: None,
        told_at: Some(told_at.into()),
    };
    let changed = Trigger {
        asked_changed: true,
        recheck_due: false,
    };
    // The leader rewrote the record after the reboot: same version.
    assert!(!looks_again(
        changed,
        Some(&loaded),
        Some("6.14.1"),
        &asked(Some("6.14.1"), "t2"),
        &not_loaded
    ));
    // Any bundle asked for: the one just loaded is it.
    assert!(!looks_again(
        changed,
        Some(&loaded),
        Some("6.14.1"),
        &asked(None, "t2"),
        &not_loaded
    ));
    // Another version asked for: look again.
    assert!(looks_again(
        changed,
        Some(&loaded),
        Some("6.14.1"),
        &asked(Some("6.15.0"), "t2"),
        &not_loaded
    ));
    // A reboot asked for from this boot: look again.
    let mut reboot = asked(Some("6.14.1"), "t2");
    reboot.reboot_from = Some("boot-2".into());
    assert!(looks_again(
        changed,
        Some(&loaded),
        Some("6.14.1"),
        &reboot,
        &not_loaded
    ));
    // The recheck looks again even so: a report that never shows the
    // load is not waited for forever.
    assert!(looks_again(
        Trigger {
            asked_changed: false,
            recheck_due: true
        },
        Some(&loaded),
        Some("6.14.1"),
        &asked(Some("6.14.1"), "t1"),
        &not_loaded
    ));
    // Nothing loaded here: a new ask is looked at.
    assert!(looks_again(
        changed,
        None,
        None,
        &asked(Some("6.14.1"), "t2"),
        &not_loaded
    ));
}

#[test]
fn only_an_enabled_driver_section_asks_for_a_driver() {
    let mut spec = DriverSpec {
        enable: false,
        ..DriverSpec::default()
    };
    assert_eq!(DriverWanted::from_spec(&spec), None);
    spec.enable = true;
    spec.version = Some("6.12.12".into());
    let wanted = DriverWanted::from_spec(&spec).unwrap();
    assert_eq!(wanted.version.as_deref(), Some("6.12.12"));
    assert_eq!(wanted.driver_type, DriverType::Container);
}

fn key_of(namespace: &str, name: &str) -> ConfigKey {
    ConfigKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn driver_spec(driver_type: &str, enable: bool) -> DeviceConfigSpec {
    let mut spec = DeviceConfigSpec::default();
    spec.driver_mut().enable = enable;
    spec.driver_mut().driver_type = DriverType::from(driver_type);
    spec
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
    let mut state = Shown::default();
    let refused = load(DriverLoadState::Refused, "ChecksumMismatch");
    let event = state.load_event(Some(&refused)).unwrap();
    assert_eq!(
        (event.0, event.2.as_str(), event.3.as_str()),
        (
            EventType::Warning,
            "ChecksumMismatch",
            "ChecksumMismatch message"
        )
    );
    // The same refusal again (a recheck) is not a second Event.
    assert_eq!(state.load_event(Some(&refused)), None);
    let unsigned = load(DriverLoadState::Refused, "UnsignedModule");
    assert!(state.load_event(Some(&unsigned)).is_some());
    let loading = load(DriverLoadState::Loading, "DriverLoading");
    assert_eq!(state.load_event(Some(&loading)), None);
    let loaded = load(DriverLoadState::Loaded, "DriverLoaded");
    let event = state.load_event(Some(&loaded)).unwrap();
    assert_eq!(
        (event.0, event.2.as_str()),
        (EventType::Normal, "DriverLoaded")
    );
    // Found running, not loaded by us: no Event.
    let mut fresh = Shown::default();
    let running = load(DriverLoadState::Loaded, "DriverRunning");
    assert_eq!(fresh.load_event(Some(&running)), None);
    // A failure retried at each recheck (loading, failed, ...) is one Event.
    let failed = load(DriverLoadState::Failed, "ModprobeFailed");
    assert!(fresh.load_event(Some(&failed)).is_some());
    assert_eq!(fresh.load_event(Some(&loading)), None);
    assert_eq!(fresh.load_event(Some(&failed)), None);
    assert_eq!(fresh.load_event(None), None);
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
    let (key, spec) = (key_of("ns", "gpus"), DeviceConfigSpec::default());
    let selection = Governing::One {
        key: &key,
        spec: &spec,
    };
    let mut node = Node::default();
    // Nothing until the report is read.
    assert_eq!(
        condition_intent(selection, None, None, None, &node, &now),
        None
    );
    let intent = condition_intent(selection, Some(&report), None, None, &node, &now)
        .expect("a first condition");
    assert_eq!(intent.conditions[0].type_, CONDITION_TYPE);
    assert_eq!(intent.conditions[0].status, "True");
    node.status = Some(NodeStatus {
        conditions: Some(intent.conditions.clone()),
        ..NodeStatus::default()
    });
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
    assert_eq!(
        condition_intent(selection, Some(&report), None, None, &node, &later),
        None,
        "the Node says it already: no write for a heartbeat"
    );
    let unloaded = DriverReport {
        loaded: false,
        origin: ModuleOrigin::NotLoaded,
        ..report.clone()
    };
    let intent = condition_intent(selection, Some(&unloaded), None, None, &node, &later).unwrap();
    assert_eq!(intent.conditions[0].status, "False");
    assert_eq!(
        condition_intent(Governing::None, Some(&report), None, None, &node, &later),
        Some(StatusIntent::default()),
        "deselected: removed"
    );
    let conflict = Governing::Conflict;
    assert_eq!(
        condition_intent(conflict, Some(&unloaded), None, None, &node, &later),
        None
    );
    assert_eq!(
        condition_intent(Governing::None, None, None, None, &Node::default(), &later),
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
    let key = key_of("ns", "gpus");
    let wanted_of = |spec: &DeviceConfigSpec| DriverWanted::for_node(spec.driver(), &key, None);
    let old = spec_of("6.12.12");
    let running = DriverLoad {
        state: DriverLoadState::Loaded,
        reason: RUNNING.into(),
        message: "amdgpu 6.12.12 runs".into(),
        bundle: None,
        version: Some("6.12.12".into()),
        asked: Some("6.12.12".into()),
        told_at: None,
    };
    let intent = condition_intent(
        Governing::One {
            key: &key,
            spec: &old,
        },
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
        condition_intent(
            Governing::One {
                key: &key,
                spec: &new,
            },
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
        reason: UPGRADE_PENDING.into(),
        asked: Some("6.14.1".into()),
        ..running.clone()
    };
    let intent = condition_intent(
        Governing::One {
            key: &key,
            spec: &new,
        },
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
    let config = key_of("kube-amd-gpu", "gpus");
    let one = Governing::One {
        key: &config,
        spec: &spec,
    };
    let key = "gpu.operator.amd.com/kube-amd-gpu.gpus.driver";
    let no_labels = BTreeMap::new();
    let mut state = Shown::default();
    assert_eq!(
        state.labels_to_apply(Governing::None, &no_labels),
        None,
        "nothing selects a clean node: no write at start"
    );
    let wanted = state
        .labels_to_apply(one, &no_labels)
        .expect("a first write");
    assert_eq!(wanted, [(key.to_owned(), "container".to_owned())].into());
    state.labels_written(wanted.clone());
    assert_eq!(state.labels_to_apply(one, &wanted), None, "unchanged");
    assert_eq!(state.labels_to_apply(Governing::Conflict, &wanted), None);
    assert_eq!(
        state.labels_to_apply(Governing::None, &wanted),
        Some(BTreeMap::new()),
        "deselected: removed"
    );
    let restarted = Shown::default();
    assert_eq!(
        restarted.labels_to_apply(Governing::None, &wanted),
        Some(BTreeMap::new()),
        "a restarted agent removes a label it finds"
    );
}

#[test]
fn the_driver_type_label_is_there_only_with_driver_enable() {
    let label = |driver_type, enable| {
        type_labels(
            "kube-amd-gpu",
            "gpu-config",
            &driver_spec(driver_type, enable),
        )
    };
    let key = "gpu.operator.amd.com/kube-amd-gpu.gpu-config.driver";
    for driver_type in ["container", "vf-passthrough", "pf-passthrough"] {
        assert_eq!(
            label(driver_type, true),
            BTreeMap::from([(key.to_owned(), driver_type.to_owned())])
        );
        assert!(label(driver_type, false).is_empty());
    }
    let long = "n".repeat(60);
    assert!(type_labels("ns", &long, &driver_spec("container", true)).is_empty());
}

#[test]
fn what_is_wanted_follows_the_governing_config_and_its_upgrade_record() {
    use crate::api::DriverUpgradePolicySpec;
    use crate::api::UpgradeState;
    use crate::api::driver_upgrade::{RECORD_ANNOTATION, UpgradeRecord};
    let key = key_of("ns", "gpus");
    let other = key_of("ns", "other");
    let mut spec = DeviceConfigSpec::default();
    spec.driver_mut().enable = true;
    spec.driver_mut().version = Some("6.12.12".into());
    let mut rolling = spec.clone();
    rolling.driver_mut().upgrade_policy = Some(DriverUpgradePolicySpec {
        enable: Some(true),
        ..DriverUpgradePolicySpec::default()
    });
    let mut disabled = spec.clone();
    disabled.driver_mut().enable = false;
    let record_of = |config: &ConfigKey| {
        let mut record = UpgradeRecord::new(config.clone(), UpgradeState::InProgress, "t1");
        record.target = Some("6.14.1".into());
        record.reboot_from = Some("boot-1".into());
        BTreeMap::from([(RECORD_ANNOTATION.to_owned(), record.to_json())])
    };
    let (ours, others) = (record_of(&key), record_of(&other));
    let none = BTreeMap::new();
    let garbled = BTreeMap::from([(RECORD_ANNOTATION.to_owned(), "{".to_owned())]);
    let one = |spec| Governing::One { key: &key, spec };
    // (governing, annotations, (version, replace, reboot_from, told_at))
    type Asked<'a> = Option<(&'a str, bool, Option<&'a str>, Option<&'a str>)>;
    let table: Vec<(Governing<'_>, &BTreeMap<String, String>, Asked<'_>)> = vec![
        (Governing::None, &none, None),
        (Governing::Conflict, &ours, None),
        (one(&disabled), &ours, None),
        (one(&spec), &none, Some(("6.12.12", true, None, None))),
        (one(&spec), &garbled, Some(("6.12.12", true, None, None))),
        (one(&rolling), &none, Some(("6.12.12", false, None, None))),
        (one(&rolling), &others, Some(("6.12.12", false, None, None))),
        (
            one(&rolling),
            &ours,
            Some(("6.14.1", true, Some("boot-1"), Some("t1"))),
        ),
    ];
    for (i, (governing, annotations, expected)) in table.into_iter().enumerate() {
        let got = wanted(governing, annotations);
        let got = got.as_ref().map(|w| {
            (
                w.version.as_deref().unwrap_or_default(),
                w.replace,
                w.reboot_from.as_deref(),
                w.told_at.as_deref(),
            )
        });
        assert_eq!(got, expected, "row {i}");
    }
}

#[test]
fn after_a_look_a_replacement_waits_for_the_rolling_upgrade_and_the_in_box_driver_names_its_blacklist()
 {
    let bundle = Box::new(Verified {
        dir: "/var/lib/amd-gpu-operator/bundles/6.14.1".into(),
        version: "6.14.1".into(),
        kernel_release: "6.8.0".into(),
        module: "amdgpu.ko".into(),
        files: 1,
        bytes: 1,
        signatures_checked: false,
    });
    let report = DriverReport {
        loaded: true,
        origin: ModuleOrigin::OutOfTree,
        version: Some("6.12.12".into()),
        ..DriverReport::default()
    };
    let wanted = |replace| DriverWanted {
        driver_type: DriverType::Container,
        version: Some("6.14.1".into()),
        blacklist: Some(true),
        module: KernelModuleConfigSpec::default(),
        replace,
        reboot_from: None,
        told_at: None,
    };
    let in_box = || LoadDecision::ReplaceNeeded {
        loaded: ModuleOrigin::InTree,
        version: None,
        why: "the in-box amdgpu is loaded".into(),
    };
    let load = LoadDecision::Load {
        bundle: bundle.clone(),
    };
    let replace = LoadDecision::Replace {
        bundle: bundle.clone(),
    };
    let step = |decision, blacklisted, replace| {
        next_step(decision, blacklisted, &wanted(replace), &report)
    };
    assert_eq!(
        step(load.clone(), Blacklisted::No, true),
        Next::Load(bundle.clone())
    );
    assert_eq!(
        step(load, Blacklisted::No, false),
        Next::Load(bundle.clone())
    );
    assert_eq!(
        step(replace.clone(), Blacklisted::No, true),
        Next::Replace(bundle.clone())
    );
    let done = |next: Next| match next {
        Next::Done(outcome) => (outcome.state, outcome.reason, outcome.message),
        other => panic!("not an outcome: {other:?}"),
    };
    let pending = done(step(replace, Blacklisted::No, false));
    assert_eq!(
        (pending.0, pending.1.as_str()),
        (DriverLoadState::Loaded, UPGRADE_PENDING)
    );
    assert!(pending.2.contains("amdgpu 6.12.12 runs"), "{}", pending.2);
    let pending = done(step(in_box(), Blacklisted::Yes, false));
    assert_eq!(pending.1, UPGRADE_PENDING);
    // Replacing the in-box driver needs a reboot: the message says how the
    // blacklist stands.
    let (state, reason, message) = done(step(in_box(), Blacklisted::Yes, true));
    assert_eq!(
        (state, reason.as_str()),
        (DriverLoadState::ReplaceNeeded, "DriverReplaceNeeded")
    );
    assert!(
        message.contains("blacklisted for the next boot"),
        "{message}"
    );
    let (_, _, message) = done(step(in_box(), Blacklisted::BlockedByForeignFile, true));
    assert!(
        message.contains("was not written by an operator"),
        "{message}"
    );
    let (_, _, message) = done(step(in_box(), Blacklisted::No, true));
    assert_eq!(message, "the in-box amdgpu is loaded");
    let refused = done(step(
        LoadDecision::Refuse {
            reason: "BundleMissingForKernel",
            message: "none for 6.8.0".into(),
        },
        Blacklisted::No,
        true,
    ));
    assert_eq!(
        (refused.0, refused.1.as_str()),
        (DriverLoadState::Refused, "BundleMissingForKernel")
    );
    let running = done(step(
        LoadDecision::Nothing {
            version: "6.14.1".into(),
        },
        Blacklisted::No,
        true,
    ));
    assert_eq!(
        (running.0, running.1.as_str()),
        (DriverLoadState::Loaded, RUNNING)
    );
}

#[test]
fn a_reboot_that_would_bring_the_in_box_driver_back_is_refused() {
    let report = |origin| DriverReport {
        loaded: true,
        origin,
        ..DriverReport::default()
    };
    let in_box = report(ModuleOrigin::InTree);
    let table: Vec<(&DriverReport, Result<Blacklisted, String>, Option<&str>)> = vec![
        (&in_box, Ok(Blacklisted::Yes), None),
        (
            &in_box,
            Ok(Blacklisted::No),
            Some("driver.blacklist is not true"),
        ),
        (
            &in_box,
            Ok(Blacklisted::BlockedByForeignFile),
            Some("was not written by an operator"),
        ),
        (
            &in_box,
            Err("read-only file system".into()),
            Some("read-only file system"),
        ),
    ];
    for (report, written, why) in table {
        let refused = reboot_blocked(report, &written);
        match why {
            None => assert_eq!(refused, None, "{written:?}"),
            Some(why) => {
                let refused = refused.expect("refused");
                assert_eq!(
                    (refused.state, refused.reason.as_str()),
                    (DriverLoadState::Refused, "BlacklistNotInEffect"),
                    "{written:?}"
                );
                assert!(refused.message.contains(why), "{}", refused.message);
            }
        }
    }
    // An out-of-tree driver does not come back at boot: reboot.
    let out_of_tree = report(ModuleOrigin::OutOfTree);
    assert_eq!(reboot_blocked(&out_of_tree, &Ok(Blacklisted::No)), None);
}
