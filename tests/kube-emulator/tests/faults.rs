//! Fault injection and request accounting: failing the next N requests, latency, dropped
//! watches, stop/restart with the same state, counts from the test and `/debug/requests`,
//! and the "an idle client only watches" assertion later tests rely on.

mod common;

use std::time::Duration;

use common::{api_error, eventually, start, start_with, within};
use futures::StreamExt;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, ListParams, PostParams, ResourceExt, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher};
use kube_emulator::EmulatorConfig;
use serde_json::{Value, json};

#[tokio::test]
async fn fail_next_n_matching_requests() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let ns: Api<Namespace> = Api::all(client.clone());
    emu.faults().fail_next(2, "get", "namespaces", 500);
    assert_eq!(emu.faults().pending_failures(), 2);
    // Other verbs and resources are not affected.
    ns.list(&ListParams::default()).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.list(&ListParams::default()).await.unwrap();
    for _ in 0..2 {
        let e = api_error(ns.get("default").await);
        assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    }
    ns.get("default").await.unwrap();
    assert_eq!(emu.faults().pending_failures(), 0);

    // kube's default client retries 503s by itself: the faults show up as extra requests.
    let retrying: Api<Namespace> = Api::all(emu.client());
    let before = emu.requests();
    emu.faults().fail_next(2, "list", "namespaces", 503);
    retrying.list(&ListParams::default()).await.unwrap();
    assert_eq!(emu.requests().since(&before).get("list", "namespaces"), 3);

    // Wildcards, and watches fail before the stream starts.
    emu.faults().fail_next(1, "watch", "*", 403);
    let e = api_error(ns.watch(&WatchParams::default(), "0").await.map(|_| ()));
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    emu.faults().fail_next(1, "*", "*", 409);
    assert_eq!(api_error(ns.get("default").await).code, 409);
    emu.faults().fail_next(5, "*", "*", 500);
    emu.faults().clear();
    ns.get("default").await.unwrap();
}

#[tokio::test]
async fn latency_delays_matching_requests() {
    let emu = start().await;
    let ns: Api<Namespace> = Api::all(emu.client());
    emu.faults()
        .add_latency("get", "namespaces", Duration::from_millis(800));
    emu.faults()
        .add_latency("get", "nodes", Duration::from_secs(30));
    let t = tokio::time::Instant::now();
    ns.get("default").await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "took {:?}",
        t.elapsed()
    );
    // Rules only apply to what they match (a 30 s rule on `get nodes` leaves `list nodes`
    // alone, which `within` bounds well below 30 s), and clearing removes them.
    let nodes: Api<Node> = Api::all(emu.client());
    within("list is not delayed", nodes.list(&ListParams::default()))
        .await
        .unwrap();
    emu.faults().clear();
    let _ = within("no latency left", nodes.get("x")).await;
}

#[tokio::test]
async fn drop_watches_cuts_open_streams() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let mut s1 = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut s2 = api
        .watch(&WatchParams::default().labels("a=b"), "0")
        .await
        .unwrap()
        .boxed();
    eventually("two watches open", || emu.open_watches() == 2).await;
    assert_eq!(emu.faults().drop_watches(), 2);
    for s in [&mut s1, &mut s2] {
        // The stream ends, possibly after a transport error; it does not hang.
        let rest: Vec<_> = within("stream cut", s.collect::<Vec<_>>()).await;
        assert!(
            rest.iter().all(|e| !matches!(e, Ok(WatchEvent::Added(_)))),
            "{rest:?}"
        );
    }
    eventually("no watch open", || emu.open_watches() == 0).await;
}

#[tokio::test]
async fn restart_keeps_state_and_port() {
    let mut emu = start().await;
    let client = emu.client_without_retries();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let c = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "keep"}})).unwrap(),
        )
        .await
        .unwrap();
    let url = emu.url();
    emu.stop().await;
    assert!(
        api.get("keep").await.is_err(),
        "nothing answers while stopped"
    );
    emu.restart().await.unwrap();
    assert_eq!(emu.url(), url);
    let again = api.get("keep").await.unwrap();
    assert_eq!(again.uid(), c.uid());
    let next = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "after"}})).unwrap(),
        )
        .await
        .unwrap();
    let (a, b): (u64, u64) = (
        c.resource_version().unwrap().parse().unwrap(),
        next.resource_version().unwrap().parse().unwrap(),
    );
    assert!(b > a, "resourceVersions continue after a restart");
    // Restart while running also works.
    emu.restart().await.unwrap();
    api.get("after").await.unwrap();
}

async fn get_json(client: &kube::Client, path: &str, method: http::Method) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    let res = client.send(req).await.unwrap();
    let code = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn requests_are_counted_by_verb_resource_and_watch() {
    let emu = start().await;
    let client = emu.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let start_counts = emu.requests();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    cms.get("c").await.unwrap();
    cms.get("c").await.unwrap();
    cms.list(&ListParams::default()).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.get_status("missing").await;
    let w = cms
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap();
    within("watch ends", w.collect::<Vec<_>>()).await;
    let _ = client.apiserver_version().await.unwrap();

    let made = emu.requests().since(&start_counts);
    assert_eq!(made.get("create", "configmaps"), 1, "{made}");
    assert_eq!(made.get("get", "configmaps"), 2, "{made}");
    assert_eq!(made.get("list", "configmaps"), 1, "{made}");
    assert_eq!(made.get("get", "nodes/status"), 1, "{made}");
    assert_eq!(made.get("watch", "configmaps"), 1, "{made}");
    assert_eq!(made.get("get", "/version"), 1, "{made}");
    assert_eq!(made.watches(), 1);
    assert_eq!(made.non_watch().total(), 6);
    assert_eq!(made.total(), 7);
    assert!(made.0.keys().any(|k| k.watch && k.verb == "watch"));

    // The same counts over HTTP; debug requests are not counted themselves.
    let (code, doc) = get_json(&client, "/debug/requests", http::Method::GET).await;
    assert_eq!(code, 200);
    let all = emu.requests();
    assert_eq!(doc["total"], all.total());
    assert_eq!(doc["watches"], 1);
    assert!(
        doc["requests"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["verb"] == "get"
                && r["resource"] == "configmaps"
                && r["count"] == 2
                && r["watch"] == false)
    );
    assert_eq!(
        emu.requests(),
        all,
        "reading /debug/requests is not counted"
    );

    // Faults over HTTP, for the binary.
    let (code, doc) = get_json(
        &client,
        "/debug/faults/fail?verb=get&resource=configmaps&count=1&code=503",
        http::Method::POST,
    )
    .await;
    assert_eq!((code, doc["pendingFailures"].as_u64()), (200, Some(1)));
    let strict: Api<ConfigMap> = Api::default_namespaced(emu.client_without_retries());
    assert_eq!(api_error(strict.get("c").await).code, 503);
    let (_, doc) = get_json(&client, "/debug/faults/compact", http::Method::POST).await;
    assert!(doc["compactedRevision"].as_u64().unwrap() >= emu.resource_version());
    let (_, doc) = get_json(&client, "/debug/faults/drop-watches", http::Method::POST).await;
    assert_eq!(doc["dropped"], 0);
    get_json(
        &client,
        "/debug/faults/latency?verb=get&resource=configmaps&ms=200",
        http::Method::POST,
    )
    .await;
    let t = tokio::time::Instant::now();
    strict.get("c").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
    get_json(&client, "/debug/faults/clear", http::Method::POST).await;
}

#[tokio::test]
async fn an_idle_reflector_makes_no_requests_but_its_watch() {
    // Short bookmarks and watch timeouts so that the quiet period sees both kinds of
    // server-side activity; the idle window is 2 s here (later agent tests use longer ones).
    let emu =
        start_with(EmulatorConfig::default().bookmark_interval(Duration::from_millis(200))).await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().timeout(1);
    let task = tokio::spawn(reflector(writer, watcher(api, cfg)).for_each(|_| async {}));
    within("reflector ready", reader.wait_until_ready())
        .await
        .unwrap();
    let before = emu.requests();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let made = emu.requests().since(&before);
    assert_eq!(
        made.non_watch().total(),
        0,
        "idle reflector made requests:\n{made}"
    );
    assert!(
        made.get("watch", "configmaps") >= 1,
        "watches re-opened after their timeout:\n{made}"
    );
    task.abort();
}

#[tokio::test]
async fn writes_are_logged_in_order_with_their_object_and_field_manager() {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let emu = start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let before = emu.writes().len();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    cms.get("c").await.unwrap();
    cms.patch(
        "c",
        &PatchParams::apply("tester"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}})),
    )
    .await
    .unwrap();
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    let writes: Vec<String> = emu.writes()[before..]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        writes,
        [
            "create configmaps default/",
            "patch configmaps default/c",
            "delete configmaps default/c"
        ],
        "reads are not logged"
    );
    assert_eq!(
        emu.writes()[before + 1].field_manager.as_deref(),
        Some("tester")
    );
}
