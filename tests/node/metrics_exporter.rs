//! The metrics exporter end to end: a simulated host, the exporter service under
//! a supervisor slot, scrapes over HTTP on 127.0.0.1, and a fake kubelet
//! PodResources server on a unix socket.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::agent::select::Sampling;
use gpu_operator::device::{Inventory, discover};
use gpu_operator::health::{HealthConfig, HealthMonitor};
use gpu_operator::host::HostRoot;
use gpu_operator::metrics::{ExporterStatus, MetricsConfig, MetricsService};
use gpu_operator::service::Slot;
use gpu_operator::simulate::{self, SimSpec};
use support::pod_resources::{FakeKubelet, pod, serve_kubelet};
use support::wait::{self, WAIT};
use tokio::sync::watch;

struct Sim {
    _dir: tempfile::TempDir,
    host: HostRoot,
    spec: SimSpec,
    inventory: watch::Sender<Arc<Inventory>>,
}

/// A temporary directory, in memory when the machine has /dev/shm: simulated
/// hosts have thousands of files, and deleting them from a disk mounted with
/// `discard` takes seconds.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

fn simulated(profile: &str, partition: Option<&str>) -> Sim {
    let dir = scratch();
    let host = HostRoot::new(dir.path().join("host"));
    let spec = SimSpec::new(profile, None, partition).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    let inventory = watch::Sender::new(Arc::new(discover(&host)));
    Sim {
        _dir: dir,
        host,
        spec,
        inventory,
    }
}

fn config(sim: &Sim) -> MetricsConfig {
    MetricsConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        interval: Duration::from_millis(100),
        file_timeout: Duration::from_millis(200),
        ..MetricsConfig::new(sim.host.clone(), "node-1")
    }
}

struct Running {
    slot: Slot<MetricsService>,
    status: watch::Receiver<ExporterStatus>,
    addr: SocketAddr,
}

async fn start(sim: &Sim, config: MetricsConfig, health: Option<&HealthMonitor>) -> Running {
    let service = MetricsService::new(sim.inventory.subscribe(), health.map(|h| h.snapshot()));
    start_service(service, config).await
}

/// As [`start`], with a service the test built itself.
async fn start_service(service: MetricsService, config: MetricsConfig) -> Running {
    let mut status = service.status();
    let mut slot = Slot::new(service);
    slot.apply(Some(config)).await;
    let addr = tokio::time::timeout(
        WAIT,
        status.wait_for(|s| s.listening.is_some() && s.samples > 0),
    )
    .await
    .expect("exporter listening and sampled in time")
    .expect("exporter alive")
    .listening
    .unwrap();
    Running { slot, status, addr }
}

impl Running {
    /// Waits until `n` more samples have been taken and published.
    async fn samples(&mut self, n: u64) {
        let target = self.status.borrow().samples + n;
        tokio::time::timeout(WAIT, self.status.wait_for(|s| s.samples >= target))
            .await
            .expect("samples in time")
            .expect("exporter alive");
    }

    async fn scrape(&self) -> String {
        let (status, body) = get(self.addr, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// One HTTP/1.0 GET on a fresh connection: (status code, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, body.to_owned())
    })
    .await
    .unwrap()
}

/// The series of one metric: labels and value.
fn series(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
                let (labels, value) = rest.rsplit_once("} ")?;
                (support::promtool::parse_labels(labels), value)
            } else {
                (BTreeMap::new(), rest.strip_prefix(' ')?)
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

fn value_of(text: &str, name: &str, gpu_id: &str) -> Option<f64> {
    series(text, name)
        .into_iter()
        .find(|(l, _)| l.get("gpu_id").map(String::as_str) == Some(gpu_id))
        .map(|(_, v)| v)
}

fn promtool_accepts(text: &str) {
    support::promtool::accepts(text);
}

#[tokio::test]
async fn mi300x_scrape_is_valid_and_has_one_series_per_gpu() {
    let sim = simulated("mi300x", None);
    let running = start(&sim, config(&sim), None).await;
    let text = running.scrape().await;
    promtool_accepts(&text);
    let edge = series(&text, "gpu_edge_temperature");
    assert_eq!(edge.len(), 8, "{text}");
    let ids: Vec<&str> = edge.iter().map(|(l, _)| l["gpu_id"].as_str()).collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4", "5", "6", "7"]);
    let (labels, value) = &edge[0];
    assert!((35.0..=65.0).contains(value), "{value}");
    for (key, expected) in [
        // The board's part number, as amd-smi's model number.
        ("card_model", "102-G30211-00"),
        ("deployment_mode", "baremetal"),
        ("job_id", ""),
        ("hostname", "node-1"),
        ("gpu_partition_id", "0"),
        ("gpu_compute_partition_type", "spx"),
        ("gpu_memory_partition_type", "nps1"),
        ("pod", ""),
        ("namespace", ""),
        ("container", ""),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(expected), "{key}");
    }
    assert!(!labels["serial_number"].is_empty());
    for name in [
        "gpu_package_power",
        "gpu_average_package_power",
        "gpu_energy_consumed",
        "gpu_junction_temperature",
        "gpu_memory_temperature",
        "gpu_gfx_activity",
        "gpu_umc_activity",
        "gpu_total_vram",
        "gpu_used_vram",
        "gpu_free_vram",
        "gpu_total_visible_vram",
        "gpu_used_visible_vram",
        "gpu_free_visible_vram",
        "gpu_total_gtt",
        "gpu_used_gtt",
        "gpu_free_gtt",
        "pcie_speed",
        "pcie_max_speed",
        "pcie_replay_count",
        "gpu_ecc_correct_total",
        "gpu_ecc_uncorrect_total",
        "gpu_ecc_correct_umc",
        "gpu_ecc_uncorrect_umc",
        "gpu_ecc_uncorrect_bif",
        "gpu_ecc_uncorrect_xgmi_wafl",
    ] {
        assert_eq!(series(&text, name).len(), 8, "{name}");
    }
    assert_eq!(value_of(&text, "gpu_total_vram", "0"), Some(192.0 * 1024.0));
    assert_eq!(value_of(&text, "pcie_max_speed", "3"), Some(32.0));
    // From gpu_metrics (v1.8): 8 XCC clocks, memory, 4 video, 4 data and 4
    // SoC clocks per GPU.
    let clocks = series(&text, "gpu_clock");
    assert_eq!(clocks.len(), 8 * 21, "every clock of the metrics table");
    assert!(
        clocks
            .iter()
            .any(|(l, v)| l["clock_type"] == "memory" && l["clock_index"] == "8" && *v == 1300.0)
    );
    // Families of the metrics table, with the reference's per-index labels.
    let busy = series(&text, "gpu_gfx_busy_instantaneous");
    assert_eq!(busy.len(), 64, "8 XCCs of 8 GPUs");
    let xccs: BTreeSet<&str> = busy.iter().map(|(l, _)| l["xcc_index"].as_str()).collect();
    assert_eq!(xccs.len(), 8);
    assert!(busy.iter().all(|(_, v)| (0.0..=100.0).contains(v)));
    for (name, per_gpu) in [
        ("pcie_bandwidth", 1),
        ("pcie_recovery_count", 1),
        ("pcie_replay_rollover_count", 1),
        ("pcie_nack_sent_count", 1),
        ("pcie_nack_received_count", 1),
        ("gpu_vram_max_bandwidth", 1),
        ("gpu_violation_current_accumulated_counter", 1),
        ("gpu_violation_processor_hot_residency_accumulated", 1),
        ("gpu_violation_ppt_residency_accumulated", 1),
        ("gpu_violation_socket_thermal_residency_accumulated", 1),
        ("gpu_violation_vr_thermal_residency_accumulated", 1),
        ("gpu_violation_hbm_thermal_residency_accumulated", 1),
        ("gpu_vcn_busy_instantaneous", 4),
        ("gpu_jpeg_busy_instantaneous", 32),
        (
            "gpu_violation_gfx_clock_below_host_limit_power_accumulated",
            8,
        ),
        (
            "gpu_violation_gfx_clock_below_host_limit_thermal_accumulated",
            8,
        ),
        ("gpu_violation_low_utilization_accumulated", 8),
        (
            "gpu_violation_gfx_clock_below_host_limit_total_accumulated",
            8,
        ),
    ] {
        assert_eq!(series(&text, name).len(), 8 * per_gpu, "{name}");
    }
    assert!(text.contains("# TYPE gpu_gfx_busy_instantaneous gauge"));
    // MI300 tables have no per-stack HBM temperature, MM activity or
    // device-level VCN/JPEG activity.
    for name in [
        "gpu_hbm_temperature",
        "gpu_mma_activity",
        "gpu_vcn_activity",
        "gpu_jpeg_activity",
    ] {
        assert!(series(&text, name).is_empty(), "{name}");
    }
    assert_eq!(series(&text, "gpu_nodes_total")[0].1, 8.0);
    // Every GPU family is a gauge, as the reference declares them (the
    // agent's own `gpu_operator_*` and `process_*` families are ours,
    // counters among them).
    let types: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
        .filter(|l| !l.starts_with("# TYPE gpu_operator_") && !l.starts_with("# TYPE process_"))
        .collect();
    assert!(types.len() > 40, "{types:?}");
    assert!(types.iter().all(|l| l.ends_with(" gauge")), "{types:?}");
    assert!(text.contains("# TYPE gpu_ecc_uncorrect_total gauge"));
    assert!(
        series(&text, "gpu_health").is_empty(),
        "no health monitor, no gpu_health"
    );
}

#[tokio::test]
async fn pod_uuid_and_extra_pod_labels_come_from_the_api_server() {
    let sim = simulated("mi300x", Some("cpx_nps4"));
    let kubelet_dir = scratch();
    let socket = kubelet_dir.path().join("kubelet.sock");
    let _kubelet = serve_kubelet(
        &socket,
        FakeKubelet {
            pods: vec![pod("infer", "amd.com/gpu", &["0000:27:00.0"])],
            ..FakeKubelet::default()
        },
    )
    .await;
    let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorConfig::default())
        .await
        .unwrap();
    emu.create(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ml"}}))
        .unwrap();
    let created = emu
        .create(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "infer", "namespace": "ml",
                         "labels": {"example.com/workload": "w1"}},
            "spec": {"nodeName": "node-1",
                     "containers": [{"name": "main", "image": "i"}]}}))
        .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let service = MetricsService::new(sim.inventory.subscribe(), None).with_kube(emu.client());
    let mut running = start_service(
        service,
        MetricsConfig {
            pod_resources_socket: Some(socket),
            config_text: Some(
                r#"{"GPUConfig": {"Labels": ["POD_UUID"],
                "ExtraPodLabels": {"WORKLOAD_ID": "example.com/workload"}}}"#
                    .into(),
            ),
            ..config(&sim)
        },
    )
    .await;
    let addr = running.addr;
    let labelled = |text: &str| {
        series(text, "gpu_junction_temperature")
            .into_iter()
            .find(|(l, _)| l["gpu_id"] == "8")
            .map(|(l, _)| (l["pod_uuid"].clone(), l["workload_id"].clone()))
    };
    let (_, text) = wait::poll_until(
        "the pod's UID and label on its GPU",
        || get(addr, "/metrics"),
        |(_, text)| labelled(text).is_some_and(|(u, _)| !u.is_empty()),
    )
    .await;
    assert_eq!(labelled(&text), Some((uid, "w1".to_owned())));
    // A GPU no pod holds has the labels, empty.
    let free = series(&text, "gpu_junction_temperature")
        .into_iter()
        .find(|(l, _)| l["gpu_id"] == "0")
        .map(|(l, _)| (l["pod_uuid"].clone(), l["workload_id"].clone()));
    assert_eq!(free, Some((String::new(), String::new())));
    assert_eq!(emu.requests().get("get", "pods"), 0, "list and watch only");
    running.slot.stop().await;
}

#[tokio::test]
async fn cpx_nps4_has_device_series_per_gpu_and_health_per_partition() {
    let sim = simulated("mi300x", Some("cpx_nps4"));
    let monitor = HealthMonitor::new(sim.inventory.subscribe());
    let mut snapshot = monitor.snapshot();
    let mut health = Slot::new(monitor);
    health
        .apply(Some(HealthConfig::new(sim.host.clone())))
        .await;
    tokio::time::timeout(WAIT, snapshot.wait_for(|s| s.gpus.len() == 8))
        .await
        .unwrap()
        .unwrap();
    let service = MetricsService::new(sim.inventory.subscribe(), Some(snapshot.clone()));
    let mut running = start_service(service, config(&sim)).await;
    let (code, text) = get(running.addr, "/metrics").await;
    assert_eq!(code, 200);
    promtool_accepts(&text);
    let edge = series(&text, "gpu_edge_temperature");
    assert_eq!(edge.len(), 8);
    assert!(edge.iter().all(|(l, _)| l["gpu_partition_id"] == "0"));
    let ids: Vec<&str> = edge.iter().map(|(l, _)| l["gpu_id"].as_str()).collect();
    assert_eq!(ids, ["0", "8", "16", "24", "32", "40", "48", "56"]);
    assert!(
        edge.iter()
            .all(|(l, _)| l["gpu_compute_partition_type"] == "cpx"
                && l["gpu_memory_partition_type"] == "nps4")
    );
    let health_series = series(&text, "gpu_health");
    assert_eq!(health_series.len(), 64);
    assert!(health_series.iter().all(|(_, v)| *v == 1.0));
    let partitions: Vec<&str> = health_series[..8]
        .iter()
        .map(|(l, _)| l["gpu_partition_id"].as_str())
        .collect();
    assert_eq!(partitions, ["0", "1", "2", "3", "4", "5", "6", "7"]);
    assert_eq!(series(&text, "gpu_nodes_total")[0].1, 64.0);
    // Per partition, from its own XCP entry: one XCC each in CPX.
    let busy = series(&text, "gpu_gfx_busy_instantaneous");
    assert_eq!(busy.len(), 64);
    assert!(busy.iter().all(|(l, _)| l["xcc_index"] == "0"));
    let ids: BTreeSet<&str> = busy.iter().map(|(l, _)| l["gpu_id"].as_str()).collect();
    assert_eq!(ids.len(), 64);
    // Power and GTT on every partition, 0 on all but the primary; clocks and
    // temperatures on the primary only, as the reference reports them.
    for name in ["gpu_package_power", "gpu_total_gtt"] {
        let per = series(&text, name);
        assert_eq!(per.len(), 64, "{name}");
        for (l, v) in &per {
            let primary = l["gpu_partition_id"] == "0";
            assert_eq!(*v == 0.0, !primary, "{name} {l:?} {v}");
        }
    }
    for name in ["gpu_junction_temperature", "gpu_clock"] {
        let per = series(&text, name);
        assert!(!per.is_empty(), "{name}");
        assert!(
            per.iter().all(|(l, _)| l["gpu_partition_id"] == "0"),
            "{name}"
        );
    }
    running.slot.stop().await;
    health.stop().await;
}

#[tokio::test]
async fn violation_percentages_follow_the_residency_counters_between_samples() {
    let sim = simulated("mi300x", None);
    let mut running = start(&sim, config(&sim), None).await;
    // One table per sample so far: no percentages yet.
    assert!(
        series(
            &running.scrape().await,
            "gpu_violation_ppt_residency_percentage"
        )
        .is_empty()
    );
    simulate::advance_telemetry(&sim.host, &sim.spec, 10).unwrap();
    // The second sample from now starts after the advance.
    running.samples(2).await;
    let text = running.scrape().await;
    // The simulator adds 3 PPT cycles and 1 socket-thermal cycle per 100
    // accumulation cycles each tick, 2 below-host-limit (power) per XCC.
    let ppt = series(&text, "gpu_violation_ppt_residency_percentage");
    assert_eq!(ppt.len(), 8);
    assert!(ppt.iter().all(|(_, v)| *v == 3.0), "{ppt:?}");
    let socket = series(&text, "gpu_violation_socket_thermal_residency_percentage");
    assert!(socket.iter().all(|(_, v)| *v == 1.0), "{socket:?}");
    let below = series(
        &text,
        "gpu_violation_gfx_clock_below_host_limit_power_percentage",
    );
    assert_eq!(below.len(), 64, "8 XCCs of 8 GPUs");
    assert!(below.iter().all(|(_, v)| *v == 2.0), "{below:?}");
    promtool_accepts(&text);
}

#[tokio::test]
async fn values_change_when_telemetry_moves() {
    let sim = simulated("mi210", None);
    let mut running = start(&sim, config(&sim), None).await;
    let before = running.scrape().await;
    simulate::advance_telemetry(&sim.host, &sim.spec, 3).unwrap();
    simulate::set_ecc_counts(&sim.host, "0000:03:00.0", "umc", 0, 7).unwrap();
    running.samples(2).await;
    let after = running.scrape().await;
    for name in [
        "gpu_edge_temperature",
        "gpu_energy_consumed",
        "gpu_used_vram",
    ] {
        assert_ne!(
            value_of(&before, name, "0"),
            value_of(&after, name, "0"),
            "{name} should move"
        );
    }
    assert_eq!(value_of(&before, "gpu_ecc_correct_umc", "0"), Some(0.0));
    assert_eq!(value_of(&after, "gpu_ecc_correct_umc", "0"), Some(7.0));
    assert_eq!(value_of(&after, "gpu_ecc_correct_total", "0"), Some(7.0));
}

/// Nobody scrapes and no pods are followed (as in standalone mode: the
/// kubelet's PodResources socket is not there): after its first sample the
/// exporter does not sample at its interval. A scrape then asks for a fresh
/// sample and is served it, and sampling at the interval resumes.
#[tokio::test]
async fn an_exporter_nobody_scrapes_samples_when_a_scrape_asks() {
    let sim = simulated("mi210", None);
    let no_kubelet = scratch();
    let config = MetricsConfig {
        pod_resources_socket: Some(no_kubelet.path().join("pod-resources/kubelet.sock")),
        ..config(&sim)
    };
    let mut running = start(&sim, config, None).await;
    let first = running.status.borrow().samples;
    // Ten intervals of 100 ms: nothing to wait for but time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        running.status.borrow().samples,
        first,
        "no scrape, no sample"
    );

    simulate::set_ecc_counts(&sim.host, "0000:03:00.0", "umc", 0, 7).unwrap();
    let text = running.scrape().await;
    assert_eq!(
        value_of(&text, "gpu_ecc_correct_umc", "0"),
        Some(7.0),
        "the scrape was served a sample taken after it asked"
    );
    // And sampling at the interval resumed.
    running.samples(2).await;
}

#[tokio::test]
async fn deferred_ecc_errors_are_exported_where_the_kernel_reports_them() {
    // Kernels add `de:` to UMC's counts (every ASIC); older ones did not.
    let sim = simulated("mi300x", None);
    let mut running = start(&sim, config(&sim), None).await;
    let before = running.scrape().await;
    assert_eq!(series(&before, "gpu_ecc_deferred_umc").len(), 8);
    assert_eq!(value_of(&before, "gpu_ecc_deferred_total", "0"), Some(0.0));
    assert!(series(&before, "gpu_ecc_deferred_gfx").is_empty());
    simulate::set_ecc_counts_with_deferred(&sim.host, "0000:05:00.0", "umc", [0, 1, 5]).unwrap();
    running.samples(2).await;
    let after = running.scrape().await;
    assert_eq!(value_of(&after, "gpu_ecc_deferred_umc", "0"), Some(5.0));
    assert_eq!(value_of(&after, "gpu_ecc_deferred_total", "0"), Some(5.0));
    assert_eq!(value_of(&after, "gpu_ecc_correct_umc", "0"), Some(1.0));
    assert_eq!(value_of(&after, "gpu_ecc_deferred_umc", "1"), Some(0.0));

    let older = simulated("mi210", None);
    // The file as kernels before the `de:` line wrote it.
    let umc = "/sys/bus/pci/devices/0000:03:00.0/ras/umc_err_count";
    simulate::write_atomic(&older.host, umc, "ue: 0\nce: 2\n").unwrap();
    let running = start(&older, config(&older), None).await;
    let text = running.scrape().await;
    assert_eq!(value_of(&text, "gpu_ecc_correct_umc", "0"), Some(2.0));
    assert_eq!(value_of(&text, "gpu_ecc_deferred_umc", "0"), None);
    assert_eq!(value_of(&text, "gpu_ecc_deferred_total", "0"), None);
    assert_eq!(value_of(&text, "gpu_ecc_deferred_umc", "1"), Some(0.0));
}

#[tokio::test]
async fn a_hung_file_costs_one_value_and_scrapes_still_answer() {
    let sim = simulated("mi300x", None);
    let mut running = start(&sim, config(&sim), None).await;
    let hung = "/sys/devices/pci0000:00/0000:27:00.0/current_link_speed";
    simulate::hang_file(&sim.host, hung).unwrap();
    // Scraped, the exporter samples at its interval.
    running.scrape().await;
    running.samples(3).await;
    let started = Instant::now();
    let text = running.scrape().await;
    let took = started.elapsed();
    let speeds = series(&text, "pcie_speed");
    assert_eq!(speeds.len(), 7, "only the hung GPU's value is missing");
    assert!(speeds.iter().all(|(l, _)| l["gpu_id"] != "1"));
    assert_eq!(series(&text, "pcie_max_speed").len(), 8);
    assert_eq!(series(&text, "gpu_edge_temperature").len(), 8);
    assert!(
        series(&text, "gpu_operator_sysfs_reads_skipped_total")[0].1
            + series(&text, "gpu_operator_sysfs_read_timeouts_total")[0].1
            >= 1.0
    );
    // Not a performance assertion (that is the benchmark's job): the scrape did
    // not wait for the hung file, whose reads never return.
    assert!(took < WAIT, "scrape took {took:?}");
    simulate::release_hung_file(&sim.host, hung, "32.0 GT/s PCIe").unwrap();
    wait::poll_until(
        "the released value back in a scrape",
        || get(running.addr, "/metrics"),
        |(_, text)| series(text, "pcie_speed").len() == 8,
    )
    .await;
    running.slot.stop().await;
}

#[tokio::test]
async fn pods_from_the_kubelet_label_their_gpus() {
    let sim = simulated("mi300x", Some("cpx_nps4"));
    // The simulator names partition 1 of the first GPU's platform device
    // amdgpu_xcp_0 (render node 129); the device plugin uses that name as its ID,
    // and partition 0 of each GPU is its PCI address.
    assert!(
        sim.host
            .exists("/sys/devices/platform/amdgpu_xcp_0/drm/renderD129")
    );
    let kubelet_dir = scratch();
    let socket = kubelet_dir.path().join("kubelet.sock");
    let _kubelet = serve_kubelet(
        &socket,
        FakeKubelet {
            pods: vec![
                pod("train", "amd.com/gpu", &["amdgpu_xcp_0"]),
                pod("infer", "amd.com/gpu", &["0000:27:00.0"]),
                pod("nic", "example.com/nic", &["0000:05:00.0"]),
            ],
            ..FakeKubelet::default()
        },
    )
    .await;
    let monitor = HealthMonitor::new(sim.inventory.subscribe());
    let snapshot = monitor.snapshot();
    let mut health = Slot::new(monitor);
    health
        .apply(Some(HealthConfig::new(sim.host.clone())))
        .await;
    let service = MetricsService::new(sim.inventory.subscribe(), Some(snapshot));
    let mut status = service.status();
    let mut slot = Slot::new(service);
    slot.apply(Some(MetricsConfig {
        pod_resources_socket: Some(socket),
        ..config(&sim)
    }))
    .await;
    let addr = tokio::time::timeout(WAIT, status.wait_for(|s| s.samples > 1 && s.series > 100))
        .await
        .unwrap()
        .unwrap()
        .listening
        .unwrap();
    let (_, text) = wait::poll_until(
        "64 gpu_health series",
        || get(addr, "/metrics"),
        |(_, text)| series(text, "gpu_health").len() == 64,
    )
    .await;
    let pod_of = |name: &str, gpu_id: &str| -> Option<(String, String, String)> {
        series(&text, name)
            .into_iter()
            .find(|(l, _)| l["gpu_id"] == gpu_id)
            .map(|(l, _)| {
                (
                    l["pod"].clone(),
                    l["namespace"].clone(),
                    l["container"].clone(),
                )
            })
    };
    let train = Some(("train".into(), "ml".into(), "main".into()));
    let nobody = Some((String::new(), String::new(), String::new()));
    assert_eq!(pod_of("gpu_health", "1"), train);
    assert_eq!(
        pod_of("gpu_health", "0"),
        nobody,
        "the NIC resource is not a GPU"
    );
    assert_eq!(pod_of("gpu_health", "2"), nobody);
    let infer = Some(("infer".into(), "ml".into(), "main".into()));
    assert_eq!(pod_of("gpu_health", "8"), infer);
    assert_eq!(pod_of("gpu_edge_temperature", "8"), infer);
    assert_eq!(pod_of("gpu_edge_temperature", "0"), nobody);
    assert_eq!(status.borrow().pod_resources_error, None);
    slot.stop().await;
    health.stop().await;
}

/// Time-sliced GPUs: the kubelet reports replicas (`<id>::<n>`); every pod
/// on a GPU gets its own series, and `gpu_shared_pods` counts them.
#[tokio::test]
async fn pods_sharing_a_gpu_each_get_its_series_and_are_counted() {
    let sim = simulated("mi210", None);
    let bdfs: Vec<String> = sim
        .inventory
        .borrow()
        .gpus
        .iter()
        .map(|g| g.bdf.clone())
        .collect();
    let (first, second) = (bdfs[0].clone(), bdfs[1].clone());
    let kubelet_dir = scratch();
    let socket = kubelet_dir.path().join("kubelet.sock");
    let mut research = pod("eval", "amd.com/gpu", &[&format!("{first}::1")]);
    research.namespace = "research".into();
    let _kubelet = serve_kubelet(
        &socket,
        FakeKubelet {
            pods: vec![
                pod(
                    "train",
                    "amd.com/gpu",
                    &[&format!("{first}::0"), &format!("{first}::3")],
                ),
                research,
                pod("infer", "amd.com/gpu", &[&format!("{second}::2")]),
            ],
            ..FakeKubelet::default()
        },
    )
    .await;
    let service = MetricsService::new(sim.inventory.subscribe(), None);
    let mut status = service.status();
    let mut slot = Slot::new(service);
    slot.apply(Some(MetricsConfig {
        pod_resources_socket: Some(socket),
        shared_gpus: true,
        ..config(&sim)
    }))
    .await;
    let addr = tokio::time::timeout(WAIT, status.wait_for(|s| s.samples > 1))
        .await
        .unwrap()
        .unwrap()
        .listening
        .unwrap();
    let (_, text) = wait::poll_until(
        "gpu_shared_pods of 2 on GPU 0",
        || get(addr, "/metrics"),
        |(_, text)| value_of(text, "gpu_shared_pods", "0") == Some(2.0),
    )
    .await;
    promtool_accepts(&text);
    assert_eq!(value_of(&text, "gpu_shared_pods", "1"), Some(1.0));
    let mut on_first: Vec<(String, String)> = series(&text, "gpu_edge_temperature")
        .into_iter()
        .filter(|(l, _)| l["gpu_id"] == "0")
        .map(|(l, _)| (l["namespace"].clone(), l["pod"].clone()))
        .collect();
    on_first.sort();
    assert_eq!(
        on_first,
        [
            ("ml".to_owned(), "train".to_owned()),
            ("research".to_owned(), "eval".to_owned())
        ],
        "one series per pod, each with its own namespace"
    );
    slot.stop().await;
}

#[tokio::test]
async fn a_bad_config_keeps_the_last_good_one() {
    let sim = simulated("mi210", None);
    let good = r#"{"GPUConfig": {"Fields": ["GPU_EDGE_TEMPERATURE"],
                                  "CustomLabels": {"CLUSTER_NAME": "lab"}}}"#;
    let mut cfg = config(&sim);
    cfg.config_text = Some(good.into());
    let mut running = start(&sim, cfg.clone(), None).await;
    let text = running.scrape().await;
    assert_eq!(series(&text, "gpu_edge_temperature").len(), 4);
    assert!(series(&text, "gpu_junction_temperature").is_empty());
    assert_eq!(
        series(&text, "gpu_edge_temperature")[0].0["cluster_name"],
        "lab"
    );

    cfg.config_text = Some(r#"{"GPUConfig": {"Fields": "#.into());
    running.slot.apply(Some(cfg.clone())).await;
    tokio::time::timeout(WAIT, running.status.wait_for(|s| s.config_error.is_some()))
        .await
        .unwrap()
        .unwrap();
    running.samples(1).await;
    let text = running.scrape().await;
    assert_eq!(
        series(&text, "gpu_edge_temperature").len(),
        4,
        "last good config"
    );
    assert!(series(&text, "gpu_junction_temperature").is_empty());
    assert_eq!(
        series(&text, "gpu_operator_metrics_config_last_reload_successful")[0].1,
        0.0
    );
    assert_eq!(
        series(&text, "gpu_operator_metrics_config_errors_total")[0].1,
        1.0
    );
    let error = running.status.borrow().config_error.clone().unwrap();
    assert!(error.contains("line 1"), "{error}");

    cfg.config_text = Some(r#"{"CommonConfig": {"MetricsFieldPrefix": "amd_"}}"#.into());
    running.slot.apply(Some(cfg)).await;
    tokio::time::timeout(WAIT, running.status.wait_for(|s| s.config_error.is_none()))
        .await
        .unwrap()
        .unwrap();
    running.samples(1).await;
    let text = running.scrape().await;
    assert_eq!(series(&text, "amd_gpu_junction_temperature").len(), 4);
    assert!(series(&text, "gpu_edge_temperature").is_empty());
    assert_eq!(
        series(&text, "gpu_operator_metrics_config_last_reload_successful")[0].1,
        1.0
    );
    promtool_accepts(&text);
}

#[tokio::test]
async fn json_view_and_probes() {
    let sim = simulated("mi300x", Some("dpx_nps1"));
    let running = start(&sim, config(&sim), None).await;
    let (code, body) = get(running.addr, "/healthz").await;
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, _) = get(running.addr, "/readyz").await;
    assert_eq!(code, 200);
    let (code, body) = get(running.addr, "/gpumetrics").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let gpus = json["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 16);
    assert_eq!(json["hostname"], "node-1");
    assert_eq!(gpus[1]["partition_id"], 1);
    assert!(
        gpus[0]["readings"]["temperature"]["edge_c"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(gpus[1]["readings"].is_null());
    let (code, _) = get(running.addr, "/nope").await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn agent_metrics_are_served() {
    let sim = simulated("radeon-w7900", None);
    let mut running = start(&sim, config(&sim), None).await;
    let before = series(&running.scrape().await, "gpu_operator_reconciles_total")[0].1;
    gpu_operator::counters::record_reconcile();
    gpu_operator::counters::record_api_error();
    running.samples(1).await;
    let text = running.scrape().await;
    assert!(series(&text, "gpu_operator_reconciles_total")[0].1 > before);
    assert!(series(&text, "gpu_operator_api_errors_total")[0].1 >= 1.0);
    assert!(!series(&text, "gpu_operator_service_restarts_total").is_empty());
    assert!(series(&text, "process_resident_memory_bytes")[0].1 > 0.0);
    assert!(!series(&text, "process_cpu_seconds_total").is_empty());
    promtool_accepts(&text);
}

#[tokio::test]
async fn listening_twice_on_one_port_fails_and_is_retried() {
    let sim = simulated("mi210", None);
    let first = start(&sim, config(&sim), None).await;
    let service = MetricsService::new(sim.inventory.subscribe(), None);
    let mut slot = Slot::new(service).with_backoff(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(10))
            .with_max_delay(Duration::from_millis(50)),
    );
    let mut state = slot.subscribe();
    slot.apply(Some(MetricsConfig {
        listen: first.addr,
        ..config(&sim)
    }))
    .await;
    let failed = tokio::time::timeout(
        WAIT,
        state.wait_for(|s| matches!(s, gpu_operator::service::ServiceState::Restarting { .. })),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    let text = format!("{failed:?}");
    assert!(text.contains("cannot listen"), "{text}");
    slot.stop().await;
}

#[tokio::test]
async fn standalone_mode_runs_discovery_health_and_metrics_without_kubernetes() {
    use gpu_operator::agent::standalone::{self, StandaloneConfig};
    let dir = scratch();
    let host = HostRoot::new(dir.path().join("host"));
    let spec = SimSpec::new("mi300x", None, Some("qpx_nps1")).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    let events = dir.path().join("events.jsonl");
    let config = StandaloneConfig {
        host: host.clone(),
        spec: standalone::default_spec(),
        node_name: "bare-metal".into(),
        kubelet_dir: dir.path().join("no-kubelet"),
        events_file: Some(events.clone()),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_config: None,
        test_config: None,
        rescan_interval: Duration::from_secs(2),
        sampling: Sampling {
            metrics_interval: Duration::from_millis(100),
            ..Sampling::default()
        },
        simulate: Some(spec),
        test_commands: Default::default(),
        driver: support::bundles::no_modprobe(),
        health_socket: None,
    };
    let (listening, addr) = tokio::sync::oneshot::channel();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(standalone::run(config, cancel.clone(), move |addr| {
        let _ = listening.send(addr.expect("the exporter listens"));
    }));
    let addr = tokio::time::timeout(WAIT, addr).await.unwrap().unwrap();
    simulate::set_ecc_counts(&host, "0000:c7:00.0", "umc", 1, 0).unwrap();
    let unhealthy_of = |text: &str| -> (usize, Vec<String>) {
        let health = series(text, "gpu_health");
        let unhealthy = health
            .iter()
            .filter(|(_, v)| *v == 0.0)
            .map(|(l, _)| l["gpu_id"].clone())
            .collect();
        (health.len(), unhealthy)
    };
    let (code, text) = wait::poll_until(
        "the unhealthy GPU in gpu_health",
        || get(addr, "/metrics"),
        |(code, text)| {
            assert_eq!(*code, 200);
            let (series, unhealthy) = unhealthy_of(text);
            series == 32 && unhealthy.len() == 4
        },
    )
    .await;
    assert_eq!(code, 200);
    let (_, first) = unhealthy_of(&text);
    assert_eq!(
        first,
        ["24", "25", "26", "27"],
        "the four partitions of GPU 6"
    );
    assert_eq!(series(&text, "gpu_edge_temperature").len(), 8);
    assert_eq!(
        series(&text, "gpu_edge_temperature")[0].0["hostname"],
        "bare-metal"
    );
    // The demo moves the simulated telemetry: energy keeps growing.
    let energy = |text: &str| value_of(text, "gpu_energy_consumed", "0").unwrap();
    let before = energy(&text);
    wait::poll_until(
        "the simulated telemetry moving",
        || get(addr, "/metrics"),
        |(_, later)| energy(later) > before,
    )
    .await;
    // Events go to the local JSON-lines file.
    let lines = std::fs::read_to_string(&events).unwrap();
    let unhealthy = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["type"] == "Warning" && e["object"] == "0000:c7:00.0")
        .unwrap_or_else(|| panic!("no unhealthy event in {lines}"));
    assert!(!unhealthy["reason"].as_str().unwrap().is_empty());
    cancel.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The leader's upgrade families pass promtool, with series and without.
#[test]
fn the_upgrade_families_pass_promtool() {
    use gpu_operator::counters::StepTotals;
    use gpu_operator::metrics::agent::upgrade_families;
    let nodes: BTreeMap<String, usize> = [
        ("Upgrade-Complete".to_owned(), 3),
        ("Upgrade-Started".to_owned(), 2),
    ]
    .into();
    let steps: BTreeMap<String, StepTotals> = [(
        "Upgrade".to_owned(),
        StepTotals {
            count: 3,
            seconds: 95.25,
        },
    )]
    .into();
    promtool_accepts(&gpu_operator::metrics::render::encode(upgrade_families(
        &nodes, &steps,
    )));
    promtool_accepts(&gpu_operator::metrics::render::encode(upgrade_families(
        &BTreeMap::new(),
        &BTreeMap::new(),
    )));
}

/// The leader's remediation counters and histogram, as the endpoint serves
/// them, pass promtool; the histogram's buckets are cumulative.
#[tokio::test]
async fn remediation_counts_and_durations_are_served_and_valid() {
    gpu_operator::counters::record_remediation("AMDGPUXgmiMetricsTest", "started", None);
    gpu_operator::counters::record_remediation("AMDGPUXgmiMetricsTest", "succeeded", Some(420.0));
    let sim = simulated("mi210", None);
    let running = start(&sim, config(&sim), None).await;
    let text = running.scrape().await;
    promtool_accepts(&text);
    let started = series(&text, "gpu_operator_remediations_total")
        .into_iter()
        .find(|(l, _)| {
            l.get("condition").map(String::as_str) == Some("AMDGPUXgmiMetricsTest")
                && l.get("result").map(String::as_str) == Some("started")
        });
    assert_eq!(started.map(|(_, v)| v), Some(1.0), "{text}");
    assert!(
        text.contains("# TYPE gpu_operator_remediation_seconds histogram"),
        "{text}"
    );
    // 420 s is above the 300 s bucket and within the 900 s one (other tests
    // in this binary record none).
    let bucket = |le: &str| {
        series(&text, "gpu_operator_remediation_seconds_bucket")
            .into_iter()
            .find(|(l, _)| l.get("le").map(String::as_str) == Some(le))
            .map(|(_, v)| v)
    };
    assert_eq!(bucket("300"), Some(0.0), "{text}");
    assert_eq!(bucket("900"), Some(1.0), "{text}");
    assert_eq!(bucket("+Inf"), Some(1.0), "{text}");
}
