//! Follows the `config.json` key of a ConfigMap that a DeviceConfig names (the
//! metrics exporter's and the test runner's configuration), by watching that one
//! ConfigMap. The name can change with the DeviceConfig; the watch follows it.
//! [`AccessFollower`] does the same for the Secret and ConfigMap that
//! `metricsExporter.rbacConfig` names. Only objects named by the DeviceConfig
//! are read, each by its name; nothing here writes.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::api::KubeRbacConfig;
use crate::metrics::access::{self, AccessMaterial, Fetched, TlsPair};
use crate::service::Followers;

/// The key the reference reads from these ConfigMaps.
pub const CONFIG_KEY: &str = "config.json";

/// `namespace/name` of the ConfigMap to follow.
pub type ConfigMapRef = (String, String);

/// Holds at most one watch; [`ConfigMapFollower::follow`] switches it. The
/// watch runs as the follower `name` of `followers`, which reports its end.
pub struct ConfigMapFollower {
    client: Client,
    followers: Followers,
    name: &'static str,
    current: Option<ConfigMapRef>,
    text: watch::Sender<Option<Arc<str>>>,
    task: Option<AbortOnDropHandle<()>>,
}

impl ConfigMapFollower {
    pub fn new(client: Client, followers: Followers, name: &'static str) -> Self {
        Self {
            client,
            followers,
            name,
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
        let task = self.followers.spawn(self.name, async move {
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
        self.task = Some(task);
    }
}

/// Follows the Secret (`tls.crt`, `tls.key`) and the client CA ConfigMap
/// (`ca.crt`) that `metricsExporter.rbacConfig` names, each by a watch on that
/// one name (so RBAC can restrict the agent to those names), and publishes
/// what it found as one [`AccessMaterial`]. Nothing is followed while
/// `rbacConfig` is off.
pub struct AccessFollower {
    client: Client,
    followers: Followers,
    current: Option<AccessTarget>,
    material: watch::Sender<AccessMaterial>,
    tasks: Vec<AbortOnDropHandle<()>>,
}

/// The followers' names of the two watches.
const ACCESS_SECRET: &str = "metrics-access-secret";
const ACCESS_CLIENT_CA: &str = "metrics-access-client-ca";

/// Namespace, Secret name and ConfigMap name followed.
type AccessTarget = (String, Option<String>, Option<String>);

impl AccessFollower {
    pub fn new(client: Client, followers: Followers) -> Self {
        Self {
            client,
            followers,
            current: None,
            material: watch::Sender::new(AccessMaterial::default()),
            tasks: Vec::new(),
        }
    }

    pub fn material(&self) -> AccessMaterial {
        self.material.borrow().clone()
    }

    /// Wakes when the material changes.
    pub fn subscribe(&self) -> watch::Receiver<AccessMaterial> {
        self.material.subscribe()
    }

    /// Follows what `rbac` names in `namespace` (or nothing). A no-op when it
    /// is already followed.
    pub fn follow(&mut self, target: Option<(&str, &KubeRbacConfig)>) {
        let target: Option<AccessTarget> = target
            .filter(|(_, rbac)| rbac.enable == Some(true))
            .map(|(namespace, rbac)| {
                let https = rbac.disable_https != Some(true);
                (
                    namespace.to_owned(),
                    rbac.secret
                        .as_ref()
                        .map(|s| s.name.clone())
                        .filter(|n| !n.is_empty())
                        .filter(|_| https),
                    rbac.client_ca_config_map
                        .as_ref()
                        .map(|c| c.name.clone())
                        .filter(|n| !n.is_empty())
                        .filter(|_| https),
                )
            });
        if target == self.current {
            return;
        }
        self.tasks.clear();
        self.material.send_replace(AccessMaterial::default());
        self.current = target.clone();
        let Some((namespace, secret, client_ca)) = target else {
            return;
        };
        if let Some(name) = secret {
            self.tasks.push(follow_one(
                (&self.followers, ACCESS_SECRET),
                Api::<Secret>::namespaced(self.client.clone(), &namespace),
                name,
                self.material.clone(),
                |m| &mut m.certificate,
                tls_pair,
            ));
        }
        if let Some(name) = client_ca {
            self.tasks.push(follow_one(
                (&self.followers, ACCESS_CLIENT_CA),
                Api::<ConfigMap>::namespaced(self.client.clone(), &namespace),
                name,
                self.material.clone(),
                |m| &mut m.client_ca,
                client_ca_text,
            ));
        }
    }
}

fn tls_pair(secret: &Secret) -> Result<TlsPair, String> {
    let data = secret.data.as_ref();
    let get = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|v| Arc::<[u8]>::from(v.0.as_slice()))
            .ok_or_else(|| format!("it has no {key}"))
    };
    Ok(TlsPair {
        cert_pem: get(access::TLS_CERT_KEY)?,
        key_pem: get(access::TLS_KEY_KEY)?,
    })
}

fn client_ca_text(cm: &ConfigMap) -> Result<Arc<str>, String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(access::CLIENT_CA_KEY))
        .map(|t| Arc::<str>::from(t.as_str()))
        .ok_or_else(|| format!("it has no {}", access::CLIENT_CA_KEY))
}

/// Watches one object by name and keeps one field of the material current.
/// An API error (e.g. forbidden) shows while nothing was read; once the object
/// was seen, a transient watch error keeps what was read.
fn follow_one<K, T>(
    (followers, follower): (&Followers, &'static str),
    api: Api<K>,
    name: String,
    tx: watch::Sender<AccessMaterial>,
    field: fn(&mut AccessMaterial) -> &mut Fetched<T>,
    extract: fn(&K) -> Result<T, String>,
) -> AbortOnDropHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    T: PartialEq + Send + Sync + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let set = move |value: Fetched<T>| {
        tx.send_if_modified(|m| {
            let slot = field(m);
            let changed = *slot != value;
            *slot = value;
            changed
        });
    };
    followers.spawn(follower, async move {
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut seen = false;
        let mut read = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => seen = false,
                Ok(Event::InitApply(object) | Event::Apply(object)) => {
                    seen = true;
                    read = true;
                    set(match extract(&object) {
                        Ok(value) => Fetched::Found(value),
                        Err(why) => Fetched::Failed(why),
                    });
                }
                Ok(Event::InitDone) => {
                    read = true;
                    if !seen {
                        set(Fetched::Missing);
                    }
                }
                Ok(Event::Delete(_)) => set(Fetched::Missing),
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "watch error on an object rbacConfig names; retrying");
                    if !read {
                        set(Fetched::Failed(format!("cannot read it: {e}")));
                    }
                }
            }
        }
    })
}
