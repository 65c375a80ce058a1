//! The health monitor end to end: a simulated host whose files the tests break
//! (ECC counts, device nodes, driver binding, temperatures, hung files), the
//! monitor under a supervisor slot, and the Node written through the API
//! emulator.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::events::EventSink;
use gpu_operator::health::outputs::{
    CONDITION_TYPE, EVENT_UNHEALTHY, REASON_HEALTHY, REASON_UNHEALTHY,
};
use gpu_operator::health::{
    GpuHealth, HealthConfig, HealthMonitor, HealthSnapshot, HealthTransition, NodeHealthPublisher,
    apply_node_health,
};
use gpu_operator::node_writer::NodeWriter;
use gpu_operator::plugin::{DeviceRef, HealthReport};
use gpu_operator::service::Slot;
use gpu_operator::simulate;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;
use support::cluster::TestCluster;
use support::node_rig::NodeRig;
use support::wait::{self, WAIT};
use tokio::sync::{broadcast, watch};

const GPU: &str = "0000:27:00.0";

/// The node (its host in memory when the machine has /dev/shm: simulated
/// hosts have thousands of files; deleting them from disk can take seconds)
/// and the monitor under a supervisor slot on its inventory feed.
struct Rig {
    node: NodeRig,
    slot: Slot<HealthMonitor>,
    report: watch::Receiver<HealthReport>,
    snapshot: watch::Receiver<Arc<HealthSnapshot>>,
    transitions: broadcast::Receiver<HealthTransition>,
}

impl std::ops::Deref for Rig {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.node
    }
}

/// The simulated node of `profile`/`partition` with its feeds, `prepare`
/// run on the host first.
async fn node(
    profile: &str,
    partition: Option<&str>,
    prepare: impl FnOnce(&gpu_operator::host::HostRoot),
) -> NodeRig {
    NodeRig::builder("gpu-node")
        .in_memory()
        .profile(profile, None, partition)
        .prepare(prepare)
        .feeds()
        .start()
        .await
}

async fn start(profile: &str, partition: Option<&str>, exporter_config: Option<&str>) -> Rig {
    let node = node(profile, partition, |_| {}).await;
    let monitor = HealthMonitor::new(node.inventory().subscribe());
    let (report, mut snapshot, transitions) =
        (monitor.report(), monitor.snapshot(), monitor.subscribe());
    let mut slot = Slot::new(monitor);
    slot.apply(Some(HealthConfig {
        exporter_config: exporter_config.map(str::to_owned),
        ..HealthConfig::new(node.host.clone())
    }))
    .await;
    let gpus = node.inventory().borrow().gpus.len();
    wait::within(
        "the first health sample",
        snapshot.wait_for(|s| s.gpus.len() == gpus),
    )
    .await
    .unwrap();
    Rig {
        node,
        slot,
        report,
        snapshot,
        transitions,
    }
}

impl Rig {
    async fn until_report(&mut self, what: &str, want: impl Fn(&HealthReport) -> bool) -> Duration {
        let started = Instant::now();
        let mut report = self.report.clone();
        if tokio::time::timeout(WAIT, report.wait_for(|r| want(r)))
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}: {:?}", *self.report.borrow());
        }
        started.elapsed()
    }

    async fn until_gpu(&mut self, bdf: &str, healthy: bool) -> GpuHealth {
        let mut snapshot = self.snapshot.clone();
        let reached = tokio::time::timeout(
            WAIT,
            snapshot.wait_for(|s| s.gpus.get(bdf).is_some_and(|h| h.healthy == healthy)),
        )
        .await;
        match reached {
            Ok(Ok(s)) => s.gpus[bdf].clone(),
            _ => panic!(
                "{bdf} healthy={healthy} not reached: {:?}",
                self.snapshot.borrow()
            ),
        }
    }

    fn pci(&self, bdf: &str, file: &str) -> String {
        format!("/sys/devices/pci0000:00/{bdf}/{file}")
    }
}

#[tokio::test]
async fn an_uncorrectable_ecc_error_marks_the_gpu_unhealthy_and_it_recovers() {
    let mut rig = start("mi300x", None, None).await;
    assert!(rig.report.borrow().unhealthy.is_empty());
    simulate::set_ecc_counts(&rig.host, GPU, "umc", 1, 3).unwrap();
    let took = rig
        .until_report("the ECC error", |r| {
            r.unhealthy.contains_key(&DeviceRef::gpu(GPU))
        })
        .await;
    // Latency is the benchmark's business; printed here for the curious.
    eprintln!("ECC error reached the HealthReport after {took:?}");
    let reason = rig.report.borrow().unhealthy[&DeviceRef::gpu(GPU)].clone();
    assert_eq!(reason, "1 uncorrectable ECC errors in UMC (threshold 0)");
    assert_eq!(rig.report.borrow().unhealthy.len(), 1, "only that GPU");
    let t = wait::within("a transition", rig.transitions.recv())
        .await
        .unwrap();
    assert_eq!(
        t,
        HealthTransition {
            bdf: GPU.into(),
            healthy: false,
            reasons: vec![reason],
            gpu_ids: vec![1],
        }
    );
    // Correctable errors alone are fine.
    simulate::set_ecc_counts(&rig.host, GPU, "umc", 0, 3).unwrap();
    rig.until_report("recovery", |r| r.unhealthy.is_empty())
        .await;
    let t = wait::within("a transition", rig.transitions.recv())
        .await
        .unwrap();
    assert!(t.healthy && t.reasons.is_empty());
    rig.slot.stop().await;
    assert!(rig.report.borrow().unhealthy.is_empty());
}

#[tokio::test]
async fn a_bad_sample_is_confirmed_at_the_short_interval_not_the_settled_one() {
    let node = node("mi300x", None, |host| {
        simulate::set_ecc_counts(host, GPU, "umc", 1, 0).unwrap();
    })
    .await;
    let monitor = HealthMonitor::new(node.inventory().subscribe());
    let mut transitions = monitor.subscribe();
    let mut slot = Slot::new(monitor);
    // Settled samples an hour apart: within the wait, only the confirmation
    // sample can make the second of the two bad samples the damping needs.
    slot.apply(Some(HealthConfig {
        interval: Duration::from_secs(3600),
        confirm_interval: Duration::from_millis(50),
        ..HealthConfig::new(node.host.clone())
    }))
    .await;
    let t = wait::within("the confirmed ECC error", transitions.recv())
        .await
        .unwrap();
    assert_eq!((t.bdf.as_str(), t.healthy), (GPU, false));
    slot.stop().await;
}

#[tokio::test]
async fn partitions_of_an_unhealthy_gpu_are_all_named_in_the_snapshot() {
    let mut rig = start("mi300x", Some("cpx_nps4"), None).await;
    simulate::set_ecc_counts(&rig.host, GPU, "gfx", 2, 0).unwrap();
    let health = rig.until_gpu(GPU, false).await;
    assert_eq!(health.gpu_ids, (8..16).collect::<Vec<u32>>());
    // The report names the whole GPU: the device plugin applies it to every
    // partition.
    assert_eq!(
        rig.report.borrow().unhealthy.keys().collect::<Vec<_>>(),
        [&DeviceRef::gpu(GPU)]
    );
}

#[tokio::test]
async fn thresholds_come_from_the_exporter_config_and_a_bad_config_keeps_them() {
    let config = r#"{"GPUConfig": {"HealthThresholds": {
        "GPU_ECC_UNCORRECT_UMC": 5, "GPU_JUNCTION_TEMPERATURE": 90}}}"#;
    let mut rig = start("mi210", None, Some(config)).await;
    let gpu = "0000:03:00.0";
    simulate::set_ecc_counts(&rig.host, gpu, "umc", 5, 0).unwrap();
    let hwmon = rig.pci(gpu, "hwmon/hwmon0/temp2_input");
    rig.host.write(&hwmon, "95000\n").unwrap();
    let health = rig.until_gpu(gpu, false).await;
    assert_eq!(
        health.reasons,
        ["junction temperature at or above the critical 90 °C"],
        "5 errors are within the threshold of 5"
    );
    // A broken config text is reported and the thresholds stay.
    let monitor_config = HealthConfig {
        exporter_config: Some("{ not json".into()),
        ..HealthConfig::new(rig.host.clone())
    };
    rig.slot.apply(Some(monitor_config)).await;
    rig.host.write(&hwmon, "60000\n").unwrap();
    rig.until_gpu(gpu, true).await;
    rig.host.write(&hwmon, "92000\n").unwrap();
    let health = rig.until_gpu(gpu, false).await;
    assert!(health.reasons[0].contains("90 °C"), "{health:?}");
}

#[tokio::test]
async fn device_nodes_binding_and_vanished_gpus() {
    let mut rig = start("mi300x", None, None).await;
    // GPU 1 (bus 0x27) has render node 136 in the simulator's layout.
    rig.host.remove_all("/dev/dri/renderD136").unwrap();
    let health = rig.until_gpu(GPU, false).await;
    assert_eq!(health.reasons, ["/dev/dri/renderD136 does not exist"]);
    rig.host.write("/dev/dri/renderD136", "").unwrap();
    rig.until_gpu(GPU, true).await;

    let other = "0000:47:00.0";
    rig.host
        .remove_all(format!("/sys/bus/pci/drivers/amdgpu/{other}"))
        .unwrap();
    let health = rig.until_gpu(other, false).await;
    assert!(
        health.reasons[0].contains("not bound to amdgpu"),
        "{health:?}"
    );

    // Discovery no longer lists a GPU: it is missing compared with the start.
    let mut fewer = (**rig.inventory().borrow()).clone();
    fewer.gpus.retain(|g| g.bdf != "0000:65:00.0");
    rig.inventory().send_replace(Arc::new(fewer));
    let health = rig.until_gpu("0000:65:00.0", false).await;
    assert_eq!(
        health.reasons,
        ["GPU 0000:65:00.0 is missing: 7 of the 8 GPUs seen since start remain"]
    );
    assert_eq!(health.gpu_ids, [3]);
}

#[tokio::test]
async fn a_hung_file_leaves_the_gpu_healthy_and_others_checked() {
    let mut rig = start("mi300x", None, None).await;
    let mut transitions = rig.transitions.resubscribe();
    simulate::hang_file(&rig.host, &rig.pci(GPU, "ras/umc_err_count")).unwrap();
    // Several samples run into the hung file: another GPU turning unhealthy
    // and healthy again takes two samples each way (the default damping), and
    // each of them reads every GPU's files, the hung one too.
    let other = "0000:05:00.0";
    simulate::set_ecc_counts(&rig.host, other, "sdma", 1, 0).unwrap();
    rig.until_gpu(other, false).await;
    simulate::set_ecc_counts(&rig.host, other, "sdma", 0, 0).unwrap();
    rig.until_gpu(other, true).await;
    assert!(
        rig.snapshot.borrow().gpus[GPU].healthy,
        "unknown is not unhealthy"
    );
    let changed: Vec<HealthTransition> = std::iter::from_fn(|| transitions.try_recv().ok())
        .filter(|t| t.bdf == GPU)
        .collect();
    assert!(changed.is_empty(), "{GPU} changed meanwhile: {changed:?}");
    // The other GPUs stay checked while the file hangs.
    simulate::set_ecc_counts(&rig.host, other, "sdma", 1, 0).unwrap();
    rig.until_gpu(other, false).await;
    simulate::release_hung_file(
        &rig.host,
        &rig.pci(GPU, "ras/umc_err_count"),
        "ue: 3\nce: 0",
    )
    .unwrap();
    rig.until_gpu(GPU, false).await;
}

fn snapshot(unhealthy: bool) -> HealthSnapshot {
    let mut s = HealthSnapshot::default();
    s.gpus.insert(
        "0000:05:00.0".into(),
        GpuHealth {
            healthy: true,
            reasons: vec![],
            gpu_ids: vec![0],
        },
    );
    s.gpus.insert(
        GPU.into(),
        GpuHealth {
            healthy: !unhealthy,
            reasons: if unhealthy {
                vec!["1 uncorrectable ECC errors in UMC (threshold 0)".into()]
            } else {
                vec![]
            },
            gpu_ids: vec![1],
        },
    );
    s
}

/// A cluster with the GPU node `name`, which has a stale health label.
async fn cluster_with_node(name: &str) -> TestCluster {
    let labels = json!({
        "amd.com/gpu.family": "AI",
        "metricsexporter.amd.com.gpu.7.state": "unhealthy"
    });
    TestCluster::with_nodes(&[(name, labels)]).await
}

fn condition(node: &serde_json::Value, kind: &str) -> Option<serde_json::Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[tokio::test]
async fn node_condition_and_labels_are_written_only_when_they_change() {
    let emulator = cluster_with_node("gpu-1").await;
    let nodes: Api<Node> = Api::all(emulator.client());

    let wrote = apply_node_health(&nodes, "gpu-1", &snapshot(true))
        .await
        .unwrap();
    assert!(wrote.condition && wrote.labels);
    let node = emulator.get("v1", "Node", "", "gpu-1").unwrap();
    let c = condition(&node, CONDITION_TYPE).expect("condition written");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], REASON_UNHEALTHY);
    assert_eq!(
        c["message"],
        "GPU 1 (0000:27:00.0): 1 uncorrectable ECC errors in UMC (threshold 0)"
    );
    assert_eq!(
        condition(&node, "Ready").unwrap()["status"],
        "True",
        "kubelet's untouched"
    );
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["metricsexporter.amd.com.gpu.1.state"], "unhealthy");
    assert!(
        labels.get("metricsexporter.amd.com.gpu.7.state").is_none(),
        "stale label removed"
    );
    assert_eq!(labels["amd.com/gpu.family"], "AI", "other labels untouched");
    let transition_time = c["lastTransitionTime"].clone();

    let before = emulator.requests();
    let wrote = apply_node_health(&nodes, "gpu-1", &snapshot(true))
        .await
        .unwrap();
    assert!(!wrote.condition && !wrote.labels);
    let made = emulator.requests().since(&before);
    assert_eq!(
        made.get("patch", "nodes") + made.get("patch", "nodes/status"),
        0,
        "{made:?}"
    );

    // Recovery flips the condition and removes the label. (A second passes
    // first: lastTransitionTime has whole seconds, and must change.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let wrote = apply_node_health(&nodes, "gpu-1", &snapshot(false))
        .await
        .unwrap();
    assert!(wrote.condition && wrote.labels);
    let node = emulator.get("v1", "Node", "", "gpu-1").unwrap();
    let c = condition(&node, CONDITION_TYPE).unwrap();
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], REASON_HEALTHY);
    assert_ne!(c["lastTransitionTime"], transition_time);
    assert!(
        node["metadata"]["labels"]
            .get("metricsexporter.amd.com.gpu.1.state")
            .is_none()
    );
}

#[tokio::test]
async fn the_publisher_follows_the_monitor_and_records_events() {
    let emulator = cluster_with_node("gpu-2").await;
    let client = emulator.client();
    let mut rig = start("mi300x", None, None).await;
    let events = EventSink::kubernetes(client.clone(), "gpu-2", watch::channel(None).1);
    let mut publisher = Slot::new(NodeHealthPublisher {
        writer: NodeWriter::new(Api::all(client), "gpu-2"),
        node: emulator.watch_node("gpu-2"),
        snapshots: rig.snapshot.clone(),
        transitions: rig.transitions.resubscribe(),
        events,
    });
    publisher.apply(Some(Duration::from_millis(200))).await;
    let node_condition = |status: &'static str| {
        let emulator = &emulator;
        async move {
            wait::poll_until(
                &format!("condition {status} written"),
                || std::future::ready(emulator.node("gpu-2")),
                |node| condition(node, CONDITION_TYPE).is_some_and(|c| c["status"] == status),
            )
            .await
        }
    };
    node_condition("False").await;
    simulate::set_ecc_counts(&rig.host, GPU, "umc", 1, 0).unwrap();
    node_condition("True").await;
    // The condition and the labels are two writes, in that order: the label
    // may land a moment after the condition.
    wait::poll_until(
        "the unhealthy GPU's label",
        || std::future::ready(emulator.node("gpu-2")),
        |node| node["metadata"]["labels"]["metricsexporter.amd.com.gpu.1.state"] == "unhealthy",
    )
    .await;
    wait::poll_until(
        "a GPUUnhealthy Event",
        || std::future::ready(emulator.list("events.k8s.io/v1", "Event")),
        |events| events.iter().any(|e| e["reason"] == EVENT_UNHEALTHY),
    )
    .await;
    rig.until_gpu(GPU, false).await;
    publisher.stop().await;
}
