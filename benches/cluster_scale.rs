//! The leader at scale: 5,000 Nodes whose agent status annotations are written by
//! a simulated fleet (not 5,000 agents), one DeviceConfig selecting them all.
//! Each Node is as a kubelet, NFD and the agent write it (`support/kubelet_node.rs`:
//! 50 images, managedFields, conditions, addresses, capacity, nodeInfo; its
//! average size is printed).
//!
//! Measures, against the API emulator (in this process) and the real leader
//! (`gpu-operator leader`, a child process, so that its RSS is its own):
//! - time for the status to converge after the fleet first reports, and after a
//!   spec change that every agent then acknowledges at once;
//! - the number of API writes the leader made for that (status, finalizer,
//!   owned Services, Events);
//! - requests per minute at idle (the goal: watches only, zero others);
//! - the leader's RSS (and this process's, the emulator's, for scale).
//!
//! Goals: at 130,000 Nodes, RSS under 1 GiB and convergence under 2 s after
//! the fleet has reported; zero idle requests.
//! Run with `cargo bench --bench cluster_scale` (NODES=... to change the fleet size).

#[path = "support/figures.rs"]
mod figures;
#[path = "../tests/support/mod.rs"]
mod support;

use figures::{rss_mib, setting};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use gpu_operator::api::DeviceConfig;
use gpu_operator::api::agent_status::STATUS_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::json;
use support::cluster::TestCluster;
use support::fixtures::DeviceConfigBuilder;
use support::kubelet_node::{self, kubelet_node, node_name};

const NS: &str = support::cluster::NAMESPACE;

fn agent_status(generation: i64, uid: &str) -> String {
    kubelet_node::fleet_agent_status(NS, generation, uid)
}

/// The whole fleet reports `generation` at once (32 writers in parallel),
/// each as its agent does: a server-side apply of the status annotation.
async fn fleet_reports(nodes: &Api<Node>, count: usize, generation: i64, uid: &str) -> Duration {
    let started = Instant::now();
    let status = agent_status(generation, uid);
    let params = PatchParams::apply(gpu_operator::api::field_manager::AGENT_STATUS).force();
    stream::iter(0..count)
        .map(|i| {
            let name = node_name(i);
            let patch = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {STATUS_ANNOTATION: status}}});
            let params = &params;
            async move {
                nodes
                    .patch(&name, params, &Patch::Apply(&patch))
                    .await
                    .expect("patch node");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    started.elapsed()
}

/// How long after now the emulator has sent revision `rv` of `plural` on a
/// watch (`None` if not within 10 minutes): the part of a convergence that is
/// the emulator's pace, when it is busy, rather than the watcher's.
async fn delivered_by(emulator: &Emulator, plural: &str, rv: u64) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if emulator.delivered(plural) >= rv {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The line that splits a convergence, `converged` after `what` was
/// written, into the emulator's part (until it `delivered` the write on a
/// watch) and the leader's.
fn delivery_line(what: &str, delivered: Option<Duration>, converged: Duration) -> String {
    match delivered {
        Some(d) => format!(
            "  the emulator sent {what} on a watch {:.2} s after it; the leader converged {:.2} s after it had it",
            d.as_secs_f64(),
            converged.saturating_sub(d).as_secs_f64()
        ),
        None => format!("  the emulator sent {what} on a watch: not seen"),
    }
}

/// Waits for the DeviceConfig's status to pass `ok`: two minutes, or a
/// second per hundred Nodes for a larger fleet (at 130,000 on a loaded
/// 2-core machine, the leader still had 44,000 Nodes' reports to take in
/// two minutes after the fleet finished). Every 30 s it prints where
/// the leader is (its status count, and how often it listed and watched
/// Nodes), so a run that does not converge says why.
async fn wait_status(
    configs: &Api<DeviceConfig>,
    emulator: &Emulator,
    count: usize,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> Duration {
    let started = Instant::now();
    let patience = Duration::from_secs(120.max(count as u64 / 100));
    let mut next_report = Duration::from_secs(30);
    loop {
        let status = match configs.get("fleet").await {
            Ok(dc) => serde_json::to_value(&dc.status).unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        if ok(&status) {
            return started.elapsed();
        }
        if started.elapsed() > next_report {
            next_report += Duration::from_secs(30);
            let requests = emulator.requests();
            println!(
                "  {:.0} s waiting ({what}): availableNumber {}, observedGeneration {}; \
                 Node LISTs {}, Node watches {}",
                started.elapsed().as_secs_f64(),
                status["devicePlugin"]["availableNumber"],
                status["observedGeneration"],
                requests.get("list", "nodes"),
                requests.get("watch", "nodes"),
            );
        }
        assert!(
            started.elapsed() < patience,
            "no convergence ({what}) in {patience:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every write the leader sent: DeviceConfig status and finalizer, owned
/// Services, Events. Node writes are the simulated fleet's, not the leader's.
fn leader_writes(emulator: &Emulator, before: &kube_emulator::RequestCounts) -> u64 {
    emulator
        .requests()
        .since(before)
        .non_watch()
        .filter(|k| {
            matches!(k.verb.as_str(), "create" | "update" | "patch" | "delete")
                && !k.resource.starts_with("nodes")
        })
        .total()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count: usize = setting("NODES", 5000);
    // HISTORY: the watch history's length, in events (a watcher further
    // behind lists again, as with a real API server's watch cache).
    let history: usize = setting("HISTORY", 100_000);
    let cluster =
        TestCluster::start_for(EmulatorConfig::default().history_limit(history), &[]).await;
    let emulator = &cluster.emulator;
    let seeding = Instant::now();
    let mut bytes = 0usize;
    for i in 0..count {
        let node = kubelet_node(i, None);
        bytes += serde_json::to_vec(&node).map_or(0, |v| v.len());
        emulator.create(node).unwrap();
    }
    println!(
        "seeded {count} Nodes in {:.1} s; average Node as JSON: {:.1} KB; this process (the emulator): {:.0} MiB",
        seeding.elapsed().as_secs_f64(),
        bytes as f64 / count.max(1) as f64 / 1000.0,
        rss_mib(std::process::id())
    );
    let dc = emulator
        .create(
            DeviceConfigBuilder::fleet(NS)
                .spec("devicePlugin", json!({}))
                .json(),
        )
        .unwrap();
    let uid = dc["metadata"]["uid"].as_str().unwrap().to_owned();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    emulator.write_kubeconfig(kubeconfig.path()).unwrap();

    let client = emulator.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let configs: Api<DeviceConfig> = Api::namespaced(client.clone(), NS);

    println!("fleet: {count} nodes");
    let before = emulator.requests();
    let started = Instant::now();
    // LEADER_PROFILER="heaptrack -o /tmp/leader" runs the leader under a
    // profiler (its RSS is then the profiler's process's).
    let profiler = std::env::var("LEADER_PROFILER").unwrap_or_default();
    let mut command = profiler.split_whitespace();
    let mut leader = match command.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(command).arg(env!("CARGO_BIN_EXE_gpu-operator"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_gpu-operator")),
    };
    let mut leader = leader
        .arg("leader")
        .env("KUBECONFIG", kubeconfig.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start leader");

    let fleet_took = fleet_reports(&nodes, count, 1, &uid).await;
    println!(
        "the fleet reported in {:.1} s; Node LISTs {}, Node watches {} so far",
        fleet_took.as_secs_f64(),
        emulator.requests().get("list", "nodes"),
        emulator.requests().get("watch", "nodes"),
    );
    let last_write = emulator.resource_version();
    let (converged, delivered) = tokio::join!(
        wait_status(&configs, emulator, count, "first report", |s| {
            s["devicePlugin"]["availableNumber"] == count && s["observedGeneration"] == 1
        }),
        delivered_by(emulator, "nodes", last_write),
    );
    let first = started.elapsed();
    println!(
        "initial convergence: {:.2} s after leader start ({:.2} s after the fleet finished reporting; fleet took {:.2} s); \
         leader writes: {}",
        first.as_secs_f64(),
        converged.as_secs_f64(),
        fleet_took.as_secs_f64(),
        leader_writes(emulator, &before)
    );
    println!(
        "{}",
        delivery_line("the fleet's last Node write", delivered, converged)
    );

    let node_lists_at_start = emulator.requests().get("list", "nodes");

    // Spec change: generation 2, acknowledged by every agent at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = emulator.requests();
    let change = Instant::now();
    configs
        .patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devicePlugin": {"enableNodeLabeller": false}}})),
        )
        .await
        .expect("spec change");
    let acks_took = fleet_reports(&nodes, count, 2, &uid).await;
    let last_ack = emulator.resource_version();
    let (after_acks, acks_delivered) = tokio::join!(
        wait_status(&configs, emulator, count, "generation 2", |s| {
            s["observedGeneration"] == 2
        }),
        delivered_by(emulator, "nodes", last_ack),
    );
    let took = change.elapsed();
    // The fleet's writes are the emulator's pace, not the leader's: the
    // leader's part is the time after the last acknowledgement.
    println!(
        "convergence after a spec change: {:.2} s (fleet of {count} acknowledging at once, which took {:.2} s; \
         {:.2} s after the last acknowledgement); leader writes: {}",
        took.as_secs_f64(),
        acks_took.as_secs_f64(),
        after_acks.as_secs_f64(),
        leader_writes(emulator, &before)
    );
    println!(
        "{}",
        delivery_line("the last acknowledgement", acks_delivered, after_acks)
    );

    // Idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window = Duration::from_secs(30);
    let before = emulator.requests();
    tokio::time::sleep(window).await;
    let idle = emulator.requests().since(&before);
    let per_minute = idle.non_watch().total() as f64 * 60.0 / window.as_secs_f64();
    println!(
        "idle: {per_minute:.1} non-watch requests per minute (watch requests: {})",
        idle.watches()
    );
    if idle.non_watch().total() > 0 {
        println!("{}", idle.non_watch());
    }
    // Steady state: the leader read the Nodes through its watch alone.
    println!(
        "Node LISTs: {node_lists_at_start} pages of the watch's first list; {} since (spec change and idle)",
        emulator.requests().get("list", "nodes") - node_lists_at_start
    );
    println!(
        "leader RSS: {:.1} MiB ({:.2} KiB per Node); this process (the emulator): {:.0} MiB",
        rss_mib(leader.id()),
        rss_mib(leader.id()) * 1024.0 / count.max(1) as f64,
        rss_mib(std::process::id())
    );
    if !profiler.is_empty() {
        // The profiler writes its report once the leader itself (its
        // child) has stopped.
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", leader.id()))
            .unwrap_or_default();
        for child in children.split_whitespace() {
            let _ = Command::new("kill").args(["-TERM", child]).status();
        }
        let _ = leader.wait();
    }
    let _ = leader.kill();
    let _ = leader.wait();
}
