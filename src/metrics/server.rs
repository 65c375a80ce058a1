//! The HTTP endpoints: `/metrics` (Prometheus text format), `/gpumetrics` (the
//! same sample as JSON), `/healthz` and `/readyz`.
//!
//! Handlers never read anything: the sampling task publishes each sample on a
//! `watch` channel ([`Published`]), rendered ahead while something scrapes, and
//! a scrape clones a reference-counted buffer. So a scrape costs the same
//! whatever sysfs is doing; only the first scrape after a quiet spell renders.
//!
//! The server owns its connections and bounds them ([`ConnectionLimits`]): at
//! most a fixed number at once (capped by the descriptor budget of
//! [`super::limits`]), a deadline for each request head (which also ends
//! keep-alive connections that stay idle), and a stall timeout for connections
//! on which no byte moves. When the cap is reached, a new client is not refused:
//! the oldest connection is asked to finish (an idle one closes at once, a busy
//! one after its response), and the new one takes its place. So idle or hostile
//! clients cost at most the cap in descriptors, and a scraper always gets in.
//!
//! Access control ([`super::access`]) sits in front of every path but
//! `/healthz` and `/readyz`. With TLS configured, the port speaks both: a
//! connection whose first byte starts a TLS handshake gets TLS, any other is
//! plain HTTP, which keeps the kubelet's HTTP probes working while metrics are
//! served over HTTPS only.
//!
//! This module must not read sysfs or talk to the Kubernetes API.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::access::{Guard, Peer, cert_subject};
use super::render::CONTENT_TYPE;

/// Renders one sample's bodies. The sampling task hands one to each
/// [`Published`]; the bodies are made at most once, when first asked for.
pub trait Exposition: Send + Sync {
    /// The Prometheus text exposition.
    fn metrics(&self) -> Bytes;
    /// The same sample as JSON (`/gpumetrics`).
    fn json(&self) -> Bytes;
}

/// What the endpoints serve, replaced as a whole after every sample.
///
/// The bodies are rendered on demand and kept: an exporter that nobody scrapes
/// renders nothing (a rendering of 8 GPUs costs milliseconds, which an idle
/// node should not pay every few seconds), and every scrape of the same sample
/// shares one rendering. The sampling task renders ahead of the scrapes
/// ([`Published::prerender`]) while something scrapes, so that a scrape
/// then only clones a reference-counted buffer.
#[derive(Default)]
pub struct Published {
    source: Option<Box<dyn Exposition>>,
    metrics: OnceLock<Bytes>,
    json: OnceLock<Bytes>,
    /// A client asked for a body (prerendering does not count).
    served: AtomicBool,
    /// Set while the sampling task waits for a scrape instead of sampling at
    /// its interval (nobody scraped for a while): a client first asks it for
    /// a fresh sample ([`Published::ask_fresh`]).
    asks: Option<Arc<tokio::sync::Notify>>,
    /// A first sample has been rendered.
    pub ready: bool,
    /// Why there is no sample yet, for `/readyz` (e.g. `discovering`);
    /// `None` reads as "no sample yet".
    pub waiting_for: Option<&'static str>,
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("ready", &self.ready)
            .field("waiting_for", &self.waiting_for)
            .field("rendered", &self.metrics.get().map(Bytes::len))
            .field("served", &self.served)
            .finish_non_exhaustive()
    }
}

impl Published {
    /// No sample yet, and why.
    pub fn waiting(waiting_for: Option<&'static str>) -> Self {
        Self {
            waiting_for,
            ..Self::default()
        }
    }

    /// A sample, rendered by `source` when first asked for.
    pub fn sample(source: impl Exposition + 'static) -> Self {
        Self {
            source: Some(Box::new(source)),
            ready: true,
            ..Self::default()
        }
    }

    /// The same sample, taken by a sampling task that now waits for a scrape
    /// to sample again: it is asked through `asks`.
    pub fn asking_through(mut self, asks: Arc<tokio::sync::Notify>) -> Self {
        self.asks = Some(asks);
        self
    }

    /// For a client: when this is the last sample before the sampling task
    /// paused, marks it served and asks for a fresh one. True if it asked.
    pub fn ask_fresh(&self) -> bool {
        match &self.asks {
            Some(asks) => {
                self.served.store(true, Ordering::Relaxed);
                asks.notify_one();
                true
            }
            None => false,
        }
    }

    /// The text exposition, for a client: rendered now if nobody asked yet.
    pub fn metrics(&self) -> Bytes {
        self.served.store(true, Ordering::Relaxed);
        self.render_metrics()
    }

    /// The JSON view, for a client: rendered now if nobody asked yet.
    pub fn json(&self) -> Bytes {
        self.served.store(true, Ordering::Relaxed);
        self.json
            .get_or_init(|| self.source.as_ref().map(|s| s.json()).unwrap_or_default())
            .clone()
    }

    /// Renders the text exposition ahead of the first scrape.
    pub fn prerender(&self) {
        self.render_metrics();
    }

    /// Whether a client asked for either body.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    fn render_metrics(&self) -> Bytes {
        self.metrics
            .get_or_init(|| {
                self.source
                    .as_ref()
                    .map(|s| s.metrics())
                    .unwrap_or_default()
            })
            .clone()
    }
}

type Shared = watch::Receiver<Arc<Published>>;

/// Bounds on the endpoint's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once; further ones displace the oldest. The
    /// server lowers it to a quarter of the soft `RLIMIT_NOFILE`.
    pub max_connections: usize,
    /// Time for a request's head to arrive, counted from when the connection
    /// opens or goes idle after a response: so also the keep-alive idle limit.
    pub header_read_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed
    /// (e.g. a client that stops reading its response).
    pub idle_timeout: Duration,
}

impl ConnectionLimits {
    pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// The access control in force, replaced as a whole when the policy changes.
pub type SharedGuard = watch::Receiver<Arc<Guard>>;

/// How long a connection asked to finish may take before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How long the accept loop waits for a displaced connection before asking the
/// next oldest one too.
const DISPLACE_WAIT: Duration = Duration::from_millis(500);

pub fn router(published: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/gpumetrics", get(gpumetrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .layer(axum::middleware::from_fn(check_access))
        .with_state(published)
}

/// Applies the [`Guard`] the connection put in the request's extensions
/// (requests that carry none, e.g. from a test driving the router directly, are
/// not checked).
async fn check_access(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if let Some(guard) = request.extensions().get::<Arc<Guard>>() {
        let peer = request
            .extensions()
            .get::<Peer>()
            .cloned()
            .unwrap_or_default();
        if let Err(refused) = guard
            .check(&peer, request.headers(), request.uri().path())
            .await
        {
            return refused;
        }
    }
    next.run(request).await
}

/// How long a client waits for the fresh sample it asked for before it is
/// served the last one (a sample's reads have deadlines well inside it).
pub const FRESH_WAIT: Duration = Duration::from_secs(5);

/// The sample a client is served: the current one, or, when the sampling
/// task paused for want of scrapes, the fresh one it takes when asked (the
/// current one if that takes longer than [`FRESH_WAIT`]).
async fn sample_to_serve(mut published: Shared) -> Arc<Published> {
    let current = published.borrow_and_update().clone();
    if !current.ask_fresh() {
        return current;
    }
    let fresh = tokio::time::timeout(
        FRESH_WAIT,
        published.wait_for(|p| !Arc::ptr_eq(p, &current) && p.ready),
    )
    .await;
    match fresh {
        Ok(Ok(fresh)) => fresh.clone(),
        _ => current,
    }
}

async fn metrics(State(published): State<Shared>) -> Response {
    let published = sample_to_serve(published).await;
    let body = published.metrics();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

async fn gpumetrics(State(published): State<Shared>) -> Response {
    let published = sample_to_serve(published).await;
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
        published.json(),
    )
        .into_response()
}

async fn readyz(State(published): State<Shared>) -> Response {
    let published = published.borrow();
    if published.ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let waiting_for = published.waiting_for.unwrap_or("no sample yet");
        (StatusCode::SERVICE_UNAVAILABLE, format!("{waiting_for}\n")).into_response()
    }
}

/// Binds `addr` and serves until `stop` fires. Returns the bound address (port 0
/// picks a free one) and the server task.
pub async fn serve(
    addr: SocketAddr,
    published: Shared,
    limits: ConnectionLimits,
    guard: SharedGuard,
    stop: CancellationToken,
) -> io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let cap = super::limits::current_connection_cap(limits.max_connections);
    super::agent::record_connection_cap(cap);
    tracing::debug!(%local, cap, "metrics endpoint connection cap");
    let app = router(published);
    let task = tokio::spawn(accept_loop(listener, app, limits, cap, guard, stop));
    Ok((local, task))
}

/// The live connections, oldest first, each with the token that asks it to
/// finish.
#[derive(Default)]
struct Connections {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, CancellationToken>>,
}

impl Connections {
    fn register(self: &Arc<Self>) -> (Registered, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.lock().insert(id, token.clone());
        super::agent::record_connection_opened();
        (
            Registered {
                connections: self.clone(),
                id,
            },
            token,
        )
    }

    /// Asks the oldest connection not yet asked to finish. Returns whether there
    /// was one.
    fn displace_oldest(&self) -> bool {
        let live = self.lock();
        match live.values().find(|t| !t.is_cancelled()) {
            Some(token) => {
                token.cancel();
                super::agent::record_connection_displaced();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        // A panic while holding this lock leaves the map consistent.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Removes a connection from [`Connections`] when it ends.
struct Registered {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
        super::agent::record_connection_closed();
    }
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    cap: usize,
    guard: SharedGuard,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(cap));
    let connections = Arc::new(Connections::default());
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the
                // descriptors come back as connections end.
                tracing::warn!(error = %e, "metrics endpoint cannot accept a connection");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        // The one accepted stream waits here for a slot: at most cap + 1
        // descriptors are ever held by clients.
        let permit = loop {
            if let Ok(permit) = slots.clone().try_acquire_owned() {
                break Some(permit);
            }
            if !connections.displace_oldest() {
                tracing::debug!("every connection is finishing; waiting for a slot");
            }
            tokio::select! {
                _ = stop.cancelled() => break None,
                permit = slots.clone().acquire_owned() => break permit.ok(),
                _ = tokio::time::sleep(DISPLACE_WAIT) => {}
            }
        };
        let Some(permit) = permit else { break };
        let (registered, displaced) = connections.register();
        tasks.spawn(connection(
            stream,
            app.clone(),
            limits,
            guard.clone(),
            displaced,
            stop.clone(),
            (permit, registered),
        ));
    }
    tasks.close();
    // Idle connections close at once on `stop`; busy ones get CLOSE_GRACE.
    let _ = tokio::time::timeout(CLOSE_GRACE + Duration::from_millis(500), tasks.wait()).await;
}

/// Serves one connection until it ends, is displaced, stalls, or `stop` fires.
/// `_held` (its slot and registration) is released when it returns.
async fn connection<H>(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    guard: SharedGuard,
    displaced: CancellationToken,
    stop: CancellationToken,
    held: H,
) {
    let tls = guard.borrow().tls.clone();
    let conn = Conn {
        app,
        limits,
        guard,
        displaced,
        stop,
    };
    let Some(tls) = tls else {
        return conn.serve(stream, Peer::default(), held).await;
    };
    // Before hyper takes over, a silent or slow client is bounded by the header
    // timeout and gives its slot up at once when displaced or stopped.
    let interrupted = {
        let (displaced, stop) = (conn.displaced.clone(), conn.stop.clone());
        async move {
            tokio::select! {
                _ = displaced.cancelled() => {}
                _ = stop.cancelled() => {}
            }
        }
    };
    tokio::pin!(interrupted);
    // A TLS ClientHello starts with the handshake record type, 0x16.
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(limits.header_read_timeout, stream.peek(&mut first)) => peeked,
        _ = &mut interrupted => return,
    };
    match peeked {
        Ok(Ok(1)) if first[0] == 0x16 => {}
        Ok(Ok(1)) => return conn.serve(stream, Peer::default(), held).await,
        _ => return,
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)) => handshake,
        _ = &mut interrupted => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "metrics TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let client = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|cert| cert_subject(cert));
    conn.serve(stream, Peer { tls: true, client }, held).await
}

/// What serving one connection needs besides its stream.
struct Conn {
    app: Router,
    limits: ConnectionLimits,
    guard: SharedGuard,
    displaced: CancellationToken,
    stop: CancellationToken,
}

impl Conn {
    async fn serve<S, H>(self, stream: S, peer: Peer, _held: H)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Conn {
            app,
            limits,
            guard,
            displaced,
            stop,
        } = self;
        let started = Instant::now();
        let activity = Arc::new(AtomicU64::new(0));
        let io = Tracked {
            inner: stream,
            started,
            activity: activity.clone(),
        };
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let mut request = request.map(axum::body::Body::new);
                // The guard in force now, so that a policy change reaches kept-alive
                // connections too.
                let current = guard.borrow().clone();
                request.extensions_mut().insert(current);
                request.extensions_mut().insert(peer.clone());
                app.clone().oneshot(request)
            });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let mut closing: Option<Instant> = None;
        loop {
            let idle_deadline = {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                tokio::time::Instant::from_std(started + last + limits.idle_timeout)
            };
            let close_deadline = closing.map(|at| tokio::time::Instant::from_std(at + CLOSE_GRACE));
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "metrics connection ended with an error");
                    }
                    return;
                }
                _ = displaced.cancelled(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(Instant::now());
                }
                _ = stop.cancelled(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(Instant::now());
                }
                _ = tokio::time::sleep_until(idle_deadline) => {
                    let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                    if started.elapsed() >= last + limits.idle_timeout {
                        tracing::debug!("closing a stalled metrics connection");
                        return;
                    }
                }
                _ = async { match close_deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                } } => return,
            }
        }
    }
}

/// A stream that records when bytes last moved, in milliseconds since
/// `started`.
struct Tracked<T> {
    inner: T,
    started: Instant,
    activity: Arc<AtomicU64>,
}

impl<T> Tracked<T> {
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.activity.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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

    /// Fixed bodies.
    struct Fixed(Bytes, Bytes);

    impl Exposition for Fixed {
        fn metrics(&self) -> Bytes {
            self.0.clone()
        }
        fn json(&self) -> Bytes {
            self.1.clone()
        }
    }

    /// Counts its renderings.
    struct Counting(Arc<AtomicU64>);

    impl Exposition for Counting {
        fn metrics(&self) -> Bytes {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            Bytes::from(format!("rendering {n}\n"))
        }
        fn json(&self) -> Bytes {
            Bytes::from_static(b"{}")
        }
    }

    #[tokio::test]
    async fn a_sample_is_rendered_once_on_the_first_scrape_and_shared_by_the_next() {
        let (tx, addr, stop) = start(ConnectionLimits::default()).await;
        let renderings = Arc::new(AtomicU64::new(0));
        tx.send_replace(Arc::new(Published::sample(Counting(renderings.clone()))));
        assert_eq!(renderings.load(Ordering::SeqCst), 0, "nobody scraped yet");
        assert!(!tx.borrow().served());
        for _ in 0..3 {
            let response = get(addr, "/metrics").await;
            assert!(response.ends_with("rendering 1\n"), "{response}");
        }
        assert_eq!(renderings.load(Ordering::SeqCst), 1);
        assert!(tx.borrow().served());
        // Prerendering renders too, but does not count as served.
        let ahead = Published::sample(Counting(renderings.clone()));
        ahead.prerender();
        assert!(!ahead.served());
        assert_eq!(renderings.load(Ordering::SeqCst), 2);
        tx.send_replace(Arc::new(ahead));
        let response = get(addr, "/metrics").await;
        assert!(response.ends_with("rendering 2\n"), "{response}");
        assert_eq!(renderings.load(Ordering::SeqCst), 2, "the scrape used it");
        stop.cancel();
    }

    async fn start(
        limits: ConnectionLimits,
    ) -> (watch::Sender<Arc<Published>>, SocketAddr, CancellationToken) {
        let (tx, rx) = watch::channel(Arc::new(Published::default()));
        let stop = CancellationToken::new();
        let (_guard_tx, guard) = watch::channel(Arc::new(Guard::default()));
        let (addr, _task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            rx,
            limits,
            guard,
            stop.clone(),
        )
        .await
        .unwrap();
        (tx, addr, stop)
    }

    #[tokio::test]
    async fn before_the_first_sample_the_json_view_is_unavailable_not_empty() {
        let (tx, addr, stop) = start(ConnectionLimits::default()).await;
        let response = get(addr, "/gpumetrics").await;
        assert!(response.starts_with("HTTP/1.0 503"), "{response}");
        assert!(
            response.ends_with(r#"{"error":"no sample yet"}"#),
            "{response}"
        );
        tx.send_replace(Arc::new(Published::sample(Fixed(
            Bytes::new(),
            Bytes::from_static(b"{\"gpus\":[]}"),
        ))));
        let response = get(addr, "/gpumetrics").await;
        assert!(response.starts_with("HTTP/1.0 200"), "{response}");
        assert!(response.ends_with(r#"{"gpus":[]}"#), "{response}");
        stop.cancel();
    }

    /// Reads until EOF or `within`; true when the peer closed.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn a_connection_that_sends_no_request_head_is_closed_after_the_header_timeout() {
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(300),
            ..ConnectionLimits::default()
        };
        let (_tx, addr, stop) = start(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET /metrics HTTP/1.1\r\nHo")
            .await
            .unwrap();
        let opened = Instant::now();
        assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
        assert!(closed_within(&mut partial, Duration::from_secs(5)).await);
        assert!(
            opened.elapsed() >= Duration::from_millis(250),
            "{:?}",
            opened.elapsed()
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn with_tls_a_silent_connection_gives_its_slot_up_before_the_handshake() {
        use crate::metrics::access::{AccessPolicy, ReviewClient};
        // Never contacted: only /healthz is requested.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let api = ReviewClient(kube::Client::try_from(config).unwrap());
        let guard = Guard::build(&AccessPolicy {
            enabled: true,
            https: true,
            api: Some(api),
            ..AccessPolicy::default()
        });
        assert!(guard.tls.is_some(), "{guard:?}");
        let (_tx, published) = watch::channel(Arc::new(Published::default()));
        let (_guard_tx, guard) = watch::channel(Arc::new(guard));
        let stop = CancellationToken::new();
        let limits = ConnectionLimits {
            max_connections: 2,
            ..ConnectionLimits::default()
        };
        let (addr, _task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            published,
            limits,
            guard,
            stop.clone(),
        )
        .await
        .unwrap();
        // Both slots wait for a first byte that never comes.
        let _silent = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        let served = tokio::time::timeout(Duration::from_secs(3), get(addr, "/healthz"))
            .await
            .expect("served within 3 s, long before the 10 s header timeout");
        assert!(served.starts_with("HTTP/1.0 200"), "{served}");
        stop.cancel();
    }

    #[tokio::test]
    async fn over_the_cap_the_oldest_idle_connection_makes_room_for_a_new_client() {
        let limits = ConnectionLimits {
            max_connections: 4,
            ..ConnectionLimits::default()
        };
        let (_tx, addr, stop) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Every idle client holds a slot: the fifth is served only because the
        // oldest one is displaced, long before any timeout.
        let served = tokio::time::timeout(Duration::from_secs(3), get(addr, "/healthz"))
            .await
            .expect("a new client is served within 3 s with the cap full");
        assert!(served.starts_with("HTTP/1.0 200"), "{served}");
        assert!(
            closed_within(&mut idle[0], Duration::from_secs(3)).await,
            "the oldest idle connection was closed"
        );
        stop.cancel();
    }
}
