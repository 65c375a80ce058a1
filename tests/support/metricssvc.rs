//! A client of the reference exporter's health socket, compiled here from
//! `proto/metricssvc/metricssvc.proto` (the reference's wire contract; the
//! build script generated the code, this test crate compiles it), as AMD's
//! device plugin dials it: a unix socket, a fresh connection per call.

use std::path::Path;

use tonic::transport::{Channel, Endpoint};

/// The generated messages and `metrics_service_client`.
#[allow(clippy::all, missing_docs)]
pub mod metricssvc {
    include!(concat!(env!("OUT_DIR"), "/metricssvc/metricssvc.rs"));
}

pub use metricssvc::GpuState;
use metricssvc::metrics_service_client::MetricsServiceClient;

/// Connects to the socket at `path`.
pub async fn connect(
    path: &Path,
) -> Result<MetricsServiceClient<Channel>, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("unix://{}", path.display()))?
        .connect()
        .await?;
    Ok(MetricsServiceClient::new(channel))
}

/// `List` on a new connection; the error says where it failed.
pub async fn list(path: &Path) -> Result<Vec<GpuState>, String> {
    let mut client = connect(path).await.map_err(|e| format!("connect: {e:?}"))?;
    client
        .list(())
        .await
        .map(|r| r.into_inner().gpu_state)
        .map_err(|s| format!("List: {s}"))
}

/// `GetGPUState` for `ids` on a new connection.
pub async fn get(path: &Path, ids: &[&str]) -> Result<Vec<GpuState>, String> {
    let mut client = connect(path).await.map_err(|e| format!("connect: {e:?}"))?;
    let request = metricssvc::GpuGetRequest {
        id: ids.iter().map(|s| s.to_string()).collect(),
    };
    client
        .get_gpu_state(request)
        .await
        .map(|r| r.into_inner().gpu_state)
        .map_err(|s| format!("GetGPUState: {s}"))
}

/// `(ID, Health)` of each state, for assertions.
pub fn health_by_id(states: &[GpuState]) -> Vec<(String, String)> {
    states
        .iter()
        .map(|s| (s.id.clone(), s.health.clone()))
        .collect()
}
