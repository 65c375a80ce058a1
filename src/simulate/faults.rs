//! Faults a test injects into a simulated host: RAS error counts (with the
//! text of the RAS files, which the tree is written with at zero) and files
//! that hang on read, as a stuck sysfs attribute does.
//!
//! This file owns what a fault looks like on the host. It must not decide when
//! one happens (tests and the standalone demo do) nor write the healthy tree.

use std::path::Path;

use super::{SimError, pci_dir, write_atomic};
use crate::host::{HostError, HostRoot};

/// Whether a RAS block's file has the `de:` line: `amdgpu_ras_sysfs_read`
/// writes deferred errors for UMC only, on every ASIC.
pub(super) fn deferred_line(block: &str) -> Option<u64> {
    (block == "umc").then_some(0)
}

/// Sets a GPU's deferred-error count for one block as well (the `de:` line
/// of kernels that report it), with its other counts.
pub fn set_ecc_counts_with_deferred(
    host: &HostRoot,
    bdf: &str,
    block: &str,
    [uncorrectable, correctable, deferred]: [u64; 3],
) -> Result<(), SimError> {
    write_ras(
        host,
        bdf,
        block,
        Some(deferred),
        [uncorrectable, correctable],
    )
}

/// Sets a GPU's RAS error counters for one block, as the kernel reports them
/// (UMC's with `de: 0`).
pub fn set_ecc_counts(
    host: &HostRoot,
    bdf: &str,
    block: &str,
    uncorrectable: u64,
    correctable: u64,
) -> Result<(), SimError> {
    write_ras(
        host,
        bdf,
        block,
        deferred_line(block),
        [uncorrectable, correctable],
    )
}

fn write_ras(
    host: &HostRoot,
    bdf: &str,
    block: &str,
    deferred: Option<u64>,
    [uncorrectable, correctable]: [u64; 2],
) -> Result<(), SimError> {
    let path = format!("{}/ras/{block}_err_count", pci_dir(bdf));
    write_atomic(host, path, ras_counts(uncorrectable, correctable, deferred))?;
    Ok(())
}

/// `ras/<block>_err_count` as `amdgpu_ras.c` writes it: `ue:` and `ce:`,
/// and `de:` where the kernel counts deferred errors.
pub(super) fn ras_counts(uncorrectable: u64, correctable: u64, deferred: Option<u64>) -> String {
    let mut text = format!("ue: {uncorrectable}\nce: {correctable}\n");
    if let Some(deferred) = deferred {
        text.push_str(&format!("de: {deferred}\n"));
    }
    text
}

/// Makes a host file hang on read, as a stuck sysfs attribute does: it is
/// replaced by a FIFO with no writer, so `open` blocks. [`release_hung_file`]
/// undoes it and lets blocked readers go.
pub fn hang_file(host: &HostRoot, host_path: &str) -> Result<(), SimError> {
    let path = host.path(host_path);
    host.remove_all(host_path)?;
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| HostError::Io {
            path: path.clone(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
    // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) } != 0 {
        return Err(HostError::Io {
            path,
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    Ok(())
}

/// Releases readers blocked on a file made by [`hang_file`] and puts `value` back.
pub fn release_hung_file(host: &HostRoot, host_path: &str, value: &str) -> Result<(), SimError> {
    let path = host.path(host_path);
    if is_fifo(&path) {
        // Opening the write end wakes every reader blocked in open(); they then
        // read end-of-file. Keep it open while the FIFO is replaced.
        use std::os::unix::fs::OpenOptionsExt;
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        host.remove_all(host_path)?;
        drop(writer);
    }
    write_atomic(host, host_path, format!("{value}\n"))?;
    Ok(())
}

pub(super) fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{SimSpec, write_host};

    #[test]
    fn ecc_counts_and_hung_files() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write_host(&host, &SimSpec::new("mi210", Some(1), None).unwrap()).unwrap();
        set_ecc_counts(&host, "0000:03:00.0", "umc", 2, 5).unwrap();
        assert_eq!(
            host.read_string("/sys/devices/pci0000:00/0000:03:00.0/ras/umc_err_count")
                .unwrap(),
            "ue: 2\nce: 5\nde: 0\n",
            "UMC's file has the deferred line"
        );
        set_ecc_counts(&host, "0000:03:00.0", "gfx", 1, 0).unwrap();
        assert_eq!(
            host.read_string("/sys/devices/pci0000:00/0000:03:00.0/ras/gfx_err_count")
                .unwrap(),
            "ue: 1\nce: 0\n"
        );
        let file = "/sys/devices/pci0000:00/0000:03:00.0/current_link_speed";
        hang_file(&host, file).unwrap();
        let reader = {
            let host = host.clone();
            std::thread::spawn(move || host.read_attr(file))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!reader.is_finished(), "a read of a hung file blocks");
        release_hung_file(&host, file, "16.0 GT/s PCIe").unwrap();
        let _ = reader.join().unwrap();
        assert_eq!(host.read_attr(file).unwrap(), "16.0 GT/s PCIe");
    }
}
