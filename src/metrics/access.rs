//! Access control on the metrics endpoint: what `metricsExporter.rbacConfig`
//! promises, done in-process the way kube-rbac-proxy does it.
//!
//! Owns: the policy a DeviceConfig asks for ([`AccessPolicy`], plain data,
//! built from the spec by the agent's planner, with the Secret and ConfigMap
//! material the agent fetched), turning it into a [`Guard`] (the rustls server
//! configuration and the authorization mode), and the per-request decision:
//! a client certificate CN named by `staticAuthorization.clientName` passes
//! without a review; otherwise the bearer token goes through a TokenReview and
//! its user through a SubjectAccessReview for `get` on the request's
//! non-resource URL (`/metrics`), both answers cached for [`CACHE_TTL`].
//!
//! Fail closed: when TLS is asked for and no usable certificate is there, the
//! protected paths answer 503 with the reason, over plain HTTP; `/healthz` and
//! `/readyz` are never protected (the kubelet probes them).
//!
//! Must not: fetch the Secret or ConfigMap (the agent follows them and passes
//! their content in), write anything to the API, or log credentials. The only
//! API calls are the two reviews, through the client the agent hands in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long a review's answer is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// Most answers kept; beyond it expired ones go first, then the oldest.
pub const CACHE_MAX_ENTRIES: usize = 1024;
/// Deadline of one TokenReview or SubjectAccessReview.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys of the TLS Secret, as for any `kubernetes.io/tls` Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";
/// Key of the client CA in `clientCAConfigMap`.
pub const CLIENT_CA_KEY: &str = "ca.crt";

/// The state of one object the agent follows for the endpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Fetched<T> {
    /// Not read yet.
    #[default]
    Waiting,
    /// The object does not exist.
    Missing,
    /// It exists but cannot be used, or cannot be read: the reason.
    Failed(String),
    Found(T),
}

/// A certificate chain and its key, PEM, as read from the Secret. `Debug`
/// never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPair {
    pub cert_pem: Arc<[u8]>,
    pub key_pem: Arc<[u8]>,
}

impl std::fmt::Debug for TlsPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPair")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The Kubernetes client the reviews go through. Every client of the process
/// talks to the same API server, so any two compare equal.
#[derive(Clone)]
pub struct ReviewClient(pub kube::Client);

impl PartialEq for ReviewClient {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ReviewClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReviewClient")
    }
}

/// What `rbacConfig` asks of the endpoint, with the material it names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccessPolicy {
    /// `rbacConfig.enable`: authenticate and authorize `/metrics` and
    /// `/gpumetrics`. Everything below matters only then.
    pub enabled: bool,
    /// Serve TLS (`disableHttps` unset or false).
    pub https: bool,
    /// `namespace/name` of the certificate Secret, if named.
    pub secret: Option<String>,
    /// `namespace/name` of the client CA ConfigMap, if named.
    pub client_ca_config_map: Option<String>,
    /// What the agent read of those two.
    pub material: AccessMaterial,
    /// A client certificate with this CN is allowed without a review.
    pub static_client: Option<String>,
    /// Where reviews go; `None` (standalone) refuses every protected request.
    pub api: Option<ReviewClient>,
}

/// What the agent read of the objects `rbacConfig` names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AccessMaterial {
    /// From the Secret in `rbacConfig.secret`.
    pub certificate: Fetched<TlsPair>,
    /// `ca.crt` of the ConfigMap in `rbacConfig.clientCAConfigMap`.
    pub client_ca: Fetched<Arc<str>>,
}

impl AccessPolicy {
    /// The policy `rbac` asks for, for a DeviceConfig in `namespace`.
    pub fn for_spec(
        rbac: &crate::api::KubeRbacConfig,
        namespace: &str,
        material: AccessMaterial,
        api: Option<ReviewClient>,
    ) -> Self {
        let named = |name: Option<&String>| {
            name.filter(|n| !n.is_empty())
                .map(|n| format!("{namespace}/{n}"))
        };
        let static_client = rbac
            .static_authorization
            .as_ref()
            .filter(|s| s.enable == Some(true))
            .and_then(|s| s.client_name.clone());
        Self {
            enabled: rbac.enable == Some(true),
            https: rbac.disable_https != Some(true),
            secret: named(rbac.secret.as_ref().map(|s| &s.name)),
            client_ca_config_map: named(rbac.client_ca_config_map.as_ref().map(|c| &c.name)),
            material,
            static_client,
            api,
        }
    }
}

/// The connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub tls: bool,
    /// Subject of a client certificate that the client CA verified.
    pub client: Option<CertSubject>,
}

/// CN and O of a certificate subject.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CertSubject {
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
}

/// The endpoint's access control in force: built once per policy change and
/// shared by every connection.
pub struct Guard {
    /// TLS for connections whose first byte is a TLS handshake.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    mode: Mode,
    /// What needs a person's attention (missing or unusable material).
    pub problems: Vec<String>,
}

enum Mode {
    Open,
    /// Protected paths answer 503 with this reason.
    Refuse(String),
    Authorize {
        https: bool,
        static_client: Option<String>,
        reviewer: Reviewer,
    },
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            tls: None,
            mode: Mode::Open,
            problems: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.mode {
            Mode::Open => "open",
            Mode::Refuse(_) => "refuse",
            Mode::Authorize { .. } => "authorize",
        };
        f.debug_struct("Guard")
            .field("tls", &self.tls.is_some())
            .field("mode", &mode)
            .field("problems", &self.problems)
            .finish()
    }
}

/// The problems a policy has, as [`Guard::build`] finds them (for the agent's
/// status).
pub fn problems(policy: &AccessPolicy) -> Vec<String> {
    Guard::build(policy).problems
}

fn describe<T>(what: &str, name: &str, fetched: &Fetched<T>) -> Option<String> {
    match fetched {
        Fetched::Found(_) => None,
        Fetched::Waiting => Some(format!("{what} {name} has not been read yet")),
        Fetched::Missing => Some(format!("{what} {name} does not exist")),
        Fetched::Failed(why) => Some(format!("{what} {name} cannot be used: {why}")),
    }
}

impl Guard {
    pub fn build(policy: &AccessPolicy) -> Self {
        if !policy.enabled {
            return Self::default();
        }
        let mut problems = Vec::new();
        let Some(api) = &policy.api else {
            let why = "rbacConfig is enabled but there is no Kubernetes API to review tokens (standalone): /metrics is refused".to_owned();
            return Self {
                tls: None,
                mode: Mode::Refuse(why.clone()),
                problems: vec![why],
            };
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // The client CA only adds a way to authenticate: without it, tokens
        // still work, so a missing one is reported and serving goes on.
        let client_roots = match &policy.client_ca_config_map {
            None => None,
            Some(name) => match &policy.material.client_ca {
                Fetched::Found(pem) => match client_ca_roots(pem.as_bytes()) {
                    Ok(roots) => Some(roots),
                    Err(why) => {
                        problems.push(format!(
                            "rbacConfig.clientCAConfigMap {name}: {why}; client certificates are not accepted"
                        ));
                        None
                    }
                },
                // Not read yet is a moment at start, not a problem.
                Fetched::Waiting => None,
                other => {
                    if let Some(p) = describe("rbacConfig.clientCAConfigMap", name, other) {
                        problems.push(format!("{p}; client certificates are not accepted"));
                    }
                    None
                }
            },
        };
        let mut tls = None;
        if policy.https {
            let certificate = match (&policy.secret, &policy.material.certificate) {
                (None, _) => self_signed()
                    .and_then(|pair| server_config(provider.clone(), &pair, client_roots.clone()))
                    .map_err(|why| format!("rbacConfig.secret is unset and {why}")),
                (Some(name), Fetched::Found(pair)) => {
                    server_config(provider.clone(), pair, client_roots.clone())
                        .map_err(|why| format!("rbacConfig.secret {name}: {why}"))
                }
                (Some(name), other) => Err(describe("rbacConfig.secret", name, other)
                    .unwrap_or_else(|| format!("rbacConfig.secret {name} is not usable"))),
            };
            match certificate {
                Ok(config) => tls = Some(Arc::new(config)),
                Err(why) => {
                    let why = format!("{why}: HTTPS is required, so /metrics is refused");
                    if policy.material.certificate != Fetched::Waiting || policy.secret.is_none() {
                        problems.push(why.clone());
                    }
                    return Self {
                        tls: None,
                        mode: Mode::Refuse(why),
                        problems,
                    };
                }
            }
        } else if policy.client_ca_config_map.is_some() {
            problems.push(
                "rbacConfig.clientCAConfigMap needs HTTPS, but disableHttps is set: client certificates are not accepted".into(),
            );
        }
        Self {
            tls,
            mode: Mode::Authorize {
                https: policy.https,
                static_client: policy.static_client.clone().filter(|c| !c.is_empty()),
                reviewer: Reviewer::new(api.0.clone()),
            },
            problems,
        }
    }

    /// Whether `path` needs a decision at all.
    pub fn protects(path: &str) -> bool {
        !matches!(path, "/healthz" | "/readyz")
    }

    /// Lets the request through (`Ok`) or answers it.
    pub async fn check(
        &self,
        peer: &Peer,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<(), Response> {
        if !Self::protects(path) {
            return Ok(());
        }
        let (https, static_client, reviewer) = match &self.mode {
            Mode::Open => return Ok(()),
            Mode::Refuse(why) => {
                return Err((StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response());
            }
            Mode::Authorize {
                https,
                static_client,
                reviewer,
            } => (*https, static_client, reviewer),
        };
        if https && !peer.tls {
            return Err((
                StatusCode::BAD_REQUEST,
                "this endpoint serves metrics over HTTPS only\n",
            )
                .into_response());
        }
        // A verified certificate of the static client needs nothing else.
        let subject = peer.client.as_ref();
        if let (Some(name), Some(cn)) =
            (static_client, subject.and_then(|s| s.common_name.as_ref()))
            && name == cn
        {
            return Ok(());
        }
        let credential = if let Some(token) = bearer_token(headers) {
            Credential::Token(token.to_owned())
        } else if let Some(CertSubject {
            common_name: Some(cn),
            organizations,
        }) = subject
        {
            Credential::Certificate {
                user: cn.clone(),
                groups: organizations.clone(),
            }
        } else {
            return Err(unauthorized());
        };
        match reviewer.decide(credential, path).await {
            Ok(Decision::Allowed) => Ok(()),
            Ok(Decision::Unauthenticated) => Err(unauthorized()),
            Ok(Decision::Forbidden(user)) => Err((
                StatusCode::FORBIDDEN,
                format!("{user} may not get {path}\n"),
            )
                .into_response()),
            Err(why) => {
                tracing::warn!(error = %why, "metrics access review failed");
                Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot review the request: {why}\n"),
                )
                    .into_response())
            }
        }
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "Unauthorized\n",
    )
        .into_response()
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Names in the self-signed certificate. Scrapers do not verify it (the
/// ServiceMonitor says `insecureSkipVerify`); name a Secret to have one that
/// verifies.
const SELF_SIGNED_NAMES: [&str; 2] = ["gpu-operator-metrics", "localhost"];

/// The process's self-signed certificate, made once, as kube-rbac-proxy does
/// when it is given none.
fn self_signed() -> Result<TlsPair, String> {
    static PAIR: std::sync::OnceLock<Result<TlsPair, String>> = std::sync::OnceLock::new();
    PAIR.get_or_init(|| {
        let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|n| n.to_string()).collect();
        let made = rcgen::generate_simple_self_signed(names)
            .map_err(|e| format!("no self-signed certificate could be made: {e}"))?;
        Ok(TlsPair {
            cert_pem: made.cert.pem().into_bytes().into(),
            key_pem: made.signing_key.serialize_pem().into_bytes().into(),
        })
    })
    .clone()
}

fn client_ca_roots(pem: &[u8]) -> Result<Arc<rustls::RootCertStore>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{CLIENT_CA_KEY} is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("{CLIENT_CA_KEY} holds an unusable certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{CLIENT_CA_KEY} holds no certificate"));
    }
    Ok(Arc::new(roots))
}

fn server_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    pair: &TlsPair,
    client_roots: Option<Arc<rustls::RootCertStore>>,
) -> Result<rustls::ServerConfig, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pair.cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{TLS_CERT_KEY} is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{TLS_CERT_KEY} holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&pair.key_pem)
        .map_err(|e| format!("{TLS_KEY_KEY} is not a PEM private key: {e}"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_roots {
        Some(roots) => {
            // Tokens still work without a certificate.
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| format!("client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{TLS_CERT_KEY} and {TLS_KEY_KEY} do not make a usable pair: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Credential {
    Token(String),
    Certificate { user: String, groups: Vec<String> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Decision {
    Allowed,
    Unauthenticated,
    /// The user who was refused.
    Forbidden(String),
}

/// TokenReview and SubjectAccessReview, with a short-lived cache of answers.
struct Reviewer {
    client: kube::Client,
    cache: Mutex<HashMap<(Credential, String), (Instant, Decision)>>,
}

/// Who a credential is.
struct User {
    name: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

impl Reviewer {
    fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, key: &(Credential, String)) -> Option<Decision> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(at, _)| at.elapsed() < CACHE_TTL)
            .map(|(_, d)| d.clone())
    }

    fn remember(&self, key: (Credential, String), decision: Decision) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        remember_bounded(&mut cache, key, decision, Instant::now());
    }

    async fn decide(&self, credential: Credential, path: &str) -> Result<Decision, String> {
        let key = (credential, path.to_owned());
        if let Some(decision) = self.cached(&key) {
            return Ok(decision);
        }
        let user = match &key.0 {
            Credential::Token(token) => match self.authenticate(token).await? {
                Some(user) => user,
                None => {
                    self.remember(key, Decision::Unauthenticated);
                    return Ok(Decision::Unauthenticated);
                }
            },
            Credential::Certificate { user, groups } => User {
                name: user.clone(),
                uid: None,
                groups: groups.clone(),
                extra: None,
            },
        };
        let decision = if self.authorize(&user, path).await? {
            Decision::Allowed
        } else {
            Decision::Forbidden(user.name)
        };
        self.remember(key, decision.clone());
        Ok(decision)
    }

    async fn authenticate(&self, token: &str) -> Result<Option<User>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("TokenReview took over {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("TokenReview: {e}"))?;
        let Some(status) = answer.status else {
            return Ok(None);
        };
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let Some(mut info) = status.user else {
            return Ok(None);
        };
        let Some(name) = info.username.take().filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        Ok(Some(User {
            name,
            uid: info.uid,
            groups: info.groups.unwrap_or_default(),
            extra: info.extra,
        }))
    }

    async fn authorize(&self, user: &User, path: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("SubjectAccessReview took over {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// Inserts into a cache bounded by [`CACHE_MAX_ENTRIES`]: when full, expired
/// entries go, then the oldest.
fn remember_bounded<K: Eq + std::hash::Hash + Clone, V>(
    cache: &mut HashMap<K, (Instant, V)>,
    key: K,
    value: V,
    now: Instant,
) {
    if cache.len() >= CACHE_MAX_ENTRIES && !cache.contains_key(&key) {
        cache.retain(|_, (at, _)| now.duration_since(*at) < CACHE_TTL);
        if cache.len() >= CACHE_MAX_ENTRIES
            && let Some(oldest) = cache
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
    }
    cache.insert(key, (now, value));
}

/// CN and O of a DER certificate's subject; `None` when it is not a
/// certificate this parser understands.
pub fn cert_subject(der: &[u8]) -> Option<CertSubject> {
    let (tag, cert, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, tbs, _) = tlv(cert)?;
    if tag != 0x30 {
        return None;
    }
    let mut rest = tbs;
    // version [0] EXPLICIT, optional
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for expected in [0x02, 0x30, 0x30, 0x30] {
        let (tag, _, after) = tlv(rest)?;
        if tag != expected {
            return None;
        }
        rest = after;
    }
    let (tag, mut name, _) = tlv(rest)?;
    if tag != 0x30 {
        return None;
    }
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    let mut subject = CertSubject::default();
    while !name.is_empty() {
        let (tag, mut set, after) = tlv(name)?;
        name = after;
        if tag != 0x31 {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, after) = tlv(set)?;
            set = after;
            if tag != 0x30 {
                return None;
            }
            let (tag, oid, value) = tlv(attribute)?;
            if tag != 0x06 {
                return None;
            }
            let (_, value, _) = tlv(value)?;
            let Ok(value) = std::str::from_utf8(value) else {
                continue;
            };
            if oid == CN {
                subject.common_name = Some(value.to_owned());
            } else if oid == O {
                subject.organizations.push(value.to_owned());
            }
        }
    }
    Some(subject)
}

/// One DER tag-length-value: the tag, the content and what follows.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let len = bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    Some((tag, content, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> TlsPair {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        TlsPair {
            cert_pem: cert.pem().into_bytes().into(),
            key_pem: key.serialize_pem().into_bytes().into(),
        }
    }

    #[test]
    fn the_subject_cn_and_o_come_out_of_a_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "prometheus");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "monitoring");
        let cert = params.self_signed(&key).unwrap();
        let subject = cert_subject(cert.der()).unwrap();
        assert_eq!(subject.common_name.as_deref(), Some("prometheus"));
        assert_eq!(subject.organizations, ["monitoring"]);
        assert_eq!(cert_subject(b"\x30\x05\x30"), None, "truncated");
        assert_eq!(cert_subject(&[]), None);
        assert_eq!(cert_subject(b"\x30\x84\xff\xff\xff\xff"), None, "overlong");
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
    }

    #[test]
    fn the_cache_stays_bounded_and_drops_expired_answers_first() {
        let mut cache = HashMap::new();
        let start = Instant::now();
        for i in 0..CACHE_MAX_ENTRIES {
            remember_bounded(&mut cache, i, (), start);
        }
        let later = start + CACHE_TTL + Duration::from_secs(1);
        remember_bounded(&mut cache, usize::MAX, (), later);
        assert_eq!(cache.len(), 1, "every expired answer went");
        for i in 0..CACHE_MAX_ENTRIES + 10 {
            remember_bounded(&mut cache, i, (), later + Duration::from_millis(i as u64));
        }
        assert_eq!(cache.len(), CACHE_MAX_ENTRIES);
        assert!(!cache.contains_key(&usize::MAX), "the oldest went");
    }

    fn client() -> ReviewClient {
        // Never contacted: these tests stop before any review.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        ReviewClient(kube::Client::try_from(config).unwrap())
    }

    #[tokio::test]
    async fn tls_asked_for_without_a_certificate_fails_closed_and_says_why() {
        let policy = AccessPolicy {
            enabled: true,
            https: true,
            secret: Some("ns/metrics-tls".into()),
            material: AccessMaterial {
                certificate: Fetched::Missing,
                ..AccessMaterial::default()
            },
            api: Some(client()),
            ..AccessPolicy::default()
        };
        let guard = Guard::build(&policy);
        assert!(guard.tls.is_none());
        assert_eq!(guard.problems.len(), 1, "{:?}", guard.problems);
        assert!(
            guard.problems[0].contains("ns/metrics-tls does not exist"),
            "{:?}",
            guard.problems
        );
        let peer = Peer::default();
        let refused = guard
            .check(&peer, &HeaderMap::new(), "/metrics")
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            guard
                .check(&peer, &HeaderMap::new(), "/healthz")
                .await
                .is_ok()
        );
        assert!(
            guard
                .check(&peer, &HeaderMap::new(), "/readyz")
                .await
                .is_ok()
        );

        let found = Guard::build(&AccessPolicy {
            material: AccessMaterial {
                certificate: Fetched::Found(pair()),
                ..AccessMaterial::default()
            },
            ..policy.clone()
        });
        assert!(
            found.tls.is_some() && found.problems.is_empty(),
            "{found:?}"
        );
        let plain = found
            .check(&peer, &HeaderMap::new(), "/metrics")
            .await
            .unwrap_err();
        assert_eq!(
            plain.status(),
            StatusCode::BAD_REQUEST,
            "no metrics over plain HTTP"
        );
        let tls_peer = Peer {
            tls: true,
            client: None,
        };
        let anonymous = found
            .check(&tls_peer, &HeaderMap::new(), "/metrics")
            .await
            .unwrap_err();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

        let broken = Guard::build(&AccessPolicy {
            material: AccessMaterial {
                certificate: Fetched::Found(TlsPair {
                    cert_pem: Arc::from(&b"not pem"[..]),
                    key_pem: Arc::from(&b""[..]),
                }),
                ..AccessMaterial::default()
            },
            ..policy
        });
        assert!(broken.tls.is_none());
        assert!(
            broken.problems[0].contains("tls.crt holds no certificate"),
            "{broken:?}"
        );
    }

    #[tokio::test]
    async fn a_static_client_passes_without_a_review_others_need_one() {
        let guard = Guard::build(&AccessPolicy {
            enabled: true,
            https: false,
            static_client: Some("prometheus".into()),
            api: Some(client()),
            ..AccessPolicy::default()
        });
        let peer = |cn: &str| Peer {
            tls: true,
            client: Some(CertSubject {
                common_name: Some(cn.into()),
                organizations: vec![],
            }),
        };
        assert!(
            guard
                .check(&peer("prometheus"), &HeaderMap::new(), "/metrics")
                .await
                .is_ok()
        );
        let mut with_token = HeaderMap::new();
        with_token.insert(header::AUTHORIZATION, "Bearer whatever".parse().unwrap());
        assert!(
            guard
                .check(&peer("prometheus"), &with_token, "/metrics")
                .await
                .is_ok(),
            "the certificate decides before any token"
        );
        // Another CN goes to a review, which cannot reach the API here.
        let other = guard
            .check(&peer("intruder"), &HeaderMap::new(), "/metrics")
            .await
            .unwrap_err();
        assert_eq!(other.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn without_a_secret_the_endpoint_uses_a_self_signed_certificate() {
        let guard = Guard::build(&AccessPolicy {
            enabled: true,
            https: true,
            api: Some(client()),
            ..AccessPolicy::default()
        });
        assert!(guard.tls.is_some(), "{guard:?}");
        assert!(guard.problems.is_empty(), "{guard:?}");
        let again = self_signed().unwrap();
        assert_eq!(again, self_signed().unwrap(), "made once per process");
    }

    #[test]
    fn off_by_default_and_standalone_refuses() {
        assert!(Guard::build(&AccessPolicy::default()).problems.is_empty());
        let standalone = Guard::build(&AccessPolicy {
            enabled: true,
            https: false,
            ..AccessPolicy::default()
        });
        assert!(standalone.problems[0].contains("standalone"));
    }
}
