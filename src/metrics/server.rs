//! The HTTP endpoints: `/metrics` (Prometheus text format), `/gpumetrics` (the
//! same sample as JSON), `/healthz` and `/readyz`.
//!
//! Handlers never compute anything: the sampling task publishes pre-rendered
//! bodies on a `watch` channel and a scrape clones a reference-counted buffer.
//! So a scrape costs the same whatever sysfs is doing.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::render::CONTENT_TYPE;

/// What the endpoints serve, replaced as a whole after every sample.
#[derive(Clone, Debug, Default)]
pub struct Published {
    pub metrics: Bytes,
    pub json: Bytes,
    /// A first sample has been rendered.
    pub ready: bool,
}

type Shared = watch::Receiver<Arc<Published>>;

pub fn router(published: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/gpumetrics", get(gpumetrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(published)
}

async fn metrics(State(published): State<Shared>) -> Response {
    let body = published.borrow().metrics.clone();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

async fn gpumetrics(State(published): State<Shared>) -> Response {
    let published = published.borrow().clone();
    if !published.ready {
        // Before the first sample there is no document; an empty 200 would
        // not be JSON.
        let body = r#"{"error":"no sample yet"}"#;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        published.json.clone(),
    )
        .into_response()
}

async fn readyz(State(published): State<Shared>) -> Response {
    if published.borrow().ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no sample yet\n").into_response()
    }
}

/// Binds `addr` and serves until `stop` fires. Returns the bound address (port 0
/// picks a free one) and the server task.
pub async fn serve(
    addr: SocketAddr,
    published: Shared,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let server = axum::serve(listener, router(published))
            .with_graceful_shutdown(async move { stop.cancelled().await });
        if let Err(e) = server.await {
            tracing::warn!(error = %e, "metrics HTTP server stopped");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.0\r\nHost: t\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn before_the_first_sample_the_json_view_is_unavailable_not_empty() {
        let (tx, rx) = watch::channel(Arc::new(Published::default()));
        let stop = CancellationToken::new();
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), rx, stop.clone())
            .await
            .unwrap();
        let response = get(addr, "/gpumetrics").await;
        assert!(response.starts_with("HTTP/1.0 503"), "{response}");
        assert!(
            response.ends_with(r#"{"error":"no sample yet"}"#),
            "{response}"
        );
        tx.send_replace(Arc::new(Published {
            metrics: Bytes::new(),
            json: Bytes::from_static(b"{\"gpus\":[]}"),
            ready: true,
        }));
        let response = get(addr, "/gpumetrics").await;
        assert!(response.starts_with("HTTP/1.0 200"), "{response}");
        assert!(response.ends_with(r#"{"gpus":[]}"#), "{response}");
        stop.cancel();
        let _ = task.await;
    }
}
