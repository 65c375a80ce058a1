//! Metrics exporter figures on a simulated MI300X in CPX/NPS4 mode (8 GPUs, 64
//! partitions), printed as a table:
//!
//! - scrape latency (p50/p99/max) of `GET /metrics` over one keep-alive
//!   connection and over a new connection per scrape, with sampling running at
//!   a 100 ms interval in the background (goal: p99 < 2 ms);
//! - the same with a hung sysfs file (a read that never returns);
//! - duration of one full sample and one rendering, and the exposition size.
//!
//! Run with `cargo bench --bench metrics`. A bench binary rather than criterion:
//! the goal is a percentile of a latency distribution, which criterion does not
//! report.

#[path = "support/figures.rs"]
mod figures;

use figures::{scratch, summary};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::device::discover;
use gpu_operator::health::{HealthConfig, HealthMonitor, HealthSnapshot};
use gpu_operator::host::HostRoot;
use gpu_operator::host::reader::BoundedReader;
use gpu_operator::metrics::render::{self, RenderInput};
use gpu_operator::metrics::{MetricsConfig, MetricsService};
use gpu_operator::service::Slot;
use gpu_operator::simulate::{self, SimSpec};
use gpu_operator::telemetry::config::ExporterConfig;
use gpu_operator::telemetry::sample::{Sampler, Scope};
use tokio::sync::watch;

const SCRAPES: usize = 2000;

/// One HTTP/1.1 request on an open connection; returns the body length.
fn get(reader: &mut BufReader<TcpStream>, path: &str) -> usize {
    write!(
        reader.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n"
    )
    .unwrap();
    let mut length = None;
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok();
        }
    }
    let length = length.expect("content-length");
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    length
}

fn scrape_keepalive(addr: SocketAddr, n: usize) -> (Vec<Duration>, usize) {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(stream);
    let mut size = 0;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        size = get(&mut reader, "/metrics");
        times.push(started.elapsed());
    }
    (times, size)
}

fn scrape_new_connections(addr: SocketAddr, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let started = Instant::now();
            let stream = TcpStream::connect(addr).unwrap();
            stream.set_nodelay(true).unwrap();
            get(&mut BufReader::new(stream), "/metrics");
            started.elapsed()
        })
        .collect()
}

fn row(what: &str, (p50, p99, max): (f64, f64, f64)) {
    println!("| {what} | {p50:.3} | {p99:.3} | {max:.3} |");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = scratch();
        let host = HostRoot::new(dir.path().join("host"));
        let spec = SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap();
        simulate::write_host(&host, &spec).unwrap();
        let inventory = Arc::new(discover(&host));
        println!(
            "simulated mi300x cpx_nps4: {} GPUs, {} partitions",
            inventory.gpus.len(),
            inventory
                .gpus
                .iter()
                .map(|g| g.partitions.len())
                .sum::<usize>()
        );

        // Sample and render costs, measured directly.
        let mut sampler = Sampler::new(
            BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
            Duration::from_millis(500),
        );
        let mut sample_times = Vec::new();
        let mut sample = sampler.sample(&inventory, Scope::Full).await;
        for _ in 0..50 {
            let started = Instant::now();
            sample = sampler.sample(&inventory, Scope::Full).await;
            sample_times.push(started.elapsed());
        }
        let mut health_times = Vec::new();
        for _ in 0..50 {
            let started = Instant::now();
            sampler.sample(&inventory, Scope::Health).await;
            health_times.push(started.elapsed());
        }
        let config = ExporterConfig::default();
        let pods = Default::default();
        let health = HealthSnapshot::default();
        let input = RenderInput {
            inventory: &inventory,
            sample: &sample,
            pods: &pods,
            health: Some(&health),
            config: &config,
            hostname: "bench",
            shared_gpus: false,
        };
        let mut render_times = Vec::new();
        let mut size = 0;
        for _ in 0..200 {
            let started = Instant::now();
            size = render::encode(render::families(&input)).len();
            render_times.push(started.elapsed());
        }

        // The service, scraped over HTTP while it samples every 100 ms.
        let (_inventory_tx, inventory_rx) = watch::channel(inventory.clone());
        let monitor = HealthMonitor::new(inventory_rx.clone());
        let snapshot = monitor.snapshot();
        let mut health_slot = Slot::new(monitor);
        health_slot
            .apply(Some(HealthConfig::new(host.clone())))
            .await;
        let service = MetricsService::new(inventory_rx, Some(snapshot));
        let mut status = service.status();
        let mut slot = Slot::new(service);
        slot.apply(Some(MetricsConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            interval: Duration::from_millis(100),
            ..MetricsConfig::new(host.clone(), "bench")
        }))
        .await;
        let addr = status
            .wait_for(|s| s.samples > 1)
            .await
            .unwrap()
            .listening
            .unwrap();
        let series = status.borrow().series;
        let advancing = {
            let host = host.clone();
            let spec = spec.clone();
            tokio::spawn(async move {
                for tick in 1.. {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = simulate::advance_telemetry(&host, &spec, tick);
                }
            })
        };
        let (keepalive, body) =
            tokio::task::spawn_blocking(move || scrape_keepalive(addr, SCRAPES))
                .await
                .unwrap();
        let fresh = tokio::task::spawn_blocking(move || scrape_new_connections(addr, SCRAPES / 4))
            .await
            .unwrap();

        let hung = "/sys/devices/pci0000:00/0000:05:00.0/current_link_speed";
        simulate::hang_file(&host, hung).unwrap();
        let target = status.borrow().samples + 5;
        status.wait_for(|s| s.samples >= target).await.unwrap();
        let hung_sample_ms = status.borrow().last_sample_ms.unwrap_or_default();
        let (hung_keepalive, _) =
            tokio::task::spawn_blocking(move || scrape_keepalive(addr, SCRAPES))
                .await
                .unwrap();
        simulate::release_hung_file(&host, hung, "32.0 GT/s PCIe").unwrap();
        advancing.abort();

        println!(
            "exposition: {body} bytes served, {series} GPU series (standalone render: {size} bytes)"
        );
        println!();
        println!("| what (ms) | p50 | p99 | max |");
        println!("|---|---|---|---|");
        row("scrape, keep-alive connection", summary(keepalive));
        row("scrape, new connection each", summary(fresh));
        row(
            "scrape, keep-alive, one sysfs file hung",
            summary(hung_keepalive),
        );
        row("full sample, 8 GPUs / 64 partitions", summary(sample_times));
        row(
            "health sample, 8 GPUs / 64 partitions",
            summary(health_times),
        );
        row("render (families + text encoding)", summary(render_times));
        println!(
            "\nfull sample with the hung file (service's last sample): {hung_sample_ms:.1} ms"
        );
        slot.stop().await;
        health_slot.stop().await;
    });
}
