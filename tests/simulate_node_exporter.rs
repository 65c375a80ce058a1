//! A reader we did not write, over a simulated host: the Prometheus node
//! exporter (Debian's `prometheus-node-exporter`) with its `drm` and `hwmon`
//! collectors pointed at the simulated `/sys`. It must find every amdgpu card it
//! looks for, with the busy percent, VRAM and temperatures that our own
//! discovery and sampler read from the same tree.
//!
//! Without the binary the tests skip, unless `REQUIRE_NODE_EXPORTER` is set
//! (CI sets it), in which case they fail. `NODE_EXPORTER` names another binary.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpu_operator::device::Inventory;
use gpu_operator::host::reader::BoundedReader;
use gpu_operator::simulate::{self, SimSpec};
use gpu_operator::telemetry::sample::{HostSample, Sampler, Scope};
use support::hosts::SimHost;
use support::tools::Tool;
use support::wait;

const NODE_EXPORTER: Tool = Tool {
    what: "the node exporter",
    path_var: "NODE_EXPORTER",
    default: "/usr/bin/prometheus-node-exporter",
    require_var: "REQUIRE_NODE_EXPORTER",
    install: "install Debian's prometheus-node-exporter",
};

/// A running node exporter; killed (and reaped) on drop.
struct Exporter {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    /// Starts the exporter's drm and hwmon collectors over `sysfs`, and waits
    /// until it answers a scrape.
    fn start(binary: &Path, sysfs: &Path, scratch: &Path) -> Self {
        // An empty directory stands for procfs: neither collector reads it, and
        // nothing of the real host's is exposed.
        let procfs = scratch.join("proc");
        std::fs::create_dir_all(&procfs).unwrap();
        // The port is free when asked for, but another process may take it
        // before the exporter binds it: then try another.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
                .port();
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let log = scratch.join(format!("node-exporter-{attempt}.log"));
            let child = Command::new(binary)
                .arg(format!("--path.sysfs={}", sysfs.display()))
                .arg(format!("--path.procfs={}", procfs.display()))
                .arg(format!("--path.rootfs={}", scratch.display()))
                .args([
                    "--collector.disable-defaults",
                    "--collector.drm",
                    "--collector.hwmon",
                    "--web.disable-exporter-metrics",
                ])
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
            let mut exporter = Self { child, addr, log };
            match exporter.wait_ready() {
                Ok(()) => return exporter,
                Err(log) => last_log = log,
            }
        }
        panic!("the node exporter exited before serving, three times; its log:\n{last_log}");
    }

    /// Polls `/metrics` until it answers 200. `Err` with the log when the
    /// exporter exited (e.g. its port was taken); panics after `WAIT`.
    fn wait_ready(&mut self) -> Result<(), String> {
        let (child, addr, log) = (&mut self.child, self.addr, &self.log);
        let mut exited_or_ready = || match child.try_wait() {
            Ok(Some(status)) => {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                Some(Err(format!("exit {status}:\n{log}")))
            }
            _ => get(addr, "/metrics")
                .is_ok_and(|(code, _)| code == 200)
                .then_some(Ok(())),
        };
        let mut outcome = None;
        wait::eventually_blocking_explained(
            &format!("the node exporter answering on {addr}"),
            || {
                outcome = exited_or_ready();
                outcome.is_some()
            },
            || {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                format!("its log:\n{log}")
            },
        );
        outcome.unwrap()
    }

    fn scrape(&self) -> Metrics {
        let (code, body) = get(self.addr, "/metrics").expect("scrape the node exporter");
        assert_eq!(code, 200, "{body}");
        Metrics::parse(&body)
    }
}

/// A plain HTTP/1.0 GET over loopback: (status, body).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    Ok((code, body.to_owned()))
}

type Labels = BTreeMap<String, String>;

/// Prometheus text format samples, by metric name.
struct Metrics(BTreeMap<String, Vec<(Labels, f64)>>);

impl Metrics {
    fn parse(text: &str) -> Self {
        let mut out: BTreeMap<String, Vec<(Labels, f64)>> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("value in {line:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series, Labels::new()),
                Some((name, rest)) => (
                    name,
                    support::promtool::parse_labels(rest.trim_end_matches('}')),
                ),
            };
            out.entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Self(out)
    }

    fn series(&self, name: &str) -> &[(Labels, f64)] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }

    /// The one value of `name` whose labels include all of `want`.
    fn value(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .series(name)
            .iter()
            .filter(|(labels, _)| {
                want.iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| *v)
            .collect();
        assert!(matching.len() <= 1, "{name} {want:?}: {matching:?}");
        matching.first().copied()
    }
}

/// A simulated host with its telemetry moved off tick 0, and what our own
/// discovery and sampler read from it.
struct Simulated {
    sim: SimHost,
    inventory: Inventory,
    sample: HostSample,
}

fn simulated(profile: &str, gpus: Option<usize>, partition: Option<&str>) -> Simulated {
    let sim = SimHost::with_gpus(profile, gpus, partition);
    let spec = SimSpec::new(profile, gpus, partition).unwrap();
    simulate::advance_telemetry(&sim.host, &spec, 7).unwrap();
    let inventory = sim.discover();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sample = runtime.block_on(async {
        let mut sampler = Sampler::new(
            BoundedReader::new(sim.host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
            Duration::from_secs(5),
        );
        sampler.sample(&inventory, Scope::Full).await
    });
    Simulated {
        sim,
        inventory,
        sample,
    }
}

/// The drm collector looks only at `class/drm/card[0-9]` (one digit).
fn in_reach(card: u32) -> bool {
    card < 10
}

/// The GPUs' own cards (on the PCI function, `DRIVER=amdgpu`) that the drm
/// collector looks at, with their GPU's address.
fn gpu_cards_in_reach(inventory: &Inventory) -> BTreeMap<String, String> {
    inventory
        .gpus
        .iter()
        .filter_map(|gpu| {
            let card = gpu.card.expect("every simulated GPU has a card");
            in_reach(card).then(|| (format!("card{card}"), gpu.bdf.clone()))
        })
        .collect()
}

/// Every DRM card the drm collector looks at, partitions' included. Partition
/// cards sit on driverless platform devices: node exporter 1.5 lists them with
/// zero values, later versions skip them.
fn all_cards_in_reach(inventory: &Inventory) -> BTreeSet<String> {
    inventory
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.card
                .into_iter()
                .chain(gpu.partitions.iter().filter_map(|p| p.card))
        })
        .filter(|card| in_reach(*card))
        .map(|card| format!("card{card}"))
        .collect()
}

/// Temperatures travel as millidegrees, then as floats: equal up to rounding.
fn same_float(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(1.0),
        _ => false,
    }
}

/// Runs the exporter over `host` and checks what it reports against our own
/// reading of the same tree. Returns the GPU cards it reported.
fn check(binary: &Path, host: &Simulated) -> BTreeSet<String> {
    let scratch = tempfile::tempdir().unwrap();
    let exporter = Exporter::start(binary, &host.sim.host.path("/sys"), scratch.path());
    let metrics = exporter.scrape();
    for collector in ["drm", "hwmon"] {
        assert_eq!(
            metrics.value("node_scrape_collector_success", &[("collector", collector)]),
            Some(1.0),
            "the {collector} collector read the simulated tree without error; log:\n{}",
            std::fs::read_to_string(&exporter.log).unwrap_or_default()
        );
    }

    // DRM: every GPU card in the collector's reach, with our busy percent and VRAM.
    let expected = gpu_cards_in_reach(&host.inventory);
    let reported: BTreeSet<String> = metrics
        .series("node_drm_card_info")
        .iter()
        .map(|(labels, _)| labels["card"].clone())
        .collect();
    let gpu_cards: BTreeSet<String> = expected.keys().cloned().collect();
    assert!(
        reported.is_superset(&gpu_cards),
        "node_drm_card_info has every GPU card {gpu_cards:?}: {reported:?}"
    );
    let all = all_cards_in_reach(&host.inventory);
    assert!(
        reported.is_subset(&all),
        "node_drm_card_info has only the cards that exist ({all:?}): {reported:?}"
    );
    for (card, bdf) in &expected {
        let ours = &host.sample.gpus[bdf];
        let theirs = |name: &str| {
            metrics
                .value(name, &[("card", card)])
                .unwrap_or_else(|| panic!("{name} for {card}"))
        };
        assert_eq!(
            Some(theirs("node_drm_gpu_busy_percent")),
            ours.gfx_activity_pct,
            "{card} busy percent"
        );
        for (name, value) in [
            ("node_drm_memory_vram_size_bytes", ours.memory.vram_total),
            ("node_drm_memory_vram_used_bytes", ours.memory.vram_used),
            (
                "node_drm_memory_vis_vram_used_bytes",
                ours.memory.vis_vram_used,
            ),
            ("node_drm_memory_gtt_used_bytes", ours.memory.gtt_used),
        ] {
            let value = value.unwrap_or_else(|| panic!("we read {name} for {bdf}")) as f64;
            assert_eq!(theirs(name), value, "{card} {name}");
        }
        let gpu = host.inventory.gpus.iter().find(|g| &g.bdf == bdf).unwrap();
        assert_eq!(
            Some(theirs("node_drm_memory_vram_size_bytes") as u64),
            gpu.vram_bytes,
            "{card}: VRAM as discovery sees it"
        );
    }

    // hwmon: one amdgpu chip per GPU, with the temperatures our sampler reads.
    let chips: Vec<(String, String)> = metrics
        .series("node_hwmon_chip_names")
        .iter()
        .map(|(labels, _)| (labels["chip"].clone(), labels["chip_name"].clone()))
        .collect();
    for gpu in &host.inventory.gpus {
        // The exporter names a chip after its device path, cleaned for Prometheus.
        let suffix = format!("_{}", gpu.bdf.replace('.', "_"));
        let chip: Vec<&(String, String)> =
            chips.iter().filter(|(c, _)| c.ends_with(&suffix)).collect();
        assert_eq!(chip.len(), 1, "one hwmon chip for {}: {chips:?}", gpu.bdf);
        let (chip, name) = chip[0];
        assert_eq!(name, "amdgpu", "{chip}");
        let ours = &host.sample.gpus[&gpu.bdf].temperature;
        for (label, value) in [
            ("edge", ours.edge_c),
            ("junction", ours.junction_c),
            ("mem", ours.memory_c),
        ] {
            let value = value.unwrap_or_else(|| panic!("we read the {label} temperature"));
            let theirs = hwmon_temperature(&metrics, chip, label);
            assert!(
                same_float(theirs, Some(value)),
                "{} {label} temperature: the exporter says {theirs:?}, we read {value}",
                gpu.bdf
            );
        }
        let crit = metrics.value(
            "node_hwmon_temp_crit_celsius",
            &[
                ("chip", chip),
                ("sensor", &sensor_of(&metrics, chip, "junction")),
            ],
        );
        assert!(
            same_float(crit, ours.junction_crit_c),
            "{} junction critical temperature: the exporter says {crit:?}, we read {:?}",
            gpu.bdf,
            ours.junction_crit_c
        );
    }
    assert_eq!(chips.len(), host.inventory.gpus.len(), "{chips:?}");
    reported.intersection(&gpu_cards).cloned().collect()
}

/// The sensor (`temp2`) that carries `label`: the exporter either names the
/// sensor after its label or reports the label in `node_hwmon_sensor_label`.
fn sensor_of(metrics: &Metrics, chip: &str, label: &str) -> String {
    metrics
        .series("node_hwmon_sensor_label")
        .iter()
        .find(|(l, _)| l["chip"] == chip && l["label"] == label)
        .map_or_else(|| label.to_owned(), |(l, _)| l["sensor"].clone())
}

fn hwmon_temperature(metrics: &Metrics, chip: &str, label: &str) -> Option<f64> {
    let sensor = sensor_of(metrics, chip, label);
    metrics.value(
        "node_hwmon_temp_celsius",
        &[("chip", chip), ("sensor", &sensor)],
    )
}

#[test]
fn node_exporter_reports_every_card_of_an_eight_gpu_mi210_host() {
    let Some(binary) = NODE_EXPORTER.find() else {
        return;
    };
    let host = simulated("mi210", Some(8), None);
    assert_eq!(host.inventory.gpus.len(), 8);
    let reported = check(&binary, &host);
    // All eight cards are within the collector's one-digit glob: every one.
    assert_eq!(reported.len(), 8, "{reported:?}");
}

#[test]
fn node_exporter_reads_an_mi300x_host() {
    let Some(binary) = NODE_EXPORTER.find() else {
        return;
    };
    // Two MI300X GPUs: card0 and card8 (each GPU reserves eight DRM minors).
    let host = simulated("mi300x", Some(2), None);
    let reported = check(&binary, &host);
    assert_eq!(
        reported,
        BTreeSet::from(["card0".to_owned(), "card8".to_owned()])
    );
}

#[test]
fn node_exporter_reads_a_partitioned_mi300x_host() {
    let Some(binary) = NODE_EXPORTER.find() else {
        return;
    };
    // CPX: cards 1-7 belong to partitions on driverless platform devices, which
    // the collector must pass over without failing; the GPUs' own cards remain.
    let host = simulated("mi300x", Some(2), Some("cpx_nps4"));
    let reported = check(&binary, &host);
    assert_eq!(
        reported,
        BTreeSet::from(["card0".to_owned(), "card8".to_owned()])
    );
}

#[test]
fn node_exporter_reads_every_hwmon_of_an_eight_gpu_mi300x_host() {
    let Some(binary) = NODE_EXPORTER.find() else {
        return;
    };
    // Cards card16..card56 are outside the drm collector's one-digit glob
    // (`class/drm/card[0-9]`), as on a real host with these numbers; hwmon has
    // no such limit, so all eight GPUs' temperatures must be there.
    let host = simulated("mi300x", None, None);
    assert_eq!(host.inventory.gpus.len(), 8);
    let reported = check(&binary, &host);
    assert_eq!(
        reported,
        BTreeSet::from(["card0".to_owned(), "card8".to_owned()])
    );
}
