//! Extended resources served through DRA (KEP-5004), end to end: the real
//! agent, leading, with DRA and device taints on, on a simulated host; the
//! API emulator; the kubelet's DRA side (`support::dra_kubelet`) and a
//! scheduler stand-in that reads the published DeviceClasses and slices as
//! the API documents them (`support::dra_scheduler`).
//!
//! - A pod asking for `amd.com/gpu` gets its GPU through the class's
//!   `extendedResourceName`; the kubelet does not report device health to
//!   such a pod (kubernetes/kubernetes#139939), so the fault must reach it
//!   through the device's taint and the Node condition, and both clear on
//!   recovery.
//! - A pod written for the device plugin's `mixed` strategy, asking for
//!   `amd.com/cpx_nps4`, gets a CPX partition through the class the leader
//!   keeps for that layout while a node has it, and the class goes when no
//!   node has the layout any more.
//! - On an autoPartition node `amd.com/gpu` still means a whole GPU: its
//!   class never selects a share of a partition layout made on demand.
//! - The claim's `status.devices` (KEP-4817) shows the GPU it got, ready and
//!   how healthy, written by the agent under its own token with
//!   deploy/10-rbac.yaml and deploy/15-admission-policy.yaml in force, and
//!   gone on unprepare; `kubectl describe resourceclaim` shows it. Another
//!   node's agent, or one without the driver grant, cannot write it.

mod support;

use std::time::Duration;

use gpu_operator::simulate::{self, SimSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::{NAMESPACE as NS, TestCluster};
use support::dra_kubelet::DraKubelet;
use support::dra_scheduler;
use support::node_rig::NodeRig;
use support::wait;

const NODE: &str = "gpu-node-1";
/// The agent's pod on it.
const POD: &str = "pod-0";

/// The agent pod's identity, from its bound token.
fn agent_user() -> kube_emulator::UserInfo {
    kube_emulator::UserInfo::service_account(NS, "gpu-operator")
        .with_extra("authentication.kubernetes.io/node-name", &[NODE])
        .with_extra("authentication.kubernetes.io/pod-name", &[POD])
}

/// One node whose agent also leads: the DeviceClasses are its leader's. Its
/// rig, and the kubelet's DRA side in its kubelet directory.
struct Node {
    rig: NodeRig,
    kubelet: DraKubelet,
}

impl std::ops::Deref for Node {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.rig
    }
}

impl Node {
    /// The agent on a host of `spec`, its DeviceConfig enabling DRA, the
    /// plugin registered with the kubelet and its slices published.
    async fn start(spec: SimSpec) -> Self {
        Self::start_with(spec, &[], false).await
    }

    /// [`Node::start`] on an MI300X of 2 GPUs, its DeviceConfig then enabling
    /// `draDriver.autoPartition`.
    async fn start_auto_partition() -> Self {
        let node = Self::start(SimSpec::new("mi300x", Some(2), None).unwrap()).await;
        node.cluster()
            .apply_device_config(
                "gpus",
                json!({"draDriver": {"enable": true, "autoPartition": true}}),
            )
            .await;
        node
    }

    /// [`Node::start`] in a cluster that has `objects` (created first).
    /// `under_policy`: deploy/10-rbac.yaml (by which the emulator authorizes
    /// each request, and a claim's `status.devices` per driver and node) and
    /// deploy/15-admission-policy.yaml in force, and the agent sending its
    /// pod's token (the operator's ServiceAccount, its node and pod named), as
    /// the kubelet mints it.
    async fn start_with(spec: SimSpec, objects: &[Value], under_policy: bool) -> Self {
        let mut rig = NodeRig::builder(NODE)
            .cluster(json!({}))
            .cluster_setup(|cluster| {
                if under_policy {
                    cluster.apply_rbac();
                    cluster.apply_admission_policies();
                }
            })
            .host(spec)
            .start()
            .await;
        let cluster = rig.cluster();
        let client = if under_policy {
            cluster.client_as(&agent_user())
        } else {
            cluster.client()
        };
        for object in objects {
            cluster.create(object.clone()).expect("object created");
        }
        let config = rig
            .agent_config()
            // The default of `--dra-device-taints`.
            .dra_device_taints(true)
            .leader(Some(
                LeaderConfigBuilder::new(NS, &format!("{NODE}/{POD}"), NODE).build(),
            ))
            .build();
        rig.start_agent_with(client, config);
        rig.cluster()
            .apply_device_config("gpus", json!({"draDriver": {"enable": true}}))
            .await;
        let kubelet = DraKubelet::new(&rig.kubelet_dir());
        kubelet.register().await;
        let node = Self { rig, kubelet };
        node.eventually("the slices published", |n| !n.devices().is_empty())
            .await;
        node
    }

    /// This node's ResourceSlices.
    fn slices(&self) -> Vec<Value> {
        self.cluster()
            .list("resource.k8s.io/v1", "ResourceSlice")
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == NODE)
            .collect()
    }

    /// Every published device of this node.
    fn devices(&self) -> Vec<Value> {
        self.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    fn device(&self, name: &str) -> Value {
        self.devices()
            .into_iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("device {name} is not published"))
    }

    fn classes(&self) -> Vec<Value> {
        self.cluster().list("resource.k8s.io/v1", "DeviceClass")
    }

    /// The Node's condition of `type_`, or null.
    fn condition(&self, type_: &str) -> Value {
        self.cluster().node(NODE)["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or(Value::Null)
    }

    async fn eventually(&self, what: &str, check: impl Fn(&Self) -> bool) {
        wait::eventually_explained(
            what,
            || check(self),
            || {
                format!(
                    "slices: {:#}\nclasses: {:#?}\nnode conditions: {:#}",
                    json!(self.slices()),
                    self.classes(),
                    self.cluster().node(NODE)["status"]["conditions"]
                )
            },
        )
        .await
    }

    /// Creates pod `name` on this node asking for `count` of extended
    /// resource `resource` in its one container, as a manifest written for
    /// the device plugin asks.
    fn pod(&self, name: &str, resource: &str, count: usize) -> Value {
        self.cluster()
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"nodeName": NODE, "containers": [{
                    "name": "main", "image": "rocm/pytorch",
                    "resources": {"limits": {resource: count.to_string()}},
                }]},
            }))
            .expect("pod created")
    }

    /// Plays the scheduler for `pod`'s `count` of `resource`: the class
    /// serving it, the special claim, its allocation (untainted devices the
    /// class selects) and the pod's status; then the kubelet prepares the
    /// claim. Returns the claim and the devices allocated.
    async fn schedule(&self, pod: &Value, resource: &str, count: usize) -> (Value, Vec<String>) {
        let classes = self.classes();
        let class = dra_scheduler::class_serving(&classes, resource)
            .unwrap_or_else(|| panic!("no DeviceClass serves {resource}: {classes:#?}"));
        let class_name = class["metadata"]["name"].as_str().unwrap();
        let (claim, pod_status) =
            dra_scheduler::extended_resource_claim(pod, class_name, resource, count);
        let claim = self
            .cluster()
            .create(claim)
            .expect("the special claim created");
        let in_use = dra_scheduler::Allocated::of_claims(
            &self.cluster().list("resource.k8s.io/v1", "ResourceClaim"),
        );
        let devices = dra_scheduler::allocate(&self.slices(), class, count, &in_use)
            .expect("the class has devices for the pod");
        let name = claim["metadata"]["name"].as_str().unwrap();
        let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
            Api::namespaced(self.cluster().client(), NS);
        let request = &claim["spec"]["devices"]["requests"][0]["name"];
        claims
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(dra_scheduler::allocation_of(
                    request.as_str().unwrap(),
                    &devices,
                    pod,
                )),
            )
            .await
            .expect("the claim allocated");
        let pods: Api<Pod> = Api::namespaced(self.cluster().client(), NS);
        pods.patch_status(
            pod["metadata"]["name"].as_str().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(pod_status),
        )
        .await
        .expect("the pod's extended resource claim status");
        let uid = claim["metadata"]["uid"].as_str().unwrap();
        let answer = self.kubelet.prepare(&[(NS, uid, name)]).await;
        assert_eq!(answer.claims[uid].error, "", "{answer:?}");
        (claim, devices.into_iter().map(|a| a.device).collect())
    }

    /// What a person can follow from `pod`: its status names the special
    /// claim, the claim names the device, the device's slice carries its
    /// taints. The taint keys on each device the pod holds.
    fn taints_seen_from(&self, pod: &str) -> Vec<Vec<String>> {
        let pod = self.cluster().get("v1", "Pod", NS, pod).expect("the pod");
        let claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
            .as_str()
            .expect("the pod names its extended resource claim")
            .to_owned();
        let claim = self
            .cluster()
            .get("resource.k8s.io/v1", "ResourceClaim", NS, &claim_name)
            .expect("the claim");
        claim["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let device = self.device(r["device"].as_str().unwrap());
                device["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        format!(
                            "{}:{}",
                            t["key"].as_str().unwrap(),
                            t["effect"].as_str().unwrap()
                        )
                    })
                    .collect()
            })
            .collect()
    }

    /// Stops the agent. Under the policy, each request it made, as agent and
    /// as leader, had its grant in deploy/10-rbac.yaml.
    async fn stop(&mut self) {
        if let Some((end, _)) = self.rig.stop_agent().await {
            end.expect("no panic").expect("a clean stop");
        }
        let refused = self.cluster().refused();
        assert!(refused.is_empty(), "{refused:#?}");
    }
}

/// kubernetes/kubernetes#139939: a pod whose `amd.com/gpu` is served by DRA
/// through the class's `extendedResourceName` gets no device health from
/// the kubelet. The fault reaches it through the taint on the device it
/// holds and through the Node condition; the scheduler gives the sick GPU
/// to no new pod; recovery clears both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_fault_reaches_a_pod_served_through_the_extended_resource_and_clears() {
    let mut node = Node::start(SimSpec::new("mi210", Some(2), None).unwrap()).await;
    node.eventually("the leader's class serves amd.com/gpu", |n| {
        dra_scheduler::class_serving(&n.classes(), "amd.com/gpu").is_some()
    })
    .await;

    let pod = node.pod("trainer", "amd.com/gpu", 1);
    let (claim, held) = node.schedule(&pod, "amd.com/gpu", 1).await;
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "amd-gpu.gpu.amd.com"
    );
    assert_eq!(node.taints_seen_from("trainer"), vec![Vec::<String>::new()]);
    assert!(
        node.condition("AMDGPUUnhealthy").is_null()
            || node.condition("AMDGPUUnhealthy")["status"] == "False",
        "{:#}",
        node.condition("AMDGPUUnhealthy")
    );

    // An uncorrectable ECC error on the GPU the pod holds.
    let held_device = node.device(&held[0]);
    let bdf = held_device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
        .as_str()
        .expect("the device's PCI address")
        .to_owned();
    simulate::set_ecc_counts(&node.host, &bdf, "umc", 7, 0).unwrap();
    node.eventually("the pod's device tainted", |n| {
        n.taints_seen_from("trainer") == vec![vec!["gpu.amd.com/unhealthy:NoSchedule".to_owned()]]
    })
    .await;
    node.eventually("the Node condition names the GPU", |n| {
        let c = n.condition("AMDGPUUnhealthy");
        c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.contains(&bdf))
    })
    .await;
    // The other GPU stays untainted, and a new pod gets only that one.
    let untainted: Vec<String> = node
        .devices()
        .iter()
        .filter(|d| !dra_scheduler::tainted(d))
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(untainted.len(), 1, "{untainted:?}");
    assert_ne!(untainted[0], held[0]);
    let classes = node.classes();
    let class = dra_scheduler::class_serving(&classes, "amd.com/gpu").unwrap();
    let refused = dra_scheduler::allocate(&node.slices(), class, 2, &[]).unwrap_err();
    assert!(refused.contains("1 of 2"), "{refused}");
    assert_eq!(
        dra_scheduler::allocate(&node.slices(), class, 1, &[]).unwrap(),
        vec![dra_scheduler::Allocated {
            pool: NODE.to_owned(),
            device: untainted[0].clone(),
            share: None
        }]
    );

    // Recovery: the taint and the condition clear.
    simulate::set_ecc_counts(&node.host, &bdf, "umc", 0, 0).unwrap();
    node.eventually("the taint removed", |n| {
        n.taints_seen_from("trainer") == vec![Vec::<String>::new()]
    })
    .await;
    node.eventually("the condition cleared", |n| {
        n.condition("AMDGPUUnhealthy")["status"] == "False"
    })
    .await;
    node.stop().await;
}

/// Issue 34 item 6: for each partition layout a DRA node has, the leader
/// keeps a DeviceClass whose `extendedResourceName` is the `mixed`
/// strategy's resource, so a pod asking for `amd.com/cpx_nps4` is served by
/// DRA with no edit, from that layout's devices only. Repartitioned, the
/// node has no CPX partitions: that class goes and SPX's comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_asking_for_a_partition_layout_is_served_through_that_layout_s_class() {
    let mut node = Node::start(SimSpec::new("mi300x", Some(2), Some("cpx_nps4")).unwrap()).await;
    node.eventually(
        "the leader's classes serve amd.com/cpx_nps4 and amd.com/gpu",
        |n| {
            let classes = n.classes();
            dra_scheduler::class_serving(&classes, "amd.com/cpx_nps4").is_some()
                && dra_scheduler::class_serving(&classes, "amd.com/gpu").is_some()
        },
    )
    .await;
    let classes = node.classes();
    let class = dra_scheduler::class_serving(&classes, "amd.com/cpx_nps4").unwrap();
    assert_eq!(class["metadata"]["name"], "cpx-nps4.gpu.amd.com");
    assert_eq!(
        class["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "gpu-operator"
    );
    assert!(
        dra_scheduler::class_serving(&classes, "amd.com/spx_nps1").is_none(),
        "no class for a layout no node has: {classes:#?}"
    );
    // The class selects the node's CPX partitions, all of them: 2 GPUs x 8.
    let cpx = dra_scheduler::allocate(&node.slices(), class, 16, &[]).expect("16 partitions");
    assert_eq!(cpx.len(), 16);

    let pod = node.pod("inference", "amd.com/cpx_nps4", 1);
    let (claim, held) = node.schedule(&pod, "amd.com/cpx_nps4", 1).await;
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "cpx-nps4.gpu.amd.com"
    );
    let device = node.device(&held[0]);
    assert_eq!(
        device["attributes"]["partitionProfile"]["string"],
        "cpx_nps4"
    );
    assert_eq!(device["attributes"]["type"]["string"], "amdgpu-partition");
    assert_eq!(
        node.taints_seen_from("inference"),
        vec![Vec::<String>::new()]
    );

    // Repartitioned to SPX: no node has CPX partitions any more.
    simulate::write_host(
        &node.host,
        &SimSpec::new("mi300x", Some(2), Some("spx_nps1")).unwrap(),
    )
    .unwrap();
    node.eventually("the cpx_nps4 class gone and spx_nps1's made", |n| {
        let classes = n.classes();
        dra_scheduler::class_serving(&classes, "amd.com/cpx_nps4").is_none()
            && dra_scheduler::class_serving(&classes, "amd.com/spx_nps1").is_some()
    })
    .await;
    let classes = node.classes();
    let spx = dra_scheduler::class_serving(&classes, "amd.com/spx_nps1").unwrap();
    assert_eq!(spx["metadata"]["name"], "spx-nps1.gpu.amd.com");
    node.eventually("the slices follow the repartition", |n| {
        n.devices().len() == 2
    })
    .await;
    // Both whole GPUs are served through it once their health settles
    // (the repartition swaps every DRM node under the health monitor).
    node.eventually("the whole GPUs untainted", |n| {
        n.devices().iter().all(|d| !dra_scheduler::tainted(d))
    })
    .await;
    let whole = dra_scheduler::allocate(&node.slices(), spx, 2, &[]).expect("both GPUs");
    assert_eq!(whole.len(), 2);
    node.stop().await;
}

/// A class of a layout's name that the operator did not make (an
/// administrator's, without the operator's label) is left alone: not taken
/// over while its layout is present, not removed when it goes. Each step is
/// judged once the leader made the class of another layout the same status
/// reported, so it has seen the layouts of that step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_s_class_of_a_layout_s_name_is_left_alone() {
    let theirs = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "cpx-nps4.gpu.amd.com", "labels": {"team": "ml"}},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.amd.com'"}}]},
    });
    // One GPU in CPX, the other whole.
    let spec = SimSpec::new("mi300x", Some(2), Some("cpx_nps4"))
        .unwrap()
        .with_gpu_partition(1, "spx_nps1")
        .unwrap();
    let mut node = Node::start_with(spec, &[theirs], false).await;
    let get = |n: &Node| {
        n.cluster().get(
            "resource.k8s.io/v1",
            "DeviceClass",
            "",
            "cpx-nps4.gpu.amd.com",
        )
    };
    let before = get(&node).expect("the administrator's class");
    node.eventually("spx_nps1's class made beside it", |n| {
        dra_scheduler::class_serving(&n.classes(), "amd.com/spx_nps1").is_some()
    })
    .await;
    let after = get(&node).expect("still there");
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    assert_eq!(after["metadata"]["labels"], json!({"team": "ml"}));
    assert!(after["spec"]["extendedResourceName"].is_null());
    assert!(dra_scheduler::class_serving(&node.classes(), "amd.com/cpx_nps4").is_none());

    // Both GPUs repartitioned to DPX: no node has CPX (nor SPX) any more.
    simulate::write_host(
        &node.host,
        &SimSpec::new("mi300x", Some(2), Some("dpx_nps1")).unwrap(),
    )
    .unwrap();
    node.eventually("dpx_nps1's class made and spx_nps1's gone", |n| {
        let classes = n.classes();
        dra_scheduler::class_serving(&classes, "amd.com/dpx_nps1").is_some()
            && dra_scheduler::class_serving(&classes, "amd.com/spx_nps1").is_none()
    })
    .await;
    let last = get(&node).expect("not removed");
    assert_eq!(
        last["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    node.stop().await;
}

/// kubectl: `$KUBECTL`, else /usr/bin/kubectl; `None` (after saying so)
/// when it is not there and `REQUIRE_KUBECTL` is not set.
fn kubectl_path(test: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("KUBECTL")
        .map(Into::into)
        .unwrap_or_else(|| std::path::PathBuf::from("/usr/bin/kubectl"));
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("REQUIRE_KUBECTL").is_none(),
        "{test}: REQUIRE_KUBECTL is set but {} does not exist",
        path.display()
    );
    println!(
        "SKIPPED {test}: {} not found; `kubectl describe` was not checked",
        path.display()
    );
    None
}

impl Node {
    /// Claim `name`'s `status.devices` entry of gpu.amd.com for `device`, or
    /// null.
    fn device_status(&self, claim: &str, device: &str) -> Value {
        let claim = self
            .cluster()
            .get("resource.k8s.io/v1", "ResourceClaim", NS, claim)
            .expect("the claim");
        claim["status"]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["driver"] == "gpu.amd.com" && d["device"] == device)
            .cloned()
            .unwrap_or(Value::Null)
    }
}

/// The status of condition `type_` of a `status.devices` entry, or "".
fn condition_of(entry: &Value, type_: &str) -> String {
    entry["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Kubernetes 1.36 authorizes a change of a claim's `status.devices` per
/// driver and node (`resourceclaims/driver`, `associated-node:patch`, the
/// emulator's `src/resource_claim.rs`): with deploy/10-rbac.yaml, the agent
/// of the node a claim is allocated on writes gpu.amd.com's entry as the
/// plugin does; another node's agent is refused, and so is the claim's own
/// node's agent once the driver grant is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_claims_own_node_agent_with_the_driver_grant_writes_its_device_status() {
    use gpu_operator::api::field_manager;
    use gpu_operator::dra::claim_status::status_apply;
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};

    let cluster = TestCluster::start().await;
    cluster.apply_rbac();
    let admin: Api<ResourceClaim> = Api::namespaced(cluster.client(), NS);
    admin
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "c"},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    admin
        .patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {
                "devices": {"results": [
                    {"request": "gpu", "driver": "gpu.amd.com", "pool": NODE, "device": "gpu-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
            }}})),
        )
        .await
        .unwrap();
    let write = |user: kube_emulator::UserInfo, ready: &str| {
        let api: Api<ResourceClaim> = Api::namespaced(cluster.client_as(&user), NS);
        let entry: AllocatedDeviceStatus = serde_json::from_value(json!({
            "driver": "gpu.amd.com", "pool": NODE, "device": "gpu-0",
            "conditions": [{"type": "Ready", "status": ready, "reason": "Prepared",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }))
        .unwrap();
        async move {
            api.patch_status(
                "c",
                &field_manager::apply(field_manager::DRA),
                &Patch::Apply(status_apply(NS, "c", &[entry])),
            )
            .await
        }
    };
    let refused = |result: Result<ResourceClaim, kube::Error>| match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(
                s.message.contains(
                    "status.devices: Forbidden: changing status.devices requires extra permission"
                ),
                "{s:?}"
            );
        }
        other => panic!("not refused: {other:?}"),
    };

    let other_node = kube_emulator::UserInfo::service_account(NS, "gpu-operator")
        .with_extra("authentication.kubernetes.io/node-name", &["gpu-node-2"]);
    refused(write(other_node, "True").await);
    let written = write(agent_user(), "True")
        .await
        .expect("its own node's claim");
    let devices = written.status.and_then(|s| s.devices).unwrap_or_default();
    assert_eq!(devices.len(), 1, "{devices:?}");

    // Without deploy/'s resourceclaims/driver rule, no change goes through.
    let roles: Api<ClusterRole> = Api::all(cluster.client());
    let mut role = roles.get("gpu-operator").await.unwrap();
    let rules = role.rules.as_mut().unwrap();
    let before = rules.len();
    rules.retain(|r| {
        !r.resources
            .iter()
            .flatten()
            .any(|res| res == "resourceclaims/driver")
    });
    assert_eq!(rules.len(), before - 1, "deploy/10-rbac.yaml grants it");
    roles
        .replace("gpu-operator", &Default::default(), &role)
        .await
        .unwrap();
    refused(write(agent_user(), "False").await);
}

/// KEP-4817: on prepare the agent writes the device's entry in the claim's
/// `status.devices` (Ready, Healthy, the PCI address and NUMA node), under
/// its own token with the admission policy in force; a fault and its
/// recovery move the Healthy condition; unprepare removes the entry.
/// `kubectl describe resourceclaim` shows the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_claims_status_shows_its_gpu_and_health_until_unprepared() {
    const TEST: &str = "a_prepared_claims_status_shows_its_gpu_and_health_until_unprepared";
    let mut node = Node::start_with(SimSpec::new("mi210", Some(2), None).unwrap(), &[], true).await;
    node.eventually("the leader's class serves amd.com/gpu", |n| {
        dra_scheduler::class_serving(&n.classes(), "amd.com/gpu").is_some()
    })
    .await;
    let pod = node.pod("trainer", "amd.com/gpu", 1);
    let (claim, held) = node.schedule(&pod, "amd.com/gpu", 1).await;
    let name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_owned();
    let device = node.device(&held[0]);
    let bdf = device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
        .as_str()
        .expect("the device's PCI address")
        .to_owned();

    node.eventually("the claim's entry: ready and healthy", |n| {
        let entry = n.device_status(&name, &held[0]);
        condition_of(&entry, "Ready") == "True" && condition_of(&entry, "Healthy") == "True"
    })
    .await;
    let entry = node.device_status(&name, &held[0]);
    assert_eq!(entry["pool"], NODE);
    assert_eq!(entry["data"]["pciAddress"], bdf.as_str(), "{entry:#}");
    assert_eq!(
        entry["data"]["numaNode"], device["attributes"]["resource.kubernetes.io/numaNode"]["int"],
        "{entry:#}"
    );
    assert!(
        entry["data"]["partition"].is_null(),
        "a whole GPU: {entry:#}"
    );
    // Written by the agent's own token and field manager, and never refused.
    let status_writes: Vec<_> = node
        .cluster()
        .writes()
        .into_iter()
        .filter(|w| w.resource == "resourceclaims.resource.k8s.io/status")
        .filter(|w| w.user == agent_user().username)
        .collect();
    assert!(!status_writes.is_empty());
    assert!(
        status_writes
            .iter()
            .all(|w| w.field_manager.as_deref() == Some(gpu_operator::api::field_manager::DRA)),
        "{status_writes:?}"
    );

    if let Some(kubectl) = kubectl_path(TEST) {
        let home = tempfile::tempdir().unwrap();
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(kubectl)
                .args(["describe", "resourceclaim", "-n", NS, &name])
                .env_clear()
                .env("KUBECONFIG", node.cluster().kubeconfig_path())
                .env("HOME", home.path())
                .arg("--cache-dir")
                .arg(home.path().join("cache"))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("kubectl describe in time")
        .expect("kubectl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for shown in [held[0].as_str(), bdf.as_str(), "Healthy", "Ready"] {
            assert!(text.contains(shown), "{shown} not in:\n{text}");
        }
    }

    // An uncorrectable ECC error on the GPU: Healthy turns False, saying why.
    simulate::set_ecc_counts(&node.host, &bdf, "umc", 7, 0).unwrap();
    node.eventually("the entry says the GPU is unhealthy", |n| {
        let entry = n.device_status(&name, &held[0]);
        condition_of(&entry, "Healthy") == "False" && condition_of(&entry, "Ready") == "True"
    })
    .await;
    let entry = node.device_status(&name, &held[0]);
    let health = entry["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Healthy")
        .unwrap();
    assert!(
        health["message"]
            .as_str()
            .is_some_and(|m| m.contains("ECC")),
        "{health:#}"
    );
    simulate::set_ecc_counts(&node.host, &bdf, "umc", 0, 0).unwrap();
    node.eventually("the entry says the GPU recovered", |n| {
        condition_of(&n.device_status(&name, &held[0]), "Healthy") == "True"
    })
    .await;

    // Unprepare: the entry goes, the allocation stays (it is the scheduler's).
    let answer = node.kubelet.unprepare(&[(NS, &uid, &name)]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    node.eventually("the entry removed", |n| {
        n.device_status(&name, &held[0]).is_null()
    })
    .await;
    let stored = node
        .cluster()
        .get("resource.k8s.io/v1", "ResourceClaim", NS, &name)
        .unwrap();
    assert_eq!(
        stored["status"]["allocation"]["devices"]["results"][0]["device"],
        held[0].as_str()
    );
    node.stop().await;
}

/// `draDriver.autoPartition` through the real agent, writing under its own
/// token with the admission policy in force: the node offers every layout
/// of its GPUs with their counter sets (slices the emulator validates as
/// the API server does); a claim for a CPX partition of GPU 0 repartitions
/// it on Prepare and its `status.devices` names the partition; a partition
/// profile label on the node turns the mode off there, the GPUs are offered
/// as they are again, and the agent's status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_partition_through_the_agent_serves_layouts_and_yields_to_a_profile_label() {
    let mut node =
        Node::start_with(SimSpec::new("mi300x", Some(2), None).unwrap(), &[], true).await;
    assert!(
        node.devices()
            .iter()
            .all(|d| d["consumesCounters"].is_null())
    );
    node.cluster()
        .apply_device_config(
            "gpus",
            json!({"draDriver": {"enable": true, "autoPartition": true}}),
        )
        .await;
    node.eventually("every layout is offered", |n| {
        n.devices().iter().any(|d| d["name"] == "gpu-0-cpx-nps1")
    })
    .await;
    let names: Vec<String> = node
        .devices()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 12, "{names:?}");
    let sets: Vec<Value> = node
        .slices()
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(sets.len(), 2, "{sets:?}");

    let cpx = node.device("gpu-0-cpx-nps1");
    let one = std::collections::BTreeMap::from([("partitions", "1")]);
    let consumed = dra_scheduler::fit(&cpx, &one, &[]).expect("a partition fits");
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(node.cluster().client(), NS);
    let claim = node
        .cluster()
        .create(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "cpx", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.amd.com",
                "capacity": {"requests": {"partitions": "1"}}}}]}},
        }))
        .expect("claim created");
    claims
        .patch_status(
            "cpx",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {
                "devices": {"results": [{"request": "gpu", "driver": "gpu.amd.com",
                    "pool": NODE, "device": "gpu-0-cpx-nps1", "shareID": "share-1",
                    "consumedCapacity": consumed}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            }}})),
        )
        .await
        .expect("claim allocated");
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let answer = node.kubelet.prepare(&[(NS, uid, "cpx")]).await;
    assert_eq!(answer.claims[uid].error, "", "{answer:?}");
    let gpus = gpu_operator::device::discover(&node.host);
    let mut modes: Vec<(String, Option<String>)> = gpus
        .gpus
        .iter()
        .map(|g| (g.bdf.clone(), g.compute_partition.clone()))
        .collect();
    modes.sort();
    assert_eq!(modes[0].1.as_deref(), Some("cpx"), "GPU 0 repartitioned");
    assert_eq!(modes[1].1.as_deref(), Some("spx"));
    node.eventually("status.devices names the partition", |n| {
        let claim = n
            .cluster()
            .get("resource.k8s.io/v1", "ResourceClaim", NS, "cpx")
            .expect("the claim");
        let data = &claim["status"]["devices"][0]["data"];
        data["partition"] == 0 && data["partitionProfile"] == "cpx_nps1"
    })
    .await;
    let answer = node.kubelet.unprepare(&[(NS, uid, "cpx")]).await;
    assert_eq!(answer.claims[uid].error, "");

    node.cluster()
        .label_node(NODE, "dcm.amd.com/gpu-config-profile", Some("cpx_nps1_all"))
        .await;
    node.eventually("the GPUs are offered as they are", |n| {
        let devices = n.devices();
        !devices.is_empty() && devices.iter().all(|d| d["consumesCounters"].is_null())
    })
    .await;
    node.eventually("the status says why", |n| {
        let node = n.cluster().node(NODE);
        let status: Value = serde_json::from_str(
            node["metadata"]["annotations"]["amd.com/gpu-agent-status"]
                .as_str()
                .unwrap_or("{}"),
        )
        .unwrap_or_default();
        status["problems"]
            .to_string()
            .contains("draDriver.autoPartition is off on this node")
    })
    .await;
    node.stop().await;
}

/// Issue 34 items 1 and 6 together: with `draDriver.autoPartition`, a pod
/// written for the device plugin's `mixed` strategy is served by a layout
/// no GPU is in yet. The node reports every layout its GPUs offer, so the
/// leader makes their classes; `cpx-nps1.gpu.amd.com` selects the layout
/// devices by `computePartition`/`memoryPartition`; the scheduler gives
/// `amd.com/cpx_nps1: 2` two shares of one layout device (as the
/// structured allocator does with a device that allows multiple
/// allocations), Prepare repartitions that GPU and hands each share its own
/// partition. A second pod for `amd.com/spx_nps1` gets the other GPU, the
/// counter keeping it off the CPX one, and layouts of another memory mode
/// are not allocatable while the node's is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_strategy_pod_is_served_by_a_layout_made_on_demand() {
    let mut node = Node::start_auto_partition().await;
    node.eventually("the classes of the offered layouts made", |n| {
        let classes = n.classes();
        ["amd.com/cpx_nps1", "amd.com/cpx_nps4", "amd.com/spx_nps1"]
            .iter()
            .all(|r| dra_scheduler::class_serving(&classes, r).is_some())
            && n.devices()
                .iter()
                .any(|d| d["name"] == "gpu-0-cpx-nps1" && !dra_scheduler::tainted(d))
    })
    .await;
    let classes = node.classes();
    let class = dra_scheduler::class_serving(&classes, "amd.com/cpx_nps1").unwrap();
    assert_eq!(class["metadata"]["name"], "cpx-nps1.gpu.amd.com");

    let pod = node.pod("inference", "amd.com/cpx_nps1", 2);
    let (claim, held) = node.schedule(&pod, "amd.com/cpx_nps1", 2).await;
    assert_eq!(held, ["gpu-0-cpx-nps1", "gpu-0-cpx-nps1"]);
    let gpus = gpu_operator::device::discover(&node.host);
    let mut modes: Vec<(String, Option<String>, usize)> = gpus
        .gpus
        .iter()
        .map(|g| {
            (
                g.bdf.clone(),
                g.compute_partition.clone(),
                g.partitions.len(),
            )
        })
        .collect();
    modes.sort();
    assert_eq!(modes[0].1.as_deref(), Some("cpx"), "GPU 0 repartitioned");
    assert_eq!(modes[0].2, 8, "{modes:?}");
    assert_eq!(modes[1].1.as_deref(), Some("spx"), "GPU 1 left alone");
    // The kubelet's retry answers the same: two distinct partitions.
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let name = claim["metadata"]["name"].as_str().unwrap();
    let answer = node.kubelet.prepare(&[(NS, uid, name)]).await;
    let prepared = &answer.claims[uid];
    assert_eq!(prepared.error, "", "{answer:?}");
    let mut cdi: Vec<&String> = prepared
        .devices
        .iter()
        .flat_map(|d| &d.cdi_device_ids)
        .collect();
    cdi.sort();
    cdi.dedup();
    assert_eq!(cdi.len(), 2, "each share its own partition: {prepared:?}");

    // Layouts of another memory mode carry the conflict taint now.
    node.eventually("the NPS4 layouts tainted", |n| {
        n.devices()
            .iter()
            .any(|d| d["name"] == "gpu-1-cpx-nps4" && dra_scheduler::tainted(d))
    })
    .await;
    let in_use = dra_scheduler::Allocated::of_claims(
        &node.cluster().list("resource.k8s.io/v1", "ResourceClaim"),
    );
    let nps4 = dra_scheduler::class_serving(&classes, "amd.com/cpx_nps4").unwrap();
    assert!(dra_scheduler::allocate(&node.slices(), nps4, 1, &in_use).is_err());

    // The simulated driver lays every GPU's DRM nodes out again on a
    // repartition: GPU 1's health settles first.
    node.eventually("GPU 1's whole layout untainted", |n| {
        n.devices()
            .iter()
            .any(|d| d["name"] == "gpu-1-spx-nps1" && !dra_scheduler::tainted(d))
    })
    .await;
    let whole = node.pod("trainer", "amd.com/spx_nps1", 1);
    let (_, held) = node.schedule(&whole, "amd.com/spx_nps1", 1).await;
    assert_eq!(held, ["gpu-1-spx-nps1"], "GPU 0's counter is taken");
    node.stop().await;
}

/// `amd.com/gpu` on an autoPartition node means a whole GPU, as on any
/// other: its class (`amd-gpu.gpu.amd.com`) selects each GPU's whole
/// layout (`gpu-<i>-spx-nps1`) and none of the partition layouts, so no
/// pod asking for it is handed one CPX share and has its GPU
/// repartitioned; `gpu.amd.com`, which AutoPartition's claims name with
/// their own CEL, still selects every layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amd_com_gpu_pod_on_an_auto_partition_node_gets_a_whole_gpu_and_repartitions_nothing() {
    let mut node = Node::start_auto_partition().await;
    node.eventually("the layouts published, both classes made", |n| {
        let classes = n.classes();
        dra_scheduler::class_serving(&classes, "amd.com/gpu").is_some()
            && classes
                .iter()
                .any(|c| c["metadata"]["name"] == "gpu.amd.com")
            && n.devices()
                .iter()
                .any(|d| d["name"] == "gpu-1-cpx-nps1" && !dra_scheduler::tainted(d))
    })
    .await;
    let classes = node.classes();
    let serving = dra_scheduler::class_serving(&classes, "amd.com/gpu").unwrap();
    assert_eq!(serving["metadata"]["name"], "amd-gpu.gpu.amd.com");
    let every = classes
        .iter()
        .find(|c| c["metadata"]["name"] == "gpu.amd.com")
        .expect("gpu.amd.com kept for claims");
    let selected_by = |class: &Value| -> Vec<String> {
        let mut names: Vec<String> = node
            .devices()
            .iter()
            .filter(|d| dra_scheduler::selects(class, "gpu.amd.com", d).unwrap())
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    };
    assert_eq!(selected_by(serving), ["gpu-0-spx-nps1", "gpu-1-spx-nps1"]);
    let all = selected_by(every);
    assert!(
        all.contains(&"gpu-0-cpx-nps4".to_owned()) && all.len() > 2,
        "{all:?}"
    );

    let pod = node.pod("trainer", "amd.com/gpu", 1);
    let (claim, held) = node.schedule(&pod, "amd.com/gpu", 1).await;
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "amd-gpu.gpu.amd.com"
    );
    assert_eq!(held.len(), 1);
    assert!(held[0].ends_with("-spx-nps1"), "{held:?}");
    let gpus = gpu_operator::device::discover(&node.host);
    assert_eq!(gpus.gpus.len(), 2);
    for gpu in &gpus.gpus {
        assert_eq!(gpu.compute_partition.as_deref(), Some("spx"), "{}", gpu.bdf);
        assert!(
            gpu.partitions.len() <= 1,
            "{}: {:?}",
            gpu.bdf,
            gpu.partitions
        );
    }
    node.stop().await;
}
