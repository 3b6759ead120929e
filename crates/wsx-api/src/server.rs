//! Serving the API: the listener (TLS when configured), the limits, graceful stop.

use crate::Control;
use crate::auth::Tokens;
use crate::metrics::Exporter;
use crate::routes::{self, AppState};
use axum::extract::DefaultBodyLimit;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How the API is served.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ApiConfig {
    /// The address to listen on (localhost by default).
    pub listen: SocketAddr,
    /// Bearer tokens, any of which is accepted. Without one, only the health probe answers.
    pub tokens: Vec<String>,
    /// Serve HTTPS with this certificate chain and key (PEM).
    pub tls: Option<TlsFiles>,
    /// The largest request body (a configuration file fits many times over).
    pub max_body: usize,
    /// The longest a request may take, and the longest a client may take to send its
    /// headers.
    pub request_timeout: Duration,
    pub header_timeout: Duration,
    /// Requests served at once; more are refused with 503 `busy`.
    pub max_concurrent: usize,
}

/// A certificate chain and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ApiConfig {
    /// The default port on localhost.
    pub const DEFAULT_LISTEN: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9180);

    pub fn new(tokens: Vec<String>) -> Self {
        Self {
            listen: Self::DEFAULT_LISTEN,
            tokens,
            tls: None,
            max_body: 1 << 20,
            request_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            max_concurrent: 64,
        }
    }
}

/// The running API server.
#[derive(Debug)]
pub struct ApiServer {
    handle: Handle,
    task: JoinHandle<io::Result<()>>,
    local_addr: SocketAddr,
}

/// The API could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The address could not be bound.
    #[error("binding the API address {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    /// The certificate or key could not be loaded.
    #[error("loading the API's TLS certificate and key: {0}")]
    Tls(io::Error),
}

impl ApiServer {
    /// Binds the address and serves the API on the current tokio runtime.
    pub async fn start(config: ApiConfig, control: Arc<dyn Control>) -> Result<Self, StartError> {
        let openapi = routes::openapi()
            .to_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        let state = Arc::new(AppState {
            metrics: Exporter::new(control.clone()),
            control,
            tokens: Tokens::new(&config.tokens),
            openapi,
            slots: Semaphore::new(config.max_concurrent.max(1)),
            request_timeout: config.request_timeout,
        });
        let app = routes::router(state).layer(DefaultBodyLimit::max(config.max_body));
        let listener =
            std::net::TcpListener::bind(config.listen).map_err(|source| StartError::Bind {
                addr: config.listen,
                source,
            })?;
        let bind_error = |source| StartError::Bind {
            addr: config.listen,
            source,
        };
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let handle = Handle::new();
        let service = app.into_make_service();
        let task = match &config.tls {
            Some(tls) => {
                // The process's TLS provider is ring (see the workspace manifest); an
                // embedding program may have installed one already.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let rustls = RustlsConfig::from_pem_file(&tls.cert, &tls.key)
                    .await
                    .map_err(StartError::Tls)?;
                let mut server =
                    axum_server::from_tcp_rustls(listener, rustls).handle(handle.clone());
                limit_headers(server.http_builder(), config.header_timeout);
                tokio::spawn(async move { server.serve(service).await })
            }
            None => {
                let mut server = axum_server::from_tcp(listener).handle(handle.clone());
                limit_headers(server.http_builder(), config.header_timeout);
                tokio::spawn(async move { server.serve(service).await })
            }
        };
        info!(address = %local_addr, tls = config.tls.is_some(), tokens = config.tokens.len(), "API listening");
        if !local_addr.ip().is_loopback() && config.tls.is_none() {
            warn!(address = %local_addr, "the API listens beyond this host without TLS: tokens cross the network in the clear");
        }
        if config.tokens.is_empty() {
            warn!("no API token configured: every route but /api/v1/health refuses requests");
        }
        Ok(Self {
            handle,
            task,
            local_addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops taking connections, lets requests in progress finish for up to `deadline`,
    /// then closes the rest.
    pub async fn shutdown(self, deadline: Duration) {
        self.handle.graceful_shutdown(Some(deadline));
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "API server ended with an error"),
            Err(e) => warn!(error = %e, "API server task failed"),
        }
    }
}

/// Clients get `timeout` to send their request headers, so that a slow one cannot hold a
/// connection (and a share of the concurrency) open.
fn limit_headers(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    timeout: Duration,
) {
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeout);
}
