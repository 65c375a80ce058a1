//! CustomResourceDefinitions: creating one serves its resource (scope, status subresource),
//! custom resources follow the generation and status rules, and deleting the CRD stops it.

use crate::common;

use common::{api_error, start, within};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, ResourceExt,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A cut-down DeviceConfig, enough to exercise typed access.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "amd.com",
    version = "v1alpha1",
    kind = "DeviceConfig",
    namespaced,
    status = "DeviceConfigStatus",
    schema = "disabled"
)]
pub struct DeviceConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DeviceConfigStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Value>>,
    #[serde(
        default,
        rename = "observedGeneration",
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
}

fn deviceconfig_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "deviceconfigs.amd.com"},
        "spec": {
            "group": "amd.com", "scope": "Namespaced",
            "names": {"plural": "deviceconfigs", "singular": "deviceconfig", "kind": "DeviceConfig",
                      "listKind": "DeviceConfigList", "shortNames": ["gpue"]},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}],
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    // The real server prunes status fields its schema does not name.
                    "properties": {"status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "observedGeneration": {"type": "integer"},
                        "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                                       "x-kubernetes-list-map-keys": ["type"],
                                       "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}}
            }]
        }
    }))
    .unwrap()
}

fn servicemonitor_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"plural": "servicemonitors", "kind": "ServiceMonitor", "listKind": "ServiceMonitorList",
                      "categories": ["prometheus-operator"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

async fn install(client: &kube::Client, crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap()
}

#[tokio::test]
async fn creating_a_crd_serves_its_resource() {
    let emu = start().await;
    let client = emu.client();
    let dc: Api<DeviceConfig> = Api::default_namespaced(client.clone());
    // Before the CRD, the path is unknown.
    assert_eq!(api_error(dc.list(&ListParams::default()).await).code, 404);

    let crd = install(&client, deviceconfig_crd()).await;
    let conds = crd.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    within("discovery sees the new group", async {
        let d = kube::Discovery::new(client.clone()).run().await.unwrap();
        let (ar, caps) = d
            .resolve_gvk(&GroupVersionKind::gvk(
                "amd.com",
                "v1alpha1",
                "DeviceConfig",
            ))
            .expect("DeviceConfig discoverable");
        assert_eq!(ar.plural, "deviceconfigs");
        assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    })
    .await;

    let obj = DeviceConfig::new(
        "gpus",
        DeviceConfigSpec {
            driver: Some(json!({"enable": true})),
            selector: None,
        },
    );
    let mut with_status = obj.clone();
    with_status.status = Some(DeviceConfigStatus {
        phase: Some("Ignored".into()),
        ..Default::default()
    });
    let created = dc
        .create(&PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(
        created.status, None,
        "creates drop status when a status subresource exists"
    );

    // Duplicate names conflict for custom resources too.
    let e = api_error(dc.create(&PostParams::default(), &obj).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "deviceconfigs.amd.com \"gpus\" already exists");

    // The second CRD from our deployment, used untyped.
    install(&client, servicemonitor_crd()).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    );
    let sm: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let mut m = DynamicObject::new("gpu-metrics", &ar);
    m.data = json!({"spec": {"endpoints": [{"port": "metrics"}], "selector": {"matchLabels": {"app": "exporter"}}}});
    let m = sm.create(&PostParams::default(), &m).await.unwrap();
    assert_eq!(m.data["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(
        sm.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn generation_counts_spec_changes_and_status_is_separate() {
    let emu = start().await;
    let client = emu.client();
    install(&client, deviceconfig_crd()).await;
    let dc: Api<DeviceConfig> = Api::default_namespaced(client.clone());
    let pp = PatchParams::default();
    dc.create(
        &PostParams::default(),
        &DeviceConfig::new(
            "g",
            DeviceConfigSpec {
                driver: None,
                selector: None,
            },
        ),
    )
    .await
    .unwrap();

    // Spec change: generation + 1.
    let o = dc
        .patch(
            "g",
            &pp,
            &Patch::Merge(json!({"spec": {"driver": {"enable": true}}})),
        )
        .await
        .unwrap();
    assert_eq!(o.metadata.generation, Some(2));
    // Metadata change: no generation change.
    let o = dc
        .patch(
            "g",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(o.metadata.generation, Some(2));
    // Status through the main resource is ignored.
    let o = dc
        .patch(
            "g",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    assert_eq!(o.status, None);
    assert_eq!(o.metadata.generation, Some(2));
    // Status through /status changes only status, never spec or generation.
    let o = dc
        .patch_status("g", &pp, &Patch::Merge(json!({"spec": {"driver": {"enable": false}}, "status": {"phase": "Ready", "observedGeneration": 2}})))
        .await
        .unwrap();
    assert_eq!(o.status.as_ref().unwrap().phase.as_deref(), Some("Ready"));
    assert_eq!(o.spec.driver, Some(json!({"enable": true})));
    assert_eq!(o.metadata.generation, Some(2));
    // replace (PUT) on the main resource keeps the stored status.
    let mut r = o.clone();
    r.status = None;
    r.spec.selector = Some(json!({"a": "b"}));
    let o = dc.replace("g", &PostParams::default(), &r).await.unwrap();
    assert_eq!(o.metadata.generation, Some(3));
    assert_eq!(o.status.unwrap().phase.as_deref(), Some("Ready"));
    // replace_status keeps the spec.
    let mut s = dc.get("g").await.unwrap();
    s.spec.selector = None;
    s.status = Some(DeviceConfigStatus {
        phase: Some("Degraded".into()),
        ..Default::default()
    });
    let o = dc
        .replace_status("g", &PostParams::default(), &s)
        .await
        .unwrap();
    assert_eq!(o.spec.selector, Some(json!({"a": "b"})));
    assert_eq!(o.status.unwrap().phase.as_deref(), Some("Degraded"));
    assert_eq!(o.metadata.generation, Some(3));

    // Strategic merge patch is not for custom resources, as on a real server.
    let e = api_error(
        dc.patch("g", &pp, &Patch::Strategic(json!({"spec": {}})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));
}

#[tokio::test]
async fn status_apply_by_two_writers_merges_list_map_conditions() {
    let emu = start().await;
    let client = emu.client();
    install(&client, deviceconfig_crd()).await;
    let dc: Api<DeviceConfig> = Api::default_namespaced(client.clone());
    dc.create(
        &PostParams::default(),
        &DeviceConfig::new(
            "g",
            DeviceConfigSpec {
                driver: None,
                selector: None,
            },
        ),
    )
    .await
    .unwrap();
    let status = |conds: Value| json!({"apiVersion": "amd.com/v1alpha1", "kind": "DeviceConfig", "status": {"conditions": conds}});
    let a = PatchParams::apply("agent-node-a").force();
    let b = PatchParams::apply("agent-node-b").force();
    dc.patch_status(
        "g",
        &a,
        &Patch::Apply(status(json!([{"type": "NodeAReady", "status": "True"}]))),
    )
    .await
    .unwrap();
    let o = dc
        .patch_status(
            "g",
            &b,
            &Patch::Apply(status(json!([{"type": "NodeBReady", "status": "True"}]))),
        )
        .await
        .unwrap();
    let types: Vec<String> = o
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["NodeAReady", "NodeBReady"]);
    // A re-applies without its condition: only A's entry goes.
    let o = dc
        .patch_status("g", &a, &Patch::Apply(status(json!([]))))
        .await
        .unwrap();
    let types: Vec<String> = o
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["NodeBReady"]);
    let mf = o.metadata.managed_fields.unwrap();
    let b_entry = mf
        .iter()
        .find(|m| m.manager.as_deref() == Some("agent-node-b"))
        .unwrap();
    assert_eq!(b_entry.subresource.as_deref(), Some("status"));
    assert_eq!(
        o.metadata.generation,
        Some(1),
        "status writes never bump generation"
    );
}

#[tokio::test]
async fn cluster_scoped_crd_and_crd_deletion() {
    let emu = start().await;
    let client = emu.client();
    let mut crd = servicemonitor_crd();
    let spec = &mut crd.spec;
    spec.group = "example.com".into();
    spec.scope = "Cluster".into();
    spec.names.plural = "widgets".into();
    spec.names.kind = "Widget".into();
    spec.names.list_kind = Some("WidgetList".into());
    crd.metadata.name = Some("widgets.example.com".into());
    install(&client, crd).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let w = all
        .create(&PostParams::default(), &DynamicObject::new("w1", &ar))
        .await
        .unwrap();
    assert_eq!(w.metadata.namespace, None);
    let namespaced: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    assert_eq!(
        api_error(namespaced.list(&ListParams::default()).await).code,
        404
    );

    // A CRD whose name does not match its names is invalid.
    let mut bad = servicemonitor_crd();
    bad.metadata.name = Some("wrong.name".into());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let e = api_error(crds.create(&PostParams::default(), &bad).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    // Deleting the CRD removes its objects and stops serving it.
    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(all.list(&ListParams::default()).await).code, 404);
    let d = kube::Discovery::new(client.clone()).run().await.unwrap();
    assert!(!d.has_group("example.com"));
    assert!(emu.list("example.com/v1", "Widget").is_empty());
    let names: Vec<String> = crds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert!(names.is_empty(), "{names:?}");
}
