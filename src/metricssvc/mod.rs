//! The health socket of AMD's device-metrics-exporter, served from our health
//! monitor, so that AMD's own node components that read GPU health there keep
//! working next to (or instead of) ours.
//!
//! The wire contract is the reference's `metricssvc.MetricsService` (our
//! `proto/metricssvc/metricssvc.proto`, whose header says where it comes
//! from) on the unix socket
//! `/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket`
//! ([`DEFAULT_SOCKET`], a host path: under the host root, `--health-socket`
//! to move it, `--no-health-socket` to not serve it). Mode 0600: bound
//! owner-only from the start by the plugin's [`crate::plugin::SocketServer`]
//! (the reference makes it 0777; its clients run as root).
//!
//! Who reads it, and what they match on (read in their sources):
//! - AMD's k8s-device-plugin (`internal/pkg/exporter/health.go`) stats the
//!   socket, dials it (short-lived, 5 s timeout) at every heartbeat, calls
//!   `List`, and takes the health of each of its devices from the entry whose
//!   `Device` equals the device's ID; devices without an entry, or every
//!   device when the socket is absent or the call fails, keep its own simple
//!   check. Its device IDs are the PCI address for a whole GPU (and for
//!   partition 0, which is the PCI function) and the `amdgpu_xcp_N` platform
//!   device for other partitions: the same IDs our device plugin gives.
//! - The reference's test runner calls `List` and reads `ID` as the GPU
//!   index, and `AssociatedWorkload` to leave GPUs in use alone.
//! - NPD's `amdgpuhealth` reads the exporter's HTTP metrics (our metrics
//!   endpoint), not this socket.
//!
//! What the fields carry ([`states`]): `ID` the reference's GPU index, which
//! is its GPU agent's `Status.Index` and our `gpu_id` (each partition one
//! GPU); `UUID` amd-smi's UUID (`gpu_uuid`); `Device` the device plugin's ID
//! of that GPU or partition, which for whole GPUs is the lower-case PCI bus
//! ID the reference sends. For partitions other than 0 the reference sends
//! its GPU agent's PCI bus ID, which AMD's device plugin never finds among
//! its `amdgpu_xcp_N` devices, so those fell back to its simple check; we
//! send the ID it looks for, so that each partition gets the monitor's
//! verdict. `AssociatedWorkload` names the pods holding the device, from the
//! metrics exporter's PodResources association (empty in standalone mode,
//! where no kubelet reports pods).
//!
//! `List` and `GetGPUState` answer from the monitor's current snapshot at
//! each call, so a verdict is on the socket as soon as the monitor publishes
//! it; with no verdict (before the first sample, or with the monitor
//! stopped) they fail with `UNAVAILABLE`, as the reference fails while it
//! has no health state. `SetError`, the reference's error-injection debug
//! call (off unless a debug setting enables it, in its later releases),
//! answers `UNIMPLEMENTED`: there is no setting that turns it on.
//!
//! The service runs wherever the health monitor runs. It does not take a
//! socket that another process serves (AMD's exporter running on the same
//! node): it reports that and serves once the other is gone; a stale socket
//! is replaced. It rebinds when its socket is removed.
//!
//! This module owns the socket's RPCs and the mapping of our health to the
//! reference's fields. It must not decide health (it shows
//! [`crate::health`]'s snapshot), ask the kubelet for pods (it reads
//! [`crate::metrics::MetricsService::pods`]), or talk to the Kubernetes API.

pub mod api;
mod rpc;
pub mod states;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::agent_status::ServiceName;
use crate::device::Inventory;
use crate::health::HealthSnapshot;
use crate::host::alarm::Ticker;
use crate::plugin::SocketServer;
use crate::pod_resources::DevicePods;
use crate::service::{Readiness, Service, ServiceError, ServiceFuture};
pub use rpc::{NO_VERDICT, SET_ERROR_UNIMPLEMENTED};

/// Where the reference serves its health socket, on the host.
pub const DEFAULT_SOCKET: &str =
    "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket";

/// How often the socket is checked for having been removed or replaced, and
/// a socket another process serves for being gone.
const RECHECK: Duration = Duration::from_secs(2);

/// Configuration of [`HealthSocket`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthSocketConfig {
    /// The socket's path as this process sees it (a host path mapped under
    /// the host root).
    pub socket: PathBuf,
}

/// The health socket service. Create it once with its feeds; a supervisor
/// slot runs it.
pub struct HealthSocket {
    feeds: rpc::Feeds,
}

impl HealthSocket {
    /// `health` is the monitor's snapshot, `pods` the exporter's association.
    pub fn new(
        inventory: watch::Receiver<Arc<Inventory>>,
        health: watch::Receiver<Arc<HealthSnapshot>>,
        pods: watch::Receiver<Arc<DevicePods>>,
    ) -> Self {
        Self {
            feeds: rpc::Feeds {
                inventory,
                health,
                pods,
            },
        }
    }
}

/// Whether a process serves the socket at `path`: a connection is accepted.
/// A stale socket (nobody listening) refuses it at once.
async fn served_by_someone(path: &Path) -> bool {
    tokio::net::UnixStream::connect(path).await.is_ok()
}

impl Service for HealthSocket {
    type Config = HealthSocketConfig;

    fn name(&self) -> &'static str {
        ServiceName::HealthSocket.as_str()
    }

    /// Available while the socket is ours and the monitor has a verdict. A
    /// socket that cannot be bound fails the run (the slot retries).
    fn run(
        self: Arc<Self>,
        mut config: watch::Receiver<HealthSocketConfig>,
        cancel: CancellationToken,
        readiness: Readiness,
    ) -> ServiceFuture {
        Box::pin(async move {
            let mut current = config.borrow_and_update().clone();
            let mut health = self.feeds.health.clone();
            let mut health_open = true;
            let mut server: Option<SocketServer> = None;
            // On the process's grid, with the other services' ticks: no
            // wake-up of its own (see `Ticker`).
            let mut recheck = Ticker::new(RECHECK);
            let result = loop {
                if server.as_ref().is_some_and(|s| !s.is_intact()) {
                    tracing::warn!(socket = %current.socket.display(), "the health socket was removed or replaced");
                    if let Some(gone) = server.take() {
                        gone.shutdown().await;
                    }
                }
                let mut occupied = false;
                if server.is_none() {
                    if current.socket.exists() && served_by_someone(&current.socket).await {
                        occupied = true;
                    } else {
                        match rpc::serve(&current.socket, self.feeds.clone()) {
                            Ok(bound) => {
                                tracing::info!(socket = %current.socket.display(), "serving GPU health on the reference exporter's socket");
                                server = Some(bound);
                            }
                            Err(e) => {
                                break Err(ServiceError::new(format!(
                                    "cannot serve {}: {e}",
                                    current.socket.display()
                                )));
                            }
                        }
                    }
                }
                if occupied {
                    readiness.unavailable(format!(
                        "{} is served by another process (AMD's device-metrics-exporter?); \
                         serving it once that one is gone (--no-health-socket: never)",
                        current.socket.display()
                    ));
                } else if health.borrow_and_update().gpus.is_empty() {
                    readiness.unavailable("waiting for the health monitor's first verdict");
                } else {
                    readiness.available();
                }
                let health_changed = async {
                    if health_open {
                        health.changed().await.is_ok()
                    } else {
                        std::future::pending().await
                    }
                };
                tokio::select! {
                    _ = cancel.cancelled() => break Ok(()),
                    changed = config.changed() => {
                        if changed.is_err() {
                            break Ok(());
                        }
                        let next = config.borrow_and_update().clone();
                        if next.socket != current.socket
                            && let Some(old) = server.take()
                        {
                            old.shutdown().await;
                        }
                        current = next;
                    }
                    alive = health_changed => health_open = alive,
                    _ = recheck.tick() => {}
                }
            };
            if let Some(server) = server {
                server.shutdown().await;
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use prost::Message as _;
    use tonic::server::NamedService;

    use super::api::metricssvc::metrics_service_client::MetricsServiceClient;
    use super::api::metricssvc::metrics_service_server::MetricsServiceServer;
    use super::api::metricssvc::{GpuGetRequest, GpuState, GpuStateResponse};
    use super::rpc::Feeds;
    use super::*;
    use crate::health::GpuHealth;
    use crate::service::ServiceState;

    /// Waits (at most 20 s) for the service's state to satisfy `done`.
    async fn until(
        state: &mut watch::Receiver<ServiceState>,
        done: impl Fn(&ServiceState) -> bool,
    ) {
        let seen = tokio::time::timeout(Duration::from_secs(20), state.wait_for(|s| done(s)))
            .await
            .map(|r| r.map(|s| s.clone()));
        assert!(
            matches!(seen, Ok(Ok(_))),
            "state last seen: {:?}",
            state.borrow()
        );
    }

    #[tokio::test]
    async fn a_socket_another_process_serves_is_left_alone_and_a_stale_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("amd-metrics-exporter/s.socket");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Someone serves the path (the kernel accepts for a bound listener).
        let foreign = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let theirs = std::fs::metadata(&path).unwrap().ino();
        let mut health = HealthSnapshot::default();
        health.gpus.insert(
            "0000:05:00.0".into(),
            GpuHealth {
                healthy: true,
                reasons: vec![],
                gpu_ids: vec![0],
            },
        );
        let service = Arc::new(HealthSocket::new(
            watch::channel(Arc::new(Inventory::default())).1,
            watch::channel(Arc::new(health)).1,
            watch::channel(Arc::new(DevicePods::new())).1,
        ));
        let (readiness, mut state) = Readiness::detached();
        let (_config, config) = watch::channel(HealthSocketConfig {
            socket: path.clone(),
        });
        let cancel = CancellationToken::new();
        let run = tokio::spawn(service.run(config, cancel.clone(), readiness));
        until(&mut state, |s| {
            matches!(s, ServiceState::Unavailable { reason } if reason.contains("another process"))
        })
        .await;
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            theirs,
            "left alone"
        );

        // It stops serving; its socket file stays behind, stale: replaced.
        drop(foreign);
        until(&mut state, |s| *s == ServiceState::Running).await;
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), theirs);
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", path.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let listed = MetricsServiceClient::new(channel).list(()).await.unwrap();
        assert_eq!(listed.into_inner().gpu_state[0].health, "healthy");

        cancel.cancel();
        run.await.unwrap().unwrap();
        assert!(!path.exists(), "its socket goes with it");
    }

    /// The names and numbers below are the reference's
    /// (pkg/exporter/proto/metricssvc.proto at v1.2.1 to v1.3.1), written
    /// out by hand: a change to our proto that the wire would notice fails
    /// here, whatever the generated code says.
    #[test]
    fn the_wire_is_the_references() {
        assert_eq!(
            <MetricsServiceServer<Feeds> as NamedService>::NAME,
            "metricssvc.MetricsService"
        );
        let state = GpuState {
            id: "3".into(),
            uuid: "u".into(),
            health: "unhealthy".into(),
            associated_workload: vec!["w".into(), "x".into()],
            device: "0000:05:00.0".into(),
        };
        // Field 1 ID, 2 UUID, 3 Health, 4 AssociatedWorkload (repeated), 5
        // Device, every one a string: tag byte (number << 3 | 2), length, bytes.
        let mut want = vec![0x0a, 1, b'3', 0x12, 1, b'u', 0x1a, 9];
        want.extend_from_slice(b"unhealthy");
        want.extend_from_slice(&[0x22, 1, b'w', 0x22, 1, b'x', 0x2a, 12]);
        want.extend_from_slice(b"0000:05:00.0");
        assert_eq!(state.encode_to_vec(), want);
        // GPUStateResponse: field 1, repeated GPUState.
        let response = GpuStateResponse {
            gpu_state: vec![state],
        };
        let mut wrapped = vec![0x0a, want.len() as u8];
        wrapped.extend_from_slice(&want);
        assert_eq!(response.encode_to_vec(), wrapped);
        // GPUGetRequest: field 1, repeated string ID.
        let request = GpuGetRequest {
            id: vec!["0".into(), "12".into()],
        };
        assert_eq!(
            request.encode_to_vec(),
            [0x0a, 1, b'0', 0x0a, 2, b'1', b'2']
        );
    }
}
