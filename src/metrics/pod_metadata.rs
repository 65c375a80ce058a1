//! The UID and labels of the pods on this node, from the API server: what
//! `POD_UUID` and `ExtraPodLabels` need and the kubelet's PodResources API
//! does not give. One metadata-only watch of the Pods whose `spec.nodeName`
//! is this node, kept as a map by namespace and name. Absent in standalone
//! mode (no API server): those labels are then empty.
//!
//! This module watches and keeps; it must not decide which label a series
//! gets (`render` does) or write anything.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// What the API server says of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub uid: String,
    pub labels: BTreeMap<String, String>,
}

/// `(namespace, name)` → the pod's metadata.
pub type PodMetadata = BTreeMap<(String, String), PodMeta>;

/// A running watch; dropping it stops the watch.
pub struct PodMetadataWatch {
    current: watch::Receiver<Arc<PodMetadata>>,
    _task: AbortOnDropHandle<()>,
}

impl PodMetadataWatch {
    /// Watches the pods of `node`. A failing watch backs off and retries; the
    /// last known pods stay meanwhile.
    pub fn start(client: Client, node: &str) -> Self {
        // Metadata only: the pods' specs (and their environment) are never read.
        let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (tx, current) = watch::channel(Arc::new(PodMetadata::new()));
        let task = tokio::spawn(async move {
            // kube's reflector keeps the pods, swapping a relist in whole at
            // its end, as the agent's DeviceConfig store does.
            let (store, writer) = reflector::store();
            let mut events = reflector::reflector(writer, watcher::watcher(api, config))
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    // A relist in progress: the store still holds the last one.
                    Ok(Event::Init | Event::InitApply(_)) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "pod metadata watch");
                        continue;
                    }
                }
                let known: PodMetadata = store.state().iter().filter_map(|p| entry(p)).collect();
                tx.send_if_modified(|current| {
                    let changed = **current != known;
                    if changed {
                        *current = Arc::new(known);
                    }
                    changed
                });
            }
        });
        Self {
            current,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The pods as last seen.
    pub fn current(&self) -> Arc<PodMetadata> {
        self.current.borrow().clone()
    }

    /// Waits until `done` holds of the pods seen (tests).
    pub async fn wait_for(&mut self, done: impl Fn(&PodMetadata) -> bool) {
        let _ = self.current.wait_for(|m| done(m)).await;
    }
}

fn entry(pod: &PartialObjectMeta<Pod>) -> Option<((String, String), PodMeta)> {
    let meta = &pod.metadata;
    let key = (meta.namespace.clone()?, meta.name.clone()?);
    let value = PodMeta {
        uid: meta.uid.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
    };
    Some((key, value))
}

/// Pure: each device's pod with its UID and labels filled in from `metadata`,
/// where the API server knows the pod.
pub fn enrich(pods: &mut crate::pod_resources::DevicePods, metadata: &PodMetadata) {
    for pod in pods.values_mut().flatten() {
        if let Some(meta) = metadata.get(&(pod.namespace.clone(), pod.pod.clone())) {
            pod.uid = meta.uid.clone();
            pod.labels = meta.labels.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::DeviceRef;
    use crate::pod_resources::PodRef;
    use serde_json::json;

    /// A wait that fails the test instead of hanging it.
    async fn bounded(wait: impl std::future::Future<Output = ()>) {
        tokio::time::timeout(std::time::Duration::from_secs(10), wait)
            .await
            .expect("the watch saw it within 10 s");
    }

    #[tokio::test]
    async fn pods_of_this_node_are_followed_with_uid_and_labels() {
        let emu = kube_emulator::Emulator::start(kube_emulator::EmulatorConfig::default())
            .await
            .unwrap();
        emu.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "ml"}}))
            .unwrap();
        let pod = |name: &str, node: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml",
                             "labels": {"example.com/workload": format!("w-{name}")}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
        };
        emu.create(pod("train", "node-1")).unwrap();
        emu.create(pod("elsewhere", "node-2")).unwrap();
        let mut watch = PodMetadataWatch::start(emu.client(), "node-1");
        bounded(watch.wait_for(|m| m.contains_key(&("ml".into(), "train".into())))).await;
        let seen = watch.current();
        assert_eq!(seen.len(), 1, "only this node's pods: {seen:?}");
        let train = &seen[&("ml".to_owned(), "train".to_owned())];
        assert!(!train.uid.is_empty());
        assert_eq!(train.labels["example.com/workload"], "w-train");

        // A pod that arrives later is seen.
        emu.create(pod("eval", "node-1")).unwrap();
        bounded(watch.wait_for(|m| m.len() == 2)).await;
        let mut pods = BTreeMap::from([(
            DeviceRef::gpu("0000:05:00.0"),
            vec![PodRef {
                pod: "eval".into(),
                namespace: "ml".into(),
                container: "c".into(),
                ..PodRef::default()
            }],
        )]);
        enrich(&mut pods, &watch.current());
        let eval = &pods[&DeviceRef::gpu("0000:05:00.0")][0];
        assert_eq!(eval.labels["example.com/workload"], "w-eval");
        assert!(!eval.uid.is_empty() && eval.uid != train.uid);

        // A pod deleted (at once, as a kubelet confirms) is forgotten.
        let pods: kube::Api<Pod> = kube::Api::namespaced(emu.client(), "ml");
        pods.delete("train", &kube::api::DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        bounded(watch.wait_for(|m| !m.contains_key(&("ml".into(), "train".into())))).await;
        assert_eq!(watch.current().len(), 1);
    }
}
