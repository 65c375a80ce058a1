//! A Kubernetes API server emulator for tests.
//!
//! It speaks the real REST and watch protocol over plain HTTP on 127.0.0.1, so code under
//! test uses an unmodified `kube::Client` (or `kubectl`). Objects are stored generically as
//! JSON; resourceVersions, watches (with bookmarks, resume and `410 Gone`), finalizers,
//! generation, status subresources, patches (merge, JSON, strategic, server-side apply),
//! CRDs and pod eviction behave like the real server's, and ValidatingAdmissionPolicies judge
//! every write (see [`admission`]), for clients of any identity ([`Emulator::client_as`]).
//! Tests can inject faults (failures, latency, dropped watches, compaction, restarts) and read
//! how many requests were made.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::Namespace;
//! use kube::api::{Api, ListParams};
//! use kube_emulator::{Emulator, EmulatorConfig};
//!
//! let emu = Emulator::start(EmulatorConfig::default()).await?;
//! let before = emu.requests();
//! let namespaces: Api<Namespace> = Api::all(emu.client());
//! assert_eq!(namespaces.list(&ListParams::default()).await?.items.len(), 4);
//! let made = emu.requests().since(&before);
//! assert_eq!(made.get("list", "namespaces"), 1, "{made}");
//! assert_eq!(made.non_watch().total(), 1);
//! # Ok(()) }
//! ```
//!
//! This crate is test-only: the production crate may depend on it only as a dev-dependency.
//! What it does not emulate is listed in its README.

pub mod admission;
mod error;
mod faults;
mod fields;
mod frozen;
mod openapi;
mod patch;
mod protobuf;
mod rbac;
pub mod resource_claim;
pub mod resource_slice;
mod resources;
mod reviews;
mod selector;
mod server;
mod store;
mod table;
mod validation;
mod views;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};

pub use admission::Verdict;
pub use error::ApiError;
pub use faults::{Faults, LoggedWrite, RequestCounts, RequestKey};
pub use reviews::{Reviews, UserInfo};

use server::{Running, Settings, Shared};
use store::WriteCtx;

/// How to start an emulator. `Default` is what most tests want.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// How many change events the server keeps for watch resumes and exact lists. Older
    /// resourceVersions get `410 Gone` (the compaction window).
    pub history_limit: usize,
    /// How often open watches that asked for bookmarks get one. The real server sends one
    /// about every minute.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            port: 0,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
        }
    }
}

impl EmulatorConfig {
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    pub fn history_limit(mut self, events: usize) -> Self {
        self.history_limit = events;
        self
    }

    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    pub fn default_watch_timeout(mut self, timeout: Duration) -> Self {
        self.default_watch_timeout = timeout;
        self
    }
}

/// Why the emulator could not start or restart.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on 127.0.0.1:{port}: {source}")]
    Bind { port: u16, source: std::io::Error },
    #[error("cannot write the kubeconfig to {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A running (or stopped) emulator. Dropping it stops the server.
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    running: Option<Running>,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn listen(port: u16) -> Result<TcpListener, StartError> {
    let bind = || -> std::io::Result<TcpListener> {
        let socket = TcpSocket::new_v4()?;
        // Restarting on the same port must work while old connections sit in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
        socket.listen(1024)
    };
    bind().map_err(|source| StartError::Bind { port, source })
}

impl Emulator {
    /// Starts serving on 127.0.0.1 and writes a kubeconfig for it into a temporary
    /// directory. Must be called inside a Tokio runtime; the server runs on it.
    pub async fn start(config: EmulatorConfig) -> Result<Emulator, StartError> {
        let listener = listen(config.port)?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            port: config.port,
            source,
        })?;
        let shared = Shared::new(
            config.history_limit,
            Settings {
                bookmark_interval: config.bookmark_interval,
                default_watch_timeout: config.default_watch_timeout,
            },
        );
        let running = server::serve(shared.clone(), listener);
        let dir = tempfile::tempdir().map_err(|source| StartError::Kubeconfig {
            path: std::env::temp_dir(),
            source,
        })?;
        let kubeconfig = dir.path().join("kubeconfig");
        let emu = Emulator {
            shared,
            addr,
            running: Some(running),
            _dir: dir,
            kubeconfig,
        };
        emu.write_kubeconfig(&emu.kubeconfig)?;
        Ok(emu)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kube client configuration for this server (default namespace `default`, the kube
    /// defaults otherwise, including its retries on 429/503/504).
    pub fn config(&self) -> kube::Config {
        let uri = self
            .url()
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1"));
        kube::Config::new(uri)
    }

    /// A client for this server, built from [`Emulator::config`].
    ///
    /// # Panics
    /// Only if kube cannot build an HTTP client at all, which needs no TLS or credentials
    /// here and so does not happen.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube builds plain HTTP clients")
    }

    /// The same client without kube's automatic retries, for tests that want to see each
    /// 429/503/504 themselves.
    pub fn client_without_retries(&self) -> kube::Client {
        let mut c = self.config();
        c.default_retry = false;
        kube::Client::try_from(c).expect("kube builds plain HTTP clients")
    }

    /// A kube client configuration whose requests the emulator attributes to
    /// `user` (in `system:authenticated`): it sends a bearer token registered
    /// for that user (the same token for the same user every time). Admission
    /// policies see the user as `request.userInfo`, and a ResourceClaim status
    /// write is authorized as the user by the stored RBAC objects (see the
    /// README); nothing else is authorized differently.
    pub fn config_as(&self, user: &UserInfo) -> kube::Config {
        let mut config = self.config();
        let token = self.shared.reviews.token_for(user);
        // AuthInfo's token is a secrecy::SecretString; its Deserialize builds one.
        if let Ok(auth) = serde_json::from_value(serde_json::json!({ "token": token })) {
            config.auth_info = auth;
        }
        config
    }

    /// A client built from [`Emulator::config_as`].
    ///
    /// # Panics
    /// As [`Emulator::client`].
    pub fn client_as(&self, user: &UserInfo) -> kube::Client {
        kube::Client::try_from(self.config_as(user)).expect("kube builds plain HTTP clients")
    }

    /// [`Emulator::kubeconfig_yaml`] with the token of [`Emulator::config_as`]:
    /// for a process that should run as `user`.
    pub fn kubeconfig_yaml_as(&self, user: &UserInfo) -> String {
        let token = self.shared.reviews.token_for(user);
        self.kubeconfig_yaml()
            .replace("  user: {}\n", &format!("  user:\n    token: {token}\n"))
    }

    /// Writes [`Emulator::kubeconfig_yaml_as`] to `path`.
    pub fn write_kubeconfig_as(&self, path: &Path, user: &UserInfo) -> Result<(), StartError> {
        std::fs::write(path, self.kubeconfig_yaml_as(user)).map_err(|source| {
            StartError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// The kubeconfig written at start (valid across restarts: the port stays).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubeconfig text: one cluster, one context (`kube-emulator`), namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-emulator\n  cluster:\n    server: {url}\n\
             contexts:\n- name: kube-emulator\n  context:\n    cluster: kube-emulator\n    user: kube-emulator\n    namespace: default\n\
             current-context: kube-emulator\nusers:\n- name: kube-emulator\n  user: {{}}\n",
            url = self.url()
        )
    }

    /// Writes the kubeconfig to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), StartError> {
        std::fs::write(path, self.kubeconfig_yaml()).map_err(|source| StartError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Authorizes every request by the stored RBAC objects (Roles,
    /// ClusterRoles and their bindings), as the real server's RBAC
    /// authorizer does, or (`false`, the default) allows every request.
    /// Requests without a known token are `system:masters`, allowed all.
    pub fn authorize_requests(&self, on: bool) {
        self.shared
            .authorize_requests
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The requests RBAC refused so far ([`Emulator::authorize_requests`]),
    /// each as its `403`'s message, in order.
    pub fn refused(&self) -> Vec<String> {
        self.shared
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Tokens and grants that TokenReviews and SubjectAccessReviews answer from.
    pub fn reviews(&self) -> Reviews {
        self.shared.reviews.clone()
    }

    /// Fault injection.
    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }

    /// A snapshot of the request counts so far (also served at `/debug/requests`).
    pub fn requests(&self) -> RequestCounts {
        self.shared.counts()
    }

    /// The write requests so far (create, update, patch, delete), in the
    /// order received, with the object each names (for a create, the
    /// collection: no name). Failed requests are logged too.
    pub fn writes(&self) -> Vec<LoggedWrite> {
        self.shared.writes()
    }

    /// The newest revision of `plural` (`nodes`) that a watch has sent an event of:
    /// compared with [`Emulator::resource_version`], how far the watchers trail the
    /// writes, which is the emulator's pace and not theirs when it is busy.
    pub fn delivered(&self, plural: &str) -> u64 {
        self.shared.delivered(plural)
    }

    /// Watches currently streaming.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches()
    }

    /// The current resourceVersion (the store's revision).
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Stops the server: closes the listener and cuts every connection, watches included.
    /// The state is kept for [`Emulator::restart`].
    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }

    /// Serves again on the same port with the same state (stopping first if running).
    pub async fn restart(&mut self) -> Result<(), StartError> {
        self.stop().await;
        let mut last = None;
        // The port was just ours; a few tries ride out a slow socket teardown.
        for _ in 0..50 {
            match listen(self.addr.port()) {
                Ok(l) => {
                    self.running = Some(server::serve(self.shared.clone(), l));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(last.unwrap_or(StartError::Bind {
            port: self.addr.port(),
            source: std::io::Error::other("could not rebind"),
        }))
    }

    fn type_for(&self, api_version: &str, kind: &str) -> Option<resources::ResourceType> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.shared
            .store()
            .types()
            .find(|t| t.group == group && t.kind == kind && t.serves(version))
            .cloned()
    }

    /// Creates an object directly in the store, without an HTTP request (so it is not
    /// counted). The type comes from `apiVersion` and `kind`, the namespace from metadata.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let rt = self
            .type_for(av, kind)
            .ok_or_else(|| ApiError::bad_request(format!("no type served for {av} {kind}")))?;
        let version = av.rsplit('/').next().unwrap_or(av).to_string();
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let ctx = WriteCtx {
            manager: "kube-emulator".into(),
            dry_run: false,
            // A seeded object with a field its kind does not know is a test's mistake.
            validation: validation::FieldCheck::new(validation::Directive::Strict),
            // Seeding is not a request: no policy judges it.
            caller: None,
        };
        self.shared
            .store()
            .create(&rt, &version, Some(&ns), obj, &ctx)
    }

    /// Reads an object directly from the store (not counted). `namespace` is ignored for
    /// cluster-scoped kinds.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let rt = self.type_for(api_version, kind)?;
        let version = api_version
            .rsplit('/')
            .next()
            .unwrap_or(api_version)
            .to_string();
        self.shared
            .store()
            .get(&rt, &version, Some(namespace), name)
            .ok()
    }

    /// Lists objects of a kind in all namespaces, directly from the store (not counted).
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let Some(rt) = self.type_for(api_version, kind) else {
            return Vec::new();
        };
        let version = api_version
            .rsplit('/')
            .next()
            .unwrap_or(api_version)
            .to_string();
        self.shared
            .store()
            .list(&rt, &version, None, &store::ListOpts::default())
            .ok()
            .and_then(|l| l.get("items").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests share one emulator between tasks (several agents against one API server).
    #[test]
    fn emulator_handles_are_shareable() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Emulator>();
        send_sync::<Faults>();
        send_sync::<RequestCounts>();
    }

    #[test]
    fn config_builder_sets_every_field() {
        let c = EmulatorConfig::default()
            .port(1234)
            .history_limit(7)
            .bookmark_interval(Duration::from_millis(5))
            .default_watch_timeout(Duration::from_secs(9));
        assert_eq!(c.port, 1234);
        assert_eq!(c.history_limit, 7);
        assert_eq!(c.bookmark_interval, Duration::from_millis(5));
        assert_eq!(c.default_watch_timeout, Duration::from_secs(9));
    }
}
