//! Conformance against a real client: `/usr/bin/kubectl` (v1.32 here and in CI) driving the
//! `kube-emulator` binary. Covers get (table, `-o yaml`, `-o jsonpath`), `create -f`,
//! client-side `apply -f` (including a CRD and then its custom resource), label, annotate,
//! `patch --type=merge`, cordon, delete, and `get -w` in one process seeing a label change made
//! by another; the typed `create namespace|configmap|...` subcommands (protobuf bodies); the
//! project's deploy/ installed as deploy/README.md says, with kubectl's default validation;
//! `get` of the shipped CRD's printer columns (JSONPath filters, one Age); Events written
//! through events.k8s.io/v1 seen by `get events` (core v1) and the reverse; and server-side
//! field validation: a typo in a manifest fails `--validate=strict` (the default), is a
//! warning with `--validate=warn`, and is dropped from what is stored.
//!
//! Run just this: `cargo test -p kube-emulator --test kubectl -- --nocapture`.
//! If kubectl is missing the tests print a SKIPPED notice and return.

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use common::{poll_until, within};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// kubectl: `$KUBECTL`, else /usr/bin/kubectl.
fn kubectl_path() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(Into::into)
        .unwrap_or_else(|| "/usr/bin/kubectl".into())
}

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
        "SKIPPED {test}: {} not found; the kubectl conformance check did not run",
        kubectl_path().display()
    );
    false
}

/// The emulator binary, started on a free port with its kubeconfig in a temporary directory.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    url: String,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
            .args(["--port", "0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the kube-emulator binary");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = within("the emulator printing its address", lines.next_line())
            .await
            .unwrap()
            .expect("a first line");
        let url = first
            .strip_prefix("listening on ")
            .expect("listening line")
            .to_string();
        let second = lines.next_line().await.unwrap().unwrap();
        assert_eq!(second, format!("kubeconfig: {}", kubeconfig.display()));
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Server {
            child,
            dir,
            kubeconfig,
            url,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(kubectl_path());
        c.args(args)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl, returning (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = within(&format!("kubectl {args:?}"), self.command(args).output())
            .await
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs kubectl, returning (exit code, stdout, stderr).
    async fn exit(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = within(&format!("kubectl {args:?}"), self.command(args).output())
            .await
            .expect("kubectl runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs kubectl and requires success.
    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}");
        out
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl -o json prints JSON")
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    /// Request counts from the server's `/debug/requests`.
    async fn counts(&self) -> Value {
        let client = kube::Client::try_from(kube::Config::new(self.url.parse().unwrap())).unwrap();
        let text = client
            .request_text(
                http::Request::get("/debug/requests")
                    .body(Vec::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    async fn stop(mut self) {
        // Our own child, by its handle.
        let _ = self.child.kill().await;
    }
}

fn count(doc: &Value, verb: &str, resource: &str) -> u64 {
    doc["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verb"] == verb && r["resource"] == resource)
        .map(|r| r["count"].as_u64().unwrap())
        .sum()
}

const CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
  labels:
    app: demo
data:
  a: \"1\"
";

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels:
    kubernetes.io/hostname: node-1
status:
  conditions:
  - type: Ready
    status: \"True\"
";

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: deviceconfigs.amd.com
spec:
  group: amd.com
  scope: Namespaced
  names:
    plural: deviceconfigs
    singular: deviceconfig
    kind: DeviceConfig
    listKind: DeviceConfigList
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

const DEVICECONFIG: &str = "apiVersion: amd.com/v1alpha1
kind: DeviceConfig
metadata:
  name: gpus
spec:
  driver:
    enable: true
";

#[tokio::test]
async fn kubectl_crud_commands_work_against_the_binary() {
    if !kubectl_present("kubectl_crud_commands_work_against_the_binary") {
        return;
    }
    let s = Server::start().await;
    let version = s.ok(&["version"]).await;
    assert!(version.contains("Server Version: v1.34.0"), "{version}");

    // create -f
    let cm = s.write("cm.yaml", CONFIGMAP);
    assert!(
        s.ok(&["create", "-f", &cm])
            .await
            .contains("configmap/demo created")
    );
    let node = s.write("node.yaml", NODE);
    assert!(
        s.ok(&["create", "-f", &node])
            .await
            .contains("node/node-1 created")
    );
    let (ok, _, err) = s.run(&["create", "-f", &cm]).await;
    assert!(!ok && err.contains("AlreadyExists"), "{err}");

    // get (server-side table) and get -o yaml
    let table = s.ok(&["get", "configmaps"]).await;
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("demo ") && l.contains(" 1 ")),
        "{table}"
    );
    let yaml = s.ok(&["get", "configmap", "demo", "-o", "yaml"]).await;
    let obj: Value = serde_saphyr::from_str(&yaml).expect("kubectl -o yaml prints YAML");
    assert_eq!(obj["data"]["a"], "1");
    assert_eq!(obj["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(
        s.ok(&["get", "nodes"])
            .await
            .lines()
            .any(|l| l.starts_with("node-1") && l.contains("Ready"))
    );
    let ns = s.ok(&["get", "ns", "-o", "name"]).await;
    assert!(ns.contains("namespace/kube-system"), "{ns}");

    // label, annotate, patch --type=merge
    assert!(
        s.ok(&["label", "configmap", "demo", "tier=gpu"])
            .await
            .contains("labeled")
    );
    assert!(
        s.ok(&["annotate", "configmap", "demo", "note=hello"])
            .await
            .contains("annotated")
    );
    assert!(
        s.ok(&[
            "patch",
            "configmap",
            "demo",
            "--type=merge",
            "-p",
            r#"{"data":{"b":"2"}}"#
        ])
        .await
        .contains("patched")
    );
    let obj = s.json(&["get", "configmap", "demo"]).await;
    assert_eq!(obj["metadata"]["labels"]["tier"], "gpu");
    assert_eq!(obj["metadata"]["annotations"]["note"], "hello");
    assert_eq!(obj["data"]["b"], "2");
    assert!(
        s.ok(&["label", "configmap", "demo", "tier-"])
            .await
            .contains("unlabeled")
    );
    assert!(
        s.json(&["get", "configmap", "demo"]).await["metadata"]["labels"]
            .get("tier")
            .is_none()
    );

    // cordon (strategic merge patch on the node)
    assert!(
        s.ok(&["cordon", "node-1"])
            .await
            .contains("node/node-1 cordoned")
    );
    assert_eq!(
        s.ok(&[
            "get",
            "node",
            "node-1",
            "-o",
            "jsonpath={.spec.unschedulable}"
        ])
        .await,
        "true"
    );
    assert!(
        s.ok(&["get", "nodes"])
            .await
            .contains("Ready,SchedulingDisabled")
    );
    assert!(s.ok(&["uncordon", "node-1"]).await.contains("uncordoned"));

    // apply -f (client-side): update an existing object, then create with apply.
    let changed = s.write("cm2.yaml", &CONFIGMAP.replace("a: \"1\"", "a: \"5\""));
    let out = s.ok(&["apply", "-f", &changed]).await;
    assert!(out.contains("configmap/demo configured"), "{out}");
    let obj = s.json(&["get", "configmap", "demo"]).await;
    assert_eq!(obj["data"]["a"], "5");
    assert_eq!(
        obj["data"]["b"], "2",
        "fields apply does not manage are kept"
    );
    assert!(
        obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    let fresh = s.write(
        "cm3.yaml",
        &CONFIGMAP.replace("name: demo", "name: applied"),
    );
    assert!(
        s.ok(&["apply", "-f", &fresh])
            .await
            .contains("configmap/applied created")
    );
    // Dropping a label from the file removes it on the next apply (three-way merge).
    let fewer = s.write(
        "cm4.yaml",
        &CONFIGMAP
            .replace("name: demo", "name: applied")
            .replace("    app: demo\n", "    other: x\n"),
    );
    s.ok(&["apply", "-f", &fewer]).await;
    let labels = s.json(&["get", "configmap", "applied"]).await["metadata"]["labels"].clone();
    assert_eq!(labels, serde_json::json!({"other": "x"}));

    // Server-side apply through kubectl.
    let ssa = s.write("cm5.yaml", &CONFIGMAP.replace("name: demo", "name: ssa"));
    assert!(
        s.ok(&["apply", "--server-side", "-f", &ssa])
            .await
            .contains("configmap/ssa serverside-applied")
    );
    let managed = s
        .json(&["get", "configmap", "ssa", "--show-managed-fields"])
        .await;
    assert_eq!(
        managed["metadata"]["managedFields"][0]["manager"],
        "kubectl"
    );
    assert_eq!(
        managed["metadata"]["managedFields"][0]["operation"],
        "Apply"
    );

    // A CRD, then its custom resource, all through kubectl.
    let crd = s.write("crd.yaml", CRD);
    assert!(s.ok(&["apply", "-f", &crd]).await.contains("created"));
    let dc = s.write("dc.yaml", DEVICECONFIG);
    assert!(
        s.ok(&["apply", "-f", &dc])
            .await
            .contains("deviceconfig.amd.com/gpus created")
    );
    assert!(s.ok(&["get", "deviceconfigs"]).await.contains("gpus"));
    assert!(
        s.ok(&["label", "deviceconfig", "gpus", "x=y"])
            .await
            .contains("labeled"),
        "label on a custom resource uses a merge patch"
    );

    // delete
    assert!(
        s.ok(&["delete", "configmap", "demo"])
            .await
            .contains("deleted")
    );
    let (ok, _, err) = s.run(&["get", "configmap", "demo"]).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    assert!(s.ok(&["delete", "-f", &dc]).await.contains("deleted"));

    // The emulator counted what kubectl did.
    let counts = s.counts().await;
    assert!(count(&counts, "patch", "configmaps") >= 5, "{counts}");
    assert!(count(&counts, "patch", "nodes") >= 2, "{counts}");
    assert!(count(&counts, "create", "configmaps") >= 2, "{counts}");
    assert!(
        count(&counts, "delete", "deviceconfigs.amd.com") == 1,
        "{counts}"
    );
    s.stop().await;
}

/// Reads lines from a child's stdout until one satisfies `want`.
async fn wait_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
    want: impl Fn(&str) -> bool,
) -> String {
    let found = within(what, async {
        while let Some(l) = lines.next_line().await.expect("read watch output") {
            if want(&l) {
                return Some(l);
            }
        }
        None
    })
    .await;
    found.unwrap_or_else(|| panic!("watch ended before {what}"))
}

#[tokio::test]
async fn kubectl_watch_sees_a_label_change_made_by_another_process() {
    if !kubectl_present("kubectl_watch_sees_a_label_change_made_by_another_process") {
        return;
    }
    let s = Server::start().await;
    let cm = s.write("cm.yaml", CONFIGMAP);
    s.ok(&["create", "-f", &cm]).await;

    // One process watches the label; another changes it.
    let mut watch = s
        .command(&[
            "get",
            "configmap",
            "demo",
            "-w",
            "-o",
            "jsonpath={.metadata.name}={.metadata.labels.tier}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    wait_line(&mut lines, "the initial object", |l| l == "demo=").await;
    s.ok(&["label", "configmap", "demo", "tier=gpu"]).await;
    wait_line(&mut lines, "the new label", |l| l == "demo=gpu").await;
    s.ok(&["label", "configmap", "demo", "tier=cpu", "--overwrite"])
        .await;
    wait_line(&mut lines, "the changed label", |l| l == "demo=cpu").await;

    // Table watch: new rows for objects created by another process.
    let mut table = s
        .command(&["get", "configmaps", "-w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rows = BufReader::new(table.stdout.take().unwrap()).lines();
    wait_line(&mut rows, "the header", |l| l.starts_with("NAME")).await;
    wait_line(&mut rows, "the demo row", |l| l.starts_with("demo ")).await;
    let other = s.write(
        "other.yaml",
        &CONFIGMAP.replace("name: demo", "name: second"),
    );
    s.ok(&["create", "-f", &other]).await;
    wait_line(&mut rows, "the new row", |l| l.starts_with("second ")).await;

    let counts = s.counts().await;
    assert!(count(&counts, "watch", "configmaps") >= 2, "{counts}");
    // Both watchers are our children; stop them by handle.
    let _ = watch.kill().await;
    let _ = table.kill().await;
    s.stop().await;
}

/// The project's deploy/ directory (the manifests `kubectl apply -f deploy/` installs).
fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Applies the project's real CRD as deploy/README.md says, and waits until it is served.
async fn install_crd(s: &Server) {
    let crd = deploy_dir().join("crd");
    let crd = crd.to_str().expect("UTF-8 path");
    let out = s.ok(&["apply", "-f", crd]).await;
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/deviceconfigs.amd.com"),
        "{out}"
    );
    let out = s
        .ok(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/deviceconfigs.amd.com",
        ])
        .await;
    assert!(out.contains("condition met"), "{out}");
}

/// kubectl's typed clients (`create namespace`, `create configmap`, ...) send protobuf bodies
/// whatever discovery says; the real server reads them, so the emulator must too.
#[tokio::test]
async fn kubectl_create_subcommands_send_protobuf_and_work() {
    if !kubectl_present("kubectl_create_subcommands_send_protobuf_and_work") {
        return;
    }
    let s = Server::start().await;
    let out = s.ok(&["create", "namespace", "team-a"]).await;
    assert!(out.contains("namespace/team-a created"), "{out}");
    let ns = s.json(&["get", "namespace", "team-a"]).await;
    assert_eq!(ns["metadata"]["name"], "team-a");
    assert_eq!(ns["status"]["phase"], "Active");

    let out = s
        .ok(&[
            "create",
            "configmap",
            "settings",
            "-n",
            "team-a",
            "--from-literal=mode=fast",
            "--from-literal=empty=",
        ])
        .await;
    assert!(out.contains("configmap/settings created"), "{out}");
    let cm = s
        .json(&["get", "configmap", "settings", "-n", "team-a"])
        .await;
    assert_eq!(cm["data"], serde_json::json!({"mode": "fast", "empty": ""}));
    assert_eq!(cm["metadata"]["namespace"], "team-a");

    let out = s
        .ok(&[
            "create",
            "secret",
            "generic",
            "token",
            "-n",
            "team-a",
            "--from-literal=k=v",
        ])
        .await;
    assert!(out.contains("secret/token created"), "{out}");
    let secret = s.json(&["get", "secret", "token", "-n", "team-a"]).await;
    assert_eq!(secret["data"]["k"], "dg==", "base64 of \"v\"");

    let out = s
        .ok(&["create", "serviceaccount", "robot", "-n", "team-a"])
        .await;
    assert!(out.contains("serviceaccount/robot created"), "{out}");
    let out = s
        .ok(&[
            "create",
            "role",
            "reader",
            "-n",
            "team-a",
            "--verb=get,list",
            "--resource=pods",
        ])
        .await;
    assert!(
        out.contains("role.rbac.authorization.k8s.io/reader created"),
        "{out}"
    );
    let role = s.json(&["get", "role", "reader", "-n", "team-a"]).await;
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    );
    let out = s
        .ok(&[
            "create",
            "rolebinding",
            "reader",
            "-n",
            "team-a",
            "--role=reader",
            "--serviceaccount=team-a:robot",
        ])
        .await;
    assert!(
        out.contains("rolebinding.rbac.authorization.k8s.io/reader created"),
        "{out}"
    );
    let binding = s
        .json(&["get", "rolebinding", "reader", "-n", "team-a"])
        .await;
    assert_eq!(binding["roleRef"]["name"], "reader");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}])
    );

    // Creating again is AlreadyExists, as the real server says it, not a decoding error.
    let (ok, _, err) = s.run(&["create", "namespace", "team-a"]).await;
    assert!(!ok && err.contains("AlreadyExists"), "{err}");
    let counts = s.counts().await;
    assert_eq!(count(&counts, "create", "namespaces"), 2, "{counts}");
    assert_eq!(count(&counts, "create", "configmaps"), 1, "{counts}");
    s.stop().await;
}

/// deploy/README.md's install steps against the emulator with kubectl's default validation
/// (`--validate=strict`): every object in deploy/ is created, and a second apply changes
/// nothing.
#[tokio::test]
async fn kubectl_applies_the_deploy_directory_with_validation() {
    if !kubectl_present("kubectl_applies_the_deploy_directory_with_validation") {
        return;
    }
    let s = Server::start().await;
    install_crd(&s).await;
    let deploy = deploy_dir();
    let deploy = deploy.to_str().expect("UTF-8 path");
    let (ok, out, err) = s.run(&["apply", "-f", deploy]).await;
    assert!(ok, "kubectl apply -f deploy/:\n{out}{err}");
    assert!(err.trim().is_empty(), "kubectl warned:\n{err}");

    // Every document in deploy/*.yaml is reported and stored.
    let mut expected = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for doc in text.split("\n---") {
            let Ok(v) = serde_saphyr::from_str::<Value>(doc) else {
                continue;
            };
            if let Some(kind) = v["kind"].as_str() {
                let name = v["metadata"]["name"].as_str().unwrap().to_string();
                let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
                // kubectl names objects `kind.group/name`.
                let group = match v["apiVersion"].as_str().unwrap().split_once('/') {
                    Some((g, _)) => format!(".{g}"),
                    None => String::new(),
                };
                let shown = format!("{}{group}/{name}", kind.to_ascii_lowercase());
                expected.push((kind.to_string(), name, ns, shown));
            }
        }
    }
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "DeviceConfig",
    ] {
        assert!(
            expected.iter().any(|(k, _, _, _)| k == kind),
            "deploy/ has no {kind}; update this test"
        );
    }
    for (kind, name, ns, shown) in &expected {
        let created = format!("{shown} created");
        assert!(
            out.lines().any(|l| l.contains(&created)),
            "{kind} {name} not created:\n{out}"
        );
        let mut args = vec!["get", kind.as_str(), name.as_str()];
        if let Some(ns) = ns {
            args.extend(["-n", ns.as_str()]);
        }
        let got = s.json(&args).await;
        assert_eq!(got["kind"], kind.as_str());
    }
    let rb = s
        .json(&["get", "rolebinding", "gpu-operator", "-n", "kube-amd-gpu"])
        .await;
    assert_eq!(rb["subjects"][0]["kind"], "ServiceAccount");

    // kubectl checked each kind's OpenAPI document (validation was on).
    let counts = s.counts().await;
    for doc in [
        "/openapi/v3/api/v1",
        "/openapi/v3/apis/rbac.authorization.k8s.io/v1",
    ] {
        assert!(count(&counts, "get", doc) >= 1, "{doc} not read:\n{counts}");
    }

    let out = s.ok(&["apply", "-f", deploy]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), expected.len(), "{out}");
    assert!(lines.iter().all(|l| l.ends_with(" unchanged")), "{out}");
    s.stop().await;
}

/// `kubectl get deviceconfig` with the project's real CRD: its printer columns, including
/// the JSONPath filter of the Ready column, and one Age column (the CRD's own; the server
/// adds its default Age only to CRDs without printer columns).
#[tokio::test]
async fn kubectl_get_shows_the_crd_printer_columns() {
    if !kubectl_present("kubectl_get_shows_the_crd_printer_columns") {
        return;
    }
    let s = Server::start().await;
    install_crd(&s).await;
    let dc = s.write("dc.yaml", DEVICECONFIG);
    s.ok(&["apply", "-f", &dc]).await;

    // The columns as the shipped CRD defines them.
    let crd_text =
        std::fs::read_to_string(deploy_dir().join("crd/deviceconfigs.amd.com.yaml")).unwrap();
    let crd: Value = serde_saphyr::from_str(&crd_text).unwrap();
    let version = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["storage"] == true)
        .unwrap();
    let columns = version["additionalPrinterColumns"].as_array().unwrap();
    let ready = r#".status.conditions[?(@.type=="Ready")].status"#;
    let ready_at = columns
        .iter()
        .position(|c| c["jsonPath"] == ready)
        .expect("the CRD has a Ready column with a JSONPath filter");
    // A status that fills every column: the Ready condition, and a distinct number for each
    // integer column (simple paths).
    let status = |ready: &str| {
        let mut obj = serde_json::json!({"status": {"conditions": [
            {"type": "Progressing", "status": "False", "reason": "Done", "message": "",
             "lastTransitionTime": "2025-01-01T00:00:00Z"},
            {"type": "Ready", "status": ready, "reason": "Nodes", "message": "",
             "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]}});
        for (i, c) in columns.iter().enumerate() {
            if c["type"] == "integer" {
                let path = c["jsonPath"].as_str().unwrap();
                let mut at = &mut obj;
                for part in path.trim_start_matches('.').split('.') {
                    at = &mut at[part];
                }
                *at = serde_json::json!(10 + i);
            }
        }
        obj.to_string()
    };
    s.ok(&[
        "patch",
        "deviceconfig",
        "gpus",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status("True"),
    ])
    .await;

    let shown: Vec<&Value> = columns
        .iter()
        .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
        .collect();
    let mut expected_header = vec!["NAME".to_string()];
    expected_header.extend(
        shown
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_ascii_uppercase()),
    );
    assert_eq!(
        expected_header.iter().filter(|h| *h == "AGE").count(),
        1,
        "the CRD lists its own Age column"
    );
    let table = s.ok(&["get", "deviceconfig"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, expected_header, "{table}");
    let row: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(row.len(), expected_header.len(), "{table}");
    assert_eq!(row[0], "gpus");
    for (i, c) in shown.iter().enumerate() {
        let cell = row[i + 1];
        match c["type"].as_str().unwrap() {
            "integer" => {
                let n = 10 + columns.iter().position(|x| x == *c).unwrap();
                assert_eq!(cell, n.to_string(), "column {}: {table}", c["name"]);
            }
            "date" => assert!(
                cell.ends_with('s') || cell.ends_with('m'),
                "column {} is an age: {table}",
                c["name"]
            ),
            _ if *c == &columns[ready_at] => assert_eq!(cell, "True", "{table}"),
            _ => {}
        }
    }
    let ready_cell = 1 + shown.iter().position(|c| *c == &columns[ready_at]).unwrap();

    // The filter follows the condition: Ready going False shows False.
    s.ok(&[
        "patch",
        "deviceconfig",
        "gpus",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status("False"),
    ])
    .await;
    let table = s.ok(&["get", "deviceconfig", "gpus", "--no-headers"]).await;
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(row[ready_cell], "False", "{table}");
    s.stop().await;
}

/// events.k8s.io/v1 and core v1 Events are one resource: what kube-runtime's Recorder writes
/// through events.k8s.io is what `kubectl get events` lists and watches, and the reverse.
#[tokio::test]
async fn kubectl_sees_events_written_through_either_events_api() {
    if !kubectl_present("kubectl_sees_events_written_through_either_events_api") {
        return;
    }
    let s = Server::start().await;
    s.ok(&["create", "namespace", "ev"]).await;

    // A core watch, started before the Event exists.
    let mut watch = s
        .command(&[
            "get",
            "events",
            "-n",
            "ev",
            "-w",
            "-o",
            "jsonpath={.reason}={.message}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The watch is open once the server counts it; only then create the Event.
    poll_until(
        "kubectl's watch open",
        || s.counts(),
        |counts| count(counts, "watch", "events") > 0,
    )
    .await;

    let new_api = s.write(
        "event-v1.yaml",
        "apiVersion: events.k8s.io/v1
kind: Event
metadata:
  name: gpu-ready.1
  namespace: ev
eventTime: \"2025-01-01T00:00:00.000000Z\"
reportingController: amd.com/gpu-operator
reportingInstance: node-1
action: Reconcile
reason: DriverReady
note: driver loaded on node-1
type: Normal
regarding:
  apiVersion: v1
  kind: Node
  name: node-1
",
    );
    s.ok(&["create", "-f", &new_api]).await;
    wait_line(&mut lines, "the core watch event", |l| {
        l == "DriverReady=driver loaded on node-1"
    })
    .await;
    let _ = watch.kill().await;

    // The core table: reason, object and message, as the real printer shows them.
    let table = s.ok(&["get", "events", "-n", "ev"]).await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{table}"
    );
    let row = table.lines().nth(1).unwrap_or("");
    for want in [
        "Normal",
        "DriverReady",
        "node/node-1",
        "driver loaded on node-1",
    ] {
        assert!(row.contains(want), "{want} missing:\n{table}");
    }
    let core = s
        .json(&["get", "events.v1.", "gpu-ready.1", "-n", "ev"])
        .await;
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "driver loaded on node-1");
    assert_eq!(core["involvedObject"]["name"], "node-1");
    assert_eq!(core["reportingComponent"], "amd.com/gpu-operator");
    assert_eq!(core["reportingInstance"], "node-1");
    assert!(core.get("note").is_none(), "{core}");

    // The reverse: a core Event read through events.k8s.io.
    let old_api = s.write(
        "event-core.yaml",
        "apiVersion: v1
kind: Event
metadata:
  name: legacy.1
  namespace: ev
reason: Started
message: started the test
type: Warning
count: 3
firstTimestamp: \"2025-01-01T00:00:00Z\"
lastTimestamp: \"2025-01-01T00:05:00Z\"
source:
  component: kubelet
  host: node-2
involvedObject:
  kind: Pod
  name: runner
  namespace: ev
",
    );
    s.ok(&["create", "-f", &old_api]).await;
    let list = s
        .json(&["get", "events.v1.events.k8s.io", "-n", "ev"])
        .await;
    let items = list["items"].as_array().expect("a list");
    assert_eq!(items.len(), 2, "{list}");
    let legacy = items
        .iter()
        .find(|e| e["metadata"]["name"] == "legacy.1")
        .expect("the core Event through events.k8s.io");
    assert_eq!(legacy["apiVersion"], "events.k8s.io/v1");
    assert_eq!(legacy["note"], "started the test");
    assert_eq!(legacy["regarding"]["name"], "runner");
    assert_eq!(legacy["deprecatedCount"], 3);
    assert_eq!(legacy["deprecatedSource"]["host"], "node-2");
    assert_eq!(legacy["deprecatedLastTimestamp"], "2025-01-01T00:05:00Z");

    // A change through one API is seen through the other; a delete removes it from both.
    s.ok(&[
        "patch",
        "events.v1.events.k8s.io",
        "gpu-ready.1",
        "-n",
        "ev",
        "--type=merge",
        "-p",
        r#"{"note":"driver reloaded"}"#,
    ])
    .await;
    let core = s
        .json(&["get", "events.v1.", "gpu-ready.1", "-n", "ev"])
        .await;
    assert_eq!(core["message"], "driver reloaded");
    s.ok(&["delete", "events.v1.", "legacy.1", "-n", "ev"])
        .await;
    let list = s
        .json(&["get", "events.v1.events.k8s.io", "-n", "ev"])
        .await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    s.stop().await;
}

/// The project's deploy/30-deviceconfig.yaml with `enableNodeLabeller` misspelled, as a user
/// might: the CRD's schema has no such field.
fn deviceconfig_with_a_typo() -> String {
    let text = std::fs::read_to_string(deploy_dir().join("30-deviceconfig.yaml")).unwrap();
    assert!(
        text.contains("enableNodeLabeller: true"),
        "deploy/30-deviceconfig.yaml changed; update this test"
    );
    text.replace("enableNodeLabeller: true", "enableNodeLabeler: true")
}

/// kubectl's default `--validate=strict` sends `fieldValidation=Strict` (the emulator's
/// OpenAPI says the server supports it), so a misspelled field fails the apply with the real
/// server's strict decoding error, on create and on the patch of an existing object alike;
/// `--validate=warn` applies it with a warning and the field dropped; server-side apply
/// refuses it whatever the directive.
#[tokio::test]
async fn kubectl_strict_validation_rejects_a_typo_in_a_deviceconfig() {
    if !kubectl_present("kubectl_strict_validation_rejects_a_typo_in_a_deviceconfig") {
        return;
    }
    let s = Server::start().await;
    install_crd(&s).await;
    s.ok(&["create", "namespace", "kube-amd-gpu"]).await;
    let typo = s.write("typo.yaml", &deviceconfig_with_a_typo());
    let get = ["get", "deviceconfig", "default", "-n", "kube-amd-gpu"];

    let (code, out, err) = s.exit(&["apply", "-f", &typo]).await;
    assert_eq!(code, Some(1), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains(&format!(
            "Error from server (BadRequest): error when creating \"{typo}\": DeviceConfig in version \"v1alpha1\" \
             cannot be handled as a DeviceConfig: strict decoding error: unknown field \"spec.devicePlugin.enableNodeLabeler\""
        )),
        "{err}"
    );
    let (found, _, err) = s.run(&get).await;
    assert!(
        !found && err.contains("NotFound"),
        "nothing is stored: {err}"
    );

    let (code, out, err) = s.exit(&["apply", "--validate=warn", "-f", &typo]).await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("deviceconfig.amd.com/default created"),
        "{out}"
    );
    assert_eq!(
        err.trim(),
        "Warning: unknown field \"spec.devicePlugin.enableNodeLabeler\"",
        "{err}"
    );
    let stored = s.json(&get).await;
    let plugin = &stored["spec"]["devicePlugin"];
    assert_eq!(plugin["enableDevicePlugin"], true, "{stored}");
    assert!(
        plugin.get("enableNodeLabeler").is_none(),
        "the unknown field is dropped: {stored}"
    );

    // The object exists now: kubectl patches it, and the patched object is checked.
    let (code, out, err) = s.exit(&["apply", "-f", &typo]).await;
    assert_eq!(code, Some(1), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("The request is invalid: patch: Invalid value: ")
            && err.contains(
                "strict decoding error: unknown field \"spec.devicePlugin.enableNodeLabeler\""
            ),
        "{err}"
    );
    let (code, out, err) = s.exit(&["apply", "--validate=false", "-f", &typo]).await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(err.trim().is_empty(), "Ignore warns about nothing: {err}");

    // Server-side apply converts the configuration to the schema's type: always an error.
    let (code, _, err) = s
        .exit(&["apply", "--server-side", "--validate=false", "-f", &typo])
        .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "failed to create typed patch object (kube-amd-gpu/default; amd.com/v1alpha1, Kind=DeviceConfig): \
             .spec.devicePlugin.enableNodeLabeler: field not declared in schema"
        ),
        "{err}"
    );

    // The manifest as shipped is clean: it applies with no warning.
    let shipped = deploy_dir().join("30-deviceconfig.yaml");
    let (code, out, err) = s
        .exit(&["apply", "-f", shipped.to_str().expect("UTF-8 path")])
        .await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("deviceconfig.amd.com/default configured"),
        "{out}"
    );
    assert!(err.trim().is_empty(), "{err}");
    let stored = s.json(&get).await;
    assert_eq!(stored["spec"]["devicePlugin"]["enableNodeLabeller"], true);
    s.stop().await;
}

/// The same for a built-in kind, whose known fields are those of its Go type: a ConfigMap
/// with a field at the top level that ConfigMaps do not have.
#[tokio::test]
async fn kubectl_strict_validation_rejects_an_unknown_configmap_field() {
    if !kubectl_present("kubectl_strict_validation_rejects_an_unknown_configmap_field") {
        return;
    }
    let s = Server::start().await;
    let cm = s.write(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\nsettings:\n  mode: slow\n",
    );
    let (code, out, err) = s.exit(&["apply", "-f", &cm]).await;
    assert_eq!(code, Some(1), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains(&format!(
            "Error from server (BadRequest): error when creating \"{cm}\": ConfigMap in version \"v1\" \
             cannot be handled as a ConfigMap: strict decoding error: unknown field \"settings\""
        )),
        "{err}"
    );
    let (found, _, _) = s.run(&["get", "configmap", "settings"]).await;
    assert!(!found, "nothing is stored");

    let (code, out, err) = s.exit(&["create", "--validate=warn", "-f", &cm]).await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("configmap/settings created"), "{out}");
    assert_eq!(err.trim(), "Warning: unknown field \"settings\"", "{err}");
    let stored = s.json(&["get", "configmap", "settings"]).await;
    assert_eq!(stored["data"], serde_json::json!({"mode": "fast"}));
    assert!(stored.get("settings").is_none(), "{stored}");

    // Updates are checked too (kubectl replace is a PUT).
    let (code, _, err) = s.exit(&["replace", "-f", &cm]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"settings\""
        ),
        "{err}"
    );
    s.stop().await;
}

/// The server-side apply semantics the agent's Node writer relies on, driven
/// by kubectl as an administrator would: each field manager's apply, a
/// conflict on a value another manager owns and `--force-conflicts` taking it
/// over, a label removed by omitting it, and a label shared with another
/// writer's equal value that omitting does not remove.
#[tokio::test]
async fn kubectl_server_side_apply_tracks_owners_as_the_node_writer_expects() {
    if !kubectl_present("kubectl_server_side_apply_tracks_owners_as_the_node_writer_expects") {
        return;
    }
    let s = Server::start().await;
    let node = s.write("node.yaml", NODE);
    s.ok(&["create", "-f", &node]).await;
    let labels_file = |name: &str, labels: &[(&str, &str)]| {
        let mut text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n".to_owned();
        if !labels.is_empty() {
            text.push_str("  labels:\n");
            for (k, v) in labels {
                text.push_str(&format!("    {k}: \"{v}\"\n"));
            }
        }
        s.write(name, &text)
    };
    let labels = |node: &Value| node["metadata"]["labels"].clone();
    let apply = |file: String, manager: &'static str| {
        let s = &s;
        async move {
            s.exit(&[
                "apply",
                "--server-side",
                "--field-manager",
                manager,
                "-f",
                &file,
            ])
            .await
        }
    };

    // The labeller applies two labels.
    let first = labels_file(
        "l1.yaml",
        &[("amd.com/gpu.family", "AI"), ("amd.com/gpu.vram", "192G")],
    );
    let (code, _, err) = apply(first, "gpu-operator-labeller").await;
    assert_eq!(code, Some(0), "{err}");
    // Another manager applying another value of an owned label: a conflict...
    let other = labels_file("o1.yaml", &[("amd.com/gpu.vram", "64G")]);
    let (code, _, err) = apply(other.clone(), "someone-else").await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("conflict"), "{err}");
    assert!(err.contains(".metadata.labels.amd.com/gpu.vram"), "{err}");
    // ... which --force-conflicts resolves by taking the field over.
    let (code, _, err) = s
        .exit(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "someone-else",
            "-f",
            &other,
        ])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let got = s.json(&["get", "node", "node-1"]).await;
    assert_eq!(labels(&got)["amd.com/gpu.vram"], "64G");

    // An admin sets a label by hand (an Update); the labeller applies the same
    // value: shared, no conflict.
    s.ok(&["label", "node", "node-1", "amd.com/gpu.note=x"])
        .await;
    let shared = labels_file(
        "l2.yaml",
        &[("amd.com/gpu.family", "AI"), ("amd.com/gpu.note", "x")],
    );
    let (code, _, err) = apply(shared, "gpu-operator-labeller").await;
    assert_eq!(code, Some(0), "{err}");

    // The labeller stops applying both: family (its own alone) is removed,
    // note (shared with the admin) stays, vram (someone else's) stays.
    let none = labels_file("l3.yaml", &[]);
    let (code, _, err) = apply(none, "gpu-operator-labeller").await;
    assert_eq!(code, Some(0), "{err}");
    let got = s
        .json(&["get", "node", "node-1", "--show-managed-fields"])
        .await;
    let now = labels(&got);
    assert!(now.get("amd.com/gpu.family").is_none(), "{now}");
    assert_eq!(now["amd.com/gpu.note"], "x", "{now}");
    assert_eq!(now["amd.com/gpu.vram"], "64G", "{now}");
    assert_eq!(
        now["kubernetes.io/hostname"], "node-1",
        "the creator's label untouched"
    );
    let managers: Vec<&str> = got["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert!(managers.contains(&"someone-else"), "{managers:?}");
    assert!(managers.contains(&"kubectl-label"), "{managers:?}");
    s.stop().await;
}
