//! The leader rolling a driver upgrade over a large fleet: 1,000 Nodes (NODES
//! to change it) whose agents are simulated by this process, one DeviceConfig
//! with `upgradePolicy: {enable: true, maxParallelUpgrades: 50}`.
//!
//! The real leader (`gpu-operator leader`, a child process, so that its CPU
//! time and RSS are its own) runs against the API emulator in this process.
//! The simulated fleet answers as agents would: when a Node's upgrade record
//! names a target its agent does not run yet, the agent's status annotation is
//! rewritten to report the target loaded (one write per node, the agent's;
//! the real agent unloads and loads in between).
//!
//! Prints:
//! - how long the upgrade took, from the spec change to every node complete;
//! - API writes per upgraded node made by the leader (every write but the
//!   fleet's own annotation writes): record and label writes, cordon and
//!   uncordon, Events, DeviceConfig status; goal <= 10;
//! - the leader's CPU time per upgraded node and its RSS;
//! - the decision time of one reconcile at this size: reading every Node
//!   into facts and planning (pure, in this process; goal < 10 ms at 1,000).
//!
//! Run with `cargo bench --bench upgrade_scale` (NODES=... for the fleet size,
//! PARALLEL=... for `maxParallelUpgrades`: a fleet of 10,000 rolled 50 at a
//! time is 200 waves, which this 2-core machine, serving every write through
//! the emulator, does not finish in an evening).

#[path = "support/figures.rs"]
mod figures;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use figures::{cpu_seconds, rss_mib, setting, summary};
use futures::StreamExt;
use gpu_operator::api::agent_status::{
    ConfigKey, DriverReport, ModuleOrigin, STATUS_ANNOTATION, SecureBoot,
};
use gpu_operator::api::driver_upgrade::UpgradeRecord;
use gpu_operator::api::{DeviceConfig, UpgradeState};
use gpu_operator::cluster::upgrade::{self, Policy, Timeouts};
use gpu_operator::cluster::upgrader::facts_of;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::json;
use support::cluster::TestCluster;
use support::fixtures::{AgentStatusBuilder, DeviceConfigBuilder, loaded_driver};
use support::kubelet_node;

const NS: &str = support::cluster::NAMESPACE;
const FROM: &str = "6.3.0";
const TO: &str = "6.4.1";

/// `maxParallelUpgrades`: PARALLEL, or 50.
fn parallel() -> i64 {
    setting("PARALLEL", 50)
}

fn agent_status(version: &str, boot: &str) -> String {
    AgentStatusBuilder::of(NS, "fleet")
        .driver(DriverReport {
            origin: ModuleOrigin::OutOfTree,
            kernel_release: Some("6.8.0-49-generic".into()),
            secure_boot: SecureBoot::NotUefi,
            ..loaded_driver(version, boot)
        })
        .since("2026-12-02T00:00:00Z")
        .to_json()
}

/// The `i`th Node as a kubelet, NFD and the agent write it
/// (`support/kubelet_node.rs`), its agent reporting the driver `FROM`.
fn node(i: usize) -> serde_json::Value {
    kubelet_node::kubelet_node(i, Some(&agent_status(FROM, &format!("boot-{i}"))))
}

/// The simulated agents: each node whose record names a target reports it
/// loaded, once. Returns how many answered.
async fn fleet_answers(client: kube::Client, answered: Arc<Mutex<HashSet<String>>>) {
    let nodes: Api<Node> = Api::all(client);
    let mut events = watcher::watcher(nodes.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event else {
            continue;
        };
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let annotations = n.metadata.annotations.clone().unwrap_or_default();
        let Some(target) = UpgradeRecord::of_annotations(&annotations).and_then(|r| r.target)
        else {
            continue;
        };
        if !answered.lock().unwrap().insert(name.clone()) {
            continue;
        }
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let status = agent_status(&target, &format!("boot-{name}"));
            let patch = json!({"metadata": {"annotations": {STATUS_ANNOTATION: status}}});
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("the agent reports its driver");
        });
    }
}

/// Every write, less the fleet's own annotation writes (one per node).
fn writes(emulator: &Emulator, before: &kube_emulator::RequestCounts) -> u64 {
    emulator
        .requests()
        .since(before)
        .non_watch()
        .filter(|k| matches!(k.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .total()
}

/// Facts and plan for `count` nodes mid-upgrade, timed in this process.
fn decision_times(count: usize) -> (f64, f64, f64) {
    let key = ConfigKey::new(NS, "fleet");
    let now = k8s_openapi::jiff::Timestamp::now();
    let since = now.to_string();
    let states = [
        UpgradeState::Complete,
        UpgradeState::InProgress,
        UpgradeState::Started,
        UpgradeState::NotStarted,
        UpgradeState::NotStarted,
    ];
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let mut record =
                UpgradeRecord::new(key.clone(), states[i % states.len()].clone(), &since);
            record.started = Some(since.clone());
            record.cordoned_before = Some(false);
            let mut value = node(i);
            value["metadata"]["annotations"]
                [gpu_operator::api::driver_upgrade::RECORD_ANNOTATION] = json!(record.to_json());
            serde_json::from_value(value).expect("a Node")
        })
        .collect();
    let policy = Policy {
        blacklist: false,
        max_parallel: parallel() as usize,
        max_unavailable: upgrade::MaxUnavailable::Percent(25),
        reboot_required: false,
        timeouts: Timeouts::default(),
    };
    let mut samples = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let facts: Vec<_> = nodes
            .iter()
            .map(|n| {
                let record = UpgradeRecord::of_annotations(
                    n.metadata.annotations.as_ref().expect("annotated"),
                );
                facts_of(n, &key, Some(TO), record.as_ref(), None, now)
            })
            .collect();
        let plan = upgrade::plan(TO, &policy, &facts);
        std::hint::black_box(plan);
        samples.push(started.elapsed());
    }
    summary(samples)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count: usize = setting("NODES", 1000);
    let (p50, p99, max) = decision_times(count);
    println!(
        "decision time of one reconcile at {count} nodes (facts of every Node, then the plan): \
         p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
    );

    let cluster =
        TestCluster::start_for(EmulatorConfig::default().history_limit(200_000), &[]).await;
    let emulator = &cluster.emulator;
    for i in 0..count {
        emulator.create(node(i)).unwrap();
    }
    emulator
        .create(
            DeviceConfigBuilder::fleet(NS)
                .spec(
                    "driver",
                    json!({"enable": true, "version": FROM, "upgradePolicy": {
                        "enable": true, "maxParallelUpgrades": parallel(), "rebootRequired": false}}),
                )
                .json(),
        )
        .unwrap();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    emulator.write_kubeconfig(kubeconfig.path()).unwrap();
    let client = emulator.client();
    let configs: Api<DeviceConfig> = Api::namespaced(client.clone(), NS);
    let answered = Arc::new(Mutex::new(HashSet::new()));
    let fleet = tokio::spawn(fleet_answers(client.clone(), answered.clone()));

    println!("fleet: {count} nodes, maxParallelUpgrades {}", parallel());
    let mut leader = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .arg("leader")
        .env("KUBECONFIG", kubeconfig.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start leader");
    // The leader has taken in the fleet: its status counts every node.
    let wait_status = async |what: &str, ok: &dyn Fn(&serde_json::Value) -> bool| {
        let started = Instant::now();
        loop {
            if let Ok(dc) = configs.get("fleet").await
                && ok(&serde_json::to_value(&dc.status).unwrap_or_default())
            {
                return started.elapsed();
            }
            // 10 minutes, or more for a fleet larger than 3,000.
            let patience = Duration::from_secs(600.max(count as u64 / 5));
            assert!(
                started.elapsed() < patience,
                "no convergence ({what}) in {patience:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_status("the fleet seen", &|s| {
        s["driverUpgrade"]["complete"] == count
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = emulator.requests();
    let cpu_before = cpu_seconds(leader.id());
    configs
        .patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"driver": {"version": TO}}})),
        )
        .await
        .expect("spec change");
    let took = wait_status("every node upgraded", &|s| {
        s["driverUpgrade"]["complete"] == count && s["driverUpgrade"]["target"] == TO
    })
    .await;
    let cpu = cpu_seconds(leader.id()) - cpu_before;
    let fleet_writes = answered.lock().unwrap().len() as u64;
    let all = writes(emulator, &before);
    // Less the fleet's answers and this bench's own spec change.
    let leader_writes = all.saturating_sub(fleet_writes + 1);
    let made = emulator.requests().since(&before);
    println!(
        "upgrade of {count} nodes: {:.1} s; leader writes {leader_writes} ({:.2} per node; the fleet's own: {fleet_writes})",
        took.as_secs_f64(),
        leader_writes as f64 / count as f64,
    );
    println!(
        "{}",
        made.non_watch()
            .filter(|k| matches!(k.verb.as_str(), "create" | "update" | "patch" | "delete"))
    );
    println!(
        "leader CPU: {:.2} s in all, {:.2} ms per upgraded node; leader RSS {:.1} MiB",
        cpu,
        cpu * 1000.0 / count as f64,
        rss_mib(leader.id())
    );
    let _ = leader.kill();
    let _ = leader.wait();
    fleet.abort();
}
