//! The simulator rewrites telemetry while the sampler reads it, as the
//! standalone demo does every interval. Each rewrite must be atomic, as sysfs
//! reads are: a sample may see the old value or the new one, never an empty or
//! half-written file (which shows as `-` in the demo and drops a series from
//! `/metrics`).

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_operator::host::reader::BoundedReader;
use gpu_operator::simulate::{self, SimSpec};
use gpu_operator::telemetry::sample::{GpuReadings, Sampler, Scope};
use support::hosts::SimHost;

/// Microjoules the simulator adds to `energy1_input` per tick.
const ENERGY_PER_TICK_UJ: u64 = 150_000_000;
const MIN_SAMPLES: usize = 300;
const MIN_TICKS_SEEN: usize = 100;
const DEADLINE: Duration = Duration::from_secs(60);

/// Every value the simulator moves or writes, as the sampler reports it; the
/// names of those that are missing.
fn missing(gpu: &GpuReadings, scope: Scope) -> Vec<&'static str> {
    let mut checks: Vec<(&str, bool)> = vec![
        ("present", gpu.present == Some(true)),
        ("bound", gpu.bound == Some(true)),
        ("junction temperature", gpu.temperature.junction_c.is_some()),
        (
            "junction critical",
            gpu.temperature.junction_crit_c.is_some(),
        ),
        ("pcie speed", gpu.pcie.speed_gts.is_some()),
        ("pcie width", gpu.pcie.width.is_some()),
        (
            "ecc blocks",
            gpu.ecc.len()
                == SimSpec::new("mi300x", None, None)
                    .unwrap()
                    .profile
                    .model
                    .ras_blocks
                    .len(),
        ),
    ];
    if scope == Scope::Full {
        checks.extend([
            ("edge temperature", gpu.temperature.edge_c.is_some()),
            ("memory temperature", gpu.temperature.memory_c.is_some()),
            ("current power", gpu.power.current_w.is_some()),
            ("average power", gpu.power.average_w.is_some()),
            ("energy", gpu.power.energy_uj.is_some()),
            ("gfx activity", gpu.gfx_activity_pct.is_some()),
            ("umc activity", gpu.umc_activity_pct.is_some()),
            ("vram used", gpu.memory.vram_used.is_some()),
            ("visible vram used", gpu.memory.vis_vram_used.is_some()),
            ("gtt used", gpu.memory.gtt_used.is_some()),
            ("sclk", gpu.sclk_mhz.is_some()),
            ("mclk", gpu.mclk_mhz.is_some()),
        ]);
    }
    let mut out: Vec<&str> = checks
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| name)
        .collect();
    if !gpu.errors.is_empty() {
        out.push("(read errors)");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampler_never_sees_a_missing_value_while_the_simulator_ticks() {
    const GPUS: usize = 4;
    let sim = SimHost::with_gpus("mi300x", Some(GPUS), None);
    let spec = SimSpec::new("mi300x", Some(GPUS), None).unwrap();
    let inventory = sim.discover();
    assert_eq!(inventory.gpus.len(), GPUS);

    // Tick as fast as the simulator can, so that reads and rewrites overlap
    // often: far harsher than the demo's one tick per interval.
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (host, stop, ticks) = (sim.host.clone(), stop.clone(), ticks.clone());
        std::thread::spawn(move || {
            let mut tick = 1;
            while !stop.load(Ordering::Relaxed) {
                simulate::advance_telemetry(&host, &spec, tick).expect("telemetry advanced");
                ticks.store(tick, Ordering::Relaxed);
                tick += 1;
            }
        })
    };
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop = StopOnDrop(stop.clone());

    let mut sampler = Sampler::new(
        BoundedReader::new(sim.host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
        Duration::from_secs(5),
    );
    let started = Instant::now();
    let mut samples = 0;
    let mut ticks_seen = BTreeSet::new();
    let mut failures = Vec::new();
    while samples < MIN_SAMPLES || ticks_seen.len() < MIN_TICKS_SEEN {
        assert!(
            started.elapsed() < DEADLINE,
            "only {samples} samples and {} distinct ticks in {DEADLINE:?} (simulator at tick {})",
            ticks_seen.len(),
            ticks.load(Ordering::Relaxed)
        );
        // Mostly full samples (the exporter's), every fourth a health sample.
        let scope = if samples % 4 == 3 {
            Scope::Health
        } else {
            Scope::Full
        };
        let sample = sampler.sample(&inventory, scope).await;
        samples += 1;
        assert_eq!(sample.gpus.len(), GPUS, "every GPU is sampled");
        for (bdf, gpu) in &sample.gpus {
            let gone = missing(gpu, scope);
            if !gone.is_empty() {
                failures.push(format!(
                    "sample {samples} ({scope:?}) {bdf}: {gone:?} {:?}",
                    gpu.errors
                ));
            }
            if let Some(energy) = gpu.power.energy_uj {
                ticks_seen.insert(energy / ENERGY_PER_TICK_UJ);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    ticker.join().expect("ticker ran without error");
    assert!(
        failures.is_empty(),
        "{} of {samples} samples saw a missing value while the simulator ticked; first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    // The sampler saw the telemetry move, so reads and rewrites did overlap.
    assert!(ticks_seen.len() >= MIN_TICKS_SEEN);
}
