//! The `crd` and `validate` subcommands.
//!
//! Argument structs and entry points for `src/cli/mod.rs` to wire in. The work is
//! done by pure functions ([`validate_text`]) that return the report lines and
//! the outcome; the entry points only read files and print. This module must not
//! hold validation rules of its own: those are in `validate`.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::validate::{document_problems, ignored_field_notes};
use super::yaml::{DocumentKind, field_lines, line_of, parse_documents};

/// Print the DeviceConfig CustomResourceDefinition as YAML, or apply both
/// of this operator's CRDs to the cluster.
///
/// The output is the same as deploy/crd/deviceconfigs.amd.com.yaml; apply it with
/// `gpu-operator crd | kubectl apply -f -`.
#[derive(Args, Debug, Clone, Default)]
pub struct CrdArgs {
    /// Apply the DeviceConfig and RemediationWorkflowStatus CRDs to the
    /// cluster (KUBECONFIG or the in-cluster service account) with
    /// server-side apply, instead of printing: the Helm chart's pre-upgrade
    /// hook, since Helm never upgrades the CRDs in a chart's crds/.
    #[arg(long)]
    pub apply: bool,
    /// With --apply: first refuse (exit 3, naming the nodes) while a
    /// DeviceConfig in --namespace (every namespace with --all-namespaces)
    /// has a node whose driver upgrade is pending or in progress, as the
    /// reference's pre-upgrade check does.
    #[arg(long, requires = "apply")]
    pub refuse_while_upgrading: bool,
    /// The namespace whose DeviceConfigs --refuse-while-upgrading reads.
    #[arg(
        long,
        value_name = "NS",
        env = "POD_NAMESPACE",
        default_value = "kube-amd-gpu"
    )]
    pub namespace: String,
    /// --refuse-while-upgrading reads the DeviceConfigs of every namespace,
    /// whatever --namespace says (the agents follow them all unless
    /// restricted to one).
    #[arg(long, short = 'A', requires = "refuse_while_upgrading")]
    pub all_namespaces: bool,
}

/// Runs `gpu-operator crd`.
pub fn run_crd(_args: CrdArgs) -> ExitCode {
    match super::crd::crd_yaml() {
        Ok(yaml) => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (e.g. `| head`) is not worth a panic or an error code.
            let _ = out.write_all(yaml.as_bytes()).and_then(|()| out.flush());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("gpu-operator crd: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Check DeviceConfig YAML files without a cluster.
///
/// Each file may hold several documents; documents of other kinds are skipped.
/// Every problem is printed as `FILE:LINE: error: FIELD: what`,
/// the line being the offending field's, along with `FILE:LINE: note: …` lines
/// for fields that are accepted but not acted on in this design and for
/// sections left out whose absence means something (an absent `devicePlugin`
/// runs no device plugin). Exit
/// status: 0 when every file is valid, 1 when a file has problems, 2 when a file
/// cannot be read or parsed (the error names its line and column).
#[derive(Args, Debug, Clone)]
pub struct ValidateArgs {
    /// DeviceConfig YAML files to check ("-" reads standard input).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Print problems only: leave out the notes on ignored fields and skipped documents.
    #[arg(long)]
    pub quiet: bool,
}

/// How a file fared. Ordered by severity, so the worst of several files is their `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Every DeviceConfig in it is valid.
    Valid,
    /// It parses, but has problems.
    Invalid,
    /// It cannot be read or parsed.
    Unreadable,
}

impl Outcome {
    /// The exit status for this outcome: 0, 1 or 2.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Valid => 0,
            Self::Invalid => 1,
            Self::Unreadable => 2,
        }
    }
}

/// What `validate` prints for one file, and the outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileReport {
    /// How the file fared.
    pub outcome: Outcome,
    /// Lines to print, each starting with the file name.
    pub lines: Vec<String>,
}

/// Validates the YAML `text` of the file called `name`. With `notes`, the report
/// also lists ignored fields and skipped documents.
pub fn validate_text(name: &str, text: &str, notes: bool) -> FileReport {
    let documents = match parse_documents(text) {
        Ok(documents) => documents,
        Err(err) => {
            return FileReport {
                outcome: Outcome::Unreadable,
                lines: vec![format!(
                    "{name}:{}:{}: cannot parse: {}",
                    err.line, err.column, err.message
                )],
            };
        }
    };
    let mut lines = Vec::new();
    let mut configs = 0usize;
    let mut problems = 0usize;
    let positions = field_lines(text);
    for doc in &documents {
        let fields = positions.get(doc.index);
        // `FILE:LINE:`, as compilers write it: editors and CI annotations jump there.
        let at = |path: &str| {
            let line = fields.and_then(|f| line_of(f, path)).unwrap_or(doc.line);
            format!("{name}:{line}")
        };
        match &doc.kind {
            DocumentKind::DeviceConfig { config, .. } => {
                configs += 1;
                let found = document_problems(doc);
                problems += found.len();
                lines.extend(
                    found
                        .iter()
                        .map(|problem| format!("{}: error: {problem}", at(&problem.path))),
                );
                if notes {
                    lines.extend(
                        config
                            .spec
                            .absent_sections()
                            .iter()
                            .map(|absent| format!("{}: note: {absent}", at(absent.path))),
                    );
                    lines.extend(
                        ignored_field_notes(&config.spec)
                            .iter()
                            .map(|note| format!("{}: note: {note}", at(&note.path))),
                    );
                }
            }
            DocumentKind::Other { api_version, kind } => {
                if notes {
                    lines.push(format!(
                        "{}: note: document {} skipped, not a DeviceConfig (apiVersion {}, kind {})",
                        at(""),
                        doc.index,
                        api_version.as_deref().unwrap_or("missing"),
                        kind.as_deref().unwrap_or("missing")
                    ));
                }
            }
        }
    }
    let outcome = if configs == 0 {
        lines.push(format!("{name}: no DeviceConfig document found"));
        Outcome::Invalid
    } else if problems > 0 {
        let s = if problems == 1 { "" } else { "s" };
        lines.push(format!(
            "{name}: invalid: {problems} problem{s} in {configs} DeviceConfig(s)"
        ));
        Outcome::Invalid
    } else {
        lines.push(format!("{name}: valid: {configs} DeviceConfig(s)"));
        Outcome::Valid
    };
    FileReport { outcome, lines }
}

/// Reads `path` ("-" is standard input) and validates it.
pub fn validate_file(path: &std::path::Path, notes: bool) -> FileReport {
    let name = path.display().to_string();
    let text = if name == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    } else {
        std::fs::read_to_string(path)
    };
    match text {
        Ok(text) => validate_text(&name, &text, notes),
        Err(err) => FileReport {
            outcome: Outcome::Unreadable,
            lines: vec![format!("{name}: cannot read: {err}")],
        },
    }
}

/// Runs `gpu-operator validate FILE...`.
pub fn run_validate(args: ValidateArgs) -> ExitCode {
    let mut worst = Outcome::Valid;
    let mut out = std::io::stdout().lock();
    for path in &args.files {
        let report = validate_file(path, !args.quiet);
        worst = worst.max(report.outcome);
        for line in &report.lines {
            // Keep going on a closed pipe: the exit status still tells the result.
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = out.flush();
    ExitCode::from(worst.exit_code())
}
