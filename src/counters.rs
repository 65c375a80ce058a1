//! Process-wide event counters that code in any module increments and the
//! metrics exporter reads: reconciles and failed Kubernetes API requests.
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

use std::sync::atomic::{AtomicU64, Ordering};

static RECONCILES: AtomicU64 = AtomicU64::new(0);
static API_ERRORS: AtomicU64 = AtomicU64::new(0);

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
