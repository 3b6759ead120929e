//! Bearer tokens: `Authorization: Bearer <token>` must carry one of the configured tokens.

use crate::error::{ApiError, ErrorCode};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The configured tokens.
#[derive(Clone)]
pub(crate) struct Tokens(Arc<[Vec<u8>]>);

impl Tokens {
    pub(crate) fn new(tokens: &[String]) -> Self {
        Self(tokens.iter().map(|t| t.as_bytes().to_vec()).collect())
    }

    /// Whether `presented` is one of the tokens. Each comparison takes the same time
    /// whatever the bytes (`subtle`), and every token is compared, so the time says
    /// nothing about which token nor how much of one matched; only lengths can differ.
    pub(crate) fn accepts(&self, presented: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for token in self.0.iter() {
            ok |= token.as_slice().ct_eq(presented);
        }
        ok.into()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

/// Server state that holds the accepted tokens (kept as a trait so that this module does not
/// depend on the router's state type).
pub(crate) trait HasTokens {
    fn tokens(&self) -> &Tokens;
}

/// Middleware: the request goes on only with a valid token.
pub(crate) async fn require<S: HasTokens>(
    State(state): State<Arc<S>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match presented {
        Some(token) if state.tokens().accepts(token.as_bytes()) => Ok(next.run(request).await),
        Some(_) => Err(ApiError::new(ErrorCode::Unauthorized, "invalid token")),
        None => Err(ApiError::new(
            ErrorCode::Unauthorized,
            "an `Authorization: Bearer <token>` header is required",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_configured_token_is_accepted() {
        let tokens = Tokens::new(&["first-token".into(), "second".into()]);
        assert!(tokens.accepts(b"first-token"));
        assert!(tokens.accepts(b"second"));
        assert!(!tokens.accepts(b"first"));
        assert!(!tokens.accepts(b"first-token-and-more"));
        assert!(!tokens.accepts(b""));
        assert!(!Tokens::new(&[]).accepts(b""));
    }
}
