//! What a connection counts.

use super::fec::FecStats;
use crate::congestion::ControllerState;
use std::time::Duration;

/// Counters of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ConnectionStats {
    pub packets_sent: u64,
    pub bytes_sent: u64,
    /// Packets that carried stream data, control messages or PINGs (they count against the
    /// congestion window).
    pub eliciting_sent: u64,
    /// Packets that carried only an ACK: the reverse-path cost of reliability.
    pub ack_only_sent: u64,
    pub acks_sent: u64,
    /// Packets received and authenticated, and those rebuilt from the peer's parity (parity
    /// packets themselves are `fec.parity_received`; the handshake is the endpoint's).
    pub packets_received: u64,
    pub bytes_received: u64,
    /// Ack-eliciting packets declared lost (only they are tracked), and their bytes.
    pub packets_lost: u64,
    pub bytes_lost: u64,
    pub stream_bytes_sent: u64,
    /// Datagrams dropped because they failed authentication.
    pub auth_failures: u64,
    /// Datagrams dropped as replays or too late for the replay window.
    pub replays: u64,
    pub pto_count: u64,
    pub smoothed_rtt: Duration,
    pub min_rtt: Duration,
    pub congestion: Option<ControllerState>,
    pub fec: FecStats,
    /// Bytes the streams hold for sending now (unacknowledged, and never sent), and the most
    /// they may queue unsent at the path's present pace.
    pub send_buffered: u64,
    pub send_unsent: u64,
    pub send_budget: u64,
    /// Bytes received on all streams and not yet read by the application (holes included).
    pub receive_buffered: u64,
}
