//! The prepared claims, kept in a crash-safe file in the plugin directory so
//! that a restarted agent knows what it prepared.
//!
//! Order of writes on prepare: the CDI spec first, then the checkpoint. A
//! crash between the two leaves a spec without an entry; the kubelet, which
//! got no answer, calls prepare again and it is rewritten, and a spec no entry
//! names is removed when the plugin starts ([`orphaned_specs`]). On
//! unprepare the entry goes first, then the spec, for the same reason.
//!
//! A checkpoint that cannot be read is never taken as empty: the kubelet
//! does not prepare again a claim it counts as prepared, so its spec must
//! stay while a container may still start with it. [`set_aside`] keeps the
//! unreadable file for a person and writes a new checkpoint that names every
//! spec present then as kept ([`Checkpoint::kept_specs`]): no start removes
//! those as orphans, however often the agent restarts, until the kubelet
//! unprepares each claim or a person deletes the spec.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cdi;

/// File name inside the plugin directory.
pub const FILE_NAME: &str = "checkpoint.json";
const VERSION: u32 = 1;
/// A checkpoint larger than this is not read: each prepared claim takes well
/// under a KiB, and a node has at most a few hundred.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;
/// What an unreadable checkpoint is renamed to (`.1`, `.2`, … when one is
/// there already).
pub const SET_ASIDE_SUFFIX: &str = "unreadable";

/// The fields of a checkpoint entry that this agent does not know, by name:
/// what a newer agent recorded (a layout device's partitions were such a
/// field once). An agent rolled back to an older version keeps them as they
/// are when it rewrites the file, so that the newer one, rolled forward
/// again, finds what it wrote for each claim still prepared; they go only
/// with their claim. A change that an older agent must not read as it
/// stands takes a new [`VERSION`] instead, which an older agent sets aside.
pub type Unknown = serde_json::Map<String, serde_json::Value>;

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
    /// A layout device's share ([`super::layouts`]): the partitions of its
    /// GPU it was given, by index. Left out otherwise, so that a checkpoint
    /// without layouts reads the same to an older agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<u32>,
    /// Fields a newer agent wrote that this one does not know, kept as they
    /// are (see [`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// A prepared claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    /// The claim's `metadata.generation` as read for the Prepare: the
    /// `observedGeneration` of its `status.devices` conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Fields a newer agent wrote that this one does not know ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// A claim by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimName {
    pub namespace: String,
    pub name: String,
}

/// What the file holds: prepared claims by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    pub prepared_claims: BTreeMap<String, PreparedClaim>,
    /// Claim UIDs whose specs were on the host when an unreadable
    /// checkpoint was set aside: what they hold is not known, so they are
    /// never orphans; unpreparing the claim removes it from here.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub kept_specs: BTreeSet<String>,
    /// Unprepared claims (by UID) whose `status.devices` entries are still
    /// to be removed: kept here so that a stop before the removal is made
    /// does not lose it; the status writer forgets each once made.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub status_removals: BTreeMap<String, ClaimName>,
    /// Fields a newer agent wrote that this one does not know ([`Unknown`]).
    #[serde(flatten)]
    pub unknown: Unknown,
}

/// Serialises every change of a checkpoint file in this process: the
/// preparer's and the status writer's.
pub(crate) static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Forgets the pending `status.devices` removals of `uids` (made, or no
/// longer possible) in the checkpoint at `path`. A failure is logged: the
/// removal is then made again after the next start, which is harmless.
pub async fn forget_status_removals(path: &Path, uids: &[String]) {
    if uids.is_empty() {
        return;
    }
    let _lock = LOCK.lock().await;
    let mut checkpoint = match Checkpoint::load(path) {
        Ok(checkpoint) => checkpoint,
        Err(e) => {
            tracing::warn!(error = %e, "cannot record the claims' status removals as made");
            return;
        }
    };
    let before = checkpoint.status_removals.len();
    checkpoint
        .status_removals
        .retain(|uid, _| !uids.contains(uid));
    if checkpoint.status_removals.len() != before
        && let Err(e) = checkpoint.save(path)
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the claims' status removals as made");
    }
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
        use std::io::Read;
        let io_error = |source| CheckpointError::Io {
            path: path.into(),
            source,
        };
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => return Err(io_error(source)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        let corrupt = |why: String| CheckpointError::Corrupt {
            path: path.into(),
            why,
        };
        if bytes.len() as u64 > MAX_BYTES {
            return Err(corrupt(format!("larger than {MAX_BYTES} bytes")));
        }
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

/// Our spec files in `cdi_dir` that neither a prepared claim nor the kept
/// set names: left by a crash between a spec write and its checkpoint entry.
pub fn orphaned_specs(cdi_dir: &Path, checkpoint: &Checkpoint) -> Vec<PathBuf> {
    our_specs(cdi_dir)
        .into_iter()
        .filter(|(uid, _)| {
            !checkpoint.prepared_claims.contains_key(uid) && !checkpoint.kept_specs.contains(uid)
        })
        .map(|(_, path)| path)
        .collect()
}

/// Our spec files in `cdi_dir`, by claim UID.
fn our_specs(cdi_dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(cdi_dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let uid = cdi::claim_of_spec_file(&name)?;
            Some((uid.to_owned(), e.path()))
        })
        .collect()
}

/// Sets an unreadable checkpoint at `path` aside: keeps it under a name of
/// its own beside it (returned), and replaces it with a checkpoint that
/// keeps every spec in `cdi_dir` (and the kept set of none). If any step
/// fails the unreadable file stays where it is, so that the next start finds
/// it unreadable again and still removes nothing.
pub fn set_aside(path: &Path, cdi_dir: &Path) -> io::Result<PathBuf> {
    let aside = (0..1000)
        .map(|n| {
            let suffix = if n == 0 {
                SET_ASIDE_SUFFIX.to_owned()
            } else {
                format!("{SET_ASIDE_SUFFIX}.{n}")
            };
            path.with_extension(format!("json.{suffix}"))
        })
        .find(|p| !p.exists())
        .ok_or_else(|| io::Error::other("1000 unreadable checkpoints are kept already"))?;
    // A second name for the same file: the checkpoint is never missing.
    std::fs::hard_link(path, &aside)?;
    let kept = Checkpoint {
        kept_specs: our_specs(cdi_dir).into_iter().map(|(uid, _)| uid).collect(),
        ..Checkpoint::default()
    };
    kept.save(path)?;
    Ok(aside)
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
                partitions: Vec::new(),
                unknown: Default::default(),
            }],
            generation: Some(4),
            unknown: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_pending_status_removal_is_kept_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut c = Checkpoint::default();
        for uid in ["u1", "u2"] {
            c.status_removals.insert(
                uid.into(),
                ClaimName {
                    namespace: "ns".into(),
                    name: format!("claim-{uid}"),
                },
            );
        }
        c.save(&path).unwrap();
        assert_eq!(Checkpoint::load(&path).unwrap().status_removals.len(), 2);
        forget_status_removals(&path, &["u1".into()]).await;
        let left: Vec<String> = Checkpoint::load(&path)
            .unwrap()
            .status_removals
            .into_keys()
            .collect();
        assert_eq!(left, ["u2"]);
        // A checkpoint written before these fields reads as none pending.
        std::fs::write(&path, r#"{"version":1,"preparedClaims":{}}"#).unwrap();
        assert!(Checkpoint::load(&path).unwrap().status_removals.is_empty());
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

    /// A rolled-back agent keeps what a newer one wrote: fields it does not
    /// know, at every level, survive its own changes to the file, and go
    /// only with the claim they belong to.
    #[test]
    fn fields_a_newer_agent_wrote_survive_an_older_agents_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let newer = serde_json::json!({
            "version": VERSION,
            "futureTop": {"a": 1},
            "preparedClaims": {
                "u1": {"namespace": "ns", "name": "c1", "futureClaim": "x",
                    "devices": [{"requestNames": ["gpu"], "poolName": "n",
                        "deviceName": "gpu-0-cpx-nps4", "cdiDeviceIds": ["k8s.gpu.amd.com/gpu=u1-gpu-0"],
                        "partitions": [3], "futureDevice": [7, 8]}]},
                "u2": {"namespace": "ns", "name": "c2", "futureClaim": "gone with u2",
                    "devices": []}
            }
        });
        std::fs::write(&path, serde_json::to_vec(&newer).unwrap()).unwrap();
        let mut c = Checkpoint::load(&path).unwrap();
        assert_eq!(c.prepared_claims["u1"].devices[0].partitions, [3]);
        // The older agent's own changes: one claim unprepared, one added.
        c.prepared_claims.remove("u2");
        c.prepared_claims.insert("u3".into(), claim());
        c.save(&path).unwrap();
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written["futureTop"], serde_json::json!({"a": 1}));
        let u1 = &written["preparedClaims"]["u1"];
        assert_eq!(u1["futureClaim"], "x");
        assert_eq!(u1["devices"][0]["futureDevice"], serde_json::json!([7, 8]));
        assert_eq!(u1["devices"][0]["partitions"], serde_json::json!([3]));
        assert!(written["preparedClaims"].get("u2").is_none());
        assert_eq!(
            written["preparedClaims"]["u3"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with("future"))
                .count(),
            0
        );
        assert_eq!(Checkpoint::load(&path).unwrap(), c);
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
        let spec = |uid: &str| cdi::spec_path(dir.path(), uid).unwrap();
        for uid in ["prepared", "lost", "kept"] {
            std::fs::write(spec(uid), "{}").unwrap();
        }
        std::fs::write(dir.path().join("other-vendor.json"), "{}").unwrap();
        let mut c = Checkpoint::default();
        c.prepared_claims.insert("prepared".into(), claim());
        c.kept_specs.insert("kept".into());
        assert_eq!(orphaned_specs(dir.path(), &c), vec![spec("lost")]);
    }

    #[test]
    fn an_oversized_checkpoint_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_BYTES + 1).unwrap();
        let e = Checkpoint::load(&path).unwrap_err();
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("larger than"), "{e}");
    }

    #[test]
    fn setting_aside_keeps_the_file_and_every_spec_through_later_starts() {
        let dir = tempfile::tempdir().unwrap();
        let cdi_dir = dir.path().join("cdi");
        std::fs::create_dir(&cdi_dir).unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{not json").unwrap();
        for uid in ["a", "b"] {
            std::fs::write(cdi::spec_path(&cdi_dir, uid).unwrap(), "{}").unwrap();
        }
        let aside = set_aside(&path, &cdi_dir).unwrap();
        assert_eq!(std::fs::read_to_string(&aside).unwrap(), "{not json");
        let now = Checkpoint::load(&path).unwrap();
        assert!(now.prepared_claims.is_empty());
        assert_eq!(now.kept_specs, BTreeSet::from(["a".into(), "b".into()]));
        // The next start reads the new file cleanly and finds no orphan.
        assert!(orphaned_specs(&cdi_dir, &now).is_empty());
        // Unreadable again: the first one set aside stays, beside the next.
        std::fs::write(&path, "{again").unwrap();
        let second = set_aside(&path, &cdi_dir).unwrap();
        assert_ne!(second, aside);
        assert_eq!(std::fs::read_to_string(&aside).unwrap(), "{not json");
    }
}
