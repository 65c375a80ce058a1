//! What the API server's ResourceClaim status strategy does on a write of
//! `resourceclaims/status` (Kubernetes 1.36,
//! `pkg/registry/resource/resourceclaim/strategy.go` and
//! `pkg/registry/resource/utils.go`):
//!
//! - [`drop_deallocated_devices`] (`PrepareForUpdate`'s
//!   `dropDeallocatedStatusDevices`): entries of `status.devices` whose device
//!   (driver, pool, device) was allocated before the write and is not after it
//!   are removed, so a deallocation takes the drivers' entries with it.
//! - [`validate_status`] (`validateDeviceStatus`): every `status.devices` entry
//!   must name a device of the allocation (with its `shareID`, if any), else
//!   `status.devices[i]: Invalid value: "driver/pool/device": must be an
//!   allocated device in the claim`.
//! - [`status_authorization`] (`AuthorizedForBinding`,
//!   `AuthorizedForDeviceStatus`, feature `DRAResourceClaimGranularStatusAuthorization`,
//!   beta and on in 1.36): a change of `status.allocation` or
//!   `status.reservedFor` needs `<verb>` on `resourceclaims/binding`
//!   (cluster-wide); a change of any `status.devices` entry of driver D needs,
//!   for D, `associated-node:<verb>` on `resourceclaims/driver` named D in the
//!   claim's namespace when the requester is a ServiceAccount whose token names
//!   exactly one node (extra `authentication.kubernetes.io/node-name`) and the
//!   claim is allocated to that one node, falling back to
//!   `arbitrary-node:<verb>`; otherwise `arbitrary-node:<verb>` only. `<verb>`
//!   is the request's (`update` for a PUT, `patch` for every PATCH and apply).
//!   A refusal is a field error: `status: Forbidden: changing
//!   status.allocation or status.reservedFor requires extra permission`,
//!   `status.devices: Forbidden: changing status.devices requires extra
//!   permission`.
//!
//! Must not: decide whether a user holds a permission (that is [`crate::rbac`]),
//! or touch other kinds. Pure functions over the claim JSON.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::rbac::Attributes;
use crate::reviews::UserInfo;

/// The extra a pod's bound ServiceAccount token carries its node in.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// A device's identity in a claim: driver, pool, device and the optional shareID.
type DeviceId = (String, String, String, Option<String>);

fn text(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn device_id(v: &Value, with_share: bool) -> DeviceId {
    let share = if with_share {
        v.get("shareID").and_then(Value::as_str).map(str::to_owned)
    } else {
        None
    };
    (text(v, "driver"), text(v, "pool"), text(v, "device"), share)
}

fn results(claim: &Value) -> &[Value] {
    claim
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn status_devices(claim: &Value) -> &[Value] {
    claim
        .pointer("/status/devices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// `dropDeallocatedStatusDevices`: removes from `new` the `status.devices`
/// entries of devices `old` had allocated and `new` has not (compared by
/// driver, pool and device); an emptied list goes.
pub fn drop_deallocated_devices(new: &mut Value, old: &Value) {
    let still: BTreeSet<DeviceId> = results(new).iter().map(|r| device_id(r, false)).collect();
    let gone: BTreeSet<DeviceId> = results(old)
        .iter()
        .map(|r| device_id(r, false))
        .filter(|id| !still.contains(id))
        .collect();
    if gone.is_empty() {
        return;
    }
    let Some(status) = new.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(Value::Array(devices)) = status.get_mut("devices") else {
        return;
    };
    devices.retain(|d| !gone.contains(&device_id(d, false)));
    if devices.is_empty() {
        status.remove("devices");
    }
}

/// `structured.SharedDeviceID`'s string: `driver/pool/device[/shareID]`.
fn id_text(id: &DeviceId) -> String {
    match &id.3 {
        Some(share) => format!("{}/{}/{}/{share}", id.0, id.1, id.2),
        None => format!("{}/{}/{}", id.0, id.1, id.2),
    }
}

/// The `status.devices` rule the emulator checks: each entry names an
/// allocated device. `(field, message)` per problem, as
/// [`crate::resource_slice::validate`] gives them.
pub fn validate_status(claim: &Value) -> Vec<(String, String)> {
    let allocated: BTreeSet<DeviceId> = results(claim).iter().map(|r| device_id(r, true)).collect();
    status_devices(claim)
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let id = device_id(d, true);
            (!allocated.contains(&id)).then(|| {
                (
                    format!("status.devices[{i}]"),
                    format!(
                        "Invalid value: {:?}: must be an allocated device in the claim",
                        id_text(&id)
                    ),
                )
            })
        })
        .collect()
}

/// `getModifiedDrivers`: the drivers with an entry added, removed or changed.
fn modified_drivers(new: &Value, old: &Value) -> BTreeSet<String> {
    let entries = |claim: &Value| -> Vec<(DeviceId, Value)> {
        status_devices(claim)
            .iter()
            .map(|d| (device_id(d, true), d.clone()))
            .collect()
    };
    let (n, o) = (entries(new), entries(old));
    let mut drivers = BTreeSet::new();
    for (id, entry) in &n {
        if !o.iter().any(|(oid, oentry)| oid == id && oentry == entry) {
            drivers.insert(id.0.clone());
        }
    }
    for (id, _) in &o {
        if !n.iter().any(|(nid, _)| nid == id) {
            drivers.insert(id.0.clone());
        }
    }
    drivers
}

/// `nodeNameFromAllocation`: the one node a claim is allocated to, when its
/// node selector is one term with one `metadata.name In [node]` field
/// requirement and nothing else; empty otherwise.
pub fn allocated_node(claim: &Value) -> String {
    let Some(terms) = claim
        .pointer("/status/allocation/nodeSelector/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return String::new();
    };
    let [term] = terms.as_slice() else {
        return String::new();
    };
    let expressions = term
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let fields = term
        .get("matchFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let [field] = fields else {
        return String::new();
    };
    let values = field
        .get("values")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    match values {
        [Value::String(node)]
            if expressions == 0
                && text(field, "key") == "metadata.name"
                && text(field, "operator") == "In" =>
        {
            node.clone()
        }
        _ => String::new(),
    }
}

/// A DNS-1123 subdomain, as a Node's name must be.
fn valid_node_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `saAssociatedWithAllocatedNode`: a ServiceAccount whose token names
/// exactly one (valid) node, the one the claim is allocated to.
pub fn associated_with(user: &UserInfo, node: &str) -> bool {
    if node.is_empty() || !user.username.starts_with("system:serviceaccount:") {
        return false;
    }
    match user.extra.get(NODE_NAME_EXTRA).map(Vec::as_slice) {
        Some([only]) => only == node && valid_node_name(only),
        _ => false,
    }
}

/// One permission a write needs: any of `attempts` (tried in order) allowed
/// suffices; else the write is refused with `field: Forbidden: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub field: &'static str,
    pub message: &'static str,
    pub attempts: Vec<Attributes>,
}

fn claim_check(verb: String, subresource: &str, namespace: &str, name: &str) -> Attributes {
    Attributes {
        verb,
        group: "resource.k8s.io".into(),
        resource: "resourceclaims".into(),
        subresource: subresource.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// What a status write from `new`'s old state `old` needs beyond
/// `resourceclaims/status` (both after [`drop_deallocated_devices`]): one
/// [`Requirement`] for the binding, if allocation or reservations change, and
/// one per driver whose entries change. `verb` is the request's.
pub fn status_authorization(
    new: &Value,
    old: &Value,
    user: &UserInfo,
    verb: &str,
    namespace: &str,
) -> Vec<Requirement> {
    let mut needs = Vec::new();
    let changed = |p: &str| new.pointer(p) != old.pointer(p);
    if changed("/status/allocation") || changed("/status/reservedFor") {
        needs.push(Requirement {
            field: "status",
            message: "changing status.allocation or status.reservedFor requires extra permission",
            attempts: vec![claim_check(verb.into(), "binding", "", "")],
        });
    }
    let associated = associated_with(user, &allocated_node(new));
    for driver in modified_drivers(new, old) {
        let mut attempts = Vec::new();
        if associated {
            attempts.push(claim_check(
                format!("associated-node:{verb}"),
                "driver",
                namespace,
                &driver,
            ));
        }
        attempts.push(claim_check(
            format!("arbitrary-node:{verb}"),
            "driver",
            namespace,
            &driver,
        ));
        needs.push(Requirement {
            field: "status.devices",
            message: "changing status.devices requires extra permission",
            attempts,
        });
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NODE: &str = "gpu-node-1";

    fn on_node(node: &str) -> Value {
        json!({"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]})
    }

    fn result(driver: &str, device: &str) -> Value {
        json!({"request": "r", "driver": driver, "pool": NODE, "device": device})
    }

    fn entry(driver: &str, device: &str, ready: &str) -> Value {
        json!({"driver": driver, "pool": NODE, "device": device,
               "conditions": [{"type": "Ready", "status": ready}]})
    }

    fn claim(results: Vec<Value>, node: Option<&str>, devices: Vec<Value>) -> Value {
        let mut status = json!({});
        if !results.is_empty() {
            status["allocation"] = json!({"devices": {"results": results}});
            if let Some(n) = node {
                status["allocation"]["nodeSelector"] = on_node(n);
            }
        }
        if !devices.is_empty() {
            status["devices"] = Value::Array(devices);
        }
        json!({"metadata": {"name": "c", "namespace": "apps"}, "status": status})
    }

    fn agent(node: &str) -> UserInfo {
        UserInfo::service_account("kube-amd-gpu", "gpu-operator")
            .with_extra(NODE_NAME_EXTRA, &[node])
    }

    fn verbs(needs: &[Requirement]) -> Vec<Vec<(String, String)>> {
        needs
            .iter()
            .map(|n| {
                n.attempts
                    .iter()
                    .map(|a| (format!("{}/{}", a.subresource, a.verb), a.name.clone()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_deallocation_drops_the_entries_of_the_devices_it_frees() {
        let gpu = result("gpu.amd.com", "gpu-0");
        let net = result("net.example.com", "eth0");
        let old = claim(
            vec![gpu.clone(), net.clone()],
            Some(NODE),
            vec![
                entry("gpu.amd.com", "gpu-0", "True"),
                entry("net.example.com", "eth0", "True"),
            ],
        );
        // Deallocated whole: every entry goes, and the emptied list with them.
        let mut new = old.clone();
        new["status"].as_object_mut().unwrap().remove("allocation");
        drop_deallocated_devices(&mut new, &old);
        assert_eq!(new["status"], json!({}));
        // One device freed: its entry goes, the other stays.
        let mut new = old.clone();
        new["status"]["allocation"]["devices"]["results"] = json!([net]);
        drop_deallocated_devices(&mut new, &old);
        assert_eq!(
            new["status"]["devices"],
            json!([entry("net.example.com", "eth0", "True")])
        );
        // Nothing freed: nothing dropped, even entries validation refuses.
        let stray = claim(
            vec![gpu],
            Some(NODE),
            vec![entry("x.example.com", "d", "True")],
        );
        let mut new = stray.clone();
        drop_deallocated_devices(&mut new, &stray);
        assert_eq!(new, stray);
    }

    #[test]
    fn an_entry_must_name_an_allocated_device() {
        let ok = claim(
            vec![result("gpu.amd.com", "gpu-0")],
            Some(NODE),
            vec![entry("gpu.amd.com", "gpu-0", "True")],
        );
        assert_eq!(validate_status(&ok), Vec::<(String, String)>::new());
        let unallocated = claim(vec![], None, vec![entry("gpu.amd.com", "gpu-0", "True")]);
        assert_eq!(
            validate_status(&unallocated),
            [(
                "status.devices[0]".to_owned(),
                "Invalid value: \"gpu.amd.com/gpu-node-1/gpu-0\": must be an allocated device in the claim"
                    .to_owned()
            )]
        );
    }

    #[test]
    fn the_node_is_read_from_a_single_node_selector_only() {
        assert_eq!(
            allocated_node(&claim(vec![result("d", "x")], Some(NODE), vec![])),
            NODE
        );
        assert_eq!(
            allocated_node(&claim(vec![result("d", "x")], None, vec![])),
            ""
        );
        let mut two = claim(vec![result("d", "x")], Some(NODE), vec![]);
        two["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] =
            json!(["a", "b"]);
        assert_eq!(allocated_node(&two), "");
        let mut not_in = claim(vec![result("d", "x")], Some(NODE), vec![]);
        not_in["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
            ["operator"] = json!("NotIn");
        assert_eq!(allocated_node(&not_in), "");
    }

    #[test]
    fn node_association_needs_a_service_account_naming_exactly_that_node() {
        assert!(associated_with(&agent(NODE), NODE));
        assert!(!associated_with(&agent(NODE), "gpu-node-2"));
        assert!(!associated_with(&agent(NODE), ""));
        let kubelet =
            UserInfo::new("system:node:gpu-node-1", &[]).with_extra(NODE_NAME_EXTRA, &[NODE]);
        assert!(!associated_with(&kubelet, NODE));
        let two = UserInfo::service_account("ns", "sa").with_extra(NODE_NAME_EXTRA, &[NODE, "n2"]);
        assert!(!associated_with(&two, NODE));
        let bad = UserInfo::service_account("ns", "sa").with_extra(NODE_NAME_EXTRA, &["Bad_Name!"]);
        assert!(!associated_with(&bad, "Bad_Name!"));
    }

    #[test]
    fn each_changed_driver_needs_its_grant_associated_first_on_its_node() {
        let results = vec![
            result("gpu.amd.com", "gpu-0"),
            result("net.example.com", "eth0"),
        ];
        let net = entry("net.example.com", "eth0", "True");
        let old = claim(results.clone(), Some(NODE), vec![net.clone()]);
        let new = claim(
            results.clone(),
            Some(NODE),
            vec![net.clone(), entry("gpu.amd.com", "gpu-0", "True")],
        );
        // The agent on the claim's node: associated-node first, then arbitrary.
        assert_eq!(
            verbs(&status_authorization(
                &new,
                &old,
                &agent(NODE),
                "patch",
                "apps"
            )),
            [vec![
                (
                    "driver/associated-node:patch".to_owned(),
                    "gpu.amd.com".to_owned()
                ),
                (
                    "driver/arbitrary-node:patch".to_owned(),
                    "gpu.amd.com".to_owned()
                ),
            ]]
        );
        let needs = status_authorization(&new, &old, &agent("gpu-node-2"), "update", "apps");
        assert_eq!(
            verbs(&needs),
            [vec![(
                "driver/arbitrary-node:update".to_owned(),
                "gpu.amd.com".to_owned()
            )]]
        );
        assert_eq!(needs[0].field, "status.devices");
        assert_eq!(needs[0].attempts[0].namespace, "apps");
        // Unchanged entries need nothing; a removed one needs its driver's grant.
        assert!(status_authorization(&new, &new, &agent(NODE), "patch", "apps").is_empty());
        let removed = claim(results, Some(NODE), vec![]);
        assert_eq!(
            verbs(&status_authorization(
                &removed,
                &old,
                &agent(NODE),
                "patch",
                "apps"
            )),
            [vec![
                (
                    "driver/associated-node:patch".to_owned(),
                    "net.example.com".to_owned()
                ),
                (
                    "driver/arbitrary-node:patch".to_owned(),
                    "net.example.com".to_owned()
                ),
            ]]
        );
    }

    #[test]
    fn an_allocation_or_reservation_change_needs_the_binding_grant() {
        let old = claim(vec![], None, vec![]);
        let allocated = claim(vec![result("gpu.amd.com", "gpu-0")], Some(NODE), vec![]);
        let needs = status_authorization(&allocated, &old, &agent(NODE), "update", "apps");
        assert_eq!(
            verbs(&needs),
            [vec![("binding/update".to_owned(), String::new())]]
        );
        assert_eq!(
            (needs[0].field, needs[0].attempts[0].namespace.as_str()),
            ("status", "")
        );
        let mut reserved = allocated.clone();
        reserved["status"]["reservedFor"] = json!([{"resource": "pods", "name": "p", "uid": "1"}]);
        assert_eq!(
            verbs(&status_authorization(
                &reserved,
                &allocated,
                &agent(NODE),
                "patch",
                "apps"
            )),
            [vec![("binding/patch".to_owned(), String::new())]]
        );
    }
}
