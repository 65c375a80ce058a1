//! The scheduler's side of DRA, for tests. Consumable capacity (KEP-5075):
//! what a request consumes of a shared device under the device's request
//! policy, whether it fits beside the shares already allocated, and the
//! allocation the scheduler writes into the claim's status. Device classes:
//! which published devices a class's CEL selectors select, that a
//! `NoSchedule` taint keeps a device from new claims (KEP-5055), and the
//! claim the scheduler makes for a pod's extended resource served by a
//! class's `extendedResourceName` (KEP-5004). Written from the API's
//! documentation (`CapacityRequestPolicy`, `consumedCapacity`,
//! `CELDeviceSelector`, `DeviceTaint`, `DeviceClassSpec`), not from the
//! plugin's or the leader's code: it judges what they published.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A quantity's value (`192Gi`, `304`, `51539607552`); integers only.
pub fn quantity(text: &str) -> u128 {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let scale: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => panic!("quantity {text:?}: suffix {other:?} not handled here"),
    };
    digits.parse::<u128>().expect("digits") * scale
}

/// What a request of `requested` (none: the policy's default) consumes of a
/// capacity of `value` with `policy`, or why the device cannot serve it.
pub fn consumes(value: u128, policy: &Value, requested: Option<u128>) -> Result<u128, String> {
    if policy.is_null() {
        // No policy: the amount asked, else the whole capacity.
        return Ok(requested.unwrap_or(value));
    }
    let Some(asked) = requested else {
        return Ok(quantity(
            policy["default"].as_str().expect("a policy has a default"),
        ));
    };
    if let Some(values) = policy["validValues"].as_array() {
        return values
            .iter()
            .map(|v| quantity(v.as_str().unwrap()))
            .find(|v| *v >= asked)
            .ok_or_else(|| format!("{asked} is above every valid value"));
    }
    let range = &policy["validRange"];
    let min = quantity(range["min"].as_str().expect("a range has a min"));
    let mut amount = asked.max(min);
    if let Some(step) = range["step"].as_str().map(quantity) {
        amount = min + (amount - min).div_ceil(step) * step;
    }
    if let Some(max) = range["max"].as_str().map(quantity)
        && amount > max
    {
        return Err(format!("{amount} is above the policy's max {max}"));
    }
    Ok(amount)
}

/// Allocates `device` of `slice_device` (a published ResourceSlice device)
/// to a request asking `requests` (capacity name to quantity), beside the
/// `allocated` shares (each a `consumedCapacity` map). Returns the
/// `consumedCapacity` to record, or why it does not fit.
pub fn fit(
    slice_device: &Value,
    requests: &BTreeMap<&str, &str>,
    allocated: &[BTreeMap<String, String>],
) -> Result<BTreeMap<String, String>, String> {
    assert_eq!(
        slice_device["allowMultipleAllocations"], true,
        "only a shared device takes several claims"
    );
    let mut consumed = BTreeMap::new();
    for (name, capacity) in slice_device["capacity"].as_object().expect("capacity") {
        let value = quantity(capacity["value"].as_str().unwrap());
        let amount = consumes(
            value,
            &capacity["requestPolicy"],
            requests.get(name.as_str()).map(|q| quantity(q)),
        )
        .map_err(|why| format!("{name}: {why}"))?;
        let used: u128 = allocated
            .iter()
            .filter_map(|share| share.get(name))
            .map(|q| quantity(q))
            .sum();
        if used + amount > value {
            return Err(format!(
                "{name}: {amount} more does not fit ({used} of {value} consumed)"
            ));
        }
        consumed.insert(name.clone(), amount.to_string());
    }
    Ok(consumed)
}

/// The status the scheduler writes for one share of `device` in `pool`.
pub fn allocation(
    pool: &str,
    device: &str,
    share_id: &str,
    consumed: &BTreeMap<String, String>,
) -> Value {
    json!({"status": {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.amd.com", "pool": pool, "device": device,
        "shareID": share_id, "consumedCapacity": consumed,
    }]}}}})
}

/// The `device` variable a class's CEL selector sees for `device`, a device
/// of a slice of `driver`, as `CELDeviceSelector` documents it: `driver`,
/// `attributes` by domain (a name without a domain is in the driver's),
/// each as its plain value, and `capacity` likewise.
pub fn cel_device(driver: &str, device: &Value) -> Value {
    let mut attributes: BTreeMap<String, serde_json::Map<String, Value>> = BTreeMap::new();
    for (name, attribute) in device["attributes"].as_object().into_iter().flatten() {
        let (domain, id) = name.rsplit_once('/').unwrap_or((driver, name.as_str()));
        let value = ["string", "int", "bool", "version"]
            .iter()
            .find_map(|kind| attribute.get(*kind).cloned())
            .expect("an attribute has a value");
        attributes
            .entry(domain.to_owned())
            .or_default()
            .insert(id.to_owned(), value);
    }
    let capacity: serde_json::Map<String, Value> = device["capacity"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, c)| (name.clone(), c["value"].clone()))
        .collect();
    json!({"driver": driver, "attributes": attributes, "capacity": {driver: capacity}})
}

/// Whether every CEL selector of `class` selects `device` (a device of a
/// slice of `driver`). A selector that does not evaluate to a bool is an
/// error, as the API documents: it fails the allocation, it does not skip
/// the device.
pub fn selects(class: &Value, driver: &str, device: &Value) -> Result<bool, String> {
    let variable = cel::to_value(cel_device(driver, device)).map_err(|e| e.to_string())?;
    for selector in class["spec"]["selectors"].as_array().into_iter().flatten() {
        let expression = selector["cel"]["expression"]
            .as_str()
            .ok_or("a selector without a CEL expression")?;
        let program = cel::Program::compile(expression).map_err(|e| e.to_string())?;
        let mut context = cel::Context::default();
        context.add_variable_from_value("device", variable.clone());
        match program.execute(&context) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(false),
            Ok(other) => return Err(format!("{expression}: {other:?} is not a bool")),
            Err(e) => return Err(format!("{expression}: {e}")),
        }
    }
    Ok(true)
}

/// Whether a taint keeps `device` from new claims: any `NoSchedule` or
/// `NoExecute` taint (the claims here tolerate none).
pub fn tainted(device: &Value) -> bool {
    device["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["effect"] == "NoSchedule" || t["effect"] == "NoExecute")
}

/// One device result of an allocation, as the scheduler records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub pool: String,
    pub device: String,
    /// For a device that allows multiple allocations: the share's ID and
    /// its `consumedCapacity`.
    pub share: Option<(String, BTreeMap<String, String>)>,
}

impl Allocated {
    /// The allocation results of `claims` (ResourceClaims), as the
    /// scheduler counts what is in use.
    pub fn of_claims(claims: &[Value]) -> Vec<Self> {
        claims
            .iter()
            .flat_map(|c| {
                c["status"]["allocation"]["devices"]["results"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|r| Self {
                pool: r["pool"].as_str().expect("a pool").to_owned(),
                device: r["device"].as_str().expect("a device").to_owned(),
                share: r["shareID"].as_str().map(|id| {
                    let consumed = r["consumedCapacity"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().expect("a quantity").to_owned()))
                        .collect();
                    (id.to_owned(), consumed)
                }),
            })
            .collect()
    }
}

/// Allocates `count` devices for an ExactCount request of `class` with no
/// capacity requests and no tolerations, from the published `slices`,
/// beside the `allocated` results of other claims: each result in the
/// slices' order, or why the request cannot be met. As the structured
/// allocator does it (k8s.io/dynamic-resource-allocation, `structured`,
/// `allocateDevice`, with consumable capacity and partitionable devices on):
///
/// - a `NoSchedule` or `NoExecute` taint keeps a device out (KEP-5055);
/// - a device that does not allow multiple allocations is taken once;
/// - one that does (KEP-5075) is taken again, by other claims and by the
///   same request, while its capacities hold another share of each
///   policy's default; each result is a share with its ID and
///   `consumedCapacity`;
/// - a device's `consumesCounters` must fit its counter sets beside the
///   devices in use (KEP-4815), checked when it is first taken: a device
///   already shared out is charged once, so further shares skip the check.
///
/// A KEP-5004 extended-resource claim is such a request (`ExactCount`,
/// the pod's count, the class that serves the resource), so a pod asking
/// for `amd.com/cpx_nps4: 2` may get two shares of one layout device.
pub fn allocate(
    slices: &[Value],
    class: &Value,
    count: usize,
    allocated: &[Allocated],
) -> Result<Vec<Allocated>, String> {
    let mut chosen: Vec<Allocated> = Vec::new();
    'results: for _ in 0..count {
        for slice in slices {
            let driver = slice["spec"]["driver"].as_str().expect("a slice's driver");
            let pool = slice["spec"]["pool"]["name"].as_str().expect("a pool name");
            for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
                let name = device["name"].as_str().expect("a device name");
                if tainted(device) || !selects(class, driver, device)? {
                    continue;
                }
                let in_use: Vec<&Allocated> = allocated
                    .iter()
                    .chain(&chosen)
                    .filter(|a| a.pool == pool && a.device == name)
                    .collect();
                let shared = device["allowMultipleAllocations"] == true;
                if !shared && !in_use.is_empty() {
                    continue;
                }
                if in_use.is_empty() {
                    let others: Vec<&str> = allocated
                        .iter()
                        .chain(&chosen)
                        .filter(|a| a.pool == pool)
                        .map(|a| a.device.as_str())
                        .collect();
                    if counters_allow(slices, name, &others).is_err() {
                        continue;
                    }
                }
                let share = if shared {
                    let shares: Vec<BTreeMap<String, String>> = in_use
                        .iter()
                        .filter_map(|a| a.share.as_ref().map(|(_, c)| c.clone()))
                        .collect();
                    let Ok(consumed) = fit(device, &BTreeMap::new(), &shares) else {
                        continue;
                    };
                    Some((format!("share-{}", in_use.len() + 1), consumed))
                } else {
                    None
                };
                chosen.push(Allocated {
                    pool: pool.to_owned(),
                    device: name.to_owned(),
                    share,
                });
                continue 'results;
            }
        }
        break;
    }
    if chosen.len() < count {
        return Err(format!(
            "{} of {count} devices of class {} are free and untainted",
            chosen.len(),
            class["metadata"]["name"]
        ));
    }
    Ok(chosen)
}

/// KEP-5004: the class serving extended resource `resource`, of `classes`:
/// the one with that `extendedResourceName` created last (ties: the name
/// first in order), as `DeviceClassSpec` documents.
pub fn class_serving<'a>(classes: &'a [Value], resource: &str) -> Option<&'a Value> {
    classes
        .iter()
        .filter(|c| c["spec"]["extendedResourceName"] == resource)
        .max_by(|a, b| {
            let created = |c: &Value| {
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(str::to_owned)
            };
            let name = |c: &Value| c["metadata"]["name"].as_str().map(str::to_owned);
            created(a)
                .cmp(&created(b))
                .then_with(|| name(b).cmp(&name(a)))
        })
}

/// The annotation on the claim the scheduler makes for a pod's extended
/// resources (KEP-5004).
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";

/// KEP-5004: the special ResourceClaim the scheduler creates for `pod`'s
/// `count` of `resource` in its first container, served by `class`, and the
/// pod status that maps the container's request to it. The claim is named
/// `<pod>-extended-resources-<suffix>`, owned by the pod, and its one request
/// is `container-0-request-0`.
pub fn extended_resource_claim(
    pod: &Value,
    class: &str,
    resource: &str,
    count: usize,
) -> (Value, Value) {
    let pod_name = pod["metadata"]["name"].as_str().expect("a pod name");
    let name = format!("{pod_name}-extended-resources-x7k2p");
    let request = "container-0-request-0";
    let container = pod["spec"]["containers"][0]["name"]
        .as_str()
        .expect("a container");
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": pod["metadata"]["namespace"],
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": pod_name,
                "uid": pod["metadata"]["uid"], "controller": true,
            }],
        },
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": class, "allocationMode": "ExactCount", "count": count,
        }}]}},
    });
    let status = json!({"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": name,
        "requestMappings": [{"containerName": container, "resourceName": resource, "requestName": request}],
    }}});
    (claim, status)
}

/// The allocation the scheduler writes for `request`: the `devices` of
/// driver gpu.amd.com (a share with its `shareID` and `consumedCapacity`),
/// the node they are on (a node-local slice's devices pin the claim to its
/// `nodeName` by a field selector; our pools are named after their node),
/// and the pod it is reserved for.
pub fn allocation_of(request: &str, devices: &[Allocated], pod: &Value) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|a| {
            let mut result = json!({"request": request, "driver": "gpu.amd.com", "pool": a.pool, "device": a.device});
            if let Some((id, consumed)) = &a.share {
                result["shareID"] = json!(id);
                result["consumedCapacity"] = json!(consumed);
            }
            result
        })
        .collect();
    let mut nodes: Vec<&str> = devices.iter().map(|a| a.pool.as_str()).collect();
    nodes.dedup();
    let terms: Vec<Value> = nodes
        .iter()
        .map(|node| {
            json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]})
        })
        .collect();
    json!({"status": {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": terms},
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }})
}

/// KEP-4815: whether allocating `device` beside the `allocated` devices (by
/// name) keeps every counter set the pool's `slices` publish within its
/// counters; why not otherwise. Each device is charged its
/// `consumesCounters` once, however many shares a device that takes several
/// allocations has handed out, as the scheduler charges it.
pub fn counters_allow(slices: &[Value], device: &str, allocated: &[&str]) -> Result<(), String> {
    let mut available: BTreeMap<(String, String), u128> = BTreeMap::new();
    let mut devices: BTreeMap<String, Value> = BTreeMap::new();
    for slice in slices {
        for set in slice["spec"]["sharedCounters"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = set["name"].as_str().expect("a counter set's name");
            for (counter, value) in set["counters"].as_object().expect("counters") {
                let value = quantity(value["value"].as_str().expect("a counter's value"));
                available.insert((name.to_owned(), counter.clone()), value);
            }
        }
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            devices.insert(d["name"].as_str().expect("a name").to_owned(), d.clone());
        }
    }
    let mut charged: Vec<&str> = allocated.to_vec();
    charged.push(device);
    charged.sort_unstable();
    charged.dedup();
    let mut used: BTreeMap<(String, String), u128> = BTreeMap::new();
    for name in charged {
        let d = devices
            .get(name)
            .ok_or_else(|| format!("no device {name}"))?;
        for consumption in d["consumesCounters"].as_array().into_iter().flatten() {
            let set = consumption["counterSet"].as_str().expect("a counter set");
            for (counter, value) in consumption["counters"].as_object().expect("counters") {
                *used.entry((set.to_owned(), counter.clone())).or_default() +=
                    quantity(value["value"].as_str().expect("a value"));
            }
        }
    }
    for (key, amount) in used {
        let Some(limit) = available.get(&key) else {
            return Err(format!("counter {}/{} is not published", key.0, key.1));
        };
        if amount > *limit {
            return Err(format!(
                "counter {}/{}: {amount} needed, {limit} there",
                key.0, key.1
            ));
        }
    }
    Ok(())
}
