//! The wsx management plane: the REST API under `/api/v1`, its OpenAPI document, bearer
//! token authentication, the Prometheus metrics at `/metrics` and a live dashboard.
//!
//! # Architecture
//!
//! - [`Control`] is what the API acts on: the running [`wsx_proxy::Gateway`] (status, peers,
//!   sessions, bypass) and what lives outside it in the daemon (the configuration file, the
//!   log filter). The `wsx` binary implements it; an embedding tool implements its own.
//! - [`model`]: the resources as they travel (serde types with OpenAPI schemas), built from
//!   the gateway's status types at request time. Nothing is cached: every request reads
//!   the gateway's live counters.
//! - `routes`: the handlers, each annotated for the OpenAPI document (utoipa), which is
//!   generated from them and served at `/api/v1/openapi.json`.
//! - `auth`: `Authorization: Bearer <token>` against the configured tokens, compared in
//!   constant time; every route but `/api/v1/health` requires it.
//! - `dashboard`: a live page for operators at `/dashboard/` (`/` leads there), built into
//!   the binary; it reads the API with the token typed into it.
//! - [`metrics`]: a Prometheus collector (prometheus-client) that reads the gateway on each
//!   scrape, so the data path keeps its plain counters and pays nothing for metrics.
//! - [`ApiServer`]: binds the address (TLS with rustls when configured), bounds every
//!   request (body size, time, concurrency, header read time) and stops gracefully.
//!
//! Errors are JSON with a stable [`ErrorCode`] (see [`error`]).

mod auth;
mod dashboard;
pub mod error;
pub mod metrics;
pub mod model;
mod routes;
mod server;

pub use error::{ApiError, ErrorCode};
pub use server::{ApiConfig, ApiServer, StartError, TlsFiles};

use model::{ConfigSummary, ConfigView, ShaperEdit};
use std::future::Future;
use std::pin::Pin;
use wsx_proxy::Gateway;

/// A boxed future, for the one asynchronous method of [`Control`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the API reads and changes. Implemented by the daemon.
pub trait Control: Send + Sync + 'static {
    /// The running gateway.
    fn gateway(&self) -> &Gateway;

    /// The running configuration, secrets masked.
    fn config(&self) -> ConfigView;

    /// Checks a candidate configuration (the text of a whole file) without applying it.
    /// Errors are [`ErrorCode::InvalidConfig`] naming the field, line and column.
    fn check_config(&self, text: &str) -> Result<ConfigSummary, ApiError>;

    /// Applies a candidate exactly as a reload (SIGHUP) would, and writes it to the
    /// configuration file atomically, so that a restart runs what is running now. When
    /// anything fails, the running configuration and the file stay as they were.
    fn apply_config(&self, text: String) -> BoxFuture<'_, Result<ConfigSummary, ApiError>>;

    /// Makes `edit` on the configuration file's shaper part and applies the result as
    /// [`apply_config`](Control::apply_config) would (checked, written, applied; nothing
    /// changes on failure). [`ErrorCode::NotFound`] when the scenario or filter is not
    /// there.
    fn edit_shaper(&self, edit: ShaperEdit) -> BoxFuture<'_, Result<ConfigSummary, ApiError>>;

    /// The log filter in force.
    fn log_filter(&self) -> String;

    /// Changes the log filter at once ([`ErrorCode::InvalidValue`] if it does not parse).
    fn set_log_filter(&self, filter: &str) -> Result<(), ApiError>;
}
