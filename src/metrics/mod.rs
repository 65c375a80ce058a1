//! GPU metrics exporter: Prometheus metrics compatible with AMD's
//! device-metrics-exporter (names, labels, `config.json`), read from amdgpu sysfs.
//!
//! Endpoints on `metricsExporter.port` (default 5000): `/metrics`,
//! `/gpumetrics` (JSON), `/healthz`, `/readyz`. A background task samples every
//! GPU at an interval (default 5 s) through [`crate::telemetry`] (per-file
//! deadlines on threads of its own, so a hung sysfs file costs one value), asks
//! the kubelet which pod holds which device ([`crate::pod_resources`]) and
//! publishes the sample; it is rendered ([`render`]) once, ahead of the
//! scrapes while something scrapes and at the first scrape otherwise, so an
//! exporter nobody scrapes renders nothing. Nor does it sample at its interval
//! once nobody scraped for [`PRERENDER_AFTER_SCRAPE`] (or ever), unless the
//! sample also tells the health socket which pods hold the GPUs
//! ([`samples_on_tick`]): it samples when the next scrape asks, and that
//! scrape waits for the fresh sample (a few milliseconds; at most
//! [`server::FRESH_WAIT`]). Any other scrape never waits for sysfs.
//! The agent's own metrics ([`agent`]) are served too.
//!
//! Layout: sampling, `config.json`, the field catalogue and the logical GPU
//! numbering are in [`crate::telemetry`], shared with the health monitor; here
//! are [`render`] (series, text and JSON), [`server`] (HTTP), and
//! [`MetricsService`], which the agent supervises. The decisions are pure; I/O
//! is in the sampler, the PodResources client, `server` and the service loop.
//!
//! The endpoint bounds its connections ([`server::ConnectionLimits`], with the
//! descriptor budget of [`limits`]) and applies `rbacConfig` ([`access`]: TLS,
//! TokenReview and SubjectAccessReview, client certificates).
//!
//! This module must not decide GPU health (it shows [`crate::health`]'s verdict
//! as `gpu_health`) nor talk to the Kubernetes API, except for the two reviews
//! of [`access`] through the client the agent hands in: the agent watches the
//! ConfigMap and passes its `config.json` in [`MetricsConfig::config_text`], and
//! passes the Secret and ConfigMap `rbacConfig` names in
//! [`MetricsConfig::access`].

pub mod access;
pub mod agent;
#[cfg(test)]
mod compat_tests;
pub mod limits;
pub mod pod_metadata;
pub mod render;
pub mod server;
#[cfg(test)]
mod support_matrix_tests;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::MetricsExporterSpec;
use crate::api::agent_status::ServiceName;
use crate::device::Inventory;
use crate::device::watch::ScanState;
use crate::health::HealthSnapshot;
use crate::host::HostRoot;
use crate::host::alarm::Ticker;
use crate::host::reader::BoundedReader;
use crate::pod_resources::{self, DevicePods};
use crate::service::{Readiness, Service, ServiceError, ServiceFuture};
use crate::telemetry::config::{ExporterConfig, parse_config};
use crate::telemetry::sample::{HostSample, Sampler, Scope};
use crate::testrunner::stats::TestRunnerStats;
use pod_metadata::PodMetadataWatch;
use render::RenderInput;
use server::Published;

/// Configuration of the exporter service.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// Where to listen. Port 0 picks a free port; [`MetricsService::status`]
    /// tells which.
    pub listen: SocketAddr,
    /// Time between samples.
    pub interval: Duration,
    /// Deadline of each sysfs read.
    pub file_timeout: Duration,
    /// The ConfigMap's `config.json`; `None` for the defaults (every field).
    pub config_text: Option<String>,
    /// The `hostname` label: the Node name.
    pub hostname: String,
    /// The kubelet's PodResources socket; `None` for no pod labels.
    pub pod_resources_socket: Option<PathBuf>,
    pub host: HostRoot,
    /// Bounds on the endpoint's connections; they take effect when the
    /// listener is bound (at start, or when `listen` changes).
    pub limits: server::ConnectionLimits,
    /// `rbacConfig`: who may read the metrics, and over what.
    pub access: access::AccessPolicy,
    /// The device plugin shares the GPUs (time-slicing): `gpu_shared_pods`
    /// is exported.
    pub shared_gpus: bool,
}

impl MetricsConfig {
    pub const DEFAULT_PORT: u16 = 5000;
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
    pub const DEFAULT_FILE_TIMEOUT: Duration = Duration::from_millis(500);
    /// How long a PodResources `List` may take.
    pub const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(2);

    /// Defaults: all interfaces, port 5000, 5 s interval, no pod labels.
    pub fn new(host: HostRoot, hostname: impl Into<String>) -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, Self::DEFAULT_PORT)),
            interval: Self::DEFAULT_INTERVAL,
            file_timeout: Self::DEFAULT_FILE_TIMEOUT,
            config_text: None,
            hostname: hostname.into(),
            pod_resources_socket: None,
            host,
            limits: server::ConnectionLimits::default(),
            access: access::AccessPolicy::default(),
            shared_gpus: false,
        }
    }

    /// The configuration a DeviceConfig's `metricsExporter` asks for.
    /// `podResourceAPISocketPath` is the directory of the kubelet's socket; at
    /// its default it follows `kubelet_dir`, like the device plugin's socket
    /// directory does.
    pub fn for_spec(
        spec: &MetricsExporterSpec,
        host: HostRoot,
        hostname: impl Into<String>,
        kubelet_dir: &Path,
        config_text: Option<String>,
    ) -> Self {
        let port = u16::try_from(spec.port)
            .ok()
            .filter(|p| *p != 0)
            .unwrap_or(Self::DEFAULT_PORT);
        Self {
            listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
            config_text,
            pod_resources_socket: Some(crate::pod_resources::socket(
                &spec.pod_resource_api_socket_path,
                kubelet_dir,
            )),
            ..Self::new(host, hostname)
        }
    }
}

/// What the exporter is doing, for the agent's status and for tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExporterStatus {
    /// The bound address, once listening.
    pub listening: Option<SocketAddr>,
    /// Samples taken by the current run.
    pub samples: u64,
    pub last_sample_ms: Option<f64>,
    /// Why the latest config text was rejected (the last good one is in force).
    pub config_error: Option<String>,
    /// What the config in force asked for that is not supported.
    pub config_warnings: Vec<String>,
    /// The latest PodResources failure, cleared by the next success.
    pub pod_resources_error: Option<String>,
    /// Series in the latest GPU exposition.
    pub series: usize,
}

/// The exporter service. Create it once; a supervisor slot runs it with a
/// [`MetricsConfig`].
pub struct MetricsService {
    inventory: watch::Receiver<Arc<Inventory>>,
    health: Option<watch::Receiver<Arc<HealthSnapshot>>>,
    tests: Option<watch::Receiver<TestRunnerStats>>,
    /// The discovery watch's progress: nothing is sampled before its first
    /// complete scan, so that an empty inventory is never served as "no GPUs".
    discovery: Option<watch::Receiver<ScanState>>,
    status: watch::Sender<ExporterStatus>,
    /// What the endpoints serve, for in-process readers too.
    published: watch::Sender<Arc<Published>>,
    /// Which pod holds which device, as of the latest sample.
    pods: watch::Sender<Arc<DevicePods>>,
    /// The API server, for pod UIDs and labels (`POD_UUID`,
    /// `ExtraPodLabels`); `None` in standalone mode.
    kube: Option<kube::Client>,
}

impl MetricsService {
    /// `health` is the health monitor's snapshot; without it `gpu_health` is
    /// not exported.
    pub fn new(
        inventory: watch::Receiver<Arc<Inventory>>,
        health: Option<watch::Receiver<Arc<HealthSnapshot>>>,
    ) -> Self {
        Self {
            inventory,
            health,
            tests: None,
            discovery: None,
            status: watch::Sender::new(ExporterStatus::default()),
            published: watch::Sender::new(Arc::new(Published::default())),
            pods: watch::Sender::new(Arc::new(DevicePods::new())),
            kube: None,
        }
    }

    /// Read the UID and labels of this node's pods from the API server when
    /// the config asks for them (`POD_UUID`, `ExtraPodLabels`) and pods are
    /// looked up at all (a PodResources socket is configured).
    pub fn with_kube(mut self, client: kube::Client) -> Self {
        self.kube = Some(client);
        self
    }

    /// Also export the test runner's results (`gpu_operator_test_*`).
    pub fn with_test_stats(mut self, tests: watch::Receiver<TestRunnerStats>) -> Self {
        self.tests = Some(tests);
        self
    }

    /// Sample only once `discovery` has seen the whole host; until then the
    /// endpoint serves `/healthz` and `/readyz` answers `discovering`.
    pub fn with_discovery(mut self, discovery: watch::Receiver<ScanState>) -> Self {
        self.discovery = Some(discovery);
        self
    }

    pub fn status(&self) -> watch::Receiver<ExporterStatus> {
        self.status.subscribe()
    }

    /// What `/metrics` and `/gpumetrics` serve, as the endpoint has it: for a
    /// reader in the same process (`standalone --show-metrics`), which then
    /// needs neither a socket nor the endpoint's access control.
    pub fn published(&self) -> watch::Receiver<Arc<Published>> {
        self.published.subscribe()
    }

    /// Which pod holds which device, from the kubelet's PodResources API as
    /// of the latest sample (empty without a PodResources socket; the last
    /// known pods while the kubelet cannot be asked). For readers that name
    /// a GPU's workloads elsewhere (the health socket), so that the kubelet
    /// is asked once per sample, not once per reader.
    pub fn pods(&self) -> watch::Receiver<Arc<DevicePods>> {
        self.pods.subscribe()
    }

    fn discovered(&self) -> bool {
        self.discovery
            .as_ref()
            .is_none_or(|d| d.borrow().discovered)
    }
}

/// The configuration in force and what a new text does to it.
struct ConfigState {
    config: ExporterConfig,
    text: Option<String>,
    errors: u64,
    error: Option<String>,
}

impl ConfigState {
    fn new() -> Self {
        Self {
            config: ExporterConfig::default(),
            text: None,
            errors: 0,
            error: None,
        }
    }

    /// Applies a text; a bad one keeps the last good config and is remembered.
    fn apply(&mut self, text: Option<&str>) {
        if self.text.as_deref() == text && self.text.is_some() {
            return;
        }
        self.text = text.map(str::to_owned);
        match parse_config(text.unwrap_or_default()) {
            Ok(config) => {
                for warning in &config.warnings {
                    tracing::warn!(%warning, "exporter config");
                }
                self.config = config;
                self.error = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "exporter config rejected; keeping the last good one");
                self.errors += 1;
                self.error = Some(e.to_string());
            }
        }
    }
}

/// The latest inputs of a rendering.
#[derive(Default)]
struct Latest {
    inventory: Arc<Inventory>,
    sample: HostSample,
    pods: DevicePods,
    pod_errors: u64,
    pod_error: Option<String>,
    /// A kubelet serves PodResources here: the socket was there at this or
    /// an earlier sample (it answered, or failed to), or its directory is
    /// (a kubelet restarting makes the socket again). The sample then
    /// follows its pods, which the health socket reports.
    follows_pods: bool,
}

/// How long after a scrape each new sample is rendered ahead of the next
/// scrape. Longer than any usual scrape interval (Prometheus defaults to a
/// minute), so that a scraped exporter always serves a ready body; after it,
/// samples wait for a scrape to render them.
pub const PRERENDER_AFTER_SCRAPE: Duration = Duration::from_secs(300);

/// Whether a new sample is rendered before anyone asks: the first of a run
/// (which also tells the status its series), and every one while a scrape
/// came within [`PRERENDER_AFTER_SCRAPE`] (`since_scrape`). Pure.
pub fn renders_ahead(rendered_once: bool, since_scrape: Option<Duration>) -> bool {
    !rendered_once || since_scrape.is_some_and(|d| d < PRERENDER_AFTER_SCRAPE)
}

/// Whether the sampling task samples at its interval, rather than when a
/// scrape asks: while a scrape came within [`PRERENDER_AFTER_SCRAPE`]
/// (`since_scrape`), or while the sample also follows the kubelet's pods,
/// which the health socket reports (`follows_pods`: a kubelet serves
/// PodResources where the config says). An exporter nobody scrapes then costs
/// nothing between scrapes on a node without pods to follow. Pure.
pub fn samples_on_tick(since_scrape: Option<Duration>, follows_pods: bool) -> bool {
    follows_pods || since_scrape.is_some_and(|d| d < PRERENDER_AFTER_SCRAPE)
}

/// Everything one rendering needs, owned, so that a scrape can render it
/// after the sampling task moved on.
struct SampleExposition {
    latest: Arc<Latest>,
    health: Option<Arc<HealthSnapshot>>,
    config: ExporterConfig,
    config_reload_ok: bool,
    config_errors: u64,
    hostname: String,
    shared_gpus: bool,
    /// For the reader's counters at render time.
    reader: BoundedReader,
    tests: Option<watch::Receiver<TestRunnerStats>>,
    /// Where the series count of each rendering goes.
    status: watch::Sender<ExporterStatus>,
}

impl SampleExposition {
    fn input(&self) -> RenderInput<'_> {
        RenderInput {
            inventory: &self.latest.inventory,
            sample: &self.latest.sample,
            pods: &self.latest.pods,
            health: self.health.as_deref(),
            config: &self.config,
            hostname: &self.hostname,
            shared_gpus: self.shared_gpus,
        }
    }
}

impl server::Exposition for SampleExposition {
    fn metrics(&self) -> Bytes {
        let mut families = render::families(&self.input());
        let series = families.iter().map(|f| f.series.len()).sum();
        let me = agent::ExporterSelf {
            reader: self.reader.stats(),
            sample_seconds: self.latest.sample.duration_ms / 1000.0,
            config_reload_ok: self.config_reload_ok,
            config_errors: self.config_errors,
            pod_resources_errors: self.latest.pod_errors,
        };
        families.extend(agent::families(
            &agent::counters(),
            agent::process_stats().as_ref(),
            &me,
        ));
        families.extend(agent::endpoint_families(&agent::endpoint_connections()));
        families.extend(agent::upgrade_families(
            &crate::counters::upgrade_nodes(),
            &crate::counters::upgrade_steps(),
        ));
        if let Some(tests) = &self.tests {
            families.extend(agent::test_runner_families(&tests.borrow()));
        }
        let (remediations, histograms) = agent::remediation_families(
            &crate::counters::remediations(),
            &crate::counters::remediation_seconds(),
        );
        families.extend(remediations);
        self.status.send_if_modified(|s| {
            let changed = s.series != series;
            s.series = series;
            changed
        });
        Bytes::from(render::encode_with_histograms(families, histograms))
    }

    fn json(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(&render::json_view(&self.input())).unwrap_or_default())
    }
}

impl MetricsService {
    /// The latest sample, to be rendered when first scraped.
    fn exposition(
        &self,
        latest: &Arc<Latest>,
        config: &ConfigState,
        current: &MetricsConfig,
        reader: &BoundedReader,
    ) -> SampleExposition {
        SampleExposition {
            latest: latest.clone(),
            health: self.health.as_ref().map(|h| h.borrow().clone()),
            config: config.config.clone(),
            config_reload_ok: config.error.is_none(),
            config_errors: config.errors,
            hostname: current.hostname.clone(),
            shared_gpus: current.shared_gpus,
            reader: reader.clone(),
            tests: self.tests.clone(),
            status: self.status.clone(),
        }
    }
}

impl Service for MetricsService {
    type Config = MetricsConfig;

    fn name(&self) -> &'static str {
        ServiceName::MetricsExporter.as_str()
    }

    /// Available once the endpoint serves its first sample.
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<MetricsConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut current = config.borrow_and_update().clone();
            let published_tx = &self.published;
            published_tx.send_replace(Arc::new(Published::waiting(
                (!self.discovered()).then_some("discovering"),
            )));
            let published_rx = published_tx.subscribe();
            let mut server_stop = cancel.child_token();
            let (guard_tx, guard_rx) =
                watch::channel(Arc::new(access::Guard::build(&current.access)));
            let (addr, mut server) = server::serve(
                current.listen,
                published_rx.clone(),
                current.limits,
                guard_rx.clone(),
                server_stop.clone(),
            )
            .await
            .map_err(|e| ServiceError::new(format!("cannot listen on {}: {e}", current.listen)))?;
            tracing::info!(%addr, "metrics exporter listening");
            self.status.send_replace(ExporterStatus {
                listening: Some(addr),
                ..ExporterStatus::default()
            });
            let new_sampler = |c: &MetricsConfig| {
                Sampler::new(
                    BoundedReader::new(c.host.clone(), BoundedReader::DEFAULT_MAX_THREADS),
                    c.file_timeout,
                )
            };
            let mut sampler = new_sampler(&current);
            let mut exporter_config = ConfigState::new();
            let mut pod_metadata: Option<PodMetadataWatch> = None;
            let mut warned_no_api = false;
            exporter_config.apply(current.config_text.as_deref());
            let mut latest = Arc::new(Latest::default());
            let mut last_scraped: Option<tokio::time::Instant> = None;
            let mut rendered_once = false;
            let mut health = self.health.clone();
            // The first sample at once, then on the process's grid of the
            // interval, where the health monitor's and discovery's ticks
            // fall too: one wake-up of the runtime serves them all.
            let mut ticker = Ticker::starting_now(current.interval);
            let mut sampled = false;
            // A scrape's ask for a fresh sample, while sampling waits for one.
            let asks = Arc::new(tokio::sync::Notify::new());
            let mut discovery = self.discovery.clone();
            // A JoinHandle must not be awaited again once it has completed.
            let mut server_finished = false;
            let result = loop {
                let ticking = !sampled
                    || samples_on_tick(last_scraped.map(|at| at.elapsed()), latest.follows_pods);
                let discovered = self.discovered();
                let discovery_changed = async {
                    match discovery.as_mut() {
                        Some(d) if !discovered => d.changed().await.is_ok(),
                        _ => std::future::pending().await,
                    }
                };
                let health_changed = async {
                    match health.as_mut() {
                        Some(h) => h.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                let resample = tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    _ = &mut server => {
                        server_finished = true;
                        if cancel.is_cancelled() {
                            // Stopping: the server went first, as it may.
                            break Ok(());
                        }
                        break Err(ServiceError::new("the metrics HTTP server stopped"));
                    }
                    changed = config.changed() => {
                        if changed.is_err() {
                            break Ok(());
                        }
                        let next = config.borrow_and_update().clone();
                        if next.listen != current.listen {
                            server_stop.cancel();
                            server_stop = cancel.child_token();
                            let (addr, task) = match server::serve(next.listen, published_rx.clone(), next.limits, guard_rx.clone(), server_stop.clone()).await {
                                Ok(bound) => bound,
                                Err(e) => break Err(ServiceError::new(format!("cannot listen on {}: {e}", next.listen))),
                            };
                            server = task;
                            server_finished = false;
                            tracing::info!(%addr, "metrics exporter listening");
                            self.status.send_modify(|s| s.listening = Some(addr));
                        }
                        if next.access != current.access {
                            let guard = access::Guard::build(&next.access);
                            tracing::info!(?guard, "metrics endpoint access control");
                            guard_tx.send_replace(Arc::new(guard));
                        }
                        if next.host != current.host || next.file_timeout != current.file_timeout {
                            sampler = new_sampler(&next);
                        }
                        if next.interval != current.interval {
                            ticker = Ticker::starting_now(next.interval);
                        }
                        exporter_config.apply(next.config_text.as_deref());
                        // A new socket may change whether the sample
                        // follows pods, and so whether it waits for scrapes.
                        let resample = next.host != current.host
                            || next.pod_resources_socket != current.pod_resources_socket;
                        current = next;
                        resample
                    }
                    alive = discovery_changed => {
                        if !alive {
                            discovery = None;
                        }
                        false
                    }
                    alive = health_changed => {
                        if !alive {
                            // The monitor is gone: stop showing its last verdict.
                            health = None;
                        }
                        false
                    }
                    // A late tick is followed by the next point of the grid,
                    // not by a burst of catch-up ticks.
                    _ = ticker.tick(), if ticking => true,
                    () = asks.notified() => true,
                };
                if !self.discovered() {
                    published_tx.send_replace(Arc::new(Published::waiting(Some("discovering"))));
                    continue;
                }
                let did_sample = resample || !sampled;
                if did_sample {
                    let config = &exporter_config.config;
                    sampler.set_processes(
                        config.labels.contains("KFD_PROCESS_ID")
                            || config.exports("GPU_PROCESS_CU_OCCUPANCY"),
                    );
                    let wants_pod_metadata = current.pod_resources_socket.is_some()
                        && (config.labels.contains("POD_UUID")
                            || !config.extra_pod_labels.is_empty());
                    match (&self.kube, wants_pod_metadata) {
                        (Some(client), true) if pod_metadata.is_none() => {
                            pod_metadata =
                                Some(PodMetadataWatch::start(client.clone(), &current.hostname));
                        }
                        (None, true) if !warned_no_api => {
                            warned_no_api = true;
                            tracing::warn!(
                                "POD_UUID and ExtraPodLabels need the API server, which this \
                                 exporter has no client for; those labels stay empty"
                            );
                        }
                        (_, false) => pod_metadata = None,
                        _ => {}
                    }
                    // A new value rather than a change to the old one: the
                    // last exposition may still hold it, and cloning a whole
                    // sample to change it costs more than building the next.
                    latest = Arc::new(
                        self.sample(&mut sampler, &current, &latest, pod_metadata.as_ref())
                            .await,
                    );
                    self.pods.send_if_modified(|current| {
                        let changed = **current != latest.pods;
                        if changed {
                            *current = Arc::new(latest.pods.clone());
                        }
                        changed
                    });
                    sampled = true;
                }
                let published = Published::sample(self.exposition(
                    &latest,
                    &exporter_config,
                    &current,
                    sampler.reader(),
                ));
                if published_tx.borrow().served() {
                    last_scraped = Some(tokio::time::Instant::now());
                }
                let since_scrape = last_scraped.map(|at| at.elapsed());
                let published = if samples_on_tick(since_scrape, latest.follows_pods) {
                    published
                } else {
                    published.asking_through(asks.clone())
                };
                if renders_ahead(rendered_once, since_scrape) {
                    // The first rendering also tells the status its series.
                    published.prerender();
                    rendered_once = true;
                }
                published_tx.send_replace(Arc::new(published));
                readiness.available();
                self.status.send_modify(|s| {
                    s.samples += u64::from(did_sample);
                    s.last_sample_ms = Some(latest.sample.duration_ms);
                    s.config_error = exporter_config.error.clone();
                    s.config_warnings = exporter_config.config.warnings.clone();
                    s.pod_resources_error = latest.pod_error.clone();
                });
            };
            server_stop.cancel();
            if !server_finished {
                let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
            }
            self.status.send_modify(|s| s.listening = None);
            result
        })
    }
}

impl MetricsService {
    /// The next inputs of a rendering: a new sample, and the pods that hold
    /// each device (the `previous` ones while the kubelet cannot be asked).
    async fn sample(
        &self,
        sampler: &mut Sampler,
        config: &MetricsConfig,
        previous: &Latest,
        pod_metadata: Option<&PodMetadataWatch>,
    ) -> Latest {
        let inventory = self.inventory.borrow().clone();
        let pods = async {
            let Some(socket) = &config.pod_resources_socket else {
                return Ok(None);
            };
            pod_resources::list(socket, MetricsConfig::POD_RESOURCES_TIMEOUT).await
        };
        let xcp = crate::plugin::devices::xcp_names_of(&inventory);
        let (sample, pod_list) = tokio::join!(sampler.sample(&inventory, Scope::Full), pods);
        let follows_pods = previous.follows_pods
            || !matches!(pod_list, Ok(None))
            || config
                .pod_resources_socket
                .as_deref()
                .and_then(std::path::Path::parent)
                .is_some_and(std::path::Path::is_dir);
        let (pods, pod_errors, pod_error) = match pod_list {
            Ok(Some(list)) => {
                let ids = crate::telemetry::devices::device_ids(&inventory, &xcp);
                let mut pods = pod_resources::assign(&list, &ids);
                if let Some(metadata) = pod_metadata {
                    pod_metadata::enrich(&mut pods, &metadata.current());
                }
                (pods, previous.pod_errors, None)
            }
            Ok(None) => (BTreeMap::new(), previous.pod_errors, None),
            Err(e) => {
                // Keep the last known pods: a kubelet restart should not blank
                // every pod label for a scrape or two.
                tracing::warn!(error = %e, "cannot list pod resources");
                (
                    previous.pods.clone(),
                    previous.pod_errors + 1,
                    Some(e.to_string()),
                )
            }
        };
        Latest {
            inventory,
            sample,
            pods,
            pod_errors,
            pod_error,
            follows_pods,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_sets_port_and_pod_resources_socket() {
        let mut spec = MetricsExporterSpec::default();
        let host = HostRoot::new("/host");
        let config = MetricsConfig::for_spec(&spec, host.clone(), "n", Path::new("/k"), None);
        assert_eq!(config.listen.port(), 5000);
        assert_eq!(
            config.pod_resources_socket.as_deref(),
            Some(Path::new("/k/pod-resources/kubelet.sock")),
            "the default directory follows --kubelet-dir"
        );
        spec.port = 9400;
        spec.pod_resource_api_socket_path = "/custom/pr".into();
        let config =
            MetricsConfig::for_spec(&spec, host.clone(), "n", Path::new("/k"), Some("{}".into()));
        assert_eq!(config.listen.port(), 9400);
        assert_eq!(
            config.pod_resources_socket.as_deref(),
            Some(Path::new("/custom/pr/kubelet.sock"))
        );
        assert_eq!(config.config_text.as_deref(), Some("{}"));
        spec.port = 70000;
        let config = MetricsConfig::for_spec(&spec, host, "n", Path::new("/k"), None);
        assert_eq!(config.listen.port(), 5000, "out of range falls back");
    }

    #[test]
    fn samples_are_rendered_ahead_only_at_first_and_while_scraped() {
        assert!(renders_ahead(false, None), "the first sample");
        assert!(!renders_ahead(true, None), "never scraped");
        assert!(renders_ahead(true, Some(Duration::from_secs(60))));
        assert!(!renders_ahead(true, Some(PRERENDER_AFTER_SCRAPE)));
    }

    #[test]
    fn sampling_waits_for_a_scrape_only_when_nothing_else_reads_the_sample() {
        assert!(!samples_on_tick(None, false), "never scraped");
        assert!(samples_on_tick(Some(Duration::from_secs(60)), false));
        assert!(!samples_on_tick(Some(PRERENDER_AFTER_SCRAPE), false));
        assert!(samples_on_tick(None, true), "the pods follow the kubelet");
    }

    #[test]
    fn a_bad_config_text_keeps_the_last_good_config() {
        let mut state = ConfigState::new();
        state.apply(Some(r#"{"CommonConfig": {"MetricsFieldPrefix": "amd_"}}"#));
        assert_eq!(state.config.prefix, "amd_");
        state.apply(Some("{"));
        assert_eq!(state.config.prefix, "amd_");
        assert!(state.error.is_some());
        state.apply(Some("{"));
        assert_eq!(state.errors, 1, "the same bad text counts once");
        state.apply(None);
        assert_eq!(state.config, ExporterConfig::default());
        assert_eq!(state.error, None);
    }
}
