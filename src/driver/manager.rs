//! The agent's driver manager: when the selected DeviceConfig asks for a
//! driver (`spec.driver.enable`), it finds the bundle for the running kernel
//! in the host's bundle store, verifies it ([`preflight`]), decides
//! ([`load::decide`]) and loads it ([`load::load`]). What it did is a
//! [`DriverLoad`], which the agent puts on the `AMDGPUDriverReady`
//! condition, in an Event and in its status.
//!
//! It acts on a change only: of what is asked for, or of the kernel or the
//! loaded module (the [`DriverReport`]). While nothing is loaded because of
//! a refusal or a failure, it looks again every [`ManagerConfig::recheck`],
//! so that a bundle that configuration management drops into the store is
//! picked up, and a failing `modprobe` is retried at that pace and no
//! faster. It writes or removes the amdgpu blacklist as
//! `spec.driver.blacklist` says ([`blacklist`]). An out-of-tree amdgpu of
//! another version is replaced: unloaded, once nothing holds it
//! ([`holders`]; a holder is named and the replacement waits), then the
//! bundle loaded. When the upgrade record asks for a reboot from the boot
//! id the node runs, it reboots the node ([`reboot`]), once per boot; the
//! in-box amdgpu is replaced that way.
//!
//! What it loaded it records in [`ManagerConfig::handoff`]
//! ([`reload::reload_from`]), so that a reload by another (the DRA plugin's
//! memory mode change) loads the same bundle with the same
//! `kernelModuleConfig`; it runs `modprobe` only holding the handoff's
//! lock, and it does not act while such a reload runs, nor, for a while
//! after it, on a report that says amdgpu is gone ([`reload::manager_holds`]).
//!
//! What is asked ([`DriverWanted`]), when to look again and the outcomes
//! that need no command are decided in [`super::decision`]; this module
//! carries them out on the host. It must not write the Node or call the
//! API: the agent does, from what [`follow`] publishes.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::blacklist;
use super::bundle::{Expected, Refusal, Verified};
use super::condition::REASON_LOADING;
use super::decision::{
    DriverWanted, LOADED_HERE, Next, REBOOT_FAILED, REBOOT_REQUESTED, Trigger, failed, looks_again,
    next_step, outcome_of, reboot_blocked, reboot_due,
};
use super::holders;
use super::load::{self, LoadCommands, LoadDecision};
use super::preflight::{self, DEFAULT_STORE};
use super::reboot::{self, RebootCommand};
use super::reload::{self, Handoff};
use crate::api::DriverType;
use crate::api::agent_status::{DriverLoad, DriverLoadState, DriverReport};
use crate::host::HostRoot;
use crate::host::reader::BoundedReader;

/// Where bundles are and how loading runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerConfig {
    /// The bundle store, a host path: one directory per bundle.
    pub store: String,
    pub commands: LoadCommands,
    /// How the node is rebooted when its upgrade asks; `None`: it is not
    /// (a reboot request then fails, `RebootFailed`).
    pub reboot: Option<RebootCommand>,
    /// How one GPU is reset when its remediation asks (used by the agent's
    /// remediation task, configured with the reboot).
    pub gpu_reset: super::gpu_reset::GpuReset,
    /// How often a refused or failed load is looked at again.
    pub recheck: Duration,
    /// What this manager loaded, for a reload by another (the DRA
    /// plugin's memory mode change), and the lock and announcement that
    /// keep the two apart ([`reload`]). Shared by the clones of this
    /// config.
    pub handoff: Handoff,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            store: DEFAULT_STORE.to_owned(),
            commands: LoadCommands::default(),
            reboot: None,
            gpu_reset: super::gpu_reset::GpuReset::default(),
            recheck: Duration::from_secs(60),
            handoff: Handoff::default(),
        }
    }
}

/// Decides what to do for `wanted` on the node `report` describes, reading
/// and verifying the store (hashing tens of MiB, so on a blocking thread).
async fn look(
    host: &HostRoot,
    config: &ManagerConfig,
    wanted: &DriverWanted,
    report: &DriverReport,
) -> LoadDecision {
    if wanted.driver_type != DriverType::Container {
        return LoadDecision::Refuse {
            reason: "DriverTypeNotSupported",
            message: format!(
                "driverType {:?}: the agent loads only the container (amdgpu) driver",
                wanted.driver_type
            ),
        };
    }
    if let Some(running) = load::already_running(report, wanted.version.as_deref()) {
        return running;
    }
    let Some(kernel_release) = report.kernel_release.clone() else {
        return LoadDecision::Refuse {
            reason: "KernelUnknown",
            message: "the running kernel's release cannot be read \
                      (/proc/sys/kernel/osrelease)"
                .to_owned(),
        };
    };
    let expected = Expected {
        kernel_release,
        version: wanted.version.clone(),
        signature_required: report.secure_boot.requires_signature(),
    };
    let (reader_host, store) = (host.clone(), config.store.clone());
    let checked =
        tokio::task::spawn_blocking(move || preflight::preflight(&reader_host, &store, &expected))
            .await;
    let verdict: Result<_, Refusal> = match checked {
        Ok(Ok(answer)) => match answer.usable() {
            Some(bundle) => Ok(bundle.clone()),
            None => Err(answer.refused.map(|r| r.0).unwrap_or_else(|| {
                Refusal::Unreadable(format!("{}: no bundle verified", config.store))
            })),
        },
        Ok(Err(refusal)) => Err(refusal),
        Err(e) => Err(Refusal::Unreadable(format!(
            "{}: the check stopped: {e}",
            config.store
        ))),
    };
    load::decide(report, verdict.as_ref(), &wanted.module)
}

/// Follows `wanted` and `report` until `cancel` fires, on the host
/// `reader` reads, loading when a
/// verified bundle is there and nothing is loaded. Publishes the outcome;
/// `None` while nothing is asked for or the report is not read yet. Returns
/// the outcome and the task that follows, for the caller to run (and
/// supervise).
pub fn follow(
    reader: BoundedReader,
    config: ManagerConfig,
    mut wanted: watch::Receiver<Option<DriverWanted>>,
    mut report: watch::Receiver<Option<DriverReport>>,
    cancel: CancellationToken,
) -> (
    watch::Receiver<Option<DriverLoad>>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(None);
    let task = async move {
        // The reader serves the holder scan; verification and the blacklist
        // read the host through its root, off the runtime.
        let host = reader.host().clone();
        let mut last: Option<DriverLoad> = None;
        // The version this manager's own load brought, until the report
        // shows it.
        let mut loaded_here: Option<String> = None;
        // The boot id this manager asked to reboot from: once per boot.
        let mut rebooted_from: Option<String> = None;
        let (mut asked_changed, mut recheck_due) = (true, false);
        // Reloads by another: while one runs, and while the report may
        // still show its gap, amdgpu gone is not a driver to load.
        let mut reloads = config.handoff.reloads();
        let mut reloads_ended = reloads.borrow().ended;
        let mut reload_grace: Option<tokio::time::Instant> = None;
        // The bundle this manager loaded last, for what it records.
        let mut own_load: Option<reload::OwnLoad> = None;
        loop {
            let asked = wanted.borrow_and_update().clone();
            let seen = report.borrow_and_update().clone();
            let reloading = *reloads.borrow_and_update();
            if reloading.ended != reloads_ended {
                reloads_ended = reloading.ended;
                reload_grace = Some(tokio::time::Instant::now() + OWN_LOAD_GRACE);
            }
            let in_grace = reload_grace.filter(|until| tokio::time::Instant::now() < *until);
            // The version that ran before a reload: what the report must
            // show again.
            let ran = last
                .as_ref()
                .filter(|l| l.state == DriverLoadState::Loaded)
                .and_then(|l| l.version.as_deref());
            let held = reload::manager_holds(reloading, in_grace.is_some(), seen.as_ref(), ran);
            if let (Some(v), Some(seen)) = (&loaded_here, &seen)
                && seen.loaded
                && seen.version.as_deref() == Some(v.as_str())
            {
                loaded_here = None;
            }
            let look_again = !held
                && match (&asked, &seen) {
                    (Some(asked), Some(seen)) => looks_again(
                        Trigger {
                            asked_changed,
                            recheck_due,
                        },
                        last.as_ref(),
                        loaded_here.as_deref(),
                        asked,
                        seen,
                    ),
                    _ => true,
                };
            if look_again {
                // Nothing runs `modprobe` on amdgpu beside this look; a
                // reload that ran while it waited makes the report stale.
                let commands = tokio::select! {
                    commands = config.handoff.commands() => commands,
                    _ = cancel.cancelled() => return,
                };
                if reloads.borrow().ended != reloads_ended {
                    drop(commands);
                    continue;
                }
                let outcome = match (&asked, &seen) {
                    (Some(asked), Some(seen)) => {
                        let done = act(
                            &host,
                            &reader,
                            &config,
                            asked,
                            seen,
                            &mut rebooted_from,
                            &tx,
                            &cancel,
                        )
                        .await;
                        let outcome = answering(asked, done);
                        let ours = outcome.state == DriverLoadState::Loaded
                            && outcome.reason == LOADED_HERE;
                        loaded_here = outcome.version.clone().filter(|_| ours);
                        Some(outcome)
                    }
                    _ => None,
                };
                if let Some(loaded) = reload::OwnLoad::of(outcome.as_ref()) {
                    own_load = Some(loaded);
                }
                config.handoff.record(reload::reload_from(
                    asked.as_ref(),
                    outcome.as_ref(),
                    seen.as_ref(),
                    &config.store,
                    own_load.as_ref(),
                ));
                drop(commands);
                last = outcome.clone();
                publish(&tx, outcome);
            }
            let settled = loaded_here.is_none()
                && last
                    .as_ref()
                    .is_none_or(|o| o.state == DriverLoadState::Loaded);
            // A change asked for while held is looked at once it is not.
            (asked_changed, recheck_due) = (asked_changed && held, false);
            // Held by a reload's gap: looked at again when the grace ends.
            let wait = match in_grace.filter(|_| held) {
                Some(until) => until.saturating_duration_since(tokio::time::Instant::now()),
                None => recheck_after(&config, loaded_here.is_some()),
            };
            let settled = settled && !held;
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = wanted.changed() => {
                    if changed.is_err() { return }
                    asked_changed = true;
                }
                changed = report.changed() => if changed.is_err() { return },
                changed = reloads.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait), if !settled => recheck_due = true,
            }
        }
    };
    (rx, task)
}

/// How long a load this manager did may go unseen by the report before it
/// is looked at again. Discovery, not `modprobe`, says what is loaded, on
/// its own pace (udev, the rescan); looking again sooner would run
/// `modprobe` a second time for a module that is there.
/// The same holds after a reload by another ([`reload`]): that long the
/// report's "not loaded" is taken for the reload's gap.
pub const OWN_LOAD_GRACE: Duration = Duration::from_secs(30);

/// When to look again while not settled: after [`ManagerConfig::recheck`],
/// or, while the report does not show this manager's own load yet, after
/// [`OWN_LOAD_GRACE`] at the least. Pure.
pub fn recheck_after(config: &ManagerConfig, awaiting_own_load: bool) -> Duration {
    if awaiting_own_load {
        config.recheck.max(OWN_LOAD_GRACE)
    } else {
        config.recheck
    }
}

fn publish(tx: &watch::Sender<Option<DriverLoad>>, outcome: Option<DriverLoad>) {
    tx.send_if_modified(|current| {
        if *current == outcome {
            return false;
        }
        if let Some(o) = &outcome {
            tracing::info!(state = ?o.state, reason = %o.reason, message = %o.message, "driver");
        }
        *current = outcome;
        true
    });
}

/// Asks the host to reboot, once per boot id (`rebooted_from` remembers).
async fn reboot_once(
    config: &ManagerConfig,
    wanted: &DriverWanted,
    boot_id: &str,
    rebooted_from: &mut Option<String>,
) -> DriverLoad {
    let target = wanted.version.as_deref().unwrap_or("the bundle's driver");
    let outcome = |state, reason: &str, message: String| DriverLoad {
        state,
        reason: reason.to_owned(),
        message,
        bundle: None,
        version: wanted.version.clone(),
        asked: None,
        told_at: None,
    };
    if rebooted_from.as_deref() == Some(boot_id) {
        return outcome(
            DriverLoadState::Rebooting,
            REBOOT_REQUESTED,
            format!("rebooting into {target} (asked from boot {boot_id})"),
        );
    }
    match reboot::reboot(config.reboot.as_ref()).await {
        Ok(()) => {
            *rebooted_from = Some(boot_id.to_owned());
            outcome(
                DriverLoadState::Rebooting,
                REBOOT_REQUESTED,
                format!("rebooting into {target} (asked from boot {boot_id})"),
            )
        }
        Err(e) => failed(
            REBOOT_FAILED,
            format!("the upgrade to {target} asks for a reboot, which failed: {e}"),
            None,
        ),
    }
}

/// One look: a reboot the leader asked for, the blacklist, the decision,
/// and the unload and load it asks for, publishing `Loading` while they
/// run.
#[allow(clippy::too_many_arguments)]
async fn act(
    host: &HostRoot,
    reader: &BoundedReader,
    config: &ManagerConfig,
    wanted: &DriverWanted,
    report: &DriverReport,
    rebooted_from: &mut Option<String>,
    tx: &watch::Sender<Option<DriverLoad>>,
    cancel: &CancellationToken,
) -> DriverLoad {
    if reboot_due(wanted, report)
        && let Some(boot_id) = report.boot_id.as_deref()
    {
        // Not into a node that could load nothing afterwards: the target's
        // bundle must verify for this kernel first (the reboot keeps it).
        if let LoadDecision::Refuse { reason, message } = look(host, config, wanted, report).await {
            return outcome_of(&LoadDecision::Refuse {
                reason,
                message: format!("not rebooting for the upgrade: {message}"),
            })
            .unwrap_or_else(|| failed(reason, message, None));
        }
        // The blacklist first: the in-box amdgpu must not come back at boot.
        let (blacklist_host, blacklist_wanted) = (host.clone(), wanted.blacklist);
        let written = tokio::task::spawn_blocking(move || {
            blacklist::apply(&blacklist_host, blacklist_wanted)
        })
        .await;
        let seen = match &written {
            Ok(Ok(blacklisted)) => Ok(*blacklisted),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Some(refused) = reboot_blocked(report, &seen) {
            return refused;
        }
        if !matches!(written, Ok(Ok(_))) {
            tracing::warn!(result = ?written, "the amdgpu blacklist could not be brought in line before the reboot");
        }
        return reboot_once(config, wanted, boot_id, rebooted_from).await;
    }
    let (blacklist_host, blacklist_wanted) = (host.clone(), wanted.blacklist);
    let blacklisted =
        tokio::task::spawn_blocking(move || blacklist::apply(&blacklist_host, blacklist_wanted))
            .await;
    let blacklisted = match blacklisted {
        Ok(Ok(blacklisted)) => blacklisted,
        Ok(Err(e)) => return failed("BlacklistFailed", e.to_string(), None),
        Err(e) => return failed("BlacklistFailed", e.to_string(), None),
    };
    let decision = look(host, config, wanted, report).await;
    let (bundle, replacing) = match next_step(decision, blacklisted, wanted, report) {
        Next::Load(bundle) => (bundle, false),
        Next::Replace(bundle) => (bundle, true),
        Next::Done(outcome) => return outcome,
    };
    if replacing {
        let running = report.version.as_deref().unwrap_or("of unknown version");
        let holding = holders::in_use(reader).await;
        if !holding.is_free() {
            let message = format!(
                "amdgpu {running} runs and {} is wanted, but it is in use and is never \
                 unloaded by force: {}",
                bundle.version,
                holding.describe()
            );
            return about(
                DriverLoadState::ReplaceNeeded,
                "DriverInUse",
                message,
                &bundle,
            );
        }
        let message = format!("unloading amdgpu {running} to load {}", bundle.version);
        publish(
            tx,
            Some(answering(
                wanted,
                about(
                    DriverLoadState::Loading,
                    "DriverUnloading",
                    message,
                    &bundle,
                ),
            )),
        );
        let unloaded = tokio::select! {
            unloaded = load::unload(host, &config.commands, &wanted.module) => unloaded,
            _ = cancel.cancelled() => return failed(
                "AgentStopping",
                "the agent stopped while unloading".to_owned(),
                Some(&bundle.dir),
            ),
        };
        if let Err(e) = unloaded {
            return failed(
                e.reason(),
                format!("unloading amdgpu {running}: {e}"),
                Some(&bundle.dir),
            );
        }
    }
    let message = format!("loading amdgpu {} from {}", bundle.version, bundle.dir);
    publish(
        tx,
        Some(answering(
            wanted,
            about(DriverLoadState::Loading, REASON_LOADING, message, &bundle),
        )),
    );
    let loaded = tokio::select! {
        loaded = load::load(host, &config.commands, &bundle, &wanted.module) => loaded,
        // modprobe's process group is killed when its future is dropped.
        _ = cancel.cancelled() => return failed(
            "AgentStopping",
            "the agent stopped while loading".to_owned(),
            Some(&bundle.dir),
        ),
    };
    match loaded {
        Ok(()) => {
            let message = format!("loaded amdgpu {} from {}", bundle.version, bundle.dir);
            about(DriverLoadState::Loaded, LOADED_HERE, message, &bundle)
        }
        Err(e) => failed(
            e.reason(),
            format!("loading {}: {e}", bundle.dir),
            Some(&bundle.dir),
        ),
    }
}

/// `outcome` as the answer to `wanted`: what was asked and when it was
/// told, so that the agent can tell an answer to the current ask from one
/// to an earlier ask.
fn answering(wanted: &DriverWanted, outcome: DriverLoad) -> DriverLoad {
    DriverLoad {
        asked: wanted.version.clone(),
        told_at: wanted.told_at.clone(),
        ..outcome
    }
}

/// An outcome about `bundle`: its directory and version recorded.
fn about(state: DriverLoadState, reason: &str, message: String, bundle: &Verified) -> DriverLoad {
    DriverLoad {
        state,
        reason: reason.to_owned(),
        message,
        bundle: Some(bundle.dir.clone()),
        version: Some(bundle.version.clone()),
        asked: None,
        told_at: None,
    }
}
