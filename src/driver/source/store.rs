//! The store: work directories, source markers, placing a bundle.
//!
//! It owns building a bundle out of sight (a `.` directory removed when
//! dropped), checking it, and renaming it into place; it must not read a
//! source (image, tarball, URL).

use std::path::PathBuf;

use super::names::bundle_name;
use super::{
    Placed, Placement, SOURCE_MARKER, SourceError, SourceKind, SourceMarker, join, store_error,
};
use crate::driver::bundle::{self, Expected, Manifest, Refusal, Verified};
use crate::host::{HostError, HostRoot};

/// A directory in the store to build a bundle in, removed with everything
/// left in it when dropped: a refused or interrupted import or fetch leaves
/// nothing behind.
pub(super) struct WorkDir {
    dir: tempfile::TempDir,
    /// Where it is on this machine (under the host root).
    pub(super) path: PathBuf,
    /// Its host path.
    pub(super) host_path: String,
}

impl WorkDir {
    pub(super) fn new(host: &HostRoot, store: &str, prefix: &str) -> Result<Self, SourceError> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(host.path(store))
            .map_err(|e| store_error(format!("{store}: cannot make a work directory: {e}")))?;
        let name = dir
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| store_error(format!("{store}: the work directory has no name")))?
            .to_owned();
        Ok(Self {
            path: dir.path().to_path_buf(),
            host_path: join(store, &name),
            dir,
        })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // TempDir removes it; a failure is only worth a line in the log.
        if self.dir.path().exists()
            && let Err(e) = std::fs::remove_dir_all(self.dir.path())
        {
            tracing::warn!(dir = %self.host_path, error = %e, "work directory not removed");
        }
    }
}

pub(super) fn write_marker(
    host: &HostRoot,
    dir: &str,
    marker: &SourceMarker,
) -> Result<(), SourceError> {
    let json = serde_json::to_vec_pretty(marker).map_err(store_error)?;
    host.write(join(dir, SOURCE_MARKER), json)
        .map_err(store_error)
}

/// The marker of the bundle in `dir`, if it has a readable one.
pub fn read_marker(host: &HostRoot, dir: &str) -> Option<SourceMarker> {
    let text = host.read_string(join(dir, SOURCE_MARKER)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The bundle in `store` fetched from a tarball of this sha256, if any:
/// its directory and manifest. What the agent asks before downloading.
pub fn already_fetched(host: &HostRoot, store: &str, sha256: &str) -> Option<(String, Manifest)> {
    let names = host.list_dir(store).ok()?;
    names
        .into_iter()
        .filter(|name| !name.starts_with('.'))
        .find_map(|name| {
            let dir = join(store, &name);
            let marker = read_marker(host, &dir)?;
            if marker.kind != SourceKind::Tarball || marker.sha256.as_deref() != Some(sha256) {
                return None;
            }
            let manifest = bundle::read_manifest(host, &dir).ok()?;
            Some((dir, manifest))
        })
}

/// What is at a bundle's name already, against the new bundle.
enum AtTarget {
    Nothing,
    Same(Verified),
    Different(String),
}

fn at_target(host: &HostRoot, target: &str, new: &Manifest, expected: &Expected) -> AtTarget {
    if std::fs::symlink_metadata(host.path(target)).is_err() {
        return AtTarget::Nothing;
    }
    let existing = match bundle::read_manifest(host, target) {
        Ok(existing) => existing,
        Err(refusal) => return AtTarget::Different(format!("its manifest: {refusal}")),
    };
    if existing != *new {
        let differ =
            if existing.version != new.version || existing.kernel_release != new.kernel_release {
                format!(
                    "driver {} for kernel {}",
                    existing.version, existing.kernel_release
                )
            } else {
                "the same driver and kernel, other files".to_owned()
            };
        return AtTarget::Different(differ);
    }
    match bundle::verify(host, target, expected) {
        Ok(verified) => AtTarget::Same(verified),
        Err(refusal) => AtTarget::Different(format!(
            "the same manifest, but it does not verify: {}: {refusal}",
            refusal.reason()
        )),
    }
}

/// Moves the verified bundle at `built` (a host path in the store) to
/// `<store>/<version>-<kernel>`, unless the same bundle is there already;
/// a different one is swapped out only when `replace` (the old one is
/// then in `built`, removed with the work directory).
pub(super) fn place(
    host: &HostRoot,
    store: &str,
    built: &str,
    manifest: &Manifest,
    verified: Verified,
    expected: &Expected,
    replace: bool,
) -> Result<Placed, SourceError> {
    let name = bundle_name(&manifest.version, &manifest.kernel_release).map_err(|why| {
        Refusal::ManifestInvalid {
            dir: built.to_owned(),
            why,
        }
    })?;
    let target = join(store, &name);
    let placed = |placement, verified: Verified| Placed {
        placement,
        dir: target.clone(),
        version: manifest.version.clone(),
        kernel_release: manifest.kernel_release.clone(),
        verified: Some(Verified {
            dir: target.clone(),
            ..verified
        }),
    };
    set_directory_mode(host, built)?;
    // Twice: another import of the same bundle may rename its own into
    // place between the look and the rename.
    for _ in 0..2 {
        match at_target(host, &target, manifest, expected) {
            AtTarget::Same(existing) => return Ok(placed(Placement::AlreadyPresent, existing)),
            AtTarget::Different(why) if !replace => {
                return Err(SourceError::Occupied {
                    dir: target.clone(),
                    why,
                });
            }
            AtTarget::Different(why) => {
                host.exchange(built, &target).map_err(store_error)?;
                tracing::info!(dir = %target, replaced = %why, "bundle replaced");
                return Ok(placed(Placement::Replaced, verified));
            }
            AtTarget::Nothing => {}
        }
        match host.rename(built, &target) {
            Ok(()) => return Ok(placed(Placement::Added, verified)),
            Err(HostError::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(store_error(format!(
        "{target}: keeps changing while the bundle is moved there"
    )))
}

/// Work directories are made private (0700); a bundle is readable by all,
/// as one that configuration management puts in the store would be.
fn set_directory_mode(host: &HostRoot, dir: &str) -> Result<(), SourceError> {
    use std::os::unix::fs::PermissionsExt;
    let path = host.path(dir);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| store_error(format!("{}: {e}", path.display())))
}
