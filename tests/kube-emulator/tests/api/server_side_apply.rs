//! Server-side apply, as Lease holders and status writers use it: conflicts between field
//! managers, force, shared ownership, removal of fields a manager stops applying, and the
//! kube-lease-manager crate electing exactly one leader.

use crate::common;

use std::time::Duration;

use common::{api_error, eventually, within};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::{Value, json};

fn lease(holder: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
}

#[tokio::test]
async fn apply_conflicts_between_managers() {
    let emu = common::start().await;
    let leases: Api<Lease> = Api::default_namespaced(emu.client());
    let a = PatchParams::apply("agent-a");
    let b = PatchParams::apply("agent-b");
    let first = leases
        .patch("leader", &a, &Patch::Apply(lease("a")))
        .await
        .unwrap();
    assert_eq!(first.spec.unwrap().holder_identity.as_deref(), Some("a"));

    let e = api_error(leases.patch("leader", &b, &Patch::Apply(lease("b"))).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Apply failed with 1 conflict: conflict with \"agent-a\" using coordination.k8s.io/v1: .spec.holderIdentity"
    );
    assert_eq!(e.details.unwrap().causes[0].field, ".spec.holderIdentity");

    // Applying the same values shares ownership instead of conflicting.
    leases
        .patch("leader", &b, &Patch::Apply(lease("a")))
        .await
        .unwrap();
    // Force takes the field over; the old owner now conflicts in turn.
    let forced = leases
        .patch("leader", &b.clone().force(), &Patch::Apply(lease("b")))
        .await
        .unwrap();
    assert_eq!(forced.spec.unwrap().holder_identity.as_deref(), Some("b"));
    let e = api_error(leases.patch("leader", &a, &Patch::Apply(lease("a"))).await);
    assert!(
        e.message.contains("conflict with \"agent-b\""),
        "{}",
        e.message
    );

    // Non-apply writes never conflict; they take the fields they change.
    let l = leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "c"}})),
        )
        .await
        .unwrap();
    let managers: Vec<(String, String)> = l
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap(), m.operation.unwrap()))
        .collect();
    assert!(
        managers.iter().any(|(_, op)| op == "Update"),
        "{managers:?}"
    );

    // A resourceVersion in an applied config is a precondition.
    let mut stale = lease("b");
    stale["metadata"]["resourceVersion"] = json!("1");
    let e = api_error(
        leases
            .patch("leader", &b.clone().force(), &Patch::Apply(stale))
            .await,
    );
    assert_eq!(e.reason, "Conflict");
}

#[tokio::test]
async fn apply_removes_fields_a_manager_stops_applying() {
    let emu = common::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let pp = PatchParams::apply("labeller");
    let cfg = |labels: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": labels}});
    cms.patch("c", &pp, &Patch::Apply(cfg(json!({"x": "1", "y": "2"}))))
        .await
        .unwrap();
    // Someone else adds a label of their own.
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"z": "3"}}})),
    )
    .await
    .unwrap();
    let c = cms
        .patch("c", &pp, &Patch::Apply(cfg(json!({"x": "1"}))))
        .await
        .unwrap();
    let keys: Vec<&String> = c.labels().keys().collect();
    assert_eq!(
        keys,
        ["x", "z"],
        "y went with its manager, z stayed with its own"
    );
    // Re-applying the same config is a no-op: no new resourceVersion.
    let again = cms
        .patch("c", &pp, &Patch::Apply(cfg(json!({"x": "1"}))))
        .await
        .unwrap();
    assert_eq!(again.resource_version(), c.resource_version());
}

#[tokio::test]
async fn node_status_writers_keep_their_own_conditions() {
    let emu = common::start().await;
    let nodes: Api<Node> = Api::all(emu.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let cond = |t: &str, s: &str| {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
               "status": {"conditions": [{"type": t, "status": s}]}})
    };
    let kubelet = PatchParams::apply("kubelet").force();
    let health = PatchParams::apply("gpu-health").force();
    nodes
        .patch_status("n1", &kubelet, &Patch::Apply(cond("Ready", "True")))
        .await
        .unwrap();
    nodes
        .patch_status("n1", &health, &Patch::Apply(cond("AMDGPUHealthy", "True")))
        .await
        .unwrap();
    let n = nodes
        .patch_status("n1", &health, &Patch::Apply(cond("AMDGPUHealthy", "False")))
        .await
        .unwrap();
    let conds: Vec<(String, String)> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        conds,
        [
            ("Ready".into(), "True".into()),
            ("AMDGPUHealthy".into(), "False".into())
        ]
    );
    // Main-resource applies cannot touch status.
    let main = nodes
        .patch(
            "n1",
            &PatchParams::apply("other"),
            &Patch::Apply(cond("Ready", "False")),
        )
        .await
        .unwrap();
    assert_eq!(main.status.unwrap().conditions.unwrap()[0].status, "True");
}

#[tokio::test]
async fn kube_lease_manager_elects_exactly_one_leader() {
    use kube_lease_manager::LeaseManagerBuilder;
    let emu = common::start().await;
    let client = emu.client();
    let mut managers = Vec::new();
    for id in ["agent-1", "agent-2", "agent-3"] {
        let m = LeaseManagerBuilder::new(client.clone(), "gpu-operator-leader")
            .with_namespace("default")
            .with_identity(id)
            // Renewals every ~3 s with a 2 s margin: no spurious takeovers on a busy machine.
            .with_duration(5)
            .with_grace(2)
            .build()
            .await
            .unwrap();
        managers.push(m);
    }
    let mut channels = Vec::new();
    let mut handles = Vec::new();
    for m in managers {
        let (rx, h) = m.watch().await;
        channels.push(rx);
        handles.push(h);
    }
    let leaders =
        |chs: &Vec<tokio::sync::watch::Receiver<bool>>| chs.iter().filter(|c| *c.borrow()).count();
    eventually("a leader is elected", || leaders(&channels) > 0).await;
    // Hold for a couple of renewals: never two leaders.
    for _ in 0..20 {
        assert_eq!(leaders(&channels), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let l = leases.get("gpu-operator-leader").await.unwrap();
    let holder = l.spec.unwrap().holder_identity.unwrap();
    let idx = ["agent-1", "agent-2", "agent-3"]
        .iter()
        .position(|i| *i == holder)
        .unwrap();
    assert!(
        *channels[idx].borrow(),
        "the lease holder is the one that thinks it leads"
    );

    // The leader steps down (closing its channel releases the lease); another takes over.
    let old = channels.remove(idx);
    drop(old);
    let h = handles.remove(idx);
    within("old leader released", h).await.unwrap().unwrap();
    eventually("a new leader", || leaders(&channels) == 1).await;
    let l = leases.get("gpu-operator-leader").await.unwrap();
    assert_ne!(
        l.spec.unwrap().holder_identity.as_deref(),
        Some(holder.as_str())
    );
    drop(channels);
    for h in handles {
        let _ = within("managers stop", h).await;
    }
}
