//! CDI specs (Container Device Interface): one per prepared claim, which the
//! container runtime reads to add the claim's device nodes to its containers.
//!
//! The spec's content is decided here, purely. Files are written by
//! [`write_spec`] and removed by [`remove_spec`], both atomic and idempotent;
//! nothing else touches the CDI directory.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The CDI kind of our devices, the reference's: `k8s.gpu.amd.com/gpu`.
pub const KIND: &str = "k8s.gpu.amd.com/gpu";
/// The oldest CDI spec version that has everything the specs use (device
/// nodes with major, minor and permissions). Runtimes accept any version up
/// to the one they implement, so the oldest sufficient one reaches the most.
pub const CDI_VERSION: &str = "0.5.0";
/// The device nodes' access in the container: read, write, mknod, as the
/// reference grants.
const PERMISSIONS: &str = "rwm";

/// A character device and its numbers on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// One device of a claim: its DRA name and its DRM nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimDevice {
    pub name: String,
    pub nodes: Vec<DeviceNode>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    cdi_version: &'a str,
    kind: &'a str,
    devices: Vec<SpecDevice>,
    container_edits: Edits,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDevice {
    name: String,
    container_edits: Edits,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Edits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<Node>,
}

#[derive(Serialize)]
struct Node {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    major: u32,
    minor: u32,
    permissions: &'static str,
}

fn node(n: &DeviceNode) -> Node {
    Node {
        path: n.path.clone(),
        kind: "c",
        major: n.major,
        minor: n.minor,
        permissions: PERMISSIONS,
    }
}

/// The CDI name of one device of a claim: `<claim uid>-<device name>`.
pub fn cdi_device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified id the kubelet passes to the runtime.
pub fn cdi_device_id(claim_uid: &str, device: &str) -> String {
    format!("{KIND}={}", cdi_device_name(claim_uid, device))
}

/// The spec file of a claim, named as the CDI library names transient specs.
///
/// The UID comes from the kubelet's request: one that could name another
/// directory (`..`, `/`) or is not a UID at all is refused, so that nothing
/// outside `cdi_dir` is ever written or removed.
pub fn spec_path(cdi_dir: &Path, claim_uid: &str) -> Result<PathBuf, String> {
    claim_uid_problem(claim_uid).map_or_else(
        || Ok(cdi_dir.join(format!("k8s.gpu.amd.com-gpu_{claim_uid}.json"))),
        Err,
    )
}

/// The longest claim UID taken: API server UIDs are 36-character UUIDs.
const MAX_CLAIM_UID: usize = 128;

/// Why `uid` is not a claim UID, if it is not: letters, digits and `-`
/// only (the API server's UIDs are UUIDs), at most [`MAX_CLAIM_UID`].
pub fn claim_uid_problem(uid: &str) -> Option<String> {
    let valid = !uid.is_empty()
        && uid.len() <= MAX_CLAIM_UID
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    (!valid).then(|| format!("claim UID {uid:?} is not a UID (letters, digits and -)"))
}

/// The claim uid of one of our spec files, from its file name.
pub fn claim_of_spec_file(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix("k8s.gpu.amd.com-gpu_")?
        .strip_suffix(".json")
}

/// The spec of one claim. `/dev/kfd` is a claim-wide edit, so a container
/// given several of the claim's GPUs gets it once; each device adds its own
/// DRM nodes. The environment names the node and driver, as the reference's
/// common device does.
pub fn claim_spec(
    claim_uid: &str,
    kfd: &DeviceNode,
    devices: &[ClaimDevice],
    node_name: &str,
) -> String {
    let spec = Spec {
        cdi_version: CDI_VERSION,
        kind: KIND,
        devices: devices
            .iter()
            .map(|d| SpecDevice {
                name: cdi_device_name(claim_uid, &d.name),
                container_edits: Edits {
                    env: Vec::new(),
                    device_nodes: d.nodes.iter().map(node).collect(),
                },
            })
            .collect(),
        container_edits: Edits {
            env: vec![
                format!("KUBERNETES_NODE_NAME={node_name}"),
                format!("DRA_RESOURCE_DRIVER_NAME={}", super::DRIVER_NAME),
            ],
            device_nodes: vec![node(kfd)],
        },
    };
    // Serialising plain strings and numbers cannot fail.
    serde_json::to_string_pretty(&spec).unwrap_or_default() + "\n"
}

/// Writes `contents` to `path` unless it already holds exactly that: a temp
/// file in the same directory, synced, then renamed over, so a reader (the
/// runtime) sees the old spec or the new one, never half. Returns whether it
/// wrote.
pub fn write_spec(path: &Path, contents: &str) -> io::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == contents.as_bytes()) {
        return Ok(false);
    }
    write_atomically(path, contents.as_bytes())?;
    Ok(true)
}

/// Removes a spec; a missing one is already removed.
pub fn remove_spec(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Replaces `path` with `bytes` through a synced temp file and a rename, then
/// syncs the directory so the rename survives a crash.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))?;
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> String {
        let kfd = DeviceNode {
            path: "/dev/kfd".into(),
            major: 235,
            minor: 0,
        };
        let devices = [ClaimDevice {
            name: "gpu-1-128".into(),
            nodes: vec![
                DeviceNode {
                    path: "/dev/dri/card1".into(),
                    major: 226,
                    minor: 1,
                },
                DeviceNode {
                    path: "/dev/dri/renderD128".into(),
                    major: 226,
                    minor: 128,
                },
            ],
        }];
        claim_spec("uid-1", &kfd, &devices, "node-a")
    }

    #[test]
    fn a_claim_spec_names_its_devices_and_their_numbers() {
        let v: serde_json::Value = serde_json::from_str(&spec()).unwrap();
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["cdiVersion"], CDI_VERSION);
        assert_eq!(v["devices"][0]["name"], "uid-1-gpu-1-128");
        let nodes = &v["devices"][0]["containerEdits"]["deviceNodes"];
        assert_eq!(nodes[1]["path"], "/dev/dri/renderD128");
        assert_eq!(nodes[1]["major"], 226);
        assert_eq!(nodes[1]["minor"], 128);
        assert_eq!(nodes[1]["type"], "c");
        assert_eq!(v["containerEdits"]["deviceNodes"][0]["path"], "/dev/kfd");
        assert_eq!(v["containerEdits"]["deviceNodes"][0]["major"], 235);
        assert_eq!(
            cdi_device_id("uid-1", "gpu-1-128"),
            "k8s.gpu.amd.com/gpu=uid-1-gpu-1-128"
        );
    }

    #[test]
    fn a_claim_uid_that_could_leave_the_cdi_directory_has_no_spec_path() {
        let dir = Path::new("/var/run/cdi");
        assert_eq!(
            spec_path(dir, "7c0b0d0e-1a2b-4c3d-8e9f-000000000001"),
            Ok(dir.join("k8s.gpu.amd.com-gpu_7c0b0d0e-1a2b-4c3d-8e9f-000000000001.json"))
        );
        for bad in ["", "../etc", "a/b", "..", "a.b", "u\0", &"a".repeat(129)] {
            assert!(spec_path(dir, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn writing_the_same_spec_twice_writes_once_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = spec_path(dir.path(), "uid-1").unwrap();
        assert!(write_spec(&path, &spec()).unwrap());
        assert!(!write_spec(&path, &spec()).unwrap());
        assert_eq!(
            claim_of_spec_file(path.file_name().unwrap().to_str().unwrap()),
            Some("uid-1")
        );
        remove_spec(&path).unwrap();
        remove_spec(&path).unwrap();
        assert!(!path.exists());
        // No temp file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
