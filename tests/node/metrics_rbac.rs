//! `metricsExporter.rbacConfig` end to end: a real agent on the API emulator
//! serves its metrics over TLS from the Secret the DeviceConfig names, lets
//! through only tokens the emulator's TokenReview accepts for users its
//! SubjectAccessReview allows (cached), accepts client certificates signed by
//! the CA of `clientCAConfigMap` (the static client without any review), keeps
//! `/healthz` open, and fails closed while the Secret is missing.
//!
//! Loopback only; certificates are made in the test with rcgen; every wait is
//! bounded.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpu_operator::api::agent_status::{AgentStatus, STATUS_ANNOTATION};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::{Value, json};
use support::cluster::NAMESPACE as NS;
use support::node_rig::NodeRig;
use support::wait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NODE: &str = "gpu-node-1";
const TOKEN_REVIEWS: &str = "tokenreviews.authentication.k8s.io";
const ACCESS_REVIEWS: &str = "subjectaccessreviews.authorization.k8s.io";
const PROMETHEUS_SA: &str = "system:serviceaccount:monitoring:prometheus";

/// A CA, a server certificate for `localhost` and client certificates, all
/// made for this test.
struct Pki {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
    ca_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "metrics test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().unwrap();
        let mut server_params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        server_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let server = server_params.signed_by(&server_key, &issuer).unwrap();
        Self {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            ca_der: ca.der().clone(),
            issuer,
        }
    }

    /// A client certificate with this CN, signed by the CA, and its key.
    fn client(&self, cn: &str) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), key)
    }

    fn connector(
        &self,
        client: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    ) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = match client {
            Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// The status code and body of one HTTP/1.0 request, or why there is none.
async fn request<S>(mut stream: S, path: &str, token: Option<&str>) -> Result<(u16, String), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw)).await;
    match read {
        Err(_) => return Err("no response within 5 s".into()),
        // A peer that closes without close_notify still sent its response.
        Ok(Err(e)) if raw.is_empty() => return Err(format!("read: {e}")),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

async fn plain(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    request(stream, path, None).await
}

async fn tls(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, stream))
        .await
        .map_err(|_| "TLS handshake took over 5 s".to_owned())?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    request(stream, path, token).await
}

/// The node with its agent, serving metrics on `metrics`.
struct Harness {
    node: NodeRig,
    metrics: SocketAddr,
}

impl std::ops::Deref for Harness {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.node
    }
}

impl Harness {
    async fn start() -> Self {
        let mut node = NodeRig::builder(NODE)
            .cluster(json!({}))
            .profile("mi300x", None, None)
            .kubelet()
            .start()
            .await;
        // The agent binds this address; take a free port and let it go.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = node.agent_config().metrics_listen(metrics).build();
        node.start_agent(config);
        Self { node, metrics }
    }

    async fn create_tls_secret(&self, name: &str, pki: &Pki) {
        let api: Api<Secret> = Api::namespaced(self.client(), NS);
        let data = BTreeMap::from([
            (
                "tls.crt".to_owned(),
                ByteString(pki.server_cert_pem.clone().into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(pki.server_key_pem.clone().into_bytes()),
            ),
        ]);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Secret::default()
        };
        api.create(&PostParams::default(), &secret).await.unwrap();
    }

    async fn create_client_ca(&self, name: &str, pki: &Pki) {
        let api: Api<ConfigMap> = Api::namespaced(self.client(), NS);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("ca.crt".to_owned(), pki.ca_pem.clone())])),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm).await.unwrap();
    }

    async fn apply_device_config(&self, spec: Value) {
        self.cluster().apply_device_config("gpus", spec).await;
    }

    fn status(&self) -> Option<AgentStatus> {
        let node = self.cluster().get("v1", "Node", "", NODE)?;
        let text = node["metadata"]["annotations"][STATUS_ANNOTATION].as_str()?;
        AgentStatus::parse(text).ok()
    }

    async fn stop(mut self) {
        let (stopped, _) = self.node.stop_agent().await.expect("an agent runs");
        stopped.unwrap().unwrap();
    }
}

fn code(answer: &Result<(u16, String), String>) -> Option<u16> {
    answer.as_ref().ok().map(|(c, _)| *c)
}

fn rbac_spec() -> Value {
    json!({"metricsExporter": {"enable": true, "rbacConfig": {
        "enable": true,
        "secret": {"name": "metrics-tls"},
        "clientCAConfigMap": {"name": "metrics-client-ca"},
        "staticAuthorization": {"enable": true, "clientName": "prometheus"},
    }}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_reviewed_and_cached_over_tls_and_healthz_stays_open() {
    let pki = Pki::new();
    let harness = Harness::start().await;
    let reviews = harness.cluster().reviews();
    reviews.add_token("good", PROMETHEUS_SA, &["system:serviceaccounts"]);
    reviews.allow_user(PROMETHEUS_SA, "get", "/metrics");
    reviews.add_token("no-grant", "alice", &[]);
    harness.create_tls_secret("metrics-tls", &pki).await;
    harness.create_client_ca("metrics-client-ca", &pki).await;
    harness.apply_device_config(rbac_spec()).await;
    let addr = harness.metrics;
    let anonymous = pki.connector(None);

    // Once the policy is in force, TLS is up and asks for credentials.
    wait::poll_until(
        "TLS with authentication",
        || tls(addr, &anonymous, "/metrics", None),
        |a| code(a) == Some(401),
    )
    .await
    .unwrap();
    let rejected = tls(addr, &anonymous, "/metrics", Some("forged")).await;
    assert_eq!(code(&rejected), Some(401), "{rejected:?}");
    let forbidden = tls(addr, &anonymous, "/metrics", Some("no-grant")).await;
    assert_eq!(code(&forbidden), Some(403), "{forbidden:?}");
    // Granted; the exposition is there once the first sample is (on a
    // loaded machine that can come after TLS is up).
    let (status, body) = wait::poll_until(
        "the granted scrape to carry the first sample",
        || tls(addr, &anonymous, "/metrics", Some("good")),
        |a| matches!(a, Ok((200, body)) if !body.is_empty()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("gpu_edge_temperature{") || body.contains("gpu_operator_"),
        "{body}"
    );

    // The probes need nothing, over TLS or plain HTTP; metrics are HTTPS only.
    let healthz = tls(addr, &anonymous, "/healthz", None).await;
    assert_eq!(code(&healthz), Some(200), "{healthz:?}");
    let healthz = plain(addr, "/healthz").await;
    assert_eq!(code(&healthz), Some(200), "{healthz:?}");
    let readyz = plain(addr, "/readyz").await;
    assert!(matches!(code(&readyz), Some(200 | 503)), "{readyz:?}");
    let plain_metrics = plain(addr, "/metrics").await;
    assert_eq!(code(&plain_metrics), Some(400), "{plain_metrics:?}");

    // The client CA may be read a moment after the Secret, and the
    // endpoint's guard, with its cache of reviews, is built again when it
    // is: count reviews only once mTLS is in force (the static client
    // passes), and with this guard's cache filled.
    let prometheus = pki.connector(Some(pki.client("prometheus")));
    wait::poll_until(
        "mTLS in force",
        || tls(addr, &prometheus, "/metrics", None),
        |a| code(a) == Some(200),
    )
    .await
    .unwrap();
    let filled = tls(addr, &anonymous, "/metrics", Some("good")).await;
    assert_eq!(code(&filled), Some(200), "{filled:?}");
    let filled = tls(addr, &anonymous, "/metrics", Some("no-grant")).await;
    assert_eq!(code(&filled), Some(403), "{filled:?}");

    // Within the cache window the same token and path make no new review.
    let before = harness.cluster().requests();
    for _ in 0..3 {
        let again = tls(addr, &anonymous, "/metrics", Some("good")).await;
        assert_eq!(code(&again), Some(200), "{again:?}");
    }
    let forbidden_again = tls(addr, &anonymous, "/metrics", Some("no-grant")).await;
    assert_eq!(code(&forbidden_again), Some(403));
    let made = harness.cluster().requests().since(&before);
    assert_eq!(made.get("create", TOKEN_REVIEWS), 0, "{made}");
    assert_eq!(made.get("create", ACCESS_REVIEWS), 0, "{made}");

    // mTLS: the static client passes with no review at all; another client
    // certificate is authorized by a SubjectAccessReview for its CN.
    let before = harness.cluster().requests();
    let (status, body) = tls(addr, &prometheus, "/metrics", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let made = harness.cluster().requests().since(&before);
    assert_eq!(made.get("create", TOKEN_REVIEWS), 0, "{made}");
    assert_eq!(made.get("create", ACCESS_REVIEWS), 0, "{made}");
    let stranger = pki.connector(Some(pki.client("stranger")));
    let refused = tls(addr, &stranger, "/metrics", None).await;
    assert_eq!(code(&refused), Some(403), "{refused:?}");
    let made = harness.cluster().requests().since(&before);
    assert_eq!(made.get("create", ACCESS_REVIEWS), 1, "{made}");
    assert_eq!(made.get("create", TOKEN_REVIEWS), 0, "{made}");
    assert!(
        harness.status().is_some_and(|s| s.problems.is_empty()),
        "no problems: {:?}",
        harness.status()
    );
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_fails_closed_is_reported_and_its_creation_enables_tls() {
    let pki = Pki::new();
    let harness = Harness::start().await;
    let reviews = harness.cluster().reviews();
    reviews.add_token("good", PROMETHEUS_SA, &[]);
    reviews.allow_user(PROMETHEUS_SA, "get", "/metrics");
    harness
        .apply_device_config(json!({"metricsExporter": {"enable": true,
            "rbacConfig": {"enable": true, "secret": {"name": "metrics-tls"}}}}))
        .await;
    let addr = harness.metrics;
    let problem = "metrics endpoint: rbacConfig.secret kube-amd-gpu/metrics-tls does not exist";
    wait::eventually_explained(
        "the missing Secret reported",
        || {
            harness
                .status()
                .is_some_and(|s| s.problems.iter().any(|p| p.starts_with(problem)))
        },
        || format!("status: {:?}", harness.status()),
    )
    .await;
    // Fail closed: no metrics over plain HTTP, and it says why; probes answer.
    // The endpoint's guard is rebuilt from the same lookup the status
    // reports, a moment after it: wait for its answer to say so too.
    let (status, body) = wait::poll_until(
        "the endpoint to name the missing Secret",
        || plain(addr, "/metrics"),
        |a| matches!(a, Ok((_, body)) if body.contains("metrics-tls does not exist")),
    )
    .await
    .unwrap();
    assert_eq!(status, 503, "{body}");
    let healthz = plain(addr, "/healthz").await;
    assert_eq!(code(&healthz), Some(200), "{healthz:?}");

    harness.create_tls_secret("metrics-tls", &pki).await;
    let connector = pki.connector(None);
    wait::poll_until(
        "TLS once the Secret exists",
        || tls(addr, &connector, "/metrics", Some("good")),
        |a| code(a) == Some(200),
    )
    .await
    .unwrap();
    wait::eventually_explained(
        "the problem cleared",
        || harness.status().is_some_and(|s| s.problems.is_empty()),
        || format!("status: {:?}", harness.status()),
    )
    .await;
    harness.stop().await;
}
