//! The test runner's `config.json`, in the reference format (the ConfigMap named
//! by `testRunner.config`):
//!
//! ```json
//! {"TestConfig": {"GPU_HEALTH_CHECK": {"TestLocationTrigger": {
//!   "global": {"TestParameters": {"AUTO_UNHEALTHY_GPU_WATCH": {"TestCases": [
//!     {"Recipe": "gst_single", "Iterations": 1, "StopOnFailure": true,
//!      "TimeoutSeconds": 600, "Arguments": "--parallel"}]}}},
//!   "node1": {"TestParameters": {"MANUAL": {"TestCases": [{"Recipe": "mem"}]}}}}}}}
//! ```
//!
//! As in the reference: category and trigger keys are case-insensitive; a node
//! whose name is a `TestLocationTrigger` key uses that entry *instead of*
//! `global` (the whole entry, not trigger by trigger); `Framework` is `RVS`
//! (default) or `AGFHC`; `Arguments` is one comma-separated string; `DeviceIDs`
//! are GPU indexes and apply to the triggers that test all GPUs. Fields left out
//! take the reference's documented defaults (`gst_single`, 1 iteration,
//! StopOnFailure true, 3600 s); an explicit 0 for `Iterations` or
//! `TimeoutSeconds` is an error, as it is for the reference.
//!
//! Every test case of a trigger runs, one after the other, each with its own
//! result (the reference runs only the first).
//!
//! Extensions, absent from the reference:
//! - trigger `PERIODIC` with `"IntervalSeconds": N` next to `TestCases` (the
//!   reference schedules tests with a CronJob running the MANUAL trigger);
//! - `"Framework": "COMMAND"` with `"Command": ["/path", "arg", ...]`: any
//!   program; it passes when it exits 0;
//! - `TimeoutSeconds` may have a fraction (`0.5`);
//! - `Arguments` may also be a JSON list of strings.
//!
//! Unknown fields are reported as warnings (once per path) and otherwise
//! ignored, like the reference's JSON decoder ignores them; an unknown trigger
//! is an error (it is almost always a typo that would silently disable tests).
//! A value of the wrong type is an error too: tests must not run other than
//! asked.
//!
//! Read with serde ([`crate::api::tracked`]), then checked across fields.
//! Pure: text in, [`TestConfig`] or a [`ConfigError`] naming the field path out.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::tracked::{
    List, ListItem, Object, Shape, deserialize_shape, join, kind, present, read,
};

/// The only test category the reference defines.
pub const CATEGORY: &str = "GPU_HEALTH_CHECK";
/// The `TestLocationTrigger` key that applies to nodes without an entry of their own.
pub const GLOBAL: &str = "global";
/// The ConfigMap key holding the configuration.
pub const CONFIG_KEY: &str = "config.json";

pub const DEFAULT_RECIPE: &str = "gst_single";
pub const DEFAULT_ITERATIONS: u32 = 1;
pub const DEFAULT_STOP_ON_FAILURE: bool = true;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// What starts a test run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Trigger {
    /// The health monitor marked a GPU unhealthy: test that GPU.
    AutoUnhealthyGpuWatch,
    /// Once, when the agent starts on the node (the reference runs it in an init
    /// container before a workload; here the agent has no such hook).
    PreStartJobCheck,
    /// The Node annotation `amd.com/gpu-test-request`, or `gpu-operator check`.
    Manual,
    /// Every `IntervalSeconds` (extension).
    Periodic,
}

impl Trigger {
    pub const ALL: [Trigger; 4] = [
        Trigger::AutoUnhealthyGpuWatch,
        Trigger::PreStartJobCheck,
        Trigger::Manual,
        Trigger::Periodic,
    ];

    /// The name in `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::AutoUnhealthyGpuWatch => "AUTO_UNHEALTHY_GPU_WATCH",
            Trigger::PreStartJobCheck => "PRE_START_JOB_CHECK",
            Trigger::Manual => "MANUAL",
            Trigger::Periodic => "PERIODIC",
        }
    }

    /// The value of the `testrunner.amd.com/trigger` Event label and of log file
    /// names: the name in lower case, as the reference writes it.
    pub fn label_value(self) -> String {
        self.name().to_ascii_lowercase()
    }

    /// Parses a trigger name, ignoring case. `PRE_START` is accepted for
    /// `PRE_START_JOB_CHECK`, the reference's full name.
    pub fn parse(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case("PRE_START") {
            return Some(Trigger::PreStartJobCheck);
        }
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The tool a test case runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Framework {
    /// ROCm Validation Suite: `rvs -c <conf dir>/<recipe>.conf`.
    #[default]
    Rvs,
    /// AMD GPU Field Health Check: `agfhc -r <recipe>`.
    Agfhc,
    /// Any program named in `Command` (extension).
    Command,
}

impl Framework {
    /// The name in `config.json` and in the `testrunner.amd.com/framework` label.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Rvs => "RVS",
            Framework::Agfhc => "AGFHC",
            Framework::Command => "COMMAND",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Framework::Rvs, Framework::Agfhc, Framework::Command]
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
    }
}

/// One test case: what to run and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestCase {
    pub framework: Framework,
    pub recipe: String,
    pub iterations: u32,
    /// Stop the remaining iterations after one fails or times out.
    pub stop_on_failure: bool,
    /// Limit of each iteration.
    pub timeout: Duration,
    /// Extra command line arguments.
    pub arguments: Vec<String>,
    /// GPU indexes to test; empty for all.
    pub device_ids: Vec<u32>,
    /// The program and its arguments, for [`Framework::Command`].
    pub command: Vec<String>,
}

impl TestCase {
    /// A test case with the reference's defaults.
    pub fn new(recipe: impl Into<String>) -> Self {
        Self {
            framework: Framework::Rvs,
            recipe: recipe.into(),
            iterations: DEFAULT_ITERATIONS,
            stop_on_failure: DEFAULT_STOP_ON_FAILURE,
            timeout: DEFAULT_TIMEOUT,
            arguments: Vec::new(),
            device_ids: Vec::new(),
            command: Vec::new(),
        }
    }
}

/// The test cases of one trigger.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TriggerConfig {
    pub test_cases: Vec<TestCase>,
    /// Time between runs, for [`Trigger::Periodic`].
    pub interval: Option<Duration>,
}

/// The triggers of one `TestLocationTrigger` entry (`global` or a node name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocationConfig {
    pub triggers: BTreeMap<Trigger, TriggerConfig>,
}

/// The `GPU_HEALTH_CHECK` configuration, by location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestConfig {
    pub locations: BTreeMap<String, LocationConfig>,
}

impl Default for TestConfig {
    /// What applies without a ConfigMap: `gst_single` for unhealthy GPUs and for
    /// manual requests, everywhere. Unlike the reference default there is no
    /// `PRE_START_JOB_CHECK` entry, because here it runs when the agent starts: an
    /// hour-long stress test on every agent restart must be asked for.
    fn default() -> Self {
        let one = |recipe: &str| TriggerConfig {
            test_cases: vec![TestCase::new(recipe)],
            interval: None,
        };
        let global = LocationConfig {
            triggers: [
                (Trigger::AutoUnhealthyGpuWatch, one(DEFAULT_RECIPE)),
                (Trigger::Manual, one(DEFAULT_RECIPE)),
            ]
            .into(),
        };
        Self {
            locations: [(GLOBAL.to_owned(), global)].into(),
        }
    }
}

impl TestConfig {
    /// The entry that applies to `node`: its own, else `global`.
    pub fn location(&self, node: &str) -> Option<&LocationConfig> {
        self.locations
            .get(node)
            .or_else(|| self.locations.get(GLOBAL))
    }

    /// The configuration of `trigger` on `node`, if any.
    pub fn trigger(&self, node: &str, trigger: Trigger) -> Option<&TriggerConfig> {
        self.location(node)?.triggers.get(&trigger)
    }
}

/// A configuration that cannot be used, with the path of the offending field
/// (`TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global...`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

/// A parsed configuration and what was ignored in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub config: TestConfig,
    pub warnings: Vec<String>,
}

/// Parses `config.json`.
pub fn parse_config(text: &str) -> Result<Parsed, ConfigError> {
    let root: Value = serde_json::from_str(text).map_err(|e| ConfigError {
        path: format!("{CONFIG_KEY} (line {}, column {})", e.line(), e.column()),
        message: format!("not valid JSON: {e}"),
    })?;
    let mut p = Parser::default();
    let Object(root) = p.read::<Object<RawRoot>>(&root, "")?;
    let Object(categories) = root
        .test_config
        .ok_or_else(|| err("TestConfig", "required"))?;
    let mut locations = None;
    for (key, value) in &categories {
        let path = join("TestConfig", key);
        if !key.eq_ignore_ascii_case(CATEGORY) {
            p.warnings.push(format!(
                "{path}: unknown test category (only {CATEGORY} is known); ignored"
            ));
            continue;
        }
        locations = Some(p.category(value, &path)?);
    }
    let locations = locations.ok_or_else(|| {
        err(
            format!("TestConfig.{CATEGORY}"),
            "required (the only test category)",
        )
    })?;
    Ok(Parsed {
        config: TestConfig { locations },
        warnings: p.warnings,
    })
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

/// The reference's `TestRunnerConfig`, read with serde. Categories are read
/// one by one: only `GPU_HEALTH_CHECK` is this implementation's to check.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawRoot {
    #[serde(rename = "TestConfig", deserialize_with = "present")]
    test_config: Option<Object<BTreeMap<String, Value>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawCategory {
    #[serde(rename = "TestLocationTrigger", deserialize_with = "present")]
    locations: Option<Object<BTreeMap<String, Object<RawLocation>>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawLocation {
    #[serde(rename = "TestParameters", deserialize_with = "present")]
    triggers: Option<Object<BTreeMap<String, Object<RawTrigger>>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawTrigger {
    #[serde(rename = "TestCases", deserialize_with = "present")]
    test_cases: Option<List<Object<RawCase>>>,
    /// `PERIODIC` only; an unknown field of the other triggers.
    #[serde(rename = "IntervalSeconds", deserialize_with = "present")]
    interval_seconds: Option<Value>,
    #[serde(rename = "LogsExportConfig", deserialize_with = "present")]
    logs_export_config: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawCase {
    #[serde(rename = "Recipe", deserialize_with = "present")]
    recipe: Option<Recipe>,
    #[serde(rename = "Framework", deserialize_with = "present")]
    framework: Option<FrameworkName>,
    #[serde(rename = "Iterations", deserialize_with = "present")]
    iterations: Option<Iterations>,
    #[serde(rename = "StopOnFailure", deserialize_with = "present")]
    stop_on_failure: Option<Flag>,
    #[serde(rename = "TimeoutSeconds", deserialize_with = "present")]
    timeout_seconds: Option<Seconds>,
    #[serde(rename = "Arguments", deserialize_with = "present")]
    arguments: Option<Arguments>,
    #[serde(rename = "DeviceIDs", deserialize_with = "present")]
    device_ids: Option<List<GpuIndex>>,
    #[serde(rename = "Command", deserialize_with = "present")]
    command: Option<List<Text>>,
}

/// A value read from any JSON with a check that names what is wrong.
macro_rules! checked {
    ($(#[$doc:meta])* $name:ident($inner:ty) = $check:expr) => {
        $(#[$doc])*
        #[derive(Deserialize)]
        #[serde(try_from = "Value")]
        struct $name($inner);

        impl TryFrom<Value> for $name {
            type Error = String;
            fn try_from(value: Value) -> Result<Self, String> {
                let check: fn(&Value) -> Result<$inner, String> = $check;
                check(&value).map($name)
            }
        }
    };
}

checked!(
    /// A recipe name (see [`check_recipe`]).
    Recipe(String) = |v| {
        let recipe = string(v)?;
        check_recipe(recipe)?;
        Ok(recipe.to_owned())
    }
);
checked!(
    /// `RVS`, `AGFHC` or `COMMAND` in any case; empty is unset, as the
    /// reference treats an empty framework as RVS.
    FrameworkName(Option<Framework>) = |v| {
        let name = string(v)?;
        if name.is_empty() {
            return Ok(None);
        }
        Framework::parse(name)
            .map(Some)
            .ok_or_else(|| "unknown framework; expected RVS, AGFHC or COMMAND".to_owned())
    }
);
checked!(
    /// A positive number of iterations.
    Iterations(u32) = positive_u32
);
checked!(
    Flag(bool) = |v| v
        .as_bool()
        .ok_or_else(|| format!("must be true or false, found {}", kind(v)))
);
checked!(Seconds(Duration) = seconds);
checked!(Text(String) = |v| string(v).map(str::to_owned));
checked!(
    /// A GPU index, as a string in the reference (`"0"`); numbers are accepted too.
    GpuIndex(u32) = |v| {
        match v {
            Value::String(s) => s.trim().parse::<u32>().ok(),
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        }
        .ok_or_else(|| format!("must be a GPU index such as \"0\", found {v}"))
    }
);

impl ListItem for Text {
    const LIST: &'static str = "a list of strings";
}

impl ListItem for GpuIndex {
    const LIST: &'static str = "a list of GPU indexes";
}

/// The reference's comma-separated string (`"--parallel,--debug,5"`), or a list.
struct Arguments(Vec<String>);

impl<'de> Shape<'de> for Arguments {
    const WHAT: &'static str = "a list of strings";
    fn from_str<E: serde::de::Error>(text: &str) -> Result<Self, E> {
        Ok(Arguments(
            text.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
        ))
    }
    fn from_seq<A: serde::de::SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        List::<Text>::from_seq(seq)
            .map(|List(items)| Arguments(items.into_iter().map(|t| t.0).collect()))
    }
}

impl<'de> Deserialize<'de> for Arguments {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_shape(deserializer)
    }
}

#[derive(Default)]
struct Parser {
    warnings: Vec<String>,
}

impl Parser {
    /// Reads `T` at `path`; its unknown fields become warnings.
    fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        value: &Value,
        path: &str,
    ) -> Result<T, ConfigError> {
        let read = read::<T>(value, path).map_err(|e| err(e.path, e.message))?;
        for field in read.unknown {
            self.unknown(&field);
        }
        Ok(read.value)
    }

    fn unknown(&mut self, path: &str) {
        self.warnings
            .push(format!("{path}: unknown field; ignored"));
    }

    fn category(
        &mut self,
        value: &Value,
        path: &str,
    ) -> Result<BTreeMap<String, LocationConfig>, ConfigError> {
        let Object(category) = self.read::<Object<RawCategory>>(value, path)?;
        let path = join(path, "TestLocationTrigger");
        let Object(raw_locations) = category.locations.ok_or_else(|| err(&path, "required"))?;
        let mut locations = BTreeMap::new();
        for (location, Object(raw)) in raw_locations {
            let path = join(&path, &location);
            locations.insert(location, self.location(raw, &path)?);
        }
        if locations.is_empty() {
            return Err(err(
                path,
                format!("needs \"{GLOBAL}\" or a node name; none given"),
            ));
        }
        Ok(locations)
    }

    fn location(&mut self, raw: RawLocation, path: &str) -> Result<LocationConfig, ConfigError> {
        let path = join(path, "TestParameters");
        let Object(raw_triggers) = raw.triggers.ok_or_else(|| err(&path, "required"))?;
        let mut triggers = BTreeMap::new();
        for (name, Object(raw)) in raw_triggers {
            let path = join(&path, &name);
            let trigger = Trigger::parse(&name).ok_or_else(|| {
                err(
                    &path,
                    format!(
                        "unknown trigger; expected one of {}",
                        Trigger::ALL.map(Trigger::name).join(", ")
                    ),
                )
            })?;
            if triggers.contains_key(&trigger) {
                return Err(err(path, "trigger given twice (names ignore case)"));
            }
            triggers.insert(trigger, self.trigger(trigger, raw, &path)?);
        }
        Ok(LocationConfig { triggers })
    }

    fn trigger(
        &mut self,
        trigger: Trigger,
        raw: RawTrigger,
        path: &str,
    ) -> Result<TriggerConfig, ConfigError> {
        let interval_path = join(path, "IntervalSeconds");
        let interval = match raw.interval_seconds {
            Some(v) if trigger == Trigger::Periodic => {
                Some(seconds(&v).map_err(|why| err(&interval_path, why))?)
            }
            Some(_) => {
                self.unknown(&interval_path);
                None
            }
            None => None,
        };
        // Log export is the reference's; this design keeps logs on the host.
        if raw.logs_export_config.is_some() {
            self.warnings.push(format!(
                "{}: log export is not supported; logs stay under logsLocation.hostPath",
                join(path, "LogsExportConfig")
            ));
        }
        if trigger == Trigger::Periodic && interval.is_none() {
            return Err(err(interval_path, "required for PERIODIC"));
        }
        let cases_path = join(path, "TestCases");
        let List(cases) = raw.test_cases.ok_or_else(|| err(&cases_path, "required"))?;
        if cases.is_empty() {
            return Err(err(cases_path, "needs at least one test case"));
        }
        let test_cases = cases
            .into_iter()
            .enumerate()
            .map(|(i, Object(raw))| self.test_case(trigger, raw, &format!("{cases_path}[{i}]")))
            .collect::<Result<_, _>>()?;
        Ok(TriggerConfig {
            test_cases,
            interval,
        })
    }

    fn test_case(
        &mut self,
        trigger: Trigger,
        raw: RawCase,
        path: &str,
    ) -> Result<TestCase, ConfigError> {
        let mut case = TestCase::new(DEFAULT_RECIPE);
        if let Some(Recipe(recipe)) = raw.recipe {
            case.recipe = recipe;
        }
        let framework_given = raw.framework.as_ref().is_some_and(|f| f.0.is_some());
        if let Some(FrameworkName(Some(framework))) = raw.framework {
            case.framework = framework;
        }
        if let Some(Iterations(n)) = raw.iterations {
            case.iterations = n;
        }
        if let Some(Flag(stop)) = raw.stop_on_failure {
            case.stop_on_failure = stop;
        }
        if let Some(Seconds(timeout)) = raw.timeout_seconds {
            case.timeout = timeout;
        }
        if let Some(Arguments(arguments)) = raw.arguments {
            case.arguments = arguments;
        }
        if let Some(List(ids)) = raw.device_ids {
            for GpuIndex(id) in ids {
                if !case.device_ids.contains(&id) {
                    case.device_ids.push(id);
                }
            }
            if trigger == Trigger::AutoUnhealthyGpuWatch && !case.device_ids.is_empty() {
                self.warnings.push(format!(
                    "{}: ignored for {trigger}, which tests the unhealthy GPU",
                    join(path, "DeviceIDs")
                ));
            }
        }
        if let Some(List(command)) = raw.command {
            case.command = command.into_iter().map(|Text(t)| t).collect();
        }
        if !framework_given && !case.command.is_empty() {
            case.framework = Framework::Command;
        }
        match case.framework {
            Framework::Command if case.command.is_empty() => {
                return Err(err(
                    join(path, "Command"),
                    "required for the COMMAND framework",
                ));
            }
            Framework::Rvs | Framework::Agfhc if !case.command.is_empty() => {
                return Err(err(
                    join(path, "Command"),
                    format!(
                        "only for the COMMAND framework; {} runs its own program",
                        case.framework.name()
                    ),
                ));
            }
            _ => {}
        }
        Ok(case)
    }
}

/// Recipe names become file names (`<recipe>.conf`) and label values, so they
/// are restricted to what the reference's recipe names use, including the
/// `levels/rvs_level_1` and `NPS4/CPX/gst_single` forms, and may not climb out
/// of the recipe directory.
pub fn check_recipe(recipe: &str) -> Result<(), String> {
    if recipe.is_empty() {
        return Err("must not be empty".into());
    }
    if recipe.len() > 200 {
        return Err("longer than 200 characters".into());
    }
    if let Some(c) = recipe
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
    {
        return Err(format!(
            "{recipe:?}: character {c:?} is not allowed in a recipe name"
        ));
    }
    if recipe.starts_with('/')
        || recipe
            .split('/')
            .any(|part| part.is_empty() || part == "..")
    {
        return Err(format!(
            "{recipe:?}: must be a relative name without empty or \"..\" parts"
        ));
    }
    Ok(())
}

fn string(value: &Value) -> Result<&str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("must be a string, found {}", kind(value)))
}

fn positive_u32(value: &Value) -> Result<u32, String> {
    let n = value
        .as_u64()
        .ok_or_else(|| format!("must be a positive integer, found {value}"))?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    u32::try_from(n).map_err(|_| format!("{n} is too large"))
}

fn seconds(value: &Value) -> Result<Duration, String> {
    let s = value
        .as_f64()
        .ok_or_else(|| format!("must be a number of seconds, found {}", kind(value)))?;
    crate::api::syntax::positive_seconds(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example ConfigMap of the reference's documentation.
    const REFERENCE_EXAMPLE: &str = r#"{
      "TestConfig": {
        "GPU_HEALTH_CHECK": {
          "TestLocationTrigger": {
            "global": {
              "TestParameters": {
                "AUTO_UNHEALTHY_GPU_WATCH": {
                  "TestCases": [
                    {
                      "Recipe": "gst_single",
                      "Iterations": 1,
                      "StopOnFailure": true,
                      "TimeoutSeconds": 600,
                      "Arguments": "--parallel"
                    }
                  ]
                }
              }
            },
            "node1": {
              "TestParameters": {
                "AUTO_UNHEALTHY_GPU_WATCH": {
                  "TestCases": [
                    {
                      "Recipe": "mem",
                      "Iterations": 1,
                      "StopOnFailure": true,
                      "TimeoutSeconds": 600,
                      "Arguments": "--parallel"
                    }
                  ]
                }
              }
            }
          }
        }
      }
    }"#;

    fn parse_err(text: &str) -> ConfigError {
        parse_config(text).expect_err("should be rejected")
    }

    fn wrap_case(case: &str) -> String {
        format!(
            r#"{{"TestConfig":{{"GPU_HEALTH_CHECK":{{"TestLocationTrigger":{{"global":{{"TestParameters":{{"MANUAL":{{"TestCases":[{case}]}}}}}}}}}}}}}}"#
        )
    }

    #[test]
    fn parses_the_reference_example() {
        let parsed = parse_config(REFERENCE_EXAMPLE).unwrap();
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
        let config = parsed.config;
        let global = config
            .trigger("some-node", Trigger::AutoUnhealthyGpuWatch)
            .unwrap();
        assert_eq!(
            global.test_cases,
            vec![TestCase {
                timeout: Duration::from_secs(600),
                arguments: vec!["--parallel".into()],
                ..TestCase::new("gst_single")
            }]
        );
        let node1 = config
            .trigger("node1", Trigger::AutoUnhealthyGpuWatch)
            .unwrap();
        assert_eq!(node1.test_cases[0].recipe, "mem");
        assert_eq!(node1.test_cases[0].framework, Framework::Rvs);
    }

    #[test]
    fn a_node_entry_replaces_global_entirely() {
        let text = r#"{"TestConfig":{"gpu_health_check":{"TestLocationTrigger":{
            "global":{"TestParameters":{"AUTO_UNHEALTHY_GPU_WATCH":{"TestCases":[{"Recipe":"gst_single"}]},
                                        "manual":{"TestCases":[{"Recipe":"babel"}]}}},
            "node1":{"TestParameters":{"MANUAL":{"TestCases":[{"Recipe":"mem","Iterations":3}]}}}}}}}"#;
        let config = parse_config(text).unwrap().config;
        assert_eq!(
            config.trigger("node1", Trigger::Manual).unwrap().test_cases[0].iterations,
            3
        );
        // node1 has its own entry, so global's AUTO trigger does not apply to it.
        assert!(
            config
                .trigger("node1", Trigger::AutoUnhealthyGpuWatch)
                .is_none()
        );
        assert_eq!(
            config.trigger("node2", Trigger::Manual).unwrap().test_cases[0].recipe,
            "babel"
        );
        assert!(config.trigger("node2", Trigger::PreStartJobCheck).is_none());
    }

    #[test]
    fn defaults_fill_missing_fields() {
        let config = parse_config(&wrap_case("{}")).unwrap().config;
        let case = &config.trigger("n", Trigger::Manual).unwrap().test_cases[0];
        assert_eq!(*case, TestCase::new("gst_single"));
        assert_eq!(case.iterations, 1);
        assert!(case.stop_on_failure);
        assert_eq!(case.timeout, Duration::from_secs(3600));
    }

    #[test]
    fn agfhc_and_device_ids_and_extensions() {
        let config = parse_config(&wrap_case(
            r#"{"Framework":"agfhc","Recipe":"all_lvl1","TimeoutSeconds":0.25,
                "DeviceIDs":["0","1","1"],"Arguments":"--ignore-dmesg, --disable-sysmon"}"#,
        ))
        .unwrap()
        .config;
        let case = &config.trigger("n", Trigger::Manual).unwrap().test_cases[0];
        assert_eq!(case.framework, Framework::Agfhc);
        assert_eq!(case.timeout, Duration::from_millis(250));
        assert_eq!(case.device_ids, vec![0, 1]);
        assert_eq!(case.arguments, vec!["--ignore-dmesg", "--disable-sysmon"]);

        let config = parse_config(&wrap_case(
            r#"{"Recipe":"smoke","Command":["/bin/true","x"]}"#,
        ))
        .unwrap()
        .config;
        let case = &config.trigger("n", Trigger::Manual).unwrap().test_cases[0];
        assert_eq!(case.framework, Framework::Command);
        assert_eq!(case.command, vec!["/bin/true", "x"]);
    }

    #[test]
    fn periodic_needs_an_interval() {
        let text = r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":
            {"PERIODIC":{"IntervalSeconds":86400,"TestCases":[{"Recipe":"babel"}]}}}}}}}"#;
        let config = parse_config(text).unwrap().config;
        let periodic = config.trigger("n", Trigger::Periodic).unwrap();
        assert_eq!(periodic.interval, Some(Duration::from_secs(86400)));
        let e = parse_err(&text.replace(r#""IntervalSeconds":86400,"#, ""));
        assert_eq!(
            e.path,
            "TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global.TestParameters.PERIODIC.IntervalSeconds"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"Iterations":0}"#,
                "TestCases[0].Iterations",
                "at least 1",
            ),
            (
                r#"{"TimeoutSeconds":0}"#,
                "TestCases[0].TimeoutSeconds",
                "more than 0",
            ),
            (
                r#"{"Iterations":"2"}"#,
                "TestCases[0].Iterations",
                "positive integer",
            ),
            (
                r#"{"StopOnFailure":"yes"}"#,
                "TestCases[0].StopOnFailure",
                "true or false",
            ),
            (
                r#"{"Framework":"DCGM"}"#,
                "TestCases[0].Framework",
                "unknown framework",
            ),
            (
                r#"{"Recipe":"../../etc/passwd"}"#,
                "TestCases[0].Recipe",
                "..",
            ),
            (r#"{"Recipe":"a b"}"#, "TestCases[0].Recipe", "not allowed"),
            (
                r#"{"DeviceIDs":["zero"]}"#,
                "TestCases[0].DeviceIDs[0]",
                "GPU index",
            ),
            (
                r#"{"Framework":"COMMAND"}"#,
                "TestCases[0].Command",
                "required",
            ),
            (r#"{"Command":[1]}"#, "TestCases[0].Command[0]", "string"),
            (
                r#"{"Framework":"RVS","Command":["x"]}"#,
                "TestCases[0].Command",
                "only for",
            ),
        ];
        let prefix =
            "TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global.TestParameters.MANUAL.";
        for (case, path, message) in cases {
            let e = parse_err(&wrap_case(case));
            assert_eq!(e.path, format!("{prefix}{path}"), "{case}: {e}");
            assert!(e.message.contains(message), "{case}: {e}");
        }
    }

    #[test]
    fn structural_errors() {
        let e = parse_err("{\"TestConfig\": ");
        assert!(e.path.starts_with("config.json (line 1"), "{e}");
        assert!(e.message.contains("not valid JSON"), "{e}");
        assert_eq!(parse_err("{}").path, "TestConfig");
        assert_eq!(parse_err("[]").message, "must be an object, found a list");
        assert_eq!(
            parse_err(r#"{"TestConfig":{"OTHER":{}}}"#).path,
            "TestConfig.GPU_HEALTH_CHECK"
        );
        let e = parse_err(
            r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":{"AUTO_UNHEALTHY":{"TestCases":[{}]}}}}}}}"#,
        );
        assert_eq!(
            e.path,
            "TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global.TestParameters.AUTO_UNHEALTHY"
        );
        assert!(e.message.contains("AUTO_UNHEALTHY_GPU_WATCH"), "{e}");
        let e = parse_err(
            r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":{"MANUAL":{"TestCases":[]}}}}}}}"#,
        );
        assert!(e.path.ends_with("MANUAL.TestCases"), "{e}");
        let e = parse_err(
            r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{"global":{"TestParameters":{"MANUAL":{"TestCases":[{}]},"manual":{"TestCases":[{}]}}}}}}}"#,
        );
        assert!(e.message.contains("twice"), "{e}");
    }

    #[test]
    fn unknown_fields_are_warnings() {
        let parsed = parse_config(&wrap_case(r#"{"Recipe":"mem","Colour":"blue"}"#)).unwrap();
        assert_eq!(
            parsed.warnings,
            vec![
                "TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global.TestParameters.MANUAL.TestCases[0].Colour: unknown field; ignored"
            ]
        );
    }

    #[test]
    fn unknown_fields_are_warned_at_every_level_once_each() {
        let text = r#"{"Extra": 1, "TestConfig": {"GPU_HEALTH_CHECK": {"Note": "x",
            "TestLocationTrigger": {"global": {"Owner": "me", "TestParameters": {
                "MANUAL": {"IntervalSeconds": 5, "TestCases": [{"Colour": 1}, {"Colour": 2}]}}}}}}}"#;
        let mut warnings = parse_config(text).unwrap().warnings;
        warnings.sort();
        let at = "TestConfig.GPU_HEALTH_CHECK";
        let manual = format!("{at}.TestLocationTrigger.global.TestParameters.MANUAL");
        assert_eq!(
            warnings,
            [
                "Extra: unknown field; ignored".to_owned(),
                format!("{at}.Note: unknown field; ignored"),
                format!("{at}.TestLocationTrigger.global.Owner: unknown field; ignored"),
                format!("{manual}.IntervalSeconds: unknown field; ignored"),
                format!("{manual}.TestCases[0].Colour: unknown field; ignored"),
                format!("{manual}.TestCases[1].Colour: unknown field; ignored"),
            ]
        );
    }

    #[test]
    fn objects_must_be_objects_and_null_is_not_absent() {
        let prefix =
            "TestConfig.GPU_HEALTH_CHECK.TestLocationTrigger.global.TestParameters.MANUAL.";
        // serde alone would read a list as the fields of a test case, in order.
        let e = parse_err(&wrap_case(r#"["mem", 1]"#));
        assert_eq!(e.path, format!("{prefix}TestCases[0]"));
        assert_eq!(e.message, "must be an object, found a list");
        let e = parse_err(&wrap_case(r#"{"Recipe": null}"#));
        assert_eq!(e.path, format!("{prefix}TestCases[0].Recipe"));
        assert_eq!(e.message, "must be a string, found null");
        let e = parse_err(&wrap_case(r#"{"DeviceIDs": "0"}"#));
        assert_eq!(e.message, "must be a list of GPU indexes, found a string");
        let e = parse_err(&wrap_case(r#"{"Arguments": ["a", 2]}"#));
        assert_eq!(e.path, format!("{prefix}TestCases[0].Arguments[1]"));
        let e = parse_err(r#"{"TestConfig": {"GPU_HEALTH_CHECK": {"TestLocationTrigger": null}}}"#);
        assert_eq!(e.message, "must be an object, found null");
    }

    #[test]
    fn default_config_covers_unhealthy_and_manual_only() {
        let config = TestConfig::default();
        for trigger in [Trigger::AutoUnhealthyGpuWatch, Trigger::Manual] {
            assert_eq!(
                config.trigger("any", trigger).unwrap().test_cases,
                vec![TestCase::new("gst_single")]
            );
        }
        assert!(config.trigger("any", Trigger::PreStartJobCheck).is_none());
        assert!(config.trigger("any", Trigger::Periodic).is_none());
    }

    #[test]
    fn trigger_names_parse_in_any_case_and_the_short_pre_start() {
        assert_eq!(Trigger::parse("pre_start"), Some(Trigger::PreStartJobCheck));
        assert_eq!(
            Trigger::parse("PRE_START_JOB_CHECK"),
            Some(Trigger::PreStartJobCheck)
        );
        assert_eq!(Trigger::parse("manual"), Some(Trigger::Manual));
        assert_eq!(Trigger::parse("PRE_STARTED"), None);
    }

    #[test]
    fn recipe_names() {
        for good in [
            "gst_single",
            "levels/rvs_level_1",
            "NPS4/CPX/gst_single",
            "all_lvl1",
        ] {
            assert_eq!(check_recipe(good), Ok(()), "{good}");
        }
        for bad in ["", "/etc/x", "a//b", "a/../b", "..", "a;rm", "x y"] {
            assert!(check_recipe(bad).is_err(), "{bad}");
        }
    }
}
