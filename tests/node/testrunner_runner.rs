//! The test runner without Kubernetes: `gpu-operator check`'s function on a
//! simulated host, with a stand-in rvs. Iterations, stop-on-failure, timeouts
//! that kill the whole process group, result parsing and log files.

use crate::fake_rvs;
use crate::support;

use std::time::{Duration, Instant};

use fake_rvs::{FakeRvs, config_json, kfd_ids, logs_in, wait_gone};
use gpu_operator::host::HostRoot;
use gpu_operator::testrunner::report::{ActionResult, IterationStatus};
use gpu_operator::testrunner::{CheckOptions, Framework, Outcome, TestRunnerError, check};
use support::hosts::SimHost;
use tokio_util::sync::CancellationToken;

/// A simulated host (no kubelet, no cluster: the check runs without them)
/// and the stand-in rvs.
struct Rig {
    rvs: FakeRvs,
    sim: SimHost,
    host: HostRoot,
}

impl Rig {
    fn new(gpus: usize) -> Self {
        let sim = SimHost::with_gpus("mi210", Some(gpus), None);
        Self {
            rvs: FakeRvs::new(),
            host: sim.host.clone(),
            sim,
        }
    }

    fn dir(&self) -> &std::path::Path {
        self.sim.dir()
    }

    fn options(&self, recipe: &str) -> CheckOptions {
        let mut options =
            CheckOptions::new(recipe, self.host.clone(), "node1", self.dir().join("logs"));
        options.commands = self.rvs.commands();
        options
    }
}

#[tokio::test]
async fn a_passing_check_reports_every_gpu_and_writes_logs() {
    let rig = Rig::new(2);
    // A per-model recipe directory, as RVS ships them, is preferred.
    let model_conf = rig.rvs.path().join("conf/MI210/gst_single.conf");
    std::fs::create_dir_all(model_conf.parent().unwrap()).unwrap();
    std::fs::write(&model_conf, "# fake\n").unwrap();

    let report = check(&rig.options("gst_single"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, Outcome::Passed);
    assert_eq!(report.iterations.len(), 1);
    let it = &report.iterations[0];
    assert_eq!(it.status, IterationStatus::Completed);
    assert_eq!(
        it.suites_result["0"]["gst_single-action"],
        ActionResult::Success
    );
    assert_eq!(
        it.suites_result["1"]["gst_single-action"],
        ActionResult::Success
    );
    assert_eq!(
        report.message(),
        r#"[{"number":1,"suitesResult":{"0":{"gst_single-action":"success"},"1":{"gst_single-action":"success"}},"status":"completed"}]"#
    );

    // rvs -c <model conf> -j, no -i: every GPU, as the reference runs MANUAL tests.
    let calls = rig.rvs.invocations();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].starts_with(&format!("-c {} -j |", model_conf.display())),
        "{calls:?}"
    );
    assert!(
        calls[0].ends_with("iteration=1 trigger=MANUAL gpus=0,1"),
        "{calls:?}"
    );

    // The GPUs carry their KFD ids, for the Event labels.
    let kfd = kfd_ids(&rig.host);
    assert_eq!(
        report.gpus.iter().map(|g| g.kfd_id).collect::<Vec<_>>(),
        kfd.iter().map(|k| Some(*k)).collect::<Vec<_>>()
    );

    // Logs: the test's stdout and stderr, and the result summary.
    let logs = logs_in(&rig.dir().join("logs"));
    let names: Vec<String> = logs
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("_manual_gst_single_iteration1_stdout.log")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("_manual_gst_single_iteration1_stderr.log")),
        "{names:?}"
    );
    let summary = logs
        .iter()
        .find(|p| p.to_string_lossy().ends_with("_result.json"))
        .unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(summary).unwrap()).unwrap();
    assert_eq!(summary["reason"], "TestPassed");
    assert_eq!(summary["trigger"], "MANUAL");
    assert_eq!(summary["gpus"][1]["index"], 1);
    assert_eq!(summary["iterations"][0]["status"], "completed");
    let stdout = logs
        .iter()
        .find(|p| p.to_string_lossy().ends_with("_stdout.log"))
        .unwrap();
    assert!(
        std::fs::read_to_string(stdout)
            .unwrap()
            .contains("fake rvs: call 1")
    );
    assert_eq!(report.log_files.len(), 3);
}

#[tokio::test]
async fn iterations_stop_on_the_first_failure_when_asked() {
    let rig = Rig::new(2);
    rig.rvs.modes(&["pass", "fail:1", "pass"]);
    let mut options = rig.options("mem");
    options.config_text = Some(config_json(
        "MANUAL",
        r#"{"Recipe":"mem","Iterations":3,"StopOnFailure":true,"Arguments":"--parallel,-d,5"}"#,
    ));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(
        report.iterations.len(),
        2,
        "stopped after the failed iteration"
    );
    assert_eq!(
        report.iterations[1].suites_result["0"]["mem-action"],
        ActionResult::Success
    );
    assert_eq!(
        report.iterations[1].suites_result["1"]["mem-action"],
        ActionResult::Failure
    );
    let calls = rig.rvs.invocations();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].contains("-j --parallel -d 5 |"), "{calls:?}");
    assert!(calls[1].contains("iteration=2"), "{calls:?}");
}

#[tokio::test]
async fn iterations_continue_after_a_failure_without_stop_on_failure() {
    let rig = Rig::new(1);
    rig.rvs.modes(&["fail", "pass", "pass"]);
    let mut options = rig.options("mem");
    options.config_text = Some(config_json(
        "MANUAL",
        r#"{"Recipe":"mem","Iterations":3,"StopOnFailure":false}"#,
    ));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(rig.rvs.invocations().len(), 3);
    assert_eq!(report.iterations.len(), 3);
    assert_eq!(
        report
            .iterations
            .iter()
            .map(|i| i.number)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(
        report.outcome,
        Outcome::Failed,
        "one failed iteration fails the run"
    );
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let rig = Rig::new(1);
    rig.rvs.modes(&["hang"]);
    let mut options = rig.options("gst_single");
    options.timeout = Some(Duration::from_millis(400));
    options.iterations = Some(2);
    let started = Instant::now();
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.outcome, Outcome::TimedOut);
    assert_eq!(
        report.iterations.len(),
        1,
        "StopOnFailure (default true) stops after a timeout"
    );
    assert_eq!(report.iterations[0].status, IterationStatus::TimedOut);
    assert_eq!(
        report.iterations[0].suites_result["0"]["result"],
        ActionResult::Timedout
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // The stand-in and the `sleep` it started in the background are both gone.
    let child = rig.rvs.wait_for_pid("child.pid");
    let grandchild = rig.rvs.wait_for_pid("grandchild.pid");
    wait_gone(child, "the test process, after the timeout");
    wait_gone(grandchild, "its grandchild, after the timeout");
    assert!(
        report.message().contains(r#""status":"timed_out""#),
        "{}",
        report.message()
    );
}

#[tokio::test]
async fn a_timed_out_iteration_then_passes_is_timed_out_overall() {
    let rig = Rig::new(1);
    rig.rvs.modes(&["hang", "pass"]);
    let mut options = rig.options("gst_single");
    options.config_text = Some(config_json(
        "MANUAL",
        r#"{"Recipe":"gst_single","Iterations":2,"StopOnFailure":false,"TimeoutSeconds":0.3}"#,
    ));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(report.iterations.len(), 2);
    assert_eq!(report.iterations[1].status, IterationStatus::Completed);
    assert_eq!(report.outcome, Outcome::TimedOut);
    let grandchild = rig.rvs.wait_for_pid("grandchild.pid");
    wait_gone(grandchild, "the test's grandchild");
}

#[tokio::test]
async fn rvs_without_results_fails() {
    let rig = Rig::new(1);
    rig.rvs.modes(&["noresult"]);
    let report = check(&rig.options("babel"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(
        report.iterations[0].suites_result["0"]["result"],
        ActionResult::Failure
    );
}

#[tokio::test]
async fn command_tests_pass_on_exit_status_and_see_their_gpus() {
    let rig = Rig::new(2);
    let seen = rig.dir().join("seen");
    let script = format!(
        "echo \"$GPU_TEST_RECIPE $GPU_TEST_GPUS $GPU_TEST_ITERATION $*\" >> '{}'; exit $EXIT",
        seen.display()
    );
    let config = |exit: u32| {
        config_json(
            "MANUAL",
            &format!(
                r#"{{"Recipe":"smoke","Iterations":2,"DeviceIDs":["1"],"Command":["/bin/sh","-c","EXIT={exit}; {}","sh"],"Arguments":"x"}}"#,
                script.replace('\\', "\\\\").replace('"', "\\\"")
            ),
        )
    };
    let mut options = rig.options("smoke");
    options.config_text = Some(config(0));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Passed);
    assert_eq!(report.case.framework, Framework::Command);
    assert_eq!(report.iterations.len(), 2);
    assert_eq!(
        report.iterations[0].suites_result["1"]["smoke"],
        ActionResult::Success
    );
    assert!(
        !report.iterations[0].suites_result.contains_key("0"),
        "DeviceIDs picked GPU 1"
    );
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        "smoke 1 1 x\nsmoke 1 2 x\n"
    );

    options.config_text = Some(config(4));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(report.iterations.len(), 1);
    assert!(rig.rvs.invocations().is_empty(), "rvs was never run");
}

#[tokio::test]
async fn a_missing_tool_is_its_own_outcome_not_a_failed_test() {
    let rig = Rig::new(1);
    let mut options = rig.options("all_lvl1");
    options.framework = Some(Framework::Agfhc);
    match check(&options, &CancellationToken::new()).await {
        Err(gpu_operator::testrunner::TestRunnerError::ToolUnavailable {
            framework,
            program,
            why,
        }) => {
            assert_eq!(framework, Framework::Agfhc);
            assert!(program.ends_with("no-agfhc"), "{}", program.display());
            assert!(why.contains("cannot start"), "{why}");
        }
        other => panic!("expected ToolUnavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn no_gpus_means_a_failed_check_without_running_anything() {
    let rig = Rig::new(1);
    let mut options = rig.options("gst_single");
    options.host = HostRoot::new(rig.dir().join("empty-host"));
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(
        report.message(),
        r#"[{"number":1,"suitesResult":{"No GPU detected":{"detect_gpu":"failure"}},"status":"completed"}]"#
    );
    assert!(rig.rvs.invocations().is_empty());

    let mut options = rig.options("gst_single");
    options.device_ids = vec![5];
    let report = check(&options, &CancellationToken::new()).await.unwrap();
    assert!(
        report.message().contains("No GPU matches DeviceIDs [5]"),
        "{}",
        report.message()
    );
}

#[tokio::test]
async fn bad_input_is_an_error() {
    let rig = Rig::new(1);
    let e = check(&rig.options("../../bin/sh"), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(e, TestRunnerError::Recipe(_)), "{e}");
    let mut options = rig.options("gst_single");
    options.config_text = Some(config_json("MANUAL", r#"{"Iterations":0}"#));
    let e = check(&options, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("TestCases[0].Iterations"), "{e}");
    let mut options = rig.options("gst_single");
    options.iterations = Some(0);
    assert!(check(&options, &CancellationToken::new()).await.is_err());
    assert!(rig.rvs.invocations().is_empty());
}

#[tokio::test]
async fn cancelling_a_check_kills_the_test() {
    let rig = Rig::new(1);
    rig.rvs.modes(&["hang"]);
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let pid_dir = rig.rvs.path().to_path_buf();
    tokio::spawn(async move {
        // Cancel once the test is really running.
        support::wait::eventually("the test running", || {
            pid_dir.join("grandchild.pid").exists()
        })
        .await;
        stop.cancel();
    });
    let e = check(&rig.options("gst_single"), &cancel)
        .await
        .unwrap_err();
    assert!(matches!(e, TestRunnerError::Cancelled), "{e}");
    wait_gone(
        rig.rvs.wait_for_pid("grandchild.pid"),
        "the test's grandchild",
    );
}

/// Without Kubernetes (bare metal): no client and no Node, yet an unhealthy GPU
/// is tested, logged, counted and handed over (standalone mode's events file
/// records what `results` hands over).
#[tokio::test]
async fn the_service_runs_without_kubernetes() {
    use gpu_operator::service::Slot;
    use gpu_operator::testrunner::{GpuUnhealthy, TestRunnerConfig, TestRunnerService, Trigger};
    use std::sync::Arc;
    use tokio::sync::{mpsc, watch};

    let rig = Rig::new(2);
    let inventory = gpu_operator::device::discover(&rig.host);
    let mut bdfs: Vec<String> = inventory.gpus.iter().map(|g| g.bdf.clone()).collect();
    bdfs.sort();
    let (_inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory));
    // No Node: its watch is closed from the start.
    let node_rx = watch::channel(None).1;
    let (unhealthy, unhealthy_rx) = mpsc::channel(4);
    let service = TestRunnerService::new(None, None, inventory_rx, node_rx, unhealthy_rx);
    let mut stats = service.stats();
    let mut results = service.results();
    let mut slot = Slot::new(service);
    let logs = rig.dir().join("logs");
    slot.apply(Some(TestRunnerConfig {
        commands: rig.rvs.commands(),
        ..TestRunnerConfig::new(rig.host.clone(), "bare-metal", &logs)
    }))
    .await;
    unhealthy
        .send(GpuUnhealthy {
            bdf: bdfs[0].clone(),
            reasons: vec!["missing".into()],
        })
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        stats.wait_for(|s| s.total(Outcome::Passed) == 1),
    )
    .await
    .expect("the test ran")
    .unwrap();
    assert_eq!(
        stats.borrow().last[0].trigger,
        Trigger::AutoUnhealthyGpuWatch
    );
    assert_eq!(stats.borrow().last[0].gpu_indexes, [0]);
    let result = results
        .try_recv()
        .expect("the finished case is handed over");
    assert_eq!(result, stats.borrow().last[0]);
    assert!(results.try_recv().is_err(), "once");
    let calls = rig.rvs.invocations();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].contains("-i 0 -j"), "{calls:?}");
    assert!(logs_in(&logs).iter().any(|p| {
        p.to_string_lossy()
            .ends_with("_auto_unhealthy_gpu_watch_gst_single_result.json")
    }));
    slot.stop().await;
}
