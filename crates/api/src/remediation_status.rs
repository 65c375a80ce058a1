//! The reference's `RemediationWorkflowStatus` resource (`rwfstatus`): one
//! object per namespace, named `default`, whose `status` maps each node to
//! its Node conditions and each condition to the runs it started. The CRD is
//! `deploy/crd/remediationworkflowstatuses.amd.com.yaml`, embedded here so
//! that one text serves `kubectl apply` and the tests.
//!
//! This module owns the shapes and the time format only; the leader writes
//! the object (`cluster::remediator`).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::discovery::ApiResource;
use serde::{Deserialize, Serialize};

/// The CRD, as deploy/crd holds it.
pub const CRD_YAML: &str =
    include_str!("../../../deploy/crd/remediationworkflowstatuses.amd.com.yaml");
/// The one object's name in each namespace, as in the reference.
pub const OBJECT_NAME: &str = "default";

/// One run, as the reference records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEntry {
    pub name: String,
    /// `2006-01-02 15:04:05 UTC`.
    pub start_time: String,
}

/// Node → condition → runs.
pub type Runs = BTreeMap<String, BTreeMap<String, Vec<RunEntry>>>;

/// The CRD object (for installing it in tests and `validate`).
pub fn crd() -> Result<CustomResourceDefinition, String> {
    serde_saphyr::from_str(CRD_YAML).map_err(|e| e.to_string())
}

/// The API resource, for a dynamic client.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "amd.com".into(),
        version: "v1alpha1".into(),
        api_version: "amd.com/v1alpha1".into(),
        kind: "RemediationWorkflowStatus".into(),
        plural: "remediationworkflowstatuses".into(),
    }
}

/// An RFC 3339 time in the reference's `startTime` format; the text as
/// given when it does not parse.
pub fn start_time(rfc3339: &str) -> String {
    rfc3339
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| rfc3339.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_is_the_references_and_parses() {
        let crd = crd().unwrap();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("remediationworkflowstatuses.amd.com")
        );
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["rwfstatus".to_owned()][..])
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, api_resource().plural);
    }

    #[test]
    fn start_times_use_the_references_format() {
        assert_eq!(
            start_time("2026-12-02T10:04:05.123Z"),
            "2026-12-02 10:04:05 UTC"
        );
        assert_eq!(start_time("garbage"), "garbage");
    }
}
