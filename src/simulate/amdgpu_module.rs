//! The amdgpu kernel module as `/sys/module/amdgpu` shows it, and the
//! running kernel (`osrelease`, `boot_id`): written with the tree, then
//! changed by loads, unloads and boots.
//!
//! This file owns those files. It must not touch the GPUs' trees (the
//! module's `mod.rs` writes them).

use super::{SimError, Writer, write_atomic};
use crate::host::{HostError, HostRoot};

/// The kernel release every simulated host runs.
pub const SIM_KERNEL_RELEASE: &str = "6.8.0-49-generic";
/// The boot id of a freshly simulated host.
pub const SIM_BOOT_ID: &str = "3f1c2a9e-5b7d-4e08-9c61-2d4f8a0b7e15";

/// The amdgpu module as `/sys/module/amdgpu` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimModule {
    /// `version`; `None` writes no file (as an in-tree build without
    /// `MODULE_VERSION` has none).
    pub version: Option<String>,
    pub srcversion: String,
    /// The module's taint flags (`O` out-of-tree, `E` unsigned).
    pub taint: String,
    pub refcnt: u32,
}

impl Default for SimModule {
    /// The out-of-tree (DKMS) build the simulator has always shown.
    fn default() -> Self {
        Self {
            version: Some("6.12.12".into()),
            srcversion: "4E0B1C2D3A5F6E7D8C9B0A1".into(),
            taint: "O".into(),
            refcnt: 0,
        }
    }
}

pub(super) fn write_kernel(w: &mut Writer<'_>) -> Result<(), HostError> {
    w.file(
        "/proc/sys/kernel/osrelease",
        format!("{SIM_KERNEL_RELEASE}\n"),
    )?;
    w.file(
        "/proc/sys/kernel/random/boot_id",
        format!("{SIM_BOOT_ID}\n"),
    )
}

/// Makes `/sys/module/amdgpu` show `module`, as a `modprobe` that loaded it
/// would leave it (the module's own files only; GPUs are [`super::write_host`]'s).
pub fn load_module(host: &HostRoot, module: &SimModule) -> Result<(), SimError> {
    write_module_files(host, module)?;
    Ok(())
}

/// Removes `/sys/module/amdgpu`, as `modprobe -r amdgpu` would.
pub fn unload_module(host: &HostRoot) -> Result<(), SimError> {
    host.remove_all("/sys/module/amdgpu")?;
    Ok(())
}

/// Simulates a boot into `kernel_release` with a new `boot_id`.
pub fn set_boot(host: &HostRoot, kernel_release: &str, boot_id: &str) -> Result<(), SimError> {
    write_atomic(
        host,
        "/proc/sys/kernel/osrelease",
        format!("{kernel_release}\n"),
    )?;
    write_atomic(
        host,
        "/proc/sys/kernel/random/boot_id",
        format!("{boot_id}\n"),
    )?;
    Ok(())
}

fn write_module_files(host: &HostRoot, module: &SimModule) -> Result<usize, HostError> {
    let dir = "/sys/module/amdgpu";
    let mut attrs = vec![
        ("srcversion", module.srcversion.clone()),
        ("taint", module.taint.clone()),
        ("refcnt", module.refcnt.to_string()),
        ("initstate", "live".to_owned()),
    ];
    match &module.version {
        Some(version) => attrs.push(("version", version.clone())),
        None => host.remove_all(format!("{dir}/version"))?,
    }
    for (name, value) in &attrs {
        write_atomic(host, format!("{dir}/{name}"), format!("{value}\n"))?;
    }
    Ok(attrs.len())
}

pub(super) fn write_driver(w: &mut Writer<'_>, module: &SimModule) -> Result<(), HostError> {
    w.files += write_module_files(w.host, module)?;
    w.link(
        "/sys/bus/pci/drivers/amdgpu",
        "/sys/module/amdgpu/drivers/pci:amdgpu",
    )?;
    w.file("/sys/class/drm/version", "drm 1.1.0 20060810\n")?;
    // KFD's major is dynamic; 235 is what a real MI300X host gave it.
    w.file("/sys/class/kfd/kfd/dev", "235:0\n")?;
    w.file("/dev/kfd", "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{SimSpec, write_host};

    #[test]
    fn kernel_and_module_files_are_written_and_follow_loads_and_boots() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write_host(&host, &SimSpec::new("mi300x", Some(1), None).unwrap()).unwrap();
        assert_eq!(
            host.read_attr("/proc/sys/kernel/osrelease").unwrap(),
            SIM_KERNEL_RELEASE
        );
        assert_eq!(
            host.read_attr("/proc/sys/kernel/random/boot_id").unwrap(),
            SIM_BOOT_ID
        );
        let module = SimModule::default();
        for (name, value) in [
            ("taint", module.taint.as_str()),
            ("refcnt", "0"),
            ("srcversion", module.srcversion.as_str()),
        ] {
            assert_eq!(
                host.read_attr(format!("/sys/module/amdgpu/{name}"))
                    .unwrap(),
                value
            );
        }

        unload_module(&host).unwrap();
        assert!(!host.exists("/sys/module/amdgpu"));
        let inbox = SimModule {
            version: None,
            taint: String::new(),
            ..SimModule::default()
        };
        load_module(&host, &inbox).unwrap();
        assert!(host.exists("/sys/module/amdgpu/refcnt"));
        assert!(!host.exists("/sys/module/amdgpu/version"));
        set_boot(&host, "6.11.0-1-generic", "b-2").unwrap();
        assert_eq!(
            host.read_attr("/proc/sys/kernel/osrelease").unwrap(),
            "6.11.0-1-generic"
        );
        assert_eq!(
            host.read_attr("/proc/sys/kernel/random/boot_id").unwrap(),
            "b-2"
        );

        // Without a driver the kernel files are still there, the module not.
        let mut spec = SimSpec::new("mi300x", Some(1), None).unwrap();
        spec.driver_loaded = false;
        write_host(&host, &spec).unwrap();
        assert!(!host.exists("/sys/module/amdgpu"));
        assert_eq!(
            host.read_attr("/proc/sys/kernel/osrelease").unwrap(),
            SIM_KERNEL_RELEASE
        );
    }
}
