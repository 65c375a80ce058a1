//! Health monitor figures on a simulated MI300X in CPX/NPS4 mode (8 GPUs, 64
//! partitions), printed as a table:
//!
//! - detection latency: an uncorrectable ECC error written to sysfs (at a random
//!   moment relative to the sampling ticks) until the GPU is Unhealthy in the
//!   `HealthReport` the device plugin consumes (goal: under 1 s);
//! - recovery latency: errors cleared until the report is empty again;
//! - detection latency while another GPU's RAS file hangs.
//!
//! Defaults: a sample every 500 ms, one 100 ms after a sample that disagrees
//! with a GPU's state, two samples to change state. Run with
//! `cargo bench --bench health`.

#[path = "support/figures.rs"]
mod figures;

use figures::{scratch, summary};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::device::discover;
use gpu_operator::health::{HealthConfig, HealthMonitor};
use gpu_operator::host::HostRoot;
use gpu_operator::plugin::{DeviceRef, HealthReport};
use gpu_operator::service::Slot;
use gpu_operator::simulate::{self, SimSpec};
use tokio::sync::watch;

const ROUNDS: usize = 30;
const GPUS: [&str; 4] = [
    "0000:05:00.0",
    "0000:27:00.0",
    "0000:47:00.0",
    "0000:65:00.0",
];

async fn until(
    report: &mut watch::Receiver<HealthReport>,
    want: impl Fn(&HealthReport) -> bool,
) -> Duration {
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), report.wait_for(|r| want(r)))
        .await
        .expect("state reached within 10 s")
        .expect("monitor alive");
    started.elapsed()
}

/// A pseudo-random delay within the default sampling interval, so that
/// injections land at every phase of it.
fn jitter(round: usize) -> Duration {
    let interval = HealthConfig::DEFAULT_INTERVAL.as_millis() as u64;
    Duration::from_millis(((round as u64).wrapping_mul(2_654_435_761) >> 7) % interval)
}

async fn rounds(
    host: &HostRoot,
    report: &mut watch::Receiver<HealthReport>,
    skip: Option<&str>,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut detect, mut recover) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let gpu = GPUS[round % GPUS.len()];
        if Some(gpu) == skip {
            continue;
        }
        tokio::time::sleep(jitter(round)).await;
        simulate::set_ecc_counts(host, gpu, "umc", 1, 0).unwrap();
        detect.push(until(report, |r| r.unhealthy.contains_key(&DeviceRef::gpu(gpu))).await);
        tokio::time::sleep(jitter(round + 7)).await;
        simulate::set_ecc_counts(host, gpu, "umc", 0, 0).unwrap();
        recover.push(until(report, |r| r.unhealthy.is_empty()).await);
    }
    (detect, recover)
}

fn row(what: &str, (p50, p99, max): (f64, f64, f64)) {
    println!("| {what} | {p50:.1} | {p99:.1} | {max:.1} |");
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
        let (_tx, inventory) = watch::channel(Arc::new(discover(&host)));
        let monitor = HealthMonitor::new(inventory);
        let mut report = monitor.report();
        let mut snapshot = monitor.snapshot();
        let mut slot = Slot::new(monitor);
        slot.apply(Some(HealthConfig::new(host.clone()))).await;
        snapshot.wait_for(|s| s.gpus.len() == 8).await.unwrap();

        let (detect, recover) = rounds(&host, &mut report, None).await;

        let hung_gpu = GPUS[3];
        let hung = format!("/sys/devices/pci0000:00/{hung_gpu}/ras/umc_err_count");
        simulate::hang_file(&host, &hung).unwrap();
        let (hung_detect, _) = rounds(&host, &mut report, Some(hung_gpu)).await;
        simulate::release_hung_file(&host, &hung, "ue: 0\nce: 0").unwrap();

        println!("| what (ms) | p50 | p99 | max |");
        println!("|---|---|---|---|");
        row("ECC error -> Unhealthy in HealthReport", summary(detect));
        row("ECC cleared -> Healthy again", summary(recover));
        row(
            "ECC error -> Unhealthy, another GPU's RAS file hung",
            summary(hung_detect),
        );
        slot.stop().await;
    });
}
