//! Driver images: importing the copy of a driver image that an init
//! container left in a staging directory.
//!
//! It owns choosing what of the image goes into a bundle (the `modules.*`
//! index, amdgpu and what it needs, amdgpu's firmware) and copying it
//! within the caps and the disk budget; it must not place the bundle
//! itself ([`super::store`] does).

use std::io::{self, Read, Write};
use std::path::Path;

use super::names::bundle_name;
use super::store::{WorkDir, place, write_marker};
use super::{
    IMPORT_PREFIX, Placed, SourceError, SourceKind, SourceMarker, join, store_error, write_error,
};
use crate::driver::bundle::{
    self, Expected, MAX_FILE_BYTES, MAX_FILES, MAX_MODULES_DEP_BYTES, Refusal, path_problem,
};
use crate::driver::space::DiskBudget;
use crate::host::{HostError, HostRoot};

/// Where a driver image keeps its modules: `<this>/<kernel>/`.
pub const IMAGE_MODULES: &str = "opt/lib/modules";
/// Where a driver image keeps amdgpu's firmware.
pub const IMAGE_FIRMWARE: &str = "firmwareDir/updates/amdgpu";
/// How deep a firmware tree may go (a link to a parent would loop).
const MAX_TREE_DEPTH: usize = 16;
/// Where a bundle keeps amdgpu's firmware.
const FIRMWARE_DIR: &str = "firmware/amdgpu";

/// amdgpu and every module it needs, transitively, per `modules.dep`: paths
/// relative to `lib/modules/<kernel_release>/`, amdgpu first. Each must be
/// a plain relative path inside that directory. Pure.
pub fn amdgpu_closure(modules_dep: &str, kernel_release: &str) -> Result<Vec<String>, String> {
    let Some((amdgpu, _)) = bundle::amdgpu_in_modules_dep(modules_dep, kernel_release) else {
        return Err("modules.dep names no amdgpu module".into());
    };
    let prefix = format!("/lib/modules/{kernel_release}/");
    let relative = |p: &str| p.strip_prefix(&prefix).unwrap_or(p).to_owned();
    let mut needs = std::collections::BTreeMap::new();
    for line in modules_dep.lines() {
        if let Some((module, deps)) = line.split_once(':') {
            let deps: Vec<String> = deps.split_whitespace().map(relative).collect();
            needs.insert(relative(module.trim()), deps);
        }
    }
    let mut closure = vec![amdgpu];
    let mut next = 0;
    while next < closure.len() {
        let module = closure[next].clone();
        next += 1;
        if let Some(why) = path_problem(
            &format!("lib/modules/{kernel_release}/{module}"),
            kernel_release,
        ) {
            return Err(format!("modules.dep names {module:?}: {why}"));
        }
        for dep in needs.get(&module).into_iter().flatten() {
            if !closure.contains(dep) {
                closure.push(dep.clone());
            }
        }
    }
    Ok(closure)
}

/// A driver image's copy to turn into a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageImport {
    /// The directory the image was copied into (a host path): it holds
    /// `opt/lib/modules/<kernel>/` and `firmwareDir/updates/amdgpu/`.
    pub staging: String,
    pub kernel_release: String,
    pub version: String,
    /// The image's tag, when known: recorded in the bundle's marker.
    pub tag: Option<String>,
    /// Modules must be signed for the bundle to be kept.
    pub signature_required: bool,
    /// Replace a different bundle already at the bundle's name.
    pub replace: bool,
    /// The most the bundle's copied files may take in the store, added up.
    pub max_total_bytes: u64,
    /// Free space the import must leave on the store's filesystem.
    pub min_free_bytes: u64,
}

/// Turns the staging copy of a driver image into the bundle
/// `<store>/<version>-<kernel>` (see the module doc). Every file to copy is
/// found and sized first, and the total checked against the budget before
/// anything is written; the copies are charged to it as they are written,
/// so a file that grows meanwhile or a disk that fills stops the import too.
/// Blocking: it copies and hashes tens of MiB, so async callers run it on
/// `spawn_blocking`.
pub fn import_image(
    host: &HostRoot,
    store: &str,
    import: &ImageImport,
) -> Result<Placed, SourceError> {
    let kernel = &import.kernel_release;
    bundle_name(&import.version, kernel).map_err(SourceError::Invalid)?;
    let staging = import.staging.as_str();
    let (modules, firmware) = image_directories(host, staging, kernel)?;
    let closure = image_closure(host, staging, &modules, kernel)?;

    let mut files = module_files(
        host,
        staging,
        &modules,
        &closure,
        &format!("lib/modules/{kernel}"),
    )?;
    firmware_files(host, staging, &firmware, FIRMWARE_DIR, 0, &mut files)?;

    host.create_dir_all(store).map_err(store_error)?;
    let budget = DiskBudget::new(
        host.path(store),
        import.max_total_bytes,
        import.min_free_bytes,
    );
    let total = files
        .iter()
        .fold(0u64, |sum, file| sum.saturating_add(file.size));
    budget
        .check_room(total)
        .map_err(|e| write_error(&host.path(store), e))?;
    // From here, any error drops `work`, which removes what was copied.
    let work = WorkDir::new(host, store, IMPORT_PREFIX)?;
    for file in &files {
        copy_file(host, &file.from, &work.path.join(&file.to), &budget)?;
    }

    let manifest = bundle::write_manifest(host, &work.host_path, &import.version, kernel)?;
    let expected = Expected {
        kernel_release: kernel.clone(),
        version: Some(import.version.clone()),
        signature_required: import.signature_required,
    };
    let verified = bundle::verify(host, &work.host_path, &expected)?;
    let marker = SourceMarker {
        kind: SourceKind::DriverImage,
        source: import.tag.clone().unwrap_or_else(|| staging.to_owned()),
        sha256: None,
    };
    write_marker(host, &work.host_path, &marker)?;
    let placed = place(
        host,
        store,
        &work.host_path,
        &manifest,
        verified,
        &expected,
        import.replace,
    )?;
    tracing::info!(
        dir = %placed.dir,
        placement = ?placed.placement,
        version = %placed.version,
        kernel = %placed.kernel_release,
        source = %marker.source,
        "driver image imported"
    );
    Ok(placed)
}

/// The image's modules directory for `kernel` and its firmware directory
/// in `staging`, or why the copy is not one of a driver image for it.
fn image_directories(
    host: &HostRoot,
    staging: &str,
    kernel: &str,
) -> Result<(String, String), SourceError> {
    if !host.path(staging).is_dir() {
        return Err(SourceError::Unavailable(format!(
            "{staging}: no such directory"
        )));
    }
    let modules = join(staging, &format!("{IMAGE_MODULES}/{kernel}"));
    if !host.exists(&modules) {
        let present = host
            .list_dir_or_empty(join(staging, IMAGE_MODULES))
            .unwrap_or_default();
        return Err(SourceError::Invalid(format!(
            "{staging} has no {IMAGE_MODULES}/{kernel}/: the image is not for kernel {kernel}, or the copy missed it (it holds: {})",
            if present.is_empty() {
                "nothing".to_owned()
            } else {
                present.join(", ")
            }
        )));
    }
    let firmware = join(staging, IMAGE_FIRMWARE);
    if !host.exists(&firmware) {
        return Err(SourceError::Invalid(format!(
            "{staging} has no {IMAGE_FIRMWARE}/: copy the image's /firmwareDir too"
        )));
    }
    within_staging(host, staging, &modules)?;
    Ok((modules, firmware))
}

/// amdgpu and what it needs, from the image's `modules.dep`.
fn image_closure(
    host: &HostRoot,
    staging: &str,
    modules: &str,
    kernel: &str,
) -> Result<Vec<String>, SourceError> {
    let missing = |why: String| Refusal::ModuleMissing {
        dir: modules.to_owned(),
        why,
    };
    let modules_dep = join(modules, "modules.dep");
    within_staging(host, staging, &modules_dep)?;
    let mut text = Vec::new();
    host.read_chunks(&modules_dep, MAX_MODULES_DEP_BYTES, |c| {
        text.extend_from_slice(c)
    })
    .map_err(|e| missing(e.to_string()))?;
    Ok(amdgpu_closure(&String::from_utf8_lossy(&text), kernel).map_err(missing)?)
}

/// One file an import copies: from a host path of the staging copy to a
/// path relative to the bundle, and its size when it was looked at.
struct ImportFile {
    from: String,
    to: String,
    size: u64,
}

impl ImportFile {
    /// `from` (already checked to resolve within the staging copy), sized.
    fn new(host: &HostRoot, from: String, to: String) -> Result<Self, SourceError> {
        let size = std::fs::metadata(host.path(&from))
            .map_err(|e| SourceError::Unavailable(format!("{}: {e}", host.path(&from).display())))?
            .len();
        Ok(Self { from, to, size })
    }
}

/// The `modules.*` index files and the modules of `closure` (amdgpu first)
/// in the image's `modules` directory, to go under `to` in the bundle.
fn module_files(
    host: &HostRoot,
    staging: &str,
    modules: &str,
    closure: &[String],
    to: &str,
) -> Result<Vec<ImportFile>, SourceError> {
    let mut files = Vec::new();
    for name in host.list_dir(modules).map_err(unavailable)? {
        if name.starts_with("modules.") {
            let from = join(modules, &name);
            within_staging(host, staging, &from)?;
            if host.path(&from).is_file() {
                files.push(ImportFile::new(host, from, join(to, &name))?);
            }
        }
    }
    let amdgpu = closure.first().cloned().unwrap_or_default();
    for module in closure {
        let from = join(modules, module);
        if !host.exists(&from) {
            return Err(SourceError::Refused(if *module == amdgpu {
                Refusal::ModuleMissing {
                    dir: modules.to_owned(),
                    why: format!("modules.dep names {module}, which the image does not hold"),
                }
            } else {
                Refusal::DependencyMissing {
                    module: join(modules, &amdgpu),
                    dependency: module.clone(),
                }
            }));
        }
        within_staging(host, staging, &from)?;
        files.push(ImportFile::new(host, from, join(to, module))?);
    }
    Ok(files)
}

pub(super) fn unavailable(e: HostError) -> SourceError {
    SourceError::Unavailable(e.to_string())
}

/// `path` of the staging tree resolves (through any symbolic link) inside
/// `staging`: an image's link to its own `/lib/modules` would name a file
/// of whoever runs the import.
fn within_staging(host: &HostRoot, staging: &str, path: &str) -> Result<(), SourceError> {
    match host.resolves_within(staging, path) {
        Ok(true) => Ok(()),
        Ok(false) => Err(SourceError::Refused(Refusal::PathEscapesBundle {
            path: path.to_owned(),
            why: format!("a symbolic link points out of {staging}"),
        })),
        Err(e) => Err(unavailable(e)),
    }
}

/// Copies the host file `from` (capped) to `to`, a new file in a work
/// directory, creating its parents, each chunk charged to `budget` before
/// it is written.
fn copy_file(
    host: &HostRoot,
    from: &str,
    to: &Path,
    budget: &DiskBudget,
) -> Result<(), SourceError> {
    let mut input = host
        .open_capped(from, MAX_FILE_BYTES)
        .map_err(unavailable)?;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| store_error(format!("{}: {e}", parent.display())))?;
    }
    let mut output =
        std::fs::File::create_new(to).map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(SourceError::Unavailable(format!(
                    "{}: {e}",
                    input.path().display()
                )));
            }
        };
        budget.charge(n as u64).map_err(|e| write_error(to, e))?;
        output
            .write_all(&buf[..n])
            .map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    }
}

/// The files under the host directory `from`, to go under `to` in the
/// bundle, added to `files`: symbolic links that stay in `staging` are
/// followed (firmware trees link one file name to another), those that
/// leave it refused.
fn firmware_files(
    host: &HostRoot,
    staging: &str,
    from: &str,
    to: &str,
    depth: usize,
    files: &mut Vec<ImportFile>,
) -> Result<(), SourceError> {
    within_staging(host, staging, from)?;
    if depth > MAX_TREE_DEPTH {
        return Err(SourceError::Invalid(format!(
            "{from}: more than {MAX_TREE_DEPTH} directories deep (a link loop?)"
        )));
    }
    for name in host.list_dir(from).map_err(unavailable)? {
        let path = join(from, &name);
        within_staging(host, staging, &path)?;
        let meta = std::fs::metadata(host.path(&path)).map_err(|e| {
            SourceError::Unavailable(format!("{}: {e}", host.path(&path).display()))
        })?;
        if meta.is_dir() {
            firmware_files(host, staging, &path, &join(to, &name), depth + 1, files)?;
        } else if meta.is_file() {
            // The module files are in `files` too; the cap is on the bundle.
            if files.len() >= MAX_FILES {
                return Err(SourceError::Invalid(format!(
                    "{from}: more than {MAX_FILES} files"
                )));
            }
            files.push(ImportFile {
                from: path,
                to: join(to, &name),
                size: meta.len(),
            });
        } else {
            return Err(SourceError::Invalid(format!(
                "{path}: neither a file nor a directory"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "6.8.0-49-generic";

    #[test]
    fn the_closure_follows_modules_dep_transitively_and_stays_inside() {
        let text = "\
updates/dkms/amdgpu.ko.xz: updates/dkms/amdttm.ko.xz kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst
updates/dkms/amdttm.ko.xz:
kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst: kernel/drivers/gpu/drm/drm_kms_helper.ko.zst
kernel/drivers/gpu/drm/drm_kms_helper.ko.zst:
kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko.zst:
";
        assert_eq!(
            amdgpu_closure(text, KERNEL).unwrap(),
            [
                "updates/dkms/amdgpu.ko.xz",
                "updates/dkms/amdttm.ko.xz",
                "kernel/drivers/gpu/drm/display/drm_display_helper.ko.zst",
                "kernel/drivers/gpu/drm/drm_kms_helper.ko.zst",
            ]
        );
        assert!(amdgpu_closure("kernel/e1000e.ko:\n", KERNEL).is_err());
        let escaping = "updates/amdgpu.ko: ../../../etc/evil.ko\n";
        let why = amdgpu_closure(escaping, KERNEL).unwrap_err();
        assert!(why.contains("evil.ko"), "{why}");
    }

    /// The import's check before copying sizes each file when it looks; a
    /// file that grows afterwards is still stopped by the charge as it is
    /// copied, before more than the bound is written.
    #[test]
    fn an_import_copy_stops_at_the_budget_as_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/staging/fw.bin", vec![7u8; 200 * 1024])
            .unwrap();
        let tight = DiskBudget::new(dir.path(), 100 * 1024, 0);
        let to = dir.path().join("work/fw.bin");
        let result = copy_file(&host, "/staging/fw.bin", &to, &tight);
        let Err(SourceError::NoSpace(why)) = result else {
            panic!("expected NoSpace: {result:?}");
        };
        assert!(why.contains("102400 bytes allowed"), "{why}");
        let written = std::fs::metadata(&to).unwrap().len();
        assert!(written <= 100 * 1024, "{written} bytes written");
    }
}
