//! Process-wide event counters that code in any module increments and the
//! metrics exporter reads: reconciles and failed Kubernetes API requests;
//! and, while this process leads, the driver upgrade's nodes per state and
//! the time its steps took, and the remediations it started, ended and
//! their length.
//!
//! Counting is a relaxed atomic increment, so any code may count from anywhere
//! without depending on the exporter:
//!
//! ```
//! gpu_operator::counters::record_reconcile();
//! gpu_operator::counters::record_api_error();
//! ```
//!
//! This module owns the counts only. It sits at the bottom of the module order
//! and must not import any other module of this crate; rendering them is the
//! exporter's job (`metrics::agent`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

static RECONCILES: AtomicU64 = AtomicU64::new(0);
static API_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Nodes per upgrade state, per DeviceConfig (`namespace/name`).
static UPGRADE_NODES: Mutex<BTreeMap<String, BTreeMap<String, usize>>> =
    Mutex::new(BTreeMap::new());
/// Per upgrade step: how many ended, and their seconds in all.
static UPGRADE_STEPS: Mutex<BTreeMap<String, StepTotals>> = Mutex::new(BTreeMap::new());
/// Remediations per (condition, result): started, succeeded, failed.
static REMEDIATIONS: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());
/// Seconds from a remediation's start to its release, of those that succeeded.
static REMEDIATION_SECONDS: Mutex<Histogram> = Mutex::new(Histogram::new());

/// Upper bounds of [`remediation_seconds`]'s buckets: a minute to 12 hours.
pub const REMEDIATION_BUCKETS: [f64; 8] =
    [60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0];

/// A histogram over [`REMEDIATION_BUCKETS`]: per bucket the observations at
/// or below its bound (cumulative, as Prometheus counts them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Histogram {
    pub buckets: [u64; REMEDIATION_BUCKETS.len()],
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub const fn new() -> Self {
        Self {
            buckets: [0; REMEDIATION_BUCKETS.len()],
            count: 0,
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let value = value.max(0.0);
        for (bucket, bound) in self.buckets.iter_mut().zip(REMEDIATION_BUCKETS) {
            if value <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts one remediation of `condition` that `result` (started,
/// succeeded, failed); a success's length goes in the histogram.
pub fn record_remediation(condition: &str, result: &str, seconds: Option<f64>) {
    if let Ok(mut all) = REMEDIATIONS.lock() {
        *all.entry((condition.to_owned(), result.to_owned()))
            .or_default() += 1;
    }
    if let Some(seconds) = seconds
        && let Ok(mut histogram) = REMEDIATION_SECONDS.lock()
    {
        histogram.observe(seconds);
    }
}

/// The counts of [`record_remediation`], per (condition, result).
pub fn remediations() -> BTreeMap<(String, String), u64> {
    REMEDIATIONS.lock().map(|r| r.clone()).unwrap_or_default()
}

/// The lengths of the remediations that succeeded.
pub fn remediation_seconds() -> Histogram {
    REMEDIATION_SECONDS.lock().map(|h| *h).unwrap_or_default()
}

/// How many upgrade steps of one kind ended, and how long they took in all.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTotals {
    pub count: u64,
    pub seconds: f64,
}

/// Counts one reconcile (of the node agent or the cluster role).
pub fn record_reconcile() {
    RECONCILES.fetch_add(1, Ordering::Relaxed);
}

/// Counts one failed Kubernetes API request.
pub fn record_api_error() {
    API_ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// Reconciles counted since the process started.
pub fn reconciles() -> u64 {
    RECONCILES.load(Ordering::Relaxed)
}

/// Failed Kubernetes API requests counted since the process started.
pub fn api_errors() -> u64 {
    API_ERRORS.load(Ordering::Relaxed)
}

/// Sets how many nodes of DeviceConfig `config` are in each upgrade state
/// (an empty map forgets the DeviceConfig).
pub fn set_upgrade_nodes(config: &str, counts: BTreeMap<String, usize>) {
    if let Ok(mut all) = UPGRADE_NODES.lock() {
        if counts.is_empty() {
            all.remove(config);
        } else {
            all.insert(config.to_owned(), counts);
        }
    }
}

/// Forgets every count of [`set_upgrade_nodes`]: this process stopped
/// leading, and the next leader counts.
pub fn clear_upgrade_nodes() {
    if let Ok(mut all) = UPGRADE_NODES.lock() {
        all.clear();
    }
}

/// Nodes per upgrade state, over every DeviceConfig.
pub fn upgrade_nodes() -> BTreeMap<String, usize> {
    let mut sum = BTreeMap::new();
    if let Ok(all) = UPGRADE_NODES.lock() {
        for counts in all.values() {
            for (state, n) in counts {
                *sum.entry(state.clone()).or_default() += n;
            }
        }
    }
    sum
}

/// Counts one upgrade step of `step` (the state it left) that took `seconds`.
pub fn record_upgrade_step(step: &str, seconds: f64) {
    if let Ok(mut steps) = UPGRADE_STEPS.lock() {
        let totals = steps.entry(step.to_owned()).or_default();
        totals.count += 1;
        totals.seconds += seconds.max(0.0);
    }
}

/// The totals of [`record_upgrade_step`], per step.
pub fn upgrade_steps() -> BTreeMap<String, StepTotals> {
    UPGRADE_STEPS
        .lock()
        .map(|steps| steps.clone())
        .unwrap_or_default()
}
