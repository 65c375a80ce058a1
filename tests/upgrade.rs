//! Rolling driver upgrades end to end: real agents on simulated hosts (each
//! with a `modprobe` and a reboot stand-in, and driver bundles in its store)
//! against the API emulator, one of them elected leader. The leader picks,
//! cordons, drains and tells; each agent unloads, loads or reboots; the
//! leader releases. What the tests check is read from the API (a watch on
//! the Nodes from the start, the emulator's request counts, the objects),
//! never from the operator's own counters.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_operator::api::agent_status::{AgentStatus, STATUS_ANNOTATION};
use gpu_operator::api::driver_upgrade::{RETRY_VALUE, STATE_LABEL, TAINT_KEY};
use gpu_operator::cluster::upgrade::Timeouts;
use gpu_operator::simulate::{self, SIM_KERNEL_RELEASE, SimModule, SimSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::bundles;
use support::cluster::{self, NAMESPACE as NS, TestCluster};
use support::node_rig::{Modprobe, NodeRig};
use support::wait;

const FROM: &str = "6.3.0";
const TO: &str = "6.4.1";
/// A whole rolling upgrade of a few nodes: each node's steps take well under
/// a second here; the bound is for a loaded 2-core machine.
const ROLLOUT: Duration = Duration::from_secs(90);

/// A node of the fleet: its rig, and how often its agent's pod started.
struct Member {
    rig: NodeRig,
    restarts: usize,
}

impl std::ops::Deref for Member {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.rig
    }
}

/// How the fleet's hosts start and how its leader times steps.
#[derive(Clone)]
struct Setup {
    nodes: usize,
    /// Bundles of these versions in every host's store.
    bundles: Vec<&'static str>,
    /// The reboot stand-in brings the node back.
    reboot_comes_back: bool,
    timeouts: Timeouts,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            nodes: 5,
            bundles: vec![FROM, TO],
            reboot_comes_back: true,
            timeouts: Timeouts {
                cordon: Duration::from_secs(20),
                drain: None,
                load: Duration::from_secs(30),
                reboot: Duration::from_secs(30),
                upgrade: Duration::from_secs(120),
            },
        }
    }
}

struct Fleet {
    cluster: TestCluster,
    members: Vec<Member>,
    setup: Setup,
    /// Every Node as the API served it, in order, from before the upgrade.
    history: Arc<Mutex<Vec<Node>>>,
    _watch: cluster::NodeHistory,
}

impl Fleet {
    async fn start(setup: Setup) -> Self {
        let cluster = TestCluster::start().await;
        let mut members = Vec::new();
        for i in 0..setup.nodes {
            let name = format!("gpu-{i}");
            cluster.add_node(cluster::node(&name, json!({"gpu": "amd"})));
            let mut rig = NodeRig::builder(&name)
                .join(cluster.client())
                .host(SimSpec::new("mi210", Some(1), None).unwrap())
                .prepare(move |host| {
                    // The out-of-tree driver the upgrade starts from.
                    simulate::load_module(
                        host,
                        &SimModule {
                            version: Some(FROM.into()),
                            ..SimModule::default()
                        },
                    )
                    .unwrap();
                });
            for version in &setup.bundles {
                rig = rig.driver_bundle(version, false);
            }
            let rig = rig.start().await;
            members.push(Member { rig, restarts: 0 });
        }
        let watch = cluster.record_nodes();
        let history = watch.shared();
        let mut fleet = Self {
            cluster,
            members,
            setup,
            history,
            _watch: watch,
        };
        for i in 0..fleet.members.len() {
            fleet.spawn(i);
        }
        fleet
    }

    fn spawn(&mut self, i: usize) {
        let eviction = self.cluster.client_without_retries();
        let member = &mut self.members[i];
        let identity = format!("{}/pod-{}", member.name, member.restarts);
        member.restarts += 1;
        let tools = member.tools();
        // The reboot stand-in is written once: a restarted agent keeps the
        // boot it counts (and its log).
        let reboot = match tools.join("reboot") {
            p if p.exists() => {
                gpu_operator::driver::reboot::RebootCommand::parse(&p.display().to_string())
                    .unwrap()
            }
            _ => bundles::reboot_recorder(&tools, member.host.root(), self.setup.reboot_comes_back),
        };
        let mut driver = member.driver_manager(Modprobe::LoadsBundles);
        driver.recheck = Duration::from_millis(300);
        driver.reboot = Some(reboot);
        let config = member
            .agent_config()
            .leader(Some(
                // A lease long enough that a loaded machine does not lose it
                // between two renewals; the leader-loss test waits for one
                // expiry.
                LeaderConfigBuilder::new(NS, &identity, &member.name)
                    .fast_lease()
                    .teardown_timeout(Duration::from_secs(5))
                    .upgrade_timeouts(self.setup.timeouts)
                    .eviction_client(eviction)
                    .build(),
            ))
            .driver(driver)
            .build();
        member.rig.start_agent(config);
    }

    fn node(&self, name: &str) -> Value {
        self.cluster.node(name)
    }

    fn state(&self, name: &str) -> Option<String> {
        self.node(name)["metadata"]["labels"][STATE_LABEL]
            .as_str()
            .map(str::to_owned)
    }

    fn states(&self) -> BTreeMap<String, Option<String>> {
        self.members
            .iter()
            .map(|m| (m.name.clone(), self.state(&m.name)))
            .collect()
    }

    /// The driver version the node's agent reports loaded.
    fn reported_version(&self, name: &str) -> Option<String> {
        self.node(name)["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .and_then(|text| AgentStatus::parse(text).ok())
            .and_then(|s| s.driver)
            .filter(|d| d.loaded)
            .and_then(|d| d.version)
    }

    /// The node runs the target, its upgrade is complete and it is released.
    fn upgraded(&self, name: &str) -> bool {
        self.state(name).as_deref() == Some("Upgrade-Complete")
            && self.reported_version(name).as_deref() == Some(TO)
            && self.released(name)
    }

    fn all_upgraded(&self) -> bool {
        self.members.iter().all(|m| self.upgraded(&m.name))
    }

    fn released(&self, name: &str) -> bool {
        let node = self.node(name);
        node["spec"]["unschedulable"] != json!(true)
            && !node["spec"]["taints"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT_KEY))
    }

    async fn apply(&self, spec: Value) {
        self.cluster.apply_device_config("gpus", spec).await;
    }

    async fn eventually(&self, what: &str, limit: Duration, check: impl Fn(&Self) -> bool) {
        wait::eventually_within(
            what,
            limit,
            || check(self),
            || format!("states: {:#?}", self.states()),
        )
        .await;
    }

    async fn holder(&self) -> Option<String> {
        self.cluster.lease_holder().await
    }

    async fn stop_all(&mut self) {
        self._watch.abort();
        for m in &mut self.members {
            let _ = m.rig.stop_agent().await;
        }
    }

    /// The most nodes that were, at one moment the API served, in one of
    /// `states` (by their state label) and the most that were unavailable
    /// (cordoned, tainted by the upgrade, or not Ready).
    fn peaks(&self, states: &[&str]) -> (usize, usize) {
        let history = self.history.lock().unwrap();
        let mut now: BTreeMap<String, &Node> = BTreeMap::new();
        let (mut busy, mut unavailable) = (0, 0);
        for node in history.iter() {
            now.insert(node.metadata.name.clone().unwrap_or_default(), node);
            let in_states = now
                .values()
                .filter(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(STATE_LABEL))
                        .is_some_and(|s| states.contains(&s.as_str()))
                })
                .count();
            let down = now.values().filter(|n| node_unavailable(n)).count();
            busy = busy.max(in_states);
            unavailable = unavailable.max(down);
        }
        (busy, unavailable)
    }
}

fn node_unavailable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_KEY));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    cordoned || tainted || !ready
}

/// Keeps every Node the API serves through a watch, in order. With the
/// watcher's backoff: once the emulator is gone at the end of a test, a
/// watch retried at once never yields, and the test's runtime never stops.
fn rolling(max_parallel: i64, max_unavailable: Value, reboot: bool, version: &str) -> Value {
    json!({"driver": {"enable": true, "version": version, "upgradePolicy": {
        "enable": true, "maxParallelUpgrades": max_parallel,
        "maxUnavailableNodes": max_unavailable, "rebootRequired": reboot}}})
}

const IN_PROGRESS: [&str; 4] = [
    "Upgrade-Started",
    "Upgrade-In-Progress",
    "Reboot-In-Progress",
    "Install-In-Progress",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_keeps_to_its_limits_and_ends_with_every_node_upgraded_and_released() {
    let mut fleet = Fleet::start(Setup::default()).await;
    // At the version every node runs: nothing to do.
    fleet.apply(rolling(2, json!(2), false, FROM)).await;
    fleet
        .eventually("every agent reports its driver", ROLLOUT, |f| {
            f.members
                .iter()
                .all(|m| f.reported_version(&m.name).as_deref() == Some(FROM))
        })
        .await;
    fleet.apply(rolling(2, json!(2), false, TO)).await;
    fleet
        .eventually(
            "every node upgraded and released",
            ROLLOUT,
            Fleet::all_upgraded,
        )
        .await;
    let (busy, unavailable) = fleet.peaks(&IN_PROGRESS);
    assert!(busy <= 2, "{busy} nodes were in progress at once");
    assert!(
        unavailable <= 2,
        "{unavailable} nodes were unavailable at once"
    );
    assert_eq!(busy, 2, "the two nodes allowed were used");
    for m in &fleet.members {
        let runs = m.modprobe_runs();
        assert_eq!(
            runs,
            [
                "-r amdgpu".to_owned(),
                format!(
                    "--dirname {} amdgpu",
                    m.host
                        .path(bundles::bundle_dir(TO, SIM_KERNEL_RELEASE))
                        .display()
                )
            ],
            "{}: unloaded once, then loaded the target",
            m.name
        );
        assert_eq!(bundles::reboots(&m.tools()), 0, "no reboot was asked for");
    }
    // The DeviceConfig's status says it too, and `upgrade status` prints it.
    let configs = fleet.cluster.device_configs();
    let status = wait::poll_until(
        "the status counts every node upgraded",
        || async {
            configs
                .get("gpus")
                .await
                .unwrap()
                .status
                .unwrap_or_default()
        },
        |s| s.driver_upgrade.as_ref().is_some_and(|u| u.complete == 5),
    )
    .await;
    assert_eq!(status.driver_upgrade.unwrap().target, TO);
    for m in &fleet.members {
        let module = &status.node_module_status[&m.name];
        assert_eq!(
            module.status.as_ref().map(|s| s.as_str()),
            Some("Upgrade-Complete")
        );
        assert!(!module.upgrade_start_time.is_empty());
    }
    for reason in ["DriverUpgradeStarted", "DriverUpgradeComplete"] {
        let count = || {
            fleet
                .cluster
                .list("events.k8s.io/v1", "Event")
                .iter()
                .filter(|e| e["reason"] == reason)
                .count()
        };
        wait::eventually(&format!("one {reason} Event per node"), || count() >= 5).await;
        assert_eq!(count(), 5, "one {reason} Event per node, no more");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["upgrade", "status"])
        .env("KUBECONFIG", fleet.cluster.kubeconfig_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("kube-amd-gpu/gpus: driver 6.4.1, rolling"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("gpu-")
                && l.contains("Upgrade-Complete")
                && l.contains(FROM)
                && l.contains(TO))
            .count(),
        5,
        "{text}"
    );
    fleet.stop_all().await;
}

/// A GPU pod on `node` owned by a ReplicaSet, running and ready.
async fn gpu_pod(fleet: &Fleet, name: &str, node: &str, labels: Value) {
    fleet
        .cluster
        .running_gpu_pod("ml", name, node, labels)
        .await;
}

fn pod_exists(fleet: &Fleet, name: &str) -> bool {
    fleet.cluster.get("v1", "Pod", "ml", name).is_some()
}

fn namespace(fleet: &Fleet, name: &str) {
    fleet
        .cluster
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
        .expect("namespace");
}

/// A person's `kubectl label node NODE KEY=VALUE --overwrite`.
async fn label(fleet: &Fleet, node: &str, key: &str, value: &str) {
    let nodes: Api<Node> = Api::all(fleet.cluster.client());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .expect("label");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_blocks_the_drain_fails_that_node_by_name_and_the_others_finish() {
    let mut fleet = Fleet::start(Setup {
        nodes: 3,
        ..Setup::default()
    })
    .await;
    namespace(&fleet, "ml");
    fleet
        .cluster
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "train-pdb", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}}),
        )
        .expect("budget");
    gpu_pod(&fleet, "train", "gpu-0", json!({"app": "train"})).await;
    gpu_pod(&fleet, "infer", "gpu-1", json!({"app": "infer"})).await;
    let mut spec = rolling(1, json!(2), false, TO);
    spec["driver"]["upgradePolicy"]["nodeDrainPolicy"] = json!({"timeoutSeconds": 3});
    fleet.apply(spec).await;
    // While gpu-0 drains, the next node waits, and its record says for
    // which limit (what `upgrade status` shows under BLOCKED BY).
    fleet
        .eventually("gpu-1 says why it is not picked", ROLLOUT, |f| {
            f.node("gpu-1")["metadata"]["annotations"]["operator.amd.com/gpu-driver-upgrade"]
                .as_str()
                .is_some_and(|r| r.contains("maxParallelUpgrades allows 1"))
        })
        .await;
    fleet
        .eventually("gpu-0 failed, the others done", ROLLOUT, |f| {
            f.state("gpu-0").as_deref() == Some("Drain-Failed")
                && ["gpu-1", "gpu-2"]
                    .iter()
                    .all(|n| f.state(n).as_deref() == Some("Upgrade-Complete") && f.released(n))
        })
        .await;
    // The failed node stays cordoned and tainted, on its old driver, and
    // says why: the budget by name, in the record, an Event and `upgrade
    // status` (which exits 1 while a node failed).
    assert!(!fleet.released("gpu-0"));
    assert_eq!(fleet.reported_version("gpu-0").as_deref(), Some(FROM));
    assert!(pod_exists(&fleet, "train"), "the guarded pod stays");
    assert!(
        !pod_exists(&fleet, "infer"),
        "the unguarded pod was evicted"
    );
    let record =
        fleet.node("gpu-0")["metadata"]["annotations"]["operator.amd.com/gpu-driver-upgrade"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(record.contains("train-pdb"), "{record}");
    wait::eventually("a Warning Event naming the budget", || {
        fleet
            .cluster
            .list("events.k8s.io/v1", "Event")
            .iter()
            .any(|e| {
                e["reason"] == "DriverUpgradeFailed"
                    && e["regarding"]["name"] == "gpu-0"
                    && e["note"].as_str().is_some_and(|n| n.contains("train-pdb"))
            })
    })
    .await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["upgrade", "status"])
        .env("KUBECONFIG", fleet.cluster.kubeconfig_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("gpu-0")
            && l.contains("Drain-Failed")
            && l.contains("train-pdb")),
        "{text}"
    );
    // A person lifts the budget and asks for a retry: the node upgrades.
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(fleet.cluster.client(), "ml");
    budgets
        .delete("train-pdb", &Default::default())
        .await
        .unwrap();
    label(&fleet, "gpu-0", STATE_LABEL, RETRY_VALUE).await;
    fleet
        .eventually("gpu-0 upgraded after the retry", ROLLOUT, |f| {
            f.upgraded("gpu-0")
        })
        .await;
    assert!(!pod_exists(&fleet, "train"));
    // The retry is an Event of its own: a person reading the node's Events
    // sees the upgrade start again, not only the first start.
    wait::eventually("a DriverUpgradeStarted Event for the retry", || {
        fleet
            .cluster
            .list("events.k8s.io/v1", "Event")
            .iter()
            .any(|e| {
                e["reason"] == "DriverUpgradeStarted"
                    && e["regarding"]["name"] == "gpu-0"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("started again after"))
            })
    })
    .await;
    // The drains asked the API for nothing but what
    // deploy/optional/driver-upgrades.yaml and the base RBAC grant.
    let pod_calls: Vec<String> = fleet
        .cluster
        .requests()
        .non_watch()
        .filter(|k| k.resource.starts_with("pods") || k.resource.starts_with("resourceclaims"))
        .0
        .keys()
        .map(|k| format!("{} {}", k.verb, k.resource))
        .collect();
    for call in &pod_calls {
        assert!(
            // `patch pods/status` is this test's, as the pods' kubelet.
            ["list pods", "create pods/eviction", "patch pods/status"].contains(&call.as_str()),
            "the drain made {call}: {pod_calls:?}"
        );
    }
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_an_upgrade_without_draining_a_node_twice() {
    let mut fleet = Fleet::start(Setup {
        nodes: 3,
        ..Setup::default()
    })
    .await;
    // gpu-0, picked first, loads the target only once the test opens the
    // gate: it stays in progress meanwhile.
    let gate = fleet.members[0].dir().join("gate");
    bundles::hold_loads_until(&fleet.members[0].tools(), &gate);
    namespace(&fleet, "ml");
    for i in 0..3 {
        gpu_pod(&fleet, &format!("job-{i}"), &format!("gpu-{i}"), json!({})).await;
    }
    fleet.apply(rolling(1, json!(1), false, TO)).await;
    fleet
        .eventually("gpu-0 drained and told", ROLLOUT, |f| {
            f.state("gpu-0").as_deref() == Some("Upgrade-In-Progress") && !pod_exists(f, "job-0")
        })
        .await;
    let evictions_before = fleet.cluster.requests().get("create", "pods/eviction");
    assert_eq!(evictions_before, 1);
    // A pod lands on gpu-0 anyway (bound to it directly): a second drain
    // would evict it.
    gpu_pod(&fleet, "late", "gpu-0", json!({})).await;
    // The leader crashes (no release); its pod comes back as a new one.
    let old = fleet.holder().await.expect("a leader");
    let i = fleet
        .members
        .iter()
        .position(|m| old.starts_with(&format!("{}/", m.name)))
        .unwrap();
    assert!(
        fleet.members[i].has_agent(),
        "the leader's node runs an agent"
    );
    fleet.members[i].rig.abort_agent();
    fleet.spawn(i);
    let new = wait::poll_until(
        "a new leader",
        || fleet.holder(),
        |h| h.as_ref().is_some_and(|h| *h != old),
    )
    .await
    .unwrap();
    // It leads for a while with gpu-0 still in progress.
    let leases: Api<Lease> = Api::namespaced(fleet.cluster.client(), NS);
    let renewed = || async {
        leases
            .get("gpu-operator-leader")
            .await
            .ok()
            .and_then(|l| l.spec?.renew_time)
    };
    let first = renewed().await;
    wait::poll_until("the new leader renews", renewed, |t| *t != first).await;
    assert_eq!(fleet.state("gpu-0").as_deref(), Some("Upgrade-In-Progress"));
    std::fs::write(&gate, "").unwrap();
    fleet
        .eventually(
            "every node upgraded under the new leader",
            ROLLOUT,
            Fleet::all_upgraded,
        )
        .await;
    assert_eq!(
        fleet.holder().await.as_deref(),
        Some(new.as_str()),
        "the new leader finished it"
    );
    assert!(pod_exists(&fleet, "late"), "gpu-0 was not drained twice");
    assert_eq!(
        fleet.cluster.requests().get("create", "pods/eviction"),
        3,
        "one eviction per node"
    );
    let (busy, _) = fleet.peaks(&IN_PROGRESS);
    assert_eq!(busy, 1, "one node at a time, across the change of leader");
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_completes_on_a_new_boot_id_and_one_that_never_comes_back_fails() {
    let mut fleet = Fleet::start(Setup {
        nodes: 2,
        ..Setup::default()
    })
    .await;
    fleet.apply(rolling(1, json!(1), true, TO)).await;
    fleet
        .eventually(
            "both nodes rebooted into the target",
            ROLLOUT,
            Fleet::all_upgraded,
        )
        .await;
    for m in &fleet.members {
        assert_eq!(bundles::reboots(&m.tools()), 1, "{} rebooted once", m.name);
        let boot = m.host.read_attr("/proc/sys/kernel/random/boot_id").unwrap();
        assert_ne!(boot, simulate::SIM_BOOT_ID, "a new boot");
        // Nothing to unload after a boot: only the load.
        let runs = m.modprobe_runs();
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert!(runs[0].starts_with("--dirname"), "{runs:?}");
    }
    let seen_rebooting = fleet
        .history
        .lock()
        .unwrap()
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(STATE_LABEL))
                .map(String::as_str)
                == Some("Reboot-In-Progress")
        })
        .count();
    assert!(seen_rebooting > 0, "the nodes were Reboot-In-Progress");
    fleet.stop_all().await;

    // A node that never comes back.
    let mut fleet = Fleet::start(Setup {
        nodes: 1,
        reboot_comes_back: false,
        timeouts: Timeouts {
            reboot: Duration::from_secs(3),
            ..Setup::default().timeouts
        },
        ..Setup::default()
    })
    .await;
    fleet.apply(rolling(1, json!(1), true, TO)).await;
    fleet
        .eventually("the reboot times out", ROLLOUT, |f| {
            f.state("gpu-0").as_deref() == Some("Reboot-Failed")
        })
        .await;
    assert!(!fleet.released("gpu-0"), "a failed node stays cordoned");
    // The Event follows the state's write.
    wait::eventually("a Warning Event about the reboot", || {
        fleet
            .cluster
            .list("events.k8s.io/v1", "Event")
            .iter()
            .any(|e| {
                e["reason"] == "DriverUpgradeFailed"
                    && e["note"].as_str().is_some_and(|n| n.contains("reboot"))
            })
    })
    .await;
    // The failed record no longer asks for a reboot; the agent, still told
    // the target, loads it without one (evidence that it acted on the record
    // after the failure), and asked for one reboot only.
    let record = |f: &Fleet| {
        f.node("gpu-0")["metadata"]["annotations"]["operator.amd.com/gpu-driver-upgrade"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert!(!record(&fleet).contains("rebootFrom"), "{}", record(&fleet));
    fleet
        .eventually(
            "the agent loads the target after the failure",
            ROLLOUT,
            |f| f.reported_version("gpu-0").as_deref() == Some(TO),
        )
        .await;
    assert_eq!(bundles::reboots(&fleet.members[0].tools()), 1);
    assert_eq!(fleet.state("gpu-0").as_deref(), Some("Reboot-Failed"));
    fleet.stop_all().await;

    // A target whose bundle does not verify for the node's kernel: the agent
    // says it refuses it, and the node is not picked (no drain, no reboot
    // into a node that could load nothing), its record saying why. Once the
    // bundle is there, the agent no longer refuses and the node goes.
    let mut fleet = Fleet::start(Setup {
        nodes: 1,
        bundles: vec![FROM],
        ..Setup::default()
    })
    .await;
    fleet.apply(rolling(1, json!(1), true, TO)).await;
    fleet
        .eventually("the node held back, saying why", ROLLOUT, |f| {
            f.state("gpu-0").as_deref() == Some("Upgrade-Not-Started")
                && record(f).contains("not picked: the agent refuses driver 6.4.1: VersionMismatch")
        })
        .await;
    assert!(fleet.released("gpu-0"), "never cordoned");
    assert_eq!(bundles::reboots(&fleet.members[0].tools()), 0);
    assert_eq!(fleet.reported_version("gpu-0").as_deref(), Some(FROM));
    bundles::write_bundle(&fleet.members[0].host, TO, SIM_KERNEL_RELEASE, false);
    fleet
        .eventually(
            "the node upgraded once its bundle is there",
            ROLLOUT,
            Fleet::all_upgraded,
        )
        .await;
    assert_eq!(bundles::reboots(&fleet.members[0].tools()), 1);
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_cordon_stays_and_a_node_that_is_not_ready_waits() {
    let mut fleet = Fleet::start(Setup {
        nodes: 4,
        ..Setup::default()
    })
    .await;
    let nodes: Api<Node> = Api::all(fleet.cluster.client());
    // `kubectl cordon gpu-1`, and gpu-2's kubelet stops reporting Ready.
    nodes
        .patch(
            "gpu-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let not_ready = |status: &str| json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "KubeletNotReady"}]}});
    nodes
        .patch_status(
            "gpu-2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(not_ready("False")),
        )
        .await
        .unwrap();
    // Three may be unavailable: two are already, so one goes at a time.
    fleet.apply(rolling(0, json!(3), false, TO)).await;
    fleet
        .eventually("the available nodes upgraded", ROLLOUT, |f| {
            ["gpu-0", "gpu-3"]
                .iter()
                .all(|n| f.state(n).as_deref() == Some("Upgrade-Complete") && f.released(n))
        })
        .await;
    let (busy, unavailable) = fleet.peaks(&IN_PROGRESS);
    assert_eq!(busy, 1, "only one more node could be made unavailable");
    assert!(unavailable <= 3, "{unavailable} unavailable at once");
    for n in ["gpu-1", "gpu-2"] {
        assert_eq!(
            fleet.state(n).as_deref(),
            Some("Upgrade-Not-Started"),
            "{n}"
        );
        assert_eq!(fleet.reported_version(n).as_deref(), Some(FROM), "{n}");
    }
    assert_eq!(
        fleet.node("gpu-1")["spec"]["unschedulable"],
        json!(true),
        "the person's cordon stays"
    );
    // Ready again: gpu-2 goes. The person uncordons gpu-1: it goes, and ends
    // uncordoned, as the upgrade's own cordon.
    nodes
        .patch_status(
            "gpu-2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(not_ready("True")),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "gpu-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": null}})),
        )
        .await
        .unwrap();
    fleet
        .eventually("every node upgraded", ROLLOUT, Fleet::all_upgraded)
        .await;
    fleet.stop_all().await;
}
