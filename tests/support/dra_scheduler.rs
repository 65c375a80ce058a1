//! The scheduler's side of DRA consumable capacity (KEP-5075), for tests:
//! what a request consumes of a shared device under the device's request
//! policy, whether it fits beside the shares already allocated, and the
//! allocation the scheduler writes into the claim's status. Written from the
//! API's documentation of `CapacityRequestPolicy` and `consumedCapacity`, not
//! from the plugin's code: it judges the slices the plugin published.

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
