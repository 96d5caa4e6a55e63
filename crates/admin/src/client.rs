//! The admin API's client, for `sluice admin` and the tests: one HTTP/1.1 connection per
//! request (an operator's command makes a handful), every step bounded by a timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;

use crate::api::{self, ApiError};

/// Why a call failed. [`ClientError::exit_code`] maps it onto `sluice admin`'s exit codes.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answered at the address (refused, unresolvable, timed out).
    #[error("cannot reach {addr}: {why}")]
    Unreachable {
        /// The address tried.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// The endpoint answered with an error.
    #[error("{status}: {} ({})", .error.error, .error.code)]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error body (built from the status when the body was not an [`ApiError`]).
        error: ApiError,
    },
    /// The endpoint answered something this client cannot read.
    #[error("unreadable answer from {addr}: {why}")]
    BadAnswer {
        /// The address.
        addr: String,
        /// What was wrong with it.
        why: String,
    },
    /// The client cannot talk to the endpoint as asked (nothing was sent).
    #[error("{0}")]
    Misconfigured(String),
}

impl ClientError {
    /// 3 when the address could not be reached, 1 otherwise (refused or unreadable).
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Unreachable { .. } => 3,
            ClientError::Refused { .. } | ClientError::BadAnswer { .. } => 1,
            ClientError::Misconfigured(_) => 2,
        }
    }
}

/// A raw answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
}

/// A client of one process's admin endpoint.
#[derive(Debug, Clone)]
pub struct AdminClient {
    /// `host:port`.
    addr: String,
    token: Option<String>,
    timeout: Duration,
    /// HTTPS, trusting this CA (PEM), for an endpoint whose process runs `[transport.tls]`.
    tls_ca: Option<std::path::PathBuf>,
    tls_server_name: Option<String>,
    /// The address was given as `https://`: never talk plain HTTP to it (the token would cross
    /// the network in clear).
    https: bool,
}

/// A connection to the endpoint, plain or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Percent-encodes one path segment (everything but RFC 3986's unreserved characters).
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl AdminClient {
    /// A client of the endpoint at `addr` (`host:port`, an `http://` prefix and a trailing `/`
    /// are taken off), sending `token` as a bearer token when given; each call is bounded by
    /// `timeout`. An `https://` address needs [`Self::with_tls_ca`]: without it every call
    /// fails before anything is sent.
    pub fn new(addr: &str, token: Option<String>, timeout: Duration) -> AdminClient {
        let addr = addr.trim();
        let https = addr.starts_with("https://");
        let addr = addr.trim_start_matches("http://").trim_start_matches("https://");
        let addr = addr.trim_end_matches('/').to_owned();
        AdminClient { addr, token, timeout, tls_ca: None, tls_server_name: None, https }
    }

    /// Talks HTTPS, checking the endpoint's certificate against the CA in `ca` (PEM) and the
    /// address's IP.
    pub fn with_tls_ca(mut self, ca: std::path::PathBuf) -> AdminClient {
        self.tls_ca = Some(ca);
        self
    }

    /// With HTTPS: checks the endpoint's certificate against `name` instead of the address's IP
    /// (a pod reached at 127.0.0.1 whose certificate names its DNS names).
    pub fn with_tls_server_name(mut self, name: String) -> AdminClient {
        self.tls_server_name = Some(name);
        self
    }

    /// The address it talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `METHOD path` with `body` (sent as JSON when not empty); any status is an answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<Answer, ClientError> {
        let unreachable = |why: String| ClientError::Unreachable { addr: self.addr.clone(), why };
        let bad = |why: String| ClientError::BadAnswer { addr: self.addr.clone(), why };
        if self.https && self.tls_ca.is_none() {
            return Err(ClientError::Misconfigured(format!(
                "https://{} needs the CA that signed its certificate (--tls-ca-file, or \
                 SLUICE_ADMIN_TLS_CA_FILE): not sent over plain HTTP, which would show the token \
                 to the network",
                self.addr
            )));
        }
        let stream = tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| unreachable(format!("no connection within {:?}", self.timeout)))?
            .map_err(|e| unreachable(e.to_string()))?;
        let stream: Box<dyn Io> = match &self.tls_ca {
            None => Box::new(stream),
            Some(ca) => {
                let cfg =
                    sluice_transport::TlsClientConfig { ca_file: ca.clone(), ..Default::default() };
                let cfg = cfg.load().map_err(|e| unreachable(e.to_string()))?;
                let name = match &self.tls_server_name {
                    Some(n) => rustls_pki_types::ServerName::try_from(n.clone())
                        .map_err(|e| unreachable(format!("TLS server name {n}: {e}")))?,
                    None => {
                        let ip = stream.peer_addr().map_err(|e| unreachable(e.to_string()))?.ip();
                        rustls_pki_types::ServerName::IpAddress(ip.into())
                    }
                };
                let connect = tokio_rustls::TlsConnector::from(cfg).connect(name, stream);
                let tls = tokio::time::timeout(self.timeout, connect)
                    .await
                    .map_err(|_| {
                        unreachable(format!("no TLS handshake within {:?}", self.timeout))
                    })?
                    .map_err(|e| unreachable(format!("TLS handshake failed: {e}")))?;
                Box::new(tls)
            }
        };
        let exchange = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            // Drives the connection; ends when the answer is read and `sender` dropped.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut req = Request::builder().method(method).uri(path).header(HOST, &self.addr);
            if let Some(t) = &self.token {
                req = req.header(AUTHORIZATION, format!("Bearer {t}"));
            }
            if !body.is_empty() {
                req = req.header(CONTENT_TYPE, "application/json");
            }
            let req = req.body(Full::new(body)).map_err(|e| bad(format!("bad request: {e}")))?;
            let resp = sender.send_request(req).await.map_err(|e| bad(e.to_string()))?;
            let status = resp.status();
            let content_type =
                resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = resp.into_body().collect().await.map_err(|e| bad(e.to_string()))?;
            Ok(Answer { status, content_type, body: body.to_bytes() })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| bad(format!("no answer within {:?}", self.timeout)))?
    }

    /// `METHOD path`, its 2xx JSON answer read as `T`, anything else an error.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<T, ClientError> {
        let a = self.call(method, path, body).await?;
        if !a.status.is_success() {
            let error = serde_json::from_slice::<ApiError>(&a.body).unwrap_or_else(|_| ApiError {
                error: String::from_utf8_lossy(&a.body).trim().to_owned(),
                code: a.status.canonical_reason().unwrap_or("error").to_lowercase(),
            });
            return Err(ClientError::Refused { status: a.status.as_u16(), error });
        }
        serde_json::from_slice(&a.body)
            .map_err(|e| ClientError::BadAnswer { addr: self.addr.clone(), why: e.to_string() })
    }

    fn action_body(reason: Option<&str>) -> Bytes {
        match reason {
            None => Bytes::new(),
            Some(r) => {
                let req = api::ActionRequest { reason: Some(r.to_owned()) };
                Bytes::from(serde_json::to_vec(&req).expect("serializable"))
            }
        }
    }

    /// Coordinator: `GET /api/v1/servers`.
    pub async fn servers(&self) -> Result<api::Members, ClientError> {
        self.json(Method::GET, "/api/v1/servers", Bytes::new()).await
    }

    /// Coordinator: `GET /api/v1/apps`.
    pub async fn apps(&self) -> Result<api::Apps, ClientError> {
        self.json(Method::GET, "/api/v1/apps", Bytes::new()).await
    }

    /// Coordinator: `GET /api/v1/apps/{app}/shuffles`.
    pub async fn shuffles(&self, app: &str) -> Result<api::Shuffles, ClientError> {
        let path = format!("/api/v1/apps/{}/shuffles", segment(app));
        self.json(Method::GET, &path, Bytes::new()).await
    }

    /// Coordinator: `POST` (drain) or `DELETE` (undrain) `/api/v1/servers/{id}/drain`.
    pub async fn set_drain(
        &self,
        server_id: &str,
        drain: bool,
        reason: Option<&str>,
    ) -> Result<api::Member, ClientError> {
        let path = format!("/api/v1/servers/{}/drain", segment(server_id));
        let method = if drain { Method::POST } else { Method::DELETE };
        self.json(method, &path, Self::action_body(reason)).await
    }

    /// Coordinator: `POST /api/v1/apps/{app}/unregister`.
    pub async fn unregister(
        &self,
        app: &str,
        reason: Option<&str>,
    ) -> Result<api::Unregistered, ClientError> {
        let path = format!("/api/v1/apps/{}/unregister", segment(app));
        self.json(Method::POST, &path, Self::action_body(reason)).await
    }

    /// Server: `GET /api/v1/status`.
    pub async fn status(&self) -> Result<api::ServerStatus, ClientError> {
        self.json(Method::GET, "/api/v1/status", Bytes::new()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("app-1_x.y~z"), "app-1_x.y~z");
        assert_eq!(segment("a b/c?"), "a%20b%2Fc%3F");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn addresses_lose_their_scheme_and_slash() {
        let c = AdminClient::new("http://h:1/", None, Duration::from_secs(1));
        assert_eq!(c.addr(), "h:1");
    }

    #[tokio::test]
    async fn an_https_address_without_a_ca_sends_nothing() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("https://{}", l.local_addr().unwrap());
        let token = Some("a-token-of-16-chars-or-more".to_owned());
        let c = AdminClient::new(&addr, token, Duration::from_secs(2));
        let e = c.call(Method::GET, "/api/v1/servers", Bytes::new()).await.unwrap_err();
        assert!(matches!(e, ClientError::Misconfigured(_)), "{e}");
        assert!(e.to_string().contains("--tls-ca-file"), "{e}");
        assert_eq!(e.exit_code(), 2);
        // Not even a connection was made.
        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "the client connected");
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let c = AdminClient::new(&addr, None, Duration::from_secs(2));
        let e = c.servers().await.unwrap_err();
        assert_eq!(e.exit_code(), 3, "{e}");
    }
}
