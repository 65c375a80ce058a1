//! The watch protocol: event types, bookmarks, resume, 410 after compaction, timeouts,
//! selectors, streaming lists, and kube-runtime's watcher and reflector (unmodified) riding
//! out dropped watches, compaction and a server restart.

use crate::common;

use std::time::Duration;

use common::{eventually, start, start_with, within};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, ResourceExt, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_emulator::EmulatorConfig;
use serde_json::json;
use tokio::sync::mpsc;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

async fn next<S>(s: &mut S) -> WatchEvent<ConfigMap>
where
    S: Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    within("next watch event", s.next())
        .await
        .expect("stream still open")
        .expect("no stream error")
}

/// The next event that is not a bookmark.
async fn next_change<S>(s: &mut S) -> WatchEvent<ConfigMap>
where
    S: Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    loop {
        match next(s).await {
            WatchEvent::Bookmark(_) => continue,
            e => return e,
        }
    }
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.resource_version().unwrap().parse().unwrap()
}

#[tokio::test]
async fn raw_watch_reports_changes_and_bookmarks() {
    let emu =
        start_with(EmulatorConfig::default().bookmark_interval(Duration::from_millis(200))).await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut s = api
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();

    api.create(&PostParams::default(), &cm("w", json!({})))
        .await
        .unwrap();
    let WatchEvent::Added(a) = next_change(&mut s).await else {
        panic!("expected ADDED")
    };
    assert_eq!(a.name_any(), "w");
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    let WatchEvent::Modified(m) = next_change(&mut s).await else {
        panic!("expected MODIFIED")
    };
    assert_eq!(m.data.as_ref().unwrap()["k"], "2");
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let WatchEvent::Deleted(d) = next_change(&mut s).await else {
        panic!("expected DELETED")
    };
    assert!(
        rv_of(&d) > rv_of(&m),
        "a deletion has its own resourceVersion"
    );

    let bookmark = within("bookmark", async {
        loop {
            if let WatchEvent::Bookmark(b) = next(&mut s).await {
                return b;
            }
        }
    })
    .await;
    assert!(bookmark.metadata.resource_version.parse::<u64>().unwrap() >= rv_of(&d));

    // Without allowWatchBookmarks there are none.
    let mut quiet = api
        .watch(
            &WatchParams::default().timeout(1).disable_bookmarks(),
            &rv_of(&d).to_string(),
        )
        .await
        .unwrap()
        .boxed();
    let got: Vec<_> = within("quiet watch ends", quiet.by_ref().collect::<Vec<_>>()).await;
    assert!(got.is_empty(), "{got:?}");
}

/// `delivered` says how far the watchers of a resource trail its writes: it moves
/// when a watch sends an event, live or replayed, and not on the write itself.
#[tokio::test]
async fn delivered_follows_what_the_watches_sent() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    assert_eq!(emu.delivered("configmaps"), 0, "no watch yet");

    // A replay from a's revision - 1 sends a as an initial event.
    let mut replay = api
        .watch(
            &WatchParams::default().timeout(5),
            &(rv_of(&a) - 1).to_string(),
        )
        .await
        .unwrap()
        .boxed();
    let WatchEvent::Added(_) = next_change(&mut replay).await else {
        panic!("expected ADDED a")
    };
    eventually("a's replay counted", || {
        emu.delivered("configmaps") == rv_of(&a)
    })
    .await;

    let b = api
        .create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    let WatchEvent::Added(_) = next_change(&mut replay).await else {
        panic!("expected ADDED b")
    };
    eventually("b's live event counted", || {
        emu.delivered("configmaps") == rv_of(&b)
    })
    .await;
    assert_eq!(emu.delivered("secrets"), 0, "per resource");
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();

    let mut s = api
        .watch(
            &WatchParams::default().timeout(5),
            &a.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let WatchEvent::Modified(m) = next_change(&mut s).await else {
        panic!("expected MODIFIED a")
    };
    assert_eq!(m.name_any(), "a");
    let WatchEvent::Added(b) = next_change(&mut s).await else {
        panic!("expected ADDED b")
    };
    assert_eq!(b.name_any(), "b");

    // From "0": the current state as ADDED events.
    let mut s = api
        .watch(&WatchParams::default().timeout(5), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        let WatchEvent::Added(o) = next_change(&mut s).await else {
            panic!("expected ADDED")
        };
        names.push(o.name_any());
    }
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test]
async fn compacted_resume_gets_a_410_error_event() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    emu.faults().compact();
    let mut s = api
        .watch(
            &WatchParams::default().timeout(5),
            &a.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match next(&mut s).await {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.contains("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    assert!(within("stream closes", s.next()).await.is_none());

    // A history window: only the last N changes are kept.
    let emu = start_with(EmulatorConfig::default().history_limit(3)).await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let first = api
        .create(&PostParams::default(), &cm("x", json!({})))
        .await
        .unwrap();
    for i in 0..4 {
        api.patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    let mut s = api
        .watch(
            &WatchParams::default().timeout(5),
            &first.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut s).await, WatchEvent::Error(e) if e.code == 410));
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let started = tokio::time::Instant::now();
    let s = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .unwrap();
    let events: Vec<_> = within("watch ends", s.collect::<Vec<_>>()).await;
    assert!(events.iter().all(|e| e.is_ok()));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "ended after {:?}",
        started.elapsed()
    );
    assert_eq!(emu.open_watches(), 0);
}

#[tokio::test]
async fn selector_watch_sees_objects_enter_and_leave() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut s = api
        .watch(&WatchParams::default().timeout(10).labels("app=x"), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("other", json!({"app": "y"})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("c", json!({"app": "x"})))
        .await
        .unwrap();
    assert!(matches!(next_change(&mut s).await, WatchEvent::Added(o) if o.name_any() == "c"));
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    assert!(matches!(next_change(&mut s).await, WatchEvent::Deleted(o) if o.name_any() == "c"));
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "x"}}})),
    )
    .await
    .unwrap();
    assert!(matches!(next_change(&mut s).await, WatchEvent::Added(o) if o.name_any() == "c"));
    // Field selector on one name, as `watch_object` uses.
    let mut one = api
        .watch(
            &WatchParams::default()
                .timeout(10)
                .fields("metadata.name=other"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_change(&mut one).await, WatchEvent::Added(o) if o.name_any() == "other"));
}

#[tokio::test]
async fn streaming_list_sends_initial_events_then_a_marked_bookmark() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut s = api
        .watch(&WatchParams::default().timeout(5).initial_events(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut s).await, WatchEvent::Added(o) if o.name_any() == "a"));
    match next(&mut s).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            );
        }
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    }
}

/// Runs a watcher in a task and hands its events over a channel, so the test can stop and
/// restart the server meanwhile.
fn spawn_watcher(
    api: Api<ConfigMap>,
    config: watcher::Config,
) -> (
    mpsc::UnboundedReceiver<Result<watcher::Event<ConfigMap>, watcher::Error>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut s = watcher(api, config).default_backoff().boxed();
        while let Some(e) = s.next().await {
            if tx.send(e).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

type Events = mpsc::UnboundedReceiver<Result<watcher::Event<ConfigMap>, watcher::Error>>;

/// Waits for an event matching `want`, returning the ones seen before it.
async fn wait_for(
    rx: &mut Events,
    what: &str,
    want: impl Fn(&Result<watcher::Event<ConfigMap>, watcher::Error>) -> bool,
) -> Vec<Result<watcher::Event<ConfigMap>, watcher::Error>> {
    within(what, async {
        let mut seen = Vec::new();
        loop {
            let e = rx.recv().await.expect("watcher running");
            if want(&e) {
                return seen;
            }
            seen.push(e);
        }
    })
    .await
}

fn is_apply_of(
    name: &'static str,
) -> impl Fn(&Result<watcher::Event<ConfigMap>, watcher::Error>) -> bool {
    move |e| matches!(e, Ok(watcher::Event::Apply(o)) if o.name_any() == name)
}

fn is_init_done(e: &Result<watcher::Event<ConfigMap>, watcher::Error>) -> bool {
    matches!(e, Ok(watcher::Event::InitDone))
}

#[tokio::test]
async fn reflector_tracks_objects_with_list_then_watch() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    let task = tokio::spawn(stream.for_each(|_| async {}));
    within("store ready", reader.wait_until_ready())
        .await
        .unwrap();
    assert_eq!(reader.state().len(), 1);
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    eventually("b in the store", || reader.state().len() == 2).await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("a gone from the store", || {
        reader
            .state()
            .iter()
            .map(|o| o.name_any())
            .collect::<Vec<_>>()
            == ["b"]
    })
    .await;
    let counts = emu.requests();
    assert_eq!(
        counts.get("list", "configmaps"),
        1,
        "one initial list:\n{counts}"
    );
    assert_eq!(counts.get("watch", "configmaps"), 1, "one watch:\n{counts}");
    task.abort();
}

#[tokio::test]
async fn watcher_with_streaming_lists() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default().streaming_lists());
    let before = wait_for(&mut rx, "InitDone", is_init_done).await;
    assert!(
        before
            .iter()
            .any(|e| matches!(e, Ok(watcher::Event::InitApply(o)) if o.name_any() == "a"))
    );
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    wait_for(&mut rx, "Apply b", is_apply_of("b")).await;
    let counts = emu.requests();
    assert_eq!(
        counts.get("list", "configmaps"),
        0,
        "streaming lists do not list:\n{counts}"
    );
    assert_eq!(counts.get("watch", "configmaps"), 1);
    task.abort();
}

#[tokio::test]
async fn watcher_resumes_after_a_dropped_watch() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default());
    wait_for(&mut rx, "InitDone", is_init_done).await;
    eventually("watch open", || emu.open_watches() == 1).await;
    let before = emu.requests();
    assert_eq!(emu.faults().drop_watches(), 1);
    api.create(&PostParams::default(), &cm("after-drop", json!({})))
        .await
        .unwrap();
    let seen = wait_for(&mut rx, "Apply after the drop", is_apply_of("after-drop")).await;
    assert!(
        !seen.iter().any(is_init_done),
        "resumed, not relisted: {seen:?}"
    );
    let made = emu.requests().since(&before);
    assert_eq!(made.get("list", "configmaps"), 0, "{made}");
    assert!(made.get("watch", "configmaps") >= 1, "{made}");
    task.abort();
}

#[tokio::test]
async fn watcher_relists_after_410() {
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default());
    wait_for(&mut rx, "InitDone", is_init_done).await;
    eventually("watch open", || emu.open_watches() == 1).await;
    let before = emu.requests();
    emu.faults().compact();
    emu.faults().drop_watches();
    let seen = wait_for(&mut rx, "relist after 410", is_init_done).await;
    assert!(
        seen.iter()
            .any(|e| matches!(e, Err(watcher::Error::WatchError(s)) if s.code == 410)),
        "the watcher saw the 410: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| matches!(e, Ok(watcher::Event::InitApply(o)) if o.name_any() == "a"))
    );
    let made = emu.requests().since(&before);
    assert_eq!(made.get("list", "configmaps"), 1, "{made}");
    // And it keeps watching from the new list.
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    wait_for(&mut rx, "Apply b", is_apply_of("b")).await;
    task.abort();
}

#[tokio::test]
async fn watcher_resumes_after_a_server_restart() {
    let mut emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let (mut rx, task) = spawn_watcher(api.clone(), watcher::Config::default());
    wait_for(&mut rx, "InitDone", is_init_done).await;
    eventually("watch open", || emu.open_watches() == 1).await;
    let before = emu.requests();
    let url = emu.url();
    emu.stop().await;
    assert!(!emu.is_running());
    // Written while the server is down (straight into the store), seen after the restart.
    emu.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "while-down", "namespace": "default"}}))
        .unwrap();
    // Down for a while, not just a blink: the watcher sees the outage.
    tokio::time::sleep(Duration::from_millis(300)).await;
    emu.restart().await.unwrap();
    assert_eq!(emu.url(), url, "same port");
    let seen = wait_for(&mut rx, "Apply after restart", is_apply_of("while-down")).await;
    assert!(
        !seen.iter().any(is_init_done),
        "resumed from its resourceVersion: {seen:?}"
    );
    let made = emu.requests().since(&before);
    assert_eq!(made.get("list", "configmaps"), 0, "{made}");
    task.abort();
}

#[tokio::test]
async fn metadata_only_lists_gets_and_watchers() {
    use kube::api::PartialObjectMeta;
    let emu = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(emu.client());
    api.create(&PostParams::default(), &cm("a", json!({"app": "x"})))
        .await
        .unwrap();

    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.labels.as_ref().unwrap()["app"], "x");
    let one = api.get_metadata("a").await.unwrap();
    assert_eq!(one.types.as_ref().unwrap().kind, "PartialObjectMetadata");

    // kube 5 sends metadata-only requests for `Api<PartialObjectMeta<K>>`.
    let meta: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(emu.client());
    let mut s = watcher(meta, watcher::Config::default()).boxed();
    within("metadata InitDone", async {
        while !matches!(s.next().await, Some(Ok(watcher::Event::InitDone))) {}
    })
    .await;
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    let applied = within("metadata Apply", async {
        loop {
            if let Some(Ok(watcher::Event::Apply(m))) = s.next().await {
                return m;
            }
        }
    })
    .await;
    assert_eq!(applied.name_any(), "b");
    assert_eq!(applied.types.unwrap().kind, "PartialObjectMetadata");
}
