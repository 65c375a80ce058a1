//! What a DeviceConfig's status should say: a pure function of the DeviceConfig,
//! the Nodes it selects (with their agents' status annotations) and the problems
//! the reconciler found.
//!
//! A service counts as available on a node only when that node's agent reports
//! it `Running`, which the agent says only once the service does its job for
//! users. `Ready` is `True` only when every selected node serves everything
//! the DeviceConfig enables; otherwise its message says how many nodes do not,
//! and why.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::agent_status::ConfigKey;
use crate::api::agent_status::{
    AgentStatus, DriverReport, STATUS_ANNOTATION, ServiceName, ServiceStatus,
};
use crate::api::driver_upgrade::UpgradeRecord;
use crate::api::{
    CONDITION_ERROR, CONDITION_READY, CONDITION_REMEDIATION_MAPPING, DeploymentStatus,
    DeviceConfig, DeviceConfigStatus, ModuleStatus, Operand, REASON_ERROR, REASON_NO_MAPPING,
    REASON_NO_MATCHING_NODES, REASON_NODES_NOT_SERVING, REASON_OPERATOR_READY,
    REASON_VALIDATION_ERROR, UpgradeSummary,
};

/// How many nodes the Ready message names before it only counts the rest.
const NODES_NAMED: usize = 5;

/// A selected Node as the status needs it: its labels (the cached Node's
/// own, shared) and the facts read from the rest of it, which a
/// [`ViewMemo`] keeps from one reconcile to the next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub labels: NodeLabels,
    pub facts: Arc<NodeFacts>,
}

impl std::ops::Deref for NodeView {
    type Target = NodeFacts;
    fn deref(&self) -> &NodeFacts {
        &self.facts
    }
}

impl std::ops::DerefMut for NodeView {
    fn deref_mut(&mut self) -> &mut NodeFacts {
        Arc::make_mut(&mut self.facts)
    }
}

/// What the status reads of a Node besides its labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    /// What the status reads of the agent's status annotation, when
    /// present and parseable.
    pub agent: Option<AgentView>,
    /// The Node's `Ready` condition is True.
    pub ready: bool,
    pub kernel_version: String,
    pub boot_id: String,
    /// The node's driver upgrade record, when it parses. Boxed: facts are
    /// kept for every selected Node, and most have none.
    pub upgrade: Option<Box<UpgradeRecord>>,
    /// A remediation quarantines the node (its record's run).
    pub quarantined: bool,
}

/// What the status reads of an agent's report ([`AgentStatus`]), and only
/// that: a view is kept for every selected Node (130,000 in the largest
/// clusters), and a whole report held ~1.5 KB of the leader's memory per
/// Node, mostly its maps and the sections no status reads. The type is the
/// strip list: the status cannot read what is not here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentView {
    pub device_config: Option<ConfigKey>,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub services: Box<[(ServiceName, ServiceStatus)]>,
    pub gpus: usize,
    pub driver_version: Option<String>,
    pub driver: Option<DriverView>,
    /// The node's partition change failed.
    pub partition_failed: bool,
}

/// What the status reads of the agent's driver report ([`DriverReport`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverView {
    pub loaded: bool,
    pub version: Option<String>,
    pub kernel_release: Option<String>,
    pub boot_id: Option<String>,
}

impl From<AgentStatus> for AgentView {
    fn from(agent: AgentStatus) -> Self {
        Self {
            device_config: agent.device_config,
            uid: agent.uid,
            generation: agent.generation,
            services: agent.services.into_iter().collect(),
            gpus: agent.gpus,
            driver_version: agent.driver_version,
            driver: agent.driver.map(DriverView::from),
            partition_failed: agent.partition.is_some_and(|p| p.state == "failed"),
        }
    }
}

impl From<DriverReport> for DriverView {
    fn from(driver: DriverReport) -> Self {
        Self {
            loaded: driver.loaded,
            version: driver.version,
            kernel_release: driver.kernel_release,
            boot_id: driver.boot_id,
        }
    }
}

impl AgentView {
    /// How the agent reports `service`.
    pub fn service(&self, service: ServiceName) -> Option<&ServiceStatus> {
        self.services
            .iter()
            .find(|(name, _)| *name == service)
            .map(|(_, state)| state)
    }
}

/// A viewed Node's labels: the cached Node's own, shared, when the view is
/// of the leader's cache. A reconcile views every selected Node, and a copy
/// of each one's labels (30 on a kubelet's Node, ~2.8 KB) made the peak of
/// every reconcile grow by that much per Node.
#[derive(Clone)]
pub enum NodeLabels {
    Shared(Arc<Node>),
    Owned(BTreeMap<String, String>),
}

impl std::ops::Deref for NodeLabels {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        match self {
            Self::Shared(node) => node.labels(),
            Self::Owned(labels) => labels,
        }
    }
}

impl Default for NodeLabels {
    fn default() -> Self {
        Self::Owned(BTreeMap::new())
    }
}

impl PartialEq for NodeLabels {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for NodeLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl NodeView {
    /// The view of a Node of the leader's cache, sharing its labels.
    pub fn from_cached(node: &Arc<Node>) -> Self {
        Self {
            labels: NodeLabels::Shared(node.clone()),
            facts: Arc::new(NodeFacts::of(node)),
        }
    }

    pub fn from_node(node: &Node) -> Self {
        Self {
            labels: NodeLabels::Owned(node.labels().clone()),
            facts: Arc::new(NodeFacts::of(node)),
        }
    }
}

impl NodeFacts {
    /// Reads the facts of `node`: parses its agent-status, upgrade and
    /// remediation annotations.
    fn of(node: &Node) -> Self {
        let status = node.status.as_ref();
        let info = status.and_then(|s| s.node_info.as_ref());
        Self {
            name: node.name_any(),
            agent: node
                .annotations()
                .get(STATUS_ANNOTATION)
                .and_then(|text| AgentStatus::parse(text).ok())
                .map(AgentView::from),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            kernel_version: info.map(|i| i.kernel_version.clone()).unwrap_or_default(),
            boot_id: info.map(|i| i.boot_id.clone()).unwrap_or_default(),
            upgrade: UpgradeRecord::of_annotations(node.annotations()).map(Box::new),
            quarantined: crate::remediation::Record::of_annotations(node.annotations())
                .run
                .is_some_and(|r| r.quarantined),
        }
    }

    /// The agent reports that it follows this DeviceConfig.
    pub fn follows(&self, key: &ConfigKey, uid: Option<&str>) -> Option<&AgentView> {
        self.agent.as_ref().filter(|a| {
            a.device_config.as_ref() == Some(key) && (uid.is_none() || a.uid.as_deref() == uid)
        })
    }
}

/// The facts of the leader's cached Nodes, each read once per version of
/// its Node. Reading them parses the Node's agent-status, upgrade and
/// remediation annotations; a reconcile views every selected Node, and
/// reconciles run back to back while a fleet reports, so without this each
/// reconcile parsed 130,000 annotations that had not changed, and the Node
/// watch (on the same thread) fell behind the fleet.
///
/// Facts are kept per Node name with the `resourceVersion` they were read
/// at, not with the Node itself: holding a Node would keep its old version
/// alive beside the cache's new one until the next reconcile, twice the
/// cache while a fleet acknowledges a spec change. Shared by every
/// DeviceConfig's reconcile; no I/O.
#[derive(Default)]
pub struct ViewMemo {
    facts: Mutex<HashMap<String, (String, Arc<NodeFacts>)>>,
}

impl ViewMemo {
    /// The views of `nodes`, Nodes of the leader's cache, which holds
    /// `cached` Nodes now. Facts of Nodes gone from the cache are dropped
    /// once the memo holds more than the cache holds Nodes.
    pub fn views_of(&self, nodes: &[Arc<Node>], cached: usize) -> Vec<NodeView> {
        let mut memo = self.facts.lock().unwrap_or_else(PoisonError::into_inner);
        let views: Vec<NodeView> = nodes
            .iter()
            .map(|node| {
                let (Some(name), Some(version)) = (
                    node.metadata.name.as_deref(),
                    node.metadata.resource_version.as_deref(),
                ) else {
                    return NodeView::from_cached(node);
                };
                let facts = match memo.get(name) {
                    Some((read_at, facts)) if read_at == version => facts.clone(),
                    _ => {
                        let facts = Arc::new(NodeFacts::of(node));
                        memo.insert(name.to_owned(), (version.to_owned(), facts.clone()));
                        facts
                    }
                };
                NodeView {
                    labels: NodeLabels::Shared(node.clone()),
                    facts,
                }
            })
            .collect();
        if memo.len() > cached {
            // Some Node left the cache. Keeping only these Nodes' facts
            // drops it; another DeviceConfig's are read again once.
            let names: std::collections::HashSet<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            memo.retain(|name, _| names.contains(name.as_str()));
        }
        views
    }

    /// How many Nodes' facts are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.facts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Why a DeviceConfig cannot be applied: validation problems, missing references,
/// nodes claimed by another DeviceConfig.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problems {
    pub validation: Vec<String>,
    pub other: Vec<String>,
    /// Not a problem: the remediation mapping in force while remediation is
    /// enabled (reason, message), said by its own condition.
    pub remediation_mapping: Option<(&'static str, String)>,
}

/// The status to write. `previous` provides condition transition times and the
/// last observed generation, which only moves forward once every selected agent
/// reports that it applied the current generation.
pub fn desired_status(
    dc: &DeviceConfig,
    selected: &[NodeView],
    problems: &Problems,
    previous: Option<&DeviceConfigStatus>,
    now: &Time,
) -> DeviceConfigStatus {
    let key = ConfigKey::of(dc);
    let uid = dc.metadata.uid.as_deref();
    let generation = dc.metadata.generation.unwrap_or(0);
    let spec = &dc.spec;
    let matching = selected.len() as i32;
    let count =
        |pred: &dyn Fn(&NodeView) -> bool| selected.iter().filter(|n| pred(n)).count() as i32;
    // A NotReady node's annotation is the last its agent could write: its
    // services are not counted as available on its word.
    let service_running = |node: &NodeView, service: ServiceName| {
        node.ready
            && node
                .follows(&key, uid)
                .and_then(|a| a.service(service))
                .is_some_and(|s| s.is_available())
    };
    let deployment = |operand: Operand, service: Option<ServiceName>| DeploymentStatus {
        nodes_matching_selector_number: matching,
        desired_number: count(&|n| spec.runs_on(operand, &n.labels)),
        available_number: match service {
            Some(service) => {
                count(&|n| spec.runs_on(operand, &n.labels) && service_running(n, service))
            }
            None => 0,
        },
    };
    // As in the reference, the driver block counts only a driver the operator
    // manages: with `driver.enable: false` (the inbox driver) it stays empty.
    let driver = if spec.is_enabled(Operand::Driver) {
        DeploymentStatus {
            nodes_matching_selector_number: matching,
            desired_number: matching,
            // Available where the agent follows this config and sees it loaded.
            available_number: count(&|n| {
                n.ready
                    && n.follows(&key, uid)
                        .is_some_and(|a| a.driver_version.is_some() || a.gpus > 0)
            }),
        }
    } else {
        DeploymentStatus::default()
    };
    let previous_modules = previous.map(|p| &p.node_module_status);
    // None with the inbox driver; at most MODULE_STATUS_NODES.
    let listed_modules = if spec.is_enabled(Operand::Driver) {
        module_status_nodes(selected, &key)
    } else {
        Vec::new()
    };
    let node_module_status: BTreeMap<String, ModuleStatus> = listed_modules
        .into_iter()
        .map(|n| {
            let agent = n.follows(&key, uid);
            // The Node's own report first, as the reference reads it; the
            // agent's where the kubelet left it empty.
            let reported = |node: &str, of_agent: fn(&DriverView) -> Option<&String>| match node {
                "" => agent
                    .and_then(|a| a.driver.as_ref())
                    .and_then(of_agent)
                    .cloned()
                    .unwrap_or_default(),
                node => node.to_owned(),
            };
            let upgrade = n.upgrade.as_ref().filter(|r| r.device_config == key);
            let module = ModuleStatus {
                container_image: agent
                    .and_then(|a| a.driver_version.clone())
                    .map(|v| format!("amdgpu {v}"))
                    .unwrap_or_default(),
                kernel_version: reported(&n.kernel_version, |d| d.kernel_release.as_ref()),
                boot_id: reported(&n.boot_id, |d| d.boot_id.as_ref()),
                status: upgrade.map(|r| r.state.clone()),
                upgrade_start_time: upgrade.and_then(|r| r.started.clone()).unwrap_or_default(),
                ..ModuleStatus::default()
            };
            let last = previous_modules.and_then(|m| m.get(&n.name));
            let transition = match last {
                Some(last)
                    if ModuleStatus {
                        last_transition_time: String::new(),
                        ..last.clone()
                    } == module =>
                {
                    last.last_transition_time.clone()
                }
                _ => now.0.to_string(),
            };
            (
                n.name.clone(),
                ModuleStatus {
                    last_transition_time: transition,
                    ..module
                },
            )
        })
        .collect();
    let modules_left_out = if spec.is_enabled(Operand::Driver) {
        selected.len() - node_module_status.len()
    } else {
        0
    };

    let all_applied = !selected.is_empty()
        && selected.iter().all(|n| {
            n.follows(&key, uid)
                .is_some_and(|a| a.generation == Some(generation))
        });
    let observed_generation =
        if all_applied || (selected.is_empty() && problems.validation.is_empty()) {
            generation
        } else {
            previous.map_or(0, |p| p.observed_generation)
        };

    let (ready, error) = if !problems.validation.is_empty() {
        let message = problems.validation.join("; ");
        (
            ("False", REASON_VALIDATION_ERROR, message.clone()),
            ("True", REASON_VALIDATION_ERROR, message),
        )
    } else if !problems.other.is_empty() {
        let message = problems.other.join("; ");
        (
            ("False", REASON_ERROR, message.clone()),
            ("True", REASON_ERROR, message),
        )
    } else if let Some(message) = not_serving_message(selected, &key, uid) {
        (
            ("False", REASON_NODES_NOT_SERVING, message),
            ("False", REASON_NODES_NOT_SERVING, String::new()),
        )
    } else if selected.is_empty() {
        (
            (
                "False",
                REASON_NO_MATCHING_NODES,
                "the selector matches no node".to_owned(),
            ),
            ("False", REASON_NO_MATCHING_NODES, String::new()),
        )
    } else {
        (
            (
                "True",
                REASON_OPERATOR_READY,
                match modules_left_out {
                    0 => format!("applied to {matching} node(s)"),
                    _ => format!(
                        "applied to {matching} node(s); nodeModuleStatus lists {} of them",
                        node_module_status.len()
                    ),
                },
            ),
            ("False", REASON_OPERATOR_READY, String::new()),
        )
    };
    let previous_conditions = previous.map(|p| p.conditions.as_slice()).unwrap_or(&[]);
    let mut conditions = vec![
        condition(CONDITION_READY, ready, generation, previous_conditions, now),
        condition(CONDITION_ERROR, error, generation, previous_conditions, now),
    ];
    if let Some((reason, message)) = &problems.remediation_mapping {
        let status = if *reason == REASON_NO_MAPPING {
            "False"
        } else {
            "True"
        };
        conditions.push(condition(
            CONDITION_REMEDIATION_MAPPING,
            (status, reason, message.clone()),
            generation,
            previous_conditions,
            now,
        ));
    }

    let driver_upgrade = upgrade_summary(dc, selected);
    DeviceConfigStatus {
        driver_upgrade,
        device_plugin: deployment(Operand::DevicePlugin, Some(ServiceName::DevicePlugin)),
        driver,
        metrics_exporter: deployment(Operand::MetricsExporter, Some(ServiceName::MetricsExporter)),
        // Available where the agent follows this config and its partition
        // change, if the Node asks for one, has not failed.
        config_manager: DeploymentStatus {
            available_number: count(&|n| {
                spec.runs_on(Operand::ConfigManager, &n.labels)
                    && n.ready
                    && n.follows(&key, uid).is_some_and(|a| !a.partition_failed)
            }),
            ..deployment(Operand::ConfigManager, None)
        },
        remediation_workflow: DeploymentStatus {
            nodes_matching_selector_number: matching,
            desired_number: if spec.remediation_workflow.is_enabled() {
                matching
            } else {
                0
            },
            // Selected nodes no remediation quarantines: those pods may use.
            available_number: if spec.remediation_workflow.is_enabled() {
                count(&|n| !n.quarantined)
            } else {
                0
            },
        },
        node_module_status,
        conditions,
        observed_generation,
    }
}

/// The most nodes `nodeModuleStatus` lists. The reference lists every
/// selected node; at ~230 bytes an entry, the status of a DeviceConfig that
/// selects more than ~6,000 nodes would outgrow what etcd stores (1.5 MiB),
/// every status write would fail, and each write near that size costs the
/// API server and every watcher of DeviceConfigs megabytes. The counts above
/// it cover every node.
pub const MODULE_STATUS_NODES: usize = 1_000;

/// The nodes `nodeModuleStatus` lists: every selected node up to
/// [`MODULE_STATUS_NODES`]; past that, the nodes in `key`'s upgrade first
/// (failed, then in progress), then the rest by name, so that the entries
/// an administrator looks for during an upgrade are there and the list does
/// not change with the order the cache returns Nodes in.
fn module_status_nodes<'a>(selected: &'a [NodeView], key: &ConfigKey) -> Vec<&'a NodeView> {
    let mut nodes: Vec<&NodeView> = selected.iter().collect();
    if nodes.len() <= MODULE_STATUS_NODES {
        return nodes;
    }
    let rank = |n: &NodeView| match n.upgrade.as_ref().filter(|r| r.device_config == *key) {
        Some(r) if r.state.is_failed() => 0,
        Some(r) if r.state.is_in_progress() => 1,
        _ => 2,
    };
    let order = |a: &&NodeView, b: &&NodeView| (rank(a), &a.name).cmp(&(rank(b), &b.name));
    // Selecting before sorting: O(n) over the fleet, a sort of the kept only.
    nodes.select_nth_unstable_by(MODULE_STATUS_NODES, order);
    nodes.truncate(MODULE_STATUS_NODES);
    nodes.sort_unstable_by(order);
    nodes
}

/// The rolling upgrade's counts over `selected`, when `dc` rolls upgrades
/// (`driver.upgradePolicy.enable` and a `driver.version`). A node without a
/// record of this DeviceConfig counts as complete when its agent reports
/// the target loaded, else as not started.
fn upgrade_summary(dc: &DeviceConfig, selected: &[NodeView]) -> Option<UpgradeSummary> {
    let driver = dc.spec.driver();
    let rolling = dc.spec.is_enabled(Operand::Driver)
        && driver.upgrade_policy.as_ref().and_then(|p| p.enable) == Some(true);
    let target = driver.version.clone().filter(|_| rolling)?;
    let key = ConfigKey::of(dc);
    let mut summary = UpgradeSummary {
        target: target.clone(),
        ..UpgradeSummary::default()
    };
    for node in selected {
        let state = node
            .upgrade
            .as_ref()
            .filter(|r| r.device_config == key)
            .map(|r| r.state.clone());
        let runs_target = || {
            node.agent
                .as_ref()
                .and_then(|a| a.driver.as_ref())
                .is_some_and(|d| d.loaded && d.version.as_deref() == Some(target.as_str()))
        };
        let slot = match state {
            Some(s) if s.is_complete() => &mut summary.complete,
            Some(s) if s.is_in_progress() => &mut summary.in_progress,
            Some(s) if s.is_failed() => &mut summary.failed,
            Some(_) => &mut summary.not_started,
            None if runs_target() => &mut summary.complete,
            None => &mut summary.not_started,
        };
        *slot += 1;
    }
    Some(summary)
}

/// Whether a selected node serves what the DeviceConfig enables: it is
/// Ready, its agent follows this DeviceConfig and reports every service
/// available. [`why_not_serving`] says why not.
fn serves(node: &NodeView, key: &ConfigKey, uid: Option<&str>) -> bool {
    node.ready
        && node.follows(key, uid).is_some_and(|agent| {
            agent
                .services
                .iter()
                .all(|(name, state)| *name == ServiceName::Unknown || state.is_available())
        })
}

/// Why a node that does not [`serves`] does not.
fn why_not_serving(node: &NodeView, key: &ConfigKey, uid: Option<&str>) -> String {
    if !node.ready {
        return "the Node is not Ready".to_owned();
    }
    let Some(agent) = node.follows(key, uid) else {
        return match &node.agent {
            None => "no agent status yet".to_owned(),
            Some(_) => "its agent does not follow this DeviceConfig yet".to_owned(),
        };
    };
    agent
        .services
        .iter()
        .filter(|(name, _)| *name != ServiceName::Unknown)
        .filter_map(|(name, state)| state.unavailable_reason().map(|r| format!("{name}: {r}")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Ready message when some selected nodes do not serve; `None` when all
/// do. It names the first [`NODES_NAMED`] of them by name, so that the
/// message does not change with the order the cache returns Nodes in, and
/// says why only for those: while a fleet of 130,000 reports, most do not
/// serve yet.
fn not_serving_message(
    selected: &[NodeView],
    key: &ConfigKey,
    uid: Option<&str>,
) -> Option<String> {
    let mut failing: Vec<&NodeView> = selected.iter().filter(|n| !serves(n, key, uid)).collect();
    if failing.is_empty() {
        return None;
    }
    let count = failing.len();
    let by_name = |a: &&NodeView, b: &&NodeView| a.name.cmp(&b.name);
    if count > NODES_NAMED {
        failing.select_nth_unstable_by(NODES_NAMED, by_name);
        failing.truncate(NODES_NAMED);
    }
    failing.sort_unstable_by(by_name);
    let mut named: Vec<String> = failing
        .iter()
        .map(|n| format!("{}: {}", n.name, why_not_serving(n, key, uid)))
        .collect();
    if count > NODES_NAMED {
        named.push(format!("and {} more", count - NODES_NAMED));
    }
    Some(format!(
        "{count} of {} node(s) not serving: {}",
        selected.len(),
        named.join("; ")
    ))
}

/// A condition that keeps its transition time while its status is unchanged.
fn condition(
    type_: &str,
    (status, reason, message): (&str, &str, String),
    generation: i64,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: Some(generation),
        last_transition_time,
    }
}

/// True when two statuses differ in anything a person would notice: transition
/// times alone do not count.
pub fn status_changed(current: Option<&DeviceConfigStatus>, desired: &DeviceConfigStatus) -> bool {
    let Some(current) = current else {
        return true;
    };
    let strip = |s: &DeviceConfigStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        for m in s.node_module_status.values_mut() {
            m.last_transition_time.clear();
        }
        s
    };
    strip(current) != strip(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceConfigSpec;

    /// A DeviceConfig with `driver: {}` and `devicePlugin: {}`: both on by
    /// the reference's defaults inside a written section.
    fn dc(generation: i64) -> DeviceConfig {
        let spec = DeviceConfigSpec {
            driver: Some(Default::default()),
            device_plugin: Some(Default::default()),
            ..Default::default()
        };
        let mut dc = DeviceConfig::new("gpus", spec);
        dc.metadata.namespace = Some("ns".into());
        dc.metadata.uid = Some("uid-1".into());
        dc.metadata.generation = Some(generation);
        dc
    }

    fn node(name: &str, generation: Option<i64>, plugin_running: bool) -> NodeView {
        let facts = NodeFacts {
            name: name.into(),
            ready: true,
            agent: generation.map(|g| AgentView {
                device_config: Some("ns/gpus".into()),
                uid: Some("uid-1".into()),
                generation: Some(g),
                services: if plugin_running {
                    [(ServiceName::DevicePlugin, ServiceStatus::Running)].into()
                } else {
                    Box::default()
                },
                gpus: 8,
                driver_version: Some("6.12.12".into()),
                ..AgentView::default()
            }),
            ..NodeFacts::default()
        };
        NodeView {
            facts: Arc::new(facts),
            ..NodeView::default()
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn cond<'a>(status: &'a DeviceConfigStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn a_node_that_is_not_ready_is_not_counted_available_on_its_last_word() {
        let mut gone = node("b", Some(2), true);
        gone.ready = false;
        let nodes = [node("a", Some(2), true), gone];
        let status = desired_status(&dc(2), &nodes, &Problems::default(), None, &now());
        assert_eq!(status.device_plugin.desired_number, 2);
        assert_eq!(status.device_plugin.available_number, 1);
        assert_eq!(status.driver.available_number, 1);
        let ready = cond(&status, CONDITION_READY);
        assert_eq!(ready.status, "False");
        assert!(ready.message.contains("not Ready"), "{}", ready.message);
    }

    #[test]
    fn counts_and_ready_when_all_agents_applied_the_generation() {
        let nodes = [node("a", Some(2), true), node("b", Some(2), true)];
        let status = desired_status(&dc(2), &nodes, &Problems::default(), None, &now());
        assert_eq!(status.device_plugin.nodes_matching_selector_number, 2);
        assert_eq!(status.device_plugin.desired_number, 2);
        assert_eq!(status.device_plugin.available_number, 2);
        assert_eq!(status.driver.available_number, 2);
        assert_eq!(status.observed_generation, 2);
        assert_eq!(cond(&status, "Ready").status, "True");
        assert_eq!(cond(&status, "Ready").reason, "OperatorReady");
        assert_eq!(cond(&status, "Error").status, "False");
        assert_eq!(status.node_module_status.len(), 2);
    }

    #[test]
    fn node_module_status_takes_the_kernel_and_boot_from_the_node_else_the_agent() {
        let mut from_agent = node("a", Some(2), true);
        if let Some(agent) = from_agent.agent.as_mut() {
            agent.driver = Some(DriverView {
                kernel_release: Some("6.8.0-57-generic".into()),
                boot_id: Some("agent-boot".into()),
                ..DriverView::default()
            });
        }
        let mut from_node = from_agent.clone();
        from_node.name = "b".into();
        from_node.kernel_version = "6.8.0-60-generic".into();
        from_node.boot_id = "node-boot".into();
        let status = desired_status(
            &dc(2),
            &[from_agent, from_node],
            &Problems::default(),
            None,
            &now(),
        );
        let a = &status.node_module_status["a"];
        assert_eq!(
            (a.kernel_version.as_str(), a.boot_id.as_str()),
            ("6.8.0-57-generic", "agent-boot")
        );
        assert_eq!(a.container_image, "amdgpu 6.12.12");
        let b = &status.node_module_status["b"];
        assert_eq!(
            (b.kernel_version.as_str(), b.boot_id.as_str()),
            ("6.8.0-60-generic", "node-boot")
        );
    }

    /// Absent `driver` and `devicePlugin` sections are off, as in the
    /// reference: nothing is desired of them, and Ready does not wait on them.
    #[test]
    fn absent_sections_are_not_desired() {
        let mut config = dc(2);
        config.spec.driver = None;
        config.spec.device_plugin = None;
        let nodes = [node("a", Some(2), false), node("b", Some(2), false)];
        let status = desired_status(&config, &nodes, &Problems::default(), None, &now());
        assert_eq!(status.device_plugin.nodes_matching_selector_number, 2);
        assert_eq!(
            (
                status.device_plugin.desired_number,
                status.device_plugin.available_number
            ),
            (0, 0)
        );
        assert_eq!(status.driver, DeploymentStatus::default());
        assert!(status.node_module_status.is_empty());
        assert_eq!(cond(&status, "Ready").status, "True");
    }

    #[test]
    fn observed_generation_waits_for_every_agent() {
        let previous = DeviceConfigStatus {
            observed_generation: 1,
            ..DeviceConfigStatus::default()
        };
        let nodes = [
            node("a", Some(2), true),
            node("b", Some(1), false),
            node("c", None, false),
        ];
        let status = desired_status(
            &dc(2),
            &nodes,
            &Problems::default(),
            Some(&previous),
            &now(),
        );
        assert_eq!(status.observed_generation, 1);
        assert_eq!(status.device_plugin.available_number, 1);
    }

    #[test]
    fn ready_only_when_every_node_serves_and_says_which_do_not() {
        let mut unregistered = node("b", Some(1), false);
        if let Some(agent) = unregistered.agent.as_mut() {
            agent.services = [
                (
                    ServiceName::DevicePlugin,
                    ServiceStatus::Unavailable {
                        reason: "not registered with the kubelet (amd.com/gpu: cannot connect)"
                            .into(),
                    },
                ),
                (ServiceName::MetricsExporter, ServiceStatus::Running),
            ]
            .into();
        }
        let nodes = [
            node("a", Some(1), true),
            unregistered,
            node("c", None, false),
        ];
        let status = desired_status(&dc(1), &nodes, &Problems::default(), None, &now());
        assert_eq!(status.device_plugin.available_number, 1);
        let ready = cond(&status, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "NodesNotServing");
        assert_eq!(
            ready.message,
            "2 of 3 node(s) not serving: b: devicePlugin: not registered with the kubelet \
             (amd.com/gpu: cannot connect); c: no agent status yet"
        );
        assert_eq!(cond(&status, "Error").status, "False");

        let mut not_ready = node("a", Some(1), true);
        not_ready.ready = false;
        let status = desired_status(&dc(1), &[not_ready], &Problems::default(), None, &now());
        assert!(
            cond(&status, "Ready")
                .message
                .contains("a: the Node is not Ready")
        );

        let many: Vec<NodeView> = (0..8)
            .map(|i| node(&format!("n{i}"), None, false))
            .collect();
        let status = desired_status(&dc(1), &many, &Problems::default(), None, &now());
        assert!(
            cond(&status, "Ready")
                .message
                .ends_with("n4: no agent status yet; and 3 more")
        );
        // Named by name, whatever order the cache gives the Nodes in: the
        // message (and so the status) does not change with it.
        let reversed: Vec<NodeView> = many.into_iter().rev().collect();
        let again = desired_status(&dc(1), &reversed, &Problems::default(), None, &now());
        assert_eq!(
            cond(&again, "Ready").message,
            cond(&status, "Ready").message
        );
    }

    #[test]
    fn node_module_status_is_bounded_with_the_upgrading_nodes_listed_first() {
        use crate::api::UpgradeState;
        let upgrading = |name: &str, state: UpgradeState| {
            let mut view = node(name, Some(1), true);
            view.upgrade = Some(Box::new(UpgradeRecord::new("ns/gpus".into(), state, "")));
            view
        };
        let extra = 50;
        let mut nodes: Vec<NodeView> = (0..MODULE_STATUS_NODES + extra)
            .rev()
            .map(|i| node(&format!("n{i:05}"), Some(1), true))
            .collect();
        nodes.push(upgrading("z-failed", UpgradeState::Failed));
        nodes.push(upgrading("z-started", UpgradeState::Started));
        let status = desired_status(&dc(1), &nodes, &Problems::default(), None, &now());
        let listed = &status.node_module_status;
        assert_eq!(listed.len(), MODULE_STATUS_NODES);
        assert!(listed.contains_key("z-failed") && listed.contains_key("z-started"));
        assert!(listed.contains_key("n00000"));
        let last_kept = format!("n{:05}", MODULE_STATUS_NODES - 3);
        let first_left = format!("n{:05}", MODULE_STATUS_NODES - 2);
        assert!(listed.contains_key(&last_kept) && !listed.contains_key(&first_left));
        assert_eq!(status.driver.available_number, nodes.len() as i32);
        assert_eq!(
            cond(&status, "Ready").message,
            format!(
                "applied to {} node(s); nodeModuleStatus lists {MODULE_STATUS_NODES} of them",
                nodes.len()
            )
        );
        // The status of the largest fleets fits what etcd stores (1.5 MiB).
        let written = serde_json::to_vec(&status).unwrap();
        assert!(written.len() < 512 * 1024, "{} bytes", written.len());
    }

    #[test]
    fn a_nodes_facts_are_read_once_per_version_of_it() {
        let node = |name: &str, version: &str, annotation: &str| {
            let mut n = Node::default();
            n.metadata.name = Some(name.into());
            n.metadata.resource_version = Some(version.into());
            n.metadata.annotations =
                Some([(STATUS_ANNOTATION.to_owned(), annotation.to_owned())].into());
            Arc::new(n)
        };
        let reporting = AgentStatus {
            v: 1,
            gpus: 8,
            ..AgentStatus::default()
        };
        let text = serde_json::to_string(&reporting).unwrap();
        let memo = ViewMemo::default();
        let (a, b) = (node("a", "1", &text), node("b", "2", "not json"));
        let first = memo.views_of(&[a.clone(), b.clone()], 2);
        assert_eq!(first[0].agent.as_ref().map(|s| s.gpus), Some(8));
        assert!(first[1].agent.is_none());
        let again = memo.views_of(&[a.clone(), b.clone()], 2);
        assert!(Arc::ptr_eq(&first[0].facts, &again[0].facts));
        assert!(Arc::ptr_eq(&first[1].facts, &again[1].facts));
        // A new version of `b` is read afresh; the old one is not held.
        let b2 = node("b", "3", &text);
        let after = memo.views_of(&[a.clone(), b2.clone()], 2);
        assert!(Arc::ptr_eq(&first[0].facts, &after[0].facts));
        assert_eq!(after[1].agent.as_ref().map(|s| s.gpus), Some(8));
        drop((first, again));
        assert_eq!(Arc::strong_count(&b), 1, "the memo holds no Node");
        // The view's labels are the cached Node's own.
        assert!(matches!(&after[1].labels, NodeLabels::Shared(n) if Arc::ptr_eq(n, &b2)));
        // `a` left the cache: its facts go once the memo outgrows it.
        memo.views_of(&[b2], 1);
        assert_eq!(memo.len(), 1);
    }

    #[test]
    fn the_inbox_driver_leaves_the_driver_block_empty_as_the_reference_does() {
        let mut inbox = dc(1);
        inbox.spec.driver_mut().enable = false;
        let nodes = [node("a", Some(1), true)];
        let status = desired_status(&inbox, &nodes, &Problems::default(), None, &now());
        assert_eq!(status.driver, DeploymentStatus::default());
        assert!(status.node_module_status.is_empty());
        assert_eq!(status.device_plugin.available_number, 1);
    }

    #[test]
    fn the_remediation_mapping_in_force_has_a_condition_of_its_own() {
        let nodes = [node("a", Some(2), true)];
        let quiet = desired_status(&dc(2), &nodes, &Problems::default(), None, &now());
        assert!(
            quiet
                .conditions
                .iter()
                .all(|c| c.type_ != CONDITION_REMEDIATION_MAPPING),
            "none while remediation is off"
        );
        let problems = Problems {
            remediation_mapping: Some((
                crate::api::REASON_BUILTIN_MAPPING,
                "built-in mapping (24 conditions)".into(),
            )),
            ..Problems::default()
        };
        let status = desired_status(&dc(2), &nodes, &problems, None, &now());
        let mapping = cond(&status, CONDITION_REMEDIATION_MAPPING);
        assert_eq!(
            (mapping.status.as_str(), mapping.reason.as_str()),
            ("True", "BuiltInMapping")
        );
        assert!(mapping.message.contains("24 conditions"));
        assert_eq!(cond(&status, "Ready").status, "True", "not a problem");
    }

    #[test]
    fn validation_errors_and_no_matching_nodes() {
        let problems = Problems {
            validation: vec!["spec.x: bad".into()],
            ..Problems::default()
        };
        let status = desired_status(&dc(1), &[], &problems, None, &now());
        assert_eq!(cond(&status, "Ready").status, "False");
        assert_eq!(cond(&status, "Error").status, "True");
        assert_eq!(cond(&status, "Error").reason, "ValidationError");
        assert!(cond(&status, "Error").message.contains("spec.x: bad"));
        let status = desired_status(&dc(1), &[], &Problems::default(), None, &now());
        assert_eq!(cond(&status, "Ready").reason, "NoMatchingNodes");
    }

    #[test]
    fn transition_times_are_kept_and_do_not_count_as_changes() {
        let nodes = [node("a", Some(1), true)];
        let first = desired_status(&dc(1), &nodes, &Problems::default(), None, &now());
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_100).unwrap());
        let second = desired_status(&dc(1), &nodes, &Problems::default(), Some(&first), &later);
        assert_eq!(first, second, "nothing changed, not even times");
        assert!(!status_changed(Some(&first), &second));
        let fewer = desired_status(&dc(1), &[], &Problems::default(), Some(&first), &later);
        assert!(status_changed(Some(&first), &fewer));
        assert_eq!(cond(&fewer, "Ready").last_transition_time, later);
    }
}
