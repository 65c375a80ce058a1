//! `gpu-operator crd` and `gpu-operator validate`, end to end through the built
//! binary, and the report function behind `validate`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_operator::api::cli::{Outcome, validate_file, validate_text};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-operator");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {BIN} {args:?}: {e}"))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write temp file");
    path.display().to_string()
}

const VALID: &str = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: ok\nspec:\n  \
                     devicePlugin:\n    devicePluginImage: rocm/k8s-device-plugin:latest\n";
const INVALID: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kube-amd-gpu\n---\n\
                       apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: a\nspec: {}\n---\n\
                       apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: b\nspec:\n  driver:\n    \
                       upgradePolicy:\n      maxUnavailableNodes: \"130%\"\n  draDriver:\n    enable: true\n  \
                       devicePlugin:\n    enableDevicePlugin: true\n";
const UNPARSEABLE: &str =
    "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nspec:\n  metricsExporter:\n    port: lots\n";

#[test]
fn crd_prints_the_committed_crd() {
    let output = run(&["crd"]);
    assert!(output.status.success(), "{output:?}");
    let committed = std::fs::read_to_string(repo("deploy/crd/deviceconfigs.amd.com.yaml"))
        .expect("committed CRD");
    assert!(
        stdout(&output) == committed,
        "`gpu-operator crd` differs from the committed CRD"
    );
}

#[test]
fn validate_accepts_the_examples() {
    let files: Vec<String> = ["full", "inbox-driver", "driver-upgrade", "dra"]
        .iter()
        .map(|name| {
            repo(&format!("deploy/examples/deviceconfig-{name}.yaml"))
                .display()
                .to_string()
        })
        .collect();
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let output = run(&args);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    for file in &files {
        assert!(
            out.contains(&format!("{file}: valid: 1 DeviceConfig(s)")),
            "{out}"
        );
    }
    assert!(
        out.contains("note: spec.devicePlugin.devicePluginImage: ignored in this design"),
        "{out}"
    );
}

#[test]
fn validate_reports_every_problem_with_file_document_and_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(&dir, "bad.yaml", INVALID);
    let output = run(&["validate", &file]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    // Each problem points at its field's own line, compiler style.
    assert!(
        out.contains(&format!(
            "{file}:19: error: spec.driver.upgradePolicy.maxUnavailableNodes: \"130%\" is not a percentage between 0% and 100%"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("{file}:21: error: spec.draDriver.enable: ")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{file}:1: note: document 0 skipped, not a DeviceConfig"
        )),
        "{out}"
    );
    // A name the API server would refuse.
    let named = write(
        &dir,
        "named.yaml",
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: Bad_Name\nspec: {}\n",
    );
    let output = run(&["validate", &named]);
    let out_named = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out_named}");
    assert!(
        out_named.contains(&format!(
            "{named}:4: error: metadata.name: \"Bad_Name\" is not a valid name"
        )),
        "{out_named}"
    );
    assert!(
        out.contains(&format!("{file}: invalid: 2 problems in 2 DeviceConfig(s)")),
        "{out}"
    );
}

/// `spec: {draDriver: {enable: true}}` is valid in the reference: its CRD
/// has no default on `devicePlugin`, so an absent one runs no device plugin
/// and does not collide with DRA. `validate` says what the absence means.
#[test]
fn validate_accepts_dra_alone_and_says_what_absent_sections_mean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(
        &dir,
        "dra.yaml",
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: dra\nspec:\n  \
         draDriver:\n    enable: true\n",
    );
    let output = run(&["validate", &file]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "{file}:5: note: spec.devicePlugin absent: no device plugin or node labeller runs"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{file}:5: note: spec.driver absent: no driver is managed"
        )),
        "{out}"
    );
    // Written sections get no such note.
    let report = validate_text(
        "p.yaml",
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: p\nspec:\n  \
         driver:\n    enable: false\n  devicePlugin: {}\n",
        true,
    );
    assert_eq!(report.outcome, Outcome::Valid);
    assert!(
        !report.lines.iter().any(|line| line.contains(" absent: ")),
        "{:?}",
        report.lines
    );
}

#[test]
fn validate_exit_status_two_for_unreadable_or_unparseable_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let broken = write(&dir, "broken.yaml", UNPARSEABLE);
    let output = run(&["validate", &broken]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stdout(&output).starts_with(&format!("{broken}:5:11: cannot parse: ")),
        "{}",
        stdout(&output)
    );

    let missing = dir.path().join("missing.yaml").display().to_string();
    let valid = write(&dir, "valid.yaml", VALID);
    let invalid = write(&dir, "invalid.yaml", INVALID);
    // The worst file decides, and every file is still reported.
    let output = run(&["validate", &valid, &missing, &invalid]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let out = stdout(&output);
    assert!(out.contains(&format!("{missing}: cannot read: ")), "{out}");
    assert!(out.contains(&format!("{valid}: valid")), "{out}");
    assert!(out.contains(&format!("{invalid}: invalid")), "{out}");
}

#[test]
fn validate_quiet_leaves_out_notes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(&dir, "ok.yaml", VALID);
    let output = run(&["validate", "--quiet", &file]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(!stdout(&output).contains("note:"), "{}", stdout(&output));
    let output = run(&["validate", &file]);
    assert!(
        stdout(&output).contains("note: spec.devicePlugin.devicePluginImage"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn report_outcomes() {
    assert_eq!(validate_text("v.yaml", VALID, true).outcome, Outcome::Valid);
    assert_eq!(
        validate_text("i.yaml", INVALID, true).outcome,
        Outcome::Invalid
    );
    let unparseable = validate_text("u.yaml", UNPARSEABLE, true);
    assert_eq!(unparseable.outcome, Outcome::Unreadable);
    assert_eq!(unparseable.lines.len(), 1);
    assert!(
        unparseable.lines[0].starts_with("u.yaml:5:11: cannot parse: "),
        "{:?}",
        unparseable.lines
    );

    let empty = validate_text("e.yaml", "# nothing here\n", true);
    assert_eq!(empty.outcome, Outcome::Invalid);
    assert_eq!(empty.lines, vec!["e.yaml: no DeviceConfig document found"]);

    let missing = validate_file(Path::new("/nonexistent/deviceconfig.yaml"), true);
    assert_eq!(missing.outcome, Outcome::Unreadable);
    assert_eq!(
        [Outcome::Valid, Outcome::Unreadable, Outcome::Invalid]
            .into_iter()
            .max(),
        Some(Outcome::Unreadable)
    );
    assert_eq!(
        (
            Outcome::Valid.exit_code(),
            Outcome::Invalid.exit_code(),
            Outcome::Unreadable.exit_code()
        ),
        (0, 1, 2)
    );
}
