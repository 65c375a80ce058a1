//! One node of a test or bench, started the one way: a simulated host under a
//! temporary directory, the node's kubelet directory beside it (with the test
//! kubelet of the device plugin API, or a PodResources kubelet, when asked),
//! the feeds a node service reads (inventory, health), the API emulator with
//! the Node (or a client of a cluster several nodes share), and the node
//! agent run on them with a config from the one `AgentConfig` literal
//! (`agent_config.rs`).
//!
//! ```text
//! NodeRig::builder("gpu-0").profile("mi300x", None, None).kubelet()
//!     .cluster(labels).start().await
//! ```
//!
//! What the rig starts it stops: `stop()` ends the agent (waiting for it)
//! and the PodResources kubelet; dropping the rig cancels the agent, and the
//! temporary directory goes with it. A node service other than the agent
//! (the device plugin, DRA, the health monitor) is the wrapper's to start
//! on the feeds and to stop.
//! A test file keeps only what is its own (fault-injecting tools, the
//! readings it asserts on) in a thin wrapper around the rig.
//!
//! The node's driver store: `.driver_bundle(version, signed)` puts a bundle
//! for the simulated kernel in it before anything starts (and
//! [`NodeRig::add_driver_bundle`] later); [`NodeRig::driver_manager`] is the
//! agent's driver manager on it, with a `modprobe` stand-in in the node's
//! `tools/` ([`Modprobe`]) whose runs [`NodeRig::modprobe_runs`] reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::agent::{self, AgentConfig, AgentError};
use gpu_operator::device::Inventory;
use gpu_operator::driver::manager::ManagerConfig;
use gpu_operator::host::HostRoot;
use gpu_operator::plugin::HealthReport;
use gpu_operator::service::Followers;
use gpu_operator::simulate::{SIM_KERNEL_RELEASE, SimSpec};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

use super::agent_config::AgentConfigBuilder;
use super::bundles;
use super::cluster::{self, TestCluster};
use super::hosts::SimHost;
use super::kubelet::TestKubelet;
use super::pod_resources::{self, FakeKubelet};
use super::wait;

/// How an agent the rig ran ended: its own result, or the task's panic.
pub type AgentEnd = Result<Result<(), AgentError>, JoinError>;

/// Which cluster the node is in.
enum ClusterChoice {
    None,
    /// A cluster of the rig's own, with this Node object in it.
    Own(Value),
    /// A cluster someone else started (a fleet's).
    Joined(kube::Client),
}

/// Work on the simulated host before anything starts on it.
type Prepare<'a> = Box<dyn FnOnce(&HostRoot) + 'a>;

/// What the `modprobe` of [`NodeRig::driver_manager`] does.
#[derive(Clone, Copy, Debug)]
pub enum Modprobe<'a> {
    /// Loads amdgpu of this version whatever it is given
    /// ([`bundles::modprobe_recorder`]).
    Loads(&'a str),
    /// Loads the bundle `--dirname` names, at its manifest's version
    /// ([`bundles::modprobe_recorder_of_bundles`]).
    LoadsBundles,
    /// Does not exist: the agent must never run it ([`bundles::no_modprobe`]).
    Missing,
    /// Loads amdgpu of this version, with faults a test switches on
    /// ([`bundles::modprobe_with_faults`]).
    WithFaults(&'a str),
}

/// Work on the rig's own cluster before the Node is created in it.
type ClusterSetup<'a> = Box<dyn FnOnce(&TestCluster) + 'a>;

/// What to start; see [`NodeRig::builder`].
pub struct NodeRigBuilder<'a> {
    node: String,
    spec: Option<SimSpec>,
    sim: Option<SimHost>,
    feeds: bool,
    inventory: Option<Inventory>,
    in_memory: bool,
    prepare: Vec<Prepare<'a>>,
    kubelet: bool,
    cluster: ClusterChoice,
    cluster_setup: Option<ClusterSetup<'a>>,
    namespaces: Vec<String>,
}

impl<'a> NodeRigBuilder<'a> {
    /// A host simulated from `spec` (an empty host directory without one).
    pub fn host(mut self, spec: SimSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// `host` of `profile` with `gpus` GPUs (the profile's count without),
    /// optionally partitioned.
    pub fn profile(self, profile: &str, gpus: Option<usize>, partition: Option<&str>) -> Self {
        self.host(SimSpec::new(profile, gpus, partition).expect("a valid simulation spec"))
    }

    /// A host simulated already (a test's own make of one); the rest of the
    /// node goes in its directory.
    pub fn sim(mut self, sim: SimHost) -> Self {
        self.sim = Some(sim);
        self
    }

    /// The feeds a node service reads, as the agent passes them: the
    /// inventory (a discovery of the host, or `inventory` if given) and the
    /// health report (empty).
    pub fn feeds(mut self) -> Self {
        self.feeds = true;
        self
    }

    /// [`NodeRigBuilder::feeds`] with `inventory` in place of a discovery
    /// (one a test made up from the host, say).
    pub fn feeds_with(mut self, inventory: Inventory) -> Self {
        self.feeds = true;
        self.inventory = Some(inventory);
        self
    }

    /// The temporary directory in `/dev/shm` when there is one: a host of
    /// many files written and rescanned quickly.
    pub fn in_memory(mut self) -> Self {
        self.in_memory = true;
        self
    }

    /// Runs `prepare` on the simulated host before anything starts on it.
    pub fn prepare(mut self, prepare: impl FnOnce(&HostRoot) + 'a) -> Self {
        self.prepare.push(Box::new(prepare));
        self
    }

    /// A complete bundle of amdgpu `version` for the simulated kernel in the
    /// node's driver store (`bundles::STORE`), its modules carrying the
    /// signature trailer when `signed`.
    pub fn driver_bundle(self, version: &'a str, signed: bool) -> Self {
        self.prepare(move |host| {
            bundles::write_bundle(host, version, SIM_KERNEL_RELEASE, signed);
        })
    }

    /// The test kubelet of the device plugin API in the kubelet directory's
    /// `device-plugins/`.
    pub fn kubelet(mut self) -> Self {
        self.kubelet = true;
        self
    }

    /// A cluster of the rig's own with the node's Node, Ready, labelled
    /// `labels`.
    pub fn cluster(self, labels: Value) -> Self {
        let node = cluster::node(&self.node, labels);
        self.cluster_with_node(node)
    }

    /// A cluster of the rig's own with `node` as the Node object.
    pub fn cluster_with_node(mut self, node: Value) -> Self {
        self.cluster = ClusterChoice::Own(node);
        self
    }

    /// Runs `setup` on the rig's own cluster before the Node is created in
    /// it (RBAC objects, admission policies).
    pub fn cluster_setup(mut self, setup: impl FnOnce(&TestCluster) + 'a) -> Self {
        self.cluster_setup = Some(Box::new(setup));
        self
    }

    /// The node in a cluster another rig or fleet owns.
    pub fn join(mut self, client: kube::Client) -> Self {
        self.cluster = ClusterChoice::Joined(client);
        self
    }

    /// A namespace (of the workloads a test runs) created in the rig's
    /// own cluster.
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_owned());
        self
    }

    /// Starts what was asked; the agent is started by
    /// [`NodeRig::start_agent`].
    pub async fn start(self) -> NodeRig {
        let (cluster, client) = match self.cluster {
            ClusterChoice::None => (None, None),
            ClusterChoice::Own(node) => {
                let cluster = TestCluster::start().await;
                if let Some(setup) = self.cluster_setup {
                    setup(&cluster);
                }
                cluster.add_node(node);
                for name in &self.namespaces {
                    cluster
                        .create(json!({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": name}}))
                        .expect("the namespace is created");
                }
                let client = cluster.client();
                (Some(cluster), Some(client))
            }
            ClusterChoice::Joined(client) => (None, Some(client)),
        };
        let sim = match self.sim {
            Some(sim) => sim,
            None => {
                let dir = if self.in_memory {
                    tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())
                } else {
                    tempfile::tempdir()
                }
                .expect("a temporary directory");
                SimHost::in_dir(dir, self.spec.as_ref())
            }
        };
        let host = sim.host.clone();
        for prepare in self.prepare {
            prepare(&host);
        }
        let inventory = self.inventory;
        let feeds = self.feeds.then(|| Feeds {
            inventory: watch::Sender::new(Arc::new(inventory.unwrap_or_else(|| sim.discover()))),
            health: watch::Sender::new(HealthReport::default()),
        });
        let plugins = sim.dir().join("kubelet/device-plugins");
        std::fs::create_dir_all(&plugins).expect("the kubelet directory");
        let kubelet = if self.kubelet {
            Some(TestKubelet::start(&plugins).await)
        } else {
            None
        };
        NodeRig {
            name: self.node,
            host,
            feeds,
            kubelet,
            cluster,
            client,
            agent: None,
            followers: Followers::new(),
            pod_resources: Vec::new(),
            sim,
        }
    }
}

/// An agent the rig runs.
struct RunningAgent {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AgentError>>,
}

/// One node; see the module's doc.
pub struct NodeRig {
    /// The Node's name.
    pub name: String,
    /// The simulated host's root (`sim.host`).
    pub host: HostRoot,
    feeds: Option<Feeds>,
    kubelet: Option<TestKubelet>,
    cluster: Option<TestCluster>,
    client: Option<kube::Client>,
    agent: Option<RunningAgent>,
    /// The last agent's followers (a stopped agent's stop for good).
    followers: Followers,
    /// Stops the PodResources servers ([`NodeRig::serve_pod_resources`]).
    pod_resources: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The simulated host, which holds the rig's directory: dropped last.
    pub sim: SimHost,
}

/// The inputs of a node service ([`NodeRigBuilder::feeds`]).
struct Feeds {
    inventory: watch::Sender<Arc<Inventory>>,
    health: watch::Sender<HealthReport>,
}

impl NodeRig {
    /// Node `node`, with nothing started yet.
    pub fn builder<'a>(node: &str) -> NodeRigBuilder<'a> {
        NodeRigBuilder {
            node: node.to_owned(),
            spec: None,
            sim: None,
            feeds: false,
            inventory: None,
            in_memory: false,
            prepare: Vec::new(),
            kubelet: false,
            cluster: ClusterChoice::None,
            cluster_setup: None,
            namespaces: Vec::new(),
        }
    }

    /// The rig's temporary directory (the host is its `host/`).
    pub fn dir(&self) -> &Path {
        self.sim.dir()
    }

    /// The node's kubelet directory (`device-plugins/`, `pod-resources/`...).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir().join("kubelet")
    }

    /// The device plugin directory the test kubelet serves in.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir().join("device-plugins")
    }

    /// The inventory feed; panics if the rig was built without feeds.
    pub fn inventory(&self) -> &watch::Sender<Arc<Inventory>> {
        &self.feeds.as_ref().expect("the rig has feeds").inventory
    }

    /// The health report feed; panics if the rig was built without feeds.
    pub fn health(&self) -> &watch::Sender<HealthReport> {
        &self.feeds.as_ref().expect("the rig has feeds").health
    }

    /// Publishes a fresh discovery of the simulated host.
    pub fn rediscover(&self) {
        self.inventory().send_replace(Arc::new(self.sim.discover()));
    }

    /// The test kubelet; panics if the rig was built without one.
    pub fn kubelet(&self) -> &TestKubelet {
        self.kubelet.as_ref().expect("the rig runs a test kubelet")
    }

    pub fn kubelet_mut(&mut self) -> &mut TestKubelet {
        self.kubelet.as_mut().expect("the rig runs a test kubelet")
    }

    /// Starts the test kubelet of a rig built without one: a kubelet that
    /// comes up after the agent.
    pub async fn start_kubelet(&mut self) {
        let plugins = self.plugin_dir();
        self.kubelet = Some(TestKubelet::start(&plugins).await);
    }

    /// Hands the test kubelet over to the test (which then outlives the
    /// rig's hold on it); panics if there is none.
    pub fn take_kubelet(&mut self) -> TestKubelet {
        self.kubelet.take().expect("the rig runs a test kubelet")
    }

    /// The rig's own cluster; panics if it joined one or has none.
    pub fn cluster(&self) -> &TestCluster {
        self.cluster.as_ref().expect("the rig started a cluster")
    }

    /// A client of the node's cluster.
    pub fn client(&self) -> kube::Client {
        self.client.clone().expect("the node is in a cluster")
    }

    /// The Node as stored now.
    pub fn node(&self) -> Value {
        self.cluster().node(&self.name)
    }

    /// Where the node's host command stand-ins are (`modprobe`, `reboot`,
    /// …), and their logs.
    pub fn tools(&self) -> PathBuf {
        self.dir().join("tools")
    }

    /// The agent's driver manager on this node: the bundles in
    /// `bundles::STORE`, looked at again every 200 ms, and a `modprobe` as
    /// `modprobe` says, in [`NodeRig::tools`]. The stand-in is written the
    /// first time only: an agent started again on the node keeps the one
    /// its node had, as a test may have changed it
    /// ([`bundles::hold_loads_until`]), and its log. Tests change the rest
    /// (reboot, timings) on what this returns.
    pub fn driver_manager(&self, modprobe: Modprobe<'_>) -> ManagerConfig {
        if let Modprobe::Missing = modprobe {
            return bundles::no_modprobe();
        }
        let mut config = ManagerConfig {
            store: bundles::STORE.into(),
            recheck: Duration::from_millis(200),
            ..ManagerConfig::default()
        };
        let tools = self.tools();
        let written = tools.join("modprobe");
        let with_faults = tools.join(bundles::MODPROBE_WITH_FAULTS);
        config.commands.modprobe = match modprobe {
            Modprobe::WithFaults(_) if with_faults.exists() => with_faults,
            Modprobe::WithFaults(version) => {
                bundles::modprobe_with_faults(&tools, self.host.root(), version)
            }
            _ if written.exists() => written,
            Modprobe::Loads(version) => {
                bundles::modprobe_recorder(&tools, self.host.root(), version)
            }
            _ => bundles::modprobe_recorder_of_bundles(&tools, self.host.root()),
        };
        config
    }

    /// Puts a bundle of `version` for the simulated kernel in the node's
    /// driver store now (see [`NodeRigBuilder::driver_bundle`]); returns its
    /// directory, a host path.
    pub fn add_driver_bundle(&self, version: &str, signed: bool) -> String {
        bundles::write_bundle(&self.host, version, SIM_KERNEL_RELEASE, signed)
    }

    /// The argument lines the `modprobe` stand-in logged, one per run.
    pub fn modprobe_runs(&self) -> Vec<String> {
        bundles::modprobe_runs(&self.tools())
    }

    /// The agent's config on this node, for a test to change what it is
    /// about and pass to [`NodeRig::start_agent`].
    pub fn agent_config(&self) -> AgentConfigBuilder {
        AgentConfigBuilder::new(&self.name, self.host.clone(), self.kubelet_dir())
    }

    /// Runs the agent of `config` against the node's cluster, with followers
    /// of its own; panics if one runs already.
    pub fn start_agent(&mut self, config: AgentConfig) {
        self.start_agent_with(self.client(), config);
    }

    /// As [`NodeRig::start_agent`], the agent talking through `client` (one
    /// with the identity of the agent's pod, say).
    pub fn start_agent_with(&mut self, client: kube::Client, config: AgentConfig) {
        assert!(self.agent.is_none(), "an agent runs on the rig already");
        let shutdown = CancellationToken::new();
        self.followers = Followers::new();
        let task = tokio::spawn(agent::run_with_followers(
            client,
            config,
            shutdown.clone(),
            self.followers.clone(),
        ));
        self.agent = Some(RunningAgent { shutdown, task });
    }

    /// The last agent's followers: the running one's, or a stopped one's
    /// (which stop for good).
    pub fn followers(&self) -> &Followers {
        &self.followers
    }

    /// Waits (within the tests' patience) for the agent to end by itself.
    pub async fn agent_ended(&mut self) -> Option<AgentEnd> {
        let agent = self.agent.take()?;
        Some(wait::within("the agent ends", agent.task).await)
    }

    /// Whether the agent task ended by itself.
    pub fn agent_finished(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.task.is_finished())
    }

    /// Cancels the agent and waits (within the tests' patience) for it to
    /// end; how it ended and how long that took, or `None` if none ran.
    pub async fn stop_agent(&mut self) -> Option<(AgentEnd, Duration)> {
        let agent = self.agent.take()?;
        let started = Instant::now();
        agent.shutdown.cancel();
        let end = wait::within("the agent stops", agent.task).await;
        Some((end, started.elapsed()))
    }

    /// Serves `kubelet`'s PodResources API on the node's kubelet socket
    /// (`pod-resources/kubelet.sock`) until the rig stops.
    pub async fn serve_pod_resources(&mut self, kubelet: FakeKubelet) {
        let socket = self.kubelet_dir().join("pod-resources/kubelet.sock");
        self.pod_resources
            .push(pod_resources::serve_kubelet(&socket, kubelet).await);
    }

    /// Aborts the agent task: a crash, with no release and no clean-up.
    pub fn abort_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.task.abort();
        }
    }

    /// Whether an agent runs (or ended by itself and was not yet waited for).
    pub fn has_agent(&self) -> bool {
        self.agent.is_some()
    }

    /// Stops everything the rig started.
    pub async fn stop(&mut self) {
        let _ = self.stop_agent().await;
        self.pod_resources.clear();
    }
}

impl Drop for NodeRig {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.shutdown.cancel();
        }
    }
}
