//! The deployment files against the code they deploy: deploy/*.yaml (Namespace,
//! RBAC, DaemonSet, the DeviceConfig installed with them) and systemd/.
//!
//! Static checks parse every manifest into its k8s-openapi type and hold it to
//! what the code needs: the environment the CLI reads, the host paths discovery
//! reads, the metrics port, and RBAC rules that are exactly the table below of
//! API calls the code makes (with file:line references). The kustomize base
//! (deploy/Kustomization) must build exactly the plain manifests, and the
//! example overlay (overlays/example) valid objects. End-to-end checks run
//! against the API emulator: `kubectl apply -f` and `kubectl apply -k` of
//! deploy/ as deploy/README.md says, and the real binary started with the
//! DaemonSet's arguments and environment, whose every API request must be
//! allowed by the RBAC.
//!
//! `.ci/check-manifests` covers the rest: kubernetes-validate, yamllint and
//! systemd-analyze.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::CommandFactory;
use gpu_operator::api::{DocumentKind, document_problems, ignored_fields, parse_documents};
use gpu_operator::host::HostRoot;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube_emulator::{Emulator, EmulatorConfig};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::cluster::TestCluster;

const NAMESPACE: &str = "kube-amd-gpu";
/// Namespaces that exist in every cluster before anything is applied.
const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];
/// kubectl: `$KUBECTL`, else /usr/bin/kubectl.
fn kubectl_path() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(Into::into)
        .unwrap_or_else(|| "/usr/bin/kubectl".into())
}
/// The entrypoint of the image (Dockerfile).
const IMAGE_ENTRYPOINT: &str = "/usr/local/bin/gpu-operator";
/// Idle resident memory the agent is sized for (README, Performance).
const IDLE_RSS_TARGET_MIB: u64 = 25;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One document of a manifest file.
#[derive(Clone, Debug)]
struct Manifest {
    file: String,
    doc: Value,
}

impl Manifest {
    fn kind(&self) -> &str {
        self.doc["kind"].as_str().unwrap_or("")
    }
    fn name(&self) -> &str {
        self.doc["metadata"]["name"].as_str().unwrap_or("")
    }
    fn namespace(&self) -> Option<&str> {
        self.doc["metadata"]["namespace"].as_str()
    }
}

/// Every document of deploy/*.yaml, in the order `kubectl apply -f deploy/`
/// applies them: files in lexical order, documents in file order.
fn manifests() -> Vec<Manifest> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy"))
        .expect("deploy/ is readable")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/");
    let mut all = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("manifest is readable");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        let file = format!("deploy/{}", path.file_name().unwrap().to_string_lossy());
        all.extend(
            docs.into_iter()
                .filter(|d| !d.is_null())
                .map(|doc| Manifest {
                    file: file.clone(),
                    doc,
                }),
        );
    }
    all
}

/// Parses a document as `T` and requires that writing it back gives the same
/// JSON: a field k8s-openapi does not know (a typo, a field at the wrong
/// level) would be dropped and show up here.
fn typed<T: DeserializeOwned + Serialize>(m: &Manifest) -> T {
    let object: T = serde_json::from_value(m.doc.clone())
        .unwrap_or_else(|e| panic!("{} {} in {}: {e}", m.kind(), m.name(), m.file));
    let back = serde_json::to_value(&object).expect("serialises");
    assert_eq!(
        back,
        m.doc,
        "{} {} in {} does not round-trip through k8s-openapi (unknown or misplaced field?)",
        m.kind(),
        m.name(),
        m.file
    );
    object
}

fn only<'a>(all: &'a [Manifest], kind: &str) -> Vec<&'a Manifest> {
    all.iter().filter(|m| m.kind() == kind).collect()
}

fn the<'a>(all: &'a [Manifest], kind: &str) -> &'a Manifest {
    let found = only(all, kind);
    assert_eq!(found.len(), 1, "expected exactly one {kind} in deploy/");
    found[0]
}

fn daemonset() -> (DaemonSet, PodSpec, Container) {
    let all = manifests();
    let ds: DaemonSet = typed(the(&all, "DaemonSet"));
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod template spec");
    assert_eq!(pod.containers.len(), 1, "one container: the agent");
    let container = pod.containers[0].clone();
    (ds, pod, container)
}

fn env_map(container: &Container) -> BTreeMap<String, k8s_openapi::api::core::v1::EnvVar> {
    container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), e))
        .collect()
}

fn env_value(container: &Container, name: &str) -> String {
    env_map(container)
        .get(name)
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| panic!("the DaemonSet sets {name} to a plain value"))
}

fn field_ref(container: &Container, name: &str) -> Option<String> {
    env_map(container)
        .get(name)?
        .value_from
        .as_ref()?
        .field_ref
        .as_ref()
        .map(|f| f.field_path.clone())
}

// ---------------------------------------------------------------------------
// Kinds, apply order, namespaces

#[test]
fn every_manifest_is_a_known_kind_and_round_trips() {
    let all = manifests();
    for m in &all {
        match m.kind() {
            "Namespace" => drop(typed::<Namespace>(m)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(m)),
            "ClusterRole" => drop(typed::<ClusterRole>(m)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(m)),
            "Role" => drop(typed::<Role>(m)),
            "RoleBinding" => drop(typed::<RoleBinding>(m)),
            "DaemonSet" => drop(typed::<DaemonSet>(m)),
            // Its CEL is tested in tests/admission_policy.rs.
            "ValidatingAdmissionPolicy" => drop(typed::<ValidatingAdmissionPolicy>(m)),
            "ValidatingAdmissionPolicyBinding" => {
                drop(typed::<ValidatingAdmissionPolicyBinding>(m))
            }
            "NetworkPolicy" => drop(typed::<NetworkPolicy>(m)),
            // Its profiles are checked against the built-in ones in their own test.
            "ConfigMap" => drop(typed::<k8s_openapi::api::core::v1::ConfigMap>(m)),
            // The leader Lease the admission policy reads, held by nobody
            // (checked in tests/admission_policy.rs).
            "Lease" => drop(typed::<k8s_openapi::api::coordination::v1::Lease>(m)),
            // Checked with the DeviceConfig rules in its own test.
            "DeviceConfig" => {}
            other => panic!("{}: kind {other:?} has no check here; add one", m.file),
        }
    }
}

#[test]
fn apply_order_creates_what_each_object_needs_first() {
    let all = manifests();
    let mut namespaces: BTreeSet<String> =
        BUILTIN_NAMESPACES.iter().map(|s| s.to_string()).collect();
    let mut service_accounts = BTreeSet::new();
    let mut saw_daemonset = false;
    for m in &all {
        if let Some(ns) = m.namespace() {
            assert!(
                namespaces.contains(ns),
                "{} {} ({}) is applied before its namespace {ns} exists",
                m.kind(),
                m.name(),
                m.file
            );
        }
        match m.kind() {
            "Namespace" => {
                namespaces.insert(m.name().to_owned());
            }
            "ServiceAccount" => {
                service_accounts
                    .insert((m.namespace().unwrap_or("").to_owned(), m.name().to_owned()));
            }
            "DaemonSet" => {
                let ds: DaemonSet = typed(m);
                let sa = ds
                    .spec
                    .unwrap()
                    .template
                    .spec
                    .unwrap()
                    .service_account_name
                    .unwrap_or_default();
                assert!(
                    service_accounts
                        .contains(&(m.namespace().unwrap_or("").to_owned(), sa.clone())),
                    "the DaemonSet's ServiceAccount {sa:?} must be applied before it"
                );
                saw_daemonset = true;
            }
            "DeviceConfig" => assert!(
                saw_daemonset,
                "the DeviceConfig comes after the agents that act on it"
            ),
            _ => {}
        }
    }
    assert!(
        namespaces.contains(NAMESPACE),
        "deploy/ creates {NAMESPACE}"
    );
}

#[test]
fn namespaced_objects_live_in_the_operator_namespace() {
    for m in manifests() {
        let Some(ns) = m.namespace() else { continue };
        // The only exception: Events about Nodes are written to "default".
        let allowed = ns == NAMESPACE
            || (ns == "default"
                && matches!(m.kind(), "Role" | "RoleBinding")
                && m.name() == "gpu-operator-node-events");
        assert!(allowed, "{} {} is in namespace {ns}", m.kind(), m.name());
    }
}

// ---------------------------------------------------------------------------
// The DaemonSet

#[test]
fn daemonset_environment_is_what_the_cli_reads() {
    let (ds, _, container) = daemonset();
    let namespace = ds.metadata.namespace.clone().unwrap_or_default();
    assert_eq!(namespace, NAMESPACE);

    // Downward API: who and where the agent is.
    assert_eq!(
        field_ref(&container, "NODE_NAME").as_deref(),
        Some("spec.nodeName")
    );
    assert_eq!(
        field_ref(&container, "POD_NAME").as_deref(),
        Some("metadata.name")
    );
    assert_eq!(
        field_ref(&container, "POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
    // DeviceConfigs are followed in every namespace (10-rbac.yaml binds
    // gpu-operator-deviceconfigs cluster-wide): no WATCH_NAMESPACE.
    assert!(
        !env_map(&container).contains_key("WATCH_NAMESPACE"),
        "the DaemonSet restricts the agents to one namespace, and 10-rbac.yaml grants every namespace"
    );
    assert_eq!(env_value(&container, "GPU_OPERATOR_HOST_ROOT"), "/host");

    // Every variable the DaemonSet sets is one the CLI reads for `agent`, so a
    // renamed flag cannot leave the DaemonSet silently setting nothing.
    let cli = gpu_operator::cli::Cli::command();
    let agent = cli
        .find_subcommand("agent")
        .expect("the CLI has an agent subcommand");
    let read: BTreeSet<String> = cli
        .get_arguments()
        .chain(agent.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for name in env_map(&container).keys() {
        assert!(
            read.contains(name),
            "the DaemonSet sets {name}, which `gpu-operator agent` does not read (it reads {read:?})"
        );
    }
    assert_eq!(container.args.as_deref(), Some(&["agent".to_owned()][..]));
    assert!(
        container.command.is_none(),
        "the image's entrypoint ({IMAGE_ENTRYPOINT}) runs the binary"
    );
}

#[test]
fn daemonset_image_matches_the_crate_version() {
    let (_, _, container) = daemonset();
    let image = container.image.expect("an image");
    // name:tag, or name:tag@sha256:<64 hex> once pinned (deploy/README.md).
    let (reference, digest) = image.split_once('@').unwrap_or((&image, ""));
    if !digest.is_empty() {
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        assert!(
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "image {image}: the digest must be sha256:<64 hex digits>"
        );
    }
    let tag = reference.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    assert_eq!(
        tag,
        env!("CARGO_PKG_VERSION"),
        "image {image} should be tagged with the crate version"
    );
}

/// Every file under `dir`, recursively.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A hostPath volume as mounted into the agent container.
#[derive(Debug)]
struct HostMount {
    host_path: String,
    mount_path: String,
    read_only: bool,
    recursive_read_only: Option<String>,
    propagation: Option<String>,
}

fn host_mounts(pod: &PodSpec, container: &Container) -> Vec<HostMount> {
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| Some((v.name, v.host_path?.path)))
        .collect();
    container
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| {
            Some(HostMount {
                host_path: volumes.get(&m.name)?.clone(),
                mount_path: m.mount_path,
                read_only: m.read_only.unwrap_or(false),
                recursive_read_only: m.recursive_read_only,
                propagation: m.mount_propagation,
            })
        })
        .collect()
}

/// Where the host file `host_path` appears in the container, if a mount shows it.
fn mounted_at<'a>(mounts: &'a [HostMount], host_path: &str) -> Option<(&'a HostMount, PathBuf)> {
    mounts.iter().find_map(|m| {
        let rest = Path::new(host_path).strip_prefix(&m.host_path).ok()?;
        Some((m, Path::new(&m.mount_path).join(rest)))
    })
}

#[test]
fn daemonset_mounts_exactly_the_host_paths_the_code_uses() {
    let (_, pod, container) = daemonset();
    let mounts = host_mounts(&pod, &container);
    let host = HostRoot::new(env_value(&container, "GPU_OPERATOR_HOST_ROOT"));
    let kubelet_dir = PathBuf::from(env_value(&container, "KUBELET_DIR"));

    // (host path, where the code looks for it in the container, written?)
    let mut needed: Vec<(String, PathBuf, bool, &str)> = Vec::new();
    // The host tree the agent reads through its host root: exactly what
    // `gpu-operator simulate` writes for a host (sysfs and devfs).
    let sim = tempfile::tempdir().unwrap();
    let sim_host = HostRoot::new(sim.path());
    gpu_operator::simulate::write_host(
        &sim_host,
        &gpu_operator::simulate::SimSpec::new("mi300x", None, None).unwrap(),
    )
    .unwrap();
    for entry in std::fs::read_dir(sim.path()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            let mut top = format!("/{}", entry.file_name().to_string_lossy());
            // Of /proc the code reads only /proc/sys/kernel (the driver
            // report's osrelease and boot id), and only that is mounted.
            if top == "/proc" {
                let kernel = sim.path().join("proc/sys/kernel");
                let outside: Vec<_> = walk_files(&entry.path())
                    .into_iter()
                    .filter(|f| !f.starts_with(&kernel))
                    .collect();
                assert!(outside.is_empty(), "/proc beyond sys/kernel: {outside:?}");
                top = "/proc/sys/kernel".into();
            }
            needed.push((
                top.clone(),
                host.path(&top),
                false,
                "discovery, health, metrics",
            ));
        }
    }
    assert!(
        needed.iter().any(|(p, ..)| p == "/sys") && needed.iter().any(|(p, ..)| p == "/dev"),
        "a simulated host has sysfs and devfs: {needed:?}"
    );
    // Test runner logs: the runner writes to logsLocation.hostPath as a local
    // path (src/testrunner/mod.rs TestRunnerConfig::for_spec).
    let runner = gpu_operator::testrunner::TestRunnerConfig::for_spec(
        &gpu_operator::api::TestRunnerSpec::default(),
        host.clone(),
        "node",
        None,
    );
    needed.push((
        gpu_operator::api::DEFAULT_TEST_RUNNER_LOGS.to_owned(),
        runner.logs_dir,
        true,
        "test runner logs",
    ));
    // The reference exporter's health socket (src/metricssvc/), which AMD's
    // device plugin dials on the host: a host path, so under the host root;
    // the agent creates the socket in its directory.
    let health_socket = Path::new(gpu_operator::metricssvc::DEFAULT_SOCKET)
        .parent()
        .unwrap();
    needed.push((
        health_socket.display().to_string(),
        host.path(health_socket),
        true,
        "the reference exporter's health socket",
    ));
    // The kubelet's directories, at their default host paths, found through
    // KUBELET_DIR the way the agent derives them (src/agent/select.rs,
    // src/pod_resources/mod.rs socket).
    needed.push((
        gpu_operator::plugin::PluginConfig::DEFAULT_DIR.to_owned(),
        kubelet_dir.join("device-plugins"),
        true,
        "device plugin sockets",
    ));
    let pod_resources = gpu_operator::pod_resources::socket("", &kubelet_dir);
    needed.push((
        gpu_operator::api::DEFAULT_POD_RESOURCES_PATH.to_owned(),
        pod_resources.parent().unwrap().to_path_buf(),
        false,
        "kubelet PodResources socket",
    ));
    // The DRA plugin's registration socket and its own directory (DRA socket,
    // checkpoint), under the kubelet's default root on the host and under
    // KUBELET_DIR in the container (src/dra/service.rs DraConfig). The kubelet
    // dials the DRA socket at the path the plugin registers, so the two must
    // be the same path.
    let kubelet_root = Path::new(gpu_operator::plugin::PluginConfig::DEFAULT_DIR)
        .parent()
        .unwrap();
    let dra_host = gpu_operator::dra::DraConfig::new(kubelet_root, host.clone(), "node");
    let dra = gpu_operator::dra::DraConfig::new(&kubelet_dir, host.clone(), "node");
    assert_eq!(dra.dra_socket(), dra_host.dra_socket());
    needed.push((
        dra_host
            .registration_socket()
            .parent()
            .unwrap()
            .display()
            .to_string(),
        dra.registration_socket().parent().unwrap().to_path_buf(),
        true,
        "DRA registration socket",
    ));
    needed.push((
        dra_host.plugin_dir().display().to_string(),
        dra.plugin_dir(),
        true,
        "DRA socket and checkpoint",
    ));
    // CDI specs: written to CDI_DIR as a path of the container (not under the
    // host root), for the runtime, which reads the host's /var/run/cdi.
    needed.push((
        gpu_operator::dra::DraConfig::DEFAULT_CDI_DIR.to_owned(),
        PathBuf::from(env_value(&container, "CDI_DIR")),
        true,
        "CDI specs of prepared claims",
    ));

    for (host_path, expected, writes, why) in &needed {
        let (mount, seen_at) = mounted_at(&mounts, host_path)
            .unwrap_or_else(|| panic!("{host_path} ({why}) is not mounted: {mounts:?}"));
        assert_eq!(
            &seen_at,
            expected,
            "{host_path} ({why}) is mounted at {}, the code looks at {}",
            seen_at.display(),
            expected.display()
        );
        if *writes {
            assert!(
                !mount.read_only,
                "{host_path} ({why}) is written, so not read-only"
            );
        }
    }
    // Nothing else from the host: each hostPath volume serves a need above.
    for m in &mounts {
        assert!(
            needed
                .iter()
                .any(|(p, ..)| Path::new(p).starts_with(&m.host_path)),
            "hostPath {} is mounted but nothing in the table needs it",
            m.host_path
        );
        let written = needed
            .iter()
            .any(|(p, _, w, _)| *w && Path::new(p).starts_with(&m.host_path));
        assert!(
            m.read_only || written,
            "hostPath {} is writable but only read",
            m.host_path
        );
        // Read-only all the way down: a plain read-only bind of /sys or /dev
        // leaves cgroupfs and /dev/shm writable. recursiveReadOnly needs
        // readOnly and no propagation.
        if m.read_only {
            assert_eq!(
                m.recursive_read_only.as_deref(),
                Some("Enabled"),
                "hostPath {} is read-only but not recursively",
                m.host_path
            );
            assert!(
                m.propagation.as_deref().is_none_or(|p| p == "None"),
                "hostPath {}: recursiveReadOnly needs mountPropagation None",
                m.host_path
            );
        }
    }
    // Exactly these are writable, each for a reason in 20-daemonset.yaml.
    let writable: BTreeSet<&str> = mounts
        .iter()
        .filter(|m| !m.read_only)
        .map(|m| m.host_path.as_str())
        .collect();
    assert_eq!(
        writable,
        BTreeSet::from([
            gpu_operator::api::DEFAULT_TEST_RUNNER_LOGS,
            gpu_operator::plugin::PluginConfig::DEFAULT_DIR,
            "/var/lib/kubelet/plugins_registry",
            // gpu.amd.com's own directory, not the kubelet's plugins/ with
            // other drivers' sockets.
            "/var/lib/kubelet/plugins/gpu.amd.com",
            gpu_operator::dra::DraConfig::DEFAULT_CDI_DIR,
            "/var/lib/amd-metrics-exporter",
        ])
    );
    // The test runner's logs may go only under /var/log/, which the logs
    // mount is under.
    assert!(
        gpu_operator::api::DEFAULT_TEST_RUNNER_LOGS
            .starts_with(gpu_operator::api::validate::TEST_LOGS_PREFIX)
    );
}

/// The opt-in patch for driver management.
const DRIVER_PATCH: &str = "deploy/patches/driver-management.yaml";

/// What a DaemonSet with the driver-management patch must grant: the
/// capabilities and host PIDs that loading, holder checks and reboots need,
/// and each host path the driver code reads or writes mounted where the code
/// looks for it (writable where it writes); with everything of the
/// DaemonSet's own least privilege still in place.
fn check_driver_management_rights(ds: &DaemonSet) {
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod template spec");
    let container = pod.containers[0].clone();
    assert_eq!(pod.host_pid, Some(true), "reboots enter PID 1's namespace");
    let sc = container.security_context.clone().expect("securityContext");
    let caps = sc.capabilities.clone().expect("capabilities");
    assert_eq!(
        caps.drop,
        Some(vec!["ALL".to_owned()]),
        "still drops all first"
    );
    let added: BTreeSet<String> = caps.add.unwrap_or_default().into_iter().collect();
    assert_eq!(
        added,
        ["SYS_MODULE", "SYS_PTRACE", "SYS_ADMIN", "SYS_CHROOT"]
            .map(str::to_owned)
            .into(),
        "exactly what loading, the holder check and the reboot need"
    );
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let host = HostRoot::new(env_value(&container, "GPU_OPERATOR_HOST_ROOT"));
    let mounts = host_mounts(&pod, &container);
    for (host_path, writes, why) in [
        (
            gpu_operator::driver::load::FIRMWARE_PATH_PARAM,
            true,
            "firmware search path",
        ),
        (
            gpu_operator::driver::blacklist::BLACKLIST_FILE,
            true,
            "amdgpu blacklist",
        ),
        (
            &*format!(
                "{}/6.4.1-6.8.0-49-generic/manifest.json",
                gpu_operator::driver::preflight::DEFAULT_STORE
            ),
            false,
            "the bundle store",
        ),
        ("/proc/4242/fd", false, "the holder check"),
        (
            "/proc/sys/kernel/random/boot_id",
            false,
            "the driver report",
        ),
    ] {
        let (mount, seen_at) = mounts
            .iter()
            .filter(|m| Path::new(host_path).starts_with(&m.host_path))
            // The most specific mount shows the path.
            .max_by_key(|m| m.host_path.len())
            .map(|m| {
                let rest = Path::new(host_path).strip_prefix(&m.host_path).unwrap();
                (m, Path::new(&m.mount_path).join(rest))
            })
            .unwrap_or_else(|| panic!("{host_path} ({why}) is not mounted: {mounts:?}"));
        assert_eq!(seen_at, host.path(host_path), "{host_path} ({why})");
        assert_eq!(
            !mount.read_only, writes,
            "{host_path} ({why}) writable: {writes}"
        );
    }
    // The DaemonSet's own mounts are all still there.
    let (_, base_pod, base_container) = daemonset();
    for base in host_mounts(&base_pod, &base_container) {
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == base.mount_path && m.read_only == base.read_only),
            "{} lost or changed by the patch",
            base.mount_path
        );
    }
}

#[tokio::test]
async fn the_driver_management_patch_grants_what_loading_and_rebooting_need() {
    let patched = patched_daemonset(DRIVER_PATCH).await;
    check_driver_management_rights(&patched);
}

/// Applies the strategic merge patch `file` of deploy/patches/ to the
/// shipped DaemonSet, in the emulator, as `kubectl patch --patch-file` does.
async fn patched_daemonset(file: &str) -> DaemonSet {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    emu.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        .unwrap();
    let all = manifests();
    emu.create(the(&all, "DaemonSet").doc.clone()).unwrap();
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let patch: Value = serde_saphyr::from_str(&text).expect("the patch is YAML");
    let daemonsets: Api<DaemonSet> = Api::namespaced(emu.client(), NAMESPACE);
    daemonsets
        .patch(
            "gpu-operator",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
        .expect("the patch applies")
}

/// The GPU tests patch gives the agent what RVS and AGFHC need, at the
/// paths the agent's tool flags default to: the tools (read-only), the
/// device nodes, a writable place for results; and the pod stays valid
/// (privileged goes with allowPrivilegeEscalation, which the API server
/// requires) with its own mounts unchanged.
#[tokio::test]
async fn the_gpu_tests_patch_gives_the_tools_and_the_devices_the_tests_need() {
    let patched = patched_daemonset("deploy/patches/gpu-tests.yaml").await;
    let pod = patched
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod template spec");
    let container = pod.containers[0].clone();
    let sc = container.security_context.clone().expect("securityContext");
    assert_eq!(
        sc.privileged,
        Some(true),
        "tests open /dev/kfd and /dev/dri"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(true),
        "the API server refuses privileged without it"
    );
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let mounts = host_mounts(&pod, &container);
    let defaults = gpu_operator::testrunner::Commands::default();
    for (host_path, writes, why) in [
        (
            defaults.rvs.to_str().unwrap(),
            false,
            "the rvs binary (--rvs)",
        ),
        (
            &*format!("{}/gst_single.conf", defaults.rvs_conf_dir.display()),
            false,
            "RVS recipes (--rvs-conf-dir)",
        ),
        (defaults.agfhc.to_str().unwrap(), false, "AGFHC (--agfhc)"),
        ("/dev/kfd", true, "the GPUs' compute device node"),
        ("/dev/dri/renderD128", true, "a GPU's render node"),
    ] {
        // The tools open these at their own paths (the agent's /host/dev
        // view of /dev stays as it was).
        let mount = mounts
            .iter()
            .filter(|m| Path::new(host_path).starts_with(&m.host_path))
            .find(|m| {
                let rest = Path::new(host_path).strip_prefix(&m.host_path).unwrap();
                Path::new(&m.mount_path).join(rest) == Path::new(host_path)
            })
            .unwrap_or_else(|| {
                panic!("{host_path} ({why}) is not mounted at {host_path}: {mounts:?}")
            });
        assert_eq!(
            !mount.read_only, writes,
            "{host_path} ({why}) writable: {writes}"
        );
    }
    // Results go to /var/tmp, which is writable on the read-only root.
    let results = container
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| Path::new(&defaults.rvs_results_dir).starts_with(&m.mount_path))
        .expect("a mount for the results directory");
    assert_ne!(results.read_only, Some(true));
    assert!(
        pod.volumes
            .unwrap_or_default()
            .iter()
            .any(|v| v.name == results.name && v.empty_dir.is_some()),
        "results go to an emptyDir, not the host"
    );
    let (_, base_pod, base_container) = daemonset();
    for base in host_mounts(&base_pod, &base_container) {
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == base.mount_path && m.read_only == base.read_only),
            "{} lost or changed by the patch",
            base.mount_path
        );
    }
}

/// The reference's default-dcm-config ships with the manifests, with the
/// profiles the agents use when it is absent: one set of profiles.
#[test]
fn the_default_dcm_config_holds_the_built_in_profiles() {
    let all = manifests();
    let cm = all
        .iter()
        .find(|m| m.doc["kind"] == "ConfigMap" && m.doc["metadata"]["name"] == "default-dcm-config")
        .expect("deploy/27-default-dcm-config.yaml");
    assert_eq!(
        cm.doc["metadata"]["name"],
        gpu_operator::partition::profiles::DEFAULT_CONFIGMAP
    );
    let text = cm.doc["data"]["config.json"].as_str().unwrap();
    let shipped = gpu_operator::partition::ProfileSet::parse(text).unwrap();
    assert_eq!(shipped, gpu_operator::partition::ProfileSet::builtin());
    // The reference's six, the heterogeneous example among them.
    for name in [
        "default",
        "cpx_nps1_all",
        "cpx_nps4_all",
        "dpx_nps2_all",
        "qpx_nps1_all",
        "heterogeneous_example",
    ] {
        assert!(shipped.profiles.contains_key(name), "{name}");
    }
}

#[test]
fn daemonset_runs_unprivileged_with_a_read_only_root() {
    let (_, pod, container) = daemonset();
    assert_ne!(pod.host_network, Some(true));
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
    let sc = container
        .security_context
        .expect("a container securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    assert!(
        caps.add.unwrap_or_default().is_empty(),
        "no capability is needed yet"
    );
    assert_eq!(
        sc.seccomp_profile.map(|p| p.type_).as_deref(),
        Some("RuntimeDefault")
    );
}

#[test]
fn daemonset_schedules_on_gpu_nodes_first_and_stops_cleanly() {
    let (ds, pod, _) = daemonset();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // The agent force-exits 5 s after SIGTERM (src/cli/runtime.rs shutdown_on_signals).
    assert!(pod.termination_grace_period_seconds.unwrap_or(30) >= 10);
    let strategy = ds
        .spec
        .as_ref()
        .unwrap()
        .update_strategy
        .clone()
        .expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.expect("rollingUpdate");
    assert_eq!(
        rolling.max_surge,
        Some(IntOrString::Int(0)),
        "two agents on one node would both register the device plugin"
    );
    let tolerations = pod.tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("amd.com/gpu")
                && t.operator.as_deref() == Some("Exists")
                && t.effect.is_none()),
        "tolerates amd.com/gpu taints of any value and effect: {tolerations:?}"
    );
    // Selector and template labels agree, and carry the label the leader's
    // metrics Service selects.
    let spec = ds.spec.unwrap();
    let selector = spec.selector.match_labels.unwrap_or_default();
    let labels = spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default();
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "template lacks selector label {k}");
    }
    let (key, value) = gpu_operator::cluster::resources::AGENT_POD_LABEL;
    assert_eq!(labels.get(key).map(String::as_str), Some(value));
}

/// Does the DaemonSet's required node affinity accept a node with `labels`?
fn affinity_accepts(pod: &PodSpec, labels: &BTreeMap<String, String>) -> bool {
    let Some(required) = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    required.node_selector_terms.iter().any(|term| {
        term.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => panic!("operator {other} not modelled here"),
            }
        }) && term.match_fields.is_none()
    })
}

#[test]
fn daemonset_targets_nfd_gpu_labels() {
    let (_, pod, _) = daemonset();
    let node = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(affinity_accepts(
        &pod,
        &node(&[("feature.node.kubernetes.io/amd-gpu", "true")])
    ));
    assert!(affinity_accepts(
        &pod,
        &node(&[("feature.node.kubernetes.io/amd-vgpu", "true")])
    ));
    assert!(!affinity_accepts(
        &pod,
        &node(&[("kubernetes.io/os", "linux")])
    ));
    assert!(!affinity_accepts(
        &pod,
        &node(&[("feature.node.kubernetes.io/amd-gpu", "false")])
    ));
}

fn port_number(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

#[test]
fn daemonset_probes_the_metrics_endpoint() {
    let (_, _, container) = daemonset();
    let metrics_port = i32::from(gpu_operator::metrics::MetricsConfig::DEFAULT_PORT);
    assert!(
        container
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == metrics_port),
        "the container declares the metrics port {metrics_port}"
    );
    for (probe, path) in [
        (container.liveness_probe.as_ref(), "/healthz"),
        (container.readiness_probe.as_ref(), "/readyz"),
    ] {
        let get = probe
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("an HTTP probe on {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(port_number(&container, &get.port), metrics_port);
    }
    // The DeviceConfig installed alongside serves metrics on that same port.
    let config = deployed_device_config();
    assert!(config.spec.metrics_exporter.is_enabled());
    assert_eq!(config.spec.metrics_exporter.port, metrics_port);
}

#[test]
fn network_policy_admits_only_the_monitoring_namespace_to_the_metrics_port() {
    let all = manifests();
    let policy: NetworkPolicy = typed(the(&all, "NetworkPolicy"));
    let spec = policy.spec.unwrap();
    // It selects the agent pods: the labels of the DaemonSet's pod template.
    let (ds, _, _) = daemonset();
    let template_labels = ds
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap_or_default();
    let selector = spec.pod_selector.unwrap_or_default();
    assert!(selector.match_expressions.is_none());
    let wanted = selector.match_labels.unwrap_or_default();
    assert!(!wanted.is_empty(), "an empty podSelector selects every pod");
    for (k, v) in &wanted {
        assert_eq!(template_labels.get(k), Some(v), "podSelector {k}={v}");
    }
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let ingress = spec.ingress.unwrap_or_default();
    assert_eq!(ingress.len(), 1, "one rule: Prometheus to the metrics port");
    let rule = &ingress[0];
    let ports = rule.ports.clone().unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(
        ports[0].port,
        Some(IntOrString::Int(i32::from(
            gpu_operator::metrics::MetricsConfig::DEFAULT_PORT
        )))
    );
    let from = rule.from.clone().unwrap_or_default();
    assert_eq!(from.len(), 1, "from the monitoring namespace only");
    assert!(from[0].pod_selector.is_none() && from[0].ip_block.is_none());
    let namespaces = from[0].namespace_selector.clone().unwrap_or_default();
    let expressions = namespaces.match_expressions.unwrap_or_default();
    assert_eq!(expressions.len(), 1);
    assert_eq!(expressions[0].key, "kubernetes.io/metadata.name");
    assert_eq!(expressions[0].operator, "In");
    assert_eq!(expressions[0].values, Some(vec!["monitoring".to_owned()]));
}

/// `32Mi`, `128Mi`, `1Gi`, plain bytes.
fn mebibytes(q: &str) -> u64 {
    let (n, unit) = q
        .find(|c: char| !c.is_ascii_digit())
        .map_or((q, ""), |i| q.split_at(i));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("quantity {q}"));
    match unit {
        "Mi" => n,
        "Gi" => n * 1024,
        "Ki" => n / 1024,
        "" => n >> 20,
        other => panic!("unit {other} not modelled here"),
    }
}

#[test]
fn daemonset_resources_cover_the_idle_footprint() {
    let (_, _, container) = daemonset();
    let resources = container.resources.expect("resources");
    let requests = resources.requests.expect("requests");
    let limits = resources.limits.expect("limits");
    let request = mebibytes(&requests["memory"].0);
    let limit = mebibytes(&limits["memory"].0);
    assert!(
        request >= IDLE_RSS_TARGET_MIB,
        "request {request} Mi below the idle footprint"
    );
    assert!(
        limit >= 4 * request,
        "limit {limit} Mi leaves too little room above {request} Mi"
    );
    assert!(requests.contains_key("cpu"));
    assert!(
        !limits.contains_key("cpu"),
        "no CPU limit: throttling would delay kubelet gRPC answers and lease renewals"
    );
}

// ---------------------------------------------------------------------------
// RBAC

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// Cluster-scoped resources, or namespaced ones across all namespaces.
    Cluster,
    Namespace(&'static str),
}

/// One API call the code makes.
#[derive(Clone, Debug)]
struct Need {
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    scope: Scope,
    /// The only object it is made on, when the code names one.
    name: Option<&'static str>,
}

const fn need(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    scope: Scope,
) -> Need {
    Need {
        group,
        resource,
        verb,
        scope,
        name: None,
    }
}

const fn named(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    scope: Scope,
    name: &'static str,
) -> Need {
    Need {
        group,
        resource,
        verb,
        scope,
        name: Some(name),
    }
}

const OPERATOR_NS: Scope = Scope::Namespace(NAMESPACE);
/// SeriesRecorder (src/events.rs) writes Events about cluster-scoped objects (Nodes)
/// to "default" (NODE_EVENT_NAMESPACE).
const NODE_EVENTS_NS: Scope = Scope::Namespace("default");
const LEASE: &str = gpu_operator::cluster::lease::DEFAULT_LEASE_NAME;
/// The DRA driver's name, which is also its DeviceClass's.
const DRA_DRIVER: &str = gpu_operator::dra::DRIVER_NAME;

/// What the code does in the API. Keep in step with deploy/10-rbac.yaml: the
/// RBAC tests fail both when a need is not granted and when a grant is not
/// needed, and the end-to-end agent test fails when the agent makes a request
/// this table does not list.
#[rustfmt::skip]
const NEEDS: &[Need] = &[
    // Nodes. get: NodeWriter::read (src/node_writer.rs) reads the Node before
    // each write, to decide what its concern must change.
    need("", "nodes", "get", Scope::Cluster),
    // list, watch: spawn_node_watch (src/agent/mod.rs) watches its own Node by
    // field selector; reconcile_until_cancelled (src/cluster/mod.rs) reflects
    // every Node for the leader.
    need("", "nodes", "list", Scope::Cluster),
    need("", "nodes", "watch", Scope::Cluster),
    // patch: NodeWriter (src/node_writer.rs), for every concern's writes to the
    // agent's own Node: labeller, agent status, health labels, test runner.
    need("", "nodes", "patch", Scope::Cluster),
    // The AMDGPUUnhealthy condition (NodeWriter::apply_status).
    need("", "nodes/status", "patch", Scope::Cluster),
    // Pods. list, watch: PodMetadataWatch (src/metrics/pod_metadata.rs), the
    // metadata of the agent's own node's Pods by field selector, for
    // POD_UUID and ExtraPodLabels.
    need("", "pods", "list", Scope::Cluster),
    need("", "pods", "watch", Scope::Cluster),
    // DeviceConfigs, in every namespace (ClusterRole
    // gpu-operator-deviceconfigs, bound cluster-wide; WATCH_NAMESPACE
    // narrows both the code and that binding to one). list, watch:
    // spawn_config_reflector (src/agent/mod.rs); the leader's Controller in
    // reconcile_until_cancelled (src/cluster/mod.rs).
    need("amd.com", "deviceconfigs", "list", Scope::Cluster),
    need("amd.com", "deviceconfigs", "watch", Scope::Cluster),
    // patch: patch_finalizers (src/cluster/reconcile.rs), on whatever the
    // Controller sees; deploy/15-admission-policy.yaml narrows it to the
    // Lease holder's own finalizer (tests/admission_policy.rs).
    need("amd.com", "deviceconfigs", "patch", Scope::Cluster),
    // Status: reconcile (src/cluster/reconcile.rs).
    need("amd.com", "deviceconfigs/status", "patch", Scope::Cluster),
    // Leader election in POD_NAMESPACE (src/cluster/lease.rs): write_lease
    // creates and updates, campaign gets after a conflict and lists+watches by
    // field selector, release updates.
    need( "coordination.k8s.io", "leases", "create", OPERATOR_NS),
    named("coordination.k8s.io", "leases", "get",    OPERATOR_NS, LEASE),
    named("coordination.k8s.io", "leases", "list",   OPERATOR_NS, LEASE),
    named("coordination.k8s.io", "leases", "watch",  OPERATOR_NS, LEASE),
    named("coordination.k8s.io", "leases", "update", OPERATOR_NS, LEASE),
    // ConfigMaps a DeviceConfig names, in its namespace (any):
    // missing_references (src/cluster/reconcile.rs) checks they exist;
    // ConfigMapFollower (src/agent/configmaps.rs) watches the exporter, test
    // runner and partition ones. The remediation mapping: mapping_of
    // (src/cluster/remediator.rs).
    need("", "configmaps", "get", Scope::Cluster),
    need("", "configmaps", "list", Scope::Cluster),
    need("", "configmaps", "watch", Scope::Cluster),
    // The RemediationWorkflowStatus "default" of the DeviceConfig's
    // namespace (any): sync_runs (src/cluster/remediator.rs) reads it,
    // creates it when missing, and writes its status.
    need( "amd.com", "remediationworkflowstatuses", "create", Scope::Cluster),
    named("amd.com", "remediationworkflowstatuses", "get", Scope::Cluster, "default"),
    named("amd.com", "remediationworkflowstatuses/status", "patch", Scope::Cluster, "default"),
    // No Secrets: missing_references looks them up only with
    // --check-secret-references and deploy/optional/secret-references.yaml.
    // The metrics Service of every DeviceConfig, wherever it lives, is kept
    // in the agents' namespace (owned_namespace, src/cluster/resources.rs):
    // server-side apply in apply_owned (src/cluster/reconcile.rs; authorized
    // as patch, and as create when the object is new); delete in apply_owned
    // and tear_down.
    need("", "services", "create", OPERATOR_NS),
    need("", "services", "patch", OPERATOR_NS),
    need("", "services", "delete", OPERATOR_NS),
    // list, watch: the leader's Controller owns() them (reconcile_until_cancelled).
    need("", "services", "list", OPERATOR_NS),
    need("", "services", "watch", OPERATOR_NS),
    // The ServiceMonitor, likewise.
    need("monitoring.coreos.com", "servicemonitors", "create", OPERATOR_NS),
    need("monitoring.coreos.com", "servicemonitors", "patch", OPERATOR_NS),
    need("monitoring.coreos.com", "servicemonitors", "delete", OPERATOR_NS),
    // With metricsExporter.rbacConfig: bearer tokens are reviewed, and the
    // request authorized, by the agent serving /metrics
    // (src/metrics/access.rs). Both reviews are cluster-scoped.
    need("authentication.k8s.io", "tokenreviews", "create", Scope::Cluster),
    need("authorization.k8s.io", "subjectaccessreviews", "create", Scope::Cluster),
    // DRA: each agent's kubelet plugin keeps its own node's ResourceSlices
    // (publish_slices, src/dra/service.rs). list, watch: the watch of the
    // node's slices, by field selector spec.nodeName,spec.driver (and the
    // list on stop before it first listed). patch, create: server-side
    // apply in SlicePublisher::sync (create when the slice is new). delete:
    // stale slices, and the node's all on teardown (delete). Any slice as far
    // as RBAC goes; deploy/15-admission-policy.yaml keeps each agent to its
    // own node's of driver gpu.amd.com (tests/admission_policy.rs).
    need("resource.k8s.io", "resourceslices", "list", Scope::Cluster),
    need("resource.k8s.io", "resourceslices", "watch", Scope::Cluster),
    need("resource.k8s.io", "resourceslices", "create", Scope::Cluster),
    need("resource.k8s.io", "resourceslices", "patch", Scope::Cluster),
    need("resource.k8s.io", "resourceslices", "delete", Scope::Cluster),
    // get: read_claim (src/dra/prepare.rs), each claim the kubelet asks the
    // plugin to prepare, in the claim's namespace (any).
    need("resource.k8s.io", "resourceclaims", "get", Scope::Cluster),
    // patch: each prepared device's status.devices entry, by server-side
    // apply on the status subresource (src/dra/claim_status.rs); the
    // admission policy keeps each agent to its own node's claims.
    need("resource.k8s.io", "resourceclaims/status", "patch", Scope::Cluster),
    // The same write, as 1.36+ servers authorize a change of status.devices:
    // per driver, only on claims allocated on the caller's node.
    named("resource.k8s.io", "resourceclaims/driver", "associated-node:patch", Scope::Cluster, DRA_DRIVER),
    // The leader's DeviceClasses (sync_device_class in
    // src/cluster/reconcile.rs): all listed first, each server-side applied
    // (create when new), deleted with the last DeviceConfig enabling DRA or
    // the last node of its layout. gpu.amd.com here, each layout's in
    // needs().
    need( "resource.k8s.io", "deviceclasses", "list",   Scope::Cluster),
    need( "resource.k8s.io", "deviceclasses", "create", Scope::Cluster),
    named("resource.k8s.io", "deviceclasses", "patch",  Scope::Cluster, DRA_DRIVER),
    named("resource.k8s.io", "deviceclasses", "delete", Scope::Cluster, DRA_DRIVER),
    // Events: SeriesRecorder (src/events.rs) creates, then patches a repeating series.
    // About DeviceConfigs (Context::event, src/cluster/reconcile.rs) in their
    // namespace (any); about Nodes (EventSink in src/events.rs, for the agent's
    // warnings and NodeHealthPublisher in src/health/node.rs) in "default".
    need("events.k8s.io", "events", "create", Scope::Cluster),
    need("events.k8s.io", "events", "patch", Scope::Cluster),
    need("events.k8s.io", "events", "create", NODE_EVENTS_NS),
    need("events.k8s.io", "events", "patch", NODE_EVENTS_NS),
    // Test results: labelled core/v1 Events about the Node, in "default"
    // (EventSink::record, src/events.rs; made in src/testrunner/kube.rs).
    need("", "events", "create", NODE_EVENTS_NS),
];

/// [`NEEDS`], and the patch and delete of amd-gpu.gpu.amd.com and each
/// per-layout DeviceClass the leader may make (`LAYOUT_CLASS_NAMES`,
/// src/cluster/device_classes.rs).
fn needs() -> Vec<Need> {
    let layouts = gpu_operator::cluster::device_classes::LAYOUT_CLASS_NAMES
        .iter()
        .chain([&gpu_operator::cluster::resources::EXTENDED_RESOURCE_CLASS])
        .flat_map(|&name| {
            ["patch", "delete"].map(|verb| {
                named(
                    "resource.k8s.io",
                    "deviceclasses",
                    verb,
                    Scope::Cluster,
                    name,
                )
            })
        });
    NEEDS.iter().cloned().chain(layouts).collect()
}

/// A rule in force for the agent's ServiceAccount, and where: `None` for
/// cluster-wide (a ClusterRoleBinding), else the RoleBinding's namespace.
#[derive(Debug)]
struct Grant {
    namespace: Option<String>,
    rule: PolicyRule,
    from: String,
}

/// The rules bound to the DaemonSet's ServiceAccount, with their scope.
fn grants() -> Vec<Grant> {
    let all = manifests();
    let (ds, pod, _) = daemonset();
    let sa_name = pod.service_account_name.expect("serviceAccountName");
    let sa_ns = ds.metadata.namespace.expect("namespace");
    let is_agent = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        let subjects = subjects.clone().unwrap_or_default();
        assert!(!subjects.is_empty(), "a binding without subjects");
        for s in &subjects {
            assert!(
                s.kind == "ServiceAccount"
                    && s.name == sa_name
                    && s.namespace.as_deref() == Some(sa_ns.as_str()),
                "bindings are for the agent's ServiceAccount only, not {s:?}"
            );
        }
        true
    };
    let cluster_roles: BTreeMap<String, ClusterRole> = only(&all, "ClusterRole")
        .into_iter()
        .map(|m| (m.name().to_owned(), typed(m)))
        .collect();
    let roles: BTreeMap<(String, String), Role> = only(&all, "Role")
        .into_iter()
        .map(|m| {
            (
                (m.namespace().unwrap().to_owned(), m.name().to_owned()),
                typed(m),
            )
        })
        .collect();
    let mut grants = Vec::new();
    for m in only(&all, "ClusterRoleBinding") {
        let b: ClusterRoleBinding = typed(m);
        assert!(is_agent(&b.subjects));
        assert_eq!(b.role_ref.kind, "ClusterRole");
        let role = cluster_roles
            .get(&b.role_ref.name)
            .unwrap_or_else(|| panic!("ClusterRole {} is not in deploy/", b.role_ref.name));
        for rule in role.rules.clone().unwrap_or_default() {
            grants.push(Grant {
                namespace: None,
                rule,
                from: format!("ClusterRole {}", b.role_ref.name),
            });
        }
    }
    for m in only(&all, "RoleBinding") {
        let b: RoleBinding = typed(m);
        assert!(is_agent(&b.subjects));
        let ns = m
            .namespace()
            .expect("a RoleBinding has a namespace")
            .to_owned();
        let rules = match b.role_ref.kind.as_str() {
            "Role" => roles
                .get(&(ns.clone(), b.role_ref.name.clone()))
                .unwrap_or_else(|| panic!("Role {}/{} is not in deploy/", ns, b.role_ref.name))
                .rules
                .clone(),
            "ClusterRole" => cluster_roles[&b.role_ref.name].rules.clone(),
            other => panic!("roleRef kind {other}"),
        };
        for rule in rules.unwrap_or_default() {
            grants.push(Grant {
                namespace: Some(ns.clone()),
                rule,
                from: format!("{} {}/{}", b.role_ref.kind, ns, b.role_ref.name),
            });
        }
    }
    grants
}

fn rule_allows(
    rule: &PolicyRule,
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let has = |list: &Option<Vec<String>>, item: &str| {
        list.iter().flatten().any(|x| x == item || x == "*")
    };
    let names = rule.resource_names.clone().unwrap_or_default();
    has(&rule.api_groups, group)
        && has(&rule.resources, resource)
        && rule.verbs.iter().any(|v| v == verb || v == "*")
        // create is never limited by name (the name is in the body).
        && (names.is_empty() || (verb != "create" && name.is_some_and(|n| names.iter().any(|x| x == n))))
}

fn allowed(grants: &[Grant], need: &Need) -> bool {
    grants.iter().any(|g| {
        let in_scope = match (&g.namespace, need.scope) {
            (None, _) => true,
            (Some(a), Scope::Namespace(b)) => a == b,
            (Some(_), Scope::Cluster) => false,
        };
        in_scope && rule_allows(&g.rule, need.group, need.resource, need.verb, need.name)
    })
}

/// What the leader's drains do in the API beyond deploy/10-rbac.yaml, which
/// deploy/optional/driver-upgrades.yaml grants: evictions (remove in
/// src/cluster/drain.rs), deletions under podDeletionPolicy (the same), and
/// the DRA claims that make a pod a GPU pod (gpu_claims). Listing the node's
/// pods is the base grant's.
#[rustfmt::skip]
const DRAIN_NEEDS: &[Need] = &[
    need("", "pods/eviction", "create", Scope::Cluster),
    need("", "pods", "delete", Scope::Cluster),
    need("resource.k8s.io", "resourceclaims", "list", Scope::Cluster),
];

#[test]
fn the_driver_upgrades_role_grants_exactly_what_drains_need() {
    let text =
        std::fs::read_to_string(repo().join("deploy/optional/driver-upgrades.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let role: ClusterRole = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "ClusterRole")
            .cloned()
            .unwrap(),
    )
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "ClusterRoleBinding")
            .cloned()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subjects = binding.subjects.unwrap_or_default();
    assert!(
        subjects.len() == 1
            && subjects[0].name == "gpu-operator"
            && subjects[0].namespace.as_deref() == Some(NAMESPACE),
        "bound to the agents' ServiceAccount only: {subjects:?}"
    );
    let granted: Vec<Grant> = role
        .rules
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|rule| Grant {
            namespace: None,
            rule,
            from: "ClusterRole gpu-operator-driver-upgrades".into(),
        })
        .collect();
    for need in DRAIN_NEEDS {
        assert!(allowed(&granted, need), "{need:?} is not granted");
    }
    for g in &granted {
        for group in g.rule.api_groups.iter().flatten() {
            for resource in g.rule.resources.iter().flatten() {
                for verb in &g.rule.verbs {
                    assert!(
                        DRAIN_NEEDS
                            .iter()
                            .any(|n| n.group == group && n.resource == resource && n.verb == verb),
                        "{verb} {group}/{resource} is granted but no drain needs it"
                    );
                }
            }
        }
    }
    // What the base RBAC grants, it does not grant again; and the base
    // grants none of these: drains stay opt-in.
    let base = grants();
    for need in DRAIN_NEEDS {
        assert!(!allowed(&base, need), "deploy/10-rbac.yaml grants {need:?}");
    }
}

#[test]
fn rbac_grants_every_call_the_code_makes() {
    let grants = grants();
    let needs = needs();
    let missing: Vec<&Need> = needs.iter().filter(|n| !allowed(&grants, n)).collect();
    assert!(
        missing.is_empty(),
        "deploy/10-rbac.yaml does not allow: {missing:#?}"
    );
}

#[test]
fn rbac_grants_nothing_the_code_does_not_need() {
    let needs = needs();
    for g in grants() {
        let r = &g.rule;
        let names = r.resource_names.clone().unwrap_or_default();
        assert!(
            r.non_resource_urls.is_none(),
            "{}: non-resource URLs are not needed",
            g.from
        );
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    assert!(
                        ![group, resource, verb].contains(&&"*".to_owned()),
                        "{}: no wildcards",
                        g.from
                    );
                    let serves: Vec<&Need> = needs
                        .iter()
                        .filter(|n| n.group == group && n.resource == resource && n.verb == verb)
                        .filter(|n| match (&g.namespace, n.scope) {
                            (None, scope) => scope == Scope::Cluster,
                            (Some(a), Scope::Namespace(b)) => a == b,
                            (Some(_), Scope::Cluster) => false,
                        })
                        .collect();
                    assert!(
                        !serves.is_empty(),
                        "{} grants {verb} {resource} ({group:?}) in {}, which nothing in the table needs there",
                        g.from,
                        g.namespace.as_deref().unwrap_or("every namespace")
                    );
                    if names.is_empty() && verb != "create" {
                        assert!(
                            serves.iter().any(|n| n.name.is_none()),
                            "{} grants {verb} {resource} on every object, but the code only uses {:?}: add resourceNames",
                            g.from,
                            serves.iter().map(|n| n.name).collect::<Vec<_>>()
                        );
                    }
                    for name in &names {
                        assert!(
                            serves.iter().any(|n| n.name == Some(name.as_str())),
                            "{} names {name}, which the code does not use for {verb} {resource}",
                            g.from
                        );
                    }
                }
            }
        }
    }
}

/// The rights that follow DeviceConfigs into their namespace: what the
/// agents and the leader do in each namespace whose DeviceConfigs they
/// follow. All of them, and nothing else, are in ClusterRole
/// gpu-operator-deviceconfigs, so that following one namespace only
/// (deploy/README.md: WATCH_NAMESPACE, and a RoleBinding of that
/// ClusterRole there instead of its ClusterRoleBinding) keeps every call
/// there and grants none elsewhere.
const DEVICE_CONFIG_NAMESPACE_RESOURCES: &[(&str, &str)] = &[
    ("amd.com", "deviceconfigs"),
    ("amd.com", "deviceconfigs/status"),
    ("", "configmaps"),
    ("amd.com", "remediationworkflowstatuses"),
    ("amd.com", "remediationworkflowstatuses/status"),
    ("events.k8s.io", "events"),
];

#[test]
fn following_one_namespace_only_keeps_every_call_there_and_grants_none_elsewhere() {
    const ROLE: &str = "ClusterRole gpu-operator-deviceconfigs";
    let follows = |n: &Need| {
        DEVICE_CONFIG_NAMESPACE_RESOURCES.contains(&(n.group, n.resource))
            && n.scope == Scope::Cluster
    };
    let all = needs();
    let needs: Vec<&Need> = all.iter().filter(|n| follows(n)).collect();
    assert!(needs.len() >= 10, "{needs:?}");
    // The default: every namespace, through the ClusterRoleBinding.
    let all = grants();
    assert!(
        all.iter().any(|g| g.from == ROLE && g.namespace.is_none()),
        "deploy/10-rbac.yaml binds {ROLE} cluster-wide by default"
    );
    // The role holds these rights and no other: nothing cluster-scoped,
    // which a RoleBinding could not grant.
    for g in all.iter().filter(|g| g.from == ROLE) {
        for group in g.rule.api_groups.iter().flatten() {
            for resource in g.rule.resources.iter().flatten() {
                assert!(
                    DEVICE_CONFIG_NAMESPACE_RESOURCES
                        .contains(&(group.as_str(), resource.as_str())),
                    "{ROLE} grants {group}/{resource}, which does not follow DeviceConfigs"
                );
            }
        }
    }
    // Bound in team-a alone: every such call is allowed there, none in team-b.
    let one: Vec<Grant> = all
        .into_iter()
        .map(|mut g| {
            if g.from == ROLE {
                g.namespace = Some("team-a".into());
            }
            g
        })
        .collect();
    for need in needs {
        let there = Need {
            scope: Scope::Namespace("team-a"),
            ..*need
        };
        let elsewhere = Need {
            scope: Scope::Namespace("team-b"),
            ..*need
        };
        assert!(allowed(&one, &there), "not allowed in team-a: {need:?}");
        assert!(
            !allowed(&one, &elsewhere),
            "still allowed in team-b by another rule: {need:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// DeviceConfigs: the one installed with deploy/, and the standalone config

fn deployed_device_config() -> gpu_operator::api::DeviceConfig {
    let all = manifests();
    let m = the(&all, "DeviceConfig");
    let text = std::fs::read_to_string(repo().join(&m.file)).unwrap();
    let docs = parse_documents(&text).expect("parses");
    let mut configs = Vec::new();
    for doc in &docs {
        let problems = document_problems(doc);
        assert!(problems.is_empty(), "{}: {problems:?}", m.file);
        if let DocumentKind::DeviceConfig { config, .. } = &doc.kind {
            configs.push((**config).clone());
        }
    }
    assert_eq!(configs.len(), 1);
    configs.remove(0)
}

#[test]
fn deployed_device_config_is_valid_and_selects_the_agents_nodes() {
    let config = deployed_device_config();
    assert!(
        ignored_fields(&config.spec).is_empty(),
        "the installed example sets only fields that have an effect: {:?}",
        ignored_fields(&config.spec)
    );
    assert_eq!(
        config.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "the installed DeviceConfig lives beside the agents, as the reference's does"
    );
    // Nothing to install: driver management needs privileges the DaemonSet
    // does not have yet.
    assert!(!config.spec.is_enabled(gpu_operator::api::Operand::Driver));
    // The section is written, so the plugin runs: an absent one would be off.
    assert!(
        config
            .spec
            .is_enabled(gpu_operator::api::Operand::DevicePlugin)
    );
    // A node that carries exactly what the DeviceConfig selects gets an agent.
    let (_, pod, _) = daemonset();
    let labels: BTreeMap<String, String> = config.spec.selector.clone().into_iter().collect();
    assert!(
        !labels.is_empty(),
        "the example selects GPU nodes, not every node"
    );
    assert!(
        affinity_accepts(&pod, &labels),
        "nodes the DeviceConfig selects ({labels:?}) must run an agent"
    );
}

#[test]
fn standalone_config_is_a_valid_device_config() {
    let text = std::fs::read_to_string(repo().join("systemd/config.yaml")).unwrap();
    // Standalone mode reads DeviceConfig documents only (crates/api/src/yaml.rs).
    let configs = gpu_operator::api::parse_device_configs(&text).expect("parses as DeviceConfigs");
    assert_eq!(configs.len(), 1);
    for doc in parse_documents(&text).unwrap() {
        assert_eq!(document_problems(&doc), Vec::new());
    }
    let spec = &configs[0].spec;
    assert!(spec.metrics_exporter.is_enabled());
    assert!(
        ignored_fields(spec).is_empty(),
        "{:?}",
        ignored_fields(spec)
    );
}

// ---------------------------------------------------------------------------
// systemd

/// (section, key) -> values in file order.
fn unit() -> BTreeMap<(String, String), Vec<String>> {
    unit_file("systemd/gpu-operator.service")
}

/// The opt-in drop-in for driver management.
const DRIVER_DROP_IN: &str = "systemd/gpu-operator.service.d/driver-management.conf";

fn unit_file(path: &str) -> BTreeMap<(String, String), Vec<String>> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let mut section = String::new();
    let mut keys: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line.split_once('=').expect("key=value");
        keys.entry((section.clone(), key.trim().to_owned()))
            .or_default()
            .push(value.trim().to_owned());
    }
    keys
}

fn setting(unit: &BTreeMap<(String, String), Vec<String>>, key: &str) -> Option<String> {
    unit.get(&("Service".to_owned(), key.to_owned()))
        .map(|values| values.join(" "))
}

#[test]
fn systemd_unit_runs_standalone_and_keeps_what_the_work_needs() {
    let unit = unit();
    let get = |key: &str| setting(&unit, key);
    assert_eq!(get("Type").as_deref(), Some("notify"));
    assert_eq!(get("Restart").as_deref(), Some("on-failure"));
    let exec = get("ExecStart").expect("ExecStart");
    let argv: Vec<&str> = exec.split_whitespace().collect();
    assert_eq!(
        argv[0], IMAGE_ENTRYPOINT,
        "the same install path as the image"
    );
    assert_eq!(&argv[1..3], ["standalone", "--config"]);
    let config = Path::new(argv[3]);
    assert_eq!(
        config.parent(),
        Some(
            Path::new("/etc")
                .join(get("ConfigurationDirectory").expect("ConfigurationDirectory"))
                .as_path()
        ),
        "the config lives in the unit's ConfigurationDirectory"
    );
    // Under ProtectSystem=strict the logs directories are the only writable
    // places: the default Events file and the test runner's logs must be in them,
    // or the service fails before it is ready.
    assert_eq!(get("ProtectSystem").as_deref(), Some("strict"));
    let logs = get("LogsDirectory").expect("LogsDirectory");
    let writable: Vec<PathBuf> = logs
        .split_whitespace()
        .map(|d| Path::new("/var/log").join(d))
        .collect();
    for needed in [
        Path::new(gpu_operator::agent::standalone::DEFAULT_EVENTS_FILE),
        Path::new(gpu_operator::api::DEFAULT_TEST_RUNNER_LOGS),
    ] {
        assert!(
            writable.iter().any(|dir| needed.starts_with(dir)),
            "{} is not under the unit's LogsDirectory= ({logs})",
            needed.display()
        );
    }
    // The health socket's directory (src/metricssvc/) is the unit's state
    // directory, made writable under ProtectSystem=strict.
    let state = get("StateDirectory").expect("StateDirectory");
    let health_socket = Path::new(gpu_operator::metricssvc::DEFAULT_SOCKET);
    assert!(
        state
            .split_whitespace()
            .any(|d| health_socket.parent() == Some(&Path::new("/var/lib").join(d))),
        "{} is not in the unit's StateDirectory= ({state})",
        health_socket.display()
    );
    // sd_notify (unix), metrics (inet), the udev monitor (netlink).
    let families = get("RestrictAddressFamilies").expect("RestrictAddressFamilies");
    for family in ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"] {
        assert!(
            families.split_whitespace().any(|f| f == family),
            "{family} allowed"
        );
    }
    assert_eq!(get("NoNewPrivileges").as_deref(), Some("yes"));
    // Nothing loads modules yet: no capability, no module system calls, and
    // /lib/modules hidden.
    assert_eq!(get("CapabilityBoundingSet").as_deref(), Some(""));
    let filter = get("SystemCallFilter").unwrap_or_default();
    assert!(!filter.contains("@module"), "SystemCallFilter={filter}");
    assert_eq!(get("ProtectKernelModules").as_deref(), Some("yes"));
    // The opt-in drop-in gives back exactly what module loading needs: the
    // capability, the system calls, /lib/modules, and the two host paths the
    // driver manager writes (the firmware search path, the blacklist).
    let drop_in = unit_file(DRIVER_DROP_IN);
    let driver = |key: &str| setting(&drop_in, key);
    assert_eq!(
        driver("CapabilityBoundingSet").as_deref(),
        Some("CAP_SYS_MODULE")
    );
    assert_eq!(driver("SystemCallFilter").as_deref(), Some("@module"));
    assert_eq!(driver("ProtectKernelModules").as_deref(), Some("no"));
    let writable = driver("ReadWritePaths").unwrap_or_default();
    for written in [
        gpu_operator::driver::load::FIRMWARE_PATH_PARAM,
        gpu_operator::driver::blacklist::BLACKLIST_FILE,
    ] {
        assert!(
            writable
                .split_whitespace()
                .map(|p| p.trim_start_matches('-'))
                .any(|dir| Path::new(written).starts_with(dir)),
            "{written} is not under the drop-in's ReadWritePaths= ({writable})"
        );
    }
    assert_eq!(
        drop_in.keys().map(|(_, k)| k.as_str()).collect::<Vec<_>>(),
        [
            "CapabilityBoundingSet",
            "ProtectKernelModules",
            "ReadWritePaths",
            "SystemCallFilter"
        ],
        "the drop-in widens nothing else"
    );
    for (key, why) in [
        ("PrivateDevices", "hides /dev/kfd and /dev/dri"),
        (
            "ProtectClock",
            "implies a DeviceAllow= list that blocks GPU device nodes",
        ),
        ("DevicePolicy", "would block GPU device nodes"),
        ("DeviceAllow", "would block GPU device nodes"),
        (
            "PrivateNetwork",
            "the metrics endpoint is scraped from other hosts",
        ),
        ("ProcSubset", "process metrics read /proc/stat"),
        ("DynamicUser", "module loading and sysfs need root"),
    ] {
        let value = get(key);
        assert!(
            value.is_none() || value.as_deref() == Some("no"),
            "{key}={value:?} breaks the service: it {why}"
        );
    }
}

// ---------------------------------------------------------------------------
// End to end: kubectl apply, and the agent with the DaemonSet's environment

fn kubectl_present(test: &str) -> bool {
    if kubectl_path().exists() {
        return true;
    }
    // CI sets this where kubectl is installed, so that a moved binary fails
    // the run instead of skipping the check unseen.
    assert!(
        std::env::var_os("REQUIRE_KUBECTL").is_none(),
        "{test}: REQUIRE_KUBECTL is set but {} does not exist",
        kubectl_path().display()
    );
    println!(
        "SKIPPED {test}: {} not found; `kubectl apply` was not checked",
        kubectl_path().display()
    );
    false
}

/// Runs kubectl against the emulator: (success, stdout, stderr).
async fn kubectl(emu: &Emulator, home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(kubectl_path())
            .args(args)
            .current_dir(repo())
            .env_clear()
            .env("KUBECONFIG", emu.kubeconfig_path())
            .env("HOME", home)
            .arg("--cache-dir")
            .arg(home.join("cache"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
    .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_deploy_as_documented() {
    if !kubectl_present("kubectl_applies_deploy_as_documented") {
        return;
    }
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    // deploy/README.md: the CRD, wait until it is served, then deploy/.
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-f", "deploy/crd/"]).await;
    assert!(ok, "kubectl apply -f deploy/crd/: {out}{err}");
    let (ok, out, err) = kubectl(
        &emu,
        home.path(),
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/deviceconfigs.amd.com",
        ],
    )
    .await;
    assert!(ok, "kubectl wait: {out}{err}");
    // Client-side validation against the emulator's OpenAPI, as against a
    // real API server: every object must be known, valid and stored.
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-f", "deploy/"]).await;
    assert!(ok, "kubectl apply -f deploy/:\n{out}{err}");

    // Each object is stored as written; none is refused for its content, its
    // kind or its order.
    for m in manifests() {
        let api_version = m.doc["apiVersion"].as_str().unwrap();
        let stored = emu
            .get(api_version, m.kind(), m.namespace().unwrap_or(""), m.name())
            .unwrap_or_else(|| {
                panic!(
                    "{} {} from {} was not created:\n{out}{err}",
                    m.kind(),
                    m.name(),
                    m.file
                )
            });
        // What was stored is what the file says (spot check: the spec).
        if let Some(spec) = m.doc.get("spec").filter(|_| m.kind() == "DaemonSet") {
            assert_eq!(&stored["spec"], spec, "DaemonSet stored as written");
        }
    }
    assert!(
        emu.get("amd.com/v1alpha1", "DeviceConfig", NAMESPACE, "default")
            .is_some(),
        "the DeviceConfig went in after its CRD"
    );

    // Applying again changes nothing.
    let before = emu.resource_version();
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-f", "deploy/"]).await;
    assert!(ok, "second kubectl apply -f deploy/:\n{out}{err}");
    assert_eq!(
        emu.resource_version(),
        before,
        "a second apply changed something:\n{out}"
    );

    // Driver management, as documented: the patch, and an apply of deploy/
    // afterwards keeps it.
    let (ok, out, err) = kubectl(
        &emu,
        home.path(),
        &[
            "-n",
            NAMESPACE,
            "patch",
            "daemonset",
            "gpu-operator",
            "--patch-file",
            DRIVER_PATCH,
        ],
    )
    .await;
    assert!(ok, "kubectl patch --patch-file {DRIVER_PATCH}:\n{out}{err}");
    for step in ["patched", "applied again"] {
        let stored = emu
            .get("apps/v1", "DaemonSet", NAMESPACE, "gpu-operator")
            .expect("the DaemonSet");
        let ds: DaemonSet = serde_json::from_value(stored).expect("a DaemonSet");
        check_driver_management_rights(&ds);
        if step == "patched" {
            let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-f", "deploy/"]).await;
            assert!(ok, "kubectl apply -f deploy/ after the patch:\n{out}{err}");
        }
    }

    // Uninstall as documented: the DeviceConfig first, then the rest, then the CRD.
    let all = manifests();
    let device_config_file = the(&all, "DeviceConfig").file.clone();
    for args in [
        &["delete", "--wait", "-f", device_config_file.as_str()][..],
        &["delete", "--ignore-not-found", "-f", "deploy/"][..],
        &["delete", "-f", "deploy/crd/"][..],
    ] {
        let (ok, out, err) = kubectl(&emu, home.path(), args).await;
        assert!(ok, "kubectl {args:?}:\n{out}{err}");
    }
    for m in &all {
        let api_version = m.doc["apiVersion"].as_str().unwrap();
        let left = emu.get(api_version, m.kind(), m.namespace().unwrap_or(""), m.name());
        assert!(
            left.is_none(),
            "{} {} left after uninstalling",
            m.kind(),
            m.name()
        );
    }
    assert!(
        emu.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            .is_empty()
    );
}

// ---------------------------------------------------------------------------
// The kustomize base (deploy/Kustomization) and the example overlay

/// The kustomize base, named so that `kubectl apply -f deploy/` skips it.
const KUSTOMIZATION: &str = "deploy/Kustomization";
const OVERLAY: &str = "overlays/example";

/// Every document of the CRD files, in the order `kubectl apply -f
/// deploy/crd/` applies them.
fn crd_documents() -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/crd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            let docs: Vec<Value> =
                serde_saphyr::from_multiple(&std::fs::read_to_string(f).unwrap()).unwrap();
            docs
        })
        .filter(|d| !d.is_null())
        .collect()
}

/// `kubectl kustomize DIR` (no server needed): its objects, in order.
fn kustomize(dir: &str) -> Vec<Value> {
    let out = std::process::Command::new(kubectl_path())
        .args(["kustomize", dir])
        .current_dir(repo())
        .output()
        .expect("kubectl runs");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

#[test]
fn kustomize_base_is_what_kubectl_apply_applies() {
    // It lists every file the two `kubectl apply -f` steps apply, CRDs first.
    let text = std::fs::read_to_string(repo().join(KUSTOMIZATION)).unwrap();
    let kustomization: Value = serde_saphyr::from_str(&text).unwrap();
    let listed: Vec<&str> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let mut files: Vec<String> = Vec::new();
    for dir in ["deploy/crd", "deploy"] {
        let mut names: Vec<String> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            })
            .map(|p| {
                p.strip_prefix(repo().join("deploy"))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        files.extend(names);
    }
    assert_eq!(listed, files, "{KUSTOMIZATION}: resources");
    // Kept in that order: kustomize sorts by kind unless told not to.
    assert_eq!(kustomization["sortOptions"]["order"], "fifo");

    if !kubectl_present("kustomize_base_is_what_kubectl_apply_applies") {
        return;
    }
    let built = kustomize("deploy/");
    let mut expected = crd_documents();
    expected.extend(manifests().into_iter().map(|m| m.doc));
    assert_eq!(built.len(), expected.len(), "kubectl kustomize deploy/");
    for (got, want) in built.iter().zip(&expected) {
        assert_eq!(
            got, want,
            "kubectl kustomize deploy/ differs from the plain manifests at {} {}",
            want["kind"], want["metadata"]["name"]
        );
    }
}

#[test]
fn kustomize_overlay_example_builds_valid_objects() {
    if !kubectl_present("kustomize_overlay_example_builds_valid_objects") {
        return;
    }
    let built = kustomize(OVERLAY);
    let base = kustomize("deploy/");
    assert_eq!(built.len(), base.len(), "the base's objects, changed");
    let mut configs = String::new();
    for doc in &built {
        let m = Manifest {
            file: OVERLAY.into(),
            doc: doc.clone(),
        };
        match m.kind() {
            "DaemonSet" => {
                let ds: DaemonSet = typed(&m);
                let pod = ds.spec.unwrap().template.spec.unwrap();
                // The image from the example's registry, pinned by digest.
                let image = pod.containers[0].image.clone().unwrap();
                let (name, digest) = image.split_once('@').expect("pinned by digest");
                assert_eq!(name, "registry.example.com/gpu-operator");
                let hex = digest.strip_prefix("sha256:").unwrap();
                assert!(hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
                assert_eq!(
                    pod.image_pull_secrets.unwrap()[0].name,
                    "registry-example-com"
                );
            }
            "DeviceConfig" => {
                // DRA instead of the device plugin.
                assert_eq!(doc["spec"]["draDriver"]["enable"], true);
                assert_eq!(doc["spec"]["devicePlugin"]["enableDevicePlugin"], false);
                configs.push_str("---\n");
                configs.push_str(&serde_json::to_string(doc).unwrap());
                configs.push('\n');
            }
            "CustomResourceDefinition" => {}
            // Everything else is the base's, unchanged.
            _ => assert!(base.contains(doc), "{} {} changed", m.kind(), m.name()),
        }
    }
    assert!(!configs.is_empty(), "the overlay keeps a DeviceConfig");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deviceconfig.yaml");
    std::fs::write(&path, configs).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpu-operator validate of the overlay's DeviceConfig:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // kubernetes-validate (.ci/check-manifests runs it on every rendering
    // too) where it is installed.
    let builtin: Vec<String> = built
        .iter()
        .filter(|d| d["kind"] != "DeviceConfig")
        .map(|d| serde_json::to_string(d).unwrap())
        .collect();
    let path = dir.path().join("builtin.yaml");
    std::fs::write(&path, format!("---\n{}\n", builtin.join("\n---\n"))).unwrap();
    match std::process::Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "--kubernetes-version", "1.34.0"])
        .arg(&path)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "kubernetes-validate --strict of {OVERLAY}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => println!("kubernetes-validate did not run ({e}): {OVERLAY} not validated by it"),
    }
}

/// deploy/README.md's kustomize install: on a fresh cluster the first
/// `kubectl apply -k deploy/` applies everything but the DeviceConfig, whose
/// kind kubectl cannot map before its CRD is served; after `kubectl wait`
/// the second applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_kustomize_base_as_documented() {
    if !kubectl_present("kubectl_applies_the_kustomize_base_as_documented") {
        return;
    }
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-k", "deploy/"]).await;
    // kubectl validates (or, with --validate=false, maps) each object against
    // what the server served when it started: the DeviceConfig's kind was not
    // served yet. The emulator establishes a CRD at once, so this is no race.
    assert!(!ok, "the first apply -k on a fresh cluster: {out}{err}");
    assert!(
        emu.get("amd.com/v1alpha1", "DeviceConfig", NAMESPACE, "default")
            .is_none(),
        "{out}{err}"
    );
    for m in manifests().iter().filter(|m| m.kind() != "DeviceConfig") {
        let api_version = m.doc["apiVersion"].as_str().unwrap();
        assert!(
            emu.get(api_version, m.kind(), m.namespace().unwrap_or(""), m.name())
                .is_some(),
            "{} {} was applied by the first run:\n{out}{err}",
            m.kind(),
            m.name()
        );
    }
    let (ok, out, err) = kubectl(
        &emu,
        home.path(),
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/deviceconfigs.amd.com",
        ],
    )
    .await;
    assert!(ok, "kubectl wait: {out}{err}");
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-k", "deploy/"]).await;
    assert!(ok, "the second apply -k:\n{out}{err}");
    for m in manifests() {
        let api_version = m.doc["apiVersion"].as_str().unwrap();
        assert!(
            emu.get(api_version, m.kind(), m.namespace().unwrap_or(""), m.name())
                .is_some(),
            "{} {} from {} was not applied",
            m.kind(),
            m.name(),
            m.file
        );
    }
    // And the plain path, over it, changes nothing.
    let before = emu.resource_version();
    let (ok, out, err) = kubectl(&emu, home.path(), &["apply", "-f", "deploy/"]).await;
    assert!(ok, "kubectl apply -f deploy/ after -k:\n{out}{err}");
    assert_eq!(emu.resource_version(), before, "{out}");
}

const NODE: &str = "gpu-node-1";
const POD: &str = "gpu-operator-x7k2p";
/// Waits until `condition` holds; a timeout shows the agent's log.
async fn eventually(what: &str, log: &Path, condition: impl FnMut() -> bool) {
    support::wait::eventually_explained(what, condition, || {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        format!("agent log:\n{log}")
    })
    .await
}

/// `plural[.group][/subresource]` (the emulator's request names) as (group, resource).
fn group_resource(name: &str) -> (String, String) {
    let (main, sub) = name
        .split_once('/')
        .map_or((name, None), |(m, s)| (m, Some(s)));
    let (plural, group) = main.split_once('.').unwrap_or((main, ""));
    let resource = match sub {
        Some(sub) => format!("{plural}/{sub}"),
        None => plural.to_owned(),
    };
    (group.to_owned(), resource)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_with_the_daemonset_environment_within_its_rbac() {
    let (ds, _, container) = daemonset();
    let namespace = ds.metadata.namespace.clone().unwrap();
    let all = manifests();
    let emu = TestCluster::start_with_namespace(the(&all, "Namespace").doc.clone()).await;
    emu.create(the(&all, "DeviceConfig").doc.clone()).unwrap();
    // A GPU node as node-feature-discovery labels it.
    emu.add_node(support::cluster::node(
        NODE,
        json!({"feature.node.kubernetes.io/amd-gpu": "true"}),
    ));

    // The container's paths, mapped to the node rig's directories (the
    // agent runs as the binary, outside the rig).
    let rig = support::node_rig::NodeRig::builder(NODE)
        .profile("mi300x", None, None)
        .kubelet()
        .start()
        .await;
    let dir = rig.dir();
    let host_root = rig.host.root().to_path_buf();
    let kubelet_dir = rig.kubelet_dir();
    let cdi_dir = dir.join("cdi");
    std::fs::create_dir_all(kubelet_dir.join("pod-resources")).unwrap();
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let kubelet = rig.kubelet();
    let paths: BTreeMap<&str, &Path> = BTreeMap::from([
        ("/host", host_root.as_path()),
        ("/var/lib/kubelet", kubelet_dir.as_path()),
        ("/var/run/cdi", cdi_dir.as_path()),
    ]);

    // The environment the kubelet would give the container.
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container.env.clone().unwrap_or_default() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) if value.starts_with('/') => paths
                .get(value.as_str())
                .unwrap_or_else(|| panic!("{}={value}: map this path in the test", var.name))
                .display()
                .to_string(),
            (Some(value), _) => value.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => NODE.to_owned(),
                Some("metadata.name") => POD.to_owned(),
                Some("metadata.namespace") => namespace.clone(),
                other => panic!("{}: downward API field {other:?} not modelled", var.name),
            },
            (None, None) => String::new(),
        };
        env.push((var.name, value));
    }
    let log_path = dir.join("agent.log");
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(container.args.clone().unwrap_or_default())
        .env_clear()
        .envs(env)
        // Stands in for the in-cluster ServiceAccount credentials.
        .env("KUBECONFIG", emu.kubeconfig_path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpu-operator");

    // Node work: it follows the installed DeviceConfig and registers its GPUs.
    eventually("the agent status annotation", &log_path, || {
        emu.get("v1", "Node", "", NODE)
            .and_then(|n| {
                n["metadata"]["annotations"]["amd.com/gpu-agent-status"]
                    .as_str()
                    .map(str::to_owned)
            })
            .is_some_and(|s| s.contains(&format!("\"deviceConfig\":\"{NAMESPACE}/default\"")))
    })
    .await;
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    // Cluster work: it leads through the Lease in its namespace and reconciles.
    let lease = || emu.get("coordination.k8s.io/v1", "Lease", &namespace, LEASE);
    eventually("leadership", &log_path, || {
        // "<node>/<pod>": deploy/15-admission-policy.yaml compares it with the
        // node and pod names of the caller's token.
        lease().is_some_and(|l| l["spec"]["holderIdentity"] == format!("{NODE}/{POD}"))
    })
    .await;
    eventually(
        "the DeviceConfig's metrics Service and status",
        &log_path,
        || {
            emu.get("v1", "Service", NAMESPACE, "default-metrics-exporter")
                .is_some()
                && emu
                    .get("amd.com/v1alpha1", "DeviceConfig", NAMESPACE, "default")
                    .is_some_and(|dc| !dc["status"].is_null())
        },
    )
    .await;

    // Uninstalling, step one (deploy/README.md): delete the DeviceConfig while
    // the agents still run; the leader tears down and lifts its finalizer.
    let configs: kube::Api<gpu_operator::api::DeviceConfig> =
        kube::Api::namespaced(emu.client(), NAMESPACE);
    configs
        .delete("default", &Default::default())
        .await
        .expect("delete the DeviceConfig");
    let ours = (1, "delete deviceconfigs.amd.com".to_owned());
    eventually("the DeviceConfig torn down and gone", &log_path, || {
        emu.get("amd.com/v1alpha1", "DeviceConfig", NAMESPACE, "default")
            .is_none()
            && emu
                .get("v1", "Service", NAMESPACE, "default-metrics-exporter")
                .is_none()
    })
    .await;

    // SIGTERM, as the kubelet stops the pod: a clean exit within the grace
    // period, with the Lease released for a standby.
    let pid = agent.id().expect("running") as libc::pid_t;
    // SAFETY: kill(2) on the child we spawned and still own.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let grace = Duration::from_secs(
        u64::try_from(
            ds.spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .termination_grace_period_seconds
                .unwrap(),
        )
        .unwrap(),
    );
    let status = tokio::time::timeout(grace, agent.wait())
        .await
        .expect("the agent exits within terminationGracePeriodSeconds")
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        lease().is_some_and(|l| l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .is_empty()),
        "the Lease was released: {:?}",
        lease()
    );

    // Every API request it made is in the table of needs, and allowed.
    let grants = grants();
    let needs = needs();
    let mut made = Vec::new();
    for (key, count) in emu.requests().0 {
        if key.resource.starts_with('/') {
            continue; // discovery and version: allowed to every authenticated client
        }
        if (count, key.to_string()) == ours {
            continue; // the test's own request, not the agent's
        }
        let (group, resource) = group_resource(&key.resource);
        let known = needs
            .iter()
            .filter(|n| n.group == group && n.resource == resource && n.verb == key.verb)
            .collect::<Vec<_>>();
        assert!(
            !known.is_empty(),
            "the agent made `{} {}`, which the table of needs does not list",
            key.verb,
            key.resource
        );
        assert!(
            known.iter().any(|n| allowed(&grants, n)),
            "not allowed: {key}"
        );
        made.push(key.to_string());
    }
    println!("API requests the agent made: {made:?}");
    // The run exercised node work, election and reconciling, so the check
    // above saw each kind of request.
    for expected in [
        "watch nodes",
        "patch nodes",
        "watch deviceconfigs.amd.com",
        "create leases.coordination.k8s.io",
        "update leases.coordination.k8s.io",
        "patch deviceconfigs.amd.com",
        "patch deviceconfigs.amd.com/status",
        "patch services",
        "delete services",
        "watch services",
    ] {
        assert!(
            made.iter().any(|m| m == expected),
            "expected `{expected}` among {made:?}"
        );
    }
}

/// deploy/optional/npd-amdgpu-plugin.yaml: Node Problem Detector runs each
/// rule's command and reads its exit code (0 ok, 1 problem, 2 unknown) and
/// one line of stdout. The command, run as NPD would (with `--host-root` as
/// the DaemonSet variant adds it), must speak that protocol on a healthy, a
/// failing and an unreadable host, within the rule's timeout.
#[test]
fn the_npd_plugin_config_runs_check_npd_by_the_plugin_protocol() {
    let path = repo().join("deploy/optional/npd-amdgpu-plugin.yaml");
    let text = std::fs::read_to_string(&path).expect("the NPD example is readable");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let config_map: k8s_openapi::api::core::v1::ConfigMap = docs
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap")
        .map(|d| serde_json::from_value(d).expect("a ConfigMap"))
        .expect("the example holds a ConfigMap");
    let data = config_map.data.expect("data");
    let monitor: Value = serde_json::from_str(&data["amdgpu-custom-plugin-monitor.json"])
        .expect("the plugin monitor config is JSON");
    assert_eq!(monitor["plugin"], "custom");
    let condition = monitor["conditions"][0]["type"]
        .as_str()
        .expect("a condition");
    let rules = monitor["rules"].as_array().expect("rules");
    assert!(!rules.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path().join("host"));
    let spec = gpu_operator::simulate::SimSpec::new("mi300x", Some(2), None).unwrap();
    gpu_operator::simulate::write_host(&host, &spec).unwrap();
    let bdf = gpu_operator::device::discover(&host).gpus[0].bdf.clone();
    for rule in rules {
        assert_eq!(rule["type"], "permanent");
        assert_eq!(
            rule["condition"], condition,
            "the rule sets the declared condition"
        );
        assert_eq!(rule["path"], IMAGE_ENTRYPOINT, "the installed binary");
        let timeout = rule["timeout"].as_str().expect("a timeout");
        let timeout: u64 = timeout.trim_end_matches('s').parse().expect("seconds");
        let args: Vec<String> = rule["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string args").to_owned())
            .collect();
        let run = |root: &Path| {
            let started = std::time::Instant::now();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
                .args(&args)
                .arg(format!("--host-root={}", root.display()))
                .env("NO_COLOR", "1")
                .output()
                .expect("the plugin runs");
            assert!(
                started.elapsed() < Duration::from_secs(timeout),
                "answered within the rule's {timeout} s"
            );
            let stdout = String::from_utf8(out.stdout).expect("UTF-8");
            assert_eq!(stdout.lines().count(), 1, "one line for NPD: {stdout:?}");
            (out.status.code(), stdout.trim_end().to_owned())
        };
        assert_eq!(run(host.root()), (Some(0), "2 AMD GPUs healthy".to_owned()));
        gpu_operator::simulate::set_ecc_counts(&host, &bdf, "umc", 1, 0).unwrap();
        let (code, line) = run(host.root());
        assert_eq!(code, Some(1), "{line}");
        assert!(
            line.starts_with(&format!("1 of 2 AMD GPUs unhealthy: {bdf}: ")),
            "{line}"
        );
        gpu_operator::simulate::set_ecc_counts(&host, &bdf, "umc", 0, 0).unwrap();
        let (code, line) = run(&dir.path().join("no-such-root"));
        assert_eq!(code, Some(2), "{line}");
        assert!(line.starts_with("cannot check AMD GPUs: "), "{line}");
    }
}

/// deploy/patches/driver-image.yaml, run as the kubelet would run its two
/// init containers, on stand-ins: the copy step's shell script over a fake
/// copy of a driver image (its paths moved into a temporary directory), then
/// the import step's own arguments through the real binary, under a host
/// root. A node the image is built for ends with a bundle that `driver
/// check` passes; one it is not built for copies nothing, and the import
/// step does not fail the pod.
#[tokio::test]
async fn the_driver_image_patch_copies_and_imports_on_the_nodes_kernel_only() {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    emu.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        .unwrap();
    let all = manifests();
    emu.create(the(&all, "DaemonSet").doc.clone()).unwrap();
    let text = std::fs::read_to_string(repo().join("deploy/patches/driver-image.yaml")).unwrap();
    let patch: Value = serde_saphyr::from_str(&text).expect("the patch is YAML");
    let daemonsets: Api<DaemonSet> = Api::namespaced(emu.client(), NAMESPACE);
    let patched = daemonsets
        .patch(
            "gpu-operator",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(patch),
        )
        .await
        .expect("the patch applies");
    let pod = patched.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers.len(),
        1,
        "the agent is still the one container"
    );
    let init = pod.init_containers.unwrap_or_default();
    let (copy, import) = match &init[..] {
        [copy, import] => (copy, import),
        other => panic!("two init containers, got {}", other.len()),
    };
    // The two name the same image tag.
    let image = copy.image.clone().unwrap();
    let args = import.args.clone().unwrap();
    let tag_at = args.iter().position(|a| a == "--image-tag").unwrap();
    let tag = &args[tag_at + 1];
    assert!(
        image.ends_with(&format!(":{tag}")),
        "{image} vs --image-tag {tag}"
    );
    // The import's arguments are the CLI's, and its store mount is the
    // store at its host path (the default host root "/").
    let mut argv = vec!["gpu-operator".to_owned()];
    argv.extend(args.iter().cloned());
    <gpu_operator::cli::Cli as clap::Parser>::try_parse_from(&argv)
        .expect("the import's args parse");
    let volumes: BTreeMap<String, k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| (v.name.clone(), v))
        .collect();
    let store_mount = import
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == gpu_operator::driver::preflight::DEFAULT_STORE)
        .expect("the store at its own path");
    assert_eq!(
        volumes[&store_mount.name]
            .host_path
            .as_ref()
            .map(|h| h.path.as_str()),
        Some(gpu_operator::driver::preflight::DEFAULT_STORE)
    );
    let staging = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/staging")
            .map(|m| m.name.clone())
    };
    assert_eq!(
        staging(copy),
        staging(import),
        "one emptyDir between the two"
    );

    // Run them: this machine's kernel stands for the node's.
    let kernel = String::from_utf8(
        std::process::Command::new("uname")
            .arg("-r")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    let script = copy.command.clone().unwrap()[2].clone();
    for built_for_this_kernel in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let image_root = dir.path().join("image");
        let host_root = dir.path().join("host");
        let image_kernel = if built_for_this_kernel {
            kernel.clone()
        } else {
            format!("{kernel}-other")
        };
        let modules = image_root.join(format!("opt/lib/modules/{image_kernel}"));
        std::fs::create_dir_all(modules.join("updates/dkms")).unwrap();
        std::fs::write(modules.join("updates/dkms/amdgpu.ko"), b"\x7fELF amdgpu").unwrap();
        std::fs::write(modules.join("modules.dep"), "updates/dkms/amdgpu.ko:\n").unwrap();
        let firmware = image_root.join("firmwareDir/updates/amdgpu");
        std::fs::create_dir_all(&firmware).unwrap();
        std::fs::write(firmware.join("psp_13_0_6_sos.bin"), "fw").unwrap();
        std::fs::create_dir_all(host_root.join("staging")).unwrap();
        // The image's paths are the quoted ones and the bare /firmwareDir;
        // /staging is the emptyDir's.
        let moved = script
            .replace("\"/opt/", &format!("\"{}/opt/", image_root.display()))
            .replace(
                " /firmwareDir ",
                &format!(" {}/firmwareDir ", image_root.display()),
            )
            .replace("/staging", &format!("{}/staging", host_root.display()));
        assert!(
            moved.matches(&*image_root.display().to_string()).count() == 3,
            "{moved}"
        );
        let copied = std::process::Command::new("sh")
            .args(["-c", &moved])
            .output()
            .unwrap();
        assert!(copied.status.success(), "{copied:?}");
        let mut import_args: Vec<String> = args.clone();
        import_args[tag_at + 1] = format!("ubuntu-22.04-{kernel}-6.12.12");
        let imported = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(&import_args)
            .arg("--host-root")
            .arg(&host_root)
            .output()
            .unwrap();
        assert!(imported.status.success(), "{imported:?}");
        let checked = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args([
                "driver",
                "check",
                "--kernel",
                &kernel,
                "--signatures",
                "not-required",
            ])
            .arg("--host-root")
            .arg(&host_root)
            .output()
            .unwrap();
        assert_eq!(
            checked.status.success(),
            built_for_this_kernel,
            "built for this kernel: {built_for_this_kernel}\n{checked:?}"
        );
    }
}
