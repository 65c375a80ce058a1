//! ResourceSlice validation (`resource.k8s.io/v1`), as the real API server's
//! `pkg/apis/resource/validation` states it for Kubernetes 1.37: the rules a
//! DRA driver's slices must pass, or the whole slice is refused with `422
//! Invalid` and one cause per problem.
//!
//! What is checked (each with the server's limit and wording):
//! - `driver` a DNS subdomain of at most 63 characters; `pool.name` at most 253
//!   characters of `/`-separated DNS subdomains; `pool.resourceSliceCount` above
//!   0; `pool.generation` not negative;
//! - exactly one of `nodeName`, `nodeSelector` (with exactly one term),
//!   `allNodes`, `perDeviceNodeSelection` (`false` is refused, as is `allNodes:
//!   false`);
//! - `sharedCounters` and `devices` not both in one slice (KEP-4815 as of 1.35);
//! - at most 128 devices, 64 when any device has taints or consumes counters;
//!   device names unique DNS labels;
//! - per device: attributes and capacities together at most 32; names
//!   qualified (`cIdentifier` of at most 32, or `<DNS subdomain of at most
//!   63>/<cIdentifier>`); each attribute exactly one value; strings and versions
//!   at most 64 characters; versions semantic versions (2.0.0); a request
//!   policy only with `allowMultipleAllocations`; at most 16 taints, each with
//!   a label-name key, a label value and effect `None`, `NoSchedule` or
//!   `NoExecute`; at most 2 counter consumptions, one per counter set, each
//!   with 1 to 32 counters named by DNS labels; per-device node fields only
//!   with `perDeviceNodeSelection`, and then exactly one of them; at most 4
//!   binding (failure) conditions;
//! - at most 8 counter sets, unique DNS-label names, each with 1 to 32
//!   counters named by DNS labels.
//!
//! Checked against `k8s.io/api` `resource/v1` at v0.37.0-beta.0 (the limits)
//! and `pkg/apis/resource/validation` of the same time (the rules and
//! wording). List-typed attributes (`bools`, `ints`, `strings`, `versions`)
//! are alpha in 1.37 and off by default: the server drops them, so an
//! attribute with only a list has no value and is refused here as there.
//!
//! Not checked: the details of a request policy's range, the content of node
//! selector terms, the alpha fields (`partitionTypeAttribute`,
//! `skipNodeOperations`, `nodeAllocatableResources`), immutability on update
//! and metadata beyond the name. Pure functions over the JSON object.

use serde_json::{Map, Value};

/// Devices per slice.
pub const MAX_DEVICES: usize = 128;
/// Devices per slice when any device has taints or consumes counters.
pub const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Counter sets per slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Counters per counter set, and per counter consumption.
pub const MAX_COUNTERS: usize = 32;
/// Counter consumptions per device.
pub const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Attributes and capacities of one device, together.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Length of a string or version attribute.
pub const MAX_VALUE_LENGTH: usize = 64;
/// Taints per device.
pub const MAX_TAINTS: usize = 16;

/// One problem: the field path as the server writes it and the message.
pub type Problem = (String, String);

/// Every problem of a ResourceSlice object; empty when the server takes it.
pub fn validate(slice: &Value) -> Vec<Problem> {
    let mut out = Vec::new();
    if let Some(name) = slice.pointer("/metadata/name").and_then(Value::as_str)
        && !is_dns_subdomain(name, 253)
    {
        out.push(invalid("metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    }
    let empty = Value::Object(Map::new());
    let spec = slice.get("spec").unwrap_or(&empty);
    spec_problems(spec, &mut out);
    out
}

/// The `reason` of a cause, from how its message starts (the server's
/// `field.ErrorType`).
pub fn cause_reason(message: &str) -> &'static str {
    [
        ("Required value", "FieldValueRequired"),
        ("Too many", "FieldValueTooMany"),
        ("Too long", "FieldValueTooLong"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Forbidden", "FieldValueForbidden"),
    ]
    .into_iter()
    .find(|(prefix, _)| message.starts_with(prefix))
    .map_or("FieldValueInvalid", |(_, reason)| reason)
}

fn invalid(field: &str, value: impl std::fmt::Display, detail: &str) -> Problem {
    (
        field.to_owned(),
        format!("Invalid value: {}: {detail}", quoted(value)),
    )
}

fn quoted(value: impl std::fmt::Display) -> String {
    serde_json::to_string(&value.to_string()).unwrap_or_default()
}

fn too_many(field: &str, count: usize, max: usize) -> Problem {
    (
        field.to_owned(),
        format!("Too many: {count}: must have at most {max} items"),
    )
}

fn spec_problems(spec: &Value, out: &mut Vec<Problem>) {
    let driver = spec.get("driver").and_then(Value::as_str).unwrap_or("");
    if driver.is_empty() {
        out.push(("spec.driver".into(), "Required value".into()));
    } else if !is_dns_subdomain(driver, 63) {
        out.push(invalid(
            "spec.driver",
            driver,
            "a lowercase RFC 1123 subdomain of at most 63 characters",
        ));
    }
    let pool = spec.get("pool").cloned().unwrap_or(Value::Null);
    let pool_name = pool.get("name").and_then(Value::as_str).unwrap_or("");
    if pool_name.is_empty() {
        out.push(("spec.pool.name".into(), "Required value".into()));
    } else if pool_name.len() > 253 || !pool_name.split('/').all(|p| is_dns_subdomain(p, 253)) {
        out.push(invalid(
            "spec.pool.name",
            pool_name,
            "must consist of one or more DNS sub-domains separated by slashes",
        ));
    }
    let count = pool
        .get("resourceSliceCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if count <= 0 {
        out.push(invalid(
            "spec.pool.resourceSliceCount",
            count,
            "must be greater than zero",
        ));
    }
    let generation = pool.get("generation").and_then(Value::as_i64).unwrap_or(0);
    if generation < 0 {
        out.push(invalid(
            "spec.pool.generation",
            generation,
            "must be greater than or equal to zero",
        ));
    }

    let mut set = Vec::new();
    if let Some(node) = spec.get("nodeName").and_then(Value::as_str) {
        if node.is_empty() {
            out.push(invalid(
                "spec.nodeName",
                node,
                "must be either unset or set to a non-empty string",
            ));
        } else {
            set.push("`nodeName`");
        }
    }
    if spec.get("nodeSelector").is_some_and(|v| !v.is_null()) {
        set.push("`nodeSelector`");
    }
    if let Some(all) = spec.get("allNodes").and_then(Value::as_bool) {
        if all {
            set.push("`allNodes`");
        } else {
            out.push(invalid(
                "spec.allNodes",
                all,
                "must be either unset or set to true",
            ));
        }
    }
    if let Some(selector) = spec.get("nodeSelector").filter(|v| !v.is_null()) {
        let terms = selector
            .get("nodeSelectorTerms")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if terms != 1 {
            out.push(invalid(
                "spec.nodeSelector.nodeSelectorTerms",
                terms,
                "must have exactly one node selector term",
            ));
        }
    }
    let per_device = match spec.get("perDeviceNodeSelection").and_then(Value::as_bool) {
        Some(true) => {
            set.push("`perDeviceNodeSelection`");
            true
        }
        Some(false) => {
            out.push(invalid(
                "spec.perDeviceNodeSelection",
                false,
                "must be either unset or set to true",
            ));
            false
        }
        None => false,
    };
    match set.len() {
        0 => out.push(("spec".into(), "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required".into())),
        1 => {}
        _ => out.push(invalid("spec", format!("{{{}}}", set.join(", ")), "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set")),
    }

    let devices = spec.get("devices").and_then(Value::as_array);
    let counter_sets = spec.get("sharedCounters").and_then(Value::as_array);
    if devices.is_some() && counter_sets.is_some() {
        out.push(invalid(
            "spec",
            "",
            "only one of `sharedCounters` or `devices` is allowed",
        ));
    }
    if let Some(devices) = devices {
        let limited = devices.iter().any(|d| {
            non_empty_array(d.get("taints")) || non_empty_array(d.get("consumesCounters"))
        });
        let max = if limited {
            MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES
        };
        if devices.len() > max {
            out.push(too_many("spec.devices", devices.len(), max));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            let path = format!("spec.devices[{i}]");
            let name = device.get("name").and_then(Value::as_str).unwrap_or("");
            if !names.insert(name.to_owned()) {
                out.push((
                    format!("{path}.name"),
                    format!("Duplicate value: {}", quoted(name)),
                ));
            }
            device_problems(device, &path, per_device, out);
        }
    }
    if let Some(sets) = counter_sets {
        if sets.len() > MAX_COUNTER_SETS {
            out.push(too_many(
                "spec.sharedCounters",
                sets.len(),
                MAX_COUNTER_SETS,
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, set) in sets.iter().enumerate() {
            let path = format!("spec.sharedCounters[{i}]");
            let name = set.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                out.push((format!("{path}.name"), "Required value".into()));
            } else if !is_dns_label(name) {
                out.push(invalid(&format!("{path}.name"), name, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
            } else if !names.insert(name.to_owned()) {
                out.push((
                    format!("{path}.name"),
                    format!("Duplicate value: {}", quoted(name)),
                ));
            }
            counters_problems(set.get("counters"), &format!("{path}.counters"), out);
        }
    }
}

fn non_empty_array(v: Option<&Value>) -> bool {
    v.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

fn counters_problems(counters: Option<&Value>, path: &str, out: &mut Vec<Problem>) {
    let Some(counters) = counters
        .and_then(Value::as_object)
        .filter(|c| !c.is_empty())
    else {
        out.push((path.to_owned(), "Required value".into()));
        return;
    };
    if counters.len() > MAX_COUNTERS {
        out.push(too_many(path, counters.len(), MAX_COUNTERS));
    }
    for (name, counter) in counters {
        if !is_dns_label(name) {
            out.push(invalid(&format!("{path}[{name}]"), name, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
        }
        if counter.get("value").and_then(Value::as_str).is_none() {
            out.push((format!("{path}[{name}].value"), "Required value".into()));
        }
    }
}

fn device_problems(device: &Value, path: &str, per_device: bool, out: &mut Vec<Problem>) {
    let name = device.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        out.push((format!("{path}.name"), "Required value".into()));
    } else if !is_dns_label(name) {
        out.push(invalid(&format!("{path}.name"), name, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
    }
    let attributes = device.get("attributes").and_then(Value::as_object);
    let capacity = device.get("capacity").and_then(Value::as_object);
    let total = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        out.push(invalid(
            path,
            total,
            &format!(
                "the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
            ),
        ));
    }
    for (key, attribute) in attributes.into_iter().flatten() {
        let at = format!("{path}.attributes[{key}]");
        if let Some(why) = qualified_name_problem(key) {
            out.push(invalid(&at, key, &why));
        }
        let values: Vec<(&str, &Value)> = ["int", "bool", "string", "version"]
            .into_iter()
            .filter_map(|k| attribute.get(k).filter(|v| !v.is_null()).map(|v| (k, v)))
            .collect();
        if values.len() != 1 {
            out.push(invalid(&at, "", "exactly one value must be specified"));
        }
        for (kind, value) in values {
            let text = value.as_str().unwrap_or_default();
            if matches!(kind, "string" | "version") && text.len() > MAX_VALUE_LENGTH {
                out.push((
                    format!("{at}.{kind}"),
                    format!("Too long: may not be more than {MAX_VALUE_LENGTH} bytes"),
                ));
            }
            if kind == "version" && !is_semver(text) {
                out.push(invalid(
                    &format!("{at}.version"),
                    text,
                    "must be a string compatible with semver.org spec 2.0.0",
                ));
            }
        }
    }
    let multiple = device
        .get("allowMultipleAllocations")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    for (key, entry) in capacity.into_iter().flatten() {
        let at = format!("{path}.capacity[{key}]");
        if let Some(why) = qualified_name_problem(key) {
            out.push(invalid(&at, key, &why));
        }
        if !multiple && entry.get("requestPolicy").is_some_and(|p| !p.is_null()) {
            out.push((
                format!("{at}.requestPolicy"),
                "Forbidden: allowMultipleAllocations must be true".into(),
            ));
        }
    }
    if let Some(taints) = device.get("taints").and_then(Value::as_array) {
        if taints.len() > MAX_TAINTS {
            out.push(too_many(
                &format!("{path}.taints"),
                taints.len(),
                MAX_TAINTS,
            ));
        }
        for (i, taint) in taints.iter().enumerate() {
            let at = format!("{path}.taints[{i}]");
            let key = taint.get("key").and_then(Value::as_str).unwrap_or("");
            if let Some(why) = label_name_problem(key) {
                out.push(invalid(&format!("{at}.key"), key, &why));
            }
            if let Some(value) = taint.get("value").and_then(Value::as_str)
                && !is_label_value(value)
            {
                out.push(invalid(&format!("{at}.value"), value, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
            }
            let effect = taint.get("effect").and_then(Value::as_str).unwrap_or("");
            if !matches!(effect, "None" | "NoSchedule" | "NoExecute") {
                out.push((
                    format!("{at}.effect"),
                    format!(
                        "Unsupported value: {}: supported values: \"NoExecute\", \"NoSchedule\", \"None\"",
                        quoted(effect)
                    ),
                ));
            }
        }
    }
    if let Some(consumes) = device.get("consumesCounters").and_then(Value::as_array) {
        let at = format!("{path}.consumesCounters");
        if consumes.len() > MAX_CONSUMPTIONS_PER_DEVICE {
            out.push(too_many(&at, consumes.len(), MAX_CONSUMPTIONS_PER_DEVICE));
        }
        let mut sets = std::collections::BTreeSet::new();
        for (i, consumption) in consumes.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let set = consumption
                .get("counterSet")
                .and_then(Value::as_str)
                .unwrap_or("");
            if set.is_empty() {
                out.push((format!("{at}.counterSet"), "Required value".into()));
            } else if !is_dns_label(set) {
                out.push(invalid(&format!("{at}.counterSet"), set, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
            } else if !sets.insert(set.to_owned()) {
                out.push((
                    format!("{at}.counterSet"),
                    format!("Duplicate value: {}", quoted(set)),
                ));
            }
            counters_problems(consumption.get("counters"), &format!("{at}.counters"), out);
        }
    }
    let node_fields: Vec<&str> = ["nodeName", "nodeSelector", "allNodes"]
        .into_iter()
        .filter(|k| device.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    if per_device {
        const ONE: &str = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";
        match node_fields.len() {
            0 => out.push((path.to_owned(), format!("Required value: {ONE}"))),
            1 => {}
            _ => {
                let named: Vec<String> = node_fields.iter().map(|f| format!("`{f}`")).collect();
                out.push(invalid(path, format!("{{{}}}", named.join(", ")), ONE));
            }
        }
    } else if !node_fields.is_empty() {
        out.push(invalid(path, "null", "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec"));
    }
    for key in ["bindingConditions", "bindingFailureConditions"] {
        if let Some(list) = device.get(key).and_then(Value::as_array)
            && list.len() > 4
        {
            out.push(too_many(&format!("{path}.{key}"), list.len(), 4));
        }
    }
}

/// A DNS label (RFC 1123): at most 63 lower-case alphanumerics or `-`,
/// starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain of at most `max` characters: dot-separated DNS labels.
pub fn is_dns_subdomain(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.split('.').all(is_dns_label)
}

fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Why `name` is not a qualified attribute or capacity name, if it is not.
pub fn qualified_name_problem(name: &str) -> Option<String> {
    let (domain, id) = match name.split_once('/') {
        Some((domain, id)) => (Some(domain), id),
        None => (None, name),
    };
    if let Some(domain) = domain
        && !is_dns_subdomain(domain, 63)
    {
        return Some("the domain must be a DNS subdomain of at most 63 characters".into());
    }
    if !is_c_identifier(id) {
        return Some("a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'".into());
    }
    (id.len() > 32).then(|| "the identifier must be no more than 32 characters".into())
}

fn label_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix, 253)
    {
        return Some("prefix part a lowercase RFC 1123 subdomain".into());
    }
    (!is_label_value(name) || name.is_empty()).then(|| "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into())
}

fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

/// Semantic Versioning 2.0.0, as the server's expression has it: three
/// numeric identifiers without leading zeros, an optional pre-release of
/// dot-separated identifiers (numeric ones without leading zeros), optional
/// build metadata of dot-separated `[0-9A-Za-z-]+`.
pub fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    if let Some(build) = build
        && !build
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return false;
    }
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| numeric(p)) {
        return false;
    }
    pre.is_none_or(|pre| {
        pre.split('.').all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && (numeric(p) || !p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(spec: Value) -> Value {
        json!({"metadata": {"name": "n1-gpu.amd.com-0"}, "spec": spec})
    }

    fn base() -> Value {
        json!({"driver": "gpu.amd.com", "nodeName": "n1",
               "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}})
    }

    #[test]
    fn semver_follows_the_servers_expression() {
        for ok in [
            "6.12.12",
            "0.0.0",
            "1.2.3-rc.1",
            "1.2.3+31400000",
            "1.2.3-a-b.0+x.01",
        ] {
            assert!(is_semver(ok), "{ok}");
        }
        for bad in [
            "6.19.14.31400000",
            "6.8",
            "01.2.3",
            "1.2.3-01",
            "1.2.3+",
            "v1.2.3",
            "",
        ] {
            assert!(!is_semver(bad), "{bad}");
        }
    }

    #[test]
    fn amds_four_part_driver_version_refuses_the_whole_slice() {
        let mut spec = base();
        spec["devices"] = json!([{"name": "gpu-1-128",
            "attributes": {"driverVersion": {"version": "6.19.14.31400000"}}}]);
        let problems = validate(&slice(spec));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0].0,
            "spec.devices[0].attributes[driverVersion].version"
        );
        assert!(problems[0].1.contains("semver.org"), "{problems:?}");
    }

    #[test]
    fn counters_and_devices_have_their_limits() {
        let mut spec = base();
        spec["sharedCounters"] =
            json!([{"name": "gpu-0-mutex", "counters": {"partition-mode": {"value": "1"}}}]);
        spec["devices"] = json!([]);
        assert!(
            validate(&slice(spec.clone()))
                .iter()
                .any(|(_, m)| m.contains("only one of `sharedCounters` or `devices`"))
        );
        spec.as_object_mut().unwrap().remove("devices");
        assert!(validate(&slice(spec.clone())).is_empty());
        spec["sharedCounters"] = Value::Array(
            (0..9)
                .map(|i| json!({"name": format!("gpu-{i}-mutex"), "counters": {"partition-mode": {"value": "1"}}}))
                .collect(),
        );
        assert!(
            validate(&slice(spec))
                .iter()
                .any(|(f, m)| f == "spec.sharedCounters" && m.contains("at most 8"))
        );

        let mut spec = base();
        let device = |i: usize| json!({"name": format!("d{i}"), "consumesCounters": [{"counterSet": "gpu-0-mutex", "counters": {"partition-mode": {"value": "1"}}}]});
        spec["devices"] = Value::Array((0..65).map(device).collect());
        assert!(
            validate(&slice(spec.clone()))
                .iter()
                .any(|(f, m)| f == "spec.devices" && m.contains("at most 64"))
        );
        spec["devices"] = Value::Array((0..64).map(device).collect());
        assert!(validate(&slice(spec)).is_empty());
    }

    #[test]
    fn names_values_and_taints_are_checked() {
        let mut spec = base();
        let attributes: Map<String, Value> = (0..33)
            .map(|i| (format!("a{i}"), json!({"int": i})))
            .collect();
        spec["devices"] = json!([
            {"name": "Bad_Name", "attributes": {"resource.kubernetes.io/numaNode": {"int": 0, "string": "0"}}},
            {"name": "many", "attributes": attributes},
            {"name": "tainted", "taints": [{"key": "gpu.amd.com/unhealthy", "effect": "PreferNoSchedule"}]},
            {"name": "long", "attributes": {"productName": {"string": "x".repeat(65)}}},
        ]);
        let problems = validate(&slice(spec));
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"spec.devices[0].name"), "{problems:?}");
        assert!(
            fields.contains(&"spec.devices[0].attributes[resource.kubernetes.io/numaNode]"),
            "{problems:?}"
        );
        assert!(fields.contains(&"spec.devices[1]"), "{problems:?}");
        assert!(
            fields.contains(&"spec.devices[2].taints[0].effect"),
            "{problems:?}"
        );
        assert!(
            fields.contains(&"spec.devices[3].attributes[productName].string"),
            "{problems:?}"
        );
    }

    #[test]
    fn node_selection_is_one_field_and_per_device_means_each_device() {
        let mut spec = base();
        spec.as_object_mut().unwrap().remove("nodeName");
        spec["perDeviceNodeSelection"] = json!(false);
        let problems = validate(&slice(spec.clone()));
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.perDeviceNodeSelection", "spec"],
            "{problems:?}"
        );

        spec["perDeviceNodeSelection"] = json!(true);
        spec["devices"] = json!([
            {"name": "a", "nodeName": "n1"},
            {"name": "b"},
            {"name": "c", "nodeName": "n1", "allNodes": true},
        ]);
        let problems = validate(&slice(spec));
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.devices[1]", "spec.devices[2]"],
            "{problems:?}"
        );
        assert_eq!(cause_reason(&problems[0].1), "FieldValueRequired");
        assert_eq!(cause_reason(&problems[1].1), "FieldValueInvalid");
    }
}
