//! Helpers shared by the emulator's integration tests: starting an emulator, bounding every
//! wait (the operator's tests' `support::wait`, one timeout for all), and building small
//! objects.
#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../support/wait.rs"]
mod wait;
#[allow(unused_imports)] // each test binary uses a different subset
pub use wait::{WAIT, eventually, poll_until, within};

use kube::api::{Api, PostParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};

/// An emulator with default settings.
pub async fn start() -> Emulator {
    start_with(EmulatorConfig::default()).await
}

pub async fn start_with(config: EmulatorConfig) -> Emulator {
    Emulator::start(config)
        .await
        .expect("emulator starts on 127.0.0.1")
}

/// The API error inside a kube error, or a panic naming what happened instead.
pub fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A pod on `node` with labels, ready or not.
pub fn pod(name: &str, node: &str, labels: Value, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": if ready {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        } else {
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]})
        },
    })
}

/// Creates a pod and sets its status (creates drop status, as on a real server).
pub async fn create_pod(
    client: &kube::Client,
    ns: &str,
    pod: Value,
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::Pod;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let typed: Pod = serde_json::from_value(pod.clone()).expect("pod json");
    let created = api
        .create(&PostParams::default(), &typed)
        .await
        .expect("create pod");
    let name = created.metadata.name.clone().expect("named");
    let mut with_status = created;
    with_status.status = serde_json::from_value(pod["status"].clone()).expect("status json");
    api.replace_status(&name, &PostParams::default(), &with_status)
        .await
        .expect("set pod status")
}
