//! Node remediation end to end, against the API emulator.
//!
//! With a real agent (a simulated MI210 host, the RVS stand-in, a reboot
//! stand-in that gives the host a new boot id and the repaired GPU its clean
//! RAS counters) and a real leader: an ECC error is injected into the
//! simulated sysfs, and the whole workflow is followed on the Node as served
//! (condition, record, taint, labels), in Events and in the emulator's
//! request counts (evictions), never in the operator's own state.
//!
//! With a leader only, over Nodes whose conditions the test sets as Node
//! Problem Detector would: the gates (maxParallelWorkflows, the circuit
//! breaker, the recovery policy, pause, dry run) and a person's labels.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "fixtures/testrunner/fake_rvs.rs"]
mod fake_rvs;

use gpu_operator::agent::LeaderConfig;
use gpu_operator::api::DeviceConfig;
use gpu_operator::cluster::ClusterRole;
use gpu_operator::driver::gpu_reset::GpuReset;
use gpu_operator::host::HostRoot;
use gpu_operator::pod_resources::api::v1::PodResources;
use gpu_operator::remediation::RECORD_ANNOTATION;
use gpu_operator::remediation::plan::Confirm;
use gpu_operator::simulate::{self, SimSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::{self, NAMESPACE as NS, TestCluster};
use support::node_rig::{Modprobe, NodeRig};
use support::pod_resources::{FakeKubelet, pod};
use support::wait;
use tokio_util::sync::CancellationToken;

/// A whole remediation, drain, reboot and tests included; generous for a
/// loaded machine.
const WORKFLOW: Duration = Duration::from_secs(60);
const TAINT_KEY: &str = "amd-gpu-unhealthy";
/// The driver a managed-driver rig's DeviceConfig asks for.
const DRIVER_VERSION: &str = "6.14.1";

/// A mapping in the reference's format: our condition, tested with RVS.
const MAPPING: &str = r#"
- nodeCondition: AMDGPUUnhealthy
  workflowTemplate: default-template
  validationTestsProfile:
    framework: RVS
    recipe: gst_single
    iterations: 1
    stopOnFailure: true
    timeoutSeconds: 30
  notifyRemediationMessage: "the GPU reported ECC errors"
  notifyTestFailureMessage: "call the vendor"
- nodeCondition: AMDGPUHardwareAssertionHwa
  workflowTemplate: default-template
  skipRebootStep: true
  recoveryPolicy:
    maxAllowedRunsPerWindow: 3
    windowSize: 1h
- nodeCondition: AMDGPUXgmi
  skipRebootStep: true
  physicalActionNeeded: true
  notifyRemediationMessage: "reseat the XGMI bridge"
"#;

/// Our condition, with the GPU reset first.
const RESET_FIRST_MAPPING: &str = r#"
- nodeCondition: AMDGPUUnhealthy
  workflowTemplate: default-template
  gpuResetFirst: true
  validationTestsProfile:
    framework: RVS
    recipe: gst_single
    iterations: 1
    stopOnFailure: true
    timeoutSeconds: 30
"#;

/// Our condition, validated with AGFHC, which the rig's agent does not have
/// (its `--agfhc` path is missing), as the built-in mapping's entry is.
const AGFHC_MAPPING: &str = r#"
- nodeCondition: AMDGPUUnhealthy
  workflowTemplate: default-template
  validationTestsProfile:
    framework: AGFHC
    recipe: all_lvl4
    iterations: 1
    timeoutSeconds: 30
"#;

/// Our condition, validated by a COMMAND program (`{program}` is replaced).
const COMMAND_MAPPING: &str = r#"
- nodeCondition: AMDGPUUnhealthy
  workflowTemplate: default-template
  validationTestsProfile:
    framework: COMMAND
    recipe: burn-in
    iterations: 1
    timeoutSeconds: 30
    command: ["{program}", "--minutes", "1"]
"#;

/// Our condition, tested without a reboot first.
const NO_REBOOT_MAPPING: &str = r#"
- nodeCondition: AMDGPUUnhealthy
  skipRebootStep: true
  validationTestsProfile:
    framework: RVS
    recipe: gst_single
    iterations: 1
    timeoutSeconds: 30
"#;

async fn create_mapping(cluster: &TestCluster) {
    create_mapping_of(cluster, MAPPING).await;
}

async fn create_mapping_of(cluster: &TestCluster, mapping: &str) {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), NS);
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "remediation"}, "data": {"workflow": mapping}
    }))
    .unwrap();
    api.create(&PostParams::default(), &map).await.unwrap();
}

fn leader_config(cluster: &TestCluster, who: &str, confirm: Confirm) -> LeaderConfig {
    LeaderConfigBuilder::new(NS, who, who)
        .fast_lease()
        .teardown_timeout(Duration::from_secs(5))
        .eviction_client(cluster.client_without_retries())
        .remediation_confirm(confirm)
        .build()
}

/// A leader; dropping the token's guard or the role stops it.
fn start_leader(
    cluster: &TestCluster,
    who: &str,
    confirm: Confirm,
) -> (CancellationToken, ClusterRole) {
    let leader = leader_config(cluster, who, confirm);
    let stop = CancellationToken::new();
    let role = ClusterRole::start(cluster.client(), leader.lease, leader.cluster, stop.clone());
    (stop, role)
}

fn fast_confirm() -> Confirm {
    Confirm {
        checks: 2,
        interval: Duration::from_millis(300),
        within: Duration::from_secs(30),
    }
}

fn record_of(node: &Value) -> Value {
    node["metadata"]["annotations"][RECORD_ANNOTATION]
        .as_str()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

fn phase_of(node: &Value) -> Option<String> {
    record_of(node)["run"]["phase"].as_str().map(str::to_owned)
}

/// The reason of the Node's `AMDGPUDriverReady` condition.
fn driver_reason(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "AMDGPUDriverReady")
        .and_then(|c| c["reason"].as_str())
        .map(str::to_owned)
}

fn tainted(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT_KEY))
}

fn condition_is(node: &Value, type_: &str, status: &str) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == status)
    })
}

fn events_with(cluster: &TestCluster, reason: &str) -> Vec<Value> {
    cluster
        .list("v1", "Event")
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

fn event_notes(cluster: &TestCluster, reason: &str) -> Vec<String> {
    events_with(cluster, reason)
        .iter()
        .map(|e| {
            e["message"]
                .as_str()
                .or(e["note"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Waits for an Event with `reason` whose message contains `text`: Events
/// are recorded after the step's writes.
async fn event_seen(cluster: &TestCluster, reason: &str, text: &str) {
    wait::eventually_explained(
        &format!("a {reason} Event saying {text:?}"),
        || {
            event_notes(cluster, reason)
                .iter()
                .any(|n| n.contains(text))
        },
        || format!("{:?}", event_notes(cluster, reason)),
    )
    .await;
}

/// Sets condition `type_` of `node` as another tool (Node Problem Detector)
/// would: the Node's status, through the API.
async fn set_condition(cluster: &TestCluster, node: &str, type_: &str, status: &str) {
    let nodes: Api<Node> = Api::all(cluster.client());
    let current = nodes.get_status(node).await.unwrap();
    let mut conditions = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != type_);
    conditions.push(serde_json::from_value(json!({
        "type": type_, "status": status, "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": "2026-12-02T00:00:00Z", "lastTransitionTime": "2026-12-02T00:00:00Z"
    })).unwrap());
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await
        .unwrap();
}

async fn label_device_config(cluster: &TestCluster, labels: Value, annotations: Value) {
    let api: Api<DeviceConfig> = cluster.device_configs();
    api.patch(
        "gpus",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": labels, "annotations": annotations}})),
    )
    .await
    .unwrap();
}

// ---------------------------------------------------------------------------
// With a real agent.

const NODE: &str = "gpu-0";

/// The node with a real agent: its rig, and what this file adds to it (the
/// RVS, reboot and GPU reset stand-ins, the kubelet's PodResources answer).
struct AgentRig {
    rig: NodeRig,
    tools: PathBuf,
    rvs: fake_rvs::FakeRvs,
    bdf: String,
    /// The second GPU, the one that stays healthy.
    other_bdf: String,
    /// What the kubelet's PodResources `List` answers.
    kubelet_pods: Arc<Mutex<Vec<PodResources>>>,
    /// The agent's `--allow-test-command` entries.
    allowed: Vec<PathBuf>,
    /// The DeviceConfig manages the driver ([`AgentRig::manage_driver`]):
    /// the agent loads it with a `modprobe` stand-in, and a reboot comes
    /// back without amdgpu, as a node whose in-box driver is blacklisted.
    managed_driver: bool,
}

impl std::ops::Deref for AgentRig {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.rig
    }
}

impl std::ops::DerefMut for AgentRig {
    fn deref_mut(&mut self) -> &mut NodeRig {
        &mut self.rig
    }
}

impl AgentRig {
    async fn start(rvs_modes: &[&str]) -> Self {
        Self::start_with(rvs_modes, MAPPING, ResetStandIn::Repairs).await
    }

    async fn start_with(rvs_modes: &[&str], mapping: &str, reset: ResetStandIn) -> Self {
        let mut rig = NodeRig::builder(NODE)
            .cluster(json!({"gpu": "amd"}))
            .namespace("ml")
            .in_memory()
            .host(SimSpec::new("mi210", Some(2), None).unwrap())
            .start()
            .await;
        let host = rig.host.clone();
        let gpus = gpu_operator::device::discover(&host).gpus;
        let (bdf, other_bdf) = (gpus[0].bdf.clone(), gpus[1].bdf.clone());
        let tools = rig.dir().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        write_reboot(&tools, &host, &bdf, false);
        write_gpu_reset(&tools, &host, reset);
        let rvs = fake_rvs::FakeRvs::new();
        rvs.modes(rvs_modes);
        create_mapping_of(rig.cluster(), mapping).await;
        let kubelet_pods = Arc::new(Mutex::new(Vec::new()));
        let client = rig.client();
        rig.serve_pod_resources(FakeKubelet {
            shared: Some(kubelet_pods.clone()),
            client: Some(client),
            ..FakeKubelet::default()
        })
        .await;
        rig.cluster()
            .apply_device_config(
                "gpus",
                json!({"selector": {"gpu": "amd"}, "devicePlugin": {},
                       "remediationWorkflow": {"enable": true, "config": {"name": "remediation"},
                           "nodeRemediationLabels": {"example.com/remediating": "yes"},
                           "nodeDrainPolicy": {"force": true, "timeoutSeconds": 30}}}),
            )
            .await;
        let mut rig = Self {
            rig,
            tools,
            rvs,
            bdf,
            other_bdf,
            kubelet_pods,
            allowed: Vec::new(),
            managed_driver: false,
        };
        rig.start_agent();
        rig
    }

    fn start_agent(&mut self) {
        self.start_agent_as(None);
    }

    /// Starts the agent; with `leader`, it campaigns for the Lease as that
    /// identity.
    fn start_agent_as(&mut self, leader: Option<&str>) {
        let mut driver = self.driver_manager(if self.managed_driver {
            Modprobe::Loads(DRIVER_VERSION)
        } else {
            Modprobe::Missing
        });
        driver.reboot = Some(
            gpu_operator::driver::reboot::RebootCommand::parse(
                &self.tools.join("reboot").display().to_string(),
            )
            .unwrap(),
        );
        driver.gpu_reset = GpuReset::Command {
            program: self.tools.join("gpu-reset"),
            args: Vec::new(),
        };
        let config = self
            .agent_config()
            .rescan_interval(Duration::from_millis(300))
            .test_commands(Some(gpu_operator::testrunner::Commands {
                allowed: gpu_operator::testrunner::AllowedCommands::from_flags(
                    self.allowed.clone(),
                ),
                ..self.rvs.commands()
            }))
            .leader(leader.map(|who| leader_config(self.cluster(), who, fast_confirm())))
            .driver(driver)
            .build();
        self.rig.start_agent(config);
    }

    /// Has the DeviceConfig manage the driver: a signed bundle in the
    /// node's store, amdgpu not loaded until the agent loads it, and every
    /// reboot coming back without it. The validation stand-in then fails
    /// every GPU while amdgpu is not loaded, as real tools find no GPU.
    async fn manage_driver(&mut self) {
        self.stop_agent().await;
        simulate::unload_module(&self.host).unwrap();
        self.add_driver_bundle(DRIVER_VERSION, true);
        write_reboot(&self.tools, &self.host, &self.bdf, true);
        self.rvs.needs(&self.host.path("/sys/module/amdgpu"));
        self.managed_driver = true;
        self.cluster()
            .apply_device_config(
                "gpus",
                json!({"driver": {"enable": true, "version": DRIVER_VERSION}}),
            )
            .await;
        self.start_agent();
        // The condition said DriverLoaded of the in-box driver before: wait
        // for the bundle's version loaded by the agent.
        self.eventually("the agent loaded the driver", |r| {
            let node = r.node();
            driver_reason(&node).as_deref() == Some("DriverLoaded")
                && node["metadata"]["annotations"]["amd.com/gpu-agent-status"]
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                    .is_some_and(|s| s["driver"]["version"] == DRIVER_VERSION)
        })
        .await;
    }

    /// The host's reboot, as the agent lives it: once the stand-in ran, the
    /// agent process goes and a new one starts (on the new boot).
    async fn come_back_from_reboot(&mut self, reboots: usize) {
        self.eventually("the reboot stand-in ran", |r| r.reboots() == reboots)
            .await;
        self.stop_agent().await;
        self.start_agent();
    }

    async fn stop_agent(&mut self) {
        let _ = self.rig.stop_agent().await;
    }

    fn reboots(&self) -> usize {
        support::bundles::reboots(&self.tools)
    }

    async fn eventually(&self, what: &str, check: impl Fn(&Self) -> bool) {
        wait::eventually_within(
            what,
            WORKFLOW,
            || check(self),
            || {
                let node = self.node();
                let logs: Vec<String> =
                    std::fs::read_dir(self.host.path("/var/log/amd-test-runner"))
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| {
                            format!(
                                "{}:\n{}",
                                e.path().display(),
                                std::fs::read_to_string(e.path()).unwrap_or_default()
                            )
                        })
                        .collect();
                format!(
                    "record {}\ntaints {}\nconditions {}\nrvs calls {:?}\ntest logs {}",
                    record_of(&node),
                    node["spec"]["taints"],
                    node["status"]["conditions"],
                    self.rvs.invocations(),
                    logs.join("\n")
                )
            },
        )
        .await
    }

    /// Waits until the agent published its status with the boot id.
    async fn agent_reported_its_boot(&self) {
        self.eventually("the agent reports a boot id", |r| {
            r.node()["metadata"]["annotations"]["amd.com/gpu-agent-status"]
                .as_str()
                .is_some_and(|s| s.contains("bootId"))
        })
        .await;
    }

    fn inject_ecc_error(&self) {
        simulate::set_ecc_counts(&self.host, &self.bdf, "umc", 3, 0).unwrap();
    }

    /// Runs GPU pods `train` on the sick GPU and `other` on the healthy
    /// one: in the API, and in the kubelet's PodResources answer.
    async fn run_pods_on_both_gpus(&self) {
        self.cluster()
            .running_gpu_pod("ml", "train", NODE, json!({}))
            .await;
        self.cluster()
            .running_gpu_pod("ml", "other", NODE, json!({}))
            .await;
        *self.kubelet_pods.lock().unwrap() = vec![
            pod("train", "amd.com/gpu", &[&self.bdf]),
            pod("other", "amd.com/gpu", &[&self.other_bdf]),
        ];
    }

    /// The GPUs the reset stand-in was run for.
    fn resets(&self) -> Vec<String> {
        std::fs::read_to_string(self.tools.join("gpu-reset.log"))
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// What the GPU reset stand-in does.
#[derive(Clone, Copy)]
enum ResetStandIn {
    /// Gives the GPU it is called for clean RAS counters (the repair).
    Repairs,
    /// Fails, as a reset the driver refuses.
    Fails,
}

/// The GPU reset stand-in: logs the PCI address it is given (its last
/// argument), then repairs that GPU or fails.
fn write_gpu_reset(tools: &Path, host: &HostRoot, reset: ResetStandIn) {
    use std::os::unix::fs::PermissionsExt;
    let log = tools.join("gpu-reset.log");
    let devices = host.path("/sys/bus/pci/devices");
    let act = match reset {
        ResetStandIn::Repairs => format!(
            "ras='{devices}'/\"$1\"/ras/umc_err_count\n\
             printf 'ue: 0\\nce: 0\\n' > \"$ras.new\" && mv \"$ras.new\" \"$ras\"\n",
            devices = devices.display()
        ),
        ResetStandIn::Fails => "echo 'amdgpu: GPU reset failed' >&2\nexit 1\n".to_owned(),
    };
    let body = format!(
        "#!/bin/sh\necho \"$1\" >> '{log}'\n{act}",
        log = log.display()
    );
    let path = tools.join("gpu-reset");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The reboot stand-in: records the reboot, gives the host a new boot id and
/// the GPU its counters of a fresh boot (the repair); with `unload`, the
/// host comes back without amdgpu (blacklisted, for the agent to load).
fn write_reboot(tools: &Path, host: &HostRoot, bdf: &str, unload: bool) {
    use std::os::unix::fs::PermissionsExt;
    let log = tools.join("reboot.log");
    let boot_id = host.path("/proc/sys/kernel/random/boot_id");
    let ras = host.path(format!("/sys/bus/pci/devices/{bdf}/ras/umc_err_count"));
    let module = if unload {
        format!("rm -rf '{}'\n", host.path("/sys/module/amdgpu").display())
    } else {
        String::new()
    };
    // The log line goes last: a reboot counted is a reboot done.
    let body = format!(
        "#!/bin/sh\nn=$(cat '{log}' 2>/dev/null | wc -l)\n\
         printf 'b007%08d-0000-4000-8000-000000000000\\n' \"$n\" > '{boot}.new' && mv '{boot}.new' '{boot}'\n\
         printf 'ue: 0\\nce: 0\\n' > '{ras}.new' && mv '{ras}.new' '{ras}'\n\
         {module}echo reboot >> '{log}'\n",
        log = log.display(),
        boot = boot_id.display(),
        ras = ras.display(),
    );
    let path = tools.join("reboot");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ecc_error_is_remediated_end_to_end_taint_drain_reboot_test_confirm_untaint() {
    let mut rig = AgentRig::start(&["pass"]).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.cluster()
        .running_gpu_pod("ml", "train", NODE, json!({}))
        .await;
    rig.agent_reported_its_boot().await;
    let boot_before = rig
        .host
        .read_string("/proc/sys/kernel/random/boot_id")
        .unwrap();
    let started = gpu_operator::counters::remediations();

    // 1-2. The ECC error; the condition.
    rig.inject_ecc_error();
    rig.eventually("the AMDGPUUnhealthy condition", |r| {
        condition_is(&r.node(), "AMDGPUUnhealthy", "True")
    })
    .await;
    // 3. Quarantined: the taint names the condition, the labels are on.
    rig.eventually("the taint", |r| tainted(&r.node())).await;
    let node = rig.node();
    let taint = node["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == TAINT_KEY)
        .unwrap()
        .clone();
    assert_eq!(taint["value"], "AMDGPUUnhealthy");
    assert_eq!(taint["effect"], "NoSchedule");
    assert_eq!(node["metadata"]["labels"]["example.com/remediating"], "yes");
    assert_eq!(record_of(&node)["run"]["condition"], "AMDGPUUnhealthy");
    // 4. Drained through the Eviction API.
    rig.eventually("the GPU pod evicted", |r| {
        r.cluster().get("v1", "Pod", "ml", "train").is_none()
    })
    .await;
    // 5. Rebooted once: a new boot id.
    rig.come_back_from_reboot(1).await;
    assert_ne!(
        rig.host
            .read_string("/proc/sys/kernel/random/boot_id")
            .unwrap(),
        boot_before
    );
    // 6. The tests ran and passed; 7. the condition cleared; 8. untainted.
    rig.eventually("released", |r| {
        let node = r.node();
        !tainted(&node) && phase_of(&node).is_none() && record_of(&node)["attempts"].is_array()
    })
    .await;
    let node = rig.node();
    assert!(condition_is(&node, "AMDGPUUnhealthy", "False"));
    assert!(node["metadata"]["labels"]["example.com/remediating"].is_null());
    assert_eq!(rig.reboots(), 1, "rebooted once");
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 1);
    // The emulator's write log, in order: the leader's record (with the
    // labels) and taint, then the eviction, then its later steps.
    let log = rig.cluster().writes();
    let leader_writes: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            w.resource == "nodes"
                && w.name.as_deref() == Some(NODE)
                && w.field_manager.as_deref() == Some("gpu-operator-remediation")
        })
        .map(|(i, _)| i)
        .collect();
    let eviction = log
        .iter()
        .position(|w| w.resource == "pods/eviction")
        .expect("the eviction is logged");
    assert!(
        leader_writes.len() >= 7 && leader_writes[1] < eviction && eviction < leader_writes[2],
        "record, taint, eviction, then reboot, tests, confirmation, untaint, release: {:?}",
        log.iter().map(ToString::to_string).collect::<Vec<_>>()
    );
    let runs = rig.rvs.invocations();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].contains("trigger=MANUAL"), "{runs:?}");
    assert_eq!(record_of(&node)["attempts"].as_array().unwrap().len(), 1);
    // The Events, the reference's names among them, in the order of the steps.
    for reason in [
        "RemediationStarted",
        "RemediationReboot",
        "RemediationTestPassed",
        "amd-gpu-remediation-succeeded",
    ] {
        event_seen(rig.cluster(), reason, "").await;
    }
    event_seen(
        rig.cluster(),
        "amd-gpu-remediation-required",
        "the GPU reported ECC errors",
    )
    .await;
    // Counted for the metrics.
    let now = gpu_operator::counters::remediations();
    let count = |m: &std::collections::BTreeMap<(String, String), u64>, r: &str| {
        m.get(&("AMDGPUUnhealthy".to_owned(), r.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert!(count(&now, "started") > count(&started, "started"));
    assert!(count(&now, "succeeded") > count(&started, "succeeded"));
    assert!(gpu_operator::counters::remediation_seconds().count >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_one_gpu_is_reset_evicting_only_its_pods_and_tested_alone_without_a_reboot() {
    let rig = AgentRig::start_with(&["pass"], RESET_FIRST_MAPPING, ResetStandIn::Repairs).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.run_pods_on_both_gpus().await;
    rig.agent_reported_its_boot().await;

    rig.inject_ecc_error();
    rig.eventually("the AMDGPUUnhealthy condition", |r| {
        condition_is(&r.node(), "AMDGPUUnhealthy", "True")
    })
    .await;
    rig.eventually("the pod on the sick GPU evicted", |r| {
        r.cluster().get("v1", "Pod", "ml", "train").is_none()
    })
    .await;
    rig.eventually("released", |r| {
        let node = r.node();
        !tainted(&node) && phase_of(&node).is_none() && record_of(&node)["attempts"].is_array()
    })
    .await;
    let node = rig.node();
    assert!(condition_is(&node, "AMDGPUUnhealthy", "False"));
    assert!(
        rig.cluster().get("v1", "Pod", "ml", "other").is_some(),
        "the pod on the healthy GPU stays"
    );
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 1);
    assert_eq!(
        rig.resets(),
        std::slice::from_ref(&rig.bdf),
        "the sick GPU reset once"
    );
    assert_eq!(rig.reboots(), 0, "no reboot");
    let runs = rig.rvs.invocations();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].ends_with("gpus=0"), "the reset GPU alone: {runs:?}");
    event_seen(rig.cluster(), "RemediationGpuReset", &rig.bdf).await;
    event_seen(rig.cluster(), "RemediationStep", "confined to GPU").await;
    event_seen(rig.cluster(), "amd-gpu-remediation-succeeded", "").await;
    assert!(events_with(rig.cluster(), "RemediationEscalated").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gpu_reset_escalates_to_draining_and_rebooting_the_node() {
    let mut rig = AgentRig::start_with(&["pass"], RESET_FIRST_MAPPING, ResetStandIn::Fails).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.run_pods_on_both_gpus().await;
    rig.agent_reported_its_boot().await;

    rig.inject_ecc_error();
    rig.eventually("the reset tried", |r| !r.resets().is_empty())
        .await;
    // Escalated: the whole node is drained, then rebooted.
    rig.eventually("every GPU pod evicted", |r| {
        r.cluster().get("v1", "Pod", "ml", "other").is_none()
            && r.cluster().get("v1", "Pod", "ml", "train").is_none()
    })
    .await;
    event_seen(
        rig.cluster(),
        "RemediationEscalated",
        "amdgpu: GPU reset failed",
    )
    .await;
    rig.come_back_from_reboot(1).await;
    rig.eventually("released", |r| {
        let node = r.node();
        !tainted(&node) && phase_of(&node).is_none()
    })
    .await;
    assert_eq!(rig.resets().len(), 1, "one reset tried");
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 2);
    let runs = rig.rvs.invocations();
    assert_eq!(
        runs.len(),
        1,
        "the node's tests after the reboot only: {runs:?}"
    );
    assert!(runs[0].ends_with("gpus=0,1"), "every GPU: {runs:?}");
}

/// The test runner's own test of an unhealthy GPU and the remediation's
/// validation never run on one GPU at once: the validation waits for the
/// runner's test (here one that hangs until its 3 s limit) to end.
/// A pod the drain leaves (a DaemonSet's) still holds the sick GPU: no
/// reset under it; the run goes on with the node's steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_gpu_reset_while_a_pod_the_drain_leaves_still_holds_the_gpu() {
    let mut rig = AgentRig::start_with(&["pass"], RESET_FIRST_MAPPING, ResetStandIn::Repairs).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.cluster()
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "monitor", "namespace": "ml",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "monitor", "uid": "uid-monitor", "controller": true}]},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "probe",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        }))
        .unwrap();
    rig.cluster().start_pod("ml", "monitor").await;
    *rig.kubelet_pods.lock().unwrap() = vec![pod("monitor", "amd.com/gpu", &[&rig.bdf])];
    rig.agent_reported_its_boot().await;

    rig.inject_ecc_error();
    event_seen(rig.cluster(), "RemediationEscalated", "still hold GPU").await;
    rig.come_back_from_reboot(1).await;
    rig.eventually("released", |r| {
        let node = r.node();
        !tainted(&node) && phase_of(&node).is_none()
    })
    .await;
    assert!(rig.resets().is_empty(), "no reset: {:?}", rig.resets());
    assert!(
        rig.cluster().get("v1", "Pod", "ml", "monitor").is_some(),
        "drains leave DaemonSet pods"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_waits_for_the_test_runners_test_on_the_same_gpu() {
    let rig =
        AgentRig::start_with(&["hang", "pass"], NO_REBOOT_MAPPING, ResetStandIn::Repairs).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    let config = fake_rvs::config_json(
        "AUTO_UNHEALTHY_GPU_WATCH",
        r#"{"Recipe":"gst_single","TimeoutSeconds":3}"#,
    );
    let api: Api<ConfigMap> = Api::namespaced(rig.cluster().client(), NS);
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "gpu-tests"}, "data": {"config.json": config}
    }))
    .unwrap();
    api.create(&PostParams::default(), &map).await.unwrap();
    rig.cluster()
        .apply_device_config(
            "gpus",
            json!({"selector": {"gpu": "amd"}, "devicePlugin": {},
                   "testRunner": {"enable": true, "config": {"name": "gpu-tests"}},
                   "remediationWorkflow": {"enable": true, "config": {"name": "remediation"},
                       "nodeDrainPolicy": {"force": true, "timeoutSeconds": 30}}}),
        )
        .await;
    rig.agent_reported_its_boot().await;

    rig.inject_ecc_error();
    // The runner's test of the sick GPU starts, and hangs.
    let hanging = tokio::task::block_in_place(|| rig.rvs.wait_for_pid("grandchild.pid"));
    rig.eventually("the validation started", |r| {
        r.rvs
            .invocations()
            .iter()
            .any(|i| i.contains("trigger=MANUAL"))
    })
    .await;
    assert!(
        fake_rvs::process_gone(hanging),
        "the validation started while the runner's test still ran: {:?}",
        rig.rvs.invocations()
    );
    let calls = rig.rvs.invocations();
    assert!(
        calls[0].contains("trigger=AUTO_UNHEALTHY_GPU_WATCH"),
        "{calls:?}"
    );
    assert!(calls[1].contains("trigger=MANUAL"), "{calls:?}");
}

/// With the driver managed, a remediation reboot comes back without
/// amdgpu: the validation starts only once the agent reports its own load
/// done for the new boot (the tests stand-in fails every GPU before), the
/// agent runs `modprobe` once for that boot, and `AMDGPUDriverReady` goes
/// from loading to loaded without falling back to not loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_validation_waits_for_the_managed_driver_loaded_once() {
    let mut rig = AgentRig::start(&["pass"]).await;
    rig.manage_driver().await;
    assert_eq!(rig.modprobe_runs().len(), 1, "{:?}", rig.modprobe_runs());
    let history = rig.cluster().record_nodes();
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.agent_reported_its_boot().await;
    rig.inject_ecc_error();
    rig.eventually("the taint", |r| tainted(&r.node())).await;
    rig.come_back_from_reboot(1).await;
    rig.eventually("released after the tests passed", |r| {
        let node = r.node();
        phase_of(&node).is_none() && !tainted(&node)
    })
    .await;
    event_seen(rig.cluster(), "RemediationTestPassed", "gst_single").await;
    assert!(events_with(rig.cluster(), "amd-gpu-remediation-failed").is_empty());
    assert_eq!(
        rig.modprobe_runs().len(),
        2,
        "once per boot: {:?}",
        rig.modprobe_runs()
    );
    let versions: Vec<Value> = history
        .versions()
        .iter()
        .filter(|n| n.metadata.name.as_deref() == Some(NODE))
        .map(|n| serde_json::to_value(n).unwrap())
        .collect();
    // The leader's Validating comes after the agent reported the driver
    // loaded for the boot after the reboot.
    let booted = rig
        .host
        .read_string("/proc/sys/kernel/random/boot_id")
        .unwrap();
    let loaded_for_new_boot = versions.iter().position(|n| {
        n["metadata"]["annotations"]["amd.com/gpu-agent-status"]
            .as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .is_some_and(|status| {
                status["driver"]["bootId"].as_str() == Some(booted.trim())
                    && status["driver"]["loaded"] == true
                    && status["driverLoad"]["state"] == "loaded"
            })
    });
    let validating = versions
        .iter()
        .position(|n| phase_of(n).as_deref() == Some("Validating"));
    assert!(
        matches!((loaded_for_new_boot, validating), (Some(l), Some(v)) if l < v),
        "driver loaded at {loaded_for_new_boot:?}, validation at {validating:?}"
    );
    // The condition's reasons, each change once: never back to not loaded
    // once the load started.
    let mut reasons: Vec<String> = versions.iter().filter_map(driver_reason).collect();
    reasons.dedup();
    let after_load = reasons
        .iter()
        .skip_while(|r| r.as_str() != "DriverLoading")
        .collect::<Vec<_>>();
    assert!(
        !after_load.iter().any(|r| r.as_str() == "DriverNotLoaded"),
        "{reasons:?}"
    );
    assert_eq!(reasons.last().map(String::as_str), Some("DriverLoaded"));
}

/// The validation tool is not in the agent's pod (as AGFHC is not in its
/// image): the tests did not run, which says nothing about the GPUs. The
/// run goes on to the confirmation by the node's own health checks and is
/// released, not failed; the Events name the tool and the agent's flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_tool_that_cannot_start_is_not_a_gpu_failure() {
    let mut rig = AgentRig::start_with(&["pass"], AGFHC_MAPPING, ResetStandIn::Repairs).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.agent_reported_its_boot().await;
    rig.inject_ecc_error();
    rig.eventually("the taint", |r| tainted(&r.node())).await;
    rig.come_back_from_reboot(1).await;
    rig.eventually("released without validation", |r| {
        let node = r.node();
        phase_of(&node).is_none() && !tainted(&node)
    })
    .await;
    event_seen(rig.cluster(), "RemediationTestNotRun", "--agfhc").await;
    event_seen(
        rig.cluster(),
        "RemediationValidationNotRun",
        "judged by its health checks alone",
    )
    .await;
    event_seen(
        rig.cluster(),
        "amd-gpu-remediation-succeeded",
        "stayed False",
    )
    .await;
    assert!(
        events_with(rig.cluster(), "amd-gpu-remediation-failed").is_empty(),
        "no failure: nothing was tested"
    );
    assert!(rig.rvs.invocations().is_empty(), "RVS was not asked");
}

/// A COMMAND profile names its program in the mapping (our `command` key),
/// and runs it once the agent allows it (`--allow-test-command`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_profile_runs_its_program() {
    use std::os::unix::fs::PermissionsExt;
    let tools = tempfile::tempdir().unwrap();
    let log = tools.path().join("burn-in.log");
    let program = tools.path().join("burn-in");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\necho \"$@ gpus=$GPU_TEST_GPUS\" >> '{}'\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mapping = COMMAND_MAPPING.replace("{program}", &program.display().to_string());
    let mut rig = AgentRig::start_with(&["pass"], &mapping, ResetStandIn::Repairs).await;
    rig.allowed = vec![tools.path().to_path_buf()];
    rig.stop_agent().await;
    rig.start_agent();
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.agent_reported_its_boot().await;
    rig.inject_ecc_error();
    rig.eventually("the taint", |r| tainted(&r.node())).await;
    rig.come_back_from_reboot(1).await;
    rig.eventually("released after the program passed", |r| {
        let node = r.node();
        phase_of(&node).is_none() && !tainted(&node)
    })
    .await;
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{ran}");
    assert!(ran.starts_with("--minutes 1 gpus="), "{ran}");
    event_seen(rig.cluster(), "RemediationTestPassed", "COMMAND burn-in").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_test_keeps_the_node_tainted_with_the_entrys_message() {
    let mut rig = AgentRig::start(&["fail"]).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.eventually("the agent reports", |r| {
        r.node()["metadata"]["annotations"]["amd.com/gpu-agent-status"].is_string()
    })
    .await;
    rig.inject_ecc_error();
    rig.come_back_from_reboot(1).await;
    rig.eventually("failed", |r| {
        phase_of(&r.node()).as_deref() == Some("Failed")
    })
    .await;
    let node = rig.node();
    assert!(tainted(&node), "a failed node stays tainted");
    assert_eq!(node["metadata"]["labels"]["example.com/remediating"], "yes");
    event_seen(
        rig.cluster(),
        "amd-gpu-remediation-failed",
        "call the vendor",
    )
    .await;
    assert_eq!(rig.reboots(), 1);
    // A person removes the taint: the run is closed and its labels go.
    let nodes: Api<Node> = Api::all(rig.cluster().client());
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    rig.eventually("closed by the person", |r| {
        let node = r.node();
        phase_of(&node).is_none() && node["metadata"]["labels"]["example.com/remediating"].is_null()
    })
    .await;
    event_seen(
        rig.cluster(),
        "RemediationReleased",
        "removed the remediation taint",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_a_remediation_without_a_second_drain_or_reboot() {
    let mut rig = AgentRig::start(&["pass"]).await;
    rig.cluster()
        .running_gpu_pod("ml", "train", NODE, json!({}))
        .await;
    rig.eventually("the agent reports", |r| {
        r.node()["metadata"]["annotations"]["amd.com/gpu-agent-status"].is_string()
    })
    .await;
    // The confirmation is slow enough to kill the leader in it.
    let slow = Confirm {
        checks: 2,
        interval: Duration::from_secs(2),
        within: Duration::from_secs(30),
    };
    let (first_stop, first) = start_leader(rig.cluster(), "leader-a", slow);
    rig.inject_ecc_error();
    rig.come_back_from_reboot(1).await;
    rig.eventually("rebooted and confirming", |r| {
        r.reboots() == 1 && phase_of(&r.node()).as_deref() == Some("Confirming")
    })
    .await;
    // The first leader dies without letting go; a pod lands on the node
    // meanwhile (bound directly): a second drain would evict it.
    drop(first);
    rig.cluster()
        .running_gpu_pod("ml", "late", NODE, json!({}))
        .await;
    let (_second_stop, _second) = start_leader(rig.cluster(), "leader-b", slow);
    wait::poll_until(
        "the second leader takes over",
        || rig.cluster().lease_holder(),
        |h| h.as_deref() == Some("leader-b"),
    )
    .await;
    rig.eventually("released by the new leader", |r| {
        !tainted(&r.node()) && phase_of(&r.node()).is_none()
    })
    .await;
    assert_eq!(rig.reboots(), 1, "not rebooted twice");
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 1);
    assert!(
        rig.cluster().get("v1", "Pod", "ml", "late").is_some(),
        "not drained twice"
    );
    assert_eq!(rig.rvs.invocations().len(), 1, "not tested twice");
    first_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_own_node_hands_the_lease_over_before_it_reboots() {
    let mut rig = AgentRig::start(&["pass"]).await;
    rig.stop_agent().await;
    rig.start_agent_as(Some("agent-gpu-0"));
    wait::poll_until(
        "the node's agent leads",
        || rig.cluster().lease_holder(),
        |h| h.as_deref() == Some("agent-gpu-0"),
    )
    .await;
    let (_stop, _standby) = start_leader(rig.cluster(), "leader-b", fast_confirm());
    rig.inject_ecc_error();
    rig.eventually("the reboot stand-in ran", |r| r.reboots() == 1)
        .await;
    // The stand-in ran after the agent let go of the Lease.
    let holder = rig.cluster().lease_holder().await;
    assert_ne!(
        holder.as_deref(),
        Some("agent-gpu-0"),
        "still leading at the reboot"
    );
    wait::poll_until(
        "the standby leads",
        || rig.cluster().lease_holder(),
        |h| h.as_deref() == Some("leader-b"),
    )
    .await;
    // Back from the reboot; the standby finishes the remediation.
    rig.stop_agent().await;
    rig.start_agent_as(Some("agent-gpu-0"));
    rig.eventually("released by the new leader", |r| {
        !tainted(&r.node()) && phase_of(&r.node()).is_none()
    })
    .await;
    assert_eq!(rig.reboots(), 1);
    // The leader's Events of the steps its own node's agent acts on were
    // written before the agent let go of the Lease, not lost with it.
    event_seen(
        rig.cluster(),
        "amd-gpu-remediation-required",
        "the GPU reported ECC errors",
    )
    .await;
    event_seen(rig.cluster(), "RemediationStep", "reboot").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_stops_the_validation_tests_that_run() {
    let mut rig = AgentRig::start(&["hang"]).await;
    let (_stop, _leader) = start_leader(rig.cluster(), "leader-a", fast_confirm());
    rig.eventually("the agent reports", |r| {
        r.node()["metadata"]["annotations"]["amd.com/gpu-agent-status"].is_string()
    })
    .await;
    rig.inject_ecc_error();
    rig.come_back_from_reboot(1).await;
    rig.eventually("validating", |r| {
        phase_of(&r.node()).as_deref() == Some("Validating")
    })
    .await;
    // The pid once it is written whole: the file exists a moment before.
    let pid = tokio::task::block_in_place(|| rig.rvs.wait_for_pid("child.pid"));
    rig.cluster()
        .label_node(NODE, "operator.amd.com/gpu-abort-workflow", Some("true"))
        .await;
    rig.eventually("aborted", |r| {
        phase_of(&r.node()).as_deref() == Some("Aborted")
    })
    .await;
    wait::eventually("the hanging test killed", || fake_rvs::process_gone(pid)).await;
    assert!(tainted(&rig.node()), "an aborted node stays tainted");
}

// ---------------------------------------------------------------------------
// With a leader only: Nodes whose conditions another tool sets.

struct Fleet {
    cluster: TestCluster,
    names: Vec<String>,
    leader: Option<(CancellationToken, ClusterRole)>,
}

impl Fleet {
    /// `nodes` GPU nodes, the mapping, and a DeviceConfig with `remediation`
    /// merged into its remediationWorkflow; no leader yet.
    async fn new(nodes: usize, remediation: Value) -> Self {
        let cluster = TestCluster::start().await;
        let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
        for name in &names {
            cluster.add_node(cluster::node(name, json!({"gpu": "amd"})));
        }
        create_mapping(&cluster).await;
        let mut rw = json!({"enable": true, "config": {"name": "remediation"}});
        if let (Some(rw), Some(extra)) = (rw.as_object_mut(), remediation.as_object()) {
            rw.extend(extra.clone());
        }
        cluster
            .apply_device_config(
                "gpus",
                json!({"selector": {"gpu": "amd"}, "remediationWorkflow": rw}),
            )
            .await;
        Self {
            cluster,
            names,
            leader: None,
        }
    }

    fn lead(&mut self) {
        let confirm = Confirm {
            checks: 2,
            interval: Duration::from_millis(200),
            within: Duration::from_secs(120),
        };
        self.leader = Some(start_leader(&self.cluster, "leader", confirm));
    }

    fn node(&self, name: &str) -> Value {
        self.cluster.node(name)
    }

    fn tainted(&self) -> BTreeSet<String> {
        self.names
            .iter()
            .filter(|n| tainted(&self.node(n)))
            .cloned()
            .collect()
    }

    async fn eventually(&self, what: &str, check: impl Fn(&Self) -> bool) {
        wait::eventually_within(
            what,
            WORKFLOW,
            || check(self),
            || {
                self.names
                    .iter()
                    .map(|n| {
                        format!(
                            "{n}: {} {}",
                            record_of(&self.node(n)),
                            self.node(n)["spec"]["taints"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        )
        .await
    }
}

const HWA: &str = "AMDGPUHardwareAssertionHwa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_parallel_workflows_holds_across_five_failing_nodes() {
    let mut fleet = Fleet::new(5, json!({"maxParallelWorkflows": 2})).await;
    label_device_config(
        &fleet.cluster,
        json!({}),
        json!({
            "operator.amd.com/gpu-remediation-max-quarantined": "100%"
        }),
    )
    .await;
    fleet.lead();
    for name in fleet.names.clone() {
        set_condition(&fleet.cluster, &name, HWA, "True").await;
    }
    fleet
        .eventually("two quarantined", |f| f.tainted().len() == 2)
        .await;
    let first = fleet.tainted();
    assert_eq!(first, ["n0", "n1"].map(String::from).into());
    // The others wait, and keep waiting while the two run.
    for _ in 0..10 {
        assert_eq!(fleet.tainted(), first);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One repaired: released, and the next one starts; never more than two.
    set_condition(&fleet.cluster, "n0", HWA, "False").await;
    fleet
        .eventually("n0 released and n2 started", |f| {
            let t = f.tainted();
            assert!(t.len() <= 2, "more than two at once: {t:?}");
            !t.contains("n0") && t.contains("n2")
        })
        .await;
    event_seen(
        &fleet.cluster,
        "amd-gpu-remediation-succeeded",
        "stayed False",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_breaker_stops_three_of_ten_failing_at_once_and_a_person_can_force_one() {
    let mut fleet = Fleet::new(10, json!({})).await;
    for name in ["n3", "n5", "n7"] {
        set_condition(&fleet.cluster, name, HWA, "True").await;
    }
    fleet.lead();
    fleet
        .eventually("the breaker Event on the DeviceConfig", |f| {
            events_with(&f.cluster, "RemediationCircuitBreakerOpen")
                .iter()
                .any(|e| {
                    e["involvedObject"]["kind"] == "DeviceConfig"
                        || e["regarding"]["kind"] == "DeviceConfig"
                })
        })
        .await;
    let notes = event_notes(&fleet.cluster, "RemediationCircuitBreakerOpen");
    assert!(
        notes.iter().any(|n| n.contains("limit of 2 of 10")),
        "{notes:?}"
    );
    assert!(fleet.tainted().is_empty(), "no node quarantined");
    // Each held node says so on itself.
    for name in ["n3", "n5", "n7"] {
        fleet
            .eventually(&format!("{name} says it is held"), |f| {
                events_with(&f.cluster, "RemediationHeld").iter().any(|e| {
                    (e["involvedObject"]["name"] == name || e["regarding"]["name"] == name)
                        && e["message"]
                            .as_str()
                            .or(e["note"].as_str())
                            .is_some_and(|m| m.contains("the circuit breaker holds it"))
                })
            })
            .await;
    }
    // A person forces one: it starts, and the label is consumed.
    fleet
        .cluster
        .label_node(
            "n5",
            "operator.amd.com/gpu-force-resume-workflow",
            Some("true"),
        )
        .await;
    fleet
        .eventually("n5 quarantined", |f| f.tainted().contains("n5"))
        .await;
    fleet
        .eventually("the force-resume label consumed", |f| {
            f.node("n5")["metadata"]["labels"]["operator.amd.com/gpu-force-resume-workflow"]
                .is_null()
        })
        .await;
    assert_eq!(fleet.tainted().len(), 1);
}

/// On three nodes the default limit (20 %, rounded up) is one node at a
/// time: a node remediated and released does not hold the next for the
/// breaker's hour, while a node still quarantined does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_three_nodes_a_healed_node_does_not_hold_the_next_one() {
    let mut fleet = Fleet::new(3, json!({})).await;
    fleet.lead();
    set_condition(&fleet.cluster, "n0", HWA, "True").await;
    fleet
        .eventually("n0 quarantined", |f| f.tainted().contains("n0"))
        .await;
    set_condition(&fleet.cluster, "n0", HWA, "False").await;
    fleet
        .eventually("n0 released", |f| {
            phase_of(&f.node("n0")).is_none() && !tainted(&f.node("n0"))
        })
        .await;
    set_condition(&fleet.cluster, "n1", HWA, "True").await;
    fleet
        .eventually("n1 quarantined after n0 healed", |f| {
            f.tainted().contains("n1")
        })
        .await;
    // n1 is quarantined now: n2 waits, and its Node says why.
    set_condition(&fleet.cluster, "n2", HWA, "True").await;
    fleet
        .eventually("n2 held by the breaker, on the Node", |f| {
            events_with(&f.cluster, "RemediationHeld").iter().any(|e| {
                (e["involvedObject"]["name"] == "n2" || e["regarding"]["name"] == "n2")
                    && e["message"]
                        .as_str()
                        .or(e["note"].as_str())
                        .is_some_and(|m| m.contains("circuit breaker"))
            })
        })
        .await;
    assert!(!fleet.tainted().contains("n2"));
    let notes = event_notes(&fleet.cluster, "RemediationCircuitBreakerOpen");
    assert!(
        notes.iter().any(|n| n.contains("limit of 1 of 3")),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_reports_what_it_would_do_and_writes_no_node() {
    let mut fleet = Fleet::new(3, json!({})).await;
    label_device_config(
        &fleet.cluster,
        json!({"operator.amd.com/gpu-remediation-dry-run": "true"}),
        json!({}),
    )
    .await;
    set_condition(&fleet.cluster, "n1", HWA, "True").await;
    let before = fleet.cluster.requests();
    fleet.lead();
    fleet
        .eventually("the dry-run Event", |f| {
            event_notes(&f.cluster, "RemediationDryRun")
                .iter()
                .any(|n| {
                    n.contains("taint amd-gpu-unhealthy=AMDGPUHardwareAssertionHwa:NoSchedule")
                })
        })
        .await;
    // The leader wrote status and Events, and no Node.
    let since = fleet.cluster.requests().since(&before);
    for verb in ["patch", "update", "create", "delete"] {
        assert_eq!(
            since.get(verb, "nodes"),
            0,
            "{verb} nodes: {}",
            since.to_json()
        );
        assert_eq!(since.get(verb, "nodes/status"), 0, "{verb} nodes/status");
    }
    assert!(record_of(&fleet.node("n1")).is_null());
    // Off again: it runs.
    label_device_config(
        &fleet.cluster,
        json!({"operator.amd.com/gpu-remediation-dry-run": null}),
        json!({}),
    )
    .await;
    fleet
        .eventually("quarantined", |f| f.tainted().contains("n1"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_labels_hold_new_workflows_but_not_running_ones() {
    let mut fleet = Fleet::new(3, json!({})).await;
    label_device_config(
        &fleet.cluster,
        json!({}),
        json!({
            "operator.amd.com/gpu-remediation-max-quarantined": "100%"
        }),
    )
    .await;
    fleet
        .cluster
        .label_node(
            "n0",
            "operator.amd.com/gpu-remediation-paused",
            Some("true"),
        )
        .await;
    set_condition(&fleet.cluster, "n0", HWA, "True").await;
    set_condition(&fleet.cluster, "n1", "AMDGPUXgmi", "True").await;
    fleet.lead();
    // n1 (not paused) starts and waits for a person in the XGMI entry.
    fleet
        .eventually("n1 waits for a person", |f| {
            phase_of(&f.node("n1")).as_deref() == Some("AwaitingPerson")
        })
        .await;
    assert!(
        record_of(&fleet.node("n0")).is_null(),
        "the paused node holds"
    );
    // The DeviceConfig paused: n2 fails and holds; n1 keeps going.
    label_device_config(
        &fleet.cluster,
        json!({"operator.amd.com/gpu-remediation-paused": "true"}),
        json!({}),
    )
    .await;
    set_condition(&fleet.cluster, "n2", HWA, "True").await;
    fleet
        .cluster
        .label_node(
            "n1",
            "operator.amd.com/gpu-force-resume-workflow",
            Some("true"),
        )
        .await;
    fleet
        .eventually("n1 resumed by the person", |f| {
            phase_of(&f.node("n1")).as_deref() == Some("Confirming")
        })
        .await;
    assert!(
        record_of(&fleet.node("n2")).is_null(),
        "paused by the DeviceConfig"
    );
    assert!(
        event_notes(&fleet.cluster, "amd-gpu-remediation-required")
            .iter()
            .any(|n| n.contains("reseat the XGMI bridge"))
    );
    // Unpaused: both start.
    label_device_config(
        &fleet.cluster,
        json!({"operator.amd.com/gpu-remediation-paused": null}),
        json!({}),
    )
    .await;
    fleet
        .cluster
        .label_node("n0", "operator.amd.com/gpu-remediation-paused", None)
        .await;
    fleet
        .eventually("n0 and n2 started", |f| {
            let t = f.tainted();
            t.contains("n0") && t.contains("n2")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recovery_policy_holds_the_fourth_run_in_the_window() {
    let mut fleet = Fleet::new(1, json!({})).await;
    fleet.lead();
    for run in 1..=3 {
        set_condition(&fleet.cluster, "n0", HWA, "True").await;
        fleet
            .eventually(&format!("run {run} started"), |f| {
                record_of(&f.node("n0"))["attempts"]
                    .as_array()
                    .map(Vec::len)
                    == Some(run)
            })
            .await;
        set_condition(&fleet.cluster, "n0", HWA, "False").await;
        fleet
            .eventually(&format!("run {run} released"), |f| {
                phase_of(&f.node("n0")).is_none() && !tainted(&f.node("n0"))
            })
            .await;
    }
    set_condition(&fleet.cluster, "n0", HWA, "True").await;
    fleet
        .eventually("the fourth held", |f| {
            phase_of(&f.node("n0")).as_deref() == Some("Held")
        })
        .await;
    fleet
        .eventually("held tainted for a person", |f| tainted(&f.node("n0")))
        .await;
    assert_eq!(
        record_of(&fleet.node("n0"))["attempts"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    event_seen(&fleet.cluster, "RemediationHeld", "a person must act").await;
    // The reference's RemediationWorkflowStatus lists the three runs.
    let rwf = fleet
        .cluster
        .get(
            "amd.com/v1alpha1",
            "RemediationWorkflowStatus",
            NS,
            "default",
        )
        .expect("the RemediationWorkflowStatus default");
    let runs = rwf["status"]["n0"][HWA]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(runs.len(), 3, "{rwf}");
    assert!(
        runs.iter().all(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("n0-default-template-"))
                && r["startTime"]
                    .as_str()
                    .is_some_and(|t| t.ends_with(" UTC") && t.len() == 23)
        }),
        "{rwf}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_abort_label_stops_a_run_and_leaves_the_taint() {
    let mut fleet = Fleet::new(1, json!({})).await;
    fleet.lead();
    set_condition(&fleet.cluster, "n0", "AMDGPUXgmi", "True").await;
    fleet
        .eventually("waiting for a person", |f| {
            phase_of(&f.node("n0")).as_deref() == Some("AwaitingPerson")
        })
        .await;
    fleet
        .cluster
        .label_node("n0", "operator.amd.com/gpu-abort-workflow", Some("true"))
        .await;
    fleet
        .eventually("aborted, the label consumed", |f| {
            let node = f.node("n0");
            phase_of(&node).as_deref() == Some("Aborted")
                && node["metadata"]["labels"]["operator.amd.com/gpu-abort-workflow"].is_null()
        })
        .await;
    assert!(tainted(&fleet.node("n0")));
    event_seen(&fleet.cluster, "RemediationAborted", "stays tainted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_waits_for_a_person_when_auto_start_is_off() {
    let mut fleet = Fleet::new(1, json!({"autoStartWorkflow": false})).await;
    fleet.lead();
    set_condition(&fleet.cluster, "n0", HWA, "True").await;
    fleet
        .eventually("awaiting approval", |f| {
            phase_of(&f.node("n0")).as_deref() == Some("AwaitingApproval")
        })
        .await;
    assert!(!tainted(&fleet.node("n0")), "nothing done before approval");
    fleet
        .cluster
        .label_node(
            "n0",
            "operator.amd.com/gpu-force-resume-workflow",
            Some("true"),
        )
        .await;
    fleet
        .eventually("approved: quarantined", |f| tainted(&f.node("n0")))
        .await;
}
