//! The gRPC edge: `metricssvc.MetricsService` on the health socket, answering
//! from the feeds it reads ([`Feeds`]) through [`super::states`].
//!
//! This file owns the RPCs, not the socket (bound by the plugin's owner-only
//! [`SocketServer`]) and not the answers (pure, in [`super::states`]).

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::api::metricssvc::metrics_service_server::{MetricsService, MetricsServiceServer};
use super::api::metricssvc::{
    GpuErrorRequest, GpuErrorResponse, GpuGetRequest, GpuState, GpuStateResponse,
};
use super::states::{gpu_states, select};
use crate::device::Inventory;
use crate::health::HealthSnapshot;
use crate::plugin::SocketServer;
use crate::pod_resources::DevicePods;

/// What `List` and `GetGPUState` answer while the health monitor has no
/// verdict (it has not sampled yet, or it is stopped): an error, as the
/// reference's "health status not available", so that AMD's device plugin
/// keeps its own checks rather than reading every GPU as healthy.
pub const NO_VERDICT: &str = "health status not available: the health monitor has no verdict yet";

/// What `SetError` answers: the reference's debug call to inject ECC
/// counts is not implemented (the simulator injects real counts instead).
pub const SET_ERROR_UNIMPLEMENTED: &str =
    "SetError (the reference's error injection for debugging) is not implemented by gpu-operator";

/// The feeds the answers are made from, read at each call.
#[derive(Clone)]
pub struct Feeds {
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub health: watch::Receiver<Arc<HealthSnapshot>>,
    pub pods: watch::Receiver<Arc<DevicePods>>,
}

impl Feeds {
    /// Every GPU's state now, or [`NO_VERDICT`].
    fn states(&self) -> Result<Vec<GpuState>, Status> {
        let health = self.health.borrow().clone();
        if health.gpus.is_empty() {
            return Err(Status::unavailable(NO_VERDICT));
        }
        let inventory = self.inventory.borrow().clone();
        let pods = self.pods.borrow().clone();
        Ok(gpu_states(&inventory, &health, &pods))
    }
}

#[tonic::async_trait]
impl MetricsService for Feeds {
    async fn get_gpu_state(
        &self,
        request: Request<GpuGetRequest>,
    ) -> Result<Response<GpuStateResponse>, Status> {
        let states = self.states()?;
        Ok(Response::new(GpuStateResponse {
            gpu_state: select(&states, &request.get_ref().id),
        }))
    }

    async fn list(&self, _: Request<()>) -> Result<Response<GpuStateResponse>, Status> {
        Ok(Response::new(GpuStateResponse {
            gpu_state: self.states()?,
        }))
    }

    async fn set_error(
        &self,
        _: Request<GpuErrorRequest>,
    ) -> Result<Response<GpuErrorResponse>, Status> {
        Err(Status::unimplemented(SET_ERROR_UNIMPLEMENTED))
    }
}

/// Serves `feeds` on `path`, owner-only from the first moment, making its
/// directory (mode 0755, as the reference does) when it is missing.
pub fn serve(path: &Path, feeds: Feeds) -> io::Result<SocketServer> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))
            })?;
    }
    SocketServer::serve(path, "health socket", |_| {
        Server::builder().add_service(MetricsServiceServer::new(feeds))
    })
}
