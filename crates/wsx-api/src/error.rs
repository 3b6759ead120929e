//! Errors as the API returns them: an HTTP status and a JSON body with a stable code, a
//! message for people, and the field at fault when there is one.
//!
//! ```json
//! {"error": {"code": "invalid_config", "message": "must be non-zero",
//!            "field": "sessions.max_sessions", "line": 12, "column": 1}}
//! ```

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The stable error codes. Clients match on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// No token, or not a valid one (401).
    Unauthorized,
    /// No such route, peer or session (404).
    NotFound,
    /// The route exists, the method does not (405).
    MethodNotAllowed,
    /// The request could not be read: malformed JSON, a bad path or query (400).
    BadRequest,
    /// The request was read and a value in it is wrong (422); `field` names it.
    InvalidValue,
    /// A configuration candidate does not validate (422); `field`, `line`, `column` say where.
    InvalidConfig,
    /// The configuration is valid but changes what only a restart can (409).
    NeedsRestart,
    /// The body is larger than the API accepts (413).
    PayloadTooLarge,
    /// The request took longer than the API allows (503).
    Timeout,
    /// Too many requests at once (503).
    Busy,
    /// Something failed inside the daemon (500); the message says what.
    Internal,
}

/// The JSON body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    /// The field at fault: `peer[1].prefixes[0]`, `limit`, …
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Where in a configuration candidate (1-based).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

/// An error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    detail: ErrorDetail,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let status = match code {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidValue | ErrorCode::InvalidConfig => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::NeedsRestart => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Timeout | ErrorCode::Busy => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            detail: ErrorDetail {
                code,
                message: message.into(),
                field: None,
                line: None,
                column: None,
            },
        }
    }

    /// Names the field at fault.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.detail.field = Some(field.into());
        self
    }

    /// Where in a configuration text.
    pub fn at(mut self, line: u32, column: u32) -> Self {
        self.detail.line = Some(line);
        self.detail.column = Some(column);
        self
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, what)
    }

    pub fn code(&self) -> ErrorCode {
        self.detail.code
    }

    pub fn detail(&self) -> &ErrorDetail {
        &self.detail
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: self.detail.clone(),
            }),
        )
            .into_response();
        if self.detail.code == ErrorCode::Unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"wsx\""),
            );
        }
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail.field {
            Some(field) => write!(f, "{field}: {}", self.detail.message),
            None => f.write_str(&self.detail.message),
        }
    }
}

impl std::error::Error for ApiError {}

// axum's extractors reject with plain text; these turn the rejections into the API's JSON.

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonDataError(e) => {
                // serde's message names the field ("unknown field `x`", "missing field `y`").
                Self::new(ErrorCode::InvalidValue, e.body_text())
            }
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Self::new(ErrorCode::PayloadTooLarge, "request body too large")
            }
            other => Self::new(ErrorCode::BadRequest, other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::new(ErrorCode::BadRequest, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::new(ErrorCode::BadRequest, r.body_text())
    }
}
