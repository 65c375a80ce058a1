//! The DeviceConfig reconciler, split the Stackable way into steps: validate,
//! select, own (finalizer, Service, ServiceMonitor), roll driver upgrades,
//! then update status. All decisions are pure functions in `status`,
//! `resources` and `upgrade`; this file and `upgrader` do the I/O, and every
//! write first asks the [`LeaderGuard`] whether the lease is still held.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, Service};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use super::context::{Context, Error, kube_err};
use super::device_classes;
#[cfg(test)]
use super::lease::LeaderGuard;
use super::resources::{self, metrics_service, service_monitor};
use super::status::{NodeView, Problems, desired_status, status_changed};
use super::steps::STEPS;
use crate::api::agent_status::ConfigKey;
use crate::api::field_manager;
use crate::api::{DeviceConfig, Operand, validate};

pub const FINALIZER: &str = "amd.node.kubernetes.io/deviceconfig-finalizer";

/// Reconciles one DeviceConfig.
pub async fn reconcile(dc: Arc<DeviceConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.stats
        .reconciles
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::counters::record_reconcile();
    ctx.check_leader()?;
    if !ctx.wait_for_nodes().await {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if let Some(watch) = &ctx.node_watch
        && !watch.holds_labels_of(&dc)
    {
        // A selector names a Node label the cache does not keep: the Node
        // watch lists again keeping it, and every DeviceConfig is
        // reconciled once that list is in. Deciding now would select
        // nodes by a label the cache lacks.
        return Ok(Action::await_change());
    }
    let key = ConfigKey::of(&dc);
    let selected_nodes: Vec<Arc<Node>> = ctx
        .nodes
        .state()
        .into_iter()
        .filter(|n| dc.spec.selects(n.labels()))
        .collect();
    let selected: Vec<NodeView> = ctx.views.views_of(&selected_nodes, ctx.nodes.len());
    if dc.metadata.deletion_timestamp.is_some() {
        return tear_down(&dc, &selected, &selected_nodes, &ctx).await;
    }
    ensure_finalizer(&dc, &ctx).await?;

    // 1. Validate, including what needs the cluster.
    let mut problems = Problems {
        validation: validate(&dc.spec).iter().map(ToString::to_string).collect(),
        ..Problems::default()
    };
    problems
        .validation
        .extend(missing_references(&dc, &ctx).await?);
    // 2-3. Each selected Node belongs to one DeviceConfig only.
    problems
        .validation
        .extend(conflicts(&dc, &selected, &ctx.configs));

    // 4. Owned objects.
    if let Err(e) = apply_owned(&dc, &ctx).await {
        problems.other.push(e.to_string());
    }

    // 5. The leader's steps (driver upgrades, partition changes,
    // remediation), each woken again at its nearest timeout. Nothing moves
    // while the spec is invalid: no pod is evicted for it.
    let mut upgrade_wake: Option<Duration> = None;
    for step in STEPS {
        if !problems.validation.is_empty() {
            step.hold(&key, &ctx);
            continue;
        }
        let outcome = step.reconcile(&dc, &selected_nodes, &ctx).await?;
        problems.other.extend(outcome.problems);
        if outcome.remediation_mapping.is_some() {
            problems.remediation_mapping = outcome.remediation_mapping;
        }
        upgrade_wake = upgrade_wake.into_iter().chain(outcome.wake).min();
    }
    let settled = || upgrade_wake.map_or_else(Action::await_change, Action::requeue);

    // 6. Status, written only when it changes and at most once per interval.
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired = desired_status(&dc, &selected, &problems, dc.status.as_ref(), &now);
    if !status_changed(dc.status.as_ref(), &desired) {
        return Ok(settled());
    }
    if let Some(wait) = throttle(&ctx, &key) {
        return Ok(Action::requeue(upgrade_wake.map_or(wait, |w| w.min(wait))));
    }
    let api: Api<DeviceConfig> =
        Api::namespaced(ctx.client.clone(), &dc.namespace().unwrap_or_default());
    // A JSON patch replaces the whole status, so counts that fell to zero (and
    // are therefore left out of the serialised status) are cleared too.
    let patch = json!([{ "op": "add", "path": "/status", "value": desired }]);
    let patch: json_patch::Patch = serde_json::from_value(patch).map_err(|e| Error::Kube {
        action: "encoding status of",
        object: key.to_string(),
        source: kube::Error::SerdeError(e),
    })?;
    let name = dc.name_any();
    let params = field_manager::patch(field_manager::LEADER);
    let patch = Patch::Json::<()>(patch);
    let write = api.patch_status(&name, &params, &patch);
    ctx.leader_write("writing status of", &key, write).await?;
    ctx.stats
        .status_writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Ok(mut last) = ctx.last_status_write.lock() {
        last.insert(key.clone(), Instant::now());
    }
    if let Some((type_, reason, note)) = readiness_event(dc.status.as_ref(), &desired) {
        ctx.event(&dc, type_, reason, note).await;
    }
    Ok(settled())
}

/// The Event a status change deserves: readiness gained or lost, or a
/// different reason or message while not ready (a new validation error, say).
/// Count changes while ready ("applied to N node(s)") are not worth an Event.
pub fn readiness_event(
    previous: Option<&crate::api::DeviceConfigStatus>,
    desired: &crate::api::DeviceConfigStatus,
) -> Option<(EventType, &'static str, String)> {
    let ready = |status: Option<&crate::api::DeviceConfigStatus>| {
        status?
            .conditions
            .iter()
            .find(|c| c.type_ == crate::api::CONDITION_READY)
            .cloned()
    };
    let now = ready(Some(desired))?;
    let before = ready(previous);
    let is_ready = now.status == "True";
    let changed = match &before {
        None => true,
        Some(b) => {
            b.status != now.status
                || (!is_ready && (b.reason != now.reason || b.message != now.message))
        }
    };
    if !changed {
        return None;
    }
    let note = format!("{}: {}", now.reason, now.message);
    Some(if is_ready {
        (EventType::Normal, "Ready", note)
    } else {
        (EventType::Warning, "NotReady", note)
    })
}

/// Time left before the next status write of `key` is allowed, if any.
fn throttle(ctx: &Context, key: &ConfigKey) -> Option<Duration> {
    let last = ctx.last_status_write.lock().ok()?.get(key).copied()?;
    let next = last + ctx.status_interval;
    let now = Instant::now();
    (now < next).then(|| next - now)
}

pub fn error_policy(dc: Arc<DeviceConfig>, error: &Error, _ctx: Arc<Context>) -> Action {
    match error {
        Error::NotLeader => Action::await_change(),
        Error::LeaseRenewalDue => Action::requeue(Duration::from_secs(1)),
        other => {
            tracing::warn!(deviceconfig = %ConfigKey::of(&dc), error = %other, "reconcile failed; retrying");
            crate::counters::record_api_error();
            Action::requeue(Duration::from_secs(5))
        }
    }
}

async fn ensure_finalizer(dc: &DeviceConfig, ctx: &Context) -> Result<(), Error> {
    if dc.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = dc.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch_finalizers(dc, ctx, finalizers).await
}

/// Sets `metadata.finalizers`, guarded by the resourceVersion that was read so
/// that a concurrent change by someone else is not overwritten.
async fn patch_finalizers(
    dc: &DeviceConfig,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<DeviceConfig> =
        Api::namespaced(ctx.client.clone(), &dc.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": dc.resource_version() }
    });
    let name = dc.name_any();
    let params = field_manager::patch(field_manager::LEADER);
    let patch = Patch::Merge(&patch);
    let write = api.patch(&name, &params, &patch);
    ctx.leader_write("updating finalizers of", &ConfigKey::of(dc), write)
        .await
        .map(|_| ())
}

/// A ConfigMap or Secret the spec names, in the DeviceConfig's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub path: &'static str,
    pub kind: &'static str,
    pub name: String,
}

/// The ConfigMaps and Secrets an enabled part of the spec depends on. Pull
/// secrets of images are not among them: images are ignored in this design.
pub fn references(spec: &crate::api::DeviceConfigSpec) -> Vec<Reference> {
    let mut refs = Vec::new();
    let mut add = |path, kind, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            refs.push(Reference {
                path,
                kind,
                name: name.to_owned(),
            });
        }
    };
    let metrics = &spec.metrics_exporter;
    if metrics.is_enabled() {
        add(
            "spec.metricsExporter.config.name",
            "ConfigMap",
            metrics.config.name.as_deref(),
        );
        if metrics.access_control_enabled() {
            let rbac = &metrics.rbac_config;
            add(
                "spec.metricsExporter.rbacConfig.secret",
                "Secret",
                rbac.secret.as_ref().map(|r| r.name.as_str()),
            );
            add(
                "spec.metricsExporter.rbacConfig.clientCAConfigMap",
                "ConfigMap",
                rbac.client_ca_config_map.as_ref().map(|r| r.name.as_str()),
            );
        }
    }
    if spec.test_runner.is_enabled() {
        add(
            "spec.testRunner.config.name",
            "ConfigMap",
            spec.test_runner.config.as_ref().map(|c| c.name.as_str()),
        );
        for secret in &spec.test_runner.logs_location.logs_export_secrets {
            add(
                "spec.testRunner.logsLocation.logsExportSecrets",
                "Secret",
                Some(&secret.name),
            );
        }
    }
    if spec.remediation_workflow.is_enabled() {
        add(
            "spec.remediationWorkflow.config.name",
            "ConfigMap",
            spec.remediation_workflow
                .config
                .as_ref()
                .map(|c| c.name.as_str()),
        );
    }
    if spec.is_enabled(Operand::Driver) {
        let sign = &spec.driver().image_sign;
        add(
            "spec.driver.imageSign.keySecret",
            "Secret",
            sign.key_secret.as_ref().map(|r| r.name.as_str()),
        );
        add(
            "spec.driver.imageSign.certSecret",
            "Secret",
            sign.cert_secret.as_ref().map(|r| r.name.as_str()),
        );
    }
    refs
}

/// The references of [`references`] that do not exist (metadata only, never a
/// Secret's data). Secrets only with `check_secret_references`: by default
/// the agents hold no right on Secrets (deploy/10-rbac.yaml), and a missing
/// Secret is reported by the agent that consumes it; the optional Role in
/// deploy/optional/ allows this earlier check.
async fn missing_references(dc: &DeviceConfig, ctx: &Context) -> Result<Vec<String>, Error> {
    let ns = dc.namespace().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut missing = Vec::new();
    for reference in references(&dc.spec)
        .into_iter()
        .filter(|r| r.kind == "ConfigMap" || ctx.check_secret_references)
    {
        let name = reference.name.clone();
        let found = match reference.kind {
            "Secret" => secrets.get_metadata_opt(&name).await.map(|o| o.is_some()),
            _ => config_maps
                .get_metadata_opt(&name)
                .await
                .map(|o| o.is_some()),
        };
        match found {
            Ok(true) => {}
            Ok(false) => missing.push(format!(
                "{}: {} {name:?} does not exist",
                reference.path, reference.kind
            )),
            // The RBAC in deploy/ may cover some namespaces only (restricted
            // to one, deploy/README.md), and Secrets only with the optional
            // Role. Retrying cannot help; saying so in the status can.
            Err(kube::Error::Api(status)) if status.code == 403 => missing.push(format!(
                "{}: {} {name:?} cannot be read in namespace {ns:?}: the operator may read \
                 ConfigMaps only where ClusterRole gpu-operator-deviceconfigs is bound, and \
                 Secrets only with the optional Role of deploy/optional/ (deploy/10-rbac.yaml)",
                reference.path, reference.kind
            )),
            Err(e) => {
                return Err(kube_err(
                    "looking up a reference",
                    format!("{} {name}", reference.kind),
                )(e));
            }
        }
    }
    Ok(missing)
}

/// Nodes that another (live) DeviceConfig selects too.
fn conflicts(
    dc: &DeviceConfig,
    selected: &[NodeView],
    configs: &Store<DeviceConfig>,
) -> Vec<String> {
    let key = ConfigKey::of(dc);
    let others: Vec<Arc<DeviceConfig>> = configs
        .state()
        .into_iter()
        .filter(|o| ConfigKey::of(o) != key)
        .collect();
    let mut problems = Vec::new();
    for node in selected {
        let claimants: BTreeSet<String> = others
            .iter()
            .filter(|o| crate::api::selects_node(o, &node.labels))
            .map(|o| ConfigKey::of(o).to_string())
            .collect();
        if !claimants.is_empty() {
            problems.push(format!(
                "spec.selector: node {} is also selected by {}; a node may belong to one DeviceConfig only",
                node.name,
                claimants.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    problems
}

/// Creates, updates or deletes the metrics Service and ServiceMonitor, and
/// the DRA DeviceClass.
async fn apply_owned(dc: &DeviceConfig, ctx: &Context) -> Result<(), Error> {
    sync_device_class(ctx).await?;
    let agents = ctx.operator_namespace.as_deref();
    sync_service(dc, ctx, metrics_service(dc, agents)).await?;
    let wanted = service_monitor(dc, agents);
    if wanted.is_none() && !dc.spec.metrics_exporter.wants_service_monitor() && dc.status.is_none()
    {
        // Nothing to create and nothing we could have created before.
        return Ok(());
    }
    sync_service_monitor(dc, ctx, wanted).await
}

/// Deletes everything [`apply_owned`] may have created. Owner references would
/// let the garbage collector do it too, but only once the DeviceConfig is gone;
/// teardown is reported done when these are.
async fn delete_owned(dc: &DeviceConfig, ctx: &Context) -> Result<(), Error> {
    sync_device_class(ctx).await?;
    sync_service(dc, ctx, None).await?;
    sync_service_monitor(dc, ctx, None).await
}

/// Server-side applies `wanted`, or deletes the Service when it is `None`.
async fn sync_service(
    dc: &DeviceConfig,
    ctx: &Context,
    wanted: Option<Service>,
) -> Result<(), Error> {
    let agents = ctx.operator_namespace.as_deref();
    let name = resources::metrics_service_name(dc, agents);
    let namespace = resources::owned_namespace(dc, agents);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    match wanted {
        Some(service) => {
            let params = apply_params();
            let patch = Patch::Apply(&service);
            let write = services.patch(&name, &params, &patch);
            ctx.leader_write("applying Service", &name, write)
                .await
                .map(|_| ())
        }
        None if ctx.service_known_absent(&namespace, &name).await => Ok(()),
        None => delete_if_present(ctx, &services, &name).await,
    }
}

/// Like [`sync_service`] for the ServiceMonitor, when the Prometheus operator's
/// CRD is served; without it there is nothing to create or delete.
async fn sync_service_monitor(
    dc: &DeviceConfig,
    ctx: &Context,
    wanted: Option<DynamicObject>,
) -> Result<(), Error> {
    let resource = resources::service_monitor_resource();
    if !ctx
        .client
        .list_api_group_resources(&resource.api_version)
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.name == resource.plural))
    {
        if wanted.is_some() {
            tracing::info!(deviceconfig = %ConfigKey::of(dc), "ServiceMonitor wanted but its CRD is not served; skipped");
        }
        return Ok(());
    }
    let agents = ctx.operator_namespace.as_deref();
    let name = resources::metrics_service_name(dc, agents);
    let monitors: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &resources::owned_namespace(dc, agents),
        &resource,
    );
    match wanted {
        Some(monitor) => {
            let params = apply_params();
            let patch = Patch::Apply(&monitor);
            let write = monitors.patch(&name, &params, &patch);
            ctx.leader_write("applying ServiceMonitor", &name, write)
                .await
                .map(|_| ())
        }
        None => delete_if_present(ctx, &monitors, &name).await,
    }
}

/// The DRA DeviceClasses ([`device_classes`]): `gpu.amd.com` exists while
/// any DeviceConfig not being deleted enables DRA, and goes with the last
/// one; beside it, one class per partition layout that some DRA node's agent
/// reports, which goes when no node reports it any more. A class of one of
/// those names that does not carry our label is someone else's (the
/// reference chart ships `gpu.amd.com`): it is left alone, neither taken
/// over nor deleted. The classes are listed first, so a reconcile that finds
/// them as wanted writes nothing; what a list found is remembered for
/// [`DEVICE_CLASS_RECHECK`] while the wanted names stay the same, so
/// reconciles in between read nothing, and a class someone deleted or
/// changed is put back after it.
///
/// Failures are logged, not returned: the classes are cluster-wide, and one
/// refused write must not hold up every DeviceConfig's reconcile.
async fn sync_device_class(ctx: &Context) -> Result<(), Error> {
    match try_sync_device_class(ctx).await {
        Err(Error::NotLeader) => Err(Error::NotLeader),
        Err(e) => {
            tracing::warn!(error = %e, "cannot keep the DRA DeviceClasses; will retry");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// How long a DeviceClass check stays trusted.
const DEVICE_CLASS_RECHECK: Duration = Duration::from_secs(300);

async fn try_sync_device_class(ctx: &Context) -> Result<(), Error> {
    let dra = ctx.configs.state().iter().any(|c| {
        c.metadata.deletion_timestamp.is_none() && c.spec.is_enabled(crate::api::Operand::DraDriver)
    });
    let layouts = match &ctx.node_watch {
        _ if !dra => BTreeSet::new(),
        Some(watch) => watch.layouts_present(),
        None => device_classes::layouts_present(ctx.nodes.state().iter().map(AsRef::as_ref)),
    };
    let wanted = device_classes::wanted_classes(dra, &layouts);
    let names: Vec<String> = wanted.iter().map(ResourceExt::name_any).collect();
    let fresh = ctx
        .device_class
        .lock()
        .ok()
        .and_then(|k| k.clone())
        .is_some_and(|(made, at)| made == names && at.elapsed() < DEVICE_CLASS_RECHECK);
    if fresh {
        return Ok(());
    }
    let classes: Api<DeviceClass> = Api::all(ctx.client.clone());
    let current = ctx
        .leader_write(
            "listing DeviceClasses",
            "deviceclasses",
            classes.list(&ListParams::default()),
        )
        .await?;
    let changes = device_classes::class_changes(&wanted, &current.items);
    for name in &changes.foreign {
        tracing::info!(
            class = %name,
            "a DeviceClass of that name exists without our label: left alone"
        );
    }
    for class in &changes.apply {
        let name = class.name_any();
        let params = apply_params();
        let patch = Patch::Apply(class);
        let write = classes.patch(&name, &params, &patch);
        let applied = ctx
            .leader_write("applying DeviceClass", &name, write)
            .await?;
        if class.spec.extended_resource_name.is_some()
            && applied.spec.extended_resource_name.is_none()
        {
            tracing::info!(
                class = %name,
                "the API server dropped extendedResourceName (DRAExtendedResource is off before Kubernetes 1.36): pods asking for its extended resource are not served by DRA"
            );
        }
        tracing::info!(class = %name, "applied the DRA DeviceClass");
    }
    for name in &changes.delete {
        delete_if_present(ctx, &classes, name).await?;
        tracing::info!(
            class = %name,
            "no DeviceConfig enables DRA, or no DRA node has its layout: removed the DRA DeviceClass"
        );
    }
    if let Ok(mut k) = ctx.device_class.lock() {
        *k = Some((names, Instant::now()));
    }
    Ok(())
}

fn apply_params() -> PatchParams {
    field_manager::apply(field_manager::LEADER)
}

async fn delete_if_present<K>(ctx: &Context, api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams::default();
    match ctx
        .leader_write("deleting", name, api.delete(name, &params))
        .await
    {
        Ok(_) => Ok(()),
        Err(Error::Kube {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletion: agents see the DeviceConfig is going and stop its services; once
/// every selected agent reports it no longer follows it (or its Node has been
/// NotReady past the timeout), owned objects are removed and the finalizer with them.
async fn tear_down(
    dc: &DeviceConfig,
    selected: &[NodeView],
    selected_nodes: &[Arc<Node>],
    ctx: &Context,
) -> Result<Action, Error> {
    if !dc.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let key = ConfigKey::of(dc);
    // A DeviceConfig being deleted evicts nothing more while it waits.
    ctx.drains.stop_all(&key);
    let since_deletion = dc
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| {
            let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            Duration::try_from(elapsed).ok()
        })
        .unwrap_or_default();
    let uid = dc.metadata.uid.as_deref();
    let waiting: Vec<&NodeView> = selected
        .iter()
        .filter(|n| n.follows(&key, uid).is_some())
        .collect();
    let timed_out = since_deletion >= ctx.teardown_timeout;
    let blocking: Vec<&&NodeView> = waiting.iter().filter(|n| n.ready || !timed_out).collect();
    if !blocking.is_empty() {
        tracing::info!(deviceconfig = %key, waiting = blocking.len(), "waiting for agents to tear down");
        let recheck = ctx
            .teardown_timeout
            .saturating_sub(since_deletion)
            .max(Duration::from_secs(1));
        return Ok(Action::requeue(recheck.min(Duration::from_secs(30))));
    }
    delete_owned(dc, ctx).await?;
    // Each step's drains, records, cordons, taints and counts go with it.
    for step in STEPS {
        step.tear_down(dc, selected_nodes, ctx).await?;
    }
    let given_up: Vec<String> = waiting.iter().map(|n| n.name.clone()).collect();
    let remaining: Vec<String> = dc
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let note = if given_up.is_empty() {
        format!("torn down on every selected node ({})", selected.len())
    } else {
        format!(
            "torn down; gave up waiting for NotReady node(s) {} after {:?}",
            given_up.join(", "),
            ctx.teardown_timeout
        )
    };
    // Recorded while the DeviceConfig still exists: once the finalizer is
    // released the object is gone, and whoever waits for that (an
    // administrator, a test) must already find the Event.
    ctx.event(dc, EventType::Normal, "TornDown", note).await;
    patch_finalizers(dc, ctx, remaining).await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::SeriesRecorder;

    fn status(ready: &str, reason: &str, message: &str) -> crate::api::DeviceConfigStatus {
        serde_json::from_value(json!({"conditions": [{
            "type": "Ready", "status": ready, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-30T00:00:00Z"}]}))
        .unwrap()
    }

    #[test]
    fn readiness_events_follow_changes_worth_telling() {
        let ready = status("True", "OperatorReady", "applied to 2 node(s)");
        let invalid = status("False", "ValidationError", "spec.a: bad");
        let event = |before: Option<&crate::api::DeviceConfigStatus>, now| {
            readiness_event(before, now)
                .map(|(t, reason, note)| (t == EventType::Normal, reason, note))
        };
        assert_eq!(
            event(None, &ready),
            Some((true, "Ready", "OperatorReady: applied to 2 node(s)".into()))
        );
        assert_eq!(
            event(Some(&ready), &invalid),
            Some((false, "NotReady", "ValidationError: spec.a: bad".into()))
        );
        // A different problem while not ready is news; the same one is not.
        let other = status("False", "ValidationError", "spec.b: bad");
        assert!(event(Some(&invalid), &other).is_some());
        let same = invalid.clone();
        assert_eq!(event(Some(&invalid), &same), None);
        let no_nodes = status("False", "NoMatchingNodes", "the selector matches no node");
        assert!(event(Some(&invalid), &no_nodes).is_some());
        // Counts moving while ready are not.
        let more = status("True", "OperatorReady", "applied to 3 node(s)");
        assert_eq!(event(Some(&ready), &more), None);
        assert_eq!(event(Some(&invalid), &ready).map(|e| e.1), Some("Ready"));
    }

    #[test]
    fn references_follow_what_is_enabled() {
        let spec: crate::api::DeviceConfigSpec = serde_json::from_value(serde_json::json!({
            "driver": {"enable": true, "imageSign": {"keySecret": {"name": "key"}, "certSecret": {"name": "cert"}}},
            "metricsExporter": {"enable": true, "config": {"name": "metrics"},
                "rbacConfig": {"enable": true, "secret": {"name": "tls"}, "clientCAConfigMap": {"name": "ca"}}},
            "testRunner": {"config": {"name": "tests"}, "logsLocation": {"logsExportSecrets": [{"name": "s3"}]}},
        }))
        .unwrap();
        let names = |spec: &crate::api::DeviceConfigSpec| -> Vec<(String, String)> {
            references(spec)
                .into_iter()
                .map(|r| (r.kind.to_owned(), r.name))
                .collect()
        };
        assert_eq!(
            names(&spec),
            [
                ("ConfigMap".into(), "metrics".into()),
                ("Secret".into(), "tls".into()),
                ("ConfigMap".into(), "ca".into()),
                ("Secret".into(), "key".into()),
                ("Secret".into(), "cert".into()),
            ],
            "the test runner is disabled, so its references do not count"
        );
        let mut spec = spec;
        spec.test_runner.enable = Some(true);
        spec.driver_mut().enable = false;
        spec.metrics_exporter.rbac_config.enable = Some(false);
        assert_eq!(
            names(&spec),
            [
                ("ConfigMap".into(), "metrics".into()),
                ("ConfigMap".into(), "tests".into()),
                ("Secret".into(), "s3".into()),
            ]
        );
    }

    #[tokio::test]
    async fn secrets_are_looked_up_only_when_asked() {
        let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorConfig::default())
            .await
            .unwrap();
        emu.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "kube-amd-gpu"}}))
            .unwrap();
        emu.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "metrics", "namespace": "kube-amd-gpu"}}))
            .unwrap();
        let client = emu.client();
        let (nodes, _) = kube::runtime::reflector::store::<Node>();
        let (configs, _) = kube::runtime::reflector::store::<DeviceConfig>();
        let recorder = SeriesRecorder::new(
            client.clone(),
            crate::events::Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let mut ctx = Context::new(client, nodes, configs, LeaderGuard::always(), recorder);
        let dc: DeviceConfig = serde_json::from_value(json!({
            "apiVersion": "amd.com/v1alpha1", "kind": "DeviceConfig",
            "metadata": {"name": "default", "namespace": "kube-amd-gpu"},
            "spec": {"metricsExporter": {"enable": true, "config": {"name": "metrics"}},
                     "driver": {"enable": true, "imageSign": {"keySecret": {"name": "no-key"}}}}
        }))
        .unwrap();
        // By default only ConfigMaps are looked up: the agents may not read Secrets.
        assert_eq!(
            missing_references(&dc, &ctx).await.unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(emu.requests().get("get", "secrets"), 0);
        // With --check-secret-references (and the optional Role) the missing
        // Secret is reported.
        ctx.check_secret_references = true;
        assert_eq!(
            missing_references(&dc, &ctx).await.unwrap(),
            ["spec.driver.imageSign.keySecret: Secret \"no-key\" does not exist"]
        );
        assert_eq!(emu.requests().get("get", "secrets"), 1);
    }
}
