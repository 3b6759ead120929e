//! Congestion control behind a trait, one file per algorithm (the quinn-proto layout).
//!
//! The connection tells its [`Controller`] what was sent, acknowledged and lost, with the time
//! and a delivery-rate sample; the controller answers with a congestion window (the most bytes
//! in flight) and a pacing rate. Every method takes `now`: controllers never read a clock, so
//! a simulation runs them at any speed and gets the same trajectory every time.
//!
//! - [`Adaptive`] (the default): *Rapid Start*, then *Optimal Congestion Control*, both driven by
//!   the measured delivery rate and minimum RTT, and deciding from the pattern of losses whether
//!   a loss is congestion (see `adaptive.rs` and `loss_pattern.rs` for the reasoning).
//! - [`NewReno`]: the conventional loss-based AIMD controller (RFC 9002 §7), for comparison and
//!   for paths shared with traffic that expects TCP-like behaviour.
//!
//! The operator's maximum rate is applied by the connection on top of any controller.

mod adaptive;
mod delivery;
mod loss_pattern;
mod new_reno;

pub use adaptive::{Adaptive, AdaptiveConfig};
pub(crate) use delivery::{DeliveryRate, PacketSnapshot};
pub use new_reno::{NewReno, NewRenoConfig};

use crate::rtt::RttEstimator;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A congestion controller. All sizes are bytes of UDP payload; rates are bytes per second.
pub trait Controller: Send + fmt::Debug {
    /// A packet that counts against the window was sent; `in_flight` includes it.
    fn on_sent(&mut self, now: Instant, bytes: u64, in_flight: u64);

    /// An ACK frame acknowledged new packets.
    fn on_ack(&mut self, now: Instant, ack: &AckEvent<'_>);

    /// Loss detection declared packets lost (one call per ACK frame or loss timer); the
    /// answer says what the controller made of them.
    fn on_loss(&mut self, now: Instant, loss: &LossEvent<'_>) -> LossVerdict;

    /// Nothing was acknowledged for a whole persistent-congestion period (RFC 9002 §7.6): the
    /// path may have changed entirely.
    fn on_persistent_congestion(&mut self, now: Instant);

    /// Path MTU discovery changed the size of the packets sent (bytes of UDP payload).
    fn on_max_datagram(&mut self, _max_datagram: u64) {}

    /// The most bytes that may be in flight.
    fn window(&self) -> u64;

    /// The rate at which the pacer releases packets.
    fn pacing_rate(&self) -> u64;

    /// What the controller currently believes, for statistics and tests.
    fn state(&self) -> ControllerState;

    /// What a later connection to the same peer may start from (a warm start), if the
    /// controller has learned anything worth keeping.
    fn path_hint(&self) -> Option<PathHint>;
}

/// What a controller made of a loss event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossVerdict {
    /// The line's own loss: the rate stands (or the episode was already answered).
    Random,
    /// Congestion with a full queue's unmistakable mark, losses while the RTT stood well
    /// above its floor: these losses, and those still to be found among the packets in
    /// flight, are overflow, not the line's.
    Overflow,
    /// Congestion judged another way (more loss runs or long runs than the line's learned
    /// rates explain, or any loss to a loss-based controller): possibly the line's own
    /// losses, in an unlucky round.
    Congestion,
}

/// Builds a controller per connection. Held in the transport configuration.
pub trait ControllerFactory: Send + Sync + fmt::Debug {
    fn build(&self, now: Instant, params: &PathParams) -> Box<dyn Controller>;
}

/// What a controller starts from.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PathParams {
    /// The largest UDP payload the connection sends at the start (path MTU discovery may
    /// change it: [`Controller::on_max_datagram`]).
    pub max_datagram: u64,
    /// The RTT measured by the handshake.
    pub initial_rtt: Duration,
    /// The longest the peer holds an acknowledgement. Data sent meanwhile is in flight on top
    /// of a round trip's worth, so a window of one BDP would stall the sender on a path
    /// whose RTT is short next to this delay (a LAN, a metro link).
    pub peer_ack_delay: Duration,
    /// Learned by an earlier connection to the same peer.
    pub hint: Option<PathHint>,
}

/// A path's learned capacity, kept per peer by the endpoint for warm starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathHint {
    /// Delivery rate, bytes per second.
    pub rate: u64,
    pub min_rtt: Duration,
}

/// A controller's view, exported in connection statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControllerState {
    /// The phase, e.g. "rapid-start", "optimal", "slow-start".
    pub phase: &'static str,
    pub window: u64,
    pub pacing_rate: u64,
    /// Estimated bottleneck rate, bytes per second (0 when the controller does not estimate it).
    pub bottleneck_rate: u64,
    /// The minimum RTT the controller works with (zero when it keeps none).
    pub min_rtt: Duration,
    /// Loss episodes judged to be congestion, each of which lowered the rate.
    pub congestion_events: u64,
    /// Lost packets judged random, which did not.
    pub random_losses: u64,
    /// Every lost packet the controller was told of (retransmitted or rebuilt by FEC),
    /// whatever its verdict.
    pub losses: u64,
}

/// One ACK frame's worth of newly acknowledged packets.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AckEvent<'a> {
    pub acked_bytes: u64,
    pub acked_packets: u64,
    /// Bytes in flight after these packets left the count.
    pub in_flight: u64,
    pub rtt: &'a RttEstimator,
    /// The RTT sample this ACK produced (when its largest packet was newly acknowledged),
    /// less the time the peer says it held the ACK (bounded by its `max_ack_delay`, never
    /// below the minimum RTT).
    pub rtt_sample: Option<Duration>,
    /// The delivery-rate sample this ACK produced.
    pub rate: Option<RateSample>,
    /// Total bytes delivered when the newest packet acknowledged here was sent: when this
    /// reaches the total delivered at the start of a round, that round has ended.
    pub prior_delivered: u64,
    /// Total bytes delivered now.
    pub delivered: u64,
}

/// Packets declared lost together.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LossEvent<'a> {
    /// Ascending by packet number.
    pub lost: &'a [LostPacket],
    /// Bytes in flight after they left the count.
    pub in_flight: u64,
    pub rtt: &'a RttEstimator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostPacket {
    pub number: u64,
    pub bytes: u64,
    pub sent: Instant,
    /// The peer rebuilt it from parity: lost on the path (a loss to judge), but delivered
    /// (its bytes count in the delivery rate).
    pub repaired: bool,
}

/// A delivery-rate sample (draft-cheng-iccrg-delivery-rate-estimation): the bytes delivered
/// between a packet's send and its acknowledgement, over the longer of the send and ACK
/// intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateSample {
    /// Bytes per second.
    pub rate: u64,
    pub interval: Duration,
    /// The sender had nothing to send for part of the interval, so the rate understates the
    /// path.
    pub app_limited: bool,
}

/// Which controller a connection uses, and its settings.
#[derive(Debug, Clone)]
pub enum CongestionControl {
    Adaptive(AdaptiveConfig),
    NewReno(NewRenoConfig),
    /// Any other implementation.
    Custom(Arc<dyn ControllerFactory>),
}

impl Default for CongestionControl {
    fn default() -> Self {
        Self::Adaptive(AdaptiveConfig::default())
    }
}

impl CongestionControl {
    pub(crate) fn build(&self, now: Instant, params: &PathParams) -> Box<dyn Controller> {
        match self {
            Self::Adaptive(config) => config.build(now, params),
            Self::NewReno(config) => config.build(now, params),
            Self::Custom(factory) => factory.build(now, params),
        }
    }
}

/// `value * permille / 1000` without overflow for any rate or window this crate handles.
pub(crate) fn scale(value: u64, permille: u64) -> u64 {
    (u128::from(value) * u128::from(permille) / 1000) as u64
}

/// Bytes carried in `duration` at `rate` bytes per second.
pub(crate) fn bytes_in(rate: u64, duration: Duration) -> u64 {
    (u128::from(rate) * duration.as_nanos() / 1_000_000_000) as u64
}

/// Bytes per second for `bytes` delivered over `interval`.
pub(crate) fn rate_of(bytes: u64, interval: Duration) -> u64 {
    let nanos = interval.as_nanos().max(1);
    (u128::from(bytes) * 1_000_000_000 / nanos).min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::LostPacket;
    use std::time::Instant;

    /// Packets `numbers` of 1,400 bytes, all sent at `sent`, lost and not rebuilt.
    pub(super) fn lost(numbers: impl IntoIterator<Item = u64>, sent: Instant) -> Vec<LostPacket> {
        numbers
            .into_iter()
            .map(|number| LostPacket {
                number,
                bytes: 1400,
                sent,
                repaired: false,
            })
            .collect()
    }
}
