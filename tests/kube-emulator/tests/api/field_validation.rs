//! Server-side field validation over HTTP: the `fieldValidation` directive on every write
//! verb, the `Warning` headers of `Warn`, unknown and duplicate fields, custom resources
//! pruned by their schema, server-side apply, and kube-rs clients (which send no directive,
//! so get the server's default, `Warn`) working as before.

use crate::common;

use common::{api_error, start};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// An answer: code, `Warning` header values, body.
struct Answer {
    code: u16,
    warnings: Vec<String>,
    body: Value,
}

async fn send(client: &kube::Client, method: &str, uri: &str, ct: &str, body: &[u8]) -> Answer {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .body(body.to_vec())
        .unwrap();
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    let code = res.status().as_u16();
    let warnings = res
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        code,
        warnings,
        body: serde_json::from_slice(&bytes).unwrap(),
    }
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const JSON: &str = "application/json";

fn q(path: &str, directive: Option<&str>) -> String {
    match directive {
        Some(d) => format!("{path}?fieldValidation={d}"),
        None => path.to_string(),
    }
}

fn stored(emu: &kube_emulator::Emulator, name: &str) -> Value {
    emu.get("v1", "ConfigMap", "default", name).unwrap()
}

#[tokio::test]
async fn creates_and_updates_honour_the_directive() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let body = |name: &str| {
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labelz": {"a": "b"}}, "data": {"k": "v"}, "dataa": 1}))
        .unwrap()
    };
    let unknown = [
        "299 - \"unknown field \\\"dataa\\\"\"",
        "299 - \"unknown field \\\"metadata.labelz\\\"\"",
    ];

    let a = send(&client, "POST", &q(CMS, Some("Strict")), JSON, &body("s")).await;
    assert_eq!(a.code, 400, "{}", a.body);
    assert_eq!(a.body["reason"], "BadRequest");
    assert_eq!(
        a.body["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: \
         unknown field \"dataa\", unknown field \"metadata.labelz\""
    );
    assert!(a.warnings.is_empty());
    assert!(emu.get("v1", "ConfigMap", "default", "s").is_none());

    // Unset is the server's default, Warn: what kube-rs clients get.
    for (name, directive) in [("w", Some("Warn")), ("d", None)] {
        let a = send(&client, "POST", &q(CMS, directive), JSON, &body(name)).await;
        assert_eq!(a.code, 201, "{}", a.body);
        assert_eq!(a.warnings, unknown);
        assert!(a.body.get("dataa").is_none(), "{}", a.body);
        let s = stored(&emu, name);
        assert!(s.get("dataa").is_none() && s["metadata"].get("labelz").is_none());
        assert_eq!(s["data"], json!({"k": "v"}));
    }
    let a = send(&client, "POST", &q(CMS, Some("Ignore")), JSON, &body("i")).await;
    assert_eq!(a.code, 201, "{}", a.body);
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    assert!(stored(&emu, "i").get("dataa").is_none());

    // A dry run is checked the same way, and stores nothing either way.
    let a = send(
        &client,
        "POST",
        &format!("{CMS}?dryRun=All&fieldValidation=Strict"),
        JSON,
        &body("dry"),
    )
    .await;
    assert_eq!(a.code, 400, "{}", a.body);

    // PUT.
    let cur = stored(&emu, "w");
    let mut upd = cur.clone();
    upd["dataa"] = json!(2);
    let put = serde_json::to_vec(&upd).unwrap();
    let a = send(
        &client,
        "PUT",
        &q(&format!("{CMS}/w"), Some("Strict")),
        JSON,
        &put,
    )
    .await;
    assert_eq!(a.code, 400, "{}", a.body);
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .ends_with("strict decoding error: unknown field \"dataa\""),
        "{}",
        a.body
    );
    assert_eq!(stored(&emu, "w"), cur, "a refused update changes nothing");
    let a = send(&client, "PUT", &format!("{CMS}/w"), JSON, &put).await;
    assert_eq!(a.code, 200, "{}", a.body);
    assert_eq!(a.warnings, ["299 - \"unknown field \\\"dataa\\\"\""]);

    // A directive the server does not know.
    let a = send(&client, "POST", &q(CMS, Some("strict")), JSON, &body("x")).await;
    assert_eq!(a.code, 422, "{}", a.body);
    assert_eq!(a.body["details"]["causes"][0]["field"], "fieldValidation");
}

#[tokio::test]
async fn duplicate_fields_count_like_unknown_ones() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let body = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"dup"},
        "data":{"a":"first","a":"second"}}"#;
    let a = send(&client, "POST", &q(CMS, Some("Strict")), JSON, body).await;
    assert_eq!(a.code, 400, "{}", a.body);
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .ends_with("strict decoding error: duplicate field \"data.a\""),
        "{}",
        a.body
    );
    let a = send(&client, "POST", CMS, JSON, body).await;
    assert_eq!(a.code, 201, "{}", a.body);
    assert_eq!(a.warnings, ["299 - \"duplicate field \\\"data.a\\\"\""]);
    assert_eq!(
        stored(&emu, "dup")["data"]["a"],
        "second",
        "the last one wins"
    );

    let patch = br#"{"data":{"b":"1","b":"2"}}"#;
    let a = send(
        &client,
        "PATCH",
        &q(&format!("{CMS}/dup"), Some("Strict")),
        "application/merge-patch+json",
        patch,
    )
    .await;
    assert_eq!(a.code, 422, "{}", a.body);
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .ends_with("strict decoding error: duplicate field \"data.b\""),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn patches_check_the_patched_object() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("p".into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let before = stored(&emu, "p");
    let uri = |d: &str| q(&format!("{CMS}/p"), Some(d));
    let kinds: [(&str, &[u8]); 3] = [
        ("application/merge-patch+json", br#"{"dataa":{"x":"y"}}"#),
        (
            "application/strategic-merge-patch+json",
            br#"{"dataa":{"x":"y"}}"#,
        ),
        (
            "application/json-patch+json",
            br#"[{"op":"add","path":"/dataa","value":{"x":"y"}}]"#,
        ),
    ];
    for (ct, patch) in kinds {
        let a = send(&client, "PATCH", &uri("Strict"), ct, patch).await;
        assert_eq!(a.code, 422, "{ct}: {}", a.body);
        assert_eq!(a.body["reason"], "Invalid");
        let cause = &a.body["details"]["causes"][0];
        assert_eq!(cause["field"], "patch", "{ct}: {}", a.body);
        assert!(
            cause["message"]
                .as_str()
                .unwrap()
                .ends_with("strict decoding error: unknown field \"dataa\""),
            "{ct}: {}",
            a.body
        );
        assert_eq!(stored(&emu, "p"), before, "{ct}: nothing changes");

        let a = send(&client, "PATCH", &uri("Warn"), ct, patch).await;
        assert_eq!(a.code, 200, "{ct}: {}", a.body);
        assert_eq!(
            a.warnings,
            ["299 - \"unknown field \\\"dataa\\\"\""],
            "{ct}"
        );
        let a = send(&client, "PATCH", &uri("Ignore"), ct, patch).await;
        assert_eq!(a.code, 200, "{ct}: {}", a.body);
        assert!(a.warnings.is_empty(), "{ct}");
        assert!(stored(&emu, "p").get("dataa").is_none(), "{ct}: pruned");
    }
    // A patch of known fields is fine under Strict.
    let a = send(
        &client,
        "PATCH",
        &uri("Strict"),
        "application/merge-patch+json",
        br#"{"data":{"k":"w"}}"#,
    )
    .await;
    assert_eq!(a.code, 200, "{}", a.body);
    assert!(a.warnings.is_empty());
    assert_eq!(stored(&emu, "p")["data"]["k"], "w");
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer"},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    }},
                }}}}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn custom_resources_follow_their_schema_and_apply_refuses_unknown_fields() {
    let emu = start().await;
    let client = emu.client_without_retries();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    let uri = "/apis/example.com/v1/namespaces/default/widgets";
    let body = serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 1, "colour": "red", "extra": {"anything": {"goes": true}}}}))
    .unwrap();
    let a = send(&client, "POST", &q(uri, Some("Strict")), JSON, &body).await;
    assert_eq!(a.code, 400, "{}", a.body);
    assert_eq!(
        a.body["message"],
        "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: \
         unknown field \"spec.colour\""
    );
    let a = send(&client, "POST", uri, JSON, &body).await;
    assert_eq!(a.code, 201, "{}", a.body);
    assert_eq!(a.warnings, ["299 - \"unknown field \\\"spec.colour\\\"\""]);
    let w = emu.get("example.com/v1", "Widget", "default", "w").unwrap();
    assert_eq!(
        w["spec"],
        json!({"size": 1, "extra": {"anything": {"goes": true}}}),
        "pruned, except under x-kubernetes-preserve-unknown-fields"
    );

    // kube-rs server-side apply of an undeclared field fails whatever the directive.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::default_namespaced_with(client.clone(), &ar);
    let pp = PatchParams::apply("test");
    let bad = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"colour": "blue"}});
    let e = api_error(widgets.patch("w", &pp, &Patch::Apply(&bad)).await);
    assert_eq!(e.code, 500, "{e:?}");
    assert_eq!(
        e.message,
        "failed to create typed patch object (default/w; example.com/v1, Kind=Widget): \
         .spec.colour: field not declared in schema"
    );
    let good = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"size": 3}});
    // (Forced: the POST above owns spec.size.)
    let o = widgets
        .patch("w", &pp.force(), &Patch::Apply(&good))
        .await
        .unwrap();
    assert_eq!(o.data["spec"]["size"], 3);
}

#[tokio::test]
async fn seeding_an_object_with_an_unknown_field_is_refused() {
    let emu = start().await;
    let e = emu
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "default"}, "date": {"k": "v"}}))
        .unwrap_err();
    assert_eq!(e.code, 400);
    assert!(e.message.ends_with("unknown field \"date\""), "{e}");
    emu.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "default"}, "data": {"k": "v"}}))
        .unwrap();
}
