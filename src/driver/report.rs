//! What driver a node runs, reported always (also when `spec.driver.enable`
//! is false): the amdgpu module's version and where it came from, the running
//! kernel, the boot id, and whether Secure Boot is on.
//!
//! The module's `version` and `srcversion` are discovery's
//! ([`DriverState`], read once per scan for the labels); this file reads only
//! what discovery does not, through the deadline-bounded [`BoundedReader`],
//! and turns the answers into a [`DriverReport`] with pure functions.
//!
//! Sources, as the kernel documents them:
//! - `/sys/module/amdgpu/taint` (Documentation/ABI/testing/sysfs-module): the
//!   module's taint flags; `O` is an out-of-tree module. The kernel sets it on
//!   load for every module whose modinfo lacks `intree=Y`, which modpost writes
//!   only for modules built inside the kernel tree, so a DKMS or other external
//!   build always shows `O`. The file exists for every loadable module (empty
//!   when untainted) and never for a built-in one, whose `/sys/module/<name>`
//!   holds only its parameters (and `version`): so a module directory without
//!   `taint` is a built-in driver. `/sys/module/amdgpu/version` is no such
//!   signal: it is whatever `MODULE_VERSION` says, which an in-tree build may
//!   set too.
//! - `/sys/module/amdgpu/refcnt`: how many users hold the module (for unloading).
//! - `/proc/sys/kernel/osrelease`: the running kernel, as `uname -r` prints it.
//! - `/proc/sys/kernel/random/boot_id`: a new random UUID at every boot.
//! - `/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098c1c4b8`
//!   (efivarfs, Documentation/filesystems/efivarfs.rst): 4 bytes of attributes,
//!   then the variable's value, one byte, 1 when Secure Boot is on. No
//!   `/sys/firmware/efi` at all means the host did not boot through UEFI, so
//!   Secure Boot is off; `/sys/firmware/efi` without the variable (efivarfs not
//!   mounted, or not visible in this container) is not known.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::device::watch::ScanState;
use crate::device::{DriverState, Inventory};
use crate::host::reader::{Answer, BoundedReader, Op, ReadError};

pub const MODULE_DIR: &str = "/sys/module/amdgpu";
pub const TAINT: &str = "/sys/module/amdgpu/taint";
pub const REFCNT: &str = "/sys/module/amdgpu/refcnt";
pub const OSRELEASE: &str = "/proc/sys/kernel/osrelease";
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
pub const EFI_DIR: &str = "/sys/firmware/efi";
pub const SECURE_BOOT_VAR: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098c1c4b8";

/// How long one of the report's files may take. None of them is backed by a
/// device, so a slow one means a host in trouble.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(1);

// The report is part of the agent's status, so its types live with that
// contract.
pub use crate::api::agent_status::{DriverReport, ModuleOrigin, SecureBoot};

/// One file's answer, as the pure functions take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact<T> {
    Read(T),
    Absent,
    /// It may exist, but reading it failed: the error, naming the file.
    Unreadable(String),
}

impl<T> Fact<T> {
    fn value(&self) -> Option<&T> {
        match self {
            Fact::Read(value) => Some(value),
            _ => None,
        }
    }

    fn problem(&self) -> Option<&str> {
        match self {
            Fact::Unreadable(why) => Some(why),
            _ => None,
        }
    }
}

/// The answers [`read_report`] collects, before they mean anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFacts {
    pub taint: Fact<String>,
    pub refcnt: Fact<String>,
    pub osrelease: Fact<String>,
    pub boot_id: Fact<String>,
    pub efi_dir: Fact<bool>,
    pub secure_boot_var: Fact<Vec<u8>>,
}

/// Where the module comes from, from whether it is loaded and its taint file.
pub fn module_origin(loaded: bool, taint: &Fact<String>) -> ModuleOrigin {
    match (loaded, taint) {
        (false, _) => ModuleOrigin::NotLoaded,
        (true, Fact::Absent) => ModuleOrigin::BuiltIn,
        (true, Fact::Read(flags)) if flags.contains('O') => ModuleOrigin::OutOfTree,
        (true, Fact::Read(_)) => ModuleOrigin::InTree,
        (true, Fact::Unreadable(_)) => ModuleOrigin::Unknown,
    }
}

/// Secure Boot from `/sys/firmware/efi` and the `SecureBoot` variable.
pub fn secure_boot(efi_dir: &Fact<bool>, variable: &Fact<Vec<u8>>) -> SecureBoot {
    match (efi_dir, variable) {
        // efivarfs: 4 bytes of attributes, then the value.
        (_, Fact::Read(bytes)) => match bytes.get(4) {
            Some(1) => SecureBoot::Enabled,
            Some(0) => SecureBoot::Disabled,
            _ => SecureBoot::Unknown,
        },
        (Fact::Read(false), Fact::Absent) => SecureBoot::NotUefi,
        _ => SecureBoot::Unknown,
    }
}

/// The report from discovery's view of the module and the kernel's files.
/// Pure.
pub fn report_from(driver: &DriverState, facts: &KernelFacts) -> DriverReport {
    let text = |fact: &Fact<String>| fact.value().filter(|v| !v.is_empty()).cloned();
    let problems = [
        facts.taint.problem(),
        facts.refcnt.problem(),
        facts.osrelease.problem(),
        facts.boot_id.problem(),
        facts.efi_dir.problem(),
        facts.secure_boot_var.problem(),
    ]
    .into_iter()
    .flatten()
    .map(str::to_owned)
    .collect();
    let loaded = driver.loaded;
    DriverReport {
        loaded,
        version: driver.version.clone().filter(|_| loaded),
        srcversion: driver.srcversion.clone().filter(|_| loaded),
        origin: module_origin(loaded, &facts.taint),
        taint: facts.taint.value().cloned().filter(|_| loaded),
        refcnt: facts
            .refcnt
            .value()
            .and_then(|n| n.parse().ok())
            .filter(|_| loaded),
        kernel_release: text(&facts.osrelease),
        boot_id: text(&facts.boot_id),
        secure_boot: secure_boot(&facts.efi_dir, &facts.secure_boot_var),
        problems,
    }
}

/// Reads what discovery does not and reports the driver. `driver` is the
/// latest inventory's. Each file is read with [`FILE_TIMEOUT`]; one that
/// hangs or fails is a `problems` entry, never an error.
pub async fn read_report(reader: &BoundedReader, driver: &DriverState) -> DriverReport {
    let facts = read_facts(reader).await;
    report_from(driver, &facts)
}

/// Keeps the node's report current for its status: read once discovery has
/// seen the whole host (`scans`), and again whenever its view of the
/// module changes (a driver loaded, unloaded or replaced). The kernel and
/// boot id change only across a reboot, which restarts the agent. Published
/// without `refcnt`, which moves with every process that opens a GPU and
/// would rewrite the status for nothing. Stops with `cancel`. Returns the
/// report and the task that keeps it, for the caller to run (and supervise).
pub fn follow(
    reader: BoundedReader,
    mut inventory: watch::Receiver<Arc<Inventory>>,
    mut scans: watch::Receiver<ScanState>,
    cancel: CancellationToken,
) -> (
    watch::Receiver<Option<DriverReport>>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(None);
    let task = async move {
        let mut last: Option<DriverState> = None;
        loop {
            let driver = inventory.borrow_and_update().driver.clone();
            if scans.borrow_and_update().discovered && last.as_ref() != Some(&driver) {
                let mut report = read_report(&reader, &driver).await;
                report.refcnt = None;
                tracing::debug!(?report, "driver report");
                tx.send_replace(Some(report));
                last = Some(driver);
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                changed = inventory.changed() => if changed.is_err() { break },
                changed = scans.changed() => if changed.is_err() { break },
            }
        }
    };
    (rx, task)
}

/// The kernel's files, read in one batch.
pub async fn read_facts(reader: &BoundedReader) -> KernelFacts {
    let requests = vec![
        (Op::Read, TAINT.to_owned()),
        (Op::Read, REFCNT.to_owned()),
        (Op::Read, OSRELEASE.to_owned()),
        (Op::Read, BOOT_ID.to_owned()),
        (Op::Exists, EFI_DIR.to_owned()),
        (Op::Bytes, SECURE_BOOT_VAR.to_owned()),
    ];
    let mut answers = reader.batch(requests, FILE_TIMEOUT).await.into_iter();
    let mut next = || answers.next().unwrap_or_else(|| Err(closed()));
    let text = |answer: Result<Answer, ReadError>| {
        fact(answer, |a| match a {
            Answer::Text(text) => Some(text),
            _ => None,
        })
    };
    KernelFacts {
        taint: text(next()),
        refcnt: text(next()),
        osrelease: text(next()),
        boot_id: text(next()),
        efi_dir: fact(next(), |a| match a {
            Answer::Exists(exists) => Some(exists),
            _ => None,
        }),
        secure_boot_var: fact(next(), |a| match a {
            Answer::Bytes(bytes) => Some(bytes),
            _ => None,
        }),
    }
}

fn closed() -> ReadError {
    ReadError::Closed {
        path: "driver report".into(),
    }
}

fn fact<T>(answer: Result<Answer, ReadError>, take: impl FnOnce(Answer) -> Option<T>) -> Fact<T> {
    match answer {
        Ok(answer) => match take(answer) {
            Some(value) => Fact::Read(value),
            None => Fact::Unreadable("the reader answered another kind of read".into()),
        },
        Err(e) if e.is_not_found() => Fact::Absent,
        Err(e) => Fact::Unreadable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoot;
    use crate::simulate;

    fn loaded(version: Option<&str>) -> DriverState {
        DriverState {
            loaded: true,
            version: version.map(str::to_owned),
            srcversion: Some("ABC".into()),
            kfd_present: true,
        }
    }

    #[test]
    fn origin_follows_the_taint_file() {
        let read = |s: &str| Fact::Read(s.to_owned());
        let cases = [
            (false, read("O"), ModuleOrigin::NotLoaded),
            (true, Fact::Absent, ModuleOrigin::BuiltIn),
            (true, read(""), ModuleOrigin::InTree),
            (true, read("E"), ModuleOrigin::InTree),
            (true, read("O"), ModuleOrigin::OutOfTree),
            (true, read("OE"), ModuleOrigin::OutOfTree),
            (true, Fact::Unreadable("x".into()), ModuleOrigin::Unknown),
        ];
        for (is_loaded, taint, want) in cases {
            assert_eq!(module_origin(is_loaded, &taint), want, "{taint:?}");
        }
        assert!(ModuleOrigin::InTree.is_inbox() && ModuleOrigin::BuiltIn.is_inbox());
        assert!(!ModuleOrigin::OutOfTree.is_inbox() && !ModuleOrigin::Unknown.is_inbox());
    }

    #[test]
    fn secure_boot_reads_the_byte_after_the_attributes() {
        let var = |bytes: &[u8]| Fact::Read(bytes.to_vec());
        let uefi = Fact::Read(true);
        let cases = [
            (uefi.clone(), var(&[6, 0, 0, 0, 1]), SecureBoot::Enabled),
            (uefi.clone(), var(&[6, 0, 0, 0, 0]), SecureBoot::Disabled),
            // Too short, or a value the specification does not define.
            (uefi.clone(), var(&[6, 0, 0, 0]), SecureBoot::Unknown),
            (uefi.clone(), var(&[6, 0, 0, 0, 7]), SecureBoot::Unknown),
            (uefi.clone(), Fact::Absent, SecureBoot::Unknown),
            (Fact::Read(false), Fact::Absent, SecureBoot::NotUefi),
            (
                Fact::Unreadable("x".into()),
                Fact::Absent,
                SecureBoot::Unknown,
            ),
        ];
        for (efi, variable, want) in cases {
            assert_eq!(secure_boot(&efi, &variable), want, "{efi:?} {variable:?}");
        }
        assert!(SecureBoot::Enabled.requires_signature());
        assert!(SecureBoot::Unknown.requires_signature());
        assert!(!SecureBoot::Disabled.requires_signature());
        assert!(!SecureBoot::NotUefi.requires_signature());
    }

    #[test]
    fn unreadable_files_are_problems_and_an_unloaded_module_has_no_version() {
        let facts = KernelFacts {
            taint: Fact::Read("O".into()),
            refcnt: Fact::Read("3".into()),
            osrelease: Fact::Unreadable("osrelease: no answer".into()),
            boot_id: Fact::Read("b-1".into()),
            efi_dir: Fact::Read(false),
            secure_boot_var: Fact::Absent,
        };
        let report = report_from(&loaded(Some("6.12.12")), &facts);
        assert_eq!(report.origin, ModuleOrigin::OutOfTree);
        assert_eq!(report.refcnt, Some(3));
        assert_eq!(report.version.as_deref(), Some("6.12.12"));
        assert_eq!(report.kernel_release, None);
        assert_eq!(report.problems, vec!["osrelease: no answer".to_owned()]);
        assert_eq!(report.secure_boot, SecureBoot::NotUefi);

        let unloaded = DriverState::default();
        let report = report_from(&unloaded, &facts);
        assert!(!report.loaded);
        assert_eq!(report.origin, ModuleOrigin::NotLoaded);
        assert_eq!((report.taint, report.refcnt), (None, None));
        assert_eq!(report.boot_id.as_deref(), Some("b-1"));
    }

    #[test]
    fn report_json_is_camel_case_and_round_trips() {
        let report = DriverReport {
            loaded: true,
            version: Some("6.12.12".into()),
            origin: ModuleOrigin::OutOfTree,
            kernel_release: Some("6.8.0-49-generic".into()),
            boot_id: Some("b".into()),
            secure_boot: SecureBoot::Enabled,
            ..DriverReport::default()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["kernelRelease"], "6.8.0-49-generic");
        assert_eq!(json["origin"], "OutOfTree");
        assert_eq!(json["secureBoot"], "Enabled");
        assert!(json.get("problems").is_none(), "{json}");
        let back: DriverReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[tokio::test]
    async fn reads_a_simulated_host() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = simulate::SimSpec::new("mi300x", Some(1), None).unwrap();
        simulate::write_host(&host, &spec).unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let driver = crate::device::discover(&host).driver;

        let report = read_report(&reader, &driver).await;
        let module = simulate::SimModule::default();
        assert!(report.loaded);
        assert_eq!(report.version, module.version);
        assert_eq!(report.srcversion.as_ref(), Some(&module.srcversion));
        assert_eq!(report.origin, ModuleOrigin::OutOfTree);
        assert_eq!(report.refcnt, Some(module.refcnt));
        assert_eq!(
            report.kernel_release.as_deref(),
            Some(simulate::SIM_KERNEL_RELEASE)
        );
        assert_eq!(report.boot_id.as_deref(), Some(simulate::SIM_BOOT_ID));
        assert_eq!(report.secure_boot, SecureBoot::NotUefi);
        assert!(report.problems.is_empty(), "{:?}", report.problems);

        // An in-box module after a reboot with Secure Boot on.
        simulate::load_module(
            &host,
            &simulate::SimModule {
                version: None,
                taint: String::new(),
                ..module
            },
        )
        .unwrap();
        simulate::set_boot(&host, "6.11.0-1-generic", "b-2").unwrap();
        host.write(SECURE_BOOT_VAR, [6u8, 0, 0, 0, 1]).unwrap();
        let driver = crate::device::discover(&host).driver;
        let report = read_report(&reader, &driver).await;
        assert_eq!(report.origin, ModuleOrigin::InTree);
        assert_eq!(report.version, None);
        assert_eq!(report.kernel_release.as_deref(), Some("6.11.0-1-generic"));
        assert_eq!(report.boot_id.as_deref(), Some("b-2"));
        assert_eq!(report.secure_boot, SecureBoot::Enabled);
    }

    #[tokio::test]
    async fn follow_reports_after_the_first_scan_and_again_when_the_module_changes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let spec = simulate::SimSpec::new("mi300x", Some(1), None).unwrap();
        simulate::write_host(&host, &spec).unwrap();
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Inventory::default()));
        let (scans_tx, scans_rx) = watch::channel(ScanState::default());
        let cancel = CancellationToken::new();
        let reader = BoundedReader::new(host.clone(), 2);
        let (mut reports, task) = follow(reader, inventory_rx, scans_rx, cancel.clone());
        let _task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(task));
        const WAIT: Duration = Duration::from_secs(10);

        // Before a scan has seen the host, nothing is reported.
        inventory_tx.send_replace(Arc::new(crate::device::discover(&host)));
        tokio::task::yield_now().await;
        assert!(reports.borrow_and_update().is_none());
        scans_tx.send_replace(ScanState {
            attempts: 1,
            discovered: true,
            last_incomplete: None,
        });
        let first = tokio::time::timeout(WAIT, reports.wait_for(Option::is_some))
            .await
            .unwrap()
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!(first.origin, ModuleOrigin::OutOfTree);
        assert_eq!(
            first.kernel_release.as_deref(),
            Some(simulate::SIM_KERNEL_RELEASE)
        );
        assert_eq!(first.refcnt, None, "refcnt stays out of the status");

        // The module unloaded: discovery's view changes, and so does the report.
        simulate::unload_module(&host).unwrap();
        inventory_tx.send_replace(Arc::new(crate::device::discover(&host)));
        let unloaded = tokio::time::timeout(
            WAIT,
            reports.wait_for(|r| r.as_ref().is_some_and(|r| !r.loaded)),
        )
        .await
        .unwrap()
        .unwrap()
        .clone()
        .unwrap();
        assert_eq!(unloaded.origin, ModuleOrigin::NotLoaded);
        assert_eq!(unloaded.version, None);
        cancel.cancel();
    }
}
