//! A Kubernetes cluster for a test: the API emulator with what the operator
//! expects to find installed (the DeviceConfig CRD and the `kube-amd-gpu`
//! namespace) and Nodes as a kubelet registers them. Tests reach the emulator
//! itself (faults, request counts, direct reads) through `Deref`.

use std::ops::Deref;

use gpu_operator::api::DeviceConfig;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};

/// The leader's reconcilers (`cluster::run`) in this process, leading
/// unconditionally; see [`TestCluster::run_leader`].
pub struct InProcessLeader {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _leading: tokio::sync::watch::Sender<bool>,
}

impl InProcessLeader {
    /// Stops the reconcilers and waits for them to end.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("the leader stops");
    }
}

/// The operator's namespace, as deploy/ creates it.
pub const NAMESPACE: &str = "kube-amd-gpu";

pub struct TestCluster {
    pub emulator: Emulator,
}

impl Deref for TestCluster {
    type Target = Emulator;

    fn deref(&self) -> &Emulator {
        &self.emulator
    }
}

impl TestCluster {
    /// The emulator with the DeviceConfig CRD and the [`NAMESPACE`] namespace.
    pub async fn start() -> Self {
        Self::start_with_namespace(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
        }))
        .await
    }

    /// As [`TestCluster::start`], with the Namespace object given (e.g. the
    /// one deploy/ holds).
    pub async fn start_with_namespace(namespace: Value) -> Self {
        Self::start_configured(EmulatorConfig::default(), namespace).await
    }

    /// As [`TestCluster::start`], with an emulator of `config` (a bench's
    /// longer watch history) and `nodes` (bare Nodes by name): the one
    /// bootstrap of tests and benches.
    pub async fn start_for(config: EmulatorConfig, nodes: &[&str]) -> Self {
        let cluster = Self::start_configured(
            config,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        .await;
        for name in nodes {
            cluster
                .emulator
                .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
                .expect("the node is created");
        }
        cluster
    }

    async fn start_configured(config: EmulatorConfig, namespace: Value) -> Self {
        let emulator = Emulator::start(config)
            .await
            .expect("emulator starts on 127.0.0.1");
        emulator
            .create(serde_json::to_value(gpu_operator::api::crd()).unwrap())
            .expect("the DeviceConfig CRD installs");
        emulator
            .create(
                serde_json::to_value(gpu_operator::api::remediation_status::crd().unwrap())
                    .unwrap(),
            )
            .expect("the RemediationWorkflowStatus CRD installs");
        emulator
            .create(namespace)
            .expect("the namespace is created");
        Self { emulator }
    }

    /// The leader's reconcilers with the default configuration, in this
    /// process, against this cluster.
    pub fn run_leader(&self) -> InProcessLeader {
        let (leading_tx, leading) = tokio::sync::watch::channel(true);
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(gpu_operator::cluster::run(
            self.emulator.client(),
            gpu_operator::cluster::ClusterConfig::default(),
            leading,
            gpu_operator::cluster::lease::LeaderGuard::always(),
            stop.clone(),
        ));
        InProcessLeader {
            stop,
            task,
            _leading: leading_tx,
        }
    }

    /// As [`TestCluster::start`], with a Node per `(name, labels)`.
    pub async fn with_nodes(nodes: &[(&str, Value)]) -> Self {
        let cluster = Self::start().await;
        for (name, labels) in nodes {
            cluster.add_node(node(name, labels.clone()));
        }
        cluster
    }

    /// Puts deploy/15-admission-policy.yaml in force: its Lease, policies and
    /// bindings, as `kubectl apply` creates them.
    pub fn apply_admission_policies(&self) {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/15-admission-policy.yaml"),
        )
        .expect("deploy/15-admission-policy.yaml");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.emulator.create(doc).expect("the policy file applies");
        }
    }

    /// Creates deploy/10-rbac.yaml's objects and has the emulator authorize
    /// every request by them, as a cluster the operator is deployed in
    /// does: each request a client of the operator's ServiceAccount makes
    /// (the agent's, the leader's) needs its grant, and so do the checks the
    /// API server makes inside a write (a ResourceClaim's `status.devices`,
    /// per driver and node). Requests without a token (the tests' own) are
    /// an administrator's.
    pub fn apply_rbac(&self) {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/10-rbac.yaml"),
        )
        .expect("deploy/10-rbac.yaml");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.emulator.create(doc).expect("the RBAC file applies");
        }
        self.emulator.authorize_requests(true);
    }

    /// Creates a Node object, e.g. one made by [`node`] and then annotated.
    pub fn add_node(&self, node: Value) {
        self.emulator.create(node).expect("the Node is created");
    }

    /// The Node as stored now; panics if there is none.
    pub fn node(&self, name: &str) -> Value {
        self.emulator
            .get("v1", "Node", "", name)
            .unwrap_or_else(|| panic!("Node {name} exists"))
    }

    pub fn device_configs(&self) -> Api<DeviceConfig> {
        Api::namespaced(self.emulator.client(), NAMESPACE)
    }

    /// Creates the DeviceConfig `name` in [`NAMESPACE`], or merges `spec` into
    /// the existing one, through the API as an administrator would.
    pub async fn apply_device_config(&self, name: &str, spec: Value) {
        self.apply_device_config_in(NAMESPACE, name, spec).await;
    }

    /// As [`TestCluster::apply_device_config`], in `namespace` (which must exist).
    pub async fn apply_device_config_in(&self, namespace: &str, name: &str, spec: Value) {
        let api: Api<DeviceConfig> = Api::namespaced(self.emulator.client(), namespace);
        if api.get_opt(name).await.unwrap().is_some() {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap();
        } else {
            let object = super::fixtures::DeviceConfigBuilder::new(namespace, name)
                .with_spec(spec)
                .build();
            api.create(&PostParams::default(), &object).await.unwrap();
        }
    }

    /// Who holds the leader Lease now, if anyone.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.emulator.client(), NAMESPACE);
        leases
            .get_opt("gpu-operator-leader")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    }

    /// A GPU pod (`amd.com/gpu: 1`) on `node`, owned by a ReplicaSet, and
    /// running and ready as its kubelet would report it (a create starts
    /// every pod Pending, as on a real API server).
    pub async fn running_gpu_pod(&self, namespace: &str, name: &str, node: &str, labels: Value) {
        self.emulator
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": labels,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": format!("{name}-rs"), "uid": format!("uid-{name}"), "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "rocm/pytorch",
                    "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            }))
            .expect("pod");
        self.start_pod(namespace, name).await;
    }

    /// Reports the pod running and ready, as its kubelet would.
    pub async fn start_pod(&self, namespace: &str, name: &str) {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.emulator.client(), namespace);
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .expect("the pod's status is written");
    }

    /// Sets (or, with `None`, removes) a label of Node `node`, as a person
    /// with kubectl would.
    pub async fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.emulator.client());
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
            )
            .await
            .expect("the Node's label is written");
    }

    /// Records every version of every Node the API serves from now on, in
    /// order, until the returned task is dropped or aborted: what a person
    /// watching `kubectl get nodes -w` would have seen.
    pub fn record_nodes(&self) -> NodeHistory {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen.clone();
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(self.client());
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(nodes, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event
                    && let Ok(mut seen) = into.lock()
                {
                    seen.push(node);
                }
            }
        });
        NodeHistory { seen, task }
    }

    /// The Node `name` as an agent watches its own Node: `None` until it is
    /// seen, or after it is deleted. Ends when the returned feed is dropped.
    pub fn watch_node(
        &self,
        name: &str,
    ) -> tokio::sync::watch::Receiver<Option<std::sync::Arc<k8s_openapi::api::core::v1::Node>>>
    {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let (tx, rx) = tokio::sync::watch::channel(None);
        let api = Api::<k8s_openapi::api::core::v1::Node>::all(self.client());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        tokio::spawn(async move {
            let mut events = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let node = match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        Some(std::sync::Arc::new(n))
                    }
                    Ok(watcher::Event::Delete(_)) => None,
                    _ => continue,
                };
                if tx.send(node).is_err() {
                    return;
                }
            }
        });
        rx
    }

    pub async fn delete_device_config(&self, name: &str) {
        self.device_configs()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// A Node named `name` with `labels`, Ready as its kubelet reports it.
pub fn node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    })
}

/// Every version of the Nodes, in the order the API served them
/// ([`TestCluster::record_nodes`]). Stops recording when dropped.
pub struct NodeHistory {
    seen: std::sync::Arc<std::sync::Mutex<Vec<k8s_openapi::api::core::v1::Node>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeHistory {
    /// The versions recorded so far.
    pub fn versions(&self) -> Vec<k8s_openapi::api::core::v1::Node> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops recording.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// The shared list itself, for a test that reads it while it grows.
    pub fn shared(
        &self,
    ) -> std::sync::Arc<std::sync::Mutex<Vec<k8s_openapi::api::core::v1::Node>>> {
        self.seen.clone()
    }
}

impl Drop for NodeHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Anything of the operator's on `node`: labels and annotations under its
/// prefixes or node detection's, its AMDGPU conditions and its taints. What
/// an uninstall must leave nothing of.
pub fn ours_on(node: &Value) -> Vec<String> {
    let keys = |section: &str| {
        node["metadata"][section]
            .as_object()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let mut found: Vec<String> = keys("labels")
        .into_iter()
        .chain(keys("annotations"))
        .filter(|k| {
            k.contains("amd.com")
                || k.starts_with("metricsexporter.amd.com")
                || k.contains("feature.node.kubernetes.io/amd-")
        })
        .collect();
    found.extend(
        node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["type"].as_str())
            .filter(|t| t.starts_with("AMDGPU"))
            .map(str::to_owned),
    );
    found.extend(
        node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["key"].as_str())
            .filter(|k| k.contains("amd"))
            .map(str::to_owned),
    );
    found
}
