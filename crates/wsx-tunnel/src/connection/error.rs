//! How a connection ends, and the errors of its API.

use crate::streams::StreamViolation;
use crate::wire::FrameError;
use std::fmt;

/// Close code for protocol violations. The transport's own codes start at 0x100; the ones
/// below are the application's (`Tunnel::close`).
pub const CLOSE_PROTOCOL_VIOLATION: u64 = 0x100;

/// Close code for a connection the peer replaced with a newer one
/// ([`ConnectionError::Replaced`] on the side that replaced it).
pub const CLOSE_REPLACED: u64 = 0x102;

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// Nothing was heard from the peer for the idle timeout.
    #[error("timed out")]
    TimedOut,
    /// The peer never answered the handshake.
    #[error("handshake timed out")]
    HandshakeTimedOut,
    /// The peer closed the connection.
    #[error("closed by peer (code {code}): {reason}")]
    PeerClosed { code: u64, reason: String },
    /// The application closed it.
    #[error("closed locally")]
    LocallyClosed,
    /// The peer broke the protocol; the connection was closed with this error.
    #[error("protocol violation: {0}")]
    ProtocolViolation(TransportError),
    /// A newer handshake from the same peer replaced this connection.
    #[error("replaced by a newer connection from the same peer")]
    Replaced,
}

/// A violation of the protocol by the peer: what closes the connection with
/// [`CLOSE_PROTOCOL_VIOLATION`] (the reason goes to the peer in the CLOSE frame).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportError {
    /// The close code sent to the peer.
    pub code: u64,
    /// The type of the frame that broke the rules, when a frame did.
    pub frame: Option<u64>,
    pub reason: String,
}

impl TransportError {
    pub(crate) fn violation(frame: Option<u64>, reason: impl fmt::Display) -> Self {
        Self {
            code: CLOSE_PROTOCOL_VIOLATION,
            frame,
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)?;
        if let Some(frame) = self.frame {
            write!(f, " (frame type {frame:#x})")?;
        }
        Ok(())
    }
}

impl std::error::Error for TransportError {}

impl From<FrameError> for TransportError {
    fn from(e: FrameError) -> Self {
        Self::violation(None, e)
    }
}

impl StreamViolation {
    /// The error that closes the connection, naming the frame of type `frame` that caused it.
    pub(super) fn in_frame(self, frame: u64) -> TransportError {
        TransportError::violation(Some(frame), self)
    }
}
