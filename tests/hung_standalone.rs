//! The standalone agent on a simulated host whose files hang (FIFOs made by
//! the simulator): it serves `/healthz` with a file hung from the start, keeps
//! running when another hangs mid-run, stops within 6 s of SIGTERM whatever
//! is blocked, and a 64 KiB `product_name` does not blow up the scrape. Every
//! hung file is released at the end.

use std::time::{Duration, Instant};

mod support;

use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use support::logged::{self, Logged};
use support::wait;

const DRIVER: &str = "/sys/bus/pci/drivers/amdgpu";

/// The agent, killed on drop, and the metrics address its log names.
struct Agent {
    process: Logged,
    addr: String,
}

impl Agent {
    fn start(dir: &std::path::Path, host: &HostRoot) -> Self {
        let config = dir.join("config.yaml");
        std::fs::write(&config, "metricsExporter: {enable: true}\n").unwrap();
        let process = Logged::start(
            logged::gpu_operator()
                .args(["standalone", "--metrics-bind", "127.0.0.1:0", "--host-root"])
                .arg(host.root())
                .arg("--config")
                .arg(&config)
                .arg("--kubelet-dir")
                .arg(dir.join("no-kubelet"))
                .arg("--events-file")
                .arg(dir.join("events.jsonl")),
        );
        let addr = process.metrics_address();
        Self { process, addr }
    }

    /// The next log line that `wanted` accepts (a timeout kills the agent, on drop).
    fn wait_line(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        self.process.wait_line(what, wanted)
    }

    /// SIGTERM, then the exit within `bound`.
    fn stop_within(&mut self, bound: Duration) {
        self.process.terminate_within(bound);
    }
}

fn simulated() -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    simulate::write_host(&host, &SimSpec::new("mi300x", Some(2), None).unwrap()).unwrap();
    (dir, host)
}

#[test]
fn standalone_serves_healthz_with_hung_files_and_stops_within_6_s() {
    let (dir, host) = simulated();
    let from_start = [
        format!("{DRIVER}/0000:05:00.0/product_name"),
        "/sys/class/kfd/kfd/topology/nodes/2/properties".to_owned(),
    ];
    for file in &from_start {
        simulate::hang_file(&host, file).unwrap();
    }
    let mut agent = Agent::start(dir.path(), &host);
    assert_eq!(support::http::get(&agent.addr, "/healthz").trim(), "ok");

    // A file that hangs mid-run: the watch goes on (its GPU changes, with
    // the problem) and /healthz still answers.
    let mid_run = format!("{DRIVER}/0000:27:00.0/current_compute_partition");
    simulate::hang_file(&host, &mid_run).unwrap();
    agent.wait_line("GPU change of 0000:27:00.0", |l| {
        l.contains("GPU change") && l.contains("0000:27:00.0")
    });
    assert_eq!(support::http::get(&agent.addr, "/healthz").trim(), "ok");
    agent.stop_within(Duration::from_secs(6));
    for file in from_start.iter().chain([&mid_run]) {
        simulate::release_hung_file(&host, file, "1").unwrap();
    }
}

#[test]
fn a_64_kib_product_name_keeps_the_scrape_small() {
    let (dir, host) = simulated();
    let long = "M".repeat(64 * 1024);
    host.write(format!("{DRIVER}/0000:05:00.0/product_name"), &long)
        .unwrap();
    let mut agent = Agent::start(dir.path(), &host);
    let scrape = wait::poll_until_blocking(
        "GPU metrics",
        || support::http::get(&agent.addr, "/metrics"),
        |scrape| scrape.contains("gpu_edge_temperature{"),
    );
    assert!(
        scrape.len() < 1024 * 1024,
        "scrape of {} bytes",
        scrape.len()
    );
    assert!(
        !scrape.contains(&"M".repeat(257)),
        "an unbounded label value"
    );
    agent.stop_within(Duration::from_secs(6));
}

/// Waits for the events file to hold a line with `reason`, and returns it.
fn wait_event(events: &std::path::Path, reason: &str) -> String {
    let text = wait::poll_until_blocking(
        &format!("a {reason} event"),
        || std::fs::read_to_string(events).unwrap_or_default(),
        |text| text.contains(&format!("\"reason\":\"{reason}\"")),
    );
    text.lines()
        .find(|l| l.contains(&format!("\"reason\":\"{reason}\"")))
        .unwrap()
        .to_owned()
}

#[test]
fn healthz_serves_before_a_first_scan_that_cannot_finish_and_readyz_says_discovering() {
    let (dir, host) = simulated();
    let hung = support::hosts::hang_past_the_scan_deadline(&host);
    let started = Instant::now();
    let mut agent = Agent::start(dir.path(), &host);
    let (status, body) = support::http::get_with_status(&agent.addr, "/healthz");
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body.trim(), "ok");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "/healthz answered only after {:?}, the scan deadline",
        started.elapsed()
    );
    let (status, body) = support::http::get_with_status(&agent.addr, "/readyz");
    assert!(status.contains(" 503 "), "{status}: {body}");
    assert_eq!(body.trim(), "discovering");

    // The scan that misses its deadline says so: log and event.
    agent.wait_line("discovery incomplete", |l| {
        l.contains("discovery incomplete")
    });
    let events = dir.path().join("events.jsonl");
    let incomplete = wait_event(&events, "DiscoveryIncomplete");
    assert!(incomplete.contains("deadline"), "{incomplete}");
    let (status, body) = support::http::get_with_status(&agent.addr, "/readyz");
    assert!(status.contains(" 503 "), "{status}: {body}");

    // Released, the next scan sees the whole host: ready, with GPU metrics.
    for file in &hung {
        simulate::release_hung_file(&host, file, "1").unwrap();
    }
    wait::poll_until_blocking(
        "ready",
        || support::http::get_with_status(&agent.addr, "/readyz"),
        |(status, _)| status.contains(" 200 "),
    );
    let scrape = support::http::get(&agent.addr, "/metrics");
    assert!(scrape.contains("gpu_edge_temperature{"), "{scrape}");
    wait_event(&events, "DiscoveryComplete");
    agent.stop_within(Duration::from_secs(6));
}
