//! The cluster role end to end: several agents (one per simulated node) against
//! one API emulator elect a leader, which reconciles DeviceConfigs; failover,
//! network partition, status, conflicts and deletion.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_operator::api::DeviceConfig;
use gpu_operator::cluster::lease::{Election, LeaseConfig};
use gpu_operator::cluster::reconcile::FINALIZER;
use gpu_operator::simulate::{self, SimSpec};
use gpu_operator::testrunner::Commands;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use kube_emulator::Emulator;
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::{self, NAMESPACE as NS, TestCluster};
use support::node_rig::NodeRig;
use support::wait;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const LEASE_DURATION: Duration = Duration::from_secs(3);

/// A TCP proxy between one agent and the emulator that a test can cut, to play a
/// network partition. While cut it accepts connections, records the request line
/// of what the agent tried to send, and closes them.
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<(Instant, String)>>>,
    connections: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (c, a, conns) = (cut.clone(), attempts.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    let mut buf = vec![0u8; 512];
                    let n = tokio::time::timeout(Duration::from_secs(1), inbound.read(&mut buf))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or(0);
                    let line = String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    a.lock().unwrap().push((Instant::now(), line));
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(task);
            }
        });
        Self {
            addr,
            cut,
            attempts,
            connections,
        }
    }

    fn client(&self, emulator: &Emulator) -> Client {
        let mut config = emulator.config();
        config.cluster_url = format!("http://{}", self.addr).parse().unwrap();
        Client::try_from(config).unwrap()
    }

    /// Cuts the link: open connections (watches included) break, new ones fail.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    fn writes_after(&self, t: Instant) -> Vec<String> {
        self.attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, line)| *at > t && !line.starts_with("GET"))
            .map(|(_, line)| line.clone())
            .collect()
    }
}

/// A node of the fleet: its rig, and how often its agent's pod started.
struct Member {
    rig: NodeRig,
    /// Pod restarts: a restarted pod has a new name, so a new identity.
    restarts: usize,
}

struct Fleet {
    cluster: TestCluster,
    members: Vec<Member>,
}

impl Fleet {
    /// A node per entry of `node_labels`, each with its agent and a test kubelet.
    async fn start(node_labels: &[Value]) -> Self {
        Self::start_without_kubelet_on(node_labels, &[]).await
    }

    /// As [`Fleet::start`], but the nodes in `no_kubelet` have no kubelet (yet).
    async fn start_without_kubelet_on(node_labels: &[Value], no_kubelet: &[usize]) -> Self {
        Self::build(node_labels, no_kubelet, false).await
    }

    /// As [`Fleet::start`], with deploy/10-rbac.yaml and
    /// deploy/15-admission-policy.yaml in force and each agent sending its
    /// own pod's token: the operator's ServiceAccount, its node and pod named
    /// in the token, as the kubelet mints it. Each request the agents and the
    /// leader make then needs its grant.
    async fn start_under_the_admission_policy(node_labels: &[Value]) -> Self {
        Self::build(node_labels, &[], true).await
    }

    /// The identity of member `i`'s pod (its current incarnation).
    fn agent_user(&self, i: usize) -> kube_emulator::UserInfo {
        let member = &self.members[i];
        let pod = format!("pod-{i}-{}", member.restarts.saturating_sub(1));
        kube_emulator::UserInfo::service_account(NS, "gpu-operator")
            .with_extra(
                "authentication.kubernetes.io/node-name",
                &[&member.rig.name],
            )
            .with_extra("authentication.kubernetes.io/pod-name", &[&pod])
    }

    async fn build(node_labels: &[Value], no_kubelet: &[usize], under_policy: bool) -> Self {
        let cluster = TestCluster::start().await;
        if under_policy {
            cluster.apply_rbac();
            cluster.apply_admission_policies();
        }
        let mut members = Vec::new();
        for (i, labels) in node_labels.iter().enumerate() {
            let name = format!("node-{i}");
            cluster.add_node(cluster::node(&name, labels.clone()));
            let mut rig = NodeRig::builder(&name)
                .join(cluster.client())
                .host(SimSpec::new("mi210", Some(1), None).unwrap());
            if !no_kubelet.contains(&i) {
                rig = rig.kubelet();
            }
            members.push(Member {
                rig: rig.start().await,
                restarts: 0,
            });
        }
        let mut fleet = Self { cluster, members };
        for i in 0..fleet.members.len() {
            let client = under_policy.then(|| {
                // The identity spawn gives the pod: pod-<i>-<restarts>.
                fleet.members[i].restarts += 1;
                let user = fleet.agent_user(i);
                fleet.members[i].restarts -= 1;
                fleet.cluster.client_as(&user)
            });
            fleet.spawn(i, client);
        }
        fleet
    }

    /// Starts node `i`'s kubelet, which its agent's device plugin then registers with.
    async fn start_kubelet(&mut self, i: usize) {
        self.members[i].rig.start_kubelet().await;
    }

    fn spawn(&mut self, i: usize, client: Option<Client>) {
        let member = &mut self.members[i];
        let identity = format!("{}/pod-{i}-{}", member.rig.name, member.restarts);
        member.restarts += 1;
        let config = member
            .rig
            .agent_config()
            .rescan_interval(Duration::from_millis(500))
            // A test tool that does not exist until a test writes it.
            .test_commands(Some(Commands {
                rvs: member.rig.dir().join("rvs"),
                ..Commands::default()
            }))
            .leader(Some(
                LeaderConfigBuilder::new(NS, &identity, &member.rig.name)
                    .lease_timing(LEASE_DURATION, Duration::from_secs(1))
                    .teardown_timeout(Duration::from_secs(5))
                    .build(),
            ))
            .build();
        let client = client.unwrap_or_else(|| self.cluster.client());
        member.rig.start_agent_with(client, config);
    }

    async fn holder(&self) -> Option<String> {
        self.cluster.lease_holder().await
    }

    /// Waits for a leader other than `not`: who, and how long it took.
    async fn wait_holder(&self, not: Option<&str>) -> (String, Duration) {
        let started = Instant::now();
        let holder = wait::poll_until(
            &format!("a leader other than {not:?}"),
            || self.holder(),
            |h| h.is_some() && h.as_deref() != not,
        )
        .await;
        (holder.unwrap(), started.elapsed())
    }

    fn index_of(&self, identity: &str) -> usize {
        self.members
            .iter()
            .position(|m| identity.starts_with(&format!("{}/", m.rig.name)))
            .unwrap()
    }

    fn kill(&mut self, i: usize) {
        // A crash: no release, no clean-up.
        assert!(self.members[i].rig.has_agent(), "node {i} runs an agent");
        self.members[i].rig.abort_agent();
    }

    async fn stop(&mut self, i: usize) -> Duration {
        let started = Instant::now();
        if let Some((end, _)) = self.members[i].rig.stop_agent().await {
            end.expect("no panic").expect("clean stop");
        }
        started.elapsed()
    }

    async fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].rig.has_agent() {
                self.stop(i).await;
            }
        }
    }

    fn configs(&self) -> Api<DeviceConfig> {
        self.cluster.device_configs()
    }

    async fn apply(&self, name: &str, spec: Value) {
        self.cluster.apply_device_config(name, spec).await;
    }

    async fn status_of(&self, name: &str) -> Value {
        let dc = self.configs().get_opt(name).await.unwrap();
        dc.map(|dc| serde_json::to_value(dc.status).unwrap())
            .unwrap_or(Value::Null)
    }

    async fn eventually(&self, what: &str, check: impl AsyncFn(&Self) -> bool) {
        wait::poll_until(what, || check(self), |held| *held).await;
    }
}

/// Installs the Prometheus operator's ServiceMonitor CRD, as its Helm chart would.
fn serve_service_monitors(emulator: &Emulator) {
    emulator
        .create(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap();
}

fn metrics_service(emulator: &Emulator) -> Option<Value> {
    emulator.get("v1", "Service", NS, "gpus-metrics-exporter")
}

fn service_monitor(emulator: &Emulator) -> Option<Value> {
    emulator.get(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        NS,
        "gpus-metrics-exporter",
    )
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// deploy/15-admission-policy.yaml in force, the API server's way (the
/// emulator judges every write): the real leader, sending its pod's token,
/// adds its finalizer and writes the DeviceConfig's status; the other
/// agent's writes to the DeviceConfig, its spec, status or finalizer, are
/// refused, and so is any change of spec or labels by the leader itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_admission_policy_only_the_leader_writes_device_config_status_and_finalizer() {
    let labels = [json!({"gpu": "yes"}), json!({"gpu": "yes"})];
    let mut fleet = Fleet::start_under_the_admission_policy(&labels).await;
    let (leader, _) = fleet.wait_holder(None).await;
    fleet
        .apply(
            "gpus",
            json!({"selector": {"gpu": "yes"}, "devicePlugin": {},
                   "driver": {"enable": false, "version": "6.4.1"}}),
        )
        .await;
    fleet
        .eventually(
            "the leader's status and finalizer, under the policy",
            async |f| {
                let s = f.status_of("gpus").await;
                let dc = f.configs().get("gpus").await.unwrap();
                condition(&s, "Ready")["status"] == "True"
                    && s["observedGeneration"] == 1
                    && dc
                        .metadata
                        .finalizers
                        .unwrap_or_default()
                        .contains(&FINALIZER.to_string())
            },
        )
        .await;
    let leading = fleet.index_of(&leader);
    let other = 1 - leading;
    let as_agent = |i: usize| -> Api<DeviceConfig> {
        Api::namespaced(fleet.cluster.client_as(&fleet.agent_user(i)), NS)
    };
    let refused = |result: Result<DeviceConfig, kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{what}: {status:?}");
            assert!(
                status
                    .message
                    .contains("ValidatingAdmissionPolicy 'gpu-operator-leader-only'"),
                "{what}: {}",
                status.message
            );
        }
        other => panic!("{what}: not refused: {other:?}"),
    };
    let merge = |v: Value| Patch::Merge(v);
    let params = PatchParams::default();
    let not_leading = as_agent(other);
    refused(
        not_leading
            .patch(
                "gpus",
                &params,
                &merge(json!({"spec": {"driver": {"version": "9.9.9"}}})),
            )
            .await,
        "a non-leader's spec change",
    );
    refused(
        not_leading
            .patch_status(
                "gpus",
                &params,
                &merge(json!({"status": {"observedGeneration": 9}})),
            )
            .await,
        "a non-leader's status write",
    );
    refused(
        not_leading
            .patch(
                "gpus",
                &params,
                &merge(json!({"metadata": {"finalizers": null}})),
            )
            .await,
        "a non-leader's finalizer removal",
    );
    let leading_api = as_agent(leading);
    refused(
        leading_api
            .patch(
                "gpus",
                &params,
                &merge(json!({"spec": {"driver": {"version": "9.9.9"}}})),
            )
            .await,
        "the leader's spec change",
    );
    refused(
        leading_api
            .patch(
                "gpus",
                &params,
                &merge(json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await,
        "the leader's label",
    );
    // Nothing of it landed; an administrator's change still does.
    let dc = fleet.configs().get("gpus").await.unwrap();
    assert_eq!(dc.spec.driver().version.as_deref(), Some("6.4.1"));
    assert!(
        dc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    fleet
        .configs()
        .patch(
            "gpus",
            &params,
            &merge(json!({"spec": {"driver": {"version": "6.4.2"}}})),
        )
        .await
        .expect("an administrator is not matched");
    fleet
        .eventually(
            "the leader reconciles the administrator's change",
            async |f| f.status_of("gpus").await["observedGeneration"] == 2,
        )
        .await;
    // The agents' and the leader's own requests all had their grants in
    // deploy/10-rbac.yaml.
    let refused = fleet.cluster.refused();
    assert!(refused.is_empty(), "{refused:#?}");
    fleet.stop_all().await;
}

/// DeviceConfigs in any namespace (the reference's operator watches them
/// all), under deploy/15-admission-policy.yaml with each agent's own token:
/// a DeviceConfig in team-a is followed by the agent of the node it selects
/// (its status annotation names team-a/gpus); the leader writes its status
/// and finalizer and its Events in team-a, and keeps its metrics Service
/// beside the agents; another agent may write none of it. A DeviceConfig in
/// team-b that selects the same node is a conflict: both DeviceConfigs'
/// status and the node's agent name the other by namespace/name, and the
/// node runs nothing until it is resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_configs_in_other_namespaces_are_followed_and_conflict_across_namespaces() {
    use gpu_operator::api::agent_status::STATUS_ANNOTATION;
    let labels = [
        json!({"gpu": "yes", "team": "a"}),
        json!({"gpu": "yes", "team": "b"}),
    ];
    let mut fleet = Fleet::start_under_the_admission_policy(&labels).await;
    for team in ["team-a", "team-b"] {
        fleet
            .cluster
            .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}}))
            .unwrap();
    }
    let (leader, _) = fleet.wait_holder(None).await;
    let leading = fleet.index_of(&leader);
    let in_ns = |ns: &str| -> Api<DeviceConfig> { Api::namespaced(fleet.cluster.client(), ns) };
    let status_in = async |ns: &str, name: &str| -> Value {
        in_ns(ns)
            .get_opt(name)
            .await
            .unwrap()
            .map(|dc| serde_json::to_value(dc.status).unwrap())
            .unwrap_or(Value::Null)
    };
    let agent_status = |node: &str| -> Value {
        fleet.cluster.node(node)["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null)
    };
    fleet
        .cluster
        .apply_device_config_in(
            "team-a",
            "gpus",
            json!({"selector": {"team": "a"}, "devicePlugin": {},
                   "metricsExporter": {"enable": true}}),
        )
        .await;

    // Followed: the selected node's agent serves it, the leader reports it.
    fleet
        .eventually("team-a/gpus followed on node-0 and Ready", async |_| {
            let s = status_in("team-a", "gpus").await;
            condition(&s, "Ready")["status"] == "True"
                && s["observedGeneration"] == 1
                && s["devicePlugin"]["nodesMatchingSelectorNumber"] == 1
                && agent_status("node-0")["deviceConfig"] == "team-a/gpus"
        })
        .await;
    assert!(
        agent_status("node-1")["deviceConfig"].is_null(),
        "node-1 is not selected: {}",
        agent_status("node-1")
    );
    let dc = in_ns("team-a").get("gpus").await.unwrap();
    assert!(
        dc.finalizers().contains(&FINALIZER.to_string()),
        "the leader's finalizer in team-a"
    );
    // Its metrics Service is kept where the agents it selects are.
    let service_name = gpu_operator::cluster::resources::metrics_service_name(&dc, Some(NS));
    let service = fleet
        .cluster
        .get("v1", "Service", NS, &service_name)
        .expect("the metrics Service of team-a/gpus beside the agents");
    assert_eq!(
        service["metadata"]["annotations"]["amd.com/deviceconfig"],
        "team-a/gpus"
    );
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/name"],
        "gpu-operator"
    );
    assert!(
        fleet
            .cluster
            .list("v1", "Service")
            .iter()
            .all(|s| s["metadata"]["namespace"] == NS),
        "no Service outside the agents' namespace"
    );
    // No owner reference crosses namespaces; the annotation brings one
    // deleted by hand back to its DeviceConfig, which puts it back. Nothing
    // else may be left to trigger a reconcile: wait until node-0's agent has
    // nothing more to report, the leader has counted it, and nobody has
    // written anything but the Lease for longer than the leader's status
    // interval (a throttled status write would reconcile again).
    fleet
        .eventually("node-0's last report counted", async |_| {
            let agent = agent_status("node-0");
            let services = agent["services"].as_object().cloned().unwrap_or_default();
            let status = status_in("team-a", "gpus").await;
            services.contains_key("metricsExporter")
                && services.values().all(|v| v["state"] == "Running")
                && status["devicePlugin"]["availableNumber"] == 1
                && status["metricsExporter"]["availableNumber"] == 1
        })
        .await;
    let writes = || {
        fleet
            .cluster
            .requests()
            .non_watch()
            .filter(|k| {
                !["get", "list"].contains(&k.verb.as_str()) && !k.resource.starts_with("leases")
            })
            .total()
    };
    let mut quiet = false;
    for _ in 0..20 {
        let before = writes();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if writes() == before {
            quiet = true;
            break;
        }
    }
    assert!(quiet, "the cluster never settled");
    let first_uid = service["metadata"]["uid"].clone();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(fleet.cluster.client(), NS);
    services
        .delete(&service_name, &DeleteParams::default())
        .await
        .unwrap();
    fleet
        .eventually("the deleted Service of team-a/gpus put back", async |f| {
            f.cluster
                .get("v1", "Service", NS, &service_name)
                .is_some_and(|s| s["metadata"]["uid"] != first_uid)
        })
        .await;
    // Its Events, in its namespace.
    fleet
        .eventually("the Ready Event in team-a", async |f| {
            f.cluster.list("events.k8s.io/v1", "Event").iter().any(|e| {
                e["metadata"]["namespace"] == "team-a"
                    && e["regarding"]["name"] == "gpus"
                    && e["reason"] == "Ready"
            })
        })
        .await;
    // Another agent may not write its status or finalizer there.
    let other = 1 - leading;
    let not_leading: Api<DeviceConfig> =
        Api::namespaced(fleet.cluster.client_as(&fleet.agent_user(other)), "team-a");
    let params = PatchParams::default();
    for (what, result) in [
        (
            "status",
            not_leading
                .patch_status(
                    "gpus",
                    &params,
                    &Patch::Merge(json!({"status": {"observedGeneration": 9}})),
                )
                .await,
        ),
        (
            "finalizer",
            not_leading
                .patch(
                    "gpus",
                    &params,
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await,
        ),
    ] {
        match result {
            Err(kube::Error::Api(status)) => assert!(
                status.code == 403
                    && status
                        .message
                        .contains("ValidatingAdmissionPolicy 'gpu-operator-leader-only'"),
                "{what}: {status:?}"
            ),
            other => panic!("a non-leader's {what} write in team-a was not refused: {other:?}"),
        }
    }

    // team-b/wide selects both nodes, node-0 too: a conflict across namespaces.
    fleet
        .cluster
        .apply_device_config_in("team-b", "wide", json!({"selector": {"gpu": "yes"}}))
        .await;
    let error_of = async |ns: &str, name: &str| -> String {
        condition(&status_in(ns, name).await, "Error")["message"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    fleet
        .eventually(
            "the conflict in both DeviceConfigs and on node-0",
            async |_| {
                let a = error_of("team-a", "gpus").await;
                let b = error_of("team-b", "wide").await;
                let problems = agent_status("node-0")["problems"].to_string();
                a.contains("node node-0 is also selected by team-b/wide")
                    && b.contains("node node-0 is also selected by team-a/gpus")
                    && !b.contains("node-1")
                    && problems
                        .contains("DeviceConfigs team-a/gpus, team-b/wide all select this node")
            },
        )
        .await;
    let a = status_in("team-a", "gpus").await;
    assert_eq!(condition(&a, "Ready")["status"], "False", "{a:#}");
    assert!(
        agent_status("node-0")["deviceConfig"].is_null(),
        "node-0 follows neither while they conflict: {}",
        agent_status("node-0")
    );
    // node-1 is team-b/wide's alone.
    fleet
        .eventually("node-1 follows team-b/wide", async |_| {
            agent_status("node-1")["deviceConfig"] == "team-b/wide"
        })
        .await;

    // Resolved: team-b/wide no longer takes node-0, and team-a/gpus is Ready again.
    fleet
        .cluster
        .apply_device_config_in("team-b", "wide", json!({"selector": {"team": "b"}}))
        .await;
    fleet
        .eventually("the conflict resolved", async |_| {
            condition(&status_in("team-a", "gpus").await, "Ready")["status"] == "True"
                && agent_status("node-0")["deviceConfig"] == "team-a/gpus"
                && error_of("team-b", "wide").await.is_empty()
        })
        .await;

    // Deleted: torn down, its Service removed, its finalizer lifted.
    in_ns("team-a")
        .delete("gpus", &DeleteParams::default())
        .await
        .unwrap();
    fleet
        .eventually("team-a/gpus torn down and gone", async |f| {
            in_ns("team-a").get_opt("gpus").await.unwrap().is_none()
                && f.cluster.get("v1", "Service", NS, &service_name).is_none()
                && agent_status("node-0")["deviceConfig"].is_null()
        })
        .await;
    // The agents' and the leader's own requests all had their grants in
    // deploy/10-rbac.yaml.
    let refused = fleet.cluster.refused();
    assert!(refused.is_empty(), "{refused:#?}");
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_reconciles_and_fails_over() {
    let labels = [
        json!({"gpu": "yes"}),
        json!({"gpu": "yes"}),
        json!({"gpu": "no"}),
    ];
    let mut fleet = Fleet::start(&labels).await;
    let (leader, _) = fleet.wait_holder(None).await;

    // Status: a selector for 2 of 3 nodes.
    fleet
        .apply(
            "gpus",
            json!({"selector": {"gpu": "yes"}, "devicePlugin": {}}),
        )
        .await;
    fleet
        .eventually("Ready with counts", async |f| {
            let s = f.status_of("gpus").await;
            condition(&s, "Ready")["status"] == "True"
                && s["devicePlugin"]["nodesMatchingSelectorNumber"] == 2
                && s["devicePlugin"]["desiredNumber"] == 2
                && s["devicePlugin"]["availableNumber"] == 2
                && s["observedGeneration"] == 1
        })
        .await;
    let dc = fleet.configs().get("gpus").await.unwrap();
    assert!(
        dc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    assert_eq!(
        condition(&fleet.status_of("gpus").await, "Ready")["reason"],
        "OperatorReady"
    );

    // Idle: after convergence nothing but watches and lease renewals. (The
    // first second lets writes already under way land; the next three must
    // see none.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = fleet.cluster.requests();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let made = fleet.cluster.requests().since(&before);
    let unexpected = made
        .non_watch()
        .filter(|k| !k.resource.starts_with("leases"));
    assert_eq!(
        unexpected.total(),
        0,
        "idle requests besides watches and lease renewals:\n{made}"
    );

    // Kubelet heartbeats (status-only Node updates) trigger no reconcile: the
    // leader makes no request about DeviceConfigs or what they own.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(fleet.cluster.client());
    let before = fleet.cluster.requests();
    for beat in 0..5 {
        for member in &fleet.members {
            let heartbeat = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": format!("2026-11-30T00:00:0{beat}Z")}]}});
            nodes
                .patch_status(
                    &member.rig.name,
                    &PatchParams::default(),
                    &Patch::Strategic(heartbeat),
                )
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let made = fleet.cluster.requests().since(&before);
    let reconciling = made
        .non_watch()
        .filter(|k| !k.resource.starts_with("leases") && !k.resource.starts_with("nodes"));
    assert_eq!(
        reconciling.total(),
        0,
        "heartbeats caused requests:\n{made}"
    );

    // Killing the leader (no release) moves leadership within duration + 2 s.
    let i = fleet.index_of(&leader);
    fleet.kill(i);
    let (second, took) = fleet.wait_holder(Some(&leader)).await;
    assert!(
        took <= LEASE_DURATION + Duration::from_secs(2),
        "failover took {took:?}"
    );

    // The DaemonSet restarts the crashed pod; the new leader reconciles a spec
    // change that every selected agent (the restarted one too) acknowledges.
    fleet.spawn(i, None);
    fleet
        .apply(
            "gpus",
            json!({"selector": {"gpu": "yes"}, "devicePlugin": {"enableNodeLabeller": false}}),
        )
        .await;
    fleet
        .eventually("generation 2 observed", async |f| {
            f.status_of("gpus").await["observedGeneration"] == 2
        })
        .await;

    // A graceful stop releases the lease: a standby takes over within 2 s.
    let j = fleet.index_of(&second);
    let stop_started = Instant::now();
    fleet.stop(j).await;
    let (third, _) = fleet.wait_holder(Some(&second)).await;
    let took = stop_started.elapsed();
    assert!(
        took <= Duration::from_secs(2),
        "graceful handover took {took:?}"
    );
    assert_ne!(third, leader);
    fleet.stop_all().await;
}

/// The status contract end to end: real agents write their annotations, the
/// real leader reads them. Every service name an agent writes is one the leader
/// knows, and a service counts as available only when it serves users.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_what_real_agents_serve_and_ready_says_which_nodes_do_not() {
    use gpu_operator::api::agent_status::{AgentStatus, STATUS_ANNOTATION, ServiceName};
    let labels = [json!({}), json!({}), json!({})];
    // node-2's kubelet is not running: its device plugin cannot register.
    let mut fleet = Fleet::start_without_kubelet_on(&labels, &[2]).await;
    fleet.wait_holder(None).await;
    fleet
        .apply(
            "gpus",
            json!({"driver": {"enable": false}, "metricsExporter": {"enable": true},
                "testRunner": {"enable": true}, "devicePlugin": {}}),
        )
        .await;
    fleet
        .eventually(
            "counts of what serves, Ready False naming node-2",
            async |f| {
                let s = f.status_of("gpus").await;
                let ready = condition(&s, "Ready");
                s["devicePlugin"]["desiredNumber"] == 3
                    && s["devicePlugin"]["availableNumber"] == 2
                    && s["metricsExporter"]["desiredNumber"] == 3
                    && s["metricsExporter"]["availableNumber"] == 3
                    && ready["status"] == "False"
                    && ready["reason"] == "NodesNotServing"
                    && ready["message"].as_str().is_some_and(|m| {
                        m.starts_with("3 of 3 node(s) not serving: ")
                            && m.contains("node-2: devicePlugin: not registered with the kubelet")
                            && m.contains("testRunner: tests cannot start")
                    })
            },
        )
        .await;
    let status = fleet.status_of("gpus").await;
    // The inbox driver: the driver block stays empty, as in the reference.
    assert!(status.get("driver").is_none(), "{status:#}");

    // Every name every real agent wrote parses to a service the leader knows.
    for member in &fleet.members {
        let node = fleet
            .cluster
            .get("v1", "Node", "", &member.rig.name)
            .unwrap();
        let text = node["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .unwrap()
            .to_owned();
        let agent = AgentStatus::parse(&text).unwrap();
        // What driver and kernel the node runs is reported whatever
        // `driver.enable` says, from the agent's own reads of the host.
        let driver = agent.driver.as_ref().expect("a driver report");
        assert_eq!(
            driver.kernel_release.as_deref(),
            Some(simulate::SIM_KERNEL_RELEASE),
            "{text}"
        );
        assert_eq!(driver.boot_id.as_deref(), Some(simulate::SIM_BOOT_ID));
        assert_eq!(driver.origin, gpu_operator::driver::ModuleOrigin::OutOfTree);
        assert!(driver.loaded && driver.version.is_some() && driver.refcnt.is_none());
        let names: Vec<ServiceName> = agent.services.keys().copied().collect();
        assert_eq!(
            names,
            [
                ServiceName::DevicePlugin,
                ServiceName::Labeller,
                ServiceName::HealthMonitor,
                ServiceName::MetricsExporter,
                ServiceName::TestRunner,
            ],
            "{}: {text}",
            member.rig.name
        );
    }

    // The administrator starts the kubelet and turns off the tests whose tool
    // is missing: every node serves, and Ready says so.
    fleet.start_kubelet(2).await;
    fleet
        .apply(
            "gpus",
            json!({"driver": {"enable": false}, "metricsExporter": {"enable": true},
                "testRunner": {"enable": false}, "devicePlugin": {}}),
        )
        .await;
    fleet
        .eventually("all three serving, Ready True", async |f| {
            let s = f.status_of("gpus").await;
            s["devicePlugin"]["availableNumber"] == 3
                && s["metricsExporter"]["availableNumber"] == 3
                && condition(&s, "Ready")["status"] == "True"
                && condition(&s, "Ready")["reason"] == "OperatorReady"
        })
        .await;

    // With a managed driver, each node's module status carries the kernel
    // and boot id its agent read (the emulator's Nodes have no nodeInfo).
    fleet
        .apply(
            "gpus",
            json!({"driver": {"enable": true}, "metricsExporter": {"enable": true},
                "testRunner": {"enable": false}, "devicePlugin": {}}),
        )
        .await;
    fleet
        .eventually("nodeModuleStatus from the agents' reports", async |f| {
            let s = f.status_of("gpus").await;
            (0..3).all(|i| {
                let module = &s["nodeModuleStatus"][format!("node-{i}")];
                module["kernelVersion"] == simulate::SIM_KERNEL_RELEASE
                    && module["bootId"] == simulate::SIM_BOOT_ID
            })
        })
        .await;
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_and_overlapping_device_configs_get_validation_errors() {
    let mut fleet = Fleet::start(&[json!({"gpu": "yes"})]).await;
    fleet.wait_holder(None).await;
    fleet
        .apply(
            "both",
            json!({"draDriver": {"enable": true}, "devicePlugin": {}, "selector": {"gpu": "no"}}),
        )
        .await;
    fleet
        .eventually("ValidationError for device plugin + DRA", async |f| {
            let s = f.status_of("both").await;
            let error = condition(&s, "Error");
            error["status"] == "True"
                && error["reason"] == "ValidationError"
                && error["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("draDriver")
                && condition(&s, "Ready")["status"] == "False"
        })
        .await;

    fleet
        .apply("first", json!({"selector": {"gpu": "yes"}}))
        .await;
    fleet.apply("second", json!({})).await;
    for name in ["first", "second"] {
        fleet
            .eventually("overlap flagged", async |f| {
                let s = f.status_of(name).await;
                let error = condition(&s, "Error");
                error["reason"] == "ValidationError"
                    && error["message"].as_str().unwrap_or("").contains("node-0")
            })
            .await;
    }
    // A missing ConfigMap reference is a validation error too. A missing
    // Secret is not looked up: the agents may not read Secrets (the consumer
    // reports it; --check-secret-references with the optional Role checks it).
    fleet
        .apply(
            "first",
            json!({"metricsExporter": {"enable": true, "config": {"name": "absent"}},
                   "driver": {"imageSign": {"keySecret": {"name": "no-key"}}}}),
        )
        .await;
    fleet
        .configs()
        .delete("second", &DeleteParams::default())
        .await
        .unwrap();
    fleet
        .eventually("missing ConfigMap flagged", async |f| {
            condition(&f.status_of("first").await, "Error")["message"]
                .as_str()
                .unwrap_or("")
                .contains("ConfigMap \"absent\" does not exist")
        })
        .await;
    let message = condition(&fleet.status_of("first").await, "Error")["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        !message.contains("no-key"),
        "the leader looked up a Secret: {message}"
    );
    assert_eq!(
        fleet.cluster.requests().get("get", "secrets"),
        0,
        "the leader made a request on Secrets"
    );
    // A reference RBAC forbids reading is a status problem, not a retry loop.
    fleet
        .cluster
        .faults()
        .fail_next(10_000, "get", "configmaps", 403);
    fleet
        .apply(
            "first",
            json!({"metricsExporter": {"config": {"name": "elsewhere"}}}),
        )
        .await;
    fleet
        .eventually("forbidden ConfigMap flagged", async |f| {
            condition(&f.status_of("first").await, "Error")["message"]
                .as_str()
                .unwrap_or("")
                .contains("ConfigMap \"elsewhere\" cannot be read")
        })
        .await;
    fleet.cluster.faults().clear();
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_device_config_tears_down_then_releases_the_finalizer() {
    let mut fleet = Fleet::start(&[json!({})]).await;
    let kubelet = fleet.members[0].rig.take_kubelet();
    serve_service_monitors(&fleet.cluster);
    fleet.wait_holder(None).await;
    fleet
        .apply(
            "gpus",
            json!({"metricsExporter": {"enable": true, "port": 5055,
                "prometheus": {"serviceMonitor": {"enable": true}}}, "devicePlugin": {}}),
        )
        .await;
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    fleet
        .eventually(
            "labels, health condition, Service and ServiceMonitor",
            async |f| {
                let node = f.cluster.get("v1", "Node", "", "node-0").unwrap();
                let has_condition = node["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "AMDGPUUnhealthy"));
                node["metadata"]["labels"]
                    .get("amd.com/gpu.family")
                    .is_some()
                    && has_condition
                    && metrics_service(&f.cluster).is_some()
                    && service_monitor(&f.cluster).is_some()
            },
        )
        .await;
    fleet
        .configs()
        .delete("gpus", &DeleteParams::default())
        .await
        .unwrap();
    fleet
        .eventually("DeviceConfig gone", async |f| {
            f.configs().get_opt("gpus").await.unwrap().is_none()
        })
        .await;
    let node = fleet.cluster.get("v1", "Node", "", "node-0").unwrap();
    let labels = node["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        !labels.keys().any(|k| k.starts_with("amd.com/gpu.")),
        "{labels:?}"
    );
    assert!(
        node["metadata"]["annotations"]
            .get(gpu_operator::api::agent_status::STATUS_ANNOTATION)
            .is_none(),
        "the status annotation is removed: {node:#}"
    );
    assert!(
        !node["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "AMDGPUUnhealthy")),
        "the health condition is removed: {node:#}"
    );
    let sockets: Vec<_> = std::fs::read_dir(kubelet.dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("amd.com_"))
        .collect();
    assert!(sockets.is_empty(), "{sockets:?}");
    assert!(metrics_service(&fleet.cluster).is_none());
    assert!(
        service_monitor(&fleet.cluster).is_none(),
        "teardown deletes the ServiceMonitor too; the emulator has no garbage collector"
    );
    let events = fleet.cluster.list("events.k8s.io/v1", "Event");
    assert!(
        events.iter().any(|e| e["reason"] == "TornDown"),
        "{events:#?}"
    );
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_gives_up_on_a_not_ready_node_after_the_timeout() {
    let mut fleet = Fleet::start(&[json!({}), json!({})]).await;
    fleet.wait_holder(None).await;
    fleet.apply("gpus", json!({"devicePlugin": {}})).await;
    fleet
        .eventually("Ready on both nodes", async |f| {
            let status = f.status_of("gpus").await;
            condition(&status, "Ready")["status"] == "True"
                && status["devicePlugin"]["availableNumber"] == 2
        })
        .await;
    // node-1 dies with its agent: it never tears down, and goes NotReady.
    fleet.kill(1);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(fleet.cluster.client());
    nodes
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
        )
        .await
        .unwrap();
    let deleted_at = Instant::now();
    fleet
        .configs()
        .delete("gpus", &DeleteParams::default())
        .await
        .unwrap();
    let configs = fleet.configs();
    wait::poll_until(
        "the finalizer released",
        || configs.get_opt("gpus"),
        |dc| dc.as_ref().is_ok_and(Option::is_none),
    )
    .await
    .unwrap();
    // The timeout runs from deletionTimestamp, which has whole seconds: up to
    // one second before this test's clock started.
    assert!(
        deleted_at.elapsed() >= Duration::from_secs(4),
        "it waited the teardown timeout for node-1 first ({:?})",
        deleted_at.elapsed()
    );
    let events = fleet.cluster.list("events.k8s.io/v1", "Event");
    assert!(
        events.iter().any(|e| e["reason"] == "TornDown"
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("gave up waiting for NotReady node(s) node-1"))),
        "{events:#?}"
    );
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_leading_and_writes_nothing_after_expiry() {
    let cluster = TestCluster::start().await;
    let proxy = Proxy::start(cluster.addr()).await;
    let shutdown = CancellationToken::new();
    let mut config = LeaseConfig::new(NS, "cut-off/pod");
    config.duration = LEASE_DURATION;
    config.renew_every = Duration::from_secs(1);
    let cut_off = Election::start(
        proxy.client(&cluster),
        config.clone(),
        shutdown.child_token(),
    );
    let mut leading = cut_off.leading.clone();
    wait::within("leadership", leading.wait_for(|l| *l))
        .await
        .unwrap();
    assert!(cut_off.guard.is_held());

    let mut standby_config = config.clone();
    standby_config.identity = "standby/pod".into();
    let standby = Election::start(cluster.client(), standby_config, shutdown.child_token());

    let cut_at = Instant::now();
    proxy.cut();
    tokio::time::timeout(
        LEASE_DURATION + Duration::from_secs(1),
        leading.wait_for(|l| !*l),
    )
    .await
    .expect("leadership ends by local expiry")
    .unwrap();
    let lost_after = cut_at.elapsed();
    assert!(
        lost_after <= LEASE_DURATION,
        "lost leadership only after {lost_after:?}"
    );
    assert!(!cut_off.guard.is_held(), "the guard refuses leader writes");
    let expired_at = Instant::now();

    let mut standby_leading = standby.leading.clone();
    tokio::time::timeout(
        LEASE_DURATION + Duration::from_secs(3),
        standby_leading.wait_for(|l| *l),
    )
    .await
    .expect("the standby takes over")
    .unwrap();
    // The cut-off candidate may try to take the lease back; it writes nothing else.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = proxy.writes_after(expired_at);
    assert!(
        writes.iter().all(|w| w.contains("/leases")),
        "writes other than lease attempts after expiry: {writes:?}"
    );
    shutdown.cancel();
    cut_off.finished().await;
    standby.finished().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_lease_renewal_ends_leadership_at_expiry() {
    let cluster = TestCluster::start().await;
    let shutdown = CancellationToken::new();
    let mut config = LeaseConfig::new(NS, "slow/pod");
    config.duration = LEASE_DURATION;
    config.renew_every = Duration::from_secs(1);
    let election = Election::start(cluster.client(), config, shutdown.child_token());
    let mut leading = election.leading.clone();
    wait::within("leadership", leading.wait_for(|l| *l))
        .await
        .unwrap();
    // The API server accepts renewals but answers none of them for 30 s.
    cluster.faults().add_latency(
        "update",
        "leases.coordination.k8s.io",
        Duration::from_secs(30),
    );
    tokio::time::timeout(
        LEASE_DURATION + Duration::from_secs(1),
        leading.wait_for(|l| !*l),
    )
    .await
    .expect("a renewal that hangs does not extend leadership past expiry")
    .unwrap();
    assert!(!election.guard.is_held());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(4), election.finished())
        .await
        .expect("shutdown does not wait for the hung write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leader_write_is_sent_after_the_lease_lapses_even_when_retried() {
    let mut fleet = Fleet::start(&[json!({})]).await;
    fleet.wait_holder(None).await;
    fleet.apply("gpus", json!({})).await;
    fleet
        .eventually("Ready", async |f| {
            condition(&f.status_of("gpus").await, "Ready")["status"] == "True"
        })
        .await;
    let leader_writes = |f: &Fleet| {
        let counts = f.cluster.requests();
        [
            "deviceconfigs.amd.com",
            "deviceconfigs.amd.com/status",
            "services",
        ]
        .iter()
        .map(|r| {
            ["create", "update", "patch", "delete"]
                .iter()
                .map(|v| counts.get(v, r))
                .sum::<u64>()
        })
        .sum::<u64>()
    };
    // From now on renewals hang, so the lease lapses at most LEASE_DURATION
    // after the last renewal that got through, and status writes fail with
    // 503, which kube's client retries by itself with growing backoff.
    let faults = fleet.cluster.faults();
    faults.add_latency(
        "update",
        "leases.coordination.k8s.io",
        Duration::from_secs(30),
    );
    faults.fail_next(100_000, "patch", "deviceconfigs.amd.com/status", 503);
    let cut_at = Instant::now();
    let before = leader_writes(&fleet);
    // A spec change the leader sees through its watch, which still works.
    fleet
        .apply("gpus", json!({"metricsExporter": {"port": 5071}}))
        .await;
    tokio::time::sleep_until((cut_at + LEASE_DURATION + Duration::from_millis(500)).into()).await;
    let at_expiry = leader_writes(&fleet);
    assert!(
        at_expiry > before,
        "the leader tried to write while it held the lease (else this test shows nothing)"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let later = leader_writes(&fleet);
    assert_eq!(
        later, at_expiry,
        "leader writes (retries included) were sent after the lease lapsed"
    );
    faults.clear();
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_metrics_service_is_put_back_without_waiting_for_other_changes() {
    let mut fleet = Fleet::start(&[json!({})]).await;
    fleet.wait_holder(None).await;
    fleet
        .apply(
            "gpus",
            json!({"metricsExporter": {"enable": true, "port": 5057}, "devicePlugin": {}}),
        )
        .await;
    fleet
        .eventually("Ready and settled, with the Service", async |f| {
            let status = f.status_of("gpus").await;
            condition(&status, "Ready")["status"] == "True"
                && status["observedGeneration"].as_i64().is_some()
                && metrics_service(&f.cluster).is_some()
        })
        .await;
    // Nothing but the deletion may be left to trigger a reconcile (there is no
    // periodic requeue): wait until the agent has nothing more to report (every
    // service it runs is Running) and the leader has counted that report.
    fleet
        .eventually("the agent's last report counted", async |f| {
            use gpu_operator::api::agent_status::{
                AgentStatus, STATUS_ANNOTATION, ServiceName, ServiceStatus,
            };
            let node = f.cluster.node("node-0");
            let all_running = node["metadata"]["annotations"][STATUS_ANNOTATION]
                .as_str()
                .and_then(|text| AgentStatus::parse(text).ok())
                .is_some_and(|s| {
                    s.services.contains_key(&ServiceName::MetricsExporter)
                        && s.services.values().all(|v| *v == ServiceStatus::Running)
                });
            let status = f.status_of("gpus").await;
            all_running
                && status["devicePlugin"]["availableNumber"] == 1
                && status["metricsExporter"]["availableNumber"] == 1
        })
        .await;
    let first_uid = metrics_service(&fleet.cluster).unwrap()["metadata"]["uid"].clone();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(fleet.cluster.client(), NS);
    services
        .delete("gpus-metrics-exporter", &DeleteParams::default())
        .await
        .unwrap();
    fleet
        .eventually("a new Service", async |f| {
            metrics_service(&f.cluster).is_some_and(|s| s["metadata"]["uid"] != first_uid)
        })
        .await;
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_monitor_follows_the_spec_when_its_crd_is_served() {
    let mut fleet = Fleet::start(&[json!({})]).await;
    fleet.wait_holder(None).await;
    // Without the CRD, asking for a ServiceMonitor is skipped, not an error.
    let with_monitor = json!({"metricsExporter": {"enable": true, "serviceType": "NodePort", "nodePort": 31500,
        "prometheus": {"serviceMonitor": {"enable": true, "interval": "30s", "labels": {"release": "prom"}}}}});
    fleet.apply("gpus", with_monitor.clone()).await;
    fleet
        .eventually("Ready with the Service", async |f| {
            condition(&f.status_of("gpus").await, "Ready")["status"] == "True"
                && metrics_service(&f.cluster).is_some()
        })
        .await;
    let service = metrics_service(&fleet.cluster).unwrap();
    assert_eq!(service["spec"]["type"], "NodePort");
    assert_eq!(service["spec"]["ports"][0]["nodePort"], 31500);
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["kind"],
        "DeviceConfig"
    );

    // Once the Prometheus operator's CRD is served, the next reconcile creates it.
    serve_service_monitors(&fleet.cluster);
    fleet
        .apply(
            "gpus",
            json!({"metricsExporter": {"prometheus": {"serviceMonitor": {"interval": "15s"}}}}),
        )
        .await;
    fleet
        .eventually("the ServiceMonitor", async |f| {
            service_monitor(&f.cluster)
                .is_some_and(|sm| sm["spec"]["endpoints"][0]["interval"] == "15s")
        })
        .await;
    let monitor = service_monitor(&fleet.cluster).unwrap();
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "exporter-port");

    // Switching the monitor off deletes it; switching metrics off deletes the Service.
    fleet
        .apply(
            "gpus",
            json!({"metricsExporter": {"prometheus": {"serviceMonitor": {"enable": false}}}}),
        )
        .await;
    fleet
        .eventually("ServiceMonitor deleted", async |f| {
            service_monitor(&f.cluster).is_none()
        })
        .await;
    fleet
        .apply("gpus", json!({"metricsExporter": {"enable": false}}))
        .await;
    fleet
        .eventually("Service deleted", async |f| {
            metrics_service(&f.cluster).is_none()
        })
        .await;
    // Later reconciles send no DELETE for it: the owned-Service cache knows
    // there is nothing to delete.
    let deletes = fleet.cluster.requests().get("delete", "services");
    fleet
        .apply(
            "gpus",
            json!({"devicePlugin": {"enableNodeLabeller": false}}),
        )
        .await;
    let generation = fleet
        .configs()
        .get("gpus")
        .await
        .unwrap()
        .metadata
        .generation;
    fleet
        .eventually("the change reconciled", async |f| {
            f.status_of("gpus").await["observedGeneration"].as_i64() == generation
        })
        .await;
    assert_eq!(fleet.cluster.requests().get("delete", "services"), deletes);
    fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_device_class_exists_while_a_device_config_enables_dra() {
    let mut fleet = Fleet::start(&[json!({})]).await;
    fleet.wait_holder(None).await;
    let class = |f: &Fleet| {
        f.cluster
            .get("resource.k8s.io/v1", "DeviceClass", "", "gpu.amd.com")
    };
    fleet.apply("gpus", json!({"devicePlugin": {}})).await;
    fleet
        .eventually("status written", async |f| {
            !condition(&f.status_of("gpus").await, "Ready").is_null()
        })
        .await;
    assert!(class(&fleet).is_none(), "no DeviceConfig enables DRA");

    // gpu.amd.com as operators before this one applied it, serving
    // amd.com/gpu itself, under the leader's field manager.
    let classes: kube::Api<k8s_openapi::api::resource::v1::DeviceClass> =
        kube::Api::all(fleet.cluster.client());
    let mut old = gpu_operator::cluster::resources::device_class();
    old.spec.extended_resource_name = Some("amd.com/gpu".into());
    classes
        .patch(
            "gpu.amd.com",
            &kube::api::PatchParams::apply(gpu_operator::api::field_manager::LEADER),
            &kube::api::Patch::Apply(&old),
        )
        .await
        .expect("the old class applied");
    fleet
        .apply(
            "gpus",
            json!({"devicePlugin": {"enableDevicePlugin": false}, "draDriver": {"enable": true}}),
        )
        .await;
    let serving = |f: &Fleet| {
        f.cluster.get(
            "resource.k8s.io/v1",
            "DeviceClass",
            "",
            "amd-gpu.gpu.amd.com",
        )
    };
    fleet
        .eventually("both DeviceClasses as wanted", async |f| {
            serving(f).is_some()
                && class(f).is_some_and(|c| c["spec"]["extendedResourceName"].is_null())
        })
        .await;
    let created = class(&fleet).unwrap();
    assert_eq!(
        created["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'gpu.amd.com'"
    );
    let serving_class = serving(&fleet).unwrap();
    assert_eq!(serving_class["spec"]["extendedResourceName"], "amd.com/gpu");
    assert_eq!(
        serving_class["spec"]["selectors"][0]["cel"]["expression"],
        gpu_operator::cluster::resources::EXTENDED_RESOURCE_CLASS_SELECTOR
    );
    for made in [&created, &serving_class] {
        assert_eq!(
            made["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "gpu-operator"
        );
    }

    // Back to the device plugin: the last DRA DeviceConfig is gone, so is the class.
    fleet
        .apply(
            "gpus",
            json!({"devicePlugin": {"enableDevicePlugin": true}, "draDriver": {"enable": false}}),
        )
        .await;
    fleet
        .eventually("the DeviceClasses removed", async |f| {
            class(f).is_none() && serving(f).is_none()
        })
        .await;
    fleet.stop_all().await;
}
