//! TLS (rustls, ring provider): the settings of a listener and of a client, certificates read
//! from PEM files, a listener's certificates reloaded when their files change or on `SIGHUP`, and
//! which path encrypts a connection's bytes (the kernel's kTLS, or rustls in user space).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use serde::Deserialize;

use crate::error::TransportError;

/// TLS of a listener (`[transport.tls]`): its certificate chain and key, and the CA whose
/// certificates clients must present (mTLS) when one is named.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsServerConfig {
    /// PEM file with the listener's certificate, then its chain.
    pub cert_file: PathBuf,
    /// PEM file with the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM file of the CA(s) that sign client certificates; set: every client must present one
    /// (mutual TLS). `None`: clients are not asked for a certificate.
    pub client_ca_file: Option<PathBuf>,
    /// How often (ms) the files are checked for a change (their modification time); a change,
    /// or `SIGHUP`, reloads them for new connections. 0: only `SIGHUP`.
    pub reload_check_ms: u64,
    /// Hand each data connection's session keys to the kernel after the handshake (kTLS), so
    /// chunks keep going out with `sendfile`, where the kernel offers it; elsewhere, or `false`,
    /// rustls encrypts in user space. Counted and logged either way.
    pub ktls: bool,
}

impl Default for TlsServerConfig {
    fn default() -> Self {
        TlsServerConfig {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            client_ca_file: None,
            reload_check_ms: 10_000,
            ktls: true,
        }
    }
}

/// TLS of a client (`[transport.tls]` of a client, `spark.sluice.tls.*` on the JVM).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsClientConfig {
    /// PEM file of the CA(s) that sign the servers' certificates.
    pub ca_file: PathBuf,
    /// The client's certificate chain, for servers that require one (mTLS).
    pub cert_file: Option<PathBuf>,
    /// The key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// The name the servers' certificates are checked against; `None`: the address connected
    /// to (its IP, which the certificate must then list).
    pub server_name: Option<String>,
}

impl Default for TlsClientConfig {
    fn default() -> Self {
        TlsClientConfig {
            ca_file: PathBuf::new(),
            cert_file: None,
            key_file: None,
            server_name: None,
        }
    }
}

fn tls_err(what: impl std::fmt::Display) -> TransportError {
    TransportError::Config(format!("tls: {what}"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TransportError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(format!("{}: {e}", path.display())))?
        .collect();
    let certs = certs.map_err(|e| tls_err(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_err(format!("{}: no certificate in it", path.display())));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TransportError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_err(format!("{}: {e}", path.display())))
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TransportError> {
    let mut store = RootCertStore::empty();
    for c in certs(path)? {
        store.add(c).map_err(|e| tls_err(format!("{}: {e}", path.display())))?;
    }
    Ok(Arc::new(store))
}

impl TlsServerConfig {
    /// Names the files that must be set.
    pub fn validate(&self) -> Result<(), TransportError> {
        if self.cert_file.as_os_str().is_empty() || self.key_file.as_os_str().is_empty() {
            return Err(tls_err("cert_file and key_file must both be set"));
        }
        Ok(())
    }

    /// Reads the files into a rustls configuration.
    pub fn load(&self) -> Result<rustls::ServerConfig, TransportError> {
        self.validate()?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots(ca)?,
                    provider(),
                )
                .build()
                .map_err(tls_err)?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut cfg = builder
            .with_single_cert(certs(&self.cert_file)?, key(&self.key_file)?)
            .map_err(|e| {
                tls_err(format!("{} / {}: {e}", self.cert_file.display(), self.key_file.display()))
            })?;
        if self.ktls {
            // The keys must leave rustls for the kernel; no TLS 1.3 tickets after the handshake
            // (nothing resumes sessions here, and no record may trail the hand-off).
            cfg.enable_secret_extraction = true;
            cfg.send_tls13_tickets = 0;
        }
        Ok(cfg)
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut f = vec![self.cert_file.clone(), self.key_file.clone()];
        f.extend(self.client_ca_file.clone());
        f
    }
}

impl TlsClientConfig {
    /// Reads the files into a rustls configuration.
    pub fn load(&self) -> Result<Arc<rustls::ClientConfig>, TransportError> {
        if self.ca_file.as_os_str().is_empty() {
            return Err(tls_err("ca_file must be set"));
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_root_certificates(roots(&self.ca_file)?);
        let cfg = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => {
                builder.with_client_auth_cert(certs(c)?, key(k)?).map_err(tls_err)?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(tls_err("cert_file and key_file go together")),
        };
        Ok(Arc::new(cfg))
    }

    /// The name a server at `addr` must prove.
    pub(crate) fn server_name(
        &self,
        addr: std::net::SocketAddr,
    ) -> Result<ServerName<'static>, TransportError> {
        match &self.server_name {
            Some(n) => ServerName::try_from(n.clone()).map_err(|e| tls_err(format!("{n}: {e}"))),
            None => Ok(ServerName::IpAddress(addr.ip().into())),
        }
    }
}

/// A listener's TLS: the current rustls configuration, replaced when the files change. The
/// protocol listener ([`crate::serve`]) and the admin HTTP listener each keep one.
pub struct TlsListener {
    settings: TlsServerConfig,
    current: RwLock<Arc<rustls::ServerConfig>>,
    stamps: RwLock<Vec<Option<SystemTime>>>,
}

fn stamps(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files.iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect()
}

impl TlsListener {
    /// Reads the files (an error names the file and what is wrong with it).
    pub fn new(settings: TlsServerConfig) -> Result<Arc<Self>, TransportError> {
        let cfg = settings.load()?;
        let stamps = RwLock::new(stamps(&settings.files()));
        Ok(Arc::new(TlsListener { settings, current: RwLock::new(Arc::new(cfg)), stamps }))
    }

    /// Whether connections' keys go to the kernel where it can take them (`ktls`).
    pub fn ktls(&self) -> bool {
        self.settings.ktls
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let cfg = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        tokio_rustls::TlsAcceptor::from(cfg)
    }

    /// Reads the files again; on failure the current configuration stays.
    pub fn reload(&self, why: &str) {
        let now = stamps(&self.settings.files());
        match self.settings.load() {
            Ok(cfg) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(cfg);
                tracing::info!(why, cert = %self.settings.cert_file.display(), "TLS certificates reloaded");
            }
            Err(e) => {
                tracing::error!(why, error = %e, "TLS certificates not reloaded; the previous ones stay")
            }
        }
        *self.stamps.write().unwrap_or_else(|e| e.into_inner()) = now;
    }

    /// Reloads on `SIGHUP` and, every `reload_check_ms`, when a file's modification time
    /// changed; runs until dropped.
    pub async fn watch(self: Arc<Self>) {
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: TLS reloads on file changes only");
                None
            }
        };
        let check = Duration::from_millis(self.settings.reload_check_ms.max(1));
        let mut tick = tokio::time::interval(check);
        tick.tick().await;
        loop {
            let hup_fired = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = hup_fired => self.reload("SIGHUP"),
                _ = tick.tick(), if self.settings.reload_check_ms > 0 => {
                    let now = stamps(&self.settings.files());
                    let changed = *self.stamps.read().unwrap_or_else(|e| e.into_inner()) != now;
                    if changed {
                        self.reload("files changed");
                    }
                }
            }
        }
    }
}

/// Whether this kernel offers kTLS (`tls` in `/proc/sys/net/ipv4/tcp_available_ulp`), read once.
pub fn ktls_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
            .map(|s| s.split_whitespace().any(|u| u == "tls"))
            .unwrap_or(false)
    })
}
