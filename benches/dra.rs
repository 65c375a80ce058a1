//! DRA plugin figures, against the API emulator, simulated hosts and the
//! kubelet's DRA side on unix sockets (`tests/support/dra_kubelet.rs`):
//! - `NodePrepareResources` latency for claims of 1 and of 8 GPUs, first call
//!   (claim read from the API, CDI spec and checkpoint written), p50 and p99
//!   (goal: p99 under 5 ms), over one kept connection as the kubelet calls,
//!   and for comparison with a new connection for each call;
//! - time from an injected uncorrectable ECC error (the simulated host's RAS
//!   counter) to `UNHEALTHY` in the health stream, through the real agent and
//!   health monitor (goal: under 1 s);
//! - time from a repartition of the simulated host (spx <-> cpx_nps4) to the
//!   node's ResourceSlices carrying the new devices, through the real agent
//!   and discovery at its default rescan interval (goal: under 2 s), and the
//!   plugin's own share of it: from the new inventory handed over to the
//!   slices written;
//! - RSS of the real `gpu-operator agent` process serving DRA for 64
//!   partitions (mi300x cpx_nps4), after it settled (budget: 25 MiB).
//!
//! - partitions allocated on demand (`autoPartition`), eight MI300Xs: the
//!   slices and their size with every layout published, and
//!   `NodePrepareResources` of a claim for a layout its GPU is not in (the
//!   GPU repartitioned SPX <-> CPX on the simulated host, then the CDI spec
//!   and checkpoint written), p50 and p99.
//!
//! Run with `cargo bench --bench dra`; `DRA_BENCH=layouts` runs only the
//! last. Prints figures; asserts nothing.

#[path = "support/figures.rs"]
mod figures;

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use figures::{percentile, rss_mib};
use gpu_operator::dra::api::dra_v1::NodePrepareResourcesRequest;
use gpu_operator::dra::{DraConfig, DraPlugin, Slices};
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};
use support::cluster::TestCluster;
use support::dra_kubelet::{DraKubelet, v1_claim};
use support::fixtures::DeviceConfigBuilder;
use support::hosts::SimHost;
use support::kubelet::TestKubelet;
use support::node_rig::NodeRig;

const NODE: &str = "bench-node";
const NS: &str = "kube-amd-gpu";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let emulator = TestCluster::start_for(EmulatorConfig::default(), &[NODE])
        .await
        .emulator;
    if std::env::var("DRA_BENCH").as_deref() != Ok("layouts") {
        prepare_latency(&emulator).await;
        agent_figures(&emulator).await;
        rss(&emulator).await;
    }
    layouts(&emulator).await;
}

/// Partitions allocated on demand: slices, and a Prepare that repartitions.
async fn layouts(emulator: &Emulator) {
    let rig = plugin_node(emulator).await;
    let dir = figures::scratch();
    let (plugin, kubelet) = start_plugin(emulator, &rig, &dir, true).await;
    let mut status = plugin.status();
    let _ = status
        .wait_for(|s| matches!(s.slices, Slices::Published { .. }))
        .await;
    let slices: Vec<Value> = emulator
        .list("resource.k8s.io/v1", "ResourceSlice")
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect();
    let bytes: usize = slices
        .iter()
        .map(|s| serde_json::to_vec(s).map_or(0, |v| v.len()))
        .sum();
    println!(
        "autoPartition, 8 x MI300X: {} slices ({} devices), {:.1} KiB of JSON in all, largest {:.1} KiB",
        slices.len(),
        slice_devices(emulator),
        bytes as f64 / 1024.0,
        slices
            .iter()
            .map(|s| serde_json::to_vec(s).map_or(0, |v| v.len()))
            .max()
            .unwrap_or(0) as f64
            / 1024.0
    );
    let client = emulator.client();
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut samples = Vec::new();
    let runs = 20;
    for i in 0..runs {
        // Alternate the layouts of GPU 0, so that every Prepare repartitions.
        let (device, share) = if i % 2 == 0 {
            (
                "gpu-0-cpx-nps1",
                Some(json!({"shareID": format!("s{i}"), "consumedCapacity": {"partitions": "1"}})),
            )
        } else {
            ("gpu-0-spx-nps1", None)
        };
        let name = format!("layout-{i}");
        let object: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}
        }))
        .unwrap();
        let uid = api
            .create(&PostParams::default(), &object)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let mut result =
            json!({"request": "gpu", "driver": "gpu.amd.com", "pool": NODE, "device": device});
        if let Some(extra) = share {
            for (k, v) in extra.as_object().unwrap() {
                result[k] = v.clone();
            }
        }
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [result]}}}})),
        )
        .await
        .unwrap();
        let started = Instant::now();
        let answer = kubelet.prepare(&[(NS, &uid, &name)]).await;
        samples.push(started.elapsed());
        assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
        let answer = kubelet.unprepare(&[(NS, &uid, &name)]).await;
        assert_eq!(answer.claims[&uid].error, "");
    }
    let (p50, p99) = (
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99),
    );
    println!(
        "autoPartition: NodePrepareResources of a claim for another layout (GPU 0 SPX <-> CPX on the simulated host): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={runs})",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    plugin.stop().await;
}

/// The bench's node: an MI300X on disk (as the Prepare figures were first
/// measured), its inventory and health fed by hand, joined to `emulator`.
async fn plugin_node(emulator: &Emulator) -> NodeRig {
    NodeRig::builder(NODE)
        .sim(SimHost::new("mi300x", None))
        .feeds()
        .join(emulator.client())
        .start()
        .await
}

/// Starts the DRA plugin on `rig`'s host and feeds, with its kubelet and CDI
/// directories in `dir` (in memory: the Prepare figures include their
/// writes), and a test kubelet that registers it.
async fn start_plugin(
    emulator: &Emulator,
    rig: &NodeRig,
    dir: &tempfile::TempDir,
    auto_partition: bool,
) -> (DraPlugin, DraKubelet) {
    let kubelet_dir = dir.path().join("kubelet");
    let mut config = DraConfig::new(&kubelet_dir, rig.host.clone(), NODE);
    config.cdi_dir = dir.path().join("cdi");
    config.auto_partition = auto_partition;
    let plugin = DraPlugin::start(
        config,
        rig.inventory().subscribe(),
        rig.health().subscribe(),
        emulator.client(),
        gpu_operator::events::EventSink::log(NODE),
    );
    let kubelet = DraKubelet::new(&kubelet_dir);
    kubelet.register().await;
    (plugin, kubelet)
}

/// Creates claim `name` allocated `devices` of this node; returns its UID.
async fn claim(client: &kube::Client, name: &str, devices: &[String]) -> String {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let object: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": "gpu.amd.com", "pool": NODE, "device": d}))
        .collect();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": results}}}})),
    )
    .await
    .unwrap();
    created.metadata.uid.unwrap()
}

async fn prepare_latency(emulator: &Emulator) {
    let rig = plugin_node(emulator).await;
    let dir = figures::scratch();
    let (plugin, kubelet) = start_plugin(emulator, &rig, &dir, false).await;
    let mut status = plugin.status();
    let _ = status
        .wait_for(|s| matches!(s.slices, Slices::Published { devices: 8, .. }))
        .await;
    let devices: Vec<String> = plugin
        .published()
        .borrow()
        .devices
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let client = emulator.client();
    // The kubelet keeps one connection to a plugin and calls over it; the
    // second figure opens a new one for each call.
    let mut connected = kubelet.v1().await;
    for (size, reuse) in [(1usize, true), (8, true), (1, false), (8, false)] {
        let runs = 200;
        let mut samples = Vec::with_capacity(runs);
        for i in 0..runs {
            let name = format!("c{size}-{reuse}-{i}");
            let uid = claim(&client, &name, &devices[..size]).await;
            let claims = vec![v1_claim((NS, &uid, &name))];
            let started = Instant::now();
            let answer = if reuse {
                connected
                    .node_prepare_resources(NodePrepareResourcesRequest { claims })
                    .await
                    .expect("NodePrepareResources")
                    .into_inner()
            } else {
                kubelet.prepare(&[(NS, &uid, &name)]).await
            };
            samples.push(started.elapsed());
            assert_eq!(answer.claims[&uid].error, "");
            kubelet.unprepare(&[(NS, &uid, &name)]).await;
        }
        println!(
            "NodePrepareResources, claim of {size} GPU(s), first call, {}: p50 {:.2?} p99 {:.2?} max {:.2?} (n={runs})",
            if reuse {
                "kept connection"
            } else {
                "new connection each call"
            },
            percentile(&mut samples, 0.5),
            percentile(&mut samples, 0.99),
            percentile(&mut samples, 1.0)
        );
    }

    // The plugin's own share of a repartition: the new inventory handed over
    // (discovery already done) until the API holds the new slices.
    time_repartitions(
        emulator,
        "new inventory handed to the DRA plugin -> ResourceSlices updated (spx <-> cpx_nps4)",
        |partition| {
            rig.sim.rewrite("mi300x", partition);
            let discovered = std::sync::Arc::new(rig.sim.discover());
            let handed = Instant::now();
            rig.inventory().send_replace(discovered);
            handed
        },
    )
    .await;
    plugin.stop().await;
}

fn slice_devices(emulator: &Emulator) -> usize {
    emulator
        .list("resource.k8s.io/v1", "ResourceSlice")
        .iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum()
}

/// Six repartitions, alternately to cpx_nps4 (64 devices) and back to spx
/// (8): `repartition` makes each and says when its clock starts; the time is
/// until the node's slices carry the new devices. Prints `what` with p50 and max.
async fn time_repartitions(
    emulator: &Emulator,
    what: &str,
    mut repartition: impl FnMut(Option<&'static str>) -> Instant,
) {
    let runs = 6;
    let mut took = Vec::with_capacity(runs);
    for i in 0..runs {
        let (partition, devices) = if i % 2 == 0 {
            (Some("cpx_nps4"), 64)
        } else {
            (None, 8)
        };
        let started = repartition(partition);
        wait_until("the slices follow the repartition", || {
            slice_devices(emulator) == devices
        })
        .await;
        took.push(started.elapsed());
    }
    println!(
        "{what}: p50 {:.2?} max {:.2?} (n={runs})",
        percentile(&mut took, 0.5),
        percentile(&mut took, 1.0)
    );
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// ECC to the health stream, and repartitions to the slices, through the
/// real agent at its default intervals.
async fn agent_figures(emulator: &Emulator) {
    emulator
        .create(
            DeviceConfigBuilder::new(NS, "gpus")
                .spec("draDriver", json!({"enable": true}))
                .spec("metricsExporter", json!({"port": 0}))
                .json(),
        )
        .unwrap();
    let mut rig = NodeRig::builder(NODE)
        .join(emulator.client())
        .in_memory()
        .profile("mi300x", None, None)
        .start()
        .await;
    let host = rig.host.clone();
    let config = rig
        .agent_config()
        .cdi_dir(rig.dir().join("cdi"))
        // The agent's defaults: what a node runs.
        .rescan_interval(Duration::from_secs(1))
        .build();
    rig.start_agent(config);
    let kubelet = DraKubelet::new(&rig.kubelet_dir());
    kubelet.register().await;
    let mut stream = kubelet.health_v1alpha1().await;
    stream
        .next_matching("eight healthy", |d| {
            d.len() == 8 && d.iter().all(|x| x.health == "HEALTHY")
        })
        .await;
    let gpu = gpu_operator::device::discover(&host).gpus[0].clone();
    let name = format!("gpu-{}-{}", gpu.card.unwrap(), gpu.render_minor.unwrap());
    let runs = 20;
    let mut to_unhealthy = Vec::with_capacity(runs);
    for i in 0..runs as u64 {
        let injected = Instant::now();
        simulate::set_ecc_counts(&host, &gpu.bdf, "umc", i + 1, 0).unwrap();
        let (_, at) = stream
            .next_matching("unhealthy", |d| {
                d.iter()
                    .any(|x| x.device == name && x.health == "UNHEALTHY")
            })
            .await;
        to_unhealthy.push(at - injected);
        // Recovery: the counter back to zero, the device healthy again.
        simulate::set_ecc_counts(&host, &gpu.bdf, "umc", 0, 0).unwrap();
        stream
            .next_matching("healthy", |d| d.iter().all(|x| x.health == "HEALTHY"))
            .await;
    }
    println!(
        "ECC error injected -> UNHEALTHY in the DRA health stream: p50 {:.0?} p99 {:.0?} max {:.0?} (n={runs})",
        percentile(&mut to_unhealthy, 0.5),
        percentile(&mut to_unhealthy, 0.99),
        percentile(&mut to_unhealthy, 1.0)
    );

    wait_until("8 devices in the slices", || slice_devices(emulator) == 8).await;
    time_repartitions(
        emulator,
        "repartition (spx <-> cpx_nps4) -> ResourceSlices updated",
        |partition| {
            simulate::write_host(&host, &SimSpec::new("mi300x", None, partition).unwrap()).unwrap();
            Instant::now()
        },
    )
    .await;
    rig.stop().await;
}

/// RSS of the real binary serving DRA for 64 partitions, and, for
/// comparison on the same host, serving the device plugin instead.
async fn rss(emulator: &Emulator) {
    let dir = figures::scratch();
    let host_dir = dir.path().join("host");
    simulate::write_host(
        &HostRoot::new(&host_dir),
        &SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap(),
    )
    .unwrap();
    let kubelet_dir = dir.path().join("kubelet");
    std::fs::create_dir_all(kubelet_dir.join("device-plugins")).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emulator.write_kubeconfig(&kubeconfig).unwrap();
    let configs: Api<gpu_operator::api::DeviceConfig> = Api::namespaced(emulator.client(), NS);
    for dra in [false, true] {
        let spec = if dra {
            json!({"draDriver": {"enable": true}, "devicePlugin": null})
        } else {
            json!({"draDriver": null, "devicePlugin": {}})
        };
        configs
            .patch(
                "gpus",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap();
        let mut device_plugin_kubelet =
            TestKubelet::start(&kubelet_dir.join("device-plugins")).await;
        let cdi_dir = dir.path().join("cdi");
        let mut child = figures::spawn_agent(
            NODE,
            &host_dir,
            &kubelet_dir,
            &kubeconfig,
            &["--cdi-dir".as_ref(), cdi_dir.as_os_str()],
        );
        let what = if dra {
            let kubelet = DraKubelet::new(&kubelet_dir);
            kubelet.register().await;
            wait_until("64 devices in the slices", || slice_devices(emulator) == 64).await;
            let mut stream = kubelet.health_v1alpha1().await;
            stream.next().await;
            tokio::time::sleep(Duration::from_secs(15)).await;
            "serving DRA (health stream open)"
        } else {
            device_plugin_kubelet
                .wait_for_registration("amd.com/gpu", 1)
                .await;
            tokio::time::sleep(Duration::from_secs(15)).await;
            "serving the device plugin instead (same host and DeviceConfig otherwise)"
        };
        let rss = rss_mib(child.id());
        println!(
            "RSS of `gpu-operator agent` on mi300x cpx_nps4 (64 partitions), {what}: {rss:.1} MiB"
        );
        let _ = child.kill();
        let _ = child.wait();
        device_plugin_kubelet.stop().await;
    }
}
