use super::*;
use crate::remediation::mapping::{RecoveryPolicy, ValidationTestsProfile};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn entry(condition: &str) -> Entry {
    Entry {
        node_condition: condition.into(),
        workflow_template: "default-template".into(),
        validation_tests_profile: Some(ValidationTestsProfile {
            framework: "RVS".into(),
            recipe: "gst_single".into(),
            iterations: 1,
            stop_on_failure: true,
            timeout_seconds: 600,
            ..ValidationTestsProfile::default()
        }),
        ..Entry::default()
    }
}

fn mapping() -> Mapping {
    Mapping {
        entries: vec![entry("AMDGPUUnhealthy"), {
            let mut e = entry("AMDGPUHardwareAssertionHwa");
            e.physical_action_needed = true;
            e.recovery_policy = Some(RecoveryPolicy {
                max_allowed_runs_per_window: 2,
                window_size: "1h".into(),
            });
            e
        }],
    }
}

fn failing(name: &str) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        conditions: vec![("Ready".into(), true), ("AMDGPUUnhealthy".into(), true)],
        ready: true,
        boot_id: Some("boot-1".into()),
        ..NodeFacts::default()
    }
}

fn candidate_of(step: NodeStep) -> Candidate {
    match step {
        NodeStep::Candidate(c) => *c,
        other => panic!("not a candidate: {other:?}"),
    }
}

fn act(step: NodeStep) -> Decision {
    match step {
        NodeStep::Act(d) => *d,
        other => panic!("not an action: {other:?}"),
    }
}

/// Carries `decision` out on `facts` the way the leader would, as the next
/// pass sees it.
fn applied(mut facts: NodeFacts, decision: &Decision) -> NodeFacts {
    if let Some(record) = &decision.record {
        facts.record = record.clone();
    }
    if let Some(on) = decision.quarantine {
        facts.tainted = on;
    }
    for label in &decision.consume {
        match *label {
            FORCE_RESUME_LABEL => facts.force_resume = false,
            ABORT_LABEL => facts.abort = false,
            _ => {}
        }
    }
    match decision.drain {
        DrainOrder::Start => facts.drain = Some(DrainState::Running),
        DrainOrder::Stop => facts.drain = None,
        DrainOrder::Keep => {}
    }
    facts
}

fn phase(facts: &NodeFacts) -> Option<Phase> {
    facts.record.run.as_ref().map(|r| r.phase)
}

fn started(name: &str, policy: &Policy, now: Timestamp) -> NodeFacts {
    let facts = failing(name);
    let candidate = candidate_of(node_step(&facts, &mapping(), policy, now));
    let decision = start(&facts, &candidate, policy, now);
    applied(facts, &decision)
}

#[test]
fn the_happy_path_goes_through_every_step_and_releases() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    assert_eq!(phase(&n), Some(Phase::Draining));
    assert!(n.tainted);
    assert_eq!(n.record.attempts.len(), 1);
    assert_eq!(
        n.record.attempts[0].name,
        format!("n1-default-template-{}", at(0).as_second())
    );

    // The drain ends: notify, then reboot from the boot id the node runs.
    n.drain = Some(DrainState::Done);
    let d = act(node_step(&n, &m, &policy, at(10)));
    assert!(d.notes.iter().any(|e| e.reason == EVENT_REQUIRED));
    assert_eq!(d.drain, DrainOrder::Stop);
    n = applied(n, &d);
    assert_eq!(phase(&n), Some(Phase::Rebooting));
    assert_eq!(
        n.record.run.as_ref().unwrap().reboot_from.as_deref(),
        Some("boot-1")
    );

    // Not back yet: wait, no write.
    let waiting = act(node_step(&n, &m, &policy, at(20)));
    assert_eq!(waiting.record, None);
    assert!(waiting.wake.is_some());

    // Back with a new boot id: validate.
    n.boot_id = Some("boot-2".into());
    n.conditions = vec![("Ready".into(), true), ("AMDGPUUnhealthy".into(), false)];
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(60))));
    assert_eq!(phase(&n), Some(Phase::Validating));
    let test_id = n.record.run.as_ref().unwrap().test.clone().unwrap();

    // An answer to another request is not this one's.
    n.answer = Some(Answer {
        id: "older".into(),
        passed: true,
        message: String::new(),
        ..Answer::default()
    });
    assert_eq!(act(node_step(&n, &m, &policy, at(70))).record, None);
    n.answer = Some(Answer {
        id: test_id,
        passed: true,
        message: String::new(),
        ..Answer::default()
    });
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(80))));
    assert_eq!(phase(&n), Some(Phase::Confirming));

    // Two checks a minute apart, then release.
    let early = act(node_step(&n, &m, &policy, at(100)));
    assert_eq!(early.record, None, "not a minute yet");
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(140))));
    assert_eq!(n.record.run.as_ref().unwrap().checks, 1);
    let d = act(node_step(&n, &m, &policy, at(200)));
    assert_eq!(d.quarantine, Some(false));
    assert!(d.notes.iter().any(|e| e.reason == EVENT_SUCCEEDED));
    assert!(matches!(
        d.outcomes.as_slice(),
        [Outcome::Succeeded { seconds, .. }] if *seconds == 200.0
    ));
    n = applied(n, &d);
    assert_eq!(n.record.run, None);
    assert_eq!(n.record.attempts.len(), 1, "kept for the recovery policy");
}

#[test]
fn a_condition_back_during_confirmation_restarts_the_count_and_then_fails() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    let run = n.record.run.as_mut().unwrap();
    run.phase = Phase::Confirming;
    run.since = at(0).to_string();
    n.tainted = true;
    n.conditions = vec![("AMDGPUUnhealthy".into(), false)];
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(60))));
    assert_eq!(n.record.run.as_ref().unwrap().checks, 1);
    n.conditions = vec![("AMDGPUUnhealthy".into(), true)];
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(120))));
    assert_eq!(n.record.run.as_ref().unwrap().checks, 0);
    // True at every check until the 15 minutes are up.
    let mut t = 120;
    while phase(&n) == Some(Phase::Confirming) {
        t += 60;
        n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(t))));
        assert!(t <= 900, "still confirming at {t}s");
    }
    assert_eq!(phase(&n), Some(Phase::Failed));
    assert!(n.tainted, "a failed node stays tainted");
}

#[test]
fn a_failed_test_fails_the_run_with_the_entrys_message_and_keeps_the_taint() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    let run = n.record.run.as_mut().unwrap();
    // The run's own copy of its entry speaks, as the mapping was at its start.
    run.entry.notify_test_failure_message = "call the vendor".into();
    run.phase = Phase::Validating;
    run.test = Some("t-1".into());
    n.answer = Some(Answer {
        id: "t-1".into(),
        passed: false,
        message: "gst_single failed on GPU 3".into(),
        ..Answer::default()
    });
    let d = act(node_step(&n, &m, &policy, at(30)));
    let note = d.notes.iter().find(|e| e.reason == EVENT_FAILED).unwrap();
    assert!(note.message.starts_with("call the vendor"), "{note:?}");
    assert!(note.message.contains("GPU 3"));
    assert_eq!(d.quarantine, None, "the taint stays");
    n = applied(n, &d);
    assert_eq!(phase(&n), Some(Phase::Failed));
    // It stays so, until a person removes the taint.
    assert_eq!(node_step(&n, &m, &policy, at(40)), NodeStep::Nothing);
    n.tainted = false;
    let d = act(node_step(&n, &m, &policy, at(50)));
    assert_eq!(d.quarantine, Some(false), "the labels go too");
    assert_eq!(applied(n, &d).record.run, None);
}

#[test]
fn validation_waits_for_the_driver_of_the_new_boot() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    n.record.run.as_mut().unwrap().phase = Phase::Rebooting;
    n.record.run.as_mut().unwrap().reboot_from = Some("boot-1".into());
    // Back and Ready, but amdgpu is still loading: no test yet.
    n.boot_id = Some("boot-2".into());
    n.driver_pending = Some("amdgpu is not loaded yet".into());
    let waiting = act(node_step(&n, &m, &policy, at(30)));
    assert_eq!(waiting.record, None, "{waiting:?}");
    assert!(waiting.wake.is_some());
    // Loaded: the tests start.
    n.driver_pending = None;
    let started = applied(n.clone(), &act(node_step(&n, &m, &policy, at(31))));
    assert_eq!(phase(&started), Some(Phase::Validating));
    // A driver that never loads fails the run at the reboot timeout, naming
    // the driver, not the GPUs.
    n.driver_pending = Some("amdgpu is not loaded yet".into());
    let limit = policy.reboot_timeout.as_secs() as i64;
    let failed = applied(n.clone(), &act(node_step(&n, &m, &policy, at(limit))));
    assert_eq!(phase(&failed), Some(Phase::Failed));
    let message = failed
        .record
        .run
        .as_ref()
        .unwrap()
        .reason
        .clone()
        .unwrap_or_default();
    assert!(
        message.contains("driver was not ready") && message.contains("amdgpu is not loaded"),
        "{message}"
    );
}

#[test]
fn timeouts_fail_the_reboot_and_the_tests() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    n.record.run.as_mut().unwrap().phase = Phase::Rebooting;
    n.record.run.as_mut().unwrap().reboot_from = Some("boot-1".into());
    let limit = policy.reboot_timeout.as_secs() as i64;
    assert!(
        act(node_step(&n, &m, &policy, at(limit - 1)))
            .record
            .is_none()
    );
    // Back, but not Ready: still rebooting.
    n.boot_id = Some("boot-2".into());
    n.ready = false;
    assert!(
        act(node_step(&n, &m, &policy, at(limit - 1)))
            .record
            .is_none()
    );
    let failed = applied(n.clone(), &act(node_step(&n, &m, &policy, at(limit))));
    assert_eq!(phase(&failed), Some(Phase::Failed));

    n.record.run.as_mut().unwrap().phase = Phase::Validating;
    n.record.run.as_mut().unwrap().test = Some("t".into());
    let limit = m.entries[0].validation_limit().as_secs() as i64;
    let failed = applied(n.clone(), &act(node_step(&n, &m, &policy, at(limit))));
    assert_eq!(phase(&failed), Some(Phase::Failed));
}

#[test]
fn physical_action_waits_for_a_person_then_reboots() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = failing("n1");
    n.conditions = vec![("AMDGPUHardwareAssertionHwa".into(), true)];
    let c = candidate_of(node_step(&n, &m, &policy, at(0)));
    n = applied(n.clone(), &start(&n, &c, &policy, at(0)));
    n.drain = Some(DrainState::Done);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(5))));
    assert_eq!(phase(&n), Some(Phase::AwaitingPerson));
    assert_eq!(node_step(&n, &m, &policy, at(3600)), NodeStep::Nothing);
    n.force_resume = true;
    let d = act(node_step(&n, &m, &policy, at(4000)));
    assert_eq!(d.consume, [FORCE_RESUME_LABEL]);
    assert_eq!(phase(&applied(n, &d)), Some(Phase::Rebooting));
}

#[test]
fn skip_reboot_and_no_profile_skip_their_steps() {
    let policy = Policy::default();
    let mut m = mapping();
    m.entries[0].skip_reboot_step = true;
    m.entries[0].validation_tests_profile = None;
    let mut n = failing("n1");
    let c = candidate_of(node_step(&n, &m, &policy, at(0)));
    n = applied(n.clone(), &start(&n, &c, &policy, at(0)));
    n.drain = Some(DrainState::Done);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(5))));
    assert_eq!(phase(&n), Some(Phase::Confirming));
}

#[test]
fn the_recovery_policy_holds_the_run_past_the_window_until_a_person_forces_one() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = failing("n1");
    n.conditions = vec![("AMDGPUHardwareAssertionHwa".into(), true)];
    for (i, t) in [0, 600].into_iter().enumerate() {
        n.record.attempts.push(Attempt {
            condition: "AMDGPUHardwareAssertionHwa".into(),
            started: at(t).to_string(),
            name: format!("a{i}"),
            healed: false,
        });
    }
    // Two runs in the hour: the third is held, tainted, with an Event.
    let d = act(node_step(&n, &m, &policy, at(1200)));
    assert_eq!(d.quarantine, Some(true));
    assert!(d.notes[0].message.contains("a person must act"));
    let held = applied(n.clone(), &d);
    assert_eq!(phase(&held), Some(Phase::Held));
    assert_eq!(held.record.attempts.len(), 2, "a held run is no attempt");
    // Once the first run leaves the window, a new one may start.
    assert!(matches!(
        node_step(&n, &m, &policy, at(3601)),
        NodeStep::Candidate(_)
    ));
    // A person forces a new one, at once.
    let mut forced = held.clone();
    forced.force_resume = true;
    let c = candidate_of(node_step(&forced, &m, &policy, at(1300)));
    assert!(c.forced);
    let d = start(&forced, &c, &policy, at(1300));
    assert_eq!(d.consume, [FORCE_RESUME_LABEL]);
    assert_eq!(phase(&applied(forced, &d)), Some(Phase::Draining));
    // Other conditions' runs do not count.
    let mut other = failing("n2");
    other.record.attempts = n.record.attempts.clone();
    assert!(matches!(
        node_step(&other, &m, &policy, at(1200)),
        NodeStep::Candidate(_)
    ));
}

#[test]
fn attempts_older_than_72_hours_are_pruned() {
    let policy = Policy::default();
    let mut n = failing("n1");
    n.conditions.clear();
    n.record.attempts.push(Attempt {
        condition: "AMDGPUUnhealthy".into(),
        started: at(0).to_string(),
        name: "old".into(),
        healed: false,
    });
    assert_eq!(
        node_step(&n, &mapping(), &policy, at(71 * 3600)),
        NodeStep::Nothing
    );
    let d = act(node_step(&n, &mapping(), &policy, at(72 * 3600)));
    assert_eq!(d.record, Some(Record::default()));
}

#[test]
fn abort_stops_any_step_and_keeps_the_taint() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    n.abort = true;
    let d = act(node_step(&n, &m, &policy, at(5)));
    assert_eq!(d.drain, DrainOrder::Stop);
    assert_eq!(d.consume, [ABORT_LABEL]);
    assert_eq!(d.quarantine, None);
    let n = applied(n, &d);
    assert_eq!(phase(&n), Some(Phase::Aborted));
    assert!(n.tainted);
}

#[test]
fn approval_waits_for_the_force_resume_label() {
    let policy = Policy {
        auto_start: false,
        ..Policy::default()
    };
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    assert_eq!(phase(&n), Some(Phase::AwaitingApproval));
    assert!(!n.tainted, "nothing is done before approval");
    assert_eq!(node_step(&n, &m, &policy, at(60)), NodeStep::Nothing);
    n.force_resume = true;
    let d = act(node_step(&n, &m, &policy, at(90)));
    assert_eq!(d.drain, DrainOrder::Start);
    assert_eq!(d.quarantine, Some(true));
    assert_eq!(phase(&applied(n.clone(), &d)), Some(Phase::Draining));
    // Cleared before approval: the run goes, nothing was done.
    n.force_resume = false;
    n.conditions = vec![("AMDGPUUnhealthy".into(), false)];
    let d = act(node_step(&n, &m, &policy, at(90)));
    assert_eq!(d.record.unwrap().run, None);
    assert_eq!(d.quarantine, None);
}

#[test]
fn gates_block_without_writing() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = failing("n1");
    n.busy = Some("a driver upgrade");
    assert!(
        matches!(node_step(&n, &m, &policy, at(0)), NodeStep::Blocked { why, .. } if why.contains("driver upgrade"))
    );
    n.busy = None;
    n.paused = true;
    assert!(matches!(
        node_step(&n, &m, &policy, at(0)),
        NodeStep::Blocked { .. }
    ));
    n.conditions = vec![("SomethingElse".into(), true)];
    n.paused = false;
    assert_eq!(node_step(&n, &m, &policy, at(0)), NodeStep::Nothing);
}

fn nodes(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn candidates(names: &[&str]) -> Vec<Candidate> {
    names
        .iter()
        .map(|n| Candidate {
            node: (*n).into(),
            condition: "AMDGPUUnhealthy".into(),
            entry: entry("AMDGPUUnhealthy"),
            forced: false,
        })
        .collect()
}

#[test]
fn max_parallel_holds_the_rest_in_name_order() {
    let policy = Policy {
        max_parallel: Some(2),
        breaker: Breaker {
            limit: CountOrPercent::Percent(100),
            ..Breaker::default()
        },
        ..Policy::default()
    };
    let a = admit(
        candidates(&["n5", "n3", "n1", "n4", "n2"]),
        0,
        &nodes(&[]),
        5,
        &policy,
    );
    let names = |c: &[Candidate]| c.iter().map(|c| c.node.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a.start), ["n1", "n2"]);
    assert_eq!(names(&a.waiting), ["n3", "n4", "n5"]);
    let a = admit(
        candidates(&["n3", "n4"]),
        2,
        &nodes(&["n1", "n2"]),
        5,
        &policy,
    );
    assert!(a.start.is_empty());
}

#[test]
fn the_breaker_trips_on_a_burst_past_the_limit_and_forced_runs_pass() {
    let policy = Policy::default();
    // 3 of 10 at once, 20 %: none starts.
    let a = admit(candidates(&["n1", "n2", "n3"]), 0, &nodes(&[]), 10, &policy);
    assert!(a.start.is_empty());
    let (held, message) = a.breaker.unwrap();
    assert_eq!(held.len(), 3);
    assert!(message.contains("limit of 2 of 10"), "{message}");
    // 2 of 10 start.
    let a = admit(candidates(&["n1", "n2"]), 0, &nodes(&[]), 10, &policy);
    assert_eq!(a.start.len(), 2);
    // One more after two within the window trips it.
    let a = admit(candidates(&["n3"]), 2, &nodes(&["n1", "n2"]), 10, &policy);
    assert!(a.breaker.is_some());
    // A node that failed before within the window counts once.
    let a = admit(candidates(&["n2"]), 1, &nodes(&["n1", "n2"]), 10, &policy);
    assert_eq!(a.start.len(), 1, "{a:?}");
    // A person's force-resume passes the breaker and the parallel limit.
    let mut forced = candidates(&["n3"]);
    forced[0].forced = true;
    let a = admit(
        forced,
        2,
        &nodes(&["n1", "n2"]),
        10,
        &Policy {
            max_parallel: Some(1),
            ..Policy::default()
        },
    );
    assert_eq!(a.start.len(), 1);
    // A forced node counts: with it, the two automatic ones pass the limit.
    let mut burst = candidates(&["n1", "n2", "n3"]);
    burst[1].forced = true;
    let a = admit(burst, 0, &nodes(&[]), 10, &Policy::default());
    assert_eq!(a.start.len(), 1, "only the forced one: {a:?}");
    assert_eq!(a.breaker.map(|(held, _)| held.len()), Some(2));
    // Paused: nothing automatic starts.
    let a = admit(
        candidates(&["n1"]),
        0,
        &nodes(&[]),
        10,
        &Policy {
            paused: true,
            ..Policy::default()
        },
    );
    assert_eq!(a.paused.len(), 1);
    assert!(a.start.is_empty());
}

#[test]
fn a_drain_this_term_did_not_start_is_resumed_and_a_lost_taint_put_back() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    n.drain = None;
    n.tainted = false;
    let d = act(node_step(&n, &m, &policy, at(5)));
    assert_eq!(d.drain, DrainOrder::Start);
    assert_eq!(d.quarantine, Some(true));
    // And a failed drain fails the run.
    n.drain = Some(DrainState::Failed("pdb x blocks".into()));
    let d = act(node_step(&n, &m, &policy, at(5)));
    assert_eq!(phase(&applied(n, &d)), Some(Phase::Failed));
}

fn reset_first_mapping() -> Mapping {
    let mut e = entry("AMDGPUUnhealthy");
    e.gpu_reset_first = true;
    Mapping { entries: vec![e] }
}

/// A run of the reset-first entry, started.
fn reset_started(policy: &Policy) -> NodeFacts {
    let facts = failing("n1");
    let m = reset_first_mapping();
    let candidate = candidate_of(node_step(&facts, &m, policy, at(0)));
    let decision = start(&facts, &candidate, policy, at(0));
    assert_eq!(decision.quarantine, Some(true), "quarantined first");
    assert_eq!(decision.drain, DrainOrder::Keep, "no whole-node drain");
    applied(facts, &decision)
}

fn answered(n: &mut NodeFacts, passed: bool, gpu: Option<&str>, pods: &[&str]) {
    n.answer = Some(Answer {
        id: n.record.run.as_ref().unwrap().test.clone().unwrap(),
        passed,
        message: "what the agent said".into(),
        gpu: gpu.map(str::to_owned),
        pods: pods.iter().map(|p| p.to_string()).collect(),
        not_run: None,
    });
}

#[test]
fn a_gpu_reset_drains_only_the_gpus_pods_resets_tests_and_confirms_without_a_reboot() {
    let policy = Policy::default();
    let m = reset_first_mapping();
    let mut n = reset_started(&policy);
    assert_eq!(phase(&n), Some(Phase::IsolatingGpu));
    let isolate_id = n.record.run.as_ref().unwrap().test.clone().unwrap();
    assert!(isolate_id.starts_with("isolate-"), "{isolate_id}");

    // No answer yet: wait, no write.
    let waiting = act(node_step(&n, &m, &policy, at(5)));
    assert_eq!(waiting.record, None);
    assert!(waiting.wake.is_some());

    // The agent names the GPU and its pods: only those are drained.
    answered(&mut n, true, Some("0000:03:00.0"), &["ml/train"]);
    let d = act(node_step(&n, &m, &policy, at(10)));
    assert_eq!(d.drain, DrainOrder::Start);
    n = applied(n, &d);
    let run = n.record.run.clone().unwrap();
    assert_eq!(run.phase, Phase::DrainingGpu);
    assert_eq!(run.gpu.as_deref(), Some("0000:03:00.0"));
    assert_eq!(run.gpu_pods, ["ml/train"]);

    // Drained: reset, a new request.
    n.drain = Some(DrainState::Done);
    let d = act(node_step(&n, &m, &policy, at(20)));
    assert_eq!(d.drain, DrainOrder::Stop);
    n = applied(n, &d);
    assert_eq!(phase(&n), Some(Phase::ResettingGpu));
    let reset_id = n.record.run.as_ref().unwrap().test.clone().unwrap();
    assert_ne!(reset_id, isolate_id);
    // The isolation's answer is not the reset's.
    assert_eq!(act(node_step(&n, &m, &policy, at(25))).record, None);

    // Reset and tested: confirm, no reboot ever asked.
    answered(&mut n, true, None, &[]);
    n.conditions = vec![("Ready".into(), true), ("AMDGPUUnhealthy".into(), false)];
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(30))));
    assert_eq!(phase(&n), Some(Phase::Confirming));
    assert_eq!(n.record.run.as_ref().unwrap().reboot_from, None);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(91))));
    let d = act(node_step(&n, &m, &policy, at(152)));
    assert_eq!(d.quarantine, Some(false));
    assert!(d.notes.iter().any(|e| e.reason == EVENT_SUCCEEDED));
}

#[test]
fn a_fault_on_several_gpus_a_failed_reset_or_a_silent_agent_escalate_to_the_whole_node() {
    let policy = Policy::default();
    let m = reset_first_mapping();
    let escalated = |d: &Decision| {
        assert_eq!(d.drain, DrainOrder::Start, "the whole node is drained");
        assert!(d.notes.iter().any(|e| e.reason == EVENT_ESCALATED), "{d:?}");
        let run = d.record.as_ref().unwrap().run.as_ref().unwrap();
        assert_eq!(run.phase, Phase::Draining);
        assert!(run.entry.validation_tests_profile.is_some());
    };

    // Several GPUs at fault.
    let mut n = reset_started(&policy);
    answered(&mut n, false, None, &[]);
    escalated(&act(node_step(&n, &m, &policy, at(10))));

    // The agent never answers.
    let n = reset_started(&policy);
    escalated(&act(node_step(
        &n,
        &m,
        &policy,
        at(GPU_ISOLATION_LIMIT.as_secs() as i64),
    )));

    // The reset (or its tests) failed: then the reboot path follows the drain.
    let mut n = reset_started(&policy);
    answered(&mut n, true, Some("0000:03:00.0"), &[]);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(10))));
    n.drain = Some(DrainState::Done);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(20))));
    answered(&mut n, false, None, &[]);
    let d = act(node_step(&n, &m, &policy, at(30)));
    escalated(&d);
    n = applied(n, &d);
    n.drain = Some(DrainState::Done);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(40))));
    assert_eq!(phase(&n), Some(Phase::Rebooting));
}

#[test]
fn an_approved_reset_first_run_isolates_the_gpu() {
    let policy = Policy {
        auto_start: false,
        ..Policy::default()
    };
    let m = reset_first_mapping();
    let facts = failing("n1");
    let candidate = candidate_of(node_step(&facts, &m, &policy, at(0)));
    let mut n = applied(facts.clone(), &start(&facts, &candidate, &policy, at(0)));
    assert_eq!(phase(&n), Some(Phase::AwaitingApproval));
    n.force_resume = true;
    let d = act(node_step(&n, &m, &policy, at(5)));
    assert_eq!(d.drain, DrainOrder::Keep);
    n = applied(n, &d);
    assert_eq!(phase(&n), Some(Phase::IsolatingGpu));
    assert!(n.record.run.as_ref().unwrap().test.is_some());
}

#[test]
fn a_reset_whose_condition_comes_back_escalates_once_then_fails() {
    let policy = Policy::default();
    let m = reset_first_mapping();
    let mut n = reset_started(&policy);
    answered(&mut n, true, Some("0000:03:00.0"), &[]);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(10))));
    n.drain = Some(DrainState::Done);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(20))));
    answered(&mut n, true, None, &[]);
    n = applied(n.clone(), &act(node_step(&n, &m, &policy, at(30))));
    assert_eq!(phase(&n), Some(Phase::Confirming));
    // The condition stays True past the confirmation's window: the reset did
    // not repair it, so the node's steps follow.
    let late = at(30 + policy.confirm.within.as_secs() as i64);
    let d = act(node_step(&n, &m, &policy, late));
    assert_eq!(d.drain, DrainOrder::Start);
    assert!(d.notes.iter().any(|e| e.reason == EVENT_ESCALATED), "{d:?}");
    n = applied(n, &d);
    let run = n.record.run.clone().unwrap();
    assert_eq!((run.phase, run.gpu), (Phase::Draining, None));
    // A drain that fails now fails the run, and its entry goes.
    n.drain = Some(DrainState::Failed("a budget".into()));
    let d = act(node_step(&n, &m, &policy, at(5000)));
    assert_eq!(d.drain, DrainOrder::Stop);
    assert_eq!(
        d.record.as_ref().unwrap().run.as_ref().unwrap().phase,
        Phase::Failed
    );
}

#[test]
fn only_runs_that_did_not_heal_count_for_the_breaker() {
    let policy = Policy::default();
    let window = policy.breaker.window;
    let mut n = started("n1", &policy, at(0));
    assert!(
        recently_quarantined(&n.record, window, at(10)),
        "quarantined now"
    );
    // Confirmed and released: the attempt is kept for the recovery policy,
    // marked healed, and no longer counts for the breaker.
    n.record.run = None;
    n.record.attempts[0].healed = false;
    assert!(
        recently_quarantined(&n.record, window, at(20)),
        "a failed run counts"
    );
    n.record.attempts[0].healed = true;
    assert!(!recently_quarantined(&n.record, window, at(20)));
    assert_eq!(attempts_within(&n.record, None, window, at(20)), 1);
    // The default 20 % of a small cluster is one node, never none.
    for selected in 1..=5 {
        assert_eq!(
            policy.breaker.limit.resolve(selected),
            1,
            "{selected} nodes"
        );
    }
}

#[test]
fn a_confirmed_run_marks_its_attempt_healed() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    let run = n.record.run.as_mut().unwrap();
    run.phase = Phase::Confirming;
    run.checks = policy.confirm.checks - 1;
    n.conditions = vec![("Ready".into(), true), ("AMDGPUUnhealthy".into(), false)];
    let later = at(policy.confirm.interval.as_secs() as i64 + 100);
    let done = applied(n.clone(), &act(node_step(&n, &m, &policy, later)));
    assert!(done.record.run.is_none(), "released");
    assert!(done.record.attempts[0].healed);
}

#[test]
fn tests_that_could_not_run_go_on_to_the_confirmation_not_to_a_failure() {
    let policy = Policy::default();
    let m = mapping();
    let mut n = started("n1", &policy, at(0));
    let run = n.record.run.as_mut().unwrap();
    run.phase = Phase::Validating;
    run.test = Some("validate-1".into());
    n.answer = Some(Answer {
        id: "validate-1".into(),
        passed: false,
        message: "AGFHC all_lvl4 not run".into(),
        not_run: Some(
            "the AGFHC test tool /opt/amd/agfhc/agfhc cannot be used (give the agent --agfhc)"
                .into(),
        ),
        ..Answer::default()
    });
    let d = act(node_step(&n, &m, &policy, at(10)));
    let note = d
        .notes
        .iter()
        .find(|e| e.reason == EVENT_VALIDATION_NOT_RUN)
        .expect("a note naming the tool");
    assert!(note.warning && note.message.contains("--agfhc"), "{note:?}");
    assert_eq!(phase(&applied(n, &d)), Some(Phase::Confirming));
}
