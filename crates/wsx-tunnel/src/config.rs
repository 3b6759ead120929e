//! Settings of connections and endpoints.

use crate::congestion::CongestionControl;
use crate::crypto::{PublicKey, SecretKey};
use std::time::Duration;

/// The largest [`TransportConfig::max_datagram`]: a 9216-byte jumbo frame's worth, the most
/// the endpoint's receive buffers take in one datagram.
pub const MAX_DATAGRAM: u16 = 9216;

/// Settings every connection of an endpoint shares.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TransportConfig {
    /// The largest UDP payload sent or accepted: a cap on path MTU discovery, which starts
    /// every connection at 1,200 bytes and finds what the path carries (1,472 on a 1500-byte
    /// Ethernet MTU over IPv4, 1,452 over IPv6; 8,972 and 8,952 with 9000-byte jumbo frames).
    /// 1,200 to [`MAX_DATAGRAM`]; the default, 9,000, lets jumbo paths be used. Lower it to
    /// keep the tunnel's datagrams small whatever the path.
    pub max_datagram: u16,
    /// Streams the peer may have open at once.
    pub max_concurrent_streams: u64,
    /// Receive window of one stream: the most unread bytes it buffers.
    pub stream_window: u64,
    /// Receive window of the connection (all streams together).
    pub connection_window: u64,
    /// Unacknowledged bytes one stream may buffer for sending before writes block.
    pub stream_send_buffer: u64,
    /// The same for all streams together.
    pub connection_send_buffer: u64,
    /// The connection closes after this long without hearing from the peer (the smaller of
    /// both sides' values applies).
    pub idle_timeout: Duration,
    /// A PING is sent after this long without sending anything, so that the peer's idle timer
    /// and the path's RTT estimate stay fresh, and a dead peer is noticed.
    pub keepalive: Duration,
    /// An ACK is sent after this many ack-eliciting packets...
    pub ack_every: u32,
    /// ...or after this delay, whichever comes first.
    pub max_ack_delay: Duration,
    /// The congestion controller.
    pub congestion: CongestionControl,
    /// The operator's cap on the sending rate (the contracted WAN bandwidth), bytes per second.
    pub max_rate: Option<u64>,
    /// Most packets handed to the driver in one call (one GSO send, which also carries at
    /// most 65,507 bytes: 44 packets of 1,472). At 3.5 Gbit/s through both gateways, 64
    /// (44 at that size) against 32 cost the sending gateway 2-7 % and the receiving one
    /// 12 % less CPU per GB (fuller GRO batches too); below ~180 Mbit/s a pacing burst
    /// (2 ms) is shorter anyway.
    pub max_burst_packets: usize,
    /// Handshake attempts before giving up; attempt `n` waits `2^n` seconds for an answer.
    pub handshake_attempts: u32,
    /// Forward error correction of what this side sends.
    pub fec: FecMode,
    /// The most parity per data packet FEC may add (0.25: a quarter more packets). Under
    /// 1/248 no group can have a parity packet, and FEC sends none.
    pub fec_max_overhead: f64,
    /// Offer AES-256-GCM for the data packets when this CPU has AES instructions; it is used
    /// when the peer offers it too, ChaCha20-Poly1305 otherwise. `false` keeps every
    /// connection on ChaCha20-Poly1305.
    pub aes_gcm: bool,
    /// What the application on this side understands, bits it defines: offered to the
    /// peer in the handshake (bits 16-47 of the `extensions` parameter), the peer's
    /// read back with [`Connection::peer_app_extensions`](crate::Connection::peer_app_extensions).
    /// The tunnel gives them no meaning. 0 by default.
    pub app_extensions: u32,
}

/// When the sender adds Reed-Solomon parity to its packets (PROTOCOL.md §5.1). The receiver
/// rebuilds what it can whatever its own setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FecMode {
    /// Never.
    Off,
    /// Always, sized for at least 1 % loss, even on a path that loses nothing.
    On,
    /// As much as the measured loss rate and burst length need (none on a clean path), for
    /// the packets whose loss would cost a round trip: the last half round trip of each
    /// flight. A bulk transfer's losses, independent or in bursts, are resent instead,
    /// which costs the link less. Until the path's loss is measured (the first 200
    /// packets), it assumes the 1 % of `On`.
    #[default]
    Adaptive,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            max_datagram: 9000,
            max_concurrent_streams: 16_384,
            stream_window: 8 << 20,
            connection_window: 64 << 20,
            stream_send_buffer: 8 << 20,
            connection_send_buffer: 64 << 20,
            idle_timeout: Duration::from_secs(30),
            keepalive: Duration::from_secs(1),
            ack_every: 64,
            max_ack_delay: Duration::from_millis(25),
            congestion: CongestionControl::default(),
            max_rate: None,
            max_burst_packets: 64,
            handshake_attempts: 5,
            fec: FecMode::default(),
            fec_max_overhead: 0.25,
            aes_gcm: true,
            app_extensions: 0,
        }
    }
}

/// An endpoint's identity and its peers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    pub secret: SecretKey,
    /// Peers allowed to connect (and to be connected to). Initiations from any other key are
    /// dropped without an answer.
    pub peers: Vec<PublicKey>,
    pub transport: TransportConfig,
    /// Seeds connection ids. Drivers pass randomness; simulations pass a fixed seed.
    pub seed: u64,
}

impl EndpointConfig {
    pub fn new(secret: SecretKey, peers: Vec<PublicKey>, seed: u64) -> Self {
        Self {
            secret,
            peers,
            transport: TransportConfig::default(),
            seed,
        }
    }
}
