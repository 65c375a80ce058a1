//! The resource types the emulator serves: the built-in table and the types that
//! CustomResourceDefinitions add.
//!
//! A [`ResourceType`] is plain data (names, scope, subresources, allowed field selectors,
//! list merge keys). The store treats every object as `serde_json::Value`; this module is the
//! only place that knows anything kind-specific about shapes. No I/O here.

use std::collections::BTreeMap;

use serde_json::Value;

/// How a list-valued field merges, for strategic merge patch and server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// Items are objects identified by these keys.
    Map(Vec<String>),
    /// Items are scalars, merged as a set.
    Set,
}

/// A CRD's additional printer column (used for `kubectl get` tables).
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    /// Columns with a priority above 0 are shown only with `kubectl get -o wide`.
    pub priority: i64,
    /// The column's `jsonPath` in Kubernetes syntax, as the CRD gives it.
    pub json_path: String,
}

/// Everything the server needs to know about one served resource.
#[derive(Clone, Debug)]
pub struct ResourceType {
    /// API group; `""` for core.
    pub group: String,
    /// Served versions, preferred (storage) version first.
    pub versions: Vec<String>,
    /// Plural resource name, as in URLs.
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Serves `/status`, and main-resource writes ignore `.status`.
    pub status: bool,
    /// Serves `pods/<name>/eviction`.
    pub eviction: bool,
    /// Keeps `metadata.generation` (bumped on spec changes). Config-like built-ins
    /// (ConfigMaps, Secrets, Nodes, Leases, ...) have none on a real server either.
    pub generation: bool,
    /// Field selector labels beyond `metadata.name` / `metadata.namespace`.
    pub field_labels: Vec<String>,
    pub printer_columns: Vec<PrinterColumn>,
    /// For custom resources: list types from the schema, keyed by field path
    /// (`spec.items`, with list items skipped). Built-ins use [`builtin_list_type`].
    pub schema_lists: BTreeMap<String, ListType>,
    /// For custom resources: each served version's `openAPIV3Schema` (what field
    /// validation prunes by, see `validation`). Built-ins use their k8s-openapi types.
    pub schemas: BTreeMap<String, Value>,
    pub custom: bool,
    /// For a view of another resource's objects: that resource's `(group, plural)`. Its
    /// objects are stored once, under that resource, and converted (see `views`).
    pub view_of: Option<(String, String)>,
}

impl ResourceType {
    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        short: &[&str],
    ) -> Self {
        Self {
            group: group.to_string(),
            versions: vec![version.to_string()],
            plural: plural.to_string(),
            singular: kind.to_ascii_lowercase(),
            kind: kind.to_string(),
            list_kind: format!("{kind}List"),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            status: false,
            eviction: false,
            generation: false,
            field_labels: Vec::new(),
            printer_columns: Vec::new(),
            schema_lists: BTreeMap::new(),
            schemas: BTreeMap::new(),
            custom: false,
            view_of: None,
        }
    }

    /// The group the objects of this type are stored under.
    pub fn storage_group(&self) -> &str {
        self.view_of.as_ref().map_or(&self.group, |(g, _)| g)
    }

    /// The resource the objects of this type are stored under.
    pub fn storage_resource(&self) -> &str {
        self.view_of.as_ref().map_or(&self.plural, |(_, r)| r)
    }

    fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    fn with_generation(mut self) -> Self {
        self.generation = true;
        self
    }

    fn with_fields(mut self, f: &[&str]) -> Self {
        self.field_labels = f.iter().map(|s| s.to_string()).collect();
        self
    }

    fn with_categories(mut self, c: &[&str]) -> Self {
        self.categories = c.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn preferred_version(&self) -> &str {
        &self.versions[0]
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// Whether `field` may be used in a field selector on this resource.
    pub fn supports_field(&self, field: &str) -> bool {
        matches!(field, "metadata.name" | "metadata.namespace")
            || self.field_labels.iter().any(|f| f == field)
    }

    /// How the list at `path` (field names from the object root) merges.
    pub fn list_type(&self, path: &[String]) -> ListType {
        if self.custom {
            if path.len() == 2 && path[0] == "metadata" {
                return builtin_list_type(path);
            }
            return self
                .schema_lists
                .get(&path.join("."))
                .cloned()
                .unwrap_or(ListType::Atomic);
        }
        builtin_list_type(path)
    }

    /// How the list at `path` merges in a strategic merge patch. Custom
    /// resources have none (their strategic patches are refused); for
    /// built-ins see [`builtin_strategic_list_type`].
    pub fn strategic_list_type(&self, path: &[String]) -> ListType {
        if self.custom {
            return self.list_type(path);
        }
        builtin_strategic_list_type(path)
    }
}

/// Where a strategic merge patch merges a built-in list differently from
/// server-side apply: it reads the Go fields' `patchStrategy` /
/// `patchMergeKey` tags, never `+listType`. ResourceClaim `status.devices`
/// is `+listType=map` (apply merges per entry) but has no `patchStrategy`, so
/// a strategic merge patch replaces the whole list, as for any untagged list;
/// `status.reservedFor` has `patchStrategy:"merge" patchMergeKey:"uid"`
/// (k8s.io/api resource/v1 `ResourceClaimStatus`).
pub fn builtin_strategic_list_type(path: &[String]) -> ListType {
    if path == ["status", "devices"] {
        return ListType::Atomic;
    }
    if path == ["status", "reservedFor"] {
        return ListType::Map(vec!["uid".to_owned()]);
    }
    builtin_list_type(path)
}

/// List-map keys the API declares optional: an item without one is keyed by
/// the others, as structured-merge-diff keys it (ResourceClaim
/// `status.devices[].shareID`: only a shared device's allocation has one).
pub const OPTIONAL_LIST_MAP_KEYS: &[&str] = &["shareID"];

/// Merge keys of the built-in types, from their `patchMergeKey` / `patchStrategy` /
/// `listType` markers. Keyed by field name, with the parent used where a name is ambiguous
/// (`ports` in containers versus services). An approximation: the real server reads the
/// Go struct tags of each type.
pub fn builtin_list_type(path: &[String]) -> ListType {
    let Some(last) = path.last() else {
        return ListType::Atomic;
    };
    let in_container = path
        .iter()
        .any(|p| p == "containers" || p == "initContainers" || p == "ephemeralContainers");
    let key = |k: &str| ListType::Map(vec![k.to_string()]);
    // ResourceClaim: each driver's entries, keyed as `+listMapKey` says
    // (KEP-4817; shareID since KEP-5075, optional: OPTIONAL_LIST_MAP_KEYS).
    if path == ["status", "devices"] {
        return ListType::Map(
            ["driver", "device", "pool", "shareID"]
                .map(str::to_owned)
                .to_vec(),
        );
    }
    match last.as_str() {
        "finalizers" | "podCIDRs" => ListType::Set,
        "ownerReferences" => key("uid"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets"
        | "env"
        | "resourceClaims"
        | "schedulingGates" => key("name"),
        "ports" if in_container => key("containerPort"),
        "ports" if path.first().is_some_and(|p| p == "spec") => key("port"),
        "volumeMounts" => key("mountPath"),
        "volumeDevices" => key("devicePath"),
        "conditions" | "addresses" => key("type"),
        "hostAliases" | "podIPs" | "hostIPs" => key("ip"),
        "topologySpreadConstraints" => key("topologyKey"),
        _ => ListType::Atomic,
    }
}

/// The types served before any CRD is created.
pub fn builtin_types() -> Vec<ResourceType> {
    use ResourceType as R;
    vec![
        R::builtin("", "v1", "namespaces", "Namespace", false, &["ns"])
            .with_status()
            .with_fields(&["status.phase"]),
        R::builtin("", "v1", "nodes", "Node", false, &["no"])
            .with_status()
            .with_fields(&["spec.unschedulable"]),
        {
            let mut pods = R::builtin("", "v1", "pods", "Pod", true, &["po"])
                .with_status()
                .with_generation()
                .with_categories(&["all"])
                .with_fields(&[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.hostNetwork",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ]);
            pods.eviction = true;
            pods
        },
        R::builtin("", "v1", "configmaps", "ConfigMap", true, &["cm"]),
        R::builtin("", "v1", "secrets", "Secret", true, &[]).with_fields(&["type"]),
        R::builtin("", "v1", "services", "Service", true, &["svc"])
            .with_status()
            .with_categories(&["all"]),
        R::builtin("", "v1", "serviceaccounts", "ServiceAccount", true, &["sa"]),
        R::builtin("", "v1", "events", "Event", true, &["ev"]).with_fields(&[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]),
        {
            // The same objects as core Events (see `views`).
            let mut ev = R::builtin("events.k8s.io", "v1", "events", "Event", true, &["ev"]);
            ev.view_of = Some((String::new(), "events".to_string()));
            ev
        },
        R::builtin("coordination.k8s.io", "v1", "leases", "Lease", true, &[]),
        // RBAC objects are stored and served; nothing enforces them (see the README).
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
        ),
        // Stored and served; nothing admits or filters by them (see the README).
        R::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            false,
            &[],
        ),
        R::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            false,
            &[],
        ),
        R::builtin(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
        ),
        // Stored and served; no controller runs them (a test that needs one
        // plays it: Helm's hooks are Jobs it waits on).
        R::builtin("batch", "v1", "jobs", "Job", true, &[])
            .with_status()
            .with_generation()
            .with_categories(&["all"])
            .with_fields(&["status.successful"]),
        R::builtin("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"])
            .with_status()
            .with_generation()
            .with_categories(&["all"]),
        R::builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
        )
        .with_status()
        .with_generation(),
        R::builtin(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            "ResourceSlice",
            false,
            &[],
        )
        .with_generation()
        .with_fields(&["spec.nodeName", "spec.driver"]),
        R::builtin(
            "resource.k8s.io",
            "v1",
            "resourceclaims",
            "ResourceClaim",
            true,
            &[],
        )
        .with_status()
        .with_generation(),
        R::builtin(
            "resource.k8s.io",
            "v1",
            "deviceclasses",
            "DeviceClass",
            false,
            &[],
        )
        .with_generation(),
        R::builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
        )
        .with_status()
        .with_generation(),
    ]
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Collects `x-kubernetes-list-type` markers from an OpenAPI v3 schema.
fn collect_schema_lists(
    schema: &Value,
    path: &mut Vec<String>,
    out: &mut BTreeMap<String, ListType>,
) {
    if schema.get("type").and_then(Value::as_str) == Some("array") {
        let lt = match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => ListType::Map(str_list(schema.get("x-kubernetes-list-map-keys"))),
            Some("set") => ListType::Set,
            _ => ListType::Atomic,
        };
        if lt != ListType::Atomic {
            out.insert(path.join("."), lt);
        }
        if let Some(items) = schema.get("items") {
            collect_schema_lists(items, path, out);
        }
        return;
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, sub) in props {
            path.push(k.clone());
            collect_schema_lists(sub, path, out);
            path.pop();
        }
    }
}

/// Validation problems in a CRD, as `(field, message)` pairs.
pub type CrdProblems = Vec<(String, String)>;

/// Builds the served type from a CustomResourceDefinition object.
pub fn type_from_crd(crd: &Value) -> Result<ResourceType, CrdProblems> {
    let mut problems = Vec::new();
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s("/group");
    let plural = s("/names/plural");
    let kind = s("/names/kind");
    let scope = s("/scope");
    if group.is_empty() {
        problems.push(("spec.group".into(), "Required value".into()));
    }
    if plural.is_empty() {
        problems.push(("spec.names.plural".into(), "Required value".into()));
    }
    if kind.is_empty() {
        problems.push(("spec.names.kind".into(), "Required value".into()));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        problems.push((
            "spec.scope".into(),
            format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        ));
    }
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name != format!("{plural}.{group}") {
        problems.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let served: Vec<&Value> = versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
        .collect();
    if served.is_empty() {
        problems.push((
            "spec.versions".into(),
            "must have at least one served version".into(),
        ));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool).unwrap_or(false))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        problems.push((
            "spec.versions".into(),
            "must have exactly one version marked as storage version".into(),
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    // Storage version first, so it is the preferred one (close enough to the real
    // server's version priority for the CRDs we use).
    let mut names: Vec<String> = Vec::new();
    for v in &served {
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            names.insert(0, v["name"].as_str().unwrap_or_default().to_string());
        } else {
            names.push(v["name"].as_str().unwrap_or_default().to_string());
        }
    }
    let storage = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .cloned()
        .unwrap_or(Value::Null);
    let status = served
        .iter()
        .any(|v| v.pointer("/subresources/status").is_some());
    let mut schema_lists = BTreeMap::new();
    if let Some(schema) = storage.pointer("/schema/openAPIV3Schema") {
        collect_schema_lists(schema, &mut Vec::new(), &mut schema_lists);
    }
    let schemas = served
        .iter()
        .filter_map(|v| {
            let name = v.get("name").and_then(Value::as_str)?;
            let schema = v.pointer("/schema/openAPIV3Schema")?;
            Some((name.to_string(), schema.clone()))
        })
        .collect();
    let field_labels = storage
        .get("selectableFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                .map(|p| p.trim_start_matches('.').to_string())
                .collect()
        })
        .unwrap_or_default();
    let storage_index = versions
        .iter()
        .position(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .unwrap_or(0);
    let printer_columns: Vec<PrinterColumn> = storage
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or_default().to_string(),
                    type_: c["type"].as_str().unwrap_or("string").to_string(),
                    format: c["format"].as_str().unwrap_or_default().to_string(),
                    description: c["description"].as_str().unwrap_or_default().to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    for (i, c) in printer_columns.iter().enumerate() {
        let field =
            format!("spec.versions[{storage_index}].additionalPrinterColumns[{i}].jsonPath");
        if c.json_path.is_empty() {
            return Err(vec![(field, "Required value".into())]);
        }
        if let Err(e) = crate::table::compile_json_path(&c.json_path) {
            return Err(vec![(
                field,
                format!("Invalid value: \"{}\": {e}", c.json_path),
            )]);
        }
    }
    let singular = match s("/names/singular") {
        x if x.is_empty() => kind.to_ascii_lowercase(),
        x => x,
    };
    let list_kind = match s("/names/listKind") {
        x if x.is_empty() => format!("{kind}List"),
        x => x,
    };
    Ok(ResourceType {
        group,
        versions: names,
        plural,
        singular,
        kind,
        list_kind,
        namespaced: scope == "Namespaced",
        short_names: str_list(spec.pointer("/names/shortNames")),
        categories: str_list(spec.pointer("/names/categories")),
        status,
        eviction: false,
        generation: true,
        field_labels,
        printer_columns,
        schema_lists,
        schemas,
        custom: true,
        view_of: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> Vec<String> {
        s.split('.').map(str::to_string).collect()
    }

    #[test]
    fn builtin_merge_keys() {
        assert_eq!(
            builtin_list_type(&p("spec.containers")),
            ListType::Map(vec!["name".into()])
        );
        assert_eq!(
            builtin_list_type(&p("spec.containers.ports")),
            ListType::Map(vec!["containerPort".into()])
        );
        assert_eq!(
            builtin_list_type(&p("spec.ports")),
            ListType::Map(vec!["port".into()])
        );
        assert_eq!(builtin_list_type(&p("metadata.finalizers")), ListType::Set);
        assert_eq!(builtin_list_type(&p("spec.taints")), ListType::Atomic);
    }

    #[test]
    fn crd_type_reads_scope_status_and_list_types() {
        let crd = json!({
            "metadata": {"name": "deviceconfigs.amd.com"},
            "spec": {
                "group": "amd.com",
                "scope": "Namespaced",
                "names": {"plural": "deviceconfigs", "kind": "DeviceConfig", "shortNames": ["dc"]},
                "versions": [{
                    "name": "v1alpha1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "selectableFields": [{"jsonPath": ".spec.driver.enable"}],
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "status": {"type": "object", "properties": {
                            "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["type"], "items": {"type": "object"}}
                        }}
                    }}}
                }]
            }
        });
        let t = type_from_crd(&crd).unwrap();
        assert!(t.namespaced && t.status && t.custom);
        assert_eq!(t.list_kind, "DeviceConfigList");
        assert_eq!(t.singular, "deviceconfig");
        assert_eq!(t.versions, vec!["v1alpha1"]);
        assert!(t.supports_field("spec.driver.enable"));
        assert!(!t.supports_field("spec.other"));
        assert_eq!(
            t.list_type(&p("status.conditions")),
            ListType::Map(vec!["type".into()])
        );
        assert_eq!(t.list_type(&p("metadata.finalizers")), ListType::Set);
    }

    #[test]
    fn crd_problems_are_reported() {
        let crd = json!({"metadata": {"name": "wrong"}, "spec": {"group": "amd.com", "scope": "Nope",
            "names": {"plural": "x", "kind": "X"}, "versions": []}});
        let problems = type_from_crd(&crd).unwrap_err();
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"spec.scope"));
        assert!(fields.contains(&"metadata.name"));
        assert!(fields.contains(&"spec.versions"));
    }
}
