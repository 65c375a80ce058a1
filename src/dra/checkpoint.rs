//! The prepared claims, kept in a crash-safe file in the plugin directory so
//! that a restarted agent knows what it prepared.
//!
//! Order of writes on prepare: the CDI spec first, then the checkpoint. A
//! crash between the two leaves a spec without an entry; the kubelet, which
//! got no answer, calls prepare again and it is rewritten, and a spec no entry
//! names is removed when the plugin starts ([`orphaned_specs`]). On
//! unprepare the entry goes first, then the spec, for the same reason.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cdi;

/// File name inside the plugin directory.
pub const FILE_NAME: &str = "checkpoint.json";
const VERSION: u32 = 1;

/// One device of a prepared claim, as answered to the kubelet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    /// A shared device's share, as allocated (`shareID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// What the share consumes of the device's capacity, as the scheduler
    /// recorded it (`consumedCapacity`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// A prepared claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
}

/// What the file holds: prepared claims by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    pub prepared_claims: BTreeMap<String, PreparedClaim>,
}

/// Why the file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a checkpoint this agent can read: {why}")]
    Corrupt { path: PathBuf, why: String },
}

impl Checkpoint {
    /// Reads the file; a missing file is an empty checkpoint.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: path.into(),
                    source,
                });
            }
        };
        let corrupt = |why: String| CheckpointError::Corrupt {
            path: path.into(),
            why,
        };
        let checkpoint: Self =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if checkpoint.version > VERSION {
            return Err(corrupt(format!(
                "version {} is newer than {VERSION}",
                checkpoint.version
            )));
        }
        Ok(checkpoint)
    }

    /// Replaces the file atomically (temp file, sync, rename, directory sync).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let mut out = self.clone();
        out.version = VERSION;
        let bytes = serde_json::to_vec_pretty(&out).map_err(io::Error::other)?;
        cdi::write_atomically(path, &bytes)
    }
}

/// Our spec files in `cdi_dir` that no prepared claim names: left by a crash
/// between a spec write and its checkpoint entry, or by a lost checkpoint.
pub fn orphaned_specs(cdi_dir: &Path, checkpoint: &Checkpoint) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return Vec::new();
    };
    let known: BTreeSet<&str> = checkpoint
        .prepared_claims
        .keys()
        .map(String::as_str)
        .collect();
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let uid = cdi::claim_of_spec_file(&name)?;
            (!known.contains(uid)).then(|| e.path())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            devices: vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "n".into(),
                device_name: "gpu-1-128".into(),
                cdi_device_ids: vec!["k8s.gpu.amd.com/gpu=u-gpu-1-128".into()],
                share_id: Some("7c0b0d0e-share".into()),
                consumed_capacity: BTreeMap::from([("memory".into(), "8Gi".into())]),
            }],
        }
    }

    #[test]
    fn a_saved_checkpoint_loads_back_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(Checkpoint::load(&path).unwrap(), Checkpoint::default());
        let mut c = Checkpoint::default();
        c.prepared_claims.insert("u".into(), claim());
        c.save(&path).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        assert_eq!(back.prepared_claims, c.prepared_claims);
        assert_eq!(back.version, VERSION);
    }

    #[test]
    fn a_corrupt_checkpoint_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{not json").unwrap();
        let e = Checkpoint::load(&path).unwrap_err().to_string();
        assert!(e.contains(FILE_NAME), "{e}");
    }

    #[test]
    fn specs_without_an_entry_are_orphans() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(cdi::spec_path(dir.path(), "kept"), "{}").unwrap();
        std::fs::write(cdi::spec_path(dir.path(), "lost"), "{}").unwrap();
        std::fs::write(dir.path().join("other-vendor.json"), "{}").unwrap();
        let mut c = Checkpoint::default();
        c.prepared_claims.insert("kept".into(), claim());
        assert_eq!(
            orphaned_specs(dir.path(), &c),
            vec![cdi::spec_path(dir.path(), "lost")]
        );
    }
}
