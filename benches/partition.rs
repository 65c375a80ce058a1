//! Partition change figures: the real agent (leading, with the drain and the
//! release) on a simulated MI300X with no pods, against the API emulator and
//! the test kubelet:
//! - time from the Node label `dcm.amd.com/gpu-config-profile` being set to
//!   the device plugin advertising the new partitions (spx <-> cpx_nps4, 64
//!   or 8 devices), p50 and max (goal: under 3 s plus the driver's own time),
//!   and to the state `success` with the node released;
//! - the driver's own time: the sixteen sysfs writes of one change, answered
//!   by the simulated driver (which re-creates the partition tree on a
//!   tmpfs), timed apart;
//! - the API writes of one change, by verb and resource, from the emulator's
//!   request counts (the Node label by the person not counted).
//!
//! Run with `cargo bench --bench partition`. Prints figures; asserts nothing.

#[path = "support/figures.rs"]
mod figures;

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use figures::percentile;
use gpu_operator::cluster::lease::LeaseConfig;
use gpu_operator::host::{AttrStore, HostRoot};
use gpu_operator::partition::{PROFILE_LABEL, STATE_LABEL};
use gpu_operator::simulate::{self, SimSpec, kernel::SimulatedKernel};
use serde_json::json;
use support::agent_config::LeaderConfigBuilder;
use support::cluster::NAMESPACE as NS;
use support::node_rig::NodeRig;

const NODE: &str = "bench-node";
const RUNS: usize = 10;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    driver_time();
    let mut rig = NodeRig::builder(NODE)
        .cluster(json!({"gpu": "amd"}))
        .in_memory()
        .profile("mi300x", None, None)
        .kubelet()
        .start()
        .await;
    let cluster = rig.cluster();
    cluster
        .apply_device_config(
            "gpus",
            json!({"selector": {"gpu": "amd"}, "configManager": {"enable": true}, "devicePlugin": {}}),
        )
        .await;
    let config = rig
        .agent_config()
        // The agent's defaults: what a node runs.
        .rescan_interval(Duration::from_secs(1))
        .leader(Some(
            LeaderConfigBuilder::new(NS, "bench", "bench")
                .lease_timing(
                    LeaseConfig::new(NS, "bench").duration,
                    Duration::from_secs(1),
                )
                .eviction_client(cluster.client_without_retries())
                .build(),
        ))
        .build();
    rig.start_agent(config);
    let cluster = rig.cluster();
    let kubelet = rig.kubelet();
    let registered = kubelet.wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = kubelet.list_and_watch(&registered.request.endpoint).await;
    devices.next_matching("eight GPUs", |d| d.len() == 8).await;
    let state = || {
        let node = cluster.node(NODE);
        (
            node["metadata"]["labels"][STATE_LABEL]
                .as_str()
                .map(str::to_owned),
            node["spec"]["unschedulable"] == json!(true),
            node["metadata"]["annotations"]
                .get(gpu_operator::partition::state::RECORD_ANNOTATION)
                .is_some(),
        )
    };
    let mut advertised = Vec::new();
    let mut released = Vec::new();
    let mut writes: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..RUNS {
        let (profile, count) = if i % 2 == 0 {
            ("cpx_nps4_all", 64)
        } else {
            ("default", 8)
        };
        let before = cluster.requests();
        let started = Instant::now();
        cluster.label_node(NODE, PROFILE_LABEL, Some(profile)).await;
        devices
            .next_matching("the new partitions", |d| d.len() == count)
            .await;
        advertised.push(started.elapsed());
        loop {
            let (state, cordoned, record) = state();
            if state.as_deref() == Some("success") && !cordoned && !record {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "stuck: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        released.push(started.elapsed());
        // Let the change's last writes (status, labels, Events) land.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = cluster.requests();
        for (key, n) in &after.0 {
            let was = before.0.get(key).copied().unwrap_or(0);
            let is_write = ["create", "update", "patch", "delete"].contains(&key.verb.as_str());
            if is_write && *n > was {
                *writes
                    .entry(format!("{} {}", key.verb, key.resource))
                    .or_default() += n - was;
            }
        }
    }
    // The person's label patch is not the operator's.
    if let Some(n) = writes.get_mut("patch nodes") {
        *n -= RUNS as u64;
    }
    println!(
        "label set -> new partitions advertised (spx <-> cpx_nps4, empty node): p50 {:.2?} max {:.2?} (n={RUNS})",
        percentile(&mut advertised, 0.5),
        percentile(&mut advertised, 1.0)
    );
    println!(
        "label set -> state success and the node released: p50 {:.2?} max {:.2?} (n={RUNS})",
        percentile(&mut released, 0.5),
        percentile(&mut released, 1.0)
    );
    let total: u64 = writes.values().sum();
    println!(
        "API writes per change: {:.1} ({})",
        total as f64 / RUNS as f64,
        writes
            .iter()
            .map(|(k, n)| format!("{k} {:.1}", *n as f64 / RUNS as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    rig.stop().await;
}

/// The simulated driver's own time for one change of eight GPUs: each GPU's
/// memory mode, then its compute mode, as the agent writes them.
fn driver_time() {
    let dir = figures::scratch();
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", None, None).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    let driver = SimulatedKernel::new(host.clone());
    let mut took = Vec::new();
    for i in 0..RUNS {
        let (memory, compute) = if i % 2 == 0 {
            ("NPS4", "CPX")
        } else {
            ("NPS1", "SPX")
        };
        let started = Instant::now();
        for bdf in simulate::gpu_addresses(&spec) {
            let dir = format!("/sys/bus/pci/devices/{bdf}");
            driver
                .store(&format!("{dir}/current_memory_partition"), memory)
                .unwrap();
            driver
                .store(&format!("{dir}/current_compute_partition"), compute)
                .unwrap();
        }
        // The operator settles once after its batch of writes; so does this.
        driver.settle().unwrap();
        took.push(started.elapsed());
    }
    println!(
        "the simulated driver's own time, 16 writes of one change: p50 {:.0?} max {:.0?} (n={RUNS})",
        percentile(&mut took, 0.5),
        percentile(&mut took, 1.0)
    );
}
