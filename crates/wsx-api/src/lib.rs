//! The wsx management plane.
//!
//! This crate will hold the axum REST server (status, sessions, peers, scenarios and filters,
//! statistics, configuration), its OpenAPI description, token authentication and the Prometheus
//! metrics exporter. Nothing is implemented yet; see the project's issue tracker.
