//! The gRPC edge: the `DevicePlugin` service on a unix socket, and the
//! `Registration` call to the kubelet.
//!
//! This module owns sockets and RPCs. It must not decide anything: answers come
//! from [`ResourceState`], and when to bind or
//! register is the service's business.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Router;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

use super::api::{self, v1beta1};
use super::devices::{resource_name, socket_name};
use super::state::ResourceState;
use v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use v1beta1::registration_client::RegistrationClient;

/// How long a stopping server waits for open streams to finish before it is
/// aborted. Keeps agent shutdown well inside its budget.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// Bound on one registration attempt. The kubelet dials back into the plugin
/// before it answers, so this covers two connections.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// Mode of the plugin sockets: read-write for the owner (root) only.
pub(crate) const SOCKET_MODE: u32 = 0o600;

/// The options this plugin registers with and reports.
pub fn plugin_options() -> v1beta1::DevicePluginOptions {
    v1beta1::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Identity of a file: replaced files (a restarted kubelet's socket, our socket
/// recreated by someone else) differ even when the inode number is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

pub(crate) fn file_id(path: &Path) -> Option<FileId> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        ctime: meta.ctime(),
        ctime_nsec: meta.ctime_nsec(),
    })
}

/// The `DevicePlugin` service of one resource.
struct PluginService {
    state: watch::Receiver<Arc<ResourceState>>,
    /// Becomes `true` when the server stops: ends `ListAndWatch` streams, which
    /// would otherwise hold a graceful shutdown open forever.
    stop: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<v1beta1::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut state = self.state.clone();
        let mut stop = self.stop.clone();
        // One task per stream; it ends when the peer goes away, the resource is
        // withdrawn or the server stops. Nothing it meets can take the agent down.
        tokio::spawn(async move {
            let mut last: Option<Vec<v1beta1::Device>> = None;
            loop {
                let devices = state.borrow_and_update().list();
                if last.as_ref() != Some(&devices) {
                    let message = v1beta1::ListAndWatchResponse {
                        devices: devices.clone(),
                    };
                    tokio::select! {
                        sent = tx.send(Ok(message)) => if sent.is_err() { return },
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    last = Some(devices);
                }
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        let state = self.state.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|req| v1beta1::ContainerPreferredAllocationResponse {
                device_i_ds: state.preferred(
                    &req.available_device_i_ds,
                    &req.must_include_device_i_ds,
                    usize::try_from(req.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(v1beta1::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let state = self.state.borrow().clone();
        let mut container_responses = Vec::new();
        for req in &request.get_ref().container_requests {
            match state.allocate_container(&req.devices_ids) {
                Ok(resp) => container_responses.push(resp),
                Err(e) => {
                    tracing::warn!(resource = %state.resource_name(), error = %e, "refused allocation");
                    return Err(e.into());
                }
            }
        }
        Ok(Response::new(v1beta1::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        Ok(Response::new(v1beta1::PreStartContainerResponse {}))
    }
}

/// Binds a unix socket at `path` that is owner-only from the moment it is
/// there: whoever can connect can ask for devices, and the kubelet connects
/// as root. A socket's mode comes from the process's umask at bind time, and
/// changing the umask would change it for every thread. So the socket is
/// bound in a new directory of mode 0700 beside `path`, which nobody else
/// can enter, given its mode there, and renamed over `path` (replacing a
/// stale socket left by an earlier run) in one step.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let context = |what: &str, e: io::Error| {
        io::Error::new(e.kind(), format!("{what} for {}: {e}", path.display()))
    };
    // tempfile makes the directory with mode 0700, whatever the umask.
    let private = tempfile::Builder::new()
        .prefix(".bind-")
        .tempdir_in(parent)
        .map_err(|e| context("cannot make a private directory", e))?;
    // A short name: the whole path must fit sockaddr_un.
    let staged = private.path().join("s");
    let listener = UnixListener::bind(&staged).map_err(|e| context("cannot bind", e))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| context(&format!("cannot set mode {SOCKET_MODE:o}"), e))?;
    std::fs::rename(&staged, path).map_err(|e| context("cannot move the socket into place", e))?;
    Ok(listener)
}

/// A gRPC server running on its own unix socket: the device plugin's, and the
/// DRA plugin's registration and service sockets.
pub(crate) struct SocketServer {
    path: PathBuf,
    id: Option<FileId>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl SocketServer {
    /// Binds `path` (replacing a stale socket left by an earlier run) and serves
    /// the `DevicePlugin` service of one resource. Must be called inside a
    /// tokio runtime.
    pub(crate) fn bind(
        path: &Path,
        state: watch::Receiver<Arc<ResourceState>>,
    ) -> io::Result<Self> {
        Self::serve(path, "device plugin", |stop| {
            Server::builder().add_service(DevicePluginServer::new(PluginService { state, stop }))
        })
    }

    /// Binds `path` (replacing a stale socket) with owner-only access and serves
    /// the router `build` makes. `build` gets a receiver that turns `true` when
    /// the server stops, for streams that would otherwise hold it open.
    pub(crate) fn serve(
        path: &Path,
        what: &'static str,
        build: impl FnOnce(watch::Receiver<bool>) -> Router,
    ) -> io::Result<Self> {
        let listener = bind_private(path)?;
        let id = file_id(path);
        let (stop, stop_rx) = watch::channel(false);
        let router = build(stop_rx.clone());
        let mut signal = stop_rx;
        let shown = path.display().to_string();
        let task = tokio::spawn(async move {
            let result = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = signal.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::warn!(socket = %shown, error = %e, "{what} server failed");
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            id,
            stop,
            task,
        })
    }

    /// False once the socket file is gone or replaced (the kubelet wipes its
    /// directory when it restarts), or the server ended.
    pub(crate) fn is_intact(&self) -> bool {
        !self.task.is_finished() && self.id.is_some() && file_id(&self.path) == self.id
    }

    /// Stops serving, ends open streams and removes the socket if it is still ours.
    pub(crate) async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        if self.id.is_some()
            && file_id(&self.path) == self.id
            && let Err(e) = std::fs::remove_file(&self.path)
        {
            tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove plugin socket");
        }
    }
}

/// Why a registration with the kubelet failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("{0}: the path is not UTF-8")]
    NonUtf8Path(PathBuf),
    #[error("cannot connect to the kubelet at {socket}: {source}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the kubelet at {socket} refused the registration of {resource}: {status}")]
    Refused {
        socket: PathBuf,
        resource: String,
        status: Status,
    },
    #[error("the kubelet at {socket} did not answer within {timeout:?}")]
    Timeout { socket: PathBuf, timeout: Duration },
}

/// Registers resource `short` with the kubelet socket in `dir`.
pub(crate) async fn register(dir: &Path, short: &str) -> Result<(), RegisterError> {
    let socket = dir.join(api::KUBELET_SOCKET);
    let uri = match socket.to_str() {
        Some(s) => format!("unix://{s}"),
        None => return Err(RegisterError::NonUtf8Path(socket)),
    };
    let request = v1beta1::RegisterRequest {
        version: api::VERSION.to_owned(),
        endpoint: socket_name(short),
        resource_name: resource_name(short),
        options: Some(plugin_options()),
    };
    let attempt = async {
        let channel = Endpoint::from_shared(uri)
            .map_err(|source| RegisterError::Connect {
                socket: socket.clone(),
                source,
            })?
            .connect()
            .await
            .map_err(|source| RegisterError::Connect {
                socket: socket.clone(),
                source,
            })?;
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|status| RegisterError::Refused {
                socket: socket.clone(),
                resource: resource_name(short),
                status,
            })?;
        Ok(())
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(RegisterError::Timeout {
            socket: socket.clone(),
            timeout: REGISTER_TIMEOUT,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process that [`socket_is_owner_only_under_a_permissive_umask`]
    /// runs: the umask is per process, so the test changes it only there.
    const CHILD: &str = "GPU_OPERATOR_TEST_UMASK_CHILD";

    #[test]
    fn socket_is_owner_only_under_a_permissive_umask() {
        if std::env::var_os(CHILD).is_none() {
            let exe = std::env::current_exe().expect("test binary path");
            let out = std::process::Command::new(exe)
                .args([
                    "--exact",
                    "plugin::server::tests::socket_is_owner_only_under_a_permissive_umask",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .output()
                .expect("test binary runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "child failed:\n{text}");
            assert!(text.contains("1 passed"), "child ran the test:\n{text}");
            return;
        }
        // SAFETY: umask only changes this process's file creation mask.
        let old = unsafe { libc::umask(0) };
        assert_eq!(unsafe { libc::umask(0) }, 0, "umask is now 0");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("amd.com_gpu.sock");
        // A stale socket from an earlier run is replaced, and also gets the mode.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let stale = std::fs::symlink_metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(stale, 0o777, "umask 0 leaves a bound socket open to all");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (_tx, rx) = watch::channel(Arc::new(ResourceState::default()));
            let server = SocketServer::bind(&path, rx).unwrap();
            let mode = std::fs::symlink_metadata(&path).unwrap().mode() & 0o7777;
            assert_eq!(mode, SOCKET_MODE, "socket mode {mode:o}");
            // It serves at its path, and the private directory it was bound
            // in is gone.
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, [std::ffi::OsString::from("amd.com_gpu.sock")]);
            std::os::unix::net::UnixStream::connect(&path).expect("connects at the path");
            assert!(server.is_intact());
            server.shutdown().await;
        });
        unsafe { libc::umask(old) };
    }
}
