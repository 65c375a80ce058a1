//! The kubelet's side of the PodResources API on a unix socket, answering
//! `List` with an allocation the test sets (and may change while it runs),
//! and, given an API client, only with pods the API server still has, as a
//! kubelet stops reporting a pod once it is gone.

use std::path::Path;
use std::sync::{Arc, Mutex};

use gpu_operator::pod_resources::api::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpu_operator::pod_resources::api::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use tonic::{Request, Response, Status};

/// Answers `List` with `pods`.
#[derive(Clone, Default)]
pub struct FakeKubelet {
    pub pods: Vec<PodResources>,
    /// When set, `List` answers from here instead (a test changes it).
    pub shared: Option<Arc<Mutex<Vec<PodResources>>>>,
    /// When set, pods the API server no longer has are left out.
    pub client: Option<kube::Client>,
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let mut pods = match &self.shared {
            Some(shared) => shared.lock().unwrap().clone(),
            None => self.pods.clone(),
        };
        if let Some(client) = &self.client {
            let mut alive = Vec::with_capacity(pods.len());
            for pod in pods {
                let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                    kube::Api::namespaced(client.clone(), &pod.namespace);
                if api.get_opt(&pod.name).await.ok().flatten().is_some() {
                    alive.push(pod);
                }
            }
            pods = alive;
        }
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not needed"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not needed"))
    }
}

/// A pod in namespace `ml` whose container `main` holds `ids` of `resource`.
pub fn pod(name: &str, resource: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
            ..ContainerResources::default()
        }],
    }
}

/// Serves `kubelet` on `socket` (its directory is created) until the
/// returned sender is dropped.
pub async fn serve_kubelet(
    socket: &Path,
    kubelet: FakeKubelet,
) -> tokio::sync::oneshot::Sender<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    );
    stop
}
