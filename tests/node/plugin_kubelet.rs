//! The device plugin against a test kubelet on simulated hosts: registration,
//! ListAndWatch, Allocate and GetPreferredAllocation over real unix sockets.

use crate::support;

use std::collections::BTreeSet;

use gpu_operator::plugin::ResourceNamingStrategy::{Mixed, Single};
use gpu_operator::plugin::api::v1beta1::Empty;
use support::hosts::{SimHost, heterogeneous};
use support::kubelet::{allocate_request, numa_of, preferred_request};
use support::rig::Rig;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_the_kubelet() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    let registered = rig
        .kubelet()
        .wait_for_registration("amd.com/gpu", 1)
        .await
        .request;
    assert_eq!(registered.version, "v1beta1");
    assert_eq!(registered.endpoint, "amd.com_gpu.sock");
    let options = registered.options.expect("options sent");
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);
    assert!(rig.plugin_dir().join("amd.com_gpu.sock").exists());

    let status = rig
        .wait_status("amd.com/gpu registered", |s| {
            s.resources.iter().any(|r| r.registered)
        })
        .await;
    assert_eq!(status.resources.len(), 1);
    assert_eq!(status.resources[0].name, "amd.com/gpu");
    assert_eq!(
        (status.resources[0].devices, status.resources[0].healthy),
        (8, 8)
    );
    assert_eq!(status.error, None);

    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;
    let served = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(served, options);
    rig.stop().await;
}

/// The kubelet dials the plugin socket with `:authority: localhost`; a client
/// doing the same is served. (Clients that send the socket path as authority,
/// as grpcio >= 1.57 does, are refused by hyper's HTTP/2 layer before the plugin
/// sees them; see src/plugin/mod.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_localhost_as_authority_is_served() {
    use gpu_operator::plugin::api::v1beta1::device_plugin_client::DevicePluginClient;
    let rig = Rig::start("mi210", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let socket = rig.plugin_dir().join("amd.com_gpu.sock");
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect over the unix socket");
    let options = DevicePluginClient::new(channel)
        .get_device_plugin_options(Empty {})
        .await
        .expect("served with :authority localhost")
        .into_inner();
    assert!(options.get_preferred_allocation_available);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_offers_the_eight_gpus_of_an_mi300x() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;

    let inventory = rig.sim.discover();
    assert_eq!(devices.len(), 8);
    for gpu in &inventory.gpus {
        let device = devices
            .iter()
            .find(|d| d.id == gpu.bdf)
            .expect("GPU advertised by its PCI address");
        assert_eq!(device.health, "Healthy");
        let numa = gpu.numa_node.filter(|n| *n >= 0).map(i64::from);
        assert_eq!(numa_of(device), numa, "{}", gpu.bdf);
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_offers_64_partitions_of_a_cpx_nps4_mi300x() {
    let mut rig = Rig::start("mi300x", Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;

    assert_eq!(devices.len(), 64);
    let ids: BTreeSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), 64, "IDs are unique");
    let inventory = rig.sim.discover();
    for gpu in &inventory.gpus {
        assert!(
            ids.contains(gpu.bdf.as_str()),
            "partition 0 of {} is its PCI address",
            gpu.bdf
        );
    }
    // The other partitions carry the name of their platform device, as AMD's plugin does.
    assert_eq!(
        ids.iter()
            .filter(|id| id.starts_with("amdgpu_xcp_"))
            .count(),
        56
    );
    assert!(
        devices
            .iter()
            .all(|d| d.health == "Healthy" && d.id.len() <= 63)
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_strategy_serves_one_socket_per_resource() {
    let sim = SimHost::with_gpus("mi300x", Some(4), Some("cpx_nps4"));
    let inventory = heterogeneous(&sim);
    let mut rig = Rig::with_inventory(sim, inventory, Mixed).await;
    rig.kubelet()
        .wait_for_registration("amd.com/cpx_nps4", 1)
        .await;
    let spx = rig
        .kubelet()
        .wait_for_registration("amd.com/spx_nps1", 1)
        .await;
    assert_eq!(spx.request.endpoint, "amd.com_spx_nps1.sock");
    assert_eq!(
        rig.sockets(),
        [
            "amd.com_cpx_nps4.sock",
            "amd.com_spx_nps1.sock",
            "kubelet.sock"
        ]
    );

    let cpx_devices = rig.kubelet().first_list("amd.com_cpx_nps4.sock").await;
    let spx_devices = rig.kubelet().first_list("amd.com_spx_nps1.sock").await;
    assert_eq!((cpx_devices.len(), spx_devices.len()), (16, 2));
    let status = rig
        .wait_status("both registered", |s| {
            s.resources.iter().all(|r| r.registered)
        })
        .await;
    assert_eq!(status.conflict, None);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_strategy_reports_a_heterogeneous_layout_and_serves_none_of_it() {
    let sim = SimHost::with_gpus("mi300x", Some(4), Some("cpx_nps4"));
    let inventory = heterogeneous(&sim);
    let mut rig = Rig::with_inventory(sim, inventory, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;
    assert!(
        devices.is_empty(),
        "conflicting GPUs are not offered: {devices:?}"
    );

    let status = rig
        .wait_status("a conflict", |s| s.conflict.is_some())
        .await;
    let conflict = status.conflict.expect("conflict");
    assert_eq!(
        conflict.profiles.keys().collect::<Vec<_>>(),
        ["cpx_nps4", "spx_nps1"]
    );
    assert!(status.error.expect("error summary").contains("spx_nps1"));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_hands_out_kfd_and_the_devices_dri_nodes() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(2), Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;
    let inventory = rig.sim.discover();
    let gpu = &inventory.gpus[0];
    let second = devices
        .iter()
        .map(|d| d.id.as_str())
        .find(|id| id.starts_with("amdgpu_xcp_"))
        .expect("a partition after the first");

    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;
    let response = client
        .allocate(allocate_request(&[gpu.bdf.as_str()]))
        .await
        .expect("allocate")
        .into_inner();
    assert_eq!(response.container_responses.len(), 1);
    let specs = &response.container_responses[0].devices;
    let paths: Vec<&str> = specs.iter().map(|s| s.host_path.as_str()).collect();
    let part0 = &gpu.partitions[0];
    assert_eq!(
        paths,
        [
            "/dev/kfd".to_owned(),
            format!("/dev/dri/card{}", part0.card.unwrap()),
            format!("/dev/dri/renderD{}", part0.render_minor.unwrap()),
        ]
    );
    for spec in specs {
        assert_eq!(spec.permissions, "rw");
        assert_eq!(spec.container_path, spec.host_path);
        assert!(
            rig.sim.host.exists(&spec.host_path),
            "{} exists on the host",
            spec.host_path
        );
    }

    // Two devices in one container: one /dev/kfd, both devices' nodes.
    let response = client
        .allocate(allocate_request(&[gpu.bdf.as_str(), second]))
        .await
        .expect("allocate two")
        .into_inner();
    let specs = &response.container_responses[0].devices;
    assert_eq!(specs.len(), 5);
    assert_eq!(
        specs.iter().filter(|s| s.host_path == "/dev/kfd").count(),
        1
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_rejects_unknown_and_unhealthy_devices() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    stream.next().await;
    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;

    let status = client
        .allocate(allocate_request(&["0000:ff:00.0"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("0000:ff:00.0"),
        "{}",
        status.message()
    );

    let inventory = rig.sim.discover();
    let gpu = &inventory.gpus[3];
    let render = format!("/dev/dri/renderD{}", gpu.render_minor.unwrap());
    rig.sim.host.remove_all(&render).unwrap();
    stream
        .next_matching("the GPU unhealthy", |d| {
            support::kubelet::health_of(d, &gpu.bdf) == Some("Unhealthy")
        })
        .await;
    let status = client
        .allocate(allocate_request(&[gpu.bdf.as_str()]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains(&gpu.bdf) && status.message().contains(&render),
        "{}",
        status.message()
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_packs_partitions_into_one_gpu() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(4), Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;
    let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    // Partition IDs of each GPU, in advertised order (8 per GPU).
    let gpu_of = |id: &str| all.iter().position(|x| x == id).unwrap() / 8;

    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;
    let answer = client
        .get_preferred_allocation(preferred_request(&all, &[], 8))
        .await
        .expect("preferred allocation")
        .into_inner();
    let chosen = &answer.container_responses[0].device_i_ds;
    assert_eq!(chosen.len(), 8);
    let gpus: BTreeSet<usize> = chosen.iter().map(|id| gpu_of(id)).collect();
    assert_eq!(gpus.len(), 1, "eight partitions fit one GPU: {chosen:?}");

    // With GPU 3 partly used, a single partition goes there.
    let available: Vec<String> = all
        .iter()
        .filter(|id| !all[24..30].contains(id))
        .cloned()
        .collect();
    let answer = client
        .get_preferred_allocation(preferred_request(&available, &[], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gpu_of(&answer.container_responses[0].device_i_ds[0]), 3);

    // must_include is honoured and filled from its own GPU.
    let must = vec![all[17].clone()];
    let answer = client
        .get_preferred_allocation(preferred_request(&all, &must, 3))
        .await
        .unwrap()
        .into_inner();
    let chosen = &answer.container_responses[0].device_i_ds;
    assert_eq!(chosen[0], all[17]);
    assert!(chosen.iter().all(|id| gpu_of(id) == 2), "{chosen:?}");
    rig.stop().await;
}
