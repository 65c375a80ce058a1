//! Partition profiles in the reference's `config.json` format, and its
//! built-in profiles.
//!
//! ```json
//! {"gpu-config-profiles": {
//!    "cpx_nps4_all": {"skippedGPUs": {"ids": []},
//!                     "profiles": [{"computePartition": "CPX", "memoryPartition": "NPS4",
//!                                   "numGPUsAssigned": 8}]}},
//!  "gpuClientSystemdServices": {"names": ["amd-metrics-exporter", "gpuagent"]}}
//! ```
//!
//! - Keys match without regard to case, as the reference's Go parser
//!   matches them, so every file it reads reads the same here. Keys it would
//!   ignore are reported as warnings, not silently dropped.
//! - `skippedGPUs.ids` are GPU indices from 0, in PCI address order.
//! - Entries take the GPUs that are not skipped in ascending order, each
//!   `numGPUsAssigned` of them. At most one entry may leave its count out; it
//!   takes the GPUs that remain. That is how the reference's own default
//!   profiles (which give no counts) mean "all GPUs".
//! - Systemd unit names may omit `.service`.
//!
//! Pure: parsing and the built-in text. The ConfigMap is read by the caller.

use std::collections::BTreeMap;

use serde_json::Value;

/// The ConfigMap the reference creates when `spec.configManager.config` names
/// none, and the key that holds the JSON.
pub use crate::api::semantics::DEFAULT_DCM_CONFIGMAP as DEFAULT_CONFIGMAP;
pub const CONFIG_KEY: &str = "config.json";
/// A file larger than this is refused (a ConfigMap holds at most 1 MiB).
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// The reference's built-in profiles (`default-dcm-config`), the same
/// profiles and services in our own writing.
pub const BUILTIN_JSON: &str = r#"{
  "gpu-config-profiles": {
    "default": {"profiles": [{"computePartition": "SPX", "memoryPartition": "NPS1"}]},
    "cpx_nps1_all": {"profiles": [{"computePartition": "CPX", "memoryPartition": "NPS1"}]},
    "cpx_nps4_all": {"profiles": [{"computePartition": "CPX", "memoryPartition": "NPS4"}]},
    "dpx_nps2_all": {"profiles": [{"computePartition": "DPX", "memoryPartition": "NPS2"}]},
    "qpx_nps1_all": {"profiles": [{"computePartition": "QPX", "memoryPartition": "NPS1"}]},
    "heterogeneous_example": {"profiles": [
      {"computePartition": "CPX", "memoryPartition": "NPS1", "numGPUsAssigned": 2},
      {"computePartition": "SPX", "memoryPartition": "NPS1"}
    ]}
  },
  "gpuClientSystemdServices": {"names": ["amd-metrics-exporter", "gpuagent"]}
}
"#;

/// A parsed `config.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileSet {
    pub profiles: BTreeMap<String, Profile>,
    /// Units to stop while partitioning a host outside Kubernetes, with
    /// `.service` appended where it was left out.
    pub systemd_services: Vec<String>,
    /// Keys the file has that nothing reads.
    pub warnings: Vec<String>,
}

/// One named profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// GPU indices (from 0, PCI address order) left as they are.
    pub skipped: Vec<u32>,
    pub entries: Vec<Entry>,
}

/// One entry: `count` GPUs (all that remain when `None`) in these modes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Upper case, as the kernel spells modes (`CPX`).
    pub compute: String,
    pub memory: String,
    pub count: Option<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    #[error("the profile configuration is {0} bytes; at most {MAX_CONFIG_BYTES} are read")]
    TooLarge(usize),
    #[error("the profile configuration is not JSON: {0}")]
    NotJson(String),
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
}

impl ProfileSet {
    /// The reference's built-in profiles.
    pub fn builtin() -> Self {
        // The text is ours and tested: it always parses.
        Self::parse(BUILTIN_JSON).unwrap_or_default()
    }

    /// Parses a `config.json`.
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ProfileError::TooLarge(text.len()));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| ProfileError::NotJson(e.to_string()))?;
        let mut warnings = Vec::new();
        let top = object(&value, "config.json")?;
        let mut out = Self::default();
        for (key, value) in top {
            match key.to_ascii_lowercase().as_str() {
                "gpu-config-profiles" => {
                    for (name, profile) in object(value, "gpu-config-profiles")? {
                        let path = format!("gpu-config-profiles.{name}");
                        let profile = parse_profile(profile, &path, &mut warnings)?;
                        if out.profiles.insert(name.clone(), profile).is_some() {
                            return Err(invalid(&path, "is defined twice"));
                        }
                    }
                }
                "gpuclientsystemdservices" => {
                    for (key, value) in object(value, "gpuClientSystemdServices")? {
                        if !key.eq_ignore_ascii_case("names") {
                            warnings.push(format!("gpuClientSystemdServices.{key} is not read"));
                            continue;
                        }
                        for (i, name) in array(value, "gpuClientSystemdServices.names")?
                            .iter()
                            .enumerate()
                        {
                            let path = format!("gpuClientSystemdServices.names[{i}]");
                            let name = string(name, &path)?;
                            let unit = service_unit(name).map_err(|why| invalid(&path, &why))?;
                            out.systemd_services.push(unit);
                        }
                    }
                }
                _ => warnings.push(format!("{key} is not read")),
            }
        }
        out.warnings = warnings;
        Ok(out)
    }
}

/// systemd's longest unit name (`UNIT_NAME_MAX` is 256 with the NUL).
const MAX_UNIT_NAME: usize = 255;

/// The service unit `name` names, with `.service` appended where it was left
/// out, or why it names none: systemd's unit name characters (letters,
/// digits, `:`, `-`, `_`, `.`, `\`, and `@` of a template instance), not
/// starting with `-` or `.` (which `systemctl` would read as an option or
/// that no unit has), and of type service only: the GPU's clients are
/// services, and stopping a target, mount or socket would stop far more.
pub fn service_unit(name: &str) -> Result<String, String> {
    let unit = if name.ends_with(".service") {
        name.to_owned()
    } else if name.contains('.') {
        return Err(format!(
            "{name:?} is not a service unit (only .service units are stopped)"
        ));
    } else {
        format!("{name}.service")
    };
    let stem = unit.trim_end_matches(".service");
    let valid_chars = stem
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '\\' | '@'));
    if stem.is_empty()
        || stem.starts_with(['-', '.', '@'])
        || !valid_chars
        || stem.matches('@').count() > 1
        || unit.len() > MAX_UNIT_NAME
    {
        return Err(format!(
            "{name:?} is not a systemd unit name (letters, digits, : - _ . \\ and one @; \
             not starting with - or .; at most {MAX_UNIT_NAME} characters)"
        ));
    }
    Ok(unit)
}

fn parse_profile(
    value: &Value,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<Profile, ProfileError> {
    let mut profile = Profile::default();
    for (key, value) in object(value, path)? {
        match key.to_ascii_lowercase().as_str() {
            "skippedgpus" => {
                for (key, value) in object(value, &format!("{path}.skippedGPUs"))? {
                    if !key.eq_ignore_ascii_case("ids") {
                        warnings.push(format!("{path}.skippedGPUs.{key} is not read"));
                        continue;
                    }
                    for (i, id) in array(value, &format!("{path}.skippedGPUs.ids"))?
                        .iter()
                        .enumerate()
                    {
                        profile
                            .skipped
                            .push(count(id, &format!("{path}.skippedGPUs.ids[{i}]"))?);
                    }
                }
            }
            "profiles" => {
                for (i, entry) in array(value, &format!("{path}.profiles"))?
                    .iter()
                    .enumerate()
                {
                    let path = format!("{path}.profiles[{i}]");
                    profile.entries.push(parse_entry(entry, &path, warnings)?);
                }
            }
            _ => warnings.push(format!("{path}.{key} is not read")),
        }
    }
    if profile.entries.is_empty() {
        return Err(invalid(path, "has no profiles entry"));
    }
    if profile.entries.iter().filter(|e| e.count.is_none()).count() > 1 {
        return Err(invalid(
            path,
            "more than one entry leaves numGPUsAssigned out; only one may take the GPUs that remain",
        ));
    }
    Ok(profile)
}

fn parse_entry(
    value: &Value,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<Entry, ProfileError> {
    let (mut compute, mut memory, mut number) = (None, None, None);
    for (key, value) in object(value, path)? {
        match key.to_ascii_lowercase().as_str() {
            "computepartition" => {
                compute = Some(string(value, &format!("{path}.computePartition"))?)
            }
            "memorypartition" => memory = Some(string(value, &format!("{path}.memoryPartition"))?),
            "numgpusassigned" => number = Some(count(value, &format!("{path}.numGPUsAssigned"))?),
            _ => warnings.push(format!("{path}.{key} is not read")),
        }
    }
    let mode = |value: Option<&str>, field: &str, known: fn(&str) -> bool| match value {
        Some(v) if known(v) => Ok(v.trim().to_ascii_uppercase()),
        Some(v) => Err(invalid(
            &format!("{path}.{field}"),
            &format!("{v:?} is not a partition mode"),
        )),
        None => Err(invalid(path, &format!("has no {field}"))),
    };
    Ok(Entry {
        compute: mode(compute, "computePartition", |m| {
            crate::device::modes::compute_partitions(m).is_some()
        })?,
        memory: mode(memory, "memoryPartition", |m| {
            crate::device::modes::memory_domains(m).is_some()
        })?,
        count: number,
    })
}

fn invalid(path: &str, why: &str) -> ProfileError {
    ProfileError::Invalid {
        path: path.to_owned(),
        why: why.to_owned(),
    }
}

fn object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a serde_json::Map<String, Value>, ProfileError> {
    value
        .as_object()
        .ok_or_else(|| invalid(path, "must be an object"))
}

fn array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, ProfileError> {
    value
        .as_array()
        .ok_or_else(|| invalid(path, "must be a list"))
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, ProfileError> {
    value
        .as_str()
        .ok_or_else(|| invalid(path, "must be a string"))
}

fn count(value: &Value, path: &str) -> Result<u32, ProfileError> {
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n <= 1024)
        .ok_or_else(|| invalid(path, "must be a whole number from 0 to 1024"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_profiles_are_the_references() {
        let set = ProfileSet::builtin();
        assert_eq!(
            set.profiles.keys().collect::<Vec<_>>(),
            [
                "cpx_nps1_all",
                "cpx_nps4_all",
                "default",
                "dpx_nps2_all",
                "heterogeneous_example",
                "qpx_nps1_all"
            ]
        );
        let default = &set.profiles["default"];
        assert_eq!(
            default.entries,
            [Entry {
                compute: "SPX".into(),
                memory: "NPS1".into(),
                count: None
            }]
        );
        assert_eq!(
            set.systemd_services,
            ["amd-metrics-exporter.service", "gpuagent.service"]
        );
        assert!(set.warnings.is_empty());
    }

    #[test]
    fn a_reference_file_parses_with_its_key_spellings() {
        // The reference's heterogeneous example, with a key in another case
        // (Go's parser takes it) and one nothing reads.
        let text = r#"{"gpu-config-profiles": {"heterogenous": {
            "skippedGPUs": {"ids": [3, 6]},
            "profiles": [
              {"computePartition": "cpx", "memoryPartition": "NPS1", "numGPUsAssigned": 2},
              {"ComputePartition": "SPX", "memoryPartition": "NPS1", "numGPUsAssigned": 4}],
            "description": "half and half"}},
          "gpuClientSystemdServices": {"names": ["gpuagent", "custom.service"]}}"#;
        let set = ProfileSet::parse(text).unwrap();
        let profile = &set.profiles["heterogenous"];
        assert_eq!(profile.skipped, [3, 6]);
        assert_eq!(profile.entries[0].compute, "CPX");
        assert_eq!(profile.entries[1].compute, "SPX");
        assert_eq!(profile.entries[1].count, Some(4));
        assert_eq!(set.systemd_services, ["gpuagent.service", "custom.service"]);
        assert_eq!(
            set.warnings,
            ["gpu-config-profiles.heterogenous.description is not read"]
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_path_of_the_problem() {
        for (text, expected) in [
            ("{", "not JSON"),
            ("[]", "config.json: must be an object"),
            (
                r#"{"gpu-config-profiles": {"p": {"profiles": []}}}"#,
                "gpu-config-profiles.p: has no profiles entry",
            ),
            (
                r#"{"gpu-config-profiles": {"p": {"profiles": [{"computePartition": "XPX", "memoryPartition": "NPS1"}]}}}"#,
                "gpu-config-profiles.p.profiles[0].computePartition: \"XPX\" is not a partition mode",
            ),
            (
                r#"{"gpu-config-profiles": {"p": {"profiles": [{"computePartition": "CPX"}]}}}"#,
                "gpu-config-profiles.p.profiles[0]: has no memoryPartition",
            ),
            (
                r#"{"gpu-config-profiles": {"p": {"profiles": [{"computePartition": "CPX", "memoryPartition": "NPS1", "numGPUsAssigned": -1}]}}}"#,
                "numGPUsAssigned: must be a whole number",
            ),
            (
                r#"{"gpu-config-profiles": {"p": {"profiles": [
                    {"computePartition": "CPX", "memoryPartition": "NPS1"},
                    {"computePartition": "SPX", "memoryPartition": "NPS1"}]}}}"#,
                "only one may take the GPUs that remain",
            ),
            (
                r#"{"gpuClientSystemdServices": {"names": ["../x"]}}"#,
                "names[0]: \"../x\" is not a service unit",
            ),
            (
                r#"{"gpuClientSystemdServices": {"names": ["gpuagent", "-H.service"]}}"#,
                "names[1]: \"-H.service\" is not a systemd unit name",
            ),
        ] {
            let err = ProfileSet::parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let huge = " ".repeat(MAX_CONFIG_BYTES + 1);
        assert_eq!(
            ProfileSet::parse(&huge),
            Err(ProfileError::TooLarge(MAX_CONFIG_BYTES + 1))
        );
    }

    #[test]
    fn only_service_units_that_systemctl_cannot_read_as_options_are_taken() {
        for (name, unit) in [
            ("gpuagent", "gpuagent.service"),
            (
                "amd-metrics-exporter.service",
                "amd-metrics-exporter.service",
            ),
            ("getty@tty1.service", "getty@tty1.service"),
            ("a:b_c\\x2d", "a:b_c\\x2d.service"),
            ("a.b.service", "a.b.service"),
        ] {
            assert_eq!(service_unit(name).as_deref(), Ok(unit), "{name}");
        }
        let long = format!("{}.service", "a".repeat(MAX_UNIT_NAME));
        for bad in [
            "-H.service",
            "--user",
            "--user.service",
            "-H",
            "",
            ".service",
            "@x.service",
            "a b",
            "a/b",
            "kubelet.target",
            "x.mount",
            "a@b@c",
            "é",
            long.as_str(),
        ] {
            assert!(service_unit(bad).is_err(), "{bad:?} was taken");
        }
    }
}
