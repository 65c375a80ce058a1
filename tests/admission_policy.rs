//! deploy/15-admission-policy.yaml against recorded admission requests.
//!
//! Four ValidatingAdmissionPolicies. The first lets only the pod holding the
//! leader Lease write Nodes other than its own, its metrics Services and
//! ServiceMonitors (beside the agents), the DeviceClasses (gpu.amd.com and
//! the partition layouts' only),
//! DeviceConfig status and finalizer, the RemediationWorkflowStatus and
//! Events outside "default" (about DeviceConfigs only), in any namespace,
//! and evict or delete Pods. The second keeps every agent
//! to its own node's ResourceSlices of driver gpu.amd.com. The third keeps
//! node detection (deploy/optional/node-detection.yaml) to its own Node's
//! two labels. The fourth keeps every agent to the status of ResourceClaims
//! allocated on its own node, and there to its driver's `status.devices`. They are judged
//! by the kube-emulator's evaluator (`kube_emulator::admission::judge`, the
//! one the emulator applies to every write), the way the API server applies
//! them: a request in the policy's `matchConstraints` has its params
//! collected first (the first policy's Lease, which the file creates: were
//! it missing, `parameterNotFoundAction: Allow` lets the request through
//! rather than refuse every user's, before any match condition); then a
//! request whose `matchConditions` are all true is
//! matched, and allowed when every validation is true (with the policy's
//! `variables`, and the Lease as `params`), denied otherwise. The requests are
//! AdmissionReviews as the API server sends them, in
//! tests/fixtures/admission/.

#[path = "support/fixtures.rs"]
mod fixtures;

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube_emulator::admission::{self, Verdict};
use serde_json::{Value, json};

const POLICY_FILE: &str = "deploy/15-admission-policy.yaml";
/// Only the Lease holder uses the leader's rights.
const LEADER_POLICY: &str = "gpu-operator-leader-only";
/// Each agent writes its own node's ResourceSlices only.
const SLICES_POLICY: &str = "gpu-operator-own-node-resourceslices";
/// Node detection sets or removes its own Node's two labels only.
const DETECT_POLICY: &str = "gpu-operator-detect-own-node-labels";
/// Each agent writes `status.devices` of its own node's claims only.
const CLAIMS_POLICY: &str = "gpu-operator-own-node-resourceclaim-status";
/// The operator's ServiceAccount, as the API server names it.
const AGENT_USER: &str = "system:serviceaccount:kube-amd-gpu:gpu-operator";
/// Node detection's ServiceAccount (deploy/optional/node-detection.yaml).
const DETECT_USER: &str = "system:serviceaccount:kube-amd-gpu:gpu-operator-detect";
/// The labels node detection writes (the agent DaemonSet selects the
/// first two), as `gpu-operator detect` defines them.
fn detected_labels() -> Vec<&'static str> {
    use gpu_operator::detect::{GPU_LABEL, MODEL_LABELS, VGPU_LABEL};
    [GPU_LABEL, VGPU_LABEL]
        .into_iter()
        .chain(MODEL_LABELS.iter().map(|(_, label)| *label))
        .collect()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> Value {
    let path = repo().join("tests/fixtures/admission").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every policy of the file with its binding, in file order: each policy
/// followed by the binding that names it.
fn policies() -> Vec<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)> {
    let text = std::fs::read_to_string(repo().join(POLICY_FILE)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    // The Lease the first policy reads comes first (the_file_creates_the_lease_it_reads).
    let docs: Vec<Value> = docs
        .into_iter()
        .filter(|d| !d.is_null() && d["kind"] != "Lease")
        .collect();
    assert_eq!(
        docs.len(),
        8,
        "{POLICY_FILE}: four policies, each with its binding"
    );
    docs.chunks(2)
        .map(|pair| {
            assert_eq!(pair[0]["kind"], "ValidatingAdmissionPolicy");
            assert_eq!(pair[1]["kind"], "ValidatingAdmissionPolicyBinding");
            let policy: ValidatingAdmissionPolicy =
                serde_json::from_value(pair[0].clone()).unwrap();
            let binding: ValidatingAdmissionPolicyBinding =
                serde_json::from_value(pair[1].clone()).unwrap();
            // Nothing k8s-openapi does not know (a typo would be dropped silently).
            assert_eq!(&serde_json::to_value(&policy).unwrap(), &pair[0]);
            assert_eq!(&serde_json::to_value(&binding).unwrap(), &pair[1]);
            (policy, binding)
        })
        .collect()
}

fn policy(name: &str) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    policies()
        .into_iter()
        .find(|(p, _)| p.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{POLICY_FILE} has no policy {name}"))
}

/// What the API server decides for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Outside `matchConstraints`, or a match condition is false.
    NotMatched,
    Allowed,
    Denied,
}

/// The decision of `policy` through `binding` on `review` with `lease`
/// (None: the Lease does not exist; a policy without a `paramKind` takes no
/// params: `lease` is unused), by the emulator's evaluator, the one that
/// judges the agents' writes in the emulator. An expression that fails to
/// compile or evaluate is a failure of the test, not a denial: the policies'
/// expressions guard every optional field, and a broken one must not pass
/// for a refusal.
fn decide(
    policy: &ValidatingAdmissionPolicy,
    binding: &ValidatingAdmissionPolicyBinding,
    review: &Value,
    lease: Option<&Value>,
) -> Decision {
    match admission::judge(&review["request"], policy, binding, lease) {
        Verdict::NotMatched => Decision::NotMatched,
        Verdict::Allowed => Decision::Allowed,
        Verdict::Denied {
            expression_error: true,
            message,
            ..
        } => panic!("an expression errs: {message}"),
        Verdict::Denied { .. } => Decision::Denied,
    }
}

/// Every fixture, with the Lease it is judged against and the decision.
fn cases() -> Vec<(&'static str, Option<&'static str>, Decision)> {
    use Decision::*;
    let lease = Some("lease.json");
    vec![
        // The leader (gpu-node-1/gpu-operator-x7k2p holds the Lease).
        ("leader-patches-another-node.json", lease, Allowed),
        ("leader-patches-its-own-node.json", lease, NotMatched),
        ("leader-creates-service.json", lease, Allowed),
        ("leader-deletes-service.json", lease, Allowed),
        // The drains of rolling driver upgrades.
        ("leader-evicts-a-pod.json", lease, Allowed),
        ("leader-deletes-a-pod.json", lease, Allowed),
        // The DRA DeviceClasses (gpu.amd.com and those of the partition
        // layouts), and no other.
        ("leader-applies-the-device-class.json", lease, Allowed),
        ("leader-deletes-the-device-class.json", lease, Allowed),
        ("leader-creates-another-device-class.json", lease, Denied),
        ("leader-applies-a-layout-device-class.json", lease, Allowed),
        (
            "leader-creates-an-unknown-layout-device-class.json",
            lease,
            Denied,
        ),
        // A non-leader agent (gpu-node-2/gpu-operator-4kq9z).
        ("non-leader-patches-another-node.json", lease, Denied),
        ("non-leader-patches-another-node-status.json", lease, Denied),
        ("non-leader-patches-its-own-node.json", lease, NotMatched),
        (
            "non-leader-patches-its-own-node-status.json",
            lease,
            NotMatched,
        ),
        ("non-leader-creates-service.json", lease, Denied),
        ("non-leader-deletes-service.json", lease, Denied),
        ("non-leader-evicts-a-pod.json", lease, Denied),
        ("non-leader-deletes-a-pod.json", lease, Denied),
        ("non-leader-applies-the-device-class.json", lease, Denied),
        ("non-leader-deletes-the-device-class.json", lease, Denied),
        (
            "non-leader-applies-a-layout-device-class.json",
            lease,
            Denied,
        ),
        // A token without node and pod claims cannot prove anything: refused.
        (
            "token-without-node-claims-patches-a-node.json",
            lease,
            Denied,
        ),
        // Not the operator's ServiceAccount: the policy does not apply, even
        // with the leader's node and pod claims.
        ("kubelet-patches-node-status.json", lease, NotMatched),
        ("admin-patches-a-node.json", lease, NotMatched),
        (
            "other-service-account-creates-service.json",
            lease,
            NotMatched,
        ),
        ("admin-creates-a-device-class.json", lease, NotMatched),
        // DeviceConfigs: the leader writes status and its own finalizer,
        // and nothing else; a non-leader writes nothing; an administrator
        // is not matched.
        ("leader-patches-deviceconfig-status.json", lease, Allowed),
        ("leader-adds-its-finalizer.json", lease, Allowed),
        ("leader-removes-its-finalizer.json", lease, Allowed),
        ("leader-patches-deviceconfig-spec.json", lease, Denied),
        ("leader-changes-spec-through-status.json", lease, Denied),
        ("leader-labels-a-deviceconfig.json", lease, Denied),
        ("leader-annotates-a-deviceconfig.json", lease, Denied),
        ("leader-adds-an-owner-reference.json", lease, Denied),
        ("leader-removes-another-finalizer.json", lease, Denied),
        ("leader-deletes-a-deviceconfig.json", lease, Denied),
        ("non-leader-patches-deviceconfig-spec.json", lease, Denied),
        ("non-leader-patches-deviceconfig-status.json", lease, Denied),
        ("non-leader-adds-the-finalizer.json", lease, Denied),
        ("non-leader-removes-the-finalizer.json", lease, Denied),
        ("admin-patches-deviceconfig-spec.json", lease, NotMatched),
        // The RemediationWorkflowStatus is the leader's.
        (
            "leader-creates-remediation-workflow-status.json",
            lease,
            Allowed,
        ),
        (
            "leader-patches-remediation-workflow-status.json",
            lease,
            Allowed,
        ),
        (
            "non-leader-creates-remediation-workflow-status.json",
            lease,
            Denied,
        ),
        (
            "non-leader-patches-remediation-workflow-status.json",
            lease,
            Denied,
        ),
        // DeviceConfigs in other namespaces are followed too (10-rbac.yaml
        // grants their rights in every namespace): the same rules hold
        // there.
        (
            "leader-patches-deviceconfig-status-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "leader-adds-its-finalizer-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "leader-removes-its-finalizer-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "leader-patches-deviceconfig-spec-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "non-leader-patches-deviceconfig-status-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "non-leader-adds-the-finalizer-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "non-leader-removes-the-finalizer-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "leader-creates-remediation-workflow-status-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "non-leader-creates-remediation-workflow-status-in-another-namespace.json",
            lease,
            Denied,
        ),
        // RBAC cannot limit create to a name: the policy keeps it to "default".
        (
            "leader-creates-another-remediation-workflow-status.json",
            lease,
            Denied,
        ),
        // Events outside "default": the leader's, about a DeviceConfig of
        // the Event's namespace, and nothing else.
        (
            "leader-records-a-deviceconfig-event-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "leader-repeats-a-deviceconfig-event-in-another-namespace.json",
            lease,
            Allowed,
        ),
        (
            "non-leader-records-a-deviceconfig-event-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "leader-records-an-event-about-a-pod-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "leader-records-an-event-in-another-namespace-than-its-deviceconfigs.json",
            lease,
            Denied,
        ),
        // Events about Nodes, in "default", are every agent's node work.
        ("non-leader-records-a-node-event.json", lease, NotMatched),
        // The metrics Services and ServiceMonitors the leader owns, for
        // DeviceConfigs anywhere, are kept beside the agents; even the
        // leader writes no other Service.
        (
            "leader-applies-the-service-of-a-deviceconfig-elsewhere.json",
            lease,
            Allowed,
        ),
        (
            "leader-creates-service-in-another-namespace.json",
            lease,
            Denied,
        ),
        (
            "leader-creates-service-selecting-other-pods.json",
            lease,
            Denied,
        ),
        (
            "leader-creates-service-with-external-ips.json",
            lease,
            Denied,
        ),
        ("leader-creates-load-balancer-service.json", lease, Denied),
        (
            "leader-takes-over-someone-elses-service.json",
            lease,
            Denied,
        ),
        ("leader-deletes-someone-elses-service.json", lease, Denied),
        ("leader-creates-service-monitor.json", lease, Allowed),
        ("non-leader-creates-service-monitor.json", lease, Denied),
        (
            "leader-deletes-someone-elses-service-monitor.json",
            lease,
            Denied,
        ),
        // Nobody leads: a released Lease (as the file creates it, held by
        // nobody) refuses the leader's rights to every agent.
        (
            "leader-patches-another-node.json",
            Some("lease-released.json"),
            Denied,
        ),
        (
            "leader-creates-service.json",
            Some("lease-released.json"),
            Denied,
        ),
        (
            "non-leader-patches-deviceconfig-status.json",
            Some("lease-released.json"),
            Denied,
        ),
        // No Lease at all (a person deleted it; agents cannot): the API
        // server collects the params before it evaluates any match
        // condition, so parameterNotFoundAction applies to every user.
        // Allow keeps the kubelets' and administrators' writes going; the
        // gap lasts until the next election creates the Lease.
        ("leader-creates-service.json", None, Allowed),
        ("non-leader-patches-another-node.json", None, Allowed),
        ("kubelet-patches-node-status.json", None, Allowed),
        ("admin-patches-a-node.json", None, Allowed),
    ]
}

/// The ResourceSlice fixtures and the slices policy's decision. The policy
/// takes no params: who leads does not matter. The agents' fixtures are the
/// non-leader on gpu-node-2 unless they say otherwise.
fn slice_cases() -> Vec<(&'static str, Decision)> {
    use Decision::*;
    vec![
        // Its own node's slices of gpu.amd.com: create, apply again, remove.
        ("agent-creates-its-own-nodes-slice.json", Allowed),
        ("agent-updates-its-own-nodes-slice.json", Allowed),
        ("agent-deletes-its-own-nodes-slice.json", Allowed),
        // Another node's: spec.nodeName decides, not the name.
        ("agent-creates-another-nodes-slice.json", Denied),
        (
            "agent-creates-a-slice-named-its-own-for-another-node.json",
            Denied,
        ),
        ("agent-updates-another-nodes-slice.json", Denied),
        ("agent-deletes-another-nodes-slice.json", Denied),
        // An update is judged on both sides: the new slice (moving its own
        // away) and the stored one (taking another node's over).
        ("agent-moves-its-slice-to-another-node.json", Denied),
        ("agent-takes-over-another-nodes-slice.json", Denied),
        // Another driver's slices, even on its own node; or one becoming ours.
        ("agent-creates-a-slice-of-another-driver.json", Denied),
        ("agent-updates-a-slice-of-another-driver.json", Denied),
        ("agent-deletes-a-slice-of-another-driver.json", Denied),
        // No nodeName at all (allNodes).
        ("agent-creates-a-slice-for-all-nodes.json", Denied),
        // The leader (gpu-node-1) is held to its own node as well.
        ("leader-creates-another-nodes-slice.json", Denied),
        // A token without the node claim proves no node.
        ("token-without-node-claims-creates-a-slice.json", Denied),
        // Other users are not matched: another DRA driver's ServiceAccount
        // (with node claims), an administrator, the kubelet.
        ("other-driver-creates-another-nodes-slice.json", NotMatched),
        ("admin-deletes-a-slice.json", NotMatched),
        ("kubelet-deletes-its-nodes-slice.json", NotMatched),
    ]
}

/// The ResourceClaim status fixtures and the claims policy's decision. The
/// agent is the non-leader on gpu-node-2; the claim holds a GPU of its pool
/// and a NIC of another driver, whose entry is there before and after.
fn claim_cases() -> Vec<(&'static str, Decision)> {
    use Decision::*;
    vec![
        // Its own node's claim: its entry written, then removed.
        (
            "agent-writes-device-status-of-its-own-nodes-claim.json",
            Allowed,
        ),
        (
            "agent-removes-device-status-of-its-own-nodes-claim.json",
            Allowed,
        ),
        // Another node's claim, one some other node may also run, or one
        // not allocated at all: the stored allocation decides.
        (
            "agent-writes-device-status-of-another-nodes-claim.json",
            Denied,
        ),
        (
            "agent-writes-device-status-of-a-claim-for-several-nodes.json",
            Denied,
        ),
        (
            "agent-writes-device-status-of-an-unallocated-claim.json",
            Denied,
        ),
        // On its own node, nothing but its driver's entries.
        ("agent-deallocates-its-own-nodes-claim.json", Denied),
        (
            "agent-reserves-its-own-nodes-claim-for-another-pod.json",
            Denied,
        ),
        ("agent-changes-another-drivers-device-status.json", Denied),
        // A token without the node claim proves no node.
        ("token-without-node-claims-writes-claim-status.json", Denied),
        // The scheduler allocating is not matched.
        ("scheduler-allocates-a-claim.json", NotMatched),
    ]
}

/// The node detection fixtures and the detect policy's decision. The caller
/// is gpu-operator-detect on gpu-node-2 unless the name says otherwise.
fn detect_cases() -> Vec<(&'static str, Decision)> {
    use Decision::*;
    vec![
        // Its own Node: either label set to "true", or removed.
        ("detect-labels-its-own-node.json", Allowed),
        ("detect-labels-its-own-node-vgpu.json", Allowed),
        ("detect-labels-its-own-node-model.json", Allowed),
        ("detect-removes-its-own-label.json", Allowed),
        // Another Node, even with the right label.
        ("detect-labels-another-node.json", Denied),
        // Any other label, set or removed, or another value.
        ("detect-sets-another-label.json", Denied),
        ("detect-removes-another-label.json", Denied),
        ("detect-sets-its-label-to-false.json", Denied),
        // Nothing else of its own Node.
        ("detect-taints-its-own-node.json", Denied),
        ("detect-annotates-its-own-node.json", Denied),
        ("detect-patches-its-own-node-status.json", Denied),
        ("detect-deletes-its-own-node.json", Denied),
        // A token without the node claim proves no node.
        (
            "detect-token-without-node-claims-labels-a-node.json",
            Denied,
        ),
    ]
}

#[test]
fn only_the_lease_holder_writes_other_nodes_and_services() {
    let (policy, binding) = policy(LEADER_POLICY);
    let mut failures = Vec::new();
    for (review, lease, expected) in cases() {
        let lease_doc = lease.map(fixture);
        let got = decide(&policy, &binding, &fixture(review), lease_doc.as_ref());
        if got != expected {
            failures.push(format!(
                "{review} with {}: {got:?}, expected {expected:?}",
                lease.unwrap_or("no Lease")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every DeviceClass the leader may make (gpu.amd.com, amd-gpu.gpu.amd.com
/// and each layout's, `LAYOUT_CLASS_NAMES`) passes the policy, and a name off that list does
/// not, whatever the class says.
#[test]
fn the_leader_writes_exactly_the_device_classes_it_may_make() {
    let (policy, binding) = policy(LEADER_POLICY);
    let lease = fixture("lease.json");
    let review = fixture("leader-applies-a-layout-device-class.json");
    let judged = |name: &str| {
        let mut review = review.clone();
        review["request"]["name"] = json!(name);
        review["request"]["object"]["metadata"]["name"] = json!(name);
        decide(&policy, &binding, &review, Some(&lease))
    };
    let ours = gpu_operator::cluster::device_classes::LAYOUT_CLASS_NAMES
        .iter()
        .copied()
        .chain([
            gpu_operator::dra::DRIVER_NAME,
            gpu_operator::cluster::resources::EXTENDED_RESOURCE_CLASS,
        ]);
    for name in ours {
        assert!(gpu_operator::cluster::device_classes::operator_class_name(
            name
        ));
        assert_eq!(judged(name), Decision::Allowed, "{name}");
    }
    for name in [
        "cpx-nps3.gpu.amd.com",
        "cpx_nps4.gpu.amd.com",
        "cpx-nps4.gpu.amd.com.evil",
        "x.cpx-nps4.gpu.amd.com",
        "amd-gpu.gpu.amd.com.evil",
        "gpu.gpu.amd.com",
        "fast.example.com",
    ] {
        assert!(!gpu_operator::cluster::device_classes::operator_class_name(
            name
        ));
        assert_eq!(judged(name), Decision::Denied, "{name}");
    }
}

#[test]
fn each_agent_writes_only_its_own_nodes_resource_slices() {
    let (policy, binding) = policy(SLICES_POLICY);
    let mut failures = Vec::new();
    for (review, expected) in slice_cases() {
        let got = decide(&policy, &binding, &fixture(review), None);
        if got != expected {
            failures.push(format!("{review}: {got:?}, expected {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_agent_writes_only_its_own_nodes_claims_device_status() {
    let (policy, binding) = policy(CLAIMS_POLICY);
    let mut failures = Vec::new();
    for (review, expected) in claim_cases() {
        let got = decide(&policy, &binding, &fixture(review), None);
        if got != expected {
            failures.push(format!("{review}: {got:?}, expected {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn node_detection_writes_only_its_own_nodes_two_labels() {
    let (policy, binding) = policy(DETECT_POLICY);
    let mut failures = Vec::new();
    for (review, expected) in detect_cases() {
        let got = decide(&policy, &binding, &fixture(review), None);
        if got != expected {
            failures.push(format!("{review}: {got:?}, expected {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_policy_leaves_the_others_requests_alone() {
    // What the API server decides is every matching policy's verdict; each
    // fixture is judged above by one policy, and the others must not match it.
    let (leader, leader_binding) = policy(LEADER_POLICY);
    let (slices, slices_binding) = policy(SLICES_POLICY);
    let (detect, detect_binding) = policy(DETECT_POLICY);
    let (claims, claims_binding) = policy(CLAIMS_POLICY);
    let lease = fixture("lease.json");
    let others: Vec<&str> = cases()
        .iter()
        .map(|(r, _, _)| *r)
        .chain(slice_cases().iter().map(|(r, _)| *r))
        .chain(detect_cases().iter().map(|(r, _)| *r))
        .collect();
    let unmatched = |policy: &ValidatingAdmissionPolicy,
                     binding: &ValidatingAdmissionPolicyBinding,
                     review: &str,
                     lease: Option<&Value>,
                     what: &str| {
        let got = decide(policy, binding, &fixture(review), lease);
        assert_eq!(got, Decision::NotMatched, "{review}: the {what} policy");
    };
    for review in others {
        unmatched(&claims, &claims_binding, review, None, "claims");
    }
    for (review, _) in claim_cases() {
        // Claim status is node work, never the leader's.
        unmatched(
            &leader,
            &leader_binding,
            review,
            Some(&lease),
            "leader-only",
        );
        unmatched(&leader, &leader_binding, review, None, "leader-only");
        unmatched(&slices, &slices_binding, review, None, "slices");
        unmatched(&detect, &detect_binding, review, None, "node detection");
    }
    for (review, _, _) in cases() {
        assert_eq!(
            decide(&slices, &slices_binding, &fixture(review), None),
            Decision::NotMatched,
            "{review}: the slices policy"
        );
        assert_eq!(
            decide(&detect, &detect_binding, &fixture(review), None),
            Decision::NotMatched,
            "{review}: the node detection policy"
        );
    }
    for (review, _) in slice_cases() {
        // With or without a Lease: slices are node work, never the leader's.
        for l in [Some(&lease), None] {
            assert_eq!(
                decide(&leader, &leader_binding, &fixture(review), l),
                Decision::NotMatched,
                "{review}: the leader-only policy"
            );
        }
        assert_eq!(
            decide(&detect, &detect_binding, &fixture(review), None),
            Decision::NotMatched,
            "{review}: the node detection policy"
        );
    }
    for (review, _) in detect_cases() {
        // Node detection is not the agents' ServiceAccount: neither of their
        // policies applies. (Without a Lease the leader-only policy allows
        // every Node write before its match conditions, as for any user.)
        assert_eq!(
            decide(&leader, &leader_binding, &fixture(review), Some(&lease)),
            Decision::NotMatched,
            "{review}: the leader-only policy"
        );
        assert_eq!(
            decide(&slices, &slices_binding, &fixture(review), None),
            Decision::NotMatched,
            "{review}: the slices policy"
        );
    }
}

#[test]
fn every_fixture_is_judged_and_is_what_the_api_server_sends() {
    let judged: Vec<&str> = cases()
        .iter()
        .flat_map(|(r, l, _)| [Some(*r), *l])
        .flatten()
        .chain(slice_cases().iter().map(|(r, _)| *r))
        .chain(detect_cases().iter().map(|(r, _)| *r))
        .chain(claim_cases().iter().map(|(r, _)| *r))
        .collect();
    let dir = repo().join("tests/fixtures/admission");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for file in &files {
        assert!(judged.contains(&file.as_str()), "{file} is not in cases()");
        let doc = fixture(file);
        if file.starts_with("lease") {
            let lease: k8s_openapi::api::coordination::v1::Lease =
                serde_json::from_value(doc).unwrap();
            assert_eq!(
                lease.metadata.name.as_deref(),
                Some(gpu_operator::cluster::lease::DEFAULT_LEASE_NAME)
            );
            continue;
        }
        // An AdmissionReview v1 request: the fields the policy reads are there.
        assert_eq!(doc["apiVersion"], "admission.k8s.io/v1", "{file}");
        assert_eq!(doc["kind"], "AdmissionReview", "{file}");
        let request = &doc["request"];
        for field in ["uid", "kind", "resource", "operation", "userInfo", "name"] {
            assert!(!request[field].is_null(), "{file}: request.{field}");
        }
        assert!(request["userInfo"]["username"].is_string(), "{file}");
        // The agents' and node detection's tokens carry one node and one
        // pod name, or none.
        if request["userInfo"]["username"] == AGENT_USER
            || request["userInfo"]["username"] == DETECT_USER
        {
            let extra = request["userInfo"]["extra"].as_object().unwrap();
            for key in [
                "authentication.kubernetes.io/node-name",
                "authentication.kubernetes.io/pod-name",
            ] {
                assert!(
                    extra
                        .get(key)
                        .is_none_or(|v| v.as_array().is_some_and(|a| a.len() == 1)),
                    "{file}: {key}"
                );
            }
        }
    }
}

#[test]
fn the_leaders_identity_is_the_node_and_pod_the_token_names() {
    // The policy compares holderIdentity with "<node-name>/<pod-name>" from
    // the token: the agent's identity is built the same way (agent::run in
    // src/cli/agent.rs; tests/deploy_manifests.rs checks the real binary's Lease).
    let lease = fixture("lease.json");
    let review = fixture("leader-patches-another-node.json");
    let extra = &review["request"]["userInfo"]["extra"];
    let identity = format!(
        "{}/{}",
        extra["authentication.kubernetes.io/node-name"][0]
            .as_str()
            .unwrap(),
        extra["authentication.kubernetes.io/pod-name"][0]
            .as_str()
            .unwrap()
    );
    assert_eq!(lease["spec"]["holderIdentity"], identity.as_str());
}

#[test]
fn the_file_creates_the_lease_it_reads_held_by_nobody() {
    let text = std::fs::read_to_string(repo().join(POLICY_FILE)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let docs: Vec<&Value> = docs.iter().filter(|d| !d.is_null()).collect();
    // First, so that it exists before the policy that reads it is bound.
    assert_eq!(docs[0]["kind"], "Lease", "{POLICY_FILE}: the Lease first");
    let lease: k8s_openapi::api::coordination::v1::Lease =
        serde_json::from_value(docs[0].clone()).unwrap();
    assert_eq!(
        lease.metadata.name.as_deref(),
        Some(gpu_operator::cluster::lease::DEFAULT_LEASE_NAME)
    );
    assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-amd-gpu"));
    assert!(
        lease
            .spec
            .as_ref()
            .is_none_or(|s| s.holder_identity.is_none()),
        "held by nobody until an election"
    );
    // As the file creates it, it refuses the leader's rights to every agent.
    let (policy, binding) = policy(LEADER_POLICY);
    let as_created = serde_json::to_value(&lease).unwrap();
    for review in [
        "leader-patches-another-node.json",
        "leader-patches-deviceconfig-status.json",
    ] {
        assert_eq!(
            decide(&policy, &binding, &fixture(review), Some(&as_created)),
            Decision::Denied,
            "{review}"
        );
    }
}

#[test]
fn the_binding_uses_the_leader_lease_and_allows_without_it() {
    let (policy, binding) = policy(LEADER_POLICY);
    let spec = policy.spec.as_ref().unwrap();
    let param = spec.param_kind.as_ref().unwrap();
    assert_eq!(param.api_version.as_deref(), Some("coordination.k8s.io/v1"));
    assert_eq!(param.kind.as_deref(), Some("Lease"));
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let binding = binding.spec.unwrap();
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
    let param_ref = binding.param_ref.unwrap();
    assert_eq!(
        param_ref.name.as_deref(),
        Some(gpu_operator::cluster::lease::DEFAULT_LEASE_NAME)
    );
    assert_eq!(param_ref.namespace.as_deref(), Some("kube-amd-gpu"));
    assert_eq!(
        param_ref.parameter_not_found_action.as_deref(),
        Some("Allow")
    );
    // The DaemonSet's agents run as the user the policy is scoped to.
    let conditions: BTreeMap<String, String> = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.expression.clone()))
        .collect();
    assert!(
        conditions["gpu-operator-service-account"].contains(AGENT_USER),
        "{conditions:?}"
    );
}

/// Policy `name`, checked as node work: no params (who leads does not
/// matter), failing closed, bound with Deny to its own constraints.
fn node_work_policy(name: &str) -> ValidatingAdmissionPolicy {
    let (policy, binding) = policy(name);
    let spec = policy.spec.as_ref().unwrap();
    assert!(spec.param_kind.is_none(), "{name}: node work: no Lease");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"), "{name}");
    let binding = binding.spec.unwrap();
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
    assert!(binding.param_ref.is_none(), "{name}");
    assert!(
        binding.match_resources.is_none(),
        "{name}: the policy's own constraints, not narrowed"
    );
    policy
}

#[test]
fn the_slices_policy_is_bound_for_every_agent_without_params() {
    let policy = node_work_policy(SLICES_POLICY);
    let spec = policy.spec.as_ref().unwrap();
    // Scoped to the agents' ServiceAccount, like the leader-only policy.
    let conditions: BTreeMap<String, String> = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.expression.clone()))
        .collect();
    assert!(
        conditions["gpu-operator-service-account"].contains(AGENT_USER),
        "{conditions:?}"
    );
    // Every write of a ResourceSlice, whichever version it is sent in.
    let constraints = spec.match_constraints.as_ref().unwrap();
    assert_eq!(constraints.match_policy.as_deref(), Some("Equivalent"));
    let rules = constraints.resource_rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources, Some(vec!["resourceslices".to_owned()]));
    let operations: std::collections::BTreeSet<String> =
        rules[0].operations.iter().flatten().cloned().collect();
    assert_eq!(
        operations,
        ["CREATE", "UPDATE", "DELETE"].map(str::to_owned).into()
    );
}

#[test]
fn the_claims_policy_is_bound_for_every_agent_and_rbac_grants_only_status_patch() {
    let policy = node_work_policy(CLAIMS_POLICY);
    let spec = policy.spec.as_ref().unwrap();
    // What RBAC grants on claims: get of the claim, patch of its status
    // (server-side apply, src/dra/claim_status.rs) and, for 1.36+ servers,
    // the per-driver node-aware patch of status.devices; nothing else. The
    // policy matches every write those grants allow.
    let text = std::fs::read_to_string(repo().join("deploy/10-rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let mut granted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rule in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .flat_map(|d| d["rules"].as_array().into_iter().flatten())
    {
        for resource in rule["resources"].as_array().into_iter().flatten() {
            let resource = resource.as_str().unwrap();
            if resource.starts_with("resourceclaims") || resource == "*" {
                let verbs = rule["verbs"].as_array().unwrap();
                granted
                    .entry(resource.to_owned())
                    .or_default()
                    .extend(verbs.iter().map(|v| v.as_str().unwrap().to_owned()));
            }
        }
    }
    assert_eq!(
        granted,
        BTreeMap::from([
            ("resourceclaims".to_owned(), vec!["get".to_owned()]),
            ("resourceclaims/status".to_owned(), vec!["patch".to_owned()]),
            (
                "resourceclaims/driver".to_owned(),
                vec!["associated-node:patch".to_owned()]
            ),
        ])
    );
    let rules = spec
        .match_constraints
        .as_ref()
        .and_then(|m| m.resource_rules.clone())
        .unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resources,
        Some(vec!["resourceclaims/status".to_owned()])
    );
    assert_eq!(rules[0].operations, Some(vec!["UPDATE".to_owned()]));
    // The fixture's write is the plugin's: its field manager.
    let review = fixture("agent-writes-device-status-of-its-own-nodes-claim.json");
    assert_eq!(
        review["request"]["options"]["fieldManager"],
        gpu_operator::api::field_manager::DRA
    );
}

#[test]
fn the_detect_policy_is_node_detections_and_guards_the_labels_the_agents_select() {
    let (policy, binding) = policy(DETECT_POLICY);
    let spec = policy.spec.as_ref().unwrap();
    assert!(spec.param_kind.is_none(), "node work: no Lease");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let binding = binding.spec.unwrap();
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(binding.validation_actions, Some(vec!["Deny".to_owned()]));
    assert!(binding.param_ref.is_none());
    assert!(binding.match_resources.is_none());
    let conditions: Vec<String> = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| c.expression.clone())
        .collect();
    assert!(
        conditions.len() == 1 && conditions[0].contains(&format!("'{DETECT_USER}'")),
        "{conditions:?}"
    );
    // The ServiceAccount deploy/optional/node-detection.yaml runs its pods as.
    let text = std::fs::read_to_string(repo().join("deploy/optional/node-detection.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let daemonset = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("node detection's DaemonSet");
    let account = &daemonset["spec"]["template"]["spec"]["serviceAccountName"];
    let namespace = &daemonset["metadata"]["namespace"];
    assert_eq!(
        format!(
            "system:serviceaccount:{}:{}",
            namespace.as_str().unwrap(),
            account.as_str().unwrap()
        ),
        DETECT_USER
    );
    // The labels it may write are those the agent DaemonSet selects on.
    let text = std::fs::read_to_string(repo().join("deploy/20-daemonset.yaml")).unwrap();
    let agents: Value = serde_saphyr::from_str(&text).unwrap();
    let terms = agents["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap();
    let selected: Vec<&str> = terms
        .iter()
        .flat_map(|t| t["matchExpressions"].as_array().unwrap())
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(selected, detected_labels()[..2]);
    // And the policy's list is exactly what `detect` writes.
    let variables: BTreeMap<String, String> = spec
        .variables
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.expression.clone()))
        .collect();
    let listed: Vec<&str> = variables["detected"]
        .split('\'')
        .skip(1)
        .step_by(2)
        .collect();
    assert_eq!(listed, detected_labels(), "{variables:?}");
}

#[test]
fn the_policies_and_fixtures_spell_the_driver_as_the_code_does() {
    // The policies write the driver name out; the code's constant must agree.
    let driver = gpu_operator::dra::DRIVER_NAME;
    for name in [LEADER_POLICY, SLICES_POLICY] {
        let (policy, _) = policy(name);
        let expressions: Vec<String> = policy
            .spec
            .unwrap()
            .validations
            .into_iter()
            .flatten()
            .map(|v| v.expression)
            .collect();
        assert!(
            expressions
                .iter()
                .any(|e| e.contains(&format!("'{driver}'"))),
            "{name}: {expressions:?}"
        );
    }
    // The agent's own slice is what the plugin writes (SlicePublisher in
    // src/dra/service.rs): its name, node, driver and pool.
    let review = fixture("agent-creates-its-own-nodes-slice.json");
    let node = review["request"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"][0]
        .as_str()
        .unwrap();
    let slice = &review["request"]["object"];
    assert_eq!(
        slice["metadata"]["name"],
        gpu_operator::dra::slices::slice_name(node, 0).as_str()
    );
    assert_eq!(review["request"]["name"], slice["metadata"]["name"]);
    assert_eq!(slice["spec"]["nodeName"], node);
    assert_eq!(slice["spec"]["driver"], driver);
    assert_eq!(slice["spec"]["pool"]["name"], node);
    assert_eq!(
        review["request"]["options"]["fieldManager"],
        gpu_operator::api::field_manager::DRA
    );
}

#[test]
#[should_panic(expected = "an expression errs")]
fn an_expression_that_errs_fails_these_tests() {
    // The evaluator denies on an error (failurePolicy: Fail); `decide` must
    // not count that as the policy's refusal.
    let (mut policy, binding) = policy(LEADER_POLICY);
    let validations = policy.spec.as_mut().unwrap().validations.as_mut().unwrap();
    validations[0].expression = "params.spec.noSuchField == 'x'".into();
    decide(
        &policy,
        &binding,
        &fixture("leader-creates-service.json"),
        Some(&fixture("lease.json")),
    );
}

/// The metrics Service and ServiceMonitor the leader really writes
/// (`metrics_service`, `service_monitor` in src/cluster/resources.rs), for a
/// DeviceConfig beside the agents and for one in another namespace, pass
/// the policy's rules on them when the Lease holder applies them, and are
/// refused to another agent: the policy and the code agree on the label,
/// selector and namespace.
#[test]
fn the_services_the_leader_writes_pass_the_policy() {
    use gpu_operator::cluster::resources::{metrics_service, service_monitor};
    let (policy, binding) = policy(LEADER_POLICY);
    let lease = fixture("lease.json");
    let agents = lease["metadata"]["namespace"].as_str().unwrap().to_owned();
    let leader = fixture("leader-creates-service.json")["request"]["userInfo"].clone();
    let other = fixture("non-leader-creates-service.json")["request"]["userInfo"].clone();
    let review = |user: &Value, resource: &str, group: &str, object: Value| {
        serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "userInfo": user,
                "name": object["metadata"]["name"], "namespace": object["metadata"]["namespace"],
                "kind": {"group": group, "version": "v1", "kind": object["kind"]},
                "resource": {"group": group, "version": "v1", "resource": resource},
                "object": object, "oldObject": null}})
    };
    for namespace in [agents.as_str(), "team-a"] {
        let dc = fixtures::DeviceConfigBuilder::new(namespace, "gpus")
            .metadata("uid", "u1".into())
            .spec(
                "metricsExporter",
                serde_json::json!({"enable": true, "serviceType": "NodePort",
                    "prometheus": {"serviceMonitor": {"enable": true,
                        // A user's label of the same key does not take the mark off.
                        "labels": {"app.kubernetes.io/name": "mine", "release": "prom"}}}}),
            )
            .build();
        let mut service =
            serde_json::to_value(metrics_service(&dc, Some(&agents)).unwrap()).unwrap();
        service["apiVersion"] = "v1".into();
        service["kind"] = "Service".into();
        let mut monitor =
            serde_json::to_value(service_monitor(&dc, Some(&agents)).unwrap()).unwrap();
        monitor["apiVersion"] = "monitoring.coreos.com/v1".into();
        monitor["kind"] = "ServiceMonitor".into();
        for (resource, group, object) in [
            ("services", "", service),
            ("servicemonitors", "monitoring.coreos.com", monitor),
        ] {
            assert_eq!(object["metadata"]["namespace"], agents.as_str(), "{object}");
            assert_eq!(
                decide(
                    &policy,
                    &binding,
                    &review(&leader, resource, group, object.clone()),
                    Some(&lease)
                ),
                Decision::Allowed,
                "the leader's {resource} for {namespace}/gpus: {object}"
            );
            assert_eq!(
                decide(
                    &policy,
                    &binding,
                    &review(&other, resource, group, object.clone()),
                    Some(&lease)
                ),
                Decision::Denied,
                "another agent's {resource} for {namespace}/gpus"
            );
        }
    }
}

/// The writes only the leader makes, as RBAC grants them to every agent
/// (group, resource, verb). Each must be granted by deploy/10-rbac.yaml (so
/// that this list follows it) and matched by the leader-only policy, so
/// that an agent that does not lead cannot use it.
const LEADER_WRITES: &[(&str, &str, &str)] = &[
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "services", "create"),
    ("", "services", "patch"),
    ("", "services", "delete"),
    ("monitoring.coreos.com", "servicemonitors", "create"),
    ("monitoring.coreos.com", "servicemonitors", "patch"),
    ("monitoring.coreos.com", "servicemonitors", "delete"),
    ("amd.com", "deviceconfigs", "patch"),
    ("amd.com", "deviceconfigs/status", "patch"),
    ("amd.com", "remediationworkflowstatuses", "create"),
    ("amd.com", "remediationworkflowstatuses/status", "patch"),
    ("resource.k8s.io", "deviceclasses", "create"),
    ("resource.k8s.io", "deviceclasses", "patch"),
    ("resource.k8s.io", "deviceclasses", "delete"),
    // Everywhere but "default" (Events about Nodes); only Events about
    // DeviceConfigs there.
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

#[test]
fn every_write_only_the_leader_makes_is_granted_and_narrowed_to_the_lease_holder() {
    let text = std::fs::read_to_string(repo().join("deploy/10-rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let rules: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .flat_map(|d| d["rules"].as_array().into_iter().flatten())
        .collect();
    let listed = |rule: &Value, field: &str, value: &str| {
        rule[field]
            .as_array()
            .is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
    };
    let (policy, _) = policy(LEADER_POLICY);
    let constraints = policy
        .spec
        .as_ref()
        .and_then(|s| s.match_constraints.as_ref())
        .and_then(|m| m.resource_rules.clone())
        .unwrap_or_default();
    for (group, resource, verb) in LEADER_WRITES {
        assert!(
            rules.iter().any(|r| listed(r, "apiGroups", group)
                && listed(r, "resources", resource)
                && listed(r, "verbs", verb)),
            "{group}/{resource} {verb}: not granted by deploy/10-rbac.yaml (stale list?)"
        );
        // A patch is an UPDATE to admission (or a CREATE when an apply
        // makes the object).
        let operation = match *verb {
            "create" => "CREATE",
            "delete" => "DELETE",
            _ => "UPDATE",
        };
        let has = |list: &Option<Vec<String>>, value: &str| {
            list.as_ref()
                .is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
        };
        assert!(
            constraints.iter().any(|rule| has(&rule.api_groups, group)
                && has(&rule.resources, resource)
                && has(&rule.operations, operation)),
            "{group}/{resource} {operation}: every agent may, and the leader-only policy does not match it"
        );
    }
}
