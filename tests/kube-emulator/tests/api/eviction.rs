//! `POST pods/<name>/eviction`: deletes the pod unless a PodDisruptionBudget would be
//! violated, in which case the answer is 429 like the real server's.

use crate::common;

use common::{api_error, create_pod, pod, start};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, PostParams, ResourceExt};
use serde_json::json;

async fn pdb(client: &kube::Client, spec: serde_json::Value) {
    let api: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    let p: PodDisruptionBudget =
        serde_json::from_value(json!({"metadata": {"name": "budget"}, "spec": spec})).unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
}

async fn names(api: &Api<Pod>) -> Vec<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect()
}

#[tokio::test]
async fn eviction_without_a_budget_deletes_the_pod() {
    let emu = start().await;
    // kube retries 429s by default; these tests want to see each answer.
    let client = emu.client_without_retries();
    create_pod(
        &client,
        "default",
        pod("p", "n1", json!({"app": "x"}), true),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let s = pods.evict("p", &EvictParams::default()).await.unwrap();
    assert!(s.is_success());
    assert!(names(&pods).await.is_empty());
    assert_eq!(
        api_error(pods.evict("p", &EvictParams::default()).await).code,
        404
    );
    let counts = emu.requests();
    assert_eq!(counts.get("create", "pods/eviction"), 2, "{counts}");
}

#[tokio::test]
async fn a_budget_at_its_minimum_answers_429() {
    let emu = start().await;
    let client = emu.client_without_retries();
    for n in ["a", "b", "c"] {
        create_pod(
            &client,
            "default",
            pod(n, "n1", json!({"app": "gpu"}), true),
        )
        .await;
    }
    create_pod(
        &client,
        "default",
        pod("other", "n1", json!({"app": "web"}), true),
    )
    .await;
    pdb(
        &client,
        json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "gpu"}}}),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    // 3 healthy, 2 wanted: one may go.
    pods.evict("a", &EvictParams::default()).await.unwrap();
    let e = api_error(pods.evict("b", &EvictParams::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        e.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &e.details.unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(
        cause.message,
        "The disruption budget budget needs 2 healthy pods and has 2 currently"
    );
    assert_eq!(names(&pods).await, ["b", "c", "other"]);
    // Pods the budget does not select are not held back.
    pods.evict("other", &EvictParams::default()).await.unwrap();
}

#[tokio::test]
async fn unready_and_pending_pods_follow_the_real_rules() {
    let emu = start().await;
    let client = emu.client_without_retries();
    create_pod(
        &client,
        "default",
        pod("ready", "n1", json!({"app": "gpu"}), true),
    )
    .await;
    create_pod(
        &client,
        "default",
        pod("sick", "n1", json!({"app": "gpu"}), false),
    )
    .await;
    pdb(
        &client,
        json!({"maxUnavailable": 0, "selector": {"matchLabels": {"app": "gpu"}}}),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // maxUnavailable 0 with 2 expected: 2 must be healthy, 1 is. The healthy one stays.
    assert_eq!(
        api_error(pods.evict("ready", &EvictParams::default()).await).code,
        429
    );
    // An unhealthy pod may go only when the budget is met (default policy) ...
    assert_eq!(
        api_error(pods.evict("sick", &EvictParams::default()).await).code,
        429
    );
    // ... or always, with unhealthyPodEvictionPolicy AlwaysAllow.
    let budgets: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    budgets
        .patch(
            "budget",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}),
            ),
        )
        .await
        .unwrap();
    pods.evict("sick", &EvictParams::default()).await.unwrap();
    // A pod that is not running yet is never held by a budget.
    let p: Pod = serde_json::from_value(pod("new", "n1", json!({"app": "gpu"}), true)).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap(); // status: Pending
    pods.evict("new", &EvictParams::default()).await.unwrap();
    assert_eq!(names(&pods).await, ["ready"]);
}
