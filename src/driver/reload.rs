//! Reloading amdgpu for someone other than the driver manager: the DRA
//! plugin after a memory (NPS) mode change (`draDriver.autoPartition`),
//! which the driver applies only when it initialises. A reload loads again
//! the driver that ran: the bundle the manager loaded, from the same
//! directory, with the firmware path at its `firmware/` and the
//! DeviceConfig's `kernelModuleConfig`, as [`super::load::load`] does; or,
//! when the operator does not manage the driver, amdgpu as the host
//! installs it, still with the DeviceConfig's `kernelModuleConfig` (the
//! same rule refusing what `validate` and the manager refuse).
//!
//! [`Handoff`] is the one place that knows what the manager loaded: the
//! manager records it after each look ([`reload_from`], pure), a reload
//! reads it ([`plan`]). It also keeps the two apart: whoever runs
//! `modprobe` on amdgpu holds its lock, and a reload is announced
//! ([`Reloads`]) so that the manager does not take the moment amdgpu is
//! gone for a driver to load ([`manager_holds`], pure). [`steps`] decides
//! the reload's `modprobe` arguments (pure); [`run`] runs them.
//!
//! This module must not decide when to reload (the caller does) nor load
//! anything of its own choosing: what it loads is what ran.

use std::ffi::OsString;
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard, watch};

use super::bundle::Expected;
use super::condition::LOADED_HERE;
use super::decision::DriverWanted;
use super::load::{self, FIRMWARE_PATH_PARAM, LoadCommands, LoadError, MAX_FIRMWARE_PATH};
use super::preflight;
use super::report::MODULE_DIR;
use crate::api::KernelModuleConfigSpec;
use crate::api::agent_status::{DriverLoad, DriverLoadState, DriverReport, ModuleOrigin};
use crate::host::HostRoot;

/// Where the amdgpu that runs comes from, as the driver manager last saw
/// it: what a reload loads again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ReloadFrom {
    /// No DeviceConfig asks the operator for a driver: amdgpu as the host
    /// installs it, with the `kernelModuleConfig` the reload is given.
    #[default]
    NotManaged,
    /// The operator manages the driver, and the host's in-box amdgpu runs
    /// (the bundle's comes with a reboot): the host's again, with `module`.
    Host { module: KernelModuleConfigSpec },
    /// The bundle the manager loaded (its directory, a host path), while
    /// its version runs.
    Bundle {
        dir: String,
        version: String,
        module: KernelModuleConfigSpec,
    },
    /// An out-of-tree amdgpu the manager found running (loaded before this
    /// agent started): the store's verified bundle of the version that
    /// runs, for the running kernel.
    Store {
        store: String,
        expected: Expected,
        module: KernelModuleConfigSpec,
    },
    /// The operator manages the driver, but what runs cannot be loaded
    /// again as it was: why. A reload is refused before anything changes.
    Refused(String),
}

/// The bundle a driver manager loaded last: its directory (a host path)
/// and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnLoad {
    pub dir: String,
    pub version: String,
}

impl OwnLoad {
    /// The bundle `outcome` says this manager loaded, if it says so.
    pub fn of(outcome: Option<&DriverLoad>) -> Option<Self> {
        match outcome? {
            DriverLoad {
                state: DriverLoadState::Loaded,
                reason,
                bundle: Some(dir),
                version: Some(version),
                ..
            } if reason == LOADED_HERE => Some(Self {
                dir: dir.clone(),
                version: version.clone(),
            }),
            _ => None,
        }
    }
}

/// What the manager records after a look: what it was `asked`, its
/// `outcome`, the `report` it acted on, its bundle `store`, and the bundle
/// it loaded last (`own`, kept across looks: a report read mid-change must
/// not make it forget). Pure.
///
/// - Nothing asked: the host's driver ([`ReloadFrom::NotManaged`]).
/// - The manager's own load, or the version of the bundle it loaded still
///   running: that bundle.
/// - The in-box amdgpu running: the host's, with the asked module config.
/// - An out-of-tree amdgpu the manager found running: the store's bundle
///   of that version.
/// - Anything else (nothing loaded, a module of unknown origin or
///   version): refused, saying why.
pub fn reload_from(
    asked: Option<&DriverWanted>,
    outcome: Option<&DriverLoad>,
    report: Option<&DriverReport>,
    store: &str,
    own: Option<&OwnLoad>,
) -> ReloadFrom {
    let Some(asked) = asked else {
        return ReloadFrom::NotManaged;
    };
    let module = asked.module.clone();
    if let Some(OwnLoad { dir, version }) = OwnLoad::of(outcome) {
        return ReloadFrom::Bundle {
            dir,
            version,
            module,
        };
    }
    let Some(report) = report else {
        return ReloadFrom::Refused("the driver report is not read yet".to_owned());
    };
    if !report.loaded {
        let why = outcome
            .map(|o| format!(" ({}: {})", o.reason, o.message))
            .unwrap_or_default();
        return ReloadFrom::Refused(format!("amdgpu is not loaded{why}"));
    }
    let running = report.version.as_deref();
    match (report.origin, own) {
        (ModuleOrigin::OutOfTree, Some(OwnLoad { dir, version }))
            if running == Some(version.as_str()) =>
        {
            ReloadFrom::Bundle {
                dir: dir.clone(),
                version: version.clone(),
                module,
            }
        }
        (origin, _) if origin.is_inbox() => ReloadFrom::Host { module },
        (ModuleOrigin::OutOfTree, _) => match (running, &report.kernel_release) {
            (Some(version), Some(kernel_release)) => ReloadFrom::Store {
                store: store.to_owned(),
                expected: Expected {
                    kernel_release: kernel_release.clone(),
                    version: Some(version.to_owned()),
                    signature_required: report.secure_boot.requires_signature(),
                },
                module,
            },
            _ => ReloadFrom::Refused(
                "an out-of-tree amdgpu whose version or kernel cannot be read runs: \
                 it is not loaded again on a guess"
                    .to_owned(),
            ),
        },
        (origin, _) => ReloadFrom::Refused(format!(
            "amdgpu {} of {origin:?} origin runs: the agent loads again only a driver it \
             can tell apart",
            running.unwrap_or("of unknown version")
        )),
    }
}

/// The `modprobe` runs of one reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadSteps {
    /// `-r ${unloadArgs} amdgpu`.
    pub unload: Vec<OsString>,
    /// The firmware search path to set before loading (a host path, as the
    /// kernel resolves it): a bundle's `firmware/`; `None` for the host's
    /// driver, whose firmware is where the host installed it.
    pub firmware: Option<String>,
    /// A bundle's `--dirname <bundle> ${loadArgs} amdgpu ${parameters}`, or
    /// the host's `${loadArgs} amdgpu ${parameters}`.
    pub load: Vec<OsString>,
}

/// The reload's `modprobe` arguments: the bundle at host path `bundle` (as
/// this process sees it through `host`), or the host's driver when `None`,
/// with `module`. Refused as the manager refuses a load: a module config
/// that `validate` refuses, a firmware path longer than the kernel takes.
/// Pure.
pub fn steps(
    host: &HostRoot,
    bundle: Option<&str>,
    module: &KernelModuleConfigSpec,
) -> Result<ReloadSteps, String> {
    if let Some(problem) = load::module_config_problem(module) {
        return Err(format!("ModuleConfigInvalid: {problem}"));
    }
    let unload = load::unload_args(module);
    let Some(dir) = bundle else {
        return Ok(ReloadSteps {
            unload,
            firmware: None,
            load: load::host_load_args(module),
        });
    };
    let firmware = load::firmware_dir(dir);
    if firmware.len() > MAX_FIRMWARE_PATH {
        return Err(format!(
            "firmware path {firmware:?} is longer than the kernel's {MAX_FIRMWARE_PATH} bytes"
        ));
    }
    Ok(ReloadSteps {
        unload,
        firmware: Some(firmware),
        load: load::modprobe_args(&host.path(dir), module),
    })
}

/// What a reload from `from` runs, on the host `host`; `not_managed` is the
/// module config for a driver the operator does not manage (the
/// DeviceConfig's). A bundle found running is looked up in the store and
/// verified (off the runtime). `Err` says why it cannot be reloaded; then
/// nothing may change that needs a reload.
pub async fn plan(
    host: &HostRoot,
    from: &ReloadFrom,
    not_managed: &KernelModuleConfigSpec,
) -> Result<ReloadSteps, String> {
    match from {
        ReloadFrom::NotManaged => steps(host, None, not_managed),
        ReloadFrom::Host { module } => steps(host, None, module),
        ReloadFrom::Bundle { dir, module, .. } => steps(host, Some(dir), module),
        ReloadFrom::Refused(why) => Err(format!(
            "the driver manager manages amdgpu, and it cannot be loaded again as it runs: {why}"
        )),
        ReloadFrom::Store {
            store,
            expected,
            module,
        } => {
            let (reader_host, store_path, wanted) = (host.clone(), store.clone(), expected.clone());
            let checked = tokio::task::spawn_blocking(move || {
                preflight::preflight(&reader_host, &store_path, &wanted)
            })
            .await;
            let version = expected.version.as_deref().unwrap_or("of any version");
            let dir = match checked {
                Ok(Ok(answer)) => match answer.usable() {
                    Some(bundle) => bundle.dir.clone(),
                    None => {
                        let why = answer
                            .refused
                            .map(|r| r.0.to_string())
                            .unwrap_or_else(|| "none verified".to_owned());
                        return Err(format!(
                            "amdgpu {version} runs, and no bundle of it for kernel {} in {store} \
                             can be loaded again: {why}",
                            expected.kernel_release
                        ));
                    }
                },
                Ok(Err(refusal)) => return Err(format!("{store}: {refusal}")),
                Err(e) => return Err(format!("{store}: the check stopped: {e}")),
            };
            steps(host, Some(&dir), module)
        }
    }
}

/// Reloads amdgpu as `steps` say: unloads it (then checks that
/// `/sys/module/amdgpu` is gone), points the firmware search path where
/// `steps.firmware` says, loads it and checks that `/sys/module/amdgpu` is
/// back. Never forced: call it only with the GPUs free, as for
/// [`load::unload`].
pub async fn run(
    host: &HostRoot,
    commands: &LoadCommands,
    steps: &ReloadSteps,
) -> Result<(), LoadError> {
    load::run_modprobe(commands, steps.unload.clone()).await?;
    if host.exists(MODULE_DIR) {
        return Err(LoadError::StillLoaded);
    }
    if let Some(firmware) = &steps.firmware {
        host.write(FIRMWARE_PATH_PARAM, firmware)
            .map_err(|e| LoadError::FirmwarePath(e.to_string()))?;
    }
    load::run_modprobe(commands, steps.load.clone()).await?;
    if !host.exists(MODULE_DIR) {
        return Err(LoadError::NotLoaded);
    }
    Ok(())
}

/// How another reloads amdgpu: with the manager's `modprobe`, loading what
/// the manager's [`Handoff`] says runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloader {
    pub commands: LoadCommands,
    pub handoff: Handoff,
}

/// Where reloads stand, for the manager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    /// A reload runs (or a change that may reload, and undo).
    pub running: bool,
    /// How many have ended since the agent started.
    pub ended: u64,
}

/// Whether the manager holds off looking, as while its own load is not
/// seen yet: while a reload runs, and, within the manager's grace for its
/// own load (`manager::OWN_LOAD_GRACE`) after one's end
/// (`just_reloaded`), while the report does not show amdgpu loaded, of the
/// version that `ran` before (when the manager knew it): a report read
/// during the reload, or of a module half set up. The recheck at the
/// grace's end looks again. Pure.
pub fn manager_holds(
    reloads: Reloads,
    just_reloaded: bool,
    report: Option<&DriverReport>,
    ran: Option<&str>,
) -> bool {
    let back =
        report.is_some_and(|r| r.loaded && ran.is_none_or(|v| r.version.as_deref() == Some(v)));
    reloads.running || (just_reloaded && !back)
}

/// What the driver manager and a reloader share: what the manager loaded,
/// where reloads stand, and the lock whoever runs `modprobe` on amdgpu
/// holds. Clones share one; equal when they are the same one.
#[derive(Clone, Default)]
pub struct Handoff(Arc<Shared>);

#[derive(Default)]
struct Shared {
    from: watch::Sender<ReloadFrom>,
    reloads: watch::Sender<Reloads>,
    commands: Arc<Mutex<()>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("from", &*self.0.from.borrow())
            .field("reloads", &*self.0.reloads.borrow())
            .finish()
    }
}

impl PartialEq for Handoff {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Handoff {}

impl Handoff {
    /// The manager's record of what runs.
    pub fn record(&self, from: ReloadFrom) {
        self.0.from.send_if_modified(|current| {
            let changed = *current != from;
            *current = from;
            changed
        });
    }

    /// What runs, as last recorded.
    pub fn from(&self) -> ReloadFrom {
        self.0.from.borrow().clone()
    }

    /// Where reloads stand; `changed()` wakes at a start and an end.
    pub fn reloads(&self) -> watch::Receiver<Reloads> {
        self.0.reloads.subscribe()
    }

    /// The lock whoever runs `modprobe` on amdgpu holds.
    pub async fn commands(&self) -> OwnedMutexGuard<()> {
        self.0.commands.clone().lock_owned().await
    }

    /// Starts a reload: waits for the manager to finish what it runs, then
    /// announces the reload until the guard is dropped.
    pub async fn begin(&self) -> ReloadGuard {
        let commands = self.commands().await;
        self.0.reloads.send_modify(|r| r.running = true);
        ReloadGuard {
            handoff: self.clone(),
            _commands: commands,
        }
    }
}

/// A reload under way: the `modprobe` lock held and the reload announced.
pub struct ReloadGuard {
    handoff: Handoff,
    _commands: OwnedMutexGuard<()>,
}

impl Drop for ReloadGuard {
    fn drop(&mut self) {
        self.handoff.0.reloads.send_modify(|r| {
            r.running = false;
            r.ended += 1;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DriverType;
    use crate::api::agent_status::SecureBoot;

    fn module() -> KernelModuleConfigSpec {
        KernelModuleConfigSpec {
            load_args: vec!["-v".into()],
            unload_args: vec!["--wait=5000".into()],
            parameters: vec!["ras_enable=1".into(), "noretry".into()],
        }
    }

    fn asked() -> DriverWanted {
        DriverWanted {
            driver_type: DriverType::Container,
            version: None,
            blacklist: None,
            module: module(),
            replace: true,
            reboot_from: None,
            told_at: None,
        }
    }

    fn report(origin: ModuleOrigin, version: Option<&str>) -> DriverReport {
        DriverReport {
            loaded: origin != ModuleOrigin::NotLoaded,
            version: version.map(str::to_owned),
            origin,
            kernel_release: Some("6.8.0".into()),
            secure_boot: SecureBoot::Disabled,
            ..DriverReport::default()
        }
    }

    fn outcome(reason: &str, bundle: Option<&str>, version: Option<&str>) -> DriverLoad {
        DriverLoad {
            state: DriverLoadState::Loaded,
            reason: reason.into(),
            message: "m".into(),
            bundle: bundle.map(str::to_owned),
            version: version.map(str::to_owned),
            asked: None,
            told_at: None,
        }
    }

    const DIR: &str = "/var/lib/gpu-operator/drivers/6.12.12-6.8.0";

    fn own(version: &str) -> Option<OwnLoad> {
        Some(OwnLoad {
            dir: DIR.into(),
            version: version.into(),
        })
    }

    fn kind(from: &ReloadFrom) -> String {
        match from {
            ReloadFrom::NotManaged => "not managed".into(),
            ReloadFrom::Host { .. } => "host".into(),
            ReloadFrom::Bundle { dir, version, .. } => format!("bundle {version} {dir}"),
            ReloadFrom::Store { expected, .. } => {
                format!("store {}", expected.version.as_deref().unwrap_or("-"))
            }
            ReloadFrom::Refused(why) => format!("refused: {why}"),
        }
    }

    #[test]
    fn a_reload_loads_what_the_manager_loaded_or_found() {
        use ModuleOrigin::*;
        let loaded_here = outcome(LOADED_HERE, Some(DIR), Some("6.12.12"));
        let running = outcome("DriverRunning", None, Some("6.12.12"));
        let loaded = report(OutOfTree, Some("6.12.12"));
        // What was asked, the look's outcome, the report, the bundle the
        // manager loaded last, and what is recorded now.
        type Case<'a> = (
            Option<DriverWanted>,
            Option<&'a DriverLoad>,
            Option<DriverReport>,
            Option<OwnLoad>,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            // Nothing asked: the host's, whatever ran before.
            (
                None,
                Some(&loaded_here),
                Some(loaded.clone()),
                own("6.12.12"),
                "not managed",
            ),
            // The manager's own load, before the report shows it.
            (
                Some(asked()),
                Some(&loaded_here),
                Some(report(NotLoaded, None)),
                None,
                "bundle 6.12.12 /var/lib/gpu-operator/drivers/6.12.12-6.8.0",
            ),
            // Found running afterwards: the bundle it loaded is kept.
            (
                Some(asked()),
                Some(&running),
                Some(loaded.clone()),
                own("6.12.12"),
                "bundle 6.12.12 /var/lib/gpu-operator/drivers/6.12.12-6.8.0",
            ),
            // Another version runs now (replaced by hand): not that bundle.
            (
                Some(asked()),
                Some(&running),
                Some(report(OutOfTree, Some("6.10.5"))),
                own("6.12.12"),
                "store 6.10.5",
            ),
            // Found running at the start: the store's bundle of its version.
            (
                Some(asked()),
                Some(&running),
                Some(loaded.clone()),
                None,
                "store 6.12.12",
            ),
            (
                Some(asked()),
                None,
                Some(report(InTree, None)),
                None,
                "host",
            ),
            (
                Some(asked()),
                None,
                Some(report(Unknown, Some("6.12.12"))),
                None,
                "refused: amdgpu 6.12.12 of Unknown origin runs: the agent loads again only a \
                 driver it can tell apart",
            ),
            (
                Some(asked()),
                None,
                Some(report(OutOfTree, None)),
                None,
                "refused: an out-of-tree amdgpu whose version or kernel cannot be read runs: it \
                 is not loaded again on a guess",
            ),
            (
                Some(asked()),
                None,
                Some(report(NotLoaded, None)),
                own("6.12.12"),
                "refused: amdgpu is not loaded",
            ),
            (
                Some(asked()),
                None,
                None,
                None,
                "refused: the driver report is not read yet",
            ),
        ];
        for (asked, outcome, report, own, want) in cases {
            let from = reload_from(
                asked.as_ref(),
                outcome,
                report.as_ref(),
                "/var/lib/gpu-operator/drivers",
                own.as_ref(),
            );
            assert_eq!(kind(&from), want, "{outcome:?} {report:?} {own:?}");
        }
    }

    #[test]
    fn a_bundle_found_running_is_looked_up_for_its_version_and_kernel() {
        let from = reload_from(
            Some(&asked()),
            None,
            Some(&DriverReport {
                secure_boot: SecureBoot::Enabled,
                ..report(ModuleOrigin::OutOfTree, Some("6.12.12"))
            }),
            "/store",
            None,
        );
        assert_eq!(
            from,
            ReloadFrom::Store {
                store: "/store".into(),
                expected: Expected {
                    kernel_release: "6.8.0".into(),
                    version: Some("6.12.12".into()),
                    signature_required: true,
                },
                module: module(),
            }
        );
    }

    fn strings(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn a_bundle_reload_runs_modprobe_as_the_manager_loads_it() {
        let host = HostRoot::new("/host");
        let steps = steps(&host, Some(DIR), &module()).unwrap();
        assert_eq!(strings(&steps.unload), ["-r", "--wait=5000", "amdgpu"]);
        assert_eq!(steps.firmware.as_deref(), Some(&*format!("{DIR}/firmware")));
        let seen = format!("/host{DIR}");
        assert_eq!(
            strings(&steps.load),
            [
                "--dirname",
                seen.as_str(),
                "-v",
                "amdgpu",
                "ras_enable=1",
                "noretry"
            ]
        );
    }

    #[test]
    fn a_host_reload_takes_the_module_config_and_no_bundle() {
        let host = HostRoot::new("/host");
        let steps = steps(&host, None, &module()).unwrap();
        assert_eq!(strings(&steps.unload), ["-r", "--wait=5000", "amdgpu"]);
        assert_eq!(steps.firmware, None);
        assert_eq!(
            strings(&steps.load),
            ["-v", "amdgpu", "ras_enable=1", "noretry"]
        );
        let plain = super::steps(&host, None, &KernelModuleConfigSpec::default()).unwrap();
        assert_eq!(strings(&plain.unload), ["-r", "amdgpu"]);
        assert_eq!(strings(&plain.load), ["amdgpu"]);
    }

    #[test]
    fn a_reload_refuses_what_a_load_refuses() {
        let host = HostRoot::new("/host");
        let forcing = KernelModuleConfigSpec {
            unload_args: vec!["--force".into()],
            ..KernelModuleConfigSpec::default()
        };
        let err = steps(&host, None, &forcing).unwrap_err();
        assert!(
            err.starts_with("ModuleConfigInvalid: kernelModuleConfig.unloadArgs"),
            "{err}"
        );
        let long = format!("/{}", "d".repeat(300));
        let err = steps(&host, Some(&long), &KernelModuleConfigSpec::default()).unwrap_err();
        assert!(err.contains("longer than the kernel's"), "{err}");
    }

    #[test]
    fn the_manager_holds_off_while_a_reload_runs_and_while_its_gap_may_show() {
        let gone = report(ModuleOrigin::NotLoaded, None);
        let back = report(ModuleOrigin::OutOfTree, Some("6.12.12"));
        // A module directory seen before its files are written.
        let half = report(ModuleOrigin::OutOfTree, None);
        let running = Reloads {
            running: true,
            ended: 0,
        };
        let idle = Reloads::default();
        let ran = Some("6.12.12");
        assert!(manager_holds(running, false, Some(&back), ran));
        assert!(manager_holds(running, false, None, ran));
        assert!(
            manager_holds(idle, true, Some(&gone), ran),
            "a report from the gap"
        );
        assert!(
            manager_holds(idle, true, Some(&half), ran),
            "a module half set up"
        );
        assert!(manager_holds(idle, true, None, ran));
        assert!(!manager_holds(idle, true, Some(&back), ran));
        assert!(
            !manager_holds(idle, true, Some(&half), None),
            "no version known"
        );
        assert!(
            !manager_holds(idle, false, Some(&gone), ran),
            "after the grace"
        );
    }

    #[tokio::test]
    async fn a_reload_waits_for_the_manager_and_is_announced_until_it_ends() {
        let handoff = Handoff::default();
        let mut reloads = handoff.reloads();
        let manager = handoff.commands().await;
        let reloader = handoff.clone();
        let reload = tokio::spawn(async move {
            let _guard = reloader.begin().await;
        });
        tokio::task::yield_now().await;
        assert!(
            !reloads.borrow_and_update().running,
            "waits for the manager"
        );
        drop(manager);
        reload.await.unwrap();
        let seen = *reloads.borrow_and_update();
        assert_eq!(
            seen,
            Reloads {
                running: false,
                ended: 1
            }
        );
        assert_eq!(handoff, handoff.clone());
        assert_ne!(handoff, Handoff::default());
    }
}
