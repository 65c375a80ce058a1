//! The leader remediating a large fleet: 1,000 GPU Nodes (NODES to change
//! it), 50 of them (FAILING) failing at once with a condition another tool
//! sets (`AMDGPUHardwareAssertionHwa`, as Node Problem Detector would), one
//! DeviceConfig with remediation on and the circuit breaker at 10 %.
//!
//! The real leader (`gpu-operator leader`, a child process, so that its CPU
//! time and RSS are its own) runs against the API emulator in this process;
//! the mapping skips the reboot and has no test profile (no agents here), so
//! each run is quarantine, drain, confirmation and release. The bench sets
//! the conditions True, waits for every run to reach its confirmation, sets
//! them False and waits for every node to be released.
//!
//! Prints:
//! - the decision time of one reconcile at this size: every Node read into
//!   facts (record, conditions, labels, taints), each node's step and the
//!   admission (pure, in this process);
//! - API writes per remediated node made by the leader (every write but the
//!   bench's own condition writes): records, labels, taints, Events,
//!   DeviceConfig status, itemised;
//! - the time from the conditions set to every node quarantined, and from
//!   the conditions cleared to every node released;
//! - the leader's CPU time per remediated node and its RSS.
//!
//! Run with `cargo bench --bench remediation_scale`.

#[path = "support/figures.rs"]
mod figures;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use figures::{cpu_seconds, rss_mib, setting, summary};
use gpu_operator::api::RemediationWorkflowSpec;
use gpu_operator::cluster::remediator::facts_of;
use gpu_operator::remediation::plan::{self, Policy};
use gpu_operator::remediation::{Mapping, RECORD_ANNOTATION, Record};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};
use support::cluster::TestCluster;
use support::fixtures::DeviceConfigBuilder;
use support::kubelet_node;

const NS: &str = support::cluster::NAMESPACE;
const CONDITION: &str = "AMDGPUHardwareAssertionHwa";
const MAPPING: &str = "- nodeCondition: AMDGPUHardwareAssertionHwa\n  workflowTemplate: default-template\n  skipRebootStep: true\n";

/// The `i`th Node as a kubelet, NFD and the agent write it
/// (`support/kubelet_node.rs`), with remediation's mapped condition.
fn node(i: usize, failing: bool) -> Value {
    let mut node = kubelet_node::kubelet_node(i, None);
    if let Some(conditions) = node["status"]["conditions"].as_array_mut() {
        conditions
            .push(json!({"type": CONDITION, "status": if failing { "True" } else { "False" }}));
    }
    node
}

fn failing_nodes(count: usize, failing: usize) -> Vec<String> {
    // Spread over the fleet.
    let step = (count / failing.max(1)).max(1);
    (0..failing)
        .map(|k| format!("gpu-{:05}", (k * step).min(count - 1)))
        .collect()
}

/// Facts, steps and admission for `count` nodes, `failing` of them mid-run.
fn decision_times(count: usize, failing: usize) -> (f64, f64, f64) {
    let mapping = Mapping::parse(MAPPING).expect("the mapping");
    let rw = RemediationWorkflowSpec {
        enable: Some(true),
        ..RemediationWorkflowSpec::default()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let policy = Policy::default();
    // Half the failing nodes have a run going; the others are new.
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let is_failing = i % (count / failing.max(1)).max(1) == 0;
            let mut value = node(i, is_failing);
            if is_failing && i % 2 == 0 {
                let facts = facts_of(&serde_json::from_value(value.clone()).unwrap(), &rw, None);
                let step = plan::node_step(&facts, &mapping, &policy, now);
                if let plan::NodeStep::Candidate(candidate) = step {
                    let decision = plan::start(&facts, &candidate, &policy, now);
                    let record = decision.record.unwrap_or_default();
                    value["metadata"]["annotations"] =
                        json!({RECORD_ANNOTATION: record.to_annotation()});
                }
            }
            serde_json::from_value(value).expect("a Node")
        })
        .collect();
    let mut samples = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let mut candidates = Vec::new();
        let mut steps = 0;
        let mut running = 0;
        let mut recent = std::collections::BTreeSet::new();
        for n in &nodes {
            let facts = facts_of(n, &rw, Some(plan::DrainState::Running));
            if plan::is_running(&facts.record) {
                running += 1;
            }
            if plan::recently_quarantined(&facts.record, policy.breaker.window, now) {
                recent.insert(facts.name.clone());
            }
            match plan::node_step(&facts, &mapping, &policy, now) {
                plan::NodeStep::Candidate(c) => candidates.push(*c),
                plan::NodeStep::Nothing => {}
                _ => steps += 1,
            }
        }
        let admission = plan::admit(candidates, running, &recent, nodes.len(), &policy);
        std::hint::black_box((admission, steps));
        samples.push(started.elapsed());
    }
    summary(samples)
}

/// Every write, less `own` of the bench's.
fn writes(
    emulator: &Emulator,
    before: &kube_emulator::RequestCounts,
) -> kube_emulator::RequestCounts {
    emulator
        .requests()
        .since(before)
        .non_watch()
        .filter(|k| matches!(k.verb.as_str(), "create" | "update" | "patch" | "delete"))
}

async fn set_condition(nodes: &Api<Node>, name: &str, status: &str) {
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True"}, {"type": CONDITION, "status": status}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the condition is set");
}

async fn wait_for(what: &str, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok().await {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no convergence ({what}) in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

fn phase(node: &Node) -> Option<String> {
    Record::of_annotations(
        node.metadata
            .annotations
            .as_ref()
            .unwrap_or(&Default::default()),
    )
    .run
    .map(|r| r.phase.name().to_owned())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count: usize = setting("NODES", 1000);
    let failing: usize = setting("FAILING", 50);
    let (p50, p99, max) = decision_times(count, failing);
    println!(
        "decision time of one reconcile at {count} nodes, {failing} failing (facts of every Node, \
         each node's step, admission): p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
    );

    let cluster =
        TestCluster::start_for(EmulatorConfig::default().history_limit(200_000), &[]).await;
    let emulator = &cluster.emulator;
    for i in 0..count {
        emulator.create(node(i, false)).unwrap();
    }
    emulator
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "remediation", "namespace": NS},
            "data": {"workflow": MAPPING}}))
        .unwrap();
    emulator
        .create(
            DeviceConfigBuilder::fleet(NS)
                .metadata(
                    "annotations",
                    json!({"operator.amd.com/gpu-remediation-max-quarantined": "10%"}),
                )
                .spec(
                    "remediationWorkflow",
                    json!({"enable": true, "config": {"name": "remediation"}}),
                )
                .json(),
        )
        .unwrap();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    emulator.write_kubeconfig(kubeconfig.path()).unwrap();
    let client = emulator.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let configs: Api<gpu_operator::api::DeviceConfig> = Api::namespaced(client.clone(), NS);

    println!("fleet: {count} nodes, {failing} failing at once");
    let mut leader = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["leader", "--remediation-confirm-interval", "1"])
        .env("KUBECONFIG", kubeconfig.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start leader");
    wait_for("the fleet seen", async || {
        configs.get("fleet").await.ok().is_some_and(|dc| {
            dc.status
                .is_some_and(|s| s.remediation_workflow.available_number == count as i32)
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let names = failing_nodes(count, failing);
    let before = emulator.requests();
    let cpu_before = cpu_seconds(leader.id());
    for name in &names {
        set_condition(&nodes, name, "True").await;
    }
    let quarantined = wait_for("every failing node confirming", async || {
        let mut all = true;
        for name in &names {
            let node = nodes.get(name).await.expect("the node");
            all &= phase(&node).as_deref() == Some("Confirming");
        }
        all
    })
    .await;
    for name in &names {
        set_condition(&nodes, name, "False").await;
    }
    let released = wait_for("every node released", async || {
        let mut all = true;
        for name in &names {
            let node = nodes.get(name).await.expect("the node");
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| !t.is_empty());
            all &= phase(&node).is_none() && !tainted;
        }
        all
    })
    .await;
    // Settle: the last status writes and Events.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = cpu_seconds(leader.id()) - cpu_before;
    let made = writes(emulator, &before);
    let own = 2 * names.len() as u64;
    let leader_writes = made.total().saturating_sub(own);
    println!(
        "remediation of {failing} nodes: quarantined and drained in {:.1} s; released {:.1} s after \
         the conditions cleared (confirmation: 2 checks 1 s apart)",
        quarantined.as_secs_f64(),
        released.as_secs_f64()
    );
    println!(
        "leader writes {leader_writes} ({:.2} per remediated node; the bench's own condition writes left out: {own})",
        leader_writes as f64 / failing as f64
    );
    println!("{made}");
    println!(
        "leader CPU: {:.2} s in all, {:.1} ms per remediated node; leader RSS {:.1} MiB",
        cpu,
        cpu * 1000.0 / failing as f64,
        rss_mib(leader.id())
    );
    let _ = leader.kill();
    let _ = leader.wait();
}
