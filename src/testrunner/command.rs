//! Which program a test case runs, with which arguments, and how its results
//! are read back.
//!
//! Command lines follow the reference:
//! - RVS: `rvs -c <conf dir>[/<MODEL>]/<recipe>.conf [-i 0,1] -j [arguments]`;
//!   the per-model directory is used when it holds the recipe. With `-j`, RVS
//!   writes its results to `<results dir>/<name>_<digits>.json` and prints that
//!   path.
//! - AGFHC: `agfhc -r <recipe> [-i 0 1] -o <results dir> [arguments]`; results
//!   go to `<results dir>/agfhc_YYYYMMDD-HHMMSS/results.json`, whose directory is
//!   printed.
//! - COMMAND: the configured program and arguments, then `Arguments`.
//!
//! Every test process also gets `GPU_TEST_RECIPE`, `GPU_TEST_TRIGGER`,
//! `GPU_TEST_ITERATION` and `GPU_TEST_GPUS` (comma-separated GPU indexes) in its
//! environment, so a COMMAND test knows what to test.
//!
//! Program paths are configuration ([`Commands`]), which is how tests put
//! stand-ins in place of the real tools. Building command lines and parsing
//! result files is pure; [`rvs_conf`] and [`read_results`] touch the file
//! system.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::config::{Framework, TestCase, TestConfig, Trigger};
use super::report::{ActionResult, SuitesResult};

/// Upper bound on a result file: real ones are a few KiB.
const MAX_RESULT_BYTES: u64 = 16 * 1024 * 1024;

/// The reference test runner image's tool paths: the agent's defaults.
pub const DEFAULT_RVS: &str = "/opt/rocm/bin/rvs";
pub const DEFAULT_RVS_CONF_DIR: &str = "/opt/rocm/share/rocm-validation-suite/conf";
pub const DEFAULT_AGFHC: &str = "/opt/amd/agfhc/agfhc";
/// Where both tools write their results by default.
pub const DEFAULT_RESULTS_DIR: &str = "/var/tmp";

/// Where the test tools live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commands {
    pub rvs: PathBuf,
    /// RVS recipes: `<dir>/<recipe>.conf` and per-model `<dir>/<MODEL>/<recipe>.conf`.
    pub rvs_conf_dir: PathBuf,
    /// Where RVS writes its JSON results.
    pub rvs_results_dir: PathBuf,
    pub agfhc: PathBuf,
    /// Where AGFHC writes its result directories (`-o`).
    pub agfhc_results_dir: PathBuf,
    /// Which programs COMMAND tests may start.
    pub allowed: AllowedCommands,
}

/// Which programs COMMAND tests may start. Set by the node's administrator
/// (`--allow-test-command`), never by the ConfigMap that names the programs:
/// the ConfigMap is writable through the API, and tests run as root on every
/// node. RVS and AGFHC, at their configured paths, are not COMMAND tests and
/// need no entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AllowedCommands {
    /// COMMAND tests are refused (the agent's default).
    #[default]
    None,
    /// Programs that are one of these files, or inside one of these
    /// directories (at any depth), after resolving symbolic links.
    Listed(Vec<PathBuf>),
    /// Any program: `gpu-operator check`, run by hand by the administrator.
    Any,
}

impl AllowedCommands {
    /// What `--allow-test-command` (repeatable) asks for: none when empty.
    pub fn from_flags(paths: Vec<PathBuf>) -> Self {
        if paths.is_empty() {
            Self::None
        } else {
            Self::Listed(paths)
        }
    }

    /// The program to start for a COMMAND test naming `program`: its resolved
    /// path, so that what runs is what was checked. `Err` says why not.
    pub fn permit(&self, program: &Path) -> Result<PathBuf, String> {
        let entries = match self {
            Self::Any => return Ok(program.to_path_buf()),
            Self::None => {
                return Err(format!(
                    "COMMAND test program {} refused: this agent allows no COMMAND tests \
                     (the node's administrator allows programs with --allow-test-command)",
                    program.display()
                ));
            }
            Self::Listed(entries) => entries,
        };
        if !program.is_absolute() {
            return Err(format!(
                "COMMAND test program {:?} refused: COMMAND tests must name an absolute \
                 path (a name is looked up in PATH, which the allow-list cannot vouch for)",
                program.display().to_string()
            ));
        }
        let resolved = std::fs::canonicalize(program).map_err(|e| {
            format!(
                "COMMAND test program {} refused: cannot resolve it: {e}",
                program.display()
            )
        })?;
        let allowed = entries.iter().any(|entry| {
            std::fs::canonicalize(entry).is_ok_and(|entry| {
                resolved == entry || (entry.is_dir() && resolved.starts_with(&entry))
            })
        });
        if allowed {
            Ok(resolved)
        } else {
            let list: Vec<String> = entries.iter().map(|e| e.display().to_string()).collect();
            Err(format!(
                "COMMAND test program {} (resolved: {}) refused: not under --allow-test-command {}",
                program.display(),
                resolved.display(),
                list.join(", ")
            ))
        }
    }
}

impl Default for Commands {
    /// The locations in the reference's test runner image.
    fn default() -> Self {
        Self {
            rvs: DEFAULT_RVS.into(),
            rvs_conf_dir: DEFAULT_RVS_CONF_DIR.into(),
            rvs_results_dir: DEFAULT_RESULTS_DIR.into(),
            agfhc: DEFAULT_AGFHC.into(),
            agfhc_results_dir: DEFAULT_RESULTS_DIR.into(),
            allowed: AllowedCommands::None,
        }
    }
}

/// The programs the tests configured for `node` would start, under any
/// trigger. A COMMAND program without a `/` is looked up in `PATH` at run time
/// and is not listed.
pub fn programs_needed(tests: &TestConfig, node: &str, commands: &Commands) -> Vec<PathBuf> {
    let mut programs: Vec<PathBuf> = Trigger::ALL
        .iter()
        .filter_map(|t| tests.trigger(node, *t))
        .flat_map(|t| &t.test_cases)
        .filter_map(|case| match case.framework {
            Framework::Rvs => Some(commands.rvs.clone()),
            Framework::Agfhc => Some(commands.agfhc.clone()),
            Framework::Command => case
                .command
                .first()
                .filter(|p| p.contains('/'))
                .map(PathBuf::from),
        })
        .collect();
    programs.sort();
    programs.dedup();
    programs
}

/// Why COMMAND tests configured for `node` would be refused, under any trigger
/// ([`AllowedCommands::permit`]).
pub fn refused_commands(tests: &TestConfig, node: &str, commands: &Commands) -> Vec<String> {
    let mut refused: Vec<String> = Trigger::ALL
        .iter()
        .filter_map(|t| tests.trigger(node, *t))
        .flat_map(|t| &t.test_cases)
        .filter(|case| case.framework == Framework::Command)
        .filter_map(|case| {
            let program = case.command.first().map(PathBuf::from).unwrap_or_default();
            commands.allowed.permit(&program).err()
        })
        .collect();
    refused.sort();
    refused.dedup();
    refused
}

/// The program `case` would start and why it cannot be, if it cannot: the
/// tool is missing or not executable, or (COMMAND) the program is not
/// allowed. A bare COMMAND name is looked up in PATH when it starts, and is
/// judged then. Told apart from a failing GPU before anything runs.
pub fn tool_unavailable(case: &TestCase, commands: &Commands) -> Option<(PathBuf, String)> {
    let program = command_line(case, commands, Path::new(""), &[]).program;
    if case.framework == crate::testrunner::Framework::Command
        && let Err(why) = commands.allowed.permit(&program)
    {
        return Some((program, why));
    }
    if !program.to_string_lossy().contains('/') {
        return None;
    }
    unstartable(&program).map(|why| (program, why))
}

/// The flag of `gpu-operator agent` that points at `framework`'s tool (or,
/// for COMMAND, allows its program).
pub fn tool_flag(framework: crate::testrunner::Framework) -> &'static str {
    match framework {
        crate::testrunner::Framework::Rvs => "--rvs",
        crate::testrunner::Framework::Agfhc => "--agfhc",
        crate::testrunner::Framework::Command => "--allow-test-command",
    }
}

/// Why `program` cannot be started, if it cannot: it is missing, not a file,
/// or not executable.
pub fn unstartable(program: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(program) {
        Err(e) => Some(format!("cannot start {}: {e}", program.display())),
        Ok(meta) if !meta.is_file() => Some(format!("{} is not a file", program.display())),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => {
            Some(format!("{} is not executable", program.display()))
        }
        Ok(_) => None,
    }
}

/// A program to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandLine {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl CommandLine {
    /// The whole command line, for logs.
    pub fn display(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The command line of one iteration. `selected` holds the GPU indexes to pass
/// with `-i`, or is empty to let the tool test every GPU; `conf` is the RVS
/// recipe file ([`rvs_conf`]).
pub fn command_line(
    case: &TestCase,
    commands: &Commands,
    conf: &Path,
    selected: &[u32],
) -> CommandLine {
    let ids = |sep: &str| {
        selected
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(sep)
    };
    let (program, mut args) = match case.framework {
        Framework::Rvs => {
            let mut args = vec!["-c".to_owned(), conf.display().to_string()];
            if !selected.is_empty() {
                args.extend(["-i".to_owned(), ids(",")]);
            }
            args.push("-j".to_owned());
            (commands.rvs.clone(), args)
        }
        Framework::Agfhc => {
            let mut args = vec!["-r".to_owned(), case.recipe.clone()];
            if !selected.is_empty() {
                args.push("-i".to_owned());
                args.extend(selected.iter().map(u32::to_string));
            }
            args.extend([
                "-o".to_owned(),
                commands.agfhc_results_dir.display().to_string(),
            ]);
            (commands.agfhc.clone(), args)
        }
        Framework::Command => {
            // The parser guarantees a program; an empty one fails to start.
            let mut parts = case.command.iter();
            let program = parts.next().cloned().unwrap_or_default();
            (PathBuf::from(program), parts.cloned().collect())
        }
    };
    args.extend(case.arguments.iter().cloned());
    CommandLine {
        program,
        args,
        env: vec![
            ("GPU_TEST_RECIPE".into(), case.recipe.clone()),
            ("GPU_TEST_GPUS".into(), ids(",")),
        ],
    }
}

/// The RVS recipe file: the per-model one when it exists, else the generic one.
pub fn rvs_conf(commands: &Commands, model: Option<&str>, recipe: &str) -> PathBuf {
    if let Some(model) = model {
        let per_model = commands
            .rvs_conf_dir
            .join(model)
            .join(format!("{recipe}.conf"));
        if per_model.is_file() {
            return per_model;
        }
    }
    commands.rvs_conf_dir.join(format!("{recipe}.conf"))
}

/// Finds the result file a tool announced in its output, if any.
pub fn result_location(framework: Framework, commands: &Commands, stdout: &str) -> Option<PathBuf> {
    match framework {
        Framework::Rvs => {
            let dir = commands.rvs_results_dir.display().to_string();
            paths_under(stdout, &dir)
                .filter(|p| is_rvs_result_name(p))
                .last()
                .map(PathBuf::from)
        }
        Framework::Agfhc => {
            let dir = commands.agfhc_results_dir.display().to_string();
            paths_under(stdout, &dir)
                .filter_map(agfhc_result_dir)
                .last()
                .map(|d| PathBuf::from(d).join("results.json"))
        }
        Framework::Command => None,
    }
}

/// Words of `text` that are paths directly under `dir`.
fn paths_under<'a>(text: &'a str, dir: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    let dir = dir.trim_end_matches('/');
    text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '(' | ')'))
        .filter(move |word| {
            word.strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|name| !name.is_empty())
        })
}

/// `<dir>/<name>_<digits>.json`, the reference's pattern for RVS results.
fn is_rvs_result_name(path: &str) -> bool {
    let Some(file) = path.rsplit('/').next() else {
        return false;
    };
    let Some(stem) = file.strip_suffix(".json") else {
        return false;
    };
    stem.rsplit_once('_').is_some_and(|(name, digits)| {
        !name.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

/// `<dir>/agfhc_YYYYMMDD-HHMMSS`, possibly followed by more path.
fn agfhc_result_dir(path: &str) -> Option<&str> {
    let start = path.find("/agfhc_")? + "/agfhc_".len();
    let stamp = path.get(start..start + 15)?;
    let ok = stamp.bytes().enumerate().all(|(i, b)| {
        if i == 8 {
            b == b'-'
        } else {
            b.is_ascii_digit()
        }
    });
    ok.then(|| &path[..start + 15])
}

/// Reads and parses the result file a tool announced. `Ok(empty)` when it
/// announced none.
pub fn read_results(
    framework: Framework,
    commands: &Commands,
    stdout: &str,
) -> Result<SuitesResult, String> {
    let Some(path) = result_location(framework, commands, stdout) else {
        return Ok(SuitesResult::new());
    };
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_RESULT_BYTES).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let parsed = match framework {
        Framework::Rvs => parse_rvs_results(&text),
        Framework::Agfhc => parse_agfhc_results(&text),
        Framework::Command => Ok(SuitesResult::new()),
    };
    parsed.map_err(|e| format!("{}: {e}", path.display()))
}

/// RVS's JSON results: `{"version": ..., "<module>": {"<action>": [{"gpu_index":
/// "0", "pass": "true"}, ...]}}`. Entries without `pass` are progress records.
///
/// Results are a tool's output, not a configuration a person wrote: what is
/// not understood is skipped rather than reported, so they are not read
/// through `api::tracked` as the config files are.
pub fn parse_rvs_results(text: &str) -> Result<SuitesResult, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let root = root.as_object().ok_or("not a JSON object")?;
    let mut out = SuitesResult::new();
    for (module, actions) in root {
        if module == "version" {
            continue;
        }
        let Some(actions) = actions.as_object() else {
            continue;
        };
        for (action, entries) in actions {
            for entry in entries.as_array().into_iter().flatten() {
                let gpu = match entry.get("gpu_index") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => continue,
                };
                let pass = match entry.get("pass") {
                    Some(Value::String(s)) if !s.is_empty() => s == "true",
                    Some(Value::Bool(b)) => *b,
                    _ => continue,
                };
                let result = if pass {
                    ActionResult::Success
                } else {
                    ActionResult::Failure
                };
                out.entry(gpu).or_default().insert(action.clone(), result);
            }
        }
    }
    Ok(out)
}

/// AGFHC's `results.json`: the tested devices in `program_args.device_ids`
/// (`GPU-00`), and per test a `state` and, for failures, the failing devices in
/// `primary_action_subject` (`GPU-00:GPU-01`).
pub fn parse_agfhc_results(text: &str) -> Result<SuitesResult, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let devices: Vec<&str> = root
        .pointer("/program_args/device_ids")
        .and_then(Value::as_array)
        .ok_or("program_args.device_ids is missing")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let tests = root
        .get("test_results")
        .and_then(Value::as_object)
        .ok_or("test_results is missing")?;
    let index = |id: &str| -> String {
        let digits = id.rsplit('-').next().unwrap_or(id).trim_start_matches('0');
        if digits.is_empty() {
            "0".into()
        } else {
            digits.into()
        }
    };
    let mut out = SuitesResult::new();
    for device in devices {
        for test in tests.values() {
            let name = test
                .get("test")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            let state = test
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_ascii_lowercase();
            let subject = test
                .get("primary_action_subject")
                .and_then(Value::as_str)
                .unwrap_or("");
            let result = match state.as_str() {
                "passed" => ActionResult::Success,
                "skipped" => ActionResult::Skipped,
                "queued" => ActionResult::Queued,
                // A failure names the devices it concerns; the others passed.
                "failed" if !subject.is_empty() && !subject.split(':').any(|s| s == device) => {
                    ActionResult::Success
                }
                _ => ActionResult::Failure,
            };
            out.entry(index(device))
                .or_default()
                .insert(name.to_owned(), result);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands() -> Commands {
        Commands {
            rvs: "/x/rvs".into(),
            rvs_conf_dir: "/x/conf".into(),
            rvs_results_dir: DEFAULT_RESULTS_DIR.into(),
            agfhc: "/x/agfhc".into(),
            agfhc_results_dir: "/var/tmp/agfhc".into(),
            allowed: AllowedCommands::None,
        }
    }

    #[test]
    fn programs_needed_follow_the_config() {
        // The default config runs gst_single through RVS.
        assert_eq!(
            programs_needed(&TestConfig::default(), "node-a", &commands()),
            [PathBuf::from("/x/rvs")]
        );
        let mut tests = TestConfig::default();
        for location in tests.locations.values_mut() {
            for trigger in location.triggers.values_mut() {
                for case in &mut trigger.test_cases {
                    case.framework = Framework::Command;
                    case.command = vec!["true".into()];
                }
            }
        }
        assert!(programs_needed(&tests, "node-a", &commands()).is_empty());
    }

    #[test]
    fn command_tests_need_the_administrators_allow_list() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let allowed_dir = dir.path().join("allowed");
        let other_dir = dir.path().join("other");
        std::fs::create_dir_all(allowed_dir.join("sub")).unwrap();
        std::fs::create_dir_all(&other_dir).unwrap();
        let script = |path: &Path| {
            std::fs::write(path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let inside = allowed_dir.join("sub/check");
        let outside = other_dir.join("evil");
        let single = other_dir.join("single");
        script(&inside);
        script(&outside);
        script(&single);

        // The default refuses everything, and says how to allow.
        let why = AllowedCommands::None.permit(&inside).unwrap_err();
        assert!(why.contains("--allow-test-command"), "{why}");
        assert_eq!(AllowedCommands::from_flags(vec![]), AllowedCommands::None);

        let list = AllowedCommands::from_flags(vec![allowed_dir.clone(), single.clone()]);
        let resolved = std::fs::canonicalize(&inside).unwrap();
        assert_eq!(list.permit(&inside).unwrap(), resolved);
        assert_eq!(
            list.permit(&single).unwrap(),
            std::fs::canonicalize(&single).unwrap()
        );
        let why = list.permit(&outside).unwrap_err();
        assert!(why.contains("not under --allow-test-command"), "{why}");
        // `..` and symbolic links are resolved before the check.
        let dotdot = allowed_dir.join("../other/evil");
        assert!(list.permit(&dotdot).is_err());
        let link = allowed_dir.join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert!(list.permit(&link).unwrap_err().contains("resolved"));
        // A file entry allows that file, not its siblings.
        let sibling = other_dir.join("single2");
        script(&sibling);
        assert!(list.permit(&sibling).is_err());
        // Names looked up in PATH, and missing programs, are refused.
        assert!(
            list.permit(Path::new("sh"))
                .unwrap_err()
                .contains("absolute")
        );
        assert!(
            list.permit(&allowed_dir.join("absent"))
                .unwrap_err()
                .contains("cannot resolve")
        );
        // `check` (by hand) allows anything, unchanged.
        assert_eq!(
            AllowedCommands::Any.permit(Path::new("sh")).unwrap(),
            PathBuf::from("sh")
        );

        // Readiness lists what would be refused.
        let mut tests = TestConfig::default();
        for location in tests.locations.values_mut() {
            for trigger in location.triggers.values_mut() {
                for case in &mut trigger.test_cases {
                    case.framework = Framework::Command;
                    case.command = vec![outside.display().to_string()];
                }
            }
        }
        let listed = Commands {
            allowed: list.clone(),
            ..commands()
        };
        let refused = refused_commands(&tests, "node-a", &listed);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("evil"));
        let fine = Commands {
            allowed: AllowedCommands::from_flags(vec![other_dir.clone()]),
            ..commands()
        };
        assert!(refused_commands(&tests, "node-a", &fine).is_empty());
        // RVS tests are not COMMAND tests.
        assert!(refused_commands(&TestConfig::default(), "node-a", &listed).is_empty());
    }

    #[test]
    fn unstartable_programs_say_why() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("rvs");
        assert!(unstartable(&missing).unwrap().contains("cannot start"));
        std::fs::write(&missing, "#!/bin/sh\n").unwrap();
        assert!(unstartable(&missing).unwrap().contains("not executable"));
        std::fs::set_permissions(&missing, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(unstartable(&missing), None);
        assert!(unstartable(dir.path()).unwrap().contains("not a file"));
    }

    #[test]
    fn rvs_command_line() {
        let case = TestCase {
            arguments: vec!["--parallel".into()],
            ..TestCase::new("gst_single")
        };
        let line = command_line(
            &case,
            &commands(),
            Path::new("/x/conf/gst_single.conf"),
            &[0, 3],
        );
        assert_eq!(line.program, PathBuf::from("/x/rvs"));
        assert_eq!(
            line.args,
            [
                "-c",
                "/x/conf/gst_single.conf",
                "-i",
                "0,3",
                "-j",
                "--parallel"
            ]
        );
        assert!(line.env.contains(&("GPU_TEST_GPUS".into(), "0,3".into())));
        let all = command_line(&case, &commands(), Path::new("/c"), &[]);
        assert_eq!(all.args, ["-c", "/c", "-j", "--parallel"]);
    }

    #[test]
    fn agfhc_and_command_lines() {
        let case = TestCase {
            framework: Framework::Agfhc,
            arguments: vec!["--ignore-dmesg".into()],
            ..TestCase::new("all_lvl1")
        };
        let line = command_line(&case, &commands(), Path::new("/unused"), &[0, 1]);
        assert_eq!(
            line.args,
            [
                "-r",
                "all_lvl1",
                "-i",
                "0",
                "1",
                "-o",
                "/var/tmp/agfhc",
                "--ignore-dmesg"
            ]
        );
        let case = TestCase {
            framework: Framework::Command,
            command: vec!["/bin/check".into(), "--fast".into()],
            arguments: vec!["x".into()],
            ..TestCase::new("smoke")
        };
        let line = command_line(&case, &commands(), Path::new("/unused"), &[]);
        assert_eq!(line.program, PathBuf::from("/bin/check"));
        assert_eq!(line.args, ["--fast", "x"]);
    }

    #[test]
    fn per_model_recipes_are_preferred_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let commands = Commands {
            rvs_conf_dir: dir.path().to_path_buf(),
            ..Commands::default()
        };
        std::fs::create_dir_all(dir.path().join("MI300X")).unwrap();
        std::fs::write(dir.path().join("MI300X/gst_single.conf"), "").unwrap();
        assert_eq!(
            rvs_conf(&commands, Some("MI300X"), "gst_single"),
            dir.path().join("MI300X/gst_single.conf")
        );
        assert_eq!(
            rvs_conf(&commands, Some("MI300X"), "babel"),
            dir.path().join("babel.conf")
        );
        assert_eq!(
            rvs_conf(&commands, None, "gst_single"),
            dir.path().join("gst_single.conf")
        );
    }

    #[test]
    fn finds_announced_result_files() {
        let c = commands();
        let out = "[RESULT] ... log written to /var/tmp/gst_single_1700000000.json\ndone";
        assert_eq!(
            result_location(Framework::Rvs, &c, out),
            Some(PathBuf::from("/var/tmp/gst_single_1700000000.json"))
        );
        assert_eq!(
            result_location(Framework::Rvs, &c, "/var/tmp/other.json /etc/x_1.json"),
            None
        );
        let out = "results in '/var/tmp/agfhc/agfhc_20231001-123456/'";
        assert_eq!(
            result_location(Framework::Agfhc, &c, out),
            Some(PathBuf::from(
                "/var/tmp/agfhc/agfhc_20231001-123456/results.json"
            ))
        );
        assert_eq!(
            result_location(Framework::Agfhc, &c, "/var/tmp/agfhc/agfhc_2023"),
            None
        );
        assert_eq!(result_location(Framework::Command, &c, out), None);
    }

    #[test]
    fn parses_rvs_results() {
        let text = r#"{"version":"1.0",
            "gst":{"gst-1215Tflops":[{"gpu_index":"0","pass":"true"},{"gpu_index":"1","pass":"false"},{"gpu_index":"1"}]},
            "iet":{"iet-power":[{"gpu_index":2,"pass":true}]}}"#;
        let r = parse_rvs_results(text).unwrap();
        assert_eq!(r["0"]["gst-1215Tflops"], ActionResult::Success);
        assert_eq!(r["1"]["gst-1215Tflops"], ActionResult::Failure);
        assert_eq!(r["2"]["iet-power"], ActionResult::Success);
        assert!(parse_rvs_results("[").is_err());
    }

    #[test]
    fn parses_agfhc_results() {
        let text = r#"{"program_args":{"device_ids":["GPU-00","GPU-02"]},
            "test_results":{"a":{"test":"hbm_bw","state":"Failed","primary_action_subject":"GPU-02"},
                            "b":{"test":"gfx_dgemm","state":"Passed"},
                            "c":{"test":"xgmi_a2a","state":"Skipped"}}}"#;
        let r = parse_agfhc_results(text).unwrap();
        assert_eq!(r["0"]["hbm_bw"], ActionResult::Success);
        assert_eq!(r["2"]["hbm_bw"], ActionResult::Failure);
        assert_eq!(r["0"]["gfx_dgemm"], ActionResult::Success);
        assert_eq!(r["2"]["xgmi_a2a"], ActionResult::Skipped);
        assert!(parse_agfhc_results("{}").is_err());
    }
}
