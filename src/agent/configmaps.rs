//! Follows the `config.json` key of a ConfigMap that a DeviceConfig names (the
//! metrics exporter's and the test runner's configuration), by watching that one
//! ConfigMap. The name can change with the DeviceConfig; the watch follows it.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

/// The key the reference reads from these ConfigMaps.
pub const CONFIG_KEY: &str = "config.json";

/// `namespace/name` of the ConfigMap to follow.
pub type ConfigMapRef = (String, String);

/// Holds at most one watch; [`ConfigMapFollower::follow`] switches it.
pub struct ConfigMapFollower {
    client: Client,
    current: Option<ConfigMapRef>,
    text: watch::Sender<Option<Arc<str>>>,
    task: Option<AbortOnDropHandle<()>>,
}

impl ConfigMapFollower {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            current: None,
            text: watch::Sender::new(None),
            task: None,
        }
    }

    /// The `config.json` text of the followed ConfigMap; `None` when nothing is
    /// followed, the ConfigMap does not exist, or it has no such key.
    pub fn text(&self) -> Option<String> {
        self.text.borrow().as_deref().map(str::to_owned)
    }

    /// Wakes when the text changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.text.subscribe()
    }

    /// Follows `target` (or nothing). A no-op when it is already followed.
    pub fn follow(&mut self, target: Option<ConfigMapRef>) {
        if target == self.current {
            return;
        }
        self.task = None;
        self.text.send_replace(None);
        self.current = target.clone();
        let Some((namespace, name)) = target else {
            return;
        };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let tx = self.text.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(cm) | Event::InitApply(cm)) => {
                        let text = cm
                            .data
                            .as_ref()
                            .and_then(|d| d.get(CONFIG_KEY))
                            .map(|t| Arc::<str>::from(t.as_str()));
                        tx.send_if_modified(|current| {
                            let changed = *current != text;
                            *current = text;
                            changed
                        });
                    }
                    Ok(Event::Delete(_)) => {
                        tx.send_replace(None);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(configmap = %name, error = %e, "ConfigMap watch error; retrying")
                    }
                }
            }
        });
        self.task = Some(AbortOnDropHandle::new(task));
    }
}
