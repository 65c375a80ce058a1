//! Standalone mode: the node services without Kubernetes, for bare metal under
//! systemd (or a one-command demo on a simulated host).
//!
//! The configuration is a DeviceConfig spec read from a file; the same services
//! run as under the Kubernetes agent ([`NodeServices`]), minus what needs the
//! API (node labels, Node conditions). The device plugin runs only where a
//! kubelet device-plugin directory exists. Events go to the log and, one JSON
//! object per line, to a local file ([`EventSink::file`]); the loop here makes
//! them from what the services hand over: health transitions, discovery
//! progress, the plugin's layout conflict, each finished test case, and what
//! the driver manager did about `driver.enable` (it loads amdgpu from the
//! host's bundle store as the Kubernetes agent does; with no leader, the
//! spec's `upgradePolicy` has nothing to roll and `driver.version` is
//! followed by hand: a running driver is replaced once nothing holds it).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::node_services::DiscoveryProgress;
use super::node_side::{self, NodeSide};
use super::select::{DesiredServices, NodeContext, plan_services};
use crate::api::{DeviceConfigSpec, parse_specs, validate};
use crate::events::{EventSink, EventType, NodeEvent};
use crate::health::outputs::transition_event;
use crate::host::HostRoot;
use crate::metrics::server::Published;
use crate::service::{Followers, ServiceState};
use crate::simulate::{self, SimSpec};
use crate::testrunner::report::Outcome;
use crate::testrunner::stats::LastRun;

#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error("config {path}: {message}")]
    Config { path: String, message: String },
    #[error("events file {path}: {source}")]
    Events {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The metrics endpoint cannot listen (the port is taken, say): nothing
    /// would ever answer the probes, so standalone mode does not start.
    #[error("the metrics endpoint {error}; choose another address with --metrics-bind")]
    MetricsListen { error: String },
}

/// Where standalone mode appends Events by default. The systemd unit's
/// LogsDirectory= must cover it: under ProtectSystem=strict nothing else is
/// writable.
pub const DEFAULT_EVENTS_FILE: &str = "/var/log/gpu-operator/events.jsonl";

#[derive(Clone, Debug)]
pub struct StandaloneConfig {
    pub host: HostRoot,
    pub spec: DeviceConfigSpec,
    /// The `hostname` label on metrics, the test runner's node name.
    pub node_name: String,
    pub kubelet_dir: PathBuf,
    /// Where Events are appended as JSON lines; `None` logs them only.
    pub events_file: Option<PathBuf>,
    /// Overrides `metricsExporter.port`.
    pub metrics_listen: Option<SocketAddr>,
    /// `config.json` texts for the exporter and the test runner.
    pub metrics_config: Option<String>,
    pub test_config: Option<String>,
    pub rescan_interval: Duration,
    /// Metrics and health sampling.
    pub sampling: super::select::Sampling,
    /// Move a simulated host's telemetry over time (demos).
    pub simulate: Option<SimSpec>,
    /// Where the test tools are (`--rvs`, `--agfhc`, …) and which programs
    /// COMMAND tests may start (`--allow-test-command`).
    pub test_commands: crate::testrunner::Commands,
    /// The driver bundle store and the commands that load from it, for a
    /// spec with `driver.enable`.
    pub driver: crate::driver::manager::ManagerConfig,
    /// The host path of the reference exporter's health socket
    /// ([`crate::metricssvc::DEFAULT_SOCKET`]); `None` serves none.
    pub health_socket: Option<PathBuf>,
}

/// The spec standalone mode uses without a config file: the metrics exporter
/// on, so that a bare host shows its GPUs, and a `devicePlugin` section with
/// the reference's defaults, so that the device plugin runs where a kubelet
/// device-plugin directory exists. (In a file, an absent `devicePlugin` means
/// no device plugin, as on Kubernetes.) No `driver` section: nothing is
/// installed.
pub fn default_spec() -> DeviceConfigSpec {
    let mut spec = DeviceConfigSpec::default();
    spec.metrics_exporter.enable = Some(true);
    spec.device_plugin = Some(Default::default());
    spec
}

/// Reads a standalone config file: one DeviceConfig, a document with just
/// `spec:`, or the bare spec. It must pass validation.
pub fn read_config(path: &Path) -> Result<DeviceConfigSpec, StandaloneError> {
    let error = |message: String| StandaloneError::Config {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let spec = parse_standalone(&text).map_err(error)?;
    let problems = validate(&spec);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(error(format!("invalid: {}", list.join("; "))));
    }
    Ok(spec)
}

/// Parses the text of a standalone config (see [`read_config`]).
pub fn parse_standalone(text: &str) -> Result<DeviceConfigSpec, String> {
    let mut specs = parse_specs(text).map_err(|e| e.to_string())?;
    if specs.len() != 1 {
        return Err(format!(
            "holds {} DeviceConfigs; standalone mode follows exactly one",
            specs.len()
        ));
    }
    let doc = specs.remove(0);
    // Unknown fields are refused as `validate` refuses them: a typo must not
    // silently fall back to a default.
    if !doc.unknown_fields.is_empty() {
        return Err(doc
            .unknown_fields
            .iter()
            .map(|path| format!("{path}: is not a field of DeviceConfig"))
            .collect::<Vec<_>>()
            .join("; "));
    }
    Ok(doc.spec)
}

/// Where standalone mode's Events go: the file, or the log only.
fn open_events(config: &StandaloneConfig) -> Result<EventSink, StandaloneError> {
    match &config.events_file {
        None => Ok(EventSink::log(config.node_name.clone())),
        Some(path) => EventSink::file(config.node_name.clone(), path).map_err(|source| {
            StandaloneError::Events {
                path: path.display().to_string(),
                source,
            }
        }),
    }
}

/// An Event standalone mode makes itself, about the node.
fn event(warning: bool, action: &'static str, reason: &str, note: impl Into<String>) -> NodeEvent {
    let type_ = if warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    NodeEvent::agent(type_, action, reason, note)
}

/// Runs until `shutdown`; `ready` is called once the node services have
/// started, with the metrics endpoint's address when it listens.
pub async fn run(
    config: StandaloneConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce(Option<SocketAddr>),
) -> Result<(), StandaloneError> {
    run_observed(config, shutdown, |started| ready(started.listening)).await
}

/// What a started standalone agent hands its caller.
pub struct Started {
    /// Where the metrics endpoint listens, when it does.
    pub listening: Option<SocketAddr>,
    /// What the metrics endpoints serve, read in process (`--show-metrics`).
    pub published: tokio::sync::watch::Receiver<std::sync::Arc<Published>>,
}

/// As [`run`], handing `ready` the exporter's in-process output too.
pub async fn run_observed(
    config: StandaloneConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce(Started),
) -> Result<(), StandaloneError> {
    let events = open_events(&config)?;
    // The node side as the agent starts it, without the Kubernetes side. The
    // driver is reported, and loaded when the spec asks (as by hand: there
    // is no leader to roll upgrades). Its two tasks are followers: one that
    // ends unasked is logged and recorded as an Event.
    let mut node_side = NodeSide::start(
        node_side::Start {
            host: config.host.clone(),
            rescan_interval: config.rescan_interval,
            driver: config.driver.clone(),
            driver_wanted: crate::driver::decision::DriverWanted::from_spec(config.spec.driver()),
        },
        None,
        Followers::new(),
    );
    let mut report_rx = node_side.driver_report.clone();
    let mut report_open = true;
    let mut driver_load = node_side.driver_load.clone();
    let mut ended = node_side.followers().ended();
    let mut driver_shown = crate::driver::decision::Shown::default();
    let mut driver_open = true;
    let services = &mut node_side.services;
    let mut discovery = services.discovery();
    let mut discovery_open = true;
    let mut desired = desired_services(&config);
    hold_tests(
        &mut desired,
        report_rx.borrow_and_update().as_ref(),
        driver_load.borrow().as_ref(),
    );
    let mut transitions = services.transitions();
    let mut plugin_status = services.plugin_status.clone();
    let mut plugin_open = true;
    let mut reported_ends = 0;
    let mut test_results = services.test_results();
    let mut results_open = true;
    let mut progress = discovery.borrow_and_update().clone();
    services.apply(desired.clone()).await;
    let mut exporter = services.exporter_status.clone();
    // Ready once the metrics endpoint listens (or at once when it is off). It
    // failing to listen ends the start with its reason; a signal meanwhile
    // stops cleanly.
    if services.metrics.is_running() {
        let mut metrics_state = services.metrics.subscribe();
        let started = tokio::select! {
            _ = shutdown.cancelled() => None,
            _ = exporter.wait_for(|s| s.listening.is_some()) => Some(Ok(())),
            failed = metrics_state.wait_for(|s| matches!(s, ServiceState::Restarting { .. })) => {
                let error = match failed.as_deref() {
                    Ok(ServiceState::Restarting { error, .. }) => error.clone(),
                    _ => "stopped".to_owned(),
                };
                Some(Err(error))
            }
        };
        match started {
            None => {
                services.stop().await;
                return Ok(());
            }
            Some(Err(error)) => {
                services.stop().await;
                return Err(StandaloneError::MetricsListen { error });
            }
            Some(Ok(())) => {
                if let Some(addr) = exporter.borrow().listening {
                    tracing::info!(%addr, "metrics on http://{addr}/metrics");
                }
            }
        }
    }
    let listening = exporter.borrow().listening;
    ready(Started {
        listening,
        published: services.metrics_published.clone(),
    });
    events
        .record(event(
            false,
            "Standalone",
            "Started",
            "gpu-operator standalone services started",
        ))
        .await;

    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut tick = 0u64;
    let mut last_conflict = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            transition = transitions.recv() => match transition {
                Ok(t) => events.record(transition_event(&t)).await,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            changed = plugin_status.changed(), if plugin_open => {
                if changed.is_err() {
                    plugin_open = false;
                    continue;
                }
                let conflict = plugin_status.borrow_and_update().conflict.clone();
                if conflict != last_conflict {
                    if let Some(c) = &conflict {
                        events.record(event(true, "SelectDeviceConfig", "PartitionLayoutConflict", c.to_string())).await;
                    }
                    last_conflict = conflict;
                }
            }
            changed = discovery.changed(), if discovery_open => {
                if changed.is_err() {
                    discovery_open = false;
                    continue;
                }
                let now = discovery.borrow_and_update().clone();
                for (warning, reason, note) in discovery_events(&progress, &now) {
                    events.record(event(warning, "SelectDeviceConfig", reason, note)).await;
                }
                if now.discovered && !progress.discovered {
                    // Held back until now (see `NodeServices::new`).
                    services.apply(desired.clone()).await;
                }
                progress = now;
            }
            changed = driver_load.changed(), if driver_open => {
                if changed.is_err() {
                    driver_open = false;
                    continue;
                }
                let load = driver_load.borrow_and_update().clone();
                if let Some((type_, action, reason, note)) = driver_shown.load_event(load.as_ref()) {
                    events.record(NodeEvent::agent(type_, action, reason, note)).await;
                }
                let report = report_rx.borrow().clone();
                if hold_tests(&mut desired, report.as_ref(), load.as_ref()) && progress.discovered {
                    services.apply(desired.clone()).await;
                }
            }
            changed = report_rx.changed(), if report_open => {
                if changed.is_err() {
                    report_open = false;
                    continue;
                }
                let report = report_rx.borrow_and_update().clone();
                let load = driver_load.borrow().clone();
                if hold_tests(&mut desired, report.as_ref(), load.as_ref()) && progress.discovered {
                    services.apply(desired.clone()).await;
                }
            }
            // `ended`'s sender lives in `followers`: it never closes here.
            _ = ended.changed() => {
                let ends = ended.borrow_and_update().clone();
                for end in ends.iter().skip(reported_ends) {
                    events.record(event(true, "Standalone", "FollowerEnded", end.to_string())).await;
                }
                reported_ends = ends.len();
            }
            result = test_results.recv(), if results_open => match result {
                Ok(run) => {
                    let warning = run.outcome != Outcome::Passed;
                    events.record(event(warning, "TestRun", run.outcome.reason(), result_note(&run))).await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "test results left out of the events file: too many at once");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => results_open = false,
            },
            _ = ticker.tick(), if config.simulate.is_some() => {
                tick += 1;
                // As the tree is now: a partition change re-laid it out.
                let now = config
                    .simulate
                    .as_ref()
                    .map(|spec| simulate::spec_of(&config.host).unwrap_or_else(|_| spec.clone()));
                if let Some(spec) = &now
                    && let Err(e) = simulate::advance_telemetry(&config.host, spec, tick)
                {
                    tracing::warn!(error = %e, "cannot move simulated telemetry");
                }
            }
        }
    }
    events
        .record(event(
            false,
            "Standalone",
            "Stopping",
            "gpu-operator standalone services stopping",
        ))
        .await;
    services.stop().await;
    drop(node_side);
    Ok(())
}

/// The services the spec asks for, with the command line's overrides; the
/// device plugin only where the kubelet has a device-plugin directory.
fn desired_services(config: &StandaloneConfig) -> DesiredServices {
    let labels = Default::default();
    let mut desired = plan_services(
        &config.spec,
        &NodeContext {
            node_name: &config.node_name,
            sampling: &config.sampling,
            labels: &labels,
            kubelet_dir: &config.kubelet_dir,
            host: &config.host,
            metrics_config: config.metrics_config.as_deref(),
            test_config: config.test_config.as_deref(),
            health_socket: config.health_socket.as_deref(),
        },
    );
    if let Some(plugin) = &desired.device_plugin
        && !plugin.device_plugin_dir.is_dir()
    {
        tracing::info!(dir = %plugin.device_plugin_dir.display(), "no kubelet device-plugin directory: the device plugin does not run");
        desired.device_plugin = None;
    }
    super::plan::apply_overrides(&mut desired, None, &config.overrides());
    desired
}

impl StandaloneConfig {
    /// What the command line overrides in the services the spec asks for
    /// (applied in [`super::plan::apply_overrides`]). DRA does not run in
    /// standalone mode: nothing of it is overridden.
    fn overrides(&self) -> super::plan::Overrides {
        super::plan::Overrides {
            metrics_listen: self.metrics_listen,
            test_commands: Some(self.test_commands.clone()),
            ..super::plan::Overrides::default()
        }
    }
}

/// The events a change of discovery progress is worth: a warning when a scan
/// is first not trusted (or for another reason), a note when discovery is
/// whole again.
fn discovery_events(
    before: &DiscoveryProgress,
    now: &DiscoveryProgress,
) -> Vec<(bool, &'static str, String)> {
    match (&before.last_incomplete, &now.last_incomplete) {
        (last, Some(reason)) if last.as_ref() != Some(reason) => vec![(
            true,
            "DiscoveryIncomplete",
            format!("GPU discovery incomplete, the last inventory stays in use: {reason}"),
        )],
        (Some(_), None) => vec![(
            false,
            "DiscoveryComplete",
            "GPU discovery sees the whole host again".to_owned(),
        )],
        _ => Vec::new(),
    }
}

/// The events file's note on a finished test case (its full result is in the
/// test runner's log directory).
/// Holds the tests while the driver is not ready for them (standalone has
/// no partition changes of its own to hold anything else for). Whether
/// `desired` changed.
fn hold_tests(
    desired: &mut DesiredServices,
    report: Option<&crate::api::agent_status::DriverReport>,
    load: Option<&crate::api::agent_status::DriverLoad>,
) -> bool {
    super::plan::hold_for_node_work(
        desired,
        super::plan::NodeWork {
            driver: report,
            load,
            partition: None,
        },
    )
}

fn result_note(run: &LastRun) -> String {
    format!(
        "{} test {} on GPUs {:?}: {} after {:.1} s (details in the test runner's log directory)",
        run.trigger,
        run.recipe,
        run.gpu_indexes,
        run.outcome.reason(),
        run.duration_seconds
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_events_mark_each_new_reason_and_the_recovery() {
        let progress = |reason: Option<&str>| DiscoveryProgress {
            discovered: true,
            last_incomplete: reason.map(str::to_owned),
        };
        let reasons = |before, now| -> Vec<&'static str> {
            discovery_events(&progress(before), &progress(now))
                .into_iter()
                .map(|(_, reason, _)| reason)
                .collect()
        };
        assert_eq!(reasons(None, None), Vec::<&str>::new());
        assert_eq!(reasons(None, Some("deadline")), ["DiscoveryIncomplete"]);
        assert_eq!(
            reasons(Some("deadline"), Some("deadline")),
            Vec::<&str>::new()
        );
        assert_eq!(
            reasons(Some("deadline"), Some("EMFILE")),
            ["DiscoveryIncomplete"]
        );
        assert_eq!(reasons(Some("deadline"), None), ["DiscoveryComplete"]);
        let (warning, _, note) = discovery_events(&progress(None), &progress(Some("EMFILE")))
            .pop()
            .unwrap();
        assert!(warning);
        assert!(note.ends_with("EMFILE"), "{note}");
    }

    #[test]
    fn a_finished_test_is_noted_with_its_outcome_and_gpus() {
        use crate::testrunner::config::Trigger;
        let run = LastRun {
            trigger: Trigger::Manual,
            recipe: "gst_single".into(),
            outcome: Outcome::TimedOut,
            duration_seconds: 2.04,
            finished_unix_seconds: 130.0,
            gpu_indexes: vec![0, 3],
        };
        assert_eq!(
            result_note(&run),
            "MANUAL test gst_single on GPUs [0, 3]: TestTimedOut after 2.0 s \
             (details in the test runner's log directory)"
        );
    }

    #[test]
    fn standalone_config_accepts_a_device_config_a_spec_document_or_a_bare_spec() {
        let full = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {name: x}\nspec:\n  metricsExporter: {enable: true, port: 5001}\n";
        assert_eq!(parse_standalone(full).unwrap().metrics_exporter.port, 5001);
        let spec_only = "spec:\n  metricsExporter: {enable: true, port: 5002}\n";
        assert_eq!(
            parse_standalone(spec_only).unwrap().metrics_exporter.port,
            5002
        );
        let bare = "metricsExporter: {enable: True, port: 5003}\n";
        let spec = parse_standalone(bare).unwrap();
        assert_eq!(spec.metrics_exporter.port, 5003);
        assert_eq!(spec.metrics_exporter.enable, Some(true));
        assert_eq!(parse_standalone("").unwrap(), DeviceConfigSpec::default());
        let two = format!("{full}---\n{full}");
        assert!(parse_standalone(&two).unwrap_err().contains("exactly one"));
        assert!(parse_standalone("metricsExporter: [1, 2]").is_err());
        assert!(parse_standalone(": : :").is_err());
    }

    #[test]
    fn unknown_fields_are_refused_in_every_form() {
        let typo = "metricsExporter:\n  enable: true\n  prot: 5001\n";
        assert_eq!(
            parse_standalone(typo).unwrap_err(),
            "spec.metricsExporter.prot: is not a field of DeviceConfig"
        );
        let spec_doc = format!("spec:\n  {}", typo.replace('\n', "\n  ").trim_end());
        assert!(
            parse_standalone(&spec_doc)
                .unwrap_err()
                .contains("spec.metricsExporter.prot")
        );
        let full = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata: {name: x}\n\
                    spec:\n  devicePlugin: {enableNodeLabeler: false}\n";
        assert_eq!(
            parse_standalone(full).unwrap_err(),
            "spec.devicePlugin.enableNodeLabeler: is not a field of DeviceConfig"
        );
    }

    #[test]
    fn invalid_specs_are_refused_with_their_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        // DRA alone is valid (an absent devicePlugin is off); with a written
        // devicePlugin section the two collide.
        std::fs::write(&path, "spec:\n  draDriver: {enable: true}\n").unwrap();
        let spec = read_config(&path).expect("DRA alone is valid");
        assert!(spec.device_plugin.is_none());
        std::fs::write(
            &path,
            "spec:\n  draDriver: {enable: true}\n  devicePlugin: {}\n",
        )
        .unwrap();
        let err = read_config(&path).unwrap_err().to_string();
        assert!(
            err.contains("config.yaml") && err.contains("draDriver"),
            "{err}"
        );
        let err = read_config(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.yaml"), "{err}");
    }
}
