//! What a connection counts.

use super::fec::FecStats;
use super::mtu::MtuStats;
use crate::congestion::ControllerState;
use crate::crypto::Cipher;
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
    /// Packets declared lost, data and ACK-only alike (both are tracked; parity packets and
    /// the handshake are not), and their bytes. The data in them is sent again. Packets the
    /// peer rebuilt from parity are acknowledged instead, and counted in
    /// `fec.recovered_by_peer`.
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
    /// The UDP payload size packets are built to now: what path MTU discovery found the path
    /// carries, within `max_datagram` (IP and UDP headers come on top).
    pub datagram_size: u16,
    /// Path MTU discovery's probes and black holes.
    pub mtu: MtuStats,
    /// The cipher sealing the data packets (`None` until the handshake completes).
    pub cipher: Option<Cipher>,
}

impl ConnectionStats {
    /// Packets tracked for loss: those that carried data and those that carried only an ACK.
    pub fn packets_tracked(&self) -> u64 {
        self.eliciting_sent + self.ack_only_sent
    }

    /// The share of tracked packets the path lost, before FEC repair: what a link's own
    /// count would show. Both directions of a tunnel read true, the one that mostly
    /// acknowledges too, since its ACK-only packets count on both sides of the ratio.
    pub fn loss_ratio(&self) -> f64 {
        share(
            self.packets_lost + self.fec.recovered_by_peer,
            self.packets_tracked(),
        )
    }

    /// The share of tracked packets lost and not rebuilt by the peer: what loss cost in
    /// retransmissions.
    pub fn unrepaired_loss_ratio(&self) -> f64 {
        share(self.packets_lost, self.packets_tracked())
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}
