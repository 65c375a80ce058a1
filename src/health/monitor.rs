//! The running monitor: samples the health-relevant files at a short interval,
//! runs the checks, damps, and publishes the results on its channels.
//!
//! Samples are taken every `interval` while every GPU's state is settled, and
//! every `confirm_interval` while a sample disagrees with a GPU's state and
//! the damping has not decided yet ([`next_sample_at`]; HAProxy's `fastinter`
//! works the same way). So a problem costs one interval to be seen and one
//! short confirmation to be believed, while an idle node is read at the slow
//! rate. The settled samples fall on the process's grid of `interval`
//! ([`alarm::next_on_grid`]), where discovery's and the exporter's ticks
//! fall too, and wait on an [`Alarm`]: on an idle node one wake-up of the
//! runtime serves them all.
//!
//! [`MonitorState::step`] is the pure core (sample in, snapshot and transitions
//! out); [`HealthMonitor`] is the supervised service around it. The channels
//! belong to the [`HealthMonitor`] value, not to a run, so receivers handed out
//! once stay valid across restarts and reconfigurations.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::checks::{Thresholds, evaluate};
use super::damping::{Damping, Step, Tracker};
use super::nodes::NodeWatch;
use super::outputs::health_report;
use super::{GpuHealth, HealthSnapshot, HealthTransition};
use crate::api::agent_status::ServiceName;
use crate::device::Inventory;
use crate::host::HostRoot;
use crate::host::alarm::{self, Alarm};
use crate::host::reader::BoundedReader;
use crate::plugin::HealthReport;
use crate::service::{Readiness, Service, ServiceFuture};
use crate::telemetry::config::parse_config;
use crate::telemetry::devices::logical_gpus;
use crate::telemetry::sample::{HostSample, Sampler, Scope};

/// Configuration of the health monitor.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthConfig {
    pub host: HostRoot,
    /// Time between samples while every GPU's state is settled.
    pub interval: Duration,
    /// Time between samples while a GPU's state is being confirmed (capped
    /// at `interval`).
    pub confirm_interval: Duration,
    /// Deadline of each file read; a file that misses it counts as unknown.
    pub file_timeout: Duration,
    pub damping: Damping,
    /// The exporter's `config.json` text, for `HealthThresholds`. A text that
    /// does not parse is reported and the last good thresholds stay in force.
    pub exporter_config: Option<String>,
    /// Check that PCIe links run at full width and speed.
    pub check_pcie_link: bool,
    /// Why verdicts are held, if they are: the node's own partition change
    /// is being written, during which the GPUs' files and device nodes go
    /// and come back on purpose. No sample is taken and the last verdicts
    /// stand; when the hold ends, the GPUs the node has then are the new
    /// baseline for "missing".
    pub hold: Option<String>,
}

impl HealthConfig {
    /// With [`HealthConfig::DEFAULT_CONFIRM_INTERVAL`] and the default damping
    /// (two samples), a problem is reported within about 0.6 s.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
    pub const DEFAULT_CONFIRM_INTERVAL: Duration = Duration::from_millis(100);
    pub const DEFAULT_FILE_TIMEOUT: Duration = Duration::from_millis(200);

    pub fn new(host: HostRoot) -> Self {
        Self {
            host,
            interval: Self::DEFAULT_INTERVAL,
            confirm_interval: Self::DEFAULT_CONFIRM_INTERVAL,
            file_timeout: Self::DEFAULT_FILE_TIMEOUT,
            damping: Damping::default(),
            exporter_config: None,
            check_pcie_link: true,
            hold: None,
        }
    }
}

/// Health over time of every GPU seen.
#[derive(Clone, Debug, Default)]
pub struct MonitorState {
    trackers: BTreeMap<String, Tracker>,
    /// Every GPU seen since start: the baseline for "missing".
    seen: BTreeSet<String>,
    /// Logical GPU ids, as last seen in the inventory.
    ids: BTreeMap<String, Vec<u32>>,
}

/// When the sample after one that started at `started` is due: `confirm`
/// (at most `interval`) after it while a GPU's state is being confirmed,
/// else the next point of the grid of `interval`, at most `interval` after
/// it. A sample that overran that time is followed at once.
pub fn next_sample_at(
    started: tokio::time::Instant,
    interval: Duration,
    confirm: Duration,
    confirming: bool,
) -> tokio::time::Instant {
    if confirming {
        started + confirm.min(interval)
    } else {
        alarm::next_on_grid(started, interval)
    }
}

impl MonitorState {
    /// Whether some GPU's latest samples disagree with its state and the
    /// damping has not decided yet.
    pub fn confirming(&self) -> bool {
        self.trackers.values().any(Tracker::confirming)
    }

    /// Takes the GPUs `inventory` has as the baseline for "missing", after
    /// a change of layout the node made on purpose (a partition change):
    /// GPUs gone with it are forgotten, not reported missing.
    pub fn rebaseline(&mut self, inventory: &Inventory) {
        let now: BTreeSet<String> = inventory.gpus.iter().map(|g| g.bdf.clone()).collect();
        self.trackers.retain(|bdf, _| now.contains(bdf));
        self.ids.retain(|bdf, _| now.contains(bdf));
        self.seen = now;
    }

    /// Feeds one sample. Returns the new snapshot and the GPUs that changed state.
    pub fn step(
        &mut self,
        inventory: &Inventory,
        sample: &HostSample,
        thresholds: &Thresholds,
        damping: &Damping,
    ) -> (HealthSnapshot, Vec<HealthTransition>) {
        self.seen
            .extend(inventory.gpus.iter().map(|g| g.bdf.clone()));
        let mut ids: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for l in logical_gpus(inventory) {
            ids.entry(l.bdf).or_default().push(l.gpu_id);
        }
        self.ids.extend(ids);
        let mut transitions = Vec::new();
        for (bdf, problems) in evaluate(inventory, sample, &self.seen, thresholds) {
            let tracker = self.trackers.entry(bdf.clone()).or_default();
            let step = tracker.observe(problems, damping);
            if matches!(step, Step::BecameHealthy | Step::BecameUnhealthy) {
                transitions.push(HealthTransition {
                    bdf: bdf.clone(),
                    healthy: tracker.healthy,
                    reasons: tracker.reasons.clone(),
                    gpu_ids: self.ids.get(&bdf).cloned().unwrap_or_default(),
                });
            }
        }
        (self.snapshot(), transitions)
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            gpus: self
                .trackers
                .iter()
                .map(|(bdf, t)| {
                    (
                        bdf.clone(),
                        GpuHealth {
                            healthy: t.healthy,
                            reasons: t.reasons.clone(),
                            gpu_ids: self.ids.get(bdf).cloned().unwrap_or_default(),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// One health sample of `inventory`'s GPUs. Device nodes and `/dev/kfd` are
/// watched rather than stat'ed every sample (see [`NodeWatch`]).
async fn take_sample(
    sampler: &mut Sampler,
    nodes: &mut NodeWatch,
    inventory: &Inventory,
    file_timeout: Duration,
) -> HostSample {
    let mut sample = sampler.sample(inventory, Scope::HealthWithoutNodes).await;
    nodes
        .status(sampler.reader(), inventory, file_timeout)
        .await
        .apply(inventory, &mut sample);
    sample
}

/// Checks every GPU once, without damping: what `gpu-operator check` reports.
/// `exporter_config` supplies `HealthThresholds` as the monitor would read them.
pub async fn check_once(
    host: &HostRoot,
    inventory: &Inventory,
    exporter_config: Option<&str>,
    file_timeout: Duration,
) -> Result<HealthSnapshot, crate::telemetry::ConfigError> {
    let limits = exporter_config
        .map(parse_config)
        .transpose()?
        .map(|c| c.health_thresholds)
        .unwrap_or_default();
    let thresholds = Thresholds {
        limits,
        pcie_link: true,
    };
    let mut sampler = Sampler::new(
        BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
        file_timeout,
    );
    let sample = sampler.sample(inventory, Scope::Health).await;
    let once = Damping {
        unhealthy_after: 1,
        healthy_after: 1,
    };
    let (snapshot, _) = MonitorState::default().step(inventory, &sample, &thresholds, &once);
    Ok(snapshot)
}

/// The health monitor service. Create it once, hand out its receivers, and let a
/// supervisor slot run it.
pub struct HealthMonitor {
    inventory: watch::Receiver<Arc<Inventory>>,
    report: watch::Sender<HealthReport>,
    snapshot: watch::Sender<Arc<HealthSnapshot>>,
    transitions: broadcast::Sender<HealthTransition>,
    config_error: watch::Sender<Option<String>>,
}

impl HealthMonitor {
    pub fn new(inventory: watch::Receiver<Arc<Inventory>>) -> Self {
        Self {
            inventory,
            report: watch::Sender::new(HealthReport::default()),
            snapshot: watch::Sender::new(Arc::new(HealthSnapshot::default())),
            transitions: broadcast::channel(256).0,
            config_error: watch::Sender::new(None),
        }
    }

    /// For the device plugin: devices of unhealthy GPUs, with reasons.
    pub fn report(&self) -> watch::Receiver<HealthReport> {
        self.report.subscribe()
    }

    /// Every GPU's state, for the metrics exporter and the Node.
    pub fn snapshot(&self) -> watch::Receiver<Arc<HealthSnapshot>> {
        self.snapshot.subscribe()
    }

    /// State changes as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<HealthTransition> {
        self.transitions.subscribe()
    }

    /// Why the last exporter config text was rejected, if it was.
    pub fn config_error(&self) -> watch::Receiver<Option<String>> {
        self.config_error.subscribe()
    }

    fn publish(&self, snapshot: HealthSnapshot, transitions: Vec<HealthTransition>) {
        for t in transitions {
            if t.healthy {
                tracing::info!(bdf = %t.bdf, "GPU healthy again");
            } else {
                tracing::warn!(bdf = %t.bdf, reasons = ?t.reasons, "GPU unhealthy");
            }
            // Nobody listening is fine.
            let _ = self.transitions.send(t);
        }
        let report = health_report(&snapshot);
        self.report.send_if_modified(|current| {
            let changed = *current != report;
            *current = report;
            changed
        });
        self.snapshot.send_if_modified(|current| {
            let changed = **current != snapshot;
            if changed {
                *current = Arc::new(snapshot);
            }
            changed
        });
    }

    /// Applies a config: returns the thresholds and the time between samples
    /// to use (the exporter config's `PollingRate`, else `interval`), keeping
    /// `last` when the exporter config text is bad.
    fn thresholds(
        &self,
        config: &HealthConfig,
        last: &(Thresholds, Duration),
    ) -> (Thresholds, Duration) {
        let (limits, interval) = match config.exporter_config.as_deref().map(parse_config) {
            None => (Default::default(), config.interval),
            Some(Ok(parsed)) => (
                parsed.health_thresholds,
                parsed.health_polling_rate.unwrap_or(config.interval),
            ),
            Some(Err(e)) => {
                let message = e.to_string();
                tracing::warn!(error = %message, "exporter config rejected; keeping the last good health thresholds");
                self.config_error.send_replace(Some(message));
                let thresholds = Thresholds {
                    pcie_link: config.check_pcie_link,
                    ..last.0.clone()
                };
                return (thresholds, last.1);
            }
        };
        self.config_error.send_replace(None);
        let thresholds = Thresholds {
            limits,
            pcie_link: config.check_pcie_link,
        };
        (thresholds, interval)
    }
}

impl Service for HealthMonitor {
    type Config = HealthConfig;

    fn name(&self) -> &'static str {
        ServiceName::HealthMonitor.as_str()
    }

    /// Available once the first verdict is published.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<HealthConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut current = config.borrow_and_update().clone();
            let mut applied = self.thresholds(&current, &(Thresholds::default(), current.interval));
            let mut sampler = Sampler::new(
                BoundedReader::new(current.host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
                current.file_timeout,
            );
            let mut nodes = NodeWatch::new(current.host.clone());
            let mut state = MonitorState::default();
            let mut alarm = Alarm::new();
            let mut next_sample = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    changed = config.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let next = config.borrow_and_update().clone();
                        if next.host != current.host || next.file_timeout != current.file_timeout {
                            sampler = Sampler::new(
                                BoundedReader::new(next.host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
                                next.file_timeout,
                            );
                            nodes = NodeWatch::new(next.host.clone());
                        }
                        let next_applied = self.thresholds(&next, &applied);
                        if next_applied.1 != applied.1 {
                            next_sample = tokio::time::Instant::now();
                        }
                        if current.hold.is_some() && next.hold.is_none() {
                            // The layout the hold covered is the node's now.
                            state.rebaseline(&self.inventory.borrow());
                            next_sample = tokio::time::Instant::now();
                        } else if let (None, Some(why)) = (&current.hold, &next.hold) {
                            tracing::info!("health verdicts held: {why}");
                        }
                        applied = next_applied;
                        current = next;
                        continue;
                    }
                    _ = alarm.sleep_until(next_sample) => {}
                }
                let started = tokio::time::Instant::now();
                if current.hold.is_some() {
                    next_sample = alarm::next_on_grid(started, applied.1);
                    continue;
                }
                let inventory = self.inventory.borrow().clone();
                let sample =
                    take_sample(&mut sampler, &mut nodes, &inventory, current.file_timeout).await;
                let (snapshot, transitions) =
                    state.step(&inventory, &sample, &applied.0, &current.damping);
                self.publish(snapshot, transitions);
                readiness.available();
                // A sample that overran its slot is followed at once, not by
                // a burst of catch-up samples.
                next_sample = next_sample_at(
                    started,
                    applied.1,
                    current.confirm_interval,
                    state.confirming(),
                );
            }
            // Stopped: nothing vouches for the old verdicts any more; the device
            // plugin's own checks remain.
            self.report.send_replace(HealthReport::default());
            self.snapshot
                .send_replace(Arc::new(HealthSnapshot::default()));
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Gpu;

    #[test]
    fn after_a_layout_change_the_gpus_gone_with_it_are_not_missing() {
        use crate::telemetry::sample::HostSample;
        let both = inventory(&["0000:05:00.0", "0000:27:00.0"]);
        let one = inventory(&["0000:05:00.0"]);
        let (thresholds, damping) = (Thresholds::default(), Damping::default());
        let mut state = MonitorState::default();
        state.step(&both, &HostSample::default(), &thresholds, &damping);
        // Without a rebaseline the GPU gone counts as missing.
        let mut plain = state.clone();
        for _ in 0..3 {
            plain.step(&one, &HostSample::default(), &thresholds, &damping);
        }
        assert!(
            plain.snapshot().gpus.values().any(|g| !g.healthy),
            "{:?}",
            plain.snapshot()
        );
        state.rebaseline(&one);
        for _ in 0..3 {
            state.step(&one, &HostSample::default(), &thresholds, &damping);
        }
        let snapshot = state.snapshot();
        assert!(!snapshot.gpus.contains_key("0000:27:00.0"), "{snapshot:?}");
    }

    #[test]
    fn the_exporter_configs_polling_rate_sets_the_time_between_samples() {
        let monitor = HealthMonitor::new(watch::channel(Arc::new(Inventory::default())).1);
        let mut config = HealthConfig::new(HostRoot::new("/nonexistent"));
        let start = (Thresholds::default(), config.interval);
        assert_eq!(monitor.thresholds(&config, &start).1, config.interval);
        config.exporter_config =
            Some(r#"{"CommonConfig": {"HealthService": {"PollingRate": "2m"}}}"#.into());
        let applied = monitor.thresholds(&config, &start);
        assert_eq!(applied.1, Duration::from_secs(120));
        // Without a PollingRate the monitor's own interval applies.
        config.exporter_config = Some("{}".into());
        assert_eq!(monitor.thresholds(&config, &applied).1, config.interval);
        // A text that does not parse keeps the last good rate.
        config.exporter_config = Some("{ not json".into());
        assert_eq!(
            monitor.thresholds(&config, &applied).1,
            Duration::from_secs(120)
        );
    }
    use crate::telemetry::sample::GpuReadings;

    fn inventory(bdfs: &[&str]) -> Inventory {
        Inventory {
            gpus: bdfs
                .iter()
                .map(|b| Gpu {
                    bdf: (*b).into(),
                    ..Gpu::default()
                })
                .collect(),
            ..Inventory::default()
        }
    }

    fn sample(ue: u64) -> HostSample {
        let r = GpuReadings::bound_gpu("0000:05:00.0").with_ecc("umc", ue, 0);
        let mut s = HostSample {
            kfd_present: Some(true),
            ..HostSample::default()
        };
        s.gpus.insert(r.bdf.clone(), r);
        s
    }

    #[test]
    fn step_damps_and_reports_transitions() {
        let damping = Damping {
            unhealthy_after: 2,
            healthy_after: 1,
        };
        let thresholds = Thresholds::default();
        let inv = inventory(&["0000:05:00.0"]);
        let mut state = MonitorState::default();
        let (snap, t) = state.step(&inv, &sample(0), &thresholds, &damping);
        assert!(t.is_empty() && snap.gpus["0000:05:00.0"].healthy);
        assert_eq!(snap.gpus["0000:05:00.0"].gpu_ids, [0]);
        let (_, t) = state.step(&inv, &sample(1), &thresholds, &damping);
        assert!(t.is_empty(), "one bad sample is not enough");
        let (snap, t) = state.step(&inv, &sample(1), &thresholds, &damping);
        assert_eq!(t.len(), 1);
        assert!(!t[0].healthy);
        assert_eq!(t[0].gpu_ids, [0]);
        assert!(!snap.gpus["0000:05:00.0"].healthy);
        assert_eq!(
            health_report(&snap).unhealthy.len(),
            1,
            "the plugin hears of it"
        );
        let (snap, t) = state.step(&inv, &sample(0), &thresholds, &damping);
        assert!(t[0].healthy && snap.gpus["0000:05:00.0"].healthy);
    }

    #[test]
    fn samples_come_fast_only_while_a_state_change_is_being_confirmed() {
        let (slow, fast) = (Duration::from_millis(500), Duration::from_millis(100));
        let started = tokio::time::Instant::now();
        let settled = next_sample_at(started, slow, fast, false);
        assert!(settled > started && settled <= started + slow);
        assert_eq!(settled, alarm::next_on_grid(started, slow), "on the grid");
        assert_eq!(
            next_sample_at(settled, slow, fast, false),
            settled + slow,
            "every interval while settled"
        );
        assert_eq!(next_sample_at(started, slow, fast, true), started + fast);
        assert_eq!(
            next_sample_at(started, fast, slow, true),
            started + fast,
            "never slower than the interval"
        );

        let damping = Damping::default();
        let inv = inventory(&["0000:05:00.0"]);
        let mut state = MonitorState::default();
        state.step(&inv, &sample(0), &Thresholds::default(), &damping);
        assert!(!state.confirming(), "settled healthy");
        state.step(&inv, &sample(1), &Thresholds::default(), &damping);
        assert!(state.confirming(), "one bad sample wants a second look");
        state.step(&inv, &sample(1), &Thresholds::default(), &damping);
        assert!(!state.confirming(), "settled unhealthy");
        state.step(&inv, &sample(0), &Thresholds::default(), &damping);
        assert!(state.confirming(), "one good sample wants a second look");
    }

    /// A simulated MI300X host with two GPUs, its first inventory, and the
    /// monitor's sampling over it, as the running monitor samples (default
    /// thresholds and damping).
    struct SimRig {
        _dir: tempfile::TempDir,
        host: HostRoot,
        inventory: Inventory,
        sampler: Sampler,
        nodes: NodeWatch,
        state: MonitorState,
    }

    impl SimRig {
        /// The host in `layout`, sampled once: every GPU healthy.
        async fn new(layout: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let host = HostRoot::new(dir.path());
            let mut rig = Self {
                inventory: Inventory::default(),
                sampler: Sampler::new(
                    BoundedReader::new(host.clone(), 2),
                    HealthConfig::DEFAULT_FILE_TIMEOUT,
                ),
                nodes: NodeWatch::new(host.clone()),
                state: MonitorState::default(),
                host,
                _dir: dir,
            };
            rig.write(layout);
            rig.inventory = crate::device::discover(&rig.host);
            let (snapshot, _) = rig.step().await;
            assert_eq!(snapshot.unhealthy().count(), 0, "{snapshot:?}");
            rig
        }

        fn write(&self, layout: &str) {
            use crate::simulate::{self, SimSpec};
            let spec = SimSpec::new("mi300x", Some(2), Some(layout)).unwrap();
            simulate::write_host(&self.host, &spec).unwrap();
        }

        /// One sample of the host against `self.inventory`.
        async fn step(&mut self) -> (HealthSnapshot, Vec<HealthTransition>) {
            let sample = take_sample(
                &mut self.sampler,
                &mut self.nodes,
                &self.inventory,
                HealthConfig::DEFAULT_FILE_TIMEOUT,
            )
            .await;
            self.state.step(
                &self.inventory,
                &sample,
                &Thresholds::default(),
                &Damping::default(),
            )
        }
    }

    /// Right after a repartition the device watch still publishes the old
    /// layout (until its next look, up to a rescan interval later), while
    /// the old partitions' DRM nodes are already gone. That is the layout
    /// changing, not a fault: no sample of it may count against the GPU.
    #[tokio::test]
    async fn a_repartition_the_inventory_has_not_caught_up_with_is_not_a_fault() {
        let mut rig = SimRig::new("cpx_nps4").await;
        rig.write("spx_nps1");
        // Samples with the inventory of before, as many as damping needs
        // and more.
        for _ in 0..4 {
            let (snapshot, transitions) = rig.step().await;
            assert!(transitions.is_empty(), "{transitions:?}");
            assert_eq!(snapshot.unhealthy().count(), 0, "{snapshot:?}");
            assert!(!rig.state.confirming(), "a sample was bad: {snapshot:?}");
        }
        // Discovery catches up: the new layout is checked, and is fine.
        rig.inventory = crate::device::discover(&rig.host);
        assert!(rig.inventory.gpus.iter().all(|g| g.partitions.len() <= 1));
        for _ in 0..2 {
            let (snapshot, transitions) = rig.step().await;
            assert!(transitions.is_empty(), "{transitions:?}");
            assert_eq!(snapshot.unhealthy().count(), 0, "{snapshot:?}");
        }
    }

    /// A partition's DRM node gone while the GPU keeps its layout is a
    /// fault, shown after the usual two samples.
    #[tokio::test]
    async fn a_partitions_node_gone_without_a_repartition_is_still_a_fault() {
        let mut rig = SimRig::new("cpx_nps4").await;
        let gpu = rig.inventory.gpus[0].clone();
        let minor = gpu.partitions[1].render_minor.expect("a render node");
        let node = format!("/dev/dri/renderD{minor}");
        rig.host.remove_all(&node).unwrap();
        let mut transitions = Vec::new();
        for _ in 0..2 {
            transitions.extend(rig.step().await.1);
        }
        assert_eq!(transitions.len(), 1, "{transitions:?}");
        assert_eq!(transitions[0].bdf, gpu.bdf);
        assert_eq!(transitions[0].reasons, [format!("{node} does not exist")]);
    }

    #[test]
    fn a_vanished_gpu_stays_in_the_snapshot_as_unhealthy() {
        let damping = Damping {
            unhealthy_after: 1,
            healthy_after: 1,
        };
        let mut state = MonitorState::default();
        let both = inventory(&["0000:05:00.0", "0000:27:00.0"]);
        state.step(&both, &sample(0), &Thresholds::default(), &damping);
        let one = inventory(&["0000:05:00.0"]);
        let (snap, t) = state.step(&one, &sample(0), &Thresholds::default(), &damping);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].bdf, "0000:27:00.0");
        assert_eq!(t[0].gpu_ids, [1], "ids as last seen");
        assert!(snap.gpus["0000:27:00.0"].reasons[0].contains("missing"));
        let (snap, _) = state.step(&both, &sample(0), &Thresholds::default(), &damping);
        assert!(snap.gpus["0000:27:00.0"].healthy, "it came back");
    }
}
