//! The wsx tunnel: one long-lived, authenticated and encrypted UDP tunnel between two gateways
//! that carries many TCP connections as streams, with its own reliability, congestion control
//! and pacing.
//!
//! # Architecture
//!
//! The crate is a **sans-IO core** in the shape of quinn-proto, plus a thin driver:
//!
//! - [`Endpoint`] owns the static key and the list of peers. It answers handshake initiations
//!   (Noise IK, see [`crypto`](crate::SecretKey)) and tells the caller which [`Connection`] each
//!   other datagram belongs to, by the connection id in its header.
//! - [`Connection`] is a state machine driven by `handle_datagram(now, ..)`,
//!   `handle_timeout(now)` and the stream API, and read through `poll_transmit(now, buf)`,
//!   `poll_timeout()` and `poll_event()`. It never reads a clock or touches a socket, so the
//!   simulation tests run it through hours of a 400 ms, 5 % loss path in milliseconds, the same
//!   way every time.
//! - Inside a connection: [`streams`](StreamId) with flow control, served in the order a
//!   [`Scheduler`] gives (by default [`RoundRobin`], equal shares); reliability after RFC
//!   9002 (ACK ranges, packet- and time-threshold loss detection, probe timeouts); coalesced, rate-limited acknowledgements; a [`Controller`]
//!   (the default [`Adaptive`] one decides from the loss *pattern* whether to slow down); and an
//!   earliest-departure-time pacer that releases ~2 ms bursts sized for one GSO send.
//! - The `driver` feature adds a tokio + quinn-udp driver.
//!
//! The wire format is specified in `PROTOCOL.md` beside this crate; the code that reads and
//! writes it is the `wire` module (headers, frames, stream metadata), and the connection's
//! sub-state machines (handshake, recovery, acknowledgements, control channel, FEC, timers)
//! are described in `connection/mod.rs`.
//!
//! # Data flow
//!
//! ```text
//!  app write ─> SendBuf ─> scheduler ─> packet (frames) ─> AEAD ─> pacer ─> Transmit ─> UDP
//!  UDP ─> Endpoint (route by id) ─> Connection: replay check, AEAD open, frames
//!        ├─ ACK ─> sent-packet map ─> RTT, delivery rate, loss detection ─> Controller
//!        └─ STREAM ─> RecvBuf (reassembly) ─> app read ─> flow-control credit ─> peer
//! ```

mod config;
pub mod congestion;
mod connection;
mod crypto;
#[cfg(feature = "driver")]
pub mod driver;
mod endpoint;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod pacing;
mod range_set;
mod replay;
mod rtt;
mod streams;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod wire;

/// The map of the per-packet lookups (streams by id, connections by handle and by id):
/// foldhash, seeded per map, where std's SipHash cost 1.3-1.6 % of a sending gateway's CPU
/// at line rate. Their keys are this endpoint's own or the authenticated peer's.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use config::{EndpointConfig, FecMode, MAX_DATAGRAM, TransportConfig};
pub use congestion::{
    Adaptive, AdaptiveConfig, CongestionControl, Controller, ControllerState, LossVerdict, NewReno,
    NewRenoConfig, PathHint,
};
pub use connection::{
    CLOSE_PROTOCOL_VIOLATION, CLOSE_REPLACED, Connection, ConnectionError, ConnectionStats,
    ControlError, Event, FecStats, MAX_CONTROL_LEN, MAX_CONTROL_MESSAGES, MtuStats, Transmit,
    TransportError,
};
pub use crypto::{
    Cipher, KEY_LEN, KEY_UPDATE_INTERVAL, KEY_UPDATE_PACKETS, KeyError, PublicKey, SecretKey,
    hardware_aes,
};
pub use endpoint::{ConnectError, ConnectionHandle, DatagramEvent, Endpoint, EndpointStats};
pub use rtt::RttEstimator;
pub use streams::{RoundRobin, Scheduler, StreamError, Turn};
pub use wire::{MAX_HINT_LEN, MAX_NAME_LEN, PROTOCOL_VERSION, StreamId, StreamMeta, Target};

/// One real instant for tests to count virtual time from. Simulations never read the clock
/// again.
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
pub(crate) fn test_epoch() -> std::time::Instant {
    std::time::Instant::now()
}
