//! A test kubelet: the kubelet's side of the device plugin API v1beta1 on unix
//! sockets in a temporary directory.
//!
//! It serves `Registration` on `<dir>/kubelet.sock` and records every request.
//! Like the real kubelet it validates the request and dials back into the
//! plugin's socket (calling `GetDevicePluginOptions`) before it accepts, so a
//! plugin that registers before it serves is refused. Tests then connect to the
//! plugin as clients to call `ListAndWatch`, `Allocate` and
//! `GetPreferredAllocation`. `restart` mimics a kubelet restart: it wipes the
//! directory's sockets and creates a new `kubelet.sock`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_operator::plugin::api::v1beta1::device_plugin_client::DevicePluginClient;
use gpu_operator::plugin::api::v1beta1::registration_server::{Registration, RegistrationServer};
use gpu_operator::plugin::api::v1beta1::{
    self, Device, Empty, ListAndWatchResponse, RegisterRequest,
};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

pub use super::wait::WAIT;

/// One accepted registration and when it arrived.
#[derive(Clone, Debug)]
pub struct Registered {
    pub request: RegisterRequest,
    pub at: Instant,
}

struct RegistrationService {
    dir: PathBuf,
    log: watch::Sender<Vec<Registered>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported version {:?}",
                request.version
            )));
        }
        let valid_name = request
            .resource_name
            .split_once('/')
            .is_some_and(|(domain, name)| domain.contains('.') && !name.is_empty());
        if !valid_name {
            return Err(Status::invalid_argument(format!(
                "invalid resource name {:?}",
                request.resource_name
            )));
        }
        if request.endpoint.is_empty() || request.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "invalid endpoint {:?}",
                request.endpoint
            )));
        }
        let socket = self.dir.join(&request.endpoint);
        let options = tokio::time::timeout(Duration::from_secs(2), async {
            let mut client = connect(&socket)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            client.get_device_plugin_options(Empty {}).await
        })
        .await
        .map_err(|_| Status::deadline_exceeded("plugin did not answer"))??;
        if options.into_inner() != request.options.unwrap_or_default() {
            return Err(Status::invalid_argument("options differ from the plugin's"));
        }
        self.log.send_modify(|log| {
            log.push(Registered {
                request,
                at: Instant::now(),
            })
        });
        Ok(Response::new(Empty {}))
    }
}

pub struct TestKubelet {
    dir: PathBuf,
    log: watch::Sender<Vec<Registered>>,
    server: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl TestKubelet {
    /// Serves `Registration` on `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> Self {
        let mut kubelet = Self {
            dir: dir.to_path_buf(),
            log: watch::channel(Vec::new()).0,
            server: None,
        };
        kubelet.serve();
        kubelet
    }

    fn serve(&mut self) {
        let path = self.socket();
        let listener = UnixListener::bind(&path).expect("bind kubelet.sock");
        let (stop, mut stop_rx) = watch::channel(false);
        let service = RegistrationServer::new(RegistrationService {
            dir: self.dir.clone(),
            log: self.log.clone(),
        });
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                })
                .await;
        });
        self.server = Some((stop, task));
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }

    pub fn registrations(&self) -> Vec<Registered> {
        self.log.borrow().clone()
    }

    /// Waits for the `n`-th registration (counting from 1) of `resource`.
    pub async fn wait_for_registration(&self, resource: &str, n: usize) -> Registered {
        let mut rx = self.log.subscribe();
        let found = tokio::time::timeout(WAIT, async {
            let log = rx
                .wait_for(|log| {
                    log.iter()
                        .filter(|r| r.request.resource_name == resource)
                        .count()
                        >= n
                })
                .await
                .expect("log open");
            log.iter()
                .filter(|r| r.request.resource_name == resource)
                .nth(n - 1)
                .cloned()
                .expect("counted above")
        })
        .await;
        match found {
            Ok(registered) => registered,
            Err(_) => panic!(
                "no registration #{n} of {resource} within {WAIT:?}; got {:?}",
                self.registrations()
                    .iter()
                    .map(|r| r.request.resource_name.clone())
                    .collect::<Vec<_>>()
            ),
        }
    }

    /// Mimics a kubelet restart: stop serving, remove every socket in the
    /// directory (the kubelet's device manager does this on start), then serve
    /// a new `kubelet.sock`. Returns when the new socket is up.
    pub async fn restart(&mut self) -> Instant {
        self.stop().await;
        for entry in std::fs::read_dir(&self.dir).expect("read dir").flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        self.serve();
        Instant::now()
    }

    /// Deletes and recreates `kubelet.sock` alone, leaving plugin sockets in
    /// place: what the plugin must notice by watching `kubelet.sock` itself.
    pub async fn recreate_socket(&mut self) {
        self.stop().await;
        self.serve();
    }

    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// A client of the plugin serving `endpoint` (a socket name in the directory).
    pub async fn client(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        connect(&self.dir.join(endpoint))
            .await
            .expect("connect to plugin")
    }

    /// Opens `ListAndWatch` on `endpoint`.
    pub async fn list_and_watch(&self, endpoint: &str) -> DeviceStream {
        let stream = self
            .client(endpoint)
            .await
            .list_and_watch(Empty {})
            .await
            .expect("ListAndWatch")
            .into_inner();
        DeviceStream { stream }
    }

    /// The devices of the first list a plugin's ListAndWatch sends.
    pub async fn first_list(&self, endpoint: &str) -> Vec<Device> {
        self.list_and_watch(endpoint).await.next().await
    }
}

/// Connects to a plugin socket.
pub async fn connect(
    socket: &Path,
) -> Result<DevicePluginClient<Channel>, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect()
        .await?;
    Ok(DevicePluginClient::new(channel))
}

/// A `ListAndWatch` stream as the kubelet reads it.
pub struct DeviceStream {
    stream: Streaming<ListAndWatchResponse>,
}

impl DeviceStream {
    /// The next list, within `WAIT`.
    pub async fn next(&mut self) -> Vec<Device> {
        match tokio::time::timeout(WAIT, self.stream.message()).await {
            Ok(Ok(Some(message))) => message.devices,
            Ok(Ok(None)) => panic!("ListAndWatch ended"),
            Ok(Err(status)) => panic!("ListAndWatch failed: {status}"),
            Err(_) => panic!("no ListAndWatch update within {WAIT:?}"),
        }
    }

    /// Reads lists until one satisfies `predicate`, and returns it.
    pub async fn next_matching(
        &mut self,
        what: &str,
        predicate: impl Fn(&[Device]) -> bool,
    ) -> Vec<Device> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.message()).await {
                Ok(Ok(Some(message))) if predicate(&message.devices) => return message.devices,
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) => panic!("ListAndWatch ended while waiting for {what}"),
                Ok(Err(status)) => panic!("ListAndWatch failed while waiting for {what}: {status}"),
                Err(_) => panic!("no ListAndWatch update with {what} within {WAIT:?}"),
            }
        }
    }

    /// Waits for the stream to end (the server going away), within `WAIT`.
    pub async fn ended(&mut self) -> bool {
        loop {
            match tokio::time::timeout(WAIT, self.stream.message()).await {
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) | Ok(Err(_)) => return true,
                Err(_) => return false,
            }
        }
    }
}

/// The health and NUMA node of each device, by ID.
pub fn health_of<'a>(devices: &'a [Device], id: &str) -> Option<&'a str> {
    devices
        .iter()
        .find(|d| d.id == id)
        .map(|d| d.health.as_str())
}

pub fn numa_of(device: &Device) -> Option<i64> {
    device
        .topology
        .as_ref()
        .and_then(|t| t.nodes.first())
        .map(|n| n.id)
}

pub fn preferred_request(
    available: &[String],
    must: &[String],
    size: i32,
) -> v1beta1::PreferredAllocationRequest {
    v1beta1::PreferredAllocationRequest {
        container_requests: vec![v1beta1::ContainerPreferredAllocationRequest {
            available_device_i_ds: available.to_vec(),
            must_include_device_i_ds: must.to_vec(),
            allocation_size: size,
        }],
    }
}

pub fn allocate_request(ids: &[&str]) -> v1beta1::AllocateRequest {
    v1beta1::AllocateRequest {
        container_requests: vec![v1beta1::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    }
}
