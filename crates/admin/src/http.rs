//! What both processes' admin endpoints share: JSON errors (logged), the bearer-token check,
//! the health and metrics endpoints, the 404/405 fallbacks, and serving a router.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use tokio::net::TcpListener;

use crate::api::{ActionRequest, ApiError, Health};

/// A refused request: its status and [`ApiError`] body. Logged when turned into a response, so
/// every failure leaves a line.
#[derive(Debug, Clone)]
pub struct Refusal {
    status: StatusCode,
    body: ApiError,
}

impl Refusal {
    /// A refusal with `status`, machine `code` and human `error`.
    pub fn new(status: StatusCode, code: &str, error: impl Into<String>) -> Refusal {
        Refusal { status, body: ApiError { error: error.into(), code: code.into() } }
    }

    /// 404 for something named in the path that does not exist.
    pub fn not_found(code: &str, error: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::NOT_FOUND, code, error)
    }

    /// 400.
    pub fn bad_request(error: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, "bad_request", error)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        tracing::warn!(status = self.status.as_u16(), code = %self.body.code,
            error = %self.body.error, "admin request refused");
        let mut r = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(WWW_AUTHENTICATE, "Bearer".parse().expect("a valid header"));
        }
        r
    }
}

/// The token write endpoints require (`None`: they are open).
#[derive(Clone, Default)]
pub struct Token(pub Option<Arc<str>>);

/// Proof that a request may write: it carried the configured token (or none is configured).
/// Taken by every write handler, so none can forget the check.
pub struct Authorized;

impl<S: Send + Sync> FromRequestParts<S> for Authorized
where
    Token: axum::extract::FromRef<S>,
{
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Refusal> {
        let Token(want) = axum::extract::FromRef::from_ref(state);
        let Some(want) = want else { return Ok(Authorized) };
        let given = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match given {
            Some(g) if sluice_transport::constant_time_eq(g.as_bytes(), want.as_bytes()) => {
                Ok(Authorized)
            }
            Some(_) => Err(Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", "wrong token")),
            None => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this endpoint needs the admin token: Authorization: Bearer <token>",
            )),
        }
    }
}

/// A write endpoint's optional body: empty, or an [`ActionRequest`] object.
pub fn action(body: &Bytes) -> Result<ActionRequest, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ActionRequest::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("the body must be empty or a JSON object like {{\"reason\": \"...\"}}: {e}"),
        )
    })
}

/// `GET /healthz`: the process answers.
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// `/readyz` for a process whose readiness `why_not` tells (`None`: ready).
fn readyz(why_not: Option<&str>) -> Response {
    match why_not {
        None => Json(Health { status: "ok".into() }).into_response(),
        Some(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(Health { status: why.into() })).into_response()
        }
    }
}

/// Prometheus text.
fn metrics(text: String) -> Response {
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// 404 for any path no route takes.
async fn no_route(method: Method, req: Request) -> Refusal {
    Refusal::not_found("not_found", format!("no such endpoint: {method} {}", req.uri().path()))
}

/// 405 for a known path asked with a method it does not take.
async fn wrong_method(method: Method, req: Request) -> Refusal {
    Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", req.uri().path()),
    )
}

/// What a process tells the shared endpoints.
pub trait Probe: Clone + Send + Sync + 'static {
    /// Why the process is not ready (`None`: ready).
    fn not_ready(&self) -> Option<&'static str>;
    /// Its metrics as Prometheus text.
    fn metrics(&self) -> String;
}

/// `/healthz`, `/readyz`, `/metrics`, and the JSON 404 and 405 answers, around `api`.
pub fn with_common<P: Probe>(api: Router, probe: P) -> Router {
    let (ready, metered) = (probe.clone(), probe);
    api.route("/healthz", get(healthz))
        .route("/readyz", get(move || async move { readyz(ready.not_ready()) }))
        .route("/metrics", get(move || async move { metrics(metered.metrics()) }))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

/// Serves `router` on `listener` until `shutdown` completes; over TLS when `tls` is given (the
/// process's `[transport.tls]`: the same certificate, reloaded the same way). Clients are not
/// asked for certificates here even when the protocol listener asks (`client_ca_file`):
/// Prometheus and probes scrape this port, and its writes need the `admin_token`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<sluice_transport::TlsServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let Some(mut tls) = tls else {
        return axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
    };
    tls.client_ca_file = None;
    let tls = sluice_transport::TlsListener::new(tls)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let local = listener.local_addr()?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let watch = tokio::spawn(tls.clone().watch());
    let accept = tokio::spawn(tls_accept_loop(listener, tls, tx));
    let served = axum::serve(TlsHttp { rx, local }, router).with_graceful_shutdown(shutdown).await;
    accept.abort();
    watch.abort();
    served
}

/// Accepts TCP connections and runs each one's TLS handshake on its own task (a slow or
/// hostile client holds up no other), handing the finished ones to [`TlsHttp`].
async fn tls_accept_loop(
    listener: TcpListener,
    tls: std::sync::Arc<sluice_transport::TlsListener>,
    tx: tokio::sync::mpsc::Sender<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        std::net::SocketAddr,
    )>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, tx) = (tls.acceptor(), tx.clone());
        tokio::spawn(async move {
            let limit = std::time::Duration::from_secs(10);
            match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => {
                    let _ = tx.send((s, peer)).await;
                }
                Ok(Err(e)) => tracing::info!(%peer, error = %e, "admin TLS handshake failed"),
                Err(_) => tracing::info!(%peer, "admin TLS handshake timed out"),
            }
        });
    }
}

/// The admin listener's connections once their TLS handshake is done.
struct TlsHttp {
    rx: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        std::net::SocketAddr,
    )>,
    local: std::net::SocketAddr,
}

impl axum::serve::Listener for TlsHttp {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept loop is gone (only at shutdown): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
