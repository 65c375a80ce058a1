//! `gpu-operator crd --apply` and `gpu-operator uninstall`: the steps of an
//! install's life that the Helm chart's hooks run in a Job of our own image
//! (and a person may run by hand), so that no kubectl image is needed.
//!
//! - `crd --apply` (pre-upgrade): Helm installs the CRDs of a chart's
//!   `crds/` once and never upgrades them, so the hook applies both CRDs as
//!   this binary defines them, server-side. With `--refuse-while-upgrading`
//!   it first refuses while a DeviceConfig has a node whose driver upgrade
//!   is pending or in progress, as the reference's pre-upgrade check does:
//!   a new agent must not take over a node half-way through an upgrade.
//! - `uninstall` (pre-delete): deletes the DeviceConfigs (of every
//!   namespace with `--all-namespaces`, as the agents follow them all) and
//!   waits until they are gone, that is until the leader's finalizer has
//!   taken every label, taint and annotation of ours off the Nodes; then
//!   removes the GPU node labels `detect` set. Helm deletes the agents only
//!   after.
//!
//! It owns these two commands' arguments, their exit codes and what they
//! print; which node states block an upgrade is [`upgrades_in_progress`],
//! pure.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch};
use kube::{Api, ResourceExt};

use super::args::kube_client;
use super::output::fail;
use super::runtime::run_to_end;
use crate::api::field_manager;
use crate::api::{DeviceConfig, UpgradeState};

/// Exit status of `crd --apply --refuse-while-upgrading` when it refuses.
pub const REFUSED: u8 = 3;

/// Delete the DeviceConfigs of a namespace, or of every namespace, and wait
/// until they are gone.
///
/// The leader holds a finalizer on each DeviceConfig until every node it
/// selected is clean again (labels, taints, annotations, the metrics
/// Service); this waits for that, so that the agents are removed only
/// after. Then it removes the labels `gpu-operator detect` set
/// (feature.node.kubernetes.io/amd-gpu and its kin, where NFD did not).
/// Run before deleting the agent DaemonSet: the Helm chart's pre-delete
/// hook does. A cluster without the DeviceConfig CRD has nothing to delete.
///
/// Exit status: 0 every DeviceConfig is gone, 1 some are still there at
/// --timeout (named; is the leader running?), 2 the cluster cannot be read
/// or the deletion is refused.
#[derive(Args, Debug)]
pub struct UninstallArgs {
    /// The namespace of the DeviceConfigs (the operator's).
    #[arg(
        long,
        short,
        value_name = "NS",
        env = "POD_NAMESPACE",
        default_value = "kube-amd-gpu"
    )]
    pub namespace: String,
    /// The DeviceConfigs of every namespace, whatever --namespace says: the
    /// agents follow them all unless restricted to one (WATCH_NAMESPACE),
    /// and one left behind would keep the leader's finalizer with no leader
    /// to lift it. The reference's pre-delete hook deletes them all too.
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,
    /// How long to wait for the DeviceConfigs to go, e.g. 300s or 5m.
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = duration)]
    pub timeout: Duration,
}

fn duration(text: &str) -> Result<Duration, String> {
    let parsed = crate::api::syntax::parse_duration(text)?;
    if parsed.is_zero() {
        return Err("must be more than 0s".to_owned());
    }
    Ok(parsed)
}

/// The nodes whose driver upgrade is pending or in progress, as
/// `namespace/name: node (state)`, from the DeviceConfigs' status. Pure.
pub fn upgrades_in_progress(configs: &[DeviceConfig]) -> Vec<String> {
    configs
        .iter()
        .flat_map(|dc| {
            let key = format!("{}/{}", dc.namespace().unwrap_or_default(), dc.name_any());
            dc.status
                .iter()
                .flat_map(|s| s.node_module_status.iter())
                .filter_map(move |(node, module)| {
                    let state = module.status.as_ref()?;
                    (state.is_in_progress() || *state == UpgradeState::NotStarted)
                        .then(|| format!("{key}: {node} ({})", state.as_str()))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Runs `crd --apply`.
pub fn run_apply(args: crate::api::cli::CrdArgs) -> ExitCode {
    run_to_end(apply_crds(args))
}

async fn apply_crds(args: crate::api::cli::CrdArgs) -> ExitCode {
    let client = match kube_client().await {
        Ok(client) => client,
        Err(message) => return fail(message, 2),
    };
    if args.refuse_while_upgrading {
        let configs: Api<DeviceConfig> = if args.all_namespaces {
            Api::all(client.clone())
        } else {
            Api::namespaced(client.clone(), &args.namespace)
        };
        match configs.list(&ListParams::default()).await {
            Ok(list) => {
                let busy = upgrades_in_progress(&list.items);
                if !busy.is_empty() {
                    return fail(
                        format!(
                            "a driver upgrade is pending or in progress; finish it (or \
                             let it fail) before upgrading the operator: {}",
                            busy.join("; ")
                        ),
                        REFUSED,
                    );
                }
            }
            // No CRD yet: nothing can be upgrading.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return fail(format!("cannot list DeviceConfigs: {e}"), 2),
        }
    }
    let crds = match crate::api::remediation_status::crd() {
        Ok(rwf) => [crate::api::crd(), rwf],
        Err(e) => return fail(format!("the RemediationWorkflowStatus CRD: {e}"), 1),
    };
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for crd in crds {
        let name = crd.name_any();
        match api
            .patch(
                &name,
                &field_manager::apply(field_manager::INSTALL),
                &Patch::Apply(&crd),
            )
            .await
        {
            Ok(_) => println!("applied CustomResourceDefinition {name}"),
            Err(e) => {
                return fail(
                    format!("cannot apply CustomResourceDefinition {name}: {e}"),
                    2,
                );
            }
        }
    }
    ExitCode::SUCCESS
}

/// Runs `uninstall`.
pub fn run_uninstall(args: UninstallArgs) -> ExitCode {
    run_to_end(uninstall(args))
}

async fn uninstall(args: UninstallArgs) -> ExitCode {
    let client = match kube_client().await {
        Ok(client) => client,
        Err(message) => return fail(message, 2),
    };
    let (configs, scope): (Api<DeviceConfig>, String) = if args.all_namespaces {
        (Api::all(client.clone()), "every namespace".to_owned())
    } else {
        (
            Api::namespaced(client.clone(), &args.namespace),
            args.namespace.clone(),
        )
    };
    let key =
        |dc: &DeviceConfig| format!("{}/{}", dc.namespace().unwrap_or_default(), dc.name_any());
    let names = |list: &[DeviceConfig]| list.iter().map(key).collect::<Vec<_>>();
    let present = match configs.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            println!("no DeviceConfig CRD: nothing to delete");
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(format!("cannot list DeviceConfigs: {e}"), 2),
    };
    for dc in &present {
        let name = dc.name_any();
        let own: Api<DeviceConfig> =
            Api::namespaced(client.clone(), &dc.namespace().unwrap_or_default());
        match own.delete(&name, &DeleteParams::default()).await {
            Ok(_) => println!("deleting DeviceConfig {}", key(dc)),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return fail(format!("cannot delete DeviceConfig {}: {e}", key(dc)), 2),
        }
    }
    // Polled: a handful of objects, for minutes at most, and a watch would
    // need its own resume logic for the same answer.
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let left = match configs.list(&ListParams::default()).await {
            Ok(list) => names(&list.items),
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list DeviceConfigs; trying again");
                vec![String::from("?")]
            }
        };
        if left.is_empty() {
            println!("every DeviceConfig in {scope} is gone");
            return match release_detect_labels(&configs).await {
                Ok(nodes) => {
                    if nodes > 0 {
                        println!("removed the GPU node labels `detect` set from {nodes} Node(s)");
                    }
                    ExitCode::SUCCESS
                }
                // The DeviceConfigs are gone, which is what the agents'
                // removal waits for: a person can remove the labels later.
                Err(message) => {
                    eprintln!(
                        "warning: {message}; remove them by hand: kubectl label nodes --all \
                         {}- {}-",
                        crate::detect::GPU_LABEL,
                        crate::detect::VGPU_LABEL
                    );
                    ExitCode::SUCCESS
                }
            };
        }
        if tokio::time::Instant::now() >= deadline {
            return fail(
                format!(
                    "DeviceConfigs still present after {}s: {} (the leader lifts their \
                     finalizer once the nodes are clean: is an agent running and leading? \
                     `kubectl -n {} get lease gpu-operator-leader`)",
                    args.timeout.as_secs(),
                    left.join(", "),
                    args.namespace
                ),
                1,
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Removes the labels `gpu-operator detect` keeps (its field manager's)
/// from every Node that has them: they are the operator's, not NFD's, and
/// go with it. Returns how many Nodes had some. The detect pods still run
/// until Helm deletes their DaemonSet, and look again only after their
/// recheck interval (10 minutes by default).
async fn release_detect_labels(configs: &Api<DeviceConfig>) -> Result<usize, String> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(configs.clone().into_client());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list Nodes: {e}"))?;
    let mut released = 0;
    for node in list.items.iter().filter(|n| {
        n.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|e| e.manager.as_deref() == Some(field_manager::DETECT))
    }) {
        let writer = crate::node_writer::NodeWriter::new(nodes.clone(), node.name_any());
        writer
            .apply_to(
                node,
                crate::node_writer::Concern::Detect,
                &crate::node_writer::NodeIntent::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        released += 1;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DeviceConfigStatus, ModuleStatus};

    #[test]
    fn pending_and_running_upgrades_block_and_finished_or_failed_ones_do_not() {
        let with = |states: &[(&str, Option<UpgradeState>)]| {
            let mut dc = DeviceConfig::new("gpus", Default::default());
            dc.metadata.namespace = Some("kube-amd-gpu".into());
            dc.status = Some(DeviceConfigStatus {
                node_module_status: states
                    .iter()
                    .map(|(node, state)| {
                        (
                            (*node).to_owned(),
                            ModuleStatus {
                                status: state.clone(),
                                ..ModuleStatus::default()
                            },
                        )
                    })
                    .collect(),
                ..DeviceConfigStatus::default()
            });
            dc
        };
        assert!(
            upgrades_in_progress(&[with(&[
                ("a", Some(UpgradeState::Complete)),
                ("b", Some(UpgradeState::Failed)),
                ("c", None),
            ])])
            .is_empty()
        );
        assert_eq!(
            upgrades_in_progress(&[with(&[
                ("a", Some(UpgradeState::NotStarted)),
                ("b", Some(UpgradeState::RebootInProgress)),
                ("c", Some(UpgradeState::Complete)),
            ])]),
            [
                "kube-amd-gpu/gpus: a (Upgrade-Not-Started)",
                "kube-amd-gpu/gpus: b (Reboot-In-Progress)"
            ]
        );
        assert!(upgrades_in_progress(&[]).is_empty());
    }
}
