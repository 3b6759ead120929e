//! The routes, each annotated for the OpenAPI document.
//!
//! ```text
//! GET    /api/v1/health                 no token: the daemon answers
//! GET    /api/v1/status                 version, uptime, peers' health, totals
//! GET    /api/v1/peers                  every peer, with its tunnel and compression
//! GET    /api/v1/peers/{name}
//! PUT    /api/v1/peers/{name}/bypass    {"force": true|false}
//! GET    /api/v1/sessions               ?peer=&route=&state=&address=&limit=&offset=
//! GET    /api/v1/sessions/{id}
//! DELETE /api/v1/sessions/{id}          reset both sides
//! GET    /api/v1/config                 the running configuration, secrets masked
//! POST   /api/v1/config/check           body: a configuration file (TOML)
//! PUT    /api/v1/config                 body: a configuration file; applied and persisted
//! GET    /api/v1/log-level
//! PUT    /api/v1/log-level              {"filter": "debug"}
//! GET    /api/v1/openapi.json
//! GET    /metrics                       Prometheus (OpenMetrics text)
//! ```

use crate::Control;
use crate::auth::{self, Tokens};
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::metrics;
use crate::model::*;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ResponseBuilder, content::ContentBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use wsx_proxy::Target;

/// Sessions per page unless the request says otherwise, and at most.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// The largest offset: what the document's 32-bit signed integers hold.
const MAX_OFFSET: u32 = i32::MAX as u32;

pub(crate) struct AppState {
    pub(crate) control: Arc<dyn Control>,
    pub(crate) tokens: Tokens,
    pub(crate) openapi: String,
    pub(crate) metrics: metrics::Exporter,
    pub(crate) slots: Semaphore,
    pub(crate) request_timeout: Duration,
}

impl auth::HasTokens for AppState {
    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "wsx",
        description = "Management API of a wsx WAN accelerator gateway. Every route but \
                       /api/v1/health takes `Authorization: Bearer <token>`."
    ),
    modifiers(&Conventions),
    tags(
        (name = "status", description = "The gateway at a glance"),
        (name = "peers", description = "Peer gateways and their tunnels"),
        (name = "sessions", description = "Relayed TCP connections"),
        (name = "shaper", description = "The bandwidth controller: scenarios and filters"),
        (name = "config", description = "The configuration file"),
        (name = "logging", description = "The log filter"),
        (name = "metrics", description = "Prometheus metrics"),
    )
)]
struct ApiDoc;

/// What every operation shares: the bearer scheme, and errors as [`ErrorBody`] for any
/// status an operation does not list itself (`default`).
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let error = ResponseBuilder::new()
            .description("An error: a stable code, a message, and the field at fault")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                        "ErrorBody",
                    ))))
                    .build(),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                op.responses
                    .responses
                    .entry("default".into())
                    .or_insert_with(|| RefOr::T(error.clone()));
            }
        }
    }
}

/// The router: the API, the document, the metrics, and the limits around them.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let (api, _) = protected().split_for_parts();
    let api = api
        .route("/api/v1/openapi.json", get(openapi_json))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require::<AppState>,
        ));
    let (public, _) = public().split_for_parts();
    public
        .merge(crate::dashboard::routes())
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), bounded))
        .with_state(state)
}

/// The OpenAPI document, generated from the annotations below.
pub(crate) fn openapi() -> utoipa::openapi::OpenApi {
    let (_, protected) = protected().split_for_parts();
    let (_, public) = public().split_for_parts();
    let mut doc = ApiDoc::openapi();
    doc.merge(protected);
    doc.merge(public);
    Conventions.modify(&mut doc);
    doc
}

fn protected() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(peers))
        .routes(routes!(peer))
        .routes(routes!(set_bypass))
        .routes(routes!(sessions))
        .routes(routes!(shaper))
        .routes(routes!(put_scenario, delete_scenario))
        .routes(routes!(add_filter))
        .routes(routes!(put_filter, delete_filter))
        .routes(routes!(session, kill_session))
        .routes(routes!(config, apply_config))
        .routes(routes!(check_config))
        .routes(routes!(log_level, set_log_level))
        .routes(routes!(prometheus))
}

fn public() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new().routes(routes!(health))
}

/// Every request: a share of the concurrency and a deadline.
async fn bounded(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Ok(_permit) = state.slots.try_acquire() else {
        return ApiError::new(ErrorCode::Busy, "too many requests at once; retry").into_response();
    };
    match tokio::time::timeout(state.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(ErrorCode::Timeout, "the request took too long").into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed on this route",
    )
}

async fn openapi_json(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.openapi.clone(),
    )
        .into_response()
}

// ---- Extractors whose rejections are the API's JSON errors --------------------------------

#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
struct Json<T>(T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
struct Query<T>(T);

#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
struct Path<T>(T);

/// A UTF-8 body of any content type (a configuration file).
struct Text(String);

impl<S: Send + Sync> FromRequest<S> for Text {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "request body too large")
            } else {
                ApiError::new(ErrorCode::BadRequest, e.body_text())
            }
        })?;
        String::from_utf8(bytes.to_vec())
            .map(Text)
            .map_err(|_| ApiError::new(ErrorCode::BadRequest, "the body is not UTF-8 text"))
    }
}

// ---- Status -------------------------------------------------------------------------------

/// Liveness: the daemon answers. No token needed.
#[utoipa::path(get, path = "/api/v1/health", tag = "status", security(()),
    responses((status = 200, description = "The daemon answers", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Version, uptime, each peer's health, live sessions and totals.
#[utoipa::path(get, path = "/api/v1/status", tag = "status", security(("token" = [])),
    responses((status = 200, description = "The gateway's status", body = Status)))]
async fn status(State(state): State<Arc<AppState>>) -> Json<Status> {
    let gateway = state.control.gateway();
    let totals = gateway.totals();
    let mut sessions = SessionCounts::default();
    for (route, n) in &totals.live {
        sessions.add(SessionRoute::new(*route), *n);
    }
    Json(Status {
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_seconds: totals.uptime.as_secs_f64(),
        public_key: gateway.public_key().to_string(),
        tunnel_address: gateway.tunnel_addr().to_string(),
        peers: gateway
            .peers()
            .iter()
            .map(|p| PeerHealth {
                name: p.name.clone(),
                healthy: p.healthy,
                bypass_forced: p.force_bypass,
            })
            .collect(),
        sessions,
        max_sessions: gateway.max_sessions() as u64,
        session_capacity: gateway.session_capacity() as u64,
        memory: {
            let m = gateway.memory();
            Memory {
                budget: m.budget,
                relay_buffers_budget: m.relay_buffers_budget,
                relay_buffers_lent: m.relay_buffers_lent,
                relay_buffers_refused: m.relay_buffers_refused,
            }
        },
        totals: Totals::new(&totals),
        smb: Smb::new(&gateway.smb()),
    })
}

// ---- Peers --------------------------------------------------------------------------------

/// Every peer, with the tunnel in use and compression counters.
#[utoipa::path(get, path = "/api/v1/peers", tag = "peers", security(("token" = [])),
    responses((status = 200, description = "The peers, by name", body = [Peer])))]
async fn peers(State(state): State<Arc<AppState>>) -> Json<Vec<Peer>> {
    Json(
        state
            .control
            .gateway()
            .peers()
            .iter()
            .map(Peer::new)
            .collect(),
    )
}

/// One peer.
#[utoipa::path(get, path = "/api/v1/peers/{name}", tag = "peers", security(("token" = [])),
    params(("name" = String, Path, description = "The peer's name")),
    responses((status = 200, description = "The peer", body = Peer),
              (status = 404, description = "No such peer", body = ErrorBody)))]
async fn peer(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<Peer>, ApiError> {
    find_peer(&state, &name).map(Json)
}

/// Forces new sessions toward a peer's prefixes to go direct, or lets them use the tunnel
/// again. Holds until the configuration is next applied or reloaded.
#[utoipa::path(put, path = "/api/v1/peers/{name}/bypass", tag = "peers",
    security(("token" = [])),
    params(("name" = String, Path, description = "The peer's name")),
    request_body = Bypass,
    responses((status = 200, description = "The peer, after the change", body = Peer),
              (status = 404, description = "No such peer", body = ErrorBody)))]
async fn set_bypass(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Json(bypass): Json<Bypass>,
) -> Result<Json<Peer>, ApiError> {
    if !state.control.gateway().set_bypass(&name, bypass.force) {
        return Err(ApiError::not_found(format!("no peer named {name:?}")));
    }
    tracing::info!(peer = %name, force = bypass.force, "bypass set through the API");
    find_peer(&state, &name).map(Json)
}

fn find_peer(state: &AppState, name: &str) -> Result<Peer, ApiError> {
    state
        .control
        .gateway()
        .peers()
        .iter()
        .find(|p| p.name == name)
        .map(Peer::new)
        .ok_or_else(|| ApiError::not_found(format!("no peer named {name:?}")))
}

// ---- Shaper -------------------------------------------------------------------------------

/// The bandwidth controller: every scenario with its settings, counters and current rate,
/// and how many sessions each filter matched. Rates cover the time since the previous
/// reading at least a second old (poll every second for live rates).
#[utoipa::path(get, path = "/api/v1/shaper", tag = "shaper", security(("token" = [])),
    responses((status = 200, description = "The controller's state", body = Shaper),
              (status = 404, description = "The gateway does not shape (no [shaper] table)", body = ErrorBody)))]
async fn shaper(State(state): State<Arc<AppState>>) -> Result<Json<Shaper>, ApiError> {
    let status = state.control.gateway().shaper();
    status
        .as_ref()
        .map(|s| Json(Shaper::new(s)))
        .ok_or_else(|| {
            ApiError::not_found(
                "the gateway does not shape: its configuration has no [shaper] table",
            )
        })
}

/// Adds the scenario `name` to the configuration file, or replaces its fields; the file is
/// then checked, saved and applied as `PUT /api/v1/config` would. Live sessions keep
/// flowing: they move to the new tree by their scenario's name.
#[utoipa::path(put, path = "/api/v1/shaper/scenarios/{name}", tag = "shaper", security(("token" = [])),
    params(("name" = String, Path, description = "The scenario's name")),
    request_body = ScenarioBody,
    responses((status = 200, description = "Saved and applied", body = ConfigSummary),
              (status = 422, description = "The file would not be valid; where", body = ErrorBody),
              (status = 409, description = "The file, as edited, needs a restart (it differs from the running configuration in more than the shaper)", body = ErrorBody)))]
async fn put_scenario(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Json(body): Json<ScenarioBody>,
) -> Result<Json<ConfigSummary>, ApiError> {
    let fields = fields_of(&body)?;
    let edit = ShaperEdit::PutScenario { name, fields };
    state.control.edit_shaper(edit).await.map(Json)
}

/// Removes the scenario `name` from the configuration file and applies it. Filters that
/// name it make the file invalid (422): change them first.
#[utoipa::path(delete, path = "/api/v1/shaper/scenarios/{name}", tag = "shaper", security(("token" = [])),
    params(("name" = String, Path, description = "The scenario's name")),
    responses((status = 200, description = "Saved and applied", body = ConfigSummary),
              (status = 404, description = "No such scenario in the file", body = ErrorBody),
              (status = 422, description = "The file would not be valid; where", body = ErrorBody)))]
async fn delete_scenario(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<ConfigSummary>, ApiError> {
    state
        .control
        .edit_shaper(ShaperEdit::DeleteScenario { name })
        .await
        .map(Json)
}

/// Where a new filter goes.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct FilterPosition {
    /// Its position (0: tried first); last if absent.
    at: Option<u32>,
}

/// Adds a filter to the configuration file (last, or at `at`) and applies it.
#[utoipa::path(post, path = "/api/v1/shaper/filters", tag = "shaper", security(("token" = [])),
    params(FilterPosition),
    request_body = FilterBody,
    responses((status = 200, description = "Saved and applied", body = ConfigSummary),
              (status = 404, description = "`at` is past the end of the list", body = ErrorBody),
              (status = 422, description = "The file would not be valid; where", body = ErrorBody)))]
async fn add_filter(
    State(state): State<Arc<AppState>>,
    Query(position): Query<FilterPosition>,
    Json(body): Json<FilterBody>,
) -> Result<Json<ConfigSummary>, ApiError> {
    let fields = fields_of(&body)?;
    let edit = ShaperEdit::AddFilter {
        at: position.at.map(|at| at as usize),
        fields,
    };
    state.control.edit_shaper(edit).await.map(Json)
}

/// Replaces the filter at `index` (its position, 0 first) and applies the file.
#[utoipa::path(put, path = "/api/v1/shaper/filters/{index}", tag = "shaper", security(("token" = [])),
    params(("index" = u32, Path, description = "The filter's position, 0 first")),
    request_body = FilterBody,
    responses((status = 200, description = "Saved and applied", body = ConfigSummary),
              (status = 404, description = "No filter at that position", body = ErrorBody),
              (status = 422, description = "The file would not be valid; where", body = ErrorBody)))]
async fn put_filter(
    State(state): State<Arc<AppState>>,
    Path(index): Path<u32>,
    Json(body): Json<FilterBody>,
) -> Result<Json<ConfigSummary>, ApiError> {
    let index = index as usize;
    let fields = fields_of(&body)?;
    let edit = ShaperEdit::PutFilter { index, fields };
    state.control.edit_shaper(edit).await.map(Json)
}

/// Removes the filter at `index` and applies the file.
#[utoipa::path(delete, path = "/api/v1/shaper/filters/{index}", tag = "shaper", security(("token" = [])),
    params(("index" = u32, Path, description = "The filter's position, 0 first")),
    responses((status = 200, description = "Saved and applied", body = ConfigSummary),
              (status = 404, description = "No filter at that position", body = ErrorBody),
              (status = 422, description = "The file would not be valid; where", body = ErrorBody)))]
async fn delete_filter(
    State(state): State<Arc<AppState>>,
    Path(index): Path<u32>,
) -> Result<Json<ConfigSummary>, ApiError> {
    let index = index as usize;
    state
        .control
        .edit_shaper(ShaperEdit::DeleteFilter { index })
        .await
        .map(Json)
}

/// A body's fields as a JSON object, the absent ones left out.
fn fields_of(
    body: &impl Serialize,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match serde_json::to_value(body) {
        Ok(serde_json::Value::Object(fields)) => Ok(fields),
        _ => Err(ApiError::new(
            ErrorCode::BadRequest,
            "the body must be a JSON object",
        )),
    }
}

// ---- Sessions -----------------------------------------------------------------------------

/// Live sessions, by id, filtered and paged.
#[utoipa::path(get, path = "/api/v1/sessions", tag = "sessions", security(("token" = [])),
    params(SessionQuery),
    responses((status = 200, description = "A page of sessions", body = SessionPage),
              (status = 422, description = "A filter is not valid", body = ErrorBody)))]
async fn sessions(
    State(state): State<Arc<AppState>>,
    Query(query): Query<SessionQuery>,
) -> Result<Json<SessionPage>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(
            ApiError::new(ErrorCode::InvalidValue, format!("1 to {MAX_LIMIT}")).field("limit"),
        );
    }
    let offset = query.offset.unwrap_or(0);
    if offset > MAX_OFFSET {
        return Err(
            ApiError::new(ErrorCode::InvalidValue, format!("0 to {MAX_OFFSET}")).field("offset"),
        );
    }
    let address = match &query.address {
        None => None,
        Some(text) => Some(parse_prefix(text).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidValue,
                "an IP address or a prefix (10.1.0.0/16, fd00::/8)",
            )
            .field("address")
        })?),
    };
    let matching: Vec<Session> = state
        .control
        .gateway()
        .sessions()
        .iter()
        .filter(|s| {
            query
                .peer
                .as_ref()
                .is_none_or(|p| s.peer.as_ref() == Some(p))
                && address.is_none_or(|net| {
                    net.contains(&s.client.0.ip())
                        || matches!(s.destination, Target::Addr(a) if net.contains(&a.ip()))
                })
        })
        .map(Session::new)
        .filter(|s| {
            query.route.is_none_or(|r| s.route == r) && query.state.is_none_or(|st| s.state == st)
        })
        .collect();
    let total = matching.len() as u64;
    let sessions = matching
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .collect();
    Ok(Json(SessionPage {
        total,
        offset,
        limit,
        sessions,
    }))
}

fn parse_prefix(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

/// One session.
#[utoipa::path(get, path = "/api/v1/sessions/{id}", tag = "sessions", security(("token" = [])),
    params(("id" = u64, Path, description = "The session's id")),
    responses((status = 200, description = "The session", body = Session),
              (status = 404, description = "No such live session", body = ErrorBody)))]
async fn session(
    State(state): State<Arc<AppState>>,
    Path(id): Path<u64>,
) -> Result<Json<Session>, ApiError> {
    state
        .control
        .gateway()
        .session(id)
        .map(|s| Json(Session::new(&s)))
        .ok_or_else(|| ApiError::not_found(format!("no live session {id}")))
}

/// Ends a session now: both sides are reset.
#[utoipa::path(delete, path = "/api/v1/sessions/{id}", tag = "sessions",
    security(("token" = [])),
    params(("id" = u64, Path, description = "The session's id")),
    responses((status = 204, description = "The session is being reset"),
              (status = 404, description = "No such live session", body = ErrorBody)))]
async fn kill_session(
    State(state): State<Arc<AppState>>,
    Path(id): Path<u64>,
) -> Result<StatusCode, ApiError> {
    if state.control.gateway().kill_session(id) {
        tracing::info!(session = id, "session killed through the API");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no live session {id}")))
    }
}

// ---- Configuration ------------------------------------------------------------------------

/// The running configuration, every default filled in, secrets masked.
#[utoipa::path(get, path = "/api/v1/config", tag = "config", security(("token" = [])),
    responses((status = 200, description = "The running configuration", body = ConfigView)))]
async fn config(State(state): State<Arc<AppState>>) -> Json<ConfigView> {
    Json(state.control.config())
}

/// Validates a candidate configuration file without applying it.
#[utoipa::path(post, path = "/api/v1/config/check", tag = "config", security(("token" = [])),
    request_body(content = String, content_type = "text/plain",
                 description = "A whole configuration file (TOML)"),
    responses((status = 200, description = "The candidate is valid", body = ConfigSummary),
              (status = 422, description = "Where the candidate is wrong", body = ErrorBody)))]
async fn check_config(
    State(state): State<Arc<AppState>>,
    Text(text): Text,
) -> Result<Json<ConfigSummary>, ApiError> {
    state.control.check_config(&text).map(Json)
}

/// Applies a configuration file as a reload (SIGHUP) would, and writes it to the
/// configuration file atomically. When anything fails, nothing changes.
#[utoipa::path(put, path = "/api/v1/config", tag = "config", security(("token" = [])),
    request_body(content = String, content_type = "text/plain",
                 description = "A whole configuration file (TOML)"),
    responses((status = 200, description = "Applied and saved", body = ConfigSummary),
              (status = 409, description = "Valid, but needs a restart", body = ErrorBody),
              (status = 422, description = "Where the candidate is wrong", body = ErrorBody)))]
async fn apply_config(
    State(state): State<Arc<AppState>>,
    Text(text): Text,
) -> Result<Json<ConfigSummary>, ApiError> {
    state.control.apply_config(text).await.map(Json)
}

// ---- Logging ------------------------------------------------------------------------------

/// The log filter in force.
#[utoipa::path(get, path = "/api/v1/log-level", tag = "logging", security(("token" = [])),
    responses((status = 200, description = "The filter", body = LogLevel)))]
async fn log_level(State(state): State<Arc<AppState>>) -> Json<LogLevel> {
    Json(LogLevel {
        filter: state.control.log_filter(),
    })
}

/// Changes the log filter at once, until the next restart.
#[utoipa::path(put, path = "/api/v1/log-level", tag = "logging", security(("token" = [])),
    request_body = LogLevel,
    responses((status = 200, description = "The filter now in force", body = LogLevel),
              (status = 422, description = "Not a valid filter", body = ErrorBody)))]
async fn set_log_level(
    State(state): State<Arc<AppState>>,
    Json(level): Json<LogLevel>,
) -> Result<Json<LogLevel>, ApiError> {
    state.control.set_log_filter(&level.filter)?;
    tracing::info!(filter = %level.filter, "log filter set through the API");
    Ok(Json(LogLevel {
        filter: state.control.log_filter(),
    }))
}

// ---- Metrics ------------------------------------------------------------------------------

/// Prometheus metrics in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "metrics", security(("token" = [])),
    responses((status = 200, description = "The metrics",
               content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8",
               body = String)))]
async fn prometheus(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let text = state
        .metrics
        .encode()
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("encoding metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}
