//! The shared drain against the API emulator: which pods go, that the
//! Eviction API (and so PodDisruptionBudgets) is what removes them, and that a
//! refused eviction names its budget when the drain gives up.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_operator::api::{DrainSpec, PodDeletionSpec};
use gpu_operator::cluster::drain::{Blocker, DrainPolicy, drain};
use gpu_operator::cluster::lease::LeaderGuard;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::cluster::TestCluster;

fn gpu_pod(namespace: &str, name: &str, node: &str, owner: Option<&str>, labels: Value) -> Value {
    let owners = owner.map_or_else(Vec::new, |kind| {
        vec![
            json!({"apiVersion": "apps/v1", "kind": kind, "name": format!("{name}-owner"),
                    "uid": format!("uid-{name}"), "controller": true}),
        ]
    });
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": owners},
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "rocm/pytorch", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
    })
}

/// Reports the pod running and ready, as its kubelet would (a create
/// starts every pod Pending, as on a real API server).
async fn started(cluster: &TestCluster, namespace: &str, name: &str) {
    cluster.start_pod(namespace, name).await;
}

fn names(cluster: &TestCluster) -> BTreeSet<String> {
    cluster
        .list("v1", "Pod")
        .iter()
        .filter_map(|p| p.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// Drains `node` as the leader would, through a client without retries.
async fn drain_on(
    cluster: &TestCluster,
    node: &str,
    policy: &DrainPolicy,
) -> Result<gpu_operator::cluster::drain::DrainReport, gpu_operator::cluster::drain::DrainError> {
    drain(
        &cluster.client_without_retries(),
        node,
        policy,
        &LeaderGuard::always(),
        |_| {},
    )
    .await
}

async fn cluster_with_namespaces() -> TestCluster {
    let cluster = TestCluster::start().await;
    for ns in ["ml", "infra"] {
        cluster
            .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .expect("namespace");
    }
    cluster
}

#[tokio::test]
async fn evicts_the_gpu_pods_of_its_node_only_and_leaves_the_rest() {
    let cluster = cluster_with_namespaces().await;
    for pod in [
        gpu_pod("ml", "train", "gpu-1", Some("ReplicaSet"), json!({})),
        gpu_pod("ml", "agent", "gpu-1", Some("DaemonSet"), json!({})),
        gpu_pod("infra", "probe", "gpu-1", Some("Job"), json!({})),
        gpu_pod("ml", "elsewhere", "gpu-2", Some("ReplicaSet"), json!({})),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web", "namespace": "ml"},
               "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "nginx"}]}}),
    ] {
        cluster.create(pod).expect("pod");
    }
    let policy = DrainPolicy::of_drain(&DrainSpec {
        ignore_namespaces: vec!["infra".into()],
        ..DrainSpec::default()
    });
    let report = drain_on(&cluster, "gpu-1", &policy)
        .await
        .expect("the pods can be listed");
    assert!(report.succeeded(), "{:?}", report.blocked);
    assert_eq!(
        names(&cluster),
        BTreeSet::from(["agent", "probe", "elsewhere", "web"].map(str::to_owned))
    );
    // Removed through the Eviction API, once: the request log says so.
    let requests = cluster.requests();
    assert_eq!(requests.get("create", "pods/eviction"), 1, "{requests:?}");
    assert_eq!(requests.get("delete", "pods"), 0, "{requests:?}");
    assert_eq!(report.removals, 1);
}

#[tokio::test]
async fn a_budget_that_refuses_the_eviction_fails_the_drain_by_name_after_the_timeout() {
    let cluster = cluster_with_namespaces().await;
    cluster
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "train-pdb", "namespace": "ml"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}}),
        )
        .expect("budget");
    cluster
        .create(gpu_pod(
            "ml",
            "train",
            "gpu-1",
            Some("ReplicaSet"),
            json!({"app": "train"}),
        ))
        .expect("pod");
    cluster
        .create(gpu_pod(
            "ml",
            "free",
            "gpu-1",
            Some("ReplicaSet"),
            json!({"app": "free"}),
        ))
        .expect("pod");
    started(&cluster, "ml", "train").await;
    started(&cluster, "ml", "free").await;
    let policy = DrainPolicy::of_drain(&DrainSpec {
        timeout_seconds: 3,
        ..DrainSpec::default()
    });
    let report = drain_on(&cluster, "gpu-1", &policy)
        .await
        .expect("the pods can be listed");
    assert!(!report.succeeded());
    assert_eq!(report.blocked.len(), 1, "{:?}", report.blocked);
    assert_eq!(report.blocked[0].name, "train");
    assert_eq!(
        report.blocked[0].blocker,
        Blocker::DisruptionBudget {
            budget: "train-pdb".into()
        }
    );
    // The unguarded pod went; the guarded one is still there.
    assert_eq!(names(&cluster), BTreeSet::from(["train".to_owned()]));
}

#[tokio::test]
async fn a_pod_without_a_controller_fails_an_unforced_drain_and_a_deletion_policy_deletes_it() {
    let cluster = cluster_with_namespaces().await;
    cluster
        .create(gpu_pod("ml", "bare", "gpu-1", None, json!({})))
        .expect("pod");
    let unforced = DrainPolicy::of_drain(&DrainSpec::default());
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        drain_on(&cluster, "gpu-1", &unforced),
    )
    .await
    .expect("an orphan fails the drain at once, not at its timeout")
    .expect("listed");
    assert_eq!(report.blocked.len(), 1);
    assert_eq!(report.blocked[0].blocker, Blocker::NoController);
    assert_eq!(names(&cluster), BTreeSet::from(["bare".to_owned()]));

    let deletion = DrainPolicy::of_deletion(&PodDeletionSpec {
        force: true,
        ..PodDeletionSpec::default()
    });
    let report = drain_on(&cluster, "gpu-1", &deletion)
        .await
        .expect("listed");
    assert!(report.succeeded(), "{:?}", report.blocked);
    assert!(names(&cluster).is_empty());
    let requests = cluster.requests();
    assert_eq!(requests.get("delete", "pods"), 1, "{requests:?}");
    assert_eq!(requests.get("create", "pods/eviction"), 0, "{requests:?}");
}

#[tokio::test]
async fn a_pod_holding_a_gpu_claim_is_drained_and_one_holding_another_drivers_claim_stays() {
    let cluster = cluster_with_namespaces().await;
    let client = cluster.client_without_retries();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    for (claim, driver) in [
        ("train-gpu", "gpu.amd.com"),
        ("train-nic", "nic.example.com"),
    ] {
        cluster
            .create(
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": claim, "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "dev",
                    "exactly": {"deviceClassName": "any"}}]}}}),
            )
            .expect("claim");
        // The scheduler's allocation, through the status subresource.
        claims
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [
                    {"request": "dev", "driver": driver, "pool": "gpu-1", "device": "d0"}]}}}})),
            )
            .await
            .expect("allocation written");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    for (pod, claim) in [("uses-gpu", "train-gpu"), ("uses-nic", "train-nic")] {
        cluster
            .create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "ml", "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]},
                "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}],
                         "resourceClaims": [{"name": "dev", "resourceClaimName": claim}]}}))
            .expect("pod");
        pods.patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("pod status");
    }
    let policy = DrainPolicy::of_drain(&DrainSpec::default());
    let report = drain(&client, "gpu-1", &policy, &LeaderGuard::always(), |_| {})
        .await
        .expect("listed");
    assert!(report.succeeded(), "{:?}", report.blocked);
    assert_eq!(names(&cluster), BTreeSet::from(["uses-nic".to_owned()]));
}
