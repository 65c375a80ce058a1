//! Device plugin figures: time from start to registration, re-registration after
//! a kubelet restart, stop, and Allocate / GetPreferredAllocation latency (p50, p99),
//! over real unix sockets against the test kubelet and for the pure
//! preferred-allocation function alone.
//!
//! Run with `cargo bench --bench plugin`. Prints a table; nothing is asserted
//! (goals: registration well under 1 s after a kubelet restart, stop well under
//! the agent's 5 s, preferred allocation under 1 ms for 64 devices, and under
//! 1 ms at p99 for 512 shared devices: 8 GPUs x 8 partitions x 8 replicas;
//! a new replica count re-advertised within 2 s).

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::device::{Gpu, Link, LinkKind};
use gpu_operator::plugin::api::v1beta1::device_plugin_client::DevicePluginClient;
use gpu_operator::plugin::{
    DevicePluginService, PluginConfig, PluginDevice, ResourceNamingStrategy, TimeSlicing, Topology,
    preferred_allocation, preferred_replicas,
};
use support::kubelet::{allocate_request, preferred_request};
use support::node_rig::NodeRig;

/// An MI300X node (in `partition`) with the test kubelet and the feeds the
/// plugin reads.
async fn node(partition: Option<&str>) -> NodeRig {
    NodeRig::builder("gpu-node")
        .profile("mi300x", None, partition)
        .kubelet()
        .feeds()
        .start()
        .await
}

/// The device plugin of `config` on `rig`'s feeds.
fn start_plugin(rig: &NodeRig, config: PluginConfig) -> DevicePluginService {
    DevicePluginService::start(
        config,
        rig.inventory().subscribe(),
        rig.health().subscribe(),
    )
}

struct Figures {
    name: String,
    samples: Vec<Duration>,
}

impl Figures {
    fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            samples: Vec::new(),
        }
    }

    fn print(mut self) {
        self.samples.sort();
        let pick = |q: f64| {
            let i = ((self.samples.len() as f64 - 1.0) * q).round() as usize;
            self.samples[i]
        };
        println!(
            "{:<58} n={:<6} p50={:>10.1?} p99={:>10.1?} max={:>10.1?}",
            self.name,
            self.samples.len(),
            pick(0.50),
            pick(0.99),
            pick(1.0)
        );
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(registration());
    runtime.block_on(rpc_latency());
    runtime.block_on(shared_rpc_latency());
    pure_preferred_allocation();
    pure_preferred_replicas();
}

fn sharing(replicas: u32) -> TimeSlicing {
    TimeSlicing {
        replicas,
        ..TimeSlicing::default()
    }
}

/// Time-slicing over gRPC: an MI300X in CPX (64 partitions) advertised 8
/// times, 512 devices; and a new replica count until ListAndWatch shows it.
async fn shared_rpc_latency() {
    let rig = node(Some("cpx_nps4")).await;
    let kubelet = rig.kubelet();
    let config = PluginConfig {
        sharing: sharing(8),
        ..PluginConfig::new(
            rig.plugin_dir(),
            ResourceNamingStrategy::Single,
            rig.host.clone(),
        )
    };
    let plugin = start_plugin(&rig, config.clone());
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = kubelet.list_and_watch("amd.com_gpu.sock").await;
    let devices = stream
        .next_matching("512 replicas", |d| d.len() == 512)
        .await;
    let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let mut client = kubelet.client("amd.com_gpu.sock").await;
    for (label, size) in [
        ("GetPreferredAllocation, 512 shared free, size 1 (gRPC)", 1),
        ("GetPreferredAllocation, 512 shared free, size 4 (gRPC)", 4),
        ("GetPreferredAllocation, 512 shared free, size 8 (gRPC)", 8),
        (
            "GetPreferredAllocation, 512 shared free, size 80 (gRPC)",
            80,
        ),
    ] {
        preferred_rpc(&mut client, label, &ids, size).await;
    }
    let mut figures = Figures::new("replica count changed -> ListAndWatch shows it");
    for round in 0..20 {
        let replicas = if round % 2 == 0 { 4 } else { 8 };
        let began = Instant::now();
        plugin
            .reconfigure(PluginConfig {
                sharing: sharing(replicas),
                ..config.clone()
            })
            .await
            .expect("reconfigure");
        let wanted = 64 * replicas as usize;
        stream
            .next_matching("the new count", |d| d.len() == wanted)
            .await;
        figures.samples.push(began.elapsed());
    }
    figures.print();
    plugin.stop().await;
}

/// The pure replica choice on 512 devices: 8 GPUs x 8 partitions x 8 replicas.
fn pure_preferred_replicas() {
    let (devices, gpus) = synthetic(8, 8);
    let shared: Vec<PluginDevice> = devices
        .iter()
        .flat_map(|d| {
            (0..8).map(move |r| PluginDevice {
                id: format!("{}::{r}", d.id),
                ..d.clone()
            })
        })
        .collect();
    let topology = Arc::new(Topology::new(&shared, &gpus));
    let available: Vec<String> = shared.iter().map(|d| d.id.clone()).collect();
    for size in [1, 4, 8, 80] {
        measure(
            format!("preferred_replicas, 8 GPUs x 8 partitions x 8 replicas, size {size}"),
            || preferred_replicas(&topology, black_box(&available), &[], size),
        );
    }
}

/// Times 2,000 GetPreferredAllocation calls for `size` out of `available`,
/// after 200 of warm-up, and prints the figures.
async fn preferred_rpc(
    client: &mut DevicePluginClient<tonic::transport::Channel>,
    label: &str,
    available: &[String],
    size: i32,
) {
    let mut figures = Figures::new(label);
    for i in 0..2200 {
        let began = Instant::now();
        let response = client
            .get_preferred_allocation(preferred_request(available, &[], size))
            .await
            .expect("preferred allocation");
        if i >= 200 {
            figures.samples.push(began.elapsed());
        }
        black_box(response);
    }
    figures.print();
}

/// Times `call` 5,000 times after 500 calls of warm-up, and prints the figures.
fn measure<T>(label: impl Into<String>, mut call: impl FnMut() -> T) {
    let mut figures = Figures::new(label);
    for i in 0..5500 {
        let began = Instant::now();
        let answer = call();
        if i >= 500 {
            figures.samples.push(began.elapsed());
        }
        black_box(answer);
    }
    figures.print();
}

/// Start → registration accepted by the test kubelet (which dials back into the
/// plugin before accepting), and kubelet restart → registration again.
async fn registration() {
    let mut start = Figures::new("start -> registered (mi300x, 8 GPUs)");
    let mut again = Figures::new("kubelet restart -> registered again");
    let mut stop = Figures::new("stop() with an open ListAndWatch stream");
    for _ in 0..20 {
        let mut rig = node(None).await;
        let config = PluginConfig::new(
            rig.plugin_dir(),
            ResourceNamingStrategy::Single,
            rig.host.clone(),
        );
        let began = Instant::now();
        let plugin = start_plugin(&rig, config);
        let kubelet = rig.kubelet_mut();
        let registered = kubelet.wait_for_registration("amd.com/gpu", 1).await;
        start.samples.push(registered.at.duration_since(began));

        for _ in 0..2 {
            let n = kubelet.registrations().len() + 1;
            let restarted = kubelet.restart().await;
            let registered = kubelet.wait_for_registration("amd.com/gpu", n).await;
            again.samples.push(registered.at.duration_since(restarted));
        }
        let mut stream = kubelet.list_and_watch("amd.com_gpu.sock").await;
        stream.next().await;
        let began = Instant::now();
        plugin.stop().await;
        stop.samples.push(began.elapsed());
    }
    start.print();
    again.print();
    stop.print();
}

/// Allocate and GetPreferredAllocation as the kubelet calls them.
async fn rpc_latency() {
    let rig = node(Some("cpx_nps4")).await;
    let kubelet = rig.kubelet();
    let config = PluginConfig::new(
        rig.plugin_dir(),
        ResourceNamingStrategy::Single,
        rig.host.clone(),
    );
    let plugin = start_plugin(&rig, config);
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    let devices = kubelet.first_list("amd.com_gpu.sock").await;
    let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let mut client = kubelet.client("amd.com_gpu.sock").await;

    for (label, count) in [
        ("Allocate, 1 partition (gRPC)", 1),
        ("Allocate, 8 partitions (gRPC)", 8),
    ] {
        let request_ids: Vec<&str> = ids.iter().take(count).map(String::as_str).collect();
        let mut figures = Figures::new(label);
        for i in 0..2200 {
            let began = Instant::now();
            let response = client
                .allocate(allocate_request(&request_ids))
                .await
                .expect("allocate");
            if i >= 200 {
                figures.samples.push(began.elapsed());
            }
            black_box(response);
        }
        figures.print();
    }

    let partly_used: Vec<String> = ids.iter().skip(5).cloned().collect();
    for (label, available, size) in [
        ("GetPreferredAllocation, 64 free, size 8 (gRPC)", &ids, 8),
        (
            "GetPreferredAllocation, 59 free, size 1 (gRPC)",
            &partly_used,
            1,
        ),
        ("GetPreferredAllocation, 64 free, size 20 (gRPC)", &ids, 20),
    ] {
        preferred_rpc(&mut client, label, available, size).await;
    }
    plugin.stop().await;
}

/// The pure function alone, on 64 devices: 8 GPUs × 8 partitions (MI300X CPX),
/// and the worst case for the search, 64 whole GPUs.
fn pure_preferred_allocation() {
    let cpx = synthetic(8, 8);
    let whole = synthetic(64, 1);
    for (label, (devices, gpus), size) in [
        (
            "preferred_allocation, 8 GPUs x 8 partitions, size 1",
            &cpx,
            1,
        ),
        (
            "preferred_allocation, 8 GPUs x 8 partitions, size 8",
            &cpx,
            8,
        ),
        (
            "preferred_allocation, 8 GPUs x 8 partitions, size 20",
            &cpx,
            20,
        ),
        ("preferred_allocation, 64 whole GPUs, size 1", &whole, 1),
        ("preferred_allocation, 64 whole GPUs, size 8", &whole, 8),
        ("preferred_allocation, 64 whole GPUs, size 32", &whole, 32),
    ] {
        let topology = Arc::new(Topology::new(devices, gpus));
        let available: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
        measure(label, || {
            preferred_allocation(&topology, black_box(&available), &[], size)
        });
    }
}

/// `gpus` GPUs in two NUMA nodes, XGMI hives of eight, PCIe between hives.
fn synthetic(gpus: usize, partitions: usize) -> (Vec<PluginDevice>, Vec<Gpu>) {
    let bdf = |g: usize| format!("0000:{:02x}:{:02x}.0", g / 32 + 1, g % 32);
    let mut devices = Vec::new();
    let mut inventory = Vec::new();
    for g in 0..gpus {
        let numa = (g * 2 / gpus) as i64;
        for p in 0..partitions {
            devices.push(PluginDevice {
                id: if p == 0 {
                    bdf(g)
                } else {
                    format!("amdgpu_xcp_{}", g * 7 + p - 1)
                },
                gpu_bdf: bdf(g),
                partition: (partitions > 1).then_some(p as u32),
                numa_node: Some(numa),
                card: Some((g * partitions + p) as u32),
                render_minor: Some((128 + g * partitions + p) as u32),
            });
        }
        let links = (0..gpus)
            .filter(|&h| h != g)
            .map(|h| Link {
                to_bdf: bdf(h),
                kind: if h / 8 == g / 8 {
                    LinkKind::Xgmi
                } else {
                    LinkKind::Pcie
                },
                weight: 15,
            })
            .collect();
        inventory.push(Gpu {
            bdf: bdf(g),
            numa_node: Some(numa as i32),
            links,
            ..Gpu::default()
        });
    }
    (devices, inventory)
}
