//! The node agent end to end: a simulated host, the API emulator, and a test
//! kubelet on unix sockets. Production code runs unmodified on top of them.

#[path = "fixtures/testrunner/fake_rvs.rs"]
mod fake_rvs;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu_operator::agent;
use gpu_operator::api::agent_status::{AgentStatus, STATUS_ANNOTATION, ServiceName, ServiceStatus};
use gpu_operator::host::HostRoot;
use gpu_operator::labeller::OWNED_ANNOTATION;
use gpu_operator::simulate::{self, SimSpec};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::bundles;
use support::cluster;
use support::dra_kubelet::DraKubelet;
use support::metricssvc;
use support::node_rig::{Modprobe, NodeRig};
use support::pod_resources::{FakeKubelet, pod, serve_kubelet};
use support::wait;

const NODE: &str = "gpu-node-1";
/// The driver version the harness's `modprobe` recorder loads.
const LOADABLE_VERSION: &str = "6.14.1";

/// The node the agent runs on: its rig, with the readings these tests take.
struct Harness(NodeRig);

impl std::ops::Deref for Harness {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.0
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut NodeRig {
        &mut self.0
    }
}

impl Harness {
    async fn start(profile: &str, partition: Option<&str>, node_labels: Value) -> Self {
        Self::start_with(SimSpec::new(profile, None, partition).unwrap(), node_labels).await
    }

    async fn start_with(spec: SimSpec, node_labels: Value) -> Self {
        Self::start_prepared(spec, cluster::node(NODE, node_labels), |_| {}).await
    }

    /// The agent on a simulated host of `spec` and on `node`, with `prepare`
    /// run on the host before the agent starts.
    async fn start_prepared(spec: SimSpec, node: Value, prepare: impl FnOnce(&HostRoot)) -> Self {
        let rig = NodeRig::builder(NODE)
            .cluster_with_node(node)
            .host(spec)
            .prepare(prepare)
            .kubelet()
            .start()
            .await;
        let mut harness = Self(rig);
        harness.spawn_agent();
        harness
    }

    fn spawn_agent(&mut self) {
        self.spawn_agent_with(None);
    }

    fn spawn_agent_with(&mut self, test_commands: Option<gpu_operator::testrunner::Commands>) {
        let driver = self.driver_manager(Modprobe::Loads(LOADABLE_VERSION));
        let config = self
            .agent_config()
            .health_socket(gpu_operator::metricssvc::DEFAULT_SOCKET.into())
            .test_commands(test_commands)
            .driver(driver)
            .build();
        self.start_agent(config);
    }

    /// Whether the Node's `AMDGPUDriverReady` has `status` and `reason`, and
    /// a message with each of `words`.
    fn driver_ready_is(&self, status: &str, reason: &str, words: &[&str]) -> bool {
        self.node()["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "AMDGPUDriverReady"
                    && c["status"] == status
                    && c["reason"] == reason
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| words.iter().all(|w| m.contains(w)))
            })
    }

    async fn apply_device_config(&self, name: &str, spec: Value) {
        self.cluster().apply_device_config(name, spec).await;
    }

    async fn delete_device_config(&self, name: &str) {
        self.cluster().delete_device_config(name).await;
    }

    /// The field managers in the Node's managedFields.
    fn field_managers(&self) -> Vec<String> {
        self.node()["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["manager"].as_str().map(str::to_owned))
            .collect()
    }

    fn labels(&self) -> BTreeMap<String, String> {
        serde_json::from_value(self.node()["metadata"]["labels"].clone()).unwrap_or_default()
    }

    fn status(&self) -> Option<AgentStatus> {
        let text = self.node()["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()?
            .to_owned();
        Some(AgentStatus::parse(&text).expect("status annotation parses"))
    }

    /// Waits until `condition` holds; a timeout shows the Node as last seen.
    async fn eventually(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        wait::eventually_explained(
            what,
            || condition(self),
            || format!("node: {:#}", self.node()),
        )
        .await
    }

    /// Stops the agent, which must stop cleanly; how long that took.
    async fn stop(&mut self) -> Duration {
        let (end, took) = self.stop_agent().await.expect("an agent runs");
        end.expect("agent task did not panic")
            .expect("agent stops cleanly");
        took
    }
}

fn plugin_sockets(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("amd.com_"))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_the_services_its_device_config_enables() {
    // The Node still carries the status an earlier agent wrote. With no
    // DeviceConfig selecting it, the agent's first reconcile removes it: the
    // evidence that the agent has looked at the unselected node.
    let mut node = cluster::node(NODE, json!({"feature.node.kubernetes.io/amd-gpu": "true"}));
    node["metadata"]["annotations"] = json!({STATUS_ANNOTATION: AgentStatus::default().to_json()});
    let spec = SimSpec::new("mi300x", None, None).unwrap();
    let mut h = Harness::start_prepared(spec, node, |_| {}).await;
    h.eventually("the stale status removed", |h| {
        h.node()["metadata"]["annotations"]
            .get(STATUS_ANNOTATION)
            .is_none()
    })
    .await;
    // Nothing selects the node yet: nothing runs and no status is published.
    assert!(h.status().is_none(), "{:#}", h.node());
    assert!(h.kubelet().registrations().is_empty());

    h.apply_device_config(
        "gpus",
        json!({"selector": {"feature.node.kubernetes.io/amd-gpu": "true"}, "devicePlugin": {}}),
    )
    .await;
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    assert_eq!(registered.request.version, "v1beta1");
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    assert_eq!(devices.next().await.len(), 8);

    h.eventually("GPU labels", |h| {
        let labels = h.labels();
        labels.get("amd.com/gpu.family").map(String::as_str) == Some("AI")
            && labels.get("amd.com/gpu.vram").map(String::as_str) == Some("192G")
            && labels.get("amd.com/gpu.product-name").map(String::as_str)
                == Some("AMD_Instinct_MI300X")
    })
    .await;
    assert_eq!(
        h.labels()
            .get("feature.node.kubernetes.io/amd-gpu")
            .map(String::as_str),
        Some("true"),
        "labels the agent did not write are kept"
    );
    h.eventually("status following the DeviceConfig", |h| {
        h.status().is_some_and(|s| {
            s.device_config == Some("kube-amd-gpu/gpus".into())
                && s.generation == Some(1)
                && s.services.contains_key(&ServiceName::DevicePlugin)
                && s.services.contains_key(&ServiceName::Labeller)
                && s.resources.get("amd.com/gpu") == Some(&8)
        })
    })
    .await;

    // Idle: only the watches stay open; no request for a few seconds. (The
    // first half second lets writes already under way land; the next three
    // must see none.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = h.cluster().requests();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let made = h.cluster().requests().since(&before);
    assert_eq!(
        made.non_watch().total(),
        0,
        "an idle agent made requests:\n{made}"
    );

    // Disabling the labeller removes exactly the labels it wrote; the plugin keeps running.
    h.apply_device_config(
        "gpus",
        json!({"selector": {"feature.node.kubernetes.io/amd-gpu": "true"},
               "devicePlugin": {"enableNodeLabeller": false}}),
    )
    .await;
    h.eventually("GPU labels removed", |h| {
        let labels = h.labels();
        !labels.keys().any(|k| k.contains("amd.com/gpu."))
            && labels.contains_key("feature.node.kubernetes.io/amd-gpu")
            && h.node()["metadata"]["annotations"]
                .get(OWNED_ANNOTATION)
                .is_none()
    })
    .await;
    h.eventually("generation 2 applied", |h| {
        h.status().is_some_and(|s| {
            s.generation == Some(2) && !s.services.contains_key(&ServiceName::Labeller)
        })
    })
    .await;
    assert_eq!(
        h.kubelet().registrations().len(),
        1,
        "the plugin was not restarted"
    );

    // Deselecting the node (the DeviceConfig goes away) tears everything down:
    // sockets, labels, the status annotation.
    h.delete_device_config("gpus").await;
    h.eventually("torn down", |h| {
        h.status().is_none() && !h.labels().keys().any(|k| k.contains("amd.com/gpu."))
    })
    .await;
    h.eventually("sockets removed", |h| {
        plugin_sockets(h.kubelet().dir()).is_empty()
    })
    .await;

    // SIGTERM: services stop, sockets are removed, well within 5 s.
    let took = h.stop().await;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    assert!(
        plugin_sockets(h.kubelet().dir()).is_empty(),
        "{:?}",
        plugin_sockets(h.kubelet().dir())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_device_configs_run_nothing_and_warn() {
    let mut h = Harness::start("mi210", None, json!({"gpu": "amd"})).await;
    h.apply_device_config(
        "one",
        json!({"selector": {"gpu": "amd"}, "devicePlugin": {}}),
    )
    .await;
    h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    h.apply_device_config("two", json!({})).await;
    h.eventually("conflict in status", |h| {
        h.status().is_some_and(|s| {
            s.device_config.is_none()
                && s.services
                    .keys()
                    .all(|k| *k == ServiceName::MetricsExporter)
                && s.problems
                    .iter()
                    .any(|p| p.contains("kube-amd-gpu/one") && p.contains("kube-amd-gpu/two"))
        })
    })
    .await;
    h.eventually("plugin sockets removed", |h| {
        plugin_sockets(h.kubelet().dir()).is_empty()
    })
    .await;
    let events = h.cluster().list("events.k8s.io/v1", "Event");
    let warning = events
        .iter()
        .find(|e| e["reason"] == "ConflictingDeviceConfigs")
        .unwrap_or_else(|| panic!("no conflict Event in {events:#?}"));
    assert_eq!(warning["type"], "Warning");
    assert_eq!(warning["regarding"]["kind"], "Node");
    assert!(
        warning["note"]
            .as_str()
            .unwrap()
            .contains("kube-amd-gpu/two")
    );

    // Resolving the conflict brings the services back.
    h.delete_device_config("two").await;
    h.kubelet().wait_for_registration("amd.com/gpu", 2).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repartitioning_updates_devices_and_labels_without_restart() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"nodeLabellerArguments": ["-compute-memory-partition"]}}),
    )
    .await;
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    assert_eq!(devices.next().await.len(), 8);
    h.eventually("spx label", |h| {
        h.labels()
            .get("amd.com/gpu.compute-memory-partition")
            .map(String::as_str)
            == Some("spx_nps1")
    })
    .await;

    simulate::write_host(
        &h.host,
        &SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap(),
    )
    .unwrap();
    let listed = devices
        .next_matching("64 partitions", |d| d.len() == 64)
        .await;
    assert_eq!(listed.len(), 64);
    h.eventually("cpx label", |h| {
        h.labels()
            .get("amd.com/gpu.compute-memory-partition")
            .map(String::as_str)
            == Some("cpx_nps4")
    })
    .await;
    assert_eq!(
        h.kubelet().registrations().len(),
        1,
        "no restart or re-registration needed"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharing_follows_the_device_config_and_a_node_label_overrides_it_live() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"devicePluginArguments": {"time_slicing_replicas": "2"}}}),
    )
    .await;
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    devices
        .next_matching("16 replicas", |d| d.len() == 16)
        .await;
    h.eventually("the sharing labels", |h| {
        let labels = h.labels();
        labels.get("amd.com/gpu.replicas").map(String::as_str) == Some("2")
            && labels
                .get("amd.com/gpu.sharing-strategy")
                .map(String::as_str)
                == Some("time-slicing")
            && labels
                .get("amd.com/gpu.product-name")
                .is_some_and(|p| p.ends_with("-SHARED"))
    })
    .await;

    // The node's own count wins, live.
    h.cluster()
        .label_node(NODE, "amd.com/gpu.sharing-replicas", Some("4"))
        .await;
    devices
        .next_matching("32 replicas", |d| d.len() == 32)
        .await;
    h.eventually("replicas=4", |h| {
        h.labels().get("amd.com/gpu.replicas").map(String::as_str) == Some("4")
    })
    .await;
    // A count it cannot use is reported; the DeviceConfig's count serves.
    h.cluster()
        .label_node(NODE, "amd.com/gpu.sharing-replicas", Some("100"))
        .await;
    devices
        .next_matching("16 replicas again", |d| d.len() == 16)
        .await;
    h.eventually("the problem in the agent's status", |h| {
        h.status().is_some_and(|s| {
            s.problems
                .iter()
                .any(|p| p.contains("amd.com/gpu.sharing-replicas") && p.contains("from 1 to 64"))
        })
    })
    .await;
    // 1 on the node: no sharing there.
    h.cluster()
        .label_node(NODE, "amd.com/gpu.sharing-replicas", Some("1"))
        .await;
    devices.next_matching("8 GPUs", |d| d.len() == 8).await;
    h.eventually("sharing-strategy none", |h| {
        let labels = h.labels();
        labels
            .get("amd.com/gpu.sharing-strategy")
            .map(String::as_str)
            == Some("none")
            && labels
                .get("amd.com/gpu.product-name")
                .is_some_and(|p| !p.ends_with("-SHARED"))
    })
    .await;
    assert_eq!(
        h.kubelet().registrations().len(),
        1,
        "the replica count changes without re-registering"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_survives_api_errors() {
    let mut h = Harness::start("radeon-w7900", None, json!({})).await;
    let counted = || {
        let c = gpu_operator::metrics::agent::counters();
        c.api_errors + c.service_restarts
    };
    let before = counted();
    // The first status writes fail; the agent retries and still converges.
    h.cluster().faults().fail_next(2, "patch", "nodes", 500);
    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    h.eventually("labels despite failed patches", |h| {
        h.labels().contains_key("amd.com/gpu.family")
    })
    .await;
    h.eventually("status despite failed patches", |h| {
        h.status().is_some_and(|s| s.device_config.is_some())
    })
    .await;
    // Each failed write shows in the agent's own metrics as an API error
    // (the Node writer counts every failed request, retried or not).
    assert!(counted() >= before + 2, "{} -> {}", before, counted());
    // A dropped watch is resumed: a later change still arrives.
    h.cluster().faults().drop_watches();
    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"enableNodeLabeller": false}}),
    )
    .await;
    h.eventually("labels removed after watch drop", |h| {
        !h.labels().contains_key("amd.com/gpu.family")
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_metrics_config_map_is_reported_and_a_fixed_one_clears_it() {
    let mut h = Harness::start("radeon-w7900", None, json!({})).await;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(h.cluster().client(), cluster::NAMESPACE);
    let bad: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "metrics"}, "data": {"config.json": "{\"GPUConfig\": [oops"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &bad).await.unwrap();
    h.apply_device_config(
        "gpus",
        json!({"metricsExporter": {"enable": true, "config": {"name": "metrics"}}}),
    )
    .await;
    let rejected = |h: &Harness| {
        h.status().is_some_and(|s| {
            s.problems
                .iter()
                .any(|p| p.starts_with("metrics config rejected"))
        })
    };
    h.eventually("the rejected config in the status", rejected)
        .await;
    h.eventually("a MetricsConfigError Event", |h| {
        h.cluster()
            .list("events.k8s.io/v1", "Event")
            .iter()
            .any(|e| e["reason"] == "MetricsConfigError")
    })
    .await;
    // Editing the ConfigMap reloads the exporter's config: the problem clears.
    api.patch(
        "metrics",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"data": {"config.json": "{\"GPUConfig\": {\"Labels\": [\"GPU_UUID\"]}}"}}),
        ),
    )
    .await
    .unwrap();
    h.eventually("the problem cleared", |h| {
        h.status().is_some() && !rejected(h)
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heterogeneous_layouts_warn_with_single_and_split_with_mixed() {
    let spec = SimSpec::new("mi300x", Some(4), Some("spx_nps1"))
        .unwrap()
        .with_gpu_partition(0, "cpx_nps4")
        .unwrap();
    let mut h = Harness::start_with(spec, json!({})).await;
    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    h.eventually("layout conflict in status", |h| {
        h.status().is_some_and(|s| {
            s.problems
                .iter()
                .any(|p| p.contains("cpx_nps4") && p.contains("spx_nps1"))
        })
    })
    .await;
    let events = h.cluster().list("events.k8s.io/v1", "Event");
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "PartitionLayoutConflict" && e["type"] == "Warning"),
        "{events:#?}"
    );

    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"devicePluginArguments": {"resource_naming_strategy": "mixed"}}}),
    )
    .await;
    let cpx = h
        .kubelet()
        .wait_for_registration("amd.com/cpx_nps4", 1)
        .await;
    let spx = h
        .kubelet()
        .wait_for_registration("amd.com/spx_nps1", 1)
        .await;
    assert_ne!(
        cpx.request.endpoint, spx.request.endpoint,
        "one socket per resource"
    );
    h.eventually("both sockets", |h| {
        plugin_sockets(h.kubelet().dir()) == ["amd.com_cpx_nps4.sock", "amd.com_spx_nps1.sock"]
    })
    .await;
    h.eventually("problem cleared", |h| {
        h.status().is_some_and(|s| {
            s.problems.is_empty() && s.resources.get("amd.com/cpx_nps4") == Some(&8)
        })
    })
    .await;
    h.stop().await;
}

/// After a boot into a node whose managed amdgpu is not loaded yet (as
/// after a driver upgrade's reboot), the pre-start check waits for the
/// driver: it runs once, after `modprobe`, and passes. Started at once, it
/// would test a node with no GPU and fail (the stand-in fails every GPU
/// while `/sys/module/amdgpu` is missing, as real rvs finds none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_start_check_waits_for_the_driver_the_device_config_manages() {
    let rvs = fake_rvs::FakeRvs::new();
    rvs.modes(&["pass"]);
    let spec = SimSpec::new("mi210", Some(2), None).unwrap();
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        simulate::unload_module(host).unwrap();
    })
    .await;
    rvs.needs(&h.host.path("/sys/module/amdgpu"));
    let _ = h.stop_agent().await;
    h.spawn_agent_with(Some(rvs.commands()));
    let config = fake_rvs::config_json("PRE_START_JOB_CHECK", r#"{"Recipe":"gst_single"}"#);
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(h.cluster().client(), cluster::NAMESPACE);
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "gpu-tests"}, "data": {"config.json": config}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    // No bundle in the store yet: the driver cannot load, and the check
    // must not run meanwhile.
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": LOADABLE_VERSION},
               "testRunner": {"enable": true, "config": {"name": "gpu-tests"}}}),
    )
    .await;
    h.eventually("the driver refused for want of a bundle", |h| {
        h.driver_ready_is("False", "BundleMissingForKernel", &[])
    })
    .await;
    h.eventually("the test runner says it waits for the driver", |h| {
        h.status().is_some_and(|s| {
            s.services
                .get(&gpu_operator::api::agent_status::ServiceName::TestRunner)
                .and_then(|t| t.unavailable_reason())
                .is_some_and(|why| {
                    why.contains("tests wait") && why.contains("BundleMissingForKernel")
                })
        })
    })
    .await;
    assert!(
        rvs.invocations().is_empty(),
        "no test before the driver: {:?}",
        rvs.invocations()
    );
    h.add_driver_bundle(LOADABLE_VERSION, true);
    h.eventually("the pre-start check passed", |h| {
        h.cluster().list("v1", "Event").iter().any(|e| {
            e["reason"] == "TestPassed"
                && e["metadata"]["labels"]["testrunner.amd.com/trigger"] == "pre_start_job_check"
        })
    })
    .await;
    assert_eq!(h.modprobe_runs().len(), 1, "loaded once");
    let runs = rvs.invocations();
    assert_eq!(runs.len(), 1, "the check ran once: {runs:?}");
    assert!(runs[0].contains("trigger=PRE_START_JOB_CHECK"), "{runs:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ecc_error_marks_the_gpu_unhealthy_everywhere_and_triggers_the_test() {
    let rvs = fake_rvs::FakeRvs::new();
    rvs.modes(&["pass"]);
    let mut h = Harness::start("mi210", None, json!({})).await;
    // Restart the agent with the stand-in test tool.
    let _ = h.stop_agent().await;
    h.spawn_agent_with(Some(rvs.commands()));

    let config = fake_rvs::config_json("AUTO_UNHEALTHY_GPU_WATCH", r#"{"Recipe":"gst_single"}"#);
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(h.cluster().client(), cluster::NAMESPACE);
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "gpu-tests"}, "data": {"config.json": config}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    h.apply_device_config(
        "gpus",
        json!({"testRunner": {"enable": true, "config": {"name": "gpu-tests"}}, "devicePlugin": {}}),
    )
    .await;
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    let bdf = "0000:03:00.0";
    devices
        .next_matching("all healthy", |d| {
            d.len() == 4 && d.iter().all(|x| x.health == "Healthy")
        })
        .await;

    simulate::set_ecc_counts(&h.host, bdf, "umc", 1, 0).unwrap();
    let listed = devices
        .next_matching("the GPU unhealthy", |d| {
            support::kubelet::health_of(d, bdf) == Some("Unhealthy")
        })
        .await;
    assert_eq!(listed.iter().filter(|d| d.health == "Healthy").count(), 3);
    h.eventually("the AMDGPUUnhealthy condition", |h| {
        h.node()["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "AMDGPUUnhealthy" && c["status"] == "True")
            })
    })
    .await;
    h.eventually("the triggered test reported", |h| {
        h.cluster().list("v1", "Event").iter().any(|e| {
            e["reason"] == "TestPassed"
                && e["metadata"]["labels"]["testrunner.amd.com/trigger"]
                    == "auto_unhealthy_gpu_watch"
        })
    })
    .await;
    assert!(
        rvs.invocations()
            .iter()
            .any(|c| c.contains("trigger=AUTO_UNHEALTHY_GPU_WATCH"))
    );

    // Recovery: the device and the condition come back.
    simulate::set_ecc_counts(&h.host, bdf, "umc", 0, 0).unwrap();
    devices
        .next_matching("the GPU healthy again", |d| {
            support::kubelet::health_of(d, bdf) == Some("Healthy")
        })
        .await;
    h.eventually("the condition cleared", |h| {
        h.node()["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "AMDGPUUnhealthy" && c["status"] == "False")
            })
    })
    .await;
    // Without a DeviceConfig the condition is removed, not left behind.
    h.delete_device_config("gpus").await;
    h.eventually("the condition removed", |h| {
        !h.node()["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "AMDGPUUnhealthy"))
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_discovery_completes_only_metrics_run_the_status_says_why_and_an_event_warns() {
    let spec = SimSpec::new("mi300x", Some(2), None).unwrap();
    let mut hung = Vec::new();
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        hung = support::hosts::hang_past_the_scan_deadline(host);
    })
    .await;
    h.apply_device_config(
        "gpus",
        json!({"metricsExporter": {"enable": true}, "devicePlugin": {}}),
    )
    .await;
    let discovering = |h: &Harness| {
        h.status().is_some_and(|s| {
            s.problems
                .iter()
                .any(|p| p.starts_with("GPU discovery has not completed yet"))
                && matches!(
                    s.services.get(&ServiceName::DevicePlugin),
                    Some(ServiceStatus::Unavailable { reason }) if reason.contains("discovery")
                )
                && matches!(
                    s.services.get(&ServiceName::MetricsExporter),
                    Some(ServiceStatus::Unavailable { .. })
                )
        })
    };
    h.eventually("a status that says discovery is under way", discovering)
        .await;
    assert!(
        h.kubelet().registrations().is_empty(),
        "no device plugin before the GPUs are known"
    );
    h.eventually("a DiscoveryIncomplete Event", |h| {
        h.cluster()
            .list("events.k8s.io/v1", "Event")
            .iter()
            .any(|e| e["reason"] == "DiscoveryIncomplete")
    })
    .await;
    assert!(discovering(&h), "still discovering: {:#}", h.node());

    for file in &hung {
        simulate::release_hung_file(&h.host, file, "1").unwrap();
    }
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    assert_eq!(devices.next().await.len(), 2);
    h.eventually("the discovery problem cleared", |h| {
        h.status().is_some_and(|s| {
            !s.problems.iter().any(|p| p.contains("GPU discovery"))
                && s.services.get(&ServiceName::MetricsExporter) == Some(&ServiceStatus::Running)
        })
    })
    .await;
    h.stop().await;
}

/// Labels the reference's labeller (or an earlier version of ours, with its
/// owned-keys annotation) wrote under the same keys are taken over through
/// server-side apply, and removed with the rest when the labeller is disabled;
/// labels nobody handed over are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_written_before_are_taken_over_and_removed_with_the_rest() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.cluster().client());
    // The reference wrote family (the same value we want) and a count we will
    // not want; an earlier version of ours listed vram as its own.
    nodes
        .patch(
            NODE,
            &PatchParams {
                field_manager: Some("amd-gpu-node-labeller".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"metadata": {
                "labels": {"amd.com/gpu.family": "AI", "amd.com/gpu.admin-note": "keep",
                           "amd.com/gpu.vram": "64G"},
                "annotations": {OWNED_ANNOTATION: "amd.com/gpu.vram"},
            }})),
        )
        .await
        .unwrap();
    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    h.eventually("labels applied and the old annotation retired", |h| {
        let labels = h.labels();
        labels.get("amd.com/gpu.vram").map(String::as_str) == Some("192G")
            && labels.get("amd.com/gpu.family").map(String::as_str) == Some("AI")
            && h.node()["metadata"]["annotations"]
                .get(OWNED_ANNOTATION)
                .is_none()
    })
    .await;
    let managers = h.field_managers();
    assert!(
        managers.iter().any(|m| m == "gpu-operator-labeller"),
        "labels are applied under the labeller's own manager: {managers:?}"
    );

    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"enableNodeLabeller": false}}),
    )
    .await;
    h.eventually("taken-over labels removed, the admin's kept", |h| {
        let labels = h.labels();
        !labels.contains_key("amd.com/gpu.family")
            && !labels.contains_key("amd.com/gpu.vram")
            && !labels.contains_key("amd.com/gpu.product-name")
            && labels.get("amd.com/gpu.admin-note").map(String::as_str) == Some("keep")
    })
    .await;
    h.stop().await;
}

/// The reference operator's `gpu.operator.amd.com/<ns>.<name>.driver` label:
/// written while the selecting DeviceConfig has `driver.enable`, under its own
/// field manager (so switching the labeller off leaves it), removed when the
/// driver is disabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_type_label_follows_driver_enable_not_the_labeller() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    let key = format!("gpu.operator.amd.com/{}.gpus.driver", cluster::NAMESPACE);
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true}, "devicePlugin": {"enableNodeLabeller": false}}),
    )
    .await;
    h.eventually("the driver type label", |h| {
        h.labels().get(&key).map(String::as_str) == Some("container")
    })
    .await;
    let managers = h.field_managers();
    assert!(
        managers.iter().any(|m| m == "gpu-operator-driver"),
        "{managers:?}"
    );
    h.apply_device_config("gpus", json!({"driver": {"enable": false}}))
        .await;
    h.eventually("the label removed with driver.enable false", |h| {
        !h.labels().contains_key(&key)
    })
    .await;
    h.stop().await;
}

/// An agent that restarts decides nothing before it has listed the
/// DeviceConfigs: with the list slow (as on a busy API server), 20 restarts
/// in a row never remove, even for a moment, the agent's driver label, its
/// `AMDGPUDriverReady` condition or its status annotation. Every version of
/// the Node is watched, not sampled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_never_remove_the_agents_own_label_condition_or_status() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let mut h = Harness::start("mi300x", None, json!({})).await;
    let loaded = simulate::SimModule::default()
        .version
        .expect("the simulated driver has a version");
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": loaded}}),
    )
    .await;
    let label = format!("gpu.operator.amd.com/{}.gpus.driver", cluster::NAMESPACE);
    let missing = move |node: &Value| -> Vec<&'static str> {
        let mut missing = Vec::new();
        if node["metadata"]["labels"][&label].is_null() {
            missing.push("driver label");
        }
        if node["metadata"]["annotations"][STATUS_ANNOTATION].is_null() {
            missing.push("status annotation");
        }
        let condition = node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "AMDGPUDriverReady" && c["status"] == "True");
        if !condition {
            missing.push("AMDGPUDriverReady=True");
        }
        missing
    };
    h.eventually("label, condition and status written", |h| {
        missing(&h.node()).is_empty()
    })
    .await;
    // Every version of the Node from now on.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.cluster().client());
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let recorder = tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
        let mut events = watcher::watcher(nodes, config).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event {
                let _ = seen_tx.send(serde_json::to_value(node).unwrap_or_default());
            }
        }
    });
    // The list the review's race lost: slow, so that a start that decided
    // before it would do so every time.
    h.cluster()
        .faults()
        .add_latency("list", "deviceconfigs.amd.com", Duration::from_millis(300));
    for restart in 1..=20 {
        h.stop().await;
        let before = h.cluster().requests();
        h.spawn_agent();
        // Listed: the watch that follows the list has started.
        h.eventually(&format!("restart {restart}: DeviceConfigs listed"), |h| {
            h.cluster()
                .requests()
                .since(&before)
                .get("watch", "deviceconfigs.amd.com")
                > 0
        })
        .await;
    }
    // A mark written after the last restart: once the recorder has it, it
    // has every version before it.
    h.cluster()
        .label_node(NODE, "test-mark", Some("done"))
        .await;
    let mut versions = 0;
    loop {
        let node = wait::within("the recorder sees the mark", seen.recv())
            .await
            .expect("the recorder runs");
        versions += 1;
        let gone = missing(&node);
        assert!(
            gone.is_empty(),
            "version {versions} of the Node lacks {gone:?}: {:#}",
            node["metadata"]
        );
        if node["metadata"]["labels"]["test-mark"] == "done" {
            break;
        }
    }
    recorder.abort();
    h.stop().await;
}

/// `AMDGPUDriverReady` says what runs against what the DeviceConfig asks
/// for, written by the agent's driver concern, and goes with the DeviceConfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_ready_condition_follows_the_asked_version_and_goes_with_the_device_config() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    let condition = |h: &Harness| {
        h.node()["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == "AMDGPUDriverReady")
                .cloned()
        })
    };
    let loaded = simulate::SimModule::default()
        .version
        .expect("the simulated driver has a version");
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": "9.9.9"}}),
    )
    .await;
    // Another version is asked for, and the store has no bundle for it.
    h.eventually("False: no bundle for the version asked for", |h| {
        condition(h).is_some_and(|c| {
            c["status"] == "False"
                && c["reason"] == "BundleMissingForKernel"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(simulate::SIM_KERNEL_RELEASE))
        })
    })
    .await;
    assert!(h.modprobe_runs().is_empty());
    assert!(
        h.field_managers()
            .iter()
            .any(|m| m == "gpu-operator-driver"),
        "{:?}",
        h.field_managers()
    );
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": loaded}}),
    )
    .await;
    h.eventually("True: the version asked for runs", |h| {
        condition(h).is_some_and(|c| c["status"] == "True" && c["reason"] == "DriverLoaded")
    })
    .await;
    h.delete_device_config("gpus").await;
    h.eventually("removed with the DeviceConfig", |h| condition(h).is_none())
        .await;
    h.stop().await;
}

/// The agent loads the driver a DeviceConfig asks for from the host's
/// bundle store, and only from a bundle that verifies: each refusal is on
/// the condition and in an Event with its reason, nothing is loaded until a
/// good bundle is there, and then `modprobe` runs once, on that bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_loads_only_a_verified_bundle_and_names_each_refusal() {
    let kernel = simulate::SIM_KERNEL_RELEASE;
    let spec = SimSpec::new("mi300x", Some(2), None).unwrap();
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        simulate::unload_module(host).unwrap();
        // Secure Boot on: modules must be signed.
        host.write(
            gpu_operator::driver::report::SECURE_BOOT_VAR,
            [7u8, 0, 0, 0, 1],
        )
        .unwrap();
        // Only a bundle for another kernel.
        bundles::write_bundle(host, LOADABLE_VERSION, "6.9.0-1-other", true);
    })
    .await;
    let condition = |h: &Harness| {
        h.node()["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == "AMDGPUDriverReady")
                .cloned()
        })
    };
    let refused = |reason: &'static str| {
        move |h: &Harness| {
            condition(h).is_some_and(|c| c["status"] == "False" && c["reason"] == reason)
                && h.status()
                    .and_then(|s| s.driver_load)
                    .is_some_and(|l| l.reason == reason)
        }
    };
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": LOADABLE_VERSION}}),
    )
    .await;
    h.eventually(
        "no bundle for the running kernel",
        refused("BundleMissingForKernel"),
    )
    .await;
    // A bundle for the running kernel whose firmware was changed after its
    // manifest was written: made outside the store, then moved in whole, so
    // that the agent never sees it intact.
    let bundle = bundles::bundle_dir(LOADABLE_VERSION, kernel);
    let staged = "/var/tmp/staged-bundle";
    bundles::write_bundle_at(&h.host, staged, LOADABLE_VERSION, kernel, true);
    h.host
        .write(
            format!("{staged}/firmware/amdgpu/psp_13_0_6_sos.bin"),
            "tampered",
        )
        .unwrap();
    std::fs::rename(h.host.path(staged), h.host.path(&bundle)).unwrap();
    h.eventually(
        "a file that does not match its sha256",
        refused("ChecksumMismatch"),
    )
    .await;
    // Intact, but unsigned while Secure Boot is on.
    h.host.remove_all(&bundle).unwrap();
    bundles::write_bundle(&h.host, LOADABLE_VERSION, kernel, false);
    h.eventually(
        "an unsigned module under Secure Boot",
        refused("UnsignedModule"),
    )
    .await;
    assert!(
        h.modprobe_runs().is_empty(),
        "nothing is loaded from a refused bundle"
    );
    // A signed, intact bundle: loaded, once.
    h.host.remove_all(&bundle).unwrap();
    bundles::write_bundle(&h.host, LOADABLE_VERSION, kernel, true);
    h.eventually("the driver asked for runs", |h| {
        condition(h).is_some_and(|c| c["status"] == "True" && c["reason"] == "DriverLoaded")
            && h.status().is_some_and(|s| {
                s.driver
                    .is_some_and(|d| d.version.as_deref() == Some(LOADABLE_VERSION))
            })
    })
    .await;
    let runs = h.modprobe_runs();
    let expected = format!("--dirname {} amdgpu", h.host.path(&bundle).display());
    assert_eq!(runs, [expected], "modprobe ran once, on the bundle");
    assert_eq!(
        h.host
            .read_attr(gpu_operator::driver::load::FIRMWARE_PATH_PARAM)
            .unwrap(),
        format!("{bundle}/firmware")
    );
    // Each refusal was an Event, and so was the load.
    let events = h.cluster().list("events.k8s.io/v1", "Event");
    for reason in [
        "BundleMissingForKernel",
        "ChecksumMismatch",
        "UnsignedModule",
        "DriverLoaded",
    ] {
        assert!(
            events.iter().any(|e| e["reason"] == reason),
            "no {reason} Event in {events:#?}"
        );
    }
    h.stop().await;
}

/// `kernelModuleConfig.loadArgs` reach `modprobe` only when kmod would read
/// every word as a reporting option: abbreviations of `--config` and
/// `--dirname` (the review's `--conf=`, `--di=`) are refused with the entries
/// named on the status, and nothing runs; allowed spellings are passed as
/// they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abbreviated_modprobe_options_never_reach_modprobe() {
    let kernel = simulate::SIM_KERNEL_RELEASE;
    let spec = SimSpec::new("mi300x", Some(1), None).unwrap();
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        simulate::unload_module(host).unwrap();
        bundles::write_bundle(host, LOADABLE_VERSION, kernel, true);
    })
    .await;
    let module_config = |load_args: Value| {
        json!({"driver": {"enable": true, "version": LOADABLE_VERSION,
            "kernelModuleConfig": {"loadArgs": load_args, "parameters": ["ras_enable=1"]}}})
    };
    h.apply_device_config(
        "gpus",
        module_config(json!([
            "-v",
            "--conf=/tmp/x/evil.conf",
            "--di=/tmp/x/unverified"
        ])),
    )
    .await;
    h.eventually("the module configuration is refused", |h| {
        h.status().and_then(|s| s.driver_load).is_some_and(|l| {
            l.reason == "ModuleConfigInvalid"
                && l.message.contains("loadArgs[1]")
                && l.message.contains("--conf means --config")
                && l.message.contains("loadArgs[2]")
                && l.message.contains("--di means --dirname")
        })
    })
    .await;
    assert!(
        h.modprobe_runs().is_empty(),
        "nothing runs with a refused option"
    );
    h.apply_device_config("gpus", module_config(json!(["-vq", "--verb"])))
        .await;
    h.eventually("the driver is loaded", |h| {
        h.status()
            .and_then(|s| s.driver)
            .is_some_and(|d| d.version.as_deref() == Some(LOADABLE_VERSION))
    })
    .await;
    let bundle = bundles::bundle_dir(LOADABLE_VERSION, kernel);
    assert_eq!(
        h.modprobe_runs(),
        [format!(
            "--dirname {} -vq --verb amdgpu ras_enable=1",
            h.host.path(&bundle).display()
        )],
        "only the allowed options, once"
    );
    h.stop().await;
}

/// An out-of-tree amdgpu of another version is replaced only once nothing
/// holds it: a process in a pod with `/dev/kfd` open is named on the
/// condition and nothing is unloaded; once it is gone, the agent unloads the
/// running module and loads the bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_in_use_is_not_unloaded_and_its_holder_is_named() {
    let spec = SimSpec::new("mi300x", Some(1), None).unwrap();
    let pod_uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        bundles::write_bundle(host, LOADABLE_VERSION, simulate::SIM_KERNEL_RELEASE, true);
        host.write("/proc/4242/comm", "python3\n").unwrap();
        host.write(
            "/proc/4242/cgroup",
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/c\n",
                pod_uid.replace('-', "_")
            ),
        )
        .unwrap();
        host.symlink("/dev/kfd", "/proc/4242/fd/3").unwrap();
    })
    .await;
    let running = simulate::SimModule::default().version.unwrap();
    let condition = Harness::driver_ready_is;
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": LOADABLE_VERSION}}),
    )
    .await;
    let holder = format!("pid 4242 (python3, pod {pod_uid}) holds /dev/kfd");
    h.eventually("in use, the holder named", |h| {
        condition(h, "False", "DriverInUse", &[&holder, &running])
    })
    .await;
    assert!(h.modprobe_runs().is_empty(), "nothing unloaded while held");
    // The workload is gone (drained): the agent replaces the driver.
    h.host.remove_all("/proc/4242").unwrap();
    h.eventually("the new driver runs", |h| {
        condition(h, "True", "DriverLoaded", &[LOADABLE_VERSION])
    })
    .await;
    let bundle = bundles::bundle_dir(LOADABLE_VERSION, simulate::SIM_KERNEL_RELEASE);
    assert_eq!(
        h.modprobe_runs(),
        [
            "-r amdgpu".to_owned(),
            format!("--dirname {} amdgpu", h.host.path(&bundle).display())
        ],
        "unloaded once, then loaded once"
    );
    h.stop().await;
}

/// The node booted into a kernel the store has no bundle for, with no
/// driver loaded: the condition names the kernel, the agent keeps running,
/// and the device plugin offers no GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_kernel_without_a_bundle_sets_the_condition_and_offers_no_gpu() {
    let mut spec = SimSpec::new("mi300x", Some(2), None).unwrap();
    spec.driver_loaded = false;
    let new_kernel = "6.9.0-1-generic";
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        // The bundle is for the kernel it ran before.
        bundles::write_bundle(host, LOADABLE_VERSION, simulate::SIM_KERNEL_RELEASE, true);
        simulate::set_boot(host, new_kernel, "5c0e8b1a-1111-4222-8333-944455556666").unwrap();
    })
    .await;
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": true, "version": LOADABLE_VERSION}, "devicePlugin": {}}),
    )
    .await;
    h.eventually("no bundle for the new kernel", |h| {
        h.driver_ready_is("False", "BundleMissingForKernel", &[new_kernel])
            && h.status().is_some_and(|s| s.gpus == 0)
    })
    .await;
    assert!(!h.agent_finished(), "the agent keeps running");
    for registered in h.kubelet().registrations() {
        let mut devices = h
            .kubelet()
            .list_and_watch(&registered.request.endpoint)
            .await;
        assert_eq!(
            devices.next().await.len(),
            0,
            "{}",
            registered.request.resource_name
        );
    }
    assert!(h.modprobe_runs().is_empty());
    h.stop().await;
}

/// `driver.blacklist: true` writes the reference's blacklist file on the
/// host, and with the in-box module loaded the condition says a reboot is
/// needed; `false` removes the file. Nothing is loaded over the in-box
/// module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blacklist_follows_the_device_config_and_an_in_box_driver_needs_a_reboot() {
    use gpu_operator::driver::blacklist::{BLACKLIST_FILE, BLACKLIST_TEXT};
    let spec = SimSpec::new("mi300x", Some(1), None).unwrap();
    let mut h = Harness::start_prepared(spec, cluster::node(NODE, json!({})), |host| {
        simulate::unload_module(host).unwrap();
        let in_box = simulate::SimModule {
            version: None,
            taint: String::new(),
            ..Default::default()
        };
        simulate::load_module(host, &in_box).unwrap();
        bundles::write_bundle(host, LOADABLE_VERSION, simulate::SIM_KERNEL_RELEASE, true);
    })
    .await;
    let replace_needed =
        |h: &Harness, words: &[&str]| h.driver_ready_is("False", "DriverReplaceNeeded", words);
    let driver = |blacklist: bool| json!({"driver": {"enable": true, "version": LOADABLE_VERSION, "blacklist": blacklist}});
    h.apply_device_config("gpus", driver(true)).await;
    h.eventually("blacklisted, and a reboot asked for", |h| {
        h.host.read_string(BLACKLIST_FILE).ok().as_deref() == Some(BLACKLIST_TEXT)
            && replace_needed(h, &["blacklisted", "reboot"])
    })
    .await;
    h.apply_device_config("gpus", driver(false)).await;
    h.eventually("the blacklist removed", |h| {
        h.host.read_string(BLACKLIST_FILE).is_err()
            && replace_needed(h, &["driver.blacklist: true", "reboot"])
    })
    .await;
    // A person's file at the path, without a blacklist line: it stays, and
    // the condition says why the blacklist asked for cannot take effect.
    let theirs = "options amdgpu ppfeaturemask=0xffffffff\n";
    h.host.write(BLACKLIST_FILE, theirs).unwrap();
    h.apply_device_config("gpus", driver(true)).await;
    h.eventually("the foreign file named as the obstacle", |h| {
        replace_needed(h, &["not written by an operator", "blacklist amdgpu"])
    })
    .await;
    assert_eq!(h.host.read_string(BLACKLIST_FILE).unwrap(), theirs);
    assert!(
        h.modprobe_runs().is_empty(),
        "nothing is loaded over the in-box module"
    );
    h.stop().await;
}

/// The reference's CRD has no default on `devicePlugin`, and its code reads
/// an absent section as off: a DeviceConfig with only `driver` and
/// `metricsExporter` (the shape of the reference's metrics examples, written
/// by us) runs no device plugin and no labeller. Writing `devicePlugin: {}`
/// turns both on with the section's defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_device_plugin_section_runs_no_device_plugin_or_labeller() {
    let mut h = Harness::start("mi300x", None, json!({})).await;
    h.apply_device_config(
        "gpus",
        json!({"driver": {"enable": false}, "metricsExporter": {"enable": true}}),
    )
    .await;
    // The status of generation 1 lists every service the agent runs.
    h.eventually("generation 1 applied, metrics running", |h| {
        h.status().is_some_and(|s| {
            s.generation == Some(1)
                && s.services.get(&ServiceName::MetricsExporter) == Some(&ServiceStatus::Running)
        })
    })
    .await;
    let status = h.status().expect("status");
    assert!(
        !status.services.contains_key(&ServiceName::DevicePlugin)
            && !status.services.contains_key(&ServiceName::Labeller),
        "{status:?}"
    );
    assert!(h.kubelet().registrations().is_empty());
    assert!(!h.labels().contains_key("amd.com/gpu.family"));

    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    h.eventually("GPU labels once devicePlugin is written", |h| {
        h.labels().get("amd.com/gpu.family").map(String::as_str) == Some("AI")
    })
    .await;
    h.stop().await;
}

/// The files in the DRA kubelet directories and the device plugin directory.
fn kubelet_sockets(h: &Harness) -> (Vec<String>, bool, bool) {
    let kubelet = h.kubelet().dir().parent().unwrap();
    let dra = DraKubelet::new(kubelet);
    (
        plugin_sockets(h.kubelet().dir()),
        dra.registration_socket().exists(),
        dra.dra_socket().exists(),
    )
}

fn dra_slices(h: &Harness) -> Vec<Value> {
    h.cluster()
        .list("resource.k8s.io/v1", "ResourceSlice")
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_switches_between_the_device_plugin_and_dra_and_keeps_prepared_claims() {
    let mut h = Harness::start("mi210", None, json!({})).await;
    let dra = DraKubelet::new(h.kubelet().dir().parent().unwrap());
    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    assert!(dra_slices(&h).is_empty());

    // To DRA: the device plugin's sockets go first, then DRA serves.
    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"enableDevicePlugin": false}, "draDriver": {"enable": true}}),
    )
    .await;
    wait::eventually("the device plugin's sockets removed", || {
        plugin_sockets(h.kubelet().dir()).is_empty()
    })
    .await;
    let (info, _) = dra.register().await;
    assert_eq!(info.name, "gpu.amd.com");
    h.eventually("draDriver available, no device plugin", |h| {
        h.status().is_some_and(|s| {
            s.generation == Some(2)
                && s.services.get(&ServiceName::DraDriver) == Some(&ServiceStatus::Running)
                && !s.services.contains_key(&ServiceName::DevicePlugin)
        })
    })
    .await;
    let slices = dra_slices(&h);
    assert_eq!(slices.len(), 1, "{slices:#?}");
    let devices = slices[0]["spec"]["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 4, "mi210: four GPUs");
    assert_eq!(
        plugin_sockets(h.kubelet().dir()),
        Vec::<String>::new(),
        "never both on one node"
    );

    // A claim prepared on DRA.
    let device = devices[0]["name"].as_str().unwrap().to_owned();
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(h.cluster().client(), cluster::NAMESPACE);
    let claim = claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "c"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    claims
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.amd.com", "pool": NODE, "device": device}
            ]}}}})),
        )
        .await
        .unwrap();
    let uid = claim.metadata.uid.unwrap();
    let answer = dra.prepare(&[(cluster::NAMESPACE, &uid, "c")]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    let spec_file = h
        .kubelet()
        .dir()
        .parent()
        .unwrap()
        .join("cdi")
        .join(format!("k8s.gpu.amd.com-gpu_{uid}.json"));
    assert!(spec_file.exists());

    // Back to the device plugin: slices and DRA sockets go, the plugin
    // registers again, and the prepared claim's spec stays for its containers.
    h.apply_device_config(
        "gpus",
        json!({"devicePlugin": {"enableDevicePlugin": true}, "draDriver": {"enable": false}}),
    )
    .await;
    h.kubelet().wait_for_registration("amd.com/gpu", 2).await;
    h.eventually("slices removed", |h| dra_slices(h).is_empty())
        .await;
    let (_, reg, sock) = kubelet_sockets(&h);
    assert!(!reg && !sock, "the DRA sockets are removed");
    assert!(spec_file.exists(), "prepared claims are left alone");
    h.eventually("the device plugin in status, no draDriver", |h| {
        h.status().is_some_and(|s| {
            s.generation == Some(3)
                && s.services.contains_key(&ServiceName::DevicePlugin)
                && !s.services.contains_key(&ServiceName::DraDriver)
        })
    })
    .await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ecc_error_reaches_the_dra_health_stream_within_a_second_and_recovers() {
    let mut h = Harness::start("mi210", None, json!({})).await;
    let dra = DraKubelet::new(h.kubelet().dir().parent().unwrap());
    h.apply_device_config("gpus", json!({"draDriver": {"enable": true}}))
        .await;
    dra.register().await;
    let mut stream = dra.health_v1alpha1().await;
    stream
        .next_matching("four healthy GPUs", |d| {
            d.len() == 4 && d.iter().all(|x| x.health == "HEALTHY")
        })
        .await;
    let bdf = "0000:03:00.0";
    let inventory = gpu_operator::device::discover(&h.host);
    let gpu = inventory.gpus.iter().find(|g| g.bdf == bdf).unwrap();
    let name = format!("gpu-{}-{}", gpu.card.unwrap(), gpu.render_minor.unwrap());

    let injected = Instant::now();
    simulate::set_ecc_counts(&h.host, bdf, "umc", 7, 0).unwrap();
    let (devices, at) = stream
        .next_matching("the GPU unhealthy", |d| {
            d.iter()
                .any(|x| x.device == name && x.health == "UNHEALTHY")
        })
        .await;
    assert!(
        at - injected < Duration::from_secs(1),
        "UNHEALTHY after {:?}",
        at - injected
    );
    let sick = devices.iter().find(|x| x.device == name).unwrap();
    assert!(
        sick.message.contains("ECC") || sick.message.contains("ecc"),
        "{sick:?}"
    );

    simulate::set_ecc_counts(&h.host, bdf, "umc", 0, 0).unwrap();
    stream
        .next_matching("healthy again", |d| d.iter().all(|x| x.health == "HEALTHY"))
        .await;
    h.stop().await;
}

/// AMD's device plugin takes GPU health from the reference exporter's gRPC
/// socket (`List`, matching each entry's `Device` to its device IDs). The
/// agent serves it from its health monitor: a client compiled from our copy
/// of the wire contract fails plainly while there is no socket, then reads
/// the monitor's verdicts, the device plugin's IDs and the pods holding each
/// GPU, sees an ECC error within the monitor's interval and its
/// confirmation, and the recovery; the socket goes with the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_exporters_health_socket_follows_the_health_monitor() {
    let mut h = Harness::start("mi210", None, json!({})).await;
    let socket = h.host.path(gpu_operator::metricssvc::DEFAULT_SOCKET);
    let bdf = "0000:03:00.0";
    let kubelet_dir = h.kubelet().dir().parent().unwrap().to_path_buf();
    let _pods = serve_kubelet(
        &kubelet_dir.join("pod-resources/kubelet.sock"),
        FakeKubelet {
            pods: vec![pod("train", "amd.com/gpu", &[bdf])],
            ..FakeKubelet::default()
        },
    )
    .await;

    // No DeviceConfig selects the node: no health monitor, no socket.
    let absent = metricssvc::list(&socket).await.unwrap_err();
    assert!(absent.starts_with("connect:"), "{absent}");

    h.apply_device_config("gpus", json!({"devicePlugin": {}}))
        .await;
    let registered = h.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = h
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    let advertised = devices
        .next_matching("four devices", |d| d.len() == 4)
        .await;
    let states = wait::poll_until(
        "four healthy GPUs on the socket, the pod on the first",
        || metricssvc::list(&socket),
        |r| {
            r.as_ref().is_ok_and(|s| {
                s.len() == 4
                    && s.iter().all(|g| g.health == "healthy")
                    && !s[0].associated_workload.is_empty()
            })
        },
    )
    .await
    .unwrap();
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::symlink_metadata(&socket).unwrap());
    assert_eq!(mode & 0o7777, 0o600, "socket mode {mode:o}");
    // IDs are the GPU indexes (gpu_id); Device is the device plugin's ID.
    let ids: Vec<&str> = states.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["0", "1", "2", "3"]);
    let mut devices_on_socket: Vec<&str> = states.iter().map(|s| s.device.as_str()).collect();
    let mut plugin_ids: Vec<&str> = advertised.iter().map(|d| d.id.as_str()).collect();
    devices_on_socket.sort_unstable();
    plugin_ids.sort_unstable();
    assert_eq!(devices_on_socket, plugin_ids);
    assert_eq!(states[0].device, bdf);
    let uuids: std::collections::BTreeSet<&str> = states.iter().map(|s| s.uuid.as_str()).collect();
    assert!(uuids.len() == 4 && !uuids.contains(""), "{states:?}");
    assert_eq!(
        states[0].associated_workload,
        ["pod : train, namespace : ml, container: main"]
    );
    assert!(states[1..].iter().all(|s| s.associated_workload.is_empty()));
    let got = metricssvc::get(&socket, &["2", "7"]).await.unwrap();
    assert_eq!(
        metricssvc::health_by_id(&got),
        [("2".into(), "healthy".into())]
    );

    // An ECC error: unhealthy on the socket within the monitor's 0.5 s
    // interval and 0.1 s confirmation (the socket answers from the
    // monitor's snapshot at each call).
    let injected = Instant::now();
    simulate::set_ecc_counts(&h.host, bdf, "umc", 1, 0).unwrap();
    let states = wait::poll_until(
        "the GPU unhealthy on the socket",
        || metricssvc::list(&socket),
        |r| {
            r.as_ref()
                .is_ok_and(|s| s.iter().any(|g| g.health == "unhealthy"))
        },
    )
    .await
    .unwrap();
    let took = injected.elapsed();
    assert!(took < Duration::from_secs(1), "unhealthy after {took:?}");
    assert_eq!(
        metricssvc::health_by_id(&states),
        [
            ("0".into(), "unhealthy".into()),
            ("1".into(), "healthy".into()),
            ("2".into(), "healthy".into()),
            ("3".into(), "healthy".into()),
        ]
    );
    let got = metricssvc::get(&socket, &["0"]).await.unwrap();
    assert_eq!(got[0].health, "unhealthy");
    // The device plugin agrees: one monitor behind both.
    devices
        .next_matching("the GPU unhealthy in the device plugin", |d| {
            support::kubelet::health_of(d, bdf) == Some("Unhealthy")
        })
        .await;

    simulate::set_ecc_counts(&h.host, bdf, "umc", 0, 0).unwrap();
    wait::poll_until(
        "every GPU healthy again on the socket",
        || metricssvc::list(&socket),
        |r| {
            r.as_ref()
                .is_ok_and(|s| s.len() == 4 && s.iter().all(|g| g.health == "healthy"))
        },
    )
    .await
    .unwrap();
    h.eventually("the health socket in the status", |h| {
        h.status().is_some_and(|s| {
            s.services.get(&ServiceName::HealthSocket) == Some(&ServiceStatus::Running)
        })
    })
    .await;

    h.stop().await;
    assert!(!socket.exists(), "the socket is removed on stop");
    let gone = metricssvc::list(&socket).await.unwrap_err();
    assert!(gone.starts_with("connect:"), "{gone}");
}

/// The CPU time the threads in `threads` have had, from their
/// `/proc/self/task/<tid>/schedstat` (its first field, in nanoseconds), for
/// those alive now.
fn cpu_time_of(threads: &std::sync::Mutex<Vec<String>>) -> BTreeMap<String, Duration> {
    let threads = threads.lock().unwrap().clone();
    threads
        .into_iter()
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
            let nanos: u64 = text.split_whitespace().next()?.parse().ok()?;
            Some((tid, Duration::from_nanos(nanos)))
        })
        .collect()
}

/// The share of one core that `threads` used over `period`.
async fn cpu_share(threads: &std::sync::Mutex<Vec<String>>, period: Duration) -> f64 {
    let before = cpu_time_of(threads);
    tokio::time::sleep(period).await;
    let after = cpu_time_of(threads);
    let used: Duration = after
        .iter()
        .filter_map(|(tid, t)| Some(t.saturating_sub(*before.get(tid)?)))
        .sum();
    used.as_secs_f64() / period.as_secs_f64()
}

/// Each follower the agent runs, ended in turn as a failure would end it,
/// is named in the status's problems; and the agent does not spin on the
/// feed it left closed. Measured on this test's own runtime threads (the
/// agent, the emulator and the kubelet), so that other tests running in
/// this process do not count.
#[test]
fn each_follower_that_ends_is_named_and_the_agent_does_not_spin() {
    let threads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = threads.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            // `/proc/thread-self` is `<pid>/task/<tid>`.
            if let Ok(link) = std::fs::read_link("/proc/thread-self")
                && let Some(tid) = link.file_name()
            {
                record
                    .lock()
                    .unwrap()
                    .push(tid.to_string_lossy().into_owned());
            }
        })
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut h = Harness::start("mi300x", None, json!({})).await;
        h.apply_device_config(
            "gpus",
            json!({
                "devicePlugin": {},
                "metricsExporter": {"enable": true, "config": {"name": "metrics"},
                    "rbacConfig": {"enable": true, "secret": {"name": "tls"},
                        "clientCAConfigMap": {"name": "client-ca"}}},
                "testRunner": {"enable": true, "config": {"name": "gpu-tests"}},
                "configManager": {"enable": true}
            }),
        )
        .await;
        h.eventually("the status of a running agent", |h| {
            h.status().is_some_and(|s| {
                s.device_config.is_some()
                    && s.services.get(&ServiceName::DevicePlugin) == Some(&ServiceStatus::Running)
            })
        })
        .await;
        let mut followers = h.followers().running();
        for name in [
            "metrics-config-map",
            "test-config-map",
            "partition-config-map",
            "metrics-access-secret",
            "metrics-access-client-ca",
            "node-watch",
            "device-config-watch",
        ] {
            assert!(followers.contains(&name), "{name} runs: {followers:?}");
        }
        // The DeviceConfig watch last: without it the agent stops.
        followers.retain(|name| *name != "device-config-watch");
        let idle = cpu_share(&threads, Duration::from_secs(5)).await;
        for name in &followers {
            // One ended by the end of another (the driver manager without
            // the driver report) has said so already.
            h.followers().end(name);
            let said = format!("follower {name} ended");
            h.eventually(&format!("the status names {name}"), |h| {
                h.status()
                    .is_some_and(|s| s.problems.iter().any(|p| p.starts_with(&said)))
            })
            .await;
        }
        let ended = cpu_share(&threads, Duration::from_secs(5)).await;
        println!(
            "CPU of the test's threads over 5 s: {:.1} % of a core with every follower running, \
             {:.1} % with {} followers ended",
            idle * 100.0,
            ended * 100.0,
            followers.len()
        );
        assert!(
            ended < 0.2,
            "the agent spins once its followers ended: {:.0} % of a core",
            ended * 100.0
        );
        // Last, the DeviceConfig watch: the agent cannot go on without it.
        assert!(h.followers().end("device-config-watch"));
        let result = h
            .agent_ended()
            .await
            .expect("an agent ran")
            .expect("agent task did not panic");
        assert!(
            matches!(result, Err(agent::AgentError::WatchEnded)),
            "{result:?}"
        );
        assert!(
            h.followers()
                .ended()
                .borrow()
                .iter()
                .any(|e| e.name == "device-config-watch"),
            "the DeviceConfig watch's end is recorded"
        );
    });
}
