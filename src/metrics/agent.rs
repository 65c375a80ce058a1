//! The agent's own metrics, served next to the GPU metrics: reconciles, API
//! errors, service restarts, sysfs reader health, and the standard process
//! metrics (`process_resident_memory_bytes`, `process_cpu_seconds_total`, ...).
//!
//! The counts themselves live below every module that counts: reconciles and
//! API errors in [`crate::counters`], service restarts in [`crate::service`],
//! untrusted discovery scans in [`crate::device::watch`]. This module only
//! reads and renders them.
//!
//! Like everything the exporter serves, these are rendered when it takes a
//! sample (and when GPU health changes), not on scrape: a scrape may be one
//! sampling interval behind. Process figures come from `/proc/self` (procfs).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::render::{Family, Series};
use crate::host::reader::ReaderStats;
use crate::service::SERVICE_RESTARTS;
use crate::telemetry::fields::Kind;
use crate::testrunner::report::Outcome;
use crate::testrunner::stats::{LastRun, TestRunnerStats};

static ENDPOINT_OPEN: AtomicU64 = AtomicU64::new(0);
static ENDPOINT_DISPLACED: AtomicU64 = AtomicU64::new(0);
static ENDPOINT_CAP: AtomicU64 = AtomicU64::new(0);

/// The metrics endpoint's connections, counted by [`super::server`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EndpointConnections {
    /// Open now.
    pub open: u64,
    /// Asked to close to make room for a new client over the cap.
    pub displaced: u64,
    /// The cap in force (0 before the endpoint listens).
    pub cap: u64,
}

pub(crate) fn record_connection_cap(cap: usize) {
    ENDPOINT_CAP.store(u64::try_from(cap).unwrap_or(u64::MAX), Ordering::Relaxed);
}

pub(crate) fn record_connection_opened() {
    ENDPOINT_OPEN.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_connection_closed() {
    // Never below zero, whatever the order of updates.
    let _ = ENDPOINT_OPEN.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        Some(n.saturating_sub(1))
    });
}

pub(crate) fn record_connection_displaced() {
    ENDPOINT_DISPLACED.fetch_add(1, Ordering::Relaxed);
}

pub fn endpoint_connections() -> EndpointConnections {
    EndpointConnections {
        open: ENDPOINT_OPEN.load(Ordering::Relaxed),
        displaced: ENDPOINT_DISPLACED.load(Ordering::Relaxed),
        cap: ENDPOINT_CAP.load(Ordering::Relaxed),
    }
}

/// The endpoint's connection families. Pure.
pub fn endpoint_families(c: &EndpointConnections) -> Vec<Family> {
    let one = |name: &str, help: &str, kind: Kind, value: u64| Family {
        name: name.to_owned(),
        help: help.to_owned(),
        kind,
        series: vec![Series {
            labels: Vec::new(),
            value: value as f64,
        }],
    };
    vec![
        one(
            "gpu_operator_metrics_connections",
            "Open connections to the metrics endpoint",
            Kind::Gauge,
            c.open,
        ),
        one(
            "gpu_operator_metrics_connections_max",
            "Connections the metrics endpoint serves at once (a quarter of RLIMIT_NOFILE at most)",
            Kind::Gauge,
            c.cap,
        ),
        one(
            "gpu_operator_metrics_connections_displaced_total",
            "Connections closed to make room for a new client over the cap",
            Kind::Counter,
            c.displaced,
        ),
    ]
}

/// The counters as they are now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub reconciles: u64,
    pub api_errors: u64,
    pub service_restarts: u64,
    /// Discovery scans that were not trusted (see [`crate::device::watch`]).
    pub discovery_incomplete: u64,
}

pub fn counters() -> Counters {
    Counters {
        reconciles: crate::counters::reconciles(),
        api_errors: crate::counters::api_errors(),
        service_restarts: SERVICE_RESTARTS.load(Ordering::Relaxed),
        discovery_incomplete: crate::device::watch::incomplete_scans(),
    }
}

/// This process, from `/proc/self`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProcessStats {
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
    pub threads: u64,
}

/// Reads [`ProcessStats`]; `None` where procfs is unavailable.
pub fn process_stats() -> Option<ProcessStats> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second().max(1) as f64;
    let boot = procfs::boot_time_secs().ok()? as f64;
    Some(ProcessStats {
        resident_memory_bytes: stat.rss.saturating_mul(procfs::page_size()),
        virtual_memory_bytes: stat.vsize,
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        start_time_seconds: boot + stat.starttime as f64 / ticks,
        threads: u64::try_from(stat.num_threads).unwrap_or(0),
    })
}

/// The exporter's view of itself, for the families below.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExporterSelf {
    pub reader: ReaderStats,
    /// Duration of the last sample, seconds.
    pub sample_seconds: f64,
    pub config_reload_ok: bool,
    pub config_errors: u64,
    pub pod_resources_errors: u64,
}

/// The agent's families. Pure.
pub fn families(
    counters: &Counters,
    process: Option<&ProcessStats>,
    me: &ExporterSelf,
) -> Vec<Family> {
    let one = |name: &str, help: &str, kind: Kind, value: f64| Family {
        name: name.to_owned(),
        help: help.to_owned(),
        kind,
        series: vec![Series {
            labels: Vec::new(),
            value,
        }],
    };
    let mut out = vec![
        one(
            "gpu_operator_reconciles_total",
            "Reconciles run by this agent",
            Kind::Counter,
            counters.reconciles as f64,
        ),
        one(
            "gpu_operator_api_errors_total",
            "Failed Kubernetes API requests",
            Kind::Counter,
            counters.api_errors as f64,
        ),
        one(
            "gpu_operator_service_restarts_total",
            "Restarts of failed node services",
            Kind::Counter,
            counters.service_restarts as f64,
        ),
        one(
            "gpu_operator_discovery_incomplete_total",
            "Discovery scans that missed their deadline or could not list the GPUs; the last inventory was kept",
            Kind::Counter,
            counters.discovery_incomplete as f64,
        ),
        one(
            "gpu_operator_sysfs_reads_total",
            "sysfs reads started by the exporter and the health monitor",
            Kind::Counter,
            me.reader.reads as f64,
        ),
        one(
            "gpu_operator_sysfs_read_timeouts_total",
            "sysfs reads that missed their deadline",
            Kind::Counter,
            me.reader.timeouts as f64,
        ),
        one(
            "gpu_operator_sysfs_reads_skipped_total",
            "sysfs reads skipped because an earlier read of the file was stuck",
            Kind::Counter,
            me.reader.skipped_stuck as f64,
        ),
        one(
            "gpu_operator_sysfs_reader_threads",
            "Threads of the sysfs reader, including those parked on hung files",
            Kind::Gauge,
            me.reader.threads as f64,
        ),
        one(
            "gpu_operator_metrics_sample_duration_seconds",
            "Time the last GPU sample took",
            Kind::Gauge,
            me.sample_seconds,
        ),
        one(
            "gpu_operator_metrics_config_last_reload_successful",
            "Whether the last exporter config was accepted (1) or rejected (0)",
            Kind::Gauge,
            if me.config_reload_ok { 1.0 } else { 0.0 },
        ),
        one(
            "gpu_operator_metrics_config_errors_total",
            "Exporter configs rejected",
            Kind::Counter,
            me.config_errors as f64,
        ),
        one(
            "gpu_operator_pod_resources_errors_total",
            "Failed calls to the kubelet PodResources API",
            Kind::Counter,
            me.pod_resources_errors as f64,
        ),
    ];
    if let Some(p) = process {
        out.extend([
            one(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                Kind::Gauge,
                p.resident_memory_bytes as f64,
            ),
            one(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Kind::Gauge,
                p.virtual_memory_bytes as f64,
            ),
            one(
                "process_cpu_seconds_total",
                "User and system CPU time spent, seconds",
                Kind::Counter,
                p.cpu_seconds,
            ),
            one(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, seconds",
                Kind::Gauge,
                p.start_time_seconds,
            ),
            one(
                "process_threads",
                "Number of OS threads in the process",
                Kind::Gauge,
                p.threads as f64,
            ),
        ]);
    }
    out
}

/// The leader's driver upgrade: nodes per state (over every DeviceConfig it
/// rolls; none while this process does not lead), and per step how many
/// ended and the seconds they took. Pure.
pub fn upgrade_families(
    nodes: &std::collections::BTreeMap<String, usize>,
    steps: &std::collections::BTreeMap<String, crate::counters::StepTotals>,
) -> Vec<Family> {
    let by = |label: &str, key: &str, value: f64| Series {
        labels: vec![(label.to_owned(), key.to_owned())],
        value,
    };
    let family = |name: &str, help: &str, kind: Kind, series: Vec<Series>| Family {
        name: name.to_owned(),
        help: help.to_owned(),
        kind,
        series,
    };
    vec![
        family(
            "gpu_operator_upgrade_nodes",
            "Nodes per driver upgrade state, on the leader (the reference's state names)",
            Kind::Gauge,
            nodes
                .iter()
                .map(|(state, n)| by("state", state, *n as f64))
                .collect(),
        ),
        family(
            "gpu_operator_upgrade_steps_total",
            "Driver upgrade steps that ended, by the state they left (Upgrade for whole upgrades)",
            Kind::Counter,
            steps
                .iter()
                .map(|(step, t)| by("step", step, t.count as f64))
                .collect(),
        ),
        family(
            "gpu_operator_upgrade_step_seconds_total",
            "Seconds the ended driver upgrade steps took, by step",
            Kind::Counter,
            steps
                .iter()
                .map(|(step, t)| by("step", step, t.seconds))
                .collect(),
        ),
    ]
}

/// The leader's remediations: runs started, succeeded and failed by
/// condition, and how long the successful ones took from start to release.
/// Pure.
pub fn remediation_families(
    counts: &std::collections::BTreeMap<(String, String), u64>,
    seconds: &crate::counters::Histogram,
) -> (Vec<Family>, Vec<super::render::HistogramFamily>) {
    let family = Family {
        name: "gpu_operator_remediations_total".to_owned(),
        help: "Node remediations by the condition that started them and result (started, succeeded, failed), on the leader".to_owned(),
        kind: Kind::Counter,
        series: counts
            .iter()
            .map(|((condition, result), n)| Series {
                labels: vec![
                    ("condition".to_owned(), condition.clone()),
                    ("result".to_owned(), result.clone()),
                ],
                value: *n as f64,
            })
            .collect(),
    };
    let histogram = super::render::HistogramFamily {
        name: "gpu_operator_remediation_seconds".to_owned(),
        help: "Seconds from a remediation's start (its condition seen True) to the node's release, of remediations that succeeded".to_owned(),
        buckets: crate::counters::REMEDIATION_BUCKETS
            .iter()
            .copied()
            .zip(seconds.buckets)
            .collect(),
        sum: seconds.sum,
        count: seconds.count,
    };
    (vec![family], vec![histogram])
}

/// The test runner's results: runs by trigger, recipe and result, the last
/// run of each trigger and recipe, the GPUs under test now and the queue.
pub fn test_runner_families(stats: &TestRunnerStats) -> Vec<Family> {
    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut labels: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        labels
    }
    let family = |name: &str, help: &str, kind: Kind, series: Vec<Series>| Family {
        name: name.to_owned(),
        help: help.to_owned(),
        kind,
        series,
    };
    let runs = stats
        .runs
        .iter()
        .map(|r| Series {
            labels: labels(&[
                ("trigger", &r.trigger.label_value()),
                ("recipe", &r.recipe),
                ("result", r.outcome.reason()),
            ]),
            value: r.count as f64,
        })
        .collect();
    let last = |value: fn(&LastRun) -> f64| {
        stats
            .last
            .iter()
            .map(|l| Series {
                labels: labels(&[("trigger", &l.trigger.label_value()), ("recipe", &l.recipe)]),
                value: value(l),
            })
            .collect()
    };
    let running = stats
        .running
        .iter()
        .map(|r| Series {
            labels: labels(&[
                ("gpu_id", &r.gpu_index.to_string()),
                ("trigger", &r.trigger.label_value()),
                ("recipe", &r.recipe),
            ]),
            value: 1.0,
        })
        .collect();
    vec![
        family(
            "gpu_operator_test_runs_total",
            "Finished GPU test cases by trigger, recipe and result (TestPassed, TestFailed, TestTimedOut)",
            Kind::Counter,
            runs,
        ),
        family(
            "gpu_operator_test_last_passed",
            "Whether the last run of a trigger and recipe passed (1) or not (0)",
            Kind::Gauge,
            last(|l| {
                if l.outcome == Outcome::Passed {
                    1.0
                } else {
                    0.0
                }
            }),
        ),
        family(
            "gpu_operator_test_last_duration_seconds",
            "Duration of the last run of a trigger and recipe",
            Kind::Gauge,
            last(|l| l.duration_seconds),
        ),
        family(
            "gpu_operator_test_last_finished_timestamp_seconds",
            "When the last run of a trigger and recipe finished, Unix time",
            Kind::Gauge,
            last(|l| l.finished_unix_seconds),
        ),
        family(
            "gpu_operator_test_running",
            "GPUs with a test case running now (1 per GPU)",
            Kind::Gauge,
            running,
        ),
        family(
            "gpu_operator_test_queued",
            "Test requests waiting for their GPUs",
            Kind::Gauge,
            vec![Series {
                labels: Vec::new(),
                value: stats.queued as f64,
            }],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::{record_api_error, record_reconcile};

    #[test]
    fn the_leaders_upgrade_counts_become_families() {
        let nodes: std::collections::BTreeMap<String, usize> = [
            ("Upgrade-Complete".to_owned(), 3),
            ("Drain-Failed".to_owned(), 1),
        ]
        .into();
        let steps: std::collections::BTreeMap<String, crate::counters::StepTotals> = [(
            "Upgrade-Started".to_owned(),
            crate::counters::StepTotals {
                count: 2,
                seconds: 30.5,
            },
        )]
        .into();
        let text = crate::metrics::render::encode(upgrade_families(&nodes, &steps));
        for line in [
            "gpu_operator_upgrade_nodes{state=\"Upgrade-Complete\"} 3.0",
            "gpu_operator_upgrade_nodes{state=\"Drain-Failed\"} 1.0",
            "gpu_operator_upgrade_steps_total{step=\"Upgrade-Started\"} 2.0",
            "gpu_operator_upgrade_step_seconds_total{step=\"Upgrade-Started\"} 30.5",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
        }
        // Not leading: no series, the families still described.
        let idle = crate::metrics::render::encode(upgrade_families(
            &Default::default(),
            &Default::default(),
        ));
        assert!(
            !idle
                .lines()
                .any(|l| l.starts_with("gpu_operator_upgrade_nodes{")),
            "{idle}"
        );
    }

    #[test]
    fn test_runner_results_become_families() {
        use crate::testrunner::config::Trigger;
        let mut stats = TestRunnerStats::default();
        let d = std::time::Duration::from_secs(3);
        stats.record(
            Trigger::Manual,
            "gst_single",
            Outcome::Passed,
            d,
            100.0,
            vec![0],
        );
        stats.record(
            Trigger::Manual,
            "gst_single",
            Outcome::Passed,
            d,
            110.0,
            vec![0],
        );
        stats.record(
            Trigger::Manual,
            "gst_single",
            Outcome::Failed,
            d,
            120.0,
            vec![1],
        );
        stats.queued = 2;
        let families = test_runner_families(&stats);
        let get = |name: &str| families.iter().find(|f| f.name == name).unwrap();
        let runs = get("gpu_operator_test_runs_total");
        let by_result: Vec<(String, f64)> = runs
            .series
            .iter()
            .map(|s| {
                let result = s.labels.iter().find(|(k, _)| k == "result").unwrap();
                (result.1.clone(), s.value)
            })
            .collect();
        assert!(
            by_result.contains(&("TestPassed".into(), 2.0)),
            "{by_result:?}"
        );
        assert!(
            by_result.contains(&("TestFailed".into(), 1.0)),
            "{by_result:?}"
        );
        let last = &get("gpu_operator_test_last_passed").series;
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].value, 0.0, "the last run failed");
        assert_eq!(
            get("gpu_operator_test_last_finished_timestamp_seconds").series[0].value,
            120.0
        );
        assert_eq!(get("gpu_operator_test_queued").series[0].value, 2.0);
        assert!(get("gpu_operator_test_running").series.is_empty());
        let text = crate::metrics::render::encode(families);
        assert!(text.contains("gpu_operator_test_runs_total{recipe=\"gst_single\",result=\"TestFailed\",trigger=\"manual\"} 1"), "{text}");
    }

    #[test]
    fn counters_count() {
        let before = counters();
        record_reconcile();
        record_reconcile();
        record_api_error();
        let after = counters();
        // Other tests may count concurrently: at least ours are there.
        assert!(after.reconciles >= before.reconciles + 2);
        assert!(after.api_errors > before.api_errors);
    }

    #[test]
    fn process_stats_are_plausible() {
        let p = process_stats().expect("procfs on Linux");
        assert!(p.resident_memory_bytes > 1 << 20, "{p:?}");
        assert!(p.threads >= 1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0);
    }

    #[test]
    fn families_include_process_metrics_when_known() {
        let counters = Counters {
            reconciles: 3,
            api_errors: 1,
            service_restarts: 2,
            discovery_incomplete: 0,
        };
        let me = ExporterSelf::default();
        let without = families(&counters, None, &me);
        let with = families(&counters, Some(&ProcessStats::default()), &me);
        assert_eq!(with.len(), without.len() + 5);
        let restarts = without
            .iter()
            .find(|f| f.name == "gpu_operator_service_restarts_total")
            .unwrap();
        assert_eq!(restarts.series[0].value, 2.0);
        assert_eq!(restarts.kind, Kind::Counter);
    }
}
