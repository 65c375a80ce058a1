//! The leader's API traffic does not grow with the fleet: the same
//! DeviceConfig over 30 and over 300 realistic Nodes (`kubelet_node.rs`)
//! costs the same few status writes to converge, before and after a spec
//! change, and the Nodes are listed once (the Node watch's first list), never
//! again. A step that wrote per Node, or listed every Node, would show here
//! as a count ten times larger.

mod support;

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use gpu_operator::api::DeviceConfig;
use gpu_operator::api::agent_status::STATUS_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_emulator::{Emulator, EmulatorConfig, RequestCounts};
use kubelet_node::{kubelet_node, node_name};
use serde_json::{Value, json};
use support::cluster::TestCluster;
use support::fixtures::DeviceConfigBuilder;
use support::kubelet_node;

const NS: &str = support::cluster::NAMESPACE;

fn agent_status(generation: i64, uid: &str) -> String {
    kubelet_node::fleet_agent_status(NS, generation, uid)
}

/// What the leader sent in one phase: its writes (DeviceConfig status and
/// finalizer, Services, Events; Node writes here are the simulated
/// fleet's) and its Node LISTs.
#[derive(Debug, PartialEq, Eq)]
struct Traffic {
    writes: u64,
    node_lists: u64,
}

fn traffic(emulator: &Emulator, before: &RequestCounts) -> Traffic {
    let since = emulator.requests().since(before);
    Traffic {
        writes: since
            .non_watch()
            .filter(|k| {
                matches!(k.verb.as_str(), "create" | "update" | "patch" | "delete")
                    && !k.resource.starts_with("nodes")
            })
            .total(),
        node_lists: since.get("list", "nodes"),
    }
}

async fn wait_status(configs: &Api<DeviceConfig>, ok: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    loop {
        if let Ok(dc) = configs.get("fleet").await
            && ok(&serde_json::to_value(&dc.status).unwrap_or_default())
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the status did not converge in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The leader's traffic over a fleet of `count` Nodes: to converge on
/// Nodes that have reported, and from a spec change to every agent's
/// acknowledgement of it.
async fn leader_over(count: usize) -> (Traffic, Traffic) {
    let cluster = TestCluster::start_for(EmulatorConfig::default(), &[]).await;
    let emulator = &cluster.emulator;
    let dc = emulator
        .create(
            DeviceConfigBuilder::fleet(NS)
                .spec("devicePlugin", json!({}))
                .json(),
        )
        .expect("create the DeviceConfig");
    let uid = dc["metadata"]["uid"].as_str().expect("a uid").to_owned();
    let reported = agent_status(1, &uid);
    for i in 0..count {
        emulator
            .create(kubelet_node(i, Some(&reported)))
            .expect("create a Node");
    }
    let client = emulator.client();
    let configs: Api<DeviceConfig> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client);

    let before = emulator.requests();
    let leader = cluster.run_leader();
    wait_status(&configs, |s| {
        s["devicePlugin"]["availableNumber"] == count && s["observedGeneration"] == 1
    })
    .await;
    let converged = traffic(emulator, &before);

    let before = emulator.requests();
    configs
        .patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devicePlugin": {"enableNodeLabeller": false}}})),
        )
        .await
        .expect("spec change");
    let acknowledged = agent_status(2, &uid);
    let params = PatchParams::apply(gpu_operator::api::field_manager::AGENT_STATUS).force();
    stream::iter(0..count)
        .for_each_concurrent(16, |i| {
            let name = node_name(i);
            let patch = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {STATUS_ANNOTATION: acknowledged}}});
            let (nodes, params) = (&nodes, &params);
            async move {
                nodes
                    .patch(&name, params, &Patch::Apply(&patch))
                    .await
                    .expect("the agent's acknowledgement");
            }
        })
        .await;
    wait_status(&configs, |s| {
        s["observedGeneration"] == 2 && s["devicePlugin"]["availableNumber"] == count
    })
    .await;
    let changed = traffic(emulator, &before);
    leader.stop().await;
    (converged, changed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_writes_and_node_lists_do_not_grow_with_the_fleet() {
    let (small_converged, small_changed) = leader_over(30).await;
    let (large_converged, large_changed) = leader_over(300).await;
    println!(
        "30 Nodes: {small_converged:?} to converge, {small_changed:?} after a spec change; \
         300 Nodes: {large_converged:?}, {large_changed:?}"
    );
    // The first list is one page (500) at both sizes; no step lists again.
    for traffic in [&small_converged, &large_converged] {
        assert_eq!(traffic.node_lists, 1, "{traffic:?}");
    }
    for traffic in [&small_changed, &large_changed] {
        assert_eq!(traffic.node_lists, 0, "{traffic:?}");
    }
    // From the list alone the leader converges in a few writes; its status
    // writes are paced in time (one a second), so where the last one of the
    // convergence falls against the spec change depends on the machine's
    // speed: ten times the fleet may add a write, not hundreds.
    assert!(
        large_converged.writes <= small_converged.writes + 1,
        "{small_converged:?} at 30 Nodes, {large_converged:?} at 300"
    );
    assert!(
        large_changed.writes <= small_changed.writes + 2,
        "{small_changed:?} at 30 Nodes, {large_changed:?} at 300"
    );
    assert!(small_converged.writes > 0 && small_changed.writes > 0);
}
