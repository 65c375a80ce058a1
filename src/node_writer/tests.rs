//! The writer's decisions over plain Nodes with `managedFields`, as the API
//! server renders them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
use serde_json::json;

use super::*;

const OTHER: &str = "amd-gpu-node-labeller";

fn entry(
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    fields: Value,
) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some(operation.into()),
        subresource: subresource.map(str::to_owned),
        api_version: Some("v1".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        time: None,
    }
}

fn label_fields(keys: &[&str]) -> Value {
    let labels: Map<String, Value> = keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
    json!({"f:metadata": {"f:labels": labels}})
}

fn node(labels: &[(&str, &str)], entries: Vec<ManagedFieldsEntry>) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    node.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    node.metadata.managed_fields = Some(entries);
    node
}

fn intent(labels: &[(&str, &str)]) -> NodeIntent {
    NodeIntent {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..NodeIntent::default()
    }
}

fn ours() -> &'static str {
    Concern::Labeller.field_manager()
}

#[test]
fn a_new_label_is_applied_and_an_owned_equal_one_is_left_alone() {
    let fresh = node(&[], vec![]);
    let plan = plan_metadata(
        &fresh,
        Concern::Labeller,
        &intent(&[("amd.com/gpu.vram", "192G")]),
    );
    assert!(plan.apply);
    assert!(plan.leftovers_patch().is_none());

    let written = node(
        &[("amd.com/gpu.vram", "192G")],
        vec![entry(
            ours(),
            "Apply",
            None,
            label_fields(&["amd.com/gpu.vram"]),
        )],
    );
    let plan = plan_metadata(
        &written,
        Concern::Labeller,
        &intent(&[("amd.com/gpu.vram", "192G")]),
    );
    assert_eq!(
        plan,
        MetadataPlan::default(),
        "idempotent: nothing to write"
    );

    let plan = plan_metadata(
        &written,
        Concern::Labeller,
        &intent(&[("amd.com/gpu.vram", "64G")]),
    );
    assert!(plan.apply, "a changed value is applied");
}

#[test]
fn a_key_only_we_applied_is_removed_by_omitting_it() {
    let n = node(
        &[("a", "1"), ("b", "2")],
        vec![entry(ours(), "Apply", None, label_fields(&["a", "b"]))],
    );
    let plan = plan_metadata(&n, Concern::Labeller, &intent(&[("a", "1")]));
    assert!(plan.apply, "the apply drops b");
    assert!(
        plan.leftover_labels.is_empty(),
        "the server removes b itself"
    );
}

#[test]
fn a_key_shared_with_an_earlier_equal_write_is_removed_explicitly() {
    // The reference's labeller wrote the same key and value (Update); we
    // applied it, so it is ours too. Not wanted any more, the apply alone
    // would leave it there.
    let n = node(
        &[("amd.com/gpu.family", "AI"), ("mine", "x")],
        vec![
            entry(OTHER, "Update", None, label_fields(&["amd.com/gpu.family"])),
            entry(
                ours(),
                "Apply",
                None,
                label_fields(&["amd.com/gpu.family", "mine"]),
            ),
        ],
    );
    let plan = plan_metadata(&n, Concern::Labeller, &intent(&[("mine", "x")]));
    assert!(plan.apply);
    assert_eq!(
        plan.leftover_labels,
        BTreeSet::from(["amd.com/gpu.family".to_owned()])
    );
    assert_eq!(
        plan.leftovers_patch(),
        Some(json!({"metadata": {"labels": {"amd.com/gpu.family": null}}}))
    );
}

#[test]
fn a_wanted_key_someone_else_set_to_the_same_value_is_claimed() {
    let n = node(
        &[("amd.com/gpu.family", "AI")],
        vec![entry(
            OTHER,
            "Update",
            None,
            label_fields(&["amd.com/gpu.family"]),
        )],
    );
    let plan = plan_metadata(
        &n,
        Concern::Labeller,
        &intent(&[("amd.com/gpu.family", "AI")]),
    );
    assert!(
        plan.apply,
        "applied, so that it becomes ours to remove later"
    );
    assert!(plan.leftover_labels.is_empty());
}

#[test]
fn keys_of_others_and_of_other_concerns_are_never_removed() {
    let n = node(
        &[
            ("kubernetes.io/hostname", "n1"),
            ("metricsexporter.amd.com.gpu.0.state", "unhealthy"),
        ],
        vec![
            entry(
                "kubelet",
                "Update",
                None,
                label_fields(&["kubernetes.io/hostname"]),
            ),
            entry(
                Concern::Health.field_manager(),
                "Apply",
                None,
                label_fields(&["metricsexporter.amd.com.gpu.0.state"]),
            ),
        ],
    );
    let plan = plan_metadata(&n, Concern::Labeller, &intent(&[]));
    assert_eq!(plan, MetadataPlan::default());
}

#[test]
fn our_own_earlier_merge_patches_count_as_ours() {
    // Written by an earlier version with a merge patch under the same manager.
    let n = node(
        &[("metricsexporter.amd.com.gpu.3.state", "unhealthy")],
        vec![entry(
            Concern::Health.field_manager(),
            "Update",
            None,
            label_fields(&["metricsexporter.amd.com.gpu.3.state"]),
        )],
    );
    let plan = plan_metadata(&n, Concern::Health, &intent(&[]));
    assert!(!plan.apply, "the Apply entry owns nothing");
    assert_eq!(
        plan.leftover_labels,
        BTreeSet::from(["metricsexporter.amd.com.gpu.3.state".to_owned()])
    );
}

#[test]
fn retired_keys_are_treated_as_owned_and_the_retired_annotation_removed() {
    let mut n = node(
        &[("amd.com/gpu.vram", "192G"), ("amd.com/gpu.count", "8")],
        vec![],
    );
    n.metadata.annotations = Some(BTreeMap::from([(
        "amd.com/gpu-labeller-keys".to_owned(),
        "amd.com/gpu.vram,amd.com/gpu.count".to_owned(),
    )]));
    let mut want = intent(&[("amd.com/gpu.count", "8")]);
    want.retired_labels = BTreeSet::from([
        "amd.com/gpu.vram".to_owned(),
        "amd.com/gpu.count".to_owned(),
    ]);
    want.retired_annotations = BTreeSet::from(["amd.com/gpu-labeller-keys".to_owned()]);
    let plan = plan_metadata(&n, Concern::Labeller, &want);
    assert!(plan.apply, "count is claimed");
    assert_eq!(
        plan.leftovers_patch(),
        Some(json!({"metadata": {
            "labels": {"amd.com/gpu.vram": null},
            "annotations": {"amd.com/gpu-labeller-keys": null},
        }}))
    );
}

fn condition(kind: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: kind.into(),
        status: status.into(),
        reason: Some("R".into()),
        message: Some("m".into()),
        ..NodeCondition::default()
    }
}

fn condition_fields(kind: &str) -> Value {
    json!({"f:status": {"f:conditions": {
        format!("k:{}", json!({"type": kind})): {"f:type": {}, "f:status": {}, "f:reason": {}}
    }}})
}

fn with_conditions(conditions: Vec<NodeCondition>, entries: Vec<ManagedFieldsEntry>) -> Node {
    let mut n = node(&[], entries);
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        conditions: Some(conditions),
        ..Default::default()
    });
    n
}

#[test]
fn conditions_are_applied_by_type_and_the_kubelets_are_never_touched() {
    let health = Concern::Health.field_manager();
    let kubelet_ready = condition("Ready", "True");
    let ours = condition("AMDGPUUnhealthy", "False");
    let n = with_conditions(
        vec![kubelet_ready.clone()],
        vec![entry(
            "kubelet",
            "Update",
            Some("status"),
            condition_fields("Ready"),
        )],
    );
    let want = StatusIntent {
        conditions: vec![ours.clone()],
    };
    assert!(plan_conditions(&n, Concern::Health, &want).apply);

    let n = with_conditions(
        vec![kubelet_ready.clone(), ours.clone()],
        vec![
            entry(
                "kubelet",
                "Update",
                Some("status"),
                condition_fields("Ready"),
            ),
            entry(
                health,
                "Apply",
                Some("status"),
                condition_fields("AMDGPUUnhealthy"),
            ),
        ],
    );
    assert_eq!(
        plan_conditions(&n, Concern::Health, &want),
        ConditionPlan::default()
    );
    let flipped = StatusIntent {
        conditions: vec![condition("AMDGPUUnhealthy", "True")],
    };
    assert!(plan_conditions(&n, Concern::Health, &flipped).apply);

    let teardown = plan_conditions(&n, Concern::Health, &StatusIntent::default());
    assert!(teardown.apply, "omitting the condition removes it");
    assert!(teardown.leftover_conditions.is_empty());

    // Written by an earlier version with a strategic merge patch: removed explicitly.
    let n = with_conditions(
        vec![kubelet_ready, ours],
        vec![
            entry(
                "kubelet",
                "Update",
                Some("status"),
                condition_fields("Ready"),
            ),
            entry(
                health,
                "Update",
                Some("status"),
                condition_fields("AMDGPUUnhealthy"),
            ),
        ],
    );
    let teardown = plan_conditions(&n, Concern::Health, &StatusIntent::default());
    assert_eq!(teardown.leftover_conditions, ["AMDGPUUnhealthy"]);
}

#[test]
fn apply_bodies_carry_only_the_concerns_fields() {
    let body = metadata_apply_body("n1", &intent(&[("a", "1")]));
    assert_eq!(
        body,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1"}}})
    );
    let empty = metadata_apply_body("n1", &NodeIntent::default());
    assert_eq!(
        empty["metadata"],
        json!({"name": "n1"}),
        "an empty intent owns nothing"
    );
    let status = status_apply_body("n1", &StatusIntent::default());
    assert!(status.get("status").is_none());
}

#[test]
fn the_guarded_removal_escapes_the_key_and_tests_the_value() {
    let patch = serde_json::to_value(guarded_annotation_removal(
        "amd.com/test~request",
        "v1",
        ("x.amd.com/receipt", "r1"),
    ))
    .unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "test", "path": "/metadata/annotations/amd.com~1test~0request", "value": "v1"},
            {"op": "remove", "path": "/metadata/annotations/amd.com~1test~0request"},
            {"op": "add", "path": "/metadata/annotations/x.amd.com~1receipt", "value": "r1"},
        ])
    );
}

#[test]
fn only_transient_errors_are_retried() {
    let api = |code: u16| {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..kube::core::Status::default()
        }))
    };
    for code in [429, 500, 503, 504] {
        assert!(is_transient(&api(code)), "{code}");
    }
    for code in [400, 403, 404, 409, 422] {
        assert!(!is_transient(&api(code)), "{code}");
    }
}

#[test]
fn a_condition_that_says_the_same_is_kept_and_a_new_message_keeps_the_transition_time() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
    let timed = |status: &str, message: &str, t: i64| NodeCondition {
        message: Some(message.into()),
        last_heartbeat_time: Some(at(t)),
        last_transition_time: Some(at(t)),
        ..condition("AMDGPUDriverReady", status)
    };
    let mut on_node = node(&[], vec![]);
    on_node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        conditions: Some(vec![condition("Ready", "True"), timed("True", "a", 100)]),
        ..Default::default()
    });
    assert_eq!(
        find_condition(&on_node, "AMDGPUDriverReady").map(|c| c.status.as_str()),
        Some("True")
    );
    // The same: the Node's own, times and all (nothing to write).
    let same = condition_to_apply(&on_node, timed("True", "a", 200));
    assert_eq!(same.last_heartbeat_time, Some(at(100)));
    // Another message, same status: the transition time stays.
    let reworded = condition_to_apply(&on_node, timed("True", "b", 200));
    assert_eq!(reworded.message.as_deref(), Some("b"));
    assert_eq!(reworded.last_transition_time, Some(at(100)));
    assert_eq!(reworded.last_heartbeat_time, Some(at(200)));
    // Another status: a transition now.
    let flipped = condition_to_apply(&on_node, timed("False", "b", 200));
    assert_eq!(flipped.last_transition_time, Some(at(200)));
    // None yet: as desired.
    let fresh = condition_to_apply(&node(&[], vec![]), timed("False", "c", 300));
    assert_eq!(fresh.last_transition_time, Some(at(300)));
}

fn upgrade_taint() -> Taint {
    Taint {
        key: "amd-gpu-driver-upgrade".into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

fn scheduled(unschedulable: Option<bool>, taints: Option<Vec<Taint>>) -> Node {
    let mut node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "resourceVersion": "42"},
        "spec": {}
    }))
    .unwrap();
    let spec = node.spec.get_or_insert_with(Default::default);
    spec.unschedulable = unschedulable;
    spec.taints = taints;
    node
}

fn ops(patch: json_patch::Patch) -> Value {
    serde_json::to_value(patch).unwrap()
}

#[test]
fn cordon_and_taint_keep_everyone_elses_taints_and_are_guarded_by_the_version() {
    let other = Taint {
        key: "dedicated".into(),
        value: Some("ml".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let node = scheduled(None, Some(vec![other.clone()]));
    let on = CordonIntent {
        unschedulable: Some(true),
        taints: vec![upgrade_taint()],
        tainted: true,
    };
    let patch = ops(cordon_patch(&node, &on).expect("a change"));
    assert_eq!(
        patch,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "add", "path": "/spec/taints", "value": [
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                {"key": "amd-gpu-driver-upgrade", "value": "true", "effect": "NoSchedule"}]},
            {"op": "add", "path": "/spec/unschedulable", "value": true},
        ])
    );
    // Already so: nothing to write.
    let done = scheduled(Some(true), Some(vec![other.clone(), upgrade_taint()]));
    assert_eq!(cordon_patch(&done, &on), None);
    // Released, keeping a person's cordon: only the taint goes.
    let release_keeping = CordonIntent {
        unschedulable: None,
        tainted: false,
        ..on.clone()
    };
    assert_eq!(
        ops(cordon_patch(&done, &release_keeping).unwrap()),
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "add", "path": "/spec/taints", "value": [
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
        ])
    );
    // Released fully, when ours was the only taint: the list goes.
    let alone = scheduled(Some(true), Some(vec![upgrade_taint()]));
    let release = CordonIntent {
        unschedulable: Some(false),
        tainted: false,
        ..on.clone()
    };
    assert_eq!(
        ops(cordon_patch(&alone, &release).unwrap()),
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "remove", "path": "/spec/taints"},
            {"op": "remove", "path": "/spec/unschedulable"},
        ])
    );
    // A Node without a spec gets one first.
    let mut bare = scheduled(None, None);
    bare.spec = None;
    let patch = ops(cordon_patch(&bare, &on).unwrap());
    assert_eq!(patch[1], json!({"op": "add", "path": "/spec", "value": {}}));
}
