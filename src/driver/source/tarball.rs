//! Tarballs: a file or an `http(s)` URL with its sha256, fetched once.
//!
//! It owns naming a tarball's location, checking its sha256 before
//! anything is unpacked, and handing the unpacked bundle to the store; it
//! must not unpack entries itself ([`super::unpack`]) nor speak HTTP
//! ([`super::http`]).

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::http::download;
use super::image::unavailable;
use super::location::{FetchLimits, Location, parse_location, redact, too_big};
use super::names::{hex, parse_sha256};
use super::store::{WorkDir, already_fetched, place, write_marker};
use super::unpack::unpack;
use super::{
    FETCH_PREFIX, Placed, Placement, SourceError, SourceKind, SourceMarker, join, store_error,
    write_error,
};
use crate::driver::bundle::{self, Expected, MANIFEST, Refusal};
use crate::driver::space::DiskBudget;
use crate::host::HostRoot;

/// A tarball holding one bundle, and its sha256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TarballSource {
    /// An absolute host path, or an `http://` or `https://` URL.
    pub source: String,
    /// 64 hex digits.
    pub sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchOptions {
    pub limits: FetchLimits,
    /// Modules must be signed for the bundle to be kept.
    pub signature_required: bool,
    /// Replace a different bundle already at the bundle's name.
    pub replace: bool,
}

/// One source's outcome in [`ensure_fetched`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The source as it may be shown (no credentials or query).
    pub source: String,
    pub result: Result<Placed, SourceError>,
}

/// Fetches each tarball not fetched before (no bundle in the store carries
/// its sha256 in its marker), one after the other. What the agent calls
/// for the sources a DeviceConfig names; every outcome is logged too.
pub async fn ensure_fetched(
    host: &HostRoot,
    store: &str,
    sources: &[TarballSource],
    options: &FetchOptions,
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(sources.len());
    for source in sources {
        let result = fetch_tarball(host, store, source, options).await;
        let shown = redact(&source.source);
        if let Err(e) = &result {
            tracing::warn!(
                source = %shown,
                reason = e.reason(),
                error = %e,
                "driver bundle tarball not fetched"
            );
        }
        outcomes.push(Outcome {
            source: shown,
            result,
        });
    }
    outcomes
}

/// Fetches one tarball into the store: downloaded (or copied) into a work
/// directory while hashed, its sha256 checked, unpacked safely, verified
/// against its own manifest for the kernel that manifest names, marked
/// with where it came from, and renamed to `<store>/<version>-<kernel>`.
/// A tarball of the same sha256 fetched before is not read again, unless
/// `options.replace` asks for it (a bundle damaged since is fetched anew).
pub async fn fetch_tarball(
    host: &HostRoot,
    store: &str,
    source: &TarballSource,
    options: &FetchOptions,
) -> Result<Placed, SourceError> {
    let sha256 = parse_sha256(&source.sha256).map_err(SourceError::Invalid)?;
    let location = parse_location(&source.source).map_err(SourceError::Invalid)?;
    let shown = redact(&source.source);

    let (h, s, sha) = (host.clone(), store.to_owned(), sha256.clone());
    let before = if options.replace {
        None
    } else {
        blocking(move || Ok(already_fetched(&h, &s, &sha))).await?
    };
    if let Some((dir, manifest)) = before {
        tracing::debug!(source = %shown, dir = %dir, "tarball fetched before");
        return Ok(Placed {
            placement: Placement::AlreadyPresent,
            dir,
            version: manifest.version,
            kernel_release: manifest.kernel_release,
            verified: None,
        });
    }

    let (h, s) = (host.clone(), store.to_owned());
    let work = blocking(move || {
        h.create_dir_all(&s).map_err(store_error)?;
        WorkDir::new(&h, &s, FETCH_PREFIX)
    })
    .await?;
    let tarball = work.path.join("tarball");
    let budget = Arc::new(DiskBudget::new(
        &work.path,
        options.limits.max_total_bytes,
        options.limits.min_free_bytes,
    ));
    let (actual, size) = match &location {
        Location::Url(uri) => download(uri, &tarball, &options.limits, &budget).await?,
        Location::Path(path) => {
            let (h, path, to, max, b) = (
                host.clone(),
                path.clone(),
                tarball.clone(),
                options.limits.max_tarball_bytes,
                budget.clone(),
            );
            blocking(move || copy_hashing(&h, &path, &to, max, &b)).await?
        }
    };
    if actual != sha256 {
        // Removing a tarball of GiBs blocks: not on the async threads.
        let _ = blocking(move || {
            drop(work);
            Ok(())
        })
        .await;
        return Err(SourceError::Refused(Refusal::ChecksumMismatch {
            path: shown,
            expected: sha256,
            actual,
        }));
    }
    tracing::debug!(source = %shown, bytes = size, "tarball checksum matches");

    let (h, s, options) = (host.clone(), store.to_owned(), options.clone());
    blocking(move || unpack_and_place(&h, &s, work, &shown, &sha256, &options, &budget)).await
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| store_error(format!("the work did not finish: {e}")))?
}

/// Copies the host file `from` to `to` while hashing it; more than `max`
/// bytes is refused before it is read.
fn copy_hashing(
    host: &HostRoot,
    from: &str,
    to: &Path,
    max: u64,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    // Named as the host path and where it was looked for: under a host
    // root other than / they differ, and the first alone names a file that
    // may well exist.
    let looked_at = host.path(from);
    let named = if looked_at.as_path() == Path::new(from) {
        from.to_owned()
    } else {
        format!(
            "{from} (the host path, looked for at {})",
            looked_at.display()
        )
    };
    let meta = std::fs::metadata(&looked_at)
        .map_err(|e| SourceError::Unavailable(format!("{named}: {e}")))?;
    if !meta.is_file() {
        return Err(SourceError::Unavailable(format!("{named}: not a file")));
    }
    if meta.len() > max {
        return Err(too_big(from, max));
    }
    budget
        .check_room(meta.len())
        .map_err(|e| write_error(to, e))?;
    let mut input = host.open_capped(from, max).map_err(unavailable)?;
    let mut output =
        std::fs::File::create_new(to).map_err(|e| store_error(format!("{}: {e}", to.display())))?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Grown past the cap since it was looked at, or unreadable.
            Err(e) => return Err(SourceError::Unavailable(format!("{from}: {e}"))),
        };
        context.update(&buf[..n]);
        budget.charge(n as u64).map_err(|e| write_error(to, e))?;
        output
            .write_all(&buf[..n])
            .map_err(|e| store_error(format!("{}: {e}", to.display())))?;
        size += n as u64;
    }
    Ok((hex(context.finish().as_ref()), size))
}

/// The tarball's sha256 checked: unpack it in the work directory, find
/// the bundle in it, verify it and put it in place.
fn unpack_and_place(
    host: &HostRoot,
    store: &str,
    work: WorkDir,
    shown: &str,
    sha256: &str,
    options: &FetchOptions,
    budget: &DiskBudget,
) -> Result<Placed, SourceError> {
    let unpacked = work.path.join("unpacked");
    std::fs::create_dir(&unpacked)
        .map_err(|e| store_error(format!("{}: {e}", unpacked.display())))?;
    unpack(
        &work.path.join("tarball"),
        &work.path.join("tarball.tar"),
        &unpacked,
        shown,
        &options.limits,
        budget,
    )?;
    let root = bundle_root(&unpacked).map_err(|why| Refusal::ManifestInvalid {
        dir: shown.to_owned(),
        why,
    })?;
    let root_host = match root {
        Some(name) => join(&work.host_path, &format!("unpacked/{name}")),
        None => join(&work.host_path, "unpacked"),
    };
    let manifest = bundle::read_manifest(host, &root_host)?;
    let expected = Expected {
        kernel_release: manifest.kernel_release.clone(),
        version: None,
        signature_required: options.signature_required,
    };
    let verified = bundle::verify(host, &root_host, &expected)?;
    let marker = SourceMarker {
        kind: SourceKind::Tarball,
        source: shown.to_owned(),
        sha256: Some(sha256.to_owned()),
    };
    write_marker(host, &root_host, &marker)?;
    let placed = place(
        host,
        store,
        &root_host,
        &manifest,
        verified,
        &expected,
        options.replace,
    )?;
    if placed.placement == Placement::AlreadyPresent {
        // The same bundle from another source (an image, another
        // compression): remember this sha256 too, so it is not fetched again.
        write_marker(host, &placed.dir, &marker)?;
    }
    drop(work);
    tracing::info!(
        dir = %placed.dir,
        placement = ?placed.placement,
        version = %placed.version,
        kernel = %placed.kernel_release,
        source = %shown,
        "driver bundle tarball fetched"
    );
    Ok(placed)
}

/// Where the manifest is in an unpacked tarball: at its top (`None`), or in
/// its single top-level directory (`Some(name)`).
fn bundle_root(unpacked: &Path) -> Result<Option<String>, String> {
    if unpacked.join(MANIFEST).is_file() {
        return Ok(None);
    }
    let names: Vec<String> = std::fs::read_dir(unpacked)
        .map_err(|e| e.to_string())?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    match names.as_slice() {
        [only] if unpacked.join(only).join(MANIFEST).is_file() => Ok(Some(only.clone())),
        _ => Err(format!(
            "no {MANIFEST} at the tarball's top or in its single top-level directory"
        )),
    }
}
