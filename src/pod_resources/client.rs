//! The client of the kubelet's PodResources API: one `List` on its socket,
//! bounded by a timeout. A missing socket (no kubelet, standalone mode) is no
//! answer, not an error. It must not interpret the answer (that is
//! [`super::holders`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Endpoint;

use super::api::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::api::v1::{ListPodResourcesRequest, ListPodResourcesResponse};

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("{socket}: cannot connect to the kubelet's PodResources API: {source}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{socket}: PodResources List failed: {status}")]
    List {
        socket: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("{socket}: PodResources List did not answer within {timeout:?}")]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("{socket}: the socket path is not UTF-8")]
    NonUtf8Path { socket: PathBuf },
}

/// Asks the kubelet which devices each container holds. `Ok(None)` when the
/// socket does not exist.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<Option<ListPodResourcesResponse>, PodResourcesError> {
    if !socket.exists() {
        return Ok(None);
    }
    let uri = socket
        .to_str()
        .map(|s| format!("unix://{s}"))
        .ok_or_else(|| PodResourcesError::NonUtf8Path {
            socket: socket.to_path_buf(),
        })?;
    let call = async {
        let channel = Endpoint::from_shared(uri)
            .map_err(|source| PodResourcesError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?
            .connect()
            .await
            .map_err(|source| PodResourcesError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map(|r| Some(r.into_inner()))
            .map_err(|status| PodResourcesError::List {
                socket: socket.to_path_buf(),
                status: Box::new(status),
            })
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(PodResourcesError::Timeout {
                socket: socket.to_path_buf(),
                timeout,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_no_pods() {
        let dir = tempfile::tempdir().unwrap();
        let answer = list(&dir.path().join("kubelet.sock"), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(answer.is_none());
    }
}
