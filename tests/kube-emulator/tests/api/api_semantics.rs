//! Verb semantics through an unmodified `kube::Client`: discovery, create, update, patch,
//! list (selectors, paging, resourceVersion), delete with finalizers, and error statuses.

use crate::common;

use common::{api_error, create_pod, pod, start, within};
use http_body_util::BodyExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, ResourceExt,
    VersionMatch,
};
use kube::core::{GroupVersionKind, Status};
use serde_json::{Value, json};

fn cm(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

#[tokio::test]
async fn discovery_lists_builtin_groups_and_version() {
    let emu = start().await;
    let client = emu.client();
    within("discovery", async {
        let v = client.apiserver_version().await.unwrap();
        assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", "34"));
        let d = kube::Discovery::new(client.clone()).run().await.unwrap();
        for (g, v, k, namespaced) in [
            ("", "v1", "Pod", true),
            ("", "v1", "Node", false),
            ("", "v1", "Namespace", false),
            ("", "v1", "ConfigMap", true),
            ("", "v1", "Secret", true),
            ("", "v1", "Service", true),
            ("", "v1", "Event", true),
            ("events.k8s.io", "v1", "Event", true),
            ("coordination.k8s.io", "v1", "Lease", true),
            ("apps", "v1", "DaemonSet", true),
            ("policy", "v1", "PodDisruptionBudget", true),
            ("resource.k8s.io", "v1", "ResourceSlice", false),
            ("resource.k8s.io", "v1", "ResourceClaim", true),
            ("resource.k8s.io", "v1", "DeviceClass", false),
            (
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                false,
            ),
        ] {
            let (ar, caps) = d
                .resolve_gvk(&GroupVersionKind::gvk(g, v, k))
                .unwrap_or_else(|| panic!("{g}/{v} {k} is discoverable"));
            assert_eq!(
                caps.scope == kube::discovery::Scope::Namespaced,
                namespaced,
                "{k} scope"
            );
            assert!(
                caps.supports_operation(kube::discovery::verbs::WATCH),
                "{k} watchable"
            );
            if k == "Pod" || k == "Node" {
                assert!(
                    caps.subresources
                        .iter()
                        .any(|(s, _)| s.plural == format!("{}/status", ar.plural)
                            || s.plural == "status"),
                    "{k} has a status subresource: {:?}",
                    caps.subresources
                );
            }
        }
    })
    .await;
}

#[tokio::test]
async fn create_fills_server_fields_and_rejects_duplicates() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let mut generated = cm("", json!({"a": "1"}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let a = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let (na, nb) = (a.name_any(), b.name_any());
    assert!(
        na.starts_with("gen-") && na.len() == 9,
        "generated name {na}"
    );
    assert_ne!(na, nb);
    assert_eq!(a.uid().unwrap().len(), 36);
    assert_ne!(a.uid(), b.uid());
    assert!(a.creation_timestamp().is_some());
    let (rva, rvb): (u64, u64) = (
        a.resource_version().unwrap().parse().unwrap(),
        b.resource_version().unwrap().parse().unwrap(),
    );
    assert!(rvb > rva, "resourceVersions increase");
    assert_eq!(a.metadata.namespace.as_deref(), Some("default"));

    let dup = api_error(
        api.create(&PostParams::default(), &cm(&na, json!({})))
            .await,
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, format!("configmaps \"{na}\" already exists"));

    // dryRun answers without storing.
    let dry = api
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &cm("dry", json!({})),
        )
        .await
        .unwrap();
    assert_eq!(dry.name_any(), "dry");
    assert_eq!(api_error(api.get("dry").await).code, 404);

    // Namespaced objects need an existing namespace.
    let elsewhere: Api<ConfigMap> = Api::namespaced(emu.client(), "missing");
    let e = api_error(
        elsewhere
            .create(&PostParams::default(), &cm("x", json!({})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));

    // Generation is kept where the real server keeps it.
    let pods: Api<Pod> = Api::default_namespaced(emu.client());
    let p: Pod = serde_json::from_value(pod("p", "n1", json!({}), true)).unwrap();
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    assert_eq!(p.metadata.generation, Some(1));
    assert_eq!(
        p.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "create resets pod status"
    );
    assert_eq!(
        a.metadata.generation, None,
        "config maps have no generation"
    );

    // Secrets: stringData lands base64-encoded in data.
    let secrets: Api<Secret> = Api::default_namespaced(emu.client());
    let s: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"k": "hello"}}))
            .unwrap();
    let s = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(s.data.unwrap()["k"].0, b"hello");
}

#[tokio::test]
async fn update_with_a_stale_resource_version_conflicts() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let v1 = api
        .create(&PostParams::default(), &cm("c", json!({"a": "1"})))
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("a".to_string(), "2".to_string())].into());
    let v2 = api.replace("c", &PostParams::default(), &v2).await.unwrap();
    assert_ne!(v1.resource_version(), v2.resource_version());

    let mut stale = v1.clone();
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    let e = api_error(api.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );

    // Without a resourceVersion the update is unconditional.
    let mut blind = v2.clone();
    blind.metadata.resource_version = None;
    blind.data = Some([("a".to_string(), "4".to_string())].into());
    let v4 = api
        .replace("c", &PostParams::default(), &blind)
        .await
        .unwrap();
    assert_eq!(v4.data.unwrap()["a"], "4");

    // A write that changes nothing keeps the resourceVersion.
    let same = api.get("c").await.unwrap();
    let again = api
        .replace("c", &PostParams::default(), &same)
        .await
        .unwrap();
    assert_eq!(same.resource_version(), again.resource_version());

    let missing = api_error(
        api.replace("nope", &PostParams::default(), &cm("nope", json!({})))
            .await,
    );
    assert_eq!(missing.code, 404);
}

#[tokio::test]
async fn patch_formats() {
    let emu = start().await;
    let client = emu.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"a": "1"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(
        created
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .len(),
        2,
        "nodes keep status on create"
    );

    // Strategic merge (what `kubectl cordon` and `label` send for built-ins).
    let pp = PatchParams::default();
    let n = nodes
        .patch("n1", &pp, &Patch::Strategic(json!({"metadata": {"labels": {"b": "2", "a": null}}, "spec": {"unschedulable": true}})))
        .await
        .unwrap();
    assert_eq!(n.labels().get("b").map(String::as_str), Some("2"));
    assert!(!n.labels().contains_key("a"));
    assert_eq!(n.spec.unwrap().unschedulable, Some(true));

    // Strategic merge on node status merges conditions by type.
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            ),
        )
        .await
        .unwrap();
    let conds = n.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(
        conds.iter().find(|c| c.type_ == "Ready").unwrap().status,
        "False"
    );

    // JSON merge patch.
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(
        &PostParams::default(),
        &cm("m", json!({"a": "1", "b": "2"})),
    )
    .await
    .unwrap();
    let m = cms
        .patch(
            "m",
            &pp,
            &Patch::Merge(json!({"data": {"a": null, "c": "3"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        m.data.unwrap(),
        [("b".into(), "2".into()), ("c".into(), "3".into())].into()
    );

    // JSON patch, including a failing test operation.
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/b", "value": "2"},
        {"op": "replace", "path": "/data/b", "value": "20"}
    ]))
    .unwrap();
    let m = cms.patch("m", &pp, &Patch::Json::<()>(ops)).await.unwrap();
    assert_eq!(m.data.unwrap()["b"], "20");
    let bad: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "nope"}]))
            .unwrap();
    let e = api_error(cms.patch("m", &pp, &Patch::Json::<()>(bad)).await);
    assert_eq!(e.code, 422);

    // A resourceVersion inside a patch is a precondition.
    let e = api_error(
        cms.patch(
            "m",
            &pp,
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}})),
        )
        .await,
    );
    assert_eq!(e.code, 409);

    // Server-side apply creates, then updates.
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let apply = PatchParams::apply("test-manager");
    let l = leases
        .patch("l1", &apply, &Patch::Apply(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l1"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 10}
        })))
        .await
        .unwrap();
    assert_eq!(
        l.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("me")
    );
    let mf = l.metadata.managed_fields.unwrap();
    assert_eq!(mf[0].manager.as_deref(), Some("test-manager"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));

    let missing = api_error(cms.patch("nope", &pp, &Patch::Merge(json!({}))).await);
    assert_eq!(missing.code, 404);
}

async fn seed_pods(client: &kube::Client) {
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();
    for (ns, name, node, labels) in [
        (
            "default",
            "a1",
            "n1",
            json!({"app": "gpu", "tier": "agent"}),
        ),
        (
            "default",
            "a2",
            "n2",
            json!({"app": "gpu", "tier": "agent"}),
        ),
        ("default", "b1", "n1", json!({"app": "web"})),
        (
            "other",
            "a3",
            "n1",
            json!({"app": "gpu", "tier": "operator"}),
        ),
        ("other", "c1", "", json!({})),
    ] {
        let mut p = pod(name, node, labels, true);
        if node.is_empty() {
            p["spec"].as_object_mut().unwrap().remove("nodeName");
        }
        create_pod(client, ns, p).await;
    }
}

fn names(l: &kube::core::ObjectList<Pod>) -> Vec<String> {
    let mut n: Vec<String> = l.items.iter().map(|p| p.name_any()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn list_selectors_and_paging() {
    let emu = start().await;
    let client = emu.client();
    seed_pods(&client).await;
    let all: Api<Pod> = Api::all(client.clone());
    let default: Api<Pod> = Api::default_namespaced(client.clone());
    let list = |lp: ListParams| {
        let all = all.clone();
        async move { names(&all.list(&lp).await.unwrap()) }
    };
    assert_eq!(
        list(ListParams::default()).await,
        ["a1", "a2", "a3", "b1", "c1"]
    );
    assert_eq!(
        names(&default.list(&ListParams::default()).await.unwrap()),
        ["a1", "a2", "b1"]
    );
    // Equality and set-based label selectors.
    assert_eq!(
        list(ListParams::default().labels("app=gpu")).await,
        ["a1", "a2", "a3"]
    );
    assert_eq!(
        list(ListParams::default().labels("app==gpu,tier!=agent")).await,
        ["a3"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier in (agent,operator)")).await,
        ["a1", "a2", "a3"]
    );
    assert_eq!(
        list(ListParams::default().labels("app notin (gpu)")).await,
        ["b1", "c1"]
    );
    assert_eq!(
        list(ListParams::default().labels("tier")).await,
        ["a1", "a2", "a3"]
    );
    assert_eq!(
        list(ListParams::default().labels("!tier")).await,
        ["b1", "c1"]
    );
    // Field selectors.
    assert_eq!(
        list(ListParams::default().fields("metadata.name=a2")).await,
        ["a2"]
    );
    assert_eq!(
        list(ListParams::default().fields("metadata.namespace=other")).await,
        ["a3", "c1"]
    );
    assert_eq!(
        list(ListParams::default().fields("spec.nodeName=n1")).await,
        ["a1", "a3", "b1"]
    );
    assert_eq!(
        list(ListParams::default().fields("spec.nodeName=")).await,
        ["c1"]
    );
    assert_eq!(
        list(ListParams::default().fields("spec.nodeName!=n1,metadata.namespace=default")).await,
        ["a2"]
    );
    assert_eq!(
        list(
            ListParams::default()
                .fields("spec.nodeName=n1")
                .labels("app=gpu")
        )
        .await,
        ["a1", "a3"]
    );
    let e = api_error(
        all.list(&ListParams::default().fields("spec.schedulerName2=x"))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    let e = api_error(all.list(&ListParams::default().labels("app in gpu")).await);
    assert_eq!(e.code, 400);

    // limit and continue walk the whole list, one consistent snapshot.
    let first = all.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first), ["a1", "a2"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    default
        .delete("b1", &DeleteParams::default())
        .await
        .unwrap();
    let second = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    // b1 was deleted after the first page, but the pages show the list as it was.
    assert_eq!(names(&second), ["a3", "b1"]);
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "pages share the snapshot"
    );
    let third = all
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_ref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(&third), ["c1"]);
    assert!(third.metadata.continue_.is_none());
}

#[tokio::test]
async fn list_resource_version_semantics() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let c1 = api
        .create(&PostParams::default(), &cm("one", json!({})))
        .await
        .unwrap();
    let rv1 = c1.resource_version().unwrap();
    api.create(&PostParams::default(), &cm("two", json!({})))
        .await
        .unwrap();

    // Any / NotOlderThan: current data.
    let any = api.list(&ListParams::default().match_any()).await.unwrap();
    assert_eq!(any.items.len(), 2);
    let not_older = api
        .list(
            &ListParams::default()
                .at(&rv1)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .unwrap();
    assert_eq!(not_older.items.len(), 2);
    // Exact: the list as it was then.
    let exact = api
        .list(&ListParams::default().at(&rv1).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 1);
    assert_eq!(
        exact.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    // Too new: 504 with the real server's wording.
    let cur: u64 = any.metadata.resource_version.unwrap().parse().unwrap();
    let e = api_error(
        emu.client_without_retries()
            .request::<kube::core::ObjectList<ConfigMap>>(
                http::Request::get(format!(
                    "/api/v1/namespaces/default/configmaps?resourceVersion={}",
                    cur + 100
                ))
                .body(Vec::new())
                .unwrap(),
            )
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (504, "Timeout"));
    // Compacted: 410.
    emu.faults().compact();
    let e = api_error(
        api.list(&ListParams::default().at(&rv1).matching(VersionMatch::Exact))
            .await,
    );
    assert_eq!(e.code, 410);
    assert_eq!(e.reason, "Expired");
}

#[tokio::test]
async fn finalizers_hold_deletion_and_deletecollection() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let mut held = cm("held", json!({}));
    held.metadata.finalizers = Some(vec!["amd.com/cleanup".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let deleted = api.delete("held", &DeleteParams::default()).await.unwrap();
    let obj = deleted.left().expect("object with finalizers is returned");
    assert!(obj.metadata.deletion_timestamp.is_some());
    // Still there, and adding finalizers is refused now.
    let got = api.get("held").await.unwrap();
    assert!(got.metadata.deletion_timestamp.is_some());
    let e = api_error(
        api.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["amd.com/cleanup", "x/y"]}})),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    // Removing the last finalizer completes the deletion.
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(api.get("held").await).code, 404);

    // Preconditions.
    let c = api
        .create(&PostParams::default(), &cm("pre", json!({})))
        .await
        .unwrap();
    let e = api_error(
        api.delete(
            "pre",
            &DeleteParams::default().preconditions(kube::api::Preconditions {
                uid: Some("wrong".into()),
                resource_version: None,
            }),
        )
        .await,
    );
    assert_eq!(e.code, 409);
    api.delete(
        "pre",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        }
        .preconditions(kube::api::Preconditions {
            uid: c.uid(),
            resource_version: None,
        }),
    )
    .await
    .unwrap();

    // deletecollection with a selector.
    for (n, app) in [("x1", "x"), ("x2", "x"), ("y1", "y")] {
        let mut c = cm(n, json!({}));
        c.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    let gone = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(gone.items.len(), 2);
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(left, ["y1"]);

    // Deleting a namespace deletes what is in it.
    let nss: Api<Namespace> = Api::all(emu.client());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "tmp"}})).unwrap(),
    )
    .await
    .unwrap();
    let tmp: Api<ConfigMap> = Api::namespaced(emu.client(), "tmp");
    tmp.create(&PostParams::default(), &cm("in-tmp", json!({})))
        .await
        .unwrap();
    nss.delete("tmp", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_error(tmp.get("in-tmp").await).code, 404);
    assert_eq!(api_error(nss.get("tmp").await).code, 404);
    // A namespace whose content has finalizers stays Terminating until they are gone, and
    // takes no new content meanwhile.
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "slow"}})).unwrap(),
    )
    .await
    .unwrap();
    let slow: Api<ConfigMap> = Api::namespaced(emu.client(), "slow");
    let mut pinned = cm("pinned", json!({}));
    pinned.metadata.finalizers = Some(vec!["amd.com/cleanup".into()]);
    slow.create(&PostParams::default(), &pinned).await.unwrap();
    nss.delete("slow", &DeleteParams::default()).await.unwrap();
    let terminating = nss.get("slow").await.unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let e = api_error(
        slow.create(&PostParams::default(), &cm("late", json!({})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    slow.patch(
        "pinned",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(nss.get("slow").await).code, 404);
    let e = api_error(nss.delete("default", &DeleteParams::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
}

/// Reads the raw body of a request, to check that errors are `metav1.Status` documents.
async fn raw(client: &kube::Client, req: http::Request<Vec<u8>>) -> (u16, Value) {
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    let code = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn errors_are_status_objects() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let check = |(code, body): (u16, Value), want_code: u16, reason: &str| {
        assert_eq!(code, want_code, "{body}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["status"], "Failure");
        assert_eq!(body["code"], want_code);
        assert_eq!(body["reason"], reason, "{body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    };
    let get = |p: &str| http::Request::get(p.to_string()).body(Vec::new()).unwrap();
    let post = |p: &str, b: Value| {
        http::Request::post(p.to_string())
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&b).unwrap())
            .unwrap()
    };
    let r = raw(&client, get("/api/v1/namespaces/default/configmaps/none")).await;
    assert_eq!(r.1["details"]["name"], "none");
    check(r, 404, "NotFound");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    raw(
        &client,
        post("/api/v1/namespaces/default/configmaps", body.clone()),
    )
    .await;
    check(
        raw(&client, post("/api/v1/namespaces/default/configmaps", body)).await,
        409,
        "AlreadyExists",
    );
    let stale = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "resourceVersion": "1"}});
    let put = http::Request::put("/api/v1/namespaces/default/configmaps/x")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&stale).unwrap())
        .unwrap();
    check(raw(&client, put).await, 409, "Conflict");
    let r = raw(
        &client,
        post(
            "/api/v1/namespaces/default/configmaps",
            json!({"metadata": {"name": "Not_Valid"}}),
        ),
    )
    .await;
    assert_eq!(r.1["details"]["causes"][0]["field"], "metadata.name");
    check(r, 422, "Invalid");
    emu.faults().compact();
    check(
        raw(&client, get("/api/v1/namespaces/default/configmaps?resourceVersion=2&resourceVersionMatch=Exact")).await,
        410,
        "Expired",
    );
    // Apply needs a field manager.
    let apply = http::Request::patch("/api/v1/namespaces/default/configmaps/x")
        .header("content-type", "application/apply-patch+yaml")
        .body(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n".to_vec())
        .unwrap();
    check(raw(&client, apply).await, 422, "Invalid");
    // Strategic merge is refused for an unknown patch content type.
    let weird = http::Request::patch("/api/v1/namespaces/default/configmaps/x")
        .header("content-type", "application/x-nonsense")
        .body(b"{}".to_vec())
        .unwrap();
    check(raw(&client, weird).await, 415, "UnsupportedMediaType");
    emu.faults().fail_next(1, "get", "namespaces", 410);
    check(
        raw(&client, get("/api/v1/namespaces/default")).await,
        410,
        "Gone",
    );
    emu.faults().fail_next(1, "get", "namespaces", 429);
    check(
        raw(&client, get("/api/v1/namespaces/default")).await,
        429,
        "TooManyRequests",
    );
    // Unknown paths answer a Status too.
    check(
        raw(&client, get("/apis/nope.example.com/v1/things")).await,
        404,
        "NotFound",
    );
    let s: Status =
        serde_json::from_value(raw(&client, get("/api/v1/nodes/missing")).await.1).unwrap();
    assert!(s.is_not_found());
}

#[tokio::test]
async fn kubeconfig_file_works_with_kube() {
    let emu = start().await;
    let kc = kube::config::Kubeconfig::read_from(emu.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config).unwrap();
    let ns: Api<Namespace> = Api::all(client);
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    // And the other helpers agree with it.
    let out = tempfile::NamedTempFile::new().unwrap();
    emu.write_kubeconfig(out.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.path()).unwrap(),
        emu.kubeconfig_yaml()
    );
    assert!(emu.kubeconfig_yaml().contains(&emu.url()));
}

#[tokio::test]
async fn events_services_and_resource_kinds() {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, Service};
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
    use kube::Resource as _;
    use kube::runtime::events::{Event as RuntimeEvent, EventType, Recorder, Reporter};

    let emu = start().await;
    let client = emu.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "gpu-node"}})).unwrap(),
        )
        .await
        .unwrap();

    // kube-runtime's recorder: events.k8s.io/v1 create, then a merge patch for the series.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "gpu-operator".into(),
            instance: Some("agent-1".into()),
        },
    );
    let ev = RuntimeEvent {
        type_: EventType::Normal,
        reason: "DriverLoaded".into(),
        note: Some("amdgpu loaded".into()),
        action: "Load".into(),
        secondary: None,
    };
    let reference = node.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(list.items[0].reason.as_deref(), Some("DriverLoaded"));
    let made = emu.requests();
    assert_eq!(made.get("create", "events.events.k8s.io"), 1, "{made}");
    assert_eq!(made.get("patch", "events.events.k8s.io"), 1, "{made}");

    // Core events with their field selectors.
    let core: Api<CoreEvent> = Api::default_namespaced(client.clone());
    core.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "e1"}, "reason": "Started", "type": "Normal",
            "involvedObject": {"kind": "Node", "name": "gpu-node"}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let l = core
        .list(&ListParams::default().fields("involvedObject.kind=Node,reason=Started"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);

    // Services keep status to the status subresource.
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let svc = svcs
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": {"name": "metrics"},
            "spec": {"ports": [{"name": "http", "port": 5000}], "selector": {"app": "exporter"}},
            "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
        })).unwrap())
        .await
        .unwrap();
    assert!(
        svc.status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_none()
    );

    // DRA kinds, with ResourceSlice field selectors.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for (name, node) in [("s1", "gpu-node"), ("s2", "other")] {
        slices
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"driver": "gpu.amd.com", "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "gpu-0"}]}
            })).unwrap())
            .await
            .unwrap();
    }
    let mine = slices
        .list(&ListParams::default().fields("spec.nodeName=gpu-node,spec.driver=gpu.amd.com"))
        .await
        .unwrap();
    assert_eq!(
        mine.items.iter().map(|s| s.name_any()).collect::<Vec<_>>(),
        ["s1"]
    );
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let dc = classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "gpu.amd.com"}, "spec": {}}))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(dc.metadata.generation, Some(1));
}

/// kube-runtime's Recorder writes events.k8s.io/v1 Events; a core v1 client lists and
/// watches the same objects (one resource, two views), including the series update.
#[tokio::test]
async fn recorder_events_are_core_events_too() {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::runtime::watcher;

    let emu = start().await;
    let client = emu.client();
    within("recorder events through core v1", async {
        let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
        let mut changes = watcher(core.clone(), watcher::Config::default()).boxed();
        // The watch is established once its initial list is done.
        loop {
            if let Some(Ok(watcher::Event::InitDone)) = changes.next().await {
                break;
            }
        }
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpu-operator".into(),
                instance: Some("node-1".into()),
            },
        );
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some("node-1".into()),
            namespace: Some("default".into()),
            ..Default::default()
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: "GPUUnhealthy".into(),
            note: Some("gpu 0 failed its health check".into()),
            action: "HealthCheck".into(),
            secondary: None,
        };
        recorder.publish(&ev, &node).await.unwrap();
        let seen = loop {
            match changes.next().await {
                Some(Ok(watcher::Event::Apply(e))) => break e,
                Some(_) => continue,
                None => panic!("the core watch ended"),
            }
        };
        assert_eq!(seen.reason.as_deref(), Some("GPUUnhealthy"));
        assert_eq!(
            seen.message.as_deref(),
            Some("gpu 0 failed its health check")
        );
        assert_eq!(seen.involved_object.name.as_deref(), Some("node-1"));
        assert_eq!(seen.reporting_component.as_deref(), Some("gpu-operator"));
        assert_eq!(seen.reporting_instance.as_deref(), Some("node-1"));
        assert_eq!(seen.type_.as_deref(), Some("Warning"));

        // The same event again: the Recorder patches the series; core sees the count.
        recorder.publish(&ev, &node).await.unwrap();
        let updated = loop {
            match changes.next().await {
                Some(Ok(watcher::Event::Apply(e))) => break e,
                Some(_) => continue,
                None => panic!("the core watch ended"),
            }
        };
        assert_eq!(updated.metadata.name, seen.metadata.name);
        assert_eq!(updated.series.as_ref().and_then(|s| s.count), Some(2));

        let listed = core.list(&ListParams::default()).await.unwrap();
        assert_eq!(listed.items.len(), 1);
        assert_eq!(
            listed.items[0].message.as_deref(),
            Some("gpu 0 failed its health check")
        );
    })
    .await;
}
