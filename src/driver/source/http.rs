//! HTTP: downloading a tarball from a URL its caller names.
//!
//! It owns the client (rustls, the system's roots), redirects, and
//! hashing the body as it is saved within the caps; it must not read the
//! body as a tarball ([`super::unpack`]).

use std::io;
use std::path::Path;

use super::location::{FetchLimits, redact, resolve_redirect, too_big};
use super::names::hex;
use super::{SourceError, store_error, write_error};
use crate::driver::space::DiskBudget;

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<hyper::body::Bytes>,
>;

/// An http and https client: TLS on rustls with the ring provider and the
/// system's root certificates (`rustls-native-certs`, which honours
/// `SSL_CERT_FILE` and `SSL_CERT_DIR`). No roots is not an error until an
/// https URL is fetched: a plain http mirror needs none.
fn http_client(limits: &FetchLimits) -> Result<HttpClient, SourceError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        tracing::warn!(
            errors = ?native.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "no system root certificates: https downloads will fail"
        );
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SourceError::Unavailable(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(limits.connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
    )
}

/// An error and its causes, `: `-separated (hyper's own says only
/// "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Downloads `url` to the new file `to`, following a few redirects, while
/// hashing it; within `limits.timeout` as a whole. Returns the sha256 and
/// size.
pub(super) async fn download(
    url: &hyper::Uri,
    to: &Path,
    limits: &FetchLimits,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    let shown = redact(&url.to_string());
    let client = http_client(limits)?;
    let work = async {
        let mut url = url.clone();
        for _ in 0..=limits.max_redirects {
            let here = redact(&url.to_string());
            let request = hyper::Request::get(url.clone())
                .header(
                    hyper::header::USER_AGENT,
                    concat!("gpu-operator/", env!("CARGO_PKG_VERSION")),
                )
                .body(http_body_util::Empty::new())
                .map_err(|e| SourceError::Invalid(format!("{here}: {e}")))?;
            let response = client.request(request).await.map_err(|e| {
                SourceError::Unavailable(format!("GET {here}: {}", error_chain(&e)))
            })?;
            let status = response.status();
            if status.is_redirection() && status != hyper::StatusCode::NOT_MODIFIED {
                let location = response
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| {
                        SourceError::Unavailable(format!("GET {here}: {status} without a Location"))
                    })?;
                url = resolve_redirect(&url, location).map_err(|why| {
                    SourceError::Unavailable(format!("GET {here}: {status}: {why}"))
                })?;
                tracing::debug!(from = %here, to = %redact(&url.to_string()), "redirected");
                continue;
            }
            if !status.is_success() {
                return Err(SourceError::Unavailable(format!("GET {here}: {status}")));
            }
            let declared = response
                .headers()
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limits.max_tarball_bytes) {
                return Err(too_big(&here, limits.max_tarball_bytes));
            }
            if let Some(declared) = declared {
                budget
                    .check_room(declared)
                    .map_err(|e| write_error(to, e))?;
            }
            return save_body(
                response.into_body(),
                to,
                limits.max_tarball_bytes,
                &here,
                budget,
            )
            .await;
        }
        Err(SourceError::Unavailable(format!(
            "GET {shown}: more than {} redirects",
            limits.max_redirects
        )))
    };
    tokio::time::timeout(limits.timeout, work)
        .await
        .map_err(|_| {
            SourceError::Unavailable(format!(
                "GET {shown}: not done within {} s",
                limits.timeout.as_secs()
            ))
        })?
}

/// Streams a response body into the new file `to` while hashing it.
async fn save_body(
    mut body: hyper::body::Incoming,
    to: &Path,
    max: u64,
    shown: &str,
    budget: &DiskBudget,
) -> Result<(String, u64), SourceError> {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    let file_error = |e: io::Error| store_error(format!("{}: {e}", to.display()));
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .await
        .map_err(file_error)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| SourceError::Unavailable(format!("GET {shown}: {}", error_chain(&e))))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        size += data.len() as u64;
        if size > max {
            return Err(too_big(shown, max));
        }
        budget
            .charge(data.len() as u64)
            .map_err(|e| write_error(to, e))?;
        context.update(&data);
        file.write_all(&data).await.map_err(file_error)?;
    }
    file.flush().await.map_err(file_error)?;
    Ok((hex(context.finish().as_ref()), size))
}
