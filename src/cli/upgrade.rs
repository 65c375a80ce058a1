//! `gpu-operator upgrade status`: where every node stands in its
//! DeviceConfig's rolling driver upgrade, for people (a table) and tools
//! (JSON).
//!
//! It owns the subcommand's arguments, the table and the exit status; the
//! rows come from `cluster::upgrader::progress_of`, the same reading of the
//! Nodes' upgrade records the leader decides on. It must not write anything.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::args::{OutputFormat, kube_client};
use super::output::fail;
use super::runtime::run_to_end;
use crate::api::DeviceConfig;
use crate::cluster::upgrader::{NodeProgress, progress_of};

#[derive(Args, Debug)]
pub struct UpgradeArgs {
    #[command(subcommand)]
    pub command: UpgradeCommand,
}

#[derive(Subcommand, Debug)]
pub enum UpgradeCommand {
    /// Print one row per node that a DeviceConfig with a driver selects:
    /// its upgrade state, the driver version it goes from and to, how long
    /// it has been in that state, and what blocks it (a PodDisruptionBudget
    /// that refuses an eviction, a pod no controller would recreate, the
    /// reason it failed) or why it is not picked (cordoned by a person, not
    /// Ready).
    ///
    /// Reads DeviceConfigs and Nodes with KUBECONFIG (or the in-cluster
    /// service account); writes nothing. The states are the reference
    /// operator's (Upgrade-Not-Started, Upgrade-Started, Upgrade-In-Progress,
    /// Reboot-In-Progress, Upgrade-Complete, and the *-Failed states), as
    /// the label operator.amd.com/gpu-driver-upgrade-state shows them. A
    /// failed node is tried again once a person labels it
    /// operator.amd.com/gpu-driver-upgrade-state=upgrade-required.
    ///
    /// Exit status: 0 no node failed, 1 some node is in a failed state,
    /// 2 the cluster cannot be read.
    Status(UpgradeStatusArgs),
}

#[derive(Args, Debug)]
pub struct UpgradeStatusArgs {
    /// Only DeviceConfigs in this namespace; all namespaces when unset.
    #[arg(long, short, value_name = "NS")]
    pub namespace: Option<String>,
    /// `table` for people, `json` for tools (a list of rows).
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

pub fn run(args: UpgradeArgs) -> ExitCode {
    match args.command {
        UpgradeCommand::Status(args) => run_to_end(status(args)),
    }
}

async fn status(args: UpgradeStatusArgs) -> ExitCode {
    let client = match kube_client().await {
        Ok(client) => client,
        Err(message) => return fail(message, 2),
    };
    let configs: Api<DeviceConfig> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let configs = match configs.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return fail(format!("cannot list DeviceConfigs: {e}"), 2),
    };
    let nodes = match Api::<Node>::all(client).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => return fail(format!("cannot list Nodes: {e}"), 2),
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let rows: Vec<NodeProgress> = configs
        .iter()
        .filter(|dc| dc.spec.is_enabled(crate::api::Operand::Driver))
        .flat_map(|dc| progress_of(dc, &nodes, now))
        .collect();
    match args.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        ),
        OutputFormat::Table if rows.is_empty() => {
            let managing = configs
                .iter()
                .filter(|dc| dc.spec.is_enabled(crate::api::Operand::Driver))
                .count();
            if managing == 0 {
                println!(
                    "no DeviceConfig{} manages the driver (spec.driver.enable): there is no \
                     driver upgrade to show",
                    args.namespace
                        .as_deref()
                        .map(|ns| format!(" in {ns}"))
                        .unwrap_or_default()
                );
            } else {
                println!("{managing} DeviceConfig(s) manage the driver, and they select no node");
            }
        }
        OutputFormat::Table => {
            for dc in &configs {
                if let Some(line) = summary_line(dc, &rows) {
                    println!("{line}");
                }
            }
            print!("{}", table(&rows));
        }
    }
    let failed = rows.iter().any(|r| {
        r.state
            .as_deref()
            .is_some_and(|s| crate::api::UpgradeState::from(s).is_failed())
    });
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `namespace/name: target 6.4.1, policy …: counts`, for a DeviceConfig
/// with a driver. Pure.
fn summary_line(dc: &DeviceConfig, rows: &[NodeProgress]) -> Option<String> {
    let driver = dc.spec.driver();
    if !driver.enable {
        return None;
    }
    let key = format!("{}/{}", dc.namespace().unwrap_or_default(), dc.name_any());
    let mine: Vec<&NodeProgress> = rows.iter().filter(|r| r.device_config == key).collect();
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for row in &mine {
        *counts
            .entry(row.state.as_deref().unwrap_or("none"))
            .or_default() += 1;
    }
    let policy = match &driver.upgrade_policy {
        Some(p) if p.enable == Some(true) => format!(
            "rolling (maxParallelUpgrades {}, maxUnavailableNodes {}, rebootRequired {})",
            p.max_parallel_upgrades,
            match &p.max_unavailable_nodes {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            },
            p.reboot_required
        ),
        _ => "no rolling upgrade (upgradePolicy.enable is not true: each agent loads \
              driver.version itself, as soon as nothing holds the running driver)"
            .to_owned(),
    };
    let counted: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    Some(format!(
        "{key}: driver {}, {policy}: {} node(s){}",
        driver.version.as_deref().unwrap_or("(any version)"),
        mine.len(),
        if counted.is_empty() {
            String::new()
        } else {
            format!(" ({})", counted.join(", "))
        }
    ))
}

/// How long, for a person: `45s`, `12m00s`, `3h05m`.
fn took(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The rows as an aligned table. Pure.
fn table(rows: &[NodeProgress]) -> String {
    let header = ["NODE", "STATE", "FROM", "TO", "FOR", "BLOCKED BY"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.node.clone(),
                r.state.clone().unwrap_or_else(|| "-".into()),
                r.from.clone().unwrap_or_else(|| "-".into()),
                r.to.clone().unwrap_or_else(|| "-".into()),
                r.for_seconds.map(took).unwrap_or_else(|| "-".into()),
                r.blocked_by
                    .clone()
                    .or_else(|| r.held.clone())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |row: [&str; 6]| {
        let mut text = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<w$}  ");
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(header);
    for row in &cells {
        line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_aligns_and_names_what_blocks() {
        let rows = vec![
            NodeProgress {
                node: "gpu-1".into(),
                device_config: "kube-amd-gpu/default".into(),
                state: Some("Upgrade-Started".into()),
                from: Some("6.3.0".into()),
                to: Some("6.4.1".into()),
                for_seconds: Some(125),
                blocked_by: Some(
                    "draining: pod ml/train: the PodDisruptionBudget train-pdb refuses its eviction"
                        .into(),
                ),
                held: None,
            },
            NodeProgress {
                node: "gpu-20".into(),
                device_config: "kube-amd-gpu/default".into(),
                state: None,
                from: Some("6.3.0".into()),
                to: Some("6.4.1".into()),
                for_seconds: None,
                blocked_by: None,
                held: Some("cordoned by someone else: not picked".into()),
            },
        ];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NODE    STATE            FROM   TO     FOR    BLOCKED BY"
        );
        assert_eq!(
            lines[1],
            "gpu-1   Upgrade-Started  6.3.0  6.4.1  2m05s  draining: pod ml/train: the PodDisruptionBudget train-pdb refuses its eviction"
        );
        assert!(lines[2].ends_with("cordoned by someone else: not picked"));
        assert_eq!(took(7384), "2h03m");
    }
}
