//! The kubelet's side of DRA on unix sockets, as the real kubelet plays it:
//! the plugin watcher (finds `<kubelet-dir>/plugins_registry/*-reg.sock`,
//! calls `GetInfo`, checks it, dials the endpoint, and reports back with
//! `NotifyRegistrationStatus`), the DRA client (`NodePrepareResources`,
//! `NodeUnprepareResources` in v1 or v1beta1) and the resource health client.
//!
//! Clients are built from the published kubelet protos (`proto/`), the same
//! generated code the plugin serves, but nothing of the plugin's own logic.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_operator::dra::api::registration::registration_client::RegistrationClient;
use gpu_operator::dra::api::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use gpu_operator::dra::api::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, health_v1beta1};
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

use super::wait::{self, WAIT};

/// The versions of the DRA service this kubelet knows, newest first.
const KUBELET_DRA_VERSIONS: &[&str] = &["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A kubelet directory's DRA side.
pub struct DraKubelet {
    dir: PathBuf,
}

impl DraKubelet {
    pub fn new(kubelet_dir: &Path) -> Self {
        Self {
            dir: kubelet_dir.to_path_buf(),
        }
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.dir
            .join("plugins_registry")
            .join("gpu.amd.com-reg.sock")
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.dir
            .join("plugins")
            .join("gpu.amd.com")
            .join("dra.sock")
    }

    /// Plays the plugin watcher once: waits for the registration socket,
    /// reads the plugin's info, checks it as the kubelet does, dials the DRA
    /// endpoint, and accepts. Returns the info and the DRA version chosen.
    pub async fn register(&self) -> (PluginInfo, &'static str) {
        let socket = self.registration_socket();
        wait::eventually("the DRA registration socket", || socket.exists()).await;
        let info = wait::poll_until(
            "GetInfo answered",
            || async {
                let channel = channel(&socket).await.ok()?;
                RegistrationClient::new(channel)
                    .get_info(InfoRequest {})
                    .await
                    .ok()
                    .map(|r| r.into_inner())
            },
            Option::is_some,
        )
        .await;
        let info = info.expect("GetInfo answered");
        assert_eq!(info.r#type, "DRAPlugin");
        // The kubelet takes the first version it knows, in the plugin's order.
        let version = info
            .supported_versions
            .iter()
            .find_map(|v| KUBELET_DRA_VERSIONS.iter().find(|k| *k == v).copied())
            .expect("the plugin offers a DRA version this kubelet knows");
        // The endpoint must be reachable before the kubelet accepts.
        channel(Path::new(&info.endpoint))
            .await
            .expect("the DRA endpoint answers");
        RegistrationClient::new(channel(&socket).await.expect("registration socket"))
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .expect("NotifyRegistrationStatus");
        (info, version)
    }

    /// Tells the plugin its registration failed, as a kubelet that refuses it does.
    pub async fn refuse(&self, why: &str) {
        RegistrationClient::new(
            channel(&self.registration_socket())
                .await
                .expect("registration socket"),
        )
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: why.to_owned(),
        })
        .await
        .expect("NotifyRegistrationStatus");
    }

    pub async fn v1(&self) -> dra_v1::dra_plugin_client::DraPluginClient<Channel> {
        dra_v1::dra_plugin_client::DraPluginClient::new(
            channel(&self.dra_socket()).await.expect("DRA socket"),
        )
    }

    pub async fn v1beta1(&self) -> dra_v1beta1::dra_plugin_client::DraPluginClient<Channel> {
        dra_v1beta1::dra_plugin_client::DraPluginClient::new(
            channel(&self.dra_socket()).await.expect("DRA socket"),
        )
    }

    /// `NodePrepareResources` (v1) for `claims` of `(namespace, uid, name)`.
    pub async fn prepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> dra_v1::NodePrepareResourcesResponse {
        self.v1()
            .await
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: claims.iter().map(|c| v1_claim(*c)).collect(),
            })
            .await
            .expect("NodePrepareResources")
            .into_inner()
    }

    pub async fn unprepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> dra_v1::NodeUnprepareResourcesResponse {
        self.v1()
            .await
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: claims.iter().map(|c| v1_claim(*c)).collect(),
            })
            .await
            .expect("NodeUnprepareResources")
            .into_inner()
    }

    /// Opens the v1alpha1 health stream (what kubelets up to 1.36 call).
    pub async fn health_v1alpha1(&self) -> HealthStream {
        let stream = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(&self.dra_socket()).await.expect("DRA socket"),
        )
        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources v1alpha1")
        .into_inner();
        HealthStream::V1alpha1(stream)
    }

    /// Opens the v1beta1 health stream.
    pub async fn health_v1beta1(&self) -> HealthStream {
        let stream = health_v1beta1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(&self.dra_socket()).await.expect("DRA socket"),
        )
        .node_watch_resources(health_v1beta1::NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources v1beta1")
        .into_inner();
        HealthStream::V1beta1(stream)
    }

    /// Opens the v1 health stream (newer kubelets).
    pub async fn health_v1(&self) -> HealthStream {
        let stream = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(&self.dra_socket()).await.expect("DRA socket"),
        )
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .expect("NodeWatchResources v1")
        .into_inner();
        HealthStream::V1(stream)
    }
}

/// A v1 claim reference of `(namespace, uid, name)`.
pub fn v1_claim((namespace, uid, name): (&str, &str, &str)) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: namespace.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

async fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
}

/// One device's health as a message reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    pub pool: String,
    pub device: String,
    /// `UNKNOWN`, `HEALTHY` or `UNHEALTHY`.
    pub health: String,
    pub message: String,
}

/// A health stream in either version.
pub enum HealthStream {
    V1alpha1(Streaming<health_v1alpha1::NodeWatchResourcesResponse>),
    V1beta1(Streaming<health_v1beta1::NodeWatchResourcesResponse>),
    V1(Streaming<health_v1::NodeWatchResourcesResponse>),
}

impl HealthStream {
    /// The next message, within `WAIT`, and when it arrived.
    pub async fn next(&mut self) -> (Vec<DeviceHealth>, Instant) {
        // Both versions have the same messages in different packages.
        macro_rules! read {
            ($v:ident, $stream:expr) => {
                match tokio::time::timeout(WAIT, $stream.message()).await {
                    Ok(Ok(Some(m))) => m
                        .devices
                        .into_iter()
                        .map(|d| {
                            let id = d.device.unwrap_or_default();
                            DeviceHealth {
                                pool: id.pool_name,
                                device: id.device_name,
                                health: $v::HealthStatus::try_from(d.health)
                                    .map(|h| h.as_str_name().to_owned())
                                    .unwrap_or_default(),
                                message: d.message,
                            }
                        })
                        .collect(),
                    other => panic!("no health message within {WAIT:?}: {other:?}"),
                }
            };
        }
        let devices = match self {
            Self::V1alpha1(s) => read!(health_v1alpha1, s),
            Self::V1beta1(s) => read!(health_v1beta1, s),
            Self::V1(s) => read!(health_v1, s),
        };
        (devices, Instant::now())
    }

    /// Reads messages until one satisfies `check`; panics after `WAIT`.
    pub async fn next_matching(
        &mut self,
        what: &str,
        check: impl Fn(&[DeviceHealth]) -> bool,
    ) -> (Vec<DeviceHealth>, Instant) {
        let deadline = Instant::now() + WAIT;
        loop {
            let (devices, at) = self.next().await;
            if check(&devices) {
                return (devices, at);
            }
            assert!(
                Instant::now() < deadline,
                "no health message with {what} within {WAIT:?}; last: {devices:?}"
            );
        }
    }
}
