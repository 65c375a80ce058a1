//! The leader's Node cache keeps only the labels a DeviceConfig's selectors
//! name (and the operator's own, `cluster::node_cache`). A DeviceConfig
//! created later that selects by a label no other names must still select
//! the right Nodes: the leader lists the Nodes again keeping that label
//! (`cluster::node_watch`), once, and follows later changes of it.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use gpu_operator::api::DeviceConfig;
use gpu_operator::detect::GPU_LABEL;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube_emulator::EmulatorConfig;
use kubelet_node::kubelet_node;
use serde_json::{Value, json};
use support::cluster::TestCluster;
use support::fixtures::DeviceConfigBuilder;
use support::kubelet_node;

const NS: &str = support::cluster::NAMESPACE;
const POOL: &str = "example.com/pool";

async fn wait_status(configs: &Api<DeviceConfig>, name: &str, ok: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    let mut last = Value::Null;
    while started.elapsed() < Duration::from_secs(60) {
        if let Ok(dc) = configs.get(name).await {
            last = serde_json::to_value(&dc.status).unwrap_or_default();
            if ok(&last) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the status of {name} did not converge in 60 s: {last}");
}

fn matching(status: &Value) -> &Value {
    &status["devicePlugin"]["nodesMatchingSelectorNumber"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_device_config_selecting_by_a_label_not_kept_so_far_selects_the_right_nodes() {
    let cluster = TestCluster::start_for(EmulatorConfig::default(), &[]).await;
    let emulator = &cluster.emulator;
    emulator
        .create(
            DeviceConfigBuilder::fleet(NS)
                .spec("devicePlugin", json!({}))
                .json(),
        )
        .expect("create the DeviceConfig");
    // Nodes 0-3 carry the GPU label `fleet` selects by; 4-6 are in pool
    // "b" instead, a label no DeviceConfig names yet.
    for i in 0..7 {
        let mut node = kubelet_node(i, None);
        if i >= 4 {
            let labels = node["metadata"]["labels"].as_object_mut().expect("labels");
            labels.remove(GPU_LABEL);
            labels.insert(POOL.into(), json!("b"));
        }
        emulator.create(node).expect("create a Node");
    }
    let client = emulator.client();
    let configs: Api<DeviceConfig> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client);

    let leader = cluster.run_leader();
    wait_status(&configs, "fleet", |s| matching(s) == 4).await;
    let lists_before = emulator.requests().get("list", "nodes");
    assert_eq!(lists_before, 1, "the leader lists the Nodes once to start");

    // Every status pool-b is given, as it is written.
    let seen = tokio::spawn({
        let configs = configs.clone();
        async move {
            let mut statuses = Vec::new();
            let mut events = std::pin::pin!(
                kube::runtime::watcher(configs, kube::runtime::watcher::Config::default())
                    .applied_objects()
            );
            while let Some(Ok(dc)) = events.next().await {
                if kube::ResourceExt::name_any(&dc) == "pool-b"
                    && let Some(status) = dc.status
                {
                    let status = serde_json::to_value(&status).unwrap_or_default();
                    let done = matching(&status) == 3;
                    statuses.push(status);
                    if done {
                        break;
                    }
                }
            }
            statuses
        }
    });
    // A DeviceConfig selecting pool "b": the cache did not keep that label.
    emulator
        .create(
            DeviceConfigBuilder::new(NS, "pool-b")
                .spec("selector", json!({POOL: "b"}))
                .spec("devicePlugin", json!({}))
                .json(),
        )
        .expect("create the second DeviceConfig");
    wait_status(&configs, "pool-b", |s| matching(s) == 3).await;
    assert_eq!(
        emulator.requests().get("list", "nodes") - lists_before,
        1,
        "the Nodes are listed again once, keeping the new label"
    );
    // It waited for that list: no status said it selected fewer.
    let statuses = tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("the watch saw the status")
        .expect("the watch ends");
    assert!(
        statuses.iter().all(|s| matching(s) == 3),
        "pool-b's statuses as written: {statuses:?}"
    );

    // The label is kept from the watch's events too: a Node joining the
    // pool is selected, and one leaving it is not.
    nodes
        .patch(
            "gpu-00000",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {POOL: "b", GPU_LABEL: null}}})),
        )
        .await
        .expect("label a node");
    wait_status(&configs, "pool-b", |s| matching(s) == 4).await;
    wait_status(&configs, "fleet", |s| matching(s) == 3).await;
    nodes
        .patch(
            "gpu-00004",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {POOL: "c"}}})),
        )
        .await
        .expect("relabel a node");
    wait_status(&configs, "pool-b", |s| matching(s) == 3).await;
    assert_eq!(
        emulator.requests().get("list", "nodes") - lists_before,
        1,
        "a known label needs no list"
    );
    leader.stop().await;
}
