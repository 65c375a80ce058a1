//! The gRPC edge: the registration socket the kubelet's plugin watcher finds,
//! and the DRA socket with the DRA and resource health services, each in every
//! version a supported kubelet calls.
//!
//! This module owns RPC shapes only. Prepare and unprepare are the
//! [`Preparer`]'s; health comes from the [`Published`] snapshot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tonic::{Request, Response, Status};

use super::api::{
    self, dra_v1, dra_v1beta1, health_v1, health_v1alpha1, health_v1beta1, registration,
};
use super::checkpoint::PreparedDevice;
use super::health::{Published, message};
use super::prepare::{ClaimRef, Preparer};
use crate::plugin::Health;

/// What the kubelet last said of our registration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Registration {
    /// The kubelet has not called yet.
    #[default]
    Waiting,
    Registered,
    Refused(String),
}

/// `pluginregistration.Registration` on the registration socket.
pub(crate) struct RegistrationService {
    pub endpoint: String,
    pub status: watch::Sender<Registration>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: api::PLUGIN_TYPE.to_owned(),
            name: super::DRIVER_NAME.to_owned(),
            endpoint: self.endpoint.clone(),
            supported_versions: api::SUPPORTED_VERSIONS
                .iter()
                .map(|v| v.to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let now = if status.plugin_registered {
            tracing::info!(
                driver = super::DRIVER_NAME,
                "the kubelet registered the DRA plugin"
            );
            Registration::Registered
        } else {
            tracing::warn!(driver = super::DRIVER_NAME, error = %status.error, "the kubelet refused the DRA plugin");
            Registration::Refused(status.error)
        };
        self.status.send_replace(now);
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

pub(crate) fn registration_router(service: RegistrationService) -> Router {
    Server::builder().add_service(registration::registration_server::RegistrationServer::new(
        service,
    ))
}

/// The DRA and health services on the DRA socket.
pub(crate) struct DraServices {
    /// This node's pool: the node name.
    pub pool: String,
    pub preparer: Arc<Preparer>,
    pub published: watch::Receiver<Arc<Published>>,
    /// Time between full health messages while nothing changes; below the
    /// kubelet's 30 s, after which a silent device becomes Unknown.
    pub health_resend: Duration,
}

pub(crate) fn dra_router(services: DraServices, stop: watch::Receiver<bool>) -> Router {
    let plugin = Arc::new(DraPlugin {
        preparer: services.preparer,
    });
    let health = Arc::new(HealthStreams {
        pool: services.pool,
        published: services.published,
        stop,
        resend: services.health_resend,
    });
    Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::from_arc(
            plugin.clone(),
        ))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::from_arc(
            plugin,
        ))
        .add_service(
            health_v1::dra_resource_health_server::DraResourceHealthServer::from_arc(
                health.clone(),
            ),
        )
        .add_service(
            health_v1beta1::dra_resource_health_server::DraResourceHealthServer::from_arc(
                health.clone(),
            ),
        )
        .add_service(
            health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::from_arc(health),
        )
}

struct DraPlugin {
    preparer: Arc<Preparer>,
}

/// The claims of a prepare or unprepare request, in either version.
macro_rules! claim_refs {
    ($request:expr) => {
        $request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                uid: c.uid,
                name: c.name,
            })
            .collect::<Vec<ClaimRef>>()
    };
}

/// v1 and v1beta1 differ only in their package and in v1's optional
/// `share_id` (set for a shared device's share): one body serves both, with
/// the answer's device built per version.
macro_rules! dra_plugin_version {
    ($v:ident, $answer:expr) => {
        #[tonic::async_trait]
        impl $v::dra_plugin_server::DraPlugin for DraPlugin {
            async fn node_prepare_resources(
                &self,
                request: Request<$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<$v::NodePrepareResourcesResponse>, Status> {
                let claims = claim_refs!(request);
                let answers = self.preparer.prepare(&claims).await;
                let claims: HashMap<String, $v::NodePrepareResourceResponse> = answers
                    .into_iter()
                    .map(|(uid, result)| {
                        let response = match result {
                            Ok(devices) => $v::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($answer).collect(),
                                error: String::new(),
                            },
                            Err(error) => $v::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new($v::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$v::NodeUnprepareResourcesResponse>, Status> {
                let claims = claim_refs!(request);
                let answers = self.preparer.unprepare(&claims).await;
                let claims = answers
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        (uid, $v::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($v::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_plugin_version!(dra_v1, |d: PreparedDevice| dra_v1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
    share_id: d.share_id,
});
// v1beta1 has no share ID: a kubelet that speaks only v1beta1 predates sharing.
dra_plugin_version!(dra_v1beta1, |d: PreparedDevice| dra_v1beta1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
});

struct HealthStreams {
    pool: String,
    published: watch::Receiver<Arc<Published>>,
    stop: watch::Receiver<bool>,
    resend: Duration,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `NodeWatchResources` in both versions: every device in every message (the
/// kubelet treats a device a message leaves out as silent), a message at once
/// on any change, and again every `resend` while nothing changes.
macro_rules! health_version {
    ($v:ident) => {
        #[tonic::async_trait]
        impl $v::dra_resource_health_server::DraResourceHealth for HealthStreams {
            type NodeWatchResourcesStream =
                ReceiverStream<Result<$v::NodeWatchResourcesResponse, Status>>;

            async fn node_watch_resources(
                &self,
                _: Request<$v::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let (tx, rx) = mpsc::channel(4);
                let mut published = self.published.clone();
                let mut stop = self.stop.clone();
                let resend = self.resend;
                let pool = self.pool.clone();
                tokio::spawn(async move {
                    loop {
                        let snapshot = published.borrow_and_update().clone();
                        let now = unix_now();
                        let devices = snapshot
                            .devices
                            .iter()
                            .map(|d| {
                                let health = snapshot.health.get(&d.name);
                                $v::DeviceHealth {
                                    device: Some($v::DeviceIdentifier {
                                        pool_name: pool.clone(),
                                        device_name: d.name.clone(),
                                    }),
                                    health: match health {
                                        Some(Health::Healthy) => $v::HealthStatus::Healthy,
                                        Some(Health::Unhealthy { .. }) => {
                                            $v::HealthStatus::Unhealthy
                                        }
                                        None => $v::HealthStatus::Unknown,
                                    } as i32,
                                    last_updated_time: now,
                                    health_check_timeout_seconds: 0,
                                    message: health.map(message).unwrap_or_default(),
                                }
                            })
                            .collect();
                        let reply = $v::NodeWatchResourcesResponse { devices };
                        tokio::select! {
                            sent = tx.send(Ok(reply)) => if sent.is_err() { return },
                            _ = stop.wait_for(|s| *s) => return,
                        }
                        tokio::select! {
                            changed = published.changed() => if changed.is_err() { return },
                            _ = tokio::time::sleep(resend) => {}
                            _ = stop.wait_for(|s| *s) => return,
                            _ = tx.closed() => return,
                        }
                    }
                });
                Ok(Response::new(ReceiverStream::new(rx)))
            }
        }
    };
}

health_version!(health_v1);
health_version!(health_v1beta1);
health_version!(health_v1alpha1);
