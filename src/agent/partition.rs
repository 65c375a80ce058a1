//! The agent's side of a partition change on its own Node: the
//! `dcm.amd.com/gpu-config-profile-state` label, and the sysfs writes once
//! the leader has drained the node.
//!
//! Fed by what the agent's loop decides ([`Wanted`]: whether the selected
//! DeviceConfig enables `configManager` for this node, and its profiles), the
//! Node as watched and the inventory. Each change runs
//! [`crate::partition::state::agent_step`] and carries it out: the state
//! label (server-side apply under its own field manager), an Event when the
//! state changes, and the change itself through [`crate::partition::apply`],
//! after which discovery is asked to look at once so that every service
//! follows the new layout without waiting for its next tick.
//!
//! A failed change is remembered for its profile until the label changes:
//! it is not tried again in a loop. The agent holds no GPU device node (it
//! reads sysfs attributes only), so it has nothing of its own to stop.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::api::agent_status::PartitionReport;
use crate::device::Inventory;
use crate::device::watch::Rescan;
use crate::events::{EventSink, NodeEvent};
use crate::host::AttrStore;
use crate::host::reader::BoundedReader;
use crate::node_writer::{Concern, NodeIntent, NodeWriter, RETRY_AFTER_FAILURE};
use crate::partition::state::{AgentStep, Record, State, agent_step};
use crate::partition::{Limits, PROFILE_LABEL, ProfileSet, STATE_LABEL, apply, plan};
use crate::service::Followers;

/// What the selected DeviceConfig asks of partitioning on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    /// The profiles; `None` while the ConfigMap named is not seen yet,
    /// `Err` when it cannot be read.
    pub profiles: Option<Result<Arc<ProfileSet>, String>>,
}

/// Where the partition task gets its facts and puts its writes.
pub struct Feeds {
    pub node: watch::Receiver<Option<Arc<Node>>>,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    /// Whether discovery has seen the whole host once.
    pub discovered: watch::Receiver<super::node_services::DiscoveryProgress>,
    pub rescan: Rescan,
    pub writer: NodeWriter,
    pub events: EventSink,
    pub store: Arc<dyn AttrStore>,
    pub reader: BoundedReader,
    pub limits: Limits,
}

/// The follower's name.
pub const FOLLOWER: &str = "partition";

/// Starts the task, as one of `followers`; it ends when `wanted`'s sender is
/// dropped or `stop` fires.
pub fn spawn(
    feeds: Feeds,
    wanted: watch::Receiver<Option<Wanted>>,
    followers: &Followers,
    stop: CancellationToken,
) -> (
    watch::Receiver<Option<PartitionReport>>,
    AbortOnDropHandle<()>,
) {
    let (report_tx, report) = watch::channel(None);
    let task = followers.spawn(FOLLOWER, run(feeds, wanted, report_tx, stop));
    (report, task)
}

async fn run(
    mut feeds: Feeds,
    mut wanted: watch::Receiver<Option<Wanted>>,
    report: watch::Sender<Option<PartitionReport>>,
    stop: CancellationToken,
) {
    // The failure of the last change, by profile.
    let mut failed: Option<(String, String)> = None;
    let mut shown: Option<(String, State)> = None;
    // A feed whose sender is gone (its follower ended) is not waited on
    // again: its `changed()` would return at once, forever.
    let (mut node_open, mut inventory_open, mut discovered_open) = (true, true, true);
    loop {
        let node = feeds.node.borrow_and_update().clone();
        let setting = wanted.borrow_and_update().clone();
        let discovered = feeds.discovered.borrow_and_update().discovered;
        let inventory = feeds.inventory.borrow_and_update().clone();
        let mut retry = false;
        if let Some(node) = node.filter(|_| discovered) {
            let label = node.labels().get(PROFILE_LABEL).cloned();
            if failed
                .as_ref()
                .is_some_and(|(p, _)| Some(p) != label.as_ref())
            {
                failed = None;
            }
            let step = match (&setting, &label) {
                // Not asked for, or nothing chosen: no state label.
                (None, _) | (_, None) => Some(AgentStep::Clear),
                // The profiles are not seen yet: nothing to decide on.
                (Some(Wanted { profiles: None }), Some(_)) => None,
                (
                    Some(Wanted {
                        profiles: Some(profiles),
                    }),
                    Some(name),
                ) => {
                    let planned = profiles.as_ref().map_err(Clone::clone).and_then(|set| {
                        let profile = set.profiles.get(name).ok_or_else(|| {
                            let names: Vec<&str> =
                                set.profiles.keys().map(String::as_str).collect();
                            format!("no profile {name:?}; the profiles are {}", names.join(", "))
                        })?;
                        plan(name, profile, &inventory.gpus)
                    });
                    let record = node
                        .annotations()
                        .get(crate::partition::state::RECORD_ANNOTATION)
                        .and_then(|r| Record::parse(r));
                    Some(agent_step(
                        Some(name),
                        planned.as_ref().map_err(String::as_str),
                        record.as_ref(),
                        failed.as_ref().map(|(p, why)| (p.as_str(), why.as_str())),
                    ))
                }
            };
            match step {
                None => {}
                Some(AgentStep::Clear) => {
                    shown = None;
                    report.send_if_modified(|r| r.take().is_some());
                    retry |= !write_state(&feeds, &node, None).await;
                }
                Some(AgentStep::Show(state, why)) => {
                    let profile = label.clone().unwrap_or_default();
                    retry |= !show(&feeds, &node, &report, &mut shown, &profile, state, why).await;
                }
                Some(AgentStep::Apply(plan)) => {
                    let profile = label.clone().unwrap_or_default();
                    if show(
                        &feeds,
                        &node,
                        &report,
                        &mut shown,
                        &profile,
                        State::Applying,
                        None,
                    )
                    .await
                    {
                        let result = async {
                            apply::write_plan(
                                &plan,
                                &inventory,
                                feeds.store.clone(),
                                &feeds.reader,
                                feeds.limits,
                            )
                            .await?;
                            apply::wait_until_seen(
                                &plan,
                                &mut feeds.inventory,
                                Some(&feeds.rescan),
                                feeds.limits.appear,
                            )
                            .await
                        }
                        .await;
                        if let Err(e) = result {
                            tracing::warn!(%profile, error = %e, "partition change failed");
                            failed = Some((profile, e.to_string()));
                        }
                        // Decide again on what the Node and GPUs show now.
                        continue;
                    }
                    retry = true;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = wanted.changed() => if changed.is_err() { return },
            changed = feeds.node.changed(), if node_open => node_open = changed.is_ok(),
            changed = feeds.inventory.changed(), if inventory_open => inventory_open = changed.is_ok(),
            changed = feeds.discovered.changed(), if discovered_open => discovered_open = changed.is_ok(),
            _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if retry => {}
        }
    }
}

/// Shows `state` on the Node and in the report, with an Event when it is new.
/// False when the label could not be written.
async fn show(
    feeds: &Feeds,
    node: &Node,
    report: &watch::Sender<Option<PartitionReport>>,
    shown: &mut Option<(String, State)>,
    profile: &str,
    state: State,
    why: Option<String>,
) -> bool {
    let now_reported = Some(PartitionReport {
        profile: profile.to_owned(),
        state: state.as_str().to_owned(),
        reason: why.clone(),
    });
    // Only a change wakes the agent's loop (which republishes its status).
    report.send_if_modified(|r| {
        let changed = *r != now_reported;
        *r = now_reported.clone();
        changed
    });
    let news = is_news(shown.as_ref(), node.labels(), profile, state);
    let written = write_state(feeds, node, Some(state)).await;
    if written {
        *shown = Some((profile.to_owned(), state));
    }
    if written && news {
        let event = match state {
            State::Failed => Some((
                EventType::Warning,
                "PartitionFailed",
                format!("profile {profile}: {}", why.as_deref().unwrap_or("failed")),
            )),
            State::Success => Some((
                EventType::Normal,
                "PartitionApplied",
                format!("the GPUs run profile {profile}"),
            )),
            State::Applying => Some((
                EventType::Normal,
                "PartitionApplying",
                format!("writing the partition modes of profile {profile}"),
            )),
            State::Pending | State::Draining => None,
        };
        if let Some((type_, reason, note)) = event {
            tracing::info!(%profile, state = state.as_str(), %note, "partition");
            feeds
                .events
                .record(NodeEvent::agent(type_, "Partition", reason, note))
                .await;
        }
    }
    written
}

/// Whether showing `state` of `profile` is news for an Event: not when this
/// process showed it last, nor, in a process that has shown nothing yet,
/// when the Node already shows it (the agent announced it before it
/// restarted). Pure.
pub fn is_news(
    shown: Option<&(String, State)>,
    node_labels: &BTreeMap<String, String>,
    profile: &str,
    state: State,
) -> bool {
    match shown {
        Some((p, s)) => !(p == profile && *s == state),
        None => {
            node_labels.get(PROFILE_LABEL).map(String::as_str) != Some(profile)
                || node_labels.get(STATE_LABEL).map(String::as_str) != Some(state.as_str())
        }
    }
}

/// Makes the Node's state label `state` (none: removed). False on failure.
async fn write_state(feeds: &Feeds, node: &Node, state: Option<State>) -> bool {
    let intent = NodeIntent {
        labels: state
            .map(|s| BTreeMap::from([(STATE_LABEL.to_owned(), s.as_str().to_owned())]))
            .unwrap_or_default(),
        ..NodeIntent::default()
    };
    match feeds
        .writer
        .apply_to(node, Concern::Partition, &intent)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the partition state label; will retry");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_agent_does_not_announce_what_the_node_already_shows() {
        let labels = |profile: &str, state: &str| {
            BTreeMap::from([
                (PROFILE_LABEL.to_owned(), profile.to_owned()),
                (STATE_LABEL.to_owned(), state.to_owned()),
            ])
        };
        let on_node = labels("cpx_nps4_all", "success");
        // Fresh process, the Node says it already: no Event again.
        assert!(!is_news(None, &on_node, "cpx_nps4_all", State::Success));
        // Fresh process, the Node says another state or profile: news.
        assert!(is_news(None, &on_node, "cpx_nps4_all", State::Applying));
        assert!(is_news(
            None,
            &labels("default", "success"),
            "cpx_nps4_all",
            State::Success
        ));
        // This process showed it: not news; another state is.
        let shown = ("cpx_nps4_all".to_owned(), State::Applying);
        assert!(!is_news(
            Some(&shown),
            &on_node,
            "cpx_nps4_all",
            State::Applying
        ));
        assert!(is_news(
            Some(&shown),
            &on_node,
            "cpx_nps4_all",
            State::Success
        ));
    }
}
