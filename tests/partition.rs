//! Partition changes end to end: a real agent on a simulated MI300X (whose
//! simulated driver answers the sysfs writes) and a real leader, against the
//! API emulator, with the test kubelet for the device plugin. A person labels
//! the Node with a profile; what the tests check is read from the API (the
//! Node as served, Events, the emulator's request counts), the simulated
//! host and the kubelet's ListAndWatch, never from the operator's counters.

mod support;

use std::time::Duration;

use gpu_operator::agent::LeaderConfig;
use gpu_operator::api::agent_status::{AgentStatus, STATUS_ANNOTATION};
use gpu_operator::cluster::ClusterRole;
use gpu_operator::partition::state::RECORD_ANNOTATION;
use gpu_operator::partition::{PROFILE_LABEL, STATE_LABEL};
use gpu_operator::simulate;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::{NAMESPACE as NS, TestCluster};
use support::node_rig::NodeRig;
use support::wait;
use tokio_util::sync::CancellationToken;

const NODE: &str = "gpu-0";
/// One change of eight GPUs, drain included; generous for a loaded machine.
const CHANGE: Duration = Duration::from_secs(60);

/// The node: its rig, with the readings these tests take.
struct Rig(NodeRig);

impl std::ops::Deref for Rig {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.0
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut NodeRig {
        &mut self.0
    }
}

impl Rig {
    async fn start(with_leader: bool) -> Self {
        Self::start_with(
            json!({"selector": {"gpu": "amd"}, "configManager": {"enable": true},
                   "devicePlugin": {}}),
            with_leader,
        )
        .await
    }

    async fn start_with(spec: Value, with_leader: bool) -> Self {
        let node = NodeRig::builder(NODE)
            .cluster(json!({"gpu": "amd"}))
            .namespace("ml")
            .in_memory()
            .profile("mi300x", None, None)
            .kubelet()
            .start()
            .await;
        node.cluster().apply_device_config("gpus", spec).await;
        let mut rig = Self(node);
        rig.start_agent(with_leader);
        rig
    }

    fn start_agent(&mut self, with_leader: bool) {
        let leader = with_leader.then(|| leader_config(self.cluster(), "agent"));
        let config = self
            .agent_config()
            .rescan_interval(Duration::from_millis(500))
            .leader(leader)
            .build();
        self.0.start_agent(config);
    }

    async fn stop_agent(&mut self) {
        let _ = self.0.stop_agent().await;
    }

    fn state(&self) -> Option<String> {
        self.node()["metadata"]["labels"][STATE_LABEL]
            .as_str()
            .map(str::to_owned)
    }

    fn cordoned(&self) -> bool {
        self.node()["spec"]["unschedulable"] == json!(true)
    }

    fn has_record(&self) -> bool {
        !self.node()["metadata"]["annotations"][RECORD_ANNOTATION].is_null()
    }

    fn label(&self, key: &str) -> Option<String> {
        self.node()["metadata"]["labels"][key]
            .as_str()
            .map(str::to_owned)
    }

    fn problems(&self) -> Vec<String> {
        self.node()["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .and_then(|t| AgentStatus::parse(t).ok())
            .map(|s| s.problems)
            .unwrap_or_default()
    }

    fn report_reason(&self) -> Option<String> {
        self.node()["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .and_then(|t| AgentStatus::parse(t).ok())
            .and_then(|s| s.partition)
            .and_then(|p| p.reason)
    }

    async fn patch_node(&self, patch: Value) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.cluster().client());
        nodes
            .patch(NODE, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("node patch");
    }

    async fn choose(&self, profile: &str) {
        self.patch_node(json!({"metadata": {"labels": {PROFILE_LABEL: profile}}}))
            .await;
    }

    async fn eventually(&self, what: &str, check: impl Fn(&Self) -> bool) {
        wait::eventually_within(
            what,
            CHANGE,
            || check(self),
            || {
                format!(
                    "state {:?}, cordoned {}, record {}",
                    self.state(),
                    self.cordoned(),
                    self.node()["metadata"]["annotations"][RECORD_ANNOTATION]
                )
            },
        )
        .await;
    }

    /// The simulated GPUs' compute modes, as the driver files say.
    fn modes(&self) -> Vec<String> {
        let spec = simulate::spec_of(&self.host).unwrap();
        simulate::gpu_addresses(&spec)
            .iter()
            .map(|bdf| {
                self.host
                    .read_attr(format!(
                        "/sys/bus/pci/devices/{bdf}/current_compute_partition"
                    ))
                    .unwrap()
            })
            .collect()
    }

    fn reasons(&self) -> Vec<String> {
        self.cluster()
            .list("v1", "Event")
            .iter()
            .filter(|e| e["involvedObject"]["name"] == NODE)
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect()
    }
}

fn leader_config(cluster: &TestCluster, who: &str) -> LeaderConfig {
    LeaderConfigBuilder::new(NS, who, who)
        .fast_lease()
        .teardown_timeout(Duration::from_secs(5))
        .eviction_client(cluster.client_without_retries())
        .build()
}

/// A GPU pod on the node, owned by a ReplicaSet, running.
async fn gpu_pod(cluster: &TestCluster, name: &str) {
    cluster.running_gpu_pod("ml", name, NODE, json!({})).await;
}

fn pod_exists(cluster: &TestCluster, name: &str) -> bool {
    cluster.get("v1", "Pod", "ml", name).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpx_nps4_is_applied_drain_safe_and_every_service_follows_then_back_to_default() {
    let mut rig = Rig::start(true).await;
    let registered = rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = rig
        .kubelet()
        .list_and_watch(&registered.request.endpoint)
        .await;
    devices.next_matching("eight GPUs", |d| d.len() == 8).await;
    rig.eventually("the GPU labels", |r| {
        r.label("amd.com/gpu.cu-count").as_deref() == Some("304")
    })
    .await;
    gpu_pod(rig.cluster(), "train").await;

    rig.choose("cpx_nps4_all").await;
    rig.eventually("cpx_nps4_all applied and the node released", |r| {
        r.state().as_deref() == Some("success") && !r.cordoned() && !r.has_record()
    })
    .await;
    assert!(
        !pod_exists(rig.cluster(), "train"),
        "the GPU pod was drained"
    );
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 1);
    assert!(rig.modes().iter().all(|m| m == "CPX"), "{:?}", rig.modes());
    devices
        .next_matching("64 partitions advertised", |d| d.len() == 64)
        .await;
    rig.eventually("the labels follow", |r| {
        r.label("amd.com/gpu.cu-count").as_deref() == Some("38")
    })
    .await;
    // Each step said so on the Node (the last one is sent after the record
    // goes).
    rig.eventually("an Event for each step", |r| {
        let reasons = r.reasons();
        [
            "PartitionDraining",
            "PartitionApplying",
            "PartitionApplied",
            "PartitionReleased",
        ]
        .iter()
        .all(|step| reasons.iter().any(|x| x == step))
    })
    .await;
    // The cordon came and went: the leader cordoned while the state said
    // so, and no state came without a check first.
    rig.choose("default").await;
    rig.eventually("back to default", |r| {
        r.state().as_deref() == Some("success") && !r.cordoned() && !r.has_record()
    })
    .await;
    devices
        .next_matching("eight GPUs again", |d| d.len() == 8)
        .await;
    assert!(rig.modes().iter().all(|m| m == "SPX"), "{:?}", rig.modes());
    // The label removed: the state goes too.
    rig.patch_node(json!({"metadata": {"labels": {PROFILE_LABEL: null}}}))
        .await;
    rig.eventually("no state without a profile", |r| r.state().is_none())
        .await;
    rig.stop_agent().await;
}

/// The node's own partition change is not a GPU fault: while the modes are
/// written the GPUs' files go and come back, and the health monitor holds
/// its verdicts, so no GPU is reported unhealthy on the Node or in an Event,
/// there and back; nor is each mixed layout on the way a Warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_own_partition_change_is_no_health_fault() {
    let mut rig = Rig::start(true).await;
    let history = rig.cluster().record_nodes();
    rig.eventually("the health condition published", |r| {
        r.node()["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "AMDGPUUnhealthy"))
    })
    .await;
    let dcm_tainted = |n: &k8s_openapi::api::core::v1::Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == "amd-dcm" && t.effect == "NoExecute")
            })
    };
    for profile in ["cpx_nps4_all", "default"] {
        if profile == "default" {
            // A person's amd-dcm taint, as the reference's runbook has them
            // set it before a change: it is theirs, and stays.
            rig.patch_node(json!({"spec": {"taints": [
                {"key": "amd-dcm", "value": "up", "effect": "NoExecute"}]}}))
                .await;
        }
        rig.choose(profile).await;
        rig.eventually(&format!("{profile} applied and the node released"), |r| {
            r.state().as_deref() == Some("success")
                && !r.cordoned()
                && !r.has_record()
                && r.reasons()
                    .iter()
                    .filter(|x| *x == "PartitionReleased")
                    .count()
                    >= if profile == "default" { 2 } else { 1 }
        })
        .await;
        if profile == "cpx_nps4_all" {
            // The reference's taint was on during the change (the leader
            // puts it there once its drain is done) and went with the rest.
            assert!(
                history.versions().iter().any(dcm_tainted),
                "amd-dcm=up:NoExecute during the change"
            );
            let node: k8s_openapi::api::core::v1::Node =
                serde_json::from_value(rig.node()).unwrap();
            assert!(!dcm_tainted(&node), "lifted at the release");
        }
    }
    let unhealthy: Vec<Value> = history
        .versions()
        .iter()
        .filter_map(|n| {
            let n = serde_json::to_value(n).unwrap();
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "AMDGPUUnhealthy" && c["status"] == "True")
                .cloned()
        })
        .collect();
    assert!(unhealthy.is_empty(), "{unhealthy:#?}");
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(rig.node()).unwrap();
    assert!(dcm_tainted(&node), "the person's amd-dcm taint stays");
    // Nor a layout conflict for each mixed layout it passes through.
    let reasons = rig.reasons();
    assert!(
        !reasons
            .iter()
            .any(|r| r == "GPUUnhealthy" || r == "PartitionLayoutConflict"),
        "{reasons:?}"
    );
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_profile_is_rejected_before_any_drain() {
    let mut rig = Rig::start(true).await;
    gpu_pod(rig.cluster(), "train").await;
    rig.eventually("the agent reports", |r| {
        !r.node()["metadata"]["annotations"][STATUS_ANNOTATION].is_null()
    })
    .await;
    // MI300X offers NPS1 and NPS4: dpx_nps2_all does not fit.
    rig.choose("dpx_nps2_all").await;
    rig.eventually("rejected", |r| r.state().as_deref() == Some("failed"))
        .await;
    // The reason, in the agent status (written after the label).
    rig.eventually("the reason in the agent status", |r| {
        r.report_reason()
            .is_some_and(|w| w.contains("does not offer memory mode NPS2"))
    })
    .await;
    rig.eventually("an Event says why", |r| {
        r.reasons().iter().any(|x| x == "PartitionFailed")
    })
    .await;
    // A profile that does not exist is rejected the same way.
    rig.choose("no_such_profile").await;
    rig.eventually("rejected by name", |r| {
        r.report_reason()
            .is_some_and(|w| w.contains("no profile \"no_such_profile\""))
    })
    .await;
    assert!(!rig.cordoned() && !rig.has_record(), "never cordoned");
    assert!(pod_exists(rig.cluster(), "train"), "never drained");
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 0);
    assert!(rig.modes().iter().all(|m| m == "SPX"));
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_holding_the_gpus_blocks_the_change_and_is_named_and_a_persons_cordon_stays() {
    let mut rig = Rig::start(true).await;
    // A person cordoned the node before.
    rig.patch_node(json!({"spec": {"unschedulable": true}}))
        .await;
    // A process of the host holds /dev/kfd.
    rig.host.write("/proc/4242/comm", "pytorch\n").unwrap();
    rig.host.symlink("/dev/kfd", "/proc/4242/fd/9").unwrap();
    rig.choose("cpx_nps1_all").await;
    rig.eventually("failed on the holder", |r| {
        r.state().as_deref() == Some("failed")
    })
    .await;
    rig.eventually("the holder named in the agent status", |r| {
        r.report_reason()
            .is_some_and(|w| w.contains("pid 4242 (pytorch) holds /dev/kfd"))
    })
    .await;
    assert!(rig.cordoned(), "the node stays cordoned after a failure");
    assert!(rig.modes().iter().all(|m| m == "SPX"), "nothing written");
    // The holder ends; the person removes and sets the label again.
    rig.host.remove_all("/proc/4242").unwrap();
    rig.patch_node(json!({"metadata": {"labels": {PROFILE_LABEL: null}}}))
        .await;
    rig.eventually("released", |r| !r.has_record() && r.state().is_none())
        .await;
    assert!(rig.cordoned(), "the person's cordon survives the release");
    rig.choose("cpx_nps1_all").await;
    rig.eventually("applied", |r| {
        r.state().as_deref() == Some("success") && !r.has_record()
    })
    .await;
    assert!(rig.modes().iter().all(|m| m == "CPX"));
    assert!(rig.cordoned(), "the person's cordon survives the change");
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_after_the_drain_without_draining_again() {
    // The agent without the cluster role; leaders run on their own.
    let mut rig = Rig::start(false).await;
    gpu_pod(rig.cluster(), "train").await;
    rig.choose("cpx_nps4_all").await;
    rig.eventually("checked by the agent", |r| {
        r.state().as_deref() == Some("pending")
    })
    .await;
    // The agent goes away before the drain: nothing applies the change.
    rig.stop_agent().await;
    let first_stop = CancellationToken::new();
    let first = leader_config(rig.cluster(), "leader-a");
    let role = ClusterRole::start(
        rig.cluster().client(),
        first.lease,
        first.cluster,
        first_stop.clone(),
    );
    rig.eventually("drained", |r| {
        r.node()["metadata"]["annotations"][RECORD_ANNOTATION]
            .as_str()
            .is_some_and(|a| a.contains("\"drained\""))
    })
    .await;
    assert!(!pod_exists(rig.cluster(), "train"));
    // The first leader dies without letting go; a pod lands on the node
    // meanwhile (bound directly): a second drain would evict it.
    drop(role);
    gpu_pod(rig.cluster(), "late").await;
    let second = leader_config(rig.cluster(), "leader-b");
    let _role = ClusterRole::start(
        rig.cluster().client(),
        second.lease,
        second.cluster,
        CancellationToken::new(),
    );
    wait::poll_until(
        "the second leader takes over",
        || rig.cluster().lease_holder(),
        |h| h.as_deref() == Some("leader-b"),
    )
    .await;
    // The agent comes back and applies; the new leader releases.
    rig.start_agent(false);
    rig.eventually("applied and released under the new leader", |r| {
        r.state().as_deref() == Some("success") && !r.cordoned() && !r.has_record()
    })
    .await;
    assert!(pod_exists(rig.cluster(), "late"), "not drained twice");
    assert_eq!(rig.cluster().requests().get("create", "pods/eviction"), 1);
    assert!(rig.modes().iter().all(|m| m == "CPX"));
    first_stop.cancel();
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heterogeneous_profile_gives_mixed_resources_and_a_clear_problem_under_single() {
    // Profiles of the reference's format in a ConfigMap of our own.
    let profiles = r#"{"gpu-config-profiles": {"half": {"profiles": [
        {"computePartition": "CPX", "memoryPartition": "NPS1", "numGPUsAssigned": 4},
        {"computePartition": "SPX", "memoryPartition": "NPS1", "numGPUsAssigned": 4}]}}}"#;
    let spec = |strategy: &str| {
        json!({"selector": {"gpu": "amd"},
               "configManager": {"enable": true, "config": {"name": "profiles"}},
               "devicePlugin": {"devicePluginArguments": {"resource_naming_strategy": strategy}}})
    };
    let mut rig = Rig::start_with(spec("mixed"), true).await;
    rig.cluster()
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "profiles", "namespace": NS},
            "data": {"config.json": profiles}}))
        .unwrap();
    rig.choose("half").await;
    rig.eventually("half applied", |r| {
        r.state().as_deref() == Some("success") && !r.has_record()
    })
    .await;
    assert_eq!(
        rig.modes(),
        ["CPX", "CPX", "CPX", "CPX", "SPX", "SPX", "SPX", "SPX"]
    );
    for (resource, count) in [("amd.com/cpx_nps1", 32), ("amd.com/spx_nps1", 4)] {
        let registered = rig.kubelet().wait_for_registration(resource, 1).await;
        let mut devices = rig
            .kubelet()
            .list_and_watch(&registered.request.endpoint)
            .await;
        devices.next_matching(resource, |d| d.len() == count).await;
    }
    // Under `single` the node cannot name its GPUs one way: the status says
    // which layouts clash.
    rig.cluster()
        .apply_device_config("gpus", spec("single"))
        .await;
    rig.eventually("a problem under single", |r| {
        r.problems()
            .iter()
            .any(|p| p.contains("cpx_nps1") && p.contains("spx_nps1"))
    })
    .await;
    rig.stop_agent().await;
}
