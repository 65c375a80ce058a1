//! A stand-in for the Job controller and the kubelet, for Jobs that run our
//! own image: the emulator stores Jobs but runs nothing, and Helm waits on
//! its hook Jobs. Each new Job's container runs as the real
//! `gpu-operator` binary with the container's `args`, the environment it
//! names (the downward API's namespace filled in) and the emulator's
//! kubeconfig, as the pod would; the Job's status then says Complete or
//! Failed, as the Job controller would write it.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

/// One Job run: its name, its arguments, its exit code and output.
#[derive(Clone, Debug)]
pub struct JobRun {
    pub name: String,
    pub args: Vec<String>,
    pub code: Option<i32>,
    pub output: String,
}

/// The Jobs run so far; the controller stops when this is dropped.
pub struct JobController {
    pub runs: Arc<Mutex<Vec<JobRun>>>,
    task: tokio::task::JoinHandle<()>,
}

impl JobController {
    pub fn runs(&self) -> Vec<JobRun> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for JobController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs every Job created in `namespace` from now on, against the API
/// server `kubeconfig` names.
pub fn run_jobs(
    client: kube::Client,
    namespace: &str,
    kubeconfig: std::path::PathBuf,
) -> JobController {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let record = runs.clone();
    let jobs: Api<Job> = Api::namespaced(client, namespace);
    let namespace = namespace.to_owned();
    let task = tokio::spawn(async move {
        let mut seen = std::collections::BTreeSet::new();
        let mut events = watcher::watcher(jobs.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(job)) = events.next().await {
            let uid = job.uid().unwrap_or_default();
            if !seen.insert(uid) || job.status.as_ref().is_some_and(|s| s.conditions.is_some()) {
                continue;
            }
            let container = job
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first().cloned())
                .unwrap_or_default();
            let args = container.args.clone().unwrap_or_default();
            let env: Vec<(String, String)> = container
                .env
                .iter()
                .flatten()
                .filter_map(|e| {
                    let value = match (&e.value, &e.value_from) {
                        (Some(v), _) => v.clone(),
                        (None, Some(from))
                            if from
                                .field_ref
                                .as_ref()
                                .is_some_and(|f| f.field_path == "metadata.namespace") =>
                        {
                            namespace.clone()
                        }
                        _ => return None,
                    };
                    Some((e.name.clone(), value))
                })
                .collect();
            let (run_args, kubeconfig) = (args.clone(), kubeconfig.clone());
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
                    .args(&run_args)
                    .env_clear()
                    .env("PATH", std::env::var("PATH").unwrap_or_default())
                    .envs(env)
                    .env("KUBECONFIG", kubeconfig)
                    .env("RUST_LOG", "info")
                    .output()
            })
            .await;
            let (code, output) = match out {
                Ok(Ok(out)) => (
                    out.status.code(),
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                ),
                Ok(Err(e)) => (None, e.to_string()),
                Err(e) => (None, e.to_string()),
            };
            let succeeded = code == Some(0);
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let condition = |type_: &str| {
                json!({"type": type_, "status": "True", "lastProbeTime": now,
                       "lastTransitionTime": now})
            };
            let status = if succeeded {
                json!({"status": {"succeeded": 1, "startTime": now, "completionTime": now,
                    "conditions": [condition("SuccessCriteriaMet"), condition("Complete")]}})
            } else {
                json!({"status": {"failed": 1, "startTime": now,
                    "conditions": [condition("FailureTarget"), condition("Failed")]}})
            };
            let _ = jobs
                .patch_status(
                    &job.name_any(),
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(status),
                )
                .await;
            if let Ok(mut runs) = record.lock() {
                runs.push(JobRun {
                    name: job.name_any(),
                    args,
                    code,
                    output,
                });
            }
        }
    });
    JobController { runs, task }
}
