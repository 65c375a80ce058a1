//! How much disk one bundle fetch or import may take while it works: a bound
//! on what its work directory holds at once (a fetch's tarball, decompressed
//! scratch and unpacked files together; an import's copied files) and a
//! margin of free space it must leave on the store's filesystem, so that
//! neither ever fills the node's disk.
//!
//! [`DiskBudget`] is charged as bytes are written and credited as work files
//! are removed; it checks the filesystem's free space before each stage that
//! knows its size, and again every [`CHECK_EVERY`] bytes written. The rule
//! itself ([`room_problem`]) is pure. This module must not write or remove
//! files: the fetch or import does, and tells it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Free space is looked at again after this many bytes are written.
pub const CHECK_EVERY: u64 = 16 * 1024 * 1024;

/// Why `wanted` more bytes do not fit, if they do not: with `used` bytes
/// already held by the work, at most `max_total` may be held at once, and
/// `min_free` of the filesystem's `free` bytes must stay free. Pure.
pub fn room_problem(
    used: u64,
    wanted: u64,
    max_total: u64,
    free: u64,
    min_free: u64,
) -> Option<String> {
    let total = used.saturating_add(wanted);
    if total > max_total {
        return Some(format!(
            "the work directory would hold {total} bytes at once, more than the {max_total} allowed"
        ));
    }
    if free < wanted.saturating_add(min_free) {
        return Some(format!(
            "{free} bytes are free, and {wanted} more would leave less than the {min_free} \
             that must stay free"
        ));
    }
    None
}

/// The bytes an unprivileged writer may still use on the filesystem of
/// `path` (`statvfs`: `f_bavail` blocks of `f_frsize` bytes).
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call,
    // and `stat` is a writable statvfs the call fills on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    // Both are 64-bit on the Linux targets this builds for.
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// What one fetch or import holds on disk, and its limits. Shared by the
/// stages of one fetch (download, decompression, unpacking) or the copies of
/// one import; cheap to charge.
#[derive(Debug)]
pub struct DiskBudget {
    /// A directory on the store's filesystem.
    dir: PathBuf,
    max_total: u64,
    min_free: u64,
    used: AtomicU64,
    /// Bytes written since free space was last looked at.
    unchecked: AtomicU64,
}

impl DiskBudget {
    pub fn new(dir: impl Into<PathBuf>, max_total: u64, min_free: u64) -> Self {
        Self {
            dir: dir.into(),
            max_total,
            min_free,
            used: AtomicU64::new(0),
            unchecked: AtomicU64::new(0),
        }
    }

    /// What the work holds now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Before writing `wanted` bytes (a size known in advance): whether they
    /// fit, by the total and by the filesystem's free space now.
    pub fn check_room(&self, wanted: u64) -> io::Result<()> {
        let free = free_bytes(&self.dir)?;
        match room_problem(self.used(), wanted, self.max_total, free, self.min_free) {
            Some(why) => Err(no_space(why)),
            None => Ok(()),
        }
    }

    /// `n` more bytes were written. Fails (`StorageFull`) once the work
    /// holds more than the total, or free space has fallen under the
    /// margin; the writer stops there, and the fetch or import removes its
    /// work.
    pub fn charge(&self, n: u64) -> io::Result<()> {
        let used = self.used.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if used > self.max_total {
            return Err(no_space(format!(
                "the work directory would hold more than the {} bytes allowed at once",
                self.max_total
            )));
        }
        let unchecked = self
            .unchecked
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n);
        if unchecked >= CHECK_EVERY {
            self.unchecked.store(0, Ordering::Relaxed);
            let free = free_bytes(&self.dir)?;
            if free < self.min_free {
                return Err(no_space(format!(
                    "{free} bytes are left free, less than the {} that must stay free",
                    self.min_free
                )));
            }
        }
        Ok(())
    }

    /// A work file of `n` bytes was removed.
    pub fn release(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

fn no_space(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_bounded_by_the_total_and_the_free_margin() {
        assert_eq!(room_problem(0, 10, 100, 1000, 100), None);
        assert_eq!(room_problem(90, 10, 100, 1000, 100), None);
        let over = room_problem(91, 10, 100, 1000, 100).unwrap_or_default();
        assert!(
            over.contains("101 bytes") && over.contains("100 allowed"),
            "{over}"
        );
        let tight = room_problem(0, 10, 100, 109, 100).unwrap_or_default();
        assert!(tight.contains("must stay free"), "{tight}");
        assert_eq!(room_problem(0, 10, 100, 110, 100), None);
        assert!(room_problem(0, u64::MAX, u64::MAX, u64::MAX - 1, 1).is_some());
    }

    #[test]
    fn free_space_is_read_from_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn charges_past_the_total_fail_and_releases_make_room() {
        let dir = tempfile::tempdir().unwrap();
        let budget = DiskBudget::new(dir.path(), 100, 0);
        budget.charge(60).unwrap();
        let e = budget.charge(41).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        budget.release(101);
        assert_eq!(budget.used(), 0);
        budget.charge(100).unwrap();
        assert!(budget.check_room(1).is_err());
    }

    #[test]
    fn a_margin_larger_than_the_disk_stops_the_writer_at_its_first_check() {
        let dir = tempfile::tempdir().unwrap();
        let budget = DiskBudget::new(dir.path(), u64::MAX, u64::MAX / 2);
        assert!(budget.check_room(1).is_err());
        budget.charge(CHECK_EVERY - 1).unwrap();
        let e = budget.charge(1).unwrap_err();
        assert!(e.to_string().contains("must stay free"), "{e}");
    }
}
