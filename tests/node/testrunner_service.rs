//! The test runner as a node service against the API emulator: triggers (Node
//! annotation, unhealthy GPU, pre-start, periodic), result Events with the
//! reference's labels and message, the running-state Node labels, log files,
//! one run per GPU, and stopping mid-test. The tests run a stand-in rvs.

use crate::fake_rvs;
use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fake_rvs::{FakeRvs, config_json, kfd_ids, logs_in, wait_gone};
use gpu_operator::events::EventSink;
use gpu_operator::service::{ServiceState, Slot};
use gpu_operator::testrunner::{
    GpuUnhealthy, Outcome, TestRunnerConfig, TestRunnerService, TestRunnerStats, Trigger,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::node_rig::NodeRig;
use support::wait;
use tokio::sync::{mpsc, watch};

const NODE: &str = "gpu-node-1";
const REQUEST: &str = "amd.com/gpu-test-request";

/// The node (host, cluster, inventory feed) with the test runner under a
/// supervisor slot and the stand-in rvs.
struct Harness {
    node: NodeRig,
    rvs: FakeRvs,
    slot: Slot<TestRunnerService>,
    unhealthy: mpsc::Sender<GpuUnhealthy>,
    stats: watch::Receiver<TestRunnerStats>,
    /// PCI addresses in GPU index order.
    bdfs: Vec<String>,
}

impl std::ops::Deref for Harness {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.node
    }
}

impl Harness {
    async fn start(gpus: usize, config_text: Option<String>, modes: &[&str]) -> Self {
        let node = NodeRig::builder(NODE)
            .cluster(json!({}))
            .profile("mi210", Some(gpus), None)
            .feeds()
            .start()
            .await;
        let rvs = FakeRvs::new();
        rvs.modes(modes);
        let mut bdfs: Vec<String> = node
            .inventory()
            .borrow()
            .gpus
            .iter()
            .map(|g| g.bdf.clone())
            .collect();
        bdfs.sort();
        let (unhealthy, unhealthy_rx) = mpsc::channel(16);
        let client = node.client();
        let watch = node.cluster().watch_node(NODE);
        let events = EventSink::kubernetes(client.clone(), NODE, watch.clone());
        let service = TestRunnerService::new(
            Some(client),
            Some(events),
            node.inventory().subscribe(),
            watch,
            unhealthy_rx,
        );
        let stats = service.stats();
        let mut harness = Self {
            node,
            rvs,
            slot: Slot::new(service),
            unhealthy,
            stats,
            bdfs,
        };
        let config = harness.config(config_text);
        harness.slot.apply(Some(config)).await;
        harness
    }

    fn logs_dir(&self) -> PathBuf {
        self.dir().join("logs")
    }

    fn config(&self, config_text: Option<String>) -> TestRunnerConfig {
        TestRunnerConfig {
            config_text,
            commands: self.rvs.commands(),
            ..TestRunnerConfig::new(self.host.clone(), NODE, self.logs_dir())
        }
    }

    async fn request(&self, recipe: &str) {
        let nodes: Api<Node> = Api::all(self.client());
        nodes
            .patch(
                NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {REQUEST: recipe}}})),
            )
            .await
            .unwrap();
    }

    fn annotation(&self) -> Option<String> {
        self.node()["metadata"]["annotations"][REQUEST]
            .as_str()
            .map(str::to_owned)
    }

    /// The test runner's labels on the Node.
    fn running_labels(&self) -> BTreeMap<String, String> {
        serde_json::from_value::<BTreeMap<String, String>>(
            self.node()["metadata"]["labels"].clone(),
        )
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("testrunner.amd.com."))
        .collect()
    }

    /// The runner's core/v1 Events, oldest first.
    fn events(&self) -> Vec<Value> {
        let mut events: Vec<Value> = self
            .cluster()
            .list("v1", "Event")
            .into_iter()
            .filter(|e| e["source"]["component"] == "amd-test-runner")
            .collect();
        events.sort_by_key(|e| {
            e["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
        });
        events
    }

    fn events_with(&self, reason: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }

    /// Waits until `condition` holds; a timeout shows the Node, the Events
    /// and the calls of the stand-in rvs.
    async fn eventually(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        wait::eventually_explained(
            what,
            || condition(self),
            || {
                format!(
                    "node: {:#}\nevents: {:#?}\ncalls: {:#?}",
                    self.node(),
                    self.events(),
                    self.rvs.invocations()
                )
            },
        )
        .await
    }

    /// Asserts that `condition` holds for a while.
    async fn stays(&self, what: &str, duration: Duration, condition: impl Fn(&Self) -> bool) {
        let until = Instant::now() + duration;
        while Instant::now() < until {
            assert!(condition(self), "{what}: {:#?}", self.rvs.invocations());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn labels(event: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(event["metadata"]["labels"].clone()).unwrap()
}

fn message(event: &Value) -> Value {
    serde_json::from_str(event["message"].as_str().unwrap()).unwrap()
}

fn running_key(recipe: &str, index: u32) -> String {
    format!("testrunner.amd.com.gpu_health_check.{recipe}.gpu{index}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_annotation_runs_the_test_once_and_reports_it() {
    let mut h = Harness::start(2, None, &["slow:1"]).await;
    h.request("gst_single").await;

    // While it runs: a running label per GPU, and the stats say so.
    h.eventually("running labels", |h| {
        h.running_labels()
            == [
                (running_key("gst_single", 0), "running".to_owned()),
                (running_key("gst_single", 1), "running".to_owned()),
            ]
            .into()
    })
    .await;
    assert_eq!(h.stats.borrow().running.len(), 2);

    h.eventually("a TestPassed Event", |h| {
        h.events_with("TestPassed").len() == 1
    })
    .await;
    let event = &h.events_with("TestPassed")[0];
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["metadata"]["namespace"], "default");
    assert!(
        event["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("amd-test-runner-gpu-health-check-")
    );
    assert_eq!(event["involvedObject"]["kind"], "Node");
    assert_eq!(event["involvedObject"]["name"], NODE);
    assert_eq!(event["involvedObject"]["uid"], h.node()["metadata"]["uid"]);
    assert_eq!(event["source"]["host"], NODE);
    let kfd = kfd_ids(&h.host);
    let expected: BTreeMap<String, String> = [
        ("testrunner.amd.com/category", "gpu_health_check".to_owned()),
        ("testrunner.amd.com/trigger", "manual".to_owned()),
        ("testrunner.amd.com/recipe", "gst_single".to_owned()),
        ("testrunner.amd.com/hostname", NODE.to_owned()),
        ("testrunner.amd.com/framework", "RVS".to_owned()),
        ("testrunner.amd.com/gpu.id.0", kfd[0].to_string()),
        ("testrunner.amd.com/gpu.id.1", kfd[1].to_string()),
        (
            &format!("testrunner.amd.com/gpu.kfd.{}", kfd[0]),
            "0".to_owned(),
        ),
        (
            &format!("testrunner.amd.com/gpu.kfd.{}", kfd[1]),
            "1".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(labels(event), expected);
    assert_eq!(
        message(event),
        json!([{"number": 1, "status": "completed", "suitesResult": {
            "0": {"gst_single-action": "success"},
            "1": {"gst_single-action": "success"}}}])
    );

    // Afterwards: labels and the request are gone, the logs are there, and the
    // request does not run again.
    h.eventually("labels and request removed", |h| {
        h.running_labels().is_empty() && h.annotation().is_none()
    })
    .await;
    let receipt = h.node()["metadata"]["annotations"]["testrunner.amd.com/request-handled"].clone();
    assert!(
        receipt.is_string(),
        "the removal leaves its receipt: {receipt}"
    );
    let logs = logs_in(&h.logs_dir());
    assert!(
        logs.iter().any(|p| p
            .to_string_lossy()
            .ends_with("_manual_gst_single_result.json")),
        "{logs:?}"
    );
    h.stays("one run per request", Duration::from_millis(400), |h| {
        h.rvs.invocations().len() == 1 && h.events().len() == 1
    })
    .await;
    assert!(h.stats.borrow().running.is_empty());

    // Asking again with the same recipe runs it again.
    h.request("gst_single").await;
    h.eventually("a second run", |h| h.events_with("TestPassed").len() == 2)
        .await;
    h.eventually("request removed", |h| h.annotation().is_none())
        .await;
    assert_eq!(h.rvs.invocations().len(), 2);
    let stats = h.stats.borrow().clone();
    assert_eq!(stats.total(Outcome::Passed), 2);
    assert_eq!(stats.runs[0].trigger, Trigger::Manual);
    assert_eq!(stats.last[0].gpu_indexes, [0, 1]);
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_changed_during_a_run_is_kept_and_runs_next() {
    let mut h = Harness::start(1, None, &["slow:0.6", "pass"]).await;
    h.request("gst_single").await;
    h.eventually("first test running", |h| !h.running_labels().is_empty())
        .await;
    h.request("babel").await;
    h.eventually("both tests reported", |h| {
        h.events_with("TestPassed").len() == 2
    })
    .await;
    let recipes: Vec<String> = h
        .events()
        .iter()
        .map(|e| labels(e)["testrunner.amd.com/recipe"].clone())
        .collect();
    assert_eq!(recipes, ["gst_single", "babel"]);
    h.eventually("request removed after the second", |h| {
        h.annotation().is_none()
    })
    .await;
    h.stays("no further runs", Duration::from_millis(400), |h| {
        h.rvs.invocations().len() == 2
    })
    .await;
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_test_times_out_and_its_processes_are_killed() {
    let config = config_json("MANUAL", r#"{"Recipe":"gst_single","TimeoutSeconds":0.3}"#);
    let mut h = Harness::start(1, Some(config), &["hang"]).await;
    h.request("gst_single").await;
    h.eventually("a TestTimedOut Event", |h| {
        h.events_with("TestTimedOut").len() == 1
    })
    .await;
    let event = &h.events_with("TestTimedOut")[0];
    assert_eq!(event["type"], "Warning");
    assert_eq!(
        message(event),
        json!([{"number": 1, "status": "timed_out", "suitesResult": {"0": {"result": "timedout"}}}])
    );
    wait_gone(
        h.rvs.wait_for_pid("grandchild.pid"),
        "the test's grandchild",
    );
    h.eventually("labels and request removed", |h| {
        h.running_labels().is_empty() && h.annotation().is_none()
    })
    .await;
    assert_eq!(h.stats.borrow().total(Outcome::TimedOut), 1);
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_gpu_is_tested_once_its_gpu_is_free() {
    let config = r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":{
        "AUTO_UNHEALTHY_GPU_WATCH":{"TestCases":[{"Recipe":"gst_single"}]},
        "MANUAL":{"TestCases":[{"Recipe":"babel","Iterations":1}]}}}}}}}"#;
    let mut h = Harness::start(2, Some(config.into()), &["slow:1.5", "pass"]).await;

    // A whole-node manual test holds both GPUs...
    h.request("babel").await;
    h.eventually("manual test running", |h| {
        h.running_labels().contains_key(&running_key("babel", 1))
    })
    .await;
    // ...so the unhealthy GPU's test waits for it.
    h.unhealthy
        .send(GpuUnhealthy {
            bdf: h.bdfs[1].clone(),
            reasons: vec!["uncorrectable ECC errors".into()],
        })
        .await
        .unwrap();
    h.eventually("the test queued", |h| h.stats.borrow().queued == 1)
        .await;
    assert_eq!(
        h.rvs.invocations().len(),
        1,
        "it does not start on a busy GPU"
    );

    h.eventually("the unhealthy GPU's test", |h| {
        h.events()
            .iter()
            .any(|e| labels(e)["testrunner.amd.com/trigger"] == "auto_unhealthy_gpu_watch")
    })
    .await;
    let events = h.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(labels(&events[0])["testrunner.amd.com/recipe"], "babel");
    let auto = &events[1];
    assert_eq!(auto["reason"], "TestPassed");
    let auto_labels = labels(auto);
    assert_eq!(auto_labels["testrunner.amd.com/recipe"], "gst_single");
    assert!(auto_labels.contains_key("testrunner.amd.com/gpu.id.1"));
    assert!(!auto_labels.contains_key("testrunner.amd.com/gpu.id.0"));
    assert_eq!(
        message(auto),
        json!([{"number": 1, "status": "completed", "suitesResult": {"1": {"gst_single-action": "success"}}}])
    );
    let calls = h.rvs.invocations();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].contains("gst_single.conf -i 1 -j |"), "{calls:?}");
    assert!(
        calls[1].contains("trigger=AUTO_UNHEALTHY_GPU_WATCH"),
        "{calls:?}"
    );
    h.eventually("labels removed", |h| h.running_labels().is_empty())
        .await;
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_configs_are_reported_on_the_node() {
    let mut h = Harness::start(1, None, &["pass"]).await;
    h.request("../../bin/sh").await;
    h.eventually("a TestConfigError Event", |h| {
        h.events_with("TestConfigError").len() == 1
    })
    .await;
    let event = &h.events_with("TestConfigError")[0];
    assert_eq!(event["type"], "Warning");
    assert!(
        event["message"].as_str().unwrap().contains(REQUEST),
        "{event:#}"
    );
    h.eventually("request removed", |h| h.annotation().is_none())
        .await;
    assert!(h.rvs.invocations().is_empty());

    // A broken update keeps the previous configuration and says why.
    let broken = config_json("MANUAL", r#"{"Recipe":"mem","Iterations":0}"#);
    h.slot.apply(Some(h.config(Some(broken)))).await;
    h.eventually("a second TestConfigError Event", |h| {
        h.events_with("TestConfigError").len() == 2
    })
    .await;
    let event = &h.events_with("TestConfigError")[1];
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("TestCases[0].Iterations"),
        "{event:#}"
    );
    assert_eq!(h.slot.state(), ServiceState::Running);
    h.request("mem").await;
    h.eventually("the request still runs", |h| {
        h.events_with("TestPassed").len() == 1
    })
    .await;
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_start_runs_once_and_periodic_tests_repeat() {
    let config = r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":{
        "PRE_START_JOB_CHECK":{"TestCases":[{"Recipe":"mem"}]},
        "PERIODIC":{"IntervalSeconds":0.3,"TestCases":[{"Recipe":"babel"}]}}}}}}}"#;
    let mut h = Harness::start(1, Some(config.into()), &["pass"]).await;
    let count = |h: &Harness, trigger: &str| {
        h.events()
            .iter()
            .filter(|e| labels(e)["testrunner.amd.com/trigger"] == trigger)
            .count()
    };
    h.eventually("a pre-start run and two periodic runs", |h| {
        count(h, "pre_start_job_check") == 1 && count(h, "periodic") >= 2
    })
    .await;
    // Restarting the service does not run the pre-start test again.
    h.slot.apply(None).await;
    let config = h.config(Some(config.into()));
    h.slot.apply(Some(config)).await;
    let periodic = count(&h, "periodic");
    h.eventually("periodic runs continue", |h| {
        count(h, "periodic") > periodic
    })
    .await;
    assert_eq!(count(&h, "pre_start_job_check"), 1);
    let calls = h.rvs.invocations();
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.contains("trigger=PRE_START_JOB_CHECK"))
            .count(),
        1,
        "{calls:?}"
    );
    h.slot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_service_kills_a_running_test() {
    let mut h = Harness::start(1, None, &["hang"]).await;
    h.request("gst_single").await;
    h.eventually("running", |h| !h.running_labels().is_empty())
        .await;
    let grandchild = h.rvs.wait_for_pid("grandchild.pid");
    let started = Instant::now();
    h.slot.stop().await;
    assert!(started.elapsed() < Duration::from_secs(3));
    wait_gone(grandchild, "the test's grandchild");
    assert!(h.running_labels().is_empty(), "{:#}", h.node());
    assert!(h.events().is_empty(), "no result for a cut-short test");
    assert_eq!(
        h.annotation().as_deref(),
        Some("gst_single"),
        "the request stays, to run after a restart"
    );
}
