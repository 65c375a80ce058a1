//! Who holds amdgpu: what must be gone before the module may be unloaded.
//! The module's use count and the modules that depend on it
//! (`/sys/module/amdgpu/{refcnt,holders/}`), and every process with
//! `/dev/kfd` or a `/dev/dri/*` node open, found from `/proc/<pid>/fd`, with
//! its command and, when its cgroup names one, its pod's UID.
//!
//! The agent itself never opens a device node (it only checks that they
//! exist), so it is never among the holders; if it were, the scan would
//! name it like any other process. Seeing the host's processes needs the
//! host's `/proc` under the host root (hostPID or a mount).
//!
//! [`pod_uid_of_cgroup`] and [`is_gpu_device`] are pure; [`in_use`] reads,
//! through the bounded reader, in a few batches. This module must not
//! unload anything or signal a process.

use std::time::Duration;

use serde::Serialize;

use crate::host::reader::{Answer, BoundedReader, Op, Requests};

/// How long each file of the scan may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(2);
/// Paths per batch: a host with thousands of processes has hundreds of
/// thousands of descriptors.
const BATCH: usize = 512;

/// A process holding a GPU device node open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub pid: u32,
    /// `/proc/<pid>/comm`.
    pub command: String,
    /// The UID of the pod it runs in, from its cgroup path, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The device nodes it holds, e.g. `/dev/kfd`.
    pub devices: Vec<String>,
}

/// What holds amdgpu now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InUse {
    /// `refcnt`, when it could be read.
    pub refcnt: Option<u32>,
    /// Modules that depend on amdgpu (`holders/`).
    pub modules: Vec<String>,
    pub processes: Vec<Holder>,
    /// Files that could not be read: with them unread, nothing is known to
    /// be free.
    pub unknown: Vec<String>,
}

impl InUse {
    /// Nothing holds the module: it may be unloaded.
    pub fn is_free(&self) -> bool {
        self.refcnt == Some(0)
            && self.modules.is_empty()
            && self.processes.is_empty()
            && self.unknown.is_empty()
    }

    /// The holders, for a person.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for p in &self.processes {
            let pod = p
                .pod_uid
                .as_deref()
                .map(|uid| format!(", pod {uid}"))
                .unwrap_or_default();
            parts.push(format!(
                "pid {} ({}{pod}) holds {}",
                p.pid,
                p.command,
                p.devices.join(", ")
            ));
        }
        if !self.modules.is_empty() {
            parts.push(format!("modules {} use it", self.modules.join(", ")));
        }
        match self.refcnt {
            Some(0) => {}
            Some(n) => parts.push(format!("its use count is {n}")),
            None => parts.push("its use count cannot be read".to_owned()),
        }
        if !self.unknown.is_empty() {
            parts.push(format!("cannot read {}", self.unknown.join(", ")));
        }
        parts.join("; ")
    }
}

/// Whether an open file is a GPU device node a workload uses. Pure.
pub fn is_gpu_device(target: &str) -> bool {
    target == "/dev/kfd" || target.starts_with("/dev/dri/")
}

/// The pod UID in a `/proc/<pid>/cgroup` text, as the kubelet names pod
/// cgroups: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid>.slice`
/// (systemd, with `_` for `-`). Pure.
pub fn pod_uid_of_cgroup(text: &str) -> Option<String> {
    text.lines()
        .flat_map(|line| line.rsplit(':').next().unwrap_or("").split('/'))
        .find_map(|part| {
            // The last "pod": "kubepods" itself has one.
            let at = part.rfind("pod")?;
            let uid = part[at + 3..].trim_end_matches(".slice").replace('_', "-");
            let looks_like_uid = uid.len() >= 8
                && uid.contains('-')
                && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            looks_like_uid.then_some(uid)
        })
}

/// What one read gave: its answer, nothing (the file is gone: a process
/// that exited holds nothing), or that it could not be read.
enum Read {
    Got(Answer),
    Gone,
    Unread,
}

async fn batched(reader: &BoundedReader, requests: Vec<(Op, String)>) -> Vec<Read> {
    let mut answers = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(BATCH) {
        let chunk: Requests = chunk.iter().cloned().collect();
        answers.extend(reader.batch(chunk, FILE_TIMEOUT).await.into_iter().map(
            |answer| match answer {
                Ok(answer) => Read::Got(answer),
                Err(e) if e.is_not_found() => Read::Gone,
                Err(_) => Read::Unread,
            },
        ));
    }
    answers
}

/// Reads what holds amdgpu on the host `reader` reads.
pub async fn in_use(reader: &BoundedReader) -> InUse {
    let module = super::report::MODULE_DIR;
    let mut found = InUse::default();
    let fixed = batched(
        reader,
        vec![
            (Op::Read, format!("{module}/refcnt")),
            (Op::List, format!("{module}/holders")),
            (Op::List, "/proc".to_owned()),
        ],
    )
    .await;
    let mut fixed = fixed.into_iter();
    match fixed.next() {
        Some(Read::Got(Answer::Text(text))) => found.refcnt = text.trim().parse().ok(),
        _ => found.unknown.push(format!("{module}/refcnt")),
    }
    match fixed.next() {
        Some(Read::Got(Answer::Names(names))) => found.modules = names,
        _ => found.unknown.push(format!("{module}/holders")),
    }
    let pids: Vec<u32> = match fixed.next() {
        Some(Read::Got(Answer::Names(names))) => {
            names.iter().filter_map(|n| n.parse().ok()).collect()
        }
        _ => {
            found.unknown.push("/proc".to_owned());
            Vec::new()
        }
    };
    // A process that exits meanwhile has no fd directory any more: it holds
    // nothing. One whose descriptors cannot be read might hold the GPU.
    let mut unread: Vec<String> = Vec::new();
    let fd_dirs = batched(
        reader,
        pids.iter()
            .map(|pid| (Op::List, format!("/proc/{pid}/fd")))
            .collect(),
    )
    .await;
    let links: Vec<(u32, String)> = pids
        .iter()
        .zip(fd_dirs)
        .flat_map(|(pid, fds)| match fds {
            Read::Got(Answer::Names(fds)) => fds
                .into_iter()
                .map(|fd| (*pid, format!("/proc/{pid}/fd/{fd}")))
                .collect(),
            Read::Gone => Vec::new(),
            _ => {
                unread.push(format!("/proc/{pid}/fd"));
                Vec::new()
            }
        })
        .collect();
    let targets = batched(
        reader,
        links.iter().map(|(_, l)| (Op::Link, l.clone())).collect(),
    )
    .await;
    let mut holding: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for ((pid, link), target) in links.iter().zip(targets) {
        let target = match target {
            Read::Got(Answer::Text(target)) => target,
            Read::Gone => continue,
            _ => {
                unread.push(link.clone());
                continue;
            }
        };
        if is_gpu_device(&target) {
            let devices = holding.entry(*pid).or_default();
            if !devices.contains(&target) {
                devices.push(target);
            }
        }
    }
    let about = batched(
        reader,
        holding
            .keys()
            .flat_map(|pid| {
                [
                    (Op::Read, format!("/proc/{pid}/comm")),
                    (Op::Read, format!("/proc/{pid}/cgroup")),
                ]
            })
            .collect(),
    )
    .await;
    for ((pid, devices), about) in holding.into_iter().zip(about.chunks(2)) {
        let text = |i: usize| match about.get(i) {
            Some(Read::Got(Answer::Text(text))) => Some(text.clone()),
            _ => None,
        };
        found.processes.push(Holder {
            pid,
            command: text(0).unwrap_or_else(|| "?".to_owned()),
            pod_uid: text(1).as_deref().and_then(pod_uid_of_cgroup),
            devices,
        });
    }
    // A few names say enough; a host that denies them all would list
    // thousands.
    let more = unread.len().saturating_sub(8);
    unread.truncate(8);
    if more > 0 {
        unread.push(format!("{more} more"));
    }
    found.unknown.extend(unread);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoot;

    #[test]
    fn pod_uids_come_from_either_cgroup_driver() {
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/\
            kubepods-burstable-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-1.scope\n";
        assert_eq!(
            pod_uid_of_cgroup(systemd).as_deref(),
            Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
        );
        let cgroupfs =
            "12:devices:/kubepods/besteffort/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789/abc\n";
        assert_eq!(
            pod_uid_of_cgroup(cgroupfs).as_deref(),
            Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
        );
        assert_eq!(pod_uid_of_cgroup("0::/user.slice/session-3.scope\n"), None);
        assert!(is_gpu_device("/dev/kfd") && is_gpu_device("/dev/dri/renderD128"));
        assert!(!is_gpu_device("/dev/null") && !is_gpu_device("/dev/kfd2"));
    }

    #[tokio::test]
    async fn processes_with_gpu_nodes_open_are_named_with_their_pod() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/sys/module/amdgpu/refcnt", "2\n").unwrap();
        host.create_dir_all("/sys/module/amdgpu/holders").unwrap();
        host.write("/proc/4242/comm", "python3\n").unwrap();
        host.write(
            "/proc/4242/cgroup",
            "0::/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/c\n",
        )
        .unwrap();
        host.symlink("/dev/kfd", "/proc/4242/fd/3").unwrap();
        host.symlink("/dev/dri/renderD128", "/proc/4242/fd/4")
            .unwrap();
        host.symlink("/dev/kfd", "/proc/4242/fd/5").unwrap();
        host.symlink("/dev/null", "/proc/77/fd/0").unwrap();
        host.write("/proc/77/comm", "sshd\n").unwrap();
        let reader = BoundedReader::new(host.clone(), 2);
        let found = in_use(&reader).await;
        assert_eq!(found.refcnt, Some(2));
        assert_eq!(
            found.processes,
            [Holder {
                pid: 4242,
                command: "python3".into(),
                pod_uid: Some("11111111-2222-3333-4444-555555555555".into()),
                devices: vec!["/dev/kfd".into(), "/dev/dri/renderD128".into()],
            }]
        );
        assert!(!found.is_free());
        let said = found.describe();
        assert!(
            said.contains("pid 4242 (python3, pod 11111111-")
                && said.contains("/dev/kfd")
                && said.contains("use count is 2"),
            "{said}"
        );
        // Gone: free.
        host.remove_all("/proc/4242").unwrap();
        host.write("/sys/module/amdgpu/refcnt", "0\n").unwrap();
        let found = in_use(&reader).await;
        assert!(found.is_free(), "{found:?}");
        // A descriptor that cannot be read might be the GPU: not free.
        host.write("/proc/99/fd/0", "not a link").unwrap();
        let found = in_use(&reader).await;
        assert_eq!(found.unknown, ["/proc/99/fd/0"]);
        assert!(!found.is_free());
        assert!(found.describe().contains("cannot read /proc/99/fd/0"));
    }
}
