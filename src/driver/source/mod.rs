//! Where driver bundles come from, besides a directory that configuration
//! management puts in the store: the reference operator's precompiled
//! driver images, and tarballs (a file or an `http(s)` URL, with their
//! sha256).
//!
//! It owns turning either into a bundle at `<store>/<version>-<kernel>/`:
//! - [`import_image`] takes the copy of a driver image that an init
//!   container left in a staging directory (`opt/lib/modules/<kernel>/`,
//!   `firmwareDir/updates/amdgpu/`) and keeps the `modules.*` index files,
//!   amdgpu with the modules it needs per `modules.dep` (not the image's
//!   whole kernel tree) and amdgpu's firmware, with caps on each file's size,
//!   the count and the total;
//! - [`fetch_tarball`] and [`ensure_fetched`] check a tarball's sha256
//!   before anything in it is unpacked, and unpack only regular files and
//!   directories, with caps on size and count.
//!
//! Both write within one [`DiskBudget`]: a bound on what the work holds in
//! the store and a margin of free space left on its filesystem, checked
//! before writing and as bytes are written.
//!
//! Every new bundle is built in a directory of the store whose name starts
//! with `.` (which [`bundle::find`] skips), written a manifest for
//! ([`bundle::write_manifest`]) or checked against its own, verified
//! ([`bundle::verify`]), and only then renamed into place: nobody sees a
//! half-made bundle, the same bundle again is a no-op, and a different one
//! already at that name is replaced only when asked.
//!
//! It must not load anything nor decide which bundle the agent uses (that
//! is [`super::manager`]'s), and it reaches the network only for a URL its
//! caller names. Host paths go through [`HostRoot`].
//!
//! The parts: names (`names`: tags, bundle directories, sha256 text),
//! driver images (`image`), the store (`store`: work directories,
//! markers, placing), tarballs (`tarball`), unpacking (`unpack`) and
//! HTTP (`http`). This module keeps what they share: the outcome, the
//! error and the source marker.
//!
//! [`DiskBudget`]: super::space::DiskBudget
//! [`bundle::find`]: super::bundle::find
//! [`bundle::write_manifest`]: super::bundle::write_manifest
//! [`bundle::verify`]: super::bundle::verify
//! [`HostRoot`]: crate::host::HostRoot

mod http;
mod image;
mod location;
mod names;
mod store;
mod tarball;
mod unpack;

pub use image::{IMAGE_FIRMWARE, IMAGE_MODULES, ImageImport, amdgpu_closure, import_image};
pub use location::{FetchLimits, Location, parse_location, redact, resolve_redirect};
pub use names::{ImageTag, bundle_name, parse_image_tag, parse_sha256};
pub use store::{already_fetched, read_marker};
pub use tarball::{FetchOptions, Outcome, TarballSource, ensure_fetched, fetch_tarball};
pub use unpack::{Compression, EntryKind, entry_kind, entry_path};

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::bundle::{Refusal, Verified};

/// The file at a bundle's top that says where it came from. Not under
/// `lib/modules/` or `firmware/`, which the manifest lists exactly.
pub const SOURCE_MARKER: &str = "source.json";

/// Work directories in the store: skipped by [`bundle::find`](super::bundle::find)
/// for their `.`.
const IMPORT_PREFIX: &str = ".import-";
const FETCH_PREFIX: &str = ".fetch-";

/// A bundle from a source, and what happened in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placed {
    pub placement: Placement,
    /// The bundle's directory, a host path: `<store>/<version>-<kernel>`.
    pub dir: String,
    pub version: String,
    pub kernel_release: String,
    /// What verifying it found; `None` when a tarball with that sha256 was
    /// fetched before and nothing was read again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verified>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Placement {
    /// A new bundle is in the store.
    Added,
    /// The same bundle was there already; nothing changed.
    AlreadyPresent,
    /// Another bundle at that name was replaced, as asked.
    Replaced,
}

/// Why a source did not become a bundle.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The source was read and refused: its sha256, an unsafe tarball
    /// entry, or a bundle that does not verify.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Another bundle is already at the name, and replacing was not asked.
    #[error("{dir} already holds another bundle ({why}); ask to replace it (--replace)")]
    Occupied { dir: String, why: String },
    /// The source cannot be used as named: a bad tag, URL or sha256, a
    /// staging directory that is not a driver image's copy.
    #[error("{0}")]
    Invalid(String),
    /// The source cannot be read: a missing file, a failed download.
    #[error("{0}")]
    Unavailable(String),
    /// The store cannot be written.
    #[error("{0}")]
    Store(String),
    /// The fetch or import would hold more on disk than it may, or leave
    /// less free than it must ([`super::space`]).
    #[error("not enough room in the bundle store: {0}")]
    NoSpace(String),
}

impl SourceError {
    /// The reason, as conditions and Events would name it.
    pub fn reason(&self) -> &'static str {
        match self {
            SourceError::Refused(refusal) => refusal.reason(),
            SourceError::Occupied { .. } => "BundleExists",
            SourceError::Invalid(_) => "BundleSourceInvalid",
            SourceError::Unavailable(_) => "BundleSourceUnavailable",
            SourceError::Store(_) => "BundleStoreUnwritable",
            SourceError::NoSpace(_) => "BundleStoreFull",
        }
    }

    /// The source was looked at and turned down (exit status 1), rather
    /// than not usable or not reachable at all (2).
    pub fn is_refusal(&self) -> bool {
        matches!(self, SourceError::Refused(_) | SourceError::Occupied { .. })
    }
}

fn store_error(e: impl std::fmt::Display) -> SourceError {
    SourceError::Store(e.to_string())
}

/// A write into the work directory failed: out of room by the fetch's or
/// import's disk budget, or the store cannot be written.
fn write_error(path: &Path, e: io::Error) -> SourceError {
    if e.kind() == io::ErrorKind::StorageFull {
        SourceError::NoSpace(e.to_string())
    } else {
        store_error(format!("{}: {e}", path.display()))
    }
}

/// `<dir>/<relative>` for host paths.
fn join(dir: &str, relative: &str) -> String {
    format!("{}/{relative}", dir.trim_end_matches('/'))
}

/// What the marker at a bundle's top says about where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceMarker {
    pub kind: SourceKind,
    /// The image tag or staging directory, or the tarball's path or URL
    /// (without credentials or query).
    pub source: String,
    /// The tarball's sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceKind {
    DriverImage,
    Tarball,
}
