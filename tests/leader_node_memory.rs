//! What one cached Node costs the leader in heap, measured with a counting
//! allocator: the cache of a 130,000-Node cluster must fit its share of the
//! leader's 1 GiB budget (`cluster_scale`). And what the API emulator that
//! serves `cluster_scale` holds per Node, so that a fleet of that size fits
//! the machine the bench runs on.

mod support;

use support::kubelet_node;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use gpu_operator::cluster::node_cache::{KeptLabels, kept_of};
use k8s_openapi::api::core::v1::Node;

/// Counts live heap bytes and allocations; a chunk of glibc's malloc costs
/// its size rounded up to 16 with 8 bytes of header, 32 at the least, and
/// that is what is counted, since that is what the RSS pays.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_ALLOCATIONS: AtomicIsize = AtomicIsize::new(0);

fn chunk(size: usize) -> isize {
    ((size + 8).div_ceil(16) * 16).max(32) as isize
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        LIVE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        LIVE_ALLOCATIONS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The counts are process-wide: one measurement at a time.
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn live() -> (isize, isize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_ALLOCATIONS.load(Ordering::Relaxed),
    )
}

/// The heap bytes and allocations one Node holds once `keep` has made the
/// cache's copy of it from the JSON a kubelet wrote, held as the reflector
/// holds it (in an `Arc`).
fn held_per_node(keep: impl Fn(Node) -> Node) -> (f64, f64) {
    const NODES: usize = 200;
    let agent_status = r#"{"v":1,"deviceConfig":"kube-amd-gpu/fleet","uid":"0b9a3c5e-8f1d-4c2a-9e7b-1d2f3a4b5c6d","generation":1,"services":{"devicePlugin":"Running"},"resources":{"amd.com/gpu":8},"gpus":8,"driverVersion":"6.12.12","problems":[],"since":"2026-11-30T00:00:00Z"}"#;
    let json: Vec<String> = (0..NODES)
        .map(|i| {
            let mut v = kubelet_node::kubelet_node(i, Some(agent_status));
            v["metadata"]["uid"] = format!("5f0c2a7e-1b3d-4e5f-8a9b-{i:012}").into();
            v["metadata"]["resourceVersion"] = format!("{}", 1_000_000 + i).into();
            v.to_string()
        })
        .collect();
    let mut cache = Vec::with_capacity(NODES);
    let before = live();
    for text in &json {
        let full: Node = serde_json::from_str(text).expect("a Node");
        cache.push(std::sync::Arc::new(keep(full)));
    }
    let after = live();
    drop(cache);
    (
        (after.0 - before.0) as f64 / NODES as f64,
        (after.1 - before.1) as f64 / NODES as f64,
    )
}

#[test]
fn a_cached_node_holds_a_seventh_of_the_kubelets_node() {
    let _one_at_a_time = MEASURING.blocking_lock();
    let (full_bytes, full_allocations) = held_per_node(|n| n);
    // What the leader keeps for the benches' DeviceConfig, selecting by the
    // GPU label.
    let fleet = support::fixtures::DeviceConfigBuilder::fleet("kube-amd-gpu").build();
    let kept_labels = KeptLabels::for_configs([&fleet]);
    let (kept_bytes, kept_allocations) = held_per_node(|n| kept_of(n, &kept_labels));
    println!(
        "a kubelet's Node: {full_bytes:.0} bytes in {full_allocations:.0} allocations; \
         what the cache keeps of it: {kept_bytes:.0} bytes in {kept_allocations:.0} allocations"
    );
    assert!(full_bytes > 50_000.0, "the fixture is a full Node");
    // 4.4 KB at the time of writing (9.1 KB while every label was kept:
    // 30 of them, each key and value its own allocation, ~5.4 KB; a real
    // NFD node carries ~100): the Node struct itself 1.5 KB, the
    // conditions 1.2 KB, the agent's status 0.9 KB, the one label the
    // DeviceConfig selects by. Keeping every gpu-operator manager's
    // ownership added 5.9 KB (nested JSON maps).
    assert!(
        kept_bytes < 6_144.0,
        "a cached Node holds {kept_bytes:.0} bytes: 130,000 of them need {:.2} GiB",
        kept_bytes * 130_000.0 / f64::from(1 << 30)
    );
}

/// The emulator keeps each object frozen as its JSON text, shared between the
/// store and the history record of the write that made it. Held as
/// `serde_json::Value`s (the store's copy, and the record's copy of the new
/// and the old version), a realistic Node cost 243 KB once seeded and 691 KB
/// after two status reports: 130,000 of them did not fit a 24 GiB machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_holds_a_realistic_node_in_a_few_times_its_json() {
    use gpu_operator::api::agent_status::STATUS_ANNOTATION;
    use kube::api::{Api, Patch, PatchParams};
    use kube_emulator::EmulatorConfig;
    use support::cluster::TestCluster;

    const NODES: usize = 200;
    let _one_at_a_time = MEASURING.lock().await;
    let cluster =
        TestCluster::start_for(EmulatorConfig::default().history_limit(100_000), &[]).await;
    let emulator = &cluster.emulator;
    let nodes: Api<Node> = Api::all(emulator.client());
    let per_node = |since: (isize, isize)| (live().0 - since.0) as f64 / NODES as f64;
    let before = live();
    let mut json_bytes = 0;
    for i in 0..NODES {
        let node = kubelet_node::kubelet_node(i, None);
        json_bytes += serde_json::to_vec(&node).map_or(0, |v| v.len());
        emulator.create(node).expect("seed a Node");
    }
    let json_per_node = json_bytes as f64 / NODES as f64;
    let seeded = per_node(before);
    // Every Node reports twice, as the bench's fleet does: a server-side
    // apply of the agent's status annotation.
    let params = PatchParams::apply(gpu_operator::api::field_manager::AGENT_STATUS).force();
    for generation in 1..=2 {
        let status = kubelet_node::fleet_agent_status("kube-amd-gpu", generation, "uid");
        for i in 0..NODES {
            let name = kubelet_node::node_name(i);
            let patch = serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {STATUS_ANNOTATION: status}}});
            nodes
                .patch(&name, &params, &Patch::Apply(&patch))
                .await
                .expect("report");
        }
    }
    let reported = per_node(before);
    println!(
        "the emulator per Node: {json_per_node:.0} bytes of JSON; {seeded:.0} bytes held once \
         seeded, {reported:.0} after two reports (history kept)"
    );
    assert!(json_per_node > 15_000.0, "the fixture is a realistic Node");
    // 45 KB at the time of writing: the text (18 KB) and the field
    // ownership (27 KB); each report adds one version's text to the history.
    assert!(
        seeded < 3.0 * json_per_node,
        "a seeded Node holds {seeded:.0} bytes"
    );
    assert!(
        reported < seeded + 2.0 * 1.5 * json_per_node,
        "a Node reported twice holds {reported:.0} bytes"
    );
}
