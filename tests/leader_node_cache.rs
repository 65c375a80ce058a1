//! The leader's Node cache (`cluster::node_cache`) keeps exactly the fields
//! its module docs list, and every decision the leader makes on a cached
//! Node comes out the same on what is kept as on the Node a kubelet wrote.
//! A decision that starts reading a dropped field (`status.images`, say)
//! fails the second test until the field is kept and listed.

mod support;

use std::collections::BTreeSet;

use gpu_operator::api::UpgradeState;
use gpu_operator::api::agent_status::ConfigKey;
use gpu_operator::api::driver_upgrade::{self, UpgradeRecord};
use gpu_operator::api::{DeviceConfig, Operand};
use gpu_operator::cluster::node_cache::{KEPT_ANNOTATIONS, KeptLabels, kept_of};
use gpu_operator::cluster::status::NodeView;
use gpu_operator::cluster::{device_classes, node_relevance, partitioner, remediator, upgrader};
use gpu_operator::node_writer::{Concern, NodeIntent, plan_metadata};
use gpu_operator::partition;
use gpu_operator::remediation;
use k8s_openapi::api::core::v1::Node;
use kubelet_node::kubelet_node;
use serde_json::{Value, json};
use support::fixtures::{AgentStatusBuilder, DeviceConfigBuilder, loaded_driver};
use support::kubelet_node;

const NS: &str = "kube-amd-gpu";
const CONDITION: &str = "AMDGPUHardwareAssertionHwa";
const SINCE: &str = "2026-12-01T00:00:00Z";

fn agent_status(boot: &str) -> String {
    AgentStatusBuilder::serving(NS, "fleet")
        .acting_on("uid-fleet", 1)
        // What a DRA node reports, for the per-layout DeviceClasses.
        .layout("cpx_nps4")
        .driver(loaded_driver("6.12.12", boot))
        .since(SINCE)
        .to_json()
}

fn device_config() -> DeviceConfig {
    DeviceConfigBuilder::fleet(NS)
        .metadata("uid", json!("uid-fleet"))
        .metadata("generation", json!(1))
        .spec(
            "driver",
            json!({"enable": true, "version": "6.14.0",
                "upgradePolicy": {"enable": true, "maxParallelUpgrades": 2}}),
        )
        .spec("devicePlugin", json!({}))
        .spec("configManager", json!({"enable": true}))
        .spec("remediationWorkflow", json!({"enable": true}))
        .build()
}

/// Nodes in each state the leader's decisions tell apart, as a kubelet
/// wrote them and with what the operator put on them.
fn fleet() -> Vec<Value> {
    let key = ConfigKey::new(NS, "fleet");
    let mut nodes = Vec::new();
    let with_uid = |mut v: Value, i: usize| {
        v["metadata"]["uid"] = json!(format!("uid-{i}"));
        v["metadata"]["resourceVersion"] = json!(format!("{}", 100 + i));
        v
    };
    // Serving, reported by its agent.
    nodes.push(with_uid(kubelet_node(0, Some(&agent_status("boot-0"))), 0));
    // Not Ready, a mapped condition True, under remediation and quarantined.
    let mut sick = with_uid(kubelet_node(1, Some(&agent_status("boot-1"))), 1);
    sick["status"]["conditions"][3]["status"] = json!("False");
    sick["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(json!({"type": CONDITION, "status": "True", "reason": "Hwa",
            "message": "hardware assertion", "lastHeartbeatTime": SINCE,
            "lastTransitionTime": SINCE}));
    let entry = remediation::Entry {
        node_condition: CONDITION.into(),
        ..remediation::Entry::default()
    };
    let record = remediation::Record {
        run: Some(remediation::Run::begin(
            &entry,
            remediation::Phase::Draining,
            true,
            SINCE,
        )),
        attempts: Vec::new(),
    };
    sick["metadata"]["annotations"][remediation::RECORD_ANNOTATION] =
        json!(record.to_annotation().expect("a run"));
    sick["spec"]["taints"] = json!([{"key": "amd-gpu-unhealthy", "value": CONDITION,
        "effect": "NoSchedule"}]);
    nodes.push(sick);
    // Mid-upgrade: cordoned by it, tainted, its state label set.
    let mut upgrading = with_uid(kubelet_node(2, Some(&agent_status("boot-2"))), 2);
    let mut record = UpgradeRecord::new(key.clone(), UpgradeState::InProgress, SINCE);
    record.started = Some(SINCE.into());
    record.target = Some("6.14.0".into());
    record.cordoned_before = Some(false);
    upgrading["metadata"]["annotations"][driver_upgrade::RECORD_ANNOTATION] =
        json!(record.to_json());
    upgrading["metadata"]["labels"][driver_upgrade::STATE_LABEL] = json!("upgrade-in-progress");
    upgrading["spec"]["unschedulable"] = json!(true);
    upgrading["spec"]["taints"] = json!([{"key": driver_upgrade::TAINT_KEY,
        "effect": "NoSchedule"}]);
    upgrading["metadata"]["managedFields"]
        .as_array_mut()
        .expect("managedFields")
        .push(json!({"manager": gpu_operator::api::field_manager::UPGRADE,
            "operation": "Apply", "apiVersion": "v1", "time": SINCE, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {
                "f:annotations": {format!("f:{}", driver_upgrade::RECORD_ANNOTATION): {}},
                "f:labels": {format!("f:{}", driver_upgrade::STATE_LABEL): {}}}}}));
    // A person set the state label too (to retry, say): theirs as well as ours.
    upgrading["metadata"]["managedFields"]
        .as_array_mut()
        .expect("managedFields")
        .push(
            json!({"manager": "kubectl-label", "operation": "Update", "apiVersion": "v1",
            "time": SINCE, "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                "f:labels": {format!("f:{}", driver_upgrade::STATE_LABEL): {}}}}}),
        );
    nodes.push(upgrading);
    // Changing partition profile: its drain recorded, the reference's taint on.
    let mut partitioning = with_uid(kubelet_node(3, Some(&agent_status("boot-3"))), 3);
    partitioning["metadata"]["labels"][partition::PROFILE_LABEL] = json!("cpx_nps4");
    partitioning["metadata"]["labels"][partition::STATE_LABEL] = json!("pending");
    let record = partition::state::Record {
        profile: "cpx_nps4".into(),
        phase: partition::state::Phase::Draining,
        person_cordoned: false,
        reason: None,
        reference_taint: false,
    };
    partitioning["metadata"]["annotations"][partition::state::RECORD_ANNOTATION] =
        json!(record.to_json());
    partitioning["spec"]["taints"] = json!([{"key": partition::state::REFERENCE_TAINT_KEY,
        "value": partition::state::REFERENCE_TAINT_VALUE, "effect": "NoExecute"}]);
    nodes.push(partitioning);
    // Registered, its agent not up yet.
    nodes.push(with_uid(kubelet_node(4, None), 4));
    nodes
}

fn node(value: &Value) -> Node {
    serde_json::from_value(value.clone()).expect("a Node")
}

/// Every decision the leader takes on a Node of its cache, as text.
fn decisions(dc: &DeviceConfig, node: &Node) -> Vec<String> {
    // The status views a Node's labels through the selectors alone, and
    // the watch hashes the Node the cache holds: both see only the labels
    // the cache keeps, whose choice the selector decisions below check.
    let kept_labels = KeptLabels::for_configs([dc]);
    let mut labels_kept = node.clone();
    labels_kept
        .metadata
        .labels
        .get_or_insert_default()
        .retain(|k, _| kept_labels.keeps(k));
    let key = ConfigKey::of(dc);
    let now: k8s_openapi::jiff::Timestamp = SINCE.parse().expect("a time");
    let record = UpgradeRecord::of_annotations(kube::ResourceExt::annotations(node));
    let upgrade_record = NodeIntent {
        labels: [(
            driver_upgrade::STATE_LABEL.to_owned(),
            "upgrade-done".to_owned(),
        )]
        .into(),
        annotations: [(
            driver_upgrade::RECORD_ANNOTATION.to_owned(),
            "{}".to_owned(),
        )]
        .into(),
        ..NodeIntent::default()
    };
    let operands = [
        Operand::Driver,
        Operand::DevicePlugin,
        Operand::NodeLabeller,
        Operand::DraDriver,
        Operand::MetricsExporter,
        Operand::TestRunner,
        Operand::ConfigManager,
    ];
    vec![
        format!("{:?}", NodeView::from_node(&labels_kept)),
        format!("{}", node_relevance(&labels_kept)),
        format!("{}", dc.spec.selects(kube::ResourceExt::labels(node))),
        format!(
            "{:?}",
            operands.map(|o| dc.spec.runs_on(o, kube::ResourceExt::labels(node)))
        ),
        format!(
            "{:?}",
            upgrader::facts_of(node, &key, Some("6.14.0"), record.as_ref(), None, now)
        ),
        format!(
            "{:?}",
            remediator::facts_of(node, &dc.spec.remediation_workflow, None)
        ),
        format!("{:?}", partitioner::facts_of(dc, node)),
        format!("{:?}", device_classes::layouts_present([node])),
        // The upgrade record is written deciding on the cached Node.
        format!(
            "{:?}",
            plan_metadata(node, Concern::Upgrade, &upgrade_record)
        ),
        format!(
            "{:?}",
            plan_metadata(node, Concern::Upgrade, &NodeIntent::default())
        ),
    ]
}

#[test]
fn every_decision_on_a_kept_node_is_the_one_on_the_full_node() {
    let dc = device_config();
    for full in fleet() {
        let full = node(&full);
        let kept = kept_of(full.clone(), &KeptLabels::for_configs([&dc]));
        // The reconciler views cached Nodes sharing their labels.
        assert_eq!(
            NodeView::from_cached(&std::sync::Arc::new(kept.clone())),
            NodeView::from_node(&kept)
        );
        assert_eq!(
            decisions(&dc, &kept),
            decisions(&dc, &full),
            "a leader decision on {} reads a field the cache drops: keep it in \
             cluster::node_cache (and say why)",
            full.metadata.name.as_deref().unwrap_or_default()
        );
    }
}

#[test]
fn the_fixture_tells_a_decision_that_reads_a_dropped_field() {
    // What the test above would catch: a decision that reads the images.
    let reads_images = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.images.as_ref())
            .map_or(0, Vec::len)
    };
    for full in fleet() {
        let full = node(&full);
        let kept = kept_of(full.clone(), &KeptLabels::for_configs([&device_config()]));
        assert_ne!(reads_images(&kept), reads_images(&full));
    }
}

#[test]
fn the_fixture_tells_a_decision_that_reads_a_label_no_selector_names() {
    // What the first test would catch: a decision on the hostname label.
    let reads_hostname = |n: &Node| {
        kube::ResourceExt::labels(n)
            .get("kubernetes.io/hostname")
            .cloned()
    };
    let kept_labels = KeptLabels::for_configs([&device_config()]);
    for full in fleet() {
        let full = node(&full);
        let kept = kept_of(full.clone(), &kept_labels);
        assert_ne!(reads_hostname(&kept), reads_hostname(&full));
    }
}

#[test]
fn the_labels_kept_are_the_operators_and_those_a_selector_names() {
    let full = node(&fleet()[3]);
    let kept_keys = |dc: &DeviceConfig| -> Vec<String> {
        kube::ResourceExt::labels(&kept_of(full.clone(), &KeptLabels::for_configs([dc])))
            .keys()
            .cloned()
            .collect()
    };
    assert!(kube::ResourceExt::labels(&full).len() >= 30);
    assert_eq!(
        kept_keys(&device_config()),
        [
            partition::PROFILE_LABEL,
            partition::STATE_LABEL,
            gpu_operator::detect::GPU_LABEL,
        ]
    );
    // Another DeviceConfig selecting by zone, its partitions by instance
    // type: those keys are kept instead, and every decision is the same.
    let by_zone = DeviceConfigBuilder::new(NS, "zone")
        .spec(
            "selector",
            json!({"topology.kubernetes.io/zone": "us-central-0"}),
        )
        .spec(
            "configManager",
            json!({"enable": true,
                "selector": {"node.kubernetes.io/instance-type": "mi300x-8gpu"}}),
        )
        .spec("devicePlugin", json!({}))
        .build();
    assert_eq!(
        kept_keys(&by_zone),
        [
            partition::PROFILE_LABEL,
            partition::STATE_LABEL,
            "node.kubernetes.io/instance-type",
            "topology.kubernetes.io/zone",
        ]
    );
    for full in fleet() {
        let full = node(&full);
        let kept = kept_of(full.clone(), &KeptLabels::for_configs([&by_zone]));
        assert_eq!(decisions(&by_zone, &kept), decisions(&by_zone, &full));
    }
}

/// The paths of `v`'s non-empty leaves, list items merged (`[]`), the keys
/// of label maps as `*`.
fn paths(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let here = if at.ends_with("labels") || at.ends_with("f:labels") {
                    format!("{at}.*")
                } else if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                paths(child, &here, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                paths(item, &format!("{at}[]"), out);
            }
        }
        Value::String(s) if s.is_empty() => {}
        Value::Null => {}
        _ => {
            out.insert(at.to_owned());
        }
    }
}

#[test]
fn the_cache_keeps_exactly_the_listed_fields() {
    let mut expected: BTreeSet<String> = [
        "metadata.name",
        "metadata.uid",
        "metadata.resourceVersion",
        "metadata.labels.*",
        "metadata.managedFields[].manager",
        "metadata.managedFields[].operation",
        "metadata.managedFields[].fieldsType",
        "metadata.managedFields[].fieldsV1.f:metadata.f:labels.*",
        "spec.unschedulable",
        "spec.taints[].key",
        "spec.taints[].value",
        "spec.taints[].effect",
        "status.conditions[].type",
        "status.conditions[].status",
        "status.conditions[].reason",
        "status.conditions[].message",
        "status.nodeInfo.bootID",
        "status.nodeInfo.kernelVersion",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    for annotation in KEPT_ANNOTATIONS {
        expected.insert(format!("metadata.annotations.{annotation}"));
    }
    // Ownership is kept of what the leader's upgrade writer owns only: its
    // record and state label. The agent's status annotation is owned in
    // the fixture too, and dropped.
    expected.insert(format!(
        "metadata.managedFields[].fieldsV1.f:metadata.f:annotations.f:{}",
        driver_upgrade::RECORD_ANNOTATION
    ));
    let mut kept = BTreeSet::new();
    let mut full = BTreeSet::new();
    let kept_labels = KeptLabels::for_configs([&device_config()]);
    for value in fleet() {
        let n = node(&value);
        paths(
            &serde_json::to_value(kept_of(n.clone(), &kept_labels)).unwrap(),
            "",
            &mut kept,
        );
        paths(&value, "", &mut full);
    }
    // What the test runs on has the fields a kubelet writes.
    for dropped in [
        "metadata.managedFields[].time",
        "metadata.annotations.node.alpha.kubernetes.io/ttl",
        "spec.podCIDR",
        "spec.providerID",
        "status.images[].names[]",
        "status.images[].sizeBytes",
        "status.addresses[].address",
        "status.capacity.cpu",
        "status.allocatable.memory",
        "status.conditions[].lastHeartbeatTime",
        "status.conditions[].lastTransitionTime",
        "status.daemonEndpoints.kubeletEndpoint.Port",
        "status.nodeInfo.osImage",
        "status.nodeInfo.machineID",
        "status.runtimeHandlers[].name",
    ] {
        assert!(full.contains(dropped), "the fixture lacks {dropped}");
    }
    let agent_owns_status = format!(
        "metadata.managedFields[].fieldsV1.f:metadata.f:annotations.f:{}",
        gpu_operator::api::agent_status::STATUS_ANNOTATION
    );
    assert!(
        full.contains(&agent_owns_status),
        "the fixture lacks {agent_owns_status}"
    );
    // apiVersion and kind are the type's, not stored per object.
    kept.retain(|p| p != "apiVersion" && p != "kind");
    assert_eq!(
        kept,
        expected,
        "kept but not listed: {:?}; listed but not kept: {:?}",
        kept.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&kept).collect::<Vec<_>>()
    );
}

#[test]
fn a_kubelet_node_is_the_size_a_real_one_is() {
    let size = serde_json::to_vec(&kubelet_node(7, Some(&agent_status("boot-7"))))
        .unwrap()
        .len();
    assert!((10_000..=30_000).contains(&size), "{size} bytes");
}
